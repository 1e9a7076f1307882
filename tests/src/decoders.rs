//! What the real-decoder tests (`tests/smollm2.rs`, `tests/qwen2.rs`) share:
//! the float-oracle fixtures that `fixtures/make_*.py` write, the checks
//! that run against any of them, and the fixed-point decoder run in the
//! clear (the reference the secure run equals bit for bit).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use suffuse_host::generate::{self, Sampling};
use suffuse_host::model::Decoder;
use suffuse_host::model::chat::ChatTemplate;
use suffuse_host::model::gguf::Gguf;
use suffuse_host::net::Timeouts;
use suffuse_host::plan::decoder::{self as planner, Generation};
use suffuse_host::reference::{self, PassInputs};
use suffuse_host::session::Options;

/// Greedy steps whose float top-1 margin (logit of the best token minus
/// the second's) is below this may go either way in fixed point; the
/// comparison stops at the first such step. Fixed point against f64 moved
/// logits by up to 0.06 on the generated decoders (`decoder_folders.rs`);
/// 0.1 leaves a little room over that.
pub const MARGIN: f64 = 0.1;

/// A fixture's common part.
#[derive(Deserialize)]
pub struct Fixture {
    /// SHA-256 of tensors dequantized by the `gguf` package, little-endian f32.
    pub dequantized_sha256: BTreeMap<String, String>,
    /// Texts and their token ids.
    pub tokenizer: Vec<Case>,
    /// One user message and the prompt the template renders for it.
    pub chat_prompt: ChatPrompt,
    /// Greedy continuations.
    pub greedy: Vec<Greedy>,
}

/// A text and its ids.
#[derive(Deserialize)]
pub struct Case {
    /// The text.
    pub text: String,
    /// Its ids.
    pub ids: Vec<u32>,
}

/// A chat prompt.
#[derive(Deserialize)]
pub struct ChatPrompt {
    /// The user's message.
    pub user: String,
    /// The template's rendering.
    pub rendered: String,
}

/// A greedy continuation by the float oracle.
#[derive(Deserialize)]
pub struct Greedy {
    /// What kind of prompt.
    pub kind: String,
    /// The prompt text.
    pub prompt: String,
    /// Its ids.
    pub prompt_ids: Vec<u32>,
    /// The tokens generated.
    pub new_ids: Vec<u32>,
    /// The top-1 margin at each step.
    pub top1_margins: Vec<f64>,
    /// The tokens' text.
    pub text: String,
}

/// Teacher-forced top-1 over a text.
#[derive(Deserialize)]
pub struct TeacherForced {
    /// The text's ids.
    pub ids: Vec<u32>,
    /// The float top-1 after each prefix `ids[..=i]`.
    pub top1: Vec<u32>,
    /// Its margins.
    pub top1_margins: Vec<f64>,
}

/// A fixture file under `tests/fixtures/`.
pub fn fixture<T: for<'a> Deserialize<'a>>(name: &str) -> T {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name);
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// The GGUF file at `models/<rel>`, or `None` with a note when it was not
/// fetched (`cargo xtask fetch-model <name>`).
pub fn gguf(rel: &str, name: &str) -> Option<Gguf> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models")
        .join(rel);
    if !path.exists() {
        eprintln!(
            "note: {} is absent; skipping (run `cargo xtask fetch-model {name}`)",
            path.display()
        );
        return None;
    }
    Some(Gguf::open(&path).unwrap())
}

/// Every tokenizer case and every greedy prompt tokenizes to the
/// fixture's ids.
pub fn check_token_ids(m: &Decoder, f: &Fixture) {
    let prompts = f.greedy.iter().map(|p| (&p.prompt, &p.prompt_ids));
    let cases = f.tokenizer.iter().map(|c| (&c.text, &c.ids)).chain(prompts);
    for (text, ids) in cases {
        assert_eq!(
            &m.tokenizer.encode(text, usize::MAX).unwrap(),
            ids,
            "{text:?}"
        );
    }
}

/// The chat template renders the fixture's prompt.
pub fn check_chat_prompt(g: &Gguf, f: &Fixture) {
    let template = ChatTemplate::from_gguf(g).unwrap().unwrap();
    assert_eq!(
        template.user_prompt(&f.chat_prompt.user).unwrap(),
        f.chat_prompt.rendered
    );
}

