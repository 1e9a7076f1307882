//! Local operations of a plan, shared by the cleartext reference and the
//! parties: every one is linear over Z_2^64, so the same code runs on
//! cleartext values and on additive shares. Public constants (biases,
//! offsets) are added once: by the reference, and by P0 only.

use rayon::prelude::*;
use suffuse_core::batch::{BatchEval, MatShape, Pairing, Resident, Turned};
use zeroize::Zeroize;

use crate::plan::{EncodedLinear, Kind, Plan, RopeTables};

mod layout;

/// Tensor values by slot; a slot is empty before it is written and after
/// its last use. On a party the values are shares: a freed slot and the
/// whole store are wiped, and `Debug` shows only which slots are held.
#[derive(Default)]
pub struct Store {
    slots: Vec<Option<Vec<u64>>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let held = self.slots.iter().filter(|s| s.is_some()).count();
        write!(
            f,
            "Store {{ {held} of {} slots held, values redacted }}",
            self.slots.len()
        )
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.slots.zeroize();
    }
}

/// A slot that should hold a value does not (a plan/interpreter bug or a
/// malformed plan), or a product had inconsistent shapes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecError {
    /// A tensor read before it was written or after it was freed.
    #[error("tensor {tensor} ({name}) is not available")]
    Missing {
        /// Slot.
        tensor: usize,
        /// Its name.
        name: String,
    },
    /// A tensor with the wrong number of elements.
    #[error("tensor {tensor} ({name}) has {got} elements, the plan says {want}")]
    Length {
        /// Slot.
        tensor: usize,
        /// Its name.
        name: String,
        /// Expected.
        want: usize,
        /// Found.
        got: usize,
    },
    /// The backend refused a matrix product.
    #[error("matrix product {shape:?}: {error}")]
    MatMul {
        /// Its shape.
        shape: MatShape,
        /// The backend's answer.
        error: suffuse_core::Error,
    },
    /// The backend refused a product with RoPE folded into its weights.
    #[error("rotated linear product: {error}")]
    Turned {
        /// The backend's answer.
        error: suffuse_core::Error,
    },
    /// A layer with RoPE folded in, without its words at the fold's
    /// precision (the planner encodes them for every such layer).
    #[error("linear layer {linear} has RoPE folded in but no words at {keep} more fraction bits")]
    Unfolded {
        /// The layer.
        linear: String,
        /// The fold's extra fraction bits.
        keep: u32,
    },
}

/// Runs one product on the backend, naming the shape in any error.
pub fn matmul(
    la: &dyn BatchEval,
    shape: MatShape,
    a: &[u64],
    b: &[u64],
    c: &mut [u64],
) -> Result<(), ExecError> {
    la.matmul(&shape, a, b, c)
        .map_err(|error| ExecError::MatMul { shape, error })
}

impl Store {
    /// A store for a plan's tensors.
    pub fn new(plan: &Plan) -> Store {
        Store {
            slots: vec![None; plan.tensors.len()],
        }
    }

    /// Sets a tensor, checking its length against the plan.
    pub fn set(&mut self, plan: &Plan, t: usize, v: Vec<u64>) -> Result<(), ExecError> {
        let info = &plan.tensors[t];
        if v.len() != info.words() {
            return Err(ExecError::Length {
                tensor: t,
                name: info.name.clone(),
                want: info.words(),
                got: v.len(),
            });
        }
        self.slots[t] = Some(v);
        Ok(())
    }

