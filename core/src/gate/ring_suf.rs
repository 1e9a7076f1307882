//! A piecewise polynomial in one round: a SUF with ring outputs only,
//! whose interval indicators come from ring-output DCF keys that carry the
//! powers of the mask as payloads, so that after the opening the active
//! piece's polynomial is local. The reciprocal and rsqrt chains' range
//! reduction and mantissa spline run on it ([`super::inverse`]).
//!
//! # Maths
//!
//! Open `x̂ = x + r` in Z_2^n. A gate of effective width k reads its
//! interval from the k-bit view of x (unsigned, or signed through the offset
//! `H = 2^(k−1)`) and evaluates the piece's polynomial at x in the ring, as
//! [`Suf::eval_at`] does. With `u = (x̂ + H) mod 2^k`, `ρ = r mod 2^k` and
//! `x' = (u − ρ) mod 2^k` the offset view, a bound c of the domain becomes
//! `c' = c + H ∈ [0, 2^k]` and, as integers (the identity of
//! [`super::ring_relu`]),
//!
//! `[x' < c'] = [(u − c') mod 2^k < ρ] − [u < ρ] + [u < c']`.
//!
//! A k-bit DCF key with threshold ρ and payload `r^i` therefore gives, at
//! the public points `u` and `(u − c') mod 2^k`, additive shares of
//!
//! `S_{c,i} = [x' ≥ c']·r^i = r^i·(1 − [u < c']) − E_i(c') + E_i(u)`,
//!
//! where `E_i(p)` is the key's evaluation at `(u − p) mod 2^k` and `[r^i]`
//! is a share of the power itself (1 for P0, the mask share, and a dealt
//! share of r² for degree 2). Writing the output as the first piece plus
//! each bound's difference `Δ_j = P_j − P_(j−1)` and expanding
//! `(x̂ − r)^m` binomially,
//!
//! `y = Σ_j Σ_i (−1)^i · (Σ_(m ≥ i) δ_(j,m)·C(m, i)·x̂^(m−i)) · S_(c_j, i)`
//!
//! with `S_(c_0, i) = [r^i]` for the first piece: public coefficients times
//! shares, so local. Degree d needs `d + 1` keys, all with threshold ρ.
//! Shares: each party expands its mask share and the keys' roots from its
//! seed, P0 its share of r² too (P1's is an explicit word); the keys' value
//! corrections are the dealer's fresh words, never a party's seed (see
//! [`crate::dcf::generate`]).
//!
//! # Scaled by an opened factor
//!
//! [`RingSuf::scaled`] outputs `P(x)·F` for a second input F, opened in the
//! same round as `F̂ = F + s` under its own fresh mask s. With `P(x)` the
//! sum above, `P(x)·F = F̂·P(x) − s·P(x)`, and `s·P(x)` is the same sum
//! with every share `S_{c,i}` replaced by `s·S_{c,i} = [x' ≥ c']·(s·r^i)`:
//! d + 1 more keys with threshold ρ and payloads `s·r^i`, and shares of
//! `s·r^i` (s itself from each party's seed, `s·r` and `s·r²` dealt). So a
//! spline whose output a secret factor scales takes one round instead of
//! two (the spline, then a Beaver product): the reciprocal and rsqrt
//! chains' mantissa spline and exponent factor ([`super::inverse`]).
//!
//! # Cost
//!
//! One round, n bits sent per element. `d + 1` k-bit ring-output keys,
//! `(k − 1)·(16 + 8) + 16` bytes of correction words each, plus one word
//! for P1 at degree 2; each key is evaluated at `J + 1` points for J
//! bounds. The two-round [`Gate`](super::Gate) on the same SUF holds one
//! bit-output key and converts its bits in a second round: fewer bytes,
//! one more round. So this form is for per-row scalars, where rounds cost
//! more than key bytes.

use crate::batch::BatchEval;
use crate::compile::MAX_KEYS;
use crate::error::{Error, SufError};
use crate::fss::{Kind, Output, Params, Party, key_buffers_fit};
use crate::gate::one_round::{self, GROUP};
use crate::gate::{Cost, PartyKeys};
use crate::mpc;
use crate::prg::Hasher;
use crate::ring::{Width, cast};
use crate::suf::{Domain, MAX_ARITH, MAX_INTERVALS, Suf};

/// Highest degree: one key per power of the mask, twice as many in the
/// scaled form ([`RingSuf::scaled`]), at most [`MAX_KEYS`].
pub const MAX_RING_DEGREE: usize = MAX_KEYS / 2 - 1;

/// PRF slots of one element: the mask shares (r in the low half, s in
/// the high half), P0's shares of the dealt words (two a block: r², then
/// s·r and s·r² when scaled), then each key's root.
const SLOT_MASK: usize = 0;
const SLOT_WORDS: usize = 1;
const SLOT_ROOTS: usize = 2;
/// The scaled form's roots: after two blocks of words.
const SLOT_ROOTS_SCALED: usize = 3;

/// One piece's coefficients per ring output, lowest degree first.
type Coeffs = [[u64; MAX_RING_DEGREE + 1]; MAX_ARITH];

