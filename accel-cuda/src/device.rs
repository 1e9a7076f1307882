//! The GPU launcher: a CUDA device through `cudarc` (dynamic loading), its
//! kernels compiled at run time by NVRTC or loaded from the checked-in PTX.

// The driver's launch takes raw parameter pointers; each unsafe block says
// why its call is sound.
#![allow(unsafe_code)]

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, DriverError,
    LaunchConfig, PinnedHostSlice, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use crate::launcher::{Arg, Dims, Kernel, Launcher};
use crate::{CudaError, driver_library_present, nvrtc, source};

/// Threads per block of the one-dimensional kernels: one evaluation per
/// thread, 256 per block (as measured on the H100, `DESIGN.md`).
const THREADS: u32 = 256;

/// Resident blocks per multiprocessor a launch asks for at most; kernels
/// stride over larger batches.
const BLOCKS_PER_SM: u32 = 8;

/// Where the kernels' machine code comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Code {
    /// NVRTC when it loads, else the checked-in PTX.
    #[default]
    Auto,
    /// NVRTC only: an error when it is missing.
    Nvrtc,
    /// The checked-in PTX only.
    Ptx,
}

/// How the loaded kernels were made, for reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CodeSource {
    /// NVRTC `major.minor` compiled the source for this architecture.
    Nvrtc {
        /// NVRTC's version.
        version: (i32, i32),
        /// `compute_XY`.
        arch: String,
        /// Whether the PTX came from the on-disk cache.
        cached: bool,
    },
    /// The checked-in PTX ([`source::PTX_ARCH`]).
    Ptx,
}

impl core::fmt::Display for CodeSource {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CodeSource::Nvrtc {
                version: (a, b),
                arch,
                cached,
            } => write!(
                f,
                "nvrtc {a}.{b} ({arch}{})",
                if *cached { ", cached" } else { "" }
            ),
            CodeSource::Ptx => write!(f, "checked-in ptx ({})", source::PTX_ARCH),
        }
    }
}

/// Bytes of each of the two pinned host buffers that staged key sections
/// pass through on their way to the device.
const PINNED_BYTES: usize = 32 << 20;

/// The pinned double buffers of [`Launcher::stage_bytes`]: while the copy
/// engine moves one to the device, the host fills the other.
struct Pinned {
    buffers: [PinnedHostSlice<u8>; 2],
    /// The copy out of each buffer, to wait for before refilling it.
    copied: [Option<CudaEvent>; 2],
    next: usize,
}

/// A CUDA device with the suffuse kernels loaded.
pub struct Device {
    context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// Staged key sections travel on their own stream, beside the kernels.
    copies: Arc<CudaStream>,
    pinned: Mutex<Option<Pinned>>,
    /// The pinned double buffers generated keys come back through
    /// ([`Launcher::download_bytes`]), apart from the staging's.
    pinned_down: Mutex<Option<[PinnedHostSlice<u8>; 2]>>,
    functions: Vec<CudaFunction>,
    name: String,
    multiprocessors: u32,
    code: CodeSource,
}

impl core::fmt::Debug for Device {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Device")
            .field("ordinal", &self.context.ordinal())
            .field("name", &self.name)
            .field("code", &self.code)
            .finish_non_exhaustive()
    }
}

fn driver(call: &'static str) -> impl Fn(DriverError) -> CudaError {
    move |source| CudaError::Driver { call, source }
}

impl Device {
    /// An event recorded on `stream` now: it completes when the stream's
    /// work so far has.
    fn recorded(&self, stream: &CudaStream) -> Result<CudaEvent, CudaError> {
        let event = self
            .context
            .new_event(None)
            .map_err(driver("cuEventCreate"))?;
        event.record(stream).map_err(driver("cuEventRecord"))?;
        Ok(event)
    }

