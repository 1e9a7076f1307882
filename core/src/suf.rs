//! Structured univariate functions (SUFs): the IR every non-linear gate is
//! written in (seeds/000 §2, seeds/001 Definition 4.1).
//!
//! A SUF over the ring Z_2^n maps one input x to `r` ring outputs and `ℓ`
//! bits. Its domain is split into `m` intervals `I_i = [α_i, α_{i+1})`;
//! on each interval every ring output is a polynomial of degree ≤ d in x and
//! every bit output is a Boolean program over primitive predicates:
//!
//! * `C_β(x) = [x < β]` in the SUF's order (signed or unsigned),
//! * `D_{γ,f}(x) = [(x mod 2^f) < γ]`,
//! * `MSB(x)` and `MSB(x + c)`,
//!
//! combined with ¬ ∧ ∨ ⊕ and constants.
//!
//! Boundaries are `i128`, so the sentinels `2^n` (unsigned) and `±2^(n−1)`
//! (signed) are exact, never a wrapped 0. A `Suf` is plain fixed-capacity
//! data: it can be a `const`, copied, and checked with [`Suf::validate`].
//! [`Suf::eval`] is the cleartext reference, the ideal functionality every
//! compiled gate must match bit for bit.
//!
//! # Effective width
//!
//! A gate runs a SUF at an effective width k ≤ n: it assumes the input
//! satisfies |x| < 2^(k−1) (signed) or x < 2^k (unsigned) and evaluates
//! every predicate on the k-bit view of x. [`Suf::eval_at`] defines what
//! happens outside that range: intervals and predicates are decided on
//! the k-bit view (sign-extended for signed SUFs), and the polynomials are
//! evaluated on the full n-bit x. Inside the range this is exactly
//! [`Suf::eval`].

use crate::error::SufError;
use crate::ring::{Width, cast};

/// Most intervals a SUF can have.
pub const MAX_INTERVALS: usize = 48;
/// Highest polynomial degree.
pub const MAX_DEGREE: usize = 3;
/// Most ring outputs.
pub const MAX_ARITH: usize = 2;
/// Most bit outputs.
pub const MAX_BOOL: usize = 4;
/// Most distinct primitive predicates.
pub const MAX_PREDS: usize = 8;
/// Most distinct Boolean programs.
pub const MAX_PROGRAMS: usize = 4;
/// Most operations in one Boolean program.
pub const MAX_OPS: usize = 16;

/// How a SUF reads its input word.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Domain {
    /// Canonical representatives `[0, 2^n)`.
    Unsigned,
    /// Two's complement `[−2^(n−1), 2^(n−1))`.
    Signed,
}

impl Domain {
    /// The smallest value of a `bits`-bit domain.
    pub const fn min(self, bits: u32) -> i128 {
        match self {
            Domain::Unsigned => 0,
            Domain::Signed => -(1i128 << (bits - 1)),
        }
    }

    /// The exclusive end of a `bits`-bit domain: the sentinel boundary.
    pub const fn end(self, bits: u32) -> i128 {
        match self {
            Domain::Unsigned => 1i128 << bits,
            Domain::Signed => 1i128 << (bits - 1),
        }
    }

    /// The value of the canonical `w`-bit word `x` in this domain.
    pub const fn value(self, w: Width, x: u64) -> i128 {
        match self {
            Domain::Unsigned => cast::i128_from_u64(x & w.mask()),
            Domain::Signed => cast::i128_from_i64(w.to_signed(x & w.mask())),
        }
    }
}

/// A primitive predicate of the input x.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pred {
    /// `C_β(x) = [x < β]`, β in the SUF's domain including the sentinels.
    Lt(i128),
    /// `D_{γ,f}(x) = [(x mod 2^f) < γ]` with `1 ≤ f ≤ n`, `0 ≤ γ ≤ 2^f`.
    LowLt {
        /// f: the number of low bits.
        bits: u32,
        /// γ: the threshold.
        gamma: u128,
    },
    /// `MSB(x)`: the sign bit at the evaluation width.
    Msb,
    /// `MSB(x + c)` at the evaluation width.
    MsbPlus(u64),
}

