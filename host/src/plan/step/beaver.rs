//! Products of secret tensors with Beaver material: nothing to build.

use serde::Serialize;

use super::Interactive;

/// `batches` secret × secret products `[m×k]·[k×n]` with Beaver matrix
/// triples (step).
#[derive(Clone, Debug, Serialize)]
pub struct MatMul {
    /// `[batches·m × k]`.
    pub a: usize,
    /// `[batches·k × n]`, or `[batches·n × k]` when transposed.
    pub b: usize,
    /// Whether b is given transposed.
    pub transpose_b: bool,
    /// Independent products.
    pub batches: usize,
    /// Rows of each product.
    pub m: usize,
    /// Inner dimension.
    pub k: usize,
    /// Columns of each product.
    pub n: usize,
    /// `[batches·m × n]`.
    pub out: usize,
}

impl Interactive for MatMul {
    fn inputs(&self) -> Vec<usize> {
        vec![self.a, self.b]
    }

    fn output(&self) -> usize {
        self.out
    }

    fn key_label(&self) -> String {
        "matrix product".to_string()
    }
}

/// `out[r, c] = x[r, c]·v[r]`, both secret, Beaver (step).
#[derive(Clone, Debug, Serialize)]
pub struct MulRows {
    /// Input.
    pub x: usize,
    /// One factor per row.
    pub v: usize,
    /// Output.
    pub out: usize,
}

impl Interactive for MulRows {
    fn inputs(&self) -> Vec<usize> {
        vec![self.x, self.v]
    }

    fn output(&self) -> usize {
        self.out
    }

    fn key_label(&self) -> String {
        "row product".to_string()
    }
}

/// `out = a ⊙ b` elementwise, both secret, Beaver (step).
#[derive(Clone, Debug, Serialize)]
pub struct Mul {
    /// First factor.
    pub a: usize,
    /// Second factor, of the same shape.
    pub b: usize,
    /// Output.
    pub out: usize,
}

impl Interactive for Mul {
    fn inputs(&self) -> Vec<usize> {
        vec![self.a, self.b]
    }

    fn output(&self) -> usize {
        self.out
    }

    fn key_label(&self) -> String {
        "product".to_string()
    }
}

/// `out = x²` elementwise, Beaver squares (step).
#[derive(Clone, Debug, Serialize)]
pub struct Square {
    /// Input.
    pub x: usize,
    /// Output.
    pub out: usize,
}

impl Interactive for Square {
    fn inputs(&self) -> Vec<usize> {
        vec![self.x]
    }

    fn output(&self) -> usize {
        self.out
    }

    fn key_label(&self) -> String {
        "square".to_string()
    }
}