    /// A tensor's values.
    pub fn get<'a>(&'a self, plan: &Plan, t: usize) -> Result<&'a [u64], ExecError> {
        self.slots[t].as_deref().ok_or_else(|| ExecError::Missing {
            tensor: t,
            name: plan.tensors[t].name.clone(),
        })
    }

    /// Takes a tensor out of the store.
    pub fn take(&mut self, plan: &Plan, t: usize) -> Result<Vec<u64>, ExecError> {
        self.slots[t].take().ok_or_else(|| ExecError::Missing {
            tensor: t,
            name: plan.tensors[t].name.clone(),
        })
    }

    /// A store holding copies of the tensors operations `ops` read but do
    /// not write: what a lane of a group needs from before the group.
    pub fn for_ops(&self, plan: &Plan, ops: &[usize]) -> Result<Store, ExecError> {
        let written: Vec<usize> = ops
            .iter()
            .flat_map(|&i| plan.ops[i].kind.outputs())
            .collect();
        let mut lane = Store::new(plan);
        for &i in ops {
            for t in plan.ops[i].kind.inputs() {
                if !written.contains(&t) && lane.slots[t].is_none() {
                    lane.slots[t] = Some(self.get(plan, t)?.to_vec());
                }
            }
        }
        Ok(lane)
    }

    /// Moves the tensors `tensors` that `other` still holds into this
    /// store (a lane's outputs); the rest of `other` is wiped.
    pub fn absorb(&mut self, mut other: Store, tensors: &[usize]) {
        for &t in tensors {
            if let Some(v) = other.slots[t].take() {
                self.slots[t].zeroize();
                self.slots[t] = Some(v);
            }
        }
    }

    /// Frees the inputs of operation `i` that no later operation reads.
    pub fn release_after(&mut self, plan: &Plan, i: usize) {
        for t in plan.ops[i].kind.inputs() {
            if plan.last_use[t] == i {
                self.slots[t].zeroize();
            }
        }
    }
}

/// Runs local operation `i` with products on `la`. `constants` adds public
/// constants (the reference, and P0).
pub fn run_local(
    plan: &Plan,
    i: usize,
    store: &mut Store,
    constants: bool,
    la: &dyn BatchEval,
) -> Result<(), ExecError> {
    let out = match &plan.ops[i].kind {
        Kind::Linear {
            x,
            linear,
            rope: Some(fold),
            unbiased,
            ..
        } => {
            let l = &plan.linears[*linear];
            rotated_linear(plan, *x, l, fold, store, (constants && !unbiased, la))?
        }
        Kind::Linear {
            x,
            linear,
            unbiased,
            ..
        } => linear_layer(plan, *x, *linear, store, constants && !unbiased, la)?,
        Kind::Add { a, b, .. } => {
            let (a, b) = (store.get(plan, *a)?, store.get(plan, *b)?);
            a.iter().zip(b).map(|(x, y)| x.wrapping_add(*y)).collect()
        }
        Kind::Affine {
            x, gain, offset, ..
        } => affine(plan, *x, gain, offset, store, constants)?,
        Kind::SplitHeads {
            x,
            part,
            heads,
            out,
        } => split_heads(plan, *x, *part, *heads, *out, store)?,
        Kind::MergeHeads { x, heads, out } => merge_heads(plan, *x, *heads, *out, store)?,
        Kind::AddBias {
            x, bias, rows_per, ..
        } => add_bias(plan, *x, *bias, *rows_per, store)?,
        kind => match row_op(plan, kind, store).or_else(|| layout::run(plan, kind, store)) {
            Some(out) => out?,
            // Steps are not local.
            None => return Ok(()),
        },
    };
    let o = plan.ops[i].kind.output();
    store.set(plan, o, out)
}

/// A row-wise local operation (a per-row value against each element, a
/// row's sum, every `stride`-th row); `None` for any other kind.
fn row_op(plan: &Plan, kind: &Kind, store: &Store) -> Option<Result<Vec<u64>, ExecError>> {
    let t = &plan.tensors;
    let each = |x: usize, v: usize, f: fn(u64, u64) -> u64| -> Result<Vec<u64>, ExecError> {
        let cols = t[x].cols;
        let vs = store.get(plan, v)?;
        let xs = store.get(plan, x)?;
        Ok(xs
            .chunks(cols.max(1))
            .zip(vs)
            .flat_map(|(row, m)| row.iter().map(move |s| f(*s, *m)))
            .collect())
    };
    Some(match kind {
        Kind::RowMinus { v, x, .. } => each(*x, *v, |s, m| m.wrapping_sub(s)),
        Kind::MinusRow { x, v, .. } => each(*x, *v, |s, m| s.wrapping_sub(m)),
        Kind::RowSum { x, .. } => store.get(plan, *x).map(|xs| {
            xs.chunks(t[*x].cols.max(1))
                .map(|row| row.iter().fold(0u64, |a, v| a.wrapping_add(*v)))
                .collect()
        }),
        Kind::TakeRows { x, stride, .. } => store.get(plan, *x).map(|xs| {
            xs.chunks(t[*x].cols.max(1))
                .step_by((*stride).max(1))
                .flat_map(|row| row.iter().copied())
                .collect()
        }),
        _ => return None,
    })
}

