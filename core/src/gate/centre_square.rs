//! A LayerNorm's centring and sum of squares in one round: for each row of
//! `d` values r, the mean `μ = ⌊g·Σr/2^f⌋` (a gap truncation, as
//! [`RingTrunc`] computes it), the centred row `y = r − μ` and `V = Σy²`.
//! Computed one after the other this takes two rounds (the mean's
//! truncation, then Beaver squares of y); here the squares' opening of r
//! travels beside the mean's.
//!
//! # Maths
//!
//! In the one round each party sends its share of `x̂ = g·S + ρ` (`S = Σr`,
//! ρ the truncation's fresh mask) and of `r̂_i = r_i − A_i` (`A_i` fresh
//! masks). With `x̂' = x̂ + 2^(k−1)`, [`RingTrunc`]'s identity gives
//!
//! `μ = T − Q − c`, `T = ⌊x̂'/2^f⌋ − 2^(k−1−f)` public,
//! `Q = R − K·M`, `R = ⌊ρ/2^f⌋`, `M = MSB(ρ)`, `K = 2^(n−f)·(1 − MSB(x̂'))`,
//!
//! and the carry `c = [x̂' mod 2^f < ρ mod 2^f]`. Since `Σy² = Σr² − 2μ·S +
//! d·μ²` in the ring, and `S = Ŝ + ΣA` with `Ŝ = Σr̂_i` public:
//!
//! - `Σr² = Σr̂_i² + 2·Σr̂_i·A_i + ΣA_i²`;
//! - `μ·S = T·Ŝ + T·ΣA − Ŝ·Q − Q·ΣA − Ŝ·c − c·ΣA`;
//! - `μ² = T² − 2T·(Q + c) + Q² + 2Q·c + c` (c is a bit).
//!
//! The carry key (an f-bit DCF with threshold `ρ mod 2^f`, ring output)
//! comes four times, with payloads 1, ΣA, R and M: its evaluations at x̂'
//! are shares of c, c·ΣA, c·R and c·M, so `Q·c = c·R − K·c·M`. The dealer
//! deals R, M, R·ΣA, M·ΣA, R², R·M and ΣA_i² (`Q·ΣA = R·ΣA − K·M·ΣA`,
//! `Q² = R² − 2K·R·M + K²·M`). Every term is then a public value times a
//! share: local. The values are the sequential form's integers: y and Σy²
//! in the ring, μ exact on the gap's range (`|g·S| < 2^(k−1)`), so the
//! reference is the truncation, the subtraction and the sum of squares.
//!
//! Security: x̂ is masked by ρ and each r̂_i by its own `A_i`, all fresh
//! and uniform, used for nothing else; the keys are DCF keys on ρ's low
//! bits whose value corrections are the dealer's fresh randomness (never
//! a party's seed), and the dealt words are additive shares (P0's from its
//! seed, P1's explicit). So the view is that of the mean's one-round
//! truncation beside d Beaver openings.
//!
//! # Cost
//!
//! One round, `(1 + d)·n` bits sent per row. Four f-bit ring-output keys
//! and, for P1, seven words per row; the masks `A_i` come from both
//! parties' seeds, so the squares hold no per-element key bytes (a Beaver
//! square holds P1's share of `A_i²`).

use crate::batch::BatchEval;
use crate::error::{Error, SufError};
use crate::fss::{Params, Party, key_buffers_fit};
use crate::gate::one_round::{self, GROUP};
use crate::gate::protocol::Protocol;
use crate::gate::ring_trunc::RingTrunc;
use crate::gate::trunc::Shift;
use crate::gate::{Cost, PartyKeys, prf_slots};
use crate::mpc;
use crate::prg::{Block, Hasher};
use crate::ring::{Width, cast};

/// Keys per row: the carry with payloads 1, ΣA, R and M.
pub const KEYS: usize = 4;
/// Dealt words per row: R, M, R·ΣA, M·ΣA, R², R·M, ΣA_i².
pub const WORDS: usize = 7;

/// PRF slots of a row: ρ's share, the dealt words (two a block), then each
/// key's root. The masks `A_i` are slot [`SLOT_A`] of element `row·d + i`.
const SLOT_MASK: usize = 0;
const SLOT_WORDS: usize = 1;
const SLOT_ROOTS: usize = SLOT_WORDS + WORDS.div_ceil(2);
const SLOTS: usize = SLOT_ROOTS + KEYS;
/// The slot of the squares' masks, indexed by element, not by row.
const SLOT_A: usize = 15;

