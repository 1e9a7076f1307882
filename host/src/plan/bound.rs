//! Proven bounds on tensor values: the range analysis behind every gate's
//! effective width (DESIGN.md §3, "Effective widths").
//!
//! A [`Bound`] holds, in real units (the fixed-point value divided by
//! 2^scale), an upper bound on `|x[r, c]|` for every column c, and an upper
//! bound on the Euclidean norm of each contiguous group of columns of a row
//! (one group per attention head, or the whole row). Both hold for every row
//! and every input the client can send, because they are derived from the
//! public weights alone:
//!
//! * a LayerNorm output has `Σ nᵢ² ≤ d`, so `|γᵢnᵢ + βᵢ| ≤ |γᵢ|√(d−1) + |βᵢ|`
//!   and the row norm is at most `max|γ|·√d + ‖β‖`;
//! * a linear layer's column j is at most `min(Σᵢ|Wᵢⱼ|·|xᵢ|, ‖W·ⱼ‖·‖x‖) + |bⱼ|`
//!   (the second by Cauchy–Schwarz), and a group of columns has norm at most
//!   `‖W_G‖_F·‖x‖ + ‖b_G‖`;
//! * attention scores are at most `‖q‖·‖k‖`, and attention outputs are
//!   convex combinations of value rows (up to the reciprocal's error).
//!
//! Fixed-point products are exact, so bounds computed with the *encoded*
//! weights are exact bounds on the computed values; truncations add one unit
//! in the last place. The norm bounds are what keep the widths small: the
//! plain interval bound of a query column after LayerNorm is about √d times
//! larger.

use rayon::prelude::*;

/// A weight matrix (`[inputs × outputs]`, row-major) as the bounds read
/// it: entries as reals, a range of them at a time.
pub trait Reals: Sync {
    /// Entries `at`, in order.
    fn reals(&self, at: std::ops::Range<usize>) -> impl Iterator<Item = f64> + '_;
}

impl Reals for [f64] {
    fn reals(&self, at: std::ops::Range<usize>) -> impl Iterator<Item = f64> + '_ {
        self[at].iter().copied()
    }
}

impl Reals for Vec<f64> {
    fn reals(&self, at: std::ops::Range<usize>) -> impl Iterator<Item = f64> + '_ {
        self[at].iter().copied()
    }
}

/// Fixed-point words at `frac` fraction bits, read as the reals they
/// encode ([`crate::fixed::decode`]) where the bound reads them, so that no
/// layer is held twice: Qwen2.5-Coder-0.5B's vocabulary head as reals was
/// 1.09 GB beside its 1.09 GB of words.
#[derive(Clone, Copy, Debug)]
pub struct Words<'a> {
    /// The encoded entries.
    pub words: &'a [u64],
    /// Their fraction bits.
    pub frac: u32,
}

impl Reals for Words<'_> {
    fn reals(&self, at: std::ops::Range<usize>) -> impl Iterator<Item = f64> + '_ {
        // `decode` divides by 2^frac; the product by 2^-frac is the same
        // real, both exact (a power of two only moves the exponent), and a
        // bound reads each word several times.
        let ulp = 1.0 / crate::fixed::pow2(self.frac);
        self.words[at]
            .iter()
            .map(move |v| crate::fixed::signed(*v) as f64 * ulp)
    }
}

/// Upper bounds on a tensor's values, in real units.
#[derive(Clone, Debug, PartialEq)]
pub struct Bound {
    /// Per column: an upper bound on `|x[r, c]|` over all rows.
    pub abs: Vec<f64>,
    /// Columns per norm group (divides the column count).
    pub group: usize,
    /// Per group: an upper bound on the Euclidean norm of that group of
    /// columns, over all rows.
    pub l2: Vec<f64>,
}

impl Bound {
    /// The same bound on every column; the norm bound follows from it.
    pub fn uniform(cols: usize, abs: f64) -> Bound {
        Bound::from_abs(vec![abs; cols], cols.max(1))
    }

