//! Local operations of a plan, shared by the cleartext reference and the
//! parties: every one is linear over Z_2^64, so the same code runs on
//! cleartext values and on additive shares. Public constants (biases,
//! offsets) are added once: by the reference, and by P0 only.

use rayon::prelude::*;
use suffuse_core::batch::{BatchEval, MatShape, Resident};
use zeroize::Zeroize;

use crate::plan::{Kind, Plan};

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
        let written: Vec<usize> = ops.iter().map(|&i| plan.ops[i].kind.output()).collect();
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
    let t = &plan.tensors;
    let out = match &plan.ops[i].kind {
        Kind::Linear { x, linear, .. } => linear_layer(plan, *x, *linear, store, constants, la)?,
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
        Kind::RowMinus { v, x, .. } => {
            let cols = t[*x].cols;
            let vs = store.get(plan, *v)?;
            let xs = store.get(plan, *x)?;
            xs.chunks(cols.max(1))
                .zip(vs)
                .flat_map(|(row, m)| row.iter().map(move |s| m.wrapping_sub(*s)))
                .collect()
        }
        Kind::MinusRow { x, v, .. } => {
            let cols = t[*x].cols;
            let vs = store.get(plan, *v)?;
            let xs = store.get(plan, *x)?;
            xs.chunks(cols.max(1))
                .zip(vs)
                .flat_map(|(row, m)| row.iter().map(move |s| s.wrapping_sub(*m)))
                .collect()
        }
        Kind::RowSum { x, .. } => {
            let cols = t[*x].cols;
            store
                .get(plan, *x)?
                .chunks(cols.max(1))
                .map(|row| row.iter().fold(0u64, |a, v| a.wrapping_add(*v)))
                .collect()
        }
        Kind::TakeRows { x, stride, .. } => {
            let cols = t[*x].cols;
            store
                .get(plan, *x)?
                .chunks(cols.max(1))
                .step_by((*stride).max(1))
                .flat_map(|row| row.iter().copied())
                .collect()
        }
        kind => match layout::run(plan, kind, store) {
            Some(out) => out?,
            // Steps are not local.
            None => return Ok(()),
        },
    };
    let o = plan.ops[i].kind.output();
    store.set(plan, o, out)
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
