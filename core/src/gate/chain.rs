//! Sequential composition: a scalar gate built from SUF gates (two-round,
//! or one-round on ring-output keys), one-round truncations and Beaver
//! multiplications, each step's input an affine
//! combination of the chain input and earlier outputs. Reciprocal and rsqrt
//! are chains: range reduction (a SUF), a truncation, a mantissa spline, a
//! product, a truncation.
//!
//! A chain is itself a sans-IO state machine over caller buffers: its
//! rounds are its steps' rounds in order, and its key material is each
//! step's, with step seeds derived from the party's seed.

use crate::batch::BatchEval;
use crate::compile::MAX_KEYS;
use crate::error::{Error, SufError};
use crate::fss::Params;
use crate::fss::Party;
use crate::gate::ring_lut::RingLut;
use crate::gate::ring_suf::RingSuf;
use crate::gate::ring_trunc::RingTrunc;
use crate::gate::{DealScratch, Eval, Gate, PartyKeys, Protocol, SingleKey};
use crate::mpc;
use crate::prg::{Block, Domain, Hasher};
use crate::ring::{Width, cast};

/// Most steps in a chain.
pub const MAX_STEPS: usize = 5;
/// Most terms in a step's input.
pub const MAX_LIN: usize = 2;

/// A value a step can read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// The chain's input.
    Input,
    /// Ring output `index` of step `step`.
    Output {
        /// The step.
        step: u8,
        /// The output index.
        index: u8,
    },
}

/// `Σ coeff·source + constant`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lin {
    /// The terms; only the first `len` are used.
    pub terms: [(Source, u64); MAX_LIN],
    /// How many terms.
    pub len: usize,
    /// A public constant (added by P0).
    pub constant: u64,
}

impl Lin {
    /// One source, unscaled.
    pub const fn of(s: Source) -> Lin {
        Lin {
            terms: [(s, 1), (Source::Input, 0)],
            len: 1,
            constant: 0,
        }
    }
}

/// One step of a chain.
#[derive(Debug, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)] // a handful per chain, built once; 3 KB each
pub enum Step {
    /// A SUF gate (which opens its input) on an affine input. The gate is
    /// held by reference: a [`Gate`] is 35 KB, and a chain holds
    /// [`MAX_STEPS`] steps, so inline it made every chain 176 KB (the
    /// plans are built on 2 MiB threads); the one-round steps are 3 KB.
    Gate {
        /// The gate.
        gate: &'static Gate,
        /// Its input.
        input: Lin,
    },
    /// A one-round piecewise polynomial ([`RingSuf`]) on an affine input;
    /// a scaled gate's outputs are multiplied by `factor`, opened in the
    /// same round ([`RingSuf::scaled`]).
    Suf {
        /// The gate.
        gate: RingSuf,
        /// Its input.
        input: Lin,
        /// The factor, for a scaled gate (and only for one).
        factor: Option<Lin>,
    },
    /// A one-round truncation ([`RingTrunc`]) of an affine input.
    Trunc {
        /// The truncation.
        gate: RingTrunc,
        /// Its input.
        input: Lin,
    },
    /// A one-round table lookup ([`RingLut`]) at an affine index.
    Lut {
        /// The lookup.
        gate: RingLut,
        /// Its index.
        input: Lin,
    },
    /// A Beaver product of two affine values (one round).
    Mul {
        /// First factor.
        a: Lin,
        /// Second factor.
        b: Lin,
    },
}

/// A chain of steps over one ring.
#[derive(Debug, PartialEq, Eq)]
pub struct Chain {
    /// The ring of every value.
    pub ring: Width,
    /// The steps; only the first `count` are used.
    pub steps: [Step; MAX_STEPS],
    /// How many steps.
    pub count: usize,
    /// The chain's output.
    pub output: Source,
}

// Plans hold and build chains on 2 MiB threads (a test profile's, the
// gateway's and the pool's): a chain stays a few pages.
const _: () = assert!(core::mem::size_of::<Chain>() <= 16 * 1024);

impl Chain {
    /// An empty chain.
    pub const fn new(ring: Width) -> Chain {
        // A `const` repeats without `Step: Copy`.
        const UNUSED: Step = Step::Mul {
            a: Lin::of(Source::Input),
            b: Lin::of(Source::Input),
        };
        Chain {
            ring,
            steps: [UNUSED; MAX_STEPS],
            count: 0,
            output: Source::Input,
        }
    }

    /// Appends a step; its outputs are `Source::Output { step: count, .. }`.
    pub const fn then(mut self, step: Step) -> Chain {
        if self.count < MAX_STEPS {
            self.steps[self.count] = step;
        }
        self.count += 1;
        self
    }

    /// Appends `step` if there is one.
    pub const fn then_some(self, step: Option<Step>) -> Chain {
        match step {
            Some(s) => self.then(s),
            None => self,
        }
    }

    /// Sets the chain's output.
    pub const fn output(mut self, s: Source) -> Chain {
        self.output = s;
        self
    }

