//! Composite-FSS gates: a compiled SUF plus a post-processing circuit Φ,
//! with a dealer and a sans-IO two-party evaluator batched over N elements.
//!
//! # Rounds
//!
//! A gate's rounds are fixed by its SUF and Φ (never by a mask):
//!
//! 1. **Open** (when the input arrives as shares): send `x_b + r_b`;
//!    everyone learns `x̂ = x + r`. Then, locally, every DCF key is
//!    evaluated at its public points and the Boolean circuit's base nodes
//!    are formed ([`Compiled::base_nodes`]).
//! 2. **AND levels**, one round each, when bit outputs need AND gates.
//! 3. **Bits**: open `b ⊕ ρ` for every bit Φ uses in the ring.
//! 4. **Beaver**: open `c_i − a_i` for coefficients evaluated Beaver-style.
//!
//! The outputs then follow locally from public coefficients and the
//! dealer's monomial shares ([`crate::phi`]).
//!
//! # Key material
//!
//! Everything uniformly random is expanded from a per-party 16-byte seed
//! with the PRF `H_prf(seed ⊕ (element, slot))`: mask shares, DCF root
//! seeds, the B2A bits' XOR shares, AND-triple inputs, Beaver masks, and
//! P0's monomial shares. P0's key is therefore its seed plus the DCF
//! correction words; P1's adds one explicit word per non-seeded monomial
//! and the AND-triple outputs (DESIGN.md §3, "Seeded party-0 material").

use crate::batch::{BatchEval, EvalJob};
use crate::compile::{Compiled, MAX_KEYS};
use crate::error::{Error, SufError};
use crate::fss::{GenBatch, KeyBatch, Params, Party, key_buffers_fit, p1_span};
use crate::mpc;
use crate::phi::program::{self, BLOCK, Program, Section};
use crate::phi::{Mono, Phi, Plan};
use crate::prg::{Block, Domain, Hasher};
use crate::ring::{Width, cast};
use crate::suf::Suf;

pub mod activation;
pub mod centre_square;
pub mod chain;
pub mod inverse;
pub mod max;
mod one_round;
pub use one_round::SingleKey;
pub mod protocol;
pub mod relu;
pub mod reluars;
pub mod ring_lut;
pub mod ring_relu;
pub mod ring_suf;
pub mod ring_trunc;
pub mod select;
pub mod spline;
pub mod splines;
pub mod trunc;
pub mod trunc_open;
pub mod width;

pub use protocol::{Protocol, Traffic, run_pair};

/// How a gate receives its input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Input {
    /// Additive shares of x: the gate opens `x + r` itself.
    Shares,
    /// The masked value `x̂ = x + r` is already public.
    Masked,
}

/// One round of a gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Round {
    /// Open the masked input.
    Open,
    /// Evaluate the AND gates of one level.
    And(u8),
    /// Convert bits to the ring.
    Bits,
    /// Open Beaver differences of polynomial coefficients.
    Beaver,
}

/// Most rounds a gate can have.
pub const MAX_ROUNDS: usize = 8;

/// A gate type: a SUF at an effective width, its post-processing, and the
/// plan both derive. Everything here is public and mask-independent.
///
/// A gate is tens of KB (22 KB on a 32-bit target), so it is neither `Copy`
/// nor `Clone`: it is built once and passed by reference, and a copy that
/// would silently cost a microcontroller's whole stack does not compile.
///
/// ```compile_fail
/// fn copies<T: Clone>() {}
/// copies::<suffuse_core::gate::Gate>();
/// ```
#[derive(Debug, PartialEq, Eq)]
pub struct Gate {
    /// The compiled SUF.
    pub compiled: Compiled,
    /// The post-processing circuit.
    pub phi: Phi,
    /// The derived plan.
    pub plan: Plan,
    /// Φ compiled into a block program.
    pub program: Program,
    /// How the input arrives.
    pub input: Input,
}

/// A party's PRF blocks of elements `first..first + count` for the slots
/// in `slots`: element `e`'s block for slot `slots.start + j` at
/// `out[e · slots.len() + j]`, each `H(seed ⊕ (element | slot << 64))` (every
/// block is its own PRF call, so a subset of slots costs only its own AES
/// calls). Returns the AES calls made.
pub(crate) fn prf_slots(
    h: &dyn Hasher,
    seed: &[u8; 16],
    (first, count): (u64, usize),
    slots: core::ops::Range<usize>,
    out: &mut [Block],
) -> u64 {
    let per = slots.len();
    let s = Block::from_bytes(*seed);
    for (e, chunk) in out.chunks_mut(per).take(count).enumerate() {
        let element = cast::u128_from_u64(first + cast::u64_from_usize(e));
        for (slot, b) in slots.clone().zip(chunk.iter_mut()) {
            let index = element | (cast::u128_from_u64(cast::u64_from_usize(slot)) << 64);
            *b = s ^ Block::from_bytes(index.to_le_bytes());
        }
    }
    h.hash_many(Domain::Prf, &mut out[..per * count])
}

/// Per-element costs of a gate, per party.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Cost {
    /// Rounds of interaction.
    pub rounds: usize,
    /// Bits one party sends per element, over all rounds.
    pub comm_bits: usize,
    /// Key bytes per element held by P0 (DCF correction words).
    pub key_bytes_p0: usize,
    /// Key bytes per element held by P1 (correction words and explicit words).
    pub key_bytes_p1: usize,
    /// AES calls per element per party online (DCF evaluations and seed
    /// expansion).
    pub aes_online: usize,
    /// DCF evaluation points per element.
    pub dcf_points: usize,
}

/// PRF slots of one element: mask share and ρ bits, AND triple inputs,
/// P0's AND outputs, then one block per DCF root, then words.
const SLOT_AND: usize = 1;
const SLOT_GAMMA: usize = 2;
const SLOT_ROOTS: usize = 3;

impl Gate {
    /// The empty value that [`Gate::init`] builds in place: `init`
    /// overwrites every field, and until then it is not a usable gate.
    pub const EMPTY: Gate = Gate {
        compiled: Compiled::EMPTY,
        phi: Phi::new(crate::phi::PolyMode::Monomials),
        plan: Plan::EMPTY,
        program: Program::EMPTY,
        input: Input::Shares,
    };

    /// Builds a gate from a SUF, an effective width and a post-processing
    /// circuit. This returns the gate by value, for `const` items and hosts;
    /// where stack is scarce, build in place with [`Gate::init`].
    pub const fn new(suf: &Suf, k: Width, phi: Phi, input: Input) -> Result<Gate, SufError> {
        let mut gate = Gate::EMPTY;
        match gate.init(suf, k, &phi, input) {
            Ok(()) => Ok(gate),
            Err(e) => Err(e),
        }
    }

    /// [`Gate::new`] in place: the compiled SUF, the plan and the program
    /// are each written where they lie in `self`, so building needs a few
    /// KiB of stack rather than several copies of a 22–35 KB descriptor
    /// (examples/mcu measures it). On an error `self` is left partly
    /// written and must not be used until a later `init` succeeds.
    pub const fn init(
        &mut self,
        suf: &Suf,
        k: Width,
        phi: &Phi,
        input: Input,
    ) -> Result<(), SufError> {
        let (views, count) = phi.wrap_views();
        if let Err(e) = self.compiled.init(suf, k, views.split_at(count).0) {
            return Err(e);
        }
        self.phi = *phi;
        self.input = input;
        if let Err(e) = self.plan.init(&self.compiled, &self.phi) {
            return Err(e);
        }
        self.program.init(&self.compiled, &self.phi, &self.plan)
    }

    /// The ring of the input and of intermediate arithmetic.
    pub const fn ring(&self) -> Width {
        self.compiled.suf.ring
    }

    /// The rounds, in order.
    pub const fn schedule(&self) -> ([Round; MAX_ROUNDS], usize) {
        let mut r = [Round::Open; MAX_ROUNDS];
        let mut n = 0;
        if matches!(self.input, Input::Shares) {
            r[n] = Round::Open;
            n += 1;
        }
        let mut l = 1;
        while l <= self.compiled.and_depth && n < MAX_ROUNDS {
            r[n] = Round::And(cast::u8_from_index(l));
            n += 1;
            l += 1;
        }
        if self.plan.b2a_count > 0 && n < MAX_ROUNDS {
            r[n] = Round::Bits;
            n += 1;
        }
        if self.plan.beaver_count > 0 && n < MAX_ROUNDS {
            r[n] = Round::Beaver;
            n += 1;
        }
        (r, n)
    }

    /// Number of ring outputs.
    pub const fn outputs(&self) -> usize {
        self.phi.count
    }

    /// Number of bit outputs (exported as XOR shares).
    pub const fn bit_outputs(&self) -> usize {
        self.compiled.suf.bools
    }

    /// Explicit words P1 holds per element.
    pub const fn explicit_words(&self) -> usize {
        self.plan.explicit_monos() + if self.compiled.and_count > 0 { 1 } else { 0 }
    }

    /// Seeded words per element (Beaver masks, then P0's monomial shares).
    const fn seeded_words(&self) -> usize {
        self.plan.beaver_count + self.plan.explicit_monos()
    }

    /// PRF blocks per element and party.
    const fn prf_blocks(&self) -> usize {
        SLOT_ROOTS + self.compiled.key_count + self.seeded_words().div_ceil(2)
    }

    /// DCF parameters of key `key`.
    pub const fn key_params(&self, key: usize) -> Params {
        Params::dcf_bit(self.compiled.keys[key])
    }

    /// Bytes a party sends per element in `round`... as bits (rounded up
    /// per batch when packed).
    pub const fn round_bits(&self, round: Round) -> usize {
        match round {
            Round::Open => cast::usize_from_u32(self.ring().bits()),
            Round::And(l) => {
                let mut n = 0;
                let mut i = 0;
                while i < self.compiled.and_count {
                    if self.compiled.level[cast::usize_from_u8(self.compiled.ands[i])] == l {
                        n += 2;
                    }
                    i += 1;
                }
                n
            }
            Round::Bits => self.plan.b2a_count,
            Round::Beaver => self.plan.beaver_count * cast::usize_from_u32(self.ring().bits()),
        }
    }

    /// Bytes a party sends in `round` for a batch of `n` elements.
    pub const fn round_bytes(&self, round: Round, n: usize) -> usize {
        match round {
            Round::Open => mpc::words_len(self.ring(), n),
            Round::Beaver => mpc::words_len(self.ring(), n * self.plan.beaver_count),
            _ => mpc::bits_len(n * self.round_bits(round)),
        }
    }

    /// Per-element costs.
    pub const fn cost(&self) -> Cost {
        let (sched, rounds) = self.schedule();
        let mut comm = 0;
        let mut i = 0;
        while i < rounds {
            comm += self.round_bits(sched[i]);
            i += 1;
        }
        let mut cw = 0;
        let mut aes = self.prf_blocks();
        let mut points = 0;
        let mut k = 0;
        while k < self.compiled.key_count {
            let p = self.key_params(k);
            cw += p.key_len() - 16;
            aes += self.compiled.points_per_key[k] * cast::usize_from_small_u64(p.aes_per_eval());
            points += self.compiled.points_per_key[k];
            k += 1;
        }
        let explicit = mpc::words_len(self.ring(), self.plan.explicit_monos())
            + if self.compiled.and_count > 0 {
                self.compiled.and_count.div_ceil(8)
            } else {
                0
            };
        Cost {
            rounds,
            comm_bits: comm,
            key_bytes_p0: cw,
            key_bytes_p1: cw + explicit,
            aes_online: aes,
            dcf_points: points,
        }
    }

