//! A LayerNorm's centring and sum of squares in one round.

use serde::Serialize;

use super::{Interactive, refused, width};
use crate::fixed::RING;
use crate::plan::{Built, BuiltCache, PlanError, TensorInfo};

/// A LayerNorm's centring and sum of squares of the rows of `x` (step,
/// one round): `μ = ⌊gain·Σx/2^shift⌋` (a gap truncation at effective
/// width `k`), `out = x − μ` and `sums = Σout²` per row (core's
/// `CentreSquare`: the squares' opening travels beside the mean's). The
/// planner makes it for every LayerNorm's centring (`plan::norm`).
#[derive(Clone, Debug, Serialize)]
pub struct CentreSquare {
    /// The rows.
    pub x: usize,
    /// The mean's factor, at `shift` fraction bits.
    pub gain: u64,
    /// Effective width of `gain·Σx`.
    pub k: u32,
    /// Bits the mean drops.
    pub shift: u32,
    /// The centred rows.
    pub out: usize,
    /// Each row's sum of squares.
    pub sums: usize,
}

impl Interactive for CentreSquare {
    fn inputs(&self) -> Vec<usize> {
        vec![self.x]
    }

    fn output(&self) -> usize {
        self.out
    }

    fn outputs(&self) -> Vec<usize> {
        vec![self.out, self.sums]
    }

    fn key_label(&self) -> String {
        "centre and square".to_string()
    }

    fn build(&self, _cache: &mut BuiltCache, tensors: &[TensorInfo]) -> Result<Built, PlanError> {
        let (k, shift) = (self.k, self.shift);
        let cols = tensors[self.x].cols;
        let g = suffuse_core::gate::centre_square::CentreSquare::new(
            RING,
            (width(k)?, shift),
            self.gain,
            cols,
        )
        .map_err(refused(
            tensors,
            self.x,
            format!("mean by {shift} at width {k}"),
        ))?;
        Ok(Built::CentreSquare(g))
    }
}