/// `x·W` (`+ b` with `constants`) of linear layer `linear`, its weights
/// resident on `la`.
fn linear_layer(
    plan: &Plan,
    x: usize,
    linear: usize,
    store: &Store,
    constants: bool,
    la: &dyn BatchEval,
) -> Result<Vec<u64>, ExecError> {
    let l = &plan.linears[linear];
    let rows = plan.tensors[x].rows;
    let mut y = vec![0u64; rows * l.outputs];
    let shape = MatShape {
        batches: 1,
        m: rows,
        k: l.inputs,
        n: l.outputs,
        transpose_b: false,
        accumulate: false,
    };
    let w = Resident {
        id: l.id,
        words: &l.w,
    };
    la.matmul_resident(&shape, store.get(plan, x)?, w, &mut y)
        .map_err(|error| ExecError::MatMul { shape, error })?;
    if constants {
        y.par_chunks_mut(l.outputs.max(1)).for_each(|row| {
            for (v, b) in row.iter_mut().zip(&l.b) {
                *v = v.wrapping_add(*b);
            }
        });
    }
    Ok(y)
}

/// `x·W` (`+ b` with `constants`) of linear layer `l` with RoPE folded in
/// ([`RopeTables`]): row `r` takes the weights and bias rotated by row
/// `r`'s angles, on `la` ([`BatchEval::turned_matmul`]).
fn rotated_linear(
    plan: &Plan,
    x: usize,
    l: &EncodedLinear,
    fold: &RopeTables,
    store: &Store,
    (constants, la): (bool, &dyn BatchEval),
) -> Result<Vec<u64>, ExecError> {
    rotated_product(store.get(plan, x)?, l, fold, constants, la)
}

/// Each column's turn, row by row, for [`rotated_product`]: its pair
/// partner, and the factors of its own word and its partner's.
struct Turns {
    partner: Vec<usize>,
    own: Vec<u64>,
    other: Vec<u64>,
}

/// [`Turns`] of `rows` rows of `n` columns. Each rotated column's pair
/// partner and frequency; a pair's words are `c·w_a − s·w_b` at its first
/// column and `c·w_b + s·w_a` at its second. The other columns turn by the
/// angle 0 (`c = 1`, `s = 0`): the layer's fine words as they are, its own
/// words times 2^keep.
fn turns(fold: &RopeTables, rows: usize, n: usize) -> Turns {
    let (rot, half) = (fold.rotated, fold.head_dim / 2);
    let mut partner: Vec<usize> = (0..n).collect();
    let mut freq = vec![0; rot];
    let mut first = vec![false; rot];
    for (a, b, i) in fold.pairs() {
        (partner[a], partner[b], freq[a], freq[b], first[a]) = (b, a, i, i, true);
    }
    let (mut own, mut other) = (Vec::with_capacity(rows * n), Vec::with_capacity(rows * n));
    for r in 0..rows {
        for c in 0..n {
            let (cos, sin) = match c < rot {
                true => (fold.cos[r * half + freq[c]], fold.sin[r * half + freq[c]]),
                false => (1 << fold.frac, 0),
            };
            own.push(cos);
            other.push(if c < rot && first[c] {
                sin.wrapping_neg()
            } else {
                sin
            });
        }
    }
    Turns {
        partner,
        own,
        other,
    }
}

