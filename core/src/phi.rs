//! Post-processing circuits Φ, written as sums of products and compiled
//! into dealer monomials.
//!
//! A gate's ring outputs are `Σ_terms scale · public · Π factors`, where the
//! public coefficient is a function of the masked input x̂ and the factors
//! are secret: powers of x, SUF polynomial outputs, SUF bit outputs and wrap
//! bits (converted to the ring), and mask-derived constants κ.
//!
//! After the Boolean round every secret factor is a polynomial in dealer
//! randomness with public coefficients:
//!
//! * `x^p = Σ_j C(p,j) x̂^{p−j} (−r)^j`,
//! * a converted bit `b = e + (1 − 2e)·ρ` with `e = b ⊕ ρ` opened,
//! * a polynomial coefficient `c_i = v + Σ_t Δ_t·C_t` (interval selection,
//!   with converted boundary bits C_t), or `c_i = u + a` when it is opened
//!   Beaver-style as `u = c_i − a` in one more round,
//! * a constant `κ(r)`.
//!
//! So every term expands into `Σ public·monomial` over monomials such as
//! `r²`, `ρ_t·r` or `a·r²`, whose *shape* is known when the gate is built.
//! The dealer shares each monomial (P0's share comes from its seed, P1's is
//! explicit key material), and the parties finish locally. This trades key
//! bytes for rounds: [`PolyMode::Monomials`] finishes after the Boolean
//! round; [`PolyMode::Beaver`] spends one more round to need fewer
//! monomials for high-degree, many-interval polynomials.

use crate::compile::{Compiled, Node, View};
use crate::error::SufError;
use crate::ring::{Width, cast};
use crate::suf::{MAX_ARITH, MAX_DEGREE};

pub mod program;

/// Most ring outputs of a gate.
pub const MAX_OUTPUTS: usize = 2;
/// Most terms per output.
pub const MAX_TERMS: usize = 8;
/// Most factors per term.
pub const MAX_FACTORS: usize = 3;
/// Most mask-derived constants.
pub const MAX_KAPPAS: usize = 4;
/// Most bits converted to the ring per element.
pub const MAX_B2A: usize = 56;
/// Most Beaver-opened coefficients per element.
pub const MAX_BEAVER: usize = MAX_ARITH * MAX_DEGREE;
/// Most distinct monomials.
pub const MAX_MONOS: usize = 128;
/// Most (term, entry-combination) contributions.
pub const MAX_CONTRIB: usize = 512;
/// Most expansion entries of one factor.
pub const MAX_ENTRIES: usize = 1 + (MAX_B2A + 2) * (MAX_DEGREE + 1);

/// A public coefficient computed from the masked input x̂.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Public {
    /// The constant 1.
    One,
    /// `view(x̂) >> shift`.
    ViewShr {
        /// The view.
        view: View,
        /// The right shift.
        shift: u32,
    },
    /// `1 − MSB(view(x̂))`.
    NotMsb(View),
}

impl Public {
    /// The coefficient's value at `x_hat`.
    #[inline]
    pub const fn at(&self, x_hat: u64) -> u64 {
        match self {
            Public::One => 1,
            Public::ViewShr { view, shift } => view.at(x_hat) >> *shift,
            Public::NotMsb(view) => view.width.msb(view.at(x_hat)) ^ 1,
        }
    }
}

/// A constant the dealer derives from the input mask r.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kappa {
    /// `(r mod 2^width) >> shift`.
    MaskBits {
        /// Low bits kept.
        width: Width,
        /// Right shift.
        shift: u32,
    },
    /// Bit `width − 1` of r.
    MaskMsb(Width),
}

impl Kappa {
    /// The constant for mask `r`.
    pub const fn of(&self, r: u64) -> u64 {
        match self {
            Kappa::MaskBits { width, shift } => width.reduce(r) >> *shift,
            Kappa::MaskMsb(w) => w.msb(r),
        }
    }
}

/// A secret factor of a term.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Factor {
    /// `x^p`, 1 ≤ p ≤ [`MAX_DEGREE`].
    X(u8),
    /// SUF ring output `j`: its interval's polynomial at x.
    Poly(u8),
    /// SUF bit output `j`, as a ring element.
    Bool(u8),
    /// The wrap bit `[view(x̂) < r mod 2^w]` of a view, as a ring element.
    Wrap(View),
    /// Mask-derived constant `i` of the circuit.
    Kappa(u8),
}

/// `scale · public · Π factors`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Term {
    /// A constant multiplier (a ring word).
    pub scale: u64,
    /// The public coefficient.
    pub public: Public,
    /// The factors; only the first `len` are used.
    pub factors: [Factor; MAX_FACTORS],
    /// How many factors.
    pub len: usize,
}

