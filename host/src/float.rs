//! The f32 reference of the whole model, written plainly from the maths: the
//! accuracy oracle for the secure path.
//!
//! Post-LayerNorm BERT, for a sequence with embedded rows `x` (see
//! [`Model::embed_tokens`]):
//!
//! ```text
//! for each layer:
//!     q, k, v = x·Wq + bq, x·Wk + bk, x·Wv + bv
//!     per head:  attn = softmax(q·kᵀ/√d_h + mask)·v      (mask: −∞ at padding keys)
//!     a = LN(x + attn·Wo + bo)
//!     x = LN(a + GeLU(a·W1 + b1)·W2 + b2)
//! ```
//!
//! then pooling (mean over real tokens, or the `[CLS]` row) and, when the
//! model says so, L2 normalization.
//!
//! Every row is computed on its own, in a fixed order, so a sequence's
//! result does not depend on the batch it is in, the padding around it or
//! the number of threads. Transcendentals come from `libm`, which gives the
//! same bits on every platform.

use rayon::prelude::*;

use crate::model::{Activation, Linear, Model, ModelError, Norm, Pooling};

/// The final hidden states, `[len × hidden]` row-major, of one unpadded
/// token sequence.
pub fn hidden_states(model: &Model, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
    let x = model.embed_tokens(tokens)?;
    Ok(encoder(model, x, &vec![true; tokens.len()]))
}

