//! The one place where a concrete accelerator is named. `--backend` resolves
//! here to the [`BatchEval`] that every other module holds as `&dyn`: the
//! dealer, the parties, the matrix products and the cleartext reference.
//!
//! * `cpu`: [`CpuEval`], every core, the fastest AES path of this CPU.
//! * `cuda`: [`CudaEval`] on device 0, its kernels from NVRTC (or the
//!   checked-in PTX), under the device-memory budget `--device-memory` sets
//!   (80 % of the free memory by default). It must pass its start-up
//!   self-test against core's reference; otherwise the choice fails with the
//!   reason.
//! * `auto`: `cuda` when a device opens and passes the self-test, else
//!   `cpu`, with the reason recorded.
//!
//! The first resolution in a process prints one line on stderr saying which
//! backend runs, and why CUDA does not when it was passed over. The CUDA
//! emulator (the kernels compiled for the CPU) is a test vehicle and cannot
//! be chosen here.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use suffuse_accel_cpu::CpuEval;
use suffuse_accel_cuda::{Code, CudaEval};
use suffuse_core::batch::BatchEval;

/// Which backend runs the heavy operations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Choice {
    /// CUDA when a device opens and passes its self-test, else the CPU.
    #[default]
    Auto,
    /// The multi-core CPU backend, with the fastest AES path this CPU has
    /// (VAES-512, VAES-256, AES-NI or software).
    Cpu,
    /// The CUDA backend on device 0; an error if no device passes the
    /// self-test.
    Cuda,
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

/// The device-memory budget in bytes; 0 means the default.
static DEVICE_MEMORY: AtomicUsize = AtomicUsize::new(0);

/// Sets the CUDA backend's device-memory budget (`--device-memory`). Takes
/// effect only before the CUDA backend is first resolved in this process.
pub fn set_device_memory(bytes: usize) {
    DEVICE_MEMORY.store(bytes, Ordering::Relaxed);
}

/// The backend for `choice`. Detection runs once per process; later calls
/// return the same evaluator. The first call prints which backend runs.
pub fn resolve(choice: Choice) -> Result<&'static dyn BatchEval, BackendError> {
    let fss: &'static dyn BatchEval = match choice {
        Choice::Cpu => cpu(),
        Choice::Cuda => cuda().map_err(|why| BackendError::Unavailable {
            name: "cuda",
            why: why.clone(),
        })?,
        Choice::Auto => auto(),
    };
    announce(choice, fss);
    Ok(fss)
}

/// The backend `auto` resolves to, without the announcement: for library
/// users and tests that take the default.
pub fn auto() -> &'static dyn BatchEval {
    match cuda() {
        Ok(c) => c,
        Err(_) => cpu(),
    }
}

/// One line on stderr, once per process: which backend, and for `auto` on
/// the CPU, why not CUDA.
fn announce(choice: Choice, fss: &dyn BatchEval) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if SAID.swap(true, Ordering::Relaxed) {
        return;
    }
    let line = match (fss.device(), cuda()) {
        (Some(device), Ok(c)) => format!(
            "backend: cuda on {device} (kernels: {}; device-memory budget {} MiB)",
            c.code(),
            c.memory_budget() >> 20
        ),
        (_, Err(why)) if choice == Choice::Auto => {
            format!("backend: cpu ({}); cuda not used: {why}", fss.aes_path())
        }
        _ => format!("backend: {} ({})", fss.name(), fss.aes_path()),
    };
    eprintln!("{line}");
}

fn cpu() -> &'static CpuEval {
    static CPU: OnceLock<CpuEval> = OnceLock::new();
    CPU.get_or_init(CpuEval::new)
}

/// The CUDA backend, opened and self-tested once per process.
fn cuda() -> Result<&'static CudaEval, &'static String> {
    static CUDA: OnceLock<Result<CudaEval, String>> = OnceLock::new();
    CUDA.get_or_init(|| {
        let budget = match DEVICE_MEMORY.load(Ordering::Relaxed) {
            0 => None,
            b => Some(b),
        };
        let eval = CudaEval::open(0, Code::Auto, budget).map_err(|e| e.to_string())?;
        eval.self_test().map_err(|e| e.to_string())?;
        Ok(eval)
    })
    .as_ref()
}
