//! A truncation, the residual sum that alone reads it, and that sum's
//! square, in the truncation's two rounds.

use serde::Serialize;
use suffuse_core::gate::trunc_open::TruncOpen;

use super::{Interactive, refused, width};
use crate::fixed::RING;
use crate::plan::{Built, BuiltCache, PlanError, TensorInfo};

/// `out = add + ⌊x/2^shift⌋` (a residual after the truncation
/// [`crate::plan::GateSpec::Trunc`] at effective width `k`), or the
/// truncation alone where there is no addend, and `square = out²`
/// elementwise (step): the truncation's second round also opens `out`
/// under a fresh mask, so the square takes no round of its own (core's
/// `TruncOpen`, squared form). The planner makes it from a truncation,
/// the residual sum that alone reads it and that sum's square, or from a
/// truncation and the square of its output (`Builder::square`).
#[derive(Clone, Debug, Serialize)]
pub struct TruncSquare {
    /// The input truncated.
    pub x: usize,
    /// The addend, if any: absent, `out` is the truncation itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub add: Option<usize>,
    /// Effective input width.
    pub k: u32,
    /// Bits dropped.
    pub shift: u32,
    /// The sum.
    pub out: usize,
    /// Its square.
    pub square: usize,
}

impl Interactive for TruncSquare {
    fn inputs(&self) -> Vec<usize> {
        [Some(self.x), self.add].into_iter().flatten().collect()
    }

    fn output(&self) -> usize {
        self.out
    }

    fn outputs(&self) -> Vec<usize> {
        vec![self.out, self.square]
    }

    fn key_label(&self) -> String {
        format!("trunc and square, {} bits", self.shift)
    }

    fn round_label(&self) -> String {
        "trunc and square".to_string()
    }

    fn build(&self, _cache: &mut BuiltCache, tensors: &[TensorInfo]) -> Result<Built, PlanError> {
        let (k, shift) = (self.k, self.shift);
        let g = TruncOpen::new(RING, width(k)?, shift).map_err(refused(
            tensors,
            self.x,
            format!("trunc by {shift} at width {k}"),
        ))?;
        Ok(Built::TruncOpen(g.squared()))
    }
}
