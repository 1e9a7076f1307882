//! `cargo xtask accuracy`: the real decoders' full-model accuracy runs,
//! too slow for CI (which runs each model's fixture checks, its logits on
//! one prompt and a two-layer slice secure against the reference).
//!
//! It runs the ignored tests of each model's test file, one test at a
//! time, and reports every model's outcome before it fails:
//! - `tests/tests/qwen2.rs`: the fixture's greedy continuations,
//!   teacher-forced top-1 over HumanEval/0, and over all 164 HumanEval
//!   problems against `tests/fixtures/qwen2-humaneval.json` (written by
//!   `tests/fixtures/make_qwen2.py --humaneval-only`), which also writes its
//!   per-problem table to `target/accuracy/qwen2-humaneval.json`
//!   (`SUFFUSE_HUMANEVAL_PROBLEMS=N` runs the first N);
//!
//! Gemma 3's whole-model logits on one prompt and teacher-forced top-1 over
//! the fixture's passage run in CI since they pass (under a minute; see
//! docs/DECODERS.md, "Gemma 3 270M").
//!
//! Each needs its model (`cargo xtask fetch-model NAME`); a missing model
//! fails here instead of skipping.

use anyhow::{Result, bail};

use crate::command::{self, cargo, workspace_root};

/// Test file, model file, `fetch-model` name.
const MODELS: [(&str, &str, &str); 1] = [(
    "qwen2",
    "models/Qwen2.5-Coder-0.5B-Instruct/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "qwen2.5-coder-0.5b",
)];

pub fn run() -> Result<()> {
    for (_, file, name) in MODELS {
        if !workspace_root().join(file).exists() {
            bail!("{file} is absent: run `cargo xtask fetch-model {name}` first");
        }
    }
    let mut failed = Vec::new();
    for (test, _, _) in MODELS {
        let args = [
            "test",
            "-p",
            "suffuse-tests",
            "--test",
            test,
            "--",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ];
        if let Err(e) = command::run(&mut cargo(args)) {
            eprintln!("accuracy: {test}: {e:#}");
            failed.push(test);
        }
    }
    if !failed.is_empty() {
        bail!("accuracy runs failed: {}", failed.join(", "));
    }
    Ok(())
}
