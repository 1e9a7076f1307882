//! Bit-width changes of a shared value whose range is known.
//!
//! * **Reduction** to k bits needs no protocol: additive shares reduced
//!   mod 2^k are shares of `x mod 2^k` ([`reduce`]).
//! * **Extension** from k to n bits ([`extend`]) is a gate: with the k-bit
//!   view `û = (x̂ + c) mod 2^k` and its wrap bit `w = [û < r mod 2^k]`,
//!   `u = û − (r mod 2^k) + 2^k·w` exactly, so the signed value is
//!   `u − 2^(k−1)` (c = 2^(k−1)) and the unsigned one `u` (c = 0). The SUF
//!   is empty; Φ is affine in one wrap bit and one mask constant.
//!   Cost: one k-bit key, 1 point, 2 rounds, n + 1 bits sent; P1 holds 2
//!   words. The input may be any n-bit sharing whose low k bits are the
//!   value (e.g. shares computed mod 2^k).

use crate::compile::View;
use crate::error::SufError;
use crate::gate::{Gate, Input};
use crate::phi::{Factor, Kappa, Phi, PolyMode, Public, Term};
use crate::ring::Width;
use crate::suf::{Domain, Suf};

/// Reduces one party's shares to k bits in place.
pub fn reduce(k: Width, shares: &mut [u64]) {
    for s in shares {
        *s = k.reduce(*s);
    }
}

/// Extends a k-bit value to the ring, sign-extending when `signed`.
pub const fn extend(ring: Width, k: Width, signed: bool) -> Result<Gate, SufError> {
    if k.bits() > ring.bits() {
        return Err(SufError::FixedPoint);
    }
    let main = View::new(k, if signed { k.half() } else { 0 });
    let phi = Phi::new(PolyMode::Monomials)
        .with_kappa(Kappa::MaskBits { width: k, shift: 0 })
        .with_output(
            ring,
            &[
                Term::new(
                    1,
                    Public::ViewShr {
                        view: main,
                        shift: 0,
                    },
                    &[],
                ),
                Term::new(ring.neg(1), Public::One, &[Factor::Kappa(0)]),
                Term::new(
                    if k.bits() >= 64 {
                        0
                    } else {
                        ring.reduce(1u64 << k.bits())
                    },
                    Public::One,
                    &[Factor::Wrap(main)],
                ),
                Term::constant(if signed { ring.neg(k.half()) } else { 0 }),
            ],
        );
    let domain = if signed {
        Domain::Signed
    } else {
        Domain::Unsigned
    };
    Gate::new(&Suf::new(ring, domain, 0, 0, 0), k, phi, Input::Shares)
}

/// The extension's spec.
pub const fn extend_spec(ring: Width, k: Width, signed: bool, x: u64) -> u64 {
    if signed {
        k.sign_extend(k.reduce(x), ring)
    } else {
        k.reduce(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::testing::{edges, exhaustive_small};

    #[test]
    fn extension_on_every_word() {
        for (n, k) in [(8, 5), (10, 10), (9, 1)] {
            let (n, k) = (Width::of(n), Width::of(k));
            for signed in [true, false] {
                let gate = extend(n, k, signed).unwrap();
                exhaustive_small(&gate, &|x| ([extend_spec(n, k, signed, x), 0], 0));
            }
        }
    }

    #[test]
    fn extension_at_64_bits() {
        for k in [20, 50, 64] {
            let (n, k) = (Width::W64, Width::of(k));
            for signed in [true, false] {
                edges(&extend(n, k, signed).unwrap(), &|x| {
                    ([extend_spec(n, k, signed, x), 0], 0)
                });
            }
        }
    }
}
