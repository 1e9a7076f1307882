//! A gap truncation whose output comes out opened: both parties learn
//! `E = z + ⌊y/2^f⌋ − A_e` for a fresh mask `A_e` they hold shares of, in
//! the truncation's own two rounds. A product or a square that reads the
//! output then needs no opening of its own (docs/PLAN.md, "Truncations
//! that open their output"). The plan runs the squared form where an
//! RMSNorm squares a residual just truncated (the host's
//! `Kind::TruncSquare`); other truncations use [`super::trunc`].
//!
//! # Maths
//!
//! Round 1 opens `ŷ = y + r` and, for `ŷ' = ŷ + 2^(k−1)` (the input
//! proven below 2^(k−1) in magnitude, k < n: the gap), the gap truncation
//! gives
//!
//! `t = ⌊y/2^f⌋ = P − R − c`, `P = ⌊ŷ'/2^f⌋ − 2^(k−1−f)` public,
//! `R = ⌊r/2^f⌋ − 2^(n−f)·(1 − MSB(ŷ'))·MSB(r)` shared, and the carry
//! `c = [ŷ' mod 2^f < r mod 2^f]` XOR-shared by an f-bit DCF key.
//!
//! Round 2 sends, besides the B2A bit `e = c ⊕ ρ` (ρ a dealer bit), the
//! shares of two words, with `A` and `D` fresh uniform masks:
//!
//! `W₀ = R + A + ρ − z`, `W₁ = R + A + D − ρ − z`.
//!
//! If `e = 0` then `c = ρ` and `z + t − A = P − W₀`; if `e = 1` then
//! `c = 1 − ρ` and `z + t − (A + D) = P − 1 − W₁`. So
//! `E = P − W₀ + e·(W₀ − W₁ − 1)` is `x − A_e` for `x = z + t` and
//! `A_e = A + e·D`, whose shares each party forms from its shares of `A`
//! and `D`, `e` being public.
//!
//! # Why nothing more is learned
//!
//! A party sees `ŷ` (uniform: `r`), `e` (a uniform bit: `ρ`), `W₀`
//! (uniform: `A`) and `W₁` (uniform and independent of `W₀`: `D`;
//! `W₁ − W₀ = D − 2ρ` says nothing of ρ), and its own shares; `E` is a
//! function of these. Each of `r`, `ρ`, `A`, `D` masks one message.
//!
//! # Shares
//!
//! Each party expands from its seed: its mask share `r_b` and its XOR share
//! of ρ (PRF slot 0), its shares of `A` and `D` (slot 1, so the dealer, who
//! holds both seeds, knows `A` and `D` for the products that read `E`),
//! and its key's root (slot 4). `[⌊r/2^f⌋]`, `[MSB(r)]` (slot 2) and the
//! additive `[ρ]` (slot 3) are P0's seeded words and P1's explicit words.
//!
//! # Cost
//!
//! Two rounds; `2n + 1` bits sent in the second (one more word than the
//! gap truncation followed by an opening, which sends `n + 1` and then
//! `n`). The key is the gap truncation's f-bit bit-output DCF; P1 holds
//! three explicit words (five in the squared form below).
//!
//! # The squared form
//!
//! [`TruncOpen::squared`] also gives each party its share of `x²` with no
//! round of its own: `x² = E² + 2E·A_e + A_e²` and, `e` being a public
//! bit, `A_e² = A² + e·(2AD + D²)`. The dealer shares `A²` and `2AD + D²`
//! (P0's shares from PRF slot 5, P1's two more explicit words); P0 adds
//! the public `E²`. An RMSNorm's sum of squares after a residual
//! `x = x_prev + ⌊y/2^f⌋` is the use (docs/PLAN.md).

use crate::batch::BatchEval;
use crate::error::{Error, SufError};
use crate::fss::{KeyBatch, Kind, Output, Params, Party, key_buffers_fit};
use crate::gate::one_round::{self, GROUP};
use crate::gate::{Cost, PartyKeys, Protocol, SingleKey};
use crate::mpc;
use crate::prg::Hasher;
use crate::ring::{Width, cast};

/// PRF slots of one element: the mask share and ρ's XOR share, the shares
/// of `A` and `D`, P0's `[⌊r/2^f⌋]` and `[MSB(r)]`, P0's `[ρ]`, the root,
/// and in the squared form P0's `[A²]` and `[2AD + D²]`.
const SLOTS: usize = 5;
const SLOT_MASK: usize = 0;
const SLOT_OWN: usize = 1;
const SLOT_WORDS: usize = 2;
const SLOT_RHO: usize = 3;
const SLOT_ROOT: usize = 4;
const SLOT_SQUARE: usize = 5;

/// Scratch words per element.
const AREA: usize = 17;
/// Scratch rows, `n` words each.
const R: usize = 0;
const HI: usize = 1;
const MSB: usize = 2;
const RHO: usize = 3;
const A: usize = 4;
const D: usize = 5;
const RHO_BIT: usize = 6;
const YHAT: usize = 7;
const CARRY: usize = 8;
const SEND: usize = 9; // two rows: round 1's share of ŷ, then W₀ and W₁;
// row 11 holds this party's share of e.
const OPENED: usize = 12; // two rows: W₀, W₁; then E in the first
const E_OPEN: usize = 14;
const SQ_A: usize = 15; // the squared form's [A²]
const SQ_AD: usize = 16; // and [2AD + D²]

