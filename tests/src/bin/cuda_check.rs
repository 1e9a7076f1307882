//! The compile check of the CUDA kernels, run by `cargo xtask cuda-check`
//! with NVRTC on `LD_LIBRARY_PATH` (no GPU and no CUDA toolkit needed):
//!
//! * every kernel compiles for sm_80 and sm_90, and ptxas's report of its
//!   registers, spills, stack and shared memory is printed; any spill, or a
//!   kernel missing from the report, fails the check;
//! * the checked-in PTX (`accel-cuda/kernels/ptx/suffuse.ptx`) is exactly
//!   what NVRTC makes of today's source for `compute_80`; with
//!   `--write-ptx PATH` it is rewritten instead.

use std::process::ExitCode;

use suffuse_accel_cuda::launcher::Kernel;
use suffuse_accel_cuda::{nvrtc, source};

/// The real architectures every kernel must compile for without spilling.
const ARCHES: [&str; 2] = ["sm_80", "sm_90"];

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cuda-check: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let write_ptx = match args.as_slice() {
        [] => None,
        [flag, path] if flag == "--write-ptx" => Some(path.clone()),
        _ => return Err("usage: cuda_check [--write-ptx PATH]".into()),
    };
    let (major, minor) = nvrtc::version().map_err(|e| e.to_string())?;
    println!(
        "NVRTC {major}.{minor}; kernel source {}",
        source::source_hash()
    );
    let text = source::source();
    let mut problems = Vec::new();
    for arch in ARCHES {
        let (resources, log) = nvrtc::resources(&text, arch).map_err(|e| e.to_string())?;
        println!("\n{arch}:");
        println!(
            "  {:<22} {:>9} {:>12} {:>11} {:>13}",
            "kernel", "registers", "spill bytes", "stack bytes", "static shared"
        );
        for r in &resources {
            println!(
                "  {:<22} {:>9} {:>12} {:>11} {:>13}",
                r.kernel, r.registers, r.spill_bytes, r.stack_bytes, r.shared_bytes
            );
            if r.spill_bytes > 0 {
                problems.push(format!(
                    "{arch}: {} spills {} bytes",
                    r.kernel, r.spill_bytes
                ));
            }
        }
        for k in Kernel::ALL {
            if !resources.iter().any(|r| r.kernel == k.name()) {
                problems.push(format!(
                    "{arch}: ptxas reported nothing for {}; its log:\n{log}",
                    k.name()
                ));
            }
        }
    }
    let ptx = nvrtc::compile(&text, source::PTX_ARCH, &[])
        .map_err(|e| e.to_string())?
        .ptx;
    let header = source::ptx_header();
    match write_ptx {
        Some(path) => {
            let file = format!("{header}{ptx}");
            std::fs::write(&path, &file).map_err(|e| format!("writing {path}: {e}"))?;
            println!("\nwrote {path} ({} bytes)", file.len());
        }
        None if source::ptx_is_current() => {
            // NVRTC's output for one source varies between runs (see
            // `source::ptx_header`), so the body is reported, not required.
            let same = source::PTX[header.len()..] == ptx;
            println!(
                "\nthe checked-in PTX was compiled from today's source ({}); this run's \
                 NVRTC output is {}",
                source::source_hash(),
                if same {
                    "the same"
                } else {
                    "a different compilation of it"
                }
            );
        }
        None => problems
            .push("the checked-in PTX is stale: run `cargo xtask cuda-check --write-ptx`".into()),
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}
