//! LayerNorm and RMSNorm as one block: `y = r − mean` (LayerNorm only),
//! `ρ = rsqrt(Σy² + d·ε)`, `out = trunc(y·ρ·(γ√d) + β)`, with the range
//! analysis that sizes the rsqrt chain's input. Shared by the encoder and
//! the decoders.

use super::bound::{self, Bound, NormForm};
use super::linear::Folded;
use super::scale::{INVERSE_REL_ERR, truncate, truncate_reading, truncate_scalar, ulp};
use super::step;
use super::{Builder, Category, ChainSpec, InverseSpec, Kind, PlanError, TensorInfo};
use crate::fixed::{self, FRAC, MEAN_FRAC, RSQRT_FRAC, WEIGHT_FRAC, encode, pow2};
use crate::model;

/// The rsqrt chain's input range, below 2^`k` (signed convention, as
/// [`bound::width`]) and saturating below 2^`lo_bits` (integer input), and
/// its output's fraction bits.
#[derive(Clone, Copy)]
struct Octaves {
    k: u32,
    lo_bits: u32,
    frac_out: u32,
}

/// For proven sums: at scale 2·FRAC, Σy² below 2^-16 saturates, i.e. rows
/// whose values all agree to about 2^-8·√(1/d); the input is below 2^56
/// (MiniLM's widest).
const PROVEN: Octaves = Octaves {
    k: 56,
    lo_bits: 8,
    frac_out: RSQRT_FRAC,
};

/// For sums checked at capacity (a deep residual stream): the widest input
/// core's chain takes at 2·FRAC (its mantissa `M < 2^(k+3)` and output
/// product must fit 64 bits), for which the floor rises to 2^-12, i.e.
/// `‖y‖ < 2^-6`, far below any residual row. ρ gets 8 more fraction bits:
/// a row of norm 10⁵ (Gemma 3's first row) has ρ ≈ 10⁻⁵, which 2^-24 holds
/// to 0.6 % only, and every channel of that row would carry it.
const CAPPED: Octaves = Octaves {
    k: 60,
    lo_bits: 12,
    frac_out: RSQRT_FRAC + 8,
};

/// ρ's fraction bits where a norm's input is checked at capacity.
///
/// ρ's rounding is relative error `‖y‖·2^-frac_out`, on every channel of
/// the row. [`CAPPED`]'s 2^-32 keeps it below 2^-12 up to the capacity
/// (Gemma 3's rows near 10⁵ need that). A pre-norm folded into the next
/// layer ([`normalize_folded`]) takes ρ at RSQRT_FRAC: below 2^-12 for
/// rows up to `‖y‖ = 2^12`, the truncation after it dropping 8 bits fewer
/// on every element. Only decoders without sandwich norms fold theirs;
/// SmolLM2's first row reaches 2.3·10⁴ (ρ's rounding 1.4·10⁻³ of that
/// row), and its logits and both decoders' accuracy tests are as good as
/// at 2^-32 (docs/DECODERS.md).
#[derive(Clone, Copy)]
enum Rho {
    /// [`CAPPED`]'s.
    Wide,
    /// RSQRT_FRAC.
    Narrow,
    /// An encoder's post-norm: [`POST_NORM_RHO_FRAC`] where its input is
    /// proven, else as `Wide`.
    Post,
}

/// ρ's fraction bits in an encoder's post-norms (`LN(x + a)` of each BERT
/// layer) whose input is proven. ρ's rounding, relative `‖y‖·2^-20`, stays
/// below 2^-12 for rows up to `‖y‖ = 2^8`, under the rsqrt chain's own
/// 3.34·10⁻⁴ (2^-11.5). A post-norm's input is a norm's output plus one
/// sublayer's, so its rows stay small: MiniLM's largest on the bench's
/// paragraph is 219 (2^-12.2 of its ρ), against proven bounds of 1.4·10³
/// to 1.8·10⁴; BERT-base's generated shape stays under 32. Each bit here
/// is one bit fewer that the norm's output truncation drops on every
/// element (the normalized rows `y·ρ` carry ρ's bits into it).
const POST_NORM_RHO_FRAC: u32 = 20;

/// The widest proven sum of squares that is narrowed for the rsqrt chain
/// (the ring check allows 62 bits; one bit of headroom for `+ d·ε`).
/// Wider proven bounds give way to the chain's checked capacity (see
/// [`norm_input`]).
const SUM_MAX_K: u32 = 61;

/// Bound of a LayerNorm output `γ·n + β` with `Σnᵢ² ≤ d`, `slack` a
/// relative allowance on n.
pub(super) fn norm_output(norm: &model::Norm, slack: f64) -> Bound {
    let d = norm.gamma.len();
    let root = ((d.max(1) - 1) as f64).sqrt() * slack;
    let abs: Vec<f64> = norm
        .gamma
        .iter()
        .zip(&norm.beta)
        .map(|(g, be)| f64::from(g.abs()) * root + f64::from(be.abs()))
        .collect();
    let gmax = norm
        .gamma
        .iter()
        .fold(0.0f64, |m, g| m.max(f64::from(g.abs())));
    let beta = norm
        .beta
        .iter()
        .map(|v| f64::from(*v) * f64::from(*v))
        .sum::<f64>()
        .sqrt();
    let mut out = Bound::from_abs(abs, d.max(1));
    out.l2[0] = out.l2[0].min(gmax * (d as f64).sqrt() * slack + beta);
    out
}