/// A gap ARS by `f` bits at effective width `k` whose output is opened
/// under a fresh mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TruncOpen {
    ring: Width,
    k: Width,
    f: u32,
    squared: bool,
}

impl TruncOpen {
    /// ARS by `f` of inputs below `2^(k−1)` in magnitude in the ring of
    /// width `ring`: needs `0 < f < k < n` (the gap).
    pub const fn new(ring: Width, k: Width, f: u32) -> Result<TruncOpen, SufError> {
        if f == 0 || f >= k.bits() || k.bits() >= ring.bits() {
            return Err(SufError::FixedPoint);
        }
        Ok(TruncOpen {
            ring,
            k,
            f,
            squared: false,
        })
    }

    /// The same truncation that also gives shares of `x²` (the module's
    /// squared form): two more explicit words for P1.
    pub const fn squared(self) -> TruncOpen {
        TruncOpen {
            squared: true,
            ..self
        }
    }

    /// Whether this is the squared form.
    pub const fn is_squared(&self) -> bool {
        self.squared
    }

    /// PRF slots per element.
    const fn slots(&self) -> usize {
        if self.squared { SLOTS + 1 } else { SLOTS }
    }

    /// The ring.
    pub const fn ring(&self) -> Width {
        self.ring
    }

    /// The carry key's parameters: an f-bit DCF with bit output.
    pub const fn key_params(&self) -> Params {
        Params::new(Kind::Dcf, Width::of(self.f), Output::Bit)
    }

    /// Explicit words P1 holds per element: its shares of `⌊r/2^f⌋`,
    /// `MSB(r)` and ρ, and in the squared form of `A²` and `2AD + D²`.
    pub const fn explicit_words(&self) -> usize {
        if self.squared { 5 } else { 3 }
    }

    /// Scratch words an evaluator needs for `n` elements.
    pub const fn scratch_words(n: usize) -> usize {
        AREA * n
    }

    /// Per-element costs (key bytes without the root, which is re-derived
    /// from the seed).
    pub const fn cost(&self) -> Cost {
        let p = self.key_params();
        let cw = p.key_len() - 16;
        let bits = cast::usize_from_u32(self.ring.bits());
        Cost {
            rounds: 2,
            comm_bits: 3 * bits + 1,
            key_bytes_p0: cw,
            key_bytes_p1: cw + mpc::words_len(self.ring, self.explicit_words()),
            aes_online: self.slots() - 1 + cast::usize_from_small_u64(p.aes_per_eval()),
            dcf_points: 1,
        }
    }

    /// The cleartext value: `z + ⌊y/2^f⌋` of the signed k-bit view of `y`,
    /// in the ring. The protocol opens it less `A_e` on the gap's range.
    pub fn reference(&self, y: u64, z: u64) -> u64 {
        let t = self.k.to_signed(self.k.reduce(y)) >> self.f;
        self.ring.add(z, self.ring.from_signed(t))
    }

    /// The dealer's square terms of masks `A`, `D`: `A²` and `2AD + D²`,
    /// so that `A_e² = A² + e·(2AD + D²)` for a bit `e`.
    fn square_terms(w: Width, a: u64, d: u64) -> [u64; 2] {
        [w.mul(a, a), w.mul(d, w.add(w.add(a, a), d))]
    }

    /// Deals `count` elements from element index `first`: both parties'
    /// full keys (roots included, `count · key_len` bytes each) and P1's
    /// explicit words. `masks` pins each party's mask shares (tests).
    /// Returns the AES calls made.
    #[allow(clippy::too_many_arguments)]
    pub fn deal(
        &self,
        fss: &dyn BatchEval,
        seeds: [[u8; 16]; 2],
        masks: Option<[&[u64]; 2]>,
        first: u64,
        count: usize,
        key0: &mut [u8],
        key1: &mut [u8],
        explicit: &mut [u64],
    ) -> Result<u64, Error> {
        let params = self.key_params();
        let len = params.key_len();
        let per = self.explicit_words();
        if !key_buffers_fit(key0, key1, count, len) || explicit.len() != per * count {
            return Err(Error::BufferLength);
        }
        let w = self.ring;
        let lo = Width::of(self.f);
        let betas = [1u64; GROUP];
        let mut alphas = [0u64; GROUP];
        let at = (first, count);
        one_round::deal_groups(fss, w, (seeds, self.slots()), masks, at, |g| {
            for (e, &r) in g.masks.iter().enumerate() {
                alphas[e] = lo.reduce(r);
                let [m0, m1] = g.block(e, SLOT_MASK);
                let rho = (m0.high64() ^ m1.high64()) & 1;
                let words = g.block(e, SLOT_WORDS)[0];
                let rho0 = g.block(e, SLOT_RHO)[0].low64();
                let ex = &mut explicit[per * (g.at + e)..per * (g.at + e) + per];
                ex[0] = w.sub(r >> self.f, w.reduce(words.low64()));
                ex[1] = w.sub(w.msb(r), w.reduce(words.high64()));
                ex[2] = w.sub(rho, w.reduce(rho0));
                if self.squared {
                    let [o0, o1] = g.block(e, SLOT_OWN);
                    let a = w.add(w.reduce(o0.low64()), w.reduce(o1.low64()));
                    let d = w.add(w.reduce(o0.high64()), w.reduce(o1.high64()));
                    let [a2, ad] = Self::square_terms(w, a, d);
                    let sq0 = g.block(e, SLOT_SQUARE)[0];
                    ex[3] = w.sub(a2, w.reduce(sq0.low64()));
                    ex[4] = w.sub(ad, w.reduce(sq0.high64()));
                }
            }
            g.generate(fss, params, SLOT_ROOT, (&alphas, &betas), &[], key0, key1)
        })
    }

