//! Key-file headers on arbitrary bytes: every input gets a header or a
//! `KeyFileError`, never a panic, and an accepted header keeps the limits
//! the format states.

#![no_main]

use libfuzzer_sys::fuzz_target;
use suffuse_host::keyfile::{KeyFileError, MAGIC, MAX_SUMMARY, VERSION, parse_header_bytes};

fuzz_target!(|data: &[u8]| {
    check(data);
    // Magic and version are needles the fuzzer would rarely find, so every
    // input also goes in behind them, to reach the fields and the summary.
    let mut prefixed = MAGIC.to_vec();
    prefixed.extend_from_slice(&VERSION.to_le_bytes());
    prefixed.extend_from_slice(data);
    check(&prefixed);
});

fn check(data: &[u8]) {
    match parse_header_bytes(data) {
        Ok(h) => {
            assert!(data.starts_with(&MAGIC));
            assert!(h.party <= 1);
            let summary_len = u32::from_le_bytes([data[68], data[69], data[70], data[71]]);
            assert!(summary_len as usize <= MAX_SUMMARY);
            assert!(data.len() >= 72 + summary_len as usize);
        }
        Err(
            KeyFileError::BadMagic { .. }
            | KeyFileError::Version { .. }
            | KeyFileError::Header { .. }
            | KeyFileError::Truncated { .. },
        ) => {}
        Err(e) => panic!("header parse gave an unexpected error: {e}"),
    }
}
