//! Keys as the kernels read them: level-major words, so that the threads of
//! a warp, which evaluate neighbouring keys, read neighbouring words.
//!
//! A batch of `n` keys with `L` levels becomes one run of words:
//!
//! | part | words | key i, level l |
//! | --- | --- | --- |
//! | roots | 2n | `2i`, `2i + 1` (low, high) |
//! | seed corrections | 2Ln | `2(l·n + i)`, `+ 1` |
//! | value corrections (ring DCF) | Ln | `l·n + i` |
//! | leaf corrections | 2n | `2i`, `2i + 1` |

use suffuse_core::fss::{KeyBatch, Kind, Output, Params};
use suffuse_core::prg::Block;

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

/// Whether keys of `p` carry a value correction per level.
pub fn has_values(p: &Params) -> bool {
    p.kind() == Kind::Dcf && matches!(p.output(), Output::Ring(_))
}

/// Words one transposed key takes.
pub fn words_per_key(p: &Params) -> usize {
    let levels = p.levels() as usize;
    4 + 2 * levels + if has_values(p) { levels } else { 0 }
}

/// The offsets of a transposed batch of `n` keys.
pub fn offsets(p: &Params, n: usize) -> Offsets {
    let levels = p.levels() as usize;
    let cw = 2 * n;
    let vcw = cw + 2 * levels * n;
    let leaf = vcw + if has_values(p) { levels * n } else { 0 };
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

/// The keys of several ranges of batches with the same params, one after
/// another as one batch, transposed into `dst` (cleared first).
pub fn transpose_parts(parts: &[(&KeyBatch<'_>, usize, usize)], dst: &mut Vec<u64>) -> Offsets {
    let Some((first, _, _)) = parts.first() else {
        dst.clear();
        return offsets(&Params::dcf_bit(suffuse_core::ring::Width::of(1)), 0);
    };
    let p = first.params();
    let n: usize = parts.iter().map(|(_, a, b)| b - a).sum();
    let at = offsets(&p, n);
    dst.clear();
    dst.resize(at.total, 0);
    let levels = p.levels() as usize;
    let vbytes = p.value_bytes();
    let mut i = 0;
    for (keys, start, end) in parts {
        for j in *start..*end {
            let key = keys.key(j);
            let body = key.body();
            put(dst, at.roots + 2 * i, Block::read(key.root()));
            for l in 0..levels {
                let off = p.body_cw_offset(l as u32);
                put(dst, at.cw + 2 * (l * n + i), Block::read(&body[off..]));
                if vbytes > 0 {
                    dst[at.vcw + l * n + i] = word(&body[off + 16..off + 16 + vbytes]);
                }
            }
            put(
                dst,
                at.leaf + 2 * i,
                Block::read(&body[p.body_leaf_offset()..]),
            );
            i += 1;
        }
    }
    at
}
