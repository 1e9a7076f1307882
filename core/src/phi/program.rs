//! Φ compiled into a block program: a flat list of column operations with
//! every index resolved when the gate is built.
//!
//! The per-element interpreter ([`Plan::entries`] and the contribution
//! walk) looks up B2A slots, Beaver slots, binomials and coefficient rows
//! for every element. Here those lookups happen once, in [`Program::init`];
//! what remains is a straight-line program over *columns* of [`BLOCK`]
//! elements (struct of arrays), each operation a loop over one block that
//! the compiler vectorizes. The program is plain data — no trait objects,
//! no pointers — so the same list can drive a GPU kernel.
//!
//! # What is computed
//!
//! An output is `Σ_contrib K · P(x̂) · Π cols · share(mono)` (module doc of
//! [`crate::phi`]), where `K` folds the term's scale and every constant
//! entry (binomials, signs, public coefficients, boundary deltas), `P` is
//! the term's public coefficient and the columns are public per-element
//! values: powers of x̂, opened bits `e` and `1 − 2e`, opened Beaver values
//! `u`, and coefficient columns `v + Σ Δ·e`. Consecutive contributions share
//! their leading factors (odometer order varies factor 0 fastest), so the
//! product chain is kept as running prefix columns and only its changed
//! tail is recomputed. A contribution whose folded constant is 0 in the
//! ring is dropped at compile time.
//!
//! The Beaver round's local part, `c_i − a_i` with
//! `c_i = v + Σ_t Δ_t·(e_t + (1 − 2e_t)·ρ_t)`, is a second section of the
//! same program.
//!
//! Arithmetic is wrapping in Z_2^64 and reduced once at the store: reduction
//! mod 2^n is a ring homomorphism, so this equals reducing after every step.

use crate::compile::Compiled;
use crate::error::{Error, SufError};
use crate::fss::Party;
use crate::phi::{
    Factor, MAX_B2A, MAX_BEAVER, MAX_FACTORS, MAX_OUTPUTS, Phi, Plan, Public, binomial,
};
use crate::ring::{Width, cast};
use crate::suf::{MAX_ARITH, MAX_DEGREE};

/// Elements per block: the length of every column.
pub const BLOCK: usize = 64;
/// Most operations in a program.
pub const MAX_OPS: usize = 768;
/// Most columns a section uses.
pub const MAX_COLS: usize = 200;
/// Most distinct public coefficients.
pub const MAX_PUBLICS: usize = 8;

/// A column index.
pub type Col = u8;

/// The constant column 1 (never materialized).
pub const ONE: Col = u8::MAX;

/// Longest product chain: the public coefficient and two columns per factor.
const CHAIN: usize = 1 + 2 * MAX_FACTORS;

/// Coefficient rows, indexed `j·(MAX_DEGREE + 1) + i`.
const ROWS: usize = MAX_ARITH * (MAX_DEGREE + 1);