/// A one-round piecewise polynomial at effective width k.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RingSuf {
    ring: Width,
    k: Width,
    /// `H`: 2^(k−1) for a signed domain, else 0.
    offset: u64,
    degree: usize,
    outputs: usize,
    /// Interior bounds.
    bounds: usize,
    /// Bound j's `c' = c + H`, at `cuts[j]`.
    cuts: [u64; MAX_INTERVALS],
    /// Piece j's coefficients.
    pieces: [Coeffs; MAX_INTERVALS],
    /// Outputs scaled by an opened factor ([`RingSuf::scaled`]).
    scaled: bool,
}

impl RingSuf {
    /// The SUF `suf` (ring outputs only, degree ≤ [`MAX_RING_DEGREE`]) at
    /// effective width `k`: every interior bound must lie in the k-bit
    /// domain.
    pub fn new(suf: &Suf, k: Width) -> Result<RingSuf, SufError> {
        suf.validate()?;
        if suf.bools != 0 || suf.arith == 0 {
            return Err(SufError::Program);
        }
        if suf.degree > MAX_RING_DEGREE {
            return Err(SufError::Degree);
        }
        if k.bits() > suf.ring.bits() {
            return Err(SufError::FixedPoint);
        }
        let offset = match suf.domain {
            Domain::Unsigned => 0,
            Domain::Signed => k.half(),
        };
        let (lo, hi) = (suf.domain.min(k.bits()), suf.domain.end(k.bits()));
        let mut g = RingSuf {
            ring: suf.ring,
            k,
            offset,
            degree: suf.degree,
            outputs: suf.arith,
            bounds: suf.intervals - 1,
            cuts: [0; MAX_INTERVALS],
            pieces: [[[0; MAX_RING_DEGREE + 1]; MAX_ARITH]; MAX_INTERVALS],
            scaled: false,
        };
        for j in 0..suf.intervals {
            if j > 0 {
                let c = suf.bounds[j];
                let shifted = c + cast::i128_from_u64(offset);
                if c < lo || c > hi || shifted > cast::i128_from_u64(k.mask()) {
                    return Err(SufError::Boundaries);
                }
                g.cuts[j - 1] = u64::try_from(shifted).map_err(|_| SufError::Boundaries)?;
            }
            for o in 0..suf.arith {
                let c = &suf.pieces[j].coeffs[o];
                g.pieces[j][o].copy_from_slice(&c[..=MAX_RING_DEGREE]);
            }
        }
        Ok(g)
    }

    /// The SUF `suf` as [`RingSuf::new`] takes it, every output multiplied
    /// by a second input F opened in the same round (module docs).
    pub fn scaled(suf: &Suf, k: Width) -> Result<RingSuf, SufError> {
        let mut g = RingSuf::new(suf, k)?;
        g.scaled = true;
        Ok(g)
    }

    /// Whether the outputs are scaled by a second input.
    pub const fn is_scaled(&self) -> bool {
        self.scaled
    }

    /// Values opened per element: x, and F when scaled.
    pub const fn inputs(&self) -> usize {
        if self.scaled { 2 } else { 1 }
    }

    /// Powers of the mask the keys carry: `r^0 … r^d`.
    const fn powers(&self) -> usize {
        self.degree + 1
    }

    /// Dealt words per element: the shares of `r^2 … r^d`, then (scaled)
    /// of `s·r … s·r^d`.
    const fn words(&self) -> usize {
        self.degree.saturating_sub(1) + if self.scaled { self.degree } else { 0 }
    }

    /// Word areas in the evaluator's scratch: one at least (r², zero below
    /// degree 2), as the unscaled layout has always had.
    const fn word_areas(&self) -> usize {
        if self.words() > 1 { self.words() } else { 1 }
    }

    /// PRF blocks of dealt words per element.
    const fn word_slots(&self) -> usize {
        self.words().div_ceil(2)
    }

    /// The PRF slot of key 0's root.
    const fn root_slot(&self) -> usize {
        if self.scaled {
            SLOT_ROOTS_SCALED
        } else {
            SLOT_ROOTS
        }
    }

    /// The ring.
    pub const fn ring(&self) -> Width {
        self.ring
    }

    /// Ring outputs.
    pub const fn outputs(&self) -> usize {
        self.outputs
    }

    /// Every key's parameters: a k-bit DCF with output in the ring.
    pub const fn key_params(&self) -> Params {
        Params::new(Kind::Dcf, self.k, Output::Ring(self.ring))
    }

    /// Keys per element: one per power of the mask up to the degree, and
    /// as many again with payloads `s·r^i` when scaled.
    pub const fn key_count(&self) -> usize {
        self.powers() * self.inputs()
    }

    /// Explicit words P1 holds per element: its shares of the dealt words
    /// (r² at degree 2; s·r and s·r² too when scaled).
    pub const fn explicit_words(&self) -> usize {
        self.words()
    }

    /// Fresh random words the dealer supplies per element (every key's).
    pub const fn random_words(&self) -> usize {
        self.key_count() * self.key_params().gen_random_words()
    }

