//! Reciprocal and reciprocal square root, by range reduction.
//!
//! A relative-error target over a wide range does not fit one fixed-point
//! polynomial: the coefficients of 1/v on a far octave are too small for
//! any common scale. So both are chains (see [`super::chain`]), in two
//! forms.
//!
//! **The spline form ([`inverse`], 4 rounds):**
//!
//! 1. **Range reduction (SUF).** Intervals are the octaves `[2^b, 2^(b+s))`
//!    of the integer input V (s = 1 for 1/v, s = 2 for 1/√v, so that
//!    `2^(−b/2)` is a power of two). The SUF has two ring outputs: the
//!    mantissa `M = V·2^(G−b)`, so `m = M/2^G ∈ [1, 2^s)`, and the exponent
//!    factor `F = 2^(H + e)` where the answer is `g(m)·2^e`.
//! 2. **Truncation** of M to `FRAC_M` fraction bits (gap LRS).
//! 3. **Mantissa spline times the factor** `g(m)·F`, `g(m) = 1/m` or
//!    `1/√m` on `[1, 2^s)` ([`super::splines::RECIP_MANTISSA`],
//!    [`super::splines::RSQRT_MANTISSA`]): a one-round SUF scaled by F,
//!    which it opens beside m ([`RingSuf::scaled`]).
//! 4. **Truncation** to the output scale (gap ARS).
//!
//! Every step takes one round: the range reduction and the spline are
//! one-round SUFs ([`RingSuf`]), the truncations take their carry from a
//! ring-output key ([`RingTrunc`]). Until the thirty-fifth session the
//! spline and the product by F were two steps (5 rounds). The same chain
//! with two-round gates and truncations and the product as a Beaver step
//! (9 rounds, fewer key bytes) is its test oracle: both compute the same
//! integers. Inputs
//! below 1 ulp saturate to the value at V = 1. Accuracy (enforced by
//! sweeps): relative error ≤ 2^-7 plus one unit of the output; rsqrt's
//! spline is fitted to 2^-11, its chain within 3.4·10⁻⁴.
//!
//! **The table form ([`inverse_table`], 3 rounds):** the same range
//! reduction with single octaves (s = 1 for both) and, as its second
//! output, the octave's row of a table less the mantissa's leading one
//! (`E·2^B − 2^B`, B the index's mantissa bits); the truncation of M to B
//! fraction bits; then a one-round lookup ([`RingLut`]) at
//! `i = E·2^B + ⌊m·2^B⌋ − 2^B` in a table that holds, for every octave and
//! mantissa bucket, the answer at the bucket's middle (its only input
//! where the bucket holds one integer V), rounded to `frac_out` fraction
//! bits ([`InverseTable`]): no product, no final truncation. The relative
//! error is at most `2^-(B+1)·|d ln g/dm|`, 2^-12 for both (B = 11 for
//! 1/v, 10 for 1/√v), plus half a unit. The SUF has at most 47 octaves, so
//! where `[2^lo_bits, 2^k_in)` holds more, the floor rises to
//! `2^(k_in − 47)` (a smaller saturated value than the spline form's).
//! The lookup expands an L-bit DPF over its whole domain per element
//! (L = 15–16: tens of thousands of AES calls and products), so the
//! planner takes this form only where a chain has few elements: a decode
//! pass's norms and softmax denominators, where rounds are the cost.

