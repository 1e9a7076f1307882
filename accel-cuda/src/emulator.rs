//! The CPU emulator: the kernels of `kernels/*.cu` compiled by g++ with a
//! stand-in header (`emu/emu.h`) and launched here. It is a test vehicle: it
//! reports itself as `cuda-emu`, it is never a user's backend, and nothing
//! it shows is a claim about a GPU.
//!
//! Each thread of a block is an OS thread and `__syncthreads` is a real
//! barrier, so missing barriers and indexing errors surface; shared memory
//! is poisoned before every block, so a read before a write returns
//! garbage, as it may on a GPU. Warps, the memory model and speed are not
//! modelled.

// The emulator is C++ behind an FFI, and its buffers are raw allocations
// that kernels write through addresses; each unsafe block says why it holds.
#![allow(unsafe_code)]

use std::ffi::{CString, c_char, c_int, c_uint, c_void};

use crate::CudaError;
use crate::launcher::{Arg, Dims, Kernel, Launcher};

unsafe extern "C" {
    fn suffuse_emu_launch(
        name: *const c_char,
        gx: c_uint,
        gy: c_uint,
        gz: c_uint,
        bx: c_uint,
        by: c_uint,
        bz: c_uint,
        shared_bytes: c_uint,
        params: *mut *mut c_void,
    ) -> c_int;
}

/// Threads per block of the emulator's one-dimensional launches: small, so
/// that a launch's OS threads start quickly, and not a power of the
/// kernels' loop strides, so that grid-stride loops are exercised.
const THREADS: u32 = 48;

/// Blocks of a one-dimensional launch: several, so that a kernel's
/// cross-block indexing is exercised, few, because blocks run one after
/// another.
const BLOCKS: u32 = 3;

/// The signature of `suffuse_emu_launch`.
type LaunchFn = unsafe extern "C" fn(
    *const c_char,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    *mut *mut c_void,
) -> c_int;

/// The environment variable naming an emulator library to load instead of
/// the one linked in: how `cargo xtask cuda-tsan` runs the kernels built
/// with ThreadSanitizer (and with its planted fault) under this same test
/// binary.
pub const LIBRARY_VAR: &str = "SUFFUSE_EMU_LIBRARY";

/// The CPU emulator of the CUDA kernels.
pub struct Emulator {
    launch: LaunchFn,
    /// The library `launch` lives in, when it was loaded at run time.
    _library: Option<libloading::Library>,
    origin: String,
}

impl core::fmt::Debug for Emulator {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Emulator")
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl Default for Emulator {
    fn default() -> Self {
        Emulator {
            launch: suffuse_emu_launch,
            _library: None,
            origin: "linked".into(),
        }
    }
}

impl Emulator {
    /// The emulator linked into this binary, or the library that
    /// `LIBRARY_VAR` names.
    ///
    /// # Panics
    ///
    /// If `LIBRARY_VAR` is set and the library cannot be loaded: a test
    /// that asked for an instrumented emulator must not silently run
    /// another.
    pub fn new() -> Emulator {
        match std::env::var_os(LIBRARY_VAR) {
            None => Emulator::default(),
            Some(path) => match Emulator::load(std::path::Path::new(&path)) {
                Ok(e) => e,
                Err(e) => panic!("{LIBRARY_VAR}={}: {e}", path.to_string_lossy()),
            },
        }
    }

    /// The emulator in the shared library at `path` (built from `emu/` by
    /// `cargo xtask cuda-tsan`).
    pub fn load(path: &std::path::Path) -> Result<Emulator, libloading::Error> {
        // SAFETY: loading runs the library's initialisers; the library is
        // the emulator built from this crate's own sources for tests.
        let library = unsafe { libloading::Library::new(path) }?;
        // SAFETY: `suffuse_emu_launch` has the signature of `LaunchFn` in
        // every build of `emu/kernels.cpp`.
        let launch: LaunchFn = unsafe { *library.get::<LaunchFn>(b"suffuse_emu_launch\0")? };
        Ok(Emulator {
            launch,
            _library: Some(library),
            origin: path.display().to_string(),
        })
    }

    /// Where the kernels come from: `linked`, or the loaded library's path.
    pub fn origin(&self) -> &str {
        &self.origin
    }
}

/// Emulated device memory: a heap allocation addressed by raw pointer, so
/// that kernels may write it while the buffer is borrowed.
pub struct EmuBuffer {
    ptr: *mut u64,
    len: usize,
}

// SAFETY: the buffer owns its allocation; it is reached only through the
// launcher, whose calls the C++ side serialises.
unsafe impl Send for EmuBuffer {}

impl Drop for EmuBuffer {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `len` came from `Box::into_raw` of a boxed slice
        // of exactly `len` words in `alloc`, and are dropped once.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}

impl Launcher for Emulator {
    type Buffer = EmuBuffer;

    fn kind(&self) -> &'static str {
        "cuda-emu"
    }

