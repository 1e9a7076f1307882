//! Truncation by f bits: ARS (signed floor), LRS (unsigned floor) and TR
//! (truncate-reduce into Z_2^(n−f)). Rescaling after every fixed-point
//! product runs through it.
//!
//! With `x̂ = x + r`, `x = x̂ − r + 2^n·w` for the wrap `w = [x̂ < r]`, and
//! splitting at bit f:
//!
//! `⌊x / 2^f⌋ = ⌊x̂/2^f⌋ − ⌊r/2^f⌋ − c + 2^(n−f)·w`, with the carry
//! `c = [x̂ mod 2^f < r mod 2^f]`.
//!
//! Both bits are wrap bits of views of x̂, so the SUF has no intervals and Φ
//! is affine: the carry comes from an f-bit DCF key, the rest from dealer
//! constants (`⌊r/2^f⌋`, `MSB(r)`).
//!
//! * [`Range::Exact`] at effective width k (f < k ≤ n): the wrap is a k-bit
//!   comparison on the view `x + 2^(k−1) mod 2^k`. Exact for every input
//!   with |x| < 2^(k−1) (ARS) or x < 2^k (LRS); outside, it is exactly the
//!   same formula on the k-bit view: `⌊sext_k(x) / 2^f⌋`.
//! * [`Range::Gap`] (SIGMA's slack trick, k ≤ n − 1): if `x' = x + 2^(k−1)`
//!   is below 2^(n−1), the wrap is `MSB(r)·(1 − MSB(x̂'))` — a dealer bit times
//!   a public bit — so only the f-bit carry key is needed. Exact for
//!   |x| < 2^(k−1); outside that range the result is still correct modulo
//!   2^(n−f) (the wrap may be wrong), and the cleartext reference rejects
//!   such inputs in debug builds.
//! * [`Shift::Reduce`] (TR) needs no wrap at all: its output lives in
//!   Z_2^(n−f) and is exact for every input.
//!
//! Cost per element, n = 64, f = 12: Gap: one 12-bit key (96 bytes of
//! correction words), 1 point, 2 rounds, n + 1 bits sent; P1 adds three
//! words (`[ρ_c]`, `[⌊r/2^f⌋]`, `[MSB(r)]`): 120 bytes. Exact at width k
//! adds a k-bit key and one more bit.

use crate::compile::View;
use crate::error::SufError;
use crate::gate::{Gate, Input};
use crate::phi::{Factor, Kappa, Phi, PolyMode, Public, Term};
use crate::ring::Width;
use crate::suf::{Domain, Suf};

/// Which right shift.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shift {
    /// Arithmetic: `⌊x / 2^f⌋` of a signed x.
    Arithmetic,
    /// Logical: `⌊x / 2^f⌋` of an unsigned x.
    Logical,
    /// Truncate-reduce: `⌊x / 2^f⌋ mod 2^(n−f)`, the output in Z_2^(n−f).
    Reduce,
}

/// How the wrap bit is obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Range {
    /// A k-bit comparison: exact on the whole k-bit range, any k ≤ n.
    Exact,
    /// The one-bit-slack trick: needs k ≤ n − 1, no k-bit key.
    Gap,
}

/// A truncation gate by `f` bits at effective width `k`.
pub const fn trunc(
    ring: Width,
    k: Width,
    f: u32,
    shift: Shift,
    range: Range,
) -> Result<Gate, SufError> {
    let n = ring.bits();
    if f == 0 || f >= k.bits() || k.bits() > n {
        return Err(SufError::FixedPoint);
    }
    if matches!(range, Range::Gap) && !matches!(shift, Shift::Reduce) && k.bits() >= n {
        return Err(SufError::FixedPoint);
    }
    let low = View::new(Width::of(f), 0);
    let signed = matches!(shift, Shift::Arithmetic);
    // x' = x + 2^(k−1) for signed inputs: non-negative on the whole range.
    let offset = if signed { k.half() } else { 0 };
    let carry = Term::new(ring.neg(1), Public::One, &[Factor::Wrap(low)]);
    let unshift = if signed {
        ring.neg(1u64 << (k.bits() - 1 - f))
    } else {
        0
    };
    let phi = match (shift, range) {
        (Shift::Reduce, _) => {
            let full = View::new(ring, 0);
            Phi::new(PolyMode::Monomials)
                .with_kappa(Kappa::MaskBits {
                    width: ring,
                    shift: f,
                })
                .with_output(
                    Width::of(n - f),
                    &[
                        Term::new(
                            1,
                            Public::ViewShr {
                                view: full,
                                shift: f,
                            },
                            &[],
                        ),
                        Term::new(ring.neg(1), Public::One, &[Factor::Kappa(0)]),
                        carry,
                    ],
                )
        }
        (_, range) => shift_phi(ring, k, f, range, offset, unshift, None),
    };
    let domain = if signed {
        Domain::Signed
    } else {
        Domain::Unsigned
    };
    Gate::new(&Suf::new(ring, domain, f, 0, 0), k, phi, Input::Shares)
}

