//! Scaled dot-product attention on secret heads, shared by every
//! architecture: scores `trunc(Q·Kᵀ)`, the additive key bias, softmax as
//! max tree → nExp → row sum → reciprocal, and `trunc(E·V)` scaled by the
//! reciprocal (normalizing after the product touches `rows·d_h` values
//! instead of `rows·keys`).
//!
//! **Causal attention** computes the scores of the entries `j ≤ i` only:
//! after the (local) product, the lower triangle of each block is packed
//! into a flat tensor, and the truncation and nExp run on those
//! `L(L+1)/2` elements per block. No −∞ mask is ever added. The max tree
//! still wants rectangular rows, so each row is spread back to `L` values
//! with the entries `j > i` set to the row's own diagonal score, a real
//! value that changes no maximum; the exponents of those entries are 0
//! (public), so the row sums and `E·V` see exact zeros there.

use super::bound::{self, Bound};
use super::scale::{
    INVERSE_REL_ERR, NexpRange, nexp_range, nexp_scale, nexp_spline, spline_width, truncate,
    truncate_decoding, ulp,
};
use super::step;
use super::{Band, Builder, Category, ChainSpec, GateSpec, InverseSpec, Kind, PlanError};
use crate::fixed::{self, FRAC};
use suffuse_core::gate::max::ONE_ROUND_TAIL;

/// The secret heads of one attention: `blocks` independent (query, key)
/// blocks, each with `queries` query rows and `keys` key rows.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    /// Queries `[blocks·queries × d_h]` at FRAC.
    pub q: usize,
    /// Keys `[blocks·keys × d_h]` at FRAC.
    pub k: usize,
    /// Values `[blocks·keys × d_h]` at FRAC.
    pub v: usize,
    /// Independent blocks (sentences × heads).
    pub blocks: usize,
    /// Query rows per block.
    pub queries: usize,
    /// Key rows per block.
    pub keys: usize,
    /// Query row `i` sees keys `j ≤ i` only (needs `queries == keys`).
    pub causal: bool,
    /// A sliding window: the query at position `p` (the block's queries
    /// are its last `queries` keys) sees keys `p − window < j ≤ p` only.
    pub window: Option<usize>,
    /// The model's position limit, which no row's keys exceed: the
    /// softmax reciprocal's bits follow it ([`fixed::recip_frac`]).
    pub positions: usize,
}

impl Heads {
    /// The band of keys each query sees: the causal square, a sliding
    /// window narrower than the keys, or `None` when every query sees
    /// every key.
    fn band(&self) -> Option<Band> {
        let window = self.window.filter(|w| *w < self.keys);
        match (self.causal, window) {
            (_, Some(window)) => Some(Band {
                queries: self.queries,
                window,
            }),
            (true, None) => Some(Band::causal(self.queries)),
            (false, None) => None,
        }
    }
}

/// Plans attention with scores bounded by `score_max` in magnitude and
/// the additive key bias `bias` (`[bias rows × keys]`, rows spread evenly
/// over the blocks; padding carries `−c`). Returns the heads' outputs
/// `[blocks·queries × d_h]` at FRAC plus the reciprocal's bits
/// ([`fixed::recip_frac`]) and the score bound.
pub fn attend(
    b: &mut Builder,
    h: Heads,
    score_max: f64,
    bias: usize,
    c: f64,
    l: usize,
) -> Result<(usize, f64), PlanError> {
    let (s, score_abs) = scores(b, h, score_max, l)?;
    let (e, ex) = exponents(b, h, s, (bias, c), score_abs, l)?;
    let o = weighted_values(b, h, e, &ex, l)?;
    Ok((o, score_abs))
}

/// The scores `trunc(Q·Kᵀ)` at FRAC (the band's entries only, where there
/// is one) and their proven bound.
fn scores(b: &mut Builder, h: Heads, score_max: f64, l: usize) -> Result<(usize, f64), PlanError> {
    let (rows, keys) = (h.blocks * h.queries, h.keys);
    let band = h.band();
    let dh = b.info(h.q).cols;
    b.at(Category::AttentionMatmul, Some(l));
    let s2 = b.tensor(
        format!("layer {l} scores product"),
        rows,
        keys,
        2 * FRAC,
        Bound::uniform(keys, score_max),
    )?;
    b.push(step::MatMul {
        a: h.q,
        b: h.k,
        transpose_b: true,
        batches: h.blocks,
        m: h.queries,
        k: dh,
        n: keys,
        out: s2,
    });
    b.at(Category::Truncation, Some(l));
    let s2 = if let Some(band) = band {
        triangle(b, s2, band, format!("layer {l} causal scores product"))?
    } else {
        s2
    };
    let s = truncate_decoding(b, s2, FRAC, format!("layer {l} scores"))?;
    let score_abs = b.info(s).bound.max_abs();
    Ok((s, score_abs))
}

