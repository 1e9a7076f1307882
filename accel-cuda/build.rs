//! Builds the CPU emulator of the kernels (feature `emulator`): the same
//! `kernels/*.cu` sources, compiled as C++20 by the system's C++ compiler
//! with the stand-in header `emu/emu.h`.
//!
//! `SUFFUSE_EMU_TSAN=1` builds it with ThreadSanitizer (and links the
//! runtime), and `SUFFUSE_EMU_PLANT=missing-sync` removes the barrier that
//! ends the AES table set-up, the planted fault the race check must report
//! (`cargo xtask cuda-tsan`).

fn main() {
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-changed=emu");
    println!("cargo:rerun-if-env-changed=SUFFUSE_EMU_TSAN");
    println!("cargo:rerun-if-env-changed=SUFFUSE_EMU_PLANT");
    #[cfg(feature = "emulator")]
    emulator();
}

#[cfg(feature = "emulator")]
fn emulator() {
    let tsan = std::env::var_os("SUFFUSE_EMU_TSAN").is_some_and(|v| v == "1");
    let plant = std::env::var("SUFFUSE_EMU_PLANT").ok();
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++20")
        .file("emu/runtime.cpp")
        .file("emu/kernels.cpp")
        .include("emu")
        .warnings(true)
        .extra_warnings(true)
        .flag_if_supported("-Wno-unused-parameter")
        .opt_level(2);
    if tsan {
        build.flag("-fsanitize=thread").flag("-g");
        println!("cargo:rustc-link-lib=dylib=tsan");
    }
    match plant.as_deref() {
        Some("missing-sync") => {
            build.define("SUFFUSE_PLANT_MISSING_SYNC", None);
        }
        Some(other) => panic!("SUFFUSE_EMU_PLANT={other}: the only planted fault is missing-sync"),
        None => {}
    }
    build.compile("suffuse_emu");
}
