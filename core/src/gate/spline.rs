//! Smooth activations as splines: the SUF of GeLU, SiLU, nExp and the
//! reciprocal, built from real-valued fits ([`super::splines`]).
//!
//! A spline is a list of pieces `p_i(x) = Σ_j c_{ij} (x − m_i)^j` on
//! `[lo_i, hi_i)` plus tails. In fixed point with input `X = x·2^f` and
//! output `Y = y·2^S`, each piece becomes an integer polynomial in X: the
//! local coefficients are rounded at their own scales
//! (`C_j = round(c_j·2^{S − j·f})`) and `(X − M)^j` is expanded exactly, so
//! rounding is paid once, on small local coefficients, and never on the
//! large standard-basis ones. For the activations the pieces already
//! include x⁺ (each piece is x⁺ + δ(x) merged), so one polynomial output
//! carries the whole function.
//!
//! The output scale S is a parameter: `S = degree·f + coeff_bits` keeps the
//! spline free of in-gate truncation; whoever consumes the output rescales
//! (usually inside the truncation that follows the next linear layer).

use crate::error::SufError;
use crate::ring::{Width, cast, encode_fixed, pow2};
use crate::suf::{Domain, MAX_ARITH, MAX_DEGREE, MAX_INTERVALS, Suf};

/// What a spline is outside its fitted range.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Tail {
    /// 0.
    Zero,
    /// The identity `x`.
    Identity,
    /// A constant.
    Const(f64),
}

/// One fitted piece on `[lo, hi)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SplinePiece {
    /// Start of the piece.
    pub lo: f64,
    /// End of the piece.
    pub hi: f64,
    /// Center of the local variable.
    pub center: f64,
    /// Coefficients of `(x − center)^j`.
    pub coeffs: [f64; 4],
}

/// A fitted spline.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spline {
    /// Polynomial degree of every piece.
    pub degree: usize,
    /// Below the first piece.
    pub left: Tail,
    /// From the end of the last piece on.
    pub right: Tail,
    /// The pieces, contiguous and increasing.
    pub pieces: &'static [SplinePiece],
}

impl Spline {
    /// The real function the fixed-point SUF approximates (with the same
    /// tails), for accuracy statements.
    pub fn eval_real(&self, x: f64) -> f64 {
        let first = self.pieces.first().map_or(0.0, |p| p.lo);
        let last = self.pieces.last().map_or(0.0, |p| p.hi);
        let tail = |t: Tail| match t {
            Tail::Zero => 0.0,
            Tail::Identity => x,
            Tail::Const(c) => c,
        };
        if x < first {
            return tail(self.left);
        }
        if x >= last {
            return tail(self.right);
        }
        for p in self.pieces {
            if x < p.hi {
                let u = x - p.center;
                return p.coeffs.iter().rev().fold(0.0, |acc, c| acc * u + c);
            }
        }
        tail(self.right)
    }

    /// The SUF of the spline over `ring` with input fraction bits `frac`,
    /// output scale `frac·degree + coeff_bits`. Every knot must lie on the
    /// fixed-point grid (the fitted tables use multiples of 2^-6).
    pub fn suf(&self, ring: Width, frac: u32, coeff_bits: u32) -> Result<Suf, SufError> {
        self.build(ring, frac, coeff_bits, false)
    }

    /// [`Spline::suf`] written into `out`, where it lies: no returned
    /// `Result<Suf, _>`, no second `Suf` and no tables of cuts and
    /// coefficients on the stack (a few hundred bytes instead of about
    /// 13 KB on a Cortex-M4, examples/mcu). On an error `out` is left
    /// partly written. [`Spline::suf`] is its test oracle.
    pub fn suf_init(
        &self,
        out: &mut Suf,
        ring: Width,
        frac: u32,
        coeff_bits: u32,
    ) -> Result<(), SufError> {
        out.reset(ring, Domain::Signed, frac, 1, self.degree);
        let m = self.walk(ring, frac, coeff_bits, false, &mut |i, lower, c| {
            out.bounds[i] = lower;
            out.pieces[i].coeffs[0] = c;
        })?;
        out.bounds[m] = Domain::Signed.end(ring.bits());
        out.intervals = m;
        out.validate()
    }