    /// The masks `A` and `D` of elements `first..first + n`, as the dealer
    /// knows them from both seeds: for the products that read `E`.
    pub fn masks_of(
        &self,
        h: &dyn Hasher,
        seeds: [&[u8; 16]; 2],
        first: u64,
        a: &mut [u64],
        d: &mut [u64],
    ) -> Result<u64, Error> {
        let n = a.len();
        if d.len() != n {
            return Err(Error::BufferLength);
        }
        let w = self.ring;
        let mut calls = 0;
        for seed in seeds {
            calls += one_round::each_block(h, (seed, SLOT_OWN), first, n, |i, b| {
                a[i] = w.add(a[i], w.reduce(b.low64()));
                d[i] = w.add(d[i], w.reduce(b.high64()));
            });
        }
        Ok(calls)
    }

    /// Fills an evaluation area ([`TruncOpen::scratch_words`]) for `n`
    /// elements from element index `first`: this party's mask shares (from
    /// `seed`, or `mask` in tests), ρ's XOR share, its shares of `A` and
    /// `D`, and its shares of `⌊r/2^f⌋`, `MSB(r)` and ρ (P0's expanded,
    /// P1's `explicit`). Returns the AES calls made.
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
        let n = area.len() / AREA;
        if area.len() != Self::scratch_words(n) || mask.is_some_and(|m| m.len() != n) {
            return Err(Error::BufferLength);
        }
        let per = self.explicit_words();
        let explicit_len = if party == Party::P1 { per * n } else { 0 };
        if explicit.len() != explicit_len {
            return Err(Error::BufferLength);
        }
        let w = self.ring;
        let (own, rest) = area.split_at_mut(7 * n);
        let (sq_a, sq_ad) = rest[(SQ_A - 7) * n..(SQ_AD + 1 - 7) * n].split_at_mut(n);
        let (r, rest) = own.split_at_mut(n);
        let (hi, rest) = rest.split_at_mut(n);
        let (msb, rest) = rest.split_at_mut(n);
        let (rho, rest) = rest.split_at_mut(n);
        let (a, rest) = rest.split_at_mut(n);
        let (d, rho_bit) = rest.split_at_mut(n);
        let mut calls = one_round::each_block(h, (seed, SLOT_MASK), first, n, |i, b| {
            r[i] = w.reduce(b.low64());
            rho_bit[i] = b.high64() & 1;
        });
        if let Some(m) = mask {
            r.copy_from_slice(m);
        }
        calls += one_round::each_block(h, (seed, SLOT_OWN), first, n, |i, b| {
            a[i] = w.reduce(b.low64());
            d[i] = w.reduce(b.high64());
        });
        let dealt = [hi, msb, rho, sq_a, sq_ad];
        Ok(calls + self.load_dealt(h, (party, seed), first, explicit, dealt)?)
    }

    /// This party's shares of the dealt words `⌊r/2^f⌋`, `MSB(r)`, ρ and,
    /// squared, `A²` and `2AD + D²`: P0 expands its own from `seed`, P1
    /// copies its `explicit` words. Returns the AES calls made.
    fn load_dealt(
        &self,
        h: &dyn Hasher,
        (party, seed): (Party, &[u8; 16]),
        first: u64,
        explicit: &[u64],
        [hi, msb, rho, sq_a, sq_ad]: [&mut [u64]; 5],
    ) -> Result<u64, Error> {
        let w = self.ring;
        if party == Party::P1 {
            for (i, ex) in explicit.chunks_exact(self.explicit_words()).enumerate() {
                (hi[i], msb[i], rho[i]) = (ex[0], ex[1], ex[2]);
                if self.squared {
                    (sq_a[i], sq_ad[i]) = (ex[3], ex[4]);
                }
            }
            return Ok(0);
        }
        let at = (seed, SLOT_WORDS);
        let mut calls = one_round::dealt_words(h, (w, party), at, first, &[], &mut [hi, msb])?;
        let at = (seed, SLOT_RHO);
        calls += one_round::dealt_words(h, (w, party), at, first, &[], &mut [rho])?;
        if self.squared {
            let at = (seed, SLOT_SQUARE);
            calls += one_round::dealt_words(h, (w, party), at, first, &[], &mut [sq_a, sq_ad])?;
        }
        Ok(calls)
    }

    /// The message of round 1: this party's share of `ŷ = y + r`.
    pub fn open(&self, area: &mut [u64], y: &[u64], send: &mut [u8]) -> Result<(), Error> {
        let n = y.len();
        if area.len() != Self::scratch_words(n) {
            return Err(Error::BufferLength);
        }
        let (head, tail) = area.split_at_mut(SEND * n);
        one_round::open(
            self.ring,
            &head[R * n..(R + 1) * n],
            y,
            &mut tail[..n],
            send,
        )
    }

    /// The peer's message of round 1: opens `ŷ' = ŷ + 2^(k−1)` and
    /// evaluates the carry key there (this party's XOR share of `c`).
    pub fn close(
        &self,
        area: &mut [u64],
        recv: &[u8],
        keys: &KeyBatch<'_>,
        backend: &dyn BatchEval,
    ) -> Result<(), Error> {
        let n = area.len() / AREA;
        if area.len() != Self::scratch_words(n) || keys.count() != n {
            return Err(Error::BufferLength);
        }
        let w = self.ring;
        let (head, tail) = area.split_at_mut(SEND * n);
        let yhat = &mut head[YHAT * n..(YHAT + 1) * n];
        mpc::open_finish(w, &tail[..n], recv, yhat)?;
        for v in yhat.iter_mut() {
            *v = w.add(*v, self.k.half());
        }
        let (yhat, carry) = head[YHAT * n..(CARRY + 1) * n].split_at_mut(n);
        backend.eval(keys, yhat, carry)?;
        Ok(())
    }

    /// Bytes each party sends in round 2 for `n` elements: `W₀`, `W₁` and
    /// the bits `e`.
    pub const fn second_len(&self, n: usize) -> usize {
        mpc::words_len(self.ring, 2 * n) + mpc::bits_len(n)
    }

    /// The public part `P = ⌊ŷ'/2^f⌋ − 2^(k−1−f)` and the wrap's public
    /// factor `2^(n−f)·(1 − MSB(ŷ'))` of an opened `ŷ'`.
    fn public(&self, yhat: u64) -> (u64, u64) {
        let w = self.ring;
        let p = w.sub(yhat >> self.f, self.k.half() >> self.f);
        let wrap = w.reduce((1 - w.msb(yhat)) << (w.bits() - self.f));
        (p, wrap)
    }

    /// The message of round 2, for the addend `z` (this party's shares):
    /// its shares of `W₀ = R + A + ρ − z` and `W₁ = R + A + D − ρ − z`,
    /// then its share of `e = c ⊕ ρ`.
    pub fn second(&self, area: &mut [u64], z: &[u64], send: &mut [u8]) -> Result<(), Error> {
        let n = z.len();
        if area.len() != Self::scratch_words(n) || send.len() != self.second_len(n) {
            return Err(Error::BufferLength);
        }
        let w = self.ring;
        let (head, tail) = area.split_at_mut(SEND * n);
        let (words, rest) = tail.split_at_mut(2 * n);
        let bits = &mut rest[..n];
        let row = |j: usize| &head[j * n..(j + 1) * n];
        let (hi, msb, rho, a, d) = (row(HI), row(MSB), row(RHO), row(A), row(D));
        let (rho_bit, yhat, carry) = (row(RHO_BIT), row(YHAT), row(CARRY));
        for i in 0..n {
            let (_, wrap) = self.public(yhat[i]);
            let base = w.sub(w.add(w.sub(hi[i], w.mul(wrap, msb[i])), a[i]), z[i]);
            words[i] = w.add(base, rho[i]);
            words[n + i] = w.sub(w.add(base, d[i]), rho[i]);
            bits[i] = (carry[i] ^ rho_bit[i]) & 1;
        }
        let (ws, bs) = send.split_at_mut(mpc::words_len(w, 2 * n));
        mpc::open_prepare(w, words, ws)?;
        mpc::pack_bits(bits, bs)
    }

    /// The peer's message of round 2: opens `e`, `W₀`, `W₁` and forms
    /// `E = P − W₀ + e·(W₀ − W₁ − 1)` (in `W₀`'s row).
    pub fn finish(&self, area: &mut [u64], recv: &[u8]) -> Result<(), Error> {
        let n = area.len() / AREA;
        if area.len() != Self::scratch_words(n) || recv.len() != self.second_len(n) {
            return Err(Error::BufferLength);
        }
        let w = self.ring;
        let (head, tail) = area.split_at_mut(SEND * n);
        let (mine, rest) = tail.split_at_mut(2 * n);
        let (bits, rest) = rest.split_at_mut(n);
        let (opened, rest) = rest.split_at_mut(2 * n);
        let e = &mut rest[..n];
        let (rw, rb) = recv.split_at(mpc::words_len(w, 2 * n));
        mpc::open_finish(w, mine, rw, opened)?;
        mpc::open_bits_finish(bits, rb, e)?;
        let yhat = &head[YHAT * n..(YHAT + 1) * n];
        let (w0, w1) = opened.split_at_mut(n);
        for i in 0..n {
            let (p, _) = self.public(yhat[i]);
            let jump = w.sub(w.sub(w0[i], w1[i]), 1);
            w0[i] = w.add(w.sub(p, w0[i]), w.mul(e[i], jump));
        }
        Ok(())
    }

    /// The opened outputs `E = x − A_e`, the same for both parties, from a
    /// finished area.
    pub fn opened<'a>(&self, area: &'a [u64]) -> Result<&'a [u64], Error> {
        let n = area.len() / AREA;
        if area.len() != Self::scratch_words(n) {
            return Err(Error::BufferLength);
        }
        Ok(&area[OPENED * n..(OPENED + 1) * n])
    }

    /// This party's shares of the masks `A_e = A + e·D` from a finished
    /// area.
    pub fn mask_shares(&self, area: &[u64], out: &mut [u64]) -> Result<(), Error> {
        let n = out.len();
        if area.len() != Self::scratch_words(n) {
            return Err(Error::BufferLength);
        }
        let w = self.ring;
        let row = |j: usize| &area[j * n..(j + 1) * n];
        let (a, d, e) = (row(A), row(D), row(E_OPEN));
        for i in 0..n {
            out[i] = w.add(a[i], w.mul(e[i], d[i]));
        }
        Ok(())
    }

    /// The squared form's shares of `x²` from a finished area:
    /// `[A²] + e·[2AD + D²] + 2E·[A_e]`, P0 adding `E²`.
    pub fn square_shares(&self, area: &[u64], party: Party, out: &mut [u64]) -> Result<(), Error> {
        let n = out.len();
        if !self.squared {
            return Err(Error::Unsupported);
        }
        if area.len() != Self::scratch_words(n) {
            return Err(Error::BufferLength);
        }
        let w = self.ring;
        let p0 = u64::from(party == Party::P0);
        let row = |j: usize| &area[j * n..(j + 1) * n];
        let (a, d, e, big_e) = (row(A), row(D), row(E_OPEN), row(OPENED));
        let (sq_a, sq_ad) = (row(SQ_A), row(SQ_AD));
        for i in 0..n {
            let a_e = w.add(a[i], w.mul(e[i], d[i]));
            let mask_sq = w.add(sq_a[i], w.mul(e[i], sq_ad[i]));
            let cross = w.mul(w.add(big_e[i], big_e[i]), a_e);
            let public = w.mul(p0, w.mul(big_e[i], big_e[i]));
            out[i] = w.add(w.add(mask_sq, cross), public);
        }
        Ok(())
    }
}