    /// Points each key is evaluated at per element: `u`, then each bound.
    const fn points(&self) -> usize {
        self.bounds + 1
    }

    /// Scratch words an evaluator needs for `n` elements (`Area`): the
    /// mask shares, the dealt words' shares, the opening, x̂ (and F̂), the
    /// points, the evaluations, the outputs (and the s-terms).
    pub const fn scratch_words(&self, n: usize) -> usize {
        Area::of(self, n).end
    }

    /// Per-element costs (key bytes without the roots, which are re-derived
    /// from the seeds).
    pub const fn cost(&self) -> Cost {
        let p = self.key_params();
        let cw = self.key_count() * (p.key_len() - 16);
        let seeded = 1 + self.word_slots();
        Cost {
            rounds: 1,
            comm_bits: self.inputs() * cast::usize_from_u32(self.ring.bits()),
            key_bytes_p0: cw,
            key_bytes_p1: cw + mpc::words_len(self.ring, self.explicit_words()),
            aes_online: seeded
                + self.key_count() * self.points() * cast::usize_from_small_u64(p.aes_per_eval()),
            dcf_points: self.key_count() * self.points(),
        }
    }

    /// The index of the piece holding `x`'s k-bit view.
    fn piece_of(&self, x: u64) -> usize {
        let v = self.k.reduce(x.wrapping_add(self.offset));
        self.cuts[..self.bounds].iter().filter(|c| **c <= v).count()
    }

    /// The scaled form's cleartext value: [`RingSuf::reference`] times `f`.
    pub fn reference_scaled(&self, x: u64, f: u64, out: &mut [u64]) {
        self.reference(x, out);
        for o in out.iter_mut().take(self.outputs) {
            *o = self.ring.mul(*o, f);
        }
    }

    /// The cleartext value: ring output `o` of the piece holding `x`'s
    /// k-bit view, its polynomial evaluated at x in the ring (as
    /// [`Suf::eval_at`]); the scaled form's before its factor.
    pub fn reference(&self, x: u64, out: &mut [u64]) {
        let w = self.ring;
        let x = w.reduce(x);
        let piece = &self.pieces[self.piece_of(x)];
        for (o, slot) in out.iter_mut().enumerate().take(self.outputs) {
            let mut acc = 0u64;
            for c in piece[o][..=self.degree].iter().rev() {
                acc = w.add(w.mul(acc, x), *c);
            }
            *slot = acc;
        }
    }

    /// Deals `count` elements from element index `first`: both parties'
    /// whole keys, key i of every element in `keys0[i]` / `keys1[i]`
    /// (`count · key_len` bytes each; unused slots empty), and P1's explicit
    /// words. `random` holds [`RingSuf::random_words`] fresh words per
    /// element, key 0's for every element, then key 1's, and so on; `masks`
    /// pins each party's mask shares (tests). Returns the AES calls made.
    #[allow(clippy::too_many_arguments)]
    pub fn deal(
        &self,
        fss: &dyn BatchEval,
        seeds: [[u8; 16]; 2],
        masks: Option<[&[u64]; 2]>,
        random: &[u64],
        (first, count): (u64, usize),
        keys0: &mut [&mut [u8]; MAX_KEYS],
        keys1: &mut [&mut [u8]; MAX_KEYS],
        explicit: &mut [u64],
    ) -> Result<u64, Error> {
        let params = self.key_params();
        let (len, keys_n) = (params.key_len(), self.key_count());
        let sizes_ok = (0..keys_n).all(|i| key_buffers_fit(keys0[i], keys1[i], count, len));
        if !sizes_ok
            || random.len() != count * self.random_words()
            || explicit.len() != count * self.explicit_words()
        {
            return Err(Error::BufferLength);
        }
        let words = self.words();
        let mut alphas = [0u64; GROUP];
        let mut betas = [[0u64; GROUP]; MAX_KEYS];
        let slots = self.root_slot() + keys_n;
        one_round::deal_groups(fss, self.ring, (seeds, slots), masks, (first, count), |g| {
            for (e, &r) in g.masks.iter().enumerate() {
                alphas[e] = self.k.reduce(r);
                let words = &mut explicit[(g.at + e) * words..(g.at + e + 1) * words];
                self.payloads(g, (e, r), &mut betas, words);
            }
            one_round::generate_keys(
                g,
                fss,
                (params, self.root_slot()),
                count,
                (&alphas, &betas[..keys_n]),
                random,
                &mut keys0[..keys_n],
                &mut keys1[..keys_n],
            )
        })
    }

    /// Element `e`'s key payloads, its mask `r` and `s` from both parties'
    /// mask slots: key i's is r^i, then s·r^i; the dealt words (P1's
    /// `explicit`, its share less P0's seeded one) are the payloads that
    /// are neither 1, r nor s.
    fn payloads(
        &self,
        g: &one_round::Group<'_>,
        (e, r): (usize, u64),
        betas: &mut [[u64; GROUP]; MAX_KEYS],
        explicit: &mut [u64],
    ) {
        let w = self.ring;
        let powers = self.powers();
        let [b0, b1] = g.block(e, SLOT_MASK);
        let s = w.add(w.reduce(b0.high64()), w.reduce(b1.high64()));
        let mut power = 1u64;
        for i in 0..powers {
            betas[i][e] = power;
            if self.scaled {
                betas[powers + i][e] = w.mul(s, power);
            }
            power = w.mul(power, r);
        }
        let dealt = (2..powers)
            .map(|i| betas[i][e])
            .chain((1..powers).map(|i| betas[powers + i][e]));
        g.explicit(w, (e, SLOT_WORDS), dealt, explicit);
    }

