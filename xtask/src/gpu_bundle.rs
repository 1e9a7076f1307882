//! `cargo xtask gpu-bundle`: the binaries and the one script that check the
//! CUDA backend on a lent GPU machine, which has no Rust toolchain, in one
//! call of the device tool.
//!
//! It builds `suffuse` and `gpu_check` in release, strips them, and puts
//! them with `xtask/gpu-bundle/run.sh` into `target/gpu-bundle/`
//! (git-ignored). The device tool carries at most 64 MiB with the working
//! tree, so the bundle's size is checked against that, less the tracked
//! files.

use std::path::Path;

use anyhow::{Context, Result, bail};

use crate::command::{self, capture, cargo, program, target_dir, workspace_root};

/// What the device tool carries at most, the working tree included.
const CARRY_LIMIT: u64 = 64 << 20;

/// The bundle's folder, relative to the workspace root (for `carry`).
pub const BUNDLE: &str = "target/gpu-bundle";

pub fn run() -> Result<()> {
    command::run(&mut cargo(["build", "--release", "--bin", "suffuse"]))?;
    command::run(&mut cargo([
        "build",
        "--release",
        "-p",
        "suffuse-tests",
        "--bin",
        "gpu_check",
    ]))?;
    let root = workspace_root();
    let release = target_dir()?.join("release");
    let dest = root.join(BUNDLE);
    if dest.exists() {
        std::fs::remove_dir_all(&dest).with_context(|| format!("removing {}", dest.display()))?;
    }
    std::fs::create_dir_all(&dest).with_context(|| format!("creating {}", dest.display()))?;
    for bin in ["suffuse", "gpu_check"] {
        let to = dest.join(bin);
        std::fs::copy(release.join(bin), &to).with_context(|| format!("copying {bin}"))?;
        command::run(program("strip", ["--strip-all"]).arg(&to))?;
    }
    let script = dest.join("run.sh");
    std::fs::copy(root.join("xtask/gpu-bundle/run.sh"), &script).context("copying run.sh")?;
    let bundle = size_of(&dest)?;
    let tree = tracked_bytes()?;
    eprintln!(
        "{BUNDLE}: {:.1} MiB, with {:.1} MiB of tracked files (limit {} MiB)",
        mib(bundle),
        mib(tree),
        CARRY_LIMIT >> 20
    );
    if bundle + tree > CARRY_LIMIT {
        bail!("the bundle and the working tree exceed the device tool's 64 MiB carry");
    }
    eprintln!(
        "run it on a lent GPU with the device tool: carry [\"{BUNDLE}\"], command \
         `bash {BUNDLE}/run.sh`, timeout_s 420 (it writes $OUT/summary.json and $OUT/log.txt)"
    );
    Ok(())
}

fn mib(bytes: u64) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let b = bytes as f64;
    b / f64::from(1u32 << 20)
}

fn size_of(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        total += entry?.metadata()?.len();
    }
    Ok(total)
}

/// Bytes of the files git tracks: they travel with every device call.
fn tracked_bytes() -> Result<u64> {
    let out = capture(&mut program("git", ["ls-files", "-z"]))?;
    if !out.status.success() {
        bail!("`git ls-files` failed");
    }
    let root = workspace_root();
    Ok(out
        .stdout
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .filter_map(|p| std::fs::metadata(root.join(String::from_utf8_lossy(p).as_ref())).ok())
        .map(|m| m.len())
        .sum())
}