impl Term {
    /// `scale · public · Π factors`.
    pub const fn new(scale: u64, public: Public, factors: &[Factor]) -> Term {
        let mut f = [Factor::X(1); MAX_FACTORS];
        let mut i = 0;
        while i < factors.len() && i < MAX_FACTORS {
            f[i] = factors[i];
            i += 1;
        }
        Term {
            scale,
            public,
            factors: f,
            len: factors.len(),
        }
    }

    /// The constant `scale`.
    pub const fn constant(scale: u64) -> Term {
        Term::new(scale, Public::One, &[])
    }

    /// `factor ·` this term (the factor goes first).
    pub const fn times(self, factor: Factor) -> Term {
        let mut f = [factor; MAX_FACTORS];
        let mut i = 0;
        while i < self.len && i + 1 < MAX_FACTORS {
            f[i + 1] = self.factors[i];
            i += 1;
        }
        Term {
            scale: self.scale,
            public: self.public,
            factors: f,
            len: self.len + 1,
        }
    }
}

/// One ring output of a gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Output {
    /// The terms; only the first `len` are used.
    pub terms: [Term; MAX_TERMS],
    /// How many terms.
    pub len: usize,
    /// The ring the output is reduced into (a divisor ring of the gate's).
    pub ring: Width,
}

/// How secret polynomial coefficients meet powers of x.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PolyMode {
    /// Dealer monomials `ρ_t·r^j`: no extra round, more key material.
    Monomials,
    /// Open `c_i − a_i` in one more round; monomials `a_i·r^j` only.
    Beaver,
}

/// A post-processing circuit: ring outputs over the SUF's outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Phi {
    /// The outputs; only the first `count` are used.
    pub outputs: [Output; MAX_OUTPUTS],
    /// How many ring outputs.
    pub count: usize,
    /// The mask-derived constants factors refer to.
    pub kappas: [Kappa; MAX_KAPPAS],
    /// How many constants.
    pub kappa_count: usize,
    /// How coefficient × power products are evaluated.
    pub mode: PolyMode,
}

impl Phi {
    /// A circuit with no outputs yet.
    pub const fn new(mode: PolyMode) -> Phi {
        let empty = Output {
            terms: [Term::constant(0); MAX_TERMS],
            len: 0,
            ring: Width::W64,
        };
        Phi {
            outputs: [empty; MAX_OUTPUTS],
            count: 0,
            kappas: [Kappa::MaskMsb(Width::W64); MAX_KAPPAS],
            kappa_count: 0,
            mode,
        }
    }

    /// The circuit whose single output is SUF ring output 0.
    pub const fn poly(ring: Width, mode: PolyMode) -> Phi {
        Phi::new(mode).with_output(ring, &[Term::new(1, Public::One, &[Factor::Poly(0)])])
    }

    /// Adds a ring output reduced into `ring`.
    pub const fn with_output(mut self, ring: Width, terms: &[Term]) -> Phi {
        if self.count < MAX_OUTPUTS {
            let mut t = [Term::constant(0); MAX_TERMS];
            let mut i = 0;
            while i < terms.len() && i < MAX_TERMS {
                t[i] = terms[i];
                i += 1;
            }
            self.outputs[self.count] = Output {
                terms: t,
                len: terms.len(),
                ring,
            };
        }
        self.count += 1;
        self
    }

    /// Adds a mask-derived constant; its index is the previous `kappa_count`.
    pub const fn with_kappa(mut self, k: Kappa) -> Phi {
        if self.kappa_count < MAX_KAPPAS {
            self.kappas[self.kappa_count] = k;
        }
        self.kappa_count += 1;
        self
    }

    /// The views whose wrap bits the circuit reads (for the compiler).
    pub const fn wrap_views(&self) -> ([View; MAX_OUTPUTS * MAX_TERMS], usize) {
        let mut out = [View {
            width: Width::W64,
            add: 0,
        }; MAX_OUTPUTS * MAX_TERMS];
        let mut n = 0;
        let mut o = 0;
        while o < self.count && o < MAX_OUTPUTS {
            let mut t = 0;
            while t < self.outputs[o].len && t < MAX_TERMS {
                let term = &self.outputs[o].terms[t];
                let mut f = 0;
                while f < term.len && f < MAX_FACTORS {
                    if let Factor::Wrap(v) = term.factors[f] {
                        out[n] = v;
                        n += 1;
                    }
                    f += 1;
                }
                t += 1;
            }
            o += 1;
        }
        (out, n)
    }
}

