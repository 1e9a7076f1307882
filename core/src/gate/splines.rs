//! Spline approximations fitted by `cargo xtask fit` (xtask/src/fit.rs).
//! Generated: do not edit by hand; change the fitter and rerun it.

use super::spline::{Spline, SplinePiece, Tail};

/// GeLU, erf form: x·Φ(x). Target |error| ≤ 2^-8.
/// 5 pieces of degree 2 on [-3.453125, 3.453125); fitted error 2.919e-3 (absolute).
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
                -0.02879835227749063,
                -0.06347035024946161,
                -0.035517631864749925,
                0.0,
            ],
        },
        SplinePiece {
            lo: -1.078125,
            hi: -0.15625,
            center: -0.6171875,
            coeffs: [
                -0.16552605118462754,
                0.08386325086697162,
                0.2616006615871666,
                0.0,
            ],
        },
        SplinePiece {
            lo: -0.15625,
            hi: 0.875,
            center: 0.359375,
            coeffs: [
                0.23090742498256295,
                0.7584465263454617,
                0.3344053309406964,
                0.0,
            ],
        },
        SplinePiece {
            lo: 0.875,
            hi: 1.984375,
            center: 1.4296875,
            coeffs: [
                1.3196521176164289,
                1.1135112665561917,
                0.010225773175495818,
                0.0,
            ],
        },
        SplinePiece {
            lo: 1.984375,
            hi: 3.453125,
            center: 2.71875,
            coeffs: [
                2.709970467425636,
                1.029378104378274,
                -0.02803917905709461,
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
                -0.030661025507069697,
                -0.0661481125511946,
                -0.03541714653964429,
                0.0,
            ],
        },
        SplinePiece {
            lo: -1.078125,
            hi: -0.15625,
            center: -0.6171875,
            coeffs: [
                -0.16556678669935646,
                0.08406028943655297,
                0.2613699916851817,
                0.0,
            ],
        },
        SplinePiece {
            lo: -0.15625,
            hi: 0.875,
            center: 0.359375,
            coeffs: [
                0.2309011967315205,
                0.7583524203449992,
                0.3342239164306353,
                0.0,
            ],
        },
        SplinePiece {
            lo: 0.875,
            hi: 1.984375,
            center: 1.4296875,
            coeffs: [
                1.3194349658462876,
                1.1136682022408895,
                0.010891888066870751,
                0.0,
            ],
        },
        SplinePiece {
            lo: 1.984375,
            hi: 3.390625,
            center: 2.6875,
            coeffs: [
                2.678369584483177,
                1.0308207586052898,
                -0.029772941595018185,
                0.0,
            ],
        },
    ],
};

