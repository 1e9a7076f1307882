//! The plan of a post-LN BERT encoder with pooling.
//!
//! Per layer (B sentences of L tokens, hidden d, H heads of d_h):
//!
//! ```text
//! qkv  = trunc(x·[Wq/√d_h | Wk | Wv] + b)            one fused product, one truncation
//! s    = trunc(Q_h·K_hᵀ) + bias                       Beaver matrix triples per (sentence, head)
//! p    = trunc(nExp(max(s) − s) · recip(Σ nExp))     max tree, spline, reciprocal chain, Beaver
//! a    = trunc(merge(P_h·V_h)·Wo + bo)                the probability scale folds into this truncation
//! x    = LN(x + a)
//! x    = LN(x + trunc(GeLU(trunc(x·W1 + b1))·W2 + b2))  GeLU's output scale folds into the last truncation
//! ```
//!
//! LayerNorm is `y = r − trunc(Σr·⌊2^16/d⌉)`, `ρ = rsqrt(Σy² + d·ε)`,
//! `out = trunc(y·ρ·(γ√d) + β)`: one rsqrt per row and no division.
//!
//! Padding: the client sends an additive attention bias per key position
//! (0, or a large negative constant for padding) and, for mean pooling, a
//! 0/1 mask, both secret-shared, so the servers never learn how many tokens
//! are real. The constant is chosen from the proven score bound so that a
//! padded key's exponent lands in nExp's zero tail: its probability is
//! exactly 0, and nothing overflows.

use super::attention;
use super::bound::{self, Bound, NormForm};
use super::{
    Builder, Category, EncodedLinear, Finish, GateSpec, Inputs, InverseSpec, Kind, Plan, PlanError,
    ProductKey, RealLinear,
};
use crate::fixed::{self, FRAC, MEAN_FRAC, RECIP_FRAC, RSQRT_FRAC, WEIGHT_FRAC, encode, pow2};
use crate::model::{self, Model, Pooling};
use suffuse_core::gate::activation::{COEFF_BITS, gelu_spline, out_scale};
use suffuse_core::gate::splines;

/// The narrowest width a spline gate compiles at: its knots must be
/// representable on the k-bit view.
pub(super) fn spline_width(spline: &suffuse_core::gate::spline::Spline) -> u32 {
    let reach = spline
        .pieces
        .iter()
        .fold(0.0f64, |m, p| m.max(p.lo.abs()).max(p.hi.abs()));
    bound::width(reach, FRAC)
}

/// Output scale of the spline gates (GeLU, nExp) at input scale FRAC.
pub(super) fn spline_scale() -> u32 {
    out_scale(&splines::NEXP, FRAC, COEFF_BITS)
}

/// Worst absolute error of the GeLU spline (core's accuracy test enforces
/// 2^-8).
pub(super) const GELU_ERR: f64 = 1.0 / 256.0;
/// Worst relative error of the reciprocal and rsqrt chains (core's tests
/// enforce 2^-7), rounded up.
pub(super) const INVERSE_REL_ERR: f64 = 1.0 / 64.0;
/// Lowest octave of LayerNorm's rsqrt input (at scale 2·FRAC): Σy² below
/// 2^-16 saturates, i.e. rows whose values all agree to about 2^-8·√(1/d).
pub(super) const RSQRT_LO_BITS: u32 = 8;
/// The widest rsqrt input planned (MiniLM's widest is 56 bits).
const RSQRT_MAX_K: u32 = 56;
/// The widest proven sum of squares that is narrowed for the rsqrt chain
/// (the ring check allows 62 bits; one bit of headroom for `+ d·ε`).
/// Wider proven bounds give way to the chain's capacity (see
/// [`norm_input`]).
const SUM_MAX_K: u32 = 61;

/// Builds (or reuses) the plan for `batch` sentences padded to `seq` tokens.
pub fn build(model: &Model, batch: usize, seq: usize) -> Result<std::sync::Arc<Plan>, PlanError> {
    let digest = model.digest();
    super::memoized((digest, batch, seq), || {
        build_uncached(model, digest, batch, seq)
    })
}

