//! NVRTC: compiling the kernels at run time, and the per-kernel resource
//! report (registers, spills, shared memory) that `cargo xtask cuda-check`
//! prints and fails on.
//!
//! cudarc panics when a library it needs cannot be loaded, so every entry
//! point probes for libnvrtc first and returns [`CudaError::NvrtcNotFound`].

// NVRTC is a C API; each unsafe block says why its call is sound.
#![allow(unsafe_code)]

use std::ffi::{CString, c_char, c_int};

use cudarc::nvrtc::{result, sys};

use crate::CudaError;

/// Whether libnvrtc can be loaded here (by cudarc's library names, on
/// `LD_LIBRARY_PATH`).
pub fn library_present() -> bool {
    // SAFETY: loads (and unloads) the NVRTC library by its well-known names;
    // no symbol is called.
    unsafe { sys::is_culib_present() }
}

/// NVRTC's version, `(major, minor)`.
pub fn version() -> Result<(i32, i32), CudaError> {
    if !library_present() {
        return Err(CudaError::NvrtcNotFound);
    }
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: the library is present; both pointers are to live integers.
    unsafe { sys::nvrtcVersion(&raw mut major, &raw mut minor) }
        .result()
        .map_err(|e| CudaError::Nvrtc(format!("nvrtcVersion: {e:?}")))?;
    Ok((major, minor))
}

/// What one compilation produced.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// PTX text (for a virtual architecture) or an empty string (for a
    /// real one, which yields a CUBIN).
    pub ptx: String,
    /// The compiler's log: warnings, and with `--ptxas-options=-v` the
    /// resources of every kernel.
    pub log: String,
}

fn text(raw: &[c_char]) -> String {
    let bytes: Vec<u8> = raw
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| c.to_ne_bytes()[0])
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Compiles `source` for `arch` (`compute_XY` for PTX, `sm_XY` for a
/// CUBIN) with the project's options plus `extra`.
pub fn compile(source: &str, arch: &str, extra: &[&str]) -> Result<Compiled, CudaError> {
    if !library_present() {
        return Err(CudaError::NvrtcNotFound);
    }
    let src = CString::new(source).map_err(|_| CudaError::Nvrtc("source holds a NUL".into()))?;
    let name = c"suffuse.cu";
    let prog = result::create_program(&src, Some(name))
        .map_err(|e| CudaError::Nvrtc(format!("nvrtcCreateProgram: {e:?}")))?;
    let mut options = vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()];
    options.extend(extra.iter().map(|s| (*s).to_owned()));
    // SAFETY: `prog` was just created and is destroyed once, below; `src`
    // and `name` outlive it.
    let compiled = unsafe { result::compile_program(prog, &options) };
    // SAFETY: as above.
    let log = unsafe { result::get_program_log(prog) }
        .map(|l| text(&l))
        .unwrap_or_default();
    let ptx = match compiled {
        Ok(()) if arch.starts_with("compute_") => {
            // SAFETY: as above; the program compiled.
            unsafe { result::get_ptx(prog) }
                .map(|p| text(&p))
                .map_err(|e| CudaError::Nvrtc(format!("nvrtcGetPTX: {e:?}")))
        }
        Ok(()) => Ok(String::new()),
        Err(e) => Err(CudaError::Nvrtc(format!(
            "{e:?} compiling for {arch}:\n{log}"
        ))),
    };
    // SAFETY: `prog` is live and not used again.
    let _ = unsafe { result::destroy_program(prog) };
    Ok(Compiled { ptx: ptx?, log })
}

/// One kernel's resources as ptxas reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resources {
    /// The kernel's name.
    pub kernel: String,
    /// Registers per thread.
    pub registers: u32,
    /// Bytes spilled to local memory (stores plus loads).
    pub spill_bytes: u32,
    /// Static shared memory in bytes.
    pub shared_bytes: u32,
    /// Stack frame in bytes.
    pub stack_bytes: u32,
}

/// Parses `--ptxas-options=-v` output: for each kernel, a line naming the
/// function, one with its stack frame and spills, and one with its
/// registers and shared memory.
pub fn parse_resources(log: &str) -> Vec<Resources> {
    let mut all: Vec<Resources> = Vec::new();
    let number_before = |line: &str, unit: &str| -> u32 {
        line.split(',')
            .find(|part| part.contains(unit))
            .and_then(|part| part.split_whitespace().find_map(|w| w.parse::<u32>().ok()))
            .unwrap_or(0)
    };
    for line in log.lines() {
        if let Some(at) = line.find("Compiling entry function '") {
            let rest = &line[at + "Compiling entry function '".len()..];
            let kernel = rest.split('\'').next().unwrap_or("").to_owned();
            all.push(Resources {
                kernel,
                registers: 0,
                spill_bytes: 0,
                shared_bytes: 0,
                stack_bytes: 0,
            });
        } else if let Some(last) = all.last_mut() {
            if line.contains("bytes stack frame") {
                last.stack_bytes = number_before(line, "stack frame");
                last.spill_bytes =
                    number_before(line, "spill stores") + number_before(line, "spill loads");
            } else if line.contains("Used") && line.contains("registers") {
                last.registers = number_before(line, "registers");
                last.shared_bytes = number_before(line, "smem");
            }
        }
    }
    all
}

/// Compiles the kernels for the real architecture `sm` (such as `sm_90`)
/// with ptxas's verbose output and returns each kernel's resources.
pub fn resources(source: &str, sm: &str) -> Result<(Vec<Resources>, String), CudaError> {
    let compiled = compile(source, sm, &["--ptxas-options=-v"])?;
    Ok((parse_resources(&compiled.log), compiled.log))
}
