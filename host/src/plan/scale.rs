//! What every block of a plan shares: the widths and output scales of the
//! spline gates, the error budgets the range analysis assumes, and the
//! truncation from one scale to another.

use super::bound;
use super::nexp_form;
use super::step;
use super::{Builder, ChainSpec, GateSpec, Kind, PlanError};
use crate::fixed::{self, FRAC, pow2};
use suffuse_core::gate::activation::{self, COEFF_BITS, out_scale};
use suffuse_core::gate::spline::Spline;

/// The narrowest width a spline gate compiles at: its knots must be
/// representable on the k-bit view.
pub(super) fn spline_width(spline: &Spline) -> u32 {
    let reach = spline
        .pieces
        .iter()
        .fold(0.0f64, |m, p| m.max(p.lo.abs()).max(p.hi.abs()));
    bound::width(reach, FRAC)
}

/// The nExp spline of decode passes (degree 1) or of every other pass.
pub(super) fn nexp_spline(linear: bool) -> &'static Spline {
    activation::nexp_spline(nexp_form(linear))
}

/// Output scale of the nExp gate at input scale FRAC: 2·FRAC + 12, or
/// FRAC + 12 in the degree-1 form.
pub(super) fn nexp_scale(linear: bool) -> u32 {
    out_scale(nexp_spline(linear), FRAC, COEFF_BITS)
}

/// Worst relative error of the reciprocal and rsqrt chains (core's tests
/// enforce 2^-7), rounded up.
pub(super) const INVERSE_REL_ERR: f64 = 1.0 / 64.0;

/// One unit in the last place at `scale`.
pub(super) fn ulp(scale: u32) -> f64 {
    1.0 / pow2(scale)
}

/// The nExp gate's fixed-point outputs over its whole domain, as reals:
/// the least and the greatest (the spline may dip a little below 0 near
/// its cut-off) and the value at `z = 0` (a row maximum's own column).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct NexpRange {
    pub(super) min: f64,
    pub(super) max: f64,
    pub(super) zero: f64,
}

/// [`NexpRange`] of the quadratic or the degree-1 form, swept once per
/// form and process.
pub(super) fn nexp_range(linear: bool) -> Result<NexpRange, PlanError> {
    static RANGE: [std::sync::OnceLock<NexpRange>; 2] =
        [std::sync::OnceLock::new(), std::sync::OnceLock::new()];
    let cell = &RANGE[usize::from(linear)];
    if let Some(r) = cell.get() {
        return Ok(*r);
    }
    let spline = nexp_spline(linear);
    let k = spline_width(spline) + 1;
    let g = GateSpec::Nexp { k, linear }
        .build()
        .map_err(|source| PlanError::Gate {
            tensor: "nExp range".into(),
            spec: format!("nexp k={k}"),
            error: source,
        })?;
    let cutoff = spline.pieces.last().map_or(16.0, |p| p.hi);
    let top = (cutoff * pow2(FRAC)).ceil() as u64 + 2;
    let scale = nexp_scale(linear);
    let mut out = [0u64; 2];
    let mut at = |z: u64| {
        g.reference(z, &mut out);
        fixed::decode(out[0], scale)
    };
    let zero = at(0);
    let (mut min, mut max) = (zero, zero);
    for z in 1..=top {
        let v = at(z);
        min = min.min(v);
        max = max.max(v);
    }
    Ok(*cell.get_or_init(|| NexpRange { min, max, zero }))
}

/// Arithmetic truncation of `x` down to `to` fraction bits, in two rounds
/// (the bit-output carry key, the cheapest per element).
pub(super) fn truncate(
    b: &mut Builder,
    x: usize,
    to: u32,
    name: String,
) -> Result<usize, PlanError> {
    truncate_as(b, x, to, name, false)
}

/// [`truncate`] in one round ([`ChainSpec::Trunc`]), for a norm's per-row
/// scalars (its mean, a narrowed sum of squares): the ring-output carry
/// key costs about 2.5× the bytes per element, which one value per row
/// makes negligible. Tensors with many elements per row keep [`truncate`].
pub(super) fn truncate_scalar(
    b: &mut Builder,
    x: usize,
    to: u32,
    name: String,
) -> Result<usize, PlanError> {
    truncate_as(b, x, to, name, true)
}

/// [`truncate`] in one round in a decode pass, in two elsewhere: a decode
/// pass's tensor has one row per head where a prefill's has one per
/// token, so the one-round form's larger keys cost little there
/// (`docs/PLAN.md`, "One round in decode passes").
pub(super) fn truncate_decoding(
    b: &mut Builder,
    x: usize,
    to: u32,
    name: String,
) -> Result<usize, PlanError> {
    let one_round = b.decoding();
    truncate_as(b, x, to, name, one_round)
}

fn truncate_as(
    b: &mut Builder,
    x: usize,
    to: u32,
    name: String,
    one_round: bool,
) -> Result<usize, PlanError> {
    let xi = b.info(x).clone();
    let out = b.tensor(name, xi.rows, xi.cols, to, xi.bound.floor_to(ulp(to)))?;
    push_truncation(b, x, xi.scale - to, out, one_round);
    Ok(out)
}

/// `x`'s words shifted right by `shift` bits (two rounds, as
/// [`truncate`]) and read at `to` fraction bits, which need not be `x`'s
/// scale less `shift`: a norm whose gains go into the next layer outputs
/// `2^s·z` for its normalized rows `z` (`norm::normalize_folded`).
/// `bound` is the output's, at `to`.
pub(super) fn truncate_reading(
    b: &mut Builder,
    x: usize,
    shift: u32,
    (to, bound): (u32, bound::Bound),
    name: String,
) -> Result<usize, PlanError> {
    let xi = b.info(x).clone();
    let out = b.tensor(name, xi.rows, xi.cols, to, bound)?;
    push_truncation(b, x, shift, out, false);
    Ok(out)
}

/// The truncation of `x` by `shift` bits into `out`, at the width `x`'s
/// bound proves.
fn push_truncation(b: &mut Builder, x: usize, shift: u32, out: usize, one_round: bool) {
    let xi = b.info(x);
    let k = bound::width(xi.bound.max_abs(), xi.scale).max(shift + 2);
    b.push(if one_round {
        Kind::Chain(step::Chain {
            x,
            spec: ChainSpec::Trunc { k, shift },
            out,
        })
    } else {
        Kind::Gate(step::Gate {
            x,
            gate: GateSpec::Trunc { k, shift },
            out,
        })
    });
}
