//! The one place where a concrete accelerator is named. `--backend` resolves
//! here to the [`BatchEval`] that every other module holds as `&dyn`: the
//! dealer, the parties, the matrix products and the cleartext reference.
//!
//! `auto` picks the fastest backend that evaluates on this machine. Today
//! that is the CPU: `suffuse-accel-cuda` opens a device but ships no kernels
//! yet. When it does, a `Cuda` choice goes here, and `auto` tries it first
//! and falls back to the CPU with the reason recorded.

use std::sync::OnceLock;

use suffuse_accel_cpu::CpuEval;
use suffuse_core::batch::BatchEval;

/// Which backend runs the heavy operations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Choice {
    /// The fastest backend available on this machine.
    #[default]
    Auto,
    /// The multi-core CPU backend, with the fastest AES path this CPU has
    /// (VAES-512, VAES-256, AES-NI or software).
    Cpu,
}

/// Why a backend cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The backend was asked for but cannot run here.
    #[error("backend {name} is not available: {why}")]
    Unavailable {
        /// The backend.
        name: &'static str,
        /// Why.
        why: String,
    },
}

/// The backend for `choice`. Detection runs once per process; later calls
/// return the same evaluator.
pub fn resolve(choice: Choice) -> Result<&'static dyn BatchEval, BackendError> {
    match choice {
        Choice::Auto | Choice::Cpu => Ok(cpu()),
    }
}

/// The backend `auto` resolves to: for library users and tests that take
/// the default.
pub fn auto() -> &'static dyn BatchEval {
    cpu()
}

fn cpu() -> &'static CpuEval {
    static CPU: OnceLock<CpuEval> = OnceLock::new();
    CPU.get_or_init(CpuEval::new)
}