impl TruncOpen {
    /// One party's evaluator for `y.len()` elements from element index
    /// `first`, a [`Protocol`]: its keys, its shares of the input `y` and
    /// the addend `z`, and [`TruncOpen::scratch_words`] of scratch. `mask`
    /// pins its mask shares (tests).
    #[allow(clippy::too_many_arguments)]
    pub fn eval<'a>(
        &'a self,
        h: &dyn Hasher,
        party: Party,
        seed: &[u8; 16],
        mask: Option<&[u64]>,
        first: u64,
        keys: PartyKeys<'a>,
        (y, z): (&'a [u64], &'a [u64]),
        scratch: &'a mut [u64],
    ) -> Result<TruncOpenEval<'a>, Error> {
        let batch = self.key_batch(party, &keys)?;
        let n = y.len();
        if batch.count() != n || z.len() != n || scratch.len() != Self::scratch_words(n) {
            return Err(Error::BufferLength);
        }
        self.load(h, party, seed, mask, first, keys.explicit, scratch)?;
        Ok(TruncOpenEval {
            gate: self,
            party,
            keys: batch,
            y,
            z,
            area: scratch,
            done: 0,
        })
    }
}

/// One party's side of a [`TruncOpen`] over a batch: round 1 opens `ŷ`,
/// round 2 opens `e`, `W₀`, `W₁`. Its output is this party's share of
/// `x = E + A_e` (P0 adds the public `E`); [`TruncOpenEval::opened`] and
/// [`TruncOpenEval::mask_shares`] give the two parts.
pub struct TruncOpenEval<'a> {
    gate: &'a TruncOpen,
    party: Party,
    keys: KeyBatch<'a>,
    y: &'a [u64],
    z: &'a [u64],
    area: &'a mut [u64],
    /// Rounds finished.
    done: usize,
}