/// Sentence embeddings of a batch of token sequences. The batch is padded to
/// its longest sequence with an attention mask, pooled over the real tokens
/// only, and normalized when the model says so. Each result has `hidden`
/// entries.
pub fn embed(model: &Model, batch: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, ModelError> {
    let longest = batch.iter().map(Vec::len).max().unwrap_or(0);
    batch
        .iter()
        .map(|tokens| {
            // Check the real tokens first so errors name their positions,
            // not the padded sequence's.
            model.check_tokens(tokens)?;
            let mut padded = tokens.clone();
            padded.resize(longest, PAD_ID);
            let mask: Vec<bool> = (0..longest).map(|i| i < tokens.len()).collect();
            let states = encoder(model, model.embed_tokens(&padded)?, &mask);
            Ok(pool(model, &states, &mask))
        })
        .collect()
}

/// The id written at padding positions. Any valid id would do, since
/// padding is masked out of attention and pooling; 0 is BERT's `[PAD]`.
const PAD_ID: u32 = 0;

/// The encoder layers on embedded rows `x` (`[len × hidden]`), with
/// `mask[j]` false for padding positions.
fn encoder(model: &Model, mut x: Vec<f32>, mask: &[bool]) -> Vec<f32> {
    let h = model.config.hidden;
    for layer in &model.layers {
        let attn = attention(model, layer, &x, mask);
        let mut a = linear(&layer.attn_out, &attn);
        add_and_norm(&mut a, &x, &layer.attn_norm, h);

        let mut up = linear(&layer.ffn_in, &a);
        let act = model.config.activation;
        up.par_iter_mut().for_each(|v| *v = gelu(act, *v));
        let mut out = linear(&layer.ffn_out, &up);
        add_and_norm(&mut out, &a, &layer.ffn_norm, h);
        x = out;
    }
    x
}

/// Multi-head self-attention before the output projection: `[len × hidden]`,
/// heads side by side as in the concatenation.
fn attention(model: &Model, layer: &crate::model::Layer, x: &[f32], mask: &[bool]) -> Vec<f32> {
    let c = &model.config;
    let (h, d) = (c.hidden, c.head_dim());
    let q = linear(&layer.query, x);
    let k = linear(&layer.key, x);
    let v = linear(&layer.value, x);
    // Hugging Face divides the scores by √d_h (rather than scaling q).
    let scale = libm::sqrtf(d as f32);
    let bias: Vec<f32> = mask
        .iter()
        .map(|&real| if real { 0.0 } else { f32::NEG_INFINITY })
        .collect();

    let mut out = vec![0.0f32; x.len()];
    out.par_chunks_mut(h).enumerate().for_each(|(i, out_row)| {
        let mut p = vec![0.0f32; mask.len()];
        for head in 0..c.heads {
            let qi = &q[i * h + head * d..][..d];
            for (j, pj) in p.iter_mut().enumerate() {
                let kj = &k[j * h + head * d..][..d];
                *pj = dot(qi, kj) / scale + bias[j];
            }
            softmax(&mut p);
            let o = &mut out_row[head * d..][..d];
            for (j, &pj) in p.iter().enumerate() {
                // Masked keys have pj = 0 exactly; skipping them keeps the
                // sum identical to the unpadded one.
                if pj == 0.0 {
                    continue;
                }
                let vj = &v[j * h + head * d..][..d];
                for (oe, &ve) in o.iter_mut().zip(vj) {
                    *oe += pj * ve;
                }
            }
        }
    });
    out
}

/// Final pooling and normalization of `[len × hidden]` states.
fn pool(model: &Model, states: &[f32], mask: &[bool]) -> Vec<f32> {
    let h = model.config.hidden;
    let mut pooled = match model.config.pooling {
        Pooling::Cls => states[..h].to_vec(),
        Pooling::Mean => {
            let mut sum = vec![0.0f32; h];
            let mut count = 0usize;
            for (row, _) in states.chunks_exact(h).zip(mask).filter(|(_, real)| **real) {
                for (s, &v) in sum.iter_mut().zip(row) {
                    *s += v;
                }
                count += 1;
            }
            // sentence-transformers clamps the count at 1e-9; a sequence
            // here always has at least one real token.
            let n = count.max(1) as f32;
            sum.iter_mut().for_each(|s| *s /= n);
            sum
        }
    };
    if model.config.normalize {
        // torch.nn.functional.normalize: x / max(‖x‖, 1e-12).
        let norm = libm::sqrtf(pooled.iter().map(|v| v * v).sum::<f32>()).max(1e-12);
        pooled.iter_mut().for_each(|v| *v /= norm);
    }
    pooled
}

/// `y = x·w + b` over rows: `x` is `[rows × inputs]`, the result
/// `[rows × outputs]`.
///
/// Each output is `(Σ_k x[k]·w[k][j]) + b[j]`, summed in increasing `k`
/// from 0.0, whichever path below computes it: that keeps a row's result
/// independent of the rows around it (padding, batch) and of threads.
fn linear(l: &Linear, x: &[f32]) -> Vec<f32> {
    let (n, m) = (l.inputs, l.outputs);
    let w = l.w.values();
    let mut y = vec![0.0f32; x.len() / n * m];
    // One band of rows per thread, so that each column strip of `w` is
    // loaded into cache once per band and used by all its rows; inside a
    // band, register tiles of TILE_ROWS × TILE_COLS accumulators reuse each
    // loaded weight for several rows and each loaded input for several
    // columns.
    let rows = x.len() / n;
    let band = rows
        .div_ceil(rayon::current_num_threads())
        .next_multiple_of(TILE_ROWS);
    y.par_chunks_mut(band * m)
        .zip(x.par_chunks(band * n))
        .for_each(|(yb, xb)| {
            let rows = xb.len() / n;
            let mut j0 = 0;
            while j0 + TILE_COLS <= m {
                let mut r0 = 0;
                while r0 + TILE_ROWS <= rows {
                    tile::<TILE_ROWS>(l, &w, xb, yb, r0, j0);
                    r0 += TILE_ROWS;
                }
                for r in r0..rows {
                    tile::<1>(l, &w, xb, yb, r, j0);
                }
                j0 += TILE_COLS;
            }
            for r in 0..rows {
                for j in j0..m {
                    let mut acc = 0.0f32;
                    for k in 0..n {
                        acc += xb[r * n + k] * w[k * m + j];
                    }
                    yb[r * m + j] = acc + l.b[j];
                }
            }
        });
    y
}

/// Rows per register tile of [`linear`].
const TILE_ROWS: usize = 4;
/// Columns per register tile: 8 × 4 accumulators fit the 16 SSE registers
/// of baseline x86-64 with room for the operands.
const TILE_COLS: usize = 8;

/// Rows `r0..r0+R`, columns `j0..j0+TILE_COLS` of [`linear`].
fn tile<const R: usize>(l: &Linear, w: &[f32], xb: &[f32], yb: &mut [f32], r0: usize, j0: usize) {
    let (n, m) = (l.inputs, l.outputs);
    let mut acc = [[0.0f32; TILE_COLS]; R];
    for k in 0..n {
        let wk = &w[k * m + j0..][..TILE_COLS];
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let a = xb[(r0 + r) * n + k];
            for (o, &w) in acc_r.iter_mut().zip(wk) {
                *o += a * w;
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        let out = &mut yb[(r0 + r) * m + j0..][..TILE_COLS];
        for ((o, &a), &b) in out.iter_mut().zip(acc_r).zip(&l.b[j0..]) {
            *o = a + b;
        }
    }
}

/// `y = LN(y + residual)`, row by row.
fn add_and_norm(y: &mut [f32], residual: &[f32], norm: &Norm, h: usize) {
    y.par_chunks_mut(h)
        .zip(residual.par_chunks(h))
        .for_each(|(row, res)| {
            for (o, &r) in row.iter_mut().zip(res) {
                *o += r;
            }
            norm.apply(row);
        });
}

/// The GeLU of the model's configuration.
pub fn gelu(activation: Activation, x: f32) -> f32 {
    match activation {
        Activation::GeluErf => 0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2)),
        Activation::GeluTanh => {
            // √(2/π)
            const C: f32 = 0.797_884_6;
            0.5 * x * (1.0 + libm::tanhf(C * (x + 0.044_715 * x * x * x)))
        }
    }
}

/// Softmax in place, stable (the maximum is subtracted first). Entries of
/// −∞ become exactly 0.
fn softmax(p: &mut [f32]) {
    let max = p.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for v in p.iter_mut() {
        *v = libm::expf(*v - max);
        sum += *v;
    }
    for v in p.iter_mut() {
        *v /= sum;
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}