    /// Like [`Spline::suf`] but rounding knots to the grid and merging
    /// pieces that collapse: a coarser function with the same structure,
    /// for exhaustive protocol tests on small rings with few fraction bits.
    pub fn suf_snapped(&self, ring: Width, frac: u32, coeff_bits: u32) -> Result<Suf, SufError> {
        self.build(ring, frac, coeff_bits, true)
    }

    /// The SUF from tables of cuts and coefficients ([`Suf::piecewise`]).
    fn build(&self, ring: Width, frac: u32, coeff_bits: u32, snap: bool) -> Result<Suf, SufError> {
        let mut cuts = [0i128; MAX_INTERVALS];
        let mut coeffs = [[[0u64; MAX_DEGREE + 1]; MAX_ARITH]; MAX_INTERVALS];
        let m = self.walk(ring, frac, coeff_bits, snap, &mut |i, lower, c| {
            if i > 0 {
                cuts[i - 1] = lower;
            }
            coeffs[i][0] = c;
        })?;
        let suf = Suf::piecewise(
            ring,
            Domain::Signed,
            frac,
            1,
            self.degree,
            &cuts[..m - 1],
            &coeffs[..m],
        );
        suf.validate()?;
        Ok(suf)
    }

    /// Walks the intervals in order, left tail, pieces, right tail, calling
    /// `put(i, lower, coeffs)` with interval i's lower bound (the domain's
    /// minimum for i = 0) and its polynomial; returns the interval count.
    fn walk(
        &self,
        ring: Width,
        frac: u32,
        coeff_bits: u32,
        snap: bool,
        put: &mut impl FnMut(usize, i128, [u64; MAX_DEGREE + 1]),
    ) -> Result<usize, SufError> {
        let d = self.degree;
        if d > MAX_DEGREE || self.pieces.len() + 2 > MAX_INTERVALS {
            return Err(SufError::Capacity);
        }
        let out_scale = frac * cast::u32_from_small_usize(d) + coeff_bits;
        if out_scale >= ring.bits() {
            return Err(SufError::FixedPoint);
        }
        let place = |x: f64| {
            if snap {
                Ok(snapped(x, frac))
            } else {
                knot(x, frac)
            }
        };
        put(
            0,
            Domain::Signed.min(ring.bits()),
            tail(self.left, ring, frac, out_scale)?,
        );
        let mut m = 1;
        let mut prev = None;
        for p in self.pieces {
            let at = place(p.lo)?;
            if prev.is_some_and(|cut| at <= cut) {
                // Collapsed by snapping: the previous piece absorbs it.
                continue;
            }
            put(m, at, self.piece_coeffs(p, ring, frac, out_scale)?);
            prev = Some(at);
            m += 1;
        }
        let last = self.pieces.last().ok_or(SufError::Capacity)?;
        let end = place(last.hi)?;
        if prev.is_some_and(|cut| end <= cut) {
            return Err(SufError::Boundaries);
        }
        put(m, end, tail(self.right, ring, frac, out_scale)?);
        Ok(m + 1)
    }

    /// Integer standard-basis coefficients of one piece.
    fn piece_coeffs(
        &self,
        p: &SplinePiece,
        ring: Width,
        frac: u32,
        out: u32,
    ) -> Result<[u64; MAX_DEGREE + 1], SufError> {
        let center = encode_fixed(ring, p.center, frac).map_err(|_| SufError::FixedPoint)?;
        let mut local = [0u64; MAX_DEGREE + 1];
        for j in 0..=self.degree {
            let scale = i64::from(out)
                - i64::from(frac) * i64::try_from(j).map_err(|_| SufError::Capacity)?;
            let v = p.coeffs[j] * pow2_signed(scale);
            local[j] = encode_fixed(ring, v, 0).map_err(|_| SufError::FixedPoint)?;
        }
        // Σ_j C_j (X − M)^j = Σ_i X^i Σ_{j≥i} C_j C(j,i) (−M)^{j−i}, exactly in Z_2^n.
        let neg_m = ring.neg(center);
        let mut out_c = [0u64; MAX_DEGREE + 1];
        for (j, &cj) in local.iter().enumerate().take(self.degree + 1) {
            let mut pow = 1u64;
            for k in 0..=j {
                let i = j - k;
                let term = ring.mul(ring.mul(cj, binomial(j, i)), pow);
                out_c[i] = ring.add(out_c[i], term);
                pow = ring.mul(pow, neg_m);
            }
        }
        Ok(out_c)
    }
}

