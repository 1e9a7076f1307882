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
pub fn linear(x: &Bound, w: &[f64], b: &[f64], outputs: usize, group: usize) -> Bound {
    let inputs = x.cols();
    let row = x.row_l2();
    let mut by_abs = vec![0.0f64; outputs];
    let mut col_sq = vec![0.0f64; outputs];
    for i in 0..inputs {
        let xi = x.abs[i];
        for (j, wij) in w[i * outputs..(i + 1) * outputs].iter().enumerate() {
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
}
