//! Truncation in one round: [`super::trunc`]'s gap form with its carry
//! taken from a ring-output DCF, so that nothing is left to convert after
//! the opening.
//!
//! # Maths
//!
//! The gap truncation opens `x̂ = x + r` and, for `x' = x + 2^(k−1)` (ARS)
//! or `x' = x` (LRS) below `2^(n−1)` (the gap), uses
//!
//! `⌊x'/2^f⌋ = ⌊x̂'/2^f⌋ − ⌊r/2^f⌋ − c + 2^(n−f)·MSB(r)·(1 − MSB(x̂'))`
//!
//! with the carry `c = [x̂' mod 2^f < r mod 2^f]`; ARS then subtracts
//! `2^(k−1−f)`. [`super::trunc`] takes `c` from a bit-output DCF, XOR-shared,
//! and spends a second round turning it into an additive share (B2A). Here
//! the carry key has output group Z_2^n and payload 1: its two evaluations
//! already add up to `c` in the ring, so after the opening every term is
//! local.
//!
//! Shares: each party expands its mask share `r_b` and the key's root from
//! its seed; `[⌊r/2^f⌋]` and `[MSB(r)]` are P0's seeded words and P1's
//! explicit words. The key's value corrections are drawn from the
//! dealer's fresh randomness, which the caller passes in (never a party's
//! seed: see [`crate::dcf::generate`]).
//!
//! # Cost
//!
//! One round, n bits sent per element. The f-bit ring-output key carries a
//! value correction per level and only one input bit per leaf block
//! (64-bit lanes): `(f − 1)·(16 + 8) + 16` bytes of correction words,
//! against `(f − 7)·16 + 16` for the two-round form's bit-output key. So it
//! trades a round for key bytes (`cargo xtask bench gates` gives both),
//! which pays where elements are few and rounds are many: a per-row scalar
//! such as a norm's mean or an inverse chain's truncations.

use crate::batch::BatchEval;
use crate::error::{Error, SufError};
use crate::fss::{KeyBatch, Kind, Output, Params, Party, key_buffers_fit};
use crate::gate::one_round::{self, GROUP};

#[cfg(test)]
use crate::gate::PartyKeys;
#[cfg(test)]
use crate::gate::protocol::Protocol;
use crate::gate::trunc::Shift;
use crate::gate::{Cost, SingleKey};
use crate::mpc;
use crate::prg::Hasher;
use crate::ring::{Width, cast};

/// PRF slots of one element: the mask share, P0's words, the key's root.
const SLOTS: usize = 3;
const SLOT_MASK: usize = 0;
const SLOT_WORDS: usize = 1;
const SLOT_ROOT: usize = 2;

/// A one-round gap truncation by `f` bits at effective width `k`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RingTrunc {
    ring: Width,
    k: Width,
    f: u32,
    shift: Shift,
}

impl RingTrunc {
    /// ARS or LRS by `f` of inputs below `2^(k−1)` in magnitude (ARS) or
    /// below `2^k` (LRS), in the ring of width `ring`: needs
    /// `0 < f < k < n` (the gap). Truncate-reduce is not offered: its
    /// two-round form needs no wrap key and is already cheap.
    pub const fn new(ring: Width, k: Width, f: u32, shift: Shift) -> Result<RingTrunc, SufError> {
        if f == 0 || f >= k.bits() || k.bits() >= ring.bits() || matches!(shift, Shift::Reduce) {
            return Err(SufError::FixedPoint);
        }
        Ok(RingTrunc { ring, k, f, shift })
    }

    /// The ring.
    pub const fn ring(&self) -> Width {
        self.ring
    }

    /// The effective input width k.
    pub const fn width(&self) -> Width {
        self.k
    }

    /// Bits dropped, f.
    pub const fn shift(&self) -> u32 {
        self.f
    }

    /// The carry key's parameters: an f-bit DCF with output in the ring.
    pub const fn key_params(&self) -> Params {
        Params::new(Kind::Dcf, Width::of(self.f), Output::Ring(self.ring))
    }

    /// Explicit words P1 holds per element: its shares of `⌊r/2^f⌋` and
    /// `MSB(r)`.
    pub const fn explicit_words(&self) -> usize {
        2
    }

