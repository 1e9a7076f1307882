//! The ring Z_2^n for a runtime width 1 ≤ n ≤ 64, held in `u64` words.
//!
//! Every word handed to or returned from a [`Width`] method is its canonical
//! representative in `[0, 2^n)`. Arithmetic wraps explicitly; this module is
//! also the one audited place for numeric `as` casts in core.

use crate::error::Error;

/// A bit width in `1..=64`: the ring Z_2^n, or a view of fewer bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Width(u8);

impl Width {
    /// The full 64-bit ring.
    pub const W64: Width = Width(64);

    /// A width of `bits` bits; an error unless `1 ≤ bits ≤ 64`.
    pub const fn new(bits: u32) -> Result<Width, Error> {
        if bits >= 1 && bits <= 64 {
            Ok(Width(bits as u8))
        } else {
            Err(Error::InvalidWidth)
        }
    }

    /// Like [`Width::new`], for constants: fails to compile when out of range.
    pub const fn of(bits: u32) -> Width {
        match Width::new(bits) {
            Ok(w) => w,
            Err(_) => panic!("bit width outside 1..=64"),
        }
    }

    /// The number of bits.
    pub const fn bits(self) -> u32 {
        self.0 as u32
    }

    /// `2^n − 1`.
    pub const fn mask(self) -> u64 {
        u64::MAX >> (64 - self.0 as u32)
    }

    /// `2^(n−1)`, the sign bit.
    pub const fn half(self) -> u64 {
        1u64 << (self.0 as u32 - 1)
    }

    /// `2^n` as a `u128`: the sentinel end of the canonical range.
    pub const fn modulus(self) -> u128 {
        1u128 << self.0
    }

    /// Reduces any word modulo `2^n`.
    #[inline(always)]
    pub const fn reduce(self, x: u64) -> u64 {
        x & self.mask()
    }

    /// Whether `x` is a canonical representative.
    pub const fn contains(self, x: u64) -> bool {
        x <= self.mask()
    }

    /// `a + b mod 2^n`.
    #[inline(always)]
    pub const fn add(self, a: u64, b: u64) -> u64 {
        a.wrapping_add(b) & self.mask()
    }

    /// `a − b mod 2^n`.
    #[inline(always)]
    pub const fn sub(self, a: u64, b: u64) -> u64 {
        a.wrapping_sub(b) & self.mask()
    }

    /// `−a mod 2^n`.
    #[inline(always)]
    pub const fn neg(self, a: u64) -> u64 {
        a.wrapping_neg() & self.mask()
    }

    /// `a · b mod 2^n`.
    #[inline(always)]
    pub const fn mul(self, a: u64, b: u64) -> u64 {
        a.wrapping_mul(b) & self.mask()
    }

    /// The most significant bit: 1 iff `x` is negative in two's complement.
    #[inline(always)]
    pub const fn msb(self, x: u64) -> u64 {
        (x >> (self.0 as u32 - 1)) & 1
    }

    /// The two's-complement value of a canonical word.
    #[inline(always)]
    pub const fn to_signed(self, x: u64) -> i64 {
        let shift = 64 - self.0 as u32;
        ((x << shift) as i64) >> shift
    }

    /// The canonical word of a signed value, reduced modulo `2^n`.
    #[inline(always)]
    pub const fn from_signed(self, v: i64) -> u64 {
        (v as u64) & self.mask()
    }

    /// Whether the signed value `v` is representable in n-bit two's complement.
    pub const fn fits_signed(self, v: i64) -> bool {
        let lo = -(1i128 << (self.0 as u32 - 1));
        let hi = (1i128 << (self.0 as u32 - 1)) - 1;
        (v as i128) >= lo && (v as i128) <= hi
    }

    /// The public view `view_{k,c}(u) = ((u mod 2^k) + c) mod 2^k` with `k = self`.
    #[inline(always)]
    pub const fn view(self, u: u64, c: u64) -> u64 {
        (u & self.mask()).wrapping_add(c) & self.mask()
    }

    /// Sign-extends a canonical word of this width into the wider ring `to`.
    #[inline(always)]
    pub const fn sign_extend(self, x: u64, to: Width) -> u64 {
        to.from_signed(self.to_signed(x))
    }