/// GeLU, tanh form, pieces of degree 1 (decode passes). Target |error| ≤ 2^-8.
/// 13 pieces of degree 1 on [-3.390625, 3.390625); fitted error 2.903e-3 (absolute).
pub const GELU_TANH_LINEAR: Spline = Spline {
    degree: 1,
    left: Tail::Zero,
    right: Tail::Identity,
    pieces: &[
        SplinePiece {
            lo: -3.390625,
            hi: -2.375,
            center: -2.8828125,
            coeffs: [-0.0078895687906422, -0.019221253614218593, 0.0, 0.0],
        },
        SplinePiece {
            lo: -2.375,
            hi: -1.71875,
            center: -2.046875,
            coeffs: [-0.04428267983685912, -0.08118853395417584, 0.0, 0.0],
        },
        SplinePiece {
            lo: -1.71875,
            hi: -0.921875,
            center: -1.3203125,
            coeffs: [-0.1218888182584993, -0.11389414193761416, 0.0, 0.0],
        },
        SplinePiece {
            lo: -0.921875,
            hi: -0.59375,
            center: -0.7578125,
            coeffs: [-0.1671820399917974, 0.0011752719010540529, 0.0, 0.0],
        },
        SplinePiece {
            lo: -0.59375,
            hi: -0.328125,
            center: -0.4609375,
            coeffs: [-0.14581829041248262, 0.15901032708904964, 0.0, 0.0],
        },
        SplinePiece {
            lo: -0.328125,
            hi: -0.09375,
            center: -0.2109375,
            coeffs: [-0.08524311606530897, 0.3349264552114906, 0.0, 0.0],
        },
        SplinePiece {
            lo: -0.09375,
            hi: 0.140625,
            center: 0.0234375,
            coeffs: [0.014662287603529304, 0.5186111408611687, 0.0, 0.0],
        },
        SplinePiece {
            lo: 0.140625,
            hi: 0.390625,
            center: 0.265625,
            coeffs: [0.16351825005052076, 0.7059601419137936, 0.0, 0.0],
        },
        SplinePiece {
            lo: 0.390625,
            hi: 0.65625,
            center: 0.5234375,
            coeffs: [0.36884224454358355, 0.8796197505337968, 0.0, 0.0],
        },
        SplinePiece {
            lo: 0.65625,
            hi: 1.0,
            center: 0.828125,
            coeffs: [0.6619902496895029, 1.0265438049960516, 0.0, 0.0],
        },
        SplinePiece {
            lo: 1.0,
            hi: 2.0625,
            center: 1.53125,
            coeffs: [1.4333794471073622, 1.1137876613290658, 0.0, 0.0],
        },
        SplinePiece {
            lo: 2.0625,
            hi: 2.8125,
            center: 2.4375,
            coeffs: [2.4170464515805166, 1.045045988506218, 0.0, 0.0],
        },
        SplinePiece {
            lo: 2.8125,
            hi: 3.390625,
            center: 3.1015625,
            coeffs: [3.098417191526006, 1.0095335531972827, 0.0, 0.0],
        },
    ],
};

/// GeLU, tanh form, where a norm rescales the MLP's output (Gemma 3). Target |error| ≤ 2^-11.
/// 13 pieces of degree 2 on [-3.890625, 3.890625); fitted error 1.827e-4 (absolute).
pub const GELU_TANH_FINE: Spline = Spline {
    degree: 2,
    left: Tail::Zero,
    right: Tail::Identity,
    pieces: &[
        SplinePiece {
            lo: -3.890625,
            hi: -2.90625,
            center: -3.3984375,
            coeffs: [
                -0.000865504812160551,
                -0.004473451712238138,
                -0.006727235894047131,
                0.0,
            ],
        },
        SplinePiece {
            lo: -2.90625,
            hi: -2.203125,
            center: -2.5546875,
            coeffs: [
                -0.013121013571657054,
                -0.03541463909968957,
                -0.035397340617002504,
                0.0,
            ],
        },
        SplinePiece {
            lo: -2.203125,
            hi: -1.5,
            center: -1.8515625,
            coeffs: [
                -0.059447295544196505,
                -0.1004888253689731,
                -0.04713846519365499,
                0.0,
            ],
        },
        SplinePiece {
            lo: -1.5,
            hi: -1.09375,
            center: -1.296875,
            coeffs: [
                -0.12647880191754127,
                -0.1230620988579522,
                0.02988210914476364,
                0.0,
            ],
        },
        SplinePiece {
            lo: -1.09375,
            hi: -0.734375,
            center: -0.9140625,
            coeffs: [
                -0.16496951697400605,
                -0.056403745780201645,
                0.15340319096481878,
                0.0,
            ],
        },
        SplinePiece {
            lo: -0.734375,
            hi: -0.375,
            center: -0.5546875,
            coeffs: [
                -0.16063003812096302,
                0.10279116717732392,
                0.2880084671960054,
                0.0,
            ],
        },
        SplinePiece {
            lo: -0.375,
            hi: 0.375,
            center: 0.0,
            coeffs: [
                0.00016001774515247866,
                0.49999999999999994,
                0.3897418988023906,
                0.0,
            ],
        },
        SplinePiece {
            lo: 0.375,
            hi: 0.734375,
            center: 0.5546875,
            coeffs: [
                0.39405746187903495,
                0.8972088328226827,
                0.288008467196109,
                0.0,
            ],
        },
        SplinePiece {
            lo: 0.734375,
            hi: 1.09375,
            center: 0.9140625,
            coeffs: [
                0.7490929830259884,
                1.056403745780207,
                0.15340319096509916,
                0.0,
            ],
        },
        SplinePiece {
            lo: 1.09375,
            hi: 1.5,
            center: 1.296875,
            coeffs: [
                1.1703961980824522,
                1.1230620988579685,
                0.02988210914503964,
                0.0,
            ],
        },
        SplinePiece {
            lo: 1.5,
            hi: 2.234375,
            center: 1.8671875,
            coeffs: [
                1.8093052203390403,
                1.0989188978478779,
                -0.0475152380306392,
                0.0,
            ],
        },
        SplinePiece {
            lo: 2.234375,
            hi: 2.9375,
            center: 2.5859375,
            coeffs: [
                2.5738448399114304,
                1.0332483123864056,
                -0.03394351486071313,
                0.0,
            ],
        },
        SplinePiece {
            lo: 2.9375,
            hi: 3.890625,
            center: 3.4140625,
            coeffs: [
                3.4132430358238084,
                1.0041978003732919,
                -0.006395123673939275,
                0.0,
            ],
        },
    ],
};