    /// Writes each element's key roots, re-derived from `party`'s `seed`,
    /// into `roots[i]` for key i (16 bytes per element): for keys whose
    /// bodies stay where a key file was read.
    pub fn derive_roots(
        &self,
        h: &dyn Hasher,
        party: Party,
        seed: &[u8; 16],
        first: u64,
        roots: &mut [&mut [u8]],
    ) -> Result<u64, Error> {
        let roots = roots
            .get_mut(..self.key_count())
            .ok_or(Error::BufferLength)?;
        one_round::derive_roots(h, party, (seed, self.root_slot()), first, roots)
    }

    /// Fills this party's mask shares (expanded from `seed`, or `mask` in
    /// tests; s from `seed` always) and its shares of the dealt words (P0's
    /// expanded, P1's `explicit`) into an evaluation area
    /// ([`RingSuf::scratch_words`]). Returns the AES calls made.
    #[allow(clippy::too_many_arguments)]
    pub fn load(
        &self,
        h: &dyn Hasher,
        party: Party,
        seed: &[u8; 16],
        mask: Option<&[u64]>,
        first: u64,
        explicit: &[u64],
        area: &mut [u64],
    ) -> Result<u64, Error> {
        let n = self.elements(area)?;
        let (w, a, words) = (self.ring, Area::of(self, n), self.words());
        let (masks, rest) = area.split_at_mut(a.words);
        let (r, s) = masks.split_at_mut(n);
        let mut calls = one_round::mask_shares(h, w, (seed, SLOT_MASK), mask, first, r)?;
        if self.scaled {
            calls += one_round::each_block(h, (seed, SLOT_MASK), first, n, |i, b| {
                s[i] = w.reduce(b.high64());
            });
        }
        let shares = &mut rest[..a.mine - a.words];
        // Below degree 2 the one word area holds zeros (no r²).
        shares.fill(0);
        let at = (first, n, words);
        let shares = &mut shares[..n * words];
        calls += one_round::word_areas(h, (w, party), (seed, SLOT_WORDS), at, explicit, shares)?;
        Ok(calls)
    }

    /// Elements an area holds, checking its length.
    fn elements(&self, area: &[u64]) -> Result<usize, Error> {
        one_round::area_elements(area.len(), self.scratch_words(1))
    }

    /// The round's message: this party's share of `x̂ = x + r` (and, scaled,
    /// of `F̂ = F + s`), for `x` the inputs (x of every element, then F).
    pub fn open(&self, area: &mut [u64], x: &[u64], send: &mut [u8]) -> Result<(), Error> {
        let n = x.len() / self.inputs();
        let a = Area::of(self, n);
        if area.len() != a.end || x.len() != n * self.inputs() {
            return Err(Error::BufferLength);
        }
        let (masks, rest) = area.split_at_mut(a.words);
        let mine = &mut rest[a.mine - a.words..a.hat - a.words];
        one_round::open(self.ring, masks, x, mine, send)
    }

    /// This party's share of the payload of key `i` for element `e`: of
    /// `r^q` or (the second half of a scaled form's keys) `s·r^q`,
    /// `q = i mod (d + 1)`.
    fn payload_share(&self, area: &[u64], a: &Area, p0: u64, (i, e): (usize, usize)) -> u64 {
        let (n, powers) = (a.n, self.powers());
        let (q, scaled) = (i % powers, i >= powers);
        let word = |j: usize| area[a.words + j * n + e];
        match (scaled, q) {
            (false, 0) => p0,
            (false, 1) => area[e],
            (false, q) => word(q - 2),
            (true, 0) => area[n + e],
            (true, q) => word(self.degree.saturating_sub(1) + q - 1),
        }
    }