fn build_uncached(
    model: &Model,
    digest: [u8; 32],
    batch: usize,
    seq: usize,
) -> Result<Plan, PlanError> {
    let cfg = &model.config;
    if batch == 0 || seq == 0 {
        return Err(PlanError::EmptyShape { batch, seq });
    }
    if seq > cfg.max_positions {
        return Err(PlanError::SequenceTooLong {
            seq,
            max: cfg.max_positions,
        });
    }
    // The largest tensors: activations (b·L·max(d, d_ff)) and scores
    // (b·h·L·L), computed in u64 with every product checked.
    let widest = cfg
        .hidden
        .max(cfg.intermediate)
        .max(cfg.heads.saturating_mul(seq));
    let largest = [batch, seq, widest]
        .iter()
        .try_fold(1u64, |acc, &n| acc.checked_mul(n as u64));
    if batch > super::MAX_BATCH || largest.is_none_or(|n| n > super::MAX_ELEMENTS) {
        return Err(PlanError::ShapeTooLarge { batch, seq });
    }
    if cfg.heads == 0 || !cfg.hidden.is_multiple_of(cfg.heads) {
        return Err(PlanError::Heads {
            hidden: cfg.hidden,
            heads: cfg.heads,
        });
    }
    // Score bounds do not depend on the padding bias, and the bias must
    // exceed them: plan once to learn them, then plan with the right bias.
    let (first, scores, bounds) = plan_with(model, digest, batch, seq, 0.0, Builder::default())?;
    // A padded key's score sits C below every real score: its exponent
    // exceeds nExp's cut-off and its probability is exactly 0.
    let cutoff = splines::NEXP.pieces.last().map_or(16.0, |p| p.hi);
    let c = (2.0 * scores + cutoff + 1.0).log2().ceil().exp2();
    let memo = Builder::with_memo(first.linears, bounds);
    let (plan, again, _) = plan_with(model, digest, batch, seq, c, memo)?;
    debug_assert_eq!(scores, again);
    Ok(plan)
}

/// The plan with padding bias `-c`; also returns the largest score bound.
fn plan_with(
    model: &Model,
    digest: [u8; 32],
    batch: usize,
    seq: usize,
    c: f64,
    mut b: Builder,
) -> Result<(Plan, f64, std::collections::HashMap<String, f64>), PlanError> {
    let cfg = &model.config;
    let d = cfg.hidden;
    let n = batch * seq;
    b.at(Category::Linear, None);

    // The client's LayerNorm output: Σnᵢ² ≤ d, so |nᵢ| ≤ √(d−1). The client
    // computes it in f32, hence the small relative allowance.
    let root = (d as f64).sqrt();
    let mut norm = NormForm {
        gain: model
            .embeddings
            .norm
            .gamma
            .iter()
            .map(|g| f64::from(*g) * root)
            .collect(),
        shift: model
            .embeddings
            .norm
            .beta
            .iter()
            .map(|v| f64::from(*v))
            .collect(),
        zeta: 1.0 + 1e-3,
        delta: ulp(FRAC),
    };
    let x_bound = norm_output(&model.embeddings.norm, 1.0 + 1e-3).floor_to(ulp(FRAC));
    let x = b.tensor("input embeddings", n, d, FRAC, x_bound)?;
    let pad_bias = encode(-c, FRAC);
    let bias = b.tensor("attention bias", batch, seq, FRAC, Bound::uniform(seq, c))?;
    let mask = match cfg.pooling {
        Pooling::Mean => Some(b.tensor("pooling mask", batch, seq, 0, Bound::uniform(seq, 1.0))?),
        Pooling::Cls => None,
    };

    let mut h = x;
    let mut scores = 0.0f64;
    for (l, layer) in model.layers.iter().enumerate() {
        let (out, out_norm, s) =
            encoder_layer(&mut b, model, l, layer, h, &norm, bias, c, seq, batch)?;
        h = out;
        norm = out_norm;
        scores = scores.max(s);
    }

    b.at(Category::Pooling, None);
    let (output, finish) = match mask {
        Some(mask) => {
            let info = b.info(h).clone();
            let bound = info.bound.scale(seq as f64, 0.0);
            let out = b.tensor("pooled sum", batch, d, FRAC, bound)?;
            b.push(Kind::MatMul {
                a: mask,
                b: h,
                transpose_b: false,
                batches: batch,
                m: 1,
                k: seq,
                n: d,
                out,
            });
            (out, Finish::MeanOverTokens)
        }
        None => {
            let info = b.info(h).clone();
            let out = b.tensor("first token", batch, d, FRAC, info.bound)?;
            b.push(Kind::TakeRows {
                x: h,
                stride: seq,
                out,
            });
            (out, Finish::AsIs)
        }
    };
    let inputs = Inputs { x, bias, mask };
    let bounds = b.bounds();
    let plan = b.finish(
        &model.name,
        digest,
        batch,
        seq,
        d,
        inputs,
        output,
        pad_bias,
        finish,
        cfg.normalize,
    )?;
    Ok((plan, scores, bounds))
}

/// One unit in the last place at `scale`.
pub(super) fn ulp(scale: u32) -> f64 {
    1.0 / pow2(scale)
}

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