/// A monomial in the dealer's secrets: `r^r · Π_{b∈rho} ρ_b · Π_{l∈a} a_l · Π_{q∈kappa} κ_q`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Mono {
    /// Power of the input mask.
    pub r: u8,
    /// Beaver masks in the product.
    pub a: u8,
    /// Constants in the product.
    pub kappa: u8,
    /// Converted bits' dealer bits in the product.
    pub rho: u64,
}

impl Mono {
    /// The monomial 1.
    pub const ONE: Mono = Mono {
        r: 0,
        a: 0,
        kappa: 0,
        rho: 0,
    };

    const fn times(self, o: Mono) -> Option<Mono> {
        // ρ² = ρ (bits); a repeated a or κ is a modelling error.
        if self.a & o.a != 0
            || self.kappa & o.kappa != 0
            || self.r + o.r > 2 * cast::u8_from_index(MAX_DEGREE)
        {
            return None;
        }
        Some(Mono {
            r: self.r + o.r,
            a: self.a | o.a,
            kappa: self.kappa | o.kappa,
            rho: self.rho | o.rho,
        })
    }

    const fn eq(self, o: Mono) -> bool {
        self.r == o.r && self.a == o.a && self.kappa == o.kappa && self.rho == o.rho
    }

    /// Whether both parties derive their shares from their seeds (1, r, a_l),
    /// so P1 needs no explicit material for it.
    pub const fn is_seeded(&self) -> bool {
        self.rho == 0
            && self.kappa == 0
            && ((self.a == 0 && self.r <= 1) || (self.r == 0 && self.a.count_ones() == 1))
    }
}

/// One contribution of a term to a monomial's coefficient: the entries
/// picked from each factor's expansion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Contrib {
    /// Output index.
    pub output: u8,
    /// Term index within the output.
    pub term: u8,
    /// Entry index within each factor's expansion.
    pub entries: [u16; MAX_FACTORS],
    /// Target monomial.
    pub mono: u8,
}

impl Contrib {
    /// An unused slot.
    const NONE: Contrib = Contrib {
        output: 0,
        term: 0,
        entries: [0; MAX_FACTORS],
        mono: 0,
    };
}

/// Everything the dealer and the parties need to agree on, derived from the
/// compiled SUF and Φ alone (so it is mask-independent).
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    /// Circuit nodes converted to the ring in the Boolean round.
    pub b2a: [u8; MAX_B2A],
    /// How many converted nodes.
    pub b2a_count: usize,
    /// For each boundary t (1 ≤ t < m), its index in `b2a` if converted.
    pub boundary_b2a: [u8; crate::suf::MAX_INTERVALS],
    /// Beaver-opened coefficients `(output, power)`.
    pub beaver: [(u8, u8); MAX_BEAVER],
    /// How many Beaver openings per element.
    pub beaver_count: usize,
    /// The monomials; index 0 is [`Mono::ONE`].
    pub monos: [Mono; MAX_MONOS],
    /// How many monomials.
    pub mono_count: usize,
    /// The contributions of every term.
    pub contribs: [Contrib; MAX_CONTRIB],
    /// How many contributions.
    pub contrib_count: usize,
    /// Per coefficient `(j, i)` (index `j·(MAX_DEGREE+1) + i`): the
    /// converted boundary bits that move it and by how much, so evaluation
    /// does not rescan the intervals.
    pub coef_terms: [[(u8, u64); crate::suf::MAX_INTERVALS]; MAX_ARITH * (MAX_DEGREE + 1)],
    /// How many entries each `coef_terms` row has.
    pub coef_len: [u8; MAX_ARITH * (MAX_DEGREE + 1)],
    /// Whether coefficient `(j, i)` is the same on every interval.
    pub coef_public: [bool; MAX_ARITH * (MAX_DEGREE + 1)],
    /// The last interval's coefficient `(j, i)`.
    pub coef_base: [u64; MAX_ARITH * (MAX_DEGREE + 1)],
    /// Where each monomial's share comes from.
    pub mono_source: [MonoSource; MAX_MONOS],
    /// Index of the monomial `ρ_b` for each converted bit (`u8::MAX` if unused).
    pub rho_mono: [u8; MAX_B2A],
}

/// Where a party's share of a monomial comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MonoSource {
    /// The public constant 1 (P0 holds it).
    One,
    /// The input mask share.
    Mask,
    /// A Beaver mask share, seeded.
    Beaver(u8),
    /// The i-th dealt monomial: P0's seeded word, P1's explicit word.
    Dealt(u8),
}