    fn device_name(&self) -> &str {
        "CPU emulator (test vehicle, not a GPU)"
    }

    fn threads_per_block(&self) -> u32 {
        THREADS
    }

    fn max_blocks(&self) -> u32 {
        BLOCKS
    }

    fn alloc(&self, words: usize) -> Result<EmuBuffer, CudaError> {
        let len = words.max(1);
        let boxed = vec![0xDEAD_BEEF_A5A5_5A5Au64; len].into_boxed_slice();
        Ok(EmuBuffer {
            ptr: Box::into_raw(boxed).cast::<u64>(),
            len,
        })
    }

    fn upload(&self, dst: &mut EmuBuffer, src: &[u64]) -> Result<(), CudaError> {
        if src.len() > dst.len {
            return Err(CudaError::Launch("upload longer than its buffer"));
        }
        // SAFETY: `dst` owns `dst.len ≥ src.len()` words, and no launch runs
        // while the launcher is called (calls are ordered).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.ptr, src.len()) };
        Ok(())
    }

    fn download(&self, src: &EmuBuffer, dst: &mut [u64]) -> Result<(), CudaError> {
        if dst.len() > src.len {
            return Err(CudaError::Launch("download longer than its buffer"));
        }
        // SAFETY: `src` owns `src.len ≥ dst.len()` words; launches are
        // synchronous, so every write to them has finished.
        unsafe { std::ptr::copy_nonoverlapping(src.ptr, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn download_bytes(&self, src: &EmuBuffer, dst: &mut [u8]) -> Result<(), CudaError> {
        if dst.len() > src.len * 8 {
            return Err(CudaError::Launch("download longer than its buffer"));
        }
        // SAFETY: `src` owns `src.len · 8 ≥ dst.len()` bytes; launches are
        // synchronous. The words are in the host's order, little-endian on
        // every host the crate builds for (checked at compile time in
        // `lib.rs`).
        unsafe { std::ptr::copy_nonoverlapping(src.ptr.cast::<u8>(), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Synchronous here: the emulator has no copy engine to overlap.
    fn stage_bytes(&self, dst: &mut EmuBuffer, bytes: &[u8]) -> Result<(), CudaError> {
        if bytes.len() > dst.len * 8 {
            return Err(CudaError::Launch("staged bytes longer than their buffer"));
        }
        // SAFETY: `dst` owns `dst.len · 8 ≥ bytes.len()` bytes, and no launch
        // runs while the launcher is called.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst.ptr.cast::<u8>(), bytes.len()) };
        Ok(())
    }

    fn wipe(&self, buf: &mut EmuBuffer, words: usize) -> Result<(), CudaError> {
        // SAFETY: `buf` owns `buf.len` words, of which the first
        // `min(words, len)` are written; no launch is running.
        unsafe { std::ptr::write_bytes(buf.ptr, 0, words.min(buf.len)) };
        Ok(())
    }

    /// Launches are synchronous: nothing is ever outstanding.
    fn synchronize(&self) -> Result<(), CudaError> {
        Ok(())
    }

    fn address(&self, buf: &EmuBuffer) -> u64 {
        buf.ptr as u64
    }

    unsafe fn launch(&self, kernel: Kernel, dims: Dims, args: &[Arg]) -> Result<(), CudaError> {
        // The values the parameter pointers point at, as cuLaunchKernel
        // takes them: 8 bytes for pointers and u64, 4 for u32.
        let mut values: Vec<u64> = args
            .iter()
            .map(|a| match *a {
                Arg::Ptr(p) | Arg::U64(p) => p,
                Arg::U32(v) => u64::from(v),
            })
            .collect();
        // A u32 argument is read as the first 4 bytes of its slot, which on a
        // little-endian machine is the value itself.
        let mut params: Vec<*mut c_void> = values
            .iter_mut()
            .map(|v| std::ptr::from_mut(v).cast::<c_void>())
            .collect();
        let name = CString::new(kernel.name()).map_err(|_| CudaError::Launch("kernel name"))?;
        let [gx, gy, gz] = dims.grid;
        let [bx, by, bz] = dims.block;
        // SAFETY: the caller guarantees that `args` match the kernel's
        // parameters and address live buffers; `params` and `values` outlive
        // the call, which returns when every emulated thread has finished.
        let rc = unsafe {
            (self.launch)(
                name.as_ptr(),
                gx,
                gy,
                gz,
                bx,
                by,
                bz,
                dims.shared_bytes,
                params.as_mut_ptr(),
            )
        };
        match rc {
            0 => Ok(()),
            1 => Err(CudaError::Launch("the emulator refused the block shape")),
            2 => Err(CudaError::Launch(
                "the emulator refused the shared memory size",
            )),
            3 => Err(CudaError::Launch("the emulator refused the grid shape")),
            _ => Err(CudaError::Launch("the emulator does not know the kernel")),
        }
    }
}