    /// Expands one party's PRF blocks for elements `first..first + count`.
    fn expand(
        &self,
        h: &dyn Hasher,
        seed: &[u8; 16],
        first: u64,
        count: usize,
        out: &mut [Block],
    ) -> u64 {
        self.expand_slots(h, seed, (first, count), 0..self.prf_blocks(), out)
    }

    /// [`Gate::expand`] of the blocks in `slots` only: element `e`'s block
    /// for slot `slots.start + j` at `out[e · slots.len() + j]` (every block
    /// is its own PRF call, so a subset costs only its own AES calls).
    fn expand_slots(
        &self,
        h: &dyn Hasher,
        seed: &[u8; 16],
        elements: (u64, usize),
        slots: core::ops::Range<usize>,
        out: &mut [Block],
    ) -> u64 {
        prf_slots(h, seed, elements, slots, out)
    }

    /// The DCF root seed of `key` in an element's expanded blocks.
    fn root(&self, blocks: &[Block], key: usize) -> Block {
        blocks[SLOT_ROOTS + key]
    }

    /// Seeded word `i` of an element's expanded blocks.
    fn seeded_word(&self, blocks: &[Block], i: usize) -> u64 {
        let b = blocks[SLOT_ROOTS + self.compiled.key_count + i / 2];
        if i.is_multiple_of(2) {
            b.low64()
        } else {
            b.high64()
        }
    }

    /// Deals `count` elements starting at element index `first`: writes both
    /// parties' full DCF keys (roots included) and P1's explicit words.
    /// An empty P1 key slot asks for P0's keys alone
    /// ([`crate::fss::p1_keys_fit`]); every gate's `deal` takes that.
    ///
    /// The input mask shares come from the seeds unless `masks` supplies
    /// them (then the evaluators must be given the same shares); tests use
    /// that to pin masks to 0, 2^n − 1 and every wrap point. The DCF keys
    /// come from the backend's [`BatchEval::generate`], one call per key
    /// slot for each group of elements; `scratch` ([`DealScratch`]) sets
    /// the group's size (the caller sizes it from the backend's
    /// [`BatchEval::preferred_batch`]) and holds both parties' expanded
    /// PRF blocks. Returns the AES calls made.
    #[allow(clippy::too_many_arguments)]
    pub fn deal(
        &self,
        fss: &dyn BatchEval,
        seeds: [[u8; 16]; 2],
        masks: Option<[&[u64]; 2]>,
        first: u64,
        count: usize,
        dcf0: &mut [&mut [u8]; MAX_KEYS],
        dcf1: &mut [&mut [u8]; MAX_KEYS],
        explicit: &mut [u64],
        scratch: &mut DealScratch<'_>,
    ) -> Result<u64, Error> {
        self.check_deal_buffers(masks, count, [dcf0, dcf1], explicit.len())?;
        let w = self.ring();
        let ew = self.explicit_words();
        let per = self.prf_blocks();
        let (group, prf, mut gen_in) = scratch.parts(per)?;
        // Elements per batch: as many as both parties' blocks fit.
        let chunk = prf.len() / (2 * per);
        let (b0, b1) = prf.split_at_mut(chunk * per);
        let mut calls = 0;
        let mut done = 0;
        while done < count {
            let n = chunk.min(count - done);
            let at = first + cast::u64_from_usize(done);
            calls += self.expand(fss, &seeds[0], at, n, b0);
            calls += self.expand(fss, &seeds[1], at, n, b1);
            // Groups of up to `group` elements: each key slot's keys of a
            // group go to the backend in one `generate` call.
            let mut g = 0;
            while g < n {
                let m = group.min(n - g);
                let blocks = [&b0[g * per..(g + m) * per], &b1[g * per..(g + m) * per]];
                for e in 0..m {
                    gen_in.masks[e] = match masks {
                        Some([m0, m1]) => w.add(m0[done + g + e], m1[done + g + e]),
                        None => w.add(blocks[0][e * per].low64(), blocks[1][e * per].low64()),
                    };
                }
                calls += self.deal_keys(fss, blocks, done + g, &mut gen_in, dcf0, dcf1)?;
                for (e, &re) in gen_in.masks[..m].iter().enumerate() {
                    let p = [
                        &blocks[0][e * per..(e + 1) * per],
                        &blocks[1][e * per..(e + 1) * per],
                    ];
                    let el = done + g + e;
                    self.deal_explicit(p, re, &mut explicit[el * ew..(el + 1) * ew]);
                }
                g += m;
            }
            done += n;
        }
        Ok(calls)
    }

    /// Checks a dealer's buffers for `count` elements: both parties' mask
    /// shares where given, every key slot of both parties at its key
    /// length, and `explicit` words of P1's.
    fn check_deal_buffers(
        &self,
        masks: Option<[&[u64]; 2]>,
        count: usize,
        [dcf0, dcf1]: [&[&mut [u8]; MAX_KEYS]; 2],
        explicit: usize,
    ) -> Result<(), Error> {
        if let Some([m0, m1]) = masks
            && (m0.len() != count || m1.len() != count)
        {
            return Err(Error::BufferLength);
        }
        if explicit != count * self.explicit_words() {
            return Err(Error::BufferLength);
        }
        for k in 0..self.compiled.key_count {
            let len = self.key_params(k).key_len();
            if !key_buffers_fit(dcf0[k], dcf1[k], count, len) {
                return Err(Error::BufferLength);
            }
        }
        Ok(())
    }

    /// Generates every DCF key pair of a group of `m` elements whose
    /// expanded blocks are `blocks` (both parties', `m` elements' each) and
    /// masks `gen_in.masks[..m]`, into the key slots of elements
    /// `first..first + m`: one
    /// [`BatchEval::generate`] call per key slot, which writes the same
    /// bytes whatever batching the backend chooses inside it.
    fn deal_keys(
        &self,
        fss: &dyn BatchEval,
        blocks: [&[Block]; 2],
        first: usize,
        gen_in: &mut GenInputs<'_>,
        dcf0: &mut [&mut [u8]; MAX_KEYS],
        dcf1: &mut [&mut [u8]; MAX_KEYS],
    ) -> Result<u64, Error> {
        let per = self.prf_blocks();
        let m = blocks[0].len() / per;
        let mut calls = 0;
        for k in 0..self.compiled.key_count {
            let params = self.key_params(k);
            for e in 0..m {
                gen_in.alphas[e] = self.compiled.key_alpha(k, gen_in.masks[e]);
                gen_in.roots[e] = [
                    self.root(&blocks[0][e * per..], k),
                    self.root(&blocks[1][e * per..], k),
                ];
            }
            // Bit outputs: β is 1, and no random words are drawn.
            let (alphas, betas) = (&gen_in.alphas[..m], &gen_in.betas[..m]);
            let batch = GenBatch::new(params, alphas, betas, &gen_in.roots[..m], &[])?;
            let len = params.key_len();
            let span = first * len..(first + m) * len;
            let p1 = p1_span(dcf1[k], span.clone());
            let stats = fss.generate(&batch, &mut dcf0[k][span], p1)?;
            calls += stats.aes_calls;
        }
        Ok(calls)
    }

    /// Writes one element's explicit words: the AND gate's masked product
    /// and every monomial not drawn from the seeds, for mask `r`.
    fn deal_explicit(&self, p: [&[Block]; 2], r: u64, out: &mut [u64]) {
        let w = self.ring();
        let [p0, p1] = p;
        let rho = p0[0].high64() ^ p1[0].high64();
        let mut o = 0;
        if self.compiled.and_count > 0 {
            let alpha = p0[SLOT_AND].low64() ^ p1[SLOT_AND].low64();
            let beta = p0[SLOT_AND].high64() ^ p1[SLOT_AND].high64();
            out[0] = (alpha & beta) ^ p0[SLOT_GAMMA].low64();
            o = 1;
        }
        let mut a = [0u64; crate::phi::MAX_BEAVER];
        for (l, al) in a.iter_mut().enumerate().take(self.plan.beaver_count) {
            *al = w.add(self.seeded_word(p0, l), self.seeded_word(p1, l));
        }
        let mut s = self.plan.beaver_count;
        for m in &self.plan.monos[..self.plan.mono_count] {
            if m.is_seeded() {
                continue;
            }
            let v = self.mono_value(m, r, rho, &a);
            out[o] = w.sub(v, self.seeded_word(p0, s));
            o += 1;
            s += 1;
        }
    }

    /// A monomial's value for mask `r`, B2A bits `rho` and Beaver masks `a`.
    fn mono_value(&self, m: &Mono, r: u64, rho: u64, a: &[u64]) -> u64 {
        let w = self.ring();
        let mut v = 1u64;
        for _ in 0..m.r {
            v = w.mul(v, r);
        }
        // Secret bits multiply without branching: v·ρ = v & −ρ.
        let mut mask = m.rho;
        while mask != 0 {
            let b = mask.trailing_zeros();
            v &= crate::prg::word_mask(rho >> b);
            mask &= mask - 1;
        }
        for (l, al) in a.iter().enumerate().take(self.plan.beaver_count) {
            if m.a >> l & 1 == 1 {
                v = w.mul(v, *al);
            }
        }
        for q in 0..self.phi.kappa_count {
            if m.kappa >> q & 1 == 1 {
                v = w.mul(v, self.phi.kappas[q].of(r));
            }
        }
        v
    }

    /// Writes each element's DCF root seeds into full keys whose bodies were
    /// loaded from a key file (which stores correction words only).
    pub fn fill_roots(
        &self,
        h: &dyn Hasher,
        party: Party,
        seed: &[u8; 16],
        first: u64,
        dcf: &mut [&mut [u8]; MAX_KEYS],
    ) -> Result<u64, Error> {
        let count = dcf[0].len() / self.key_params(0).key_len();
        self.write_roots(h, party, (seed, first, count), dcf, |k| {
            self.key_params(k).key_len()
        })
    }

    /// Writes each element's DCF root seeds, 16 bytes per element per key
    /// width, into `roots`: the roots of keys whose bodies stay where a key
    /// file was read ([`PartyKeys::roots`]).
    pub fn derive_roots(
        &self,
        h: &dyn Hasher,
        party: Party,
        seed: &[u8; 16],
        first: u64,
        roots: &mut [&mut [u8]; MAX_KEYS],
    ) -> Result<u64, Error> {
        let count = roots[0].len() / 16;
        self.write_roots(h, party, (seed, first, count), roots, |_| 16)
    }