    /// One pinned host buffer of [`PINNED_BYTES`].
    fn pinned_buffer(&self) -> Result<PinnedHostSlice<u8>, CudaError> {
        // SAFETY: plain pinned host memory, written before it is read.
        unsafe { self.context.alloc_pinned::<u8>(PINNED_BYTES) }.map_err(driver("cuMemHostAlloc"))
    }
    /// Opens device `ordinal` and loads the kernels from `code`.
    pub fn open(ordinal: usize, code: Code) -> Result<Device, CudaError> {
        // cudarc panics when a driver symbol is used without the library,
        // so the probe must come first.
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
        let context = CudaContext::new(ordinal).map_err(driver("cuDevicePrimaryCtxRetain"))?;
        // One stream orders every copy and launch; cudarc's per-buffer
        // events would only add work.
        // SAFETY: no buffer exists yet, and every buffer is used on the one
        // stream below.
        unsafe { context.disable_event_tracking() };
        let name = context.name().map_err(driver("cuDeviceGetName"))?;
        let (major, minor) = context
            .compute_capability()
            .map_err(driver("cuDeviceGetAttribute"))?;
        let multiprocessors = context
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(driver("cuDeviceGetAttribute"))?;
        let (ptx, code) = kernels(code, major, minor)?;
        let module = context
            .load_module(ptx)
            .map_err(driver("cuModuleLoadData"))?;
        let functions = Kernel::ALL
            .iter()
            .map(|k| module.load_function(k.name()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(driver("cuModuleGetFunction"))?;
        let stream = context.default_stream();
        let copies = context.new_stream().map_err(driver("cuStreamCreate"))?;
        Ok(Device {
            context,
            stream,
            copies,
            pinned: Mutex::new(None),
            pinned_down: Mutex::new(None),
            functions,
            name,
            multiprocessors: u32::try_from(multiprocessors).unwrap_or(1).max(1),
            code,
        })
    }

    /// How the loaded kernels were made.
    pub fn code(&self) -> &CodeSource {
        &self.code
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.context.ordinal()
    }

    /// Free and total device memory in bytes, as the driver reports them.
    pub fn memory_info(&self) -> Result<(usize, usize), CudaError> {
        self.context.mem_get_info().map_err(driver("cuMemGetInfo"))
    }
}

/// The kernels' PTX for a device of compute capability `major.minor`.
fn kernels(code: Code, major: i32, minor: i32) -> Result<(Ptx, CodeSource), CudaError> {
    let arch = format!("compute_{major}{minor}");
    match code {
        Code::Ptx => Ok((Ptx::from_src(source::PTX), CodeSource::Ptx)),
        Code::Nvrtc => compiled(&arch),
        Code::Auto => match compiled(&arch) {
            Ok(found) => Ok(found),
            Err(CudaError::NvrtcNotFound) => Ok((Ptx::from_src(source::PTX), CodeSource::Ptx)),
            Err(e) => Err(e),
        },
    }
}

/// The cache folder of compiled PTX: `$SUFFUSE_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/suffuse`, else `~/.cache/suffuse`; then `cuda/`.
fn cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("SUFFUSE_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("suffuse")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/suffuse")))?;
    Some(base.join("cuda"))
}

/// NVRTC's PTX for `arch`, from the cache when this source was compiled
/// for this architecture by this NVRTC before.
fn compiled(arch: &str) -> Result<(Ptx, CodeSource), CudaError> {
    let version = nvrtc::version()?;
    let file = format!(
        "{}-{arch}-nvrtc{}.{}.ptx",
        source::source_hash(),
        version.0,
        version.1
    );
    let path = cache_dir().map(|d| d.join(file));
    if let Some(text) = path.as_ref().and_then(|p| std::fs::read_to_string(p).ok()) {
        let code = CodeSource::Nvrtc {
            version,
            arch: arch.to_owned(),
            cached: true,
        };
        return Ok((Ptx::from_src(text), code));
    }
    let ptx = nvrtc::compile(&source::source(), arch, &[])?.ptx;
    if let Some(p) = &path {
        // A cache that cannot be written costs a compile next time, nothing
        // more; a partial file is never read because it is renamed in place.
        if let Some(dir) = p.parent()
            && std::fs::create_dir_all(dir).is_ok()
        {
            let tmp = p.with_extension(format!("tmp{}", std::process::id()));
            if std::fs::write(&tmp, &ptx).is_ok() {
                let _ = std::fs::rename(&tmp, p);
            }
        }
    }
    let code = CodeSource::Nvrtc {
        version,
        arch: arch.to_owned(),
        cached: false,
    };
    Ok((Ptx::from_src(ptx), code))
}

