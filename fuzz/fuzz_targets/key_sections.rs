//! A party streaming its key file after a genuine v2 header: every section
//! kind of a tiny encoder's plan (gates, reciprocal and rsqrt chains, the
//! max tree, matrix, row and square triples) or of a tiny decoder's
//! scoring plan (openings, truncations fused with a residual and its
//! square), run against a peer that echoes, so the run goes as far as the
//! keys allow.
//!
//! Byte 0: bit 0 picks the party; bit 1 the mode; bit 2 the decoder's
//! fixture.
//! - raw: the rest is the file after its header, section headers, digests
//!   and end marker included. Every byte is covered by a digest or a
//!   marker, so the run succeeds exactly when the rest is the genuine file.
//! - sealed: the rest is edits, each `offset u32 · n u8 · n bytes` XORed
//!   onto the genuine payloads at `offset` (mod their total), and the file
//!   is sealed again with valid digests: what a faulty dealer would write.
//!   The section parsers and evaluators then see the bytes; any outcome but
//!   a panic is fine, and no edit at all must succeed.

#![no_main]

use libfuzzer_sys::fuzz_target;
use suffuse_host::fuzzing;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let party = (mode & 1) | ((mode >> 1) & 2);
    if mode & 2 == 0 {
        raw(party, rest);
    } else {
        sealed(party, rest);
    }
});

fn raw(party: u8, rest: &[u8]) {
    let whole = fuzzing::key_file(party);
    let head = fuzzing::header_len(party);
    let mut file = whole[..head].to_vec();
    file.extend_from_slice(rest);
    let genuine = rest == &whole[head..];
    match fuzzing::run_with_keys(party, file) {
        Ok(share) => {
            assert!(genuine, "an altered key file was accepted");
            assert_eq!(share.len(), fuzzing::output_len(party));
        }
        Err(e) => assert!(!genuine, "the genuine key file failed: {e:?}"),
    }
}

fn sealed(party: u8, mut edits: &[u8]) {
    let mut payloads: Vec<Vec<u8>> = fuzzing::payloads(party)
        .into_iter()
        .map(<[u8]>::to_vec)
        .collect();
    let total: usize = payloads.iter().map(Vec::len).sum();
    let mut edited = false;
    while let [a, b, c, d, n, tail @ ..] = edits {
        let n = usize::from(*n).min(tail.len());
        let (xor, next) = tail.split_at(n);
        let mut at = u32::from_le_bytes([*a, *b, *c, *d]) as usize % total;
        for x in xor {
            // Find the payload that holds byte `at` of their concatenation.
            let mut i = at;
            let p = payloads
                .iter_mut()
                .find(|p| {
                    let here = i < p.len();
                    if !here {
                        i -= p.len();
                    }
                    here
                })
                .expect("offsets are reduced mod the total");
            p[i] ^= x;
            edited |= *x != 0;
            at = (at + 1) % total;
        }
        edits = next;
    }
    let result = fuzzing::run_with_keys(party, fuzzing::seal(party, &payloads));
    if let Ok(share) = &result {
        assert_eq!(share.len(), fuzzing::output_len(party));
    }
    if !edited {
        assert!(
            result.is_ok(),
            "genuine payloads failed once sealed: {result:?}"
        );
    }
}