/// One operation over a block of elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `dst = x̂`.
    Input {
        /// Destination column.
        dst: Col,
    },
    /// `dst = publics[index](x̂)`.
    Public {
        /// Destination column.
        dst: Col,
        /// Index into [`Program::publics`].
        index: u8,
    },
    /// `dst = e_slot`, `sign = 1 − 2·e_slot` (opened B2A bit `slot`).
    Bit {
        /// Destination of the bit.
        dst: Col,
        /// Destination of `1 − 2e`.
        sign: Col,
        /// B2A slot.
        slot: u8,
    },
    /// `dst = u_slot` (opened Beaver value `slot`).
    Opened {
        /// Destination column.
        dst: Col,
        /// Beaver slot.
        slot: u8,
    },
    /// `dst = value`.
    Const {
        /// Destination column.
        dst: Col,
        /// The constant.
        value: u64,
    },
    /// `dst += k·src` (both parties: a public value).
    AddScaled {
        /// Destination column.
        dst: Col,
        /// Constant factor.
        k: u64,
        /// Source column.
        src: Col,
    },
    /// `dst = a·b`.
    Mul {
        /// Destination column (differs from `a` and `b`).
        dst: Col,
        /// First factor.
        a: Col,
        /// Second factor.
        b: Col,
    },
    /// `dst += k·src·share(mono)`; monomial 0 is the public 1, which P0
    /// adds and P1 does not.
    Acc {
        /// Destination column.
        dst: Col,
        /// Constant factor.
        k: u64,
        /// Source column ([`ONE`] for 1).
        src: Col,
        /// Monomial whose share multiplies.
        mono: u8,
    },
    /// Beaver slot `slot` of every element: `reduce(src − a_slot)`.
    StoreOpened {
        /// Source column.
        src: Col,
        /// Beaver slot.
        slot: u8,
    },
    /// Ring output `output` of every element: `reduce_output(src)`.
    StoreOutput {
        /// Source column.
        src: Col,
        /// Output index.
        output: u8,
    },
}

/// The two independent parts of a program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Section {
    /// `c_i − a_i` for the Beaver round (writes the opened-value area).
    Beaver,
    /// The ring outputs.
    Outputs,
}

/// A compiled Φ: plain data, built once per gate.
#[derive(Debug, PartialEq, Eq)]
pub struct Program {
    /// The operations; sections are ranges of it.
    pub ops: [Op; MAX_OPS],
    /// How many operations.
    pub len: usize,
    /// Where the outputs section starts (the Beaver section is before it).
    pub outputs_at: usize,
    /// Columns the larger section uses.
    pub cols: usize,
    /// The public coefficients `Op::Public` reads.
    pub publics: [Public; MAX_PUBLICS],
    /// How many public coefficients.
    pub public_count: usize,
    /// The gate's ring.
    pub ring: Width,
    /// Each output's ring.
    pub out_ring: [Width; MAX_OUTPUTS],
    /// Ring outputs.
    pub outputs: usize,
    /// B2A slots per element.
    pub bits: usize,
    /// Beaver slots per element.
    pub beaver: usize,
    /// Monomials per element.
    pub monos: usize,
}

/// Lazily materialized columns of one section, written straight into the
/// program being built.
struct Builder<'p> {
    prog: &'p mut Program,
    next: usize,
    err: Option<SufError>,
    x_pow: [Col; MAX_DEGREE + 1],
    public: [Col; MAX_PUBLICS],
    bit: [Col; MAX_B2A],
    sign: [Col; MAX_B2A],
    opened: [Col; MAX_BEAVER],
    coef: [Col; ROWS],
    tmp: [Col; CHAIN],
    /// The product chain the `tmp` columns hold, and its length.
    chain: [Col; CHAIN],
    chain_len: usize,
}

/// A factor entry: `k · c1 · c2`.
type Entry = (u64, Col, Col);