/// One operation of a postfix Boolean program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// Push predicate `i` of the SUF's predicate table.
    Pred(u8),
    /// Push a constant.
    Const(bool),
    /// Pop a, push ¬a.
    Not,
    /// Pop b, a; push a ∧ b.
    And,
    /// Pop b, a; push a ∨ b.
    Or,
    /// Pop b, a; push a ⊕ b.
    Xor,
}

/// A postfix Boolean program over the SUF's predicates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Program {
    /// The operations; only the first `len` are used.
    pub ops: [Op; MAX_OPS],
    /// How many operations the program has.
    pub len: usize,
}

impl Program {
    /// The program that pushes the constant `b`.
    pub const fn constant(b: bool) -> Program {
        let mut ops = [Op::Const(false); MAX_OPS];
        ops[0] = Op::Const(b);
        Program { ops, len: 1 }
    }

    /// A program from a slice of operations (at most [`MAX_OPS`]).
    pub const fn from_ops(src: &[Op]) -> Program {
        let mut ops = [Op::Const(false); MAX_OPS];
        let mut i = 0;
        while i < src.len() && i < MAX_OPS {
            ops[i] = src[i];
            i += 1;
        }
        // An over-long program keeps a length that `validate` rejects.
        Program {
            ops,
            len: src.len(),
        }
    }

    /// Checks stack discipline; returns the number of ANDs/ORs (the gates
    /// that need interaction) on success.
    const fn check(&self, preds: usize) -> Result<usize, SufError> {
        if self.len == 0 || self.len > MAX_OPS {
            return Err(SufError::Program);
        }
        let mut depth = 0usize;
        let mut ands = 0;
        let mut i = 0;
        while i < self.len {
            match self.ops[i] {
                Op::Pred(p) => {
                    if cast::usize_from_u8(p) >= preds {
                        return Err(SufError::Program);
                    }
                    depth += 1;
                }
                Op::Const(_) => depth += 1,
                Op::Not => {
                    if depth < 1 {
                        return Err(SufError::Program);
                    }
                }
                Op::And | Op::Or | Op::Xor => {
                    if depth < 2 {
                        return Err(SufError::Program);
                    }
                    if !matches!(self.ops[i], Op::Xor) {
                        ands += 1;
                    }
                    depth -= 1;
                }
            }
            i += 1;
        }
        if depth != 1 {
            return Err(SufError::Program);
        }
        Ok(ands)
    }

    /// Runs the program on predicate values (bit `i` of `preds` is predicate `i`).
    pub const fn run(&self, preds: u32) -> bool {
        let mut stack = 0u32;
        let mut sp = 0u32;
        let mut i = 0;
        while i < self.len {
            match self.ops[i] {
                Op::Pred(p) => {
                    stack |= ((preds >> p) & 1) << sp;
                    sp += 1;
                }
                Op::Const(b) => {
                    stack |= cast::u32_from_bool(b) << sp;
                    sp += 1;
                }
                Op::Not => stack ^= 1 << (sp - 1),
                Op::And | Op::Or | Op::Xor => {
                    let b = (stack >> (sp - 1)) & 1;
                    let a = (stack >> (sp - 2)) & 1;
                    let v = match self.ops[i] {
                        Op::And => a & b,
                        Op::Or => a | b,
                        _ => a ^ b,
                    };
                    stack &= !(3 << (sp - 2));
                    stack |= v << (sp - 2);
                    sp -= 1;
                }
            }
            i += 1;
        }
        stack & 1 == 1
    }
}

/// The outputs of a SUF on one piece: polynomial coefficients and, for each
/// bit output, the index of its Boolean program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Piece {
    /// `coeffs[j][i]`: coefficient of x^i in ring output j (canonical words).
    pub coeffs: [[u64; MAX_DEGREE + 1]; MAX_ARITH],
    /// `bools[j]`: the program computing bit output j on this piece.
    pub bools: [u8; MAX_BOOL],
}

impl Piece {
    /// The all-zero piece with every bit output on program 0.
    pub const ZERO: Piece = Piece {
        coeffs: [[0; MAX_DEGREE + 1]; MAX_ARITH],
        bools: [0; MAX_BOOL],
    };
}

/// Fixed-point metadata of the input wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fixed {
    /// Fractional bits f.
    pub frac: u32,
}

