//! Wiping secret buffers at memory speed.
//!
//! `zeroize` writes one volatile store per element, so a byte buffer is
//! wiped a byte a cycle. A MiniLM-128 query wipes each key section (2.0 GB
//! at P0, 2.4 GB at P1 in all) and the keys rebuilt from it; at that rate
//! `Material::drop` alone took 5.8 % of the online phase's `perf` samples
//! (2 cores), and the section wipe sat inlined in `party::run_passes`.
//! Here a buffer is zeroed over its whole capacity by one `memset`, its
//! pointer then escapes through `black_box`, so that the compiler must
//! assume the zeros are read and cannot drop the stores as dead; then the
//! block is freed. Where the global allocator zeroes every freed block
//! itself (the `suffuse` binary's does, and says so through
//! [`allocator_wipes_freed_blocks`]), the block is only freed.
//! `host/tests/memscan.rs` checks the result in a live server.

use std::sync::atomic::{AtomicBool, Ordering};

/// Whether the global allocator zeroes every block it is given back.
static ALLOCATOR_WIPES: AtomicBool = AtomicBool::new(false);

/// Declares that this process's global allocator zeroes every block, its
/// whole layout, as the block is freed, as the `suffuse` binary's does.
/// [`vec()`] then only frees: its own `memset` would be a second pass over
/// memory the allocator is about to zero (a key section or a gate's keys,
/// hundreds of MB per query). A library user's allocator is never assumed
/// to wipe; only a binary whose allocator does may call this.
pub fn allocator_wipes_freed_blocks() {
    ALLOCATOR_WIPES.store(true, Ordering::Relaxed);
}

/// Zeroes `v`'s whole capacity (one `memset`), then frees it (`v` is left
/// empty); only frees it when the allocator zeroes freed blocks itself
/// ([`allocator_wipes_freed_blocks`]).
pub fn vec<T: Copy + Default>(v: &mut Vec<T>) {
    if ALLOCATOR_WIPES.load(Ordering::Relaxed) {
        *v = Vec::new();
        return;
    }
    v.clear();
    v.resize(v.capacity(), T::default());
    std::hint::black_box(v.as_mut_ptr());
    *v = Vec::new();
}

/// A byte buffer wiped by [`vec()`] when dropped, on every path: what
/// `zeroize::Zeroizing` does, at memory speed. Key sections are read into
/// these.
#[derive(Default)]
pub struct Wiped(pub Vec<u8>);

impl std::ops::Deref for Wiped {
    type Target = Vec<u8>;
    fn deref(&self) -> &Vec<u8> {
        &self.0
    }
}

impl std::ops::DerefMut for Wiped {
    fn deref_mut(&mut self) -> &mut Vec<u8> {
        &mut self.0
    }
}

impl Drop for Wiped {
    fn drop(&mut self) {
        vec(&mut self.0);
    }
}

impl std::fmt::Debug for Wiped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Wiped({} bytes, redacted)", self.0.len())
    }
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