/// A LayerNorm's centring and sum of squares for rows of `d` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CentreSquare {
    mean: RingTrunc,
    /// The mean's factor `g` (about `2^f/d`).
    gain: u64,
    d: usize,
}

impl CentreSquare {
    /// Rows of `d` values whose mean is `⌊gain·Σr/2^f⌋` (ARS at effective
    /// width k: `|gain·Σr| < 2^(k−1)` must hold, the gap) in the ring.
    pub const fn new(
        ring: Width,
        (k, f): (Width, u32),
        gain: u64,
        d: usize,
    ) -> Result<CentreSquare, SufError> {
        if d == 0 {
            return Err(SufError::Capacity);
        }
        match RingTrunc::new(ring, k, f, Shift::Arithmetic) {
            Ok(mean) => Ok(CentreSquare {
                mean,
                gain: ring.reduce(gain),
                d,
            }),
            Err(e) => Err(e),
        }
    }

    /// The ring.
    pub const fn ring(&self) -> Width {
        self.mean.ring()
    }

    /// Values per row.
    pub const fn row_len(&self) -> usize {
        self.d
    }

    /// Every key's parameters: the mean's carry key.
    pub const fn key_params(&self) -> Params {
        self.mean.key_params()
    }

    /// Keys per row.
    pub const fn key_count(&self) -> usize {
        KEYS
    }

    /// Explicit words P1 holds per row.
    pub const fn explicit_words(&self) -> usize {
        WORDS
    }

    /// Fresh dealer words per row (every key's value corrections).
    pub const fn random_words(&self) -> usize {
        KEYS * self.key_params().gen_random_words()
    }

    /// Scratch words an evaluator needs for `n` rows (`Area`).
    pub const fn scratch_words(&self, n: usize) -> usize {
        Area::of(self, n).end
    }

    /// Per-row costs.
    pub const fn cost(&self) -> Cost {
        let p = self.key_params();
        let cw = KEYS * (p.key_len() - 16);
        Cost {
            rounds: 1,
            comm_bits: (1 + self.d) * cast::usize_from_u32(self.ring().bits()),
            key_bytes_p0: cw,
            key_bytes_p1: cw + mpc::words_len(self.ring(), WORDS),
            aes_online: SLOT_ROOTS + self.d + KEYS * cast::usize_from_small_u64(p.aes_per_eval()),
            dcf_points: KEYS,
        }
    }

    /// The cleartext value of one row `r`: the centred row into `y` and
    /// its sum of squares, returned.
    pub fn reference(&self, r: &[u64], y: &mut [u64]) -> u64 {
        let w = self.ring();
        let sum = r.iter().fold(0, |s, v| w.add(s, *v));
        let mu = self.mean.reference(w.mul(self.gain, sum));
        let mut v = 0;
        for (yi, ri) in y.iter_mut().zip(r) {
            *yi = w.sub(*ri, mu);
            v = w.add(v, w.mul(*yi, *yi));
        }
        v
    }

    /// `ΣA_i` and `ΣA_i²` of row `row`, each `A_i` the sum of both
    /// parties' shares, in pieces of [`GROUP`] values on the stack; the
    /// AES calls made last.
    fn mask_sums(&self, h: &dyn Hasher, seeds: &[[u8; 16]; 2], row: u64) -> (u64, u64, u64) {
        let w = self.ring();
        let first = row * cast::u64_from_usize(self.d);
        let (mut sum, mut squares, mut calls) = (0u64, 0u64, 0u64);
        let mut blocks = [[Block::ZERO; GROUP]; 2];
        let mut done = 0;
        while done < self.d {
            let m = GROUP.min(self.d - done);
            let at = (first + cast::u64_from_usize(done), m);
            for (seed, b) in seeds.iter().zip(&mut blocks) {
                calls += prf_slots(h, seed, at, SLOT_A..SLOT_A + 1, &mut b[..m]);
            }
            for (b0, b1) in blocks[0][..m].iter().zip(&blocks[1][..m]) {
                let a = w.add(w.reduce(b0.low64()), w.reduce(b1.low64()));
                sum = w.add(sum, a);
                squares = w.add(squares, w.mul(a, a));
            }
            done += m;
        }
        blocks = [[Block::ZERO; GROUP]; 2];
        core::hint::black_box(&blocks);
        (sum, squares, calls)
    }