/// Encodes a linear layer for an input at `in_scale`; `prescale` multiplies
/// the weights and bias of the first `prescale.1` outputs by `prescale.0`.
pub(super) fn encode_linear(
    name: String,
    parts: &[&model::Linear],
    in_scale: u32,
    query_scale: f64,
) -> EncodedLinear {
    let inputs = parts.first().map_or(0, |p| p.inputs);
    let outputs: usize = parts.iter().map(|p| p.outputs).sum();
    let bias_scale = in_scale + WEIGHT_FRAC;
    let mut w = vec![0u64; inputs * outputs];
    let mut bias = Vec::with_capacity(outputs);
    let mut col = 0;
    for (pi, p) in parts.iter().enumerate() {
        // Attention's 1/√d_h is folded into the query weights (part 0 of a
        // fused QKV layer).
        let s = if pi == 0 { query_scale } else { 1.0 };
        for i in 0..inputs {
            for j in 0..p.outputs {
                w[i * outputs + col + j] =
                    encode(f64::from(p.w[i * p.outputs + j]) * s, WEIGHT_FRAC);
            }
        }
        bias.extend(p.b.iter().map(|v| encode(f64::from(*v) * s, bias_scale)));
        col += p.outputs;
    }
    EncodedLinear {
        name,
        inputs,
        outputs,
        w,
        b: bias,
        bias_scale,
        id: [0; 16],
    }
}

/// The real values of an encoded layer, for bounds.
pub(super) fn real_weights(l: &EncodedLinear) -> (Vec<f64>, Vec<f64>) {
    (
        l.w.iter().map(|v| fixed::decode(*v, WEIGHT_FRAC)).collect(),
        l.b.iter()
            .map(|v| fixed::decode(*v, l.bias_scale))
            .collect(),
    )
}

/// `x·W + b` followed by the truncation back to FRAC; returns the output
/// and the linear layer's index. An input above FRAC (a spline output,
/// attention outputs) is multiplied as it is when the product still fits, so
/// one truncation rescales both; otherwise it is truncated first. `norm`
/// describes a LayerNorm-output input for a tighter bound.
#[allow(clippy::too_many_arguments)]
pub(super) fn linear_to_frac(
    b: &mut Builder,
    x: usize,
    norm: Option<&NormForm>,
    name: String,
    parts: &[&model::Linear],
    query_scale: f64,
    group: usize,
    layer: usize,
) -> Result<(usize, usize), PlanError> {
    let (y, linear) = linear_product(b, x, norm, name.clone(), parts, query_scale, group, layer)?;
    b.at(Category::Truncation, Some(layer));
    Ok((truncate(b, y, FRAC, name)?, linear))
}

/// `x·W + b` at the product's scale, without the truncation: see
/// [`linear_to_frac`]. A layer already encoded in this plan at the same
/// scale (an earlier decode pass) is reused, not encoded again.
#[allow(clippy::too_many_arguments)]
pub(super) fn linear_product(
    b: &mut Builder,
    x: usize,
    norm: Option<&NormForm>,
    name: String,
    parts: &[&model::Linear],
    query_scale: f64,
    group: usize,
    layer: usize,
) -> Result<(usize, usize), PlanError> {
    let bound_of = |b: &mut Builder, xb: &Bound, enc: &Enc| {
        let real = real_weights_of(b, enc);
        let (w, bias, outputs) = (&real.0, &real.1, real.2);
        let plain = bound::linear(xb, w, bias, outputs, group);
        match norm {
            Some(nf) => plain.min(&bound::linear_from_norm(nf, w, bias, outputs, group)),
            None => plain,
        }
    };
    let xi = b.info(x).clone();
    if let Some(done) = reuse(b, x, &name, norm, group, layer)? {
        return Ok(done);
    }
    let try_scale = xi.scale + WEIGHT_FRAC;
    let enc = encoded(b, &name, parts, xi.scale, query_scale);
    let out = bound_of(b, &xi.bound, &enc);
    let fits = bound::width(out.max_abs(), try_scale) <= 62;
    let (x, enc, out) = if fits || xi.scale == FRAC {
        (x, enc, out)
    } else {
        if let Enc::New(unused) = enc {
            // The next decode pass tries this scale again.
            b.keep_memo(unused);
        }
        b.at(Category::Truncation, Some(layer));
        let x = truncate(b, x, FRAC, format!("{} (rescaled)", xi.name))?;
        let xi = b.info(x).clone();
        let enc = encoded(b, &name, parts, xi.scale, query_scale);
        let out = bound_of(b, &xi.bound, &enc);
        (x, enc, out)
    };
    let rows = b.info(x).rows;
    let scale = b.info(x).scale + WEIGHT_FRAC;
    b.at(Category::Linear, Some(layer));
    let linear = match enc {
        Enc::Built(i) => i,
        Enc::New(enc) => b.linear_layer(enc),
    };
    let outputs = b.linear_ref(linear).outputs;
    let key = product_key(&name, scale, &b.info(x).bound, norm, group);
    b.remember_product(key, out.clone());
    let y = b.tensor(format!("{name} product"), rows, outputs, scale, out)?;
    b.push(Kind::Linear { x, linear, out: y });
    Ok((y, linear))
}

