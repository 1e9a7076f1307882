//! Reciprocal and reciprocal square root, by range reduction.
//!
//! A relative-error target over a wide range does not fit one fixed-point
//! polynomial: the coefficients of 1/v on a far octave are too small for
//! any common scale. So both are chains (see [`super::chain`]):
//!
//! 1. **Range reduction (SUF).** Intervals are the octaves `[2^b, 2^(b+s))`
//!    of the integer input V (s = 1 for 1/v, s = 2 for 1/√v, so that
//!    `2^(−b/2)` is a power of two). The SUF has two ring outputs: the
//!    mantissa `M = V·2^(G−b)`, so `m = M/2^G ∈ [1, 2^s)`, and the exponent
//!    factor `F = 2^(H + e)` where the answer is `g(m)·2^e`.
//! 2. **Truncation** of M to `frac_m` fraction bits (gap LRS, one round:
//!    [`RingTrunc`]).
//! 3. **Mantissa spline** `g(m) = 1/m` or `1/√m` on `[1, 2^s)`
//!    ([`super::splines::RECIP_MANTISSA`], [`super::splines::RSQRT_MANTISSA`]).
//! 4. **Product** `g(m)·F` (Beaver).
//! 5. **Truncation** to the output scale (gap ARS, one round).
//!
//! Inputs below 1 ulp (V = 0, or V = 1 for rsqrt with odd scale) saturate
//! to the value at V = 1. Accuracy (enforced by a sweep): relative error
//! ≤ 2^-7 for every input of the range at the default scales, plus one unit
//! of the output. Rsqrt's mantissa spline is fitted to 2^-11 (five pieces),
//! so its chain is within 3.4·10⁻⁴ (sampled over every octave at
//! `frac_out` = 40): a norm's ρ scales a whole row, and Gemma 3's six
//! norms per block compound it. Cost: 5 rounds, one per step: the range
//! reduction and the spline are one-round SUFs ([`RingSuf`]: ring-output
//! keys with the mask's powers as payloads, evaluated at one point per
//! octave or knot), the truncations take their carry from a ring-output
//! key ([`RingTrunc`]). The same chain with two-round gates and
//! truncations (9 rounds, fewer key bytes) is the test oracle.

use crate::error::SufError;
use crate::gate::chain::{Chain, Lin, Source, Step};
use crate::gate::ring_suf::RingSuf;
use crate::gate::ring_trunc::RingTrunc;
use crate::gate::spline::Spline;
use crate::gate::splines;
use crate::gate::trunc::{Range, Shift, trunc};
use crate::gate::{Gate, Input};
use crate::phi::{Factor, Phi, PolyMode, Public, Term};
use crate::ring::Width;
use crate::suf::{Domain, MAX_ARITH, MAX_DEGREE, MAX_INTERVALS, Suf};

/// Scales of a range-reduced inverse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct InverseScales {
    /// Fraction bits of the input.
    pub frac_in: u32,
    /// Input width: the input is below 2^k_in.
    pub k_in: u32,
    /// The smallest octave: inputs below `2^lo_bits` (integer) saturate to
    /// the value there. For a softmax denominator (≥ 1) it is `frac_in`.
    pub lo_bits: u32,
    /// Fraction bits the mantissa is truncated to.
    pub frac_m: u32,
    /// Coefficient bits of the mantissa spline.
    pub coeff_bits: u32,
    /// Fraction bits of the output.
    pub frac_out: u32,
}

/// Which inverse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Inverse {
    /// `1/v`.
    Recip,
    /// `1/√v`.
    Rsqrt,
}

impl Inverse {
    /// Octave step s: m ∈ [1, 2^s).
    const fn step(self) -> u32 {
        match self {
            Inverse::Recip => 1,
            Inverse::Rsqrt => 2,
        }
    }