/// An error for a Φ that exceeds a capacity or is inconsistent.
const fn cap<T>() -> Result<T, SufError> {
    Err(SufError::Capacity)
}

impl Plan {
    /// Storage for [`Plan::init`]: every field is overwritten there.
    pub const EMPTY: Plan = Plan {
        b2a: [0; MAX_B2A],
        b2a_count: 0,
        boundary_b2a: [u8::MAX; crate::suf::MAX_INTERVALS],
        beaver: [(0, 0); MAX_BEAVER],
        beaver_count: 0,
        monos: [Mono::ONE; MAX_MONOS],
        mono_count: 1,
        contribs: [Contrib::NONE; MAX_CONTRIB],
        contrib_count: 0,
        coef_terms: [[(0, 0); crate::suf::MAX_INTERVALS]; MAX_ARITH * (MAX_DEGREE + 1)],
        coef_len: [0; MAX_ARITH * (MAX_DEGREE + 1)],
        coef_public: [true; MAX_ARITH * (MAX_DEGREE + 1)],
        coef_base: [0; MAX_ARITH * (MAX_DEGREE + 1)],
        mono_source: [MonoSource::One; MAX_MONOS],
        rho_mono: [u8::MAX; MAX_B2A],
    };

    /// Plans `phi` over `c` in place: every field is assigned where it
    /// lies (the plan is 9–14 KB). On an error `self` is left partly
    /// written and must not be used.
    pub const fn init(&mut self, c: &Compiled, phi: &Phi) -> Result<(), SufError> {
        self.reset();
        if phi.count > MAX_OUTPUTS || phi.kappa_count > MAX_KAPPAS {
            return cap();
        }
        // Boundary bits of every non-public coefficient of a Poly factor.
        let mut o = 0;
        while o < phi.count {
            let out = &phi.outputs[o];
            if out.len > MAX_TERMS || out.ring.bits() > c.suf.ring.bits() {
                return cap();
            }
            let mut t = 0;
            while t < out.len {
                let term = &out.terms[t];
                if term.len > MAX_FACTORS {
                    return cap();
                }
                let mut f = 0;
                while f < term.len {
                    if let Err(e) = self.add_factor(c, phi, term.factors[f]) {
                        return Err(e);
                    }
                    f += 1;
                }
                t += 1;
            }
            o += 1;
        }
        // Contributions: every combination of factor entries.
        let mut o = 0;
        while o < phi.count {
            let out = &phi.outputs[o];
            let mut t = 0;
            while t < out.len {
                if let Err(e) = self.add_term(c, phi, o, t) {
                    return Err(e);
                }
                t += 1;
            }
            o += 1;
        }
        if let Err(e) = self.add_beaver_rhos(c) {
            return Err(e);
        }
        self.index_tables(c);
        Ok(())
    }

    /// Every field at its empty value.
    const fn reset(&mut self) {
        self.b2a = [0; MAX_B2A];
        self.b2a_count = 0;
        self.boundary_b2a = [u8::MAX; crate::suf::MAX_INTERVALS];
        self.beaver = [(0, 0); MAX_BEAVER];
        self.beaver_count = 0;
        self.monos = [Mono::ONE; MAX_MONOS];
        self.mono_count = 1;
        self.contribs = [Contrib::NONE; MAX_CONTRIB];
        self.contrib_count = 0;
        self.coef_terms = [[(0, 0); crate::suf::MAX_INTERVALS]; MAX_ARITH * (MAX_DEGREE + 1)];
        self.coef_len = [0; MAX_ARITH * (MAX_DEGREE + 1)];
        self.coef_public = [true; MAX_ARITH * (MAX_DEGREE + 1)];
        self.coef_base = [0; MAX_ARITH * (MAX_DEGREE + 1)];
        self.mono_source = [MonoSource::One; MAX_MONOS];
        self.rho_mono = [u8::MAX; MAX_B2A];
    }