    /// Per-column bounds; group norms follow from them.
    pub fn from_abs(abs: Vec<f64>, group: usize) -> Bound {
        let group = group.max(1);
        let l2 = abs
            .chunks(group)
            .map(|g| g.iter().map(|a| a * a).sum::<f64>().sqrt())
            .collect();
        Bound { abs, group, l2 }
    }

    /// Columns.
    pub fn cols(&self) -> usize {
        self.abs.len()
    }

    /// The largest column bound.
    pub fn max_abs(&self) -> f64 {
        self.abs.iter().fold(0.0, |m, a| m.max(*a))
    }

    /// Norm bound of group `g`, the tighter of the stored bound and the one
    /// the column bounds imply.
    pub fn group_l2(&self, g: usize) -> f64 {
        let cols = &self.abs[g * self.group..((g + 1) * self.group).min(self.abs.len())];
        let implied = cols.iter().map(|a| a * a).sum::<f64>().sqrt();
        self.l2
            .get(g)
            .copied()
            .unwrap_or(f64::INFINITY)
            .min(implied)
    }

    /// Norm bound of a whole row.
    pub fn row_l2(&self) -> f64 {
        let groups = self.abs.len().div_ceil(self.group);
        let from_groups = (0..groups)
            .map(|g| {
                let l = self.group_l2(g);
                l * l
            })
            .sum::<f64>()
            .sqrt();
        let implied = self.abs.iter().map(|a| a * a).sum::<f64>().sqrt();
        from_groups.min(implied)
    }

    /// The largest group norm.
    pub fn max_group_l2(&self) -> f64 {
        let groups = self.abs.len().div_ceil(self.group);
        (0..groups).map(|g| self.group_l2(g)).fold(0.0, f64::max)
    }

    /// Regroups the norm bounds into groups of `group` columns (group norms
    /// of a finer partition combine by root-sum-square; a coarser group
    /// than stored falls back to the column bounds).
    pub fn regroup(&self, group: usize) -> Bound {
        if group == self.group {
            return self.clone();
        }
        if group.is_multiple_of(self.group) {
            let per = group / self.group;
            let groups = self.abs.len().div_ceil(self.group);
            let mut l2 = Vec::new();
            for start in (0..groups).step_by(per) {
                let s: f64 = (start..(start + per).min(groups))
                    .map(|g| {
                        let l = self.group_l2(g);
                        l * l
                    })
                    .sum();
                l2.push(s.sqrt());
            }
            let mut b = Bound::from_abs(self.abs.clone(), group);
            for (dst, src) in b.l2.iter_mut().zip(l2) {
                *dst = dst.min(src);
            }
            return b;
        }
        Bound::from_abs(self.abs.clone(), group)
    }

    /// After flooring to `ulp` (a truncation): every value may drop by less
    /// than one unit.
    pub fn floor_to(&self, ulp: f64) -> Bound {
        let abs = self.abs.iter().map(|a| a + ulp).collect();
        let root = (self.group as f64).sqrt();
        let l2 = (0..self.l2.len())
            .map(|g| self.group_l2(g) + root * ulp)
            .collect();
        Bound {
            abs,
            group: self.group,
            l2,
        }
    }

    /// The tighter of two bounds on the same tensor (column by column and
    /// group by group; groups follow `self`).
    pub fn min(&self, other: &Bound) -> Bound {
        let abs = self
            .abs
            .iter()
            .zip(&other.abs)
            .map(|(a, b)| a.min(*b))
            .collect();
        let o = other.regroup(self.group);
        let l2 = (0..self.l2.len())
            .map(|g| self.group_l2(g).min(o.group_l2(g)))
            .collect();
        Bound {
            abs,
            group: self.group,
            l2,
        }
    }

    /// Elementwise sum of two tensors of the same shape.
    pub fn add(&self, other: &Bound) -> Bound {
        let abs = self
            .abs
            .iter()
            .zip(&other.abs)
            .map(|(a, b)| a + b)
            .collect();
        let o = other.regroup(self.group);
        let l2 = (0..self.l2.len())
            .map(|g| self.group_l2(g) + o.group_l2(g))
            .collect();
        Bound {
            abs,
            group: self.group,
            l2,
        }
    }

