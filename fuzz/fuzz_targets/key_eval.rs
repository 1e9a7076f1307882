//! Parse, then evaluate: arbitrary key bytes must evaluate without panics,
//! to canonical outputs, and consistently across `Serial`'s batch,
//! single-key and full-domain paths.
//!
//! Input layout: byte 0 picks the points per key (0..=7), the next
//! `8 · points` bytes are the points (little-endian, zero-padded when the
//! input is short), and the rest is a serialized key batch.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use suffuse_core::batch::{BatchEval, Serial};
use suffuse_core::fss::{KeyBatch, Kind, Output};
use suffuse_core::prg::FixedKeyAes;
use suffuse_core::wire::parse_key_batch;
use suffuse_core::{Error, dcf, dpf};

/// Keys evaluated per input: enough to cross a key boundary, few enough to
/// keep executions fast.
const MAX_KEYS: usize = 4;
/// Largest domain expanded in full: 2^10 outputs per key.
const MAX_FULL_DOMAIN_BITS: u32 = 10;

fn serial() -> &'static Serial {
    static SERIAL: OnceLock<Serial> = OnceLock::new();
    SERIAL.get_or_init(Serial::new)
}

fn aes() -> &'static FixedKeyAes {
    static AES: OnceLock<FixedKeyAes> = OnceLock::new();
    AES.get_or_init(FixedKeyAes::new)
}

fn is_canonical(output: Output, y: u64) -> bool {
    match output {
        Output::Bit => y <= 1,
        Output::Ring(w) | Output::Pair(w) => w.contains(y),
    }
}

fn take_points(data: &[u8]) -> (Vec<u64>, &[u8]) {
    let Some((&first, rest)) = data.split_first() else {
        return (Vec::new(), data);
    };
    let per_key = usize::from(first % 8);
    let (raw, file) = rest.split_at(rest.len().min(8 * per_key));
    let points = (0..per_key)
        .map(|i| {
            let mut word = [0u8; 8];
            let chunk = raw.get(8 * i..).unwrap_or(&[]);
            let n = chunk.len().min(8);
            word[..n].copy_from_slice(&chunk[..n]);
            u64::from_le_bytes(word)
        })
        .collect();
    (points, file)
}

fuzz_target!(|data: &[u8]| {
    let (per_key_points, file) = take_points(data);
    let Ok(batch) = parse_key_batch(file) else {
        return;
    };
    let params = batch.params();
    let keys = batch.slice(0, batch.count().min(MAX_KEYS));
    let n = keys.count();

    let points: Vec<u64> = (0..n)
        .flat_map(|_| per_key_points.iter().copied())
        .collect();
    // A pair's query writes two words.
    let words = params.output().words();
    let mut out = vec![0u64; points.len() * words];
    let stats = serial()
        .eval(&keys, &points, &mut out)
        .expect("well-formed buffers must evaluate");
    assert_eq!(
        stats.aes_calls,
        params.aes_per_eval() * u64::try_from(points.len()).expect("small")
    );
    assert!(out.iter().all(|&y| is_canonical(params.output(), y)));

    // A wrong output length is an error, not a panic.
    let mut long = vec![0u64; points.len() * words + 1];
    assert_eq!(
        serial().eval(&keys, &points, &mut long),
        Err(Error::BufferLength)
    );

    // The same keys with their roots apart from their bodies give the same
    // outputs.
    let roots: Vec<u8> = (0..n).flat_map(|i| keys.key(i).root().to_vec()).collect();
    let bodies: Vec<u8> = (0..n).flat_map(|i| keys.key(i).body().to_vec()).collect();
    let apart = KeyBatch::split(params, keys.party(), &roots, &bodies).expect("same keys");
    let mut again = vec![0u64; points.len() * words];
    serial()
        .eval(&apart, &points, &mut again)
        .expect("well-formed buffers must evaluate");
    assert_eq!(again, out);

    // The one-key evaluators agree with the batch.
    let per_key = per_key_points.len();
    let (whole, len) = (keys.bytes().unwrap_or_default(), params.key_len());
    for (q, (&x, y)) in points.iter().zip(out.chunks_exact(words)).enumerate() {
        let key = &whole[q / per_key * len..(q / per_key + 1) * len];
        let single = match (params.kind(), params.output()) {
            (Kind::Dcf, Output::Pair(_)) => {
                dcf::eval_pair(aes(), &params, keys.party(), key, x).map(|w| w.to_vec())
            }
            (Kind::Dcf, _) => dcf::eval(aes(), &params, keys.party(), key, x).map(|w| vec![w]),
            (Kind::Dpf, _) => dpf::eval(aes(), &params, keys.party(), key, x).map(|w| vec![w]),
        };
        assert_eq!(single, Ok(y.to_vec()));
    }

    let k = params.domain().bits();
    if k <= MAX_FULL_DOMAIN_BITS {
        let size = 1usize << k;
        let mut table = vec![0u64; n * size];
        let result = serial().eval_full_domain(&keys, &mut table);
        match params.kind() {
            // DCF keys have no full-domain evaluation, even in an empty batch.
            Kind::Dcf => assert_eq!(result, Err(Error::KindMismatch)),
            Kind::Dpf => {
                result.expect("a DPF batch expands in full");
                // The table agrees with point evaluation.
                for (q, (&x, &y)) in points.iter().zip(&out).enumerate() {
                    let x = usize::try_from(x & params.domain().mask()).expect("k ≤ 10");
                    assert_eq!(table[(q / per_key) * size + x], y);
                }
            }
        }
    }
});
