//! The bit-output DCF/DPF walk on AVX2 with VAES, two evaluations per
//! register: the VAES-256 counterpart of `walk.rs`.
//!
//! It computes exactly what core's `fss::eval_queries` computes (the
//! conformance harness checks that bit for bit). Control bits become
//! all-ones or all-zero 128-bit masks (AVX2 has no mask registers), and the
//! next group's keys are prefetched into L2 while a group is walked
//! ([`super::Ahead`]): with one key per evaluation every lane is its own
//! memory stream, and core's walk, which cannot prefetch, waits on those
//! streams at every level.

use core::arch::x86_64::*;
use suffuse_core::fss::{KeyBatch, Kind};

use super::{Heads, Vaes256};

/// Evaluations per lockstep group: sixteen registers of two, twice what
/// VAES-256's latency × throughput needs, so the serial work between levels
/// leaves the AES units busy.
const GROUP: usize = 32;
const PAIRS: usize = GROUP / 2;
/// Registers hashed round by round together: eight in flight cover
/// VAES-256's latency × throughput and leave registers for the round keys.
const HALF: usize = 8;

/// Bit-output evaluation of queries `first..first + points.len()`, query `q`
/// being key `q / per_key` at `points[q − first]`, in whole groups; returns
/// how many queries it did (a multiple of the group size) and the AES calls.
///
/// Callers check `walk::supports`, the buffer lengths and the key count.
pub(crate) fn eval_bits(
    h: &Vaes256,
    keys: &KeyBatch<'_>,
    per_key: usize,
    first: usize,
    points: &[u64],
    out: &mut [u64],
) -> (usize, u64) {
    super::by_groups((h, GROUP, walk_group), keys, per_key, first, points, out)
}

/// Two 16-byte blocks at `a` (low lane) and `b` (high lane) as one register.
///
/// # Safety
/// 16 readable bytes at each pointer; the CPU must support AVX2.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn load2(a: *const u8, b: *const u8) -> __m256i {
    // SAFETY: as documented.
    unsafe { _mm256_loadu2_m128i(b.cast(), a.cast()) }
}

/// σ(x) = `(x_L ⊕ x_R) ‖ x_L` per 128-bit lane, as the hashes apply it.
#[target_feature(enable = "avx2")]
#[inline]
fn sigma(x: __m256i, hi_half: __m256i) -> __m256i {
    _mm256_xor_si256(_mm256_shuffle_epi32(x, 0x4e), _mm256_and_si256(x, hi_half))
}

/// All ones in each 128-bit lane whose block has its low bit set.
#[target_feature(enable = "avx2")]
#[inline]
fn lsb_mask(s: __m256i, lsb_lo: __m256i) -> __m256i {
    let t = _mm256_sub_epi64(_mm256_setzero_si256(), _mm256_and_si256(s, lsb_lo));
    // Copy the low word's mask to the high word of the same lane.
    _mm256_shuffle_epi32(t, 0x44)
}

/// `H(s)` for every register: the fixed-key hash with round keys `rk`.
#[target_feature(enable = "avx2,vaes")]
#[inline]
fn hash(s: &[__m256i; PAIRS], rk: &[__m256i; 11], hi_half: __m256i) -> [__m256i; PAIRS] {
    let mut out = [_mm256_setzero_si256(); PAIRS];
    for (s, out) in s.chunks_exact(HALF).zip(out.chunks_exact_mut(HALF)) {
        let mut y = [_mm256_setzero_si256(); HALF];
        let mut b = [_mm256_setzero_si256(); HALF];
        for q in 0..HALF {
            y[q] = sigma(s[q], hi_half);
            b[q] = _mm256_xor_si256(y[q], rk[0]);
        }
        for k in &rk[1..10] {
            for v in b.iter_mut() {
                *v = _mm256_aesenc_epi128(*v, *k);
            }
        }
        for q in 0..HALF {
            out[q] = _mm256_xor_si256(_mm256_aesenclast_epi128(b[q], rk[10]), y[q]);
        }
    }
    out
}