/// The bound a norm works with for its input `y` (bound `yb`, row norm
/// `y_l2`), and the rsqrt chain's range.
///
/// Where the proven `‖y‖² + d·ε` fits [`SUM_MAX_K`] bits at 2·FRAC it is
/// kept, and proven. Beyond that (a deep pre-norm residual stream, whose
/// worst case compounds every block's worst case), the norm runs at the
/// [`CAPPED`] chain's full capacity instead: `y` is taken to satisfy
/// `‖y‖² + d·ε < 2^(60 − 1 − 2·FRAC)/MARGIN`, about `‖y‖ < 1.8·10⁵`
/// (every square, sum and product after it is then exact), and the
/// reference checks it on every row at run time, as it checks every
/// proven bound. Only this assumption is not proven; docs/DECODERS.md
/// gives the margin measured on real text.
fn norm_input(
    yb: Bound,
    (y_l2, frac): (f64, u32),
    d: usize,
    eps: f32,
    rho: Rho,
) -> (Bound, f64, Octaves) {
    let de = d as f64 * f64::from(eps);
    if bound::width(y_l2 * y_l2 + de, 2 * frac) <= SUM_MAX_K {
        let frac_out = match rho {
            Rho::Post => POST_NORM_RHO_FRAC,
            Rho::Wide | Rho::Narrow => PROVEN.frac_out,
        };
        return (yb, y_l2, Octaves { frac_out, ..PROVEN });
    }
    let v_cap = (pow2(CAPPED.k - 1) - 4.0) / (bound::MARGIN * pow2(2 * frac)) * (1.0 - 1e-9);
    let cap = (v_cap - de).max(0.0).sqrt();
    debug_assert!(bound::width(cap * cap + de, 2 * frac) <= CAPPED.k);
    let mut capped = Bound::from_abs(yb.abs.iter().map(|a| a.min(cap)).collect(), d);
    capped.l2[0] = capped.l2[0].min(cap);
    let frac_out = match rho {
        Rho::Wide | Rho::Post => CAPPED.frac_out,
        Rho::Narrow => RSQRT_FRAC,
    };
    (capped, y_l2.min(cap), Octaves { frac_out, ..CAPPED })
}

/// `Σy² + d·ε` of each row of `y` (a `d`-wide tensor with bound `yb` and
/// row norm `y_l2`) at 2·FRAC, ready for the rsqrt chain whose input is
/// below 2^`k_max`: returns the tensor, its scale and its bound.
fn sum_of_squares(
    b: &mut Builder,
    y: usize,
    (yb, y_l2): (&Bound, f64),
    eps: f32,
    k_max: u32,
    name: &str,
    l: usize,
) -> Result<(usize, u32, f64), PlanError> {
    let (rows, d) = (b.info(y).rows, yb.abs.len());
    let de = d as f64 * f64::from(eps);
    let v_max = y_l2 * y_l2 + de;
    let scale = 2 * b.info(y).scale;
    let sq = b.tensor(
        format!("{name} squares"),
        rows,
        d,
        scale,
        Bound::from_abs(yb.abs.iter().map(|a| a * a).collect(), d),
    )?;
    b.square(y, sq);
    let v = b.tensor(
        format!("{name} sum of squares"),
        rows,
        1,
        scale,
        Bound::uniform(1, v_max),
    )?;
    b.push(Kind::RowSum { x: sq, out: v });
    let (v, frac_in) = ready_sum(b, v, (de, v_max), k_max, (name, l))?;
    Ok((v, frac_in, v_max))
}

/// The sum of squares `v` (bounded by `v_max`) plus `de = d·ε`, truncated
/// where the rsqrt chain's input must be below 2^`k_max`: returns it and
/// its scale.
fn ready_sum(
    b: &mut Builder,
    v: usize,
    (de, v_max): (f64, f64),
    k_max: u32,
    (name, l): (&str, usize),
) -> Result<(usize, u32), PlanError> {
    let (rows, scale) = (b.info(v).rows, b.info(v).scale);
    // LayerNorm's ε enters as d·ε (the rsqrt is of Σy², not of the mean).
    let eps = encode(de, scale);
    let v = if eps != 0 {
        let ve = b.tensor(
            format!("{name} sum of squares + dε"),
            rows,
            1,
            scale,
            Bound::uniform(1, v_max),
        )?;
        b.push(Kind::Affine {
            x: v,
            gain: vec![1],
            offset: vec![eps],
            out: ve,
        });
        ve
    } else {
        v
    };
    // The rsqrt chain's range reduction needs its input below 2^k_max: a
    // wider proven range is truncated first (one element per row), which
    // only raises the saturation floor 2^(lo_bits − frac_in).
    match bound::width(v_max, scale).checked_sub(k_max) {
        Some(shift) if shift > 0 => {
            let vt = truncate_scalar(
                b,
                v,
                scale - shift,
                format!("{name} sum of squares (narrowed)"),
            )?;
            b.at(Category::LayerNorm, Some(l));
            Ok((vt, scale - shift))
        }
        _ => Ok((v, scale)),
    }
}

