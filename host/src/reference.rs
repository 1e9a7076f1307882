//! The cleartext fixed-point reference: the plan executed on cleartext
//! values with the same approximations as the protocol. The secure output
//! must equal it bit for bit.
//!
//! Steps use each protocol's own cleartext algebra (`Gate::reference`,
//! `Chain::reference`, exact ring products), and every tensor is checked
//! against the bound the plan proved for it: a value outside its bound is
//! an error naming the tensor, so a flaw in the range analysis cannot go
//! unnoticed (a gate outside its effective width would silently compute
//! something else).

use rayon::prelude::*;
use suffuse_core::batch::BatchEval;
use zeroize::Zeroize;

use crate::exec::{self, ExecError, Store};
use crate::plan::Plan;
use crate::proto;

/// Why the reference could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReferenceError {
    /// A value left its proven bound.
    #[error(
        "{tensor}: value {value} (element {index}) exceeds its proven bound ±{limit}; the range \
         analysis is wrong for this input"
    )]
    OutOfRange {
        /// The tensor.
        tensor: String,
        /// Element index.
        index: usize,
        /// The value (signed).
        value: i64,
        /// The bound.
        limit: u64,
    },
    /// The interpreter failed.
    #[error(transparent)]
    Exec(#[from] ExecError),
}

/// The cleartext inputs of a run: the client's secret. Wiped on drop;
/// `Debug` shows only sizes.
#[derive(Clone)]
pub struct ClearInputs {
    /// Embeddings `[B·L × d]`.
    pub x: Vec<u64>,
    /// Attention bias `[B × L]`.
    pub bias: Vec<u64>,
    /// Pooling mask `[B × L]`, for mean pooling.
    pub mask: Option<Vec<u64>>,
}

/// Runs the plan in the clear, matrix products on `la`; returns the output
/// tensor.
pub fn run(
    plan: &Plan,
    inputs: &ClearInputs,
    la: &dyn BatchEval,
) -> Result<Vec<u64>, ReferenceError> {
    let mut store = Store::new(plan);
    store.set(plan, plan.inputs.x, inputs.x.clone())?;
    store.set(plan, plan.inputs.bias, inputs.bias.clone())?;
    if let (Some(t), Some(m)) = (plan.inputs.mask, &inputs.mask) {
        store.set(plan, t, m.clone())?;
    }
    for t in [
        Some(plan.inputs.x),
        Some(plan.inputs.bias),
        plan.inputs.mask,
    ]
    .into_iter()
    .flatten()
    {
        check(plan, &store, t)?;
    }
    for i in 0..plan.ops.len() {
        op(plan, i, &mut store, la)?;
    }
    Ok(store.take(plan, plan.output)?)
}

/// One operation in the clear, its output checked against its bound.
fn op(plan: &Plan, i: usize, store: &mut Store, la: &dyn BatchEval) -> Result<(), ReferenceError> {
    if plan.ops[i].kind.is_step() {
        step(plan, i, store, la)?;
    } else {
        exec::run_local(plan, i, store, true, la)?;
    }
    for t in plan.ops[i].kind.outputs() {
        check(plan, store, t)?;
    }
    store.release_after(plan, i);
    Ok(())
}

/// One pass's cleartext inputs: embeddings and key bias. Wiped on drop;
/// `Debug` shows only sizes.
#[derive(Clone)]
pub struct PassInputs {
    /// Embeddings.
    pub x: Vec<u64>,
    /// Additive key bias.
    pub bias: Vec<u64>,
}

impl std::fmt::Debug for ClearInputs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ClearInputs {{ x: {} words, bias: {} words, mask: {:?} words (redacted) }}",
            self.x.len(),
            self.bias.len(),
            self.mask.as_ref().map(Vec::len)
        )
    }
}

impl Drop for ClearInputs {
    fn drop(&mut self) {
        self.x.zeroize();
        self.bias.zeroize();
        self.mask.zeroize();
    }
}

impl std::fmt::Debug for PassInputs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (x, b) = (self.x.len(), self.bias.len());
        write!(
            f,
            "PassInputs {{ x: {x} words, bias: {b} words (redacted) }}"
        )
    }
}

impl Drop for PassInputs {
    fn drop(&mut self) {
        self.x.zeroize();
        self.bias.zeroize();
    }
}

/// Gives a pass's inputs from the outputs of the passes before it.
pub type NextPass<'a> = dyn FnMut(usize, &[Vec<u64>]) -> Option<PassInputs> + 'a;

/// Runs a multi-pass plan in the clear. `next(p, outputs)` gives pass p's
/// inputs from the outputs of the passes before it, or `None` to stop.
/// Returns every pass's output.
pub fn run_passes(
    plan: &Plan,
    next: &mut NextPass<'_>,
    la: &dyn BatchEval,
) -> Result<Vec<Vec<u64>>, ReferenceError> {
    let mut store = Store::new(plan);
    let mut outputs = Vec::new();
    for (p, pass) in plan.passes.iter().enumerate() {
        let Some(mut inputs) = next(p, &outputs) else {
            break;
        };
        store.set(plan, pass.x, std::mem::take(&mut inputs.x))?;
        store.set(plan, pass.bias, std::mem::take(&mut inputs.bias))?;
        check(plan, &store, pass.x)?;
        check(plan, &store, pass.bias)?;
        for i in plan.pass_ops(p) {
            op(plan, i, &mut store, la)?;
        }
        outputs.push(store.take(plan, pass.output)?);
    }
    Ok(outputs)
}

/// Checks a tensor against its proven bound.
fn check(plan: &Plan, store: &Store, t: usize) -> Result<(), ReferenceError> {
    let info = &plan.tensors[t];
    let values = store.get(plan, t)?;
    let bad = values
        .par_iter()
        .position_first(|v| (*v as i64).unsigned_abs() > info.limit);
    match bad {
        None => Ok(()),
        Some(index) => Err(ReferenceError::OutOfRange {
            tensor: info.name.clone(),
            index,
            value: values[index] as i64,
            limit: info.limit,
        }),
    }
}

/// One step in the clear, by its kind's own algebra (`proto::reference`).
fn step(
    plan: &Plan,
    i: usize,
    store: &mut Store,
    la: &dyn BatchEval,
) -> Result<(), ReferenceError> {
    if let Some(out) = proto::reference(plan, i, store, la)? {
        proto::set_outputs(plan, i, store, out)?;
    }
    Ok(())
}
