//! Qwen2.5-Coder-0.5B-Instruct's GGUF (`qwen2`: Llama's block with Q/K/V
//! biases and rotate-half RoPE) against code that shares none with ours,
//! recorded in `tests/fixtures/qwen2.json` by `tests/fixtures/make_qwen2.py`:
//! token ids from the script's own byte-level BPE with llama.cpp's `qwen2`
//! expression, the chat prompt rendered by jinja2, tensors dequantized by
//! the `gguf` package, and a numpy float64 forward pass.
//!
//! Runs only when `models/Qwen2.5-Coder-0.5B-Instruct` exists (`cargo
//! xtask fetch-model qwen2.5-coder-0.5b`, which `.ci/run` does); otherwise
//! it prints a note and passes. The full HumanEval comparison is `cargo
//! xtask accuracy`'s, not CI's.

#![allow(clippy::unwrap_used)]

use serde::Deserialize;
use suffuse_host::fixed::decode;
use suffuse_host::generate::{self, Sampling};
use suffuse_host::model::gguf::Gguf;
use suffuse_host::model::{Decoder, RopeStyle};
use suffuse_host::plan::decoder::{self as planner, Generation};
use suffuse_host::session;
use suffuse_tests::decoders::{self, Fixture, MARGIN, TeacherForced};

#[derive(Deserialize)]
struct Qwen2 {
    #[serde(flatten)]
    common: Fixture,
    logits: Logits,
    teacher_forced: TeacherForced,
}

/// The float logits of the last row of one prompt, the largest first.
#[derive(Deserialize)]
struct Logits {
    prompt_ids: Vec<u32>,
    top_ids: Vec<u32>,
    top_logits: Vec<f64>,
}

const NAME: &str = "Qwen2.5-Coder-0.5B-Instruct";

fn fixture() -> Qwen2 {
    decoders::fixture("qwen2.json")
}

fn load() -> Option<Gguf> {
    decoders::gguf(
        "Qwen2.5-Coder-0.5B-Instruct/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "qwen2.5-coder-0.5b",
    )
}

fn model() -> Option<Decoder> {
    Some(Decoder::from_gguf(&load()?, NAME).unwrap())
}

/// The adapter reads the shape the issue states: 24 layers of width 896,
/// 14 query and 2 key/value heads, RoPE θ = 10⁶ on halves, biases on Q, K
/// and V only, and an untied head.
#[test]
fn decoder_from_gguf_has_qwen2s_shape() {
    let Some(m) = model() else { return };
    assert_eq!(decoders::shape(&m), [24, 896, 4864, 14, 2, 64]);
    let c = &m.config;
    assert_eq!(c.vocab_size, 151_936);
    assert_eq!((c.rope_theta, c.rope_style), (1e6, RopeStyle::RotateHalf));
    assert!(!c.tied_head && m.lm_head.is_some());
    let l = &m.layers[0];
    for lin in [&l.query, &l.key, &l.value] {
        assert!(lin.b.iter().any(|b| *b != 0.0));
    }
    for lin in [&l.attn_out, &l.up, &l.down] {
        assert!(lin.b.iter().all(|b| *b == 0.0));
    }
}

#[test]
fn token_ids_equal_independent_bpe() {
    let Some(m) = model() else { return };
    let f = fixture();
    decoders::check_token_ids(&m, &f.common);
    let tf = &f.teacher_forced;
    assert_eq!(
        m.tokenizer.encode(&tf_text(&m, tf), usize::MAX).unwrap(),
        tf.ids
    );
}

/// The teacher-forced text, decoded from its ids (the fixture keeps ids).
fn tf_text(m: &Decoder, tf: &TeacherForced) -> String {
    m.tokenizer.decode(&tf.ids).unwrap()
}

suffuse_tests::fixture_checks!(load(), fixture().common);

