//! `cargo xtask fit`: fits the spline approximations the gates use and
//! writes them to `core/src/gate/splines.rs`.
//!
//! Each function is approximated on a bounded range by pieces of degree d,
//! each a near-minimax fit (Lawson's iteratively reweighted least squares)
//! in the piece's local variable `x − center`. Knots are chosen greedily on
//! a dyadic grid, so that every boundary is exact in fixed point with at
//! least [`KNOT_BITS`] fractional bits: each piece is stretched as far as
//! its error stays under the budget. The error budget is a fraction of the
//! gate's accuracy target, leaving the rest to coefficient rounding, which
//! the gate tests measure on the fixed-point result.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};

/// Knots lie on multiples of `2^-KNOT_BITS` (times the range's octave for
/// relative-error fits), so they are exact at f ≥ KNOT_BITS.
const KNOT_BITS: i32 = 6;

/// How error is measured.
#[derive(Clone, Copy)]
enum Error {
    Absolute,
    Relative,
}

/// A function to fit and how.
struct Target {
    name: &'static str,
    doc: &'static str,
    f: fn(f64) -> f64,
    lo: f64,
    hi: f64,
    degree: usize,
    budget: f64,
    error: Error,
    left: &'static str,
    right: &'static str,
}

fn gelu_erf(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

fn gelu_tanh(x: f64) -> f64 {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (c * (x + 0.044_715 * x * x * x)).tanh())
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

fn nexp(z: f64) -> f64 {
    (-z).exp()
}

fn recip(s: f64) -> f64 {
    1.0 / s
}

fn rsqrt(m: f64) -> f64 {
    1.0 / m.sqrt()
}

/// The smallest T ≥ 0 (on the knot grid) beyond which `tail` stays within
/// `budget` of `f`.
fn tail_bound(f: fn(f64) -> f64, tail: fn(f64, f64) -> f64, budget: f64) -> f64 {
    let step = 2f64.powi(-KNOT_BITS);
    let mut t = 64.0;
    while t > 0.0 {
        let mut ok = true;
        let mut x = t;
        while x < 64.0 {
            if (tail(x, f(x)) > budget) || (tail(-x, f(-x)) > budget) {
                ok = false;
                break;
            }
            x += step / 4.0;
        }
        if !ok {
            return t + step;
        }
        t -= step;
    }
    0.0
}

fn targets() -> Vec<Target> {
    // GeLU/SiLU: x⁺ tails; the spline covers [−T, T) where the tails are
    // within budget: right tail x, left tail 0.
    let act_tail = |x: f64, fx: f64| if x >= 0.0 { (x - fx).abs() } else { fx.abs() };
    let gelu_t = tail_bound(gelu_erf, act_tail, 2f64.powi(-10));
    let gelu_tanh_t = tail_bound(gelu_tanh, act_tail, 2f64.powi(-10));
    let gelu_fine_t = tail_bound(gelu_tanh, act_tail, 2f64.powi(-13));
    let silu_t = tail_bound(silu, act_tail, 2f64.powi(-10));
    vec![
        // Degree 2 (output at 2f + 12). At degree 1 (13 pieces) BERT-base's
        // keys fell by 2 % (6.91 to 6.77 GB per server), but the firmware's
        // GeLU (examples/mcu, 64 KiB of RAM) then needs 2,456 scratch words
        // where its runtime-gates build has room for 1,472.
        Target {
            name: "GELU_ERF",
            doc: "GeLU, erf form: x·Φ(x). Target |error| ≤ 2^-8.",
            f: gelu_erf,
            lo: -gelu_t,
            hi: gelu_t,
            degree: 2,
            budget: 0.75 * 2f64.powi(-8),
            error: Error::Absolute,
            left: "Tail::Zero",
            right: "Tail::Identity",
        },
        Target {
            name: "GELU_TANH",
            doc: "GeLU, tanh form (GPT-2). Target |error| ≤ 2^-8.",
            f: gelu_tanh,
            lo: -gelu_tanh_t,
            hi: gelu_tanh_t,
            degree: 2,
            budget: 0.75 * 2f64.powi(-8),
            error: Error::Absolute,
            left: "Tail::Zero",
            right: "Tail::Identity",
        },
        // Degree 1 (output at f + 12, so the product after it truncates 12
        // bits fewer), for decode passes, where a row's key bytes count and
        // its 13 pieces' extra DCF points do not (docs/GATES.md).
        Target {
            name: "GELU_TANH_LINEAR",
            doc: "GeLU, tanh form, pieces of degree 1 (decode passes). Target |error| ≤ 2^-8.",
            f: gelu_tanh,
            lo: -gelu_tanh_t,
            hi: gelu_tanh_t,
            degree: 1,
            budget: 0.75 * 2f64.powi(-8),
            error: Error::Absolute,
            left: "Tail::Zero",
            right: "Tail::Identity",
        },
        Target {
            name: "GELU_TANH_FINE",
            // A row whose MLP is nearly silent carries the spline's absolute
            // error up to unit RMS through the norm after it.
            doc: "GeLU, tanh form, where a norm rescales the MLP's output (Gemma 3). Target |error| ≤ 2^-11.",
            f: gelu_tanh,
            lo: -gelu_fine_t,
            hi: gelu_fine_t,
            degree: 2,
            budget: 0.75 * 2f64.powi(-12),
            error: Error::Absolute,
            left: "Tail::Zero",
            right: "Tail::Identity",
        },
        Target {
            name: "SILU",
            doc: "SiLU: x·σ(x). Target |error| ≤ 2^-8.",
            f: silu,
            lo: -silu_t,
            hi: silu_t,
            degree: 2,
            budget: 0.75 * 2f64.powi(-8),
            error: Error::Absolute,
            left: "Tail::Zero",
            right: "Tail::Identity",
        },
        // Degree 1, as GELU_TANH_LINEAR: the gated product keeps 12 fraction
        // bits fewer, 1,536 wide in SmolLM2. Fitted to 2/3 of SILU's budget
        // (22 pieces instead of 17): at the same budget Qwen2.5-Coder's
        // first 8 HumanEval problems fell from 1,135 to 1,132 of 1,145
        // teacher-forced positions; at this one 1,134 (both with every pass
        // on degree 1).
        Target {
            name: "SILU_LINEAR",
            doc: "SiLU, pieces of degree 1 (decode passes). Target |error| ≤ 2^-8.",
            f: silu,
            lo: -silu_t,
            hi: silu_t,
            degree: 1,
            budget: 0.5 * 2f64.powi(-8),
            error: Error::Absolute,
            left: "Tail::Zero",
            right: "Tail::Identity",
        },
        // Degree 2: at degree 1 (22 pieces, the same target, in every pass)
        // SmolLM2's teacher-forced passage fell from 254 to 251 of 256.
        Target {
            name: "NEXP",
            doc: "nExp: e^-z for z ≥ 0, 0 from z = 12 on (e^-12 < 2^-17), saturating at 1 below 0. Target |error| ≤ 2^-10.",
            f: nexp,
            lo: 0.0,
            hi: 12.0,
            degree: 2,
            budget: 0.6 * 2f64.powi(-10),
            error: Error::Absolute,
            left: "Tail::Const(1.0)",
            right: "Tail::Zero",
        },
        // Degree 1 (output at f + 12), for decode passes only, as
        // GELU_TANH_LINEAR and SILU_LINEAR: the weighted values then drop 12
        // bits fewer. In every pass (the thirty-first session's trial) the
        // teacher-forced passage fell from 254 to 251 of 256.
        Target {
            name: "NEXP_LINEAR",
            doc: "nExp, pieces of degree 1 (decode passes). Target |error| ≤ 2^-10.",
            f: nexp,
            lo: 0.0,
            hi: 12.0,
            degree: 1,
            budget: 0.6 * 2f64.powi(-10),
            error: Error::Absolute,
            left: "Tail::Const(1.0)",
            right: "Tail::Zero",
        },
        Target {
            name: "RECIP",
            doc: "Reciprocal 1/s on [1, 1024): the softmax denominator, saturating outside. Target relative error ≤ 2^-7.",
            f: recip,
            lo: 1.0,
            hi: 1024.0,
            degree: 2,
            budget: 0.6 * 2f64.powi(-7),
            error: Error::Relative,
            left: "Tail::Const(1.0)",
            right: "Tail::Const(0.0009765625)",
        },
        Target {
            name: "RECIP_MANTISSA",
            doc: "1/m on [1, 2): the mantissa step of the reciprocal after range reduction. Target relative error ≤ 2^-7.",
            f: recip,
            lo: 1.0,
            hi: 2.0,
            degree: 2,
            budget: 0.5 * 2f64.powi(-7),
            error: Error::Relative,
            left: "Tail::Zero",
            right: "Tail::Zero",
        },
        Target {
            name: "RSQRT_MANTISSA",
            doc: "1/√m on [1, 4): the mantissa step of rsqrt after range reduction. Target relative error ≤ 2^-11.",
            f: rsqrt,
            lo: 1.0,
            hi: 4.0,
            degree: 2,
            budget: 0.5 * 2f64.powi(-11),
            error: Error::Relative,
            left: "Tail::Zero",
            right: "Tail::Zero",
        },
    ]
}

/// A fitted piece: `Σ_i coeffs[i]·(x − center)^i` on `[lo, hi)`.
struct Piece {
    lo: f64,
    hi: f64,
    center: f64,
    coeffs: Vec<f64>,
    error: f64,
}

/// Solves the `n × n` system `a·x = b` by Gaussian elimination with partial
/// pivoting.
fn solve(mut a: Vec<Vec<f64>>, mut b: Vec<f64>) -> Vec<f64> {
    let n = b.len();
    for col in 0..n {
        let pivot = (col..n)
            .max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))
            .unwrap_or(col);
        a.swap(col, pivot);
        b.swap(col, pivot);
        let (top, bottom) = a.split_at_mut(col + 1);
        let pivot_row = &top[col];
        for (i, row) in bottom.iter_mut().enumerate() {
            let f = row[col] / pivot_row[col];
            for (x, p) in row[col..].iter_mut().zip(&pivot_row[col..]) {
                *x -= f * p;
            }
            b[col + 1 + i] -= f * b[col];
        }
    }
    let mut x = vec![0.0; n];
    for row in (0..n).rev() {
        let s: f64 = b[row]
            - a[row][row + 1..]
                .iter()
                .zip(&x[row + 1..])
                .map(|(a, x)| a * x)
                .sum::<f64>();
        x[row] = s / a[row][row];
    }
    x
}