/// Our dequantization equals the `gguf` package's, bit for bit.
pub fn check_dequantization(g: &Gguf, f: &Fixture) {
    for (name, want) in &f.dequantized_sha256 {
        let values = g.dequantize(name).unwrap();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let got: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(&got, want, "{name}");
    }
}

/// The fixed-point greedy tokens of every fixture prompt equal the float
/// ones until the first step whose float margin is below [`MARGIN`].
pub fn check_greedy(m: &Decoder, f: &Fixture) {
    let la = suffuse_host::backend::auto();
    for p in &f.greedy {
        let cut = p
            .top1_margins
            .iter()
            .position(|m| *m < MARGIN)
            .unwrap_or(p.new_ids.len());
        // Tokens past the first indecisive margin are not compared, so
        // they are not generated either.
        let g = Generation {
            prompt: planner::bucket(p.prompt_ids.len(), 2048),
            steps: cut.max(1) - 1,
        };
        let plan = planner::build(m, g).unwrap();
        let out = generate::reference(m, &plan, &p.prompt_ids, Sampling::default(), la).unwrap();
        eprintln!(
            "{}: compared {cut} of {} tokens; fixed point {:?}",
            p.kind,
            p.new_ids.len(),
            m.tokenizer.decode(&out.tokens).unwrap_or_default()
        );
        assert!(out.tokens.len() >= cut, "{}", p.kind);
        assert_eq!(out.tokens[..cut], p.new_ids[..cut], "{}", p.kind);
    }
}

/// The fixed-point logits after each prefix `ids[..=i]`, `i < n`, with
/// their scale: one scoring pass ([`planner::build_scoring`]) over the
/// first `n` tokens, left-padded to their bucket, every row's logits.
pub fn teacher_forced_logits(m: &Decoder, ids: &[u32], n: usize) -> (Vec<Vec<u64>>, u32) {
    let la = suffuse_host::backend::auto();
    let bucket = planner::bucket(n, usize::MAX);
    let plan = planner::build_scoring(m, bucket).unwrap();
    let layout = generate::Layout::of(&plan);
    let mut next = |pass: usize, _: &[Vec<u64>]| -> Option<PassInputs> {
        (pass == 0).then(|| generate::prefill_inputs(m, &layout, &ids[..n]).unwrap())
    };
    let out = reference::run_passes(&plan, &mut next, la).unwrap();
    let vocab = m.config.vocab_size;
    let rows = out[0].chunks_exact(vocab).skip(bucket - n);
    (rows.map(<[u64]>::to_vec).collect(), layout.logit_scale)
}

/// How the fixed-point top-1 compares with the float one: positions
/// equal, and misses where the float margin was at least [`MARGIN`].
pub fn top1_agreement(m: &Decoder, tf: &TeacherForced) -> (usize, usize, Vec<u32>) {
    let n = tf.top1.len();
    let (logits, scale) = teacher_forced_logits(m, &tf.ids, n);
    assert_eq!(logits.len(), n);
    let mut sampler = generate::Sampler::new(Sampling::default());
    let ours: Vec<u32> = logits.iter().map(|l| sampler.pick(l, scale)).collect();
    let missed = misses(tf, &ours);
    let decisive = missed.iter().filter(|m| m.3 >= MARGIN).count();
    (n - missed.len(), decisive, ours)
}

/// Where `ours` (the fixed-point top-1 at each position) differs from the
/// float top-1: `(position, float token, our token, float margin)`.
pub fn misses(tf: &TeacherForced, ours: &[u32]) -> Vec<(usize, u32, u32, f64)> {
    (0..ours.len())
        .filter(|i| ours[*i] != tf.top1[*i])
        .map(|i| (i, tf.top1[i], ours[i], tf.top1_margins[i]))
        .collect()
}

/// A HumanEval fixture: the float teacher-forced top-1 of each problem.
#[derive(Deserialize)]
struct HumanEval {
    problems: Vec<Problem>,
}

#[derive(Deserialize)]
struct Problem {
    task_id: String,
    #[serde(flatten)]
    forced: TeacherForced,
}