use crate::error::SufError;
use crate::gate::chain::{Chain, Lin, Source, Step};
use crate::gate::ring_lut::{RingLut, Table};
use crate::gate::ring_suf::RingSuf;
use crate::gate::ring_trunc::RingTrunc;
use crate::gate::trunc::Shift;
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
    /// The spline form's octave step s: m ∈ [1, 2^s), so that the exponent
    /// factor of 1/√v is a power of two. The table's octaves are single
    /// (s = 1) for both.
    const fn step(self) -> u32 {
        match self {
            Inverse::Recip => 1,
            Inverse::Rsqrt => 2,
        }
    }

    /// B: the mantissa bits of the table index, so that the relative error
    /// is at most 2^-12 for both. (At B = 9, 2^-10, SmolLM2's
    /// teacher-forced passage lost two positions at float margins below
    /// 0.02; at 11, one; at 12, still one.)
    pub const fn index_bits(self) -> u32 {
        match self {
            Inverse::Recip => 11,
            Inverse::Rsqrt => 10,
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

/// `⌊√n⌋`, by Newton's method from above.
const fn isqrt(n: u128) -> u128 {
    if n < 2 {
        return n;
    }
    let mut x = 1u128 << (128 - n.leading_zeros()).div_ceil(2);
    loop {
        let y = (x + n / x) / 2;
        if y >= x {
            return x;
        }
        x = y;
    }
}

/// The octaves of an inverse's input: their starts, every s bits from b0
/// (`b ≡ f (mod s)`, so that the spline form's `e = (f − b)/s` is an
/// integer, and at least `floor`). At most 47: the SUF's intervals, one
/// below the first octave.
struct Octaves {
    starts: [u32; MAX_INTERVALS],
    count: usize,
}

impl Octaves {
    fn of(s: u32, sc: &InverseScales, floor: u32) -> Result<Octaves, SufError> {
        let f = sc.frac_in;
        let lo = sc.lo_bits.max(floor);
        let b0 = lo + (s - (lo % s + s - f % s) % s) % s;
        if b0 >= sc.k_in {
            return Err(SufError::FixedPoint);
        }
        let mut o = Octaves {
            starts: [0; MAX_INTERVALS],
            count: 0,
        };
        let mut b = b0;
        while b < sc.k_in {
            if o.count >= MAX_INTERVALS - 1 {
                return Err(SufError::Capacity);
            }
            o.starts[o.count] = b;
            o.count += 1;
            b += s;
        }
        Ok(o)
    }

    fn b0(&self) -> u32 {
        self.starts[0]
    }

    fn b_max(&self) -> u32 {
        self.starts[self.count - 1]
    }

    /// The range-reduction SUF: below the first octave `(2^G, out(b0))`,
    /// on octave i `(V·2^(G−b_i), out(i))`.
    fn suf(
        &self,
        ring: Width,
        f: u32,
        g: u32,
        out: impl Fn(usize) -> u64,
    ) -> Result<Suf, SufError> {
        let count = self.count;
        let mut cuts = [0i128; MAX_INTERVALS];
        let mut coeffs = [[[0u64; MAX_DEGREE + 1]; MAX_ARITH]; MAX_INTERVALS];
        coeffs[0][0][0] = ring.reduce(1u64 << g);
        coeffs[0][1][0] = ring.reduce(out(0));
        for (i, &b) in self.starts[..count].iter().enumerate() {
            cuts[i] = 1i128 << b;
            coeffs[i + 1][0][1] = ring.reduce(1u64 << (g - b));
            coeffs[i + 1][1][0] = ring.reduce(out(i));
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
        Ok(suf)
    }
}

/// An inverse's table: row E (octave `b = b0 + E`), column j (the
/// mantissa bucket `[1 + j·2^-B, 1 + (j + 1)·2^-B)`) holds the answer at
/// the bucket's middle, rounded to `frac_out` fraction bits; entries no
/// index reaches hold 0. Integer arithmetic only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct InverseTable {
    kind: Inverse,
    frac_in: u32,
    b0: u32,
    octaves: u32,
    frac_out: u32,
}

impl InverseTable {
    /// Index bits: the rows' and the columns'.
    pub const fn bits(&self) -> u32 {
        let rows = 32 - (self.octaves - 1).leading_zeros();
        rows + self.kind.index_bits()
    }

    /// The entry at index `i`.
    pub fn entry(&self, i: u64) -> u64 {
        let b_bits = self.kind.index_bits();
        let (row, j) = (i >> b_bits, i & ((1 << b_bits) - 1));
        if row >= u64::from(self.octaves) {
            return 0;
        }
        let b = self.b0 + u32::try_from(row).unwrap_or(0);
        let lead = u128::from((1u64 << b_bits) + j);
        // Twice the bucket's middle V (the mean of its integers).
        let two_v = if b >= b_bits {
            (lead << (b - b_bits + 1)) + (1u128 << (b - b_bits)) - 1
        } else {
            (lead >> (b_bits - b)) << 1
        };
        let (fi, fo) = (self.frac_in, self.frac_out);
        let t = match self.kind {
            // round(2^(fo + fi) / V)
            Inverse::Recip => ((1u128 << (fo + fi + 2)) + two_v) / (2 * two_v),
            // round(√(2^(2fo + fi) / V)) = ⌈⌊√(2^(2fo + fi + 3) / 2V)⌋ / 2⌉
            Inverse::Rsqrt => isqrt((1u128 << (2 * fo + fi + 3)) / two_v).div_ceil(2),
        };
        u64::try_from(t).unwrap_or(u64::MAX)
    }
}

/// The inverse's table form as a chain; its output has `frac_out`
/// fraction bits. Three one-round steps: 3 rounds.
pub fn inverse_table(kind: Inverse, ring: Width, sc: InverseScales) -> Result<Chain, SufError> {
    let n = ring.bits();
    let b_bits = kind.index_bits();
    let most = u32::try_from(MAX_INTERVALS - 1).map_err(|_| SufError::Capacity)?;
    let oct = Octaves::of(1, &sc, sc.k_in.saturating_sub(most))?;
    let g = oct.b_max() + 1; // M = V·2^(G−b) ≥ 2^G with G − b ≥ 1
    let k_m = g + 2;
    if k_m >= n || b_bits >= g || 2 * sc.frac_out + sc.frac_in + 3 > 124 {
        return Err(SufError::FixedPoint);
    }
    let row = |e: usize| (u64::try_from(e).unwrap_or(0) << b_bits).wrapping_sub(1 << b_bits);
    let suf = oct.suf(ring, sc.frac_in, g, row)?;
    let k_in = Width::new(sc.k_in).map_err(|_| SufError::FixedPoint)?;
    let step = |i: u8, j: u8| Source::Output { step: i, index: j };
    let reduce = Step::Suf {
        gate: RingSuf::new(&suf, k_in)?,
        input: Lin::of(Source::Input),
        factor: None,
    };
    let k_m = Width::new(k_m).map_err(|_| SufError::FixedPoint)?;
    let mantissa = Step::Trunc {
        gate: RingTrunc::new(ring, k_m, g - b_bits, Shift::Logical)?,
        input: Lin::of(step(0, 0)),
    };
    let table = InverseTable {
        kind,
        frac_in: sc.frac_in,
        b0: oct.b0(),
        octaves: u32::try_from(oct.count).map_err(|_| SufError::Capacity)?,
        frac_out: sc.frac_out,
    };
    let bits = Width::new(table.bits()).map_err(|_| SufError::Capacity)?;
    let lookup = Step::Lut {
        gate: RingLut::new(ring, bits, Table::Inverse(table))?,
        input: Lin {
            terms: [(step(1, 0), 1), (step(0, 1), 1)],
            len: 2,
            constant: 0,
        },
    };
    let chain = Chain::new(ring)
        .then(reduce)
        .then(mantissa)
        .then(lookup)
        .output(step(2, 0));
    chain.validate()?;
    Ok(chain)
}

/// The inverse's spline form as a chain; its output has `frac_out`
/// fraction bits. Every step takes one round: 4 rounds.
pub fn inverse(kind: Inverse, ring: Width, sc: InverseScales) -> Result<Chain, SufError> {
    spline_form::chain(kind, ring, sc, spline_form::Form::OneRound)
}

/// The spline form (mantissa spline, product, truncation).
mod spline_form {
    use super::*;
    use crate::gate::spline::Spline;
    use crate::gate::splines;
    #[cfg(test)]
    use crate::{
        gate::trunc::{Range, trunc},
        gate::{Gate, Input},
        phi::{Factor, Phi, PolyMode, Public, Term},
    };

    /// Fraction bits the mantissa is truncated to.
    const FRAC_M: u32 = 12;
    /// Coefficient bits of the mantissa spline.
    const COEFF_BITS: u32 = 12;

    fn spline(kind: Inverse) -> &'static Spline {
        match kind {
            Inverse::Recip => &splines::RECIP_MANTISSA,
            Inverse::Rsqrt => &splines::RSQRT_MANTISSA,
        }
    }

    /// How a chain's SUFs and truncations run.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(crate) enum Form {
        /// Bit-output keys and a B2A round each ([`Gate`], [`trunc`]): the
        /// test oracle, whose gates live as long as the test process
        /// ([`Step::Gate`] holds them by reference).
        #[cfg(test)]
        TwoRounds,
        /// Ring-output keys ([`RingSuf`], [`RingTrunc`]).
        OneRound,
    }

    /// The two-round oracle's gates, kept for the test process.
    #[cfg(test)]
    fn leak(gate: Gate) -> &'static Gate {
        std::boxed::Box::leak(std::boxed::Box::new(gate))
    }

    /// A SUF step on `input` at width `k`; the two-round gate outputs the
    /// SUF's polynomials in order.
    fn suf_step(form: Form, suf: &Suf, k: Width, input: Lin) -> Result<Step, SufError> {
        Ok(match form {
            #[cfg(test)]
            Form::TwoRounds => {
                let mut phi = Phi::new(PolyMode::Monomials);
                for i in 0..suf.arith {
                    phi = phi.with_output(
                        suf.ring,
                        &[Term::new(
                            1,
                            Public::One,
                            &[Factor::Poly(crate::ring::cast::u8_from_index(i))],
                        )],
                    );
                }
                Step::Gate {
                    gate: leak(Gate::new(suf, k, phi, Input::Shares)?),
                    input,
                }
            }
            Form::OneRound => Step::Suf {
                gate: RingSuf::new(suf, k)?,
                input,
                factor: None,
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
            #[cfg(test)]
            Form::TwoRounds => Step::Gate {
                gate: leak(trunc(ring, k, f, shift, Range::Gap)?),
                input,
            },
            Form::OneRound => Step::Trunc {
                gate: RingTrunc::new(ring, k, f, shift)?,
                input,
            },
        })
    }

    /// The spline of the mantissa (step 1's output) times the exponent
    /// factor (step 0's second output): a Beaver product after the spline,
    /// or (one round) the spline scaled by the factor. Returns the spline's
    /// step, the product's if it has one, and the index of the step whose
    /// output is the product.
    fn times_factor(
        form: Form,
        spline_suf: &Suf,
        k_spline: Width,
    ) -> Result<(Step, Option<Step>, u8), SufError> {
        let step = |i: u8, j: u8| Source::Output { step: i, index: j };
        Ok(match form {
            #[cfg(test)]
            Form::TwoRounds => {
                let times = Step::Mul {
                    a: Lin::of(step(2, 0)),
                    b: Lin::of(step(0, 1)),
                };
                let spline = suf_step(form, spline_suf, k_spline, Lin::of(step(1, 0)))?;
                (spline, Some(times), 3)
            }
            Form::OneRound => {
                let scaled = Step::Suf {
                    gate: RingSuf::scaled(spline_suf, k_spline)?,
                    input: Lin::of(step(1, 0)),
                    factor: Some(Lin::of(step(0, 1))),
                };
                (scaled, None, 2)
            }
        })
    }

    /// The spline chain: 4 rounds one-round (the spline scaled by the
    /// factor), 9 two-round (the spline, then a Beaver product).
    pub(crate) fn chain(
        kind: Inverse,
        ring: Width,
        sc: InverseScales,
        form: Form,
    ) -> Result<Chain, SufError> {
        let n = ring.bits();
        let s = kind.step();
        let f = sc.frac_in;
        let oct = Octaves::of(s, &sc, 0)?;
        let g = oct.b_max() + s;
        // F = 2^(H + (f − b)/s) must be an integer for every octave.
        let h = oct.b_max().saturating_sub(f).div_ceil(s);
        let f_of = |i: usize| -> u64 {
            let b = i64::from(oct.starts[i]);
            1u64 << (i64::from(h) + (i64::from(f) - b) / i64::from(s))
        };
        let suf = oct.suf(ring, f, g, f_of)?;
        let k_in = Width::new(sc.k_in).map_err(|_| SufError::FixedPoint)?;
        let reduce = suf_step(form, &suf, k_in, Lin::of(Source::Input))?;
        let k_m = g + s + 1;
        if k_m >= n || FRAC_M >= g {
            return Err(SufError::FixedPoint);
        }
        let step = |i: u8, j: u8| Source::Output { step: i, index: j };
        let mantissa = truncation(
            form,
            ring,
            (k_m, g - FRAC_M, Shift::Logical),
            Lin::of(step(0, 0)),
        )?;
        let k_spline = Width::of(FRAC_M + s + 2);
        let spline_suf = spline(kind).suf(ring, FRAC_M, COEFF_BITS)?;
        let spline_scale = 2 * FRAC_M + COEFF_BITS;
        let product_scale = spline_scale + h;
        let k_out = product_scale + sc.frac_in.saturating_sub(sc.lo_bits).div_ceil(s) + 3;
        if k_out >= n || sc.frac_out >= product_scale {
            return Err(SufError::FixedPoint);
        }
        let (spline, times, product) = times_factor(form, &spline_suf, k_spline)?;
        let out = truncation(
            form,
            ring,
            (k_out, product_scale - sc.frac_out, Shift::Arithmetic),
            Lin::of(step(product, 0)),
        )?;
        let chain = Chain::new(ring)
            .then(reduce)
            .then(mantissa)
            .then(spline)
            .then_some(times)
            .then(out)
            .output(step(product + 1, 0));
        chain.validate()?;
        Ok(chain)
    }
}

