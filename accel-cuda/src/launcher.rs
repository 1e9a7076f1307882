//! The launcher: the one boundary between [`CudaEval`](crate::CudaEval) and
//! the thing that runs kernels.
//!
//! Everything above it is the same code on a GPU and on the CPU emulator:
//! key layouts, batching, the memory budget. Below it, [`Device`] drives a
//! GPU through `cudarc`, and `Emulator` (feature `emulator`) runs the same
//! `.cu` sources compiled as C++.
//!
//! [`Device`]: crate::Device

// The launch is an unsafe method: kernels index raw device memory.
#![allow(unsafe_code)]

use crate::CudaError;
use crate::phases::Phase;

/// The kernels of `kernels/*.cu`, by their `extern "C"` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// DCF/DPF evaluation at public points.
    FssEval,
    /// One level of a full-domain DPF expansion.
    DpfLevel,
    /// The leaves of a full-domain DPF expansion.
    DpfLeaves,
    /// Seed expansion: the fixed-key hash of many blocks.
    Hash,
    /// Key-pair generation.
    FssGen,
    /// Ring matrix products mod 2^64.
    Matmul,
    /// Ring matrix products with RoPE folded into the weights row by row.
    TurnedMatmul,
    /// Key bodies in device memory, transposed level-major.
    GatherKeys,
}

impl Kernel {
    /// Every kernel, in source order.
    pub const ALL: [Kernel; 8] = [
        Kernel::FssEval,
        Kernel::DpfLevel,
        Kernel::DpfLeaves,
        Kernel::Hash,
        Kernel::FssGen,
        Kernel::Matmul,
        Kernel::TurnedMatmul,
        Kernel::GatherKeys,
    ];

    /// The kernel's `extern "C"` name.
    pub const fn name(self) -> &'static str {
        match self {
            Kernel::FssEval => "suffuse_fss_eval",
            Kernel::DpfLevel => "suffuse_dpf_level",
            Kernel::DpfLeaves => "suffuse_dpf_leaves",
            Kernel::Hash => "suffuse_hash",
            Kernel::FssGen => "suffuse_fss_gen",
            Kernel::Matmul => "suffuse_matmul",
            Kernel::TurnedMatmul => "suffuse_turned_matmul",
            Kernel::GatherKeys => "suffuse_gather_keys",
        }
    }
}

/// A launch's grid, block and dynamic shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    /// Blocks in x, y and z.
    pub grid: [u32; 3],
    /// Threads per block in x, y and z.
    pub block: [u32; 3],
    /// Dynamic shared memory per block, in bytes.
    pub shared_bytes: u32,
}

/// One kernel argument, by value: a device address or an integer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    /// A device address (a pointer parameter).
    Ptr(u64),
    /// A 64-bit integer parameter.
    U64(u64),
    /// A 32-bit integer parameter.
    U32(u32),
}

/// Where kernels run: device memory of 64-bit words, copies, launches.
///
/// Calls on one launcher are ordered: a launch sees every earlier upload,
/// and a download sees every earlier launch.
pub trait Launcher: Send + Sync {
    /// A region of device memory holding `u64` words.
    type Buffer: Send;

    /// What reports call this launcher: `"cuda"` or `"cuda-emu"`.
    fn kind(&self) -> &'static str;

    /// The device's name.
    fn device_name(&self) -> &str;

    /// Threads per block of the one-dimensional kernels.
    fn threads_per_block(&self) -> u32;

    /// Blocks a one-dimensional launch needs at most to fill the device;
    /// kernels stride over larger batches.
    fn max_blocks(&self) -> u32;

    /// A buffer of `words` words (at least one), contents unspecified.
    fn alloc(&self, words: usize) -> Result<Self::Buffer, CudaError>;

    /// Copies `src` into the start of `dst`, which must be long enough.
    fn upload(&self, dst: &mut Self::Buffer, src: &[u64]) -> Result<(), CudaError>;

    /// Copies the start of `src` into `dst`, once every earlier launch has
    /// finished.
    fn download(&self, src: &Self::Buffer, dst: &mut [u64]) -> Result<(), CudaError>;

    /// Copies the first `dst.len()` bytes of `src`'s words, each word's
    /// bytes little-endian (the byte order of CUDA devices and of every host
    /// this crate runs on), once every earlier launch has finished.
    fn download_bytes(&self, src: &Self::Buffer, dst: &mut [u8]) -> Result<(), CudaError>;

    /// Copies `bytes` into the start of `dst` (which must hold them) ahead
    /// of use: on a device, asynchronously through pinned double buffers on
    /// a copy stream, so that the caller's thread returns once the bytes are
    /// in pinned memory and the copy overlaps the kernels; every launch
    /// issued after this call returns sees the bytes.
    fn stage_bytes(&self, dst: &mut Self::Buffer, bytes: &[u8]) -> Result<(), CudaError>;

    /// Overwrites the first `words` words of `buf` with zeros (key material
    /// is wiped before a buffer is reused or freed).
    fn wipe(&self, buf: &mut Self::Buffer, words: usize) -> Result<(), CudaError>;

    /// Waits until every earlier launch and copy has finished.
    fn synchronize(&self) -> Result<(), CudaError>;

    /// The device address of `buf`'s first word, for [`Arg::Ptr`].
    fn address(&self, buf: &Self::Buffer) -> u64;

    /// Counts host work of a call that began at `start` towards `phase`
    /// (a launcher that keeps [`Phase`] totals); by default nothing.
    fn host_phase(&self, phase: Phase, start: std::time::Instant) {
        let _ = (phase, start);
    }

    /// Launches `kernel` with `args`.
    ///
    /// # Safety
    ///
    /// `args` must match the kernel's parameter list in number and types,
    /// every [`Arg::Ptr`] must be the address of a live buffer of this
    /// launcher (or an offset into one), and every index the kernel derives
    /// from the integer arguments must stay inside the buffers it reads and
    /// writes.
    unsafe fn launch(&self, kernel: Kernel, dims: Dims, args: &[Arg]) -> Result<(), CudaError>;
}
