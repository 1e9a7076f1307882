//! The bit-output DCF/DPF walk on AVX-512 with VAES, four evaluations per
//! register.
//!
//! It computes exactly what core's `fss::eval_queries` computes (the
//! conformance harness checks that bit for bit) but keeps seeds, hashes and
//! correction words in 512-bit registers, applies control bits through mask
//! registers, and prefetches each key's correction words a few levels ahead,
//! because one key per evaluation means one independent memory stream per
//! lane.

use core::arch::x86_64::*;
use suffuse_core::fss::{KeyBatch, Kind, Output};

use super::Vaes512;

/// Evaluations per lockstep group: eight registers of four.
const GROUP: usize = 32;
const QUADS: usize = GROUP / 4;
/// How many levels ahead correction words are prefetched.
const PREFETCH_LEVELS: u32 = 6;

/// Whether [`eval_bits`] handles keys of this shape.
pub(crate) fn supports(keys: &KeyBatch<'_>) -> bool {
    matches!(keys.params().output(), Output::Bit)
}

/// Bit-output evaluation of queries `first..first + points.len()`, query `q`
/// being key `q / per_key` at `points[q − first]`, in whole groups; returns
/// how many queries it did (a multiple of the group size) and the AES calls.
///
/// Callers check [`supports`], the buffer lengths and that `h` can walk.
pub(crate) fn eval_bits(
    h: &Vaes512,
    keys: &KeyBatch<'_>,
    per_key: usize,
    first: usize,
    points: &[u64],
    out: &mut [u64],
) -> (usize, u64) {
    debug_assert!(h.walks);
    let mut calls = 0;
    let mut q = 0;
    while q + GROUP <= points.len() {
        if q + 2 * GROUP <= points.len() {
            super::prefetch_heads(keys, per_key, first + q + GROUP, GROUP);
        }
        // SAFETY: `h.walks` records that AVX-512F, AVX-512DQ and VAES exist.
        calls += unsafe {
            walk_group(
                h,
                keys,
                per_key,
                first + q,
                &points[q..q + GROUP],
                &mut out[q..q + GROUP],
            )
        };
        q += GROUP;
    }
    (q, calls)
}

/// Loads the 16-byte block at `p` into the 128-bit lane `LANE` of `v`.
#[inline(always)]
unsafe fn insert<const LANE: i32>(v: __m512i, p: *const u8) -> __m512i {
    // SAFETY: the caller guarantees 16 readable bytes at `p`; AVX-512F is
    // enabled by the calling function.
    unsafe { _mm512_inserti64x2::<LANE>(v, _mm_loadu_si128(p.cast())) }
}