    /// Fresh random words the dealer supplies per element.
    pub const fn random_words(&self) -> usize {
        self.key_params().gen_random_words()
    }

    /// Scratch words an evaluator needs for `n` elements.
    pub const fn scratch_words(n: usize) -> usize {
        5 * n
    }

    /// Per-element costs (key bytes without the roots, which are re-derived
    /// from the seeds).
    pub const fn cost(&self) -> Cost {
        let p = self.key_params();
        let cw = p.key_len() - 16;
        Cost {
            rounds: 1,
            comm_bits: cast::usize_from_u32(self.ring.bits()),
            key_bytes_p0: cw,
            key_bytes_p1: cw + mpc::words_len(self.ring, 2),
            aes_online: SLOTS - 1 + cast::usize_from_small_u64(p.aes_per_eval()),
            dcf_points: 1,
        }
    }

    /// The offset that makes signed inputs non-negative.
    const fn offset(&self) -> u64 {
        match self.shift {
            Shift::Arithmetic => self.k.half(),
            _ => 0,
        }
    }

    /// The cleartext value: `⌊x/2^f⌋` of the signed (ARS) or unsigned (LRS)
    /// k-bit view of `x`, in the ring. The protocol equals it on the gap's
    /// range (|x| < 2^(k−1), or x < 2^k).
    pub fn reference(&self, x: u64) -> u64 {
        let v = self.k.reduce(x);
        match self.shift {
            Shift::Arithmetic => self.ring.from_signed(self.k.to_signed(v) >> self.f),
            _ => v >> self.f,
        }
    }

    /// Deals `count` elements from element index `first`: both parties'
    /// full keys (roots included, `count · key_len` bytes each) and P1's
    /// explicit words. `random` holds [`RingTrunc::random_words`] fresh
    /// words per element; `masks` pins each party's mask shares (tests).
    /// Returns the AES calls made.
    #[allow(clippy::too_many_arguments)]
    pub fn deal(
        &self,
        fss: &dyn BatchEval,
        seeds: [[u8; 16]; 2],
        masks: Option<[&[u64]; 2]>,
        random: &[u64],
        first: u64,
        count: usize,
        key0: &mut [u8],
        key1: &mut [u8],
        explicit: &mut [u64],
    ) -> Result<u64, Error> {
        let params = self.key_params();
        let (len, rw) = (params.key_len(), self.random_words());
        if !key_buffers_fit(key0, key1, count, len)
            || explicit.len() != 2 * count
            || random.len() != count * rw
        {
            return Err(Error::BufferLength);
        }
        let w = self.ring;
        let lo = Width::of(self.f);
        let betas = [1u64; GROUP];
        let mut alphas = [0u64; GROUP];
        let at = (first, count);
        one_round::deal_groups(fss, w, (seeds, SLOTS), masks, at, |g| {
            for (e, &r) in g.masks.iter().enumerate() {
                alphas[e] = lo.reduce(r);
                let words = g.block(e, SLOT_WORDS)[0];
                let ex = &mut explicit[2 * (g.at + e)..2 * (g.at + e) + 2];
                ex[0] = w.sub(r >> self.f, w.reduce(words.low64()));
                ex[1] = w.sub(w.msb(r), w.reduce(words.high64()));
            }
            let random = &random[g.at * rw..(g.at + g.len()) * rw];
            g.generate(
                fss,
                params,
                SLOT_ROOT,
                (&alphas, &betas),
                random,
                key0,
                key1,
            )
        })
    }

