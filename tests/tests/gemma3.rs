//! Gemma 3 270M's tokenizer (`tokenizer.ggml.model = llama`, SentencePiece)
//! read from its GGUF file, against code that shares none with ours:
//! `tests/fixtures/gemma3_tokens.json`, written by
//! `tests/fixtures/make_gemma3_tokens.py`, an independent Python port of
//! llama.cpp's SPM tokenizer (which sentencepiece and a `tokenizers` BPE
//! spec both agreed with when it was written; see the script).
//!
//! Runs only when `models/gemma-3-270m` exists (`cargo xtask fetch-model
//! gemma3-270m`); otherwise it prints a note and passes. The fixture's own
//! shape is checked either way.

#![allow(clippy::unwrap_used)]

use std::time::Instant;

use serde::Deserialize;
use suffuse_host::model::Tokenizer;
use suffuse_tests::decoders::{self, Case};

#[derive(Deserialize)]
struct Fixture {
    model: String,
    add_bos: bool,
    cases: Vec<Case>,
}

const BOS: u32 = 2;
const CHAT: &str = "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n";

fn fixture() -> Fixture {
    decoders::fixture("gemma3_tokens.json")
}

/// The tokenizer of the GGUF file, and how long building it took.
fn load() -> Option<Tokenizer> {
    let g = decoders::gguf("gemma-3-270m/gemma-3-270m-q4_k_m.gguf", "gemma3-270m")?;
    let start = Instant::now();
    let t = Tokenizer::from_gguf(&g).unwrap();
    eprintln!("Gemma 3 tokenizer built in {:?}", start.elapsed());
    Some(t)
}

/// Every text of the fixture tokenizes to the Python SPM's ids, BOS first.
#[test]
fn token_ids_equal_the_independent_spm() {
    let Some(t) = load() else { return };
    for c in &fixture().cases {
        assert_eq!(
            t.encode(&c.text, usize::MAX).unwrap(),
            c.ids,
            "{:?}",
            c.text
        );
    }
}

/// Decoding the ids after BOS gives each text back: byte-fallback tokens
/// fuse into UTF-8, `▁` becomes a space, control tokens are written out.
#[test]
fn decoding_the_ids_gives_the_text_back() {
    let Some(t) = load() else { return };
    for c in &fixture().cases {
        assert_eq!(t.decode(&c.ids[1..]).unwrap(), c.text);
    }
}

/// The vocabulary as the file states it: 262,144 tokens, BOS 2 written
/// once, the turn markers single control tokens.
#[test]
fn tokenizer_has_gemma3s_vocabulary() {
    let Some(t) = load() else { return };
    assert_eq!((t.id_bound(), t.special_token_count()), (262_144, 1));
    assert_eq!(t.token_id("<bos>"), Some(BOS));
    let sot = t.token_id("<start_of_turn>").unwrap();
    let eot = t.token_id("<end_of_turn>").unwrap();
    let ids = t.encode(CHAT, usize::MAX).unwrap();
    assert_eq!((ids[0], ids[1], ids[5]), (BOS, sot, eot));
    assert_eq!(ids.iter().filter(|&&id| id == sot).count(), 2);
}

/// What the tests above rely on: the kinds of text, BOS first in
/// every case, and at least one text that needs byte fallback.
#[test]
fn fixture_has_the_texts_the_tests_need() {
    let f = fixture();
    assert_eq!(f.model, "gemma-3-270m-q4_k_m.gguf");
    assert!(f.add_bos);
    assert!(f.cases.len() >= 12);
    assert!(f.cases.iter().all(|c| c.ids.first() == Some(&BOS)));
    let has = |p: fn(&str) -> bool| f.cases.iter().any(|c| p(&c.text));
    assert!(has(|t| t == CHAT));
    assert!(has(|t| t.contains("   ")) && has(|t| t.contains('\t')));
    assert!(has(|t| t.contains('é')) && has(|t| t.contains('語')));
    assert!(has(|t| t.contains('🦀')) && has(|t| t.contains("def ")));
    assert!(has(str::is_empty));
    // Byte tokens are ids 238–493 in Gemma 3's vocabulary.
    assert!(
        f.cases
            .iter()
            .any(|c| c.ids.iter().any(|id| (238..494).contains(id)))
    );
}

mod model {
    //! The whole decoder from the GGUF file (`gguf/gemma3.rs`) against the
    //! numpy float forward of `tests/fixtures/gemma3_forward.py`
    //! (`fixtures/gemma3.json`), and a two-layer slice secure against the
    //! fixed-point reference.

    use super::*;
    use suffuse_host::fixed::decode;
    use suffuse_host::generate::{self, Sampling};
    use suffuse_host::model::Decoder;
    use suffuse_host::plan::decoder::{self as planner, Generation};
    use suffuse_host::session;

    #[derive(Deserialize)]
    struct Oracle {
        logits: Logits,
        teacher_forced: decoders::TeacherForced,
    }

    #[derive(Deserialize)]
    struct Logits {
        prompt_ids: Vec<u32>,
        top_ids: Vec<u32>,
        top_logits: Vec<f64>,
    }

    fn model() -> Option<Decoder> {
        let g = decoders::gguf("gemma-3-270m/gemma-3-270m-q4_k_m.gguf", "gemma3-270m")?;
        Some(Decoder::from_gguf(&g, "gemma-3-270m").unwrap())
    }