impl core::fmt::Debug for TruncOpenEval<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("TruncOpenEval")
            .field("gate", self.gate)
            .field("party", &self.party)
            .field("n", &self.y.len())
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl TruncOpenEval<'_> {
    /// The opened `E = x − A_e`, the same for both parties, once both
    /// rounds are finished.
    pub fn opened(&self) -> Result<&[u64], Error> {
        if self.done != 2 {
            return Err(Error::Unsupported);
        }
        self.gate.opened(self.area)
    }

    /// This party's shares of `A_e = A + e·D`, once both rounds are
    /// finished.
    pub fn mask_shares(&self, out: &mut [u64]) -> Result<(), Error> {
        if self.done != 2 {
            return Err(Error::Unsupported);
        }
        self.gate.mask_shares(self.area, out)
    }

    /// This party's shares of `x²` (the squared form), once both rounds
    /// are finished.
    pub fn square_shares(&self, out: &mut [u64]) -> Result<(), Error> {
        if self.done != 2 {
            return Err(Error::Unsupported);
        }
        self.gate.square_shares(self.area, self.party, out)
    }
}

impl Protocol for TruncOpenEval<'_> {
    fn rounds(&self) -> usize {
        2
    }

    fn send_len(&self, round: usize) -> usize {
        match round {
            0 => mpc::words_len(self.gate.ring, self.y.len()),
            1 => self.gate.second_len(self.y.len()),
            _ => 0,
        }
    }

    fn output_len(&self) -> usize {
        self.y.len()
    }

    fn prepare(&mut self, round: usize, send: &mut [u8]) -> Result<(), Error> {
        match (round, self.done) {
            (0, 0) => self.gate.open(self.area, self.y, send),
            (1, 1) => self.gate.second(self.area, self.z, send),
            _ => Err(Error::Unsupported),
        }
    }

    fn finish(&mut self, round: usize, recv: &[u8], backend: &dyn BatchEval) -> Result<(), Error> {
        match (round, self.done) {
            (0, 0) => self.gate.close(self.area, recv, &self.keys, backend)?,
            (1, 1) => self.gate.finish(self.area, recv)?,
            _ => return Err(Error::Unsupported),
        }
        self.done += 1;
        Ok(())
    }

    fn output(&self, out: &mut [u64]) -> Result<(), Error> {
        self.mask_shares(out)?;
        if self.party == Party::P0 {
            let w = self.gate.ring;
            for (o, e) in out.iter_mut().zip(self.opened()?) {
                *o = w.add(*o, *e);
            }
        }
        Ok(())
    }
}