impl Launcher for Device {
    type Buffer = CudaSlice<u64>;

    fn kind(&self) -> &'static str {
        "cuda"
    }

    fn device_name(&self) -> &str {
        &self.name
    }

    fn threads_per_block(&self) -> u32 {
        THREADS
    }

    fn max_blocks(&self) -> u32 {
        self.multiprocessors.saturating_mul(BLOCKS_PER_SM)
    }

    fn alloc(&self, words: usize) -> Result<CudaSlice<u64>, CudaError> {
        // Zeroed: a kernel reading past what was uploaded reads zeros, never
        // another query's leftovers.
        self.stream
            .alloc_zeros::<u64>(words.max(1))
            .map_err(driver("cuMemAlloc"))
    }

    fn upload(&self, dst: &mut CudaSlice<u64>, src: &[u64]) -> Result<(), CudaError> {
        if src.len() > dst.len() {
            return Err(CudaError::Launch("upload longer than its buffer"));
        }
        if src.is_empty() {
            return Ok(());
        }
        let mut view = dst.slice_mut(..src.len());
        self.stream
            .memcpy_htod(src, &mut view)
            .map_err(driver("cuMemcpyHtoD"))
    }

    fn download(&self, src: &CudaSlice<u64>, dst: &mut [u64]) -> Result<(), CudaError> {
        if dst.len() > src.len() {
            return Err(CudaError::Launch("download longer than its buffer"));
        }
        if !dst.is_empty() {
            let view = src.slice(..dst.len());
            self.stream
                .memcpy_dtoh(&view, dst)
                .map_err(driver("cuMemcpyDtoH"))?;
        }
        self.stream
            .synchronize()
            .map_err(driver("cuStreamSynchronize"))
    }

    fn download_bytes(&self, src: &CudaSlice<u64>, dst: &mut [u8]) -> Result<(), CudaError> {
        if dst.len() > src.num_bytes() {
            return Err(CudaError::Launch("download longer than its buffer"));
        }
        if dst.is_empty() {
            return Ok(());
        }
        // Through two pinned buffers: the copy engine fills one while the
        // host's cores copy the other out. A copy straight into pageable
        // memory ran at about 3 GB/s on the H200 machine.
        let mut guard = self
            .pinned_down
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if guard.is_none() {
            *guard = Some([self.pinned_buffer()?, self.pinned_buffer()?]);
        }
        let Some(buffers) = guard.as_mut() else {
            return Err(CudaError::Launch("pinned buffers missing"));
        };
        let (base, _sync) = src.device_ptr(&self.stream);
        let len = dst.len();
        let chunks = len.div_ceil(PINNED_BYTES);
        let span = |i: usize| (i * PINNED_BYTES, len.min((i + 1) * PINNED_BYTES));
        // Starts chunk i's copy into buffer i % 2; returns its event.
        let start = |i: usize, buffers: &mut [PinnedHostSlice<u8>; 2]| {
            let (a, b) = span(i);
            let host = buffers[i % 2]
                .as_mut_slice()
                .map_err(driver("cuEventSynchronize"))?;
            // SAFETY: `base + a` lies in `src`, which holds `dst.len()`
            // bytes or more; the buffer is not read before the event
            // recorded after the copy completes, and not written again
            // before its bytes were copied out (the loop below).
            unsafe {
                cudarc::driver::result::memcpy_dtoh_async(
                    &mut host[..b - a],
                    base + a as u64,
                    self.stream.cu_stream(),
                )
            }
            .map_err(driver("cuMemcpyDtoHAsync"))?;
            self.recorded(&self.stream)
        };
        let mut pending = start(0, buffers)?;
        for i in 0..chunks {
            let next = match i + 1 < chunks {
                true => Some(start(i + 1, buffers)?),
                false => None,
            };
            pending
                .synchronize()
                .map_err(driver("cuEventSynchronize"))?;
            let (a, b) = span(i);
            let host = buffers[i % 2]
                .as_slice()
                .map_err(driver("cuEventSynchronize"))?;
            crate::par::zip_chunks(&mut dst[a..b], 1 << 20, &host[..b - a], 1 << 20, |o, i| {
                o.copy_from_slice(i);
            });
            if let Some(e) = next {
                pending = e;
            }
        }
        Ok(())
    }

    fn stage_bytes(&self, dst: &mut CudaSlice<u64>, bytes: &[u8]) -> Result<(), CudaError> {
        if bytes.len() > dst.num_bytes() {
            return Err(CudaError::Launch("staged bytes longer than their buffer"));
        }
        let mut guard = self.pinned.lock().unwrap_or_else(PoisonError::into_inner);
        if guard.is_none() {
            *guard = Some(Pinned {
                buffers: [self.pinned_buffer()?, self.pinned_buffer()?],
                copied: [None, None],
                next: 0,
            });
        }
        let Some(pinned) = guard.as_mut() else {
            return Err(CudaError::Launch("pinned buffers missing"));
        };
        let (base, _sync) = dst.device_ptr(&self.copies);
        for (i, chunk) in bytes.chunks(PINNED_BYTES).enumerate() {
            let slot = pinned.next;
            pinned.next ^= 1;
            if let Some(copied) = &pinned.copied[slot] {
                copied.synchronize().map_err(driver("cuEventSynchronize"))?;
            }
            let host = pinned.buffers[slot]
                .as_mut_slice()
                .map_err(driver("cuEventSynchronize"))?;
            // On every core: one thread copied at about 3.7 GB/s on the
            // H200 machine, where the link takes several times that.
            crate::par::zip_chunks(&mut host[..chunk.len()], 1 << 20, chunk, 1 << 20, |o, i| {
                o.copy_from_slice(i);
            });
            let at = base + (i * PINNED_BYTES) as u64;
            // SAFETY: `at` lies in `dst`, which holds all of `bytes`; the
            // pinned source stays untouched until `copied[slot]` completes,
            // which the next use of this slot waits for.
            unsafe {
                cudarc::driver::result::memcpy_htod_async(
                    at,
                    &host[..chunk.len()],
                    self.copies.cu_stream(),
                )
            }
            .map_err(driver("cuMemcpyHtoDAsync"))?;
            pinned.copied[slot] = Some(self.recorded(&self.copies)?);
        }
        // Every later launch waits for the copies, on the device.
        let done = self.recorded(&self.copies)?;
        self.stream.wait(&done).map_err(driver("cuStreamWaitEvent"))
    }

    fn wipe(&self, buf: &mut CudaSlice<u64>, words: usize) -> Result<(), CudaError> {
        let words = words.min(buf.len());
        if words == 0 {
            return Ok(());
        }
        let mut view = buf.slice_mut(..words);
        self.stream
            .memset_zeros(&mut view)
            .map_err(driver("cuMemsetD8"))
    }

    fn synchronize(&self) -> Result<(), CudaError> {
        self.stream
            .synchronize()
            .map_err(driver("cuStreamSynchronize"))
    }

    fn address(&self, buf: &CudaSlice<u64>) -> u64 {
        let (ptr, _sync) = buf.device_ptr(&self.stream);
        ptr
    }

    unsafe fn launch(&self, kernel: Kernel, dims: Dims, args: &[Arg]) -> Result<(), CudaError> {
        let index = Kernel::ALL.iter().position(|k| *k == kernel).unwrap_or(0);
        let function = &self.functions[index];
        let values: Vec<(u64, u32)> = args
            .iter()
            .map(|a| match *a {
                Arg::Ptr(p) | Arg::U64(p) => (p, 0),
                Arg::U32(v) => (0, v),
            })
            .collect();
        let mut builder = self.stream.launch_builder(function);
        for (arg, (wide, narrow)) in args.iter().zip(&values) {
            match arg {
                Arg::Ptr(_) | Arg::U64(_) => builder.arg(wide),
                Arg::U32(_) => builder.arg(narrow),
            };
        }
        let config = LaunchConfig {
            grid_dim: (dims.grid[0], dims.grid[1], dims.grid[2]),
            block_dim: (dims.block[0], dims.block[1], dims.block[2]),
            shared_mem_bytes: dims.shared_bytes,
        };
        // SAFETY: the caller guarantees that `args` match the kernel's
        // parameters and address live buffers of this device; `values`
        // outlives the launch call, which copies the parameters.
        unsafe { builder.launch(config) }
            .map(|_| ())
            .map_err(driver("cuLaunchKernel"))
    }
}