/// An encoder's post-norm `LN(r)` of a residual sum `r` at FRAC, the gains
/// in the norm: the output the pooling takes.
pub(super) fn post_norm(
    b: &mut Builder,
    r: usize,
    norm: &model::Norm,
    name: String,
    l: usize,
) -> Result<(usize, NormForm), PlanError> {
    normalize_with(b, r, norm, (name, l), true, Rho::Post)
}

/// An encoder's post-norm `LN(r)` whose gains and shifts the stream
/// after it applies ([`normalize_folded`]'s output `t` and fold, with
/// ρ at a post-norm's bits): the next layer's first product folds them
/// into its weights, and its residual sum multiplies them in at the
/// product's scale (`bert.rs` `residual_sum`).
pub(super) fn post_norm_folded(
    b: &mut Builder,
    r: usize,
    norm: &model::Norm,
    name: String,
    l: usize,
) -> Result<(usize, NormForm, Folded), PlanError> {
    fold_norm(b, r, norm, (name, l), (true, Rho::Post), Output::Frac)
}

/// `z` (at `scale`) as every norm's gains' product can take it: where
/// `|z|·|γ|√d + |β|` would not fit the ring at `z`'s scale plus the gains'
/// (Gemma's sandwich norms have gains in the hundreds), `z` is first
/// truncated by just the excess bits, which drops bits far below FRAC.
/// Returns the input and its scale.
fn narrow_for_gains(
    b: &mut Builder,
    (z, scale): (usize, u32),
    zb: &Bound,
    norms: &[&model::Norm],
    name: &str,
) -> Result<(usize, u32), PlanError> {
    let root = (zb.abs.len() as f64).sqrt();
    let max = norms
        .iter()
        .flat_map(|norm| {
            zb.abs
                .iter()
                .zip(norm.gamma.iter().zip(&norm.beta))
                .map(|(z, (g, o))| {
                    z * (f64::from(g.abs()) * root + ulp(WEIGHT_FRAC)) + f64::from(o.abs())
                })
        })
        .fold(0.0f64, f64::max);
    let excess = bound::width(max, scale + WEIGHT_FRAC).saturating_sub(61);
    if excess == 0 {
        return Ok((z, scale));
    }
    let to = scale.saturating_sub(excess).max(FRAC);
    Ok((
        truncate(b, z, to, format!("{name} normalized (narrowed)"))?,
        to,
    ))
}

/// A norm's rows `z = y·ρ` before its gains: the tensor, its scale, its
/// bound and its row-norm bound.
struct Normalized {
    z: usize,
    scale: u32,
    zb: Bound,
    z_l2: f64,
}

/// LayerNorm (`centre`) or RMSNorm of `r`: `y = r − mean` (LayerNorm
/// only), `ρ = rsqrt(Σy² + d·ε)`, `out = trunc(y·ρ·(γ√d) + β)`. `r` may be
/// at any scale (its squares at twice it); the output is at FRAC.
pub(super) fn normalize(
    b: &mut Builder,
    r: usize,
    norm: &model::Norm,
    name: String,
    l: usize,
    centre: bool,
) -> Result<(usize, NormForm), PlanError> {
    normalize_with(b, r, norm, (name, l), centre, Rho::Wide)
}

/// [`normalize`] with ρ's bits chosen by `rho`.
fn normalize_with(
    b: &mut Builder,
    r: usize,
    norm: &model::Norm,
    (name, l): (String, usize),
    centre: bool,
    rho: Rho,
) -> Result<(usize, NormForm), PlanError> {
    let n = normalized(b, r, norm.eps, &name, l, centre, rho)?;
    let (z, z_scale) = narrow_for_gains(b, (n.z, n.scale), &n.zb, &[norm], &name)?;
    let (a, form) = gained(b, (z, z_scale), &n, norm, &name)?;
    Ok((truncate(b, a, FRAC, format!("{name} LayerNorm"))?, form))
}

/// [`normalize`] for a pre-norm whose output only one linear layer
/// takes: the gains `γ√d` and shifts `β` go into that layer's weights and
/// bias ([`Folded`]), and the norm outputs `t = 2^s·z` at FRAC, `z = y·ρ`
/// its normalized rows, `s` the power of two nearest the gains' RMS (so
/// that `t` holds about as many significant bits as `γ√d·z` did, and the
/// folded gains `γ√d/2^s` are near 1). `t` is `z`'s words read at a
/// scale `s` lower, so the truncation drops `s` bits fewer than `z`'s
/// scale less FRAC, and the gains' WEIGHT_FRAC bits are not there to drop:
/// SmolLM2's norm outputs drop 29 bits instead of 44. Returns `t`, its
/// form for the layer's bound, and what the layer folds in.
///
/// With `Output::Wide`, `t` is not truncated at all: `z`'s words are read
/// at `z`'s scale less `s` (no rounds, no keys), and the layer's own
/// truncation drops these bits with its own. That costs key bytes where
/// the layer is wider than the norm and saves the truncation's 2 rounds
/// (a decode pass's query/key/value projection, see [`Output`]).
pub(super) fn normalize_folded(
    b: &mut Builder,
    r: usize,
    norm: &model::Norm,
    (name, l): (String, usize),
    centre: bool,
    output: Output,
) -> Result<(usize, NormForm, Folded), PlanError> {
    fold_norm(b, r, norm, (name, l), (centre, Rho::Narrow), output)
}

