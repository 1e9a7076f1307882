//! The MLP block: the activation gate every MLP shares, the encoder's
//! `GeLU(x·W1 + b1)` and a decoder's gated (`SiLU(g) ⊙ u`) or plain MLP,
//! each up to its output projection, which the caller composes with its
//! residual and norms.

use super::attention::PRODUCT_MAX_K;
use super::bound::{self, Bound, NormForm};
use super::linear::{Folded, Normed, Weights, heads, linear_to_frac};
use super::scale::{spline_width, truncate, ulp};
use super::step;
use super::{Builder, Category, GateSpec, PlanError};
use crate::fixed::FRAC;
use crate::model::{self, Decoder, DecoderLayer, GatedActivation};
use suffuse_core::gate::activation::{COEFF_BITS, gelu_spline, out_scale, silu_spline};
use suffuse_core::gate::spline::Spline;

/// Worst absolute error of the GeLU spline (core's accuracy test enforces
/// 2^-8).
const GELU_ERR: f64 = 1.0 / 256.0;

/// An MLP's activation, as a model names it.
#[derive(Clone, Copy, Debug)]
enum Activation {
    /// SiLU `x·σ(x)`.
    Silu,
    /// GeLU, erf (BERT) or tanh (GPT-2, Gemma 3).
    Gelu {
        /// The tanh form.
        tanh: bool,
    },
}

impl Activation {
    /// The gate (its width left to the caller) and its spline.
    fn gate(self, rescaled: bool, decoding: bool) -> (GateSpec, &'static Spline) {
        let linear = decoding && !rescaled;
        match self {
            Activation::Silu => (
                GateSpec::Silu { k: 0, linear },
                silu_spline(super::silu_form(linear)),
            ),
            Activation::Gelu { tanh } => {
                let (fine, linear) = (tanh && rescaled, tanh && linear);
                let spec = GateSpec::Gelu {
                    k: 0,
                    tanh,
                    fine,
                    linear,
                    beaver: decoding,
                };
                (spec, gelu_spline(super::gelu_form(tanh, fine, linear)))
            }
        }
    }
}

/// The spline gate of `act` on `x` (at FRAC), at the width the input's
/// bound proves, its output at the spline's scale. `rescaled`: a norm
/// rescales the MLP's output, where a nearly silent row would carry the
/// coarse spline's absolute error (2^-8) up to unit RMS, so the tanh GeLU
/// takes its fine form. A decode pass has one row: its key bytes count,
/// the degree-1 pieces' extra DCF points not (docs/GATES.md), so it takes
/// the degree-1 SiLU and tanh GeLU, except where the output is rescaled.
fn activation(
    b: &mut Builder,
    x: usize,
    (act, rescaled): (Activation, bool),
    name: String,
    l: usize,
) -> Result<usize, PlanError> {
    b.at(Category::Gelu, Some(l));
    let (spec, spline) = act.gate(rescaled, b.decoding());
    let xi = b.info(x).clone();
    let k = bound::width(xi.bound.max_abs(), FRAC).max(spline_width(spline));
    let out = b.tensor(
        name,
        xi.rows,
        xi.cols,
        out_scale(spline, FRAC, COEFF_BITS),
        xi.bound.scale(1.0, GELU_ERR),
    )?;
    b.push(step::Gate {
        x,
        gate: spec.with_k(k),
        out,
    });
    Ok(out)
}

/// An encoder's MLP up to its output projection: `GeLU(x·W1 + b1)`, the
/// product truncated to FRAC, the GeLU at its spline's scale (erf or tanh,
/// by the model); `fold`, the gains and shifts of the norm that made `x`,
/// goes into W1 and b1.
pub(super) fn encoder_mlp(
    b: &mut Builder,
    (x, x_norm, fold): (usize, &NormForm, Option<&Folded>),
    (ffn_in, intermediate): (&model::Linear, usize),
    tanh: bool,
    l: usize,
) -> Result<usize, PlanError> {
    let (h, _) = linear_to_frac(
        b,
        x,
        Some(x_norm),
        format!("layer {l} intermediate"),
        Weights::new(&[ffn_in], 1.0).folding(fold),
        intermediate,
        l,
    )?;
    activation(
        b,
        h,
        (Activation::Gelu { tanh }, false),
        format!("layer {l} GeLU"),
        l,
    )
}

/// The MLP of a block up to its down projection: the activations it takes.
pub(super) fn decoder_mlp(
    b: &mut Builder,
    model: &Decoder,
    l: usize,
    layer: &DecoderLayer,
    (n, form, fold): Normed<'_>,
) -> Result<usize, PlanError> {
    let cfg = &model.config;
    let inter = cfg.intermediate;
    // A sandwich norm rescales the MLP's output (Gemma 3).
    let rescaled = layer.post_norms.is_some();
    let hidden = match &layer.gate {
        Some(gate) => {
            let (gu, _) = linear_to_frac(
                b,
                n,
                Some(form),
                format!("layer {l} gate/up"),
                Weights::new(&[gate, &layer.up], 1.0).folding(fold),
                inter,
                l,
            )?;
            b.at(Category::Linear, Some(l));
            let g = heads(b, gu, 0, 1, inter, format!("layer {l} gate"))?;
            let u = heads(b, gu, inter, 1, inter, format!("layer {l} up"))?;
            let (act, what) = match cfg.block.activation {
                GatedActivation::Silu => (Activation::Silu, "SiLU"),
                GatedActivation::GeluTanh => (Activation::Gelu { tanh: true }, "GeLU"),
            };
            let name = format!("layer {l} {what}");
            let s = activation(b, g, (act, rescaled), name, l)?;
            gated(b, s, u, l)?
        }
        None => {
            let (h, _) = linear_to_frac(
                b,
                n,
                Some(form),
                format!("layer {l} intermediate"),
                Weights::new(&[&layer.up], 1.0).folding(fold),
                inter,
                l,
            )?;
            let act = Activation::Gelu { tanh: true };
            activation(b, h, (act, rescaled), format!("layer {l} GeLU"), l)?
        }
    };
    Ok(hidden)
}

/// `SiLU(g) ⊙ u` with one Beaver product. SiLU's output comes at the
/// spline's scale (FRAC + coefficient bits); where the product's proven
/// bound would not fit the ring at that scale plus u's, SiLU's output is
/// truncated first by just the bits that make it fit.
fn gated(b: &mut Builder, s: usize, u: usize, l: usize) -> Result<usize, PlanError> {
    let (si, ui) = (b.info(s).clone(), b.info(u).clone());
    let abs_at = |sb: &Bound| -> Vec<f64> {
        sb.abs
            .iter()
            .zip(&ui.bound.abs)
            .map(|(a, c)| a * c)
            .collect()
    };
    let max = |v: &[f64]| v.iter().fold(0.0f64, |m, a| m.max(*a));
    let excess = bound::width(
        max(&abs_at(&si.bound.floor_to(ulp(FRAC)))),
        si.scale + ui.scale,
    )
    .saturating_sub(PRODUCT_MAX_K);
    let (s, si) = if excess == 0 {
        (s, si)
    } else {
        let to = si.scale.saturating_sub(excess).max(FRAC);
        let st = truncate(b, s, to, format!("{} (narrowed)", si.name))?;
        b.at(Category::Gelu, Some(l));
        (st, b.info(st).clone())
    };
    let p = b.tensor(
        format!("layer {l} gated"),
        si.rows,
        ui.cols,
        si.scale + ui.scale,
        Bound::from_abs(abs_at(&si.bound), ui.cols),
    )?;
    b.push(step::Mul { a: s, b: u, out: p });
    Ok(p)
}