#[cfg(test)]
mod tests {
    use super::spline_form::{Form, chain as spline_chain};
    use super::*;
    use crate::gate::chain::testing::run_chain;
    use crate::prg::Prg;
    use std::vec::Vec;

    fn scales(frac_in: u32, k_in: u32, lo_bits: u32) -> InverseScales {
        InverseScales {
            frac_in,
            k_in,
            lo_bits,
            frac_out: 24,
        }
    }

    /// The chain's worst error over inputs `lo..hi` (integers) stepping by
    /// `stride`, as `(relative, relative beyond one unit of the output)`.
    fn worst(
        kind: Inverse,
        chain: &Chain,
        sc: &InverseScales,
        (lo, hi, stride): (u64, u64, u64),
    ) -> (f64, f64) {
        let unit = 1.0 / crate::ring::pow2(sc.frac_out);
        let (mut rel, mut beyond) = (0.0f64, 0.0f64);
        let mut v = lo;
        while v < hi {
            let y = chain.reference(v) as i64 as f64 * unit;
            let want = kind.real(v as f64 / crate::ring::pow2(sc.frac_in));
            rel = rel.max((y - want).abs() / want);
            beyond = beyond.max(((y - want).abs() - unit / 2.0).max(0.0) / want);
            v += stride;
        }
        (rel, beyond)
    }

