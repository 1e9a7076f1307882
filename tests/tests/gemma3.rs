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