    /// Every value and norm scaled by `s ≥ 0`, plus `plus` per value.
    pub fn scale(&self, s: f64, plus: f64) -> Bound {
        let abs = self.abs.iter().map(|a| a * s + plus).collect();
        let root = (self.group as f64).sqrt();
        let l2 = (0..self.l2.len())
            .map(|g| self.group_l2(g) * s + root * plus)
            .collect();
        Bound {
            abs,
            group: self.group,
            l2,
        }
    }
}

/// Bound of `x·W + b` for a weight matrix `w` (`[inputs × outputs]`, real
/// values), with norm groups of `group` output columns.
pub fn linear<W: Reals + ?Sized>(
    x: &Bound,
    w: &W,
    b: &[f64],
    outputs: usize,
    group: usize,
) -> Bound {
    let inputs = x.cols();
    let row = x.row_l2();
    let mut by_abs = vec![0.0f64; outputs];
    let mut col_sq = vec![0.0f64; outputs];
    for i in 0..inputs {
        let xi = x.abs[i];
        for (j, wij) in w.reals(i * outputs..(i + 1) * outputs).enumerate() {
            by_abs[j] += wij.abs() * xi;
            col_sq[j] += wij * wij;
        }
    }
    let abs: Vec<f64> = (0..outputs)
        .map(|j| by_abs[j].min(col_sq[j].sqrt() * row) + b[j].abs())
        .collect();
    let mut out = Bound::from_abs(abs, group);
    for (g, l) in out.l2.iter_mut().enumerate() {
        let cols = g * group..((g + 1) * group).min(outputs);
        let frob = cols.clone().map(|j| col_sq[j]).sum::<f64>().sqrt();
        let bias = cols.map(|j| b[j] * b[j]).sum::<f64>().sqrt();
        *l = l.min(frob * row + bias);
    }
    out
}

/// A LayerNorm output, row by row `x = z ⊙ g + β − δ` with `‖z‖ ≤ ζ` and
/// `|δᵢ| ≤ δ`. Keeping this form (rather than per-column bounds) lets a
/// following linear layer be bounded through `diag(g)·W` by Cauchy–Schwarz,
/// which is what makes attention-score bounds tight enough to matter.
#[derive(Clone, Debug, PartialEq)]
pub struct NormForm {
    /// Per-column gain g (real).
    pub gain: Vec<f64>,
    /// Per-column shift β (real).
    pub shift: Vec<f64>,
    /// Bound ζ on ‖z‖.
    pub zeta: f64,
    /// Bound on each |δᵢ| (rounding).
    pub delta: f64,
}

impl NormForm {
    /// The per-column and row-norm bound it implies.
    pub fn bound(&self) -> Bound {
        let abs: Vec<f64> = self
            .gain
            .iter()
            .zip(&self.shift)
            .map(|(g, s)| g.abs() * self.zeta + s.abs() + self.delta)
            .collect();
        let d = abs.len();
        let gmax = self.gain.iter().fold(0.0f64, |m, g| m.max(g.abs()));
        let shift = self.shift.iter().map(|s| s * s).sum::<f64>().sqrt();
        let mut b = Bound::from_abs(abs, d.max(1));
        b.l2[0] = b.l2[0].min(gmax * self.zeta + shift + (d as f64).sqrt() * self.delta);
        b
    }

    /// Columns `cols` of `x·W + b` as `z·A + c − δ·W`: returns `A = diag(g)·W_cols`
    /// (`[d × |cols|]`), `c = β·W_cols + b_cols`, and a bound on `‖δ·W_cols‖`.
    pub fn project<W: Reals + ?Sized>(
        &self,
        w: &W,
        b: &[f64],
        outputs: usize,
        cols: std::ops::Range<usize>,
    ) -> (Vec<f64>, Vec<f64>, f64) {
        let d = self.gain.len();
        let m = cols.len();
        let mut a = vec![0.0f64; d * m];
        let mut c: Vec<f64> = cols.clone().map(|j| b[j]).collect();
        let mut frob = 0.0f64;
        for i in 0..d {
            let row = w.reals(i * outputs + cols.start..i * outputs + cols.end);
            for (k, wij) in row.enumerate() {
                a[i * m + k] = self.gain[i] * wij;
                c[k] += self.shift[i] * wij;
                frob += wij * wij;
            }
        }
        let err = self.delta * (d as f64).sqrt() * frob.sqrt();
        (a, c, err)
    }

