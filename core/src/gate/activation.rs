//! Smooth scalar functions as spline gates: GeLU (erf and tanh forms),
//! SiLU and nExp.
//!
//! * Spec: the fixed-point spline itself ([`Spline::suf`]): input at `frac`
//!   fractional bits, output at `out_scale = degree·frac + coeff_bits`.
//!   Its distance to the real function is the accuracy statement below,
//!   and a test sweeps every input of the range to enforce it.
//! * SUF: one polynomial output with the pieces of [`super::splines`]:
//!   degree 2, except [`GeluForm::TanhLinear`], [`SiluForm::Linear`] and
//!   [`NexpForm::Linear`], of degree 1, whose outputs carry
//!   `frac + coeff_bits` fraction bits (24 at frac = 12), not
//!   `2·frac + coeff_bits` (`cargo xtask fit` says which and why). The
//!   tails are `x` and `0` (activations) or `1` and `0` (nExp). The pieces
//!   carry x⁺ folded in (x⁺ + δ(x)).
//! * Φ: the polynomial, in one of two forms ([`PolyMode`]). GeLU's is
//!   Beaver-style: after the Boolean round the parties open `c₁ − a₁` (and
//!   `c₂ − a₂` at degree 2) and finish locally with dealer monomials
//!   (`a₁r`, and `a₂r, a₂r², r²` at degree 2): 3 rounds. SiLU's and nExp's
//!   take dealer monomials `ρ_t·r^j` for every interval bit instead (2
//!   rounds, one word less sent per element, more explicit words for P1:
//!   `cargo xtask bench gates`, docs/GATES.md).
//! * Accuracy at frac = 12, coeff_bits = 12: GeLU |err| ≤ 2^-8 on all
//!   inputs, SiLU |err| ≤ 2^-8, nExp |err| ≤ 2^-10 for z ≥ 0. A degree-1
//!   piece's slope is rounded in the piece's local variable `x − center`,
//!   so its rounding error is at most `2^-13·h/2` for a piece of width h.
//! * Cost at effective width k: one k-bit key (`16(k − 7) + 16` bytes), one
//!   point per interior boundary plus one; 3 rounds and `n + b + d·n` bits
//!   (opening, b boundary bits, d Beaver openings) Beaver-style, 2 rounds
//!   and `n + b` bits with dealer monomials.
//!
//! The output is left at `out_scale` on purpose: rescaling costs a
//! truncation (2 rounds), and the linear layer that consumes an activation
//! is followed by a truncation anyway, which can absorb it when the range
//! allows (the planner decides).

use crate::error::SufError;
use crate::gate::spline::Spline;
use crate::gate::splines;
use crate::gate::{Gate, Input};
use crate::phi::{Phi, PolyMode};
use crate::ring::Width;
use crate::suf::Suf;

/// Which GeLU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GeluForm {
    /// `x·Φ(x)` with the Gaussian CDF (BERT).
    Erf,
    /// `x·σ(1.5958·(x + 0.044715·x³))` approximation (GPT-2).
    Tanh,
    /// The tanh form to 2^-11 instead of 2^-8 (13 pieces instead of 5:
    /// P1's key grows by 64 bytes per element, P0's not at all), for an
    /// MLP whose output a norm rescales to unit RMS (Gemma 3).
    TanhFine,
    /// The tanh form with pieces of degree 1 (13 instead of 5): output at
    /// `frac + coeff_bits`, so the product after it truncates `frac` bits
    /// fewer; 2.1 times the DCF points, so decode passes take it.
    TanhLinear,
}

/// Which SiLU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SiluForm {
    /// Pieces of degree 2 (7): output at `2·frac + coeff_bits`.
    Quadratic,
    /// Pieces of degree 1 (22, fitted to 2/3 of the quadratic form's
    /// error): output at `frac + coeff_bits`, for decode passes, as
    /// [`GeluForm::TanhLinear`].
    Linear,
}

/// Which nExp.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NexpForm {
    /// Pieces of degree 2 (7): output at `2·frac + coeff_bits`.
    Quadratic,
    /// Pieces of degree 1 (22, the same error target): output at
    /// `frac + coeff_bits`, so the weighted values `E·V` truncate `frac`
    /// bits fewer; for decode passes, as [`GeluForm::TanhLinear`].
    Linear,
}

