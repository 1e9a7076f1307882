//! Exhaustive correctness at small input widths: every α, every x, both
//! output groups, DCF and DPF, random roots; and the masked-comparison
//! identity of DESIGN.md §3 for every mask, threshold and input.

// Tests: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use suffuse_core::batch::{BatchEval, Serial};
use suffuse_core::fss::{KeyBatch, Kind, Output, Params, Party};
use suffuse_core::prg::{FixedKeyAes, Prg};
use suffuse_core::ring::Width;
use suffuse_tests::keys::{self, KeyPair, PARTIES};
use suffuse_tests::reference;

const DOMAINS: [u32; 5] = [1, 2, 3, 5, 8];
/// One width in each leaf lane size (8, 16, 32, 64 bits), and w = 1.
const RING_WIDTHS: [u32; 6] = [1, 5, 8, 13, 32, 64];

/// `party`'s share at every x of the domain, through `Serial` (a pair's
/// two words per x side by side).
fn table(pair: &KeyPair, party: Party) -> Vec<u64> {
    let params = pair.params;
    let points: Vec<u64> = (0..1u64 << params.domain().bits()).collect();
    let keys = KeyBatch::new(params, party, pair.key(party)).unwrap();
    let mut out = vec![0; points.len() * params.output().words()];
    Serial::new().eval(&keys, &points, &mut out).unwrap();
    out
}

/// A key pair at α (β by [`beta_for`]), its generation's AES count checked,
/// with both parties' shares at every x.
fn dealt_with_shares(
    aes: &FixedKeyAes,
    params: &Params,
    alpha: u64,
    rng: &mut Prg,
) -> (KeyPair, [Vec<u64>; 2]) {
    let beta = beta_for(params, alpha, rng);
    let pair = keys::deal(aes, params, alpha, beta, rng);
    assert_eq!(pair.gen_aes_calls, params.aes_per_gen(), "{params:?}");
    let shares = PARTIES.map(|party| table(&pair, party));
    (pair, shares)
}

/// β for the key at α: the edges 1 and 2^w − 1, and uniform words.
fn beta_for(params: &Params, alpha: u64, rng: &mut Prg) -> u64 {
    let w = params.output().width();
    match alpha % 3 {
        0 => w.mask(),
        1 => 1,
        _ => rng.next_u64(),
    }
}

fn check_every_alpha_and_x(kind: Kind, seed: &[u8; 16]) {
    let aes = FixedKeyAes::new();
    let mut rng = Prg::new(seed);
    let mut checked = 0u64;
    for params in keys::shapes(&DOMAINS, &RING_WIDTHS) {
        if params.kind() != kind {
            continue;
        }
        let size = 1u64 << params.domain().bits();
        for alpha in 0..size {
            let (pair, shares) = dealt_with_shares(&aes, &params, alpha, &mut rng);
            for x in 0..size {
                let i = usize::try_from(x).unwrap();
                let got = reference::reconstruct(params.output(), shares[0][i], shares[1][i]);
                let want = reference::ideal(&params, alpha, pair.beta, x);
                assert_eq!(
                    got, want,
                    "{params:?} α = {alpha}, β = {:#x}, x = {x}: shares {:#x}, {:#x}",
                    pair.beta, shares[0][i], shares[1][i]
                );
                checked += 1;
            }
            if kind == Kind::Dpf {
                for (party, expected) in PARTIES.into_iter().zip(&shares) {
                    let keys = KeyBatch::new(params, party, pair.key(party)).unwrap();
                    let mut full = vec![0; expected.len()];
                    Serial::new().eval_full_domain(&keys, &mut full).unwrap();
                    assert_eq!(
                        &full, expected,
                        "{params:?} α = {alpha} {party:?} full domain"
                    );
                }
            }
        }
    }
    println!("{checked} reconstructions equal the spec");
}

#[test]
fn dcf_every_alpha_every_x() {
    check_every_alpha_and_x(Kind::Dcf, b"exhaustive dcf\0\0");
}

#[test]
fn dpf_every_alpha_every_x() {
    check_every_alpha_and_x(Kind::Dpf, b"exhaustive dpf\0\0");
}

