//! Keys as the kernels read them: level-major words, so that the threads of
//! a warp, which evaluate neighbouring keys, read neighbouring words.
//!
//! A batch of `n` keys with `L` levels becomes one run of words:
//!
//! | part | words | key i, level l |
//! | --- | --- | --- |
//! | roots | 2n | `2i`, `2i + 1` (low, high) |
//! | seed corrections | 2Ln | `2(l·n + i)`, `+ 1` |
//! | value corrections (ring DCF) | mLn | `m(l·n + i) + h` |
//! | leaf corrections | 2n | `2i`, `2i + 1` |
//!
//! with m the value words per level ([`value_words`]: a pair's two, one
//! for a ring DCF) and h the output word.

use suffuse_core::fss::{KeyBatch, KeyRef, Kind, Output, Params};
use suffuse_core::prg::Block;

use crate::par;

/// Where each part of a transposed batch starts, in words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offsets {
    /// Root seeds.
    pub roots: usize,
    /// Seed corrections.
    pub cw: usize,
    /// Value corrections (equal to `leaf` when the keys have none).
    pub vcw: usize,
    /// Leaf corrections.
    pub leaf: usize,
    /// Words in all.
    pub total: usize,
}

/// Value corrections per level of a key of `p`: one per output word of a
/// ring or pair DCF, none otherwise.
pub fn value_words(p: &Params) -> usize {
    match (p.kind(), p.output()) {
        (Kind::Dcf, Output::Ring(_) | Output::Pair(_)) => p.output().words(),
        _ => 0,
    }
}

/// Words one transposed key takes.
pub fn words_per_key(p: &Params) -> usize {
    let levels = p.levels() as usize;
    4 + (2 + value_words(p)) * levels
}

/// The offsets of a transposed batch of `n` keys.
pub fn offsets(p: &Params, n: usize) -> Offsets {
    let levels = p.levels() as usize;
    let cw = 2 * n;
    let vcw = cw + 2 * levels * n;
    let leaf = vcw + value_words(p) * levels * n;
    Offsets {
        roots: 0,
        cw,
        vcw,
        leaf,
        total: leaf + 2 * n,
    }
}

fn put(dst: &mut [u64], at: usize, b: Block) {
    dst[at] = b.low64();
    dst[at + 1] = b.high64();
}

/// A little-endian word of up to 8 bytes.
fn word(bytes: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b[..bytes.len()].copy_from_slice(bytes);
    u64::from_le_bytes(b)
}

/// Keys `start..end` of `keys`, transposed into `dst` (cleared first).
pub fn transpose(keys: &KeyBatch<'_>, start: usize, end: usize, dst: &mut Vec<u64>) -> Offsets {
    transpose_parts(&[(keys, start, end)], dst)
}

/// `read(key)` of each of `keys` into consecutive word pairs of `out`.
fn put_blocks(out: &mut [u64], keys: &[KeyRef<'_>], read: &dyn Fn(&KeyRef<'_>) -> Block) {
    for (w, k) in out.chunks_exact_mut(2).zip(keys) {
        put(w, 0, read(k));
    }
}

/// Keys per parallel task of [`transpose_parts`]: enough that a task's
/// words of one level fill whole cache lines many times over.
const TASK_KEYS: usize = 1 << 12;

/// The keys of several ranges of batches with the same params, one after
/// another as one batch, transposed into `dst` (cleared first).
///
/// Each part of the layout is filled on several threads (`par`): the
/// roots and leaves in runs of `TASK_KEYS` keys, the corrections level by
/// level, so that every thread writes contiguous runs.
pub fn transpose_parts(parts: &[(&KeyBatch<'_>, usize, usize)], dst: &mut Vec<u64>) -> Offsets {
    let Some((first, _, _)) = parts.first() else {
        dst.clear();
        return offsets(&Params::dcf_bit(suffuse_core::ring::Width::of(1)), 0);
    };
    let p = first.params();
    let keys: Vec<KeyRef<'_>> = parts
        .iter()
        .flat_map(|(k, a, b)| (*a..*b).map(|j| k.key(j)))
        .collect();
    let n = keys.len();
    let at = offsets(&p, n);
    dst.clear();
    dst.resize(at.total, 0);
    let (roots, rest) = dst.split_at_mut(at.cw);
    let (cw, rest) = rest.split_at_mut(at.vcw - at.cw);
    let (vcw, leaf) = rest.split_at_mut(at.leaf - at.vcw);
    let m = value_words(&p);
    let vbytes = p.value_bytes() / m.max(1);
    let by_keys = |out: &mut [u64], read: &(dyn Fn(&KeyRef<'_>) -> Block + Sync)| {
        par::zip_chunks(out, 2 * TASK_KEYS, &keys, TASK_KEYS, |o, ks| {
            put_blocks(o, ks, read);
        });
    };
    by_keys(roots, &|k| Block::read(k.root()));
    by_keys(leaf, &|k| Block::read(&k.body()[p.body_leaf_offset()..]));
    let levels: Vec<u32> = (0..p.levels()).collect();
    par::zip_chunks(cw, 2 * n, &levels, 1, |level, l| {
        let off = p.body_cw_offset(l[0]);
        put_blocks(level, &keys, &|k| Block::read(&k.body()[off..]));
    });
    if m > 0 {
        par::zip_chunks(vcw, m * n, &levels, 1, |level, l| {
            let off = p.body_cw_offset(l[0]) + 16;
            for (ws, k) in level.chunks_exact_mut(m).zip(&keys) {
                for (h, w) in ws.iter_mut().enumerate() {
                    let at = off + h * vbytes;
                    *w = word(&k.body()[at..at + vbytes]);
                }
            }
        });
    }
    at
}