/// Default coefficient precision: local coefficients rounded at
/// `2^-coeff_bits` keep the rounding error below 2^-12.
pub const COEFF_BITS: u32 = 12;

/// The GeLU spline.
pub const fn gelu_spline(form: GeluForm) -> &'static Spline {
    match form {
        GeluForm::Erf => &splines::GELU_ERF,
        GeluForm::Tanh => &splines::GELU_TANH,
        GeluForm::TanhFine => &splines::GELU_TANH_FINE,
        GeluForm::TanhLinear => &splines::GELU_TANH_LINEAR,
    }
}

/// The SiLU spline.
pub const fn silu_spline(form: SiluForm) -> &'static Spline {
    match form {
        SiluForm::Quadratic => &splines::SILU,
        SiluForm::Linear => &splines::SILU_LINEAR,
    }
}

/// The nExp spline.
pub const fn nexp_spline(form: NexpForm) -> &'static Spline {
    match form {
        NexpForm::Quadratic => &splines::NEXP,
        NexpForm::Linear => &splines::NEXP_LINEAR,
    }
}

/// A spline gate at effective width `k` with its Φ in `mode`: input at
/// `frac` bits, output at `2·frac + coeff_bits`.
pub fn spline_gate_in(
    mode: PolyMode,
    spline: &Spline,
    ring: Width,
    k: Width,
    frac: u32,
    coeff_bits: u32,
) -> Result<Gate, SufError> {
    let mut gate = Gate::EMPTY;
    init_in(&mut gate, mode, spline, (ring, k), frac, coeff_bits)?;
    Ok(gate)
}

/// A spline gate at effective width `k`, Beaver-style: input at `frac`
/// bits, output at `2·frac + coeff_bits`.
pub fn spline_gate(
    spline: &Spline,
    ring: Width,
    k: Width,
    frac: u32,
    coeff_bits: u32,
) -> Result<Gate, SufError> {
    spline_gate_in(PolyMode::Beaver, spline, ring, k, frac, coeff_bits)
}

/// [`spline_gate`] built in `gate`, where it lies ([`Gate::init`]): for
/// targets whose stack cannot hold a returned descriptor (examples/mcu).
/// Never inlined, so that its SUF and Φ temporaries do not join the
/// caller's frame.
#[inline(never)]
pub fn spline_gate_init(
    gate: &mut Gate,
    spline: &Spline,
    ring: Width,
    k: Width,
    frac: u32,
    coeff_bits: u32,
) -> Result<(), SufError> {
    init_in(gate, PolyMode::Beaver, spline, (ring, k), frac, coeff_bits)
}

/// [`spline_gate_in`] built in `gate`. Never inlined, as
/// [`spline_gate_init`].
#[inline(never)]
fn init_in(
    gate: &mut Gate,
    mode: PolyMode,
    spline: &Spline,
    (ring, k): (Width, Width),
    frac: u32,
    coeff_bits: u32,
) -> Result<(), SufError> {
    // The one `Suf` on this frame, written in place (`Spline::suf` would
    // put the returned `Result` and the tables it is built from here too).
    let mut suf = Suf::EMPTY;
    spline.suf_init(&mut suf, ring, frac, coeff_bits)?;
    gate.init(&suf, k, &Phi::poly(ring, mode), Input::Shares)
}

/// GeLU.
pub fn gelu(form: GeluForm, ring: Width, k: Width, frac: u32) -> Result<Gate, SufError> {
    spline_gate(gelu_spline(form), ring, k, frac, COEFF_BITS)
}

/// [`gelu`] built in `gate`, where it lies.
pub fn gelu_init(
    gate: &mut Gate,
    form: GeluForm,
    ring: Width,
    k: Width,
    frac: u32,
) -> Result<(), SufError> {
    spline_gate_init(gate, gelu_spline(form), ring, k, frac, COEFF_BITS)
}

/// GeLU with dealer monomials (2 rounds), the form plans take: the same
/// function as [`gelu`] (Beaver-style, 3 rounds), which stays its oracle
/// and the firmware's gate (examples/mcu).
pub fn gelu_monomials(form: GeluForm, ring: Width, k: Width, frac: u32) -> Result<Gate, SufError> {
    spline_gate_in(
        PolyMode::Monomials,
        gelu_spline(form),
        ring,
        k,
        frac,
        COEFF_BITS,
    )
}