/// The rows `xs` (`[rows × l.inputs]`) times `l`'s weights with `fold`
/// applied row by row, `+ b` (rotated) with `constants`.
fn rotated_product(
    xs: &[u64],
    l: &EncodedLinear,
    fold: &RopeTables,
    constants: bool,
    la: &dyn BatchEval,
) -> Result<Vec<u64>, ExecError> {
    let (k, n) = (l.inputs, l.outputs);
    let rows = xs.len() / k.max(1);
    let Turns {
        partner,
        own,
        other,
    } = turns(fold, rows, n);
    let turned = Turned {
        m: rows,
        k,
        n,
        turned: n,
        pairing: match fold.adjacent {
            true => Pairing::Adjacent,
            false => Pairing::Halves(fold.head_dim),
        },
        own: &own,
        other: &other,
        frac: fold.frac,
    };
    // The layer's words at `keep` more fraction bits, rotated and rounded
    // to their own scale: the planner encodes them for every layer it
    // folds RoPE into.
    let fine = l
        .fine
        .as_deref()
        .filter(|f| f.keep == fold.keep)
        .ok_or_else(|| ExecError::Unfolded {
            linear: l.name.clone(),
            keep: fold.keep,
        })?;
    let (w, bias) = (&fine.w, &fine.b);
    let mut y = vec![0u64; rows * n];
    la.turned_matmul(&turned, xs, w, &mut y)
        .map_err(|error| ExecError::Turned { error })?;
    if constants && bias.len() == n {
        for (r, out) in y.chunks_exact_mut(n.max(1)).enumerate() {
            for (c, o) in out.iter_mut().enumerate() {
                let (f, g) = (own[r * n + c], other[r * n + c]);
                let b = Turned::turn(bias[c], bias[partner[c]], f, g, turned.frac);
                *o = o.wrapping_add(b);
            }
        }
    }
    Ok(y)
}

/// `x·gain + offset` per column (the offset with `constants` only).
fn affine(
    plan: &Plan,
    x: usize,
    gain: &[u64],
    offset: &[u64],
    store: &Store,
    constants: bool,
) -> Result<Vec<u64>, ExecError> {
    let cols = plan.tensors[x].cols;
    let xs = store.get(plan, x)?;
    let mut y = Vec::with_capacity(xs.len());
    for row in xs.chunks(cols.max(1)) {
        for (c, v) in row.iter().enumerate() {
            let g = gain[c.min(gain.len() - 1)];
            let o = if constants {
                offset[c.min(offset.len() - 1)]
            } else {
                0
            };
            y.push(v.wrapping_mul(g).wrapping_add(o));
        }
    }
    Ok(y)
}

/// Part `part` of `x`'s columns, split into `heads` heads: output row
/// (b·H + h)·L + i holds columns part·d + h·dh.. of input row b·L + i.
fn split_heads(
    plan: &Plan,
    x: usize,
    part: usize,
    heads: usize,
    out: usize,
    store: &Store,
) -> Result<Vec<u64>, ExecError> {
    let t = &plan.tensors;
    let (rows_out, dh) = (t[out].rows, t[out].cols);
    let d = dh * heads;
    let seq = plan.seq;
    let src = store.get(plan, x)?;
    let width = t[x].cols;
    let mut y = vec![0u64; rows_out * dh];
    y.par_chunks_mut(dh * seq)
        .enumerate()
        .for_each(|(bh, block)| {
            let (b, h) = (bh / heads, bh % heads);
            for i in 0..seq {
                let from = (b * seq + i) * width + part * d + h * dh;
                block[i * dh..(i + 1) * dh].copy_from_slice(&src[from..from + dh]);
            }
        });
    Ok(y)
}

/// The inverse of [`split_heads`]: heads side by side again.
fn merge_heads(
    plan: &Plan,
    x: usize,
    heads: usize,
    out: usize,
    store: &Store,
) -> Result<Vec<u64>, ExecError> {
    let t = &plan.tensors;
    let (rows, d) = (t[out].rows, t[out].cols);
    let dh = t[x].cols;
    let seq = plan.seq;
    let src = store.get(plan, x)?;
    let mut y = vec![0u64; rows * d];
    y.par_chunks_mut(d * seq)
        .enumerate()
        .for_each(|(b, block)| {
            for h in 0..heads {
                for i in 0..seq {
                    let from = ((b * heads + h) * seq + i) * dh;
                    block[i * d + h * dh..i * d + (h + 1) * dh]
                        .copy_from_slice(&src[from..from + dh]);
                }
            }
        });
    Ok(y)
}