    /// [`NormForm::project`] with A's Frobenius norm in place of A: the
    /// same sums in the same order, so the same numbers for any non-empty
    /// `cols` (an empty one gives +0 where the iterator sum gives −0),
    /// without holding A.
    pub fn project_frobenius<W: Reals + ?Sized>(
        &self,
        w: &W,
        b: &[f64],
        outputs: usize,
        cols: std::ops::Range<usize>,
    ) -> (f64, Vec<f64>, f64) {
        let d = self.gain.len();
        let mut c: Vec<f64> = cols.clone().map(|j| b[j]).collect();
        let mut frob = 0.0f64;
        let mut a_sq = 0.0f64;
        for i in 0..d {
            let row = w.reals(i * outputs + cols.start..i * outputs + cols.end);
            for (k, wij) in row.enumerate() {
                let a = self.gain[i] * wij;
                a_sq += a * a;
                c[k] += self.shift[i] * wij;
                frob += wij * wij;
            }
        }
        let err = self.delta * (d as f64).sqrt() * frob.sqrt();
        (a_sq.sqrt(), c, err)
    }
}

/// Bound of `x·W + b` for a LayerNorm-form input: column j is at most
/// `ζ·‖diag(g)·W·ⱼ‖ + |(β·W + b)ⱼ| + δ·Σᵢ|Wᵢⱼ|`; a group of columns has norm
/// at most `σ(diag(g)·W_G)·ζ + ‖(β·W + b)_G‖ + ‖δ·W_G‖`.
pub fn linear_from_norm<W: Reals + ?Sized>(
    x: &NormForm,
    w: &W,
    b: &[f64],
    outputs: usize,
    group: usize,
) -> Bound {
    let d = x.gain.len();
    let mut sq = vec![0.0f64; outputs];
    let mut shift: Vec<f64> = b.to_vec();
    let mut l1 = vec![0.0f64; outputs];
    for i in 0..d {
        let row = w.reals(i * outputs..(i + 1) * outputs);
        let g = x.gain[i];
        for (j, wij) in row.enumerate() {
            let a = g * wij;
            sq[j] += a * a;
            shift[j] += x.shift[i] * wij;
            l1[j] += wij.abs();
        }
    }
    let abs: Vec<f64> = (0..outputs)
        .map(|j| x.zeta * sq[j].sqrt() + shift[j].abs() + x.delta * l1[j])
        .collect();
    let mut out = Bound::from_abs(abs, group);
    // Groups are independent: one a thread, each the same number.
    out.l2.par_iter_mut().enumerate().for_each(|(gi, l)| {
        let cols = gi * group..((gi + 1) * group).min(outputs);
        let (sigma, c, err) = if cols.len() > SPECTRAL_COLS {
            // `spectral_norm` would take A's Frobenius norm: summed in the
            // same order without A (a whole row of a vocabulary head is
            // d × 49,152 reals, 226 MB for SmolLM2, zeroed page by page).
            x.project_frobenius(w, b, outputs, cols.clone())
        } else {
            let (a, c, err) = x.project(w, b, outputs, cols.clone());
            (spectral_norm(&a, d, cols.len()), c, err)
        };
        let cn = c.iter().map(|v| v * v).sum::<f64>().sqrt();
        *l = l.min(sigma * x.zeta + cn + err);
    });
    out
}

/// The widest matrix [`spectral_norm`] bounds through its Gram matrix;
/// wider ones get their Frobenius norm.
const SPECTRAL_COLS: usize = 128;

/// An upper bound on the spectral norm of `a` (`[rows × cols]`): the square
/// root of an upper bound on the largest eigenvalue of its Gram matrix. For
/// wide matrices the Frobenius norm is used (computing the Gram matrix would
/// cost more than the planner should).
pub fn spectral_norm(a: &[f64], rows: usize, cols: usize) -> f64 {
    let frob = a.iter().map(|v| v * v).sum::<f64>().sqrt();
    if cols > SPECTRAL_COLS || cols == 0 {
        return frob;
    }
    let g = gram(a, rows, cols);
    spectral_radius(&g, cols).sqrt().min(frob)
}