/// Pair-output DCFs: every α and x, each word against its own payload and
/// each party's word against the reference walk; and the key is the
/// layout the reference recomputes.
#[test]
fn pair_dcf_every_alpha_every_x() {
    let aes = FixedKeyAes::new();
    let mut rng = Prg::new(b"exhaustive pair\0");
    let mut checked = 0u64;
    for params in keys::pair_shapes(&DOMAINS, &RING_WIDTHS) {
        assert_eq!(params.key_len(), reference::key_len(&params), "{params:?}");
        let size = 1u64 << params.domain().bits();
        for alpha in 0..size {
            let (pair, shares) = dealt_with_shares(&aes, &params, alpha, &mut rng);
            for x in 0..size {
                for (word, payload) in [pair.beta, pair.second].into_iter().enumerate() {
                    let i = 2 * usize::try_from(x).unwrap() + word;
                    let got = reference::reconstruct(params.output(), shares[0][i], shares[1][i]);
                    let want = reference::ideal(&params, alpha, payload, x);
                    assert_eq!(
                        got, want,
                        "{params:?} α = {alpha}, β = {payload:#x} (word {word}), x = {x}"
                    );
                    for (p, party) in PARTIES.into_iter().enumerate() {
                        let r =
                            reference::eval_word(&aes, &params, party, pair.key(party), x, word);
                        assert_eq!(shares[p][i], r, "{params:?} {party:?} x = {x} word {word}");
                    }
                    checked += 1;
                }
            }
        }
    }
    println!("{checked} pair words equal the spec and the reference");
}

/// `[x < β] = DCF_r((x̂ − β) mod 2^k) ⊕ DCF_r(x̂) ⊕ [x̂ < β]` with
/// `x̂ = x + r mod 2^k`, on shares: P0 adds the public `[x̂ < β]`. Checked
/// over XOR (bit output) and over Z_2^w (ring output, with − for the middle
/// term), for every mask r, threshold β and input x.
#[test]
fn masked_comparison_identity_for_every_mask_threshold_and_input() {
    let aes = FixedKeyAes::new();
    let mut rng = Prg::new(b"identity, sec. 3");
    for k in [1u32, 2, 3, 4, 5, 8] {
        let width = Width::of(k);
        let size = 1u64 << k;
        let idx = |v: u64| usize::try_from(v).unwrap();
        let mut wraps = [0u64; 3];
        for output in [Output::Bit, Output::Ring(Width::of(8))] {
            let params = Params::new(Kind::Dcf, width, output);
            for r in 0..size {
                let pair = keys::deal(&aes, &params, r, 1, &mut rng);
                let [t0, t1] = PARTIES.map(|party| table(&pair, party));
                for beta in 0..size {
                    for x in 0..size {
                        let masked = width.add(x, r);
                        let shifted = width.sub(masked, beta);
                        let public = u64::from(masked < beta);
                        let (s0, s1) = match output {
                            Output::Bit => (
                                t0[idx(shifted)] ^ t0[idx(masked)] ^ public,
                                t1[idx(shifted)] ^ t1[idx(masked)],
                            ),
                            Output::Ring(w) | Output::Pair(w) => (
                                w.add(w.sub(t0[idx(shifted)], t0[idx(masked)]), public),
                                w.sub(t1[idx(shifted)], t1[idx(masked)]),
                            ),
                        };
                        assert_eq!(
                            reference::reconstruct(output, s0, s1),
                            u64::from(x < beta),
                            "{params:?}: r = {r}, β = {beta}, x = {x}, x̂ = {masked}"
                        );
                    }
                    wraps[0] += u64::from(r == 0);
                    wraps[1] += u64::from(r == width.mask());
                    wraps[2] += u64::from(u128::from(r) + u128::from(beta) == width.modulus());
                }
            }
        }
        assert!(
            wraps.iter().all(|&n| n > 0),
            "k = {k}: wrap cases r = 0, r = 2^k − 1, r + β = 2^k must all occur"
        );
    }
}
