//! Local halves of the standard two-party subprotocols over additive
//! (Z_2^n) and XOR shares, each split into `prepare` (what this party
//! sends) and `finish` (what it computes from the peer's message).
//!
//! Messages are bit-packed: ring words at their width
//! ([`crate::wire::pack`]), bits eight to a byte. Sizes are
//! `const fn`s of the shape, so buffers are allocated by the caller.
//!
//! * **Open.** Each party sends its share; both add. Used for masked values
//!   `x + r` and Beaver differences.
//! * **Beaver multiplication.** With a triple `c = a·b`, open `d = x − a`
//!   and `e = y − b`; then `x·y = c + d·b + e·a + d·e`, the public `d·e`
//!   added by P0 alone.
//! * **AND.** The same over GF(2) with a bit triple.
//! * **B2A.** With a random bit ρ held both XOR- and additively shared,
//!   open `e = b ⊕ ρ`; then `b = e + (1 − 2e)·ρ`.

use crate::error::Error;
use crate::ring::Width;
use crate::wire;

/// Bytes of a message carrying `count` words of width `w`.
pub const fn words_len(w: Width, count: usize) -> usize {
    match w.packed_len(count) {
        Some(n) => n,
        None => usize::MAX,
    }
}

/// Bytes of a message carrying `count` bits.
pub const fn bits_len(count: usize) -> usize {
    count.div_ceil(8)
}

/// Writes this party's shares of values to open.
pub fn open_prepare(w: Width, mine: &[u64], send: &mut [u8]) -> Result<(), Error> {
    wire::pack(w, mine, send)?;
    Ok(())
}

/// Reconstructs opened values: `out = mine + theirs mod 2^w`.
pub fn open_finish(w: Width, mine: &[u64], recv: &[u8], out: &mut [u64]) -> Result<(), Error> {
    if mine.len() != out.len() {
        return Err(Error::BufferLength);
    }
    wire::unpack(w, recv, out)?;
    for (o, m) in out.iter_mut().zip(mine) {
        *o = w.add(*o, *m);
    }
    Ok(())
}

/// Packs bits (each word's least significant bit) eight to a byte.
pub fn pack_bits(bits: &[u64], send: &mut [u8]) -> Result<(), Error> {
    if send.len() != bits_len(bits.len()) {
        return Err(Error::BufferLength);
    }
    send.fill(0);
    for (i, b) in bits.iter().enumerate() {
        send[i / 8] |= u8::from(b & 1 == 1) << (i % 8);
    }
    Ok(())
}

/// XOR-reconstructs opened bits: `out[i] = mine[i] ⊕ theirs[i]`.
pub fn open_bits_finish(mine: &[u64], recv: &[u8], out: &mut [u64]) -> Result<(), Error> {
    if mine.len() != out.len() || recv.len() != bits_len(mine.len()) {
        return Err(Error::BufferLength);
    }
    for (i, (o, m)) in out.iter_mut().zip(mine).enumerate() {
        *o = (m ^ u64::from(recv[i / 8] >> (i % 8))) & 1;
    }
    // Padding bits of the last byte must be zero: a peer sending garbage
    // there is a protocol error, not something to ignore.
    let used = mine.len() % 8;
    if used != 0 && recv.last().is_some_and(|b| b >> used != 0) {
        return Err(Error::Wire(crate::error::WireError::ReservedNonZero));
    }
    Ok(())
}

/// P`party`'s additive share of a bit after B2A: `e + (1 − 2e)·[ρ]`, with
/// `e` the opened `b ⊕ ρ` and `rho` this party's additive share of ρ.
#[inline(always)]
pub const fn b2a_share(w: Width, party: u64, e: u64, rho: u64) -> u64 {
    let e = e & 1;
    let sign = w.sub(1, w.mul(2, e));
    w.add(e & (party ^ 1), w.mul(sign, rho))
}

/// This party's share of `x·y` after opening `d = x − a`, `e = y − b`:
/// `c + d·b + e·a`, plus `d·e` for P0.
#[inline(always)]
pub const fn beaver_share(w: Width, party: u64, d: u64, e: u64, a: u64, b: u64, c: u64) -> u64 {
    let mut z = w.add(c, w.add(w.mul(d, b), w.mul(e, a)));
    if party == 0 {
        z = w.add(z, w.mul(d, e));
    }
    z
}

/// This party's XOR share of `x ∧ y` after opening `d = x ⊕ α`, `e = y ⊕ β`.
#[inline(always)]
pub const fn and_share(party: u64, d: u64, e: u64, alpha: u64, beta: u64, gamma: u64) -> u64 {
    (gamma ^ (d & beta) ^ (e & alpha) ^ (d & e & (party ^ 1))) & 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn b2a_beaver_and_reconstruct() {
        let w = Width::of(13);
        for b in 0..2u64 {
            for rho in 0..2u64 {
                for r0 in [0u64, 1, 4095, 8191] {
                    let r1 = w.sub(rho, r0);
                    let e = b ^ rho;
                    let s = w.add(b2a_share(w, 0, e, r0), b2a_share(w, 1, e, r1));
                    assert_eq!(s, b);
                }
            }
        }
        let (x, y, a, bb) = (1234u64, 777u64, 4000u64, 99u64);
        let c = w.mul(a, bb);
        let (x0, a0, b0, c0) = (5u64, 17u64, 8000u64, 3u64);
        let (x1, a1, b1, c1) = (w.sub(x, x0), w.sub(a, a0), w.sub(bb, b0), w.sub(c, c0));
        let (y0, y1) = (100u64, w.sub(y, 100));
        let d = w.sub(w.add(x0, x1), a);
        let e = w.sub(w.add(y0, y1), bb);
        let z = w.add(
            beaver_share(w, 0, d, e, a0, b0, c0),
            beaver_share(w, 1, d, e, a1, b1, c1),
        );
        assert_eq!(z, w.mul(x, y));
        for v in 0..16u64 {
            let (x, y, al, be) = (v & 1, (v >> 1) & 1, (v >> 2) & 1, (v >> 3) & 1);
            let g = al & be;
            let (al0, be0, g0) = (1u64, 0u64, 1u64);
            let d = x ^ al;
            let e = y ^ be;
            let z =
                and_share(0, d, e, al0, be0, g0) ^ and_share(1, d, e, al ^ al0, be ^ be0, g ^ g0);
            assert_eq!(z, x & y);
        }
    }

    #[test]
    fn packed_bits_round_trip_and_reject_padding() {
        let bits = [1u64, 0, 1, 1, 0, 0, 0, 1, 1, 1];
        let mut buf = [0u8; 2];
        pack_bits(&bits, &mut buf).unwrap();
        let zero = [0u64; 10];
        let mut out = [0u64; 10];
        open_bits_finish(&zero, &buf, &mut out).unwrap();
        assert_eq!(out, bits);
        buf[1] |= 0x80;
        assert!(open_bits_finish(&zero, &buf, &mut out).is_err());
    }
}
