//! A real OpenAI client against `suffuse gateway`: the `openai` Python
//! package, at a pinned version, installed into a temporary venv, runs a
//! streamed chat on `tiny-llama`, a plain completion and an embedding on
//! `demo`, through the gateway to two pool servers per model over mutual
//! TLS. The chat's text must be `suffuse generate`'s for the same seed, the
//! embedding `suffuse embed`'s vector.
//!
//! It needs python3 with venv and pip reaching PyPI. Without them it fails;
//! outside CI, `SUFFUSE_SKIP_OPENAI=1` skips it with a line saying so
//! (`CI=true` ignores that and runs it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use serde_json::Value;

#[path = "gateway/stack.rs"]
#[allow(dead_code)]
mod stack;

use stack::{DECODER_KEYS, Pair, SEED, gateway, generated, pool, run, setup};

/// The `openai` package's version, pinned.
const OPENAI: &str = "openai==1.109.1";

fn skipped() -> bool {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let skip = std::env::var("SUFFUSE_SKIP_OPENAI").is_ok_and(|v| v == "1");
    if skip && !ci {
        eprintln!("SUFFUSE_SKIP_OPENAI=1: the openai-package test is skipped");
    }
    skip && !ci
}

/// A venv in `dir` with the pinned package; pip is tried three times, as a
/// registry hiccup should not fail the run, and then the test fails.
fn venv(dir: &Path) -> std::path::PathBuf {
    let venv = dir.join("venv");
    let made = Command::new("python3")
        .arg("-m")
        .arg("venv")
        .arg(&venv)
        .status();
    assert!(
        made.is_ok_and(|s| s.success()),
        "python3 -m venv failed: python3 with venv is needed"
    );
    let pip = venv.join("bin/pip");
    for attempt in 1..=3 {
        let st = Command::new(&pip)
            .args(["install", "--quiet", "--disable-pip-version-check", OPENAI])
            .status()
            .unwrap();
        if st.success() {
            return venv.join("bin/python");
        }
        eprintln!("pip install {OPENAI} failed (attempt {attempt})");
        std::thread::sleep(std::time::Duration::from_secs(10));
    }
    panic!("pip could not install {OPENAI}: this test needs PyPI");
}

#[test]
fn the_openai_package_streams_completes_and_embeds_through_the_gateway() {
    if skipped() {
        return;
    }
    let dir = setup("openai");
    let python = venv(&dir);

    // What the CLI gives for the same requests.
    let (expected, ids) = generated(&dir, "hi there");
    let ids = ids.len();
    let text = "Two servers compute on secret shares.";
    let line: Value =
        serde_json::from_slice(&run(&["embed", "--model", "demo", text]).stdout).unwrap();
    let seq = line["tokens"].to_string();

    let llama = pool(&dir, "llama", "tiny-llama", 3, &DECODER_KEYS);
    let demo = pool(&dir, "demo", "demo", 2, &["--seq", &seq]);
    let llama = Pair::start(&dir, "llama", "tiny-llama", &llama, &[]);
    let demo = Pair::start(&dir, "demo", "demo", &demo, &[]);
    let gw = gateway(
        &dir,
        &[("tiny-llama", &llama.servers()), ("demo", &demo.servers())],
        &[],
    );

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gateway/openai_client.py");
    let base = format!("http://{}/v1", gw.addr());
    let out = Command::new(python)
        .arg(script)
        .args([&base, text, &SEED.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the openai client failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();

    assert_eq!(got["stream_text"], expected.as_str());
    // A chunk per token, and the last with the reason and usage.
    assert_eq!(got["stream_chunks"], ids + 1);
    assert_eq!(got["stream_completion_tokens"], ids);
    assert_eq!(got["completion_finish"], "length");
    assert_eq!(got["completion_tokens"], 4);
    assert!(got["completion_text"].is_string());
    // The package decodes base64 f32s into Python floats: compared as f32.
    let f32s = |v: &Value| -> Vec<f32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect()
    };
    assert_eq!(f32s(&got["embedding"]), f32s(&line["embedding"]));
    assert_eq!(got["models"], serde_json::json!(["tiny-llama", "demo"]));
}
