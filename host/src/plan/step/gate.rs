//! A scalar gate on every element of a tensor.

use serde::Serialize;

use super::{Interactive, refused};
use crate::plan::{Built, BuiltCache, GateSpec, GeluForm, PlanError, TensorInfo, shared};
use crate::plan::{gate_name, gelu_form};

/// A scalar gate on every element (step).
#[derive(Clone, Debug, Serialize)]
pub struct Gate {
    /// Input.
    pub x: usize,
    /// The gate.
    pub gate: GateSpec,
    /// Output.
    pub out: usize,
}

impl Interactive for Gate {
    fn inputs(&self) -> Vec<usize> {
        vec![self.x]
    }

    fn output(&self) -> usize {
        self.out
    }

    fn key_label(&self) -> String {
        match self.gate {
            GateSpec::Trunc { shift, .. } => format!("trunc, {shift} bits"),
            GateSpec::Gelu {
                tanh, fine, linear, ..
            } => match gelu_form(tanh, fine, linear) {
                GeluForm::Erf => "gelu",
                GeluForm::Tanh => "gelu tanh",
                GeluForm::TanhFine => "gelu tanh, fine",
                GeluForm::TanhLinear => "gelu tanh, degree 1",
            }
            .to_string(),
            GateSpec::Silu { linear: true, .. } => "silu, degree 1".to_string(),
            GateSpec::Nexp { linear: true, .. } => "nexp, degree 1".to_string(),
            other => gate_name(&other).to_string(),
        }
    }

    fn round_label(&self) -> String {
        match self.gate {
            GateSpec::Trunc { .. } => "trunc".to_string(),
            _ => self.key_label(),
        }
    }

    fn build(&self, cache: &mut BuiltCache, tensors: &[TensorInfo]) -> Result<Built, PlanError> {
        let gate = self.gate;
        let g = shared(&mut cache.gates, gate, || {
            gate.build()
                .map_err(refused(tensors, self.x, format!("{gate:?}")))
        })?;
        Ok(Built::Gate(g))
    }
}