impl<'p> Builder<'p> {
    const fn new(prog: &'p mut Program) -> Builder<'p> {
        Builder {
            prog,
            next: 0,
            err: None,
            x_pow: [ONE; MAX_DEGREE + 1],
            public: [ONE; MAX_PUBLICS],
            bit: [ONE; MAX_B2A],
            sign: [ONE; MAX_B2A],
            opened: [ONE; MAX_BEAVER],
            coef: [ONE; ROWS],
            tmp: [ONE; CHAIN],
            chain: [ONE; CHAIN],
            chain_len: 0,
        }
    }

    /// Starts a section: no column is loaded yet.
    const fn section(&mut self) {
        self.next = 0;
        self.x_pow = [ONE; MAX_DEGREE + 1];
        self.public = [ONE; MAX_PUBLICS];
        self.bit = [ONE; MAX_B2A];
        self.sign = [ONE; MAX_B2A];
        self.opened = [ONE; MAX_BEAVER];
        self.coef = [ONE; ROWS];
        self.tmp = [ONE; CHAIN];
        self.chain = [ONE; CHAIN];
        self.chain_len = 0;
    }

    const fn push(&mut self, op: Op) {
        if self.prog.len < MAX_OPS {
            self.prog.ops[self.prog.len] = op;
            self.prog.len += 1;
        } else {
            self.err = Some(SufError::Capacity);
        }
    }

    const fn col(&mut self) -> Col {
        let c = self.next;
        self.next += 1;
        if self.next > self.prog.cols {
            self.prog.cols = self.next;
        }
        if c >= MAX_COLS {
            self.err = Some(SufError::Capacity);
            return 0;
        }
        cast::u8_from_index(c)
    }

    /// The column of `x̂^p` (p ≥ 1).
    const fn x_pow(&mut self, p: usize) -> Col {
        if self.x_pow[p] == ONE {
            let dst = self.col();
            if p == 1 {
                self.push(Op::Input { dst });
            } else {
                let a = self.x_pow(p - 1);
                let b = self.x_pow(1);
                self.push(Op::Mul { dst, a, b });
            }
            self.x_pow[p] = dst;
        }
        self.x_pow[p]
    }

    const fn public(&mut self, p: Public) -> Col {
        if matches!(p, Public::One) {
            return ONE;
        }
        let mut i = 0;
        while i < self.prog.public_count {
            if public_eq(self.prog.publics[i], p) {
                break;
            }
            i += 1;
        }
        if i == self.prog.public_count {
            if i >= MAX_PUBLICS {
                self.err = Some(SufError::Capacity);
                return ONE;
            }
            self.prog.publics[i] = p;
            self.prog.public_count += 1;
        }
        if self.public[i] == ONE {
            let dst = self.col();
            self.push(Op::Public {
                dst,
                index: cast::u8_from_index(i),
            });
            self.public[i] = dst;
        }
        self.public[i]
    }

    /// `(e_b, 1 − 2e_b)` columns of B2A slot `b`.
    const fn bit(&mut self, b: usize) -> (Col, Col) {
        if self.bit[b] == ONE {
            let dst = self.col();
            let sign = self.col();
            self.push(Op::Bit {
                dst,
                sign,
                slot: cast::u8_from_index(b),
            });
            self.bit[b] = dst;
            self.sign[b] = sign;
        }
        (self.bit[b], self.sign[b])
    }

    const fn opened(&mut self, l: usize) -> Col {
        if self.opened[l] == ONE {
            let dst = self.col();
            self.push(Op::Opened {
                dst,
                slot: cast::u8_from_index(l),
            });
            self.opened[l] = dst;
        }
        self.opened[l]
    }

    /// The public part of coefficient row `row`: `v_{m−1} + Σ_t Δ_t·e_t`.
    const fn coef(&mut self, plan: &Plan, row: usize) -> Col {
        if self.coef[row] == ONE {
            let dst = self.col();
            self.push(Op::Const {
                dst,
                value: plan.coef_base[row],
            });
            let mut t = 0;
            while t < cast::usize_from_u8(plan.coef_len[row]) {
                let (b, d) = plan.coef_terms[row][t];
                let (e, _) = self.bit(cast::usize_from_u8(b));
                self.push(Op::AddScaled { dst, k: d, src: e });
                t += 1;
            }
            self.coef[row] = dst;
        }
        self.coef[row]
    }

    /// Entry `e` of `x^p`: `C(p, e)·(−1)^e · x̂^(p−e)`.
    const fn x_entry(&mut self, p: usize, e: usize) -> Entry {
        let mut k = binomial(p, e);
        if e % 2 == 1 {
            k = k.wrapping_neg();
        }
        let col = if p > e { self.x_pow(p - e) } else { ONE };
        (k, col, ONE)
    }

    /// Entry `e` of a converted bit's expansion `e + (1 − 2e)·ρ`; a bit
    /// never converted has `e = 0`.
    const fn bit_entry(&mut self, plan: &Plan, node: u8, e: usize) -> Entry {
        match plan.b2a_of(node) {
            Some(b) => {
                let (bit, sign) = self.bit(b);
                (1, if e == 0 { bit } else { sign }, ONE)
            }
            None => (if e == 0 { 0 } else { 1 }, ONE, ONE),
        }
    }

    /// Entry `e` of factor `f` (the order of [`Plan::entries`]).
    const fn entry(&mut self, c: &Compiled, plan: &Plan, f: Factor, e: usize) -> Entry {
        match f {
            Factor::X(p) => self.x_entry(cast::usize_from_u8(p), e),
            Factor::Bool(j) => self.bit_entry(plan, c.bool_node[cast::usize_from_u8(j)], e),
            Factor::Wrap(v) => match crate::phi::wrap_node(c, v) {
                Some(node) => self.bit_entry(plan, node, e),
                None => (0, ONE, ONE),
            },
            Factor::Kappa(_) => (1, ONE, ONE),
            Factor::Poly(j) => self.poly_entry(c, plan, cast::usize_from_u8(j), e),
        }
    }

    /// Entry `e` of polynomial output `j`: per degree i, each coefficient
    /// entry times each entry of `x^i`.
    const fn poly_entry(&mut self, c: &Compiled, plan: &Plan, j: usize, e: usize) -> Entry {
        let mut e = e;
        let mut i = 0;
        while i <= c.suf.degree {
            let per = plan.coefficient_entries(c, j, i);
            if e < per * (i + 1) {
                let (k1, c1) = self.coef_entry(plan, j, i, e / (i + 1));
                let (k2, c2, _) = self.x_entry(i, e % (i + 1));
                return (k1.wrapping_mul(k2), c1, c2);
            }
            e -= per * (i + 1);
            i += 1;
        }
        self.err = Some(SufError::Program);
        (0, ONE, ONE)
    }

    /// Entry `ce` of coefficient `(j, i)`: public; Beaver `(u, 1)`; or
    /// `v + Σ Δ·e` then `Δ_t·(1 − 2e_t)` per boundary.
    const fn coef_entry(&mut self, plan: &Plan, j: usize, i: usize, ce: usize) -> (u64, Col) {
        let row = j * (MAX_DEGREE + 1) + i;
        if plan.coef_public[row] {
            return (plan.coef_base[row], ONE);
        }
        let l = plan.beaver_index(j, i);
        if i >= 1 && l != u8::MAX {
            return if ce == 0 {
                (1, self.opened(cast::usize_from_u8(l)))
            } else {
                (1, ONE)
            };
        }
        if ce == 0 {
            return (1, self.coef(plan, row));
        }
        let (b, d) = plan.coef_terms[row][ce - 1];
        let (_, sign) = self.bit(cast::usize_from_u8(b));
        (d, sign)
    }

    /// Emits the product of `cols` (reusing the cached chain's common
    /// prefix) and returns the column holding it.
    const fn product(&mut self, cols: &[Col; CHAIN], len: usize) -> Col {
        if len == 0 {
            return ONE;
        }
        let mut p = 0;
        while p < len && p < self.chain_len && self.chain[p] == cols[p] {
            p += 1;
        }
        let mut d = if p > 1 { p } else { 1 };
        while d < len {
            if self.tmp[d] == ONE {
                self.tmp[d] = self.col();
            }
            let a = if d == 1 { cols[0] } else { self.tmp[d - 1] };
            self.push(Op::Mul {
                dst: self.tmp[d],
                a,
                b: cols[d],
            });
            d += 1;
        }
        self.chain = *cols;
        self.chain_len = len;
        if len == 1 { cols[0] } else { self.tmp[len - 1] }
    }
}

impl Program {
    /// Storage for [`Program::init`]: every field is overwritten there.
    pub const EMPTY: Program = Program {
        ops: [Op::Input { dst: 0 }; MAX_OPS],
        len: 0,
        outputs_at: 0,
        cols: 0,
        publics: [Public::One; MAX_PUBLICS],
        public_count: 0,
        ring: Width::W64,
        out_ring: [Width::W64; MAX_OUTPUTS],
        outputs: 0,
        bits: 0,
        beaver: 0,
        monos: 0,
    };