    /// Deals `count` rows from row index `first`: both parties' whole
    /// keys, key j of every row in `keys0[j]` / `keys1[j]`, and P1's
    /// explicit words (row-major). `random` holds
    /// [`CentreSquare::random_words`] fresh words per row, key 0's for
    /// every row, then key 1's, and so on; `masks` pins each party's shares
    /// of ρ (tests). Returns the AES calls made.
    #[allow(clippy::too_many_arguments)]
    pub fn deal(
        &self,
        fss: &dyn BatchEval,
        (seeds, masks): ([[u8; 16]; 2], Option<[&[u64]; 2]>),
        random: &[u64],
        (first, count): (u64, usize),
        keys0: &mut [&mut [u8]],
        keys1: &mut [&mut [u8]],
        explicit: &mut [u64],
    ) -> Result<u64, Error> {
        let params = self.key_params();
        let len = params.key_len();
        let fit = keys0.len() == KEYS
            && keys1.len() == KEYS
            && (keys0.iter().zip(&*keys1)).all(|(a, b)| key_buffers_fit(a, b, count, len));
        if !fit || random.len() != count * self.random_words() || explicit.len() != count * WORDS {
            return Err(Error::BufferLength);
        }
        let (w, f) = (self.ring(), self.mean_shift());
        let lo = Width::of(f);
        let mut alphas = [0u64; GROUP];
        let mut betas = [[0u64; GROUP]; KEYS];
        one_round::deal_groups(fss, w, (seeds, SLOTS), masks, (first, count), |g| {
            let mut made = 0;
            for (e, &rho) in g.masks.iter().enumerate() {
                let row = first + cast::u64_from_usize(g.at + e);
                let (sum_a, sum_a2, calls) = self.mask_sums(fss, &seeds, row);
                made += calls;
                let (r, m) = (rho >> f, w.msb(rho));
                alphas[e] = lo.reduce(rho);
                for (b, v) in betas.iter_mut().zip([1, sum_a, r, m]) {
                    b[e] = v;
                }
                let words = [
                    r,
                    m,
                    w.mul(r, sum_a),
                    w.mul(m, sum_a),
                    w.mul(r, r),
                    w.mul(r, m),
                    sum_a2,
                ];
                let out = &mut explicit[(g.at + e) * WORDS..(g.at + e + 1) * WORDS];
                g.explicit(w, (e, SLOT_WORDS), words, out);
            }
            made += one_round::generate_keys(
                g,
                fss,
                (params, SLOT_ROOTS),
                count,
                (&alphas, &betas),
                random,
                keys0,
                keys1,
            )?;
            Ok(made)
        })
    }

    /// Bits the mean drops.
    const fn mean_shift(&self) -> u32 {
        self.mean.shift()
    }

    /// Writes each row's key roots, re-derived from `party`'s `seed`, into
    /// `roots[j]` for key j (16 bytes per row).
    pub fn derive_roots(
        &self,
        h: &dyn Hasher,
        party: Party,
        seed: &[u8; 16],
        first: u64,
        roots: &mut [&mut [u8]],
    ) -> Result<u64, Error> {
        let roots = roots.get_mut(..KEYS).ok_or(Error::BufferLength)?;
        one_round::derive_roots(h, party, (seed, SLOT_ROOTS), first, roots)
    }

    /// Fills this party's shares of ρ (from its seed, or `mask` in tests),
    /// of the dealt words (P0's expanded, P1's `explicit`) and of the masks
    /// `A_i` for the rows from `first` into an evaluation area
    /// ([`CentreSquare::scratch_words`]). Returns the AES calls made.
    pub fn load(
        &self,
        h: &dyn Hasher,
        (party, seed, mask): (Party, &[u8; 16], Option<&[u64]>),
        first: u64,
        explicit: &[u64],
        area: &mut [u64],
    ) -> Result<u64, Error> {
        let n = self.rows(area)?;
        let (w, a) = (self.ring(), Area::of(self, n));
        let (rho, rest) = area[..a.mine].split_at_mut(n);
        let (words, masks) = rest.split_at_mut(WORDS * n);
        let mut calls = one_round::mask_shares(h, w, (seed, SLOT_MASK), mask, first, rho)?;
        let at = (first, n, WORDS);
        calls += one_round::word_areas(h, (w, party), (seed, SLOT_WORDS), at, explicit, words)?;
        let at = first * cast::u64_from_usize(self.d);
        calls += one_round::each_block(h, (seed, SLOT_A), at, n * self.d, |i, b| {
            masks[i] = w.reduce(b.low64());
        });
        Ok(calls)
    }

