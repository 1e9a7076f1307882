//! Builds the CPU emulator of the kernels (feature `emulator`): the same
//! `kernels/*.cu` sources, compiled as C++20 by the system's C++ compiler
//! with the stand-in header `emu/emu.h`, linked as a static library.
//!
//! The race check (`cargo xtask cuda-tsan`) builds the same sources again,
//! with ThreadSanitizer, as a shared library that the emulator loads at run
//! time (`SUFFUSE_EMU_LIBRARY`).

fn main() {
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-changed=emu");
    #[cfg(feature = "emulator")]
    cc::Build::new()
        .cpp(true)
        .std("c++20")
        .file("emu/runtime.cpp")
        .file("emu/kernels.cpp")
        .include("emu")
        .warnings(true)
        .extra_warnings(true)
        .flag_if_supported("-Wno-unused-parameter")
        .opt_level(2)
        .compile("suffuse_emu");
}