/// `x` plus row `r / rows_per` of `bias` on each row `r`.
fn add_bias(
    plan: &Plan,
    x: usize,
    bias: usize,
    rows_per: usize,
    store: &Store,
) -> Result<Vec<u64>, ExecError> {
    let cols = plan.tensors[x].cols;
    let bias = store.get(plan, bias)?;
    let mut y = store.get(plan, x)?.to_vec();
    y.par_chunks_mut(cols.max(1))
        .enumerate()
        .for_each(|(r, row)| {
            let b = &bias[(r / rows_per) * cols..(r / rows_per + 1) * cols];
            for (v, add) in row.iter_mut().zip(b) {
                *v = v.wrapping_add(*add);
            }
        });
    Ok(y)
}

/// The product of a [`Kind::MatMul`]: `batches` products of `m × k` by
/// `k × n` (or its transpose), into or added to `m × n`.
pub fn matmul_shape(
    transpose_b: bool,
    batches: usize,
    m: usize,
    k: usize,
    n: usize,
    accumulate: bool,
) -> MatShape {
    MatShape {
        batches,
        m,
        k,
        n,
        transpose_b,
        accumulate,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixed::{WEIGHT_FRAC, decode, encode};

    /// A decode pass whose projection leaves its biases to after the
    /// truncation (`plan::decoder` `add_turned_bias`, turned in floating
    /// point) adds what the prefill's folded product would turn in integer
    /// arithmetic at the same position: the executor's rotation of the
    /// prefill's biased words by the decode pass's tables, rounded to
    /// FRAC, is the pass's offset within one unit.
    #[test]
    fn a_decode_pass_adds_the_biases_the_fold_would_turn() {
        use crate::plan::decoder::{Generation, build};
        let mut model = crate::model::Decoder::builtin("tiny-llama").unwrap();
        for layer in &mut model.layers {
            for part in [&mut layer.query, &mut layer.key, &mut layer.value] {
                part.b = (0..part.outputs)
                    .map(|i| ((7 * i) % 13) as f32 / 6.0 - 1.0)
                    .collect();
            }
        }
        let plan = build(
            &model,
            Generation {
                prompt: 8,
                steps: 1,
            },
        )
        .unwrap();
        let la = crate::backend::auto();
        let mut checked = 0;
        for l in 0..model.layers.len() {
            let named = |what: &str| format!("layer {l} query/key/value{what}");
            let pass = &plan.ops[plan.pass_ops(1)];
            let found = pass.iter().find_map(|op| match &op.kind {
                Kind::Linear {
                    linear,
                    rope: Some(fold),
                    unbiased: true,
                    ..
                } if plan.linears[*linear].name == named("") => {
                    Some((&plan.linears[*linear], fold))
                }
                _ => None,
            });
            // The prefill's layer, biases and all.
            let (biased, fold) = found.unzip();
            let offset = pass.iter().find_map(|op| match &op.kind {
                Kind::Affine { offset, out, .. }
                    if plan.tensors[*out].name == named(" (biased)") =>
                {
                    Some(offset)
                }
                _ => None,
            });
            let (Some(biased), Some(fold), Some(offset)) = (biased, fold, offset) else {
                panic!("layer {l}: no biases after the truncation");
            };
            assert!(biased.b.iter().any(|v| *v != 0));
            let zero = vec![0u64; biased.inputs];
            let turned = rotated_product(&zero, biased, fold, true, la).unwrap();
            let scale = biased.bias_scale + fold.keep;
            for (c, (t, o)) in turned.iter().zip(offset).enumerate() {
                let want = decode(*t, scale) * f64::from(crate::fixed::FRAC).exp2();
                let got = *o as i64 as f64;
                assert!(
                    (want - got).abs() <= 1.0,
                    "layer {l} column {c}: {want} vs {got}"
                );
            }
            checked += offset.len();
        }
        assert!(checked > 0);
    }

    /// A small layer: 3 inputs, two heads of 4 rotated columns and one
    /// more; with `keep`, its words at `keep` more fraction bits too.
    /// `l`'s words at its fine precision, as a layer of their own.
    fn fine_words(l: &EncodedLinear) -> EncodedLinear {
        let fine = l.fine.as_deref().unwrap();
        EncodedLinear {
            w: fine.w.clone(),
            b: fine.b.clone(),
            fine: None,
            ..l.clone()
        }
    }

    fn layer_kept(seed: u64, keep: Option<u32>) -> EncodedLinear {
        let (inputs, outputs) = (3, 12);
        let mut reals = crate::plan::testing::uniform(inputs * outputs + outputs, 2.0, seed);
        let b = reals.split_off(inputs * outputs);
        let w = reals;
        let at =
            |v: &[f64], frac: u32| -> Vec<u64> { v.iter().map(|x| encode(*x, frac)).collect() };
        EncodedLinear {
            name: "test".into(),
            inputs,
            outputs,
            w: at(&w, WEIGHT_FRAC),
            b: at(&b, 2 * WEIGHT_FRAC),
            bias_scale: 2 * WEIGHT_FRAC,
            id: [0; 16],
            fine: keep.map(|keep| {
                Box::new(crate::plan::Fine {
                    keep,
                    w: at(&w, WEIGHT_FRAC + keep),
                    b: at(&b, 2 * WEIGHT_FRAC + keep),
                })
            }),
        }
    }

    fn fold(rows: &[(f64, f64)], adjacent: bool, keep: u32) -> RopeTables {
        let enc = |v: f64| encode(v, 16);
        let (cos, sin) = rows
            .iter()
            .flat_map(|&(c, s)| [(enc(c), enc(s)), (enc(c * 0.5), enc(s * 0.5))])
            .unzip();
        RopeTables {
            rotated: 8,
            head_dim: 4,
            adjacent,
            cos,
            sin,
            frac: 16,
            keep,
        }
    }

    /// The folded product on this machine's backend, which must equal
    /// core's reference row loop.
    fn product(xs: &[u64], l: &EncodedLinear, f: &RopeTables, constants: bool) -> Vec<u64> {
        let serial = suffuse_core::batch::Serial::new();
        let want = rotated_product(xs, l, f, constants, &serial).unwrap();
        let got = rotated_product(xs, l, f, constants, crate::backend::auto()).unwrap();
        assert_eq!(got, want);
        got
    }

    fn plain(xs: &[u64], l: &EncodedLinear) -> Vec<u64> {
        let shape = MatShape {
            batches: 1,
            m: xs.len() / l.inputs,
            k: l.inputs,
            n: l.outputs,
            transpose_b: false,
            accumulate: false,
        };
        let mut y = vec![0; shape.m * l.outputs];
        suffuse_core::batch::matmul_reference(&shape, xs, &l.w, &mut y).unwrap();
        for row in y.chunks_mut(l.outputs) {
            for (v, b) in row.iter_mut().zip(&l.b) {
                *v = v.wrapping_add(*b);
            }
        }
        y
    }

    /// The identity rotation gives the plain product of the layer's fine
    /// words and a quarter turn its pairs swapped with one sign, bit for
    /// bit; both pair styles.
    #[test]
    fn exact_turns_are_exact() {
        let xs: Vec<u64> = [0.5, -1.25, 2.0, 1.0, 0.75, -0.5]
            .iter()
            .map(|v| encode(*v, WEIGHT_FRAC))
            .collect();
        for (adjacent, keep) in [(true, 0), (false, 0), (true, 4), (false, 3)] {
            let l = layer_kept(1, Some(keep));
            let p = plain(&xs, &fine_words(&l));
            let mut f = fold(&[(1.0, 0.0), (1.0, 0.0)], adjacent, keep);
            f.cos.iter_mut().for_each(|c| *c = 1 << 16);
            f.sin.iter_mut().for_each(|s| *s = 0);
            assert_eq!(product(&xs, &l, &f, true), p);
            f.cos.iter_mut().for_each(|c| *c = 0);
            f.sin.iter_mut().for_each(|s| *s = 1 << 16);
            let q = product(&xs, &l, &f, true);
            for r in 0..2 {
                let (pr, qr) = (&p[r * 12..r * 12 + 12], &q[r * 12..r * 12 + 12]);
                for (a, b, _) in f.pairs() {
                    assert_eq!(qr[a], pr[b].wrapping_neg());
                    assert_eq!(qr[b], pr[a]);
                }
                assert_eq!(qr[8..], pr[8..]);
            }
        }
    }

    /// Shares: the product of a sharing is a sharing of the product (the
    /// rotated bias added once).
    #[test]
    fn shares_add_up() {
        let l = layer_kept(2, Some(4));
        let f = fold(&[(0.6, 0.8), (-0.28, 0.96)], true, 4);
        let xs: Vec<u64> = (0..6).map(|i| encode(i as f64 * 0.3 - 0.7, 12)).collect();
        let x0: Vec<u64> = (0..6u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        let x1: Vec<u64> = xs
            .iter()
            .zip(&x0)
            .map(|(x, a)| x.wrapping_sub(*a))
            .collect();
        let y0 = product(&x0, &l, &f, true);
        let y1 = product(&x1, &l, &f, false);
        let sum: Vec<u64> = y0
            .iter()
            .zip(&y1)
            .map(|(a, b)| a.wrapping_add(*b))
            .collect();
        assert_eq!(sum, product(&xs, &l, &f, true));
    }

    /// A fold whose layer has no words at its precision is refused, not
    /// run on coarser words.
    #[test]
    fn a_fold_without_its_fine_words_is_refused() {
        let xs: Vec<u64> = (0..6).map(|i| encode(f64::from(i) * 0.25, 12)).collect();
        let f = fold(&[(0.6, 0.8), (0.8, -0.6)], true, 4);
        let serial = suffuse_core::batch::Serial::new();
        for l in [layer_kept(3, None), layer_kept(3, Some(5))] {
            let got = rotated_product(&xs, &l, &f, true, &serial);
            assert!(
                matches!(got, Err(ExecError::Unfolded { keep: 4, .. })),
                "{got:?}"
            );
        }
    }

    /// With the layer's words at `keep` more fraction bits (as the planner
    /// folds): within half a unit of those words per input of the exact
    /// rotation of their own product, and the other columns exact.
    #[test]
    fn fine_words_stay_within_the_planned_error() {
        for seed in 0..30 {
            let keep = 4 + (seed % 5) as u32;
            let l = layer_kept(seed, Some(keep));
            let words = fine_words(&l);
            let angle = seed as f64 * 0.61;
            let f = fold(
                &[(angle.cos(), angle.sin()), (angle.sin(), angle.cos())],
                seed % 2 == 1,
                keep,
            );
            let xr = [1.5, -0.25 - seed as f64 * 0.02, 0.5, 2.0, -1.75, 0.125];
            let xs: Vec<u64> = xr.iter().map(|v| encode(*v, WEIGHT_FRAC)).collect();
            let (p, q) = (plain(&xs, &words), product(&xs, &l, &f, true));
            let scale = 2 * WEIGHT_FRAC + keep;
            for r in 0..2 {
                let l1: f64 = xr[r * 3..r * 3 + 3].iter().map(|v| v.abs()).sum();
                let allowed = 0.5 * 2f64.powi(-((WEIGHT_FRAC + keep) as i32)) * l1
                    + 2f64.powi(-(scale as i32));
                for (a, b, i) in f.pairs() {
                    let c = decode(f.cos[r * 2 + i], 16);
                    let s = decode(f.sin[r * 2 + i], 16);
                    let (pa, pb) = (decode(p[r * 12 + a], scale), decode(p[r * 12 + b], scale));
                    for (col, want) in [(a, c * pa - s * pb), (b, s * pa + c * pb)] {
                        let got = decode(q[r * 12 + col], scale);
                        assert!((got - want).abs() <= allowed, "seed {seed} col {col}");
                    }
                }
                assert_eq!(q[r * 12 + 8..r * 12 + 12], p[r * 12 + 8..r * 12 + 12]);
            }
        }
    }
}