/// A structured univariate function. See the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Suf {
    /// The ring Z_2^n of the input and the ring outputs.
    pub ring: Width,
    /// Signed or unsigned reading of the input.
    pub domain: Domain,
    /// Fixed-point metadata (informational; arithmetic is in the ring).
    pub fixed: Fixed,
    /// r: the number of ring outputs.
    pub arith: usize,
    /// d: the degree bound of every polynomial.
    pub degree: usize,
    /// ℓ: the number of bit outputs.
    pub bools: usize,
    /// m: the number of intervals.
    pub intervals: usize,
    /// `bounds[0..=m]`: `α_0 = min < α_1 < … < α_m = end`.
    pub bounds: [i128; MAX_INTERVALS + 1],
    /// `pieces[0..m]`: the outputs on each interval.
    pub pieces: [Piece; MAX_INTERVALS],
    /// The predicate table used by the Boolean programs.
    pub preds: [Pred; MAX_PREDS],
    /// How many predicates are in the table.
    pub pred_count: usize,
    /// The Boolean programs.
    pub programs: [Program; MAX_PROGRAMS],
    /// How many programs there are.
    pub program_count: usize,
}

/// A SUF's value at one input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SufValue {
    /// Ring outputs (entries past `arith` are 0).
    pub arith: [u64; MAX_ARITH],
    /// Bit outputs: bit j is output j.
    pub bits: u32,
    /// The interval the input fell in.
    pub interval: usize,
}

impl Suf {
    /// Storage for building a SUF in place with [`Suf::reset`]; not a valid
    /// SUF itself (no intervals).
    pub const EMPTY: Suf = Suf {
        ring: Width::W64,
        domain: Domain::Unsigned,
        fixed: Fixed { frac: 0 },
        arith: 0,
        degree: 0,
        bools: 0,
        intervals: 0,
        bounds: [0; MAX_INTERVALS + 1],
        pieces: [Piece::ZERO; MAX_INTERVALS],
        preds: [Pred::Msb; MAX_PREDS],
        pred_count: 0,
        programs: [Program::constant(false); MAX_PROGRAMS],
        program_count: 0,
    };

    /// One interval covering the whole domain, with zero polynomials, no
    /// bit outputs and no predicates. Build on it with [`Suf::piecewise`],
    /// [`Suf::with_pred`] and friends, all usable in `const` items.
    pub const fn new(ring: Width, domain: Domain, frac: u32, arith: usize, degree: usize) -> Suf {
        let mut s = Suf::EMPTY;
        s.reset(ring, domain, frac, arith, degree);
        s
    }

    /// [`Suf::new`] where `self` lies, field by field: assigning a returned
    /// `Suf` can put a second 4–5 KB copy on the stack (examples/mcu).
    pub const fn reset(
        &mut self,
        ring: Width,
        domain: Domain,
        frac: u32,
        arith: usize,
        degree: usize,
    ) {
        self.ring = ring;
        self.domain = domain;
        self.fixed = Fixed { frac };
        self.arith = arith;
        self.degree = degree;
        self.bools = 0;
        self.intervals = 1;
        self.bounds = [0; MAX_INTERVALS + 1];
        self.bounds[0] = domain.min(ring.bits());
        self.bounds[1] = domain.end(ring.bits());
        self.pieces = [Piece::ZERO; MAX_INTERVALS];
        self.preds = [Pred::Msb; MAX_PREDS];
        self.pred_count = 0;
        self.programs = [Program::constant(false); MAX_PROGRAMS];
        self.program_count = 1;
    }

    /// A piecewise SUF from interior cut points (increasing) and one set of
    /// coefficients per interval (`cuts.len() + 1` of them).
    pub const fn piecewise(
        ring: Width,
        domain: Domain,
        frac: u32,
        arith: usize,
        degree: usize,
        cuts: &[i128],
        coeffs: &[[[u64; MAX_DEGREE + 1]; MAX_ARITH]],
    ) -> Suf {
        let mut s = Suf::new(ring, domain, frac, arith, degree);
        let m = cuts.len() + 1;
        if m > MAX_INTERVALS || coeffs.len() != m {
            // Leave an inconsistent count for `validate` to report.
            s.intervals = MAX_INTERVALS + 1;
            return s;
        }
        let mut i = 0;
        while i < cuts.len() {
            s.bounds[i + 1] = cuts[i];
            i += 1;
        }
        s.bounds[m] = domain.end(ring.bits());
        s.intervals = m;
        let mut i = 0;
        while i < m {
            s.pieces[i].coeffs = coeffs[i];
            i += 1;
        }
        s
    }