    /// Writes element `e`'s root for key width `k` at `out[k][e · stride(k)..]`
    /// for `count` elements from `first`.
    fn write_roots(
        &self,
        h: &dyn Hasher,
        party: Party,
        (seed, first, count): (&[u8; 16], u64, usize),
        out: &mut [&mut [u8]; MAX_KEYS],
        stride: impl Fn(usize) -> usize,
    ) -> Result<u64, Error> {
        let c = &self.compiled;
        for k in 0..c.key_count {
            if out[k].len() != count * stride(k) {
                return Err(Error::BufferLength);
            }
        }
        if c.key_count == 0 {
            return Ok(0);
        }
        // Only the root slots: the rest of an element's blocks are
        // expanded again by `Eval::new`.
        let per = c.key_count;
        let slots = SLOT_ROOTS..SLOT_ROOTS + c.key_count;
        let chunk = PRF_STACK / per;
        let mut blocks = [Block::ZERO; PRF_STACK];
        let mut calls = 0;
        let mut done = 0;
        while done < count {
            let n = chunk.min(count - done);
            let at = first + cast::u64_from_usize(done);
            calls += self.expand_slots(h, seed, (at, n), slots.clone(), &mut blocks);
            for e in 0..n {
                for k in 0..c.key_count {
                    let to = (done + e) * stride(k);
                    blocks[e * per + k]
                        .with_lsb(party.index())
                        .write(&mut out[k][to..]);
                }
            }
            done += n;
        }
        Ok(calls)
    }

    /// The gate's cleartext value at `x`: ring outputs into `out`, bit
    /// outputs returned as a mask. This is the fixed-point reference every
    /// two-party run must equal: correctness holds for every mask, so it is
    /// the protocol's algebra evaluated with the mask 0.
    pub fn reference(&self, x: u64, out: &mut [u64]) -> u32 {
        let c = &self.compiled;
        let w = self.ring();
        let x = w.reduce(x);
        let nodes = c.clear_nodes(x, 0);
        let value = c.suf.eval_at(x, c.k);
        for (o, slot) in out.iter_mut().enumerate().take(self.phi.count) {
            let output = &self.phi.outputs[o];
            let mut acc = 0u64;
            for term in &output.terms[..output.len] {
                let mut v = w.mul(term.scale, term.public.at(x));
                for f in &term.factors[..term.len] {
                    let fv = match *f {
                        crate::phi::Factor::X(p) => {
                            let mut p_v = 1u64;
                            for _ in 0..p {
                                p_v = w.mul(p_v, x);
                            }
                            p_v
                        }
                        crate::phi::Factor::Poly(j) => value.arith[usize::from(j)],
                        crate::phi::Factor::Bool(j) => u64::from((value.bits >> j) & 1),
                        crate::phi::Factor::Wrap(view) => crate::phi::wrap_node(c, view)
                            .map_or(0, |node| crate::compile::node_bit(nodes, node)),
                        crate::phi::Factor::Kappa(q) => self.phi.kappas[usize::from(q)].of(0),
                    };
                    v = w.mul(v, fv);
                }
                acc = w.add(acc, v);
            }
            *slot = output.ring.reduce(acc);
        }
        value.bits
    }

    /// Scratch words an evaluator needs for `n` elements.
    pub const fn scratch_words(&self, n: usize) -> usize {
        let l = self.layout(n);
        l.end
    }

    /// The least [`DealScratch`] blocks [`Gate::deal`] accepts for groups
    /// of `group` elements: one element's PRF blocks for each party, and
    /// the group's roots.
    pub const fn deal_scratch_min(&self, group: usize) -> usize {
        2 * self.prf_blocks() + 2 * group
    }

    /// [`DealScratch`] blocks for dealing `count` elements in groups of
    /// `group` and full-sized AES batches: PRF blocks for up to 64 KiB per
    /// party or a whole group, whichever is more (less when `count` needs
    /// less), and the group's roots.
    pub const fn deal_scratch_blocks(&self, count: usize, group: usize) -> usize {
        let per = self.prf_blocks();
        let batch = PRF_BUFFER / per;
        let batch = if group > batch { group } else { batch };
        let elements = if count < batch { count } else { batch };
        let elements = if elements == 0 { 1 } else { elements };
        2 * per * elements + 2 * group
    }

    /// Checks an evaluator's buffers for `n` elements as `party`: `inputs`
    /// input shares (none for an [`Input::Masked`] gate), keys that hold
    /// every key at its parameters, P1's explicit words (P0 holds none) and
    /// at least the layout's scratch. Returns the layout.
    fn check_eval_buffers(
        &self,
        party: Party,
        n: usize,
        keys: &PartyKeys<'_>,
        inputs: usize,
        scratch: usize,
    ) -> Result<Layout, Error> {
        let want_inputs = match self.input {
            Input::Shares => n,
            Input::Masked => 0,
        };
        let l = self.layout(n);
        if inputs != want_inputs || scratch < l.end {
            return Err(Error::BufferLength);
        }
        for k in 0..self.compiled.key_count {
            if !keys.holds(k, self.key_params(k), n) {
                return Err(Error::BufferLength);
            }
        }
        let want = if party == Party::P1 {
            n * self.explicit_words()
        } else {
            0
        };
        if keys.explicit.len() != want {
            return Err(Error::BufferLength);
        }
        Ok(l)
    }

    const fn layout(&self, n: usize) -> Layout {
        let b = self.plan.b2a_count;
        let u = self.plan.beaver_count;
        let m = self.plan.mono_count;
        let x_hat = 0;
        let mask = x_hat + n;
        let rho = mask + n;
        let and = rho + n;
        let nodes = and + 3 * n;
        let e = nodes + n.div_ceil(BLOCK) * self.compiled.node_count;
        let a = e + n * b;
        let uu = a + n * u;
        let monos = uu + n * u;
        let out = monos + n * m;
        let fss = out + n * self.phi.count;
        // Room for any batch up to the whole tensor (the backend picks the
        // batch: `BatchEval::preferred_batch`). The FSS points are dead once
        // the opening round is done, so the Φ program's columns reuse that
        // area.
        let dcf = 2 * n * self.compiled.total_points();
        let cols = self.program.scratch_words();
        let end = fss + if dcf > cols { dcf } else { cols };
        Layout {
            x_hat,
            mask,
            rho,
            and,
            nodes,
            e,
            a,
            u: uu,
            monos,
            out,
            fss,
            end,
        }
    }
}

/// Caller scratch for dealing ([`Gate::deal`], [`chain::Chain::deal_step`],
/// [`max::MaxTree::deal_level`]): both parties' expanded PRF blocks, and
/// the key-generation inputs of one group of elements, the elements whose
/// keys go to the backend in one [`BatchEval::generate`] call per key slot.
/// The caller picks the group's size, from the backend's
/// [`BatchEval::preferred_batch`], and the dealt bytes do not depend on it.
pub struct DealScratch<'a> {
    /// PRF blocks, then two root blocks per group element.
    blocks: &'a mut [Block],
    /// Three words per group element: its mask, its key's point α and β.
    words: &'a mut [u64],
}

impl core::fmt::Debug for DealScratch<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DealScratch")
            .field("blocks", &self.blocks.len())
            .field("words", &self.words.len())
            .finish()
    }
}

/// One group's key-generation inputs, carved from a [`DealScratch`].
struct GenInputs<'a> {
    masks: &'a mut [u64],
    alphas: &'a mut [u64],
    betas: &'a [u64],
    roots: &'a mut [[Block; 2]],
}

impl<'a> DealScratch<'a> {
    /// Scratch over `blocks` ([`Gate::deal_scratch_blocks`] of them) and
    /// `words` ([`DealScratch::words`] of the group).
    pub fn new(blocks: &'a mut [Block], words: &'a mut [u64]) -> Self {
        DealScratch { blocks, words }
    }

    /// Words for a group of `group` elements.
    pub const fn words(group: usize) -> usize {
        3 * group
    }

    /// The group's size, the PRF blocks (at least one element's for each
    /// party of a gate with `per` blocks per element) and the group's
    /// inputs, β set to 1 (bit outputs).
    fn parts(&mut self, per: usize) -> Result<(usize, &mut [Block], GenInputs<'_>), Error> {
        let group = self.words.len() / 3;
        let prf_len = self.blocks.len().saturating_sub(2 * group);
        if group == 0 || prf_len < 2 * per {
            return Err(Error::BufferLength);
        }
        let (prf, roots) = self.blocks.split_at_mut(prf_len);
        let (roots, _) = roots.as_chunks_mut::<2>();
        let (masks, rest) = self.words.split_at_mut(group);
        let (alphas, betas) = rest.split_at_mut(group);
        betas[..group].fill(1);
        let betas = &betas[..group];
        Ok((
            group,
            prf,
            GenInputs {
                masks,
                alphas,
                betas,
                roots,
            },
        ))
    }
}

/// PRF blocks per party and batch that [`Gate::deal_scratch_blocks`] asks
/// for: 64 KiB, enough to keep AES pipelines full on the dealer.
const PRF_BUFFER: usize = 4096;

/// PRF blocks an evaluator expands per batch on its own stack (2 KiB): a
/// party expands a few blocks per element, so batches of this size already
/// keep a pipelined AES busy, and the frame stays small enough for a
/// microcontroller (examples/mcu measures it).
const PRF_STACK: usize = 128;

/// The most PRF blocks one element can need: every slot, key and seeded
/// word at its capacity.
const MAX_PRF_BLOCKS: usize =
    SLOT_ROOTS + MAX_KEYS + (crate::phi::MAX_BEAVER + crate::phi::MAX_MONOS).div_ceil(2);

// Every gate fits at least one element in an evaluator's batch.
const _: () = assert!(MAX_PRF_BLOCKS <= PRF_STACK);

/// Offsets into an evaluator's scratch.
#[derive(Clone, Copy, Debug)]
struct Layout {
    x_hat: usize,
    mask: usize,
    rho: usize,
    and: usize,
    nodes: usize,
    e: usize,
    a: usize,
    u: usize,
    monos: usize,
    out: usize,
    fss: usize,
    end: usize,
}

/// One gate's key material as a party holds it. Secret: its `Debug` shows
/// lengths only.
#[derive(Clone, Copy, Default)]
pub struct PartyKeys<'a> {
    /// The DCF keys per key width: whole keys (roots included,
    /// [`Gate::fill_roots`]) where `roots[k]` is empty, else their bodies
    /// ([`crate::fss::Params::body_len`] bytes each).
    pub dcf: [&'a [u8]; MAX_KEYS],
    /// The keys' 16-byte roots per key width ([`Gate::derive_roots`]) when
    /// `dcf` holds bodies; empty when it holds whole keys.
    pub roots: [&'a [u8]; MAX_KEYS],
    /// P1's explicit words (empty for P0).
    pub explicit: &'a [u64],
}

impl core::fmt::Debug for PartyKeys<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let lens = self.dcf.map(<[u8]>::len);
        f.debug_struct("PartyKeys")
            .field("dcf_bytes", &lens)
            .field("root_bytes", &self.roots.map(<[u8]>::len))
            .field("explicit_words", &self.explicit.len())
            .finish()
    }
}