/// A decode pass repeats the layers of the pass before it on inputs with
/// the same bounds: the layer's encoding and its output bound (a pass
/// over every weight) are reused, not recomputed. `None` when either is
/// new.
fn reuse(
    b: &mut Builder,
    x: usize,
    name: &str,
    norm: Option<&NormForm>,
    group: usize,
    layer: usize,
) -> Result<Option<(usize, usize)>, PlanError> {
    let xi = b.info(x);
    let (rows, scale) = (xi.rows, xi.scale + WEIGHT_FRAC);
    let key = product_key(name, scale, &xi.bound, norm, group);
    let (Some(linear), Some(out)) = (b.find_linear(name, scale), b.remembered_product(&key)) else {
        return Ok(None);
    };
    let outputs = b.linear_ref(linear).outputs;
    b.at(Category::Linear, Some(layer));
    let y = b.tensor(format!("{name} product"), rows, outputs, scale, out)?;
    b.push(Kind::Linear { x, linear, out: y });
    Ok(Some((y, linear)))
}

/// What a linear layer's output bound depends on: the layer, the
/// product's scale, the grouping, and every real of the input's bound and
/// norm form (compared exactly, so a reused bound is the one that would be
/// computed).
fn product_key(
    name: &str,
    scale: u32,
    xb: &Bound,
    norm: Option<&NormForm>,
    group: usize,
) -> ProductKey {
    let reals = xb.abs.iter().chain(&xb.l2);
    let form = norm
        .into_iter()
        .flat_map(|f| f.gain.iter().chain(&f.shift).chain([&f.zeta, &f.delta]));
    ProductKey {
        name: name.to_string(),
        scale,
        groups: (group, xb.group, norm.is_some()),
        reals: reals.chain(form).map(|v| v.to_bits()).collect(),
    }
}

/// A linear layer for [`linear_product`]: already in the plan, or
/// encoded and not yet added (it may turn out to be at the wrong scale).
enum Enc {
    Built(usize),
    New(EncodedLinear),
}

/// The layer `name` encoded for an input at `in_scale`: from this plan,
/// from an earlier pass's memo, or encoded now.
fn encoded(
    b: &mut Builder,
    name: &str,
    parts: &[&model::Linear],
    in_scale: u32,
    query_scale: f64,
) -> Enc {
    let scale = in_scale + WEIGHT_FRAC;
    if let Some(i) = b.find_linear(name, scale) {
        return Enc::Built(i);
    }
    Enc::New(
        b.take_memo(name, scale)
            .unwrap_or_else(|| encode_linear(name.to_string(), parts, in_scale, query_scale)),
    )
}

/// A layer's weights and biases as reals, and its output count: decoded
/// once per build (every decode pass bounds the same layers again).
fn real_weights_of(b: &mut Builder, enc: &Enc) -> std::sync::Arc<RealLinear> {
    let l = match enc {
        Enc::Built(i) => b.linear_ref(*i),
        Enc::New(l) => l,
    };
    let key = (l.name.clone(), l.bias_scale);
    if let Some(r) = b.real_linear(&key) {
        return r;
    }
    let (w, bias) = real_weights(l);
    let real = std::sync::Arc::new((w, bias, l.outputs));
    b.remember_real_linear(key, real.clone());
    real
}

