//! # suffuse-accel-cuda
//!
//! [`CudaEval`] implements [`BatchEval`](suffuse_core::batch::BatchEval), core's accelerator boundary, with
//! CUDA kernels: DCF/DPF evaluation at public points and over whole
//! domains, seed expansion, key generation and ring matrix products. The
//! kernels are CUDA C under `kernels/`, with no CUDA headers, one thread per
//! evaluation, keys transposed level-major by the host ([`layout`]), and a
//! T-table fixed-key AES that computes core's hash bit for bit.
//!
//! `CudaEval` is generic over a [`Launcher`], the one place kernels run:
//!
//! * [`Device`]: a GPU through `cudarc` with dynamic loading, so a binary
//!   built without CUDA runs on a GPU machine. NVRTC compiles the kernels
//!   at run time for the device's architecture (cached on disk per source
//!   hash, architecture and NVRTC version); the checked-in PTX is the
//!   fallback where NVRTC is missing.
//! * `Emulator` (feature `emulator`): the same `.cu` files compiled as C++
//!   by g++ and run on the CPU, every thread of a block an OS thread. It is
//!   how the kernels are proven bit-exact on machines without a GPU; it
//!   reports itself as `cuda-emu` and is never a user's backend.
//!
//! Everything above the launcher (key layouts, batching, the device-memory
//! budget) is the same code on both. Results must equal
//! [`suffuse_core::batch::Serial`] bit for bit on the conformance harness,
//! and nothing GPU-related is claimed before it has run on a GPU
//! (`docs/BACKENDS.md`).

#![deny(unsafe_code)]
#![warn(missing_docs)]

// Device words reach host bytes by plain copies (`Launcher::download_bytes`),
// which equal `u64::to_le_bytes` only on little-endian hosts.
#[cfg(not(target_endian = "little"))]
compile_error!("suffuse-accel-cuda needs a little-endian host");

mod device;
mod driver;
#[cfg(feature = "emulator")]
mod emulator;
mod eval;
mod gather;
pub mod launcher;
pub mod layout;
mod measure;
pub mod nvrtc;
mod par;
mod phases;
mod pool;
mod resident;
mod selftest;
pub mod source;
mod staged;
mod turned;

use std::sync::Mutex;

use cudarc::driver::DriverError;
use suffuse_core::prg::FixedKeyAes;

pub use device::{Code, CodeSource, Device};
pub use driver::driver_library_present;
#[cfg(feature = "emulator")]
pub use emulator::{EmuBuffer, Emulator};
pub use launcher::Launcher;
pub use measure::ResidentTiming;
pub use phases::Phase;

use phases::Timed;
use pool::Pool;

/// Why the CUDA evaluator could not be created or could not run a call.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// The CUDA driver library could not be loaded.
    #[error(
        "no CUDA driver: the NVIDIA driver library (libcuda.so) could not be loaded; \
         install the NVIDIA driver, or evaluate on the CPU with suffuse-accel-cpu's CpuEval"
    )]
    DriverNotFound,
    /// The driver loaded but reports no device with this ordinal.
    #[error(
        "no CUDA device {ordinal}: the driver reports {available} device(s); \
         evaluate on the CPU with suffuse-accel-cpu's CpuEval"
    )]
    NoDevice {
        /// The device ordinal that was asked for.
        ordinal: usize,
        /// How many devices the driver reports.
        available: usize,
    },
    /// A driver call failed.
    #[error("CUDA driver call {call} failed: {source}")]
    Driver {
        /// The operation that failed.
        call: &'static str,
        /// The driver's error code.
        #[source]
        source: DriverError,
    },
    /// NVRTC was asked for but its library could not be loaded.
    #[error(
        "no NVRTC: libnvrtc could not be loaded (put the folder holding libnvrtc.so on \
         LD_LIBRARY_PATH), so the kernels cannot be compiled at run time"
    )]
    NvrtcNotFound,
    /// NVRTC failed to compile the kernels.
    #[error("NVRTC failed: {0}")]
    Nvrtc(String),
    /// A launch or copy was refused before it ran.
    #[error("CUDA launch refused: {0}")]
    Launch(&'static str),
    /// A call needs more device memory than the budget leaves.
    #[error(
        "a CUDA call needs {needed} bytes of device memory with {held} held, over the budget of \
         {budget} bytes; raise the budget (--device-memory) or use smaller batches"
    )]
    OverBudget {
        /// Bytes the allocation needed.
        needed: usize,
        /// Bytes already held.
        held: usize,
        /// The budget.
        budget: usize,
    },
    /// The start-up self-test disagreed with core's reference.
    #[error("the CUDA self-test failed: {0}")]
    SelfTest(String),
}

/// Device memory a [`CudaEval`] may hold when the user sets no budget: this
/// share of what the device has free when it is opened.
pub const DEFAULT_BUDGET_SHARE: f64 = 0.8;

/// Device memory the emulator may hold when the user sets no budget.
pub const EMULATOR_BUDGET: usize = 256 << 20;

/// Blocks at or above which [`CudaEval`]'s seed expansion runs on the
/// device; fewer run on the host's AES, on the caller's thread. None do by
/// default: a device hash copies 16 bytes per block each way through
/// pageable memory under the evaluator's lock, and on the H200 machine
/// (16 cores with AES-NI) the host was faster. With the device hashing
/// from 2^14 blocks up, BERT-base-128's dealer waited 42.6 s for the lock
/// (summed over its threads) in a 10.9 s deal; hashing on the host, 6.0 s
/// in an 8.6 s one (docs/BACKENDS.md, thirty-fourth session). The
/// conformance harness lowers the threshold to 0
/// ([`CudaEval::with_device_hash_min`]) so that the kernel stays tested.
pub const DEVICE_HASH_MIN: usize = usize::MAX;

