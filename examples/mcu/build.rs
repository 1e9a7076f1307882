//! Puts the memory layout (`memory/target.x`, or `memory/runtime.x` with
//! the `runtime-gates` feature) as `memory.x` where cortex-m-rt's `link.x`
//! includes it from, and links with `link.x` (here rather than in
//! `.cargo/config.toml`, where a `RUSTFLAGS` in the environment would
//! silently replace it).

use std::path::PathBuf;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    // `runtime-gates` keeps a gate slot in RAM: more statics, less stack
    // (memory/runtime.x says how much).
    let layout = if std::env::var_os("CARGO_FEATURE_RUNTIME_GATES").is_some() {
        "memory/runtime.x"
    } else {
        "memory/target.x"
    };
    std::fs::copy(layout, out.join("memory.x")).expect("copying the memory layout");
    println!("cargo:rustc-link-search={}", out.display());
    println!("cargo:rustc-link-arg=-Tlink.x");
    // Not in this folder: the linker searches the working directory first,
    // so a `memory.x` here would win over the one chosen above.
    println!("cargo:rerun-if-changed=memory");
    println!("cargo:rerun-if-changed=build.rs");
}