/// [`normalize_folded`] with ρ's bits chosen by `rho`.
fn fold_norm(
    b: &mut Builder,
    r: usize,
    norm: &model::Norm,
    (name, l): (String, usize),
    (centre, rho): (bool, Rho),
    output: Output,
) -> Result<(usize, NormForm, Folded), PlanError> {
    let n = normalized(b, r, norm.eps, &name, l, centre, rho)?;
    let d = n.zb.abs.len();
    let root = (d as f64).sqrt();
    let s = gain_shift(norm, n.scale);
    let unit = pow2(s);
    let t = match output {
        Output::Frac => {
            let tb = n.zb.scale(unit, ulp(FRAC));
            let shift = n.scale - FRAC - s;
            truncate_reading(b, n.z, shift, (FRAC, tb), format!("{name} LayerNorm"))?
        }
        Output::Wide => {
            let scale = n.scale - s;
            let tb = n.zb.scale(unit, 0.0);
            let rows = b.info(n.z).rows;
            let t = b.tensor(
                format!("{name} LayerNorm (untruncated)"),
                rows,
                d,
                scale,
                tb,
            )?;
            b.push(Kind::Affine {
                x: n.z,
                gain: vec![1],
                offset: vec![0],
                out: t,
            });
            t
        }
    };
    let form = NormForm {
        gain: vec![unit; d],
        shift: vec![0.0; d],
        zeta: n.z_l2,
        delta: ulp(b.info(t).scale),
    };
    let folded = Folded {
        gain: norm
            .gamma
            .iter()
            .map(|g| f64::from(*g) * root / unit)
            .collect(),
        shift: norm.beta.iter().map(|v| f64::from(*v)).collect(),
    };
    Ok((t, form, folded))
}

/// Where a folded pre-norm's output goes: truncated to FRAC, or at its
/// normalized rows' own scale for the layer's truncation to take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Output {
    /// `t` at FRAC, truncated by the norm (two rounds).
    Frac,
    /// `t` untruncated: the layer after it truncates once.
    Wide,
}

/// The power of two `2^s` nearest the RMS of a norm's gains `γ√d`, at
/// most `z_scale − FRAC − 1` (the truncation drops at least one bit).
fn gain_shift(norm: &model::Norm, z_scale: u32) -> u32 {
    let d = norm.gamma.len().max(1) as f64;
    let log = (gain_rms(norm) * d.sqrt()).log2().round();
    let top = z_scale.saturating_sub(FRAC + 1);
    if log.is_finite() && log > 0.0 {
        (log as u32).min(top)
    } else {
        0
    }
}

/// The RMS of a norm's gains.
fn gain_rms(norm: &model::Norm) -> f64 {
    let d = norm.gamma.len().max(1) as f64;
    (norm
        .gamma
        .iter()
        .map(|g| f64::from(*g) * f64::from(*g))
        .sum::<f64>()
        / d)
        .sqrt()
}

/// RMSNorms of equal width and ε over the row blocks of one tensor
/// (`parts`: each block's norm and rows, in order), in the rounds of one:
/// the rows are normalized together, each block takes its own gains, and
/// one truncation brings them back to FRAC. Returns the stacked output and
/// each block's bound. Gemma 3's query and key norms.
pub(super) fn normalize_stacked(
    b: &mut Builder,
    r: usize,
    parts: &[(&model::Norm, usize)],
    name: &str,
    l: usize,
) -> Result<(usize, Vec<Bound>), PlanError> {
    let eps = parts.first().map_or(0.0, |(norm, _)| norm.eps);
    debug_assert!(parts.iter().all(|(norm, _)| norm.eps == eps));
    debug_assert_eq!(
        parts.iter().map(|(_, rows)| rows).sum::<usize>(),
        b.info(r).rows
    );
    let n = normalized(b, r, eps, name, l, false, Rho::Wide)?;
    let norms: Vec<&model::Norm> = parts.iter().map(|(norm, _)| *norm).collect();
    let (z, z_scale) = narrow_for_gains(b, (n.z, n.scale), &n.zb, &norms, name)?;
    let zb = b.info(z).bound.clone();
    let mut first = 0;
    let mut blocks = Vec::new();
    for (i, (norm, rows)) in parts.iter().enumerate() {
        let what = format!("{name} block {i}");
        let zi = b.rows(z, (first, *rows), zb.clone(), format!("{what} normalized"))?;
        let (a, _) = gained(b, (zi, z_scale), &n, norm, &what)?;
        blocks.push(a);
        first += rows;
    }
    let bounds = blocks
        .iter()
        .map(|a| b.info(*a).bound.floor_to(ulp(FRAC)))
        .collect();
    let a = b.stack_rows(&blocks, format!("{name} scaled"))?;
    Ok((truncate(b, a, FRAC, format!("{name} LayerNorm"))?, bounds))
}