impl<'a> PartyKeys<'a> {
    /// Key material from the first key slots' keys `dcf` and roots
    /// `roots` (the slots after them empty) and P1's `explicit` words.
    pub fn of(dcf: &[&'a [u8]], roots: &[&'a [u8]], explicit: &'a [u64]) -> PartyKeys<'a> {
        let slot = |s: &[&'a [u8]], k: usize| s.get(k).copied().unwrap_or_default();
        PartyKeys {
            dcf: core::array::from_fn(|k| slot(dcf, k)),
            roots: core::array::from_fn(|k| slot(roots, k)),
            explicit,
        }
    }

    /// Elements `start..end` of key width `k` as a batch under `params`.
    fn batch(
        &self,
        k: usize,
        params: Params,
        party: Party,
        start: usize,
        end: usize,
    ) -> Result<KeyBatch<'a>, Error> {
        let (roots, dcf) = (self.roots[k], self.dcf[k]);
        let range = |len: usize| dcf.get(start * len..end * len).ok_or(Error::BufferLength);
        if roots.is_empty() {
            KeyBatch::new(params, party, range(params.key_len())?)
        } else {
            let r = roots.get(start * 16..end * 16).ok_or(Error::BufferLength)?;
            KeyBatch::split(params, party, r, range(params.body_len())?)
        }
    }

    /// Whether key width `k` holds exactly `n` keys under `params`.
    fn holds(&self, k: usize, params: Params, n: usize) -> bool {
        if self.roots[k].is_empty() {
            self.dcf[k].len() == n * params.key_len()
        } else {
            self.roots[k].len() == n * 16 && self.dcf[k].len() == n * params.body_len()
        }
    }
}

/// One party's evaluation of a gate over a batch, as a state machine over
/// caller buffers: call [`Eval::prepare`] and [`Eval::finish`] for each
/// round in order, then [`Eval::outputs`].
pub struct Eval<'a> {
    gate: &'a Gate,
    party: Party,
    n: usize,
    keys: PartyKeys<'a>,
    s: &'a mut [u64],
    l: Layout,
    next: usize,
    /// Between [`Eval::open_deferred`] and [`Eval::fss_done`].
    deferred: bool,
    /// Benchmarks only: run Φ by the interpreter instead of the program.
    #[cfg(feature = "interpreter")]
    interpret: bool,
}

impl core::fmt::Debug for Eval<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Eval")
            .field("party", &self.party)
            .field("n", &self.n)
            .finish_non_exhaustive()
    }
}