    /// Rows an area holds, checking its length.
    fn rows(&self, area: &[u64]) -> Result<usize, Error> {
        one_round::area_elements(area.len(), self.scratch_words(1))
    }

    /// The round's message for the rows `r` (row-major): this party's
    /// shares of `g·Σr + ρ` per row, then of `r_i − A_i` per value.
    pub fn open(&self, area: &mut [u64], r: &[u64], send: &mut [u8]) -> Result<(), Error> {
        let n = r.len() / self.d;
        let a = Area::of(self, n);
        if area.len() != a.end || r.len() != n * self.d {
            return Err(Error::BufferLength);
        }
        let w = self.ring();
        let (loaded, rest) = area.split_at_mut(a.mine);
        let mine = &mut rest[..a.hat - a.mine];
        for (row, values) in r.chunks_exact(self.d).enumerate() {
            let sum = values.iter().fold(0, |s, v| w.add(s, *v));
            mine[row] = w.add(w.mul(self.gain, sum), loaded[row]);
        }
        let masks = &loaded[a.masks..];
        for (i, (v, m)) in r.iter().zip(masks).enumerate() {
            mine[n + i] = w.sub(*v, *m);
        }
        mpc::open_prepare(w, mine, send)
    }

    /// The peer's message: opens x̂ and every r̂_i, and evaluates the four
    /// keys at `x̂' = x̂ + 2^(k−1)`.
    pub fn close(
        &self,
        party: Party,
        area: &mut [u64],
        recv: &[u8],
        keys: &PartyKeys<'_>,
        backend: &dyn BatchEval,
    ) -> Result<(), Error> {
        let n = self.rows(area)?;
        let (w, a) = (self.ring(), Area::of(self, n));
        let (head, tail) = area.split_at_mut(a.hat);
        let (hat, evals) = tail.split_at_mut(a.evals - a.hat);
        mpc::open_finish(w, &head[a.mine..], recv, hat)?;
        let offset = self.mean_offset();
        for x in &mut hat[..n] {
            *x = w.add(*x, offset);
        }
        for j in 0..KEYS {
            let batch = one_round::key_batch(self.key_params(), party, keys, j)?;
            if batch.count() != n {
                return Err(Error::BufferLength);
            }
            backend.eval(&batch, &hat[..n], &mut evals[j * n..(j + 1) * n])?;
        }
        Ok(())
    }

    /// `2^(k−1)`: the ARS offset.
    const fn mean_offset(&self) -> u64 {
        self.mean.width().half()
    }

    /// This party's shares of the centred rows into `y` (row-major) and of
    /// each row's sum of squares into `v`, from a closed area.
    pub fn output(
        &self,
        party: Party,
        area: &[u64],
        y: &mut [u64],
        v: &mut [u64],
    ) -> Result<(), Error> {
        let n = self.rows(area)?;
        let (w, a, d) = (self.ring(), Area::of(self, n), self.d);
        if y.len() != n * d || v.len() != n {
            return Err(Error::BufferLength);
        }
        let p0 = u64::from(party == Party::P0);
        for (row, (y, v)) in y.chunks_exact_mut(d).zip(v).enumerate() {
            let m = self.mean(p0, area, (&a, row));
            let cols = row * d..(row + 1) * d;
            let rhat = &area[a.hat + n..][cols.clone()];
            let masks = &area[a.masks..][cols.clone()];
            let mine = &area[a.mine + n..][cols];
            let mut sums = Sums::default();
            for ((rh, m_i), (out, own)) in rhat.iter().zip(masks).zip(y.iter_mut().zip(mine)) {
                sums.s_hat = w.add(sums.s_hat, *rh);
                sums.a = w.add(sums.a, *m_i);
                // Σr̂² (P0) + 2·Σr̂·A.
                let sq = w.mul(*rh, w.add(w.mul(p0, *rh), w.mul(2, *m_i)));
                sums.r2 = w.add(sums.r2, sq);
                // r_i = (r_i − A_i) + A_i, this party's shares.
                *out = w.sub(w.add(*own, *m_i), m.mu);
            }
            *v = self.squares(p0, &m, &sums, area, (&a, row));
        }
        Ok(())
    }