/// SiLU: x·σ(x). Target |error| ≤ 2^-8.
/// 7 pieces of degree 2 on [-9.15625, 9.15625); fitted error 2.921e-3 (absolute).
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
                -0.006707560200378893,
                -0.009964532246911456,
                -0.003669854974100375,
                0.0,
            ],
        },
        SplinePiece {
            lo: -4.375,
            hi: -1.8125,
            center: -3.09375,
            coeffs: [
                -0.13612739672501617,
                -0.08023011840410313,
                -0.011110589400327685,
                0.0,
            ],
        },
        SplinePiece {
            lo: -1.8125,
            hi: -0.578125,
            center: -1.1953125,
            coeffs: [
                -0.27778524294725004,
                0.03312442667215542,
                0.12266902337594739,
                0.0,
            ],
        },
        SplinePiece {
            lo: -0.578125,
            hi: 1.078125,
            center: 0.25,
            coeffs: [
                0.14231317668682258,
                0.6146251132090751,
                0.22749802400340388,
                0.0,
            ],
        },
        SplinePiece {
            lo: 1.078125,
            hi: 2.46875,
            center: 1.7734375,
            coeffs: [
                1.5156186806909464,
                1.062402040317582,
                0.05087439418376455,
                0.0,
            ],
        },
        SplinePiece {
            lo: 2.46875,
            hi: 6.328125,
            center: 4.3984375,
            coeffs: [
                4.344367823570895,
                1.0455212497002155,
                -0.012874815913146747,
                0.0,
            ],
        },
        SplinePiece {
            lo: 6.328125,
            hi: 9.15625,
            center: 7.7421875,
            coeffs: [
                7.738897851988143,
                1.0034596281704904,
                -0.0014166944824296568,
                0.0,
            ],
        },
    ],
};

