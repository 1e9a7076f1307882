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
/// Fraction bits of the softmax denominator's reciprocal, at most (see
/// [`recip_frac`]).
pub const RECIP_FRAC: u32 = 24;
/// The softmax reciprocal's rounding, relative, on the row of the largest
/// sum a model admits: at most 2^-`RECIP_ROUNDING` (see [`recip_frac`]).
pub const RECIP_ROUNDING: u32 = 11;
/// Fraction bits of LayerNorm's 1/√(Σ y²).
pub const RSQRT_FRAC: u32 = 24;
/// Fraction bits of the public 1/d used for the LayerNorm mean.
pub const MEAN_FRAC: u32 = 16;

/// Fraction bits of the softmax reciprocal `1/Σe` for a model whose rows
/// hold at most `positions` keys (its position limit, never the plan's
/// padded key count, so that a row's bits do not depend on the padding
/// around it). Each `e ≤ nExp(0) ≈ 1`, so `Σe ≤ positions` and the
/// reciprocal's truncation errs by less than `Σe·2^-frac ≤ 2^-RECIP_ROUNDING`
/// of it: 2^-11, against 2^-8 for the reciprocal's own spline. 20 bits for
/// BERT's 512 positions, 21 for GPT-2's 1,024, and RECIP_FRAC from 8,192
/// on (the Llama-family decoders).
pub fn recip_frac(positions: usize) -> u32 {
    let log2 = usize::BITS - positions.saturating_sub(1).leading_zeros();
    (RECIP_ROUNDING + log2).min(RECIP_FRAC)
}

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

    /// The reciprocal's bits hold `positions·2^-frac ≤ 2^-RECIP_ROUNDING`
    /// and never exceed RECIP_FRAC.
    #[test]
    fn the_reciprocals_bits_follow_the_position_limit() {
        let cases = [
            (1, 11),
            (2, 12),
            (128, 18),
            (512, 20),
            (513, 21),
            (1024, 21),
        ];
        for (positions, frac) in cases {
            assert_eq!(recip_frac(positions), frac, "{positions} positions");
        }
        for positions in [8192, 32768, 131_072] {
            assert_eq!(recip_frac(positions), RECIP_FRAC);
        }
        for positions in 1..5000usize {
            let frac = recip_frac(positions);
            assert!(frac == RECIP_FRAC || positions as f64 * pow2(RECIP_ROUNDING) <= pow2(frac));
        }
    }
}
