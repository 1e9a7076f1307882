//! Secure inference on the real all-MiniLM-L6-v2 checkpoint: bit-exact
//! against the fixed-point reference, and within cosine 0.995 of
//! sentence-transformers' own embeddings (`host/tests/fixtures/minilm.json`)
//! and of the f32 model.
//!
//! Runs only when `models/all-MiniLM-L6-v2` exists (`cargo xtask
//! fetch-model minilm`, which `.ci/run` does); otherwise it prints a note
//! and passes.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use serde::Deserialize;
use suffuse_host::model::Model;
use suffuse_host::report::cosine;
use suffuse_host::session::{self, Options};

/// The bar for every sentence.
const MIN_COSINE: f64 = 0.995;

#[derive(Deserialize)]
struct Fixture {
    sentences: Vec<Sentence>,
}

#[derive(Deserialize)]
struct Sentence {
    text: String,
    token_ids: Vec<u32>,
    embedding: Vec<f32>,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn load() -> Option<Model> {
    let dir = root().join("models/all-MiniLM-L6-v2");
    if !dir.exists() {
        eprintln!(
            "note: {} is absent; skipping (run `cargo xtask fetch-model minilm`)",
            dir.display()
        );
        return None;
    }
    Some(Model::load(&dir).unwrap())
}

fn fixture() -> Fixture {
    let path = root().join("host/tests/fixtures/minilm.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn minilm_padded_batch_matches_sentence_transformers() {
    let Some(model) = load() else { return };
    // Four sentences of 12, 12, 19 and 3 tokens share one padded batch of 19.
    let fixture = fixture();
    let sentences: Vec<&Sentence> = fixture
        .sentences
        .iter()
        .filter(|s| s.token_ids.len() < 64)
        .collect();
    assert!(sentences.len() >= 4);
    let batch: Vec<Vec<u32>> = sentences
        .iter()
        .map(|s| {
            let ids = model
                .tokenizer
                .encode(&s.text, model.config.max_tokens)
                .unwrap();
            assert_eq!(ids, s.token_ids, "{}", s.text);
            ids
        })
        .collect();
    let lengths: Vec<usize> = batch.iter().map(Vec::len).collect();
    assert!(lengths.iter().any(|&l| l != lengths[0]), "{lengths:?}");

    let out = session::run(&model, &batch, &Options::default()).unwrap();
    assert_eq!(out.report.bit_exact, Some(true));
    for (s, got) in sentences.iter().zip(&out.embeddings) {
        let c = cosine(&s.embedding, got);
        assert!(
            c >= MIN_COSINE,
            "cosine {c} to sentence-transformers for {:?}",
            s.text
        );
    }
    for &c in &out.report.cosine_to_float_each {
        assert!(c >= MIN_COSINE, "cosine {c} to the f32 model");
    }
}

#[test]
fn minilm_at_128_tokens_is_bit_exact_and_close_to_float() {
    let Some(model) = load() else { return };
    let fixture = fixture();
    let long = fixture
        .sentences
        .iter()
        .find(|s| s.token_ids.len() >= 128)
        .unwrap();
    let ids = model.tokenizer.encode(&long.text, 128).unwrap();
    assert_eq!(ids.len(), 128);
    let out = session::run(&model, &[ids], &Options::default()).unwrap();
    assert_eq!(out.report.bit_exact, Some(true));
    let c = out.report.cosine_to_float.unwrap();
    assert!(c >= MIN_COSINE, "cosine {c} to the f32 model");
    eprintln!(
        "MiniLM 128 tokens: online {:.2} s, keygen {:.2} s, keys {} B/party, comm {} B/party, {} rounds, cosine {c:.5}",
        out.report.online_s,
        out.report.keygen_s,
        out.report.key_bytes_per_party[0],
        out.report.comm_bytes_per_party[0],
        out.report.rounds
    );
}
