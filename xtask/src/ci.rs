//! `cargo xtask ci`: every check, in order, stopping at the first failure.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::command::{self, NO_STD_TARGET, cargo, seconds};

/// Seconds each fuzz target runs in the smoke run.
const FUZZ_SECONDS_PER_TARGET: u32 = 15;

enum Outcome {
    Passed(Duration),
    Skipped(String),
}

struct Summary(Vec<(&'static str, Outcome)>);

impl Summary {
    fn print(&self, total: Duration) {
        eprintln!("\nci summary:");
        for (name, outcome) in &self.0 {
            match outcome {
                Outcome::Passed(d) => eprintln!("  {name:<28} ok        {:>8}", seconds(*d)),
                Outcome::Skipped(why) => eprintln!("  {name:<28} skipped   ({why})"),
            }
        }
        eprintln!("  {:<28} {:>18}", "total", seconds(total));
    }
}

pub fn run() -> Result<()> {
    let start = Instant::now();
    let mut summary = Summary(Vec::new());
    let result = run_steps(&mut summary);
    if let Err(e) = &result {
        summary.print(start.elapsed());
        eprintln!("  FAILED: {e:#}");
        return result;
    }
    summary.print(start.elapsed());
    eprintln!("\nci: all checks passed");
    Ok(())
}

fn run_steps(summary: &mut Summary) -> Result<()> {
    let mut step = |name: &'static str, f: &mut dyn FnMut() -> Result<Outcome>| -> Result<()> {
        eprintln!("\n==> {name}");
        let outcome = f().with_context(|| format!("ci step `{name}` failed"))?;
        summary.0.push((name, outcome));
        Ok(())
    };

    step("rustfmt", &mut || {
        passed(command::run(&mut cargo(["fmt", "--all", "--", "--check"])))
    })?;
    step("clippy -D warnings", &mut || {
        passed(command::run(&mut cargo([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ])))
    })?;
    step("tests", &mut || {
        let nextest = command::succeeds(&mut cargo(["nextest", "--version"]));
        let mut cmd = if nextest {
            cargo(["nextest", "run", "--workspace"])
        } else {
            eprintln!("cargo-nextest is not installed; using cargo test");
            cargo(["test", "--workspace"])
        };
        passed(command::run(&mut cmd))
    })?;
    step("slow accuracy tests, sampled", &mut sampled_accuracy)?;
    step("CUDA kernels under NVRTC", &mut || {
        let start = Instant::now();
        if !crate::cuda::nvrtc_present() {
            let why = "NVRTC is not fetched; `cargo xtask fetch-model nvrtc`".to_owned();
            if in_ci() {
                anyhow::bail!("{why} (.ci/run fetches it)");
            }
            return Ok(Outcome::Skipped(why));
        }
        crate::cuda::check(&[])?;
        Ok(Outcome::Passed(start.elapsed()))
    })?;
    step("CUDA races (ThreadSanitizer)", &mut || {
        let start = Instant::now();
        crate::cuda::tsan()?;
        Ok(Outcome::Passed(start.elapsed()))
    })?;
    step("doc tests", &mut || {
        passed(command::run(&mut cargo(["test", "--workspace", "--doc"])))
    })?;
    step("rustdoc -D warnings", &mut || {
        let mut cmd = cargo(["doc", "--workspace", "--no-deps"]);
        cmd.env("RUSTDOCFLAGS", "-D warnings");
        passed(command::run(&mut cmd))
    })?;
    step("no_std build of core", &mut || {
        let start = Instant::now();
        command::ensure_no_std_target()?;
        command::run(&mut cargo([
            "build",
            "-p",
            "suffuse-core",
            "--target",
            NO_STD_TARGET,
        ]))?;
        Ok(Outcome::Passed(start.elapsed()))
    })?;
    step("audit (cargo deny, core no_std)", &mut || {
        let start = Instant::now();
        if !require_in_ci("deny", "cargo-deny")? {
            return Ok(Outcome::Skipped("cargo-deny is not installed".into()));
        }
        crate::audit::run()?;
        Ok(Outcome::Passed(start.elapsed()))
    })?;
    step("firmware under QEMU (xtask mcu)", &mut firmware)?;
    step("fuzz smoke run", &mut fuzz_smoke)?;
    step("constant time (xtask ct)", &mut || {
        let start = Instant::now();
        crate::ct::run()?;
        Ok(Outcome::Passed(start.elapsed()))
    })?;
    Ok(())
}

fn passed(result: Result<Duration>) -> Result<Outcome> {
    result.map(Outcome::Passed)
}

/// The firmware's checks under QEMU. CI installs QEMU (`.ci/run`), so there
/// its absence is a failure; a developer without it gets a skip that says
/// how to install it.
fn firmware() -> Result<Outcome> {
    if !crate::mcu::qemu_available() {
        let why = format!(
            "{} is not installed; `apt-get install qemu-system-arm`",
            crate::mcu::QEMU
        );
        if in_ci() {
            anyhow::bail!("{why} (CI must run the firmware: .ci/run installs it)");
        }
        return Ok(Outcome::Skipped(why));
    }
    let start = Instant::now();
    crate::mcu::run()?;
    Ok(Outcome::Passed(start.elapsed()))
}

/// Whether this run is CI's (`CI` set and not `false`), where every tool
/// must be present: `.ci/run` installs them, so a missing one is a fault of
/// the run, not a reason to skip a check.
fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false")
}