/// The exponents `nExp(max(row) − s)` of the biased scores, narrowed for
/// the weighted sum and spread back over the rows where there is a band:
/// the tensor and its [`Exponents`] record.
fn exponents(
    b: &mut Builder,
    h: Heads,
    s: usize,
    (bias, c): (usize, f64),
    score_abs: f64,
    l: usize,
) -> Result<(usize, Exponents), PlanError> {
    let (rows, keys) = (h.blocks * h.queries, h.keys);
    let band = h.band();

    b.at(Category::Softmax, Some(l));
    let s = match band {
        Some(band) => spread(
            b,
            s,
            [rows, keys],
            band,
            false,
            format!("layer {l} scores (j ≤ i)"),
        )?,
        None => s,
    };
    let sb = biased(b, s, (bias, c), score_abs, (rows, keys), l)?;
    let (z, z_abs) = minus_row_max(b, sb, h, score_abs, c, l)?;
    let z = match band {
        Some(band) => triangle(b, z, band, format!("layer {l} causal max − score"))?,
        None => z,
    };
    let ex = nexp_of(b, z, z_abs, l)?;
    let v_abs = b.info(h.v).bound.max_abs();
    let ex = narrow_exponents(b, ex, keys, v_abs, l)?;
    let e = match band {
        Some(band) => spread(
            b,
            ex.t,
            [rows, keys],
            band,
            false,
            format!("layer {l} exponents (j ≤ i)"),
        )?,
        None => ex.t,
    };
    Ok((e, ex))
}

/// The scores `s` (`rows × keys`) plus the additive key bias (`−c` on
/// padding), each bias row spread over its share of the score rows.
fn biased(
    b: &mut Builder,
    s: usize,
    (bias, c): (usize, f64),
    score_abs: f64,
    (rows, keys): (usize, usize),
    l: usize,
) -> Result<usize, PlanError> {
    let sb = b.tensor(
        format!("layer {l} biased scores"),
        rows,
        keys,
        FRAC,
        Bound::uniform(keys, score_abs + c),
    )?;
    let bias_rows = b.info(bias).rows.max(1);
    b.push(Kind::AddBias {
        x: s,
        bias,
        rows_per: rows / bias_rows,
        out: sb,
    });
    Ok(sb)
}

/// `nExp(z)` for `z` below `z_abs`, in the pass's form (decode passes take
/// the degree-1 pieces, docs/GATES.md).
fn nexp_of(b: &mut Builder, z: usize, z_abs: f64, l: usize) -> Result<Exponents, PlanError> {
    let linear = b.decoding();
    let range = nexp_range(linear)?;
    let e_abs = range.max.max(-range.min);
    let (zr, zc) = (b.info(z).rows, b.info(z).cols);
    let e = b.tensor(
        format!("layer {l} exponents"),
        zr,
        zc,
        nexp_scale(linear),
        Bound::uniform(zc, e_abs),
    )?;
    b.push(step::Gate {
        x: z,
        gate: GateSpec::Nexp {
            k: bound::width(z_abs, FRAC).max(spline_width(nexp_spline(linear))),
            linear,
        },
        out: e,
    });
    Ok(Exponents::of_nexp(e, e_abs, range, linear))
}

