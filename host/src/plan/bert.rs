//! The plan of a post-LN BERT encoder with pooling.
//!
//! Per layer (B sentences of L tokens, hidden d, H heads of d_h):
//!
//! ```text
//! qkv  = trunc(x·[Wq/√d_h | Wk | Wv] + b)            one fused product, one truncation
//! s    = trunc(Q_h·K_hᵀ) + bias                       Beaver matrix triples per (sentence, head)
//! p    = trunc(nExp(max(s) − s) · recip(Σ nExp))     max tree, spline, reciprocal chain, Beaver
//! r    = trunc(merge(P_h·V_h)·Wo + bo + x)            the probability scale folds into this truncation
//! x    = LN(r)
//! x    = LN(trunc(GeLU(trunc(x·W1 + b1))·W2 + b2 + x)) GeLU's output scale folds into the last truncation
//! ```
//!
//! LayerNorm is `y = r − trunc(Σr·⌊2^16/d⌉)`, `ρ = rsqrt(Σy² + d·ε)`,
//! `out = trunc(y·ρ·(γ√d) + β)`: one rsqrt per row and no division.
//!
//! Every norm but the last leaves its gains out (`x = g⊙t + β` with `t =
//! trunc(2^s·y·ρ)`, `norm::post_norm_folded`): the next product folds `g`
//! and `β` into its weights, and each residual `x` is added as `g⊙t + β`
//! at the sublayer product's scale, before the truncation that product
//! takes anyway (`residual_sum`). So a norm's output truncation drops
//! the bits of `y·ρ` only, not the gains' as well (docs/PLAN.md, "Post-norm
//! gains folded into the stream").
//!
//! Padding: the client sends an additive attention bias per key position
//! (0, or a large negative constant for padding) and, for mean pooling, a
//! 0/1 mask, both secret-shared, so the servers never learn how many tokens
//! are real. The constant is chosen from the proven score bound so that a
//! padded key's exponent lands in nExp's zero tail: its probability is
//! exactly 0, and nothing overflows.

use rayon::prelude::*;

use super::attention;
use super::bound::{self, Bound, NormForm};
use super::linear::{Folded, Weights, for_bounds, linear_product, linear_to_frac};
use super::mlp;
use super::norm::{affine_bound, norm_output, post_norm, post_norm_folded};
use super::scale::{truncate, ulp};
use super::step;
use super::{Builder, Category, EncodedLinear, Finish, Inputs, Kind, Plan, PlanError};
use crate::fixed::{FRAC, encode};
use crate::model::{self, Model, Pooling};
use suffuse_core::gate::splines;

