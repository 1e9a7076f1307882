//! The local operations of decoders: rearranging heads, the KV cache,
//! causal triangles and RoPE. All linear over Z_2^64 (RoPE multiplies by
//! public constants), so parties run them on shares unchanged.

use crate::plan::{Band, Kind, Plan, RopeTables};

use super::{ExecError, Store};

/// Runs one of the layout operations; `None` for any other kind.
pub(super) fn run(plan: &Plan, kind: &Kind, store: &Store) -> Option<Result<Vec<u64>, ExecError>> {
    let t = &plan.tensors;
    let get = |x: usize| store.get(plan, x);
    // An opened tensor's halves (masked values, mask share) move alike.
    let pair = t[kind.output()].paired;
    let out = match *kind {
        Kind::Triangle { x, band, .. } => {
            let band = band.unwrap_or(Band::causal(t[x].cols));
            get(x).map(|v| triangle(v, t[x].cols, band))
        }
        Kind::Spread {
            x,
            diagonal,
            band,
            out,
        } => {
            let band = band.unwrap_or(Band::causal(t[out].cols));
            get(x).map(|v| spread(v, t[out].cols, band, diagonal))
        }
        Kind::Rope { x, ref tables, .. } => get(x).map(|v| rope(v, t[x].cols, tables)),
        Kind::Heads {
            x,
            from,
            heads,
            out,
        } => get(x).map(|v| {
            halves(pair, v, &[], |v, _| {
                split_heads(v, t[x].cols, from, heads, t[out].cols)
            })
        }),
        Kind::Unheads { x, heads, .. } => get(x).map(|v| merge_heads(v, heads, t[x].cols)),
        Kind::Append {
            cache, new, heads, ..
        } => get(cache)
            .and_then(|c| get(new).map(|n| halves(pair, c, n, |c, n| append(c, n, heads)))),
        Kind::Repeat {
            x, heads, times, ..
        } => get(x).map(|v| halves(pair, v, &[], |v, _| repeat(v, heads, times))),
        Kind::Rows { x, first, out } => get(x).map(|v| {
            let cols = t[x].cols;
            halves(pair, v, &[], |v, _| {
                v[first * cols..(first + t[out].rows) * cols].to_vec()
            })
        }),
        _ => return None,
    };
    Some(out)
}

/// `f(a, b)`, or for paired tensors `f` on the first halves of `a` and
/// `b`, then on the second halves, concatenated.
fn halves(pair: bool, a: &[u64], b: &[u64], f: impl Fn(&[u64], &[u64]) -> Vec<u64>) -> Vec<u64> {
    if !pair {
        return f(a, b);
    }
    let (a0, a1) = a.split_at(a.len() / 2);
    let (b0, b1) = b.split_at(b.len() / 2);
    let mut out = f(a0, b0);
    out.extend(f(a1, b1));
    out
}

/// Row `i` of each `[l × l]` block keeps columns `0..=i`.
/// Each row's band of keys, packed row by row (`keys` per row).
fn triangle(x: &[u64], keys: usize, band: Band) -> Vec<u64> {
    let mut y = Vec::with_capacity(x.len().div_ceil(2) + keys);
    for (r, row) in x.chunks_exact(keys.max(1)).enumerate() {
        y.extend_from_slice(&row[band.range(r % band.queries.max(1), keys)]);
    }
    y
}

/// Packed bands back to rows of `keys`; the entries outside a row's band
/// are its diagonal (`diagonal`, the band's last entry) or 0.
fn spread(x: &[u64], keys: usize, band: Band, diagonal: bool) -> Vec<u64> {
    let blocks = x.len() / band.packed(keys).max(1);
    let mut y = Vec::with_capacity(blocks * band.queries * keys);
    let mut at = 0;
    for r in 0..blocks * band.queries {
        let range = band.range(r % band.queries.max(1), keys);
        let (lo, hi) = (*range.start(), *range.end());
        let row = &x[at..=at + hi - lo];
        at += hi - lo + 1;
        let fill = if diagonal { row[hi - lo] } else { 0 };
        y.extend(std::iter::repeat_n(fill, lo));
        y.extend_from_slice(row);
        y.extend(std::iter::repeat_n(fill, keys - hi - 1));
    }
    y
}

/// `(a, b) ↦ (a·cos − b·sin, a·sin + b·cos)` on every pair of the rotated
/// heads; the other columns times `2^frac`.
fn rope(x: &[u64], cols: usize, t: &RopeTables) -> Vec<u64> {
    let half = t.head_dim / 2;
    let pairs: Vec<(usize, usize, usize)> = t.pairs().collect();
    let mut y = x.to_vec();
    for (r, row) in y.chunks_exact_mut(cols.max(1)).enumerate() {
        let (c, sn) = (
            &t.cos[r * half..(r + 1) * half],
            &t.sin[r * half..(r + 1) * half],
        );
        for &(ia, ib, i) in &pairs {
            let (a, b) = (row[ia], row[ib]);
            row[ia] = a.wrapping_mul(c[i]).wrapping_sub(b.wrapping_mul(sn[i]));
            row[ib] = a.wrapping_mul(sn[i]).wrapping_add(b.wrapping_mul(c[i]));
        }
        for v in &mut row[t.rotated..] {
            *v = v.wrapping_shl(t.frac);
        }
    }
    y
}

