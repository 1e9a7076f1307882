//! `cargo xtask accuracy`: the real decoders' full-model accuracy runs,
//! too slow for CI (which runs each model's fixture checks, its logits on
//! one prompt and a two-layer slice secure against the reference).
//!
//! It runs the ignored tests of `tests/tests/qwen2.rs`: the fixture's
//! greedy continuations, teacher-forced top-1 over HumanEval/0, and over
//! all 164 HumanEval problems against `tests/fixtures/qwen2-humaneval.json`
//! (written by `tests/fixtures/make_qwen2.py --humaneval`), which also
//! writes its per-problem table to `target/accuracy/qwen2-humaneval.json`.
//! Each needs `cargo xtask fetch-model qwen2.5-coder-0.5b`; a missing model
//! fails here instead of skipping.

use anyhow::{Result, bail};

use crate::command::{self, cargo, workspace_root};

const QWEN2: &str = "models/Qwen2.5-Coder-0.5B-Instruct/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

pub fn run() -> Result<()> {
    if !workspace_root().join(QWEN2).exists() {
        bail!("{QWEN2} is absent: run `cargo xtask fetch-model qwen2.5-coder-0.5b` first");
    }
    command::run(&mut cargo([
        "test",
        "-p",
        "suffuse-tests",
        "--test",
        "qwen2",
        "--",
        "--ignored",
        "--nocapture",
        "--test-threads",
        "1",
    ]))?;
    Ok(())
}