/// The CUDA batch evaluator over a [`Launcher`].
pub struct CudaEval<L: Launcher = Device> {
    /// The launcher, its copies and launches timed.
    launcher: Timed<L>,
    state: Mutex<State<Timed<L>>>,
    /// Small seed expansions run here (see [`DEVICE_HASH_MIN`]).
    host: FixedKeyAes,
    device_hash_min: usize,
    /// The last device failure, for reports: `BatchEval` returns core's
    /// error codes, which cannot carry it.
    last_failure: Mutex<Option<String>>,
}

/// What the calls share, behind one lock: device calls are serialised.
struct State<L: Launcher> {
    pool: Pool<L>,
    /// The four domains' AES keys, uploaded once.
    aes: Option<L::Buffer>,
    /// Host staging for transposed keys and inputs.
    staging: Vec<u64>,
    /// Public operands kept on the device
    /// ([`suffuse_core::batch::BatchEval::matmul_resident`]).
    resident: Vec<resident::Entry<L>>,
    /// A clock for evicting the least recently used resident operand.
    tick: u64,
    /// Key sections copied ahead of use
    /// ([`suffuse_core::batch::BatchEval::stage`]).
    staged: Vec<staged::Section<L>>,
}

impl<L: Launcher> core::fmt::Debug for CudaEval<L> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CudaEval")
            .field("launcher", &self.launcher.kind())
            .field("device", &self.launcher.device_name())
            .finish_non_exhaustive()
    }
}

impl CudaEval<Device> {
    /// Opens device 0 with its kernels from NVRTC, or the checked-in PTX
    /// where NVRTC is missing, and the default memory budget.
    pub fn new() -> Result<CudaEval<Device>, CudaError> {
        CudaEval::open(0, Code::Auto, None)
    }

    /// Opens device `ordinal` with kernels from `code` and `budget` bytes of
    /// device memory at most ([`DEFAULT_BUDGET_SHARE`] of the free memory
    /// when `None`).
    pub fn open(
        ordinal: usize,
        code: Code,
        budget: Option<usize>,
    ) -> Result<CudaEval<Device>, CudaError> {
        let device = Device::open(ordinal, code)?;
        let budget = match budget {
            Some(b) => b,
            None => {
                let (free, _) = device.memory_info()?;
                // Truncation is the intent: a share of the free bytes.
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let share = (free as f64 * DEFAULT_BUDGET_SHARE) as usize;
                share
            }
        };
        Ok(CudaEval::with_launcher(device, budget))
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.launcher.inner.ordinal()
    }

    /// How the kernels were made (NVRTC or the checked-in PTX).
    pub fn code(&self) -> &CodeSource {
        self.launcher.inner.code()
    }
}

#[cfg(feature = "emulator")]
impl CudaEval<Emulator> {
    /// The kernels on the CPU emulator, with [`EMULATOR_BUDGET`] and the
    /// device's threshold for seed expansion; for tests. The conformance
    /// harness lowers the threshold to 0 so that every hash runs the kernel.
    pub fn emulated() -> CudaEval<Emulator> {
        CudaEval::with_launcher(Emulator::new(), EMULATOR_BUDGET)
    }
}

impl<L: Launcher> CudaEval<L> {
    /// An evaluator on `launcher` that holds at most `budget` bytes of its
    /// memory.
    pub fn with_launcher(launcher: L, budget: usize) -> CudaEval<L> {
        CudaEval {
            launcher: Timed::new(launcher),
            state: Mutex::new(State {
                pool: Pool::new(budget),
                aes: None,
                staging: Vec::new(),
                resident: Vec::new(),
                tick: 0,
                staged: Vec::new(),
            }),
            host: FixedKeyAes::new(),
            device_hash_min: DEVICE_HASH_MIN,
            last_failure: Mutex::new(None),
        }
    }

    /// Runs seed expansions of at least `blocks` blocks on the device (0:
    /// all of them, as the conformance tests do).
    pub fn with_device_hash_min(mut self, blocks: usize) -> CudaEval<L> {
        self.device_hash_min = blocks;
        self
    }

    /// The launcher.
    pub fn launcher(&self) -> &L {
        &self.launcher.inner
    }

    /// Seconds spent in each [`Phase`] since the evaluator was made.
    pub fn phase_seconds(&self) -> Vec<(&'static str, f64)> {
        self.launcher.phases.seconds()
    }

    /// The device's name as the driver (or the emulator) reports it.
    pub fn device_name(&self) -> &str {
        self.launcher.device_name()
    }

    /// The device-memory budget in bytes.
    pub fn memory_budget(&self) -> usize {
        self.lock().pool.budget()
    }

    /// The most device memory this evaluator has held at once, in bytes.
    pub fn peak_memory(&self) -> usize {
        self.lock().pool.peak()
    }

    /// The last device failure, if a call failed on the device.
    pub fn last_failure(&self) -> Option<String> {
        self.last_failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<Timed<L>>> {
        let start = std::time::Instant::now();
        // A panic in another call leaves no half-updated state that matters:
        // buffers are reallocated and re-uploaded as needed.
        let guard = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.launcher.phases.add(Phase::LockWait, start);
        guard
    }
}