    /// Adds a predicate to the table; returns the SUF (the predicate's index
    /// is the previous `pred_count`).
    pub const fn with_pred(mut self, p: Pred) -> Suf {
        if self.pred_count < MAX_PREDS {
            self.preds[self.pred_count] = p;
        }
        self.pred_count += 1;
        self
    }

    /// Adds a Boolean program; its index is the previous `program_count`.
    pub const fn with_program(mut self, p: Program) -> Suf {
        if self.program_count < MAX_PROGRAMS {
            self.programs[self.program_count] = p;
        }
        self.program_count += 1;
        self
    }

    /// Declares `count` bit outputs and makes output `j` use program
    /// `programs[j]` on every interval.
    pub const fn with_bools(mut self, programs: &[u8]) -> Suf {
        self.bools = programs.len();
        let mut i = 0;
        while i < self.intervals && i < MAX_INTERVALS {
            let mut j = 0;
            while j < programs.len() && j < MAX_BOOL {
                self.pieces[i].bools[j] = programs[j];
                j += 1;
            }
            i += 1;
        }
        self
    }

    /// Checks well-formedness; every other method assumes it.
    pub const fn validate(&self) -> Result<(), SufError> {
        if let Err(e) = self.validate_shape() {
            return Err(e);
        }
        let mut i = 0;
        while i < self.intervals {
            if let Err(e) = self.validate_piece(i) {
                return Err(e);
            }
            i += 1;
        }
        if let Err(e) = self.validate_preds() {
            return Err(e);
        }
        let mut q = 0;
        while q < self.program_count {
            if let Err(e) = self.programs[q].check(self.pred_count) {
                return Err(e);
            }
            q += 1;
        }
        Ok(())
    }

    /// [`Suf::validate`]'s counts, degree, fixed point and outer bounds.
    const fn validate_shape(&self) -> Result<(), SufError> {
        let n = self.ring.bits();
        let m = self.intervals;
        if m == 0 || m > MAX_INTERVALS {
            return Err(SufError::Capacity);
        }
        if self.arith > MAX_ARITH
            || self.bools > MAX_BOOL
            || self.pred_count > MAX_PREDS
            || self.program_count == 0
            || self.program_count > MAX_PROGRAMS
        {
            return Err(SufError::Capacity);
        }
        if self.degree > MAX_DEGREE {
            return Err(SufError::Degree);
        }
        if self.fixed.frac > n {
            return Err(SufError::FixedPoint);
        }
        if self.bounds[0] != self.domain.min(n) || self.bounds[m] != self.domain.end(n) {
            return Err(SufError::Boundaries);
        }
        Ok(())
    }

    /// [`Suf::validate`]'s piece `i` (below `intervals`, which
    /// [`Suf::validate_shape`] bounds): increasing bounds, coefficients in
    /// the ring and within the declared outputs and degree, programs that
    /// exist.
    const fn validate_piece(&self, i: usize) -> Result<(), SufError> {
        if self.bounds[i] >= self.bounds[i + 1] {
            return Err(SufError::Boundaries);
        }
        let mut j = 0;
        while j < MAX_ARITH {
            let mut e = 0;
            while e <= MAX_DEGREE {
                let c = self.pieces[i].coeffs[j][e];
                if !self.ring.contains(c) {
                    return Err(SufError::Degree);
                }
                if c != 0 && (j >= self.arith || e > self.degree) {
                    return Err(SufError::Degree);
                }
                e += 1;
            }
            j += 1;
        }
        let mut j = 0;
        while j < self.bools {
            if cast::usize_from_u8(self.pieces[i].bools[j]) >= self.program_count {
                return Err(SufError::Program);
            }
            j += 1;
        }
        Ok(())
    }

