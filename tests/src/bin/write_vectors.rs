//! `write_vectors ROOT [MCU_KAT]`: rewrites the known-answer vectors of the
//! current version under the vectors root `ROOT` (so `ROOT/v1/...`) through
//! [`suffuse_tests::vectors::write_all`], then the firmware's known answers
//! (`MCU_KAT`, by default `examples/mcu/src/kat.rs`) from them through
//! [`suffuse_tests::mcu::write`]. `cargo xtask vectors` runs it with
//! `tests/vectors` from the workspace root.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (Some(dir), kat, None) = (args.next(), args.next(), args.next()) else {
        eprintln!("usage: write_vectors VECTORS_ROOT [MCU_KAT]");
        return ExitCode::from(2);
    };
    let dir = PathBuf::from(dir);
    if let Err(e) = suffuse_tests::vectors::write_all(&dir) {
        eprintln!("write_vectors: writing {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    println!(
        "wrote {}",
        suffuse_tests::vectors::file_path(&dir).display()
    );
    let kat = kat.map_or_else(suffuse_tests::mcu::default_path, PathBuf::from);
    if let Err(e) = suffuse_tests::mcu::write(Path::new(&dir), &kat) {
        eprintln!("write_vectors: writing {}: {e}", kat.display());
        return ExitCode::FAILURE;
    }
    println!("wrote {}", kat.display());
    ExitCode::SUCCESS
}