/// Teacher-forced top-1 over every problem of `fixtures/{stem}-humaneval.json`
/// (`SUFFUSE_HUMANEVAL_PROBLEMS=N`: the first N), against `m` in fixed
/// point; each problem's agreement and every miss (position, both tokens,
/// the float margin) go to `target/accuracy/{stem}-humaneval.json`.
/// Returns the positions equal, all positions, and the misses at a float
/// margin of at least [`MARGIN`].
pub fn humaneval(m: &Decoder, stem: &str, model_name: &str) -> (usize, usize, usize) {
    let he: HumanEval = fixture(&format!("{stem}-humaneval.json"));
    let limit = std::env::var("SUFFUSE_HUMANEVAL_PROBLEMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(usize::MAX);
    let (mut agree, mut total, mut decisive) = (0, 0, 0);
    let mut table = Vec::new();
    // By bucket, so that each scoring plan (the encoded weights, GBs) is
    // built once and kept while its problems run.
    let mut problems: Vec<&Problem> = he.problems.iter().take(limit).collect();
    let bucket = |p: &Problem| planner::bucket(p.forced.top1.len(), usize::MAX);
    problems.sort_by_key(|p| bucket(p));
    let mut plan = None;
    for p in problems {
        let tf = &p.forced;
        if plan.as_ref().is_none_or(|(b, _)| *b != bucket(p)) {
            drop(plan.take()); // its weights go before the next plan's come
            plan = Some((bucket(p), planner::build_scoring(m, bucket(p)).unwrap()));
        }
        let (a, d, ours) = top1_agreement(m, tf);
        let missed: Vec<_> = misses(tf, &ours)
            .into_iter()
            .map(|(i, f, o, margin)| serde_json::json!([i, f, o, margin]))
            .collect();
        (agree, total, decisive) = (agree + a, total + ours.len(), decisive + d);
        eprintln!(
            "{}: {a}/{} ({d} at margin ≥ {MARGIN})",
            p.task_id,
            ours.len()
        );
        table.push(
            serde_json::json!({"task_id": p.task_id, "positions": ours.len(),
            "agree": a, "decisive_misses": d, "misses [position, float, ours, margin]": missed}),
        );
    }
    let report = serde_json::json!({"model": model_name, "problems": table.len(), "positions": total,
        "agree": agree, "decisive_misses": decisive, "per_problem": table});
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/accuracy");
    std::fs::create_dir_all(&dir).unwrap();
    let text = serde_json::to_string_pretty(&report).unwrap();
    std::fs::write(dir.join(format!("{stem}-humaneval.json")), text).unwrap();
    eprintln!(
        "HumanEval teacher-forced top-1: {agree}/{total}; {decisive} misses at margin ≥ {MARGIN}"
    );
    (agree, total, decisive)
}

/// Options for a real model's secure run in a test: the 30 s to connect
/// and 60 s of silence between frames that `Timeouts::default` allows do
/// not cover a server's start (its plan and key file) or a prefill pass
/// with a 150k-token head on 2 cores while the model's other tests (each
/// its own full reference) run beside it.
pub fn patient() -> Options {
    let long = std::time::Duration::from_secs(900);
    Options {
        timeouts: Timeouts {
            connect: long,
            io: long,
        },
        ..Options::default()
    }
}

/// A decoder's shape: layers, hidden, intermediate, heads, key/value heads,
/// head width.
pub fn shape(m: &Decoder) -> [usize; 6] {
    let c = &m.config;
    [
        c.layers,
        c.hidden,
        c.intermediate,
        c.heads,
        c.kv_heads,
        c.head_dim,
    ]
}

/// The checks every real decoder's fixture gets, as tests: `$load` gives
/// the GGUF file (or `None` when it was not fetched), `$common` the
/// fixture's [`Fixture`].
#[macro_export]
macro_rules! fixture_checks {
    ($load:expr, $common:expr) => {
        #[test]
        fn chat_prompt_equals_jinja2() {
            let Some(g) = $load else { return };
            $crate::decoders::check_chat_prompt(&g, &$common);
        }

        #[test]
        fn dequantization_equals_gguf_py() {
            let Some(g) = $load else { return };
            $crate::decoders::check_dequantization(&g, &$common);
        }
    };
}