    /// Checks capacities and references.
    pub const fn validate(&self) -> Result<(), SufError> {
        if self.count == 0 || self.count > MAX_STEPS {
            return Err(SufError::Capacity);
        }
        if !self.source_ok(self.output, self.count) {
            return Err(SufError::Program);
        }
        let mut s = 0;
        while s < self.count {
            let ok = match &self.steps[s] {
                Step::Gate { gate, input } => {
                    gate.ring().bits() == self.ring.bits()
                        && matches!(gate.input, crate::gate::Input::Shares)
                        && self.lin_ok(input, s)
                }
                Step::Trunc { gate, input } => {
                    gate.ring().bits() == self.ring.bits() && self.lin_ok(input, s)
                }
                Step::Suf {
                    gate,
                    input,
                    factor,
                } => {
                    gate.ring().bits() == self.ring.bits()
                        && self.lin_ok(input, s)
                        && match factor {
                            Some(f) => gate.is_scaled() && self.lin_ok(f, s),
                            None => !gate.is_scaled(),
                        }
                }
                Step::Lut { gate, input } => {
                    gate.ring().bits() == self.ring.bits() && self.lin_ok(input, s)
                }
                Step::Mul { a, b } => self.lin_ok(a, s) && self.lin_ok(b, s),
            };
            if !ok {
                return Err(SufError::Program);
            }
            s += 1;
        }
        Ok(())
    }

    const fn lin_ok(&self, l: &Lin, before: usize) -> bool {
        if l.len > MAX_LIN {
            return false;
        }
        let mut i = 0;
        while i < l.len {
            if !self.source_ok(l.terms[i].0, before) {
                return false;
            }
            i += 1;
        }
        true
    }

    const fn source_ok(&self, s: Source, before: usize) -> bool {
        match s {
            Source::Input => true,
            Source::Output { step, index } => {
                let step = cast::usize_from_u8(step);
                step < before
                    && cast::usize_from_u8(index)
                        < match &self.steps[step] {
                            Step::Gate { gate, .. } => gate.outputs(),
                            Step::Suf { gate, .. } => gate.outputs(),
                            Step::Trunc { .. } | Step::Lut { .. } | Step::Mul { .. } => 1,
                        }
            }
        }
    }

    /// Ring outputs of step `s`.
    const fn outs(&self, s: usize) -> usize {
        match &self.steps[s] {
            Step::Gate { gate, .. } => gate.outputs(),
            Step::Suf { gate, .. } => gate.outputs(),
            Step::Trunc { .. } | Step::Lut { .. } | Step::Mul { .. } => 1,
        }
    }

    /// Rounds of step `s`.
    pub const fn step_rounds(&self, s: usize) -> usize {
        match &self.steps[s] {
            Step::Gate { gate, .. } => gate.schedule().1,
            Step::Suf { .. } | Step::Trunc { .. } | Step::Lut { .. } | Step::Mul { .. } => 1,
        }
    }

    /// Total rounds.
    pub const fn rounds(&self) -> usize {
        let mut r = 0;
        let mut s = 0;
        while s < self.count {
            r += self.step_rounds(s);
            s += 1;
        }
        r
    }

    /// Per-element costs summed over the steps.
    pub const fn cost(&self) -> crate::gate::Cost {
        let mut c = crate::gate::Cost {
            rounds: 0,
            comm_bits: 0,
            key_bytes_p0: 0,
            key_bytes_p1: 0,
            aes_online: 0,
            dcf_points: 0,
        };
        let mut s = 0;
        while s < self.count {
            let step = match &self.steps[s] {
                Step::Gate { gate, .. } => Some(gate.cost()),
                Step::Trunc { gate, .. } => Some(gate.cost()),
                Step::Suf { gate, .. } => Some(gate.cost()),
                Step::Lut { gate, .. } => Some(gate.cost()),
                Step::Mul { .. } => None,
            };
            match step {
                Some(g) => {
                    c.rounds += g.rounds;
                    c.comm_bits += g.comm_bits;
                    c.key_bytes_p0 += g.key_bytes_p0;
                    c.key_bytes_p1 += g.key_bytes_p1;
                    c.aes_online += g.aes_online;
                    c.dcf_points += g.dcf_points;
                }
                None => {
                    c.rounds += 1;
                    c.comm_bits += 2 * cast::usize_from_u32(self.ring.bits());
                    c.key_bytes_p1 += mpc::words_len(self.ring, 1);
                    c.aes_online += 1;
                }
            }
            s += 1;
        }
        c
    }

    /// Explicit words P1 holds per element for step `s`.
    pub const fn explicit_words(&self, s: usize) -> usize {
        match &self.steps[s] {
            Step::Gate { gate, .. } => gate.explicit_words(),
            Step::Trunc { gate, .. } => gate.explicit_words(),
            Step::Suf { gate, .. } => gate.explicit_words(),
            Step::Lut { gate, .. } => gate.explicit_words(),
            Step::Mul { .. } => 1,
        }
    }

    /// Fresh dealer words step `s` needs per element ([`Chain::deal_step`]'s
    /// `random`).
    pub const fn random_words(&self, s: usize) -> usize {
        match &self.steps[s] {
            Step::Trunc { gate, .. } => gate.random_words(),
            Step::Suf { gate, .. } => gate.random_words(),
            Step::Lut { gate, .. } => gate.random_words(),
            Step::Gate { .. } | Step::Mul { .. } => 0,
        }
    }

