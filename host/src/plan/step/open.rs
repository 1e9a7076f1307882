//! A tensor opened once under a fresh mask, for every later product that
//! reads it.

use serde::Serialize;

use super::Interactive;

/// `x` opened under a fresh dealt mask, once, for every later product
/// that reads it (step): `out` is paired, holding `E = x − A` and the
/// party's share of `A` ([`crate::plan::TensorInfo::paired`]). Layout
/// operations carry the pair along, and a [`super::MatMul`] reading it
/// opens nothing for that operand: a decoder's KV cache keeps the masks
/// its rows were opened under across passes.
#[derive(Clone, Debug, Serialize)]
pub struct Open {
    /// Input.
    pub x: usize,
    /// The paired output.
    pub out: usize,
}

impl Interactive for Open {
    fn inputs(&self) -> Vec<usize> {
        vec![self.x]
    }

    fn output(&self) -> usize {
        self.out
    }

    fn key_label(&self) -> String {
        "opening".to_string()
    }
}
