//! The key batch parser: every malformation is the right typed
//! `WireError`, never a panic, and valid files round-trip and evaluate.

// Tests: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use suffuse_core::WireError;
use suffuse_core::batch::{BatchEval, Serial};
use suffuse_core::fss::{Kind, Output, Params, Party};
use suffuse_core::prg::{FixedKeyAes, Prg};
use suffuse_core::ring::Width;
use suffuse_core::wire::{KEY_HEADER_LEN, key_batch_len, parse_key_batch, write_key_header};
use suffuse_tests::keys::{self, DealtBatch, PARTIES};
use suffuse_tests::reference;

/// Header byte offsets, from the format table in `suffuse_core::wire`.
const VERSION: usize = 4;
const KIND: usize = 6;
const OUTPUT: usize = 7;
const DOMAIN: usize = 8;
const WIDTH: usize = 9;
const PARTY: usize = 10;
const RESERVED: usize = 11;
const COUNT: usize = 12;

/// A serialized batch of `dealt`'s first `count` keys of `party`.
fn serialize(dealt: &DealtBatch, party: Party, count: usize) -> Vec<u8> {
    let mut file = write_key_header(&dealt.params, party, count).to_vec();
    file.extend_from_slice(&dealt.bytes(party)[..count * dealt.params.key_len()]);
    assert_eq!(Some(file.len()), key_batch_len(&dealt.params, count));
    file
}

/// A valid two-key file: bit DCF over 5-bit inputs (keys of 32 bytes).
fn small_file() -> Vec<u8> {
    let aes = FixedKeyAes::new();
    let params = Params::dcf_bit(Width::of(5));
    let dealt = DealtBatch::deal(&aes, &params, 2, &mut Prg::new(&[1; 16]));
    serialize(&dealt, Party::P1, 2)
}

fn with_byte(file: &[u8], at: usize, value: u8) -> Vec<u8> {
    let mut f = file.to_vec();
    f[at] = value;
    f
}

fn with_count(file: &[u8], count: u64) -> Vec<u8> {
    let mut f = file.to_vec();
    f[COUNT..COUNT + 8].copy_from_slice(&count.to_le_bytes());
    f
}

fn error_of(bytes: &[u8]) -> WireError {
    parse_key_batch(bytes).map(|_| ()).unwrap_err()
}

#[test]
fn header_layout_is_the_documented_one() {
    let params = Params::new(Kind::Dpf, Width::of(50), Output::Ring(Width::of(13)));
    let h = write_key_header(&params, Party::P1, 0x0102_0304);
    assert_eq!(h.len(), KEY_HEADER_LEN);
    assert_eq!(&h[..4], b"SUFK");
    assert_eq!(&h[VERSION..VERSION + 2], &[1, 0]);
    assert_eq!(h[KIND..=RESERVED], [1, 1, 50, 13, 1, 0]);
    assert_eq!(&h[COUNT..], &0x0102_0304u64.to_le_bytes());
    let bit = write_key_header(&Params::dcf_bit(Width::of(7)), Party::P0, 0);
    assert_eq!(bit[KIND..=RESERVED], [0, 0, 7, 1, 0, 0]);
}

#[test]
fn valid_files_round_trip_and_evaluate() {
    let aes = FixedKeyAes::new();
    let mut rng = Prg::new(b"wire: round trip");
    let mut shapes = keys::shapes(&[1, 5, 8, 24, 64], &[1, 8, 13, 64]);
    shapes.extend(keys::pair_shapes(&[1, 5, 8, 24, 64], &[1, 8, 13, 64]));
    for params in shapes {
        let dealt = DealtBatch::deal(&aes, &params, 5, &mut rng);
        // A pair's query has two words: β's and the second payload's.
        let words = params.output().words();
        for count in [0, 1, 5] {
            let points: Vec<u64> = dealt.alphas[..count]
                .iter()
                .flat_map(|&a| [a.wrapping_sub(1), a, a.wrapping_add(1)])
                .collect();
            let mut shares = [vec![0; points.len() * words], vec![0; points.len() * words]];
            for (party, out) in PARTIES.into_iter().zip(shares.iter_mut()) {
                let file = serialize(&dealt, party, count);
                let parsed = parse_key_batch(&file).unwrap();
                assert_eq!(parsed.params(), params);
                assert_eq!(parsed.party(), party);
                assert_eq!(parsed.count(), count);
                assert_eq!(parsed.bytes(), Some(&file[KEY_HEADER_LEN..]));
                Serial::new().eval(&parsed, &points, out).unwrap();
            }
            for (q, &x) in points.iter().enumerate() {
                let i = q / 3;
                let payloads = [dealt.betas[i], dealt.seconds[i]];
                for (word, &beta) in payloads.iter().enumerate().take(words) {
                    let at = q * words + word;
                    assert_eq!(
                        reference::reconstruct(params.output(), shares[0][at], shares[1][at]),
                        reference::ideal(&params, dealt.alphas[i], beta, x),
                        "{params:?} key {i} x = {x:#x} word {word}"
                    );
                }
            }
        }
    }
}

#[test]
fn every_truncation_is_truncated() {
    let file = small_file();
    for len in 0..file.len() {
        assert_eq!(error_of(&file[..len]), WireError::Truncated, "{len} bytes");
    }
    assert!(parse_key_batch(&file).is_ok());
}