    /// Fills the first three parts of an evaluation area
    /// ([`RingTrunc::scratch_words`]) for `n` elements from element index
    /// `first`: this party's mask shares (expanded from `seed`, or `mask`
    /// in tests), its shares of `⌊r/2^f⌋` and of `MSB(r)` (P0's expanded,
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
        let n = area.len() / 5;
        if area.len() != Self::scratch_words(n) || mask.is_some_and(|m| m.len() != n) {
            return Err(Error::BufferLength);
        }
        let w = self.ring;
        let (r, rest) = area.split_at_mut(n);
        let (hi, rest) = rest.split_at_mut(n);
        let msb = &mut rest[..n];
        let calls = one_round::mask_shares(h, w, (seed, SLOT_MASK), mask, first, r)?;
        let at = (seed, SLOT_WORDS);
        let words = &mut [hi, msb];
        Ok(calls + one_round::dealt_words(h, (w, party), at, first, explicit, words)?)
    }

    /// The round's message: this party's share of `x̂ = x + r`.
    pub fn open(&self, area: &mut [u64], x: &[u64], send: &mut [u8]) -> Result<(), Error> {
        let n = x.len();
        if area.len() != Self::scratch_words(n) {
            return Err(Error::BufferLength);
        }
        let (r, rest) = area.split_at_mut(n);
        one_round::open(self.ring, r, x, &mut rest[3 * n..], send)
    }

    /// The peer's message: opens `x̂' = x̂ + offset` and evaluates the
    /// carry key there.
    pub fn close(
        &self,
        area: &mut [u64],
        recv: &[u8],
        keys: &KeyBatch<'_>,
        backend: &dyn BatchEval,
    ) -> Result<(), Error> {
        let n = area.len() / 5;
        if area.len() != Self::scratch_words(n) || keys.count() != n {
            return Err(Error::BufferLength);
        }
        let w = self.ring;
        let (xhat, mine) = area[3 * n..].split_at_mut(n);
        mpc::open_finish(w, mine, recv, xhat)?;
        for v in xhat.iter_mut() {
            *v = w.add(*v, self.offset());
        }
        backend.eval(keys, xhat, mine)?;
        Ok(())
    }

    /// This party's output shares from a closed area.
    pub fn output(&self, party: Party, area: &[u64], out: &mut [u64]) -> Result<(), Error> {
        let n = out.len();
        if area.len() != Self::scratch_words(n) {
            return Err(Error::BufferLength);
        }
        let (w, bits) = (self.ring, self.ring.bits());
        let (hi, msb) = (&area[n..2 * n], &area[2 * n..3 * n]);
        let (xhat, carry) = (&area[3 * n..4 * n], &area[4 * n..]);
        // P0 adds the public part: ⌊x̂'/2^f⌋ less the offset's 2^(k−1−f).
        let p0 = u64::from(party == Party::P0);
        let unshift = self.offset() >> self.f;
        for i in 0..n {
            let public = w.mul(p0, w.sub(xhat[i] >> self.f, unshift));
            // The wrap's public factor 2^(n−f)·(1 − MSB(x̂')).
            let wrap = w.reduce((1 - w.msb(xhat[i])) << (bits - self.f));
            out[i] = w.add(w.sub(w.sub(public, hi[i]), carry[i]), w.mul(wrap, msb[i]));
        }
        Ok(())
    }

    /// One party's evaluator for `x.len()` elements from element index
    /// `first`, a [`Protocol`]: its keys, its input shares and
    /// [`RingTrunc::scratch_words`] of scratch. `mask` pins its mask shares.
    /// Tests only: the plan runs one-round truncations inside chains
    /// ([`super::chain`]), which drive `load`, `open`, `close` and `output`.
    #[cfg(test)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn eval<'a>(
        &'a self,
        h: &dyn Hasher,
        party: Party,
        seed: &[u8; 16],
        mask: Option<&[u64]>,
        first: u64,
        keys: PartyKeys<'a>,
        x: &'a [u64],
        scratch: &'a mut [u64],
    ) -> Result<RingTruncEval<'a>, Error> {
        let keys_batch = self.key_batch(party, &keys)?;
        if keys_batch.count() != x.len() || scratch.len() != Self::scratch_words(x.len()) {
            return Err(Error::BufferLength);
        }
        self.load(h, party, seed, mask, first, keys.explicit, scratch)?;
        Ok(RingTruncEval {
            gate: self,
            party,
            keys: keys_batch,
            x,
            scratch,
            finished: false,
        })
    }
}

/// One party's side of a [`RingTrunc`] over a batch (tests).
#[cfg(test)]
pub(crate) struct RingTruncEval<'a> {
    gate: &'a RingTrunc,
    party: Party,
    keys: KeyBatch<'a>,
    x: &'a [u64],
    /// `r_b`, `[⌊r/2^f⌋]`, `[MSB(r)]`, then `x̂'` and `[c]`, `n` words each.
    scratch: &'a mut [u64],
    finished: bool,
}