/// Fails in CI when `cargo SUBCOMMAND` is missing; elsewhere it is fine,
/// and the caller decides whether to skip.
fn require_in_ci(subcommand: &str, package: &str) -> Result<bool> {
    let present = command::succeeds(&mut cargo([subcommand, "--version"]));
    if !present && in_ci() {
        anyhow::bail!("`cargo {subcommand}` is missing in CI: .ci/run installs {package}");
    }
    Ok(present)
}

/// Runs every fuzz target briefly. Outside CI it is skipped when cargo-fuzz
/// is not installed; in CI that is an error.
fn fuzz_smoke() -> Result<Outcome> {
    if !command::workspace_root().join("fuzz/Cargo.toml").is_file() {
        anyhow::bail!("fuzz/Cargo.toml is missing");
    }
    if !require_in_ci("fuzz", "cargo-fuzz")? {
        return Ok(Outcome::Skipped("cargo-fuzz is not installed".into()));
    }
    let start = Instant::now();
    let listed = command::capture(&mut cargo(["fuzz", "list"]))?;
    if !listed.status.success() {
        anyhow::bail!(
            "`cargo fuzz list` failed: {}",
            String::from_utf8_lossy(&listed.stderr)
        );
    }
    let targets: Vec<String> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect();
    if targets.is_empty() {
        return Ok(Outcome::Skipped(
            "`cargo fuzz list` shows no targets".into(),
        ));
    }
    let max_time = format!("-max_total_time={FUZZ_SECONDS_PER_TARGET}");
    let root = command::workspace_root();
    for target in &targets {
        // The working corpus (ignored by git) first, where libFuzzer writes;
        // the committed seeds (`fuzz/seeds/<target>`) are read as well, so a
        // fresh machine starts from the minimised corpus, not from nothing.
        // Absolute paths: cargo fuzz runs the target in `fuzz/`.
        let corpus = root.join("fuzz/corpus").join(target);
        let seeds = root.join("fuzz/seeds").join(target);
        std::fs::create_dir_all(&corpus)?;
        let mut cmd = cargo(["fuzz", "run", target, "--sanitizer", "none"]);
        cmd.arg(&corpus);
        if seeds.is_dir() {
            cmd.arg(&seeds);
        }
        // A memory limit that a reservation sized by a forged length (a
        // sparse key file, a lying frame or model header) would trip
        // (issue 27): 1 GiB resident, and no single allocation above it.
        let limits = ["-rss_limit_mb=1024", "-malloc_limit_mb=1024"];
        command::run(cmd.arg("--").arg(&max_time).args(limits))?;
    }
    eprintln!(
        "fuzzed {} target(s) for {FUZZ_SECONDS_PER_TARGET} s each: {}",
        targets.len(),
        targets.join(", ")
    );
    Ok(Outcome::Passed(start.elapsed()))
}

/// The ignored full-model accuracy tests (`cargo xtask accuracy`, 20 and 32
/// minutes for the two HumanEval runs), sampled so that CI runs each kind:
/// Gemma 3's HumanEval test over its first 8 problems (3 took 57 s),
/// Qwen2's teacher-forced HumanEval/0 and Qwen2's greedy fixtures (235 s:
/// each prompt generates only the tokens it compares). Qwen2's HumanEval
/// test is not sampled: its first 3–10 problems agree at 98.7–99.0 %,
/// under the whole set's 99 % it asserts.
fn sampled_accuracy() -> Result<Outcome> {
    let start = Instant::now();
    let root = command::workspace_root();
    for model in ["models/gemma-3-270m", "models/Qwen2.5-Coder-0.5B-Instruct"] {
        if !root.join(model).exists() {
            let why = format!("{model} is not fetched; `cargo xtask fetch-model`");
            if in_ci() {
                anyhow::bail!("{why} (.ci/run fetches it)");
            }
            return Ok(Outcome::Skipped(why));
        }
    }
    let mut gemma = cargo([
        "test",
        "-p",
        "suffuse-tests",
        "--test",
        "gemma3",
        "humaneval",
        "--",
        "--ignored",
    ]);
    gemma.env("SUFFUSE_HUMANEVAL_PROBLEMS", "8");
    command::run(&mut gemma)?;
    for test in [
        "teacher_forced_top1_agrees_with_the_float_oracle",
        "greedy_tokens_equal_the_float_oracle",
    ] {
        command::run(&mut cargo([
            "test",
            "-p",
            "suffuse-tests",
            "--test",
            "qwen2",
            test,
            "--",
            "--ignored",
            "--exact",
        ]))?;
    }
    Ok(Outcome::Passed(start.elapsed()))
}