impl<'a> Eval<'a> {
    /// Prepares party `party` to evaluate `n` elements (element indices
    /// `first..first + n` of the key material) on its `input` shares with
    /// its `keys`; `scratch` holds at least [`Gate::scratch_words`] words.
    /// `mask` overrides the seed-derived input-mask shares, as in
    /// [`Gate::deal`]. An [`Input::Masked`] gate takes an empty `input` and
    /// gets x̂ from [`Eval::set_masked`].
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gate: &'a Gate,
        h: &dyn Hasher,
        party: Party,
        seed: &[u8; 16],
        mask: Option<&[u64]>,
        first: u64,
        n: usize,
        keys: PartyKeys<'a>,
        input: &[u64],
        scratch: &'a mut [u64],
    ) -> Result<Eval<'a>, Error> {
        if mask.is_some_and(|m| m.len() != n) {
            return Err(Error::BufferLength);
        }
        let l = gate.check_eval_buffers(party, n, &keys, input.len(), scratch.len())?;
        let mut ev = Eval {
            gate,
            party,
            n,
            keys,
            s: scratch,
            l,
            next: 0,
            deferred: false,
            #[cfg(feature = "interpreter")]
            interpret: false,
        };
        ev.load_seeded(h, seed, first);
        if let Some(m) = mask {
            ev.set_mask(m);
        }
        // The opening's own half: x_b + r_b.
        let w = gate.ring();
        for (j, x) in input.iter().enumerate() {
            ev.s[l.x_hat + j] = w.add(*x, ev.s[l.mask + j]);
        }
        Ok(ev)
    }

    /// Takes the mask shares from the caller instead of the seed (as
    /// [`Gate::deal`]'s `mask`): reduced to the gate's ring, and copied into
    /// the monomials equal to `r`.
    fn set_mask(&mut self, m: &[u64]) {
        let (g, l, n) = (self.gate, self.l, self.n);
        let w = g.ring();
        for (d, v) in self.s[l.mask..l.mask + n].iter_mut().zip(m) {
            *d = w.reduce(*v);
        }
        let mm = g.plan.mono_count;
        for (k, mono) in g.plan.monos[..mm].iter().enumerate() {
            if mono.is_seeded() && mono.r == 1 {
                for i in 0..n {
                    self.s[l.monos + k * n + i] = self.s[l.mask + i];
                }
            }
        }
    }

    /// Unpacks this party's seeded material into scratch.
    fn load_seeded(&mut self, h: &dyn Hasher, seed: &[u8; 16], first: u64) {
        let g = self.gate;
        let w = g.ring();
        let per = g.prf_blocks();
        let pb = self.party.index();
        let l = self.l;
        let chunk = PRF_STACK / per;
        let mut blocks = [Block::ZERO; PRF_STACK];
        let ew = g.explicit_words();
        let u = g.plan.beaver_count;
        let mut done = 0;
        while done < self.n {
            let n = chunk.min(self.n - done);
            g.expand(h, seed, first + cast::u64_from_usize(done), n, &mut blocks);
            for e in 0..n {
                let i = done + e;
                let b = &blocks[e * per..(e + 1) * per];
                self.s[l.mask + i] = w.reduce(b[0].low64());
                self.s[l.rho + i] = b[0].high64();
                self.s[l.and + 3 * i] = b[SLOT_AND].low64();
                self.s[l.and + 3 * i + 1] = b[SLOT_AND].high64();
                self.s[l.and + 3 * i + 2] = if pb == 0 || g.compiled.and_count == 0 {
                    b[SLOT_GAMMA].low64()
                } else {
                    self.keys.explicit[i * ew]
                };
                for j in 0..u {
                    self.s[l.a + i * u + j] = w.reduce(g.seeded_word(b, j));
                }
            }
            self.load_monos(&blocks, done, n);
            done += n;
        }
    }

    /// Monomial shares of elements `done..done + n`, whose PRF blocks are
    /// `blocks`: 1 and r, a_l from the seed; the rest from the seed (P0) or
    /// the explicit words (P1). Column by column, the source chosen once per
    /// column (the columns are `n` words apart): element by element, with
    /// the source matched for each, `Eval::new` took 6.5 % of MiniLM-128's
    /// online CPU samples, and 4.0 % this way.
    fn load_monos(&mut self, blocks: &[Block], done: usize, n: usize) {
        let g = self.gate;
        let (w, l, per) = (g.ring(), self.l, g.prf_blocks());
        let (u, ew) = (g.plan.beaver_count, g.explicit_words());
        let base = usize::from(g.compiled.and_count > 0);
        let explicit = self.keys.explicit;
        let (own, monos) = self.s.split_at_mut(l.monos);
        let m = g.plan.mono_count;
        for (k, src) in g.plan.mono_source[..m].iter().enumerate() {
            let col = &mut monos[k * self.n + done..][..n];
            let at = |e: usize| done + e;
            match *src {
                crate::phi::MonoSource::One => col.fill(1),
                crate::phi::MonoSource::Mask => col.copy_from_slice(&own[l.mask + done..][..n]),
                crate::phi::MonoSource::Beaver(a) => {
                    let a = usize::from(a);
                    for (e, v) in col.iter_mut().enumerate() {
                        *v = own[l.a + at(e) * u + a];
                    }
                }
                crate::phi::MonoSource::Dealt(d) if self.party == Party::P1 => {
                    let d = base + usize::from(d);
                    for (e, v) in col.iter_mut().enumerate() {
                        *v = explicit[at(e) * ew + d];
                    }
                }
                crate::phi::MonoSource::Dealt(d) => {
                    let d = u + usize::from(d);
                    for (e, v) in col.iter_mut().enumerate() {
                        *v = w.reduce(g.seeded_word(&blocks[e * per..(e + 1) * per], d));
                    }
                }
            }
        }
    }

    /// Ends the evaluation and hands its scratch back to the caller (for
    /// drivers that reuse one area across steps, such as
    /// [`chain::ChainEval`]).
    pub fn into_scratch(self) -> &'a mut [u64] {
        self.s
    }

    /// The gate being evaluated.
    pub fn gate(&self) -> &'a Gate {
        self.gate
    }

    /// The next round to run (`rounds()` when finished).
    pub fn next_round(&self) -> usize {
        self.next
    }

    /// Supplies the public masked input directly (for [`Input::Masked`]
    /// gates) and runs the FSS evaluation.
    pub fn set_masked(&mut self, x_hat: &[u64], fss: &dyn BatchEval) -> Result<(), Error> {
        if x_hat.len() != self.n {
            return Err(Error::BufferLength);
        }
        let w = self.gate.ring();
        for (d, x) in self.s[self.l.x_hat..self.l.x_hat + self.n]
            .iter_mut()
            .zip(x_hat)
        {
            *d = w.reduce(*x);
        }
        self.evaluate_fss(fss)?;
        self.after_round(fss)
    }

    /// Writes what this party sends in round `i`.
    fn prepare_round(&mut self, i: usize, send: &mut [u8]) -> Result<(), Error> {
        let round = self.expect_round(i, send.len())?;
        let n = self.n;
        let l = self.l;
        let w = self.gate.ring();
        match round {
            Round::Open => mpc::open_prepare(w, &self.s[l.x_hat..l.x_hat + n], send),
            Round::And(level) => {
                let bits = self.and_messages(level, None);
                self.pack_message(bits, send)
            }
            Round::Bits => {
                let b = self.gate.plan.b2a_count;
                for j in 0..n {
                    let rho = self.s[l.rho + j];
                    for k in 0..b {
                        let bit = self.node(j, self.gate.plan.b2a[k]) ^ ((rho >> k) & 1);
                        self.s[l.e + j * b + k] = bit;
                    }
                }
                mpc::pack_bits(&self.s[l.e..l.e + n * b], send)
            }
            Round::Beaver => {
                // `c_i − a_i` was computed when the previous round finished.
                let u = self.gate.plan.beaver_count;
                mpc::open_prepare(w, &self.s[l.u..l.u + n * u], send)
            }
        }
    }

    /// Consumes the peer's message of round `i`.
    fn finish_round(&mut self, i: usize, recv: &[u8], fss: &dyn BatchEval) -> Result<(), Error> {
        let round = self.expect_round(i, recv.len())?;
        let n = self.n;
        let l = self.l;
        let w = self.gate.ring();
        match round {
            Round::Open => {
                let (head, _) = self.s.split_at_mut(l.x_hat + n);
                let mine = &mut head[l.x_hat..];
                wire_add(w, mine, recv)?;
                self.evaluate_fss(fss)?;
            }
            Round::And(level) => {
                self.and_messages(level, Some(recv));
            }
            Round::Bits => {
                let b = self.gate.plan.b2a_count;
                let region = &mut self.s[l.e..l.e + n * b];
                for (k, v) in region.iter_mut().enumerate() {
                    *v = (*v ^ u64::from(recv[k / 8] >> (k % 8))) & 1;
                }
                check_padding(recv, n * b)?;
            }
            Round::Beaver => {
                let u = self.gate.plan.beaver_count;
                let region = &mut self.s[l.u..l.u + n * u];
                wire_add(w, region, recv)?;
            }
        }
        self.next += 1;
        self.after_round(fss)
    }

    /// Local work that follows a round: the Beaver section before the
    /// Beaver round, the outputs after the last round.
    fn after_round(&mut self, fss: &dyn BatchEval) -> Result<(), Error> {
        let (sched, count) = self.gate.schedule();
        if self.next == count {
            self.run_program(Section::Outputs, fss)
        } else if sched[self.next] == Round::Beaver {
            self.run_program(Section::Beaver, fss)
        } else {
            Ok(())
        }
    }

    /// Round `i`, if it is the next one and `len` is its message length.
    fn expect_round(&self, i: usize, len: usize) -> Result<Round, Error> {
        let (sched, count) = self.gate.schedule();
        if i != self.next || i >= count {
            return Err(Error::Unsupported);
        }
        if len != self.send_len(i) {
            return Err(Error::BufferLength);
        }
        Ok(sched[i])
    }

    /// This party's share of `node` for element `j` (nodes are bit-sliced:
    /// one word per node per block of 64 elements).
    fn node(&self, j: usize, node: u8) -> u64 {
        let at = self.l.nodes + j / BLOCK * self.gate.compiled.node_count + usize::from(node);
        (self.s[at] >> (j % BLOCK)) & 1
    }

    /// Evaluates every DCF key at its points and forms the base nodes.
    fn evaluate_fss(&mut self, fss: &dyn BatchEval) -> Result<(), Error> {
        let total = self.gate.compiled.total_points();
        // The backend's batch, in whole bit-slicing blocks so that every
        // batch after the first starts on a block boundary.
        let batch = fss
            .preferred_batch()
            .max(1)
            .next_multiple_of(BLOCK)
            .min(self.n.max(1));
        let mut start = 0;
        while start < self.n {
            let count = batch.min(self.n - start);
            self.fss_points(start, count, batch);
            let area = &mut self.s[self.l.fss..self.l.fss + 2 * batch * total];
            let (points, outs) = area.split_at_mut(batch * total);
            let mut off = 0;
            for k in 0..self.gate.compiled.key_count {
                let per = self.gate.compiled.points_per_key[k];
                let params = self.gate.key_params(k);
                let keys = (self.keys).batch(k, params, self.party, start, start + count)?;
                let span = off..off + count * per;
                fss.eval(&keys, &points[span.clone()], &mut outs[span])?;
                off += count * per;
            }
            self.fss_base_words(start, count, batch);
            start += count;
        }
        Ok(())
    }

    /// Writes the FSS points of elements `start..start + count` into the
    /// FSS area, whose batches hold `batch` elements: key-major regions,
    /// key `k`'s points for every element.
    fn fss_points(&mut self, start: usize, count: usize, batch: usize) {
        let c = &self.gate.compiled;
        let l = self.l;
        let total = c.total_points();
        let (head, area) = self.s.split_at_mut(l.fss);
        let points = &mut area[..batch * total];
        let mut off = 0;
        for k in 0..c.key_count {
            let per = c.points_per_key[k];
            for e in 0..count {
                let x_hat = head[l.x_hat + start + e];
                c.points(k, x_hat, &mut points[off + e * per..off + (e + 1) * per]);
            }
            off += count * per;
        }
    }

    /// Forms the circuit's base nodes of elements `start..start + count`
    /// from the FSS outputs in the FSS area, bit-sliced 64 elements per
    /// word (`start` is on a block boundary).
    fn fss_base_words(&mut self, start: usize, count: usize, batch: usize) {
        let c = &self.gate.compiled;
        let l = self.l;
        let total = c.total_points();
        let pb = self.party.index();
        let (head, area) = self.s.split_at_mut(l.fss);
        let outs = &area[batch * total..2 * batch * total];
        let nc = c.node_count;
        let mut e = 0;
        while e < count {
            let block = BLOCK.min(count - e);
            let mut refs: [&[u64]; MAX_KEYS] = [&[]; MAX_KEYS];
            let mut off = 0;
            for (k, r) in refs.iter_mut().enumerate().take(c.key_count) {
                let per = c.points_per_key[k];
                *r = &outs[off + e * per..off + (e + block) * per];
                off += count * per;
            }
            // x̂ lies before the node area.
            let (x_area, words) = head.split_at_mut(l.nodes + (start + e) / BLOCK * nc);
            let x_hat = &x_area[l.x_hat + start + e..l.x_hat + start + e + block];
            c.base_words(pb, x_hat, &refs, &mut words[..nc]);
            #[cfg(test)]
            check_base_words(c, pb, x_hat, &refs, &words[..nc]);
            e += block;
        }
    }

    /// Takes the peer's message of round `i`, the opening, without
    /// evaluating the FSS keys: for hosts that gather the evaluations of
    /// many evaluators into one backend call ([`BatchEval::eval_many`]).
    /// Follow it with [`Eval::fss_job`] for every key slot, the backend,
    /// then [`Eval::fss_done`].
    pub fn open_deferred(&mut self, i: usize, recv: &[u8]) -> Result<(), Error> {
        if self.expect_round(i, recv.len())? != Round::Open {
            return Err(Error::Unsupported);
        }
        let n = self.n;
        let l = self.l;
        let w = self.gate.ring();
        let (head, _) = self.s.split_at_mut(l.x_hat + n);
        wire_add(w, &mut head[l.x_hat..], recv)?;
        self.fss_points(0, n, n);
        self.deferred = true;
        Ok(())
    }

    /// Key slot `k`'s keys, points and output area after
    /// [`Eval::open_deferred`]; `None` past the last slot.
    pub fn fss_job(&mut self, k: usize) -> Result<Option<EvalJob<'_>>, Error> {
        let c = &self.gate.compiled;
        if !self.deferred {
            return Err(Error::Unsupported);
        }
        if k >= c.key_count {
            return Ok(None);
        }
        let (n, total) = (self.n, c.total_points());
        let off: usize = c.points_per_key[..k].iter().map(|per| n * per).sum();
        let len = n * c.points_per_key[k];
        let params = self.gate.key_params(k);
        let keys = (self.keys).batch(k, params, self.party, 0, n)?;
        let area = &mut self.s[self.l.fss..self.l.fss + 2 * n * total];
        let (points, outs) = area.split_at_mut(n * total);
        Ok(Some(EvalJob {
            keys,
            points: &points[off..off + len],
            out: &mut outs[off..off + len],
        }))
    }

    /// Ends the opening round after every [`Eval::fss_job`] was evaluated:
    /// the base nodes, then the local work that follows the round.
    pub fn fss_done(&mut self, fss: &dyn BatchEval) -> Result<(), Error> {
        if !self.deferred {
            return Err(Error::Unsupported);
        }
        self.deferred = false;
        let n = self.n;
        self.fss_base_words(0, n, n);
        self.next += 1;
        self.after_round(fss)
    }

    /// AND round of `level`: without `recv`, writes this party's masked
    /// inputs into the e-area and returns how many bits; with `recv`,
    /// finishes the gates.
    fn and_messages(&mut self, level: u8, recv: Option<&[u8]>) -> usize {
        let c = &self.gate.compiled;
        let l = self.l;
        let pb = self.party.index();
        let mut gates = [0u8; crate::compile::MAX_ANDS];
        let mut count = 0;
        for &a in &c.ands[..c.and_count] {
            if c.level[usize::from(a)] == level {
                gates[count] = a;
                count += 1;
            }
        }
        let mut slot = 0;
        // AND triple bits are indexed by the gate's position in `ands`.
        let index_of = |node: u8| {
            c.ands[..c.and_count]
                .iter()
                .position(|&x| x == node)
                .unwrap_or(0)
        };
        let nc = c.node_count;
        for j in 0..self.n {
            let alpha = self.s[l.and + 3 * j];
            let beta = self.s[l.and + 3 * j + 1];
            let gamma = self.s[l.and + 3 * j + 2];
            for &node in &gates[..count] {
                let crate::compile::Node::And(x, y) = c.nodes[usize::from(node)] else {
                    continue;
                };
                let t = index_of(node);
                let (al, be, ga) = ((alpha >> t) & 1, (beta >> t) & 1, (gamma >> t) & 1);
                let d_mine = self.node(j, x) ^ al;
                let e_mine = self.node(j, y) ^ be;
                match recv {
                    None => {
                        self.s[l.e + slot] = d_mine;
                        self.s[l.e + slot + 1] = e_mine;
                    }
                    Some(r) => {
                        let theirs = |k: usize| u64::from(r[k / 8] >> (k % 8)) & 1;
                        let d = d_mine ^ theirs(slot);
                        let e = e_mine ^ theirs(slot + 1);
                        let z = mpc::and_share(pb, d, e, al, be, ga);
                        // AND nodes start at 0 and this level writes each once.
                        self.s[l.nodes + j / BLOCK * nc + usize::from(node)] |= z << (j % BLOCK);
                    }
                }
                slot += 2;
            }
        }
        if recv.is_some() {
            for (b, words) in self.s[l.nodes..l.e].chunks_mut(nc).enumerate() {
                let count = BLOCK.min(self.n - b * BLOCK);
                c.fill_level_words(pb, words, level, count);
            }
        }
        slot
    }

    fn pack_message(&mut self, bits: usize, send: &mut [u8]) -> Result<(), Error> {
        mpc::pack_bits(&self.s[self.l.e..self.l.e + bits], send)
    }

    /// Runs the Φ program's `section`: the Beaver section writes this
    /// party's `c_i − a_i` into the opened-value area, the outputs section
    /// the ring outputs into the output area.
    fn run_program(&mut self, section: Section, fss: &dyn BatchEval) -> Result<(), Error> {
        #[cfg(feature = "interpreter")]
        if self.interpret {
            return self.run_interpreter(section);
        }
        let g = self.gate;
        let (l, n) = (self.l, self.n);
        let (b, u, m) = (g.plan.b2a_count, g.plan.beaver_count, g.plan.mono_count);
        let (at, len) = match section {
            Section::Beaver => (l.u, n * u),
            Section::Outputs => (l.out, n * g.phi.count),
        };
        let (head, tail) = self.s.split_at_mut(at);
        let (out, rest) = tail.split_at_mut(len);
        // The monomial shares lie in `head` (outputs) or `rest` (Beaver).
        let (shares, cols) = match section {
            Section::Beaver => {
                let (shares, rest) = rest.split_at_mut(n * m);
                (&*shares, &mut rest[l.fss - l.monos - n * m..])
            }
            Section::Outputs => (
                &head[l.monos..l.monos + n * m],
                &mut rest[l.fss - l.out - len..],
            ),
        };
        let input = program::Inputs {
            x_hat: &head[l.x_hat..l.x_hat + n],
            e: &head[l.e..l.e + n * b],
            u: if section == Section::Outputs {
                &head[l.u..l.u + n * u]
            } else {
                &[]
            },
            a: if section == Section::Beaver {
                &head[l.a..l.a + n * u]
            } else {
                &[]
            },
            shares,
        };
        fss.eval_phi(&g.program, section, self.party, &input, out, cols)?;
        #[cfg(test)]
        self.check_against_interpreter(section);
        Ok(())
    }

    /// Writes the ring outputs (`n × outputs`, element-major) and the bit
    /// outputs as XOR shares (`n × bit_outputs`, one per word).
    pub fn outputs(&self, arith: &mut [u64], bits: &mut [u64]) -> Result<(), Error> {
        let g = self.gate;
        let c = &g.compiled;
        if self.next != g.schedule().1 {
            return Err(Error::Unsupported);
        }
        let outs = g.phi.count;
        let nb = c.suf.bools;
        if arith.len() != self.n * outs || bits.len() != self.n * nb {
            return Err(Error::BufferLength);
        }
        arith.copy_from_slice(&self.s[self.l.out..self.l.out + self.n * outs]);
        for j in 0..self.n {
            for (o, out) in bits[j * nb..(j + 1) * nb].iter_mut().enumerate() {
                *out = self.node(j, c.bool_node[o]);
            }
        }
        Ok(())
    }
}