    /// [`Suf::validate`]'s predicates: thresholds inside the domain, low
    /// comparisons within the ring.
    const fn validate_preds(&self) -> Result<(), SufError> {
        let n = self.ring.bits();
        let mut p = 0;
        while p < self.pred_count {
            match self.preds[p] {
                Pred::Lt(b) => {
                    if b < self.domain.min(n) || b > self.domain.end(n) {
                        return Err(SufError::Predicate);
                    }
                }
                Pred::LowLt { bits, gamma } => {
                    if bits == 0 || bits > n || gamma > (1u128 << bits) {
                        return Err(SufError::Predicate);
                    }
                }
                Pred::Msb => {}
                Pred::MsbPlus(c) => {
                    if !self.ring.contains(c) {
                        return Err(SufError::Predicate);
                    }
                }
            }
            p += 1;
        }
        Ok(())
    }

    /// The smallest effective width the SUF can be compiled at: every
    /// interior boundary, `Lt` threshold and `LowLt` width must fit.
    pub const fn min_width(&self) -> u32 {
        let mut k = 1;
        let mut i = 1;
        while i < self.intervals {
            let need = bits_for(self.domain, self.bounds[i]);
            if need > k {
                k = need;
            }
            i += 1;
        }
        let mut p = 0;
        while p < self.pred_count {
            let need = match self.preds[p] {
                Pred::Lt(b) => bits_for(self.domain, b),
                Pred::LowLt { bits, .. } => bits,
                Pred::Msb | Pred::MsbPlus(_) => 1,
            };
            if need > k {
                k = need;
            }
            p += 1;
        }
        k
    }

    /// The interval holding domain value `v`.
    pub const fn interval_of(&self, v: i128) -> usize {
        let mut i = 0;
        while i + 1 < self.intervals && v >= self.bounds[i + 1] {
            i += 1;
        }
        i
    }

    /// Predicate `p` on input word `x` at evaluation width `k`.
    pub const fn pred(&self, p: usize, x: u64, k: Width) -> bool {
        let n = self.ring;
        match self.preds[p] {
            Pred::Lt(b) => self.domain.value(k, x) < b,
            Pred::LowLt { bits, gamma } => {
                let low = cast::u128_from_u64(x & Width::of(bits).mask());
                low < gamma
            }
            Pred::Msb => k.msb(x & n.mask()) == 1,
            Pred::MsbPlus(c) => k.msb(x.wrapping_add(c)) == 1,
        }
    }

    /// The SUF at input `x` (a canonical n-bit word): the ideal functionality.
    pub const fn eval(&self, x: u64) -> SufValue {
        self.eval_at(x, self.ring)
    }

    /// The SUF as a gate of effective width `k` computes it at `x`; equal to
    /// [`Suf::eval`] whenever x is inside the k-bit range.
    pub const fn eval_at(&self, x: u64, k: Width) -> SufValue {
        let x = self.ring.reduce(x);
        let interval = self.interval_of(self.domain.value(k, x));
        let piece = &self.pieces[interval];
        let mut arith = [0u64; MAX_ARITH];
        let mut j = 0;
        while j < self.arith {
            // Horner in Z_2^n.
            let mut acc = 0u64;
            let mut e = self.degree + 1;
            while e > 0 {
                e -= 1;
                acc = self.ring.add(self.ring.mul(acc, x), piece.coeffs[j][e]);
            }
            arith[j] = acc;
            j += 1;
        }
        let mut preds = 0u32;
        let mut p = 0;
        while p < self.pred_count {
            preds |= cast::u32_from_bool(self.pred(p, x, k)) << p;
            p += 1;
        }
        let mut bits = 0u32;
        let mut j = 0;
        while j < self.bools {
            let prog = &self.programs[cast::usize_from_u8(piece.bools[j])];
            bits |= cast::u32_from_bool(prog.run(preds)) << j;
            j += 1;
        }
        SufValue {
            arith,
            bits,
            interval,
        }
    }
}