    /// Checks one factor of a term and registers what it needs: a Poly
    /// factor's non-public coefficients' boundary bits, a Bool's or a
    /// Wrap's bit conversion.
    const fn add_factor(
        &mut self,
        c: &Compiled,
        phi: &Phi,
        factor: Factor,
    ) -> Result<(), SufError> {
        match factor {
            Factor::Poly(j) => {
                if cast::usize_from_u8(j) >= c.suf.arith {
                    return Err(SufError::Program);
                }
                self.add_poly(c, phi, cast::usize_from_u8(j))
            }
            Factor::Bool(j) => {
                if cast::usize_from_u8(j) >= c.suf.bools {
                    return Err(SufError::Program);
                }
                match self.add_b2a(c.bool_node[cast::usize_from_u8(j)]) {
                    Ok(_) => Ok(()),
                    Err(e) => Err(e),
                }
            }
            Factor::Wrap(v) => match wrap_node(c, v) {
                Some(node) => match self.add_b2a(node) {
                    Ok(_) => Ok(()),
                    Err(e) => Err(e),
                },
                None => Err(SufError::Program),
            },
            Factor::Kappa(q) => {
                if cast::usize_from_u8(q) >= phi.kappa_count {
                    return Err(SufError::Program);
                }
                Ok(())
            }
            Factor::X(p) => {
                if p == 0 || cast::usize_from_u8(p) > MAX_DEGREE {
                    return Err(SufError::Degree);
                }
                Ok(())
            }
        }
    }

    /// Beaver openings need shares of each ρ_t they combine: a monomial
    /// for every boundary bit whose coefficient delta a Beaver pair reads.
    const fn add_beaver_rhos(&mut self, c: &Compiled) -> Result<(), SufError> {
        let mut l = 0;
        while l < self.beaver_count {
            let (j, i) = self.beaver[l];
            let mut tb = 1;
            while tb < c.suf.intervals {
                if c.coefficient_delta(cast::usize_from_u8(j), cast::usize_from_u8(i), tb) != 0 {
                    let b = self.boundary_b2a[tb];
                    if let Err(e) = self.mono_index(Mono {
                        r: 0,
                        a: 0,
                        kappa: 0,
                        rho: 1 << b,
                    }) {
                        return Err(e);
                    }
                }
                tb += 1;
            }
            l += 1;
        }
        Ok(())
    }

    /// Fills the lookup tables evaluation uses.
    const fn index_tables(&mut self, c: &Compiled) {
        let mut j = 0;
        while j < c.suf.arith {
            let mut i = 0;
            while i <= c.suf.degree {
                let row = j * (MAX_DEGREE + 1) + i;
                let mut n = 0;
                let mut t = 1;
                while t < c.suf.intervals {
                    let d = c.coefficient_delta(j, i, t);
                    if d != 0 && self.boundary_b2a[t] != u8::MAX {
                        self.coef_terms[row][n] = (self.boundary_b2a[t], d);
                        n += 1;
                    }
                    t += 1;
                }
                self.coef_len[row] = cast::u8_from_index(n);
                self.coef_public[row] = c.coefficient_is_public(j, i);
                self.coef_base[row] = c.coefficient_base(j, i);
                i += 1;
            }
            j += 1;
        }
        let mut dealt = 0;
        let mut m = 0;
        while m < self.mono_count {
            let mono = self.monos[m];
            self.mono_source[m] = if mono.eq(Mono::ONE) {
                MonoSource::One
            } else if mono.is_seeded() && mono.r == 1 {
                MonoSource::Mask
            } else if mono.is_seeded() {
                MonoSource::Beaver(cast::u8_from_index(cast::usize_from_u32(
                    mono.a.trailing_zeros(),
                )))
            } else {
                dealt += 1;
                MonoSource::Dealt(cast::u8_from_index(dealt - 1))
            };
            if mono.r == 0 && mono.a == 0 && mono.kappa == 0 && mono.rho.count_ones() == 1 {
                self.rho_mono[cast::usize_from_u32(mono.rho.trailing_zeros())] =
                    cast::u8_from_index(m);
            }
            m += 1;
        }
    }

    const fn add_b2a(&mut self, node: u8) -> Result<u8, SufError> {
        let mut i = 0;
        while i < self.b2a_count {
            if self.b2a[i] == node {
                return Ok(cast::u8_from_index(i));
            }
            i += 1;
        }
        if self.b2a_count >= MAX_B2A {
            return cap();
        }
        self.b2a[self.b2a_count] = node;
        self.b2a_count += 1;
        Ok(cast::u8_from_index(self.b2a_count - 1))
    }

    const fn add_poly(&mut self, c: &Compiled, phi: &Phi, j: usize) -> Result<(), SufError> {
        let mut i = 0;
        while i <= c.suf.degree {
            if !c.coefficient_is_public(j, i) {
                let mut t = 1;
                while t < c.suf.intervals {
                    if c.coefficient_delta(j, i, t) != 0 && self.boundary_b2a[t] == u8::MAX {
                        match self.add_b2a(c.boundary[t]) {
                            Ok(b) => self.boundary_b2a[t] = b,
                            Err(e) => return Err(e),
                        }
                    }
                    t += 1;
                }
                if i >= 1
                    && matches!(phi.mode, PolyMode::Beaver)
                    && self.beaver_index(j, i) == u8::MAX
                {
                    if self.beaver_count >= MAX_BEAVER {
                        return cap();
                    }
                    self.beaver[self.beaver_count] =
                        (cast::u8_from_index(j), cast::u8_from_index(i));
                    self.beaver_count += 1;
                }
            }
            i += 1;
        }
        Ok(())
    }

