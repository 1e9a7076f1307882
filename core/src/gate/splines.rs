//! Spline approximations fitted by `cargo xtask fit` (xtask/src/fit.rs).
//! Generated: do not edit by hand; change the fitter and rerun it.

use super::spline::{Spline, SplinePiece, Tail};

/// GeLU, erf form: x·Φ(x). Target |error| ≤ 2^-8.
/// 5 pieces of degree 2 on [-3.453125, 3.453125); fitted error 2.920e-3 (absolute).
pub const GELU_ERF: Spline = Spline {
    degree: 2,
    left: Tail::Zero,
    right: Tail::Identity,
    pieces: &[
        SplinePiece {
            lo: -3.453125,
            hi: -1.078125,
            center: -2.265625,
            coeffs: [
                -0.02880348492706113,
                -0.06348631563270757,
                -0.0354921029997989,
                0.0,
            ],
        },
        SplinePiece {
            lo: -1.078125,
            hi: -0.15625,
            center: -0.6171875,
            coeffs: [
                -0.16552569163683928,
                0.08389924695458532,
                0.2616002891485093,
                0.0,
            ],
        },
        SplinePiece {
            lo: -0.15625,
            hi: 0.875,
            center: 0.359375,
            coeffs: [
                0.2309087533794107,
                0.7584150377906671,
                0.33440320917835853,
                0.0,
            ],
        },
        SplinePiece {
            lo: 0.875,
            hi: 1.984375,
            center: 1.4296875,
            coeffs: [
                1.3196508376413951,
                1.1134813140681499,
                0.010226867435463935,
                0.0,
            ],
        },
        SplinePiece {
            lo: 1.984375,
            hi: 3.453125,
            center: 2.71875,
            coeffs: [
                2.7099706729196926,
                1.0293890285006937,
                -0.028039406442398652,
                0.0,
            ],
        },
    ],
};

/// GeLU, tanh form (GPT-2). Target |error| ≤ 2^-8.
/// 5 pieces of degree 2 on [-3.390625, 3.390625); fitted error 2.910e-3 (absolute).
pub const GELU_TANH: Spline = Spline {
    degree: 2,
    left: Tail::Zero,
    right: Tail::Identity,
    pieces: &[
        SplinePiece {
            lo: -3.390625,
            hi: -1.078125,
            center: -2.234375,
            coeffs: [
                -0.030664928101146505,
                -0.06614881715333308,
                -0.03540668379101268,
                0.0,
            ],
        },
        SplinePiece {
            lo: -1.078125,
            hi: -0.15625,
            center: -0.6171875,
            coeffs: [
                -0.16556643413786937,
                0.08409627322895506,
                0.261369627802176,
                0.0,
            ],
        },
        SplinePiece {
            lo: -0.15625,
            hi: 0.875,
            center: 0.359375,
            coeffs: [
                0.2309025237930993,
                0.7583208605985202,
                0.33422178991297996,
                0.0,
            ],
        },
        SplinePiece {
            lo: 0.875,
            hi: 1.984375,
            center: 1.4296875,
            coeffs: [
                1.319433708741417,
                1.113638345077172,
                0.010892934991196968,
                0.0,
            ],
        },
        SplinePiece {
            lo: 1.984375,
            hi: 3.390625,
            center: 2.6875,
            coeffs: [
                2.6783696938250023,
                1.0308311029600385,
                -0.029773095753445854,
                0.0,
            ],
        },
    ],
};