/// Φ of a shift by `f` of `x + offset` (x' ≥ 0 on the whole range), plus
/// the constant `unshift`: `⌊x̂'/2^f⌋ − ⌊r/2^f⌋ − carry + 2^(·)·wrap +
/// unshift`, the wrap from a k-bit key ([`Range::Exact`]) or from the mask's
/// MSB ([`Range::Gap`]). With `gate = Some(d)` every term is multiplied by
/// the bit d (ReluARS).
pub(crate) const fn shift_phi(
    ring: Width,
    k: Width,
    f: u32,
    range: Range,
    offset: u64,
    unshift: u64,
    gate: Option<Factor>,
) -> Phi {
    let (phi, mut terms) = match range {
        Range::Exact => exact_terms(ring, k, f, (offset, unshift)),
        Range::Gap => gap_terms(ring, f, (offset, unshift)),
    };
    if let Some(d) = gate {
        let mut i = 0;
        while i < terms.len() {
            terms[i] = terms[i].times(d);
            i += 1;
        }
    }
    phi.with_output(ring, &terms)
}

/// The exact form's Φ and terms: `⌊x̂_k / 2^f⌋ − ⌊r_k / 2^f⌋ − carry` over
/// the k-bit view, its wrap weighted by `2^(k−f)`, and the unshift.
const fn exact_terms(
    ring: Width,
    k: Width,
    f: u32,
    (offset, unshift): (u64, u64),
) -> (Phi, [Term; 5]) {
    let main = View::new(k, offset);
    let shifted = Public::ViewShr {
        view: main,
        shift: f,
    };
    (
        Phi::new(PolyMode::Monomials).with_kappa(Kappa::MaskBits { width: k, shift: f }),
        [
            Term::new(1, shifted, &[]),
            mask_floor(ring),
            carry(ring, f),
            Term::new(1u64 << (k.bits() - f), Public::One, &[Factor::Wrap(main)]),
            Term::constant(unshift),
        ],
    )
}

/// The gap form's Φ and terms: the same over the whole ring, the wrap
/// read from the mask's top bit and x̂'s (no comparison).
const fn gap_terms(ring: Width, f: u32, (offset, unshift): (u64, u64)) -> (Phi, [Term; 5]) {
    let full = View::new(ring, offset);
    let shifted = Public::ViewShr {
        view: full,
        shift: f,
    };
    (
        Phi::new(PolyMode::Monomials)
            .with_kappa(Kappa::MaskBits {
                width: ring,
                shift: f,
            })
            .with_kappa(Kappa::MaskMsb(ring)),
        [
            Term::new(1, shifted, &[]),
            mask_floor(ring),
            carry(ring, f),
            Term::new(
                ring.reduce(1u64 << (ring.bits() - f)),
                Public::NotMsb(full),
                &[Factor::Kappa(1)],
            ),
            Term::constant(unshift),
        ],
    )
}

/// `−[x̂ mod 2^f < r mod 2^f]`: the borrow out of the dropped bits.
const fn carry(ring: Width, f: u32) -> Term {
    let low = View::new(Width::of(f), 0);
    Term::new(ring.neg(1), Public::One, &[Factor::Wrap(low)])
}

/// `−⌊r_view / 2^f⌋`: the first κ word (the mask's bits above the
/// dropped ones), from the dealer.
const fn mask_floor(ring: Width) -> Term {
    Term::new(ring.neg(1), Public::One, &[Factor::Kappa(0)])
}

/// What the gate computes on every ring word (for [`Range::Exact`] and
/// [`Shift::Reduce`]; for [`Range::Gap`] inside its range).
pub const fn trunc_at(ring: Width, k: Width, f: u32, shift: Shift, x: u64) -> u64 {
    match shift {
        Shift::Arithmetic => ring.from_signed(k.to_signed(k.reduce(x)) >> f),
        Shift::Logical => ring.reduce(k.reduce(x) >> f),
        Shift::Reduce => Width::of(ring.bits() - f).reduce(ring.reduce(x) >> f),
    }
}