    /// The parameters of step `s`'s key slot `k`, if it has one.
    pub const fn key_params(&self, s: usize, k: usize) -> Option<Params> {
        match &self.steps[s] {
            Step::Gate { gate, .. } if k < gate.compiled.key_count => Some(gate.key_params(k)),
            Step::Trunc { gate, .. } if k == 0 => Some(gate.key_params()),
            Step::Suf { gate, .. } if k < gate.key_count() => Some(gate.key_params()),
            Step::Lut { gate, .. } if k == 0 => Some(gate.key_params()),
            _ => None,
        }
    }

    /// Words of step `s`'s public table: a lookup's
    /// ([`RingLut::fill_table`]), which [`ChainEval::with_tables`] takes;
    /// 0 for other steps.
    pub const fn table_words(&self, s: usize) -> usize {
        match &self.steps[s] {
            Step::Lut { gate, .. } => gate.table_words(),
            _ => 0,
        }
    }

    /// Writes step `s`'s table ([`Chain::table_words`] words).
    fn fill_table(&self, s: usize, table: &mut [u64]) -> Result<(), Error> {
        match &self.steps[s] {
            Step::Lut { gate, .. } => gate.fill_table(table),
            _ if table.is_empty() => Ok(()),
            _ => Err(Error::BufferLength),
        }
    }

    /// Words of every step's table together ([`Chain::fill_tables`]).
    pub const fn tables_words(&self) -> usize {
        let mut w = 0;
        let mut s = 0;
        while s < self.count {
            w += self.table_words(s);
            s += 1;
        }
        w
    }

