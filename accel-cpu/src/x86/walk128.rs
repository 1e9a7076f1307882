//! The bit-output DCF/DPF walk on AES-NI, one evaluation per register: the
//! 128-bit counterpart of `walk256.rs` for CPUs without VAES.
//!
//! It computes exactly what core's `fss::eval_queries` computes (the
//! conformance harness checks that bit for bit), with control bits as
//! arithmetic masks and the next group's keys prefetched into L2 while a
//! group is walked ([`super::Ahead`]), which core's walk cannot do.

use core::arch::x86_64::*;
use suffuse_core::fss::{KeyBatch, Kind};

use super::{AesNi, Heads};

/// Evaluations per lockstep group: sixteen blocks in flight per level,
/// twice AES-NI's latency × throughput.
const GROUP: usize = 16;

/// Bit-output evaluation of queries `first..first + points.len()`, query `q`
/// being key `q / per_key` at `points[q − first]`, in whole groups; returns
/// how many queries it did (a multiple of the group size) and the AES calls.
///
/// Callers check `walk::supports`, the buffer lengths and the key count.
pub(crate) fn eval_bits(
    h: &AesNi,
    keys: &KeyBatch<'_>,
    per_key: usize,
    first: usize,
    points: &[u64],
    out: &mut [u64],
) -> (usize, u64) {
    super::by_groups((h, GROUP, walk_group), keys, per_key, first, points, out)
}

/// All ones if the block's low bit is set, else zero.
#[target_feature(enable = "sse2")]
#[inline]
fn lsb_mask(s: __m128i, lsb_lo: __m128i) -> __m128i {
    let t = _mm_sub_epi64(_mm_setzero_si128(), _mm_and_si128(s, lsb_lo));
    _mm_shuffle_epi32(t, 0x44)
}

/// `H(s)` for every lane: the fixed-key hash with round keys `rk`.
#[target_feature(enable = "aes,sse2")]
#[inline]
fn hash(s: &[__m128i; GROUP], rk: &[__m128i; 11]) -> [__m128i; GROUP] {
    let mut y = [_mm_setzero_si128(); GROUP];
    let mut b = [_mm_setzero_si128(); GROUP];
    for q in 0..GROUP {
        y[q] = super::sigma128(s[q]);
        b[q] = _mm_xor_si128(y[q], rk[0]);
    }
    for k in &rk[1..10] {
        for v in b.iter_mut() {
            *v = _mm_aesenc_si128(*v, *k);
        }
    }
    for q in 0..GROUP {
        b[q] = _mm_xor_si128(_mm_aesenclast_si128(b[q], rk[10]), y[q]);
    }
    b
}

/// # Safety
/// The CPU must support AES-NI; `points` and `out` hold `GROUP` entries and
/// keys `first / per_key ..` cover them.
#[target_feature(enable = "aes,sse2")]
unsafe fn walk_group(
    h: &AesNi,
    keys: &KeyBatch<'_>,
    per_key: usize,
    first: usize,
    points: &[u64],
    out: &mut [u64],
    next: &super::Ahead<'_>,
) -> u64 {
    let p = keys.params();
    let k = p.domain().bits();
    let levels = p.levels();
    let dcf = p.kind() == Kind::Dcf;
    let rk_tree = &h.keys[0].0;
    let rk_leaf = &h.keys[1].0;

    let heads = Heads::<GROUP>::new(keys, per_key, first, points);
    let (key_ptr, x) = (&heads.body, &heads.x);
    let mut s = [_mm_setzero_si128(); GROUP];
    for (s, root) in s.iter_mut().zip(heads.root) {
        // SAFETY: a key's root is 16 bytes.
        *s = unsafe { _mm_loadu_si128(root.cast()) };
    }
    let lsb_lo = _mm_set_epi64x(0, 1);
    let mut acc = [0u64; GROUP];

    for level in 0..levels {
        let off = p.body_cw_offset(level);
        next.step(level);
        let shift = k - 1 - level;
        let hs = hash(&s, rk_tree);
        for j in 0..GROUP {
            // SAFETY: level < levels, so `off + 16 ≤ body_len` for every key.
            let cw = unsafe { _mm_loadu_si128(key_ptr[j].add(off).cast()) };
            let t = lsb_mask(s[j], lsb_lo);
            let left = _mm_xor_si128(hs[j], _mm_and_si128(cw, t));
            let right = _mm_xor_si128(left, s[j]);
            // The point is public: its bit may steer a scalar mask.
            let xb = 0u64.wrapping_sub((x[j] >> shift) & 1);
            if dcf {
                // x_i = 0: the right sibling's control bit shares [x < α].
                acc[j] ^= (_mm_cvtsi128_si64(right) as u64) & 1 & !xb;
            }
            // s ← x_i ? right : left, where right = left ⊕ s.
            let m = _mm_set1_epi64x(xb as i64);
            s[j] = _mm_xor_si128(left, _mm_and_si128(m, s[j]));
        }
    }

    // Leaf: H_leaf(s) ⊕ t·LCW, then the bit at x mod 2^ν.
    let leaf_off = p.body_leaf_offset();
    let hs = hash(&s, rk_leaf);
    let lane_mask = (1u64 << p.leaf_bits()) - 1;
    for j in 0..GROUP {
        // SAFETY: the leaf correction is the body's last 16 bytes.
        let lcw = unsafe { _mm_loadu_si128(key_ptr[j].add(leaf_off).cast()) };
        let t = lsb_mask(s[j], lsb_lo);
        let v = _mm_xor_si128(hs[j], _mm_and_si128(lcw, t));
        let mut words = [0u64; 2];
        // SAFETY: `words` has room for 16 bytes.
        unsafe { _mm_storeu_si128(words.as_mut_ptr().cast(), v) };
        let lane = x[j] & lane_mask;
        let word = words[usize::from(lane >= 64)];
        out[j] = ((word >> (lane & 63)) & 1) ^ acc[j];
    }
    GROUP as u64 * u64::from(levels + 1)
}