/// SiLU, pieces of degree 1 (decode passes). Target |error| ≤ 2^-8.
/// 22 pieces of degree 1 on [-9.15625, 9.15625); fitted error 1.951e-3 (absolute).
pub const SILU_LINEAR: Spline = Spline {
    degree: 1,
    left: Tail::Zero,
    right: Tail::Identity,
    pieces: &[
        SplinePiece {
            lo: -9.15625,
            hi: -6.078125,
            center: -7.6171875,
            coeffs: [-0.005509606455248531, -0.004203806504469585, 0.0, 0.0],
        },
        SplinePiece {
            lo: -6.078125,
            hi: -4.671875,
            center: -5.375,
            coeffs: [-0.026671744103956927, -0.020905650985228882, 0.0, 0.0],
        },
        SplinePiece {
            lo: -4.671875,
            hi: -3.671875,
            center: -4.171875,
            coeffs: [-0.06526472448666956, -0.04775746434422532, 0.0, 0.0],
        },
        SplinePiece {
            lo: -3.671875,
            hi: -2.734375,
            center: -3.203125,
            coeffs: [-0.12697815511448907, -0.08071752023665593, 0.0, 0.0],
        },
        SplinePiece {
            lo: -2.734375,
            hi: -1.6875,
            center: -2.2109375,
            coeffs: [-0.21701814904925512, -0.09236151006078927, 0.0, 0.0],
        },
        SplinePiece {
            lo: -1.6875,
            hi: -1.265625,
            center: -1.4765625,
            coeffs: [-0.2727603156362173, -0.035599048169185035, 0.0, 0.0],
        },
        SplinePiece {
            lo: -1.265625,
            hi: -0.9375,
            center: -1.1015625,
            coeffs: [-0.27296341725269513, 0.044584657210514314, 0.0, 0.0],
        },
        SplinePiece {
            lo: -0.9375,
            hi: -0.65625,
            center: -0.796875,
            coeffs: [-0.24579292320390997, 0.14099416274343912, 0.0, 0.0],
        },
        SplinePiece {
            lo: -0.65625,
            hi: -0.390625,
            center: -0.5234375,
            coeffs: [-0.1928291035083193, 0.25042994705032334, 0.0, 0.0],
        },
        SplinePiece {
            lo: -0.390625,
            hi: -0.140625,
            center: -0.265625,
            coeffs: [-0.11339814357170047, 0.369066527375918, 0.0, 0.0],
        },
        SplinePiece {
            lo: -0.140625,
            hi: 0.09375,
            center: -0.0234375,
            coeffs: [-0.009871706552801894, 0.48830911873725913, 0.0, 0.0],
        },
        SplinePiece {
            lo: 0.09375,
            hi: 0.34375,
            center: 0.21875,
            coeffs: [0.12319000539071018, 0.6082310794668857, 0.0, 0.0],
        },
        SplinePiece {
            lo: 0.34375,
            hi: 0.59375,
            center: 0.46875,
            coeffs: [0.2900657944019525, 0.7255197993107682, 0.0, 0.0],
        },
        SplinePiece {
            lo: 0.59375,
            hi: 0.875,
            center: 0.734375,
            coeffs: [0.4981444830352595, 0.8357436042392801, 0.0, 0.0],
        },
        SplinePiece {
            lo: 0.875,
            hi: 1.1875,
            center: 1.03125,
            coeffs: [0.761975088052705, 0.9357160668477127, 0.0, 0.0],
        },
        SplinePiece {
            lo: 1.1875,
            hi: 1.59375,
            center: 1.390625,
            coeffs: [1.1153732335448199, 1.0207002515874828, 0.0, 0.0],
        },
        SplinePiece {
            lo: 1.59375,
            hi: 2.296875,
            center: 1.9453125,
            coeffs: [1.703858511648066, 1.0842226974207008, 0.0, 0.0],
        },
        SplinePiece {
            lo: 2.296875,
            hi: 3.390625,
            center: 2.84375,
            coeffs: [2.685479515495183, 1.0908715164739677, 0.0, 0.0],
        },
        SplinePiece {
            lo: 3.390625,
            hi: 4.34375,
            center: 3.8671875,
            coeffs: [3.786029132796729, 1.0575033992285026, 0.0, 0.0],
        },
        SplinePiece {
            lo: 4.34375,
            hi: 5.578125,
            center: 4.9609375,
            coeffs: [4.924517968202359, 1.0281028919359532, 0.0, 0.0],
        },
        SplinePiece {
            lo: 5.578125,
            hi: 7.8125,
            center: 6.6953125,
            coeffs: [6.685180047161493, 1.0079874341596613, 0.0, 0.0],
        },
        SplinePiece {
            lo: 7.8125,
            hi: 9.15625,
            center: 8.484375,
            coeffs: [8.482468603198278, 1.0016325641501467, 0.0, 0.0],
        },
    ],
};