/// The normalized rows of `r` (see [`normalize`]), before the gains.
fn normalized(
    b: &mut Builder,
    r: usize,
    eps: f32,
    name: &str,
    l: usize,
    centre: bool,
    rho: Rho,
) -> Result<Normalized, PlanError> {
    b.at(Category::LayerNorm, Some(l));
    let ri = b.info(r).clone();
    let (rows, d) = (ri.rows, ri.cols);
    let r_bound = ri.bound.regroup(d);
    let r_l2 = r_bound.row_l2();
    let y_scale = ri.scale;
    let (y, v, frac_in, v_max, yb, y_l2, octaves) = if centre {
        // The centring and the squares in one step (one round).
        let c = Centring::of(&ri, &r_bound);
        let (yb, y_l2, octaves) = norm_input(c.yb.clone(), (c.y_l2, y_scale), d, eps, rho);
        let de = d as f64 * f64::from(eps);
        let v_max = y_l2 * y_l2 + de;
        let (y, v) = c.push(b, r, v_max, name)?;
        let (v, frac_in) = ready_sum(b, v, (de, v_max), octaves.k, (name, l))?;
        (y, v, frac_in, v_max, yb, y_l2, octaves)
    } else {
        let (yb, y_l2, octaves) = norm_input(r_bound.clone(), (r_l2, y_scale), d, eps, rho);
        let (v, frac_in, v_max) = sum_of_squares(b, r, (&yb, y_l2), eps, octaves.k, name, l)?;
        (r, v, frac_in, v_max, yb, y_l2, octaves)
    };
    let rho = inverse_root(b, v, (frac_in, v_max), &octaves, name)?;
    // |yᵢ|·ρ ≤ (1 + err)·|yᵢ|/‖y‖ ≤ 1 + err, plus ρ's rounding; the
    // row's norm ‖y‖·ρ likewise, plus ‖y‖ times ρ's rounding.
    let z_abs: Vec<f64> = yb
        .abs
        .iter()
        .map(|a| 1.0 + INVERSE_REL_ERR + a * ulp(octaves.frac_out))
        .collect();
    let z_l2 = 1.0 + INVERSE_REL_ERR + y_l2 * ulp(octaves.frac_out);
    let mut zb = Bound::from_abs(z_abs, d);
    zb.l2[0] = zb.l2[0].min(z_l2);
    let scale = y_scale + octaves.frac_out;
    let z = b.tensor(format!("{name} normalized"), rows, d, scale, zb.clone())?;
    b.push(step::MulRows {
        x: y,
        v: rho,
        out: z,
    });
    Ok(Normalized { z, scale, zb, z_l2 })
}

/// `ρ = 1/√v` per row, for the sum of squares `v` (at `frac_in`, at most
/// `v_max`), by the inverse chain at `octaves`' output scale: the table
/// form in decode passes, the spline form elsewhere.
fn inverse_root(
    b: &mut Builder,
    v: usize,
    (frac_in, v_max): (u32, f64),
    octaves: &Octaves,
    name: &str,
) -> Result<usize, PlanError> {
    let rows = b.info(v).rows;
    let rho_max =
        (1.0 + INVERSE_REL_ERR) * pow2((frac_in - octaves.lo_bits) / 2) + ulp(octaves.frac_out);
    let rho = b.tensor(
        format!("{name} 1/√Σy²"),
        rows,
        1,
        octaves.frac_out,
        Bound::uniform(1, rho_max),
    )?;
    b.push(step::Chain {
        x: v,
        spec: ChainSpec::Inverse(InverseSpec {
            rsqrt: true,
            frac_in,
            k_in: bound::width(v_max, frac_in),
            lo_bits: octaves.lo_bits,
            frac_out: octaves.frac_out,
            table: b.decoding(),
        }),
        out: rho,
    });
    Ok(rho)
}

/// `a = z·(γ√d) + β` at `z`'s scale plus WEIGHT_FRAC, for `z` (at its
/// scale) rows of `n`, narrowed since where the scale differs; returns it
/// and the form later bounds use (after the truncation to FRAC that
/// follows).
fn gained(
    b: &mut Builder,
    (z, z_scale): (usize, u32),
    n: &Normalized,
    norm: &model::Norm,
    name: &str,
) -> Result<(usize, NormForm), PlanError> {
    let (rows, d) = (b.info(z).rows, n.zb.abs.len());
    let root = (d as f64).sqrt();
    let gains: Vec<u64> = norm
        .gamma
        .iter()
        .map(|g| encode(f64::from(*g) * root, WEIGHT_FRAC))
        .collect();
    let (zb, z_l2) = if z_scale == n.scale {
        (n.zb.clone(), n.z_l2)
    } else {
        // The narrowing's rounding, at most one unit of the new scale.
        let zb = b.info(z).bound.clone();
        (zb, n.z_l2 + root * ulp(z_scale))
    };
    let out_scale = z_scale + WEIGHT_FRAC;
    let offsets: Vec<u64> = norm
        .beta
        .iter()
        .map(|v| encode(f64::from(*v), out_scale))
        .collect();
    let ab = affine_bound(&zb, z_l2, (&gains, WEIGHT_FRAC), (&offsets, out_scale));
    let a = b.tensor(format!("{name} scaled"), rows, d, out_scale, ab)?;
    b.push(Kind::Affine {
        x: z,
        gain: gains.clone(),
        offset: offsets.clone(),
        out: a,
    });
    let form = NormForm {
        gain: gains
            .iter()
            .map(|g| fixed::decode(*g, WEIGHT_FRAC))
            .collect(),
        shift: offsets
            .iter()
            .map(|o| fixed::decode(*o, out_scale))
            .collect(),
        zeta: z_l2,
        delta: ulp(FRAC),
    };
    Ok((a, form))
}