    /// Compiles `phi` over `c` with its plan, in place: the program is
    /// 7–13 KB and is written where it lies. On an error `self` is left
    /// partly written and must not be used.
    pub const fn init(&mut self, c: &Compiled, phi: &Phi, plan: &Plan) -> Result<(), SufError> {
        self.ops = [Op::Input { dst: 0 }; MAX_OPS];
        self.len = 0;
        self.outputs_at = 0;
        self.cols = 0;
        self.publics = [Public::One; MAX_PUBLICS];
        self.public_count = 0;
        self.ring = c.suf.ring;
        self.out_ring = [c.suf.ring; MAX_OUTPUTS];
        self.outputs = phi.count;
        self.bits = plan.b2a_count;
        self.beaver = plan.beaver_count;
        self.monos = plan.mono_count;
        let mut b = Builder::new(self);
        b.beaver_section(plan);
        b.section();
        b.prog.outputs_at = b.prog.len;
        let mut o = 0;
        while o < phi.count {
            b.prog.out_ring[o] = phi.outputs[o].ring;
            b.output_section(c, phi, plan, o);
            o += 1;
        }
        match b.err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Scratch words [`run`] needs: one block per column.
    pub const fn scratch_words(&self) -> usize {
        self.cols * BLOCK
    }

    /// The operations of `section`.
    pub fn section(&self, section: Section) -> &[Op] {
        match section {
            Section::Beaver => &self.ops[..self.outputs_at],
            Section::Outputs => &self.ops[self.outputs_at..self.len],
        }
    }
}

impl Builder<'_> {
    /// `c_l − a_l` per Beaver slot; P0 adds the public parts.
    const fn beaver_section(&mut self, plan: &Plan) {
        let mut l = 0;
        while l < plan.beaver_count {
            let (j, i) = plan.beaver[l];
            let row = cast::usize_from_u8(j) * (MAX_DEGREE + 1) + cast::usize_from_u8(i);
            let dst = self.col();
            self.push(Op::Const { dst, value: 0 });
            self.push(Op::Acc {
                dst,
                k: plan.coef_base[row],
                src: ONE,
                mono: 0,
            });
            let mut t = 0;
            while t < cast::usize_from_u8(plan.coef_len[row]) {
                let (bi, d) = plan.coef_terms[row][t];
                let (e, sign) = self.bit(cast::usize_from_u8(bi));
                // Δ·(e + (1 − 2e)·ρ): e is public (P0's), ρ is shared.
                self.push(Op::Acc {
                    dst,
                    k: d,
                    src: e,
                    mono: 0,
                });
                self.push(Op::Acc {
                    dst,
                    k: d,
                    src: sign,
                    mono: plan.rho_mono[cast::usize_from_u8(bi)],
                });
                t += 1;
            }
            self.push(Op::StoreOpened {
                src: dst,
                slot: cast::u8_from_index(l),
            });
            l += 1;
        }
    }

