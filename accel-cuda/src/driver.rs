//! Finding the CUDA driver library without touching any of its symbols.

// `libloading` marks loading a library unsafe because the library's
// initialisers run in this process; this module contains the one such call.
#![allow(unsafe_code)]

/// Whether the CUDA driver library (`libcuda.so` or a versioned name) can be
/// loaded on this machine. Cheap enough to call before every device probe.
pub fn driver_library_present() -> bool {
    // SAFETY: this loads (and immediately unloads) the system's NVIDIA driver
    // library by its well-known names; its initialisers are trusted exactly as
    // much as any system library this process would link against, and no
    // symbol is called.
    unsafe { cudarc::driver::sys::is_culib_present() }
}
