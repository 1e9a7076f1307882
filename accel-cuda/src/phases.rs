//! Where a [`CudaEval`](crate::CudaEval)'s time goes: host packing, copies
//! each way, kernels, wipes, staging and waiting for the state's lock, summed
//! over every call since the evaluator was made.
//!
//! [`Timed`] wraps the launcher, so that every copy and launch is counted
//! whatever method issued it; a launch is followed by a synchronisation, so
//! that its time is the kernel's and not the next download's (a download
//! waits for the kernels before it anyway). The host's own phases (packing
//! keys level-major, unpacking generated keys, zeroing the staging) are
//! counted where they happen. Reports carry the totals
//! ([`BatchEval::device_phases`](suffuse_core::batch::BatchEval::device_phases)).

// `launch` forwards an unsafe call; its contract is the caller's.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::CudaError;
use crate::launcher::{Arg, Dims, Kernel, Launcher};

/// One phase of a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The host lays keys and inputs out for the kernels.
    Pack,
    /// Host to device copies of a call's inputs.
    Upload,
    /// Kernels, from the launch to the device's completion.
    Kernel,
    /// Device to host copies of a call's outputs, with faulting in the
    /// pages they land in where the host does that first.
    Download,
    /// The host turns the kernels' outputs into core's layout.
    Unpack,
    /// Zeroing device buffers and the host staging after use.
    Wipe,
    /// Key sections copied ahead of use (the caller's share of it: filling
    /// pinned memory and queueing the copies).
    Stage,
    /// Waiting for another call to release the evaluator's state.
    LockWait,
}

impl Phase {
    /// Every phase, in report order.
    pub const ALL: [Phase; 8] = [
        Phase::Pack,
        Phase::Upload,
        Phase::Kernel,
        Phase::Download,
        Phase::Unpack,
        Phase::Wipe,
        Phase::Stage,
        Phase::LockWait,
    ];

    /// The phase's name in reports.
    pub const fn name(self) -> &'static str {
        match self {
            Phase::Pack => "pack",
            Phase::Upload => "upload",
            Phase::Kernel => "kernel",
            Phase::Download => "download",
            Phase::Unpack => "unpack",
            Phase::Wipe => "wipe",
            Phase::Stage => "stage",
            Phase::LockWait => "lock_wait",
        }
    }
}

/// Nanoseconds per phase, summed.
#[derive(Debug, Default)]
pub struct Phases([AtomicU64; Phase::ALL.len()]);

impl Phases {
    /// Adds the time since `start` to `phase`.
    pub fn add(&self, phase: Phase, start: Instant) {
        let nanos = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.0[phase as usize].fetch_add(nanos, Ordering::Relaxed);
    }

    /// Runs `f`, counting its time to `phase`.
    pub fn time<R>(&self, phase: Phase, f: impl FnOnce() -> R) -> R {
        let start = Instant::now();
        let r = f();
        self.add(phase, start);
        r
    }

    /// Seconds per phase so far, in [`Phase::ALL`]'s order.
    pub fn seconds(&self) -> Vec<(&'static str, f64)> {
        Phase::ALL
            .iter()
            .map(|p| {
                #[allow(clippy::cast_precision_loss)]
                let s = self.0[*p as usize].load(Ordering::Relaxed) as f64 * 1e-9;
                (p.name(), s)
            })
            .collect()
    }
}

/// A launcher whose copies and launches are counted in [`Phases`].
#[derive(Debug)]
pub struct Timed<L> {
    pub(crate) inner: L,
    pub(crate) phases: Phases,
}

impl<L> Timed<L> {
    pub(crate) fn new(inner: L) -> Timed<L> {
        Timed {
            inner,
            phases: Phases::default(),
        }
    }
}

impl<L: Launcher> Launcher for Timed<L> {
    type Buffer = L::Buffer;

    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn device_name(&self) -> &str {
        self.inner.device_name()
    }

    fn threads_per_block(&self) -> u32 {
        self.inner.threads_per_block()
    }

    fn max_blocks(&self) -> u32 {
        self.inner.max_blocks()
    }

    fn alloc(&self, words: usize) -> Result<L::Buffer, CudaError> {
        self.inner.alloc(words)
    }

    fn upload(&self, dst: &mut L::Buffer, src: &[u64]) -> Result<(), CudaError> {
        self.phases
            .time(Phase::Upload, || self.inner.upload(dst, src))
    }

    fn download(&self, src: &L::Buffer, dst: &mut [u64]) -> Result<(), CudaError> {
        self.phases
            .time(Phase::Download, || self.inner.download(src, dst))
    }

    fn download_bytes(&self, src: &L::Buffer, dst: &mut [u8]) -> Result<(), CudaError> {
        self.phases
            .time(Phase::Download, || self.inner.download_bytes(src, dst))
    }

    fn stage_bytes(&self, dst: &mut L::Buffer, bytes: &[u8]) -> Result<(), CudaError> {
        self.phases
            .time(Phase::Stage, || self.inner.stage_bytes(dst, bytes))
    }

    fn wipe(&self, buf: &mut L::Buffer, words: usize) -> Result<(), CudaError> {
        self.phases
            .time(Phase::Wipe, || self.inner.wipe(buf, words))
    }

    fn synchronize(&self) -> Result<(), CudaError> {
        self.phases.time(Phase::Kernel, || self.inner.synchronize())
    }

    fn address(&self, buf: &L::Buffer) -> u64 {
        self.inner.address(buf)
    }

    fn host_phase(&self, phase: Phase, start: Instant) {
        self.phases.add(phase, start);
    }

    unsafe fn launch(&self, kernel: Kernel, dims: Dims, args: &[Arg]) -> Result<(), CudaError> {
        let start = Instant::now();
        // SAFETY: the caller's contract is the inner launcher's.
        let launched = unsafe { self.inner.launch(kernel, dims, args) };
        let r = launched.and_then(|()| self.inner.synchronize());
        self.phases.add(Phase::Kernel, start);
        r
    }
}