    /// Output `o`: every contribution of its terms.
    const fn output_section(&mut self, c: &Compiled, phi: &Phi, plan: &Plan, o: usize) {
        let acc = self.col();
        self.push(Op::Const { dst: acc, value: 0 });
        let ring = c.suf.ring;
        let mut k = 0;
        while k < plan.contrib_count {
            let ct = plan.contribs[k];
            k += 1;
            if cast::usize_from_u8(ct.output) != o {
                continue;
            }
            let term = &phi.outputs[o].terms[cast::usize_from_u8(ct.term)];
            // Slow-varying parts first: the public coefficient, then the
            // factors from last to first.
            let mut cols = [ONE; CHAIN];
            let mut len = 0;
            let mut konst = term.scale;
            let p = self.public(term.public);
            if p != ONE {
                cols[len] = p;
                len += 1;
            }
            let mut f = term.len;
            while f > 0 {
                f -= 1;
                let (kf, c1, c2) = self.entry(
                    c,
                    plan,
                    term.factors[f],
                    cast::usize_from_u16(ct.entries[f]),
                );
                konst = konst.wrapping_mul(kf);
                if c1 != ONE {
                    cols[len] = c1;
                    len += 1;
                }
                if c2 != ONE {
                    cols[len] = c2;
                    len += 1;
                }
            }
            if ring.reduce(konst) == 0 {
                continue;
            }
            let src = self.product(&cols, len);
            self.push(Op::Acc {
                dst: acc,
                k: konst,
                src,
                mono: ct.mono,
            });
        }
        self.push(Op::StoreOutput {
            src: acc,
            output: cast::u8_from_index(o),
        });
    }
}

const fn public_eq(a: Public, b: Public) -> bool {
    match (a, b) {
        (Public::One, Public::One) => true,
        (Public::ViewShr { view: v, shift: s }, Public::ViewShr { view: w, shift: t }) => {
            v.width.bits() == w.width.bits() && v.add == w.add && s == t
        }
        (Public::NotMsb(v), Public::NotMsb(w)) => {
            v.width.bits() == w.width.bits() && v.add == w.add
        }
        _ => false,
    }
}

/// What a section reads, for `n` elements.
///
/// Areas are element-major (`element · width + slot`) as the wire formats
/// lay them out, except the monomial shares, which are column-major
/// (`mono · n + element`) so that the accumulation streams them.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    /// Masked inputs x̂ (n words).
    pub x_hat: &'a [u64],
    /// Opened B2A bits (n × bits; bit 0 of each word).
    pub e: &'a [u64],
    /// Opened Beaver values (n × beaver; the outputs section reads them).
    pub u: &'a [u64],
    /// This party's Beaver mask shares (n × beaver; the Beaver section
    /// reads them).
    pub a: &'a [u64],
    /// This party's monomial shares (monos × n).
    pub shares: &'a [u64],
}