    /// Bytes needed to hold `count` words of this width bit-packed.
    pub const fn packed_len(self, count: usize) -> Option<usize> {
        match count.checked_mul(self.0 as usize) {
            Some(bits) => Some(bits.div_ceil(8)),
            None => None,
        }
    }
}

/// Encodes a real constant in fixed point with `frac` fractional bits,
/// rounding to nearest (ties away from zero), as a canonical word of `w`.
///
/// Only for public constants (coefficients, thresholds): the float rounding
/// is not constant time.
pub fn encode_fixed(w: Width, value: f64, frac: u32) -> Result<u64, Error> {
    let scaled = value * pow2(frac);
    if !scaled.is_finite() {
        return Err(Error::ValueOutOfRange);
    }
    let rounded = round_half_away(scaled);
    if rounded < i64::MIN as f64 || rounded >= i64::MAX as f64 {
        return Err(Error::ValueOutOfRange);
    }
    let v = rounded as i64;
    if !w.fits_signed(v) {
        return Err(Error::ValueOutOfRange);
    }
    Ok(w.from_signed(v))
}

/// Decodes a canonical word of `w` holding a signed fixed-point value.
pub fn decode_fixed(w: Width, x: u64, frac: u32) -> f64 {
    w.to_signed(x) as f64 / pow2(frac)
}

/// `2^e` as an `f64`, exact for `e < 1024`.
pub fn pow2(e: u32) -> f64 {
    f64::from_bits((1023 + u64::from(e)) << 52)
}

/// Truncation toward zero (`f64::trunc` is std-only).
pub fn trunc(x: f64) -> f64 {
    if f64::from_bits(x.to_bits() & !(1u64 << 63)) >= 4_503_599_627_370_496.0 {
        return x;
    }
    (x as i64) as f64
}

fn round_half_away(x: f64) -> f64 {
    // `f64::round` lives in std; this is the same rule with core operations.
    // Values with |x| ≥ 2^52 are already integers.
    if f64::from_bits(x.to_bits() & !(1u64 << 63)) >= 4_503_599_627_370_496.0 {
        return x;
    }
    let t = (x as i64) as f64;
    let frac = x - t;
    if frac >= 0.5 {
        t + 1.0
    } else if frac <= -0.5 {
        t - 1.0
    } else {
        t
    }
}

/// Audited integer conversions used across core.
pub(crate) mod cast {
    /// A `u32` bit count as `usize` (every supported target has ≥ 32-bit usize).
    #[inline(always)]
    pub(crate) const fn usize_from_u32(x: u32) -> usize {
        x as usize
    }

    /// A `usize` as `u64` (usize is at most 64 bits on supported targets).
    #[inline(always)]
    pub(crate) const fn u64_from_usize(x: usize) -> u64 {
        x as u64
    }

    /// The low 64 bits of a `u128`.
    #[inline(always)]
    pub(crate) const fn low_u64(x: u128) -> u64 {
        x as u64
    }

    /// A `u64` bit (0 or 1) or mask widened to `u128`.
    #[inline(always)]
    pub(crate) const fn u128_from_u64(x: u64) -> u128 {
        x as u128
    }

    /// A `u32` as `u64`, in const contexts where `From` is unavailable.
    #[inline(always)]
    pub(crate) const fn u64_from_u32(x: u32) -> u64 {
        x as u64
    }

    /// A `u64` as `i128` (lossless).
    #[inline(always)]
    pub(crate) const fn i128_from_u64(x: u64) -> i128 {
        x as i128
    }

    /// An `i64` as `i128` (lossless).
    #[inline(always)]
    pub(crate) const fn i128_from_i64(x: i64) -> i128 {
        x as i128
    }

    /// A `u8` index as `usize` (lossless).
    #[inline(always)]
    pub(crate) const fn usize_from_u8(x: u8) -> usize {
        x as usize
    }

    /// A `u16` index as `usize` (lossless).
    #[inline(always)]
    pub(crate) const fn usize_from_u16(x: u16) -> usize {
        x as usize
    }

    /// A small count (an AES-call or word count) as `usize`.
    #[inline(always)]
    pub(crate) const fn usize_from_small_u64(x: u64) -> usize {
        debug_assert!(x <= u32::MAX as u64);
        x as usize
    }

