//! `Serial` and core's one-key evaluators against the reference oracle,
//! per party and bit for bit, on random keys of every shape.

// Tests: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use suffuse_core::batch::{BatchEval, Serial};
use suffuse_core::fss::{Kind, Params};
use suffuse_core::prg::{FixedKeyAes, Prg};
use suffuse_core::{dcf, dpf};
use suffuse_tests::keys::{self, DealtBatch, PARTIES};
use suffuse_tests::reference;

/// Ring widths on both sides of every lane size.
const RING_WIDTHS: [u32; 12] = [1, 7, 8, 9, 16, 17, 31, 32, 33, 50, 63, 64];

fn all_domains() -> Vec<u32> {
    (1..=64).collect()
}

/// Points that matter for key `alpha`: the edges of the domain, α and its
/// neighbours, a word with bits above k, and uniform words.
fn points_near(params: &Params, alpha: u64, rng: &mut Prg) -> [u64; 8] {
    let k = params.domain();
    [
        0,
        k.mask(),
        alpha,
        alpha.wrapping_sub(1),
        alpha.wrapping_add(1),
        alpha | !k.mask(),
        rng.next_u64(),
        rng.next_u64(),
    ]
}

#[test]
fn reference_layout_matches_params() {
    let widths: Vec<u32> = (1..=64).collect();
    for params in keys::shapes(&all_domains(), &widths) {
        assert_eq!(reference::key_len(&params), params.key_len(), "{params:?}");
        assert_eq!(
            reference::leaf_bits(&params),
            params.leaf_bits(),
            "{params:?}"
        );
        assert_eq!(reference::levels(&params), params.levels(), "{params:?}");
        assert_eq!(
            reference::lane_bits(params.output()),
            params.lane_bits(),
            "{params:?}"
        );
    }
}

#[test]
fn serial_matches_reference_on_every_shape() {
    let aes = FixedKeyAes::new();
    let mut rng = Prg::new(b"oracle: shapes\0\0");
    let mut compared = 0;
    for params in keys::shapes(&all_domains(), &RING_WIDTHS) {
        let dealt = DealtBatch::deal(&aes, &params, 3, &mut rng);
        let points: Vec<u64> = dealt
            .alphas
            .iter()
            .flat_map(|&alpha| points_near(&params, alpha, &mut rng))
            .collect();
        let per_key = points.len() / dealt.count();
        let mut shares = [vec![0; points.len()], vec![0; points.len()]];
        for (party, out) in PARTIES.into_iter().zip(shares.iter_mut()) {
            let batch = dealt.batch(party, dealt.count());
            let stats = Serial::new().eval(&batch, &points, out).unwrap();
            assert_eq!(
                stats.aes_calls,
                params.aes_per_eval() * u64::try_from(points.len()).unwrap()
            );
            for (q, (&x, &y)) in points.iter().zip(out.iter()).enumerate() {
                let key = dealt.key(party, q / per_key);
                let want = reference::eval(&aes, &params, party, key, x);
                assert_eq!(
                    y,
                    want,
                    "{params:?} {party:?} key {} at x = {x:#x}: Serial {y:#x}, reference {want:#x}",
                    q / per_key
                );
                assert!(reference::is_canonical(params.output(), y));
                compared += 1;
            }
        }
        for (q, &x) in points.iter().enumerate() {
            let i = q / per_key;
            let got = reference::reconstruct(params.output(), shares[0][q], shares[1][q]);
            let want = reference::ideal(&params, dealt.alphas[i], dealt.betas[i], x);
            assert_eq!(
                got, want,
                "{params:?} α = {:#x}, β = {:#x}, x = {x:#x}",
                dealt.alphas[i], dealt.betas[i]
            );
        }
    }
    println!("{compared} shares equal the reference");
}

#[test]
fn one_key_evaluators_match_reference() {
    let aes = FixedKeyAes::new();
    let mut rng = Prg::new(b"oracle: one key\0");
    for params in keys::shapes(&[1, 2, 7, 8, 9, 33, 64], &RING_WIDTHS) {
        let alpha = keys::edgy_alpha(&params, &mut rng);
        let pair = keys::deal(&aes, &params, alpha, rng.next_u64(), &mut rng);
        assert_eq!(pair.gen_aes_calls, params.aes_per_gen(), "{params:?}");
        for party in PARTIES {
            let key = pair.key(party);
            for x in points_near(&params, pair.alpha, &mut rng) {
                let got = match params.kind() {
                    Kind::Dcf => dcf::eval(&aes, &params, party, key, x),
                    Kind::Dpf => dpf::eval(&aes, &params, party, key, x),
                }
                .unwrap();
                let want = reference::eval(&aes, &params, party, key, x);
                assert_eq!(got, want, "{params:?} {party:?} x = {x:#x}");
            }
        }
    }
}

#[test]
fn full_domain_matches_reference() {
    let aes = FixedKeyAes::new();
    let mut rng = Prg::new(b"oracle: domain\0\0");
    let domains: Vec<u32> = (1..=12).collect();
    for params in keys::shapes(&domains, &RING_WIDTHS) {
        if params.kind() != Kind::Dpf {
            continue;
        }
        let dealt = DealtBatch::deal(&aes, &params, 2, &mut rng);
        let size = 1usize << params.domain().bits();
        for party in PARTIES {
            let batch = dealt.batch(party, 2);
            let mut table = vec![0; 2 * size];
            let stats = Serial::new().eval_full_domain(&batch, &mut table).unwrap();
            assert_eq!(stats.aes_calls, 2 * params.aes_per_full_domain());
            let mut single = vec![0; size];
            let calls =
                dpf::eval_full_domain(&aes, &params, party, dealt.key(party, 1), &mut single)
                    .unwrap();
            assert_eq!(calls, params.aes_per_full_domain());
            assert_eq!(single, table[size..], "{params:?} {party:?}");
            for (i, &y) in table.iter().enumerate() {
                let x = u64::try_from(i % size).unwrap();
                let want = reference::eval(&aes, &params, party, dealt.key(party, i / size), x);
                assert_eq!(y, want, "{params:?} {party:?} key {} x = {x}", i / size);
            }
        }
    }
}
