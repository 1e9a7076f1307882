//! Property tests at wide inputs (n ∈ {32, 50, 63, 64}) where exhaustive
//! checking is impossible: α drawn to hit 0, 1 and 2^n − 1 often, points at
//! α − 1, α, α + 1, 0 and 2^n − 1; both groups, both kinds; the
//! masked-comparison identity; and bit packing round trips.

// Tests: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use suffuse_core::WireError;
use suffuse_core::batch::{BatchEval, Serial};
use suffuse_core::fss::{KeyBatch, Kind, Output, Params, Party};
use suffuse_core::prg::{FixedKeyAes, Prg};
use suffuse_core::ring::Width;
use suffuse_core::wire::{pack, unpack};
use suffuse_core::{dcf, dpf};
use suffuse_tests::keys::{self, KeyPair, PARTIES};
use suffuse_tests::reference;

const DOMAINS: [u32; 4] = [32, 50, 63, 64];

/// A value in `[0, 2^n)` that is an edge (0, 1, 2^n − 1) half the time.
#[derive(Clone, Copy, Debug)]
enum Pick {
    Zero,
    One,
    Max,
    Any(u64),
}

impl Pick {
    fn value(self, width: Width) -> u64 {
        match self {
            Pick::Zero => 0,
            Pick::One => 1,
            Pick::Max => width.mask(),
            Pick::Any(v) => width.reduce(v),
        }
    }
}

fn pick() -> impl Strategy<Value = Pick> {
    prop_oneof![
        1 => Just(Pick::Zero),
        1 => Just(Pick::One),
        1 => Just(Pick::Max),
        3 => any::<u64>().prop_map(Pick::Any),
    ]
}

fn output() -> impl Strategy<Value = Output> {
    prop_oneof![
        2 => Just(Output::Bit),
        1 => prop::sample::select(vec![1u32, 8, 9, 16, 17, 32, 33, 64])
            .prop_map(|w| Output::Ring(Width::of(w))),
        2 => (1u32..=64).prop_map(|w| Output::Ring(Width::of(w))),
    ]
}

fn params() -> impl Strategy<Value = Params> {
    (
        prop::sample::select(keys::KINDS.to_vec()),
        prop::sample::select(DOMAINS.to_vec()),
        output(),
    )
        .prop_map(|(kind, k, output)| Params::new(kind, Width::of(k), output))
}

/// Both parties' shares of `pair` at `points`, through `Serial` (a
/// pair's two words per point side by side).
fn shares(pair: &KeyPair, points: &[u64]) -> [Vec<u64>; 2] {
    PARTIES.map(|party| {
        let keys = KeyBatch::new(pair.params, party, pair.key(party)).unwrap();
        let mut out = vec![0; points.len() * pair.params.output().words()];
        Serial::new().eval(&keys, points, &mut out).unwrap();
        out
    })
}