    /// Writes every step's table into `store` ([`Chain::tables_words`]
    /// words) and returns each step's, as [`ChainEval::with_tables`] takes
    /// them (empty for steps without one).
    pub fn fill_tables<'t>(&self, store: &'t mut [u64]) -> Result<[&'t [u64]; MAX_STEPS], Error> {
        if store.len() != self.tables_words() {
            return Err(Error::BufferLength);
        }
        let mut tables: [&[u64]; MAX_STEPS] = [&[]; MAX_STEPS];
        let mut rest = store;
        for (s, t) in tables.iter_mut().enumerate().take(self.count) {
            let (mine, tail) = core::mem::take(&mut rest).split_at_mut(self.table_words(s));
            self.fill_table(s, mine)?;
            *t = mine;
            rest = tail;
        }
        Ok(tables)
    }

    /// Scratch words an evaluator needs for `n` elements: the values area,
    /// then the step area.
    pub const fn scratch_words(&self, n: usize) -> usize {
        let mut step = 0;
        let mut s = 0;
        while s < self.count {
            let w = match &self.steps[s] {
                Step::Gate { gate, .. } => gate.scratch_words(n),
                Step::Trunc { .. } => RingTrunc::scratch_words(n),
                Step::Suf { gate, .. } => gate.scratch_words(n),
                Step::Lut { gate, .. } => gate.scratch_words(n),
                Step::Mul { .. } => 5 * n,
            };
            if w > step {
                step = w;
            }
            s += 1;
        }
        self.values_words(n) + step
    }

    /// The values area: the input, every step's outputs and a step-input
    /// area (two values per element: a scaled SUF's input and factor), `n`
    /// words each.
    const fn values_words(&self, n: usize) -> usize {
        let mut values = 1;
        let mut s = 0;
        while s < self.count {
            values += self.outs(s);
            s += 1;
        }
        n * values + 2 * n
    }

    /// Bytes sent in chain round `i` for `n` elements.
    pub const fn round_bytes(&self, i: usize, n: usize) -> usize {
        let (s, j) = self.locate(i);
        match &self.steps[s] {
            Step::Gate { gate, .. } => gate.round_bytes(gate.schedule().0[j], n),
            Step::Suf { gate, .. } => mpc::words_len(self.ring, gate.inputs() * n),
            Step::Trunc { .. } | Step::Lut { .. } => mpc::words_len(self.ring, n),
            Step::Mul { .. } => mpc::words_len(self.ring, 2 * n),
        }
    }

    /// The step and the round within it of chain round `i`.
    pub const fn locate(&self, i: usize) -> (usize, usize) {
        let mut i = i;
        let mut s = 0;
        while s < self.count {
            let r = self.step_rounds(s);
            if i < r {
                return (s, i);
            }
            i -= r;
            s += 1;
        }
        (self.count, 0)
    }

    /// The chain's cleartext value at `x`: each step's reference in order.
    pub fn reference(&self, x: u64) -> u64 {
        let w = self.ring;
        let mut values = [[0u64; crate::phi::MAX_OUTPUTS]; MAX_STEPS];
        let read = |values: &[[u64; crate::phi::MAX_OUTPUTS]; MAX_STEPS], src: Source| match src {
            Source::Input => w.reduce(x),
            Source::Output { step, index } => values[usize::from(step)][usize::from(index)],
        };
        let lin = |values: &[[u64; crate::phi::MAX_OUTPUTS]; MAX_STEPS], l: &Lin| {
            let mut v = l.constant;
            for &(src, c) in &l.terms[..l.len] {
                v = w.add(v, w.mul(c, read(values, src)));
            }
            v
        };
        for s in 0..self.count {
            match &self.steps[s] {
                Step::Gate { gate, input } => {
                    let v = lin(&values, input);
                    let mut out = [0u64; crate::phi::MAX_OUTPUTS];
                    gate.reference(v, &mut out);
                    values[s] = out;
                }
                Step::Trunc { gate, input } => {
                    values[s][0] = gate.reference(lin(&values, input));
                }
                Step::Suf {
                    gate,
                    input,
                    factor,
                } => {
                    let x = lin(&values, input);
                    match factor {
                        Some(f) => gate.reference_scaled(x, lin(&values, f), &mut values[s]),
                        None => gate.reference(x, &mut values[s]),
                    }
                }
                Step::Lut { gate, input } => {
                    values[s][0] = gate.reference(lin(&values, input));
                }
                Step::Mul { a, b } => {
                    values[s][0] = w.mul(lin(&values, a), lin(&values, b));
                }
            }
        }
        read(&values, self.output)
    }

    /// [`DealScratch`] blocks [`Chain::deal_step`] wants for `count`
    /// elements in groups of `group`: the most any gate step asks for (see
    /// [`Gate::deal_scratch_blocks`]).
    pub const fn deal_scratch_blocks(&self, count: usize, group: usize) -> usize {
        let mut most = 0;
        let mut s = 0;
        while s < self.count {
            if let Step::Gate { gate, .. } = &self.steps[s] {
                let b = gate.deal_scratch_blocks(count, group);
                if b > most {
                    most = b;
                }
            }
            s += 1;
        }
        most
    }

    /// Deals step `s` for `count` elements from element `first`; `scratch`
    /// is a gate step's ([`Gate::deal`]), `random` holds
    /// [`Chain::random_words`] fresh dealer words per element (a one-round
    /// truncation's key draws them; never a party's seed).
    #[allow(clippy::too_many_arguments)]
    pub fn deal_step(
        &self,
        s: usize,
        fss: &dyn BatchEval,
        seeds: [[u8; 16]; 2],
        first: u64,
        count: usize,
        dcf0: &mut [&mut [u8]; MAX_KEYS],
        dcf1: &mut [&mut [u8]; MAX_KEYS],
        explicit: &mut [u64],
        random: &[u64],
        scratch: &mut DealScratch<'_>,
    ) -> Result<u64, Error> {
        let h: &dyn Hasher = fss;
        let step_seeds = [step_seed(h, &seeds[0], s), step_seed(h, &seeds[1], s)];
        match &self.steps[s] {
            Step::Gate { gate, .. } => gate.deal(
                fss, step_seeds, None, first, count, dcf0, dcf1, explicit, scratch,
            ),
            Step::Trunc { gate, .. } => {
                let [k0, ..] = dcf0;
                let [k1, ..] = dcf1;
                gate.deal(
                    fss, step_seeds, None, random, first, count, k0, k1, explicit,
                )
            }
            Step::Suf { gate, .. } => gate.deal(
                fss,
                step_seeds,
                None,
                random,
                (first, count),
                dcf0,
                dcf1,
                explicit,
            ),
            Step::Lut { gate, .. } => {
                let [k0, ..] = dcf0;
                let [k1, ..] = dcf1;
                if !explicit.is_empty() {
                    return Err(Error::BufferLength);
                }
                gate.deal(fss, step_seeds, None, first, count, k0, k1)
            }
            Step::Mul { .. } => self.deal_mul(h, &step_seeds, (first, count), explicit),
        }
    }

    /// A Beaver step's material: P1's explicit `c = a·b − c₀` per element,
    /// `a`, `b` and `c₀` expanded from both step seeds in runs of 64.
    fn deal_mul(
        &self,
        h: &dyn Hasher,
        step_seeds: &[[u8; 16]; 2],
        (first, count): (u64, usize),
        explicit: &mut [u64],
    ) -> Result<u64, Error> {
        if explicit.len() != count {
            return Err(Error::BufferLength);
        }
        let w = self.ring;
        let mut calls = 0;
        let mut t0 = [0u64; 4 * 64];
        let mut t1 = [0u64; 4 * 64];
        let mut done = 0;
        while done < count {
            let n = 64.min(count - done);
            let at = first + cast::u64_from_usize(done);
            calls += triple_words(h, &step_seeds[0], at, n, &mut t0);
            calls += triple_words(h, &step_seeds[1], at, n, &mut t1);
            for e in 0..n {
                let a = w.add(t0[4 * e], t1[4 * e]);
                let b = w.add(t0[4 * e + 1], t1[4 * e + 1]);
                explicit[done + e] = w.sub(w.mul(a, b), w.reduce(t0[4 * e + 2]));
            }
            done += n;
        }
        Ok(calls)
    }
}

/// The seed of step `s` derived from a party's chain seed.
pub fn step_seed(h: &dyn Hasher, seed: &[u8; 16], s: usize) -> [u8; 16] {
    // A tag no gate's (element, slot) index reaches: all-ones high word.
    let tag = (u128::from(u64::MAX) << 64) | cast::u128_from_u64(cast::u64_from_usize(s));
    let mut b = [Block::from_bytes(*seed) ^ Block::from_bytes(tag.to_le_bytes())];
    h.hash_many(Domain::Prf, &mut b);
    b[0].to_bytes()
}