/// # Safety
/// The CPU must support AVX2 and VAES; `points` and `out` hold `GROUP`
/// entries and keys `first / per_key ..` cover them.
#[target_feature(enable = "avx2,vaes")]
unsafe fn walk_group(
    h: &Vaes256,
    keys: &KeyBatch<'_>,
    per_key: usize,
    first: usize,
    points: &[u64],
    out: &mut [u64],
    next: &super::Ahead<'_>,
) -> u64 {
    let p = keys.params();
    let k = p.domain().bits();
    let heads = Heads::<GROUP>::new(keys, per_key, first, points);
    let lsb_lo = _mm256_set_epi64x(0, 1, 0, 1);
    let hi_half = _mm256_set_epi64x(-1, 0, -1, 0);
    let mut s = [_mm256_setzero_si256(); PAIRS];
    let mut xv = [_mm256_setzero_si256(); PAIRS];
    for q in 0..PAIRS {
        let (b, x) = (2 * q, &heads.x);
        // SAFETY: a key's root is 16 bytes.
        s[q] = unsafe { load2(heads.root[b], heads.root[b + 1]) };
        // Both 64-bit halves of a lane carry that lane's point, shifted so
        // that the first level's bit x_{k−1} is the sign bit.
        let (hi, lo) = ((x[b + 1] << (64 - k)) as i64, (x[b] << (64 - k)) as i64);
        xv[q] = _mm256_set_epi64x(hi, hi, lo, lo);
    }
    // DCF accumulator per lane: its low bit (of each lane's low half) is
    // the share; the bits above it are never read.
    let mut acc = [_mm256_setzero_si256(); PAIRS];
    for level in 0..p.levels() {
        next.step(level);
        // SAFETY: level < levels, so `off + 16 ≤ body_len` for every key.
        unsafe { step(h, keys, &heads, level, (&mut s, &mut xv, &mut acc)) };
    }

    // Leaf: H_leaf(s) ⊕ t·LCW, then the bit at x mod 2^ν.
    let leaf_off = p.body_leaf_offset();
    let hs = hash(&s, &h.keys[1], hi_half);
    let mut leaf = [0u64; 2 * GROUP];
    let mut accs = [0u64; 2 * GROUP];
    for q in 0..PAIRS {
        let b = 2 * q;
        // SAFETY: the leaf correction is the body's last 16 bytes.
        let lcw = unsafe { load2(heads.body[b].add(leaf_off), heads.body[b + 1].add(leaf_off)) };
        let t = lsb_mask(s[q], lsb_lo);
        let v = _mm256_xor_si256(hs[q], _mm256_and_si256(lcw, t));
        // SAFETY: `leaf` and `accs` have room for four words at 4q.
        unsafe {
            _mm256_storeu_si256(leaf.as_mut_ptr().add(4 * q).cast(), v);
            // Only the control bit leaves the registers: the other bits of
            // `acc` are sums of seed bits.
            let bit = _mm256_and_si256(acc[q], lsb_lo);
            _mm256_storeu_si256(accs.as_mut_ptr().add(4 * q).cast(), bit);
        }
    }
    heads.leaf_bits(p.leaf_bits(), &leaf, &accs, out);
    GROUP as u64 * u64::from(p.levels() + 1)
}

/// One level of the walk: each seed becomes its child on the point's path
/// (the point's bit for this level is each lane's sign bit, and `xv`
/// shifts to the next), and a DCF's accumulator takes the right sibling's
/// control bit where the point goes left.
///
/// # Safety
/// `level` is below the keys' levels; the CPU must support AVX2 and VAES.
#[target_feature(enable = "avx2,vaes")]
#[inline]
unsafe fn step(
    h: &Vaes256,
    keys: &KeyBatch<'_>,
    heads: &Heads<GROUP>,
    level: u32,
    (s, xv, acc): (
        &mut [__m256i; PAIRS],
        &mut [__m256i; PAIRS],
        &mut [__m256i; PAIRS],
    ),
) {
    let p = keys.params();
    let off = p.body_cw_offset(level);
    let lsb_lo = _mm256_set_epi64x(0, 1, 0, 1);
    let hs = hash(s, &h.keys[0], _mm256_set_epi64x(-1, 0, -1, 0));
    for q in 0..PAIRS {
        let b = 2 * q;
        // SAFETY: the caller's `level` keeps `off + 16` inside every body.
        let cw = unsafe { load2(heads.body[b].add(off), heads.body[b + 1].add(off)) };
        let t = lsb_mask(s[q], lsb_lo);
        let left = _mm256_xor_si256(hs[q], _mm256_and_si256(cw, t));
        let right = _mm256_xor_si256(left, s[q]);
        // All ones where x_i = 1: x_i is the sign bit at this level.
        let xb = _mm256_cmpgt_epi64(_mm256_setzero_si256(), xv[q]);
        xv[q] = _mm256_add_epi64(xv[q], xv[q]);
        if p.kind() == Kind::Dcf {
            // x_i = 0: the right sibling's control bit shares [x < α]
            // here; only the low bit of `acc` is read at the end.
            acc[q] = _mm256_xor_si256(acc[q], _mm256_andnot_si256(xb, right));
        }
        s[q] = _mm256_blendv_epi8(left, right, xb);
    }
}