proptest! {
    // Each case is a few hundred AES calls; more cases cost little.
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn keys_reconstruct_to_the_spec(
        params in params(),
        alpha in pick(),
        beta in pick(),
        seed in any::<[u8; 16]>(),
        extra in prop::collection::vec(any::<u64>(), 0..4),
    ) {
        let aes = FixedKeyAes::new();
        let k = params.domain();
        let alpha = alpha.value(k);
        let beta = beta.value(Width::W64);
        let pair = keys::deal(&aes, &params, alpha, beta, &mut Prg::new(&seed));
        prop_assert_eq!(pair.gen_aes_calls, params.aes_per_gen());
        // P1's key is P0's but for the root: the dealer writes the bodies
        // once for both key files (host `proto::Dealt::Same`).
        prop_assert_eq!(&pair.keys[1][16..], &pair.keys[0][16..]);

        let mut points = vec![
            alpha.wrapping_sub(1),
            alpha,
            alpha.wrapping_add(1),
            0,
            k.mask(),
            // Bits above k are ignored.
            alpha | !k.mask(),
        ];
        points.extend(extra);
        let [s0, s1] = shares(&pair, &points);
        for (i, &x) in points.iter().enumerate() {
            prop_assert_eq!(
                reference::reconstruct(params.output(), s0[i], s1[i]),
                reference::ideal(&params, alpha, pair.beta, x),
                "{:?} α = {:#x} β = {:#x} x = {:#x}", params, alpha, pair.beta, x
            );
            for (party, share) in [(Party::P0, s0[i]), (Party::P1, s1[i])] {
                prop_assert_eq!(
                    share,
                    reference::eval(&aes, &params, party, pair.key(party), x),
                    "{:?} {:?} x = {:#x}", params, party, x
                );
            }
        }
    }

    /// Pair-output DCFs at wide k: both words against their payloads and
    /// the reference walk, at the same edge points.
    #[test]
    fn pair_keys_reconstruct_to_the_spec(
        k in prop::sample::select(DOMAINS.to_vec()),
        w in 1u32..=64,
        alpha in pick(),
        beta in pick(),
        seed in any::<[u8; 16]>(),
        extra in prop::collection::vec(any::<u64>(), 0..4),
    ) {
        let aes = FixedKeyAes::new();
        let params = Params::new(Kind::Dcf, Width::of(k), Output::Pair(Width::of(w)));
        let k = params.domain();
        let alpha = alpha.value(k);
        let pair = keys::deal(&aes, &params, alpha, beta.value(Width::W64), &mut Prg::new(&seed));
        prop_assert_eq!(pair.gen_aes_calls, params.aes_per_gen());
        prop_assert_eq!(params.key_len(), reference::key_len(&params));
        prop_assert_eq!(&pair.keys[1][16..], &pair.keys[0][16..]);
        let mut points = vec![alpha.wrapping_sub(1), alpha, alpha.wrapping_add(1), 0, k.mask()];
        points.extend(extra);
        let [s0, s1] = shares(&pair, &points);
        for (q, &x) in points.iter().enumerate() {
            for (word, payload) in [pair.beta, pair.second].into_iter().enumerate() {
                let i = 2 * q + word;
                prop_assert_eq!(
                    reference::reconstruct(params.output(), s0[i], s1[i]),
                    reference::ideal(&params, alpha, payload, x),
                    "{:?} α = {:#x} β = {:#x} x = {:#x} word {}", params, alpha, payload, x, word
                );
                for (party, share) in [(Party::P0, s0[i]), (Party::P1, s1[i])] {
                    prop_assert_eq!(
                        share,
                        reference::eval_word(&aes, &params, party, pair.key(party), x, word),
                        "{:?} {:?} x = {:#x} word {}", params, party, x, word
                    );
                }
            }
        }
    }

    /// DESIGN.md §3 at wide k, with the wrap cases r = 0, r = 2^k − 1 and
    /// r + β = 2^k drawn often.
    #[test]
    fn masked_comparison_identity(
        k in prop::sample::select(DOMAINS.to_vec()),
        r in pick(),
        beta in pick(),
        x in pick(),
        wrap in any::<bool>(),
        seed in any::<[u8; 16]>(),
    ) {
        let aes = FixedKeyAes::new();
        let width = Width::of(k);
        let r = r.value(width);
        // r + β = 2^k: the comparison point wraps to 0.
        let beta = if wrap { width.neg(r) } else { beta.value(width) };
        let x = x.value(width);
        let params = Params::dcf_bit(width);
        let pair = keys::deal(&aes, &params, r, 1, &mut Prg::new(&seed));
        let masked = width.add(x, r);
        let shifted = width.sub(masked, beta);
        let [s0, s1] = shares(&pair, &[shifted, masked]);
        let share0 = s0[0] ^ s0[1] ^ u64::from(masked < beta);
        let share1 = s1[0] ^ s1[1];
        prop_assert_eq!(
            share0 ^ share1,
            u64::from(x < beta),
            "k = {} r = {:#x} β = {:#x} x = {:#x}", k, r, beta, x
        );
    }

    #[test]
    fn pack_unpack_round_trip(
        bits in 1u32..=64,
        words in prop::collection::vec(any::<u64>(), 0..40),
    ) {
        let width = Width::of(bits);
        let len = width.packed_len(words.len()).unwrap();
        let mut bytes = vec![0u8; len];
        pack(width, &words, &mut bytes).unwrap();
        let mut back = vec![0u64; words.len()];
        unpack(width, &bytes, &mut back).unwrap();
        let reduced: Vec<u64> = words.iter().map(|&w| width.reduce(w)).collect();
        prop_assert_eq!(&back, &reduced);

        // Padding bits in the last byte must be zero.
        let used = usize::try_from(bits).unwrap() * words.len();
        if used % 8 != 0 {
            let mut dirty = bytes.clone();
            *dirty.last_mut().unwrap() |= 0x80;
            prop_assert_eq!(unpack(width, &dirty, &mut back), Err(WireError::ReservedNonZero));
        }
        // Wrong lengths are typed errors on both sides.
        let mut longer = bytes.clone();
        longer.push(0);
        prop_assert_eq!(unpack(width, &longer, &mut back), Err(WireError::Truncated));
        prop_assert_eq!(pack(width, &words, &mut longer), Err(WireError::Truncated));
        if let Some((_, shorter)) = bytes.split_last() {
            prop_assert_eq!(unpack(width, shorter, &mut back), Err(WireError::Truncated));
        }
    }
}

/// `generate` documents that α is taken mod 2^k and β mod 2^w, so callers
/// may pass unreduced values.
#[test]
fn generation_reduces_alpha_and_beta() {
    let aes = FixedKeyAes::new();
    for kind in keys::KINDS {
        for k in [32u32, 50, 63] {
            let width = Width::of(k);
            let params = Params::new(kind, width, Output::Ring(Width::of(20)));
            let alpha = 0x1234_5678 & width.mask();
            let above = alpha | !width.mask();
            let beta = 0xF_FFFF_u64 | (0xABC << 20);
            let mut rng = Prg::new(&[7; 16]);
            let roots = [rng.next_block(), rng.next_block()];
            let mut k0 = vec![0; params.key_len()];
            let mut k1 = vec![0; params.key_len()];
            let generate = match kind {
                Kind::Dcf => dcf::generate::<FixedKeyAes, Prg>,
                Kind::Dpf => dpf::generate::<FixedKeyAes, Prg>,
            };
            generate(
                &aes, &params, above, beta, roots, &mut rng, &mut k0, &mut k1,
            )
            .unwrap();
            let pair = KeyPair {
                params,
                alpha,
                beta: 0xF_FFFF,
                second: 0,
                roots,
                keys: [k0, k1],
                gen_aes_calls: 0,
            };
            let points = [alpha.wrapping_sub(1), alpha, alpha + 1];
            let [s0, s1] = shares(&pair, &points);
            for (i, &x) in points.iter().enumerate() {
                assert_eq!(
                    reference::reconstruct(params.output(), s0[i], s1[i]),
                    reference::ideal(&params, alpha, 0xF_FFFF, x),
                    "{params:?} x = {x:#x}"
                );
            }
        }
    }
}