/// Whether `x` is inside the range where a gap truncation is exact.
pub const fn gap_in_range(ring: Width, k: Width, shift: Shift, x: u64) -> bool {
    match shift {
        Shift::Arithmetic => k.fits_signed(ring.to_signed(x)),
        Shift::Logical => ring.reduce(x) <= k.mask(),
        Shift::Reduce => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::testing::{
        check_pairs, edges, edges_where, exhaustive_small, run, wrap_masks,
    };
    use proptest::prelude::*;
    use std::vec::Vec;

    fn spec(n: Width, k: Width, f: u32, s: Shift) -> impl Fn(u64) -> ([u64; 2], u32) {
        move |x| ([trunc_at(n, k, f, s, x), 0], 0)
    }

    #[test]
    fn exact_truncations_are_exact_on_every_word() {
        for (n, k, f) in [(8, 8, 3), (10, 7, 2), (9, 9, 4)] {
            let (n, k) = (Width::of(n), Width::of(k));
            for s in [Shift::Arithmetic, Shift::Logical, Shift::Reduce] {
                let gate = trunc(n, k, f, s, Range::Exact).unwrap();
                assert_eq!(gate.cost().rounds, 2);
                exhaustive_small(&gate, &spec(n, k, f, s));
            }
        }
    }

    #[test]
    fn gap_truncation_is_exact_in_range_and_congruent_outside() {
        let (n, k, f) = (Width::of(10), Width::of(8), 3);
        for s in [Shift::Arithmetic, Shift::Logical] {
            let gate = trunc(n, k, f, s, Range::Gap).unwrap();
            // One key, of f bits.
            assert_eq!(gate.compiled.key_count, 1);
            assert_eq!(gate.compiled.keys[0].bits(), f);
            let xs: Vec<u64> = (0..1u64 << n.bits()).collect();
            let hi = Width::of(n.bits() - f);
            for (i, r) in wrap_masks(&gate, 64).iter().enumerate() {
                let out = run(&gate, &xs, Some(&std::vec![*r; xs.len()]), i as u8);
                for x in &xs {
                    let got = out.arith[*x as usize];
                    let ideal = match s {
                        Shift::Arithmetic => n.from_signed(n.to_signed(*x) >> f),
                        _ => *x >> f,
                    };
                    if gap_in_range(n, k, s, *x) {
                        assert_eq!(got, ideal, "{s:?} x={x} r={r}");
                    }
                    // Outside the range: still right modulo 2^(n−f).
                    let base = match s {
                        Shift::Arithmetic => {
                            n.sub(n.add(*x, k.half()) >> f, 1 << (k.bits() - 1 - f))
                        }
                        _ => *x >> f,
                    };
                    assert_eq!(
                        hi.reduce(got),
                        hi.reduce(base),
                        "{s:?} congruence x={x} r={r}"
                    );
                }
            }
        }
        assert!(trunc(n, n, f, Shift::Arithmetic, Range::Gap).is_err());
    }

    #[test]
    fn truncation_edges_at_64_bits() {
        let n = Width::W64;
        for (k, f) in [(64, 12), (40, 12), (37, 24)] {
            let k = Width::of(k);
            for s in [Shift::Arithmetic, Shift::Logical, Shift::Reduce] {
                edges(&trunc(n, k, f, s, Range::Exact).unwrap(), &spec(n, k, f, s));
            }
            if k.bits() < 64 {
                let gate = trunc(n, k, f, Shift::Arithmetic, Range::Gap).unwrap();
                let inside = |x| gap_in_range(n, k, Shift::Arithmetic, x);
                edges_where(&gate, &spec(n, k, f, Shift::Arithmetic), &inside);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]
        #[test]
        fn truncation_random_at_64_bits(
            xs in proptest::collection::vec(any::<u64>(), 64),
            rs in proptest::collection::vec(any::<u64>(), 64),
            k in 14u32..=63,
            f in 1u32..=13,
        ) {
            let (n, k) = (Width::W64, Width::of(k));
            // Inputs inside the k-bit range for the gap variant.
            let inside: Vec<u64> = xs.iter().map(|x| n.from_signed(k.to_signed(k.reduce(*x)))).collect();
            check_pairs(&trunc(n, k, f, Shift::Arithmetic, Range::Exact).unwrap(), &xs, &rs, &spec(n, k, f, Shift::Arithmetic), 1);
            check_pairs(&trunc(n, k, f, Shift::Arithmetic, Range::Gap).unwrap(), &inside, &rs, &spec(n, k, f, Shift::Arithmetic), 2);
            check_pairs(&trunc(n, k, f, Shift::Reduce, Range::Exact).unwrap(), &xs, &rs, &spec(n, k, f, Shift::Reduce), 3);
        }
    }
}