/// The largest attention score of a layer, by heads: with the layer input
/// `x = z⊙g + β − δ` (‖z‖ ≤ ζ), each query is `z·A + c_q` and each key
/// `z·B + c_k` up to rounding, so
/// `|q·k| ≤ σ(A·Bᵀ)·ζ² + ‖A·c_k‖·ζ + ‖B·c_q‖·ζ + |c_q·c_k|` plus the
/// rounding terms. σ(A·Bᵀ)² is the spectral radius of `(AᵀA)(BᵀB)`, a
/// d_h × d_h matrix.
fn score_bound(enc: &EncodedLinear, norm: &NormForm, heads: usize) -> f64 {
    let (w, bias) = real_weights(enc);
    let d = norm.gain.len();
    let dh = d / heads;
    let outs = enc.outputs;
    let mut worst = 0.0f64;
    for h in 0..heads {
        let (a, cq, eq) = norm.project(&w, &bias, outs, h * dh..(h + 1) * dh);
        let (bm, ck, ek) = norm.project(&w, &bias, outs, d + h * dh..d + (h + 1) * dh);
        let ga = bound::gram(&a, d, dh);
        let gb = bound::gram(&bm, d, dh);
        let sigma_ab = bound::spectral_radius(&bound::square_product(&ga, &gb, dh), dh).sqrt();
        let sigma_a = bound::spectral_radius(&ga, dh).sqrt();
        let sigma_b = bound::spectral_radius(&gb, dh).sqrt();
        let mat_vec = |m: &[f64], v: &[f64]| -> f64 {
            (0..d)
                .map(|i| {
                    let r: f64 = (0..dh).map(|j| m[i * dh + j] * v[j]).sum();
                    r * r
                })
                .sum::<f64>()
                .sqrt()
        };
        let z = norm.zeta;
        let dot: f64 = cq.iter().zip(&ck).map(|(x, y)| x * y).sum();
        let main = sigma_ab * z * z + mat_vec(&a, &ck) * z + mat_vec(&bm, &cq) * z + dot.abs();
        let norm_of = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
        let qm = sigma_a * z + norm_of(&cq);
        let km = sigma_b * z + norm_of(&ck);
        // Input rounding plus the QKV truncation's floor.
        let rq = eq + (dh as f64).sqrt() * ulp(FRAC);
        let rk = ek + (dh as f64).sqrt() * ulp(FRAC);
        worst = worst.max(main + qm * rk + rq * km + rq * rk);
    }
    worst * (1.0 + 1e-6)
}

/// The exact range of the nExp gate's fixed-point output over its whole
/// domain (evaluated once): the spline may dip a little below 0 near its
/// cut-off.
pub(super) fn nexp_range() -> Result<(f64, f64), PlanError> {
    static RANGE: std::sync::OnceLock<(f64, f64)> = std::sync::OnceLock::new();
    if let Some(r) = RANGE.get() {
        return Ok(*r);
    }
    let k = spline_width(&splines::NEXP) + 1;
    let g = GateSpec::Nexp { k }
        .build()
        .map_err(|source| PlanError::Gate {
            tensor: "nExp range".into(),
            spec: format!("nexp k={k}"),
            error: source,
        })?;
    let cutoff = splines::NEXP.pieces.last().map_or(16.0, |p| p.hi);
    let top = (cutoff * pow2(FRAC)).ceil() as u64 + 2;
    let scale = spline_scale();
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    let mut out = [0u64; 2];
    for z in 0..=top {
        g.reference(z, &mut out);
        let v = fixed::decode(out[0], scale);
        lo = lo.min(v);
        hi = hi.max(v);
    }
    Ok(*RANGE.get_or_init(|| (lo, hi)))
}