/// Runs `section` of `prog` over `n` elements for `party`, block by block,
/// with `cols` (at least [`Program::scratch_words`] words) as column
/// scratch. `out` receives opened-value shares (n × beaver) or ring outputs
/// (n × outputs). The reference implementation of the Φ boundary.
pub fn run(
    prog: &Program,
    section: Section,
    party: Party,
    input: &Inputs<'_>,
    out: &mut [u64],
    cols: &mut [u64],
) -> Result<(), Error> {
    let n = input.x_hat.len();
    let (width, reads) = match section {
        Section::Beaver => (prog.beaver, input.a),
        Section::Outputs => (prog.outputs, input.u),
    };
    if input.e.len() != n * prog.bits
        || input.shares.len() != n * prog.monos
        || reads.len() != n * prog.beaver
        || out.len() != n * width
        || cols.len() < prog.scratch_words()
    {
        return Err(Error::BufferLength);
    }
    let (blocks, _) = cols.as_chunks_mut::<BLOCK>();
    let blocks = &mut blocks[..prog.cols];
    let p0 = party == Party::P0;
    let mut start = 0;
    while start < n {
        let at = Block {
            start,
            count: BLOCK.min(n - start),
            n,
        };
        #[cfg(feature = "ct-planted")]
        crate::planted::secret_index(
            input
                .shares
                .iter()
                .skip(start)
                .step_by(n)
                .fold(0, |a, b| a ^ b),
        );
        run_block(prog, (section, p0, &at), input, (out, width), blocks);
        start += at.count;
    }
    Ok(())
}