/// The bound of an [`Kind::Affine`] with encoded `gain` (at `gain_frac`
/// fraction bits) and `offset` (at `offset_frac`), one word per column or
/// one for all, on `x` bounded by `xb` (one group) with row norm at most
/// `x_l2`: `|gᵢ|·|xᵢ| + |oᵢ|` per column, `max|g|·‖x‖ + ‖o‖` per row.
pub(super) fn affine_bound(
    xb: &Bound,
    x_l2: f64,
    (gain, gain_frac): (&[u64], u32),
    (offset, offset_frac): (&[u64], u32),
) -> Bound {
    let d = xb.abs.len();
    let real = |v: &[u64], c: usize, frac| fixed::decode(v[c.min(v.len() - 1)], frac).abs();
    let g: Vec<f64> = (0..d).map(|c| real(gain, c, gain_frac)).collect();
    let o: Vec<f64> = (0..d).map(|c| real(offset, c, offset_frac)).collect();
    let mut out = Bound::from_abs((0..d).map(|c| g[c] * xb.abs[c] + o[c]).collect(), d);
    let gmax = g.iter().fold(0.0f64, |m, v| m.max(*v));
    let o_l2 = o.iter().map(|v| v * v).sum::<f64>().sqrt();
    out.l2[0] = out.l2[0].min(gmax * x_l2 + o_l2);
    out
}

/// A LayerNorm's centring `y = r − trunc(Σr·⌊2^16/d⌉)`: the mean's factor
/// and the width of its truncation, and the centred rows' bounds.
struct Centring {
    gain: u64,
    k: u32,
    scale: u32,
    yb: Bound,
    y_l2: f64,
}

impl Centring {
    /// For the rows `ri` with bound `r_bound` (regrouped by row).
    fn of(ri: &TensorInfo, r_bound: &Bound) -> Centring {
        let d = ri.cols;
        // Mean: Σr·⌊2^16/d⌉ truncated; |Σr| ≤ √d·‖r‖.
        let r_l2 = r_bound.row_l2();
        let sum_abs = (d as f64).sqrt() * r_l2;
        let gain = encode(1.0 / d as f64, MEAN_FRAC);
        let gain_real = fixed::decode(gain, MEAN_FRAC);
        let k = bound::width(sum_abs * gain_real, ri.scale + MEAN_FRAC).max(MEAN_FRAC + 2);
        let mu_abs = sum_abs * gain_real + ulp(ri.scale);
        // ‖y‖ ≤ ‖r − mean‖ + √d·|mean − μ| ≤ ‖r‖ + √d·δ.
        let delta = sum_abs * (gain_real - 1.0 / d as f64).abs() + ulp(ri.scale);
        let y_l2 = r_l2 + (d as f64).sqrt() * delta;
        let mut yb = Bound::from_abs(r_bound.abs.iter().map(|a| a + mu_abs).collect(), d);
        yb.l2[0] = yb.l2[0].min(y_l2);
        Centring {
            gain,
            k,
            scale: ri.scale,
            yb,
            y_l2,
        }
    }

    /// Pushes the centring of `r` and the sum of its squares, bounded by
    /// `v_max`, as one step ([`Kind::CentreSquare`]): returns the centred
    /// rows and the sums.
    fn push(
        &self,
        b: &mut Builder,
        r: usize,
        v_max: f64,
        name: &str,
    ) -> Result<(usize, usize), PlanError> {
        let rows = b.info(r).rows;
        let d = self.yb.abs.len();
        let y = b.tensor(
            format!("{name} centred"),
            rows,
            d,
            self.scale,
            self.yb.clone(),
        )?;
        let v = b.tensor(
            format!("{name} sum of squares"),
            rows,
            1,
            2 * self.scale,
            Bound::uniform(1, v_max),
        )?;
        b.push(step::CentreSquare {
            x: r,
            gain: self.gain,
            k: self.k,
            shift: MEAN_FRAC,
            out: y,
            sums: v,
        });
        Ok((y, v))
    }
}

