//! `cargo xtask vectors`: regenerates the versioned known-answer vectors
//! and, from them, the firmware's built-in known answers
//! (`examples/mcu/src/kat.rs`).
//!
//! The vectors are written by `suffuse_tests::vectors::write_all`, run
//! through the `write_vectors` binary of `suffuse-tests` rather than linked
//! into xtask, so that xtask (and with it `ci`, `ct` and `bench`) builds
//! even while the test crate does not.

use anyhow::{Context, Result};

use crate::command::{self, cargo};

/// The vectors root, relative to the workspace root; `write_all` writes the
/// current version's folder (`v1/`) under it.
const VECTORS_ROOT: &str = "tests/vectors";

/// The firmware's known answers, relative to the workspace root.
const MCU_KAT: &str = "examples/mcu/src/kat.rs";

pub fn run() -> Result<()> {
    let crate_has_vectors = command::workspace_root()
        .join("tests/src/vectors.rs")
        .is_file();
    if !crate_has_vectors {
        anyhow::bail!(
            "tests/src/vectors.rs does not exist, so there is no vector writer \
             (suffuse_tests::vectors::write_all) to run"
        );
    }
    command::run(&mut cargo([
        "run",
        "--quiet",
        "-p",
        "suffuse-tests",
        "--bin",
        "write_vectors",
        "--",
        VECTORS_ROOT,
        MCU_KAT,
    ]))
    .context("regenerating the test vectors")?;
    eprintln!("vectors: review the change with `git diff {VECTORS_ROOT} {MCU_KAT}`");
    Ok(())
}