    /// Row `row`'s mean terms from a closed area.
    fn mean(&self, p0: u64, area: &[u64], (a, row): (&Area, usize)) -> Mean {
        let (w, f, n) = (self.ring(), self.mean_shift(), a.n);
        let xhat = area[a.hat + row];
        let t = w.sub(xhat >> f, self.mean_offset() >> f);
        let k = w.reduce((1 - w.msb(xhat)) << (w.bits() - f));
        let q = w.sub(area[a.words + row], w.mul(k, area[a.words + n + row]));
        let c = area[a.evals + row];
        let mu = w.sub(w.sub(w.mul(p0, t), q), c);
        Mean { t, k, q, c, mu }
    }

    /// `Σy² = Σr² − 2μ·S + d·μ²` of row `row` from its mean terms and its
    /// sums (module docs).
    fn squares(&self, p0: u64, m: &Mean, s: &Sums, area: &[u64], (a, row): (&Area, usize)) -> u64 {
        let (w, n) = (self.ring(), a.n);
        let word = |j: usize| area[a.words + j * n + row];
        let eval = |j: usize| area[a.evals + j * n + row];
        let add = |terms: &[u64]| terms.iter().fold(0, |acc, x| w.add(acc, *x));
        let (t, k, q, c) = (m.t, m.k, m.q, m.c);
        let sum_r2 = w.add(s.r2, word(6));
        let q_sum_a = w.sub(word(2), w.mul(k, word(3)));
        let q2 = add(&[
            word(4),
            w.neg(w.mul(w.mul(2, k), word(5))),
            w.mul(w.mul(k, k), word(1)),
        ]);
        let qc = w.sub(eval(2), w.mul(k, eval(3)));
        let mu_s = add(&[
            w.mul(p0, w.mul(t, s.s_hat)),
            w.mul(t, s.a),
            w.neg(w.mul(s.s_hat, q)),
            w.neg(q_sum_a),
            w.neg(w.mul(s.s_hat, c)),
            w.neg(eval(1)),
        ]);
        let mu2 = add(&[
            w.mul(p0, w.mul(t, t)),
            w.neg(w.mul(w.mul(2, t), w.add(q, c))),
            q2,
            w.mul(2, qc),
            c,
        ]);
        let dw = w.reduce(cast::u64_from_usize(self.d));
        w.add(w.sub(sum_r2, w.mul(2, mu_s)), w.mul(dw, mu2))
    }
}

/// One row's mean after the round, as this party's shares: `μ = T − Q − c`
/// with T (public, P0's) and K public, `Q = R − K·M` and the carry c.
struct Mean {
    t: u64,
    k: u64,
    q: u64,
    c: u64,
    mu: u64,
}

/// One row's sums over its values: `Ŝ = Σr̂_i` (public), this party's
/// share of `ΣA_i`, and of `Σr̂_i² + 2·Σr̂_i·A_i`.
#[derive(Default)]
struct Sums {
    s_hat: u64,
    a: u64,
    r2: u64,
}

impl CentreSquare {
    /// One party's evaluator for the rows `r` (row-major) from row index
    /// `first`, a [`Protocol`]: its keys, its input shares and
    /// [`CentreSquare::scratch_words`] of scratch. Its output is the
    /// centred rows, then each row's sum of squares.
    pub fn eval<'a>(
        &'a self,
        h: &dyn Hasher,
        (party, seed): (Party, &[u8; 16]),
        first: u64,
        keys: PartyKeys<'a>,
        r: &'a [u64],
        scratch: &'a mut [u64],
    ) -> Result<CentreSquareEval<'a>, Error> {
        let n = r.len() / self.d;
        if r.len() != n * self.d || scratch.len() != self.scratch_words(n) {
            return Err(Error::BufferLength);
        }
        self.load(h, (party, seed, None), first, keys.explicit, scratch)?;
        Ok(CentreSquareEval {
            gate: self,
            party,
            keys,
            r,
            scratch,
            finished: false,
        })
    }
}