/// `aᵀa` for `a` of `[rows × cols]`. The upper triangle is summed and
/// mirrored: entry (j, i) would add the same products `a_ri·a_rj` in the
/// same row order, so only the signs of zero sums can differ from the
/// full square (a skipped zero row entry adds nothing either way).
pub fn gram(a: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut g = vec![0.0f64; cols * cols];
    for r in 0..rows {
        let row = &a[r * cols..(r + 1) * cols];
        for i in 0..cols {
            let ri = row[i];
            if ri == 0.0 {
                continue;
            }
            let upper = &mut g[i * cols + i..(i + 1) * cols];
            for (gij, rj) in upper.iter_mut().zip(&row[i..]) {
                *gij += ri * rj;
            }
        }
    }
    for i in 0..cols {
        for j in 0..i {
            g[i * cols + j] = g[j * cols + i];
        }
    }
    g
}

/// `a·b` for square `n × n` matrices.
pub fn square_product(a: &[f64], b: &[f64], n: usize) -> Vec<f64> {
    let mut c = vec![0.0f64; n * n];
    for i in 0..n {
        for k in 0..n {
            let aik = a[i * n + k];
            for j in 0..n {
                c[i * n + j] += aik * b[k * n + j];
            }
        }
    }
    c
}

/// An upper bound on the spectral radius of a square matrix:
/// `ρ(K) ≤ ‖K^p‖_F^(1/p)` for every p, here p = 2^8 by repeated squaring
/// (normalized at each step). For a matrix similar to a positive
/// semidefinite one the bound exceeds ρ by at most a factor
/// `(κ·√n)^(1/p)`; a relative margin covers floating-point rounding.
pub fn spectral_radius(k: &[f64], n: usize) -> f64 {
    let norm = |m: &[f64]| m.iter().map(|v| v * v).sum::<f64>().sqrt();
    let f = norm(k);
    if f == 0.0 || !f.is_finite() {
        return f;
    }
    let mut m: Vec<f64> = k.iter().map(|v| v / f).collect();
    let mut log = f.ln();
    let mut p = 1.0f64;
    for _ in 0..8 {
        let sq = square_product(&m, &m, n);
        let s = norm(&sq);
        if s == 0.0 {
            // Nilpotent part: the radius is bounded by what we have.
            break;
        }
        log = 2.0 * log + s.ln();
        p *= 2.0;
        m = sq.iter().map(|v| v / s).collect();
    }
    (log / p).exp() * (1.0 + 1e-9)
}

/// The width k (sign bit included) that holds every integer of magnitude
/// up to `bound·2^scale`, with the planner's margin: values of the bound
/// itself stay a factor [`MARGIN`] below 2^(k−1).
pub fn width(bound: f64, scale: u32) -> u32 {
    let limit = (bound * MARGIN * crate::fixed::pow2(scale)).ceil() + 2.0;
    // Smallest k with limit < 2^(k−1).
    let mut k = 2u32;
    while crate::fixed::pow2(k - 1) <= limit && k < 128 {
        k += 1;
    }
    k
}

