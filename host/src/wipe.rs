//! Wiping secret buffers at memory speed.
//!
//! `zeroize` writes one volatile store per element, so a byte buffer is
//! wiped a byte a cycle. A MiniLM-128 query wipes about 4.8 GB of key bytes
//! per party (each section, then the keys rebuilt from it), which at that
//! rate was about a tenth of the online phase's CPU time (`perf`, 2 cores).
//! Here a buffer is zeroed by `fill` (a `memset`) over its whole capacity,
//! its pointer then escapes through `black_box`, so that the compiler must
//! assume the zeros are read and cannot drop the stores as dead; then the
//! block is freed. The binary's allocator wipes every freed block as well,
//! and `host/tests/memscan.rs` checks the result in a live server.

/// Zeroes `v`'s whole capacity, then frees it (`v` is left empty).
pub fn vec<T: Copy + Default>(v: &mut Vec<T>) {
    v.resize(v.capacity(), T::default());
    v.fill(T::default());
    std::hint::black_box(v.as_mut_ptr());
    *v = Vec::new();
}

#[cfg(test)]
mod tests {
    #[test]
    fn wipes_length_and_spare_capacity_and_leaves_the_vec_empty() {
        let mut v: Vec<u8> = Vec::with_capacity(100);
        v.extend_from_slice(&[7u8; 60]);
        super::vec(&mut v);
        assert!(v.is_empty());
        assert_eq!(v.capacity(), 0);
        let mut w = vec![u64::MAX; 10];
        super::vec(&mut w);
        assert_eq!(w.capacity(), 0);
    }
}