/// SiLU, with dealer monomials (2 rounds).
pub fn silu(form: SiluForm, ring: Width, k: Width, frac: u32) -> Result<Gate, SufError> {
    spline_gate_in(
        PolyMode::Monomials,
        silu_spline(form),
        ring,
        k,
        frac,
        COEFF_BITS,
    )
}

/// nExp(z) = e^-z for z ≥ 0 (1 below 0, 0 from 12 on), with dealer
/// monomials (2 rounds).
pub fn nexp(form: NexpForm, ring: Width, k: Width, frac: u32) -> Result<Gate, SufError> {
    spline_gate_in(
        PolyMode::Monomials,
        nexp_spline(form),
        ring,
        k,
        frac,
        COEFF_BITS,
    )
}

/// The output scale of a spline gate.
pub fn out_scale(spline: &Spline, frac: u32, coeff_bits: u32) -> u32 {
    frac * u32::try_from(spline.degree).unwrap_or(u32::MAX) + coeff_bits
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::testing::{check_pairs, edges, exhaustive_small};
    use proptest::prelude::*;

    fn gelu_erf(x: f64) -> f64 {
        0.5 * x * (1.0 + libm::erf(x / core::f64::consts::SQRT_2))
    }

    fn gelu_tanh(x: f64) -> f64 {
        let c = libm::sqrt(2.0 / core::f64::consts::PI);
        0.5 * x * (1.0 + libm::tanh(c * (x + 0.044_715 * x * x * x)))
    }

    fn silu(x: f64) -> f64 {
        x / (1.0 + libm::exp(-x))
    }

    /// Max |fixed-point spline − f| over every input with |x| < 2^(k−1−f) (real).
    fn max_error(spline: &Spline, f: fn(f64) -> f64, frac: u32, lo: f64, hi: f64) -> f64 {
        let ring = Width::W64;
        let suf = spline.suf(ring, frac, COEFF_BITS).unwrap();
        let s = out_scale(spline, frac, COEFF_BITS);
        let scale_in = crate::ring::pow2(frac);
        let scale_out = crate::ring::pow2(s);
        let mut worst = 0.0f64;
        let mut x = (lo * scale_in) as i64;
        while (x as f64) < hi * scale_in {
            let y = suf.eval(ring.from_signed(x)).arith[0];
            let got = ring.to_signed(y) as f64 / scale_out;
            let want = f(x as f64 / scale_in);
            worst = worst.max((got - want).abs());
            x += 1;
        }
        worst
    }

    #[test]
    fn accuracy_at_frac_12() {
        let e = max_error(&splines::GELU_ERF, gelu_erf, 12, -64.0, 64.0);
        assert!(e <= 2f64.powi(-8), "GeLU erf error {e}");
        let e = max_error(&splines::GELU_TANH, gelu_tanh, 12, -64.0, 64.0);
        assert!(e <= 2f64.powi(-8), "GeLU tanh error {e}");
        let e = max_error(&splines::GELU_TANH_FINE, gelu_tanh, 12, -64.0, 64.0);
        assert!(e <= 2f64.powi(-11), "fine GeLU tanh error {e}");
        let e = max_error(&splines::GELU_TANH_LINEAR, gelu_tanh, 12, -64.0, 64.0);
        assert!(e <= 2f64.powi(-8), "GeLU tanh, degree 1, error {e}");
        let e = max_error(&splines::SILU, silu, 12, -64.0, 64.0);
        assert!(e <= 2f64.powi(-8), "SiLU error {e}");
        let e = max_error(&splines::SILU_LINEAR, silu, 12, -64.0, 64.0);
        assert!(e <= 2f64.powi(-8), "SiLU, degree 1, error {e}");
        let e = max_error(&splines::NEXP, |z| libm::exp(-z), 12, 0.0, 64.0);
        assert!(e <= 2f64.powi(-10), "nExp error {e}");
        let e = max_error(&splines::NEXP_LINEAR, |z| libm::exp(-z), 12, 0.0, 64.0);
        assert!(e <= 2f64.powi(-10), "nExp, degree 1, error {e}");
    }

    /// The in-place constructor (through `Spline::suf_init`) builds the
    /// gate that `Gate::new` builds from `Spline::suf`'s returned SUF.
    #[test]
    fn in_place_spline_gates_equal_returned_ones() {
        let n = Width::W64;
        let mut gate = Gate::EMPTY;
        for (spline, k) in [
            (gelu_spline(GeluForm::Erf), 20),
            (gelu_spline(GeluForm::Tanh), 26),
            (gelu_spline(GeluForm::TanhFine), 22),
            (gelu_spline(GeluForm::TanhLinear), 26),
            (&splines::SILU, 30),
            (&splines::SILU_LINEAR, 18),
            (&splines::NEXP, 24),
            (&splines::NEXP_LINEAR, 27),
        ] {
            let k = Width::of(k);
            let suf = spline.suf(n, 12, COEFF_BITS).unwrap();
            let phi = Phi::poly(n, PolyMode::Beaver);
            let want = Gate::new(&suf, k, phi, Input::Shares).unwrap();
            spline_gate_init(&mut gate, spline, n, k, 12, COEFF_BITS).unwrap();
            assert!(gate == want);
        }
    }

    #[test]
    fn small_ring_gelu_is_exact_against_its_spec() {
        // At f = 2 on Z_2^10 (knots snapped to the grid) the spline is a
        // small SUF we can sweep fully.
        // The fine and the degree-1 tanh forms, at f = 3 on Z_2^12, keep 9
        // or more intervals.
        for (spline, n, k, f, pieces) in [
            (&splines::GELU_ERF, 10, 8, 2, 5),
            (&splines::GELU_TANH_FINE, 12, 10, 3, 9),
            (&splines::GELU_TANH_LINEAR, 12, 10, 3, 9),
        ] {
            let (n, k) = (Width::of(n), Width::of(k));
            let suf = spline.suf_snapped(n, f, 3).unwrap();
            let gate = Gate::new(&suf, k, Phi::poly(n, PolyMode::Beaver), Input::Shares).unwrap();
            assert!(suf.intervals >= pieces, "{}", suf.intervals);
            assert_eq!(gate.cost().rounds, 3);
            let suf = gate.compiled.suf;
            exhaustive_small(&gate, &|x| ([suf.eval_at(x, k).arith[0], 0], 0));
        }
    }

    /// GeLU, SiLU and nExp run with dealer monomials: two rounds, the
    /// same function as the Beaver-style gate (their oracle), swept fully
    /// on a small ring with pinned wrap masks.
    #[test]
    fn dealer_monomial_splines_equal_the_beaver_form() {
        let (n, k) = (Width::of(12), Width::of(10));
        for spline in [
            &splines::GELU_ERF,
            &splines::GELU_TANH,
            &splines::GELU_TANH_FINE,
            &splines::GELU_TANH_LINEAR,
            &splines::SILU,
            &splines::SILU_LINEAR,
            &splines::NEXP,
            &splines::NEXP_LINEAR,
        ] {
            let suf = spline.suf_snapped(n, 2, 3).unwrap();
            let fast =
                Gate::new(&suf, k, Phi::poly(n, PolyMode::Monomials), Input::Shares).unwrap();
            let oracle = Gate::new(&suf, k, Phi::poly(n, PolyMode::Beaver), Input::Shares).unwrap();
            assert_eq!((fast.cost().rounds, oracle.cost().rounds), (2, 3));
            for x in 0..=n.mask() {
                let (mut a, mut b) = ([0u64; 2], [0u64; 2]);
                fast.reference(x, &mut a);
                oracle.reference(x, &mut b);
                assert_eq!(a, b, "x = {x}");
            }
            let suf = fast.compiled.suf;
            exhaustive_small(&fast, &|x| ([suf.eval_at(x, k).arith[0], 0], 0));
        }
        let w = Width::W64;
        for form in [SiluForm::Quadratic, SiluForm::Linear] {
            assert_eq!(
                super::silu(form, w, Width::of(26), 12)
                    .unwrap()
                    .cost()
                    .rounds,
                2
            );
        }
        for form in [NexpForm::Quadratic, NexpForm::Linear] {
            assert_eq!(nexp(form, w, Width::of(24), 12).unwrap().cost().rounds, 2);
        }
        for form in [
            GeluForm::Erf,
            GeluForm::Tanh,
            GeluForm::TanhFine,
            GeluForm::TanhLinear,
        ] {
            let gate = gelu_monomials(form, w, Width::of(26), 12).unwrap();
            assert_eq!(gate.cost().rounds, 2);
        }
    }

    #[test]
    fn activation_edges_at_64_bits() {
        let n = Width::W64;
        for (gate, k) in [
            (gelu(GeluForm::Erf, n, Width::of(26), 12).unwrap(), 26),
            (gelu(GeluForm::Tanh, n, Width::of(64), 12).unwrap(), 64),
            (gelu(GeluForm::TanhFine, n, Width::of(22), 12).unwrap(), 22),
            (
                gelu(GeluForm::TanhLinear, n, Width::of(26), 12).unwrap(),
                26,
            ),
            (
                super::silu(SiluForm::Quadratic, n, Width::of(30), 12).unwrap(),
                30,
            ),
            (
                super::silu(SiluForm::Linear, n, Width::of(18), 12).unwrap(),
                18,
            ),
            (nexp(NexpForm::Quadratic, n, Width::of(24), 12).unwrap(), 24),
            (nexp(NexpForm::Linear, n, Width::of(27), 12).unwrap(), 27),
            (
                gelu_monomials(GeluForm::Erf, n, Width::of(21), 12).unwrap(),
                21,
            ),
            (
                gelu_monomials(GeluForm::Tanh, n, Width::of(64), 12).unwrap(),
                64,
            ),
            (
                gelu_monomials(GeluForm::TanhFine, n, Width::of(22), 12).unwrap(),
                22,
            ),
            (
                gelu_monomials(GeluForm::TanhLinear, n, Width::of(26), 12).unwrap(),
                26,
            ),
        ] {
            let suf = gate.compiled.suf;
            let k = Width::of(k);
            edges(&gate, &|x| ([suf.eval_at(x, k).arith[0], 0], 0));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(12))]
        #[test]
        fn gelu_random_at_64_bits(xs in proptest::collection::vec(any::<u64>(), 64), rs in proptest::collection::vec(any::<u64>(), 64)) {
            let n = Width::W64;
            for (form, k) in [(GeluForm::Erf, 26), (GeluForm::TanhFine, 22), (GeluForm::TanhLinear, 26)] {
                let k = Width::of(k);
                let gate = gelu(form, n, k, 12).unwrap();
                let suf = gate.compiled.suf;
                // Half the inputs inside the spline's range, half anywhere.
                let xs: std::vec::Vec<u64> = xs.iter().enumerate().map(|(i, x)| if i % 2 == 0 { n.from_signed((*x as i64) >> 48) } else { *x }).collect();
                check_pairs(&gate, &xs, &rs, &|x| ([suf.eval_at(x, k).arith[0], 0], 0), 4);
            }
        }

        /// nExp, SiLU and GeLU with dealer monomials against their spec,
        /// which the Beaver-style gate meets too.
        #[test]
        fn monomial_splines_random_at_64_bits(xs in proptest::collection::vec(any::<u64>(), 64), rs in proptest::collection::vec(any::<u64>(), 64)) {
            let n = Width::W64;
            for (gate, k) in [
                (nexp(NexpForm::Quadratic, n, Width::of(24), 12).unwrap(), 24),
                (nexp(NexpForm::Linear, n, Width::of(27), 12).unwrap(), 27),
                (super::silu(SiluForm::Quadratic, n, Width::of(26), 12).unwrap(), 26),
                (super::silu(SiluForm::Linear, n, Width::of(26), 12).unwrap(), 26),
                (gelu_monomials(GeluForm::Erf, n, Width::of(26), 12).unwrap(), 26),
                (gelu_monomials(GeluForm::Tanh, n, Width::of(26), 12).unwrap(), 26),
                (gelu_monomials(GeluForm::TanhFine, n, Width::of(22), 12).unwrap(), 22),
                (gelu_monomials(GeluForm::TanhLinear, n, Width::of(26), 12).unwrap(), 26),
            ] {
                let k = Width::of(k);
                let suf = gate.compiled.suf;
                let xs: std::vec::Vec<u64> = xs.iter().enumerate().map(|(i, x)| if i % 2 == 0 { n.from_signed((*x as i64) >> 44) } else { *x }).collect();
                check_pairs(&gate, &xs, &rs, &|x| ([suf.eval_at(x, k).arith[0], 0], 0), 4);
            }
        }
    }
}