/// `y = r − trunc(Σr·⌊2^16/d⌉)` as separate operations (the mean's
/// one-round truncation, then the subtraction): the test oracle of
/// [`Centring`]; returns y, its bound and its row-norm bound.
#[cfg(test)]
fn centre_rows(
    b: &mut Builder,
    r: usize,
    r_bound: &Bound,
    name: &str,
    l: usize,
) -> Result<(usize, Bound, f64), PlanError> {
    let ri = b.info(r).clone();
    let (rows, d) = (ri.rows, ri.cols);

    // Mean: Σr·⌊2^16/d⌉ truncated; |Σr| ≤ √d·‖r‖.
    let r_l2 = r_bound.row_l2();
    let sum_abs = (d as f64).sqrt() * r_l2;
    let s = b.tensor(
        format!("{name} row sums"),
        rows,
        1,
        ri.scale,
        Bound::uniform(1, sum_abs),
    )?;
    b.push(Kind::RowSum { x: r, out: s });
    let gain = encode(1.0 / d as f64, MEAN_FRAC);
    let gain_real = fixed::decode(gain, MEAN_FRAC);
    let sm = b.tensor(
        format!("{name} mean product"),
        rows,
        1,
        ri.scale + MEAN_FRAC,
        Bound::uniform(1, sum_abs * gain_real),
    )?;
    b.push(Kind::Affine {
        x: s,
        gain: vec![gain],
        offset: vec![0],
        out: sm,
    });
    let mu = truncate_scalar(b, sm, ri.scale, format!("{name} mean"))?;
    b.at(Category::LayerNorm, Some(l));
    let mu_abs = b.info(mu).bound.max_abs();
    // ‖y‖ ≤ ‖r − mean‖ + √d·|mean − μ| ≤ ‖r‖ + √d·δ.
    let delta = sum_abs * (gain_real - 1.0 / d as f64).abs() + ulp(ri.scale);
    let y_l2 = r_l2 + (d as f64).sqrt() * delta;
    let mut yb = Bound::from_abs(r_bound.abs.iter().map(|a| a + mu_abs).collect(), d);
    yb.l2[0] = yb.l2[0].min(y_l2);
    let y = b.tensor(format!("{name} centred"), rows, d, ri.scale, yb.clone())?;
    b.push(Kind::MinusRow {
        x: r,
        v: mu,
        out: y,
    });
    Ok((y, yb, y_l2))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::testing::{self, uniform};

    fn norm(d: usize, gain: f32, shift: f32) -> model::Norm {
        model::Norm {
            gamma: (0..d).map(|c| gain + 0.125 * c as f32).collect(),
            beta: (0..d).map(|c| shift * c as f32).collect(),
            eps: 1e-6,
        }
    }

    /// The stacked norms (one set of rounds) against each norm run on its
    /// own block, the form it replaced: equal bit for bit, since both see
    /// the same input bound and so the same rsqrt chain, and truncations
    /// are exact at any width that holds the value.
    #[test]
    fn stacked_norms_equal_each_norm_on_its_own_block() {
        let (d, rows) = (16, [5, 3]);
        let norms = [norm(d, 0.5, 0.0), norm(d, 3.0, 0.01)];
        let total = rows[0] + rows[1];
        let bound = Bound::uniform(d, 6.0);
        let (mut b, x, bias) = testing::begin(total, d, bound.clone());
        let parts = [(&norms[0], rows[0]), (&norms[1], rows[1])];
        let (stacked, _) = normalize_stacked(&mut b, x, &parts, "stacked", 0).unwrap();
        let mut alone = Vec::new();
        for (i, (n, first)) in norms.iter().zip([0, rows[0]]).enumerate() {
            let xi = b
                .rows(x, (first, rows[i]), bound.clone(), format!("x{i}"))
                .unwrap();
            alone.push(
                normalize(&mut b, xi, n, format!("alone {i}"), 0, false)
                    .unwrap()
                    .0,
            );
        }
        let alone = b.stack_rows(&alone, "alone".into()).unwrap();
        let out = b.stack_rows(&[stacked, alone], "both".into()).unwrap();
        // Uniform in [−6, 6) at FRAC.
        let xs: Vec<u64> = uniform(total * d, 6.0, 0x9e37_79b9_7f4a_7c15)
            .iter()
            .map(|v| encode(*v, FRAC))
            .collect();
        let (_, outs) = testing::run(b, (x, bias, out), "norms", xs);
        let (s, a) = outs.split_at(total * d);
        assert_eq!(s, a);
        // And it is a norm: row 0 of block 0 has mean square γ² near 1.
        let row: Vec<f64> = s[..d].iter().map(|v| fixed::decode(*v, FRAC)).collect();
        let ms = row
            .iter()
            .zip(&norms[0].gamma)
            .map(|(y, g)| (y / f64::from(*g)).powi(2))
            .sum::<f64>()
            / d as f64;
        assert!((ms - 1.0).abs() < 1e-2, "mean square {ms}");
    }

    /// A LayerNorm's centring and sum of squares as one step (one round)
    /// against the operations it replaced (the mean's truncation, the
    /// subtraction, Beaver squares and their row sums), through the
    /// reference: the same centred rows and sums, bit for bit, on random
    /// rows, constant rows and rows at the bound's edges.
    #[test]
    fn one_round_centring_equals_the_separate_steps() {
        let (d, rows) = (24, 9);
        let bound = Bound::uniform(d, 6.0);
        let mut xs: Vec<u64> = uniform(6 * d, 6.0, 11)
            .iter()
            .map(|v| encode(*v, FRAC))
            .collect();
        xs.extend((0..d).map(|_| encode(2.5, FRAC)));
        xs.extend((0..d).map(|c| encode(if c % 2 == 0 { 6.0 } else { -6.0 }, FRAC)));
        xs.extend((0..d).map(|_| encode(-6.0, FRAC)));
        for sums in [false, true] {
            let (mut b, x, bias) = testing::begin(rows, d, bound.clone());
            let ri = b.info(x).clone();
            let r_bound = ri.bound.regroup(d);
            let c = Centring::of(&ri, &r_bound);
            let (y1, v1) = c.push(&mut b, x, c.y_l2 * c.y_l2, "fused").unwrap();
            let (y2, yb, y_l2) = centre_rows(&mut b, x, &r_bound, "separate", 0).unwrap();
            let (v2, _, _) =
                sum_of_squares(&mut b, y2, (&yb, y_l2), 0.0, 64, "separate", 0).unwrap();
            assert_eq!((yb.abs, y_l2), (c.yb.abs.clone(), c.y_l2));
            let (a, z) = if sums { (v1, v2) } else { (y1, y2) };
            let out = b.stack_rows(&[a, z], "both".into()).unwrap();
            let (plan, outs) = testing::run(b, (x, bias, out), "centring", xs.clone());
            let (fused, separate) = outs.split_at(outs.len() / 2);
            assert_eq!(fused, separate, "sums: {sums}");
            let kinds = |k: fn(&Kind) -> bool| plan.ops.iter().filter(|o| k(&o.kind)).count();
            assert_eq!(kinds(|k| matches!(k, Kind::CentreSquare(_))), 1);
        }
    }

    /// A norm and the linear layer after it, the gains in the norm (the
    /// old form, the oracle) and folded into the layer: the two outputs
    /// differ only by their roundings after the shared normalized rows,
    /// each within `tol` of the exact `(γ√d⊙z + β)·W + b` (the input's
    /// floor, half a unit of each weight and gain, the bias's and the
    /// output's rounding). LayerNorm with shifts and RMSNorm, gains
    /// spread over two octaves, the folded norm's output truncated or
    /// taken whole by the layer.
    #[test]
    fn folded_gains_equal_the_gained_norm_within_its_rounding() {
        use crate::plan::linear::{Weights, linear_to_frac};
        let (d, outputs, rows) = (24, 8, 6);
        let cases = [(true, 0.05f32), (false, 0.0)]
            .into_iter()
            .flat_map(|c| [(c, Output::Frac), (c, Output::Wide)]);
        for ((centre, shift), output) in cases {
            let mut n = norm(d, 0.4, shift);
            n.gamma.iter_mut().enumerate().for_each(|(c, g)| {
                *g = 0.4 + 0.05 * c as f32;
            });
            let w: Vec<f32> = uniform(d * outputs, 0.5, 7)
                .iter()
                .map(|v| *v as f32)
                .collect();
            let bias: Vec<f32> = uniform(outputs, 1.0, 9).iter().map(|v| *v as f32).collect();
            let layer = model::Linear {
                w: w.clone().into(),
                b: bias.clone(),
                inputs: d,
                outputs,
            };
            let (mut b, x, zero) = testing::begin(rows, d, Bound::uniform(d, 6.0));
            let (g, g_form) = normalize(&mut b, x, &n, "gained".into(), 0, centre).unwrap();
            let parts = [&layer];
            let weights = Weights::new(&parts, 1.0);
            let (yg, _) = linear_to_frac(
                &mut b,
                g,
                Some(&g_form),
                "gained layer".into(),
                weights,
                1,
                0,
            )
            .unwrap();
            let (t, t_form, folded) =
                normalize_folded(&mut b, x, &n, ("folded".into(), 0), centre, output).unwrap();
            let weights = weights.folding(Some(&folded));
            let (yf, _) = linear_to_frac(
                &mut b,
                t,
                Some(&t_form),
                "folded layer".into(),
                weights,
                1,
                0,
            )
            .unwrap();
            let out = b.stack_rows(&[yg, yf], "both".into()).unwrap();
            let xs = uniform(rows * d, 5.0, 11);
            let words = xs.iter().map(|v| encode(*v, FRAC)).collect();
            let (_, outs) = testing::run(b, (x, zero, out), "fold", words);
            let (gained, folded_out) = outs.split_at(rows * outputs);
            let root = (d as f64).sqrt();
            // The fold's 2^s, from its first gain.
            let two_s = f64::from(n.gamma[0]) * root / folded.gain[0];
            for r in 0..rows {
                let row: Vec<f64> = xs[r * d..(r + 1) * d]
                    .iter()
                    .map(|v| fixed::decode(encode(*v, FRAC), FRAC))
                    .collect();
                let mean = if centre {
                    row.iter().sum::<f64>() / d as f64
                } else {
                    0.0
                };
                let y: Vec<f64> = row.iter().map(|v| v - mean).collect();
                let norm2 = y.iter().map(|v| v * v).sum::<f64>() + d as f64 * f64::from(n.eps);
                let z: Vec<f64> = y.iter().map(|v| 1.1 * v.abs() / norm2.sqrt()).collect();
                for j in 0..outputs {
                    let mut tol = 6.0 * ulp(FRAC);
                    for (i, zi) in z.iter().enumerate() {
                        let wij = f64::from(w[i * outputs + j]).abs();
                        let g = f64::from(n.gamma[i]) * root;
                        let a = g * zi + f64::from(n.beta[i]).abs();
                        let folded_gain = folded.gain[i].abs();
                        // Gained: a's floor, W's and the gain's rounding.
                        tol += ulp(FRAC) * (wij + 0.5 * a + 0.5 * zi * wij);
                        // Folded: t's floor, the folded weight's rounding.
                        tol += ulp(FRAC) * (folded_gain * wij + 0.5 * zi * two_s);
                    }
                    let (vg, vf) = (gained[r * outputs + j], folded_out[r * outputs + j]);
                    let diff = (fixed::decode(vg, FRAC) - fixed::decode(vf, FRAC)).abs();
                    assert!(
                        diff <= tol,
                        "centre {centre}: row {r} output {j}: {diff} > {tol}"
                    );
                }
            }
            // And the fold is not a no-op: the norm's gains and shifts
            // move the outputs far beyond that tolerance.
            assert!(folded.gain.iter().any(|g| (g - 1.0).abs() > 0.1));
        }
    }
}