    /// A table index below 256 as `u8`; capacities guarantee the bound.
    #[inline(always)]
    pub(crate) const fn u8_from_index(x: usize) -> u8 {
        debug_assert!(x < 256);
        x as u8
    }

    /// A table index below 2^16 as `u16`; capacities guarantee the bound.
    #[inline(always)]
    pub(crate) const fn u16_from_index(x: usize) -> u16 {
        debug_assert!(x < 65536);
        x as u16
    }

    /// A `u128` below 2^127 as `i128`.
    #[inline(always)]
    pub(crate) const fn i128_from_u128(x: u128) -> i128 {
        x as i128
    }

    /// A non-negative `i128` below 2^64 as `u64`; callers bound it first.
    #[inline(always)]
    pub(crate) const fn u64_from_i128(x: i128) -> u64 {
        x as u64
    }

    /// An `f64` that is an integer in `i64` range, exactly; `None` otherwise.
    pub(crate) fn i64_from_integral_f64(v: f64) -> Option<i64> {
        if !(-9.223_372_036_854_775e18..9.223_372_036_854_775e18).contains(&v) {
            return None;
        }
        let i = v as i64;
        if i as f64 == v { Some(i) } else { None }
    }

    /// A `usize` count below 2^32 as `u32`.
    #[inline(always)]
    pub(crate) const fn u32_from_small_usize(x: usize) -> u32 {
        debug_assert!(x <= u32::MAX as usize);
        x as u32
    }

    /// A `bool` as 0 or 1.
    #[inline(always)]
    pub(crate) const fn u32_from_bool(b: bool) -> u32 {
        b as u32
    }

    /// A `u64` width that is known to be at most 64, as `u32`.
    #[inline(always)]
    pub(crate) const fn u32_from_small_u64(x: u64) -> u32 {
        x as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widths() {
        assert!(Width::new(0).is_err());
        assert!(Width::new(65).is_err());
        let w = Width::of(5);
        assert_eq!(w.mask(), 31);
        assert_eq!(w.half(), 16);
        assert_eq!(w.modulus(), 32);
        assert_eq!(Width::W64.mask(), u64::MAX);
        assert_eq!(Width::W64.modulus(), 1u128 << 64);
    }

    #[test]
    fn arithmetic_wraps() {
        let w = Width::of(5);
        assert_eq!(w.add(30, 5), 3);
        assert_eq!(w.sub(3, 5), 30);
        assert_eq!(w.neg(1), 31);
        assert_eq!(w.mul(7, 9), 63 & 31);
        assert_eq!(w.msb(16), 1);
        assert_eq!(w.msb(15), 0);
        assert_eq!(w.to_signed(31), -1);
        assert_eq!(w.to_signed(16), -16);
        assert_eq!(w.from_signed(-1), 31);
        assert_eq!(w.view(0b1_0110, 3), 0b1_1001);
        assert_eq!(Width::of(3).view(0b1_0110, 3), 0b001);
        assert_eq!(Width::of(4).sign_extend(0b1000, Width::of(8)), 0b1111_1000);
        assert_eq!(Width::W64.to_signed(u64::MAX), -1);
    }

    #[test]
    fn fixed_point() {
        let w = Width::of(20);
        assert_eq!(encode_fixed(w, 1.5, 4).unwrap(), 24);
        assert_eq!(encode_fixed(w, -1.5, 4).unwrap(), w.from_signed(-24));
        assert_eq!(encode_fixed(w, 0.03125, 4).unwrap(), 1); // 0.5 ulp rounds away
        assert_eq!(encode_fixed(w, -0.03125, 4).unwrap(), w.mask()); // −1
        assert!(encode_fixed(w, 1e9, 4).is_err());
        assert!(encode_fixed(w, f64::NAN, 4).is_err());
        assert_eq!(decode_fixed(w, w.from_signed(-24), 4), -1.5);
        assert_eq!(pow2(12), 4096.0);
    }

    #[test]
    fn packed_lengths() {
        assert_eq!(Width::of(50).packed_len(3), Some(19));
        assert_eq!(Width::of(1).packed_len(9), Some(2));
        assert_eq!(Width::W64.packed_len(usize::MAX), None);
    }
}