/// The whole model in fixed point on one prompt: the last row's logits of
/// the float oracle's 32 best tokens are within [`LOGIT_TOLERANCE`] of
/// ours, and the best token is the same.
#[test]
fn fixed_point_logits_are_close_to_the_float_oracles() {
    let Some(m) = model() else { return };
    let l = fixture().logits;
    let g = Generation {
        prompt: planner::bucket(l.prompt_ids.len(), 2048),
        steps: 0,
    };
    let plan = planner::build(&m, g).unwrap();
    let la = suffuse_host::backend::auto();
    let layout = generate::Layout::of(&plan);
    let mut next = |pass: usize, _: &[Vec<u64>]| {
        (pass == 0).then(|| generate::prefill_inputs(&m, &layout, &l.prompt_ids).unwrap())
    };
    let rows = suffuse_host::reference::run_passes(&plan, &mut next, la).unwrap();
    let ours: Vec<f64> = rows[0]
        .iter()
        .map(|v| decode(*v, layout.logit_scale))
        .collect();
    let mut worst = 0.0f64;
    for (t, want) in l.top_ids.iter().zip(&l.top_logits) {
        worst = worst.max((ours[*t as usize] - want).abs());
    }
    let best = (0..ours.len())
        .max_by(|a, b| ours[*a].total_cmp(&ours[*b]))
        .unwrap();
    eprintln!("largest logit difference over the float top-32: {worst:.4}");
    assert!(worst <= LOGIT_TOLERANCE, "{worst}");
    assert_eq!(best as u32, l.top_ids[0]);
}

/// How far a fixed-point logit may sit from the float one, measured
/// (see `docs/DECODERS.md`) with room to spare.
const LOGIT_TOLERANCE: f64 = 0.25;

/// The first two blocks of the real model, through dealer, both servers
/// (loopback TCP) and client: every pass equals the fixed-point
/// reference bit for bit.
#[test]
fn a_two_layer_slice_runs_securely_bit_exact() {
    let Some(mut m) = model() else { return };
    m.layers.truncate(2);
    m.config.layers = 2;
    let l = fixture().logits;
    let out = session::generate(
        &m,
        &l.prompt_ids,
        2,
        Sampling::default(),
        &decoders::patient(),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(out.report.bit_exact, Some(true), "not bit-exact");
    assert_eq!(out.outcome.generated.tokens.len(), 2);
}

/// The fixture's greedy continuations (the chat question, a HumanEval
/// prompt), compared as far as the float margins are decisive.
#[test]
#[ignore = "2–4 minutes on 2 cores (142.5 s in CI on 2026-11-29, 235 s on 2026-11-28): cargo xtask accuracy, and xtask ci's sampled accuracy step"]
fn greedy_tokens_equal_the_float_oracle() {
    let Some(m) = model() else { return };
    decoders::check_greedy(&m, &fixture().common);
}

/// Teacher-forced top-1 over HumanEval/0 (prompt and canonical solution):
/// at least 99 % equal the float top-1, and every miss is at a margin
/// below [`MARGIN`].
#[test]
#[ignore = "under a minute on 2 cores (43.3 s in CI, 2026-11-29): cargo xtask accuracy, and xtask ci's sampled accuracy step"]
fn teacher_forced_top1_agrees_with_the_float_oracle() {
    let Some(m) = model() else { return };
    let tf = fixture().teacher_forced;
    let n = tf.top1.len();
    let (agree, decisive, _) = decoders::top1_agreement(&m, &tf);
    eprintln!("teacher-forced top-1: {agree}/{n}; {decisive} misses at margin ≥ {MARGIN}");
    assert!(agree * 100 >= n * 99, "{agree}/{n}");
    assert_eq!(decisive, 0);
}

/// Teacher-forced top-1 over every HumanEval problem's prompt and
/// canonical solution (`fixtures/qwen2-humaneval.json`): at least 99 %
/// of all positions equal the float top-1. Each problem's agreement and
/// every miss (position, both tokens, the float margin) go to
/// `target/accuracy/qwen2-humaneval.json`; `SUFFUSE_HUMANEVAL_PROBLEMS=N`
/// runs the first N problems only.
#[test]
#[ignore = "32 minutes on 2 cores (1,893 s, 2026-11-28): cargo xtask accuracy runs it; CI runs HumanEval/0 through the teacher-forced test above instead (first-N subsets may fall under the 99 %: the first 8 gave 1,132 of 1,145 before RoPE was folded into the weights, 1,138 after, and 1,135 since the norms' gains are folded too, 2026-11-29)"]
fn humaneval_teacher_forced_top1_agrees_with_the_float_oracle() {
    let m = model().expect("cargo xtask fetch-model qwen2.5-coder-0.5b");
    let (agree, total, _) = decoders::humaneval(&m, "qwen2", NAME);
    assert!(agree * 100 >= total * 99, "{agree}/{total}");
}
