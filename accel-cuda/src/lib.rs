//! # suffuse-accel-cuda
//!
//! The CUDA side of suffuse's accelerator boundary.
//!
//! What this crate does today:
//!
//! * [`CudaEval::new`] looks for the CUDA driver library at run time
//!   (`cudarc` with dynamic loading, so nothing CUDA is needed to build),
//!   opens the primary context of device 0 and records the device name. When
//!   there is no driver or no device it returns a [`CudaError`] that says so
//!   and points at the CPU evaluator.
//! * [`CudaEval`] implements [`BatchEval`], so hosts can already select it and
//!   fall back cleanly. This release ships no evaluation kernels, so
//!   [`BatchEval::eval`] and [`BatchEval::eval_full_domain`] return
//!   [`Error::Unsupported`] on every machine, GPU or not, and hosts use
//!   `suffuse-accel-cpu` instead.
//!
//! The kernels (CUDA C under `kernels/`, compiled at run time with NVRTC,
//! with checked-in PTX as a fallback) arrive in a later issue; see
//! `kernels/README.md`. Once they exist they must match
//! [`suffuse_core::batch::Serial`] bit for bit on the shared conformance
//! harness, and nothing GPU-related is claimed before it has run on a GPU.

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod driver;

use std::sync::Arc;

use cudarc::driver::{CudaContext, DriverError};
use suffuse_core::Error;
use suffuse_core::batch::{BatchEval, EvalStats, MatShape};
use suffuse_core::fss::{GenBatch, KeyBatch};
use suffuse_core::prg::{Block, Domain, FixedKeyAes, Hasher};

pub use driver::driver_library_present;

/// Why no CUDA evaluator could be created.
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
}

/// A CUDA device opened for batch evaluation.
///
/// See the crate documentation for what it evaluates today.
pub struct CudaEval {
    context: Arc<CudaContext>,
    device_name: String,
    /// Seed expansion runs on the host until the kernels exist.
    aes: FixedKeyAes,
}

impl core::fmt::Debug for CudaEval {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CudaEval")
            .field("ordinal", &self.context.ordinal())
            .field("device_name", &self.device_name)
            .finish_non_exhaustive()
    }
}

impl CudaEval {
    /// Opens device 0.
    pub fn new() -> Result<CudaEval, CudaError> {
        CudaEval::on_device(0)
    }

    /// Opens device `ordinal`: checks that the driver library loads, that the
    /// device exists, and creates (retains) its primary context.
    pub fn on_device(ordinal: usize) -> Result<CudaEval, CudaError> {
        // cudarc panics when a driver symbol is used without the library, so
        // the probe must come first.
        if !driver_library_present() {
            return Err(CudaError::DriverNotFound);
        }
        let available = match CudaContext::device_count() {
            Ok(n) => usize::try_from(n).unwrap_or(0),
            // cuInit reports a machine without GPUs as an error, not as zero.
            Err(DriverError(cudarc::driver::sys::CUresult::CUDA_ERROR_NO_DEVICE)) => 0,
            Err(source) => {
                return Err(CudaError::Driver {
                    call: "cuInit/cuDeviceGetCount",
                    source,
                });
            }
        };
        if ordinal >= available {
            return Err(CudaError::NoDevice { ordinal, available });
        }
        let context = CudaContext::new(ordinal).map_err(|source| CudaError::Driver {
            call: "cuDevicePrimaryCtxRetain",
            source,
        })?;
        let device_name = context.name().map_err(|source| CudaError::Driver {
            call: "cuDeviceGetName",
            source,
        })?;
        Ok(CudaEval {
            context,
            device_name,
            aes: FixedKeyAes::new(),
        })
    }

    /// The device's name as the driver reports it.
    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.context.ordinal()
    }
}

/// Seed expansion on the host CPU (the `aes` crate) until the kernels exist.
impl Hasher for CudaEval {
    fn hash_many(&self, d: Domain, blocks: &mut [Block]) -> u64 {
        self.aes.hash_many(d, blocks)
    }
}

impl BatchEval for CudaEval {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn aes_path(&self) -> &'static str {
        "aes-crate (host)"
    }

    /// A GPU wants millions of elements per launch.
    fn preferred_batch(&self) -> usize {
        1 << 22
    }

    /// Returns [`Error::Unsupported`]: this release has no evaluation kernels
    /// (they arrive in a later issue). Use `suffuse-accel-cpu` meanwhile.
    fn eval(
        &self,
        _keys: &KeyBatch<'_>,
        _points: &[u64],
        _out: &mut [u64],
    ) -> Result<EvalStats, Error> {
        Err(Error::Unsupported)
    }

    /// Returns [`Error::Unsupported`], as [`CudaEval::eval`] does.
    fn eval_full_domain(&self, _keys: &KeyBatch<'_>, _out: &mut [u64]) -> Result<EvalStats, Error> {
        Err(Error::Unsupported)
    }

    /// Returns [`Error::Unsupported`], as [`CudaEval::eval`] does.
    fn generate(
        &self,
        _batch: &GenBatch<'_>,
        _key0: &mut [u8],
        _key1: &mut [u8],
    ) -> Result<EvalStats, Error> {
        Err(Error::Unsupported)
    }

    /// Returns [`Error::Unsupported`], as [`CudaEval::eval`] does.
    fn matmul(
        &self,
        _shape: &MatShape,
        _a: &[u64],
        _b: &[u64],
        _c: &mut [u64],
    ) -> Result<(), Error> {
        Err(Error::Unsupported)
    }
}
