//! ReluARS: `max(⌊x / 2^f⌋, 0)`, ReLU fused with an arithmetic shift
//! (SHARK's helper bits, seeds/000 §4.4).
//!
//! * Spec: `ReluARS(x) = ⌊max(x, 0) / 2^f⌋` on signed x (the same as
//!   `max(⌊x/2^f⌋, 0)`).
//! * SUF: the helper bit `d = [x ≥ 0]` (`¬MSB(x)` on the k-bit view); the
//!   other helpers are wrap bits of views: `t` = the carry
//!   `[x̂ mod 2^f < r mod 2^f]` and `w` = the wrap, from a k-bit comparison
//!   ([`Range::Exact`]) or from `MSB(r)·(1 − MSB(x̂'))` ([`Range::Gap`]).
//! * Φ: `d·(⌊x̂'/2^f⌋ − ⌊r/2^f⌋ − t + 2^(·)·w − 2^(k−1−f))`: the truncation
//!   of [`super::trunc`] times d. After the Boolean round (which opens
//!   `d ⊕ ρ_d` and `t ⊕ ρ_t`, as SHARK opens its masked helper bits), the
//!   products `d·t`, `d·⌊r/2^f⌋`, `d·MSB(r)` are dealer monomials: no table
//!   and no third round.
//! * Cost (gap, n = 64, f = 12, width k): a k-bit key and a 12-bit key,
//!   2 points, 2 rounds, n + 2 bits sent; P1 holds 7 explicit words.

use crate::error::SufError;
use crate::gate::trunc::{Range, shift_phi};
use crate::gate::{Gate, Input};
use crate::phi::Factor;
use crate::ring::Width;
use crate::suf::{Domain, Op, Pred, Program, Suf};

/// ReluARS by `f` bits at effective width `k`.
pub const fn reluars(ring: Width, k: Width, f: u32, range: Range) -> Result<Gate, SufError> {
    let n = ring.bits();
    if f == 0 || f >= k.bits() || k.bits() > n || (matches!(range, Range::Gap) && k.bits() >= n) {
        return Err(SufError::FixedPoint);
    }
    let suf = Suf::new(ring, Domain::Signed, f, 0, 0)
        .with_pred(Pred::Msb)
        .with_program(Program::from_ops(&[Op::Pred(0), Op::Not]))
        .with_bools(&[1]);
    let d = Factor::Bool(0);
    let unshift = ring.neg(1u64 << (k.bits() - 1 - f));
    let phi = shift_phi(ring, k, f, range, k.half(), unshift, Some(d));
    Gate::new(&suf, k, phi, Input::Shares)
}

/// What the gate computes on a word: exact ReluARS of the k-bit view (for
/// [`Range::Gap`], inside its range).
pub const fn reluars_at(ring: Width, k: Width, f: u32, x: u64) -> u64 {
    let v = k.to_signed(k.reduce(x));
    if v < 0 { 0 } else { ring.from_signed(v >> f) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::testing::{check_pairs, edges_where, exhaustive_small, run, wrap_masks};
    use proptest::prelude::*;
    use std::vec::Vec;

    #[test]
    fn exact_reluars_on_every_word() {
        for (n, k, f) in [(8, 8, 3), (10, 7, 2)] {
            let (n, k) = (Width::of(n), Width::of(k));
            let gate = reluars(n, k, f, Range::Exact).unwrap();
            assert_eq!(gate.cost().rounds, 2);
            exhaustive_small(&gate, &|x| {
                (
                    [reluars_at(n, k, f, x), 0],
                    u32::from(k.to_signed(k.reduce(x)) >= 0),
                )
            });
        }
    }

    #[test]
    fn gap_reluars_in_range() {
        let (n, k, f) = (Width::of(10), Width::of(8), 3);
        let gate = reluars(n, k, f, Range::Gap).unwrap();
        let xs: Vec<u64> = (0..1u64 << 10)
            .filter(|x| k.fits_signed(n.to_signed(*x)))
            .collect();
        for (i, r) in wrap_masks(&gate, 64).iter().enumerate() {
            let out = run(&gate, &xs, Some(&std::vec![*r; xs.len()]), i as u8);
            for (j, x) in xs.iter().enumerate() {
                assert_eq!(out.arith[j], reluars_at(n, k, f, *x), "x={x} r={r}");
            }
        }
    }

    #[test]
    fn reluars_edges_at_64_bits() {
        let n = Width::W64;
        let k = Width::of(40);
        for range in [Range::Exact, Range::Gap] {
            let gate = reluars(n, k, 12, range).unwrap();
            edges_where(
                &gate,
                &|x| {
                    (
                        [reluars_at(n, k, 12, x), 0],
                        u32::from(k.to_signed(k.reduce(x)) >= 0),
                    )
                },
                &|x| k.fits_signed(n.to_signed(x)),
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(12))]
        #[test]
        fn reluars_random_at_64_bits(xs in proptest::collection::vec(any::<i64>(), 64), rs in proptest::collection::vec(any::<u64>(), 64)) {
            let (n, k) = (Width::W64, Width::of(48));
            let xs: Vec<u64> = xs.iter().map(|x| n.from_signed(x >> 17)).collect();
            let gate = reluars(n, k, 12, Range::Gap).unwrap();
            check_pairs(&gate, &xs, &rs, &|x| ([reluars_at(n, k, 12, x), 0], u32::from(k.to_signed(k.reduce(x)) >= 0)), 5);
        }
    }
}