    /// The peer's message: opens `x̂` (and F̂), evaluates every key at `u`
    /// and at `(u − c') mod 2^k` for each bound, and accumulates this
    /// party's output shares (output-major) in the area: `P(x)`, or
    /// `F̂·P(x) − s·P(x)` when scaled.
    pub fn close(
        &self,
        party: Party,
        area: &mut [u64],
        recv: &[u8],
        keys: &PartyKeys<'_>,
        backend: &dyn BatchEval,
    ) -> Result<(), Error> {
        let n = self.elements(area)?;
        let (w, p, a) = (self.ring, self.points(), Area::of(self, n));
        {
            let (head, hat) = area[..a.points].split_at_mut(a.hat);
            mpc::open_finish(w, &head[a.mine..], recv, hat)?;
        }
        for e in 0..n {
            let u = self.k.reduce(area[a.hat + e].wrapping_add(self.offset));
            area[a.points + e * p] = u;
            for (j, c) in self.cuts[..self.bounds].iter().enumerate() {
                area[a.points + e * p + j + 1] = self.k.reduce(u.wrapping_sub(*c));
            }
        }
        area[a.acc..a.end].fill(0);
        let p0 = u64::from(party == Party::P0);
        for i in 0..self.key_count() {
            let batch = one_round::key_batch(self.key_params(), party, keys, i)?;
            if batch.count() != n {
                return Err(Error::BufferLength);
            }
            {
                let (head, evals) = area[..a.evals + p * n].split_at_mut(a.evals);
                backend.eval(&batch, &head[a.points..], evals)?;
            }
            self.add_terms(area, &a, (i, p0));
        }
        if self.scaled {
            for e in 0..n {
                let f = area[a.hat + n + e];
                for o in 0..self.outputs {
                    let (y, sy) = (a.acc + o * n + e, a.acc2 + o * n + e);
                    area[y] = w.sub(w.mul(f, area[y]), area[sy]);
                }
            }
        }
        Ok(())
    }

    /// Adds key `i`'s terms, its evaluations in the area, to every output
    /// share: `S_{c,i}` times the pieces' public coefficients (module
    /// docs), into the outputs, or into the s-terms for a scaled form's
    /// second half of keys.
    fn add_terms(&self, area: &mut [u64], a: &Area, (i, p0): (usize, u64)) {
        let (w, p, n) = (self.ring, self.points(), a.n);
        let acc = if i < self.powers() { a.acc } else { a.acc2 };
        for e in 0..n {
            let power = self.payload_share(area, a, p0, (i, e));
            // u went to the backend as public: its comparisons are read
            // from the points.
            let u = area[a.points + e * p];
            let at_u = area[a.evals + e * p];
            let xhat = area[a.hat + e];
            for j in 0..p {
                let term = match j {
                    0 => power,
                    _ => {
                        let above = 1 - u64::from(u < self.cuts[j - 1]);
                        let at = area[a.evals + e * p + j];
                        w.add(w.sub(w.mul(power, above), at), at_u)
                    }
                };
                for o in 0..self.outputs {
                    let c = self.coefficient(j, o, i % self.powers(), xhat);
                    let slot = acc + o * n + e;
                    area[slot] = w.add(area[slot], w.mul(c, term));
                }
            }
        }
    }

    /// `(−1)^i · Σ_(m ≥ i) δ_m·C(m, i)·x̂^(m−i)` for piece j's difference
    /// δ from piece j − 1 (the first piece itself for j = 0), output o.
    fn coefficient(&self, j: usize, o: usize, i: usize, xhat: u64) -> u64 {
        const BINOMIAL: [[u64; 3]; 3] = [[1, 0, 0], [1, 1, 0], [1, 2, 1]];
        let w = self.ring;
        let mut sum = 0u64;
        let mut power = 1u64;
        for m in i..=self.degree {
            let below = if j == 0 { 0 } else { self.pieces[j - 1][o][m] };
            let delta = w.sub(self.pieces[j][o][m], below);
            sum = w.add(sum, w.mul(w.mul(delta, BINOMIAL[m][i]), power));
            power = w.mul(power, xhat);
        }
        if i % 2 == 1 { w.neg(sum) } else { sum }
    }

    /// This party's output shares from a closed area, output-major
    /// (`out[o·n + e]`).
    pub fn output(&self, area: &[u64], out: &mut [u64]) -> Result<(), Error> {
        let n = self.elements(area)?;
        if out.len() != self.outputs * n {
            return Err(Error::BufferLength);
        }
        let at = Area::of(self, n).acc;
        out.copy_from_slice(&area[at..at + self.outputs * n]);
        Ok(())
    }
}

/// An evaluator's scratch for `n` elements, in order: the mask shares
/// (r, then s when scaled), the dealt words' shares (word-major), this
/// party's opening shares, the opened values (x̂, then F̂), the points,
/// the evaluations, the outputs and (scaled) the s-terms. Unscaled, the
/// layout it has always had: r, r², opening, x̂, points, evaluations,
/// outputs.
struct Area {
    n: usize,
    words: usize,
    mine: usize,
    hat: usize,
    points: usize,
    evals: usize,
    acc: usize,
    acc2: usize,
    end: usize,
}

