//! What a server or client decodes before any key is used: a connection's
//! hello (raw bytes, or a genuine server hello overwritten in part), the
//! client's check of the shape a server announces, the servers' ready
//! round, and the client's parse of an output frame. Every input gets a
//! value or a typed error, never a panic.
//!
//! Byte 0 picks the decoder; the rest is its input.

#![no_main]

use libfuzzer_sys::fuzz_target;
use suffuse_host::client::{HELLO_STEP, Hello};
use suffuse_host::fuzzing;
use suffuse_host::net::{FrameKind, encode_frame};

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 5 {
        0 => hello(rest),
        // The frame header is a needle: wrap the rest in one.
        1 => hello(&encode_frame(FrameKind::Hello, HELLO_STEP, rest)),
        2 => {
            // A genuine hello with the rest written over it from an offset
            // (its first byte), to reach the fields' checks.
            let mut json = fuzzing::server_hello();
            if let Some((&at, over)) = rest.split_first() {
                let at = usize::from(at) % json.len();
                let end = (at + over.len()).min(json.len());
                json[at..end].copy_from_slice(&over[..end - at]);
            }
            hello(&encode_frame(FrameKind::Hello, HELLO_STEP, &json));
        }
        3 => {
            if let Ok(payload) = fuzzing::ready_round(rest) {
                assert_eq!(payload.len(), 5, "the ready round takes 5 bytes only");
            }
        }
        _ => {
            let words = rest.first().map_or(0, |&b| usize::from(b % 8));
            if let Ok((share, _)) = fuzzing::output_frame(rest, words) {
                assert_eq!(share.len(), words);
            }
        }
    }
});

fn hello(bytes: &[u8]) {
    if let Ok(Ok(Hello::Server { view, .. })) = fuzzing::hear_hello(bytes) {
        let _ = fuzzing::client_checks(&view, 1, fuzzing::hidden());
    }
}