/// Near-minimax fit of `f` on `[lo, hi]` by Lawson's algorithm.
fn fit(t: &Target, lo: f64, hi: f64) -> Piece {
    let d = t.degree;
    let center = 0.5 * (lo + hi);
    let half = 0.5 * (hi - lo);
    let samples = 1025;
    let xs: Vec<f64> = (0..samples)
        .map(|i| lo + (hi - lo) * i as f64 / (samples - 1) as f64)
        .collect();
    let scale: Vec<f64> = xs
        .iter()
        .map(|&x| match t.error {
            Error::Absolute => 1.0,
            Error::Relative => 1.0 / (t.f)(x).abs(),
        })
        .collect();
    let mut w = vec![1.0; samples];
    let mut coeffs = vec![0.0; d + 1];
    for _ in 0..60 {
        let mut a = vec![vec![0.0; d + 1]; d + 1];
        let mut b = vec![0.0; d + 1];
        for (i, &x) in xs.iter().enumerate() {
            let u = (x - center) / half;
            let ww = w[i] * scale[i] * scale[i];
            let pows: Vec<f64> = (0..=d).map(|p| u.powi(p as i32)).collect();
            for r in 0..=d {
                for c in 0..=d {
                    a[r][c] += ww * pows[r] * pows[c];
                }
                b[r] += ww * pows[r] * (t.f)(x);
            }
        }
        coeffs = solve(a, b);
        let errs: Vec<f64> = xs
            .iter()
            .enumerate()
            .map(|(i, &x)| (eval_local(&coeffs, (x - center) / half) - (t.f)(x)).abs() * scale[i])
            .collect();
        let total: f64 = errs.iter().zip(&w).map(|(e, w)| e * w).sum();
        if total == 0.0 {
            break;
        }
        for (wi, e) in w.iter_mut().zip(&errs) {
            *wi *= e / total * samples as f64 + 1e-12;
        }
    }
    // Back to the x − center basis.
    let coeffs: Vec<f64> = coeffs
        .iter()
        .enumerate()
        .map(|(i, c)| c / half.powi(i as i32))
        .collect();
    let error = xs
        .iter()
        .enumerate()
        .map(|(i, &x)| (eval_local(&coeffs, x - center) - (t.f)(x)).abs() * scale[i])
        .fold(0.0, f64::max);
    Piece {
        lo,
        hi,
        center,
        coeffs,
        error,
    }
}