fn split_heads(x: &[u64], cols: usize, from: usize, heads: usize, dh: usize) -> Vec<u64> {
    let rows = x.len() / cols.max(1);
    let mut y = Vec::with_capacity(heads * rows * dh);
    for h in 0..heads {
        for r in 0..rows {
            let at = r * cols + from + h * dh;
            y.extend_from_slice(&x[at..at + dh]);
        }
    }
    y
}

fn merge_heads(x: &[u64], heads: usize, dh: usize) -> Vec<u64> {
    let rows = x.len() / (heads * dh).max(1);
    let mut y = vec![0u64; x.len()];
    for (i, chunk) in x.chunks_exact(dh.max(1)).enumerate() {
        let (h, r) = (i / rows.max(1), i % rows.max(1));
        let at = r * heads * dh + h * dh;
        y[at..at + dh].copy_from_slice(chunk);
    }
    y
}

fn append(cache: &[u64], new: &[u64], heads: usize) -> Vec<u64> {
    let (n, m) = (cache.len() / heads.max(1), new.len() / heads.max(1));
    let mut y = Vec::with_capacity(cache.len() + new.len());
    for h in 0..heads {
        y.extend_from_slice(&cache[h * n..(h + 1) * n]);
        y.extend_from_slice(&new[h * m..(h + 1) * m]);
    }
    y
}

fn repeat(x: &[u64], heads: usize, times: usize) -> Vec<u64> {
    let block = x.len() / heads.max(1);
    let mut y = Vec::with_capacity(x.len() * times);
    for h in x.chunks_exact(block.max(1)) {
        for _ in 0..times {
            y.extend_from_slice(h);
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn triangle_and_spread_round_trip() {
        let l = 3;
        let x: Vec<u64> = (0..(2 * l * l) as u64).collect();
        let p = triangle(&x, l, Band::causal(l));
        assert_eq!(p, [0, 3, 4, 6, 7, 8, 9, 12, 13, 15, 16, 17]);
        let z = spread(&p, l, Band::causal(l), false);
        assert_eq!(&z[..9], &[0, 0, 0, 3, 4, 0, 6, 7, 8]);
        let d = spread(&p, l, Band::causal(l), true);
        assert_eq!(&d[9..], &[9, 9, 9, 12, 13, 13, 15, 16, 17]);
    }

    #[test]
    fn a_band_keeps_the_window_of_each_query() {
        // A block of 3 queries over 4 keys (one cached), window 2.
        let band = Band {
            queries: 3,
            window: 2,
        };
        let x: Vec<u64> = (0..12).collect();
        let p = triangle(&x, 4, band);
        assert_eq!(p, [0, 1, 5, 6, 10, 11]);
        assert_eq!(band.packed(4), 6);
        assert_eq!(
            spread(&p, 4, band, false),
            [0, 1, 0, 0, 0, 5, 6, 0, 0, 0, 10, 11]
        );
        assert_eq!(
            spread(&p, 4, band, true),
            [0, 1, 1, 1, 6, 5, 6, 6, 11, 11, 10, 11]
        );
        // A decode row sees its last `window` keys.
        let one = Band {
            queries: 1,
            window: 3,
        };
        assert_eq!(triangle(&[1, 2, 3, 4, 5], 5, one), [3, 4, 5]);
    }

    #[test]
    fn heads_round_trip_and_cache_layout() {
        let x: Vec<u64> = (0..2 * 8).collect(); // 2 rows × (2 heads of 2 + 4 more)
        let h = split_heads(&x, 8, 4, 2, 2);
        assert_eq!(h, [4, 5, 12, 13, 6, 7, 14, 15]);
        let back = merge_heads(&h, 2, 2);
        assert_eq!(back, [4, 5, 6, 7, 12, 13, 14, 15]);
        let a = append(&[1, 2, 3, 4], &[9, 8], 2);
        assert_eq!(a, [1, 2, 9, 3, 4, 8]);
        assert_eq!(repeat(&[1, 2, 3, 4], 2, 2), [1, 2, 1, 2, 3, 4, 3, 4]);
    }

    #[test]
    fn rope_styles_pair_different_columns() {
        // cos = 0, sin = 1 (at scale 0): (a, b) ↦ (−b, a).
        let x = [1u64, 2, 3, 4, 7];
        let tables = |adjacent| RopeTables {
            rotated: 4,
            head_dim: 4,
            adjacent,
            cos: vec![0, 0],
            sin: vec![1, 1],
            frac: 0,
            keep: 0,
        };
        let neg = |v: u64| v.wrapping_neg();
        let y = rope(&x, 5, &tables(true));
        assert_eq!(y, [neg(2), 1, neg(4), 3, 7]);
        let y = rope(&x, 5, &tables(false));
        assert_eq!(y, [neg(3), neg(4), 1, 2, 7]);
    }
}