/// One block of [`run`]: every operation of `section` on the block's
/// columns, the stores writing `width` words per element into `out`.
fn run_block(
    prog: &Program,
    (section, p0, at): (Section, bool, &Block),
    input: &Inputs<'_>,
    (out, width): (&mut [u64], usize),
    blocks: &mut [[u64; BLOCK]],
) {
    for op in prog.section(section) {
        match *op {
            Op::StoreOpened { src, slot } => {
                let col = &blocks[usize::from(src)];
                let slot = usize::from(slot);
                store(prog.ring, at, width, slot, col, Some(input.a), out);
            }
            Op::StoreOutput { src, output } => {
                let ring = prog.out_ring[usize::from(output)];
                let col = &blocks[usize::from(src)];
                store(ring, at, width, usize::from(output), col, None, out);
            }
            op => step(prog, op, p0, at, input, blocks),
        }
    }
}

/// Where a block lies in the batch.
struct Block {
    start: usize,
    count: usize,
    n: usize,
}

/// `out[element · width + slot] = reduce(col − minus)` over one block.
fn store(
    ring: Width,
    at: &Block,
    width: usize,
    slot: usize,
    col: &[u64; BLOCK],
    minus: Option<&[u64]>,
    out: &mut [u64],
) {
    let from = at.start * width + slot;
    let end = (from + at.count * width).min(out.len());
    let out = out[from..end].iter_mut().step_by(width);
    match minus {
        Some(a) => {
            for ((o, v), m) in out.zip(col).zip(strided(a, width, at.start, slot)) {
                *o = ring.reduce(v.wrapping_sub(*m));
            }
        }
        None => {
            for (o, v) in out.zip(col) {
                *o = ring.reduce(*v);
            }
        }
    }
}

/// Slot `slot` of an element-major area of `width` words per element, from
/// element `start` on.
fn strided(
    area: &[u64],
    width: usize,
    start: usize,
    slot: impl Into<usize>,
) -> impl Iterator<Item = &u64> {
    area[start * width + slot.into()..]
        .iter()
        .step_by(width.max(1))
}

/// One operation over one block (stores are done by [`run`]).
#[inline]
fn step(prog: &Program, op: Op, p0: bool, at: &Block, io: &Inputs<'_>, cols: &mut [[u64; BLOCK]]) {
    let (s, c) = (at.start, at.count);
    match op {
        Op::Input { dst } => cols[usize::from(dst)][..c].copy_from_slice(&io.x_hat[s..s + c]),
        Op::Public { dst, index } => public_column(
            prog.publics[usize::from(index)],
            &io.x_hat[s..s + c],
            &mut cols[usize::from(dst)],
        ),
        Op::Bit { dst, sign, slot } => {
            let (d, g) = two(cols, dst, sign);
            let e = strided(io.e, prog.bits, s, slot);
            for ((d, g), e) in d.iter_mut().zip(g.iter_mut()).zip(e) {
                let e = e & 1;
                *d = e;
                *g = 1u64.wrapping_sub(e << 1);
            }
        }
        Op::Opened { dst, slot } => {
            let u = strided(io.u, prog.beaver, s, slot);
            for (d, u) in cols[usize::from(dst)].iter_mut().zip(u) {
                *d = *u;
            }
        }
        Op::Const { dst, value } => cols[usize::from(dst)].fill(value),
        Op::AddScaled { dst, k, src } => {
            let (d, a) = two_ref(cols, dst, src);
            for (d, a) in d.iter_mut().zip(a) {
                *d = d.wrapping_add(k.wrapping_mul(*a));
            }
        }
        Op::Mul { dst, a, b } => {
            let (d, x, y) = three(cols, dst, a, b);
            for ((d, x), y) in d.iter_mut().zip(x).zip(y) {
                *d = x.wrapping_mul(*y);
            }
        }
        Op::Acc { dst, k, src, mono } => acc(p0, at, io, cols, (dst, k, src, mono)),
        Op::StoreOpened { .. } | Op::StoreOutput { .. } => {}
    }
}

