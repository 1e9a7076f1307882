//! Row maxima by a comparison tree.

use serde::Serialize;
use suffuse_core::gate::max::MaxTree;

use super::{Interactive, refused, width};
use crate::fixed::RING;
use crate::plan::{Built, BuiltCache, PlanError, TensorInfo, is_standard_tail, is_zero, shared};

/// Row maxima by a comparison tree (step).
#[derive(Clone, Debug, Serialize)]
pub struct Max {
    /// Input `[rows × len]`.
    pub x: usize,
    /// Width of pairwise differences.
    pub k: u32,
    /// Output `[rows × 1]`.
    pub out: usize,
    /// Rows per causal block, or 0: row `r` then takes its first
    /// `r % causal + 1` values only (`MaxTree::causal`).
    #[serde(skip_serializing_if = "is_zero")]
    pub causal: usize,
    /// The last levels that run in one round
    /// (`MaxTree::one_round_tail`).
    #[serde(skip_serializing_if = "is_standard_tail")]
    pub tail: usize,
}

impl Interactive for Max {
    fn inputs(&self) -> Vec<usize> {
        vec![self.x]
    }

    fn output(&self) -> usize {
        self.out
    }

    fn key_label(&self) -> String {
        "max".to_string()
    }

    fn build(&self, cache: &mut BuiltCache, tensors: &[TensorInfo]) -> Result<Built, PlanError> {
        let Max {
            x, k, causal, tail, ..
        } = *self;
        let cols = tensors[x].cols;
        let t = shared(&mut cache.trees, (k, cols, causal, tail), || {
            MaxTree::new(RING, width(k)?, cols)
                .map(|t| t.one_round_tail(tail))
                .map(|t| match causal {
                    0 => t,
                    period => t.causal(period),
                })
                .map_err(refused(tensors, x, format!("max over width {k}")))
        })?;
        Ok(Built::Max(t))
    }
}