    fn spline(self) -> &'static Spline {
        match self {
            Inverse::Recip => &splines::RECIP_MANTISSA,
            Inverse::Rsqrt => &splines::RSQRT_MANTISSA,
        }
    }

    /// The real function, for accuracy statements.
    pub fn real(self, v: f64) -> f64 {
        match self {
            Inverse::Recip => 1.0 / v,
            Inverse::Rsqrt => 1.0 / sqrt(v),
        }
    }
}

/// `√v` for v ≥ 0 by Newton's method (`f64::sqrt` is std-only).
fn sqrt(v: f64) -> f64 {
    if v <= 0.0 {
        return 0.0;
    }
    let mut x = if v > 1.0 { v } else { 1.0 };
    for _ in 0..64 {
        x = 0.5 * (x + v / x);
    }
    x
}

/// The range-reduction SUF and its constants `(G, H)`.
fn octaves(kind: Inverse, ring: Width, sc: &InverseScales) -> Result<(Suf, u32, u32), SufError> {
    let s = kind.step();
    let f = sc.frac_in;
    // Octaves start at b ≡ f (mod s) so that e = (f − b)/s is an integer.
    let b0 = sc.lo_bits + (s - (sc.lo_bits % s + s - f % s) % s) % s;
    if b0 >= sc.k_in {
        return Err(SufError::FixedPoint);
    }
    let mut starts = [0u32; MAX_INTERVALS];
    let mut count = 0;
    let mut b = b0;
    while b < sc.k_in {
        if count >= MAX_INTERVALS - 1 {
            return Err(SufError::Capacity);
        }
        starts[count] = b;
        count += 1;
        b += s;
    }
    let b_max = starts[count - 1];
    let g = b_max + s; // M = V·2^(G−b) ≥ 2^G with G − b ≥ s ≥ 1
    // F = 2^(H + (f − b)/s) must be an integer for every octave.
    let h = b_max.saturating_sub(f).div_ceil(s);
    let f_of =
        |b: u32| -> u64 { 1u64 << (i64::from(h) + (i64::from(f) - i64::from(b)) / i64::from(s)) };
    let mut cuts = [0i128; MAX_INTERVALS];
    let mut coeffs = [[[0u64; MAX_DEGREE + 1]; MAX_ARITH]; MAX_INTERVALS];
    // Below the first octave: saturate as at V = 2^b0.
    coeffs[0][0][0] = ring.reduce(1u64 << g);
    coeffs[0][1][0] = ring.reduce(f_of(b0));
    for (i, &b) in starts[..count].iter().enumerate() {
        cuts[i] = 1i128 << b;
        coeffs[i + 1][0][1] = ring.reduce(1u64 << (g - b));
        coeffs[i + 1][1][0] = ring.reduce(f_of(b));
    }
    let suf = Suf::piecewise(
        ring,
        Domain::Unsigned,
        f,
        2,
        1,
        &cuts[..count],
        &coeffs[..count + 1],
    );
    suf.validate()?;
    Ok((suf, g, h))
}

/// The inverse as a chain; its output has `frac_out` fraction bits. Every
/// step takes one round: 5 rounds.
pub fn inverse(kind: Inverse, ring: Width, sc: InverseScales) -> Result<Chain, SufError> {
    chain_of(kind, ring, sc, Form::OneRound)
}

/// How a chain's SUFs and truncations run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    /// Bit-output keys and a B2A round each ([`Gate`], [`trunc`]): the
    /// test oracle.
    #[cfg_attr(not(test), allow(dead_code))]
    TwoRounds,
    /// Ring-output keys ([`RingSuf`], [`RingTrunc`]).
    OneRound,
}

/// A SUF step on `input` at width `k`; `phi` gives the two-round gate's
/// outputs, which must be the SUF's polynomials in order (the one-round
/// gate's outputs).
fn suf_step(form: Form, suf: &Suf, k: Width, phi: Phi, input: Lin) -> Result<Step, SufError> {
    Ok(match form {
        Form::TwoRounds => Step::Gate {
            gate: Gate::new(suf, k, phi, Input::Shares)?,
            input,
        },
        Form::OneRound => Step::Suf {
            gate: RingSuf::new(suf, k)?,
            input,
        },
    })
}

