//! GGUF headers on arbitrary bytes: every input gets a parsed file or a
//! `GgufError`, never a panic or an allocation the input cannot back, and
//! every tensor of an accepted file lies inside it and dequantizes to
//! exactly its element count.

#![no_main]

use libfuzzer_sys::fuzz_target;
use suffuse_host::model::gguf::{Gguf, GgufError};

fuzz_target!(|data: &[u8]| {
    check(data.to_vec());
    // The magic and a version are needles the fuzzer would rarely find, so
    // every input also goes in behind them, to reach counts and metadata.
    let mut prefixed = b"GGUF\x03\0\0\0".to_vec();
    prefixed.extend_from_slice(data);
    check(prefixed);
});

fn check(data: Vec<u8>) {
    let len = data.len();
    match Gguf::from_bytes(data) {
        Ok(g) => {
            for t in g.tensors() {
                assert!(t.start + t.len <= len);
                match g.dequantize(&t.name) {
                    Ok(values) => assert_eq!(values.len() as u64, t.elements()),
                    Err(GgufError::Unsupported { .. }) => {}
                    Err(e) => panic!("dequantizing an accepted tensor failed: {e}"),
                }
            }
        }
        Err(GgufError::Io { .. }) => panic!("parsing bytes reported an I/O error"),
        Err(_) => {}
    }
}
