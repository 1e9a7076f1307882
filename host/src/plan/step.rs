//! The plan's interactive steps, one module per kind: each defines the
//! step's fields (what [`super::Kind`] holds and the plan hash covers)
//! and what the planner, the dealer and the report ask of it, in
//! [`Interactive`]: the tensors it reads and writes, its labels in the
//! report and the core object it runs. Running it is the same-named
//! module of `proto`. A new fused step is a module here, a module there,
//! and one variant of `Kind`.

mod beaver;
mod centre_square;
mod chain;
mod gate;
mod max;
mod open;
mod trunc_square;

pub use beaver::{MatMul, Mul, MulRows, Square};
pub use centre_square::CentreSquare;
pub use chain::Chain;
pub use gate::Gate;
pub use max::Max;
pub use open::Open;
pub use trunc_square::TruncSquare;

use super::{Built, BuiltCache, Kind, PlanError, TensorInfo};
use suffuse_core::ring::Width;

/// What every interactive step tells the planner, the dealer and the
/// report.
pub trait Interactive {
    /// Tensors read.
    fn inputs(&self) -> Vec<usize>;

    /// The tensor written ([`Kind::output`]).
    fn output(&self) -> usize;

    /// Tensors written: [`Interactive::output`], then any others (a
    /// square, a row's sums).
    fn outputs(&self) -> Vec<usize> {
        vec![self.output()]
    }

    /// What its key section is for, in the report's key bytes per gate:
    /// the gate and, for a truncation, the bits it drops.
    fn key_label(&self) -> String;

    /// What kind of step it is in the report's rounds per kind of step:
    /// the key label, without a truncation's shift (its rounds do not
    /// depend on it).
    fn round_label(&self) -> String {
        self.key_label()
    }

    /// The core object it runs, built on first use and shared through
    /// `cache` by every step of the same spec; a Beaver step has none.
    fn build(&self, _cache: &mut BuiltCache, _tensors: &[TensorInfo]) -> Result<Built, PlanError> {
        Ok(Built::Beaver)
    }
}

/// Each step is the [`Kind`] of its name: `Kind::step` answers with it
/// (a local operation, any other kind, with `None`), and
/// `Builder::push` takes it as that kind.
macro_rules! kinds {
    ($($step:ident),*) => {
        impl Kind {
            /// The interactive step this is, or `None` for a local operation.
            pub fn step(&self) -> Option<&dyn Interactive> {
                match self {
                    $(Kind::$step(s) => Some(s),)*
                    _ => None,
                }
            }
        }
        $(impl From<$step> for Kind {
            fn from(s: $step) -> Kind {
                Kind::$step(s)
            }
        })*
    };
}
kinds!(
    Gate,
    Chain,
    Max,
    MatMul,
    MulRows,
    Open,
    TruncSquare,
    CentreSquare,
    Square,
    Mul
);

/// The effective width `k` as core's [`Width`].
fn width(k: u32) -> Result<Width, PlanError> {
    Width::new(k).map_err(|_| PlanError::Width { k })
}

/// The error of a core object that refused to build for the step reading
/// `tensor`.
fn refused(
    tensors: &[TensorInfo],
    x: usize,
    spec: String,
) -> impl FnOnce(suffuse_core::SufError) -> PlanError + '_ {
    move |error| PlanError::Gate {
        tensor: tensors[x].name.clone(),
        spec,
        error,
    }
}