/// # Safety
/// The CPU must support AVX-512F, AVX-512DQ and VAES.
#[target_feature(enable = "avx512f,avx512dq,vaes")]
unsafe fn walk_group(
    h: &Vaes512,
    keys: &KeyBatch<'_>,
    per_key: usize,
    first: usize,
    points: &[u64],
    out: &mut [u64],
) -> u64 {
    let p = keys.params();
    let k = p.domain().bits();
    let levels = p.levels();
    let dcf = p.kind() == Kind::Dcf;
    let rk_tree = &h.keys[0];
    let rk_leaf = &h.keys[1];

    let mut key_ptr = [core::ptr::null::<u8>(); GROUP];
    let mut root_ptr = [core::ptr::null::<u8>(); GROUP];
    let mut x = [0u64; GROUP];
    for j in 0..GROUP {
        let key = keys.key((first + j) / per_key);
        key_ptr[j] = key.body().as_ptr();
        root_ptr[j] = key.root().as_ptr();
        x[j] = points[j] & p.domain().mask();
    }

    let lsb_lo = _mm512_set_epi64(0, 1, 0, 1, 0, 1, 0, 1);
    let hi_half = _mm512_set_epi64(-1, 0, -1, 0, -1, 0, -1, 0);
    let ones = _mm512_set1_epi64(1);

    let mut s = [_mm512_setzero_si512(); QUADS];
    let mut xv = [_mm512_setzero_si512(); QUADS];
    for q in 0..QUADS {
        let b = 4 * q;
        // SAFETY: a key's root is 16 bytes.
        s[q] = unsafe {
            let v = _mm512_castsi128_si512(_mm_loadu_si128(root_ptr[b].cast()));
            let v = insert::<1>(v, root_ptr[b + 1]);
            let v = insert::<2>(v, root_ptr[b + 2]);
            insert::<3>(v, root_ptr[b + 3])
        };
        // Both 64-bit halves of a lane carry that lane's point.
        xv[q] = _mm512_set_epi64(
            x[b + 3] as i64,
            x[b + 3] as i64,
            x[b + 2] as i64,
            x[b + 2] as i64,
            x[b + 1] as i64,
            x[b + 1] as i64,
            x[b] as i64,
            x[b] as i64,
        );
    }
    // DCF accumulator per lane, in the low bit of each lane's low half.
    let mut acc = [_mm512_setzero_si512(); QUADS];

    for level in 0..levels {
        let off = p.body_cw_offset(level);
        if level + PREFETCH_LEVELS < levels {
            let ahead = p.body_cw_offset(level + PREFETCH_LEVELS);
            for ptr in key_ptr {
                // SAFETY: prefetching never faults; the address is inside the key.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(ptr.add(ahead).cast()) };
            }
        }
        let shift = _mm_set_epi64x(0, i64::from(k - 1 - level));

        let mut y = [_mm512_setzero_si512(); QUADS];
        let mut b = [_mm512_setzero_si512(); QUADS];
        for q in 0..QUADS {
            y[q] = _mm512_xor_si512(
                _mm512_shuffle_epi32(s[q], _MM_PERM_BADC),
                _mm512_and_si512(s[q], hi_half),
            );
            b[q] = _mm512_xor_si512(y[q], rk_tree[0]);
        }
        for rk in &rk_tree[1..10] {
            for v in b.iter_mut() {
                *v = _mm512_aesenc_epi128(*v, *rk);
            }
        }
        for q in 0..QUADS {
            let hq = _mm512_xor_si512(_mm512_aesenclast_epi128(b[q], rk_tree[10]), y[q]);
            let base = 4 * q;
            // SAFETY: level < levels, so `off + 16 ≤ body_len` for every key.
            let cw = unsafe {
                let v = _mm512_castsi128_si512(_mm_loadu_si128(key_ptr[base].add(off).cast()));
                let v = insert::<1>(v, key_ptr[base + 1].add(off));
                let v = insert::<2>(v, key_ptr[base + 2].add(off));
                insert::<3>(v, key_ptr[base + 3].add(off))
            };
            // Control bit t = lsb(s), applied to both halves of its lane.
            let t = _mm512_test_epi64_mask(s[q], lsb_lo);
            let t = t | (t << 1);
            let left = _mm512_mask_xor_epi64(hq, t, hq, cw);
            let right = _mm512_xor_si512(left, s[q]);
            let xb = _mm512_test_epi64_mask(_mm512_srl_epi64(xv[q], shift), ones);
            if dcf {
                // x_i = 0: the right sibling's control bit shares [x < α]
                // here; kept in vector registers, applied under the mask.
                acc[q] =
                    _mm512_mask_xor_epi64(acc[q], !xb, acc[q], _mm512_and_si512(right, lsb_lo));
            }
            s[q] = _mm512_mask_blend_epi64(xb, left, right);
        }
    }

    // Leaf: H_leaf(s) ⊕ t·LCW, then the bit at x mod 2^ν.
    let leaf_off = p.body_leaf_offset();
    let mut y = [_mm512_setzero_si512(); QUADS];
    let mut b = [_mm512_setzero_si512(); QUADS];
    for q in 0..QUADS {
        y[q] = _mm512_xor_si512(
            _mm512_shuffle_epi32(s[q], _MM_PERM_BADC),
            _mm512_and_si512(s[q], hi_half),
        );
        b[q] = _mm512_xor_si512(y[q], rk_leaf[0]);
    }
    for rk in &rk_leaf[1..10] {
        for v in b.iter_mut() {
            *v = _mm512_aesenc_epi128(*v, *rk);
        }
    }
    let lane_mask = (1u64 << p.leaf_bits()) - 1;
    let mut leaf = [0u64; 2 * GROUP];
    let mut accs = [0u64; 2 * GROUP];
    for q in 0..QUADS {
        let hq = _mm512_xor_si512(_mm512_aesenclast_epi128(b[q], rk_leaf[10]), y[q]);
        let base = 4 * q;
        // SAFETY: the leaf correction is the body's last 16 bytes.
        let lcw = unsafe {
            let v = _mm512_castsi128_si512(_mm_loadu_si128(key_ptr[base].add(leaf_off).cast()));
            let v = insert::<1>(v, key_ptr[base + 1].add(leaf_off));
            let v = insert::<2>(v, key_ptr[base + 2].add(leaf_off));
            insert::<3>(v, key_ptr[base + 3].add(leaf_off))
        };
        let t = _mm512_test_epi64_mask(s[q], lsb_lo);
        let t = t | (t << 1);
        let v = _mm512_mask_xor_epi64(hq, t, hq, lcw);
        // SAFETY: `leaf` and `accs` have room for eight words at 8q.
        unsafe {
            _mm512_storeu_si512(leaf.as_mut_ptr().add(8 * q).cast(), v);
            _mm512_storeu_si512(accs.as_mut_ptr().add(8 * q).cast(), acc[q]);
        }
    }
    for j in 0..GROUP {
        let lane = x[j] & lane_mask;
        let word = leaf[2 * j + usize::from(lane >= 64)];
        let bit = (word >> (lane & 63)) & 1;
        let acc_bit = accs[2 * j] & 1;
        out[j] = bit ^ acc_bit;
    }
    GROUP as u64 * u64::from(levels + 1)
}