/// nExp: e^-z for z ≥ 0, 0 from z = 12 on (e^-12 < 2^-17), saturating at 1 below 0. Target |error| ≤ 2^-10.
/// 7 pieces of degree 2 on [0, 12); fitted error 5.850e-4 (absolute).
pub const NEXP: Spline = Spline {
    degree: 2,
    left: Tail::Const(1.0),
    right: Tail::Zero,
    pieces: &[
        SplinePiece {
            lo: 0.0,
            hi: 0.515625,
            center: 0.2578125,
            coeffs: [
                0.7727044187126155,
                -0.779175481964018,
                0.3890536788122262,
                0.0,
            ],
        },
        SplinePiece {
            lo: 0.515625,
            hi: 1.140625,
            center: 0.828125,
            coeffs: [
                0.4368240221268899,
                -0.4422198488815887,
                0.2206654943068716,
                0.0,
            ],
        },
        SplinePiece {
            lo: 1.140625,
            hi: 1.9375,
            center: 1.5390625,
            coeffs: [
                0.21452537646449987,
                -0.21886642579043059,
                0.10907705687342449,
                0.0,
            ],
        },
        SplinePiece {
            lo: 1.9375,
            hi: 3.03125,
            center: 2.484375,
            coeffs: [
                0.08329875697935661,
                -0.08653165114674675,
                0.04300294363469178,
                0.0,
            ],
        },
        SplinePiece {
            lo: 3.03125,
            hi: 4.765625,
            center: 3.8984375,
            coeffs: [
                0.020149448935549583,
                -0.02223775837113386,
                0.010953793484683312,
                0.0,
            ],
        },
        SplinePiece {
            lo: 4.765625,
            hi: 9.078125,
            center: 6.921875,
            coeffs: [
                0.000705439377867571,
                -0.0016779354521892552,
                0.0007767514974587018,
                0.0,
            ],
        },
        SplinePiece {
            lo: 9.078125,
            hi: 12.0,
            center: 10.5390625,
            coeffs: [
                2.5081071926657056e-5,
                -3.4184048038705484e-5,
                1.642838369636644e-5,
                0.0,
            ],
        },
    ],
};

/// nExp, pieces of degree 1 (decode passes). Target |error| ≤ 2^-10.
/// 22 pieces of degree 1 on [0, 12); fitted error 5.853e-4 (absolute).
pub const NEXP_LINEAR: Spline = Spline {
    degree: 1,
    left: Tail::Const(1.0),
    right: Tail::Zero,
    pieces: &[
        SplinePiece {
            lo: 0.0,
            hi: 0.09375,
            center: 0.046875,
            coeffs: [0.9547295277201274, -0.954556620842894, 0.0, 0.0],
        },
        SplinePiece {
            lo: 0.09375,
            hi: 0.1875,
            center: 0.140625,
            coeffs: [0.8692911273046448, -0.8691336938013516, 0.0, 0.0],
        },
        SplinePiece {
            lo: 0.1875,
            hi: 0.28125,
            center: 0.234375,
            coeffs: [0.791498578466608, -0.7913552336306552, 0.0, 0.0],
        },
        SplinePiece {
            lo: 0.28125,
            hi: 0.390625,
            center: 0.3359375,
            coeffs: [0.7152008130073991, -0.7150245381155714, 0.0, 0.0],
        },
        SplinePiece {
            lo: 0.390625,
            hi: 0.5,
            center: 0.4453125,
            coeffs: [0.6411018653605817, -0.6409438535687738, 0.0, 0.0],
        },
        SplinePiece {
            lo: 0.5,
            hi: 0.625,
            center: 0.5625,
            coeffs: [0.5703379262344077, -0.5701543544697172, 0.0, 0.0],
        },
        SplinePiece {
            lo: 0.625,
            hi: 0.75,
            center: 0.6875,
            coeffs: [0.5033214533283857, -0.5031594518146432, 0.0, 0.0],
        },
        SplinePiece {
            lo: 0.75,
            hi: 0.890625,
            center: 0.8203125,
            coeffs: [0.44083696117434196, -0.4406574157780509, 0.0, 0.0],
        },
        SplinePiece {
            lo: 0.890625,
            hi: 1.046875,
            center: 0.96875,
            coeffs: [0.38013503563578277, -0.3799439372242877, 0.0, 0.0],
        },
        SplinePiece {
            lo: 1.046875,
            hi: 1.203125,
            center: 1.125,
            coeffs: [0.32514672647690773, -0.32498327134356997, 0.0, 0.0],
        },
        SplinePiece {
            lo: 1.203125,
            hi: 1.375,
            center: 1.2890625,
            coeffs: [0.2760365679670526, -0.2758686993850147, 0.0, 0.0],
        },
        SplinePiece {
            lo: 1.375,
            hi: 1.5625,
            center: 1.46875,
            coeffs: [0.23071784126215683, -0.23055090537984943, 0.0, 0.0],
        },
        SplinePiece {
            lo: 1.5625,
            hi: 1.78125,
            center: 1.671875,
            coeffs: [0.18845528350985802, -0.1882697943024544, 0.0, 0.0],
        },
        SplinePiece {
            lo: 1.78125,
            hi: 2.03125,
            center: 1.90625,
            coeffs: [0.14921633451196295, -0.1490246353237937, 0.0, 0.0],
        },
        SplinePiece {
            lo: 2.03125,
            hi: 2.3125,
            center: 2.171875,
            coeffs: [0.11452630483694336, -0.11434023095509963, 0.0, 0.0],
        },
        SplinePiece {
            lo: 2.3125,
            hi: 2.640625,
            center: 2.4765625,
            coeffs: [0.08459641896342968, -0.08440958293325715, 0.0, 0.0],
        },
        SplinePiece {
            lo: 2.640625,
            hi: 3.03125,
            center: 2.8359375,
            coeffs: [0.059222688059422365, -0.05903769687648049, 0.0, 0.0],
        },
        SplinePiece {
            lo: 3.03125,
            hi: 3.515625,
            center: 3.2734375,
            coeffs: [0.03843176631628296, -0.03824786645412812, 0.0, 0.0],
        },
        SplinePiece {
            lo: 3.515625,
            hi: 4.171875,
            center: 3.84375,
            coeffs: [0.021991461164112006, -0.02179999805589779, 0.0, 0.0],
        },
        SplinePiece {
            lo: 4.171875,
            hi: 5.140625,
            center: 4.65625,
            coeffs: [0.010065196251885193, -0.009878487984049982, 0.0, 0.0],
        },
        SplinePiece {
            lo: 5.140625,
            hi: 7.09375,
            center: 6.1171875,
            coeffs: [0.0027573709264921238, -0.0025726822974745014, 0.0, 0.0],
        },
        SplinePiece {
            lo: 7.09375,
            hi: 12.0,
            center: 9.546875,
            coeffs: [0.00022078290933835005, -0.00016814185019734893, 0.0, 0.0],
        },
    ],
};