/// One party's side of a [`CentreSquare`] over a batch of rows.
pub struct CentreSquareEval<'a> {
    gate: &'a CentreSquare,
    party: Party,
    keys: PartyKeys<'a>,
    r: &'a [u64],
    scratch: &'a mut [u64],
    finished: bool,
}

impl core::fmt::Debug for CentreSquareEval<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CentreSquareEval")
            .field("gate", self.gate)
            .field("party", &self.party)
            .field("values", &self.r.len())
            .finish_non_exhaustive()
    }
}

impl Protocol for CentreSquareEval<'_> {
    fn rounds(&self) -> usize {
        1
    }

    fn send_len(&self, round: usize) -> usize {
        let rows = self.r.len() / self.gate.d;
        match round {
            0 => mpc::words_len(self.gate.ring(), rows + self.r.len()),
            _ => 0,
        }
    }

    fn output_len(&self) -> usize {
        self.r.len() + self.r.len() / self.gate.d
    }

    fn prepare(&mut self, round: usize, send: &mut [u8]) -> Result<(), Error> {
        if round != 0 || self.finished {
            return Err(Error::Unsupported);
        }
        self.gate.open(self.scratch, self.r, send)
    }

    fn finish(&mut self, round: usize, recv: &[u8], backend: &dyn BatchEval) -> Result<(), Error> {
        if round != 0 || self.finished {
            return Err(Error::Unsupported);
        }
        let g = self.gate;
        g.close(self.party, self.scratch, recv, &self.keys, backend)?;
        self.finished = true;
        Ok(())
    }

    fn output(&self, out: &mut [u64]) -> Result<(), Error> {
        if out.len() != self.output_len() {
            return Err(Error::BufferLength);
        }
        let (y, v) = out.split_at_mut(self.r.len());
        self.outputs(y, v)
    }
}

impl CentreSquareEval<'_> {
    /// [`Protocol::output`] into two places: the centred rows into `y`,
    /// the sums into `v`.
    pub fn outputs(&self, y: &mut [u64], v: &mut [u64]) -> Result<(), Error> {
        if !self.finished {
            return Err(Error::Unsupported);
        }
        self.gate.output(self.party, self.scratch, y, v)
    }
}

/// An evaluator's scratch for `n` rows, in order: ρ's shares, the dealt
/// words (word-major), the masks `A_i`, this party's opening shares (x̂'s,
/// then the r̂_i's), the opened values, the keys' evaluations (key-major).
struct Area {
    n: usize,
    words: usize,
    masks: usize,
    mine: usize,
    hat: usize,
    evals: usize,
    end: usize,
}

