//! `cargo xtask bench [NAME...]`: benchmarks, measured in release builds and
//! written as JSON to `target/bench/NAME.json`.
//!
//! `bench` re-runs this binary as `cargo run --release -p xtask -- bench-run`
//! when it was itself built without optimisations, so numbers never come
//! from a debug build. Benchmarks report; they assert nothing about time.

mod dcf;
mod e2e;
mod floors;
mod gates;
mod linalg;
mod lookup;
mod net;
mod relay;
mod serve;

use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::command::{self, cargo};

/// A benchmark: its name and the function that runs it and returns its
/// records as JSON text.
struct Bench {
    name: &'static str,
    about: &'static str,
    run: fn() -> Result<String>,
}

const BENCHES: &[Bench] = &[
    Bench {
        name: "dcf",
        about: "DCF evaluation against the AES and memory-bandwidth floors",
        run: dcf::run,
    },
    Bench {
        name: "gates",
        about: "every gate dealt and run by two parties, 128×3072 elements",
        run: gates::run,
    },
    Bench {
        name: "e2e",
        about: "secure inference through the suffuse binary: MiniLM at 17 and 128 tokens, BERT-base's and GPT-2's shapes at 128, SmolLM2 at 64 and 128",
        run: e2e::run,
    },
    Bench {
        name: "linalg",
        about: "matrix products mod 2^64 in transformer shapes, 1 and 2 threads",
        run: linalg::run,
    },
    Bench {
        name: "lookup",
        about: "full-domain DPF evaluation and the table lookup on it, L = 8 to 16 bits, against the AES floor",
        run: lookup::run,
    },
    Bench {
        name: "net",
        about: "BERT-base's shape at 128 tokens and SmolLM2 (prefill 64 + 8 decode passes) as three processes through delay-and-rate relays: zero delay, LAN (0.5 ms, 1 GB/s), WAN (4 ms, 400 MB/s)",
        run: net::run,
    },
    Bench {
        name: "serve",
        about: "the key-pool server under load: 100 MiniLM queries of 17 tokens, 4 concurrent clients, mutual TLS on loopback",
        run: serve::run,
    },
];

fn selected(names: &[String]) -> Result<Vec<&'static Bench>> {
    if names.is_empty() {
        return Ok(BENCHES.iter().collect());
    }
    names
        .iter()
        .map(|name| {
            BENCHES.iter().find(|b| b.name == name).with_context(|| {
                let known: Vec<String> = BENCHES
                    .iter()
                    .map(|b| format!("{} ({})", b.name, b.about))
                    .collect();
                format!("unknown benchmark `{name}`; known: {}", known.join(", "))
            })
        })
        .collect()
}

/// `cargo xtask bench`: makes sure the measurements run optimised.
pub fn run(names: &[String]) -> Result<()> {
    selected(names)?;
    if cfg!(debug_assertions) {
        command::run(
            cargo([
                "run",
                "--release",
                "--quiet",
                "-p",
                "xtask",
                "--",
                "bench-run",
            ])
            .args(names),
        )?;
        return Ok(());
    }
    run_in_process(names)
}

/// `bench-run`: runs the benchmarks in this process.
pub fn run_in_process(names: &[String]) -> Result<()> {
    let benches = selected(names)?;
    if cfg!(debug_assertions) {
        eprintln!("warning: this is a debug build; use `cargo xtask bench` for real numbers");
    }
    let out_dir = command::target_dir()?.join("bench");
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    for bench in benches {
        println!("== bench {}: {}", bench.name, bench.about);
        let start = Instant::now();
        let mut json = (bench.run)()?;
        json.push('\n');
        let path = out_dir.join(format!("{}.json", bench.name));
        std::fs::write(&path, json).with_context(|| format!("writing {}", path.display()))?;
        println!(
            "\nwrote {} ({:.1} s)",
            path.display(),
            start.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// Builds the `suffuse` binary in release and returns its path: the
/// end-to-end benches run it as a user would.
fn release_suffuse() -> Result<std::path::PathBuf> {
    command::run(&mut cargo([
        "build",
        "--release",
        "--quiet",
        "-p",
        "suffuse-host",
        "--bin",
        "suffuse",
    ]))?;
    Ok(command::target_dir()?.join("release/suffuse"))
}

/// Whether `name` is among the comma-separated names in environment
/// variable `var` (every name is, when it is unset).
fn chosen(var: &str, name: &str) -> bool {
    std::env::var(var)
        .ok()
        .is_none_or(|v| v.split(',').any(|c| c == name))
}

/// The `--model` argument of case `case`: a built-in name as it is, a
/// path under the workspace when that is there (`None`, said, when it is
/// not: `cargo xtask fetch-model` fetches it).
fn model_arg(case: &str, model: &str) -> Option<String> {
    if !model.contains('/') {
        return Some(model.to_string());
    }
    let dir = command::workspace_root().join(model);
    if !dir.exists() {
        println!(
            "{case}: {} is absent, skipped (`cargo xtask fetch-model` fetches it)",
            dir.display()
        );
        return None;
    }
    Some(dir.to_string_lossy().into_owned())
}

/// Runs `f` once to warm up, then `reps` times; returns the median seconds.
fn median_seconds(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    if reps == 0 {
        bail!("median of zero repetitions");
    }
    f()?;
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        f()?;
        times.push(start.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok(times[reps / 2])
}