/// `(E·V)·(1/Σe)` per row: the reciprocal of the row sums and the weighted
/// values' product run in two lanes, then one row product; the heads'
/// outputs at FRAC plus the reciprocal's bits.
fn weighted_values(
    b: &mut Builder,
    h: Heads,
    e: usize,
    ex: &Exponents,
    l: usize,
) -> Result<usize, PlanError> {
    let (rows, keys) = (h.blocks * h.queries, h.keys);
    let dh = b.info(h.q).cols;
    let vb = b.info(h.v).bound.clone();
    // The reciprocal of the row sums and the weighted values are
    // independent: two lanes whose rounds are shared.
    b.begin_lanes();
    let recip_frac = fixed::recip_frac(h.positions);
    let (inv, inv_max) = reciprocal_of_sums(b, e, (keys, recip_frac), ex, l)?;
    b.next_lane();

    // |Σⱼ eᵢⱼ vⱼ| ≤ L·max|e|·|v|, truncated, then scaled by 1/Σe.
    b.at(Category::AttentionMatmul, Some(l));
    let sum_max = keys as f64 * ex.abs;
    let ev = b.tensor(
        format!("layer {l} weighted values product"),
        rows,
        dh,
        ex.scale + FRAC,
        vb.scale(sum_max, 0.0),
    )?;
    b.push(step::MatMul {
        a: e,
        b: h.v,
        transpose_b: false,
        batches: h.blocks,
        m: h.queries,
        k: keys,
        n: dh,
        out: ev,
    });
    b.at(Category::Truncation, Some(l));
    let evt = truncate(b, ev, FRAC, format!("layer {l} weighted values"))?;
    b.end_lanes()?;
    b.at(Category::Softmax, Some(l));
    // |oᵢ| ≤ inv·Σⱼ|eᵢⱼ|·|vⱼ| ≤ (inv·Σe + inv·2L·|e_min|)·|v| + inv·ulp.
    let neg = (-ex.min).max(0.0);
    let o_scale = 1.0 + INVERSE_REL_ERR + inv_max * 2.0 * keys as f64 * neg;
    let o = b.tensor(
        format!("layer {l} attention heads"),
        rows,
        dh,
        FRAC + recip_frac,
        vb.scale(o_scale, inv_max * ulp(FRAC)),
    )?;
    b.push(step::MulRows {
        x: evt,
        v: inv,
        out: o,
    });
    Ok(o)
}

/// `z = max(row) − s` for the biased scores `sb`, with its bound.
fn minus_row_max(
    b: &mut Builder,
    sb: usize,
    h: Heads,
    score_abs: f64,
    c: f64,
    l: usize,
) -> Result<(usize, f64), PlanError> {
    let (rows, keys) = (h.blocks * h.queries, h.keys);
    let kmax = bound::width(2.0 * (score_abs + c) + 4.0 * ulp(FRAC), FRAC);
    // A row with a real key (every row of a non-causal block: the first
    // token is real; a causal row at a real position: its own key) has a
    // real maximum. A causal row at a left-padding position sees padded
    // keys only, its maximum lies c lower.
    // A windowed row counts as causal: it may see padded keys only.
    let band = h.band();
    let m_abs = if band.is_some() {
        score_abs + c
    } else {
        score_abs
    };
    let max_in = if let Some(band) = band {
        let packed = triangle(b, sb, band, format!("layer {l} causal biased scores"))?;
        spread(
            b,
            packed,
            [rows, keys],
            band,
            true,
            format!("layer {l} rows for the max"),
        )?
    } else {
        sb
    };
    let m = match band {
        Some(_) if h.queries == keys && keys > 1 => causal_max(b, max_in, h, (kmax, m_abs), l)?,
        _ => row_max(b, max_in, (kmax, m_abs), format!("layer {l} row max"))?,
    };
    let z_abs = 2.0 * score_abs + c;
    let z = b.tensor(
        format!("layer {l} max − score"),
        rows,
        keys,
        FRAC,
        Bound::uniform(keys, z_abs),
    )?;
    b.push(Kind::RowMinus {
        v: m,
        x: sb,
        out: z,
    });
    Ok((z, z_abs))
}

/// The maxima of `x`'s rows by a comparison tree over differences of
/// width `k`, each below `m_abs`.
fn row_max(
    b: &mut Builder,
    x: usize,
    (k, m_abs): (u32, f64),
    name: String,
) -> Result<usize, PlanError> {
    let rows = b.info(x).rows;
    let m = b.tensor(name, rows, 1, FRAC, Bound::uniform(1, m_abs))?;
    // A decode pass has one row per head: its levels all take one round.
    let tail = if b.decoding() {
        DECODE_TAIL
    } else {
        ONE_ROUND_TAIL
    };
    b.push(step::Max {
        x,
        k,
        out: m,
        causal: 0,
        tail,
    });
    Ok(m)
}

/// One-round levels at the end of a decode pass's max tree: two more than
/// a prefill's. A decode pass's rows are its heads (9 of 65 keys for
/// SmolLM2 at context 64), so the fifth-last level's 8 ReLUs a row cost
/// 2.1 MB more keys per token for 30 rounds fewer, and, since the
/// one-round ReLU holds one pair key, the sixth-last level's 16 cost 2.4
/// MB more for 30 more (`docs/PLAN.md`, "One round in decode passes" and
/// "One pair key per one-round ReLU"); the level above that would cost
/// about 4.8 MB.
const DECODE_TAIL: usize = 6;

