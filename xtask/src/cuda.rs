//! `cargo xtask cuda-check` and `cargo xtask cuda-tsan`: what CI proves
//! about the CUDA kernels on machines without a GPU.
//!
//! * **cuda-check**: NVRTC from PyPI (`cargo xtask fetch-model nvrtc`)
//!   compiles every kernel for sm_80 and sm_90; the check prints registers,
//!   spills, stack and shared memory per kernel and fails on any spill; and
//!   the checked-in PTX must be NVRTC's output for today's source
//!   (`--write-ptx` rewrites it).
//! * **cuda-tsan**: the emulated kernels, built with ThreadSanitizer, run
//!   the conformance harness's small cases and must give no report; built
//!   again with the planted missing `__syncthreads`, they must be reported.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::command::{self, capture, cargo, program, target_dir, workspace_root};
use crate::fetch_model::nvrtc_dir;

/// The checked-in PTX, relative to the workspace root.
const PTX: &str = "accel-cuda/kernels/ptx/suffuse.ptx";

/// Whether NVRTC has been fetched; the callers decide whether its absence
/// is a skip or a failure.
pub fn nvrtc_present() -> bool {
    nvrtc_dir().join("libnvrtc.so.12").is_file()
}

/// A test-support binary of `suffuse-tests`, built in the dev profile.
fn tests_bin(name: &str) -> Result<PathBuf> {
    command::run(&mut cargo(["build", "-p", "suffuse-tests", "--bin", name]))?;
    Ok(target_dir()?.join("debug").join(name))
}

pub fn check(args: &[String]) -> Result<()> {
    let write = match args {
        [] => false,
        [flag] if flag == "--write-ptx" => true,
        _ => bail!("usage: cargo xtask cuda-check [--write-ptx]"),
    };
    if !nvrtc_present() {
        bail!(
            "NVRTC is not in {}: run `cargo xtask fetch-model nvrtc` first",
            nvrtc_dir().display()
        );
    }
    let bin = tests_bin("cuda_check")?;
    let mut cmd = program(bin.to_string_lossy().as_ref(), None::<&str>);
    cmd.env("LD_LIBRARY_PATH", nvrtc_dir());
    if write {
        cmd.arg("--write-ptx").arg(workspace_root().join(PTX));
    }
    command::run(&mut cmd)?;
    Ok(())
}

/// Builds the emulator as a ThreadSanitizer shared library, planted or not.
fn tsan_library(out: &Path, planted: bool) -> Result<()> {
    let emu = workspace_root().join("accel-cuda/emu");
    let mut cmd = program("g++", ["-std=c++20", "-O1", "-g", "-fsanitize=thread"]);
    cmd.args(["-fPIC", "-shared", "-fvisibility=hidden", "-Wl,-Bsymbolic"]);
    if planted {
        cmd.arg("-DSUFFUSE_PLANT_MISSING_SYNC");
    }
    cmd.arg(emu.join("runtime.cpp"))
        .arg(emu.join("kernels.cpp"))
        .arg("-o")
        .arg(out);
    command::run(&mut cmd)?;
    Ok(())
}

fn libtsan() -> Result<String> {
    let out = capture(&mut program("gcc", ["-print-file-name=libtsan.so"]))?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || !Path::new(&path).is_file() {
        bail!("gcc's ThreadSanitizer runtime (libtsan.so) is missing; install gcc's libtsan");
    }
    Ok(path)
}

/// Runs the race check on `library` and returns its exit status and stderr.
fn race_run(bin: &Path, library: &Path, halt: bool) -> Result<(bool, String)> {
    let mut cmd = program(bin.to_string_lossy().as_ref(), None::<&str>);
    cmd.env("LD_PRELOAD", libtsan()?)
        .env("SUFFUSE_EMU_LIBRARY", library);
    if halt {
        cmd.env("TSAN_OPTIONS", "halt_on_error=1");
    }
    let out = capture(&mut cmd)?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    Ok((out.status.success(), stderr))
}

pub fn tsan() -> Result<()> {
    let start = Instant::now();
    let dir = target_dir()?.join("cuda-tsan");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let (clean, planted) = (dir.join("clean.so"), dir.join("planted.so"));
    tsan_library(&clean, false)?;
    tsan_library(&planted, true)?;
    let bin = tests_bin("emu_race_check")?;

    let (ok, stderr) = race_run(&bin, &clean, false)?;
    eprint!("{stderr}");
    if !ok || stderr.contains("ThreadSanitizer") {
        bail!("the emulated kernels race or fail under ThreadSanitizer (report above)");
    }
    let (_, stderr) = race_run(&bin, &planted, true)?;
    let found = stderr.contains("WARNING: ThreadSanitizer: data race") && stderr.contains(".cuh");
    if !found {
        eprint!("{stderr}");
        bail!("ThreadSanitizer did not report the planted missing __syncthreads");
    }
    let summary = stderr
        .lines()
        .find(|l| l.starts_with("SUMMARY"))
        .unwrap_or("SUMMARY: (none)");
    eprintln!(
        "cuda-tsan: the clean kernels gave no report; the planted missing \
         __syncthreads was reported ({summary}); {}",
        command::seconds(start.elapsed())
    );
    Ok(())
}
