//! Fixed-point conventions of the secure models: every wire is a u64 in the
//! ring Z_2^64 holding a signed value times 2^scale.
//!
//! The scales below are the plan's choices (docs/PLAN.md explains each).

use suffuse_core::ring::Width;

/// The ring of every tensor.
pub const RING: Width = Width::W64;
/// Fraction bits of activations between layers.
pub const FRAC: u32 = 12;
/// Fraction bits of weights and per-column LayerNorm gains.
pub const WEIGHT_FRAC: u32 = 12;
/// Fraction bits of the softmax denominator's reciprocal.
pub const RECIP_FRAC: u32 = 24;
/// Fraction bits of LayerNorm's 1/√(Σ y²).
pub const RSQRT_FRAC: u32 = 24;
/// Fraction bits of the public 1/d used for the LayerNorm mean.
pub const MEAN_FRAC: u32 = 16;

/// 2^e as f64, for any e a scale can take.
pub fn pow2(e: u32) -> f64 {
    f64::from(e.min(1023)).exp2()
}

/// `round(v·2^scale)` as a ring element (two's complement mod 2^64).
/// Saturates at ±2^62, far beyond anything a proven bound admits.
pub fn encode(v: f64, scale: u32) -> u64 {
    let x = (v * pow2(scale)).round();
    let limit = pow2(62);
    let x = x.clamp(-limit, limit);
    // In range by the clamp; the cast is exact for integers below 2^63.
    (x as i64) as u64
}

/// The real value of a ring element at `scale`.
pub fn decode(x: u64, scale: u32) -> f64 {
    (x as i64) as f64 / pow2(scale)
}

/// The signed value of a ring element.
pub fn signed(x: u64) -> i64 {
    x as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_round_trips_and_rounds_to_nearest() {
        for v in [0.0, 1.0, -1.0, 0.5, -3.25, 1234.000244140625] {
            assert_eq!(decode(encode(v, FRAC), FRAC), v);
        }
        assert_eq!(encode(1.0 / 8192.0 + 1e-9, FRAC), 1);
        assert_eq!(encode(-1.0 / 4096.0, FRAC), u64::MAX);
    }
}