impl Area {
    const fn of(g: &CentreSquare, n: usize) -> Area {
        let words = n;
        let masks = words + WORDS * n;
        let mine = masks + n * g.d;
        let hat = mine + n + n * g.d;
        let evals = hat + n + n * g.d;
        Area {
            n,
            words,
            masks,
            mine,
            hat,
            evals,
            end: evals + KEYS * n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Serial;
    use crate::gate::testing::dirty;
    use crate::prg::{FixedKeyAes, Prg};
    use proptest::prelude::*;
    use std::vec;
    use std::vec::Vec;

    /// Deals and runs both parties on shares of the rows `rs` (row-major),
    /// ρ pinned to `masks` where given (one per row); odd salts keep the
    /// keys' bodies and re-derive their roots. Returns the reconstructed
    /// centred rows and sums of squares.
    fn run(g: &CentreSquare, rs: &[u64], masks: Option<&[u64]>, salt: u8) -> (Vec<u64>, Vec<u64>) {
        let (w, d) = (g.ring(), g.row_len());
        let n = rs.len() / d;
        let (fss, aes) = (Serial::new(), FixedKeyAes::new());
        let mut prg = Prg::new(&[salt ^ 0x3c; 16]);
        let seeds = [[salt; 16], [salt ^ 0x5a; 16]];
        let pinned: Option<[Vec<u64>; 2]> = masks.map(|m| {
            let m0: Vec<u64> = m.iter().map(|_| w.reduce(prg.next_u64())).collect();
            let m1 = m.iter().zip(&m0).map(|(r, a)| w.sub(*r, *a)).collect();
            [m0, m1]
        });
        let pins = pinned.as_ref().map(|[a, b]| [&a[..], &b[..]]);
        let random: Vec<u64> = (0..n * g.random_words()).map(|_| prg.next_u64()).collect();
        let len = g.key_params().key_len();
        let mut k: Vec<Vec<u8>> = (0..2 * KEYS).map(|_| vec![0u8; n * len]).collect();
        let mut explicit = vec![0u64; n * WORDS];
        {
            let (k0, k1) = k.split_at_mut(KEYS);
            let mut d0: Vec<&mut [u8]> = k0.iter_mut().map(|v| &mut v[..]).collect();
            let mut d1: Vec<&mut [u8]> = k1.iter_mut().map(|v| &mut v[..]).collect();
            g.deal(
                &fss,
                (seeds, pins),
                &random,
                (3, n),
                &mut d0,
                &mut d1,
                &mut explicit,
            )
            .unwrap();
        }
        let r0: Vec<u64> = rs.iter().map(|_| w.reduce(prg.next_u64())).collect();
        let r1: Vec<u64> = rs.iter().zip(&r0).map(|(r, a)| w.sub(*r, *a)).collect();
        let parties = [Party::P0, Party::P1];
        let mut areas: Vec<Vec<u64>> = Vec::new();
        let mut msgs: Vec<Vec<u8>> = Vec::new();
        for (p, party) in parties.into_iter().enumerate() {
            let mut area = dirty(g.scratch_words(n), p as u64);
            let ex = if p == 1 { &explicit[..] } else { &[] };
            let mask = pins.map(|m| m[p]);
            g.load(&aes, (party, &seeds[p], mask), 3, ex, &mut area)
                .unwrap();
            let mut send = vec![0u8; mpc::words_len(w, n * (1 + d))];
            g.open(&mut area, [&r0, &r1][p], &mut send).unwrap();
            areas.push(area);
            msgs.push(send);
        }
        let (mut y, mut v) = (vec![0u64; n * d], vec![0u64; n]);
        for (p, party) in parties.into_iter().enumerate() {
            let whole: Vec<&[u8]> = (0..KEYS).map(|j| &k[p * KEYS + j][..]).collect();
            let bodies: Vec<Vec<u8>> = whole
                .iter()
                .map(|ks| crate::gate::one_round::testing::bodies(ks, len))
                .collect();
            let mut roots: Vec<Vec<u8>> = (0..KEYS).map(|_| vec![0u8; 16 * n]).collect();
            {
                let mut rs: Vec<&mut [u8]> = roots.iter_mut().map(|r| &mut r[..]).collect();
                g.derive_roots(&aes, party, &seeds[p], 3, &mut rs).unwrap();
            }
            let ex = if p == 1 { &explicit[..] } else { &[] };
            let keys = if salt % 2 == 1 {
                let b: Vec<&[u8]> = bodies.iter().map(Vec::as_slice).collect();
                let r: Vec<&[u8]> = roots.iter().map(Vec::as_slice).collect();
                PartyKeys::of(&b, &r, ex)
            } else {
                PartyKeys::of(&whole, &[], ex)
            };
            g.close(party, &mut areas[p], &msgs[1 - p], &keys, &fss)
                .unwrap();
            let (mut ys, mut vs) = (vec![0u64; n * d], vec![0u64; n]);
            g.output(party, &areas[p], &mut ys, &mut vs).unwrap();
            for (s, x) in y.iter_mut().zip(ys).chain(v.iter_mut().zip(vs)) {
                *s = w.add(*s, x);
            }
        }
        (y, v)
    }

    /// Every row's centred values and sum of squares against the
    /// reference.
    fn check(g: &CentreSquare, rs: &[u64], masks: Option<&[u64]>, salt: u8) {
        let d = g.row_len();
        let (y, v) = run(g, rs, masks, salt);
        for (row, r) in rs.chunks_exact(d).enumerate() {
            let mut want = vec![0u64; d];
            let sum = g.reference(r, &mut want);
            assert_eq!(&y[row * d..(row + 1) * d], &want[..], "row {row}: {r:?}");
            assert_eq!(v[row], sum, "row {row}: {r:?}");
        }
    }

    /// Masks with ρ mod 2^f and ρ's top bit at their edges.
    fn edge_masks(w: Width, f: u32) -> Vec<u64> {
        let mut ms = Vec::new();
        for high in [0, 1, w.mask() >> (f + 1), w.mask() >> f] {
            for low in [0, 1, (1 << f) - 1, 1 << (f - 1)] {
                ms.push(w.reduce((high << f) | low));
            }
        }
        ms
    }

    /// In Z_2^12 with rows of two values: every pair whose mean stays in
    /// the gap, under each edge mask, against the reference.
    #[test]
    fn every_pair_of_a_small_ring() {
        let w = Width::of(12);
        let (k, f, gain) = (Width::of(10), 3, 3);
        let g = CentreSquare::new(w, (k, f), gain, 2).unwrap();
        // |gain·(r0 + r1)| < 2^9: both values in [−85, 85].
        let vals: Vec<u64> = (-85i64..=85).map(|x| w.from_signed(x)).collect();
        let mut rs = Vec::new();
        for a in &vals {
            for b in &vals {
                rs.extend([*a, *b]);
            }
        }
        let rows = rs.len() / 2;
        for (i, m) in edge_masks(w, f).into_iter().enumerate() {
            check(&g, &rs, Some(&vec![m; rows]), i as u8);
        }
    }

    /// Rows longer than a PRF group, more rows than a dealing group, and
    /// seeded masks.
    #[test]
    fn long_rows_and_many_of_them() {
        let w = Width::W64;
        for (d, rows, salt) in [(1usize, 130usize, 4u8), (70, 3, 5), (129, 66, 6)] {
            let g = CentreSquare::new(w, (Width::of(40), 16), 65_536 / d as u64, d).unwrap();
            let mut prg = Prg::new(&[salt; 16]);
            let rs: Vec<u64> = (0..rows * d)
                .map(|_| w.from_signed((prg.next_u64() >> 45) as i64 - (1 << 18)))
                .collect();
            check(&g, &rs, None, salt);
        }
    }

    #[test]
    fn shapes_it_cannot_take_are_refused() {
        let w = Width::W64;
        assert!(CentreSquare::new(w, (Width::of(40), 16), 1, 0).is_err());
        assert!(CentreSquare::new(w, (Width::of(16), 16), 1, 4).is_err());
        let g = CentreSquare::new(w, (Width::of(40), 16), 1, 4).unwrap();
        let c = g.cost();
        assert_eq!((c.rounds, c.comm_bits, c.dcf_points), (1, 5 * 64, KEYS));
        let mut area = vec![0u64; g.scratch_words(2) + 1];
        assert!(
            g.load(
                &FixedKeyAes::new(),
                (Party::P0, &[0; 16], None),
                0,
                &[],
                &mut area
            )
            .is_err()
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]
        /// Random rows at n = 64: widths, shifts and gains with the mean in
        /// the gap.
        #[test]
        fn random_rows_at_64_bits(
            seed in any::<u64>(),
            d in 1usize..20,
            f in 1u32..30,
            spare in 2u32..20,
        ) {
            let w = Width::W64;
            let k = f + spare;
            let gain = (1u64 << f) / d as u64 + 1;
            let g = CentreSquare::new(w, (Width::of(k), f), gain, d).unwrap();
            let mut prg = Prg::new(&seed.to_le_bytes().repeat(2).try_into().unwrap());
            // |gain·Σr| < 2^(k−1): each |r| at most 2^(k−2)/(gain·d), and
            // rows of zeros where that bound is below 1.
            let bound = (1u64 << (k - 2)) / (gain * d as u64);
            let rs: Vec<u64> = (0..5 * d)
                .map(|_| {
                    let v = prg.next_u64() % (2 * bound).max(1);
                    w.from_signed(v as i64 - bound as i64)
                })
                .collect();
            let (y, v) = run(&g, &rs, None, (seed % 251) as u8);
            for (row, r) in rs.chunks_exact(d).enumerate() {
                let mut want = vec![0u64; d];
                let sum = g.reference(r, &mut want);
                prop_assert_eq!(&y[row * d..(row + 1) * d], &want[..]);
                prop_assert_eq!(v[row], sum);
            }
        }
    }
}