impl Protocol for Eval<'_> {
    fn rounds(&self) -> usize {
        self.gate.schedule().1
    }

    fn send_len(&self, round: usize) -> usize {
        let (sched, count) = self.gate.schedule();
        if round < count {
            self.gate.round_bytes(sched[round], self.n)
        } else {
            0
        }
    }

    fn output_len(&self) -> usize {
        self.n * (self.gate.outputs() + self.gate.bit_outputs())
    }

    fn prepare(&mut self, round: usize, send: &mut [u8]) -> Result<(), Error> {
        self.prepare_round(round, send)
    }

    fn finish(&mut self, round: usize, recv: &[u8], fss: &dyn BatchEval) -> Result<(), Error> {
        self.finish_round(round, recv, fss)
    }

    /// The ring outputs (`n × outputs`), then the bit outputs
    /// (`n × bit_outputs`), as in [`Eval::outputs`].
    fn output(&self, out: &mut [u64]) -> Result<(), Error> {
        if out.len() != self.output_len() {
            return Err(Error::BufferLength);
        }
        let (arith, bits) = out.split_at_mut(self.n * self.gate.outputs());
        self.outputs(arith, bits)
    }
}

/// The per-element Φ interpreter: the test oracle of the compiled block
/// program ([`crate::phi::program`]). It is compiled into core's own tests,
/// where every Beaver round and every output of every gate is checked
/// against it bit for bit, and behind the non-default `interpreter` feature,
/// which only the benchmarks enable to measure it beside the program.
#[cfg(any(test, feature = "interpreter"))]
impl Eval<'_> {
    /// This party's `c_i − a_i` of elements `first..` (`count × beaver`,
    /// as many as `out` holds), by the interpreter.
    pub fn beaver_interpreted(&self, first: usize, out: &mut [u64]) -> Result<(), Error> {
        let g = self.gate;
        let c = &g.compiled;
        let w = g.ring();
        let l = self.l;
        let pb = self.party.index();
        let b = g.plan.b2a_count;
        let u = g.plan.beaver_count;
        let count = out.len().checked_div(u).unwrap_or(0);
        if out.len() != count * u || first + count > self.n {
            return Err(Error::BufferLength);
        }
        for (o_at, j) in (first..first + count).enumerate() {
            for (slot, &(o, i)) in g.plan.beaver[..u].iter().enumerate() {
                let (o, i) = (usize::from(o), usize::from(i));
                // c = v_{m−1} + Σ_t Δ_t·C_t with C_t = e_t + (1 − 2e_t)ρ_t.
                let mut acc = if pb == 0 { c.coefficient_base(o, i) } else { 0 };
                let row = o * (crate::suf::MAX_DEGREE + 1) + i;
                for &(bi, d) in &g.plan.coef_terms[row][..usize::from(g.plan.coef_len[row])] {
                    let bi = usize::from(bi);
                    let e = self.s[l.e + j * b + bi] & 1;
                    let mi = usize::from(g.plan.rho_mono[bi]);
                    let rho = self.s[l.monos + mi * self.n + j];
                    acc = w.add(acc, w.mul(d, mpc::b2a_share(w, pb, e, rho)));
                }
                out[o_at * u + slot] = w.sub(acc, self.s[l.a + j * u + slot]);
            }
        }
        Ok(())
    }

    /// The ring outputs of elements `first..` (`count × outputs`,
    /// element-major, as many as `arith` holds), by the interpreter.
    pub fn outputs_interpreted(&self, first: usize, arith: &mut [u64]) -> Result<(), Error> {
        use crate::phi::{MAX_ENTRIES, MAX_FACTORS, MAX_MONOS, Publics};
        let g = self.gate;
        let outs = g.phi.count;
        let count = arith.len().checked_div(outs).unwrap_or(0);
        if arith.len() != count * outs || first + count > self.n {
            return Err(Error::BufferLength);
        }
        let w = g.ring();
        let l = self.l;
        let pb = self.party.index();
        let b = g.plan.b2a_count;
        let u = g.plan.beaver_count;
        let m = g.plan.mono_count;
        let mut coef = [0u64; MAX_MONOS];
        let mut shares = [0u64; MAX_MONOS];
        let mut entries = [[0u64; MAX_ENTRIES]; MAX_FACTORS];
        for (o_at, j) in (first..first + count).enumerate() {
            let x_hat = self.s[l.x_hat + j];
            let publics = Publics::new(
                w,
                x_hat,
                &self.s[l.e + j * b..l.e + (j + 1) * b],
                &self.s[l.u + j * u..l.u + (j + 1) * u],
            );
            for (k, sh) in shares[..m].iter_mut().enumerate() {
                *sh = self.s[l.monos + k * self.n + j];
            }
            let mut k = 0;
            for o in 0..outs {
                let output = &g.phi.outputs[o];
                coef[..m].fill(0);
                let at = (o, x_hat, &publics);
                interpret_terms(g, at, &mut k, &mut entries, &mut coef);
                let mut acc = if pb == 0 { coef[0] } else { 0 };
                for i in 1..m {
                    acc = w.add(acc, w.mul(coef[i], shares[i]));
                }
                arith[o_at * outs + o] = output.ring.reduce(acc);
            }
        }
        Ok(())
    }
}

/// The interpreter's coefficients of output `o` at `x_hat`: each term's
/// public factor times its entries, added to the coefficient of the
/// monomial each contribution names; `k` walks the plan's contributions
/// in order across the outputs.
#[cfg(any(test, feature = "interpreter"))]
fn interpret_terms(
    g: &Gate,
    (o, x_hat, publics): (usize, u64, &crate::phi::Publics<'_>),
    k: &mut usize,
    entries: &mut [[u64; crate::phi::MAX_ENTRIES]; crate::phi::MAX_FACTORS],
    coef: &mut [u64; crate::phi::MAX_MONOS],
) {
    let (c, w) = (&g.compiled, g.ring());
    let output = &g.phi.outputs[o];
    for t in 0..output.len {
        let term = &output.terms[t];
        let p = w.mul(term.scale, term.public.at(x_hat));
        for f in 0..term.len {
            g.plan.entries(c, term.factors[f], publics, &mut entries[f]);
        }
        while *k < g.plan.contrib_count
            && usize::from(g.plan.contribs[*k].output) == o
            && usize::from(g.plan.contribs[*k].term) == t
        {
            let ct = &g.plan.contribs[*k];
            let mut v = p;
            for f in 0..term.len {
                v = w.mul(v, entries[f][usize::from(ct.entries[f])]);
            }
            let mi = usize::from(ct.mono);
            coef[mi] = w.add(coef[mi], v);
            *k += 1;
        }
    }
}

#[cfg(feature = "interpreter")]
impl Eval<'_> {
    /// Benchmarks only: from now on run Φ by the per-element interpreter.
    pub fn use_interpreter(&mut self) {
        self.interpret = true;
    }

    /// Benchmarks only: runs the compiled program's `section` again on the
    /// current state (the Beaver section overwrites the opened values).
    pub fn run_section(&mut self, section: Section, backend: &dyn BatchEval) -> Result<(), Error> {
        let interpret = core::mem::replace(&mut self.interpret, false);
        let result = self.run_program(section, backend);
        self.interpret = interpret;
        result
    }

    /// The interpreter's result of `section`, where the program's would go
    /// (through a stack buffer: the interpreter reads the same scratch).
    fn run_interpreter(&mut self, section: Section) -> Result<(), Error> {
        const CHUNK: usize = 64;
        let (at, width) = match section {
            Section::Beaver => (self.l.u, self.gate.plan.beaver_count),
            Section::Outputs => (self.l.out, self.gate.phi.count),
        };
        let mut buf = [0u64; CHUNK * crate::phi::MAX_BEAVER];
        let mut first = 0;
        while first < self.n {
            let len = CHUNK.min(self.n - first) * width;
            match section {
                Section::Beaver => self.beaver_interpreted(first, &mut buf[..len])?,
                Section::Outputs => self.outputs_interpreted(first, &mut buf[..len])?,
            }
            let to = at + first * width;
            self.s[to..to + len].copy_from_slice(&buf[..len]);
            first += CHUNK;
        }
        Ok(())
    }
}

#[cfg(test)]
impl Eval<'_> {
    /// The compiled section's result equals the interpreter's, bit for bit.
    fn check_against_interpreter(&self, section: Section) {
        let (at, len) = match section {
            Section::Beaver => (self.l.u, self.n * self.gate.plan.beaver_count),
            Section::Outputs => (self.l.out, self.n * self.gate.phi.count),
        };
        let mut want = std::vec![0u64; len];
        match section {
            Section::Beaver => self.beaver_interpreted(0, &mut want),
            Section::Outputs => self.outputs_interpreted(0, &mut want),
        }
        .unwrap();
        assert_eq!(
            &self.s[at..at + len],
            &want[..],
            "compiled Φ {section:?} differs from the interpreter"
        );
    }
}

/// `mine += unpack(recv)` in place, element-wise.
pub(crate) fn wire_add(w: Width, mine: &mut [u64], recv: &[u8]) -> Result<(), Error> {
    // Unpack in blocks to stay allocation-free.
    const BLOCK: usize = 512;
    let bits = cast::usize_from_u32(w.bits());
    let mut tmp = [0u64; BLOCK];
    let mut done = 0;
    while done < mine.len() {
        let n = BLOCK.min(mine.len() - done);
        // Blocks of 512 words start on byte boundaries for any width.
        let from = done * bits / 8;
        let to = if done + n == mine.len() {
            recv.len()
        } else {
            (done + n) * bits / 8
        };
        crate::wire::unpack(w, &recv[from..to], &mut tmp[..n])?;
        for (m, t) in mine[done..done + n].iter_mut().zip(&tmp[..n]) {
            *m = w.add(*m, *t);
        }
        done += n;
    }
    Ok(())
}

/// The bit-sliced base nodes equal the per-element circuit evaluation
/// ([`Compiled::base_nodes`], the oracle) for every element of the block.
#[cfg(test)]
fn check_base_words(c: &Compiled, pb: u64, x_hat: &[u64], dcf: &[&[u64]; MAX_KEYS], words: &[u64]) {
    for (e, x) in x_hat.iter().enumerate() {
        let mut refs: [&[u64]; MAX_KEYS] = [&[]; MAX_KEYS];
        for (k, r) in refs.iter_mut().enumerate().take(c.key_count) {
            let per = c.points_per_key[k];
            *r = &dcf[k][e * per..(e + 1) * per];
        }
        let want = c.base_nodes(pb, *x, &refs);
        for (i, w) in words.iter().enumerate() {
            let bit = crate::compile::node_bit(want, cast::u8_from_index(i));
            assert_eq!((w >> e) & 1, bit, "bit-sliced node {i} of element {e}");
        }
    }
}