/// Beaver triple words of `n` elements: `a, b, c0, spare` per element.
fn triple_words(h: &dyn Hasher, seed: &[u8; 16], first: u64, n: usize, out: &mut [u64]) -> u64 {
    let s = Block::from_bytes(*seed);
    let mut blocks = [Block::ZERO; 2 * 64];
    for e in 0..n {
        for slot in 0..2u64 {
            let index = cast::u128_from_u64(first + cast::u64_from_usize(e))
                | (cast::u128_from_u64(slot) << 64);
            blocks[2 * e + cast::usize_from_small_u64(slot)] =
                s ^ Block::from_bytes(index.to_le_bytes());
        }
    }
    let calls = h.hash_many(Domain::Prf, &mut blocks[..2 * n]);
    for e in 0..n {
        out[4 * e] = blocks[2 * e].low64();
        out[4 * e + 1] = blocks[2 * e].high64();
        out[4 * e + 2] = blocks[2 * e + 1].low64();
        out[4 * e + 3] = blocks[2 * e + 1].high64();
    }
    calls
}

/// What a chain needs of a one-round step's opening ([`RingTrunc`],
/// [`RingSuf`]): its area, its loaded material and its message.
trait OneRound {
    /// Step-area words for `n` elements.
    fn area_words(&self, n: usize) -> usize;
    /// Loads this party's material (seeded, and P1's explicit words).
    fn load_step(
        &self,
        h: &dyn Hasher,
        party: Party,
        at: (&[u8; 16], u64),
        explicit: &[u64],
        area: &mut [u64],
    ) -> Result<u64, Error>;
    /// This party's share of the opening.
    fn open_step(&self, area: &mut [u64], x: &[u64], send: &mut [u8]) -> Result<(), Error>;
    /// The peer's message: evaluates the keys and writes this party's
    /// output shares (output-major) into `out`.
    fn finish_step(
        &self,
        party: Party,
        area: &mut [u64],
        recv: &[u8],
        with: (&PartyKeys<'_>, &dyn BatchEval, &[u64]),
        out: &mut [u64],
    ) -> Result<(), Error>;
}

/// The one-round gates load with no pinned mask and open alike; `$finish`
/// closes the round and writes the outputs.
macro_rules! one_round_step {
    ($gate:ty, |$g:ident, $n:ident| $words:expr, $finish:expr) => {
        impl OneRound for $gate {
            fn area_words(&self, $n: usize) -> usize {
                let $g = self;
                $words
            }

            fn load_step(
                &self,
                h: &dyn Hasher,
                party: Party,
                (seed, first): (&[u8; 16], u64),
                explicit: &[u64],
                area: &mut [u64],
            ) -> Result<u64, Error> {
                self.load(h, party, seed, None, first, explicit, area)
            }

            fn open_step(&self, area: &mut [u64], x: &[u64], send: &mut [u8]) -> Result<(), Error> {
                self.open(area, x, send)
            }

            fn finish_step(
                &self,
                party: Party,
                area: &mut [u64],
                recv: &[u8],
                with: (&PartyKeys<'_>, &dyn BatchEval, &[u64]),
                out: &mut [u64],
            ) -> Result<(), Error> {
                $finish(self, party, area, recv, with, out)
            }
        }
    };
}

type Finish<G> = fn(
    &G,
    Party,
    &mut [u64],
    &[u8],
    (&PartyKeys<'_>, &dyn BatchEval, &[u64]),
    &mut [u64],
) -> Result<(), Error>;

const TRUNC_FINISH: Finish<RingTrunc> = |g, party, area, recv, (keys, fss, _), out| {
    let keys = g.key_batch(party, keys)?;
    g.close(area, recv, &keys, fss)?;
    g.output(party, area, out)
};

const SUF_FINISH: Finish<RingSuf> = |g, party, area, recv, (keys, fss, _), out| {
    g.close(party, area, recv, keys, fss)?;
    g.output(area, out)
};

const LUT_FINISH: Finish<RingLut> = |g, party, area, recv, (keys, fss, table), out| {
    let keys = g.key_batch(party, keys)?;
    g.close(area, recv, (&keys, table), fss)?;
    g.output(area, out)
};

one_round_step!(RingTrunc, |_g, n| RingTrunc::scratch_words(n), TRUNC_FINISH);
one_round_step!(RingSuf, |g, n| g.scratch_words(n), SUF_FINISH);
one_round_step!(RingLut, |g, n| g.scratch_words(n), LUT_FINISH);

/// One party's evaluation of a chain, a [`Protocol`].
///
/// Scratch is split once: the values area (the input, every step's
/// outputs, a step-input area) and the step area, which a running gate step
/// borrows as its evaluator's scratch and hands back when it ends.
pub struct ChainEval<'a> {
    chain: &'a Chain,
    h: &'a (dyn Hasher + Sync),
    party: Party,
    seed: [u8; 16],
    first: u64,
    n: usize,
    keys: [PartyKeys<'a>; MAX_STEPS],
    /// Each lookup step's table.
    tables: [&'a [u64]; MAX_STEPS],
    values: &'a mut [u64],
    /// The step area while no gate step holds it.
    free: Option<&'a mut [u64]>,
    /// The gate step in progress.
    current: Option<Eval<'a>>,
    next: usize,
}

impl core::fmt::Debug for ChainEval<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ChainEval")
            .field("party", &self.party)
            .field("n", &self.n)
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl<'a> ChainEval<'a> {
    /// Prepares party `party` for `n` elements on its `input` shares.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        chain: &'a Chain,
        h: &'a (dyn Hasher + Sync),
        party: Party,
        seed: [u8; 16],
        first: u64,
        n: usize,
        keys: [PartyKeys<'a>; MAX_STEPS],
        input: &[u64],
        scratch: &'a mut [u64],
    ) -> Result<ChainEval<'a>, Error> {
        chain.validate()?;
        if scratch.len() < chain.scratch_words(n) || input.len() != n {
            return Err(Error::BufferLength);
        }
        for s in 0..chain.count {
            let want = if party == Party::P1 {
                n * chain.explicit_words(s)
            } else {
                0
            };
            if keys[s].explicit.len() != want {
                return Err(Error::BufferLength);
            }
        }
        let (values, step) = scratch.split_at_mut(chain.values_words(n));
        values[..n].copy_from_slice(input);
        Ok(ChainEval {
            chain,
            h,
            party,
            seed,
            first,
            n,
            keys,
            tables: [&[]; MAX_STEPS],
            values,
            free: Some(step),
            current: None,
            next: 0,
        })
    }

    /// Hands the evaluator each lookup step's table
    /// ([`Chain::fill_tables`]); steps without one take an empty slice.
    #[must_use]
    pub fn with_tables(mut self, tables: [&'a [u64]; MAX_STEPS]) -> Self {
        self.tables = tables;
        self
    }

    fn value_offset(&self, src: Source) -> usize {
        match src {
            Source::Input => 0,
            Source::Output { step, index } => {
                let mut off = 1;
                for s in 0..usize::from(step) {
                    off += self.chain.outs(s);
                }
                (off + usize::from(index)) * self.n
            }
        }
    }

    /// Where step `s`'s first output lies in the values area.
    fn output_at(&self, s: usize) -> usize {
        self.value_offset(Source::Output {
            step: cast::u8_from_index(s),
            index: 0,
        })
    }

    /// Where a step's input is assembled (a scaled SUF's factor after it).
    fn step_input(&self) -> usize {
        self.chain.values_words(self.n) - 2 * self.n
    }

    /// Evaluates an affine combination into the step-input area.
    fn lin(&mut self, l: &Lin) {
        self.lin_at(l, self.step_input());
    }

    /// Evaluates an affine combination into the values area at `at`.
    fn lin_at(&mut self, l: &Lin, at: usize) {
        let w = self.chain.ring;
        let pb = self.party.index();
        for e in 0..self.n {
            let mut v = if pb == 0 { l.constant } else { 0 };
            for t in 0..l.len {
                let (src, c) = l.terms[t];
                v = w.add(v, w.mul(c, self.values[self.value_offset(src) + e]));
            }
            self.values[at + e] = v;
        }
    }

    /// Starts gate step `s`: its evaluator takes the step area.
    fn start_gate(&mut self, s: usize, gate: &'a Gate, input: &Lin) -> Result<(), Error> {
        self.lin(input);
        let area = self.free.take().ok_or(Error::Unsupported)?;
        let step_seed = step_seed(self.h, &self.seed, s);
        let at = self.step_input();
        let x = &self.values[at..at + self.n];
        let ev = Eval::new(
            gate,
            self.h,
            self.party,
            &step_seed,
            None,
            self.first,
            self.n,
            self.keys[s],
            x,
            area,
        );
        match ev {
            Ok(ev) => {
                self.current = Some(ev);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Mul step `s`, first half: `x − a` and `y − b` into the message.
    fn prepare_mul(&mut self, s: usize, a: &Lin, b: &Lin, send: &mut [u8]) -> Result<(), Error> {
        let n = self.n;
        let w = self.chain.ring;
        let tmp = self.step_input();
        // x and y into the step area, then d = x − a and e = y − b; the
        // triple shares a, b, c stay there for finish.
        for (half, l) in [a, b].into_iter().enumerate() {
            self.lin(l);
            let area = self.free.as_deref_mut().ok_or(Error::Unsupported)?;
            area[half * n..(half + 1) * n].copy_from_slice(&self.values[tmp..tmp + n]);
        }
        let step_seed = step_seed(self.h, &self.seed, s);
        let (h, first, party) = (self.h, self.first, self.party);
        let explicit = self.keys[s].explicit;
        let area = self.free.as_deref_mut().ok_or(Error::Unsupported)?;
        let mut trip = [0u64; 4 * 64];
        let mut done = 0;
        while done < n {
            let c = 64.min(n - done);
            triple_words(
                h,
                &step_seed,
                first + cast::u64_from_usize(done),
                c,
                &mut trip,
            );
            for e in 0..c {
                let idx = done + e;
                let c_share = if party == Party::P0 {
                    w.reduce(trip[4 * e + 2])
                } else {
                    explicit[idx]
                };
                area[2 * n + idx] = w.reduce(trip[4 * e]);
                area[3 * n + idx] = w.reduce(trip[4 * e + 1]);
                area[4 * n + idx] = c_share;
                area[idx] = w.sub(area[idx], area[2 * n + idx]);
                area[n + idx] = w.sub(area[n + idx], area[3 * n + idx]);
            }
            done += c;
        }
        mpc::open_prepare(w, &area[..2 * n], send)
    }

    /// Gate step `s`'s round `j` finished: on its last round, its outputs
    /// go to the values area (output-major) and the step area comes back.
    fn finish_gate(
        &mut self,
        s: usize,
        j: usize,
        recv: &[u8],
        fss: &dyn BatchEval,
    ) -> Result<(), Error> {
        let n = self.n;
        let out_at = self.output_at(s);
        let ev = self.current.as_mut().ok_or(Error::Unsupported)?;
        ev.finish(j, recv, fss)?;
        if j + 1 < ev.rounds() {
            return Ok(());
        }
        let outs = match &self.chain.steps[s] {
            Step::Gate { gate, .. } => gate.outputs(),
            _ => return Err(Error::Unsupported),
        };
        ev.outputs(&mut self.values[out_at..out_at + n * outs], &mut [])?;
        let area = match self.current.take() {
            Some(ev) => ev.into_scratch(),
            None => return Err(Error::Unsupported),
        };
        if outs > 1 {
            // Element-major to output-major, through the free step area.
            let v = &mut self.values[out_at..out_at + n * outs];
            for e in 0..n {
                for o in 0..outs {
                    area[o * n + e] = v[e * outs + o];
                }
            }
            v.copy_from_slice(&area[..n * outs]);
        }
        self.free = Some(area);
        Ok(())
    }

    /// One-round step `s` (a truncation or a SUF), its round's message:
    /// the opening of its input, with its material loaded into the step
    /// area.
    fn prepare_one_round(
        &mut self,
        s: usize,
        gate: &dyn OneRound,
        (input, factor): (&Lin, Option<&Lin>),
        send: &mut [u8],
    ) -> Result<(), Error> {
        self.lin(input);
        let (n, at) = (self.n, self.step_input());
        if let Some(f) = factor {
            self.lin_at(f, at + n);
        }
        // The input, then (scaled) the factor: both opened this round.
        let opened = n * (1 + usize::from(factor.is_some()));
        let step_seed = step_seed(self.h, &self.seed, s);
        let area = self.free.as_deref_mut().ok_or(Error::Unsupported)?;
        let area = &mut area[..gate.area_words(n)];
        let explicit = self.keys[s].explicit;
        let (h, party, first) = (self.h, self.party, self.first);
        gate.load_step(h, party, (&step_seed, first), explicit, area)?;
        gate.open_step(area, &self.values[at..at + opened], send)
    }

    /// One-round step `s` (a truncation, a SUF or a lookup), the peer's
    /// message: its keys and this party's output shares (output-major, as
    /// the values area holds them).
    fn finish_one_round(
        &mut self,
        s: usize,
        gate: &dyn OneRound,
        recv: &[u8],
        fss: &dyn BatchEval,
    ) -> Result<(), Error> {
        let n = self.n;
        let out_at = self.output_at(s);
        let outs = self.chain.outs(s);
        let area = self.free.as_deref_mut().ok_or(Error::Unsupported)?;
        let area = &mut area[..gate.area_words(n)];
        let out = &mut self.values[out_at..out_at + n * outs];
        let with = (&self.keys[s], fss, self.tables[s]);
        gate.finish_step(self.party, area, recv, with, out)
    }

    /// Mul step, second half: this party's share of the product.
    fn finish_mul(&mut self, s: usize, recv: &[u8]) -> Result<(), Error> {
        let n = self.n;
        let w = self.chain.ring;
        let pb = self.party.index();
        let out_at = self.output_at(s);
        let area = self.free.as_deref_mut().ok_or(Error::Unsupported)?;
        let (opened, triple) = area.split_at_mut(2 * n);
        // Own differences plus the peer's: d = x − a and e = y − b.
        crate::gate::wire_add(w, opened, recv)?;
        for e in 0..n {
            let (a, b, c) = (triple[e], triple[n + e], triple[2 * n + e]);
            self.values[out_at + e] = mpc::beaver_share(w, pb, opened[e], opened[n + e], a, b, c);
        }
        Ok(())
    }
}

impl Protocol for ChainEval<'_> {
    fn rounds(&self) -> usize {
        self.chain.rounds()
    }

    fn send_len(&self, round: usize) -> usize {
        if round < self.rounds() {
            self.chain.round_bytes(round, self.n)
        } else {
            0
        }
    }

    fn output_len(&self) -> usize {
        self.n
    }

    fn prepare(&mut self, round: usize, send: &mut [u8]) -> Result<(), Error> {
        if round != self.next || round >= self.rounds() {
            return Err(Error::Unsupported);
        }
        if send.len() != self.send_len(round) {
            return Err(Error::BufferLength);
        }
        let (s, j) = self.chain.locate(round);
        let chain = self.chain;
        match &chain.steps[s] {
            Step::Gate { gate, input } => {
                if j == 0 {
                    self.start_gate(s, gate, input)?;
                }
                self.current
                    .as_mut()
                    .ok_or(Error::Unsupported)?
                    .prepare(j, send)
            }
            Step::Trunc { gate, input } => self.prepare_one_round(s, gate, (input, None), send),
            Step::Suf {
                gate,
                input,
                factor,
            } => self.prepare_one_round(s, gate, (input, factor.as_ref()), send),
            Step::Lut { gate, input } => self.prepare_one_round(s, gate, (input, None), send),
            Step::Mul { a, b } => self.prepare_mul(s, a, b, send),
        }
    }

    fn finish(&mut self, round: usize, recv: &[u8], fss: &dyn BatchEval) -> Result<(), Error> {
        if round != self.next || round >= self.rounds() {
            return Err(Error::Unsupported);
        }
        if recv.len() != self.send_len(round) {
            return Err(Error::BufferLength);
        }
        let (s, j) = self.chain.locate(round);
        let chain = self.chain;
        match &chain.steps[s] {
            Step::Trunc { gate, .. } => self.finish_one_round(s, gate, recv, fss)?,
            Step::Suf { gate, .. } => self.finish_one_round(s, gate, recv, fss)?,
            Step::Lut { gate, .. } => self.finish_one_round(s, gate, recv, fss)?,
            Step::Gate { gate, .. } => {
                if gate.bit_outputs() != 0 {
                    // Chains carry ring values only.
                    return Err(Error::Unsupported);
                }
                self.finish_gate(s, j, recv, fss)?;
            }
            Step::Mul { .. } => self.finish_mul(s, recv)?,
        }
        self.next += 1;
        Ok(())
    }

    /// The chain output (n words).
    fn output(&self, out: &mut [u64]) -> Result<(), Error> {
        if self.next != self.rounds() {
            return Err(Error::Unsupported);
        }
        if out.len() != self.n {
            return Err(Error::BufferLength);
        }
        let at = self.value_offset(self.chain.output);
        out.copy_from_slice(&self.values[at..at + self.n]);
        Ok(())
    }
}

/// Test support: deal a chain and run both parties in memory.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use crate::batch::Serial;
    use crate::prg::FixedKeyAes;
    use std::vec;
    use std::vec::Vec;

    /// Reconstructed chain outputs on shares of `xs`.
    pub(crate) fn run_chain(chain: &Chain, xs: &[u64], salt: u8) -> Vec<u64> {
        let n = xs.len();
        let w = chain.ring;
        let aes = FixedKeyAes::new();
        let seeds = [[salt; 16], [salt ^ 0x77; 16]];
        let mut dcf: Vec<[Vec<Vec<u8>>; 2]> = Vec::new();
        let mut explicit: Vec<Vec<u64>> = Vec::new();
        for s in 0..chain.count {
            let sizes: Vec<usize> = (0..MAX_KEYS)
                .map(|k| chain.key_params(s, k).map_or(0, |p| n * p.key_len()))
                .collect();
            let mut fresh = crate::prg::Prg::new(&[salt ^ 0x42; 16]);
            let random: Vec<u64> = (0..n * chain.random_words(s))
                .map(|_| fresh.next_u64())
                .collect();
            let mut k0: Vec<Vec<u8>> = sizes.iter().map(|l| vec![0u8; *l]).collect();
            let mut k1 = k0.clone();
            let mut ex = vec![0u64; n * chain.explicit_words(s)];
            {
                let mut d0 = crate::gate::testing::key_slices(&mut k0);
                let mut d1 = crate::gate::testing::key_slices(&mut k1);
                let mut prf = vec![crate::prg::Block::ZERO; chain.deal_scratch_blocks(n, 5)];
                let mut words = vec![0u64; DealScratch::words(5)];
                chain
                    .deal_step(
                        s,
                        &Serial::new(),
                        seeds,
                        11,
                        n,
                        &mut d0,
                        &mut d1,
                        &mut ex,
                        &random,
                        &mut DealScratch::new(&mut prf, &mut words),
                    )
                    .unwrap();
            }
            dcf.push([k0, k1]);
            explicit.push(ex);
        }
        let mut prg = crate::prg::Prg::new(&[salt ^ 1; 16]);
        let x0: Vec<u64> = (0..n).map(|_| w.reduce(prg.next_u64())).collect();
        let x1: Vec<u64> = xs.iter().zip(&x0).map(|(x, a)| w.sub(*x, *a)).collect();
        let keys = |party: usize| -> [PartyKeys<'_>; MAX_STEPS] {
            let mut k = [PartyKeys::default(); MAX_STEPS];
            for s in 0..chain.count {
                let d = &dcf[s][party];
                k[s] = PartyKeys {
                    dcf: core::array::from_fn(|k| d.get(k).map_or(&[][..], |v| &v[..])),
                    roots: [&[]; MAX_KEYS],
                    explicit: if party == 1 { &explicit[s][..] } else { &[] },
                };
            }
            k
        };
        let mut s0 = crate::gate::testing::dirty(chain.scratch_words(n), 0);
        let mut s1 = crate::gate::testing::dirty(chain.scratch_words(n), 1);
        let mut store = vec![0u64; chain.tables_words()];
        let tables = chain.fill_tables(&mut store).unwrap();
        let mut e0 = ChainEval::new(
            chain,
            &aes,
            Party::P0,
            seeds[0],
            11,
            n,
            keys(0),
            &x0,
            &mut s0,
        )
        .unwrap()
        .with_tables(tables);
        let mut e1 = ChainEval::new(
            chain,
            &aes,
            Party::P1,
            seeds[1],
            11,
            n,
            keys(1),
            &x1,
            &mut s1,
        )
        .unwrap()
        .with_tables(tables);
        let serial = Serial::new();
        let len = crate::gate::protocol::max_send_len(&e0);
        let (mut b0, mut b1) = (vec![0u8; len], vec![0u8; len]);
        crate::gate::run_pair(&mut e0, &mut e1, &serial, &mut b0, &mut b1).unwrap();
        let mut y0 = vec![0u64; n];
        let mut y1 = vec![0u64; n];
        e0.output(&mut y0).unwrap();
        e1.output(&mut y1).unwrap();
        y0.iter().zip(&y1).map(|(a, b)| w.add(*a, *b)).collect()
    }
}
