//! A chain on every element of a tensor: a reciprocal, an rsqrt, or a
//! one-round truncation of a per-row scalar.

use serde::Serialize;

use super::{Interactive, refused};
use crate::plan::{Built, BuiltCache, ChainSpec, PlanError, TensorInfo, shared};

/// A chain on every element (step): a reciprocal or rsqrt, or a
/// one-round truncation of a per-row scalar.
#[derive(Clone, Debug, Serialize)]
pub struct Chain {
    /// Input.
    pub x: usize,
    /// What it computes.
    pub spec: ChainSpec,
    /// Output.
    pub out: usize,
}

impl Interactive for Chain {
    fn inputs(&self) -> Vec<usize> {
        vec![self.x]
    }

    fn output(&self) -> usize {
        self.out
    }

    fn key_label(&self) -> String {
        match self.spec {
            ChainSpec::Trunc { shift, .. } => format!("trunc, one round, {shift} bits"),
            other => other.name_and_width().0.to_string(),
        }
    }

    fn round_label(&self) -> String {
        match self.spec {
            ChainSpec::Trunc { .. } => "trunc, one round".to_string(),
            _ => self.key_label(),
        }
    }

    fn build(&self, cache: &mut BuiltCache, tensors: &[TensorInfo]) -> Result<Built, PlanError> {
        let spec = self.spec;
        let c = shared(&mut cache.chains, spec, || {
            spec.build()
                .map_err(refused(tensors, self.x, format!("{spec:?}")))
        })?;
        Ok(Built::Chain(c))
    }
}