/// Bits a boundary needs: unsigned b ≤ 2^k; signed −2^(k−1) ≤ b ≤ 2^(k−1).
const fn bits_for(domain: Domain, b: i128) -> u32 {
    let mut k = 1;
    while k < 64 {
        if b >= domain.min(k) && b <= domain.end(k) {
            return k;
        }
        k += 1;
    }
    64
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Width = Width::of(8);

    /// ReLU with its sign bit, as a `const`.
    const RELU: Suf = Suf::piecewise(
        W,
        Domain::Signed,
        0,
        1,
        1,
        &[0],
        &[[[0, 0, 0, 0], [0; 4]], [[0, 1, 0, 0], [0; 4]]],
    )
    .with_pred(Pred::Msb)
    .with_program(Program::from_ops(&[Op::Pred(0)]))
    .with_bools(&[1]);

    #[test]
    fn const_relu_is_valid_and_correct() {
        RELU.validate().unwrap();
        for x in 0..256u64 {
            let v = RELU.eval(x);
            let s = W.to_signed(x);
            assert_eq!(v.arith[0], if s < 0 { 0 } else { x });
            assert_eq!(v.bits & 1 == 1, s < 0);
        }
        assert_eq!(RELU.min_width(), 1);
    }

    #[test]
    fn malformed_sufs_are_typed_errors() {
        let mut s = RELU;
        s.bounds[1] = s.bounds[0];
        assert_eq!(s.validate(), Err(SufError::Boundaries));
        let mut s = RELU;
        s.bounds[2] = 127; // the sentinel must be exactly 2^(n−1)
        assert_eq!(s.validate(), Err(SufError::Boundaries));
        let mut s = RELU;
        s.pieces[1].coeffs[0][2] = 1; // degree 2 > bound 1
        assert_eq!(s.validate(), Err(SufError::Degree));
        let mut s = RELU;
        s.pieces[0].coeffs[0][0] = 256; // not canonical in Z_2^8
        assert_eq!(s.validate(), Err(SufError::Degree));
        let s = RELU.with_program(Program::from_ops(&[Op::Pred(0), Op::And]));
        assert_eq!(s.validate(), Err(SufError::Program));
        let s = RELU.with_pred(Pred::LowLt { bits: 9, gamma: 0 });
        assert_eq!(s.validate(), Err(SufError::Predicate));
        let s = Suf::piecewise(
            W,
            Domain::Unsigned,
            0,
            1,
            1,
            &[5, 3],
            &[[[0; 4]; MAX_ARITH]; 3],
        );
        assert_eq!(s.validate(), Err(SufError::Boundaries));
        let s = Suf::piecewise(
            W,
            Domain::Unsigned,
            0,
            1,
            1,
            &[5],
            &[[[0; 4]; MAX_ARITH]; 3],
        );
        assert_eq!(s.validate(), Err(SufError::Capacity));
    }

    #[test]
    fn programs_follow_boolean_semantics() {
        let p = Program::from_ops(&[
            Op::Pred(0),
            Op::Pred(1),
            Op::Or,
            Op::Pred(2),
            Op::Not,
            Op::And,
        ]);
        assert_eq!(p.check(3), Ok(2));
        for v in 0..8u32 {
            let (a, b, c) = (v & 1 == 1, v & 2 == 2, v & 4 == 4);
            assert_eq!(p.run(v), (a || b) && !c);
        }
        let x = Program::from_ops(&[Op::Pred(0), Op::Const(true), Op::Xor]);
        assert!(x.run(0));
        assert!(!x.run(1));
    }

    #[test]
    fn effective_width_views() {
        // Unsigned SUF with a low-bit predicate and MSB(x + c).
        let s = Suf::new(W, Domain::Unsigned, 0, 0, 0)
            .with_pred(Pred::LowLt { bits: 3, gamma: 5 })
            .with_pred(Pred::MsbPlus(3))
            .with_program(Program::from_ops(&[Op::Pred(0)]))
            .with_program(Program::from_ops(&[Op::Pred(1)]))
            .with_bools(&[1, 2]);
        s.validate().unwrap();
        for x in 0..256u64 {
            let v = s.eval(x);
            assert_eq!(v.bits & 1 == 1, x % 8 < 5);
            assert_eq!(v.bits & 2 == 2, (x + 3) % 256 >= 128);
            // At width 6, MSB is bit 5 of (x + 3) mod 64.
            let v6 = s.eval_at(x, Width::of(6));
            assert_eq!(v6.bits & 2 == 2, (x + 3) % 64 >= 32);
        }
        assert_eq!(s.min_width(), 3);
    }
}