/// Reciprocal 1/s on [1, 1024): the softmax denominator, saturating outside. Target relative error ≤ 2^-7.
/// 14 pieces of degree 2 on [1, 1024); fitted error 4.673e-3 (relative).
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
                0.7398849376708294,
                -0.5766825567163623,
                0.4266714145458001,
                0.0,
            ],
        },
        SplinePiece {
            lo: 1.703125,
            hi: 2.875,
            center: 2.2890625,
            coeffs: [
                0.436860369004917,
                -0.2007063040358093,
                0.08767917626611685,
                0.0,
            ],
        },
        SplinePiece {
            lo: 2.875,
            hi: 4.875,
            center: 3.875,
            coeffs: [
                0.2580646999151182,
                -0.07009729542941806,
                0.018089332285103704,
                0.0,
            ],
        },
        SplinePiece {
            lo: 4.875,
            hi: 8.25,
            center: 6.5625,
            coeffs: [
                0.15238105929618145,
                -0.024431117617764016,
                0.0037227772485365043,
                0.0,
            ],
        },
        SplinePiece {
            lo: 8.25,
            hi: 14.0,
            center: 11.125,
            coeffs: [
                0.08988770484041951,
                -0.008505675283097997,
                0.0007645426900454616,
                0.0,
            ],
        },
        SplinePiece {
            lo: 14.0,
            hi: 23.75,
            center: 18.875,
            coeffs: [
                0.052980170311610716,
                -0.002954667128851999,
                0.00015653612173275013,
                0.0,
            ],
        },
        SplinePiece {
            lo: 23.75,
            hi: 40.5,
            center: 32.125,
            coeffs: [
                0.031128427797607803,
                -0.0010210036381087465,
                3.178168991499862e-5,
                0.0,
            ],
        },
        SplinePiece {
            lo: 40.5,
            hi: 69.0,
            center: 54.75,
            coeffs: [
                0.018264853661036577,
                -0.000351454496398933,
                6.419154628453013e-6,
                0.0,
            ],
        },
        SplinePiece {
            lo: 69.0,
            hi: 117.0,
            center: 93.0,
            coeffs: [
                0.010752695829796573,
                -0.00012169669345385088,
                1.3085454488645885e-6,
                0.0,
            ],
        },
        SplinePiece {
            lo: 117.0,
            hi: 198.0,
            center: 157.5,
            coeffs: [
                0.00634921080400765,
                -4.2415134753062576e-5,
                2.6929812272391816e-7,
                0.0,
            ],
        },
        SplinePiece {
            lo: 198.0,
            hi: 336.0,
            center: 267.0,
            coeffs: [
                0.0037453210350174592,
                -1.4766797366489481e-5,
                5.5305460796120595e-8,
                0.0,
            ],
        },
        SplinePiece {
            lo: 336.0,
            hi: 568.0,
            center: 452.0,
            coeffs: [
                0.00221239092013318,
                -5.14891944483001e-6,
                1.1391232699566616e-8,
                0.0,
            ],
        },
        SplinePiece {
            lo: 568.0,
            hi: 968.0,
            center: 768.0,
            coeffs: [
                0.001302084296394262,
                -1.7862424185900646e-6,
                2.325798185449728e-9,
                0.0,
            ],
        },
        SplinePiece {
            lo: 968.0,
            hi: 1024.0,
            center: 996.0,
            coeffs: [
                0.001004016064349913,
                -1.0086459077188203e-6,
                1.0126965058975103e-9,
                0.0,
            ],
        },
    ],
};