    #[test]
    fn reciprocal_accuracy_over_the_softmax_range() {
        let sc = scales(12, 23, 12);
        let chain = inverse_table(Inverse::Recip, Width::W64, sc).unwrap();
        let old = spline_chain(Inverse::Recip, Width::W64, sc, Form::OneRound).unwrap();
        // s ∈ [1, 1024) at f = 12.
        let range = (1 << 12, 1 << 22, 97);
        let (rel, beyond) = worst(Inverse::Recip, &chain, &sc, range);
        let (was, _) = worst(Inverse::Recip, &old, &sc, range);
        assert!(beyond <= 2f64.powi(-12), "reciprocal relative error {rel}");
        assert!(rel <= was, "table {rel} against the spline's {was}");
    }

    #[test]
    fn rsqrt_accuracy_over_a_variance_range() {
        for f in [12, 24, 25] {
            let sc = scales(f, 44, f - 8);
            let chain = inverse_table(Inverse::Rsqrt, Width::W64, sc).unwrap();
            let old = spline_chain(Inverse::Rsqrt, Width::W64, sc, Form::OneRound).unwrap();
            // v from 2^-8 (well above one ulp) to 2^(44 − f).
            let range = (1u64 << (f - 8), 1 << 44, (1u64 << 44) / 200_003 + 1);
            let (rel, beyond) = worst(Inverse::Rsqrt, &chain, &sc, range);
            let (was, _) = worst(Inverse::Rsqrt, &old, &sc, range);
            assert!(
                beyond <= 2f64.powi(-12),
                "rsqrt relative error {rel} at f = {f}"
            );
            assert!(
                rel <= was,
                "table {rel} against the spline's {was} at f = {f}"
            );
        }
    }