/// Builds (or reuses) the plan for `batch` sentences padded to `seq` tokens.
pub fn build(model: &Model, batch: usize, seq: usize) -> Result<std::sync::Arc<Plan>, PlanError> {
    let digest = model.digest();
    super::memoized((digest, "encoder", batch, seq), || {
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
    b.at(Category::Linear, None);
    let inputs = encoder_inputs(&mut b, model, (batch, seq), c)?;
    let pad_bias = encode(-c, FRAC);

    let mut h = Stream {
        t: inputs.x,
        form: embeddings_norm(model),
        fold: None,
    };
    let mut scores = 0.0f64;
    for (l, layer) in model.layers.iter().enumerate() {
        let site = Site {
            l,
            layer,
            x: &h,
            bias: inputs.bias,
            c,
            seq,
            batch,
            last: l + 1 == model.layers.len(),
        };
        let (out, s) = encoder_layer(&mut b, model, &site)?;
        h = out;
        scores = scores.max(s);
    }
    let h = h.t;

    b.at(Category::Pooling, None);
    let (output, finish) = pool(&mut b, h, inputs.mask, (batch, seq, d))?;
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

/// The client's inputs for `batch` sentences of `seq` tokens: the
/// embeddings (the embedding norm's output), the attention bias (0 for
/// a token, `−c` for padding) and, for mean pooling, the pooling mask.
fn encoder_inputs(
    b: &mut Builder,
    model: &Model,
    (batch, seq): (usize, usize),
    c: f64,
) -> Result<Inputs, PlanError> {
    let x_bound = norm_output(&model.embeddings.norm, 1.0 + 1e-3).floor_to(ulp(FRAC));
    let d = model.config.hidden;
    let x = b.tensor("input embeddings", batch * seq, d, FRAC, x_bound)?;
    let bias = b.tensor("attention bias", batch, seq, FRAC, Bound::uniform(seq, c))?;
    let mask = match model.config.pooling {
        Pooling::Mean => Some(b.tensor("pooling mask", batch, seq, 0, Bound::uniform(seq, 1.0))?),
        Pooling::Cls => None,
    };
    Ok(Inputs { x, bias, mask })
}

/// The client's LayerNorm output as a norm form: `Σnᵢ² ≤ d`, so
/// `|nᵢ| ≤ √(d−1)`. The client computes it in f32, hence the small
/// relative allowance.
fn embeddings_norm(model: &Model) -> NormForm {
    let root = (model.config.hidden as f64).sqrt();
    NormForm {
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
    }
}

/// The output: the masked sum over each sentence's tokens (mean pooling,
/// divided by the client), or each sentence's first token.
fn pool(
    b: &mut Builder,
    h: usize,
    mask: Option<usize>,
    (batch, seq, d): (usize, usize, usize),
) -> Result<(usize, Finish), PlanError> {
    Ok(match mask {
        Some(mask) => {
            let info = b.info(h).clone();
            let bound = info.bound.scale(seq as f64, 0.0);
            let out = b.tensor("pooled sum", batch, d, FRAC, bound)?;
            b.push(step::MatMul {
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
    })
}

/// The largest attention score of a layer, by heads: with the layer input
/// `x = z⊙g + β − δ` (‖z‖ ≤ ζ), each query is `z·A + c_q` and each key
/// `z·B + c_k` up to rounding, so
/// `|q·k| ≤ σ(A·Bᵀ)·ζ² + ‖A·c_k‖·ζ + ‖B·c_q‖·ζ + |c_q·c_k|` plus the
/// rounding terms. σ(A·Bᵀ)² is the spectral radius of `(AᵀA)(BᵀB)`, a
/// d_h × d_h matrix.
fn score_bound(enc: &EncodedLinear, norm: &NormForm, heads: usize) -> f64 {
    let (w, bias) = for_bounds(&enc.w, &enc.b, enc.bias_scale);
    let d = norm.gain.len();
    let dh = d / heads;
    let outs = enc.outputs;
    // Heads are independent: each is bounded on its own thread and the
    // largest taken, the same number in any order.
    let head = |h: usize| {
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
        main + qm * rk + rq * km + rq * rk
    };
    let worst = (0..heads)
        .into_par_iter()
        .map(head)
        .reduce(|| 0.0, f64::max);
    worst * (1.0 + 1e-6)
}

/// A layer's input as the residual stream holds it: `t` at FRAC, its
/// norm form (for bounds) and, where the norm that made it left its gains
/// and shifts out (`x = g⊙t + β`, [`post_norm_folded`]), those. The
/// layer's first product folds them into its weights, and its residual
/// sums apply them ([`residual_sum`]). The client's embeddings (layer 0's
/// input) and the last norm's output carry their gains (`fold: None`).
struct Stream {
    t: usize,
    form: NormForm,
    fold: Option<Folded>,
}

/// Where a layer runs: its index and weights, its input, the attention
/// bias and its constant `c`, the shape, and whether it is the last
/// (whose norm keeps its gains for the pooling).
#[derive(Clone, Copy)]
struct Site<'a> {
    l: usize,
    layer: &'a model::Layer,
    x: &'a Stream,
    bias: usize,
    c: f64,
    seq: usize,
    batch: usize,
    last: bool,
}

/// A layer's self-attention up to its output projection: one fused
/// q/k/v product split into heads, the scores bounded through the weights'
/// bilinear form, softmax and the weighted values ([`attention::attend`]),
/// the heads merged and projected. Returns the projection's product
/// (untruncated: [`residual_sum`] truncates it) and the worst score.
fn encoder_attention(
    b: &mut Builder,
    model: &Model,
    site: &Site<'_>,
) -> Result<(usize, f64), PlanError> {
    let cfg = &model.config;
    let Site {
        l,
        layer,
        x,
        bias,
        c,
        seq,
        batch,
        ..
    } = *site;
    let (d, heads) = (cfg.hidden, cfg.heads);
    let dh = d / heads;
    let bh = batch * heads;
    let ([q, k, v], qkv_linear) = query_key_value(b, model, site)?;
    let scores = scores_bound(b, (q, k, qkv_linear), &x.form, heads, l);
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
            window: None,
            positions: cfg.max_positions,
        },
        scores,
        bias,
        c,
        l,
    )?;
    b.at(Category::Linear, Some(l));
    let om = merge_heads(b, o, l, (heads, dh, batch * seq))?;
    let (a, _) = linear_product(
        b,
        om,
        None,
        format!("layer {l} attention output"),
        Weights::new(&[&layer.attn_out], 1.0),
        d,
        l,
    )?;
    Ok((a, score_abs))
}

/// A layer's attention projections: one fused q/k/v product (the scale
/// `1/√d_h` in the queries, the stream's fold in the weights) truncated
/// to FRAC and split into heads; returns the heads and the product's
/// linear layer.
fn query_key_value(
    b: &mut Builder,
    model: &Model,
    site: &Site<'_>,
) -> Result<([usize; 3], usize), PlanError> {
    let (l, layer, x) = (site.l, site.layer, site.x);
    let (d, heads) = (model.config.hidden, model.config.heads);
    let dh = d / heads;
    let (qkv, qkv_linear) = linear_to_frac(
        b,
        x.t,
        Some(&x.form),
        format!("layer {l} query/key/value"),
        Weights::new(
            &[&layer.query, &layer.key, &layer.value],
            1.0 / (dh as f64).sqrt(),
        )
        .folding(x.fold.as_ref()),
        dh,
        l,
    )?;
    b.at(Category::Linear, Some(l));
    let rows = site.batch * heads * site.seq;
    Ok((split_heads(b, qkv, l, (heads, dh, rows))?, qkv_linear))
}

/// The scores' bound: the product of the query and key rows' norms, or
/// the bilinear form of the weights ([`score_bound`], memoized by layer),
/// whichever is smaller.
fn scores_bound(
    b: &mut Builder,
    (q, k, qkv_linear): (usize, usize, usize),
    x_norm: &NormForm,
    heads: usize,
    l: usize,
) -> f64 {
    let qn = b.info(q).bound.row_l2();
    let kn = b.info(k).bound.row_l2();
    let bilinear = b.memo_linear_bound(&format!("layer {l} scores"), qkv_linear, |enc| {
        score_bound(enc, x_norm, heads)
    });
    (qn * kn).min(bilinear)
}

/// The fused q/k/v product's three parts split into heads (`rows` rows of
/// `dh` each): every head's column bounds folded into one, and its group
/// norm the largest head's.
fn split_heads(
    b: &mut Builder,
    qkv: usize,
    l: usize,
    (heads, dh, rows): (usize, usize, usize),
) -> Result<[usize; 3], PlanError> {
    let d = heads * dh;
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
        let t = b.tensor(format!("layer {l} {name}"), rows, dh, FRAC, hb)?;
        b.push(Kind::SplitHeads {
            x: qkv,
            part,
            heads,
            out: t,
        });
        split[part] = t;
    }
    Ok(split)
}

/// The heads' outputs `o` merged back into `n` rows of `heads·dh`.
fn merge_heads(
    b: &mut Builder,
    o: usize,
    l: usize,
    (heads, dh, n): (usize, usize, usize),
) -> Result<usize, PlanError> {
    let d = heads * dh;
    let (ob, scale) = (b.info(o).bound.clone(), b.info(o).scale);
    let mut merged = Bound::from_abs((0..d).map(|j| ob.abs[j % dh]).collect(), dh);
    for g in &mut merged.l2 {
        *g = g.min(ob.row_l2());
    }
    let om = b.tensor(format!("layer {l} attention"), n, d, scale, merged)?;
    b.push(Kind::MergeHeads {
        x: o,
        heads,
        out: om,
    });
    Ok(om)
}

/// One post-LN layer at `site`: attention, its residual and norm, the
/// MLP, its residual and norm. Returns the output stream and the layer's
/// worst score.
fn encoder_layer(
    b: &mut Builder,
    model: &Model,
    site: &Site<'_>,
) -> Result<(Stream, f64), PlanError> {
    let cfg = &model.config;
    let (l, layer, x) = (site.l, site.layer, site.x);
    let (a, score_abs) = encoder_attention(b, model, site)?;
    let name = format!("layer {l} attention");
    let r1 = residual_sum(b, a, x, &name, l)?;
    let (t1, form1, fold1) = post_norm_folded(b, r1, &layer.attn_norm, name, l)?;
    let x1 = Stream {
        t: t1,
        form: form1,
        fold: Some(fold1),
    };

    let tanh = matches!(cfg.activation, model::Activation::GeluTanh);
    let ffn_in = (&layer.ffn_in, cfg.intermediate);
    let g = mlp::encoder_mlp(b, (x1.t, &x1.form, x1.fold.as_ref()), ffn_in, tanh, l)?;
    let (f, _) = linear_product(
        b,
        g,
        None,
        format!("layer {l} output"),
        Weights::new(&[&layer.ffn_out], 1.0),
        cfg.hidden,
        l,
    )?;
    let name = format!("layer {l} output");
    let r2 = residual_sum(b, f, &x1, &name, l)?;
    let out = if site.last {
        let (t, form) = post_norm(b, r2, &layer.ffn_norm, name, l)?;
        Stream {
            t,
            form,
            fold: None,
        }
    } else {
        let (t, form, fold) = post_norm_folded(b, r2, &layer.ffn_norm, name, l)?;
        Stream {
            t,
            form,
            fold: Some(fold),
        }
    };
    Ok((out, score_abs))
}

/// `r = trunc(p + x·2^e)` at FRAC: a sublayer's product `p` (at FRAC + e)
/// and the residual stream `x = g⊙t + β` it adds to, applied to `t` at
/// the product's scale (the gains at e fraction bits, the shifts at the
/// product's), so that the truncation the product needs anyway rounds the
/// sum. A stream without a fold (`x = t`) gives `trunc(p) + t` exactly,
/// the sum after the truncation it replaces.
fn residual_sum(
    b: &mut Builder,
    p: usize,
    x: &Stream,
    name: &str,
    l: usize,
) -> Result<usize, PlanError> {
    b.at(Category::LayerNorm, Some(l));
    let (pi, ti) = (b.info(p).clone(), b.info(x.t).clone());
    let (d, e) = (ti.cols, pi.scale - ti.scale);
    let (gain, offset): (Vec<u64>, Vec<u64>) = match &x.fold {
        Some(f) => (
            f.gain.iter().map(|g| encode(*g, e)).collect(),
            f.shift.iter().map(|v| encode(*v, pi.scale)).collect(),
        ),
        None => (vec![encode(1.0, e)], vec![0]),
    };
    let tb = ti.bound.regroup(d);
    let hb = affine_bound(&tb, tb.row_l2(), (&gain, e), (&offset, pi.scale));
    let h = b.tensor(format!("{name} stream"), ti.rows, d, pi.scale, hb.clone())?;
    b.push(Kind::Affine {
        x: x.t,
        gain,
        offset,
        out: h,
    });
    let sb = pi.bound.regroup(d).add(&hb);
    let sum = b.tensor(format!("{name} residual sum"), ti.rows, d, pi.scale, sb)?;
    b.push(Kind::Add {
        a: p,
        b: h,
        out: sum,
    });
    b.at(Category::Truncation, Some(l));
    truncate(b, sum, FRAC, format!("{name} residual"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::fixed;
    use crate::plan::testing::{self, uniform};

    /// A layer `d → d` with seeded weights and biases.
    fn layer(d: usize) -> model::Linear {
        model::Linear {
            w: uniform(d * d, 0.5, 7)
                .iter()
                .map(|v| *v as f32)
                .collect::<Vec<_>>()
                .into(),
            b: uniform(d, 1.0, 9).iter().map(|v| *v as f32).collect(),
            inputs: d,
            outputs: d,
        }
    }

    /// A stream without a fold (the client's embeddings) gives
    /// `trunc(p) + x` bit for bit: the residual added after the
    /// product's truncation, the form it replaced.
    #[test]
    fn an_unfolded_stream_adds_as_after_the_truncation() {
        let (d, rows) = (16, 5);
        let lin = layer(d);
        let (mut b, x, zero) = testing::begin(rows, d, Bound::uniform(d, 6.0));
        let parts = [&lin];
        let (p, _) =
            linear_product(&mut b, x, None, "p".into(), Weights::new(&parts, 1.0), d, 0).unwrap();
        let form = NormForm {
            gain: vec![1.0; d],
            shift: vec![0.0; d],
            zeta: 0.0,
            delta: 0.0,
        };
        let stream = Stream {
            t: x,
            form,
            fold: None,
        };
        let summed = residual_sum(&mut b, p, &stream, "summed", 0).unwrap();
        let a = truncate(&mut b, p, FRAC, "after".into()).unwrap();
        let info = b.info(summed).clone();
        let after = b
            .tensor("after residual", rows, d, FRAC, info.bound)
            .unwrap();
        b.push(Kind::Add {
            a: x,
            b: a,
            out: after,
        });
        let out = b.stack_rows(&[summed, after], "both".into()).unwrap();
        let words = uniform(rows * d, 6.0, 3)
            .iter()
            .map(|v| encode(*v, FRAC))
            .collect();
        let (_, outs) = testing::run(b, (x, zero, out), "unfolded", words);
        let (s, a) = outs.split_at(rows * d);
        assert_eq!(s, a);
    }

    /// A post-norm and the sublayer after it, with the residual added
    /// back: the gains in the norm (the old form, the oracle: `x =
    /// trunc(γ√d⊙z + β)`, `r = x + trunc(x·W + b)`) and folded into the
    /// stream (`t = trunc(2^s·z)`, the layer's weights folded, `r =
    /// trunc(t·W' + b' + (g⊙t + β)·2^e)`). Both residual sums are within
    /// their roundings of each other; a stream that drops its shifts is
    /// not.
    #[test]
    fn folded_post_norms_give_the_gained_residual_within_its_rounding() {
        let (d, rows) = (24, 6);
        let n = model::Norm {
            gamma: (0..d).map(|c| 0.4 + 0.05 * c as f32).collect(),
            beta: (0..d).map(|c| 0.05 * c as f32).collect(),
            eps: 1e-6,
        };
        let lin = layer(d);
        let parts = [&lin];
        let (mut b, x, zero) = testing::begin(rows, d, Bound::uniform(d, 6.0));
        let (h, h_form) = post_norm(&mut b, x, &n, "gained".into(), 0).unwrap();
        let (p, _) = linear_product(
            &mut b,
            h,
            Some(&h_form),
            "gained layer".into(),
            Weights::new(&parts, 1.0),
            d,
            0,
        )
        .unwrap();
        let a = truncate(&mut b, p, FRAC, "gained layer".into()).unwrap();
        let rb = b.info(h).bound.add(&b.info(a).bound);
        let gained = b.tensor("gained residual", rows, d, FRAC, rb).unwrap();
        b.push(Kind::Add {
            a: h,
            b: a,
            out: gained,
        });
        let (t, form, fold) = post_norm_folded(&mut b, x, &n, "folded".into(), 0).unwrap();
        let (pf, _) = linear_product(
            &mut b,
            t,
            Some(&form),
            "folded layer".into(),
            Weights::new(&parts, 1.0).folding(Some(&fold)),
            d,
            0,
        )
        .unwrap();
        let unshifted = Folded {
            gain: fold.gain.clone(),
            shift: vec![0.0; d],
        };
        let two_s = f64::from(n.gamma[0]) * (d as f64).sqrt() / fold.gain[0];
        let mut stream = Stream {
            t,
            form,
            fold: Some(fold),
        };
        let folded = residual_sum(&mut b, pf, &stream, "folded", 0).unwrap();
        stream.fold = Some(unshifted);
        let planted = residual_sum(&mut b, pf, &stream, "planted", 0).unwrap();
        let out = b
            .stack_rows(&[gained, folded, planted], "all".into())
            .unwrap();
        let xs = uniform(rows * d, 5.0, 11);
        let words = xs.iter().map(|v| encode(*v, FRAC)).collect();
        let (_, outs) = testing::run(b, (x, zero, out), "fold", words);
        let at = |i: usize| fixed::decode(outs[i], FRAC);
        let (root, u) = ((d as f64).sqrt(), ulp(FRAC));
        let mut planted_off = 0.0f64;
        for r in 0..rows {
            let row = &xs[r * d..(r + 1) * d];
            let mean = row.iter().sum::<f64>() / d as f64;
            let norm2 = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>();
            // |zᵢ| with room for ρ's and the inputs' roundings.
            let z: Vec<f64> = row
                .iter()
                .map(|v| 1.1 * (v - mean).abs() / norm2.sqrt())
                .collect();
            for j in 0..d {
                let mut tol = 8.0 * u;
                for (i, zi) in z.iter().enumerate() {
                    let wij = f64::from(lin.w.values()[i * d + j]).abs();
                    let g = f64::from(n.gamma[i]) * root;
                    let hi = g * zi + f64::from(n.beta[i]).abs();
                    // Gained: x's floor (on the residual and through W),
                    // W's and the gain's rounding.
                    tol += u * (wij + 0.5 * hi + 0.5 * zi * (1.0 + wij));
                    // Folded: t's floor (through g and W'), W''s rounding.
                    let gf = g / two_s;
                    tol += u * (gf * (1.0 + wij) + 0.5 * zi * two_s);
                }
                let k = r * d + j;
                let (vg, vf, vp) = (at(k), at(rows * d + k), at(2 * rows * d + k));
                assert!(
                    (vg - vf).abs() <= tol,
                    "row {r} column {j}: {} > {tol}",
                    (vg - vf).abs()
                );
                planted_off = planted_off.max((vg - vp).abs() / tol);
            }
        }
        // The shifts are what the planted stream leaves out: far beyond
        // the tolerance.
        assert!(
            planted_off > 10.0,
            "planted fault within {planted_off}× tol"
        );
    }
}