    /// Index of the Beaver opening of coefficient `(j, i)`, or `u8::MAX`.
    pub const fn beaver_index(&self, j: usize, i: usize) -> u8 {
        let mut l = 0;
        while l < self.beaver_count {
            if cast::usize_from_u8(self.beaver[l].0) == j
                && cast::usize_from_u8(self.beaver[l].1) == i
            {
                return cast::u8_from_index(l);
            }
            l += 1;
        }
        u8::MAX
    }

    const fn mono_index(&mut self, m: Mono) -> Result<u8, SufError> {
        let mut i = 0;
        while i < self.mono_count {
            if self.monos[i].eq(m) {
                return Ok(cast::u8_from_index(i));
            }
            i += 1;
        }
        if self.mono_count >= MAX_MONOS {
            return cap();
        }
        self.monos[self.mono_count] = m;
        self.mono_count += 1;
        Ok(cast::u8_from_index(self.mono_count - 1))
    }

    /// Adds the contributions of term `t` of output `o`.
    const fn add_term(
        &mut self,
        c: &Compiled,
        phi: &Phi,
        o: usize,
        t: usize,
    ) -> Result<(), SufError> {
        let term = &phi.outputs[o].terms[t];
        let mut counts = [1usize; MAX_FACTORS];
        let mut f = 0;
        while f < term.len {
            counts[f] = self.entry_count(c, term.factors[f]);
            f += 1;
        }
        let mut idx = [0usize; MAX_FACTORS];
        loop {
            let mono = match self.combination_mono(c, phi, term, &idx) {
                Ok(m) => m,
                Err(e) => return Err(e),
            };
            let mi = match self.mono_index(mono) {
                Ok(i) => i,
                Err(e) => return Err(e),
            };
            if let Err(e) = self.push_contrib((o, t), &idx, mi) {
                return Err(e);
            }
            // Next combination, odometer order.
            let mut f = 0;
            loop {
                if f == term.len {
                    return Ok(());
                }
                idx[f] += 1;
                if idx[f] < counts[f] {
                    break;
                }
                idx[f] = 0;
                f += 1;
            }
        }
    }

    /// The monomial of one combination `idx` of a term's factors' entries:
    /// the product of each entry's monomial (an error past the degree).
    const fn combination_mono(
        &self,
        c: &Compiled,
        phi: &Phi,
        term: &Term,
        idx: &[usize; MAX_FACTORS],
    ) -> Result<Mono, SufError> {
        let mut mono = Mono::ONE;
        let mut f = 0;
        while f < term.len {
            match mono.times(self.entry_mono(c, phi, term.factors[f], idx[f])) {
                Some(m) => mono = m,
                None => return Err(SufError::Program),
            }
            f += 1;
        }
        Ok(mono)
    }

    /// Records that combination `idx` of term `t` of output `o` adds to
    /// monomial `mono`.
    const fn push_contrib(
        &mut self,
        (o, t): (usize, usize),
        idx: &[usize; MAX_FACTORS],
        mono: u8,
    ) -> Result<(), SufError> {
        if self.contrib_count >= MAX_CONTRIB {
            return cap();
        }
        let mut entries = [0u16; MAX_FACTORS];
        let mut f = 0;
        while f < MAX_FACTORS {
            entries[f] = cast::u16_from_index(idx[f]);
            f += 1;
        }
        self.contribs[self.contrib_count] = Contrib {
            output: cast::u8_from_index(o),
            term: cast::u8_from_index(t),
            entries,
            mono,
        };
        self.contrib_count += 1;
        Ok(())
    }

    /// How many expansion entries a factor has (a public fact).
    pub const fn entry_count(&self, c: &Compiled, factor: Factor) -> usize {
        match factor {
            Factor::X(p) => cast::usize_from_u8(p) + 1,
            Factor::Bool(_) | Factor::Wrap(_) => 2,
            Factor::Kappa(_) => 1,
            Factor::Poly(j) => {
                let mut n = 0;
                let mut i = 0;
                while i <= c.suf.degree {
                    n += self.coefficient_entries(c, cast::usize_from_u8(j), i) * (i + 1);
                    i += 1;
                }
                n
            }
        }
    }