impl Area {
    const fn of(g: &RingSuf, n: usize) -> Area {
        let (m, p) = (g.inputs(), g.points());
        let words = m * n;
        let mine = words + g.word_areas() * n;
        let hat = mine + m * n;
        let points = hat + m * n;
        let evals = points + p * n;
        let acc = evals + p * n;
        let acc2 = acc + g.outputs * n;
        let end = if g.scaled { acc2 + g.outputs * n } else { acc2 };
        Area {
            n,
            words,
            mine,
            hat,
            points,
            evals,
            acc,
            acc2,
            end,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Serial;
    use crate::gate::one_round::testing::{Setup, bodies};
    use crate::gate::testing::{dirty, run as run_gate};
    use crate::gate::{Gate, Input};
    use crate::phi::{Factor, Phi, PolyMode, Public, Term};
    use crate::prg::{FixedKeyAes, Prg};
    use crate::suf::MAX_DEGREE;
    use proptest::prelude::*;
    use std::vec;
    use std::vec::Vec;

    /// Deals and runs both parties on shares of `xs` (masks pinned to
    /// `masks` where given; odd salts store bodies and re-derive roots);
    /// returns the reconstructed outputs, element-major.
    fn run(g: &RingSuf, xs: &[u64], masks: Option<&[u64]>, salt: u8) -> Vec<u64> {
        run_scaled(g, xs, &[], masks, salt)
    }

    /// [`run`] with the factors `fs` of a scaled form (one per element;
    /// empty for the plain form).
    fn run_scaled(
        g: &RingSuf,
        xs: &[u64],
        fs: &[u64],
        masks: Option<&[u64]>,
        salt: u8,
    ) -> Vec<u64> {
        let (n, w, keys_n) = (xs.len(), g.ring(), g.key_count());
        let (fss, aes) = (Serial::new(), FixedKeyAes::new());
        let setup = Setup::new(w, xs, masks, n * g.random_words(), salt);
        let (seeds, pinned, random) = (setup.seeds, setup.pinned(), &setup.random);
        let len = g.key_params().key_len();
        let size = |i: usize| if i < keys_n { n * len } else { 0 };
        let mut k: Vec<Vec<u8>> = (0..2 * MAX_KEYS)
            .map(|i| vec![0u8; size(i % MAX_KEYS)])
            .collect();
        let mut explicit = vec![0u64; n * g.explicit_words()];
        {
            let (k0, k1) = k.split_at_mut(MAX_KEYS);
            let mut d0 = crate::gate::testing::key_slices(k0);
            let mut d1 = crate::gate::testing::key_slices(k1);
            g.deal(
                &fss,
                seeds,
                pinned,
                random,
                (7, n),
                &mut d0,
                &mut d1,
                &mut explicit,
            )
            .unwrap();
        }
        let split = salt % 2 == 1;
        let parties = [Party::P0, Party::P1];
        let mut msgs: Vec<Vec<u8>> = Vec::new();
        let mut areas: Vec<Vec<u64>> = Vec::new();
        // The factors' shares: random for P0, the rest for P1.
        let mut prg = Prg::new(&[salt ^ 0x6c; 16]);
        let f0: Vec<u64> = fs.iter().map(|_| w.reduce(prg.next_u64())).collect();
        let f1: Vec<u64> = fs.iter().zip(&f0).map(|(f, a)| w.sub(*f, *a)).collect();
        for (p, party) in parties.into_iter().enumerate() {
            let mask = pinned.map(|m| m[p]);
            let ex = if p == 1 { &explicit[..] } else { &[] };
            let mut area = dirty(g.scratch_words(n), p as u64);
            g.load(&aes, party, &seeds[p], mask, 7, ex, &mut area)
                .unwrap();
            let inputs: Vec<u64> = setup.x[p].iter().chain([&f0, &f1][p]).copied().collect();
            let mut send = vec![0u8; mpc::words_len(w, n * g.inputs())];
            g.open(&mut area, &inputs, &mut send).unwrap();
            msgs.push(send);
            areas.push(area);
        }
        let mut sums = vec![0u64; g.outputs() * n];
        for (p, party) in parties.into_iter().enumerate() {
            let whole: Vec<&[u8]> = (0..MAX_KEYS).map(|i| &k[p * MAX_KEYS + i][..]).collect();
            let bodies: Vec<Vec<u8>> = whole.iter().map(|ks| bodies(ks, len)).collect();
            let mut roots: Vec<Vec<u8>> = (0..MAX_KEYS)
                .map(|i| vec![0u8; 16 * n * usize::from(i < keys_n)])
                .collect();
            {
                let mut rs: Vec<&mut [u8]> = roots.iter_mut().map(|r| &mut r[..]).collect();
                g.derive_roots(&aes, party, &seeds[p], 7, &mut rs).unwrap();
            }
            let ex = if p == 1 { &explicit[..] } else { &[] };
            let keys = if split {
                let b: Vec<&[u8]> = bodies.iter().map(Vec::as_slice).collect();
                let r: Vec<&[u8]> = roots.iter().map(Vec::as_slice).collect();
                PartyKeys::of(&b, &r, ex)
            } else {
                PartyKeys::of(&whole, &[], ex)
            };
            g.close(party, &mut areas[p], &msgs[1 - p], &keys, &fss)
                .unwrap();
            let mut o = vec![0u64; g.outputs() * n];
            g.output(&areas[p], &mut o).unwrap();
            for (s, v) in sums.iter_mut().zip(o) {
                *s = w.add(*s, v);
            }
        }
        // Output-major to element-major.
        let outs = g.outputs();
        (0..n * outs)
            .map(|i| sums[(i % outs) * n + i / outs])
            .collect()
    }

    /// The two-round gate on the same SUF, its outputs the polynomials.
    fn oracle(suf: &Suf, k: Width) -> Gate {
        let mut phi = Phi::new(PolyMode::Monomials);
        for j in 0..suf.arith {
            let poly = [Factor::Poly(u8::try_from(j).unwrap())];
            phi = phi.with_output(suf.ring, &[Term::new(1, Public::One, &poly)]);
        }
        Gate::new(suf, k, phi, Input::Shares).unwrap()
    }

    /// Masks with r mod 2^k and r itself at their edges, and random ones.
    fn edge_masks(w: Width, k: Width) -> Vec<u64> {
        let mut ms = Vec::new();
        let top = w.mask() >> k.bits();
        for high in [0, 1, top / 2, top] {
            for low in [0, 1, k.half() - 1, k.half(), k.mask()] {
                ms.push(w.reduce((high << k.bits()) | low));
            }
        }
        let mut prg = Prg::new(&[9; 16]);
        ms.extend((0..6).map(|_| w.reduce(prg.next_u64())));
        ms
    }

    type Piece = [[u64; MAX_DEGREE + 1]; MAX_ARITH];

    /// Small SUFs: unsigned and signed, degrees 0 to 2, one or two outputs,
    /// first and last intervals of every length (empty ones included).
    fn small_sufs() -> Vec<(Suf, Width)> {
        let p =
            |a: [u64; 3], b: [u64; 3]| -> Piece { [[a[0], a[1], a[2], 0], [b[0], b[1], b[2], 0]] };
        let mut out = Vec::new();
        let w8 = Width::of(8);
        let pieces = [
            p([5, 0, 0], [1, 0, 0]),
            p([1, 2, 0], [0, 7, 0]),
            p([7, 3, 1], [200, 0, 9]),
            p([0, 0, 2], [3, 3, 3]),
            p([9, 250, 0], [0, 1, 0]),
        ];
        let u = Suf::piecewise(w8, Domain::Unsigned, 0, 2, 2, &[3, 17, 40, 63], &pieces);
        out.push((u, Width::of(6)));
        out.push((u, Width::of(8)));
        let s = Suf::piecewise(w8, Domain::Signed, 0, 2, 2, &[-32, -3, 0, 31], &pieces);
        out.push((s, Width::of(6)));
        out.push((s, Width::of(7)));
        let w10 = Width::of(10);
        let lin = [
            p([0, 0, 0], [1, 0, 0]),
            p([0, 1, 0], [2, 0, 0]),
            p([4, 1, 0], [3, 0, 0]),
        ];
        out.push((
            Suf::piecewise(w10, Domain::Signed, 0, 2, 1, &[0, 5], &lin),
            Width::of(4),
        ));
        let steps: Vec<Piece> = (0..12).map(|i| p([(i * 37) % 128, 0, 0], [0; 3])).collect();
        let cuts: Vec<i128> = (1..12).map(|i| i * 5).collect();
        out.push((
            Suf::piecewise(Width::of(7), Domain::Unsigned, 0, 1, 0, &cuts, &steps),
            Width::of(6),
        ));
        out
    }

    #[test]
    fn one_round_suf_equals_the_two_round_gate_on_every_input() {
        for (t, (suf, k)) in small_sufs().iter().enumerate() {
            let g = RingSuf::new(suf, *k).unwrap();
            let gate = oracle(suf, *k);
            let w = suf.ring;
            let xs: Vec<u64> = (0..=w.mask()).collect();
            let outs = suf.arith;
            for (i, r) in edge_masks(w, *k).iter().enumerate() {
                let masks = vec![*r; xs.len()];
                let got = run(&g, &xs, Some(&masks), (t * 31 + i) as u8);
                let was = run_gate(&gate, &xs, Some(&masks), i as u8).arith;
                for (e, x) in xs.iter().enumerate() {
                    let mut want = [0u64; MAX_ARITH];
                    g.reference(*x, &mut want);
                    let mut spec = [0u64; 2];
                    gate.reference(*x, &mut spec);
                    assert_eq!(
                        want[..outs],
                        suf.eval_at(*x, *k).arith[..outs],
                        "spec t={t} x={x}"
                    );
                    assert_eq!(want[..outs], spec[..outs], "gate reference t={t} x={x}");
                    let at = e * outs..(e + 1) * outs;
                    assert_eq!(got[at.clone()], want[..outs], "t={t} x={x} r={r}");
                    assert_eq!(was[at], want[..outs], "two rounds t={t} x={x} r={r}");
                }
            }
        }
    }

    /// Factors at the ring's edges and random ones, one per element.
    fn factors(w: Width, n: usize, salt: u8) -> Vec<u64> {
        let mut prg = Prg::new(&[salt; 16]);
        (0..n)
            .map(|e| match e % 7 {
                0 => 0,
                1 => 1,
                2 => w.mask(),
                3 => w.half(),
                4 => 1 << (e % usize::try_from(w.bits()).unwrap()),
                _ => w.reduce(prg.next_u64()),
            })
            .collect()
    }

    /// The scaled form on every input of the small SUFs under edge masks:
    /// each output is the plain form's times its factor.
    #[test]
    fn scaled_suf_is_the_plain_output_times_its_factor_on_every_input() {
        for (t, (suf, k)) in small_sufs().iter().enumerate() {
            let g = RingSuf::scaled(suf, *k).unwrap();
            assert_eq!(
                g.key_count(),
                2 * RingSuf::new(suf, *k).unwrap().key_count()
            );
            let w = suf.ring;
            let xs: Vec<u64> = (0..=w.mask()).collect();
            let outs = suf.arith;
            for (i, r) in edge_masks(w, *k).iter().enumerate() {
                let masks = vec![*r; xs.len()];
                let fs = factors(w, xs.len(), (t * 7 + i) as u8);
                let got = run_scaled(&g, &xs, &fs, Some(&masks), (t * 31 + i) as u8);
                for (e, (x, f)) in xs.iter().zip(&fs).enumerate() {
                    let (mut want, mut plain) = ([0u64; MAX_ARITH], [0u64; MAX_ARITH]);
                    g.reference_scaled(*x, *f, &mut want);
                    g.reference(*x, &mut plain);
                    for o in 0..outs {
                        assert_eq!(want[o], w.mul(plain[o], *f), "reference t={t} x={x}");
                    }
                    let at = e * outs..(e + 1) * outs;
                    assert_eq!(got[at], want[..outs], "t={t} x={x} f={f} r={r}");
                }
            }
        }
    }

    #[test]
    fn shapes_it_cannot_take_are_refused() {
        let w = Width::of(8);
        let q = [[[0u64; MAX_DEGREE + 1]; MAX_ARITH]; 2];
        let cubic = Suf::piecewise(w, Domain::Unsigned, 0, 1, 3, &[9], &q);
        assert_eq!(RingSuf::new(&cubic, w), Err(SufError::Degree));
        let wide = Suf::piecewise(w, Domain::Unsigned, 0, 1, 1, &[200], &q);
        assert_eq!(RingSuf::new(&wide, Width::of(6)), Err(SufError::Boundaries));
        assert!(RingSuf::new(&wide, Width::of(9)).is_err());
        let g = RingSuf::new(&wide, w).unwrap();
        let c = g.cost();
        assert_eq!((c.rounds, c.comm_bits, c.dcf_points), (1, 8, 4));
        assert_eq!(c.key_bytes_p0, 2 * (g.key_params().key_len() - 16));
        // Scaled: twice the keys and points, two values opened.
        let sc = RingSuf::scaled(&wide, w).unwrap().cost();
        assert_eq!((sc.rounds, sc.comm_bits, sc.dcf_points), (1, 16, 8));
        assert_eq!(sc.key_bytes_p0, 2 * c.key_bytes_p0);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]
        /// Random quadratic pieces over random bounds at n = 64, every width.
        #[test]
        fn one_round_suf_random_at_64_bits(
            xs in proptest::collection::vec(any::<u64>(), 64),
            rs in proptest::collection::vec(any::<u64>(), 64),
            raw in proptest::collection::vec(any::<u64>(), 8),
            coeffs in proptest::collection::vec(any::<u64>(), 2 * 9 * 3),
            k in 2u32..=63,
            signed in any::<bool>(),
            fs in proptest::collection::vec(any::<u64>(), 64),
        ) {
            let (w, k) = (Width::W64, Width::of(k));
            let domain = if signed { Domain::Signed } else { Domain::Unsigned };
            let mut cuts: Vec<i128> = raw.iter().map(|b| {
                let v = i128::from(b & k.mask());
                if signed { v - i128::from(k.half()) } else { v }
            }).collect();
            cuts.sort_unstable();
            cuts.dedup();
            // Bounds rise strictly from the domain's first value.
            cuts.retain(|c| *c > domain.min(k.bits()));
            let pieces: Vec<Piece> = (0..=cuts.len()).map(|j| {
                let c = |o: usize, m: usize| coeffs[(j * 2 + o) * 3 + m];
                [[c(0, 0), c(0, 1), c(0, 2), 0], [c(1, 0), c(1, 1), c(1, 2), 0]]
            }).collect();
            let suf = Suf::piecewise(w, domain, 0, 2, 2, &cuts, &pieces);
            let g = RingSuf::new(&suf, k).unwrap();
            // Inputs near the bounds as well as anywhere.
            let near: Vec<u64> = xs.iter().enumerate().map(|(i, x)| match i % 3 {
                _ if cuts.is_empty() => *x,
                0 => *x,
                _ => {
                    let c = cuts[i % cuts.len()];
                    w.reduce((c as u64).wrapping_add(x % 3).wrapping_sub(1))
                }
            }).collect();
            let out = run(&g, &near, Some(&rs), 5);
            let scaled = run_scaled(&RingSuf::scaled(&suf, k).unwrap(), &near, &fs, Some(&rs), 6);
            for (e, x) in near.iter().enumerate() {
                let want = suf.eval_at(*x, k).arith;
                prop_assert_eq!(&out[2 * e..2 * e + 2], &want[..2], "x={} k={:?}", x, k);
                let times = [w.mul(want[0], fs[e]), w.mul(want[1], fs[e])];
                prop_assert_eq!(&scaled[2 * e..2 * e + 2], &times[..], "scaled x={} k={:?}", x, k);
            }
        }
    }
}