/// The row maxima of a prefill's causal (or banded) square blocks `x`
/// (`[blocks·L × L]`, each row's keys after its own already replaced by
/// its diagonal): row `i` of a block sees keys `0..=i` only, so one causal
/// tree (`MaxTree::causal`) takes each row's first `i + 1` values,
/// `L(L−1)/2` comparisons per block where a tree over whole rows takes
/// `L(L−1)`. The same maxima, in the rounds of a tree over `L` values.
fn causal_max(
    b: &mut Builder,
    x: usize,
    h: Heads,
    (k, m_abs): (u32, f64),
    l: usize,
) -> Result<usize, PlanError> {
    let rows = b.info(x).rows;
    let name = format!("layer {l} row max");
    let m = b.tensor(name, rows, 1, FRAC, Bound::uniform(1, m_abs))?;
    b.push(step::Max {
        x,
        k,
        out: m,
        causal: h.keys,
        tail: ONE_ROUND_TAIL,
    });
    Ok(m)
}

/// Row sums of the exponents `e` and their reciprocal at `frac_out`;
/// returns it and its bound.
fn reciprocal_of_sums(
    b: &mut Builder,
    e: usize,
    (keys, frac_out): (usize, u32),
    ex: &Exponents,
    l: usize,
) -> Result<(usize, f64), PlanError> {
    let rows = b.info(e).rows;
    let e_scale = ex.scale;
    let neg = (-ex.min).max(0.0);
    let sum_max = keys as f64 * ex.abs;
    let sum = b.tensor(
        format!("layer {l} exponent sums"),
        rows,
        1,
        e_scale,
        Bound::uniform(1, sum_max),
    )?;
    b.push(Kind::RowSum { x: e, out: sum });
    // The max's own column contributes nExp(0) ≈ 1; the lowest octave of
    // the reciprocal starts at 1/2, below which it saturates.
    let sum_min = (ex.zero - (keys as f64 - 1.0) * neg).max(0.5);
    let inv_max = (1.0 + INVERSE_REL_ERR) / sum_min + ulp(frac_out);
    let inv = b.tensor(
        format!("layer {l} 1/sum"),
        rows,
        1,
        frac_out,
        Bound::uniform(1, inv_max),
    )?;
    b.push(step::Chain {
        x: sum,
        spec: ChainSpec::Inverse(InverseSpec {
            rsqrt: false,
            frac_in: e_scale,
            k_in: bound::width(sum_max, e_scale),
            lo_bits: e_scale - 1,
            frac_out,
            table: b.decoding(),
        }),
        out: inv,
    });
    Ok((inv, inv_max))
}

/// Exponents `e = nExp(z)` as the weighted sum and the row sums use them:
/// the tensor, its scale, the range of its values and the value at
/// `z = 0` (the row maximum's own column).
struct Exponents {
    t: usize,
    scale: u32,
    abs: f64,
    min: f64,
    zero: f64,
}

impl Exponents {
    /// The nExp gate's output `e` (values in `range`, at most `e_abs` in
    /// magnitude), at the spline's scale.
    fn of_nexp(e: usize, e_abs: f64, range: NexpRange, linear: bool) -> Self {
        Self {
            t: e,
            scale: nexp_scale(linear),
            abs: e_abs,
            min: range.min,
            zero: range.zero,
        }
    }
}

/// The widest product of two secret tensors (`E·V`, a gated MLP's
/// `SiLU(g) ⊙ u`) kept without narrowing an operand first.
pub(super) const PRODUCT_MAX_K: u32 = 61;

/// The exponents at a scale where `E·V`'s proven bound, `L·max|e|·max|v|`,
/// fits the ring: unchanged unless the context is long or the values are
/// large, and then truncated by just the excess bits (each exponent drops
/// by less than one unit of the new scale, far below FRAC).
fn narrow_exponents(
    b: &mut Builder,
    ex: Exponents,
    keys: usize,
    v_abs: f64,
    l: usize,
) -> Result<Exponents, PlanError> {
    let excess = bound::width(keys as f64 * (ex.abs + ulp(FRAC)) * v_abs, ex.scale + FRAC)
        .saturating_sub(PRODUCT_MAX_K);
    if excess == 0 {
        return Ok(ex);
    }
    let to = ex.scale.saturating_sub(excess).max(FRAC);
    b.at(Category::Truncation, Some(l));
    let t = truncate(b, ex.t, to, format!("layer {l} exponents (narrowed)"))?;
    b.at(Category::Softmax, Some(l));
    Ok(Exponents {
        t,
        scale: to,
        abs: ex.abs.max(-ex.min) + ulp(to),
        min: ex.min - ulp(to),
        zero: ex.zero - ulp(to),
    })
}