    /// Entries of coefficient `(j, i)` before multiplying by x^i.
    pub(crate) const fn coefficient_entries(&self, c: &Compiled, j: usize, i: usize) -> usize {
        if c.coefficient_is_public(j, i) {
            1
        } else if i >= 1 && self.beaver_index(j, i) != u8::MAX {
            2
        } else {
            1 + self.boundary_terms(c, j, i)
        }
    }

    /// Boundaries whose delta for coefficient `(j, i)` is non-zero.
    const fn boundary_terms(&self, c: &Compiled, j: usize, i: usize) -> usize {
        let mut n = 0;
        let mut t = 1;
        while t < c.suf.intervals {
            if c.coefficient_delta(j, i, t) != 0 {
                n += 1;
            }
            t += 1;
        }
        n
    }

    /// The monomial of a factor's `e`-th entry.
    const fn entry_mono(&self, c: &Compiled, phi: &Phi, factor: Factor, e: usize) -> Mono {
        match factor {
            Factor::X(_) => Mono {
                r: cast::u8_from_index(e),
                a: 0,
                kappa: 0,
                rho: 0,
            },
            Factor::Bool(j) => self.bit_mono(c.bool_node[cast::usize_from_u8(j)], e),
            Factor::Wrap(v) => match wrap_node(c, v) {
                Some(n) => self.bit_mono(n, e),
                None => Mono::ONE,
            },
            Factor::Kappa(q) => Mono {
                r: 0,
                a: 0,
                kappa: 1 << q,
                rho: 0,
            },
            Factor::Poly(j) => {
                let _ = phi;
                let j = cast::usize_from_u8(j);
                let mut e = e;
                let mut i = 0;
                while i <= c.suf.degree {
                    let per = self.coefficient_entries(c, j, i);
                    let here = per * (i + 1);
                    if e < here {
                        let ce = e / (i + 1);
                        let rp = cast::u8_from_index(e % (i + 1));
                        return match self.coefficient_mono(c, j, i, ce).times(Mono {
                            r: rp,
                            a: 0,
                            kappa: 0,
                            rho: 0,
                        }) {
                            Some(m) => m,
                            None => Mono::ONE,
                        };
                    }
                    e -= here;
                    i += 1;
                }
                Mono::ONE
            }
        }
    }

    /// The monomial of entry `ce` of coefficient `(j, i)`.
    const fn coefficient_mono(&self, c: &Compiled, j: usize, i: usize, ce: usize) -> Mono {
        if ce == 0 || c.coefficient_is_public(j, i) {
            return Mono::ONE;
        }
        let l = self.beaver_index(j, i);
        if i >= 1 && l != u8::MAX {
            return Mono {
                r: 0,
                a: 1 << l,
                kappa: 0,
                rho: 0,
            };
        }
        // ce-th non-zero boundary delta.
        let mut k = 0;
        let mut t = 1;
        while t < c.suf.intervals {
            if c.coefficient_delta(j, i, t) != 0 {
                k += 1;
                if k == ce {
                    return Mono {
                        r: 0,
                        a: 0,
                        kappa: 0,
                        rho: 1 << self.boundary_b2a[t],
                    };
                }
            }
            t += 1;
        }
        Mono::ONE
    }

    const fn bit_mono(&self, node: u8, e: usize) -> Mono {
        if e == 0 {
            return Mono::ONE;
        }
        let mut b = 0;
        while b < self.b2a_count {
            if self.b2a[b] == node {
                return Mono {
                    r: 0,
                    a: 0,
                    kappa: 0,
                    rho: 1 << b,
                };
            }
            b += 1;
        }
        Mono::ONE
    }

    /// Monomials P1 must receive explicitly (the rest are seeded).
    pub const fn explicit_monos(&self) -> usize {
        let mut n = 0;
        let mut i = 0;
        while i < self.mono_count {
            if !self.monos[i].is_seeded() {
                n += 1;
            }
            i += 1;
        }
        n
    }

    /// Index of the B2A conversion of `node`, if any.
    pub const fn b2a_of(&self, node: u8) -> Option<usize> {
        let mut b = 0;
        while b < self.b2a_count {
            if self.b2a[b] == node {
                return Some(b);
            }
            b += 1;
        }
        None
    }
}

/// The circuit node holding a view's wrap bit.
pub const fn wrap_node(c: &Compiled, v: View) -> Option<u8> {
    let mut i = 0;
    while i < c.node_count {
        if let Node::Wrap(x) = c.nodes[i] {
            let view = c.views[cast::usize_from_u8(x)];
            if view.width.bits() == v.width.bits() && view.add == v.width.reduce(v.add) {
                return Some(cast::u8_from_index(i));
            }
        }
        i += 1;
    }
    None
}