fn eval_local(c: &[f64], u: f64) -> f64 {
    c.iter().rev().fold(0.0, |acc, &ci| acc * u + ci)
}

/// The knot grid step at `x`.
fn step_at(t: &Target, x: f64) -> f64 {
    match t.error {
        Error::Absolute => 2f64.powi(-KNOT_BITS),
        // Relative fits stretch with the octave: 2^(⌊log2 x⌋ − KNOT_BITS).
        Error::Relative => 2f64.powi(x.log2().floor() as i32 - KNOT_BITS),
    }
}

/// Greedy knots: each piece as long as its error stays within budget.
fn pieces(t: &Target) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut lo = t.lo;
    while lo < t.hi {
        let mut best = None;
        let mut hi = lo + step_at(t, lo);
        loop {
            let hi_c = hi.min(t.hi);
            let p = fit(t, lo, hi_c);
            if p.error > t.budget {
                break;
            }
            best = Some(p);
            if hi_c >= t.hi {
                break;
            }
            hi += step_at(t, hi);
        }
        let p = best.unwrap_or_else(|| fit(t, lo, lo + step_at(t, lo)));
        lo = p.hi;
        out.push(p);
    }
    out
}

fn render(all: &[(&Target, Vec<Piece>)]) -> String {
    let mut s = String::new();
    s.push_str(
        "//! Spline approximations fitted by `cargo xtask fit` (xtask/src/fit.rs).\n\
         //! Generated: do not edit by hand; change the fitter and rerun it.\n\n\
         use super::spline::{Spline, SplinePiece, Tail};\n",
    );
    for (t, ps) in all {
        let worst = ps.iter().map(|p| p.error).fold(0.0, f64::max);
        let _ = writeln!(s, "\n/// {}", t.doc);
        let _ = writeln!(
            s,
            "/// {} pieces of degree {} on [{}, {}); fitted error {:.3e} ({}).",
            ps.len(),
            t.degree,
            t.lo,
            t.hi,
            worst,
            match t.error {
                Error::Absolute => "absolute",
                Error::Relative => "relative",
            }
        );
        let _ = writeln!(s, "pub const {}: Spline = Spline {{", t.name);
        let _ = writeln!(s, "    degree: {},", t.degree);
        let _ = writeln!(s, "    left: {},", t.left);
        let _ = writeln!(s, "    right: {},", t.right);
        let _ = writeln!(s, "    pieces: &[");
        for p in ps {
            let mut c = [0.0f64; 4];
            c[..p.coeffs.len()].copy_from_slice(&p.coeffs);
            let _ = writeln!(
                s,
                "        SplinePiece {{ lo: {:?}, hi: {:?}, center: {:?}, coeffs: [{:?}, {:?}, {:?}, {:?}] }},",
                p.lo, p.hi, p.center, c[0], c[1], c[2], c[3]
            );
        }
        let _ = writeln!(s, "    ],\n}};");
    }
    s
}

/// Fits every target and writes the table.
pub fn run() -> Result<()> {
    let targets = targets();
    let mut all = Vec::new();
    for t in &targets {
        let ps = pieces(t);
        let worst = ps.iter().map(|p| p.error).fold(0.0, f64::max);
        println!(
            "{:<16} [{:>8.4}, {:>8.4})  degree {}  {:>3} pieces  fitted error {:.3e} (budget {:.3e})",
            t.name,
            t.lo,
            t.hi,
            t.degree,
            ps.len(),
            worst,
            t.budget
        );
        all.push((t, ps));
    }
    let path = Path::new("core/src/gate/splines.rs");
    std::fs::write(path, render(&all)).with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}