/// The planner's safety factor on every proven bound (documented in
/// docs/PLAN.md): it absorbs floating-point error in the bound arithmetic
/// itself and the client's f32 embedding LayerNorm.
pub const MARGIN: f64 = 1.0625;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_takes_the_tighter_of_interval_and_norm_bounds() {
        // 4 inputs each |x| ≤ 1 with ‖x‖ ≤ 1 (a unit vector), W all ones.
        let mut x = Bound::uniform(4, 1.0);
        x.l2 = vec![1.0];
        let w = vec![1.0; 4 * 2];
        let b = vec![0.5, -0.5];
        let y = linear(&x, &w, &b, 2, 1);
        // Interval: 4; Cauchy–Schwarz: ‖(1,1,1,1)‖·1 = 2.
        assert_eq!(y.abs, vec![2.5, 2.5]);
        assert!((y.group_l2(0) - 2.5).abs() < 1e-12);
        assert!((y.group_l2(1) - 2.5).abs() < 1e-12);
    }

    #[test]
    fn width_leaves_the_margin() {
        // limit = ⌈1.0625⌉ + 2 = 4 < 2^(k−1) first holds at k = 4.
        assert_eq!(width(1.0, 0), 4);
        assert!(crate::fixed::pow2(width(100.0, 12) - 1) > 100.0 * 4096.0 * MARGIN);
    }

    #[test]
    fn spectral_bounds_are_upper_bounds_and_tight() {
        // diag(3, 1): radius 3.
        let r = spectral_radius(&[3.0, 0.0, 0.0, 1.0], 2);
        assert!((3.0..3.0 * 1.01).contains(&r), "{r}");
        // A rank-one matrix u·vᵀ has spectral norm ‖u‖·‖v‖.
        let (u, v) = ([1.0, 2.0, 2.0], [3.0, 4.0]);
        let a: Vec<f64> = u
            .iter()
            .flat_map(|x| v.iter().map(move |y| x * y))
            .collect();
        let s = spectral_norm(&a, 3, 2);
        assert!((15.0..15.0 * 1.01).contains(&s), "{s}");
        // A product of two PSD matrices (not symmetric).
        let c = [2.0, 1.0, 1.0, 2.0];
        let d = [1.0, 0.0, 0.0, 4.0];
        let k = square_product(&c, &d, 2);
        // Eigenvalues of c·d: roots of λ² − 10λ + 12 → 5 + √13.
        let want = 5.0 + 13f64.sqrt();
        let r = spectral_radius(&k, 2);
        assert!(r >= want && r < want * 1.02, "{r} vs {want}");
    }

    #[test]
    fn the_mirrored_gram_matrix_equals_the_full_square() {
        // The full square, as `gram` summed it before it took the triangle.
        let full = |a: &[f64], rows: usize, cols: usize| {
            let mut g = vec![0.0f64; cols * cols];
            for r in 0..rows {
                let row = &a[r * cols..(r + 1) * cols];
                for i in 0..cols {
                    for j in 0..cols {
                        g[i * cols + j] += row[i] * row[j];
                    }
                }
            }
            g
        };
        for (rows, cols) in [(1, 1), (7, 5), (64, 33), (3, 128)] {
            // Every fifth entry zero, so that the skipped entries count.
            let a: Vec<f64> = (0..rows * cols)
                .map(|i| match i % 5 {
                    0 => 0.0,
                    _ => (((i * 7919) % 2003) as f64 - 1001.0) / 97.0,
                })
                .collect();
            let (got, want) = (gram(&a, rows, cols), full(&a, rows, cols));
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                // Equal as reals: only a zero's sign may differ.
                assert!(g == w, "{rows}×{cols} at {i}: {g} vs {w}");
            }
        }
    }

    #[test]
    fn the_streamed_projection_equals_the_materialized_one_bit_for_bit() {
        let d = 7;
        let outputs = 300;
        let val =
            |i: usize, salt: usize| (((i * 7919 + salt * 104_729) % 2003) as f64 - 1001.0) / 97.0;
        let nf = NormForm {
            gain: (0..d).map(|i| val(i, 1)).collect(),
            shift: (0..d).map(|i| val(i, 2)).collect(),
            zeta: 3.0,
            delta: 1e-3,
        };
        let w: Vec<f64> = (0..d * outputs).map(|i| val(i, 3)).collect();
        let b: Vec<f64> = (0..outputs).map(|i| val(i, 4)).collect();
        for cols in [0..outputs, 5..200, 17..18] {
            let (a, c, err) = nf.project(&w, &b, outputs, cols.clone());
            let (frob, c2, err2) = nf.project_frobenius(&w, &b, outputs, cols.clone());
            let want = a.iter().map(|v| v * v).sum::<f64>().sqrt();
            assert_eq!(frob.to_bits(), want.to_bits(), "{cols:?}");
            assert_eq!(c, c2);
            assert_eq!(err.to_bits(), err2.to_bits());
        }
    }

    #[test]
    fn a_norm_form_bounds_every_sample() {
        // x = z⊙g + β with ‖z‖ ≤ 1; W random: every sampled output stays
        // inside the bound.
        let d = 6;
        let nf = NormForm {
            gain: vec![1.5, -0.5, 2.0, 0.1, 1.0, -3.0],
            shift: vec![0.1, 0.2, -0.3, 0.0, 0.5, -0.1],
            zeta: 1.0,
            delta: 0.0,
        };
        let outputs = 4;
        let w: Vec<f64> = (0..d * outputs)
            .map(|i| ((i * 7 % 11) as f64 - 5.0) / 4.0)
            .collect();
        let b = vec![0.5, -1.0, 0.0, 2.0];
        let bound = linear_from_norm(&nf, &w, &b, outputs, 2);
        let samples = crate::plan::testing::uniform(2000 * d, 0.5, 1);
        for sample in samples.chunks(d) {
            let mut z = sample.to_vec();
            let n = z.iter().map(|v| v * v).sum::<f64>().sqrt();
            z.iter_mut().for_each(|v| *v /= n);
            let x: Vec<f64> = (0..d).map(|i| z[i] * nf.gain[i] + nf.shift[i]).collect();
            let y: Vec<f64> = (0..outputs)
                .map(|j| (0..d).map(|i| x[i] * w[i * outputs + j]).sum::<f64>() + b[j])
                .collect();
            for (j, v) in y.iter().enumerate() {
                assert!(v.abs() <= bound.abs[j] + 1e-12);
            }
            for g in 0..2 {
                let l = (y[2 * g].powi(2) + y[2 * g + 1].powi(2)).sqrt();
                assert!(l <= bound.group_l2(g) + 1e-12);
            }
        }
    }

    #[test]
    fn regroup_combines_finer_groups() {
        let mut b = Bound::uniform(4, 10.0);
        b = b.regroup(1);
        for l in &mut b.l2 {
            *l = 1.0;
        }
        let c = b.regroup(2);
        assert!((c.group_l2(0) - 2f64.sqrt()).abs() < 1e-12);
        assert!((c.row_l2() - 2.0).abs() < 1e-12);
    }

    /// Bounds read from the words equal those read from the decoded reals,
    /// bit for bit, and each word reads as `decode` gives it.
    #[test]
    fn words_bound_as_their_decoded_reals() {
        let (d, outputs) = (9, 140);
        let mix = |i: usize| (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut words: Vec<u64> = (0..d * outputs)
            .map(|i| (mix(i) as i64 >> 40) as u64)
            .collect();
        words[..5].copy_from_slice(&[0, 1, u64::MAX, 1 << 63, u64::MAX >> 1]);
        for frac in [0, 12, 24, 60] {
            let w = Words {
                words: &words,
                frac,
            };
            let reals: Vec<f64> = (words.iter())
                .map(|v| crate::fixed::decode(*v, frac))
                .collect();
            let bits = |v: Vec<f64>| v.into_iter().map(f64::to_bits).collect::<Vec<_>>();
            assert_eq!(bits(w.reals(0..words.len()).collect()), bits(reals.clone()));
            let b: Vec<f64> = (0..outputs).map(|j| j as f64 / 7.0 - 9.0).collect();
            let mut x = Bound::uniform(d, 1.5);
            x.l2 = vec![2.0];
            assert_eq!(
                linear(&x, &w, &b, outputs, 20),
                linear(&x, &reals, &b, outputs, 20)
            );
            let nf = NormForm {
                gain: (0..d).map(|i| 0.5 + i as f64).collect(),
                shift: (0..d).map(|i| i as f64 - 4.0).collect(),
                zeta: 3.0,
                delta: 1e-3,
            };
            // Groups of 20 take the spectral path, of 140 the Frobenius.
            for group in [20, 140] {
                assert_eq!(
                    linear_from_norm(&nf, &w, &b, outputs, group),
                    linear_from_norm(&nf, &reals, &b, outputs, group)
                );
            }
        }
    }
}
