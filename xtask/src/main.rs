//! `cargo xtask`: suffuse's project tasks, in Rust so they run wherever
//! cargo does.
//!
//! | command | what it does |
//! | --- | --- |
//! | `ci` | fmt, clippy, tests, doc tests, rustdoc's warnings, the no_std build of core, `mcu`, a fuzz smoke run, `ct` |
//! | `ct` | the constant-time check under valgrind memcheck |
//! | `dudect` | a statistical timing test, fixed vs random secrets (not in `ci`) |
//! | `audit` | licences, bans and sources (`cargo deny`), and core's no_std/no-unsafe properties |
//! | `vectors` | regenerates the versioned test vectors in `tests/vectors/v1` |
//! | `fit` | refits the gates' spline approximations into `core/src/gate/splines.rs` |
//! | `bench [NAME...]` | builds the benchmarks in release and runs them (all when no name is given) |
//! | `accuracy` | the real decoders' full-model accuracy runs (HumanEval on Qwen2.5-Coder, Gemma 3's logits and teacher-forced passage); not in `ci` |
//! | `mcu` | builds the Cortex-M firmware (`examples/mcu`) and runs its checks under QEMU |

mod accuracy;
mod audit;
mod bench;
mod ci;
mod command;
mod ct;
mod cuda;
mod dudect;
mod fetch_model;
mod fit;
mod gpu_bundle;
mod mcu;
mod vectors;

use std::process::ExitCode;

use anyhow::{Result, bail};

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  ci              fmt, clippy, tests, doc tests, rustdoc, no_std build, mcu, fuzz smoke run, ct
  ct              constant-time check: secrets marked undefined under valgrind memcheck
  dudect          statistical timing test (Welch t, fixed vs random secrets); not in ci
  audit           cargo deny (licences, bans, sources) and core's no_std/no-unsafe properties
  vectors         regenerate tests/vectors/v1 and the firmware's examples/mcu/src/kat.rs
  accuracy        the real decoders' full-model accuracy runs: greedy and teacher-forced
                  top-1 against the float oracle, HumanEval's 164 problems on
                  Qwen2.5-Coder-0.5B (needs `fetch-model qwen2.5-coder-0.5b`); not in ci
  mcu             build examples/mcu and run it under qemu-system-arm: known answers,
                  one party's gate rounds, key parsing, stack high-water marks
  fit             refit the gates' splines into core/src/gate/splines.rs
  cuda-check [--write-ptx]
                  compile every CUDA kernel with NVRTC (sm_80, sm_90): registers, spills,
                  and the checked-in PTX up to date (needs `fetch-model nvrtc`)
  cuda-tsan       the emulated CUDA kernels under ThreadSanitizer, and its planted race
  gpu-bundle      build target/gpu-bundle: stripped binaries and run.sh, the GPU checks
                  to run on a lent GPU machine in one device call (docs/BACKENDS.md)
  fetch-model NAME  download a real checkpoint into models/ and verify it (names: minilm, smollm2, qwen2.5-coder-0.5b, gemma3-270m; also nvrtc, the CUDA compiler CI uses)
  bench [NAME..]  run benchmarks in release and write target/bench/NAME.json
                  (names: dcf, gates, linalg; all when none is given)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match dispatch(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("\nxtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(args: &[String]) -> Result<()> {
    let Some((command, rest)) = args.split_first() else {
        println!("{USAGE}");
        return Ok(());
    };
    let no_arguments = |name: &str| -> Result<()> {
        if rest.is_empty() {
            Ok(())
        } else {
            bail!("`{name}` takes no arguments (got {rest:?})\n\n{USAGE}")
        }
    };
    match command.as_str() {
        "ci" => no_arguments("ci").and_then(|()| ci::run()),
        "ct" => no_arguments("ct").and_then(|()| ct::run()),
        "dudect" => no_arguments("dudect").and_then(|()| dudect::run()),
        "audit" => no_arguments("audit").and_then(|()| audit::run()),
        "vectors" => no_arguments("vectors").and_then(|()| vectors::run()),
        "fit" => no_arguments("fit").and_then(|()| fit::run()),
        "mcu" => no_arguments("mcu").and_then(|()| mcu::run()),
        "accuracy" => no_arguments("accuracy").and_then(|()| accuracy::run()),
        "fetch-model" => fetch_model::run(rest),
        "cuda-check" => cuda::check(rest),
        "cuda-tsan" => no_arguments("cuda-tsan").and_then(|()| cuda::tsan()),
        "gpu-bundle" => no_arguments("gpu-bundle").and_then(|()| gpu_bundle::run()),
        "bench" => bench::run(rest),
        // What `bench` re-invokes in a release build; not for direct use.
        "bench-run" => bench::run_in_process(rest),
        "help" | "-h" | "--help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => bail!("unknown command `{other}`\n\n{USAGE}"),
    }
}
