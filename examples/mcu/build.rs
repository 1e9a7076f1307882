//! Puts `memory.x` where cortex-m-rt's `link.x` includes it from, and links
//! with `link.x` (here rather than in `.cargo/config.toml`, where a
//! `RUSTFLAGS` in the environment would silently replace it).

use std::path::PathBuf;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::copy("memory.x", out.join("memory.x")).expect("copying memory.x");
    println!("cargo:rustc-link-search={}", out.display());
    println!("cargo:rustc-link-arg=-Tlink.x");
    println!("cargo:rerun-if-changed=memory.x");
    println!("cargo:rerun-if-changed=build.rs");
}