#[cfg(test)]
impl core::fmt::Debug for RingTruncEval<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RingTruncEval")
            .field("gate", self.gate)
            .field("party", &self.party)
            .field("n", &self.x.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
impl Protocol for RingTruncEval<'_> {
    fn rounds(&self) -> usize {
        1
    }

    fn send_len(&self, round: usize) -> usize {
        if round == 0 {
            mpc::words_len(self.gate.ring, self.x.len())
        } else {
            0
        }
    }

    fn output_len(&self) -> usize {
        self.x.len()
    }

    fn prepare(&mut self, round: usize, send: &mut [u8]) -> Result<(), Error> {
        if round != 0 || self.finished {
            return Err(Error::Unsupported);
        }
        self.gate.open(self.scratch, self.x, send)
    }

    fn finish(&mut self, round: usize, recv: &[u8], backend: &dyn BatchEval) -> Result<(), Error> {
        if round != 0 || self.finished {
            return Err(Error::Unsupported);
        }
        self.gate.close(self.scratch, recv, &self.keys, backend)?;
        self.finished = true;
        Ok(())
    }

    fn output(&self, out: &mut [u64]) -> Result<(), Error> {
        if !self.finished {
            return Err(Error::Unsupported);
        }
        self.gate.output(self.party, self.scratch, out)
    }
}

impl SingleKey for RingTrunc {
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
    use crate::gate::trunc::{Range, trunc};
    use crate::prg::{FixedKeyAes, Prg};
    use proptest::prelude::*;
    use std::vec;
    use std::vec::Vec;