/// A gap truncation step of `input` by `f` bits at width `k`.
fn truncation(
    form: Form,
    ring: Width,
    (k, f, shift): (u32, u32, Shift),
    input: Lin,
) -> Result<Step, SufError> {
    let k = Width::new(k).map_err(|_| SufError::FixedPoint)?;
    Ok(match form {
        Form::TwoRounds => Step::Gate {
            gate: trunc(ring, k, f, shift, Range::Gap)?,
            input,
        },
        Form::OneRound => Step::Trunc {
            gate: RingTrunc::new(ring, k, f, shift)?,
            input,
        },
    })
}

fn chain_of(kind: Inverse, ring: Width, sc: InverseScales, form: Form) -> Result<Chain, SufError> {
    let n = ring.bits();
    let (suf, g, h) = octaves(kind, ring, &sc)?;
    let s = kind.step();
    let phi = Phi::new(PolyMode::Monomials)
        .with_output(ring, &[Term::new(1, Public::One, &[Factor::Poly(0)])])
        .with_output(ring, &[Term::new(1, Public::One, &[Factor::Poly(1)])]);
    let k_in = Width::new(sc.k_in).map_err(|_| SufError::FixedPoint)?;
    let reduce = suf_step(form, &suf, k_in, phi, Lin::of(Source::Input))?;
    // M < 2^(G+s): truncate to frac_m bits.
    let k_m = g + s + 1;
    if k_m >= n || sc.frac_m >= g {
        return Err(SufError::FixedPoint);
    }
    let step = |i: u8, j: u8| Source::Output { step: i, index: j };
    let mantissa = truncation(
        form,
        ring,
        (k_m, g - sc.frac_m, Shift::Logical),
        Lin::of(step(0, 0)),
    )?;
    let k_spline = sc.frac_m + s + 2;
    let spline_suf = kind.spline().suf(ring, sc.frac_m, sc.coeff_bits)?;
    // The two-round form: dealer monomials are cheaper than a Beaver round.
    let spline = suf_step(
        form,
        &spline_suf,
        Width::of(k_spline),
        Phi::poly(ring, PolyMode::Monomials),
        Lin::of(step(1, 0)),
    )?;
    let spline_scale = 2 * sc.frac_m + sc.coeff_bits;
    // g(m) ≤ 1 and F ≤ 2^(H + (f − b0)/s): the product fits below 2^k_out.
    let product_scale = spline_scale + h;
    let k_out = product_scale + sc.frac_in.saturating_sub(sc.lo_bits).div_ceil(s) + 3;
    if k_out >= n || sc.frac_out >= product_scale {
        return Err(SufError::FixedPoint);
    }
    let out = truncation(
        form,
        ring,
        (k_out, product_scale - sc.frac_out, Shift::Arithmetic),
        Lin::of(step(3, 0)),
    )?;
    let chain = Chain::new(ring)
        .then(reduce)
        .then(mantissa)
        .then(spline)
        .then(Step::Mul {
            a: Lin::of(step(2, 0)),
            b: Lin::of(step(0, 1)),
        })
        .then(out)
        .output(step(4, 0));
    chain.validate()?;
    Ok(chain)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::chain::testing::run_chain;
    use crate::prg::Prg;
    use std::vec::Vec;

    fn scales(frac_in: u32, k_in: u32, lo_bits: u32) -> InverseScales {
        InverseScales {
            frac_in,
            k_in,
            lo_bits,
            frac_m: 12,
            coeff_bits: 12,
            frac_out: 24,
        }
    }

    /// Worst relative error of the chain's cleartext value over inputs
    /// `lo..hi` (integers) stepping by `stride`.
    fn worst(
        kind: Inverse,
        chain: &Chain,
        sc: &InverseScales,
        lo: u64,
        hi: u64,
        stride: u64,
    ) -> f64 {
        let mut w = 0.0f64;
        let mut v = lo;
        while v < hi {
            let y = chain.reference(v) as i64 as f64 / crate::ring::pow2(sc.frac_out);
            let want = kind.real(v as f64 / crate::ring::pow2(sc.frac_in));
            w = w.max((y - want).abs() / want);
            v += stride;
        }
        w
    }

    #[test]
    fn reciprocal_accuracy_over_the_softmax_range() {
        let sc = scales(12, 23, 12);
        let chain = inverse(Inverse::Recip, Width::W64, sc).unwrap();
        // s ∈ [1, 1024) at f = 12.
        let e = worst(Inverse::Recip, &chain, &sc, 1 << 12, 1 << 22, 97);
        assert!(e <= 2f64.powi(-7), "reciprocal relative error {e}");
    }

    #[test]
    fn rsqrt_accuracy_over_a_variance_range() {
        for f in [12, 24, 25] {
            let sc = scales(f, 44, f - 8);
            let chain = inverse(Inverse::Rsqrt, Width::W64, sc).unwrap();
            // v from 2^-8 (well above one ulp) to 2^(44 − f).
            let lo = 1u64 << (f - 8);
            let e = worst(
                Inverse::Rsqrt,
                &chain,
                &sc,
                lo,
                1 << 44,
                (1u64 << 44) / 200_003 + 1,
            );
            assert!(e <= 2f64.powi(-7), "rsqrt relative error {e} at f = {f}");
        }
    }

    /// The widest rsqrt the planner asks for (a norm's sum of squares at
    /// 2^-24 checked at capacity, below 2^60 with its floor at 2^12): every
    /// octave, sampled, within 2^-7 relative plus one unit of the output
    /// (which the planner bounds separately: near 2^60 the answer is about
    /// 2^-17.5, 90 units at 2^-24).
    #[test]
    fn rsqrt_accuracy_over_the_widest_planned_range() {
        let sc = scales(24, 60, 12);
        let chain = inverse(Inverse::Rsqrt, Width::W64, sc).unwrap();
        let unit = 1.0 / crate::ring::pow2(sc.frac_out);
        for b in 12..59 {
            let stride = (1u64 << b) / 4093 + 1;
            for v in (1u64 << b..2 << b).step_by(stride as usize) {
                let y = chain.reference(v) as i64 as f64 * unit;
                let want = Inverse::Rsqrt.real(v as f64 / crate::ring::pow2(sc.frac_in));
                let e = (y - want).abs();
                assert!(e <= want / 128.0 + unit, "v = {v}: {y} for {want}");
            }
        }
    }

    #[test]
    fn two_party_inverses_equal_the_reference() {
        let mut prg = Prg::new(&[4; 16]);
        for (kind, sc) in [
            (Inverse::Recip, scales(12, 23, 12)),
            (Inverse::Rsqrt, scales(24, 44, 0)),
            (Inverse::Rsqrt, scales(24, 60, 12)),
        ] {
            let chain = inverse(kind, Width::W64, sc).unwrap();
            let mut xs: Vec<u64> = (0..200).map(|_| prg.next_u64() >> (64 - sc.k_in)).collect();
            // Octave edges, 0 and 1.
            for b in 0..sc.k_in {
                xs.extend([(1u64 << b) - 1, 1 << b, (1 << b) + 1]);
            }
            xs.extend([0, 1]);
            let xs: Vec<u64> = xs.into_iter().filter(|x| *x < 1 << sc.k_in).collect();
            let got = run_chain(&chain, &xs, 3);
            // The two-round chain is the oracle: same values, four more
            // rounds.
            let old = chain_of(kind, Width::W64, sc, Form::TwoRounds).unwrap();
            let was = run_chain(&old, &xs, 4);
            for ((x, y), z) in xs.iter().zip(&got).zip(&was) {
                assert_eq!(*y, chain.reference(*x), "{kind:?} x={x}");
                assert_eq!(*z, old.reference(*x), "{kind:?} two rounds, x={x}");
                assert_eq!(*y, *z, "{kind:?} one against two rounds, x={x}");
            }
            assert_eq!((chain.rounds(), old.rounds()), (5, 9));
        }
    }
}