/// SiLU: x·σ(x). Target |error| ≤ 2^-8.
/// 7 pieces of degree 2 on [-9.15625, 9.15625); fitted error 2.923e-3 (absolute).
pub const SILU: Spline = Spline {
    degree: 2,
    left: Tail::Zero,
    right: Tail::Identity,
    pieces: &[
        SplinePiece {
            lo: -9.15625,
            hi: -4.375,
            center: -6.765625,
            coeffs: [
                -0.006705915875473412,
                -0.009971255380473118,
                -0.0036698917551424882,
                0.0,
            ],
        },
        SplinePiece {
            lo: -4.375,
            hi: -1.8125,
            center: -3.09375,
            coeffs: [
                -0.13613052921850036,
                -0.0802191121242163,
                -0.011109807924594779,
                0.0,
            ],
        },
        SplinePiece {
            lo: -1.8125,
            hi: -0.578125,
            center: -1.1953125,
            coeffs: [
                -0.2777854022950718,
                0.03315118182802536,
                0.12266913246047538,
                0.0,
            ],
        },
        SplinePiece {
            lo: -0.578125,
            hi: 1.078125,
            center: 0.25,
            coeffs: [
                0.14231662444878113,
                0.6146083521214398,
                0.2274910658138258,
                0.0,
            ],
        },
        SplinePiece {
            lo: 1.078125,
            hi: 2.46875,
            center: 1.7734375,
            coeffs: [
                1.5156179546775501,
                1.062377955541914,
                0.05087466213866964,
                0.0,
            ],
        },
        SplinePiece {
            lo: 2.46875,
            hi: 6.328125,
            center: 4.3984375,
            coeffs: [
                4.34436563612647,
                1.0455287424991613,
                -0.01287330352584099,
                0.0,
            ],
        },
        SplinePiece {
            lo: 6.328125,
            hi: 9.15625,
            center: 7.7421875,
            coeffs: [
                7.738897957434357,
                1.0034606781994204,
                -0.0014166970753109783,
                0.0,
            ],
        },
    ],
};

/// nExp: e^-z for z ≥ 0, 0 from z = 12 on (e^-12 < 2^-17), saturating at 1 below 0. Target |error| ≤ 2^-10.
/// 6 pieces of degree 2 on [0, 12); fitted error 7.227e-4 (absolute).
pub const NEXP: Spline = Spline {
    degree: 2,
    left: Tail::Const(1.0),
    right: Tail::Zero,
    pieces: &[
        SplinePiece {
            lo: 0.0,
            hi: 0.5625,
            center: 0.28125,
            coeffs: [
                0.754790119776626,
                -0.7623390268420802,
                0.38054108602846504,
                0.0,
            ],
        },
        SplinePiece {
            lo: 0.5625,
            hi: 1.25,
            center: 0.90625,
            coeffs: [
                0.40397730193586195,
                -0.4100425055309788,
                0.20451760294846533,
                0.0,
            ],
        },
        SplinePiece {
            lo: 1.25,
            hi: 2.15625,
            center: 1.703125,
            coeffs: [
                0.18203257595623099,
                -0.18683410851579887,
                0.09302055066526876,
                0.0,
            ],
        },
        SplinePiece {
            lo: 2.15625,
            hi: 3.453125,
            center: 2.8046875,
            coeffs: [
                0.06041160740230748,
                -0.0637667824534122,
                0.03161006442567487,
                0.0,
            ],
        },
        SplinePiece {
            lo: 3.453125,
            hi: 5.78125,
            center: 4.6171875,
            coeffs: [
                0.009677750780131968,
                -0.011651705020924856,
                0.005673912580786778,
                0.0,
            ],
        },
        SplinePiece {
            lo: 5.78125,
            hi: 12.0,
            center: 8.890625,
            coeffs: [
                -7.889584480475563e-5,
                -0.00038450127214723117,
                0.00016805949102573082,
                0.0,
            ],
        },
    ],
};