/// Arithmetic truncation of `x` down to `to` fraction bits.
pub(super) fn truncate(
    b: &mut Builder,
    x: usize,
    to: u32,
    name: String,
) -> Result<usize, PlanError> {
    let xi = b.info(x).clone();
    let shift = xi.scale - to;
    let k = bound::width(xi.bound.max_abs(), xi.scale).max(shift + 2);
    let out = b.tensor(name, xi.rows, xi.cols, to, xi.bound.floor_to(ulp(to)))?;
    b.push(Kind::Gate {
        x,
        gate: GateSpec::Trunc { k, shift },
        out,
    });
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
fn encoder_layer(
    b: &mut Builder,
    model: &Model,
    l: usize,
    layer: &model::Layer,
    x: usize,
    x_norm: &NormForm,
    bias: usize,
    c: f64,
    seq: usize,
    batch: usize,
) -> Result<(usize, NormForm, f64), PlanError> {
    let cfg = &model.config;
    let (d, heads) = (cfg.hidden, cfg.heads);
    let dh = d / heads;
    let n = batch * seq;
    let bh = batch * heads;

    // Attention projections: one fused product.
    let (qkv, qkv_linear) = linear_to_frac(
        b,
        x,
        Some(x_norm),
        format!("layer {l} query/key/value"),
        &[&layer.query, &layer.key, &layer.value],
        1.0 / (dh as f64).sqrt(),
        dh,
        l,
    )?;
    b.at(Category::Linear, Some(l));
    let qkv_bound = b.info(qkv).bound.clone();
    let mut split = [0usize; 3];
    for (part, name) in ["queries", "keys", "values"].iter().enumerate() {
        let cols = &qkv_bound.abs[part * d..(part + 1) * d];
        let abs: Vec<f64> = (0..dh)
            .map(|c| (0..heads).map(|h| cols[h * dh + c]).fold(0.0, f64::max))
            .collect();
        let l2 = (0..heads)
            .map(|h| qkv_bound.group_l2(part * heads + h))
            .fold(0.0, f64::max);
        let mut hb = Bound::from_abs(abs, dh);
        hb.l2[0] = hb.l2[0].min(l2);
        let t = b.tensor(format!("layer {l} {name}"), bh * seq, dh, FRAC, hb)?;
        b.push(Kind::SplitHeads {
            x: qkv,
            part,
            heads,
            out: t,
        });
        split[part] = t;
    }
    let [q, k, v] = split;

    // Scores, bounded through the bilinear form of the weights.
    let qn = b.info(q).bound.row_l2();
    let kn = b.info(k).bound.row_l2();
    let bilinear = {
        let enc = b.linear_ref(qkv_linear).clone();
        b.memo_bound(&format!("layer {l} scores"), || {
            score_bound(&enc, x_norm, heads)
        })
    };
    let (o, score_abs) = attention::attend(
        b,
        attention::Heads {
            q,
            k,
            v,
            blocks: bh,
            queries: seq,
            keys: seq,
            causal: false,
        },
        (qn * kn).min(bilinear),
        bias,
        c,
        l,
    )?;
    b.at(Category::Linear, Some(l));
    let ob = b.info(o).bound.clone();
    let mut merged = Bound::from_abs((0..d).map(|j| ob.abs[j % dh]).collect(), dh);
    for g in &mut merged.l2 {
        *g = g.min(ob.row_l2());
    }
    let om = b.tensor(
        format!("layer {l} attention"),
        n,
        d,
        FRAC + RECIP_FRAC,
        merged,
    )?;
    b.push(Kind::MergeHeads {
        x: o,
        heads,
        out: om,
    });
    let (a, _) = linear_to_frac(
        b,
        om,
        None,
        format!("layer {l} attention output"),
        &[&layer.attn_out],
        1.0,
        d,
        l,
    )?;
    let (x1, x1_norm) =
        residual_norm(b, x, a, &layer.attn_norm, format!("layer {l} attention"), l)?;

    // Feed-forward.
    let (h, _) = linear_to_frac(
        b,
        x1,
        Some(&x1_norm),
        format!("layer {l} intermediate"),
        &[&layer.ffn_in],
        1.0,
        cfg.intermediate,
        l,
    )?;
    b.at(Category::Gelu, Some(l));
    let hi = b.info(h).clone();
    let g_bound = hi.bound.scale(1.0, GELU_ERR);
    let tanh = matches!(cfg.activation, model::Activation::GeluTanh);
    let spline = gelu_spline(if tanh {
        suffuse_core::gate::activation::GeluForm::Tanh
    } else {
        suffuse_core::gate::activation::GeluForm::Erf
    });
    let g_scale = out_scale(spline, FRAC, COEFF_BITS);
    let g = b.tensor(
        format!("layer {l} GeLU"),
        hi.rows,
        hi.cols,
        g_scale,
        g_bound,
    )?;
    b.push(Kind::Gate {
        x: h,
        gate: GateSpec::Gelu {
            k: bound::width(hi.bound.max_abs(), FRAC).max(spline_width(spline)),
            tanh,
        },
        out: g,
    });
    let (f, _) = linear_to_frac(
        b,
        g,
        None,
        format!("layer {l} output"),
        &[&layer.ffn_out],
        1.0,
        d,
        l,
    )?;
    let (out, out_norm) = residual_norm(b, x1, f, &layer.ffn_norm, format!("layer {l} output"), l)?;
    Ok((out, out_norm, score_abs))
}

/// The bound a norm works with for its input `y` (bound `yb`, row norm
/// `y_l2`).
///
/// Where the proven `‖y‖² + d·ε` fits [`SUM_MAX_K`] bits at 2·FRAC it is
/// kept, and proven. Beyond that (a deep pre-norm residual stream, whose
/// worst case compounds every block's worst case), the norm runs at the
/// rsqrt chain's full capacity instead: `y` is taken to satisfy
/// `‖y‖² + d·ε < 2^(RSQRT_MAX_K − 1 − 2·FRAC)/MARGIN`, about `‖y‖ < 4.5·10⁴`
/// (every square, sum and product after it is then exact), and the
/// reference checks it on every row at run time, as it checks every
/// proven bound. Only this assumption is not proven; docs/DECODERS.md
/// gives the margin measured on real text.
fn norm_input(yb: Bound, y_l2: f64, d: usize, eps: f32) -> (Bound, f64) {
    let de = d as f64 * f64::from(eps);
    if bound::width(y_l2 * y_l2 + de, 2 * FRAC) <= SUM_MAX_K {
        return (yb, y_l2);
    }
    let v_cap = (pow2(RSQRT_MAX_K - 1) - 4.0) / (bound::MARGIN * pow2(2 * FRAC)) * (1.0 - 1e-9);
    let cap = (v_cap - de).max(0.0).sqrt();
    debug_assert!(bound::width(cap * cap + de, 2 * FRAC) <= RSQRT_MAX_K);
    let mut capped = Bound::from_abs(yb.abs.iter().map(|a| a.min(cap)).collect(), d);
    capped.l2[0] = capped.l2[0].min(cap);
    (capped, y_l2.min(cap))
}

/// `Σy² + d·ε` of each row of `y` (a `d`-wide tensor with bound `yb` and
/// row norm `y_l2`) at 2·FRAC, ready for the rsqrt chain: returns the
/// tensor, its scale and its bound.
fn sum_of_squares(
    b: &mut Builder,
    y: usize,
    yb: &Bound,
    y_l2: f64,
    eps: f32,
    name: &str,
    l: usize,
) -> Result<(usize, u32, f64), PlanError> {
    let (rows, d) = (b.info(y).rows, yb.abs.len());
    let de = d as f64 * f64::from(eps);
    let v_max = y_l2 * y_l2 + de;
    let scale = 2 * FRAC;
    let sq = b.tensor(
        format!("{name} squares"),
        rows,
        d,
        scale,
        Bound::from_abs(yb.abs.iter().map(|a| a * a).collect(), d),
    )?;
    b.push(Kind::Square { x: y, out: sq });
    let v = b.tensor(
        format!("{name} sum of squares"),
        rows,
        1,
        scale,
        Bound::uniform(1, v_max),
    )?;
    b.push(Kind::RowSum { x: sq, out: v });
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
    // The rsqrt chain's range reduction needs its input below 2^56: a wider
    // proven range is truncated first (one element per row), which only
    // raises the saturation floor 2^(lo_bits − frac_in).
    match bound::width(v_max, scale).checked_sub(RSQRT_MAX_K) {
        Some(shift) if shift > 0 => {
            let vt = truncate(
                b,
                v,
                scale - shift,
                format!("{name} sum of squares (narrowed)"),
            )?;
            b.at(Category::LayerNorm, Some(l));
            Ok((vt, scale - shift, v_max))
        }
        _ => Ok((v, scale, v_max)),
    }
}

/// `LN(x + a)`.
fn residual_norm(
    b: &mut Builder,
    x: usize,
    a: usize,
    norm: &model::Norm,
    name: String,
    l: usize,
) -> Result<(usize, NormForm), PlanError> {
    b.at(Category::LayerNorm, Some(l));
    let xi = b.info(x).clone();
    let (rows, d) = (xi.rows, xi.cols);
    let r_bound = xi.bound.regroup(d).add(&b.info(a).bound.regroup(d));
    let r = b.tensor(format!("{name} residual"), rows, d, FRAC, r_bound.clone())?;
    b.push(Kind::Add { a: x, b: a, out: r });
    normalize(b, r, norm, name, l, true)
}

/// LayerNorm (`centre`) or RMSNorm of `r`: `y = r − mean` (LayerNorm
/// only), `ρ = rsqrt(Σy² + d·ε)`, `out = trunc(y·ρ·(γ√d) + β)`.
pub(super) fn normalize(
    b: &mut Builder,
    r: usize,
    norm: &model::Norm,
    name: String,
    l: usize,
    centre: bool,
) -> Result<(usize, NormForm), PlanError> {
    b.at(Category::LayerNorm, Some(l));
    let ri = b.info(r).clone();
    let (rows, d) = (ri.rows, ri.cols);
    let r_bound = ri.bound.regroup(d);
    let r_l2 = r_bound.row_l2();
    let (y, yb, y_l2) = if centre {
        centre_rows(b, r, &r_bound, &name, l)?
    } else {
        (r, r_bound.clone(), r_l2)
    };
    let (yb, y_l2) = norm_input(yb, y_l2, d, norm.eps);
    let (v, frac_in, v_max) = sum_of_squares(b, y, &yb, y_l2, norm.eps, &name, l)?;
    let rho_max = (1.0 + INVERSE_REL_ERR) * pow2((frac_in - RSQRT_LO_BITS) / 2) + ulp(RSQRT_FRAC);
    let rho = b.tensor(
        format!("{name} 1/√Σy²"),
        rows,
        1,
        RSQRT_FRAC,
        Bound::uniform(1, rho_max),
    )?;
    b.push(Kind::Inverse {
        x: v,
        spec: InverseSpec {
            rsqrt: true,
            frac_in,
            k_in: bound::width(v_max, frac_in),
            lo_bits: RSQRT_LO_BITS,
            frac_out: RSQRT_FRAC,
        },
        out: rho,
    });
    // |yᵢ|·ρ ≤ (1 + err)·|yᵢ|/‖y‖ ≤ 1 + err, plus ρ's rounding.
    let z_abs: Vec<f64> = yb
        .abs
        .iter()
        .map(|a| 1.0 + INVERSE_REL_ERR + a * ulp(RSQRT_FRAC))
        .collect();
    let z_l2 = 1.0 + INVERSE_REL_ERR + (d as f64).sqrt() * yb.max_abs() * ulp(RSQRT_FRAC);
    let mut zb = Bound::from_abs(z_abs, d);
    zb.l2[0] = zb.l2[0].min(z_l2);
    let z = b.tensor(
        format!("{name} normalized"),
        rows,
        d,
        FRAC + RSQRT_FRAC,
        zb.clone(),
    )?;
    b.push(Kind::MulRows {
        x: y,
        v: rho,
        out: z,
    });
    // out = z·(γ√d) + β, then one truncation.
    let root = (d as f64).sqrt();
    let gains: Vec<u64> = norm
        .gamma
        .iter()
        .map(|g| encode(f64::from(*g) * root, WEIGHT_FRAC))
        .collect();
    let out_scale = FRAC + RSQRT_FRAC + WEIGHT_FRAC;
    let offsets: Vec<u64> = norm
        .beta
        .iter()
        .map(|v| encode(f64::from(*v), out_scale))
        .collect();
    let g_real: Vec<f64> = gains
        .iter()
        .map(|g| fixed::decode(*g, WEIGHT_FRAC).abs())
        .collect();
    let o_real: Vec<f64> = offsets
        .iter()
        .map(|o| fixed::decode(*o, out_scale).abs())
        .collect();
    let abs: Vec<f64> = (0..d).map(|c| g_real[c] * zb.abs[c] + o_real[c]).collect();
    let gmax = g_real.iter().fold(0.0f64, |m, g| m.max(*g));
    let obeta = o_real.iter().map(|o| o * o).sum::<f64>().sqrt();
    let mut ab = Bound::from_abs(abs, d);
    ab.l2[0] = ab.l2[0].min(gmax * z_l2 + obeta);
    let a = b.tensor(format!("{name} scaled"), rows, d, out_scale, ab)?;
    b.push(Kind::Affine {
        x: z,
        gain: gains.clone(),
        offset: offsets.clone(),
        out: a,
    });
    let out = truncate(b, a, FRAC, format!("{name} LayerNorm"))?;
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
    Ok((out, form))
}

/// `y = r − trunc(Σr·⌊2^16/d⌉)`; returns y, its bound and its row-norm
/// bound.
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
        FRAC,
        Bound::uniform(1, sum_abs),
    )?;
    b.push(Kind::RowSum { x: r, out: s });
    let gain = encode(1.0 / d as f64, MEAN_FRAC);
    let gain_real = fixed::decode(gain, MEAN_FRAC);
    let sm = b.tensor(
        format!("{name} mean product"),
        rows,
        1,
        FRAC + MEAN_FRAC,
        Bound::uniform(1, sum_abs * gain_real),
    )?;
    b.push(Kind::Affine {
        x: s,
        gain: vec![gain],
        offset: vec![0],
        out: sm,
    });
    let mu = truncate(b, sm, FRAC, format!("{name} mean"))?;
    b.at(Category::LayerNorm, Some(l));
    let mu_abs = b.info(mu).bound.max_abs();
    // ‖y‖ ≤ ‖r − mean‖ + √d·|mean − μ| ≤ ‖r‖ + √d·δ.
    let delta = sum_abs * (gain_real - 1.0 / d as f64).abs() + ulp(FRAC);
    let y_l2 = r_l2 + (d as f64).sqrt() * delta;
    let mut yb = Bound::from_abs(r_bound.abs.iter().map(|a| a + mu_abs).collect(), d);
    yb.l2[0] = yb.l2[0].min(y_l2);
    let y = b.tensor(format!("{name} centred"), rows, d, FRAC, yb.clone())?;
    b.push(Kind::MinusRow {
        x: r,
        v: mu,
        out: y,
    });
    Ok((y, yb, y_l2))
}
