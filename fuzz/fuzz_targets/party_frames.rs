//! A party on its genuine keys fed arbitrary frames in any order: the
//! peer's every answer is scripted by the input (echoes, repainted
//! payloads, frames of any kind, step and length, raw bytes, cut frames,
//! replays, aborts, a closed link). Every outcome must be an output share
//! or a typed error, never a panic or a hang, and a peer that only echoes
//! must give the same share as the echoing peer of `key_sections`.
//!
//! Byte 0 picks the party (bit 0) and the fixture (bit 1: the tiny
//! decoder's scoring plan, whose openings and fused truncations exchange
//! their own frames); the rest is the script
//! (`suffuse_host::fuzzing::run_with_peer`).

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use suffuse_host::fuzzing::{self, RunError};

fn echoed(party: u8) -> &'static [u64] {
    static SHARES: OnceLock<[Vec<u64>; 4]> = OnceLock::new();
    let shares = SHARES.get_or_init(|| {
        [0, 1, 2, 3].map(|p| {
            fuzzing::run_with_keys(p, fuzzing::key_file(p).to_vec())
                .expect("a genuine run against an echo succeeds")
        })
    });
    &shares[usize::from(party & 3)]
}

fuzz_target!(|data: &[u8]| {
    let Some((&party, script)) = data.split_first() else {
        return;
    };
    let party = party & 3;
    match fuzzing::run_with_peer(party, script) {
        Ok(share) => {
            if script.iter().all(|op| op % 8 == 0) {
                assert_eq!(share, echoed(party));
            }
            assert_eq!(share.len(), fuzzing::output_len(party));
        }
        Err(RunError::Header(e)) => panic!("genuine keys were refused: {e}"),
        Err(RunError::Party(_)) => {}
    }
});
