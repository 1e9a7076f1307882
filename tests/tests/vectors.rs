//! The committed known-answer vectors still describe this build.

// Tests: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use suffuse_core::batch::{BatchEval, Serial};
use suffuse_core::fss::{KeyBatch, Party};
use suffuse_core::prg::FixedKeyAes;
use suffuse_tests::reference;
use suffuse_tests::vectors::{self, Vector, VectorFile};

const REGENERATE: &str = "If the DCF/DPF construction changed on purpose (hashes, key layout, \
     generation or evaluation), run `cargo xtask vectors` and commit tests/vectors; \
     bump the version folder when keys dealt before the change can no longer be read. \
     Otherwise this is a regression.";

fn committed_text() -> String {
    let path = vectors::file_path(&vectors::default_dir());
    std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e}. Run `cargo xtask vectors` to create it.",
            path.display()
        )
    })
}

fn committed() -> VectorFile {
    serde_json::from_str(&committed_text()).unwrap()
}

/// The first field in which two vectors differ.
fn first_difference(old: &Vector, new: &Vector) -> &'static str {
    let fields: [(&str, bool); 16] = [
        (
            "kind/output/k/w",
            (&old.kind, &old.output, old.k, old.w) == (&new.kind, &new.output, new.k, new.w),
        ),
        ("seed", old.seed == new.seed),
        ("roots", old.roots == new.roots),
        ("alpha", old.alpha == new.alpha),
        ("beta", old.beta == new.beta),
        ("beta1", old.beta1 == new.beta1),
        ("key_len", old.key_len == new.key_len),
        ("gen_aes_calls", old.gen_aes_calls == new.gen_aes_calls),
        ("eval_aes_calls", old.eval_aes_calls == new.eval_aes_calls),
        ("key0", old.key0 == new.key0),
        ("key1", old.key1 == new.key1),
        ("points", old.points == new.points),
        ("out0", old.out0 == new.out0),
        ("out1", old.out1 == new.out1),
        ("values", old.values == new.values),
        ("name", old.name == new.name),
    ];
    fields
        .iter()
        .find(|(_, same)| !same)
        .map_or("(none)", |(f, _)| f)
}

#[test]
fn regenerated_vectors_equal_the_committed_file() {
    let file = committed();
    assert_eq!(file.format, vectors::FORMAT);
    assert_eq!(file.version, vectors::VERSION);
    let fresh = vectors::generate();
    assert_eq!(
        file.vectors.len(),
        fresh.len(),
        "the committed file has {} vectors, this build makes {}. {REGENERATE}",
        file.vectors.len(),
        fresh.len()
    );
    for (old, new) in file.vectors.iter().zip(&fresh) {
        assert!(
            old == new,
            "vector {} differs from the committed one, first in `{}`. {REGENERATE}",
            old.name,
            first_difference(old, new)
        );
    }
    assert!(
        committed_text() == vectors::render(),
        "the committed vectors match but the file's formatting differs. {REGENERATE}"
    );
}

/// Independently of how they were made, the committed keys must still
/// evaluate to the committed shares, and those must reconstruct to the
/// function they claim: this separates an evaluation change from a
/// generation change.
#[test]
fn committed_keys_evaluate_to_committed_outputs() {
    let aes = FixedKeyAes::new();
    let file = committed();
    assert!(file.vectors.len() >= 18);
    let pairs = file.vectors.iter().filter(|v| v.output == "pair").count();
    assert!(pairs >= 2, "the file must pin the pair-output key layout");
    for v in &file.vectors {
        let params = vectors::params_of(v).unwrap();
        let words = params.output().words();
        let betas = [Some(v.beta), v.beta1];
        assert_eq!(v.beta1.is_some(), words == 2, "{}", v.name);
        assert_eq!(v.key_len, params.key_len(), "{}", v.name);
        assert_eq!(v.eval_aes_calls, params.aes_per_eval(), "{}", v.name);
        assert_eq!(v.gen_aes_calls, params.aes_per_gen(), "{}", v.name);
        let keys = [&v.key0, &v.key1].map(|hex| vectors::from_hex(hex).unwrap());
        for (party, key, recorded) in [
            (Party::P0, &keys[0], &v.out0),
            (Party::P1, &keys[1], &v.out1),
        ] {
            let batch = KeyBatch::new(params, party, key).unwrap();
            let mut out = vec![0; v.points.len() * words];
            Serial::new().eval(&batch, &v.points, &mut out).unwrap();
            assert_eq!(
                &out, recorded,
                "vector {} {party:?}: this build evaluates the committed key differently. {REGENERATE}",
                v.name
            );
            for (&x, ys) in v.points.iter().zip(recorded.chunks_exact(words)) {
                for (word, &y) in ys.iter().enumerate() {
                    let want = reference::eval_word(&aes, &params, party, key, x, word);
                    assert_eq!(y, want, "{} word {word}", v.name);
                }
            }
        }
        for (i, &x) in v.points.iter().enumerate() {
            for (word, beta) in betas.iter().take(words).enumerate() {
                let at = i * words + word;
                let value = reference::reconstruct(params.output(), v.out0[at], v.out1[at]);
                assert_eq!(value, v.values[at], "{} x = {x:#x}", v.name);
                let ideal = reference::ideal(&params, v.alpha, beta.unwrap(), x);
                assert_eq!(value, ideal, "{} x = {x:#x} word {word}", v.name);
            }
        }
    }
}

#[test]
fn vector_file_stays_small() {
    let len = committed_text().len();
    assert!(len < 200_000, "vectors file is {len} bytes");
}