/// `dst += k·src·share(mono)` over one block.
#[inline]
fn acc(
    p0: bool,
    at: &Block,
    io: &Inputs<'_>,
    cols: &mut [[u64; BLOCK]],
    (dst, k, src, mono): (Col, u64, Col, u8),
) {
    let (s, c) = (at.start, at.count);
    if mono == 0 {
        // The public monomial 1: only P0 adds public values.
        if !p0 {
            return;
        }
        if src == ONE {
            for d in &mut cols[usize::from(dst)][..c] {
                *d = d.wrapping_add(k);
            }
        } else {
            let (d, a) = two_ref(cols, dst, src);
            for (d, a) in d.iter_mut().zip(a) {
                *d = d.wrapping_add(k.wrapping_mul(*a));
            }
        }
        return;
    }
    let m = usize::from(mono) * at.n;
    let share = &io.shares[m + s..m + s + c];
    if src == ONE {
        for (d, r) in cols[usize::from(dst)].iter_mut().zip(share) {
            *d = d.wrapping_add(k.wrapping_mul(*r));
        }
    } else {
        let (d, a) = two_ref(cols, dst, src);
        for ((d, a), r) in d.iter_mut().zip(a).zip(share) {
            *d = d.wrapping_add(k.wrapping_mul(a.wrapping_mul(*r)));
        }
    }
}

/// A public coefficient over one block of x̂.
fn public_column(p: Public, x_hat: &[u64], dst: &mut [u64; BLOCK]) {
    match p {
        Public::One => dst.fill(1),
        Public::ViewShr { view, shift } => {
            for (d, x) in dst.iter_mut().zip(x_hat) {
                *d = view.at(*x) >> shift;
            }
        }
        Public::NotMsb(view) => {
            for (d, x) in dst.iter_mut().zip(x_hat) {
                *d = view.width.msb(view.at(*x)) ^ 1;
            }
        }
    }
}

/// Column `dst` mutably and column `src` (≠ dst) shared.
fn two_ref(cols: &mut [[u64; BLOCK]], dst: Col, src: Col) -> (&mut [u64; BLOCK], &[u64; BLOCK]) {
    let (d, a, _) = three(cols, dst, src, src);
    (d, a)
}

/// Two distinct columns, both mutably.
fn two(cols: &mut [[u64; BLOCK]], x: Col, y: Col) -> (&mut [u64; BLOCK], &mut [u64; BLOCK]) {
    let (x, y) = (usize::from(x), usize::from(y));
    if x < y {
        let (lo, hi) = cols.split_at_mut(y);
        (&mut lo[x], &mut hi[0])
    } else {
        let (lo, hi) = cols.split_at_mut(x);
        (&mut hi[0], &mut lo[y])
    }
}

/// Column `dst` mutably and columns `a`, `b` (both ≠ dst) shared.
fn three(
    cols: &mut [[u64; BLOCK]],
    dst: Col,
    a: Col,
    b: Col,
) -> (&mut [u64; BLOCK], &[u64; BLOCK], &[u64; BLOCK]) {
    let d = usize::from(dst);
    let (lo, rest) = cols.split_at_mut(d);
    let (mid, hi) = rest.split_at_mut(1);
    let (lo, hi): (&[[u64; BLOCK]], &[[u64; BLOCK]]) = (lo, hi);
    (&mut mid[0], pick(lo, hi, d, a), pick(lo, hi, d, b))
}

/// Column `c` of a column array split around column `d`.
fn pick<'a>(lo: &'a [[u64; BLOCK]], hi: &'a [[u64; BLOCK]], d: usize, c: Col) -> &'a [u64; BLOCK] {
    let c = usize::from(c);
    if c < d { &lo[c] } else { &hi[c - d - 1] }
}