/// Reciprocal 1/s on [1, 1024): the softmax denominator, saturating outside. Target relative error ≤ 2^-7.
/// 14 pieces of degree 2 on [1, 1024); fitted error 4.679e-3 (relative).
pub const RECIP: Spline = Spline {
    degree: 2,
    left: Tail::Const(1.0),
    right: Tail::Const(0.0009765625),
    pieces: &[
        SplinePiece {
            lo: 1.0,
            hi: 1.703125,
            center: 1.3515625,
            coeffs: [
                0.7398848794677407,
                -0.576741679684768,
                0.426716314796288,
                0.0,
            ],
        },
        SplinePiece {
            lo: 1.703125,
            hi: 2.875,
            center: 2.2890625,
            coeffs: [
                0.4368603368607511,
                -0.20072619649956688,
                0.08768809631929561,
                0.0,
            ],
        },
        SplinePiece {
            lo: 2.875,
            hi: 4.875,
            center: 3.875,
            coeffs: [
                0.25806468027270374,
                -0.07010436305111926,
                0.018091204407133184,
                0.0,
            ],
        },
        SplinePiece {
            lo: 4.875,
            hi: 8.25,
            center: 6.5625,
            coeffs: [
                0.15238104786921602,
                -0.024433562410209428,
                0.003723159638943315,
                0.0,
            ],
        },
        SplinePiece {
            lo: 8.25,
            hi: 14.0,
            center: 11.125,
            coeffs: [
                0.08988769795859401,
                -0.00850653541539329,
                0.0007646220492144076,
                0.0,
            ],
        },
        SplinePiece {
            lo: 14.0,
            hi: 23.75,
            center: 18.875,
            coeffs: [
                0.052980166265149425,
                -0.0029549655556590864,
                0.00015655235040656326,
                0.0,
            ],
        },
        SplinePiece {
            lo: 23.75,
            hi: 40.5,
            center: 32.125,
            coeffs: [
                0.031128425325873753,
                -0.0010211088109618551,
                3.178505029251578e-5,
                0.0,
            ],
        },
        SplinePiece {
            lo: 40.5,
            hi: 69.0,
            center: 54.75,
            coeffs: [
                0.01826485222058358,
                -0.00035149057469112014,
                6.419831007604624e-6,
                0.0,
            ],
        },
        SplinePiece {
            lo: 69.0,
            hi: 117.0,
            center: 93.0,
            coeffs: [
                0.01075269501136266,
                -0.00012170896363041568,
                1.3086808743585714e-6,
                0.0,
            ],
        },
        SplinePiece {
            lo: 117.0,
            hi: 198.0,
            center: 157.5,
            coeffs: [
                0.006349210327883984,
                -4.24193791843914e-5,
                2.6932578406710004e-7,
                0.0,
            ],
        },
        SplinePiece {
            lo: 198.0,
            hi: 336.0,
            center: 267.0,
            coeffs: [
                0.003745320748274743,
                -1.4768290651724436e-5,
                5.531120147673834e-8,
                0.0,
            ],
        },
        SplinePiece {
            lo: 336.0,
            hi: 568.0,
            center: 452.0,
            coeffs: [
                0.002212390755580523,
                -5.149432559333431e-6,
                1.1392397928128e-8,
                0.0,
            ],
        },
        SplinePiece {
            lo: 568.0,
            hi: 968.0,
            center: 768.0,
            coeffs: [
                0.0013020841934710046,
                -1.7864259960239363e-6,
                2.3260435355087323e-9,
                0.0,
            ],
        },
        SplinePiece {
            lo: 968.0,
            hi: 1024.0,
            center: 996.0,
            coeffs: [
                0.0010040160643399608,
                -1.0086470539288988e-6,
                1.0126976877864104e-9,
                0.0,
            ],
        },
    ],
};

/// 1/√m on [1, 4): the mantissa step of rsqrt after range reduction. Target relative error ≤ 2^-7.
/// 2 pieces of degree 2 on [1, 4); fitted error 3.862e-3 (relative).
pub const RSQRT_MANTISSA: Spline = Spline {
    degree: 2,
    left: Tail::Zero,
    right: Tail::Zero,
    pieces: &[
        SplinePiece {
            lo: 1.0,
            hi: 2.09375,
            center: 1.546875,
            coeffs: [
                0.8036098288039057,
                -0.27650000039672296,
                0.13824794293510984,
                0.0,
            ],
        },
        SplinePiece {
            lo: 2.09375,
            hi: 4.0,
            center: 3.046875,
            coeffs: [
                0.5727136810265072,
                -0.09862752343890357,
                0.024862690382006433,
                0.0,
            ],
        },
    ],
};