/// 1/m on [1, 2): the mantissa step of the reciprocal after range reduction. Target relative error ≤ 2^-7.
/// 2 pieces of degree 2 on [1, 2); fitted error 3.739e-3 (relative).
pub const RECIP_MANTISSA: Spline = Spline {
    degree: 2,
    left: Tail::Zero,
    right: Tail::Zero,
    pieces: &[
        SplinePiece {
            lo: 1.0,
            hi: 1.640625,
            center: 1.3203125,
            coeffs: [
                0.7573968669151987,
                -0.6001313992716492,
                0.4545309223252496,
                0.0,
            ],
        },
        SplinePiece {
            lo: 1.640625,
            hi: 2.0,
            center: 1.8203125,
            coeffs: [
                0.5493562309854028,
                -0.30401325381682315,
                0.16701118792228192,
                0.0,
            ],
        },
    ],
};

/// 1/√m on [1, 4): the mantissa step of rsqrt after range reduction. Target relative error ≤ 2^-11.
/// 5 pieces of degree 2 on [1, 4); fitted error 2.320e-4 (relative).
pub const RSQRT_MANTISSA: Spline = Spline {
    degree: 2,
    left: Tail::Zero,
    right: Tail::Zero,
    pieces: &[
        SplinePiece {
            lo: 1.0,
            hi: 1.328125,
            center: 1.1640625,
            coeffs: [
                0.9268441888695803,
                -0.4018662853411326,
                0.2601391290517062,
                0.0,
            ],
        },
        SplinePiece {
            lo: 1.328125,
            hi: 1.765625,
            center: 1.546875,
            coeffs: [
                0.8040206450914597,
                -0.2623559479784243,
                0.12780562283133098,
                0.0,
            ],
        },
        SplinePiece {
            lo: 1.765625,
            hi: 2.34375,
            center: 2.0546875,
            coeffs: [
                0.6976249889530903,
                -0.17136119537995098,
                0.06284340087885296,
                0.0,
            ],
        },
        SplinePiece {
            lo: 2.34375,
            hi: 3.125,
            center: 2.734375,
            coeffs: [
                0.6047356282893621,
                -0.11165329195577385,
                0.03077302301884712,
                0.0,
            ],
        },
        SplinePiece {
            lo: 3.125,
            hi: 4.0,
            center: 3.5625,
            coeffs: [
                0.529809360296354,
                -0.07489040549330385,
                0.01582260485685937,
                0.0,
            ],
        },
    ],
};