    /// 18 layers of width 640, 4 query heads and one key/value head of
    /// 256, MLP 2,048; five local layers (window 512, base 10⁴) to one
    /// global (base 10⁶); √640 on the embeddings; a tied head.
    #[test]
    fn decoder_from_gguf_has_gemma3s_shape() {
        let Some(m) = model() else { return };
        assert_eq!(decoders::shape(&m), [18, 640, 2048, 4, 1, 256]);
        let c = &m.config;
        assert_eq!(c.vocab_size, 262_144);
        assert_eq!(c.attention_of(4), (Some(512), 10_000.0));
        assert_eq!(c.attention_of(5), (None, 1e6));
        assert_eq!(c.block.embed_scale, Some(640f32.sqrt()));
        assert!(c.tied_head && m.layers.iter().all(|l| l.qk_norm.is_some()));
    }

    /// The whole model in fixed point on one prompt: the float oracle's 32
    /// best logits of the last row are within 0.13 of ours, and the best
    /// token is the same. Gemma's residual stream reaches ‖y‖ ≈ 1.0·10⁵ (one
    /// channel of the first row), within the norms' checked capacity of
    /// about 1.8·10⁵ (`docs/DECODERS.md`, "Gemma 3 270M"). The largest
    /// difference was 0.62 while the sandwich norms took their inputs at
    /// FRAC, 0.12 once they took them at 2^-18, and 0.064 since the blocks'
    /// last products take their inputs at 2^-18 too and the GeLU is the
    /// fine one.
    #[test]
    fn fixed_point_logits_are_close_to_the_float_oracles() {
        let Some(m) = model() else { return };
        let l = decoders::fixture::<Oracle>("gemma3.json").logits;
        let g = Generation {
            prompt: planner::bucket(l.prompt_ids.len(), 2048),
            steps: 0,
        };
        let plan = planner::build(&m, g).unwrap();
        let layout = generate::Layout::of(&plan);
        let mut next = |pass: usize, _: &[Vec<u64>]| {
            (pass == 0).then(|| generate::prefill_inputs(&m, &layout, &l.prompt_ids).unwrap())
        };
        let la = suffuse_host::backend::auto();
        let rows = suffuse_host::reference::run_passes(&plan, &mut next, la).unwrap();
        let ours: Vec<f64> = rows[0]
            .iter()
            .map(|v| decode(*v, layout.logit_scale))
            .collect();
        let worst = l
            .top_ids
            .iter()
            .zip(&l.top_logits)
            .map(|(t, want)| (ours[*t as usize] - want).abs())
            .fold(0.0f64, f64::max);
        let best = (0..ours.len())
            .max_by(|a, b| ours[*a].total_cmp(&ours[*b]))
            .unwrap();
        eprintln!("largest logit difference over the float top-32: {worst:.4}");
        assert!(worst <= 0.13, "{worst}");
        assert_eq!(best as u32, l.top_ids[0]);
    }

    /// Teacher-forced top-1 over the fixture's passage (48 positions): at
    /// least 98 % equal the float top-1, and every miss is at a float
    /// margin below [`decoders::MARGIN`].
    #[test]
    fn teacher_forced_top1_agrees_with_the_float_oracle() {
        let Some(m) = model() else { return };
        let tf = decoders::fixture::<Oracle>("gemma3.json").teacher_forced;
        let n = tf.top1.len();
        let (agree, decisive, ours) = decoders::top1_agreement(&m, &tf);
        for (i, f, o, margin) in decoders::misses(&tf, &ours) {
            eprintln!("miss at {i}: float {f}, ours {o}, float margin {margin}");
        }
        eprintln!("teacher-forced top-1: {agree}/{n}; {decisive} misses at margin ≥ 0.1");
        assert!(agree * 100 >= n * 98, "{agree}/{n}");
        assert_eq!(decisive, 0);
    }

    /// Teacher-forced top-1 over every HumanEval problem's prompt and
    /// canonical solution (`fixtures/gemma3-humaneval.json`, written by
    /// `gemma3_forward.py --humaneval-only`): at least 98 % of all
    /// positions equal the float top-1, as the issue asks of Gemma 3 on
    /// Qwen2's text. Per problem to `target/accuracy/gemma3-humaneval.json`;
    /// `SUFFUSE_HUMANEVAL_PROBLEMS=N` runs the first N problems only.
    #[test]
    #[ignore = "20 minutes on 2 cores (1,164 s, 2026-11-28): cargo xtask accuracy runs it; xtask ci its first 8 problems"]
    fn humaneval_teacher_forced_top1_agrees_with_the_float_oracle() {
        let m = model().expect("cargo xtask fetch-model gemma3-270m");
        let (agree, total, _) = decoders::humaneval(&m, "gemma3", "gemma-3-270m");
        assert!(agree * 100 >= total * 98, "{agree}/{total}");
    }

    /// The first two blocks through dealer, both servers and client:
    /// bit-exact on every pass.
    #[test]
    fn a_two_layer_slice_runs_securely_bit_exact() {
        let Some(mut m) = model() else { return };
        m.layers.truncate(2);
        m.config.layers = 2;
        let ids = decoders::fixture::<Oracle>("gemma3.json").logits.prompt_ids;
        let out = session::generate(
            &m,
            &ids,
            2,
            Sampling::default(),
            &decoders::patient(),
            &mut |_| {},
        )
        .unwrap();
        assert_eq!(out.report.bit_exact, Some(true), "not bit-exact");
    }
}
