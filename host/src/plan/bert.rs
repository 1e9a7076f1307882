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

use rayon::prelude::*;

use super::attention;
use super::bound::{self, Bound, NormForm};
use super::linear::{Weights, linear_to_frac, real_weights};
use super::mlp;
use super::norm::{norm_output, residual_norm};
use super::scale::ulp;
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
    let n = batch * seq;
    b.at(Category::Linear, None);

    let mut norm = embeddings_norm(model);
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
        let site = Site {
            l,
            layer,
            x: h,
            x_norm: &norm,
            bias,
            c,
            seq,
            batch,
        };
        let (out, out_norm, s) = encoder_layer(&mut b, model, &site)?;
        h = out;
        norm = out_norm;
        scores = scores.max(s);
    }

    b.at(Category::Pooling, None);
    let (output, finish) = pool(&mut b, h, mask, (batch, seq, d))?;
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
    })
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

/// Where a layer runs: its index and weights, its input `x` and the
/// input's norm form, the attention bias and its constant `c`, the shape.
#[derive(Clone, Copy)]
struct Site<'a> {
    l: usize,
    layer: &'a model::Layer,
    x: usize,
    x_norm: &'a NormForm,
    bias: usize,
    c: f64,
    seq: usize,
    batch: usize,
}

/// A layer's self-attention up to its output projection: one fused
/// q/k/v product split into heads, the scores bounded through the weights'
/// bilinear form, softmax and the weighted values ([`attention::attend`]),
/// the heads merged and projected. Returns the projection at FRAC and the
/// worst score.
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
        x_norm,
        bias,
        c,
        seq,
        batch,
    } = *site;
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
        Weights::new(
            &[&layer.query, &layer.key, &layer.value],
            1.0 / (dh as f64).sqrt(),
        ),
        dh,
        l,
    )?;
    b.at(Category::Linear, Some(l));
    let [q, k, v] = split_heads(b, qkv, l, (heads, dh, bh * seq))?;

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
            window: None,
            positions: cfg.max_positions,
        },
        (qn * kn).min(bilinear),
        bias,
        c,
        l,
    )?;
    b.at(Category::Linear, Some(l));
    let om = merge_heads(b, o, l, (heads, dh, n))?;
    let (a, _) = linear_to_frac(
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
/// MLP, its residual and norm. Returns the output, its norm form and the
/// layer's worst score.
fn encoder_layer(
    b: &mut Builder,
    model: &Model,
    site: &Site<'_>,
) -> Result<(usize, NormForm, f64), PlanError> {
    let cfg = &model.config;
    let (l, layer, x) = (site.l, site.layer, site.x);
    let (a, score_abs) = encoder_attention(b, model, site)?;
    let (x1, x1_norm) =
        residual_norm(b, x, a, &layer.attn_norm, format!("layer {l} attention"), l)?;

    let tanh = matches!(cfg.activation, model::Activation::GeluTanh);
    let ffn_in = (&layer.ffn_in, cfg.intermediate);
    let g = mlp::encoder_mlp(b, (x1, &x1_norm), ffn_in, tanh, l)?;
    let (f, _) = linear_to_frac(
        b,
        g,
        None,
        format!("layer {l} output"),
        Weights::new(&[&layer.ffn_out], 1.0),
        cfg.hidden,
        l,
    )?;
    let (out, out_norm) = residual_norm(b, x1, f, &layer.ffn_norm, format!("layer {l} output"), l)?;
    Ok((out, out_norm, score_abs))
}