/// Padding bits after `count` bits must be zero.
fn check_padding(recv: &[u8], count: usize) -> Result<(), Error> {
    let used = count % 8;
    if used != 0 && recv.last().is_some_and(|b| b >> used != 0) {
        return Err(Error::Wire(crate::error::WireError::ReservedNonZero));
    }
    Ok(())
}

/// Test support: deal and run a gate in memory, reconstructing outputs.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use crate::batch::Serial;
    use crate::prg::{FixedKeyAes, Prg};
    use std::vec;
    use std::vec::Vec;

    /// Each key slot's buffer of `v` (empty slots past its end), as a
    /// dealer takes them.
    pub(crate) fn key_slices(v: &mut [Vec<u8>]) -> [&mut [u8]; MAX_KEYS] {
        let mut it = v.iter_mut();
        core::array::from_fn(|_| it.next().map_or(&mut [][..], Vec::as_mut_slice))
    }

    /// Evaluator scratch of `words` words left dirty, as a driver that
    /// reuses one area across steps hands it over: a different pattern in
    /// each party's area and at each word, none of them zero. An evaluator
    /// that read a word before writing it would disagree with the spec.
    pub(crate) fn dirty(words: usize, party: u64) -> Vec<u64> {
        (0..words as u64)
            .map(|i| (i ^ party << 63).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
            .collect()
    }

    /// Reconstructed outputs of a two-party run: ring outputs
    /// (element-major) and bits.
    pub(crate) struct Run {
        pub arith: Vec<u64>,
        pub bits: Vec<u64>,
        pub traffic: Traffic,
    }

    /// Deals `xs.len()` elements with the given masks (or seeded ones) and
    /// runs both parties on shares of `xs`.
    pub(crate) fn run(gate: &Gate, xs: &[u64], masks: Option<&[u64]>, salt: u8) -> Run {
        let n = xs.len();
        let w = gate.ring();
        let aes = FixedKeyAes::new();
        let seeds = [[salt; 16], [salt ^ 0x5a; 16]];
        let mut prg = Prg::new(&[salt ^ 0x33; 16]);
        let (m0, m1): (Vec<u64>, Vec<u64>) = match masks {
            Some(m) => {
                let m0: Vec<u64> = (0..n).map(|_| w.reduce(prg.next_u64())).collect();
                let m1 = m.iter().zip(&m0).map(|(r, a)| w.sub(*r, *a)).collect();
                (m0, m1)
            }
            None => (Vec::new(), Vec::new()),
        };
        let c = &gate.compiled;
        let mut k0: Vec<Vec<u8>> = (0..MAX_KEYS)
            .map(|k| {
                vec![
                    0u8;
                    if k < c.key_count {
                        n * gate.key_params(k).key_len()
                    } else {
                        0
                    }
                ]
            })
            .collect();
        let mut k1 = k0.clone();
        let mut explicit = vec![0u64; n * gate.explicit_words()];
        {
            let mut d0 = testing::key_slices(&mut k0);
            let mut d1 = testing::key_slices(&mut k1);
            let ms = masks.map(|_| [&m0[..], &m1[..]]);
            // Three elements per PRF batch and two per key-generation
            // group: every test crosses both kinds of edge.
            let mut prf = vec![Block::ZERO; 3 * gate.deal_scratch_min(0) + 2 * 2];
            let mut words = vec![0u64; DealScratch::words(2)];
            gate.deal(
                &Serial::new(),
                seeds,
                ms,
                7,
                n,
                &mut d0,
                &mut d1,
                &mut explicit,
                &mut DealScratch::new(&mut prf, &mut words),
            )
            .unwrap();
        }
        let x0: Vec<u64> = (0..n).map(|_| w.reduce(prg.next_u64())).collect();
        let x1: Vec<u64> = xs.iter().zip(&x0).map(|(x, a)| w.sub(*x, *a)).collect();
        let mut s0 = dirty(gate.scratch_words(n), 0);
        let mut s1 = dirty(gate.scratch_words(n), 1);
        let r0: [&[u8]; MAX_KEYS] = core::array::from_fn(|k| &k0[k][..]);
        let r1: [&[u8]; MAX_KEYS] = core::array::from_fn(|k| &k1[k][..]);
        let mask0 = masks.map(|_| &m0[..]);
        let mask1 = masks.map(|_| &m1[..]);
        let mut e0 = Eval::new(
            gate,
            &aes,
            Party::P0,
            &seeds[0],
            mask0,
            7,
            n,
            PartyKeys {
                dcf: r0,
                roots: [&[]; MAX_KEYS],
                explicit: &[],
            },
            &x0,
            &mut s0,
        )
        .unwrap();
        let mut e1 = Eval::new(
            gate,
            &aes,
            Party::P1,
            &seeds[1],
            mask1,
            7,
            n,
            PartyKeys {
                dcf: r1,
                roots: [&[]; MAX_KEYS],
                explicit: &explicit,
            },
            &x1,
            &mut s1,
        )
        .unwrap();
        let max = protocol::max_send_len(&e0);
        let mut b0 = vec![0u8; max];
        let mut b1 = vec![0u8; max];
        let serial = Serial::new();
        // Odd salts take the opening through the deferred path that hosts
        // use to gather a step's evaluations (`BatchEval::eval_many`), so
        // every exhaustive test checks both against the spec.
        let traffic = if salt % 2 == 1 {
            run_pair_deferred(gate, [&mut e0, &mut e1], &serial, [&mut b0, &mut b1])
        } else {
            run_pair(&mut e0, &mut e1, &serial, &mut b0, &mut b1).unwrap()
        };
        let outs = gate.outputs();
        let nb = gate.bit_outputs();
        let mut a0 = vec![0u64; n * outs];
        let mut a1 = vec![0u64; n * outs];
        let mut bb0 = vec![0u64; n * nb];
        let mut bb1 = vec![0u64; n * nb];
        e0.outputs(&mut a0, &mut bb0).unwrap();
        e1.outputs(&mut a1, &mut bb1).unwrap();
        let arith = a0
            .iter()
            .zip(&a1)
            .enumerate()
            .map(|(i, (a, b))| gate.phi.outputs[i % outs.max(1)].ring.add(*a, *b))
            .collect();
        let bits = bb0.iter().zip(&bb1).map(|(a, b)| a ^ b).collect();
        Run {
            arith,
            bits,
            traffic,
        }
    }

    /// [`run_pair`] with the opening round taken by
    /// [`Eval::open_deferred`], both parties' keys of each slot in one
    /// [`BatchEval::eval_many`] call, then [`Eval::fss_done`].
    fn run_pair_deferred(
        gate: &Gate,
        [e0, e1]: [&mut Eval<'_>; 2],
        backend: &dyn BatchEval,
        [b0, b1]: [&mut Vec<u8>; 2],
    ) -> protocol::Traffic {
        let (sched, rounds) = gate.schedule();
        let mut bytes = 0;
        for (i, round) in sched.iter().enumerate().take(rounds) {
            let len = e0.send_len(i);
            e0.prepare(i, &mut b0[..len]).unwrap();
            e1.prepare(i, &mut b1[..len]).unwrap();
            if *round == Round::Open {
                e0.open_deferred(i, &b1[..len]).unwrap();
                e1.open_deferred(i, &b0[..len]).unwrap();
                for k in 0..MAX_KEYS {
                    let mut jobs: Vec<EvalJob<'_>> = [e0.fss_job(k), e1.fss_job(k)]
                        .into_iter()
                        .filter_map(|j| j.unwrap())
                        .collect();
                    backend.eval_many(&mut jobs).unwrap();
                }
                e0.fss_done(backend).unwrap();
                e1.fss_done(backend).unwrap();
            } else {
                e0.finish(i, &b1[..len], backend).unwrap();
                e1.finish(i, &b0[..len], backend).unwrap();
            }
            bytes += len;
        }
        protocol::Traffic {
            rounds,
            bytes_per_party: bytes,
        }
    }

    /// Expected outputs of a gate at one input: ring outputs and bits.
    pub(crate) type Spec<'a> = &'a dyn Fn(u64) -> ([u64; 2], u32);

    /// Runs `xs` under per-element masks `rs` and compares with `spec`.
    pub(crate) fn check_pairs(gate: &Gate, xs: &[u64], rs: &[u64], spec: Spec<'_>, salt: u8) {
        let out = run(gate, xs, Some(rs), salt);
        let (o, b) = (gate.outputs(), gate.bit_outputs());
        for (i, (x, r)) in xs.iter().zip(rs).enumerate() {
            let (want, bits) = spec(*x);
            // The cleartext reference is the spec too.
            let mut reference = [0u64; 2];
            let ref_bits = gate.reference(*x, &mut reference);
            assert_eq!(&reference[..o], &want[..o], "reference: x={x:#x}");
            assert_eq!(
                ref_bits & ((1 << b) - 1),
                bits & ((1 << b) - 1),
                "reference bits: x={x:#x}"
            );
            for j in 0..o {
                assert_eq!(
                    out.arith[i * o + j],
                    want[j],
                    "output {j}: x={x:#x} r={r:#x}"
                );
            }
            for j in 0..b {
                assert_eq!(
                    out.bits[i * b + j],
                    u64::from((bits >> j) & 1),
                    "bit {j}: x={x:#x} r={r:#x}"
                );
            }
        }
    }

    /// Every input of the ring under at least 64 masks, including 0,
    /// 2^n − 1 and every wrap mask.
    pub(crate) fn exhaustive_small(gate: &Gate, spec: Spec<'_>) {
        let n = gate.ring();
        assert!(n.bits() <= 12, "exhaustive tests are for small rings");
        let xs: Vec<u64> = (0..1u64 << n.bits()).collect();
        let masks = wrap_masks(gate, 64);
        for (i, r) in masks.iter().enumerate() {
            check_pairs(gate, &xs, &vec![*r; xs.len()], spec, i as u8);
        }
    }

    /// Inputs worth testing at a wide ring: 0, ±1, the ends of the k-bit
    /// range and every boundary of the SUF ± 1.
    pub(crate) fn edge_inputs(gate: &Gate) -> Vec<u64> {
        let n = gate.ring();
        let k = gate.compiled.k;
        let mut xs = vec![0, 1, n.mask(), n.from_signed(-2)];
        for v in [k.half(), k.half() - 1, k.half() + 1] {
            xs.push(n.reduce(v));
            xs.push(n.neg(v));
        }
        let s = &gate.compiled.suf;
        for t in 1..s.intervals {
            for d in [-1i128, 0, 1] {
                xs.push(n.reduce((s.bounds[t] + d) as u64));
            }
        }
        xs
    }

    /// Every edge input under every wrap mask (for wide rings, where the
    /// exhaustive sweep is impossible; property tests add random pairs).
    pub(crate) fn edges(gate: &Gate, spec: Spec<'_>) {
        edges_where(gate, spec, &|_| true);
    }

    /// [`edges`] restricted to inputs `keep` accepts.
    pub(crate) fn edges_where(gate: &Gate, spec: Spec<'_>, keep: &dyn Fn(u64) -> bool) {
        let xs: Vec<u64> = edge_inputs(gate).into_iter().filter(|x| keep(*x)).collect();
        for (i, r) in wrap_masks(gate, 16).iter().enumerate() {
            check_pairs(gate, &xs, &vec![*r; xs.len()], spec, i as u8);
        }
    }

    /// Masks that hit every wrap point of every view: 0, 2^n − 1, and for
    /// each view (w, c) and threshold β (and β = 0) the masks with
    /// `r + c + β ≡ δ (mod 2^w)`, δ ∈ {−1, 0, 1}, with high bits all-zero,
    /// all-one and mixed; topped up with pseudorandom masks to `min`.
    pub(crate) fn wrap_masks(gate: &Gate, min: usize) -> Vec<u64> {
        let c = &gate.compiled;
        let w = gate.ring();
        let mut out = vec![0, w.mask()];
        for v in 0..c.view_count {
            let view = c.views[v];
            let mut thresholds = vec![0u64];
            thresholds.extend(
                c.queries[..c.query_count]
                    .iter()
                    .filter(|q| usize::from(q.view) == v)
                    .map(|q| q.threshold),
            );
            for beta in thresholds {
                for delta in [u64::MAX, 0, 1] {
                    let low = view.width.reduce(
                        0u64.wrapping_sub(view.add)
                            .wrapping_sub(beta)
                            .wrapping_add(delta),
                    );
                    for high in [0u64, u64::MAX, 0x5555_5555_5555_5555] {
                        let r = w.reduce((high & !view.width.mask()) | low);
                        if !out.contains(&r) {
                            out.push(r);
                        }
                    }
                }
            }
        }
        let mut prg = Prg::new(&[0xab; 16]);
        while out.len() < min {
            out.push(w.reduce(prg.next_u64()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{run, wrap_masks};
    use super::*;
    use crate::compile::View;
    use crate::phi::{Factor, Kappa, PolyMode, Public, Term};
    use crate::suf::{Domain, Op, Pred, Program};
    use std::vec::Vec;

    const N: Width = Width::of(8);

    fn relu() -> Suf {
        Suf::piecewise(
            N,
            Domain::Signed,
            0,
            1,
            1,
            &[0],
            &[[[0; 4], [0; 4]], [[0, 1, 0, 0], [0; 4]]],
        )
        .with_pred(Pred::Msb)
        .with_program(Program::from_ops(&[Op::Pred(0)]))
        .with_bools(&[1])
    }

    fn spline() -> Suf {
        let c = |a: u64, b: u64, d: u64| [[a, b, d, 0], [0; 4]];
        Suf::piecewise(
            N,
            Domain::Signed,
            0,
            1,
            2,
            &[-40, -7, 0, 9, 50],
            &[
                c(3, 0, 0),
                c(200, 17, 5),
                c(1, 1, 250),
                c(0, 1, 0),
                c(77, 3, 1),
                c(0, 1, 0),
            ],
        )
    }

    /// Every input under every wrap mask: outputs equal the SUF at width k.
    fn exhaustive(gate: &Gate, k: Width) {
        let xs: Vec<u64> = (0..1u64 << N.bits()).collect();
        let masks = wrap_masks(gate, 64);
        assert!(masks.len() >= 64);
        for (i, r) in masks.iter().enumerate() {
            let rs = std::vec![*r; xs.len()];
            let out = run(gate, &xs, Some(&rs), i as u8);
            let cost = gate.cost();
            assert_eq!(out.traffic.rounds, cost.rounds);
            assert_eq!(
                out.traffic.bytes_per_party,
                (cost.comm_bits * xs.len()).div_ceil(8)
            );
            for x in &xs {
                let want = gate.compiled.suf.eval_at(*x, k);
                for o in 0..gate.outputs() {
                    assert_eq!(
                        out.arith[*x as usize * gate.outputs() + o],
                        want.arith[o],
                        "x={x} r={r} k={}",
                        k.bits()
                    );
                }
                for j in 0..gate.bit_outputs() {
                    assert_eq!(
                        out.bits[*x as usize * gate.bit_outputs() + j],
                        u64::from((want.bits >> j) & 1),
                        "bit {j} x={x} r={r}"
                    );
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "compiled Φ Outputs differs from the interpreter")]
    fn a_planted_fault_in_the_program_is_caught_by_the_oracle() {
        let mut gate =
            Gate::new(&spline(), N, Phi::poly(N, PolyMode::Beaver), Input::Shares).unwrap();
        let p = &mut gate.program;
        let at = p.outputs_at
            + p.section(program::Section::Outputs)
                .iter()
                .position(|op| matches!(op, program::Op::Acc { .. }))
                .unwrap();
        if let program::Op::Acc { k, .. } = &mut p.ops[at] {
            *k = k.wrapping_add(1);
        }
        let xs: Vec<u64> = (0..1u64 << N.bits()).collect();
        run(&gate, &xs, None, 1);
    }

    #[test]
    fn relu_all_inputs_all_wrap_masks() {
        for k in [8, 6] {
            let k = Width::of(k);
            let gate =
                Gate::new(&relu(), k, Phi::poly(N, PolyMode::Monomials), Input::Shares).unwrap();
            assert_eq!(gate.cost().rounds, 2);
            exhaustive(&gate, k);
        }
    }

    #[test]
    fn spline_in_both_polynomial_modes() {
        for mode in [PolyMode::Monomials, PolyMode::Beaver] {
            let gate = Gate::new(&spline(), N, Phi::poly(N, mode), Input::Shares).unwrap();
            let rounds = if mode == PolyMode::Beaver { 3 } else { 2 };
            assert_eq!(gate.cost().rounds, rounds);
            exhaustive(&gate, N);
        }
    }

    #[test]
    fn boolean_outputs_with_and_gates() {
        let s = Suf::piecewise(N, Domain::Signed, 0, 0, 0, &[-30, 0, 30], &[[[0; 4]; 2]; 4])
            .with_pred(Pred::LowLt { bits: 3, gamma: 5 })
            .with_pred(Pred::MsbPlus(17))
            .with_pred(Pred::Lt(4))
            .with_program(Program::from_ops(&[Op::Pred(0), Op::Pred(1), Op::Or]))
            .with_program(Program::from_ops(&[
                Op::Pred(2),
                Op::Not,
                Op::Pred(0),
                Op::And,
            ]))
            .with_bools(&[1, 2]);
        let mut s = s;
        s.pieces[2].bools[0] = 2;
        let gate = Gate::new(&s, N, Phi::new(PolyMode::Monomials), Input::Shares).unwrap();
        assert!(gate.compiled.and_depth >= 1);
        exhaustive(&gate, N);
    }

    #[test]
    fn wraps_and_mask_constants_give_exact_truncation() {
        // floor(x / 2^f) for signed x at width k < n (one bit of slack):
        // x' = x + 2^(k−1) ≥ 0, x̂' = x̂ + 2^(k−1); with c = [x̂' mod 2^f < r mod 2^f]
        // and w = MSB(r)·(1 − MSB(x̂')), floor = x̂'_hi − r_hi − c + 2^(n−f)·w − 2^(k−1−f).
        let (f, k) = (3u32, Width::of(6));
        let shifted = View::new(N, k.half());
        let low = View::new(Width::of(f), 0);
        let phi = Phi::new(PolyMode::Monomials)
            .with_kappa(Kappa::MaskBits { width: N, shift: f })
            .with_kappa(Kappa::MaskMsb(N))
            .with_output(
                N,
                &[
                    Term::new(
                        1,
                        Public::ViewShr {
                            view: shifted,
                            shift: f,
                        },
                        &[],
                    ),
                    Term::new(N.neg(1), Public::One, &[Factor::Kappa(0)]),
                    Term::new(N.neg(1), Public::One, &[Factor::Wrap(low)]),
                    Term::new(
                        1 << (N.bits() - f),
                        Public::NotMsb(shifted),
                        &[Factor::Kappa(1)],
                    ),
                    Term::constant(N.neg(1 << (k.bits() - 1 - f))),
                ],
            );
        let s = Suf::new(N, Domain::Signed, f, 0, 0);
        let gate = Gate::new(&s, k, phi, Input::Shares).unwrap();
        let xs: Vec<u64> = (0..1u64 << N.bits())
            .filter(|x| k.fits_signed(N.to_signed(*x)))
            .collect();
        for (i, r) in wrap_masks(&gate, 64).iter().enumerate() {
            let out = run(&gate, &xs, Some(&std::vec![*r; xs.len()]), i as u8);
            for (j, x) in xs.iter().enumerate() {
                let want = N.from_signed(N.to_signed(*x) >> f);
                assert_eq!(out.arith[j], want, "x={x} r={r}");
            }
        }
    }

    /// Dealt keys in one-element PRF batches, with the least scratch,
    /// equal those in full batches, and so do P0's keys dealt alone; less
    /// scratch than that is refused.
    #[test]
    fn deal_scratch_size_changes_nothing_but_batching() {
        let gate = Gate::new(
            &spline(),
            N,
            Phi::poly(N, PolyMode::Monomials),
            Input::Shares,
        )
        .unwrap();
        let n = 37;
        let seeds = [[3; 16], [4; 16]];
        let deal_as = |blocks: usize, group: usize, p1: bool| {
            let len = n * gate.key_params(0).key_len();
            let (mut a, mut b) = (
                std::vec![0u8; len],
                std::vec![0u8; if p1 { len } else { 0 }],
            );
            let mut ex = std::vec![0u64; n * gate.explicit_words()];
            let mut d0: [&mut [u8]; MAX_KEYS] = Default::default();
            let mut d1: [&mut [u8]; MAX_KEYS] = Default::default();
            (d0[0], d1[0]) = (&mut a, &mut b);
            let mut prf = std::vec![Block::ZERO; blocks];
            let mut words = std::vec![0u64; DealScratch::words(group)];
            let r = gate.deal(
                &crate::batch::Serial::new(),
                seeds,
                None,
                5,
                n,
                &mut d0,
                &mut d1,
                &mut ex,
                &mut DealScratch::new(&mut prf, &mut words),
            );
            r.map(|_| (a, b, ex))
        };
        let deal = |blocks: usize, group: usize| deal_as(blocks, group, true);
        assert_eq!(gate.compiled.key_count, 1);
        let full = deal(gate.deal_scratch_blocks(n, n), n).unwrap();
        // P0's keys alone (an empty P1 slot): the same bytes.
        let (a, b, ex) = deal_as(gate.deal_scratch_blocks(n, 5), 5, false).unwrap();
        assert_eq!((&a, b.len(), &ex), (&full.0, 0, &full.2));
        // Groups of one, of five (across PRF batches of one and of all),
        // and larger than the PRF batch.
        assert_eq!(deal(gate.deal_scratch_min(1), 1).unwrap(), full);
        assert_eq!(deal(gate.deal_scratch_min(5), 5).unwrap(), full);
        assert_eq!(deal(gate.deal_scratch_blocks(n, 5), 5).unwrap(), full);
        assert_eq!(deal(gate.deal_scratch_min(8) + 6, 8).unwrap(), full);
        assert_eq!(
            deal(gate.deal_scratch_min(3) - 1, 3).unwrap_err(),
            Error::BufferLength
        );
        assert_eq!(
            deal(gate.deal_scratch_blocks(n, 1), 0).unwrap_err(),
            Error::BufferLength
        );
        assert!(gate.deal_scratch_blocks(n, n) >= n * gate.deal_scratch_min(0));
    }
}
