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
//! - `tests/tests/gemma3.rs`: teacher-forced top-1 over all 164 HumanEval
//!   problems against `tests/fixtures/gemma3-humaneval.json` (written by
//!   `tests/fixtures/gemma3_forward.py --humaneval-only`), per problem to
//!   `target/accuracy/gemma3-humaneval.json`. Its whole-model logits on one
//!   prompt and its teacher-forced passage run in CI since they pass.
//!
//! Each needs its model (`cargo xtask fetch-model NAME`); a missing model
//! fails here instead of skipping.

use anyhow::{Result, bail};

use crate::command::{self, cargo, workspace_root};

/// Test file, model file, `fetch-model` name.
const MODELS: [(&str, &str, &str); 2] = [
    (
        "qwen2",
        "models/Qwen2.5-Coder-0.5B-Instruct/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "qwen2.5-coder-0.5b",
    ),
    (
        "gemma3",
        "models/gemma-3-270m/gemma-3-270m-q4_k_m.gguf",
        "gemma3-270m",
    ),
];

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