/// Per-element public inputs of the expansion.
pub struct Publics<'a> {
    /// The ring of the gate.
    pub ring: Width,
    /// The masked input.
    pub x_hat: u64,
    /// Opened B2A values `e_b` (bit b of the word array, one word per b).
    pub e: &'a [u64],
    /// Opened Beaver values `u_l`.
    pub u: &'a [u64],
    /// `x̂^i` for `0 ≤ i ≤ MAX_DEGREE`.
    pub x_pow: [u64; MAX_DEGREE + 1],
}

impl<'a> Publics<'a> {
    /// The public inputs of one element.
    pub fn new(ring: Width, x_hat: u64, e: &'a [u64], u: &'a [u64]) -> Publics<'a> {
        let mut x_pow = [1u64; MAX_DEGREE + 1];
        for i in 1..=MAX_DEGREE {
            x_pow[i] = ring.mul(x_pow[i - 1], x_hat);
        }
        Publics {
            ring,
            x_hat,
            e,
            u,
            x_pow,
        }
    }
}

impl Plan {
    /// Fills the public coefficients of a factor's entries.
    pub fn entries(&self, c: &Compiled, factor: Factor, p: &Publics<'_>, out: &mut [u64]) -> usize {
        let w = p.ring;
        match factor {
            Factor::X(pow) => {
                let pow = usize::from(pow);
                for (j, o) in out.iter_mut().enumerate().take(pow + 1) {
                    // C(p, j) x̂^{p−j} (−1)^j
                    let v = w.mul(binomial(pow, j), p.x_pow[pow - j]);
                    *o = if j % 2 == 1 { w.neg(v) } else { v };
                }
                pow + 1
            }
            Factor::Bool(j) => self.bit_entries(w, c.bool_node[usize::from(j)], p, out),
            Factor::Wrap(v) => match wrap_node(c, v) {
                Some(node) => self.bit_entries(w, node, p, out),
                None => 0,
            },
            Factor::Kappa(_) => {
                out[0] = 1;
                1
            }
            Factor::Poly(j) => {
                let j = usize::from(j);
                let mut n = 0;
                for i in 0..=c.suf.degree {
                    // Coefficient entries, then each times x^i's entries,
                    // expanded in place from the back so nothing unread is
                    // overwritten.
                    let ce = self.coefficient_public(j, i, p, &mut out[n..]);
                    let mut xe = [1u64; MAX_DEGREE + 1];
                    if i > 0 {
                        self.entries(c, Factor::X(cast::u8_from_index(i)), p, &mut xe);
                    }
                    for cidx in (0..ce).rev() {
                        let v = out[n + cidx];
                        for jx in (0..=i).rev() {
                            out[n + cidx * (i + 1) + jx] = w.mul(v, xe[jx]);
                        }
                    }
                    n += ce * (i + 1);
                }
                n
            }
        }
    }

    fn bit_entries(&self, w: Width, node: u8, p: &Publics<'_>, out: &mut [u64]) -> usize {
        let e = self.b2a_of(node).map_or(0, |b| p.e[b] & 1);
        out[0] = e;
        out[1] = w.sub(1, w.mul(2, e));
        2
    }

    /// Public coefficients of coefficient `(j, i)`'s entries.
    fn coefficient_public(&self, j: usize, i: usize, p: &Publics<'_>, out: &mut [u64]) -> usize {
        let w = p.ring;
        let row = j * (MAX_DEGREE + 1) + i;
        if self.coef_public[row] {
            out[0] = self.coef_base[row];
            return 1;
        }
        let l = self.beaver_index(j, i);
        if i >= 1 && l != u8::MAX {
            out[0] = p.u[usize::from(l)];
            out[1] = 1;
            return 2;
        }
        let mut base = self.coef_base[row];
        let terms = &self.coef_terms[row][..usize::from(self.coef_len[row])];
        for (slot, &(b, d)) in out[1..].iter_mut().zip(terms) {
            let e = p.e[usize::from(b)] & 1;
            base = w.add(base, w.mul(d, e));
            *slot = w.mul(d, w.sub(1, w.mul(2, e)));
        }
        out[0] = base;
        1 + terms.len()
    }
}

/// `C(n, k)` for `n ≤ MAX_DEGREE`.
pub(crate) const fn binomial(n: usize, k: usize) -> u64 {
    const TABLE: [[u64; 4]; 4] = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 2, 1, 0], [1, 3, 3, 1]];
    TABLE[n][k]
}