impl SingleKey for TruncOpen {
    const ROOT_SLOT: usize = SLOT_ROOT;

    fn single_key(&self) -> Params {
        self.key_params()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Serial;
    use crate::gate::one_round::testing::{Setup, bodies};
    use crate::gate::protocol::{max_send_len, run_pair};
    use crate::prg::{FixedKeyAes, Prg};
    use proptest::prelude::*;
    use std::vec;
    use std::vec::Vec;

    /// What a run shows: each party's opened `E`, the reconstructed masks
    /// `A_e`, and `A`, `D` as the dealer knows them.
    struct Run {
        opened: [Vec<u64>; 2],
        masks: Vec<u64>,
        /// The protocol's output shares, reconstructed: `x`.
        outputs: Vec<u64>,
        /// The squared form's shares of `x²`, reconstructed (else empty).
        squares: Vec<u64>,
        a: Vec<u64>,
        d: Vec<u64>,
    }

    /// Deals and runs both parties on shares of `ys` and `zs`, the masks
    /// pinned to `masks` where given; odd salts keep key bodies and
    /// re-derive the roots, as a key file does.
    fn run(g: &TruncOpen, ys: &[u64], zs: &[u64], masks: Option<&[u64]>, salt: u8) -> Run {
        let (n, w) = (ys.len(), g.ring());
        let fss = Serial::new();
        let aes = FixedKeyAes::new();
        let setup = Setup::new(w, ys, masks, 0, salt);
        let (seeds, pinned) = (setup.seeds, setup.pinned());
        let len = g.key_params().key_len();
        let (mut k0, mut k1) = (vec![0u8; n * len], vec![0u8; n * len]);
        let mut explicit = vec![0u64; g.explicit_words() * n];
        g.deal(&fss, seeds, pinned, 7, n, &mut k0, &mut k1, &mut explicit)
            .unwrap();
        let mut prg = Prg::new(&[salt ^ 0x77; 16]);
        let z0: Vec<u64> = (0..n).map(|_| w.reduce(prg.next_u64())).collect();
        let z1: Vec<u64> = zs.iter().zip(&z0).map(|(z, a)| w.sub(*z, *a)).collect();
        let odd = salt % 2 == 1;
        let kept = [bodies(&k0, len), bodies(&k1, len)];
        let mut roots = [vec![0u8; 16 * n], vec![0u8; 16 * n]];
        let parties = [Party::P0, Party::P1];
        for b in 0..2 {
            g.derive_roots(&aes, parties[b], &seeds[b], 7, &mut roots[b])
                .unwrap();
        }
        let whole = [&k0, &k1];
        let keys = |b: usize| {
            PartyKeys::of(
                &[if odd { &kept[b] } else { whole[b] }],
                &[if odd { &roots[b][..] } else { &[] }],
                if b == 1 { &explicit } else { &[] },
            )
        };
        // Scratch starts dirty: nothing may rely on zeroes.
        let mut s0 = vec![0x5555; TruncOpen::scratch_words(n)];
        let mut s1 = vec![u64::MAX; TruncOpen::scratch_words(n)];
        let pin = |b: usize| pinned.map(|m| m[b]);
        let mut e0 = g
            .eval(
                &aes,
                Party::P0,
                &seeds[0],
                pin(0),
                7,
                keys(0),
                (&setup.x[0], &z0),
                &mut s0,
            )
            .unwrap();
        let mut e1 = g
            .eval(
                &aes,
                Party::P1,
                &seeds[1],
                pin(1),
                7,
                keys(1),
                (&setup.x[1], &z1),
                &mut s1,
            )
            .unwrap();
        let max = max_send_len(&e0);
        let (mut b0, mut b1) = (vec![0u8; max], vec![0u8; max]);
        let traffic = run_pair(&mut e0, &mut e1, &fss, &mut b0, &mut b1).unwrap();
        assert_eq!(traffic.rounds, 2);
        let (mut m0, mut m1) = (vec![0u64; n], vec![0u64; n]);
        e0.mask_shares(&mut m0).unwrap();
        e1.mask_shares(&mut m1).unwrap();
        let (mut o0, mut o1) = (vec![0u64; n], vec![0u64; n]);
        e0.output(&mut o0).unwrap();
        e1.output(&mut o1).unwrap();
        let squares = match g.is_squared() {
            true => {
                let (mut q0, mut q1) = (vec![0u64; n], vec![0u64; n]);
                e0.square_shares(&mut q0).unwrap();
                e1.square_shares(&mut q1).unwrap();
                q0.iter().zip(&q1).map(|(x, y)| w.add(*x, *y)).collect()
            }
            false => {
                let mut q = [0u64];
                assert_eq!(e0.square_shares(&mut q), Err(Error::Unsupported));
                Vec::new()
            }
        };
        let (mut a, mut d) = (vec![0u64; n], vec![0u64; n]);
        g.masks_of(&aes, [&seeds[0], &seeds[1]], 7, &mut a, &mut d)
            .unwrap();
        Run {
            opened: [e0.opened().unwrap().to_vec(), e1.opened().unwrap().to_vec()],
            masks: m0.iter().zip(&m1).map(|(x, y)| w.add(*x, *y)).collect(),
            outputs: o0.iter().zip(&o1).map(|(x, y)| w.add(*x, *y)).collect(),
            squares,
            a,
            d,
        }
    }

    /// Checks a run against the spec on every input: both parties open the
    /// same `E`, `E + A_e` is the truncation plus the addend, `A_e` is
    /// `A` or `A + D`, the dealer's masks, and in the squared form the
    /// squares are `x²`.
    fn check(g: &TruncOpen, ys: &[u64], zs: &[u64], run: &Run) {
        let w = g.ring();
        assert_eq!(run.opened[0], run.opened[1]);
        for i in 0..ys.len() {
            let x = w.add(run.opened[0][i], run.masks[i]);
            assert_eq!(x, g.reference(ys[i], zs[i]), "y={} z={}", ys[i], zs[i]);
            assert_eq!(run.outputs[i], x);
            let with_d = w.add(run.a[i], run.d[i]);
            assert!(run.masks[i] == run.a[i] || run.masks[i] == with_d);
            if g.is_squared() {
                assert_eq!(run.squares[i], w.mul(x, x), "y={} z={}", ys[i], zs[i]);
            }
        }
    }

    /// Masks that put the wrap and the carry at their edges.
    fn edge_masks(g: &TruncOpen) -> Vec<u64> {
        let (w, lo) = (g.ring, Width::of(g.f));
        let mut ms = Vec::new();
        for high in [
            0,
            1,
            w.half() >> g.f,
            (w.half() >> g.f) - 1,
            w.mask() >> g.f,
        ] {
            for low in [0, 1, lo.half(), lo.mask()] {
                ms.push(w.reduce((high << g.f) | low));
            }
        }
        let mut prg = Prg::new(&[9; 16]);
        ms.extend((0..4).map(|_| w.reduce(prg.next_u64())));
        ms
    }

    /// Every input of the gap's range.
    fn in_range(g: &TruncOpen) -> Vec<u64> {
        let h = g.k.half();
        (0..=g.ring.mask())
            .filter(|y| {
                let s = g.ring.to_signed(*y);
                s >= -i64::try_from(h).unwrap() && s < i64::try_from(h).unwrap()
            })
            .collect()
    }

    #[test]
    fn opened_truncation_equals_its_spec_on_every_input_in_range() {
        let shapes = [
            (8, 7, 3, false),
            (10, 8, 1, true),
            (9, 6, 5, false),
            (7, 6, 2, true),
        ];
        for (n, k, f, squared) in shapes {
            let g = TruncOpen::new(Width::of(n), Width::of(k), f).unwrap();
            let g = if squared { g.squared() } else { g };
            let ys = in_range(&g);
            let mut prg = Prg::new(&[n as u8; 16]);
            let zs: Vec<u64> = ys.iter().map(|_| g.ring.reduce(prg.next_u64())).collect();
            for (i, r) in edge_masks(&g).iter().enumerate() {
                let out = run(&g, &ys, &zs, Some(&vec![*r; ys.len()]), i as u8);
                check(&g, &ys, &zs, &out);
            }
        }
    }

    #[test]
    fn seeded_masks_give_the_same_values_and_both_mask_choices_occur() {
        let g = TruncOpen::new(Width::of(12), Width::of(9), 4).unwrap();
        for g in [g, g.squared()] {
            let ys = in_range(&g);
            let zs = vec![0u64; ys.len()];
            let out = run(&g, &ys, &zs, None, 3);
            check(&g, &ys, &zs, &out);
            let plain = out.masks.iter().zip(&out.a).filter(|(m, a)| m == a).count();
            assert!(plain > 0 && plain < ys.len(), "e took one value only");
        }
    }

    #[test]
    fn shapes_outside_the_gap_are_refused_and_buffers_are_checked() {
        let w = Width::W64;
        assert!(TruncOpen::new(w, Width::of(64), 12).is_err());
        assert!(TruncOpen::new(w, Width::of(40), 0).is_err());
        assert!(TruncOpen::new(w, Width::of(12), 12).is_err());
        let g = TruncOpen::new(w, Width::of(40), 12).unwrap();
        let len = g.key_params().key_len();
        let (mut k0, mut k1) = (vec![0u8; 2 * len], vec![0u8; 2 * len]);
        let fss = Serial::new();
        let seeds = [[1; 16], [2; 16]];
        let mut short = vec![0u64; 5];
        let dealt = g.deal(&fss, seeds, None, 0, 2, &mut k0, &mut k1, &mut short);
        assert_eq!(dealt, Err(Error::BufferLength));
        let mut ex = vec![0u64; 6];
        g.deal(&fss, seeds, None, 0, 2, &mut k0, &mut k1, &mut ex)
            .unwrap();
        let aes = FixedKeyAes::new();
        let mut area = vec![0u64; TruncOpen::scratch_words(2)];
        // P1 without its explicit words; P0 with some.
        assert!(
            g.load(&aes, Party::P1, &seeds[1], None, 0, &[], &mut area)
                .is_err()
        );
        assert!(
            g.load(&aes, Party::P0, &seeds[0], None, 0, &ex, &mut area)
                .is_err()
        );
        g.load(&aes, Party::P0, &seeds[0], None, 0, &[], &mut area)
            .unwrap();
        // The squared form takes five words per element, and only it
        // gives squares.
        let sq = g.squared();
        assert_eq!(
            sq.deal(&fss, seeds, None, 0, 2, &mut k0, &mut k1, &mut ex),
            Err(Error::BufferLength)
        );
        let mut ex5 = vec![0u64; 10];
        sq.deal(&fss, seeds, None, 0, 2, &mut k0, &mut k1, &mut ex5)
            .unwrap();
        assert!(
            sq.load(&aes, Party::P1, &seeds[1], None, 0, &ex, &mut area)
                .is_err()
        );
        sq.load(&aes, Party::P1, &seeds[1], None, 0, &ex5, &mut area)
            .unwrap();
        assert_eq!(
            g.square_shares(&area, Party::P0, &mut [0, 0]),
            Err(Error::Unsupported)
        );
        g.load(&aes, Party::P0, &seeds[0], None, 0, &[], &mut area)
            .unwrap();
        // A second-round message of the wrong length.
        let mut send = vec![0u8; g.second_len(2) - 1];
        assert_eq!(
            g.second(&mut area, &[0, 0], &mut send),
            Err(Error::BufferLength)
        );
        assert_eq!(g.finish(&mut area, &send), Err(Error::BufferLength));
        // The evaluator: rounds out of order and outputs before the end.
        let keys = PartyKeys::of(&[&k0], &[], &[]);
        let (y, z) = ([1u64, 2], [0u64, 0]);
        let mut e = g
            .eval(
                &aes,
                Party::P0,
                &seeds[0],
                None,
                0,
                keys,
                (&y, &z),
                &mut area,
            )
            .unwrap();
        let mut first = vec![0u8; e.send_len(0)];
        let mut second = vec![0u8; e.send_len(1)];
        assert_eq!(e.prepare(1, &mut second), Err(Error::Unsupported));
        e.prepare(0, &mut first).unwrap();
        e.finish(0, &first, &fss).unwrap();
        assert_eq!(e.output(&mut [0, 0]), Err(Error::Unsupported));
        assert_eq!(e.finish(0, &first, &fss), Err(Error::Unsupported));
    }

    /// The reference is the planned form's: the gap truncation gate's
    /// output plus the addend (the host's fused step replaces a truncation
    /// and the residual sum that reads it), on every input of a small
    /// ring's gap range and on random 64-bit ones.
    #[test]
    fn reference_is_the_gap_truncation_plus_the_addend() {
        use crate::gate::trunc::{Range, Shift, trunc};
        let mut prg = Prg::new(&[21; 16]);
        for (n, k, f) in [(10, 8, 3), (64, 40, 12), (64, 62, 36)] {
            let (w, kw) = (Width::of(n), Width::of(k));
            let g = TruncOpen::new(w, kw, f).unwrap();
            let gate = trunc(w, kw, f, Shift::Arithmetic, Range::Gap).unwrap();
            let ys: Vec<u64> = match n {
                10 => in_range(&g),
                _ => (0..4096)
                    .map(|_| w.from_signed(kw.to_signed(kw.reduce(prg.next_u64()))))
                    .collect(),
            };
            for y in ys {
                let z = w.reduce(prg.next_u64());
                let mut out = [0u64; 4];
                gate.reference(y, &mut out);
                assert_eq!(g.reference(y, z), w.add(z, out[0]), "y={y:#x} k={k} f={f}");
            }
        }
    }

    /// One round more than the opening it replaces, one word more sent.
    #[test]
    fn cost_is_the_gap_truncations_key_and_one_more_word() {
        let w = Width::W64;
        let g = TruncOpen::new(w, Width::of(40), 12).unwrap();
        let gap = crate::gate::trunc::trunc(
            w,
            Width::of(40),
            12,
            crate::gate::trunc::Shift::Arithmetic,
            crate::gate::trunc::Range::Gap,
        )
        .unwrap();
        let (c, t) = (g.cost(), gap.cost());
        assert_eq!((c.rounds, t.rounds), (2, 2));
        // The truncation's n + 1 bits and an opening's n, plus one word.
        assert_eq!(c.comm_bits, t.comm_bits + 64 + 64);
        assert_eq!(c.key_bytes_p0, t.key_bytes_p0);
        assert_eq!(g.second_len(3), 6 * 8 + 1);
        // The squared form: two more words for P1, none for P0, and the
        // same messages.
        let sq = g.squared().cost();
        assert_eq!(sq.key_bytes_p1, c.key_bytes_p1 + 16);
        assert_eq!(
            (sq.key_bytes_p0, sq.comm_bits),
            (c.key_bytes_p0, c.comm_bits)
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]
        #[test]
        fn opened_truncation_random_at_64_bits(
            ys in proptest::collection::vec(any::<u64>(), 64),
            zs in proptest::collection::vec(any::<u64>(), 64),
            rs in proptest::collection::vec(any::<u64>(), 64),
            k in 14u32..=63,
            f in 1u32..=13,
            seeded in any::<bool>(),
            squared in any::<bool>(),
        ) {
            let (n, k) = (Width::W64, Width::of(k));
            let g = TruncOpen::new(n, k, f).unwrap();
            let g = if squared { g.squared() } else { g };
            let inside: Vec<u64> = ys.iter().map(|y| n.from_signed(k.to_signed(k.reduce(*y)))).collect();
            let masks = if seeded { None } else { Some(&rs[..]) };
            let out = run(&g, &inside, &zs, masks, 5);
            prop_assert_eq!(&out.opened[0], &out.opened[1]);
            for i in 0..inside.len() {
                let x = n.add(out.opened[0][i], out.masks[i]);
                prop_assert_eq!(x, g.reference(inside[i], zs[i]), "y={} k={:?} f={}", inside[i], k, f);
                if squared {
                    prop_assert_eq!(out.squares[i], n.mul(x, x));
                }
            }
        }
    }
}
