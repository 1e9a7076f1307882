//! The TLS handshake on raw records, with certificates made once by
//! `suffuse certs`' code: P0's server reading a connection's first flight
//! (arbitrary bytes, or a genuine client's ClientHello with bytes XORed in),
//! and a client reading what comes back after its hello. Every input is
//! answered or refused by rustls, never a panic.
//!
//! Byte 0 picks the side and mode; the rest is the records (or the XOR).

#![no_main]

use libfuzzer_sys::fuzz_target;
use suffuse_host::fuzzing;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let _ = match which % 3 {
        0 => fuzzing::tls_server_reads(rest),
        1 => {
            let mut hello = fuzzing::tls_client_hello().to_vec();
            for (h, x) in hello.iter_mut().zip(rest) {
                *h ^= x;
            }
            fuzzing::tls_server_reads(&hello)
        }
        _ => fuzzing::tls_client_reads(rest),
    };
});