/// A tail's polynomial at output scale `out_scale`.
fn tail(
    t: Tail,
    ring: Width,
    frac: u32,
    out_scale: u32,
) -> Result<[u64; MAX_DEGREE + 1], SufError> {
    let mut c = [0u64; MAX_DEGREE + 1];
    match t {
        Tail::Zero => {}
        Tail::Identity => c[1] = ring.reduce(1u64 << (out_scale - frac)),
        Tail::Const(v) => {
            c[0] = encode_fixed(ring, v, out_scale).map_err(|_| SufError::FixedPoint)?
        }
    }
    Ok(c)
}

fn knot(x: f64, frac: u32) -> Result<i128, SufError> {
    // A knot off the fixed-point grid would move with rounding.
    cast::i64_from_integral_f64(x * pow2(frac))
        .map(i128::from)
        .ok_or(SufError::FixedPoint)
}

/// `x` rounded to the nearest point of the fixed-point grid.
fn snapped(x: f64, frac: u32) -> i128 {
    let v = x * pow2(frac);
    let r = if v >= 0.0 { v + 0.5 } else { v - 0.5 };
    i128::from(cast::i64_from_integral_f64(r - fract(r)).unwrap_or(0))
}

/// The fractional part, toward zero (`f64::fract` is std-only).
fn fract(v: f64) -> f64 {
    v - crate::ring::trunc(v)
}

fn pow2_signed(e: i64) -> f64 {
    if e >= 0 {
        pow2(u32::try_from(e).unwrap_or(0))
    } else {
        1.0 / pow2(u32::try_from(-e).unwrap_or(0))
    }
}

const fn binomial(n: usize, k: usize) -> u64 {
    const TABLE: [[u64; 4]; 4] = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 2, 1, 0], [1, 3, 3, 1]];
    TABLE[n][k]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::splines;

    /// `suf_init` writes what `suf` returns, errors included, for every
    /// fitted spline over rings and scales where some fit and some do not.
    /// One `out` serves every case, so a field `reset` missed would show.
    #[test]
    fn suf_init_equals_suf() {
        let all = [
            &splines::GELU_ERF,
            &splines::GELU_TANH,
            &splines::GELU_TANH_FINE,
            &splines::GELU_TANH_LINEAR,
            &splines::SILU,
            &splines::SILU_LINEAR,
            &splines::NEXP,
            &splines::RECIP,
            &splines::RECIP_MANTISSA,
            &splines::RSQRT_MANTISSA,
        ];
        let mut out = Suf::EMPTY;
        let (mut built, mut refused) = (0, 0);
        for spline in all {
            for ring in [16, 20, 32, 48, 64].map(Width::of) {
                for frac in [2, 6, 8, 12, 16] {
                    for coeff_bits in [3, 12] {
                        let want = spline.suf(ring, frac, coeff_bits);
                        let got = spline.suf_init(&mut out, ring, frac, coeff_bits);
                        match want {
                            Ok(suf) => {
                                assert_eq!(got, Ok(()));
                                assert!(out == suf, "{ring:?} f={frac} c={coeff_bits}");
                                built += 1;
                            }
                            Err(e) => {
                                assert_eq!(got, Err(e));
                                refused += 1;
                            }
                        }
                    }
                }
            }
        }
        assert!(
            built > 50 && refused > 50,
            "{built} built, {refused} refused"
        );
    }
}
