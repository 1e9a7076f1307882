//! all-MiniLM-L6-v2 against sentence-transformers: token ids and sentence
//! embeddings recorded in `fixtures/minilm.json` by the Python library.
//!
//! Runs only when `models/all-MiniLM-L6-v2` exists (`cargo xtask
//! fetch-model minilm`); otherwise it prints a note and passes.

// Tests: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::Instant;

use serde::Deserialize;
use suffuse_host::float;
use suffuse_host::model::{Activation, Model, Pooling};

#[derive(Deserialize)]
struct Fixture {
    max_seq_length: usize,
    sentences: Vec<Sentence>,
}

#[derive(Deserialize)]
struct Sentence {
    text: String,
    token_ids: Vec<u32>,
    embedding: Vec<f32>,
}

fn model_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/all-MiniLM-L6-v2")
}

fn load() -> Option<Model> {
    let dir = model_dir();
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
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/minilm.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

#[test]
fn minilm_config_is_read_from_the_folder() {
    let Some(model) = load() else { return };
    let c = &model.config;
    assert_eq!(model.name, "all-MiniLM-L6-v2");
    assert_eq!(
        (c.vocab_size, c.hidden, c.layers, c.heads, c.intermediate),
        (30522, 384, 6, 12, 1536)
    );
    assert_eq!((c.max_positions, c.type_vocab, c.max_tokens), (512, 2, 256));
    assert_eq!(c.ln_eps, 1e-12);
    assert_eq!(c.activation, Activation::GeluErf);
    assert_eq!(c.pooling, Pooling::Mean);
    assert!(c.normalize);
    assert_eq!(c.max_tokens, fixture().max_seq_length);
    let hex: String = model.digest().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        hex,
        "f8e54572e0049904a94200399252e534f748e19ba9da51f2ec95b53e53efbecb"
    );
}

#[test]
fn minilm_matches_sentence_transformers() {
    let Some(model) = load() else { return };
    let fixture = fixture();
    let batch: Vec<Vec<u32>> = fixture
        .sentences
        .iter()
        .map(|s| {
            let ids = model
                .tokenizer
                .encode(&s.text, model.config.max_tokens)
                .unwrap();
            assert_eq!(ids, s.token_ids, "token ids of {:?}", s.text);
            ids
        })
        .collect();
    // The short sentences as one padded batch (as sentence-transformers
    // ran them); the 256-token one alone, so the batch is not padded to it.
    let start = Instant::now();
    let (short, long): (Vec<usize>, Vec<usize>) =
        (0..batch.len()).partition(|&i| batch[i].len() <= 64);
    let mut embeddings = vec![Vec::new(); batch.len()];
    let short_batch: Vec<Vec<u32>> = short.iter().map(|&i| batch[i].clone()).collect();
    for (&i, e) in short
        .iter()
        .zip(float::embed(&model, &short_batch).unwrap())
    {
        embeddings[i] = e;
    }
    for &i in &long {
        embeddings[i] = float::embed(&model, std::slice::from_ref(&batch[i]))
            .unwrap()
            .remove(0);
    }
    eprintln!(
        "float reference: {} sentences in {:.0} ms",
        batch.len(),
        start.elapsed().as_secs_f64() * 1e3
    );
    for (s, got) in fixture.sentences.iter().zip(&embeddings) {
        let cos = cosine(got, &s.embedding);
        let worst = got
            .iter()
            .zip(&s.embedding)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        eprintln!("cosine {cos:.9}, max |Δ| {worst:.2e}: {:.40}", s.text);
        assert!(cos >= 0.9999, "cosine {cos} for {:?}", s.text);
    }
}

#[test]
fn minilm_round_trips_through_write_dir() {
    let Some(model) = load() else { return };
    let tmp = std::env::temp_dir().join(format!("suffuse-minilm-{}", std::process::id()));
    let dir = tmp.join(&model.name);
    model.write_dir(&dir).unwrap();
    let again = Model::load(&dir);
    let _ = std::fs::remove_dir_all(&tmp);
    let again = again.unwrap();
    assert!(again == model);
    assert_eq!(again.digest(), model.digest());
}