    /// Deals and runs both parties on shares of `xs`, the masks pinned to
    /// `masks` where given; returns the reconstructed outputs and the
    /// traffic.
    fn run(g: &RingTrunc, xs: &[u64], masks: Option<&[u64]>, salt: u8) -> (Vec<u64>, usize) {
        let (n, w) = (xs.len(), g.ring());
        let fss = Serial::new();
        let aes = FixedKeyAes::new();
        let setup = Setup::new(w, xs, masks, n * g.random_words(), salt);
        let (seeds, pinned, random) = (setup.seeds, setup.pinned(), &setup.random);
        let len = g.key_params().key_len();
        let (mut k0, mut k1) = (vec![0u8; n * len], vec![0u8; n * len]);
        let mut explicit = vec![0u64; 2 * n];
        g.deal(
            &fss,
            seeds,
            pinned,
            random,
            7,
            n,
            &mut k0,
            &mut k1,
            &mut explicit,
        )
        .unwrap();
        let [x0, x1] = &setup.x;
        // Scratch starts dirty: nothing may rely on zeroes.
        let mut s0 = vec![u64::MAX; RingTrunc::scratch_words(n)];
        let mut s1 = vec![0x5555; RingTrunc::scratch_words(n)];
        let mask0 = pinned.map(|[a, _]| a);
        let mask1 = pinned.map(|[_, b]| b);
        // Odd salts store bodies only and re-derive the roots from the
        // seeds, as a key file does.
        let split = |k: &[u8], party, seed| {
            let bodies = bodies(k, len);
            let mut roots = vec![0u8; 16 * n];
            g.derive_roots(&aes, party, seed, 7, &mut roots).unwrap();
            (bodies, roots)
        };
        let (d0, d1) = (
            split(&k0, Party::P0, &seeds[0]),
            split(&k1, Party::P1, &seeds[1]),
        );
        fn keys<'k>(
            split: bool,
            k: &'k [u8],
            d: &'k (Vec<u8>, Vec<u8>),
            ex: &'k [u64],
        ) -> PartyKeys<'k> {
            match split {
                false => PartyKeys::of(&[k], &[], ex),
                true => PartyKeys::of(&[&d.0], &[&d.1], ex),
            }
        }
        let odd = salt % 2 == 1;
        let mut e0 = g
            .eval(
                &aes,
                Party::P0,
                &seeds[0],
                mask0,
                7,
                keys(odd, &k0, &d0, &[]),
                x0,
                &mut s0,
            )
            .unwrap();
        let k1e = keys(odd, &k1, &d1, &explicit);
        let mut e1 = g
            .eval(&aes, Party::P1, &seeds[1], mask1, 7, k1e, x1, &mut s1)
            .unwrap();
        let max = max_send_len(&e0);
        let (mut b0, mut b1) = (vec![0u8; max], vec![0u8; max]);
        let traffic = run_pair(&mut e0, &mut e1, &fss, &mut b0, &mut b1).unwrap();
        let (mut o0, mut o1) = (vec![0u64; n], vec![0u64; n]);
        e0.output(&mut o0).unwrap();
        e1.output(&mut o1).unwrap();
        let out = o0.iter().zip(&o1).map(|(a, b)| w.add(*a, *b)).collect();
        (out, traffic.rounds)
    }

    fn in_range(g: &RingTrunc, x: u64) -> bool {
        match g.shift {
            Shift::Arithmetic => {
                let h = i64::try_from(g.k.half()).unwrap();
                (-h..h).contains(&g.ring.to_signed(x))
            }
            _ => x <= g.k.mask(),
        }
    }

    /// Masks that put the wrap and the carry at their edges: r and its
    /// low f bits at 0, 1, the middle and the top, and random ones.
    fn edge_masks(g: &RingTrunc) -> Vec<u64> {
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
        ms.extend((0..8).map(|_| w.reduce(prg.next_u64())));
        ms
    }

    #[test]
    fn one_round_truncation_equals_its_spec_on_every_input_in_range() {
        for (n, k, f) in [(8, 7, 3), (10, 8, 1), (9, 6, 5), (7, 6, 2)] {
            let (n, k) = (Width::of(n), Width::of(k));
            let xs: Vec<u64> = (0..=n.mask()).collect();
            for s in [Shift::Arithmetic, Shift::Logical] {
                let g = RingTrunc::new(n, k, f, s).unwrap();
                let oracle = trunc(n, k, f, s, Range::Gap).unwrap();
                for (i, r) in edge_masks(&g).iter().enumerate() {
                    let (out, rounds) = run(&g, &xs, Some(&vec![*r; xs.len()]), i as u8);
                    assert_eq!(rounds, 1);
                    for &x in xs.iter().filter(|x| in_range(&g, **x)) {
                        let mut want = [0u64; 2];
                        oracle.reference(x, &mut want);
                        assert_eq!(g.reference(x), want[0], "{s:?} spec x={x}");
                        assert_eq!(out[x as usize], want[0], "{s:?} n={n:?} x={x} r={r}");
                    }
                }
            }
        }
    }

    #[test]
    fn seeded_masks_give_the_same_outputs() {
        let g = RingTrunc::new(Width::of(12), Width::of(9), 4, Shift::Arithmetic).unwrap();
        let xs: Vec<u64> = (0..=g.ring.mask()).filter(|x| in_range(&g, *x)).collect();
        let (out, _) = run(&g, &xs, None, 3);
        for (x, o) in xs.iter().zip(&out) {
            assert_eq!(*o, g.reference(*x), "x={x}");
        }
    }

    #[test]
    fn shapes_outside_the_gap_are_refused_and_buffers_are_checked() {
        let w = Width::W64;
        assert!(RingTrunc::new(w, Width::of(64), 12, Shift::Arithmetic).is_err());
        assert!(RingTrunc::new(w, Width::of(40), 0, Shift::Arithmetic).is_err());
        assert!(RingTrunc::new(w, Width::of(12), 12, Shift::Logical).is_err());
        assert!(RingTrunc::new(w, Width::of(40), 12, Shift::Reduce).is_err());
        let g = RingTrunc::new(w, Width::of(40), 12, Shift::Arithmetic).unwrap();
        let len = g.key_params().key_len();
        let (mut k0, mut k1) = (vec![0u8; 2 * len], vec![0u8; 2 * len]);
        let mut ex = vec![0u64; 4];
        let random = vec![0u64; 2 * g.random_words()];
        let fss = Serial::new();
        let seeds = [[1; 16], [2; 16]];
        assert_eq!(
            g.deal(
                &fss,
                seeds,
                None,
                &random[1..],
                0,
                2,
                &mut k0,
                &mut k1,
                &mut ex
            ),
            Err(Error::BufferLength)
        );
        g.deal(&fss, seeds, None, &random, 0, 2, &mut k0, &mut k1, &mut ex)
            .unwrap();
        // P0's keys alone (an empty P1 buffer) are the same bytes; a P1
        // buffer of another length is refused.
        let (mut alone, mut ex2) = (vec![0u8; 2 * len], vec![0u64; 4]);
        g.deal(
            &fss,
            seeds,
            None,
            &random,
            0,
            2,
            &mut alone,
            &mut [],
            &mut ex2,
        )
        .unwrap();
        assert_eq!((&alone, &ex2), (&k0, &ex));
        let short = &mut vec![0u8; len][..];
        let dealt = g.deal(
            &fss, seeds, None, &random, 0, 2, &mut alone, short, &mut ex2,
        );
        assert_eq!(dealt, Err(Error::BufferLength));
        let aes = FixedKeyAes::new();
        let mut s = vec![0u64; RingTrunc::scratch_words(2)];
        let keys = |k| PartyKeys::of(&[k], &[], &[]);
        // P1 without its explicit words.
        let x = [1, 2];
        assert!(
            g.eval(&aes, Party::P1, &seeds[1], None, 0, keys(&k1), &x, &mut s)
                .is_err()
        );
        let mut e = g
            .eval(&aes, Party::P0, &seeds[0], None, 0, keys(&k0), &x, &mut s)
            .unwrap();
        // Output before the round, and a second round, are errors.
        assert_eq!(e.output(&mut [0, 0]), Err(Error::Unsupported));
        let mut send = vec![0u8; e.send_len(0)];
        e.prepare(0, &mut send).unwrap();
        e.finish(0, &send, &fss).unwrap();
        assert_eq!(e.prepare(1, &mut send), Err(Error::Unsupported));
    }

    /// The key-byte trade against the two-round form, at the plan's shift.
    #[test]
    fn cost_is_one_round_for_a_wider_key() {
        let w = Width::W64;
        let one = RingTrunc::new(w, Width::of(40), 12, Shift::Arithmetic).unwrap();
        let two = trunc(w, Width::of(40), 12, Shift::Arithmetic, Range::Gap).unwrap();
        let (c1, c2) = (one.cost(), two.cost());
        assert_eq!((c1.rounds, c2.rounds), (1, 2));
        assert_eq!(c1.comm_bits, 64);
        assert!(c1.comm_bits < c2.comm_bits);
        // 11 levels of a 16-byte seed correction and an 8-byte value
        // correction, and the leaf block.
        assert_eq!(c1.key_bytes_p0, 11 * 24 + 16);
        assert_eq!(c1.key_bytes_p1, c1.key_bytes_p0 + 16);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]
        #[test]
        fn one_round_truncation_random_at_64_bits(
            xs in proptest::collection::vec(any::<u64>(), 64),
            rs in proptest::collection::vec(any::<u64>(), 64),
            k in 14u32..=63,
            f in 1u32..=13,
            arithmetic in any::<bool>(),
        ) {
            let (n, k) = (Width::W64, Width::of(k));
            let s = if arithmetic { Shift::Arithmetic } else { Shift::Logical };
            let g = RingTrunc::new(n, k, f, s).unwrap();
            // Inputs inside the gap's range.
            let inside: Vec<u64> = xs
                .iter()
                .map(|x| match s {
                    Shift::Arithmetic => n.from_signed(k.to_signed(k.reduce(*x))),
                    _ => k.reduce(*x),
                })
                .collect();
            let (out, _) = run(&g, &inside, Some(&rs), 5);
            let oracle = trunc(n, k, f, s, Range::Gap).unwrap();
            for (x, o) in inside.iter().zip(&out) {
                let mut want = [0u64; 2];
                oracle.reference(*x, &mut want);
                prop_assert_eq!(*o, want[0], "x={} k={:?} f={}", x, k, f);
            }
        }
    }
}