    /// The widest rsqrt the planner asks for (a norm's sum of squares at
    /// 2^-24 checked at capacity, below 2^60 with its floor at 2^12, which
    /// the table form raises to 2^13 to hold 47 octaves): every
    /// octave, sampled, within 2^-12 relative plus half a unit of the
    /// output (which the planner bounds separately: near 2^60 the answer
    /// is about 2^-17.5, 90 units at 2^-24).
    #[test]
    fn rsqrt_accuracy_over_the_widest_planned_range() {
        let sc = scales(24, 60, 12);
        let chain = inverse_table(Inverse::Rsqrt, Width::W64, sc).unwrap();
        let unit = 1.0 / crate::ring::pow2(sc.frac_out);
        for b in 13..59 {
            let stride = (1u64 << b) / 4093 + 1;
            for v in (1u64 << b..2 << b).step_by(stride as usize) {
                let y = chain.reference(v) as i64 as f64 * unit;
                let want = Inverse::Rsqrt.real(v as f64 / crate::ring::pow2(sc.frac_in));
                let e = (y - want).abs();
                assert!(e <= want / 4096.0 + unit / 2.0, "v = {v}: {y} for {want}");
            }
        }
    }

    /// Every integer input of a small range, both kinds: the table's value
    /// is the bucket middle's, so within `2^-(B+1)` (1/v) or `2^-(B+2)`
    /// (1/√v) of the real function, plus half a unit; below the first
    /// octave it is the first bucket's.
    #[test]
    fn every_input_of_a_small_range() {
        for (kind, sc, bound) in [
            (Inverse::Recip, scales(4, 16, 2), 2f64.powi(-12)),
            (Inverse::Rsqrt, scales(6, 18, 0), 2f64.powi(-12)),
        ] {
            let chain = inverse_table(kind, Width::W64, sc).unwrap();
            let unit = 1.0 / crate::ring::pow2(sc.frac_out);
            let floor = 1u64 << sc.lo_bits;
            for v in 0..1u64 << sc.k_in {
                let y = chain.reference(v) as i64 as f64 * unit;
                let at = v.max(floor) as f64 / crate::ring::pow2(sc.frac_in);
                let want = kind.real(at);
                let e = (y - want).abs();
                assert!(
                    e <= want * bound + unit / 2.0,
                    "{kind:?} v = {v}: {y} for {want}"
                );
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
            let chain = inverse_table(kind, Width::W64, sc).unwrap();
            let mut xs: Vec<u64> = (0..200).map(|_| prg.next_u64() >> (64 - sc.k_in)).collect();
            // Octave edges, 0 and 1.
            for b in 0..sc.k_in {
                xs.extend([(1u64 << b) - 1, 1 << b, (1 << b) + 1]);
            }
            xs.extend([0, 1]);
            let xs: Vec<u64> = xs.into_iter().filter(|x| *x < 1 << sc.k_in).collect();
            let got = run_chain(&chain, &xs, 3);
            for (x, y) in xs.iter().zip(&got) {
                assert_eq!(*y, chain.reference(*x), "{kind:?} x={x}");
            }
            assert_eq!(chain.rounds(), 3);
        }
    }

    /// The spline chains: the one-round form (the spline scaled by the
    /// exponent factor) and the two-round oracle (the spline, then a Beaver
    /// product) agree with their references and with each other, on random
    /// inputs and every octave's edges (every factor), and their
    /// references agree on a sweep of every octave.
    #[test]
    fn two_party_spline_chains_equal_their_reference() {
        let mut prg = Prg::new(&[5; 16]);
        for (kind, sc) in [
            (Inverse::Recip, scales(12, 23, 12)),
            (Inverse::Rsqrt, scales(24, 44, 0)),
            (Inverse::Rsqrt, scales(24, 60, 12)),
        ] {
            let chain = spline_chain(kind, Width::W64, sc, Form::OneRound).unwrap();
            let old = spline_chain(kind, Width::W64, sc, Form::TwoRounds).unwrap();
            let mut xs: Vec<u64> = (0..100).map(|_| prg.next_u64() >> (64 - sc.k_in)).collect();
            for b in 0..sc.k_in {
                xs.extend([(1u64 << b) - 1, 1 << b, (1 << b) + 1]);
            }
            xs.extend([0, 1, 1 << sc.lo_bits, (1 << sc.k_in) - 1]);
            let xs: Vec<u64> = xs.into_iter().filter(|x| *x < 1 << sc.k_in).collect();
            let got = run_chain(&chain, &xs, 3);
            let was = run_chain(&old, &xs, 4);
            for ((x, y), z) in xs.iter().zip(&got).zip(&was) {
                assert_eq!(*y, chain.reference(*x), "{kind:?} x={x}");
                assert_eq!(*y, *z, "{kind:?} one against two rounds, x={x}");
            }
            for b in 0..sc.k_in {
                for _ in 0..64 {
                    let x = (1u64 << b) | (prg.next_u64() & ((1u64 << b) - 1));
                    assert_eq!(chain.reference(x), old.reference(x), "{kind:?} x={x}");
                }
            }
            assert_eq!((chain.rounds(), old.rounds()), (4, 9));
        }
    }
}