#[test]
fn trailing_bytes_are_refused() {
    let file = small_file();
    let mut one_more = file.clone();
    one_more.push(0);
    assert_eq!(error_of(&one_more), WireError::TrailingBytes);
    // A whole extra key is still more than the header declares.
    let mut extra_key = file.clone();
    extra_key.extend_from_slice(&file[KEY_HEADER_LEN..KEY_HEADER_LEN + 32]);
    assert_eq!(error_of(&extra_key), WireError::TrailingBytes);
    // An empty batch followed by anything.
    let empty = with_count(&file[..KEY_HEADER_LEN], 0);
    assert!(parse_key_batch(&empty).is_ok());
    let mut tail = empty.clone();
    tail.push(0);
    assert_eq!(error_of(&tail), WireError::TrailingBytes);
}

#[test]
fn wrong_magic_is_refused() {
    let file = small_file();
    for at in 0..4 {
        for flip in [0x01, 0x20, 0x80] {
            let bad = with_byte(&file, at, file[at] ^ flip);
            assert_eq!(error_of(&bad), WireError::BadMagic, "byte {at} ^ {flip:#x}");
        }
    }
    assert_eq!(error_of(&[0u8; KEY_HEADER_LEN]), WireError::BadMagic);
}

#[test]
fn other_versions_are_refused() {
    let file = small_file();
    for version in [0u16, 2, 0x0100, u16::MAX] {
        let mut bad = file.clone();
        bad[VERSION..VERSION + 2].copy_from_slice(&version.to_le_bytes());
        assert_eq!(
            error_of(&bad),
            WireError::UnsupportedVersion,
            "version {version}"
        );
    }
}

#[test]
fn unknown_tags_are_refused() {
    let file = small_file();
    for (field, name, first) in [
        (KIND, "kind", 2),
        (OUTPUT, "output", 3),
        (PARTY, "party", 2),
    ] {
        for value in [first, first + 1, 0x80, 0xFF] {
            let bad = with_byte(&file, field, value);
            assert_eq!(error_of(&bad), WireError::UnknownTag, "{name} = {value}");
        }
    }
    // Pair output (tag 2) is for comparison keys only.
    let dpf = with_byte(&file, KIND, 1);
    assert_eq!(error_of(&with_byte(&dpf, OUTPUT, 2)), WireError::UnknownTag);
}

#[test]
fn bad_widths_are_refused() {
    let file = small_file();
    for k in [0u8, 65, 128, 255] {
        assert_eq!(
            error_of(&with_byte(&file, DOMAIN, k)),
            WireError::BadWidth,
            "k = {k}"
        );
    }
    // Bit output has w = 1 exactly.
    for w in [0u8, 2, 8, 64, 255] {
        assert_eq!(
            error_of(&with_byte(&file, WIDTH, w)),
            WireError::BadWidth,
            "bit output with w = {w}"
        );
    }
    // Ring and pair outputs have 1 ≤ w ≤ 64.
    for tag in [1u8, 2] {
        let ring = with_byte(&file, OUTPUT, tag);
        for w in [0u8, 65, 255] {
            assert_eq!(
                error_of(&with_byte(&ring, WIDTH, w)),
                WireError::BadWidth,
                "output {tag} with w = {w}"
            );
        }
    }
}

#[test]
fn non_zero_reserved_byte_is_refused() {
    let file = small_file();
    for value in [1u8, 0x80, 0xFF] {
        assert_eq!(
            error_of(&with_byte(&file, RESERVED, value)),
            WireError::ReservedNonZero
        );
    }
}

#[test]
fn huge_counts_overflow_or_truncate_without_allocating() {
    let file = small_file();
    let key_len = 32u64;
    let header = u64::try_from(KEY_HEADER_LEN).unwrap();
    // The largest count whose total length still fits a u64.
    let largest = (u64::MAX - header) / key_len;
    // count · key_len + header does not fit a usize.
    for count in [u64::MAX, u64::MAX / key_len + 1, largest + 1] {
        assert_eq!(
            error_of(&with_count(&file, count)),
            WireError::CountOverflow,
            "count {count:#x}"
        );
    }
    // Representable but far beyond the bytes present.
    for count in [3u64, 1 << 40, largest] {
        assert_eq!(
            error_of(&with_count(&file, count)),
            WireError::Truncated,
            "count {count:#x}"
        );
    }
    // Fewer keys declared than present.
    assert_eq!(error_of(&with_count(&file, 1)), WireError::TrailingBytes);
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = parse_key_batch(&bytes);
    }

    /// A valid file with random bytes overwritten: the parser answers, and
    /// whatever it accepts evaluates without panicking.
    #[test]
    fn mutated_files_never_panic(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        points in prop::collection::vec(any::<u64>(), 2),
    ) {
        let mut file = small_file();
        for (at, value) in edits {
            let i = at.index(file.len());
            file[i] = value;
        }
        if let Ok(batch) = parse_key_batch(&file) {
            let n = batch.count();
            let points: Vec<u64> = points.iter().copied().cycle().take(2 * n).collect();
            let mut out = vec![0; points.len()];
            prop_assert!(Serial::new().eval(&batch, &points, &mut out).is_ok());
            for &y in &out {
                prop_assert!(reference::is_canonical(batch.params().output(), y));
            }
        }
    }
}
