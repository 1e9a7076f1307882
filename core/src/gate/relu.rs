//! ReLU with its sign bit, and DReLU.
//!
//! * Spec: `ReLU(x) = max(x, 0)` on signed x; the sign bit is `[x < 0]`;
//!   `DReLU(x) = [x ≥ 0]`. Exact.
//! * SUF: two intervals split at 0; the polynomial is `0` or `x`; the bit
//!   output is `MSB(x)` (ReLU) or `¬MSB(x)` (DReLU).
//! * Φ: `ReLU = c₁(x)·x` with `c₁` selected by the boundary bit; one dealer
//!   monomial `ρ·r` makes it local after the Boolean round.
//! * Cost (effective width k): one k-bit DCF key (`16(k − 7) + 16` bytes
//!   of correction words), 2 evaluation points, 2 rounds; P1 also holds
//!   `[ρ]` and `[ρ·r]`. Communication: n bits (opening) + 1 bit. DReLU needs
//!   only the opening round: the sign bit is an XOR share right after the
//!   DCF evaluation.

use crate::error::SufError;
use crate::gate::{Gate, Input};
use crate::phi::{Phi, PolyMode};
use crate::ring::Width;
use crate::suf::{Domain, Op, Pred, Program, Suf};

/// The ReLU SUF over `ring`: one ring output `max(x, 0)`, one bit `[x < 0]`.
pub const fn relu_suf(ring: Width) -> Suf {
    Suf::piecewise(
        ring,
        Domain::Signed,
        0,
        1,
        1,
        &[0],
        &[[[0; 4], [0; 4]], [[0, 1, 0, 0], [0; 4]]],
    )
    .with_pred(Pred::Msb)
    .with_program(Program::from_ops(&[Op::Pred(0)]))
    .with_bools(&[1])
}

/// ReLU at effective width k: exact for |x| < 2^(k−1).
pub const fn relu(ring: Width, k: Width) -> Result<Gate, SufError> {
    let mut gate = Gate::EMPTY;
    match relu_init(&mut gate, ring, k) {
        Ok(()) => Ok(gate),
        Err(e) => Err(e),
    }
}

/// [`relu`] built in `gate`, where it lies ([`Gate::init`]): for targets
/// whose stack cannot hold a returned descriptor (examples/mcu). Never
/// inlined, so that its SUF and Φ temporaries do not join the caller's
/// frame.
#[inline(never)]
pub const fn relu_init(gate: &mut Gate, ring: Width, k: Width) -> Result<(), SufError> {
    gate.init(
        &relu_suf(ring),
        k,
        &Phi::poly(ring, PolyMode::Monomials),
        Input::Shares,
    )
}

/// ReLU without the sign bit output (for trees that only need the value).
pub const fn relu_value(ring: Width, k: Width) -> Result<Gate, SufError> {
    let suf = Suf::piecewise(
        ring,
        Domain::Signed,
        0,
        1,
        1,
        &[0],
        &[[[0; 4], [0; 4]], [[0, 1, 0, 0], [0; 4]]],
    );
    Gate::new(&suf, k, Phi::poly(ring, PolyMode::Monomials), Input::Shares)
}

/// DReLU `[x ≥ 0]` at effective width k, as an XOR-shared bit.
pub const fn drelu(ring: Width, k: Width) -> Result<Gate, SufError> {
    let suf = Suf::new(ring, Domain::Signed, 0, 0, 0)
        .with_pred(Pred::Msb)
        .with_program(Program::from_ops(&[Op::Pred(0), Op::Not]))
        .with_bools(&[1]);
    Gate::new(&suf, k, Phi::new(PolyMode::Monomials), Input::Shares)
}

/// The ReLU spec on a canonical ring word.
pub const fn relu_spec(ring: Width, x: u64) -> u64 {
    if ring.to_signed(x) < 0 {
        0
    } else {
        ring.reduce(x)
    }
}

/// ReLU and its sign bit as a gate of effective width `k` computes them on
/// any ring word: decided on the k-bit view, equal to the spec in range.
pub const fn relu_at(ring: Width, k: Width, x: u64) -> (u64, bool) {
    if k.to_signed(k.reduce(x)) < 0 {
        (0, true)
    } else {
        (ring.reduce(x), false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::testing::{check_pairs, edges, exhaustive_small};
    use proptest::prelude::*;

    fn spec(n: Width, k: Width) -> impl Fn(u64) -> ([u64; 2], u32) {
        move |x| {
            let (y, s) = relu_at(n, k, x);
            ([y, 0], u32::from(s))
        }
    }

    #[test]
    fn relu_is_exact_for_every_input_and_mask_at_small_widths() {
        for (n, k) in [(8, 8), (8, 5), (10, 10)] {
            let (n, k) = (Width::of(n), Width::of(k));
            let gate = relu(n, k).unwrap();
            assert_eq!(gate.cost().rounds, 2);
            exhaustive_small(&gate, &spec(n, k));
        }
        // In range, the width-k gate is the spec.
        let (n, k) = (Width::of(10), Width::of(6));
        for x in 0..1u64 << 10 {
            if k.fits_signed(n.to_signed(x)) {
                assert_eq!(relu_at(n, k, x).0, relu_spec(n, x));
            }
        }
    }

    #[test]
    fn drelu_is_exact() {
        let (n, k) = (Width::of(8), Width::of(6));
        let gate = drelu(n, k).unwrap();
        assert_eq!(gate.cost().rounds, 1);
        exhaustive_small(&gate, &|x| ([0, 0], u32::from(!relu_at(n, k, x).1)));
    }

    #[test]
    fn relu_edges_at_64_bits() {
        for k in [64, 40] {
            let (n, k) = (Width::W64, Width::of(k));
            edges(&relu(n, k).unwrap(), &spec(n, k));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn relu_random_at_64_bits(xs in proptest::collection::vec(any::<u64>(), 64), rs in proptest::collection::vec(any::<u64>(), 64), k in 20u32..=64) {
            let (n, k) = (Width::W64, Width::of(k));
            check_pairs(&relu(n, k).unwrap(), &xs, &rs, &spec(n, k), 9);
        }
    }
}