/// The lower triangles (`j ≤ i`) of the square blocks of `x`, packed.
fn triangle(b: &mut Builder, x: usize, band: Band, name: String) -> Result<usize, PlanError> {
    let xi = b.info(x).clone();
    let keys = xi.cols;
    let blocks = xi.rows / band.queries.max(1);
    let abs = xi.bound.max_abs();
    let out = b.tensor(
        name,
        blocks * band.packed(keys),
        1,
        xi.scale,
        Bound::uniform(1, abs),
    )?;
    b.push(Kind::Triangle {
        x,
        band: kind_band(band),
        out,
    });
    Ok(out)
}

/// The band a [`Kind`] records: none for the causal square (whose plans
/// hash as before windows existed).
fn kind_band(band: Band) -> Option<Band> {
    (band.window != usize::MAX).then_some(band)
}

/// Packed lower triangles back to `[rows × keys]`; the entries `j > i` are
/// the row's diagonal (`diagonal`) or 0.
fn spread(
    b: &mut Builder,
    x: usize,
    [rows, keys]: [usize; 2],
    band: Band,
    diagonal: bool,
    name: String,
) -> Result<usize, PlanError> {
    let xi = b.info(x).clone();
    let out = b.tensor(
        name,
        rows,
        keys,
        xi.scale,
        Bound::uniform(keys, xi.bound.max_abs()),
    )?;
    b.push(Kind::Spread {
        x,
        diagonal,
        band: kind_band(band),
        out,
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixed;
    use crate::plan::testing;

    /// The causal max's tree, each row over its own first `i + 1` keys,
    /// gives every row the maximum one tree over the whole row gives (its
    /// keys after its own are copies of its diagonal), for square blocks
    /// of 40 and 16 keys, under the causal square and a band.
    #[test]
    fn causal_maxima_equal_the_whole_rows_maxima() {
        for (keys, window) in [(40, None), (16, None), (16, Some(5))] {
            check_causal_max(keys, window);
        }
    }

    fn check_causal_max(keys: usize, window: Option<usize>) {
        let blocks = 3;
        let rows = blocks * keys;
        let (mut b, x, bias) = testing::begin(rows, keys, Bound::uniform(keys, 8.0));
        let h = Heads {
            q: x,
            k: x,
            v: x,
            blocks,
            queries: keys,
            keys,
            causal: true,
            window,
            positions: keys,
        };
        let band = h.band().unwrap();
        let packed = triangle(&mut b, x, band, "packed".into()).unwrap();
        let spread = spread(&mut b, packed, [rows, keys], band, true, "spread".into()).unwrap();
        let m_abs = 8.0;
        let k = bound::width(2.0 * m_abs + 1.0, FRAC);
        let ragged = causal_max(&mut b, spread, h, (k, m_abs), 0).unwrap();
        let whole = row_max(&mut b, spread, (k, m_abs), "whole".into()).unwrap();
        let out = b.stack_rows(&[ragged, whole], "both".into()).unwrap();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let xs: Vec<u64> = (0..rows * keys)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let unit = (state >> 11) as f64 / (1u64 << 53) as f64;
                fixed::encode(16.0 * unit - 8.0, FRAC)
            })
            .collect();
        let (plan, outs) = testing::run(b, (x, bias, out), "max", xs.clone());
        let trees = plan
            .ops
            .iter()
            .filter(|op| matches!(op.kind, Kind::Max(_)))
            .count();
        assert_eq!(trees, 2, "keys {keys}");
        let (r, w) = outs.split_at(rows);
        assert_eq!(r, w, "keys {keys}, window {window:?}");
        // And they are the maxima over each row's band.
        for (row, m) in w.iter().enumerate() {
            let i = row % keys;
            let lo = window.map_or(0, |w| (i + 1).saturating_sub(w));
            let band = &xs[row * keys + lo..=row * keys + i];
            let want = band.iter().map(|v| *v as i64).max().unwrap();
            assert_eq!(*m as i64, want, "row {row}");
        }
    }
}
