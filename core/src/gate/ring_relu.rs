//! ReLU in one round: [`super::relu::relu_value`]'s function with its sign
//! taken from ring-output DCF keys, so that nothing is left to convert
//! after the opening.
//!
//! # Maths
//!
//! Open `d̂ = d + r` for `|d| < 2^(k−1)` (k < n). With `d' = d + 2^(k−1)`
//! in `[0, 2^k)`, `u = (d̂ + 2^(k−1)) mod 2^k` and `ρ = r mod 2^k`,
//! `d' = (u − ρ) mod 2^k`, and the sign `s = [d < 0] = [d' < T]` for
//! `T = 2^(k−1)` is, as integers,
//!
//! `s = [(u − T) mod 2^k < ρ] − [u < ρ] + [u < T]`
//!
//! (both cases of whether `[ρ, ρ + T)` wraps give it; the bit-output gates
//! use the same three terms XORed). The first two are one DCF key
//! `[x < ρ]` at two public points, the third is public. One pair-output
//! key ([`Output::Pair`]) with payloads `(1, r)` gives `[s]` and `[r·s]`
//! (its two words), so
//!
//! `ReLU(d) = d − d·s = (d̂ − r) − d̂·s + r·s`
//!
//! is local: P0 adds `d̂`, each party subtracts its mask share and
//! `d̂·[s]` and adds `[r·s]`. Mask shares and key roots come from the
//! parties' seeds; the keys' value corrections from the dealer's fresh
//! words (never a party's seed, see [`crate::dcf::generate`]). P1 holds
//! no explicit words.
//!
//! # Cost
//!
//! One round, n bits sent per element; one k-bit pair-output key,
//! `k·(16 + 16) + 16` bytes of correction words at n > 32 (1,040 at k = 32,
//! where two ring-output keys held `2·((k − 1)·(16 + 8) + 16)` = 1,520),
//! against one bit-output key plus two words in two rounds for
//! [`super::relu::relu_value`] (413 / 429 bytes at k = 32). Where rows have
//! few comparisons left (a max tree's last levels) the round is worth it.
//! The pair's two words come from one walk: `2·(2k + 1)` AES calls per
//! element (two points), half of what two keys took.

use crate::batch::BatchEval;
use crate::error::{Error, SufError};
use crate::fss::{KeyBatch, Kind, Output, Params, Party, key_buffers_fit};
use crate::gate::one_round::{self, GROUP};
use crate::gate::{Cost, PartyKeys};
use crate::mpc;
use crate::prg::Hasher;
use crate::ring::{Width, cast};

/// PRF slots of one element: the mask share, then the key's root.
const SLOTS: usize = 2;
const SLOT_MASK: usize = 0;
const SLOT_ROOTS: usize = 1;

/// Keys per element: one pair, the sign (payload 1) and the sign times the
/// mask.
const KEYS: usize = 1;

/// Words per evaluation of the pair key.
const WORDS: usize = 2;

/// A one-round ReLU of inputs below `2^(k−1)` in magnitude.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RingRelu {
    ring: Width,
    k: Width,
}

impl RingRelu {
    /// ReLU at effective width `k` in the ring of width `ring`: needs
    /// `1 < k < n` (the gap).
    pub const fn new(ring: Width, k: Width) -> Result<RingRelu, SufError> {
        if k.bits() < 2 || k.bits() >= ring.bits() {
            return Err(SufError::FixedPoint);
        }
        Ok(RingRelu { ring, k })
    }

    /// The ring.
    pub const fn ring(&self) -> Width {
        self.ring
    }

    /// The key's parameters: a k-bit DCF with a pair of ring words out.
    pub const fn key_params(&self) -> Params {
        Params::new(Kind::Dcf, self.k, Output::Pair(self.ring))
    }

    /// Keys per element.
    pub const fn key_count(&self) -> usize {
        KEYS
    }

    /// Fresh random words the dealer supplies per element (both words'
    /// value corrections).
    pub const fn random_words(&self) -> usize {
        KEYS * self.key_params().gen_random_words()
    }

    /// Scratch words an evaluator needs for `n` elements: the mask shares,
    /// `[s]`, `d̂`, two points each and the pair's four words each.
    pub const fn scratch_words(n: usize) -> usize {
        9 * n
    }

    /// Per-element costs (key bytes without the roots, which are re-derived
    /// from the seeds).
    pub const fn cost(&self) -> Cost {
        let p = self.key_params();
        let cw = KEYS * (p.key_len() - 16);
        Cost {
            rounds: 1,
            comm_bits: cast::usize_from_u32(self.ring.bits()),
            key_bytes_p0: cw,
            key_bytes_p1: cw,
            aes_online: 1 + 2 * KEYS * cast::usize_from_small_u64(p.aes_per_eval()),
            dcf_points: 2 * KEYS * WORDS,
        }
    }

    /// The cleartext value: `max(d, 0)` of the signed k-bit view of `d`, in
    /// the ring; the protocol equals it for |d| < 2^(k−1).
    pub fn reference(&self, d: u64) -> u64 {
        let v = self.k.to_signed(self.k.reduce(d));
        self.ring.from_signed(if v > 0 { v } else { 0 })
    }

    /// Deals `count` elements from element index `first`: both parties'
    /// whole keys in `keys0[0]` / `keys1[0]` (`count · key_len` bytes
    /// each). `random` holds [`RingRelu::random_words`] fresh words per
    /// element; `masks` pins each party's mask shares (tests). Returns the
    /// AES calls made.
    #[allow(clippy::too_many_arguments)]
    pub fn deal(
        &self,
        fss: &dyn BatchEval,
        seeds: [[u8; 16]; 2],
        masks: Option<[&[u64]; 2]>,
        random: &[u64],
        first: u64,
        count: usize,
        keys0: [&mut [u8]; KEYS],
        keys1: [&mut [u8]; KEYS],
    ) -> Result<u64, Error> {
        let params = self.key_params();
        let (len, rw) = (params.key_len(), params.gen_random_words());
        let sizes_ok =
            (keys0.iter().zip(&keys1)).all(|(k0, k1)| key_buffers_fit(k0, k1, count, len));
        if !sizes_ok || random.len() != count * KEYS * rw {
            return Err(Error::BufferLength);
        }
        let [k0] = keys0;
        let [k1] = keys1;
        let mut alphas = [0u64; GROUP];
        // The pair's payloads (1, r), side by side.
        let mut betas = [1u64; WORDS * GROUP];
        one_round::deal_groups(fss, self.ring, (seeds, SLOTS), masks, (first, count), |g| {
            for (e, &r) in g.masks.iter().enumerate() {
                alphas[e] = self.k.reduce(r);
                betas[WORDS * e + 1] = r;
            }
            let words = g.at * rw..(g.at + g.len()) * rw;
            g.generate(
                fss,
                params,
                SLOT_ROOTS,
                (&alphas, &betas),
                &random[words],
                k0,
                k1,
            )
        })
    }

    /// Writes each element's key root, re-derived from `party`'s `seed`,
    /// into `roots[0]` (16 bytes per element): for keys whose bodies stay
    /// where a key file was read.
    pub fn derive_roots(
        &self,
        h: &dyn Hasher,
        party: Party,
        seed: &[u8; 16],
        first: u64,
        roots: [&mut [u8]; KEYS],
    ) -> Result<u64, Error> {
        let [a] = roots;
        one_round::derive_roots(h, party, (seed, SLOT_ROOTS), first, &mut [a])
    }

    /// One party's key batch: whole keys where `keys.roots[0]` is empty,
    /// else roots and bodies.
    pub fn key_batches<'k>(
        &self,
        party: Party,
        keys: &PartyKeys<'k>,
    ) -> Result<[KeyBatch<'k>; KEYS], Error> {
        Ok([one_round::key_batch(self.key_params(), party, keys, 0)?])
    }

    /// Fills this party's mask shares (expanded from `seed`, or `mask` in
    /// tests) into the first part of an evaluation area
    /// ([`RingRelu::scratch_words`]). Returns the AES calls made.
    pub fn load(
        &self,
        h: &dyn Hasher,
        seed: &[u8; 16],
        mask: Option<&[u64]>,
        first: u64,
        area: &mut [u64],
    ) -> Result<u64, Error> {
        let n = area.len() / 9;
        if area.len() != Self::scratch_words(n) {
            return Err(Error::BufferLength);
        }
        one_round::mask_shares(h, self.ring, (seed, SLOT_MASK), mask, first, &mut area[..n])
    }

    /// The round's message: this party's share of `d̂ = d + r`.
    pub fn open(&self, area: &mut [u64], d: &[u64], send: &mut [u8]) -> Result<(), Error> {
        let n = d.len();
        if area.len() != Self::scratch_words(n) {
            return Err(Error::BufferLength);
        }
        let (r, rest) = area.split_at_mut(n);
        one_round::open(self.ring, r, d, &mut rest[..n], send)
    }

    /// The peer's message: opens `d̂` and evaluates the pair key at
    /// `(u − T) mod 2^k` and `u`, keeping the difference of the two for
    /// each word (the secret terms of `[s]` and `[r·s]`).
    pub fn close(
        &self,
        area: &mut [u64],
        recv: &[u8],
        keys: &[KeyBatch<'_>; KEYS],
        backend: &dyn BatchEval,
    ) -> Result<(), Error> {
        let n = area.len() / 9;
        if area.len() != Self::scratch_words(n) || keys.iter().any(|k| k.count() != n) {
            return Err(Error::BufferLength);
        }
        let w = self.ring;
        // r | mine, then [s] | d̂ | points, then [r·s] | evaluations (four
        // words per element: both words at the first point, then at the
        // second), then the public term.
        let (_, rest) = area.split_at_mut(n);
        let (s, rest) = rest.split_at_mut(n);
        let (dhat, rest) = rest.split_at_mut(n);
        let (points, out) = rest.split_at_mut(2 * n);
        mpc::open_finish(w, s, recv, dhat)?;
        let half = self.k.half();
        for (i, d) in dhat.iter().enumerate() {
            let u = self.k.reduce(w.add(*d, half));
            points[2 * i] = self.k.reduce(u.wrapping_sub(half));
            points[2 * i + 1] = u;
        }
        backend.eval(&keys[0], points, out)?;
        for (i, si) in s.iter_mut().enumerate() {
            *si = w.sub(out[4 * i], out[4 * i + 2]);
        }
        // In place, each index read before it is written: [r·s]'s secret
        // terms over the points, the public term [u < T] (from the points,
        // which went to the backend as public) over the evaluations.
        for i in 0..n {
            let c = u64::from(points[2 * i + 1] < half);
            points[i] = w.sub(out[4 * i + 1], out[4 * i + 3]);
            out[i] = c;
        }
        Ok(())
    }

    /// This party's output shares from a closed area.
    pub fn output(&self, party: Party, area: &[u64], out: &mut [u64]) -> Result<(), Error> {
        let n = out.len();
        if area.len() != Self::scratch_words(n) {
            return Err(Error::BufferLength);
        }
        let w = self.ring;
        let (r, s, dhat, rs) = (
            &area[..n],
            &area[n..2 * n],
            &area[2 * n..3 * n],
            &area[3 * n..4 * n],
        );
        let public = &area[5 * n..6 * n];
        let p0 = u64::from(party == Party::P0);
        for i in 0..n {
            // The public term c = [u < T] of s, added to [s] by P0 and to
            // [r·s] as c·[r] by both.
            let c = public[i];
            let s_i = w.add(s[i], w.mul(p0, c));
            let rs_i = w.add(rs[i], w.mul(c, r[i]));
            let d_i = w.sub(w.mul(p0, dhat[i]), r[i]);
            out[i] = w.add(w.sub(d_i, w.mul(dhat[i], s_i)), rs_i);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Serial;
    use crate::gate::one_round::testing::{Setup, bodies};
    use crate::gate::relu::relu_value;
    use crate::prg::{FixedKeyAes, Prg};
    use proptest::prelude::*;
    use std::vec;
    use std::vec::Vec;

    /// Deals and runs both parties on shares of `ds` (masks pinned to
    /// `masks` where given; odd salts store bodies and re-derive roots);
    /// returns the reconstructed outputs.
    fn run(g: &RingRelu, ds: &[u64], masks: Option<&[u64]>, salt: u8) -> Vec<u64> {
        run_tampered(g, ds, masks, salt, |_| {})
    }

    /// [`run`] with P0's whole keys handed to `tamper` after dealing.
    fn run_tampered(
        g: &RingRelu,
        ds: &[u64],
        masks: Option<&[u64]>,
        salt: u8,
        tamper: impl Fn(&mut [u8]),
    ) -> Vec<u64> {
        let (n, w) = (ds.len(), g.ring());
        let (fss, aes) = (Serial::new(), FixedKeyAes::new());
        let setup = Setup::new(w, ds, masks, n * g.random_words(), salt);
        let (seeds, pinned, random) = (setup.seeds, setup.pinned(), &setup.random);
        let len = g.key_params().key_len();
        let mut k: Vec<Vec<u8>> = (0..2).map(|_| vec![0u8; n * len]).collect();
        {
            let [a0, a1] = &mut k[..] else { unreachable!() };
            g.deal(&fss, seeds, pinned, random, 7, n, [a0], [a1])
                .unwrap();
            tamper(a0);
        }
        let split = salt % 2 == 1;
        let mut out = vec![[0u64; 2]; n];
        let mut msgs: Vec<Vec<u8>> = Vec::new();
        let mut areas: Vec<Vec<u64>> = Vec::new();
        for (p, party) in [Party::P0, Party::P1].into_iter().enumerate() {
            let mask = pinned.map(|m| m[p]);
            let mut area = vec![u64::MAX - p as u64; RingRelu::scratch_words(n)];
            g.load(&aes, &seeds[p], mask, 7, &mut area).unwrap();
            let mut send = vec![0u8; mpc::words_len(w, n)];
            g.open(&mut area, &setup.x[p], &mut send).unwrap();
            msgs.push(send);
            areas.push(area);
            let _ = party;
        }
        for (p, party) in [Party::P0, Party::P1].into_iter().enumerate() {
            let whole = &k[p][..];
            let bodies = bodies(whole, len);
            let mut roots = vec![0u8; 16 * n];
            g.derive_roots(&aes, party, &seeds[p], 7, [&mut roots])
                .unwrap();
            let keys = if split {
                PartyKeys::of(&[&bodies], &[&roots], &[])
            } else {
                PartyKeys::of(&[whole], &[], &[])
            };
            let batches = g.key_batches(party, &keys).unwrap();
            g.close(&mut areas[p], &msgs[1 - p], &batches, &fss)
                .unwrap();
            let mut o = vec![0u64; n];
            g.output(party, &areas[p], &mut o).unwrap();
            for (i, v) in o.into_iter().enumerate() {
                out[i][p] = v;
            }
        }
        out.iter().map(|[a, b]| w.add(*a, *b)).collect()
    }

    fn in_range(g: &RingRelu, d: u64) -> bool {
        let h = i64::try_from(g.k.half()).unwrap();
        (-h..h).contains(&g.ring.to_signed(d))
    }

    /// Masks with r mod 2^k and r itself at their edges, and random ones.
    fn edge_masks(g: &RingRelu) -> Vec<u64> {
        let w = g.ring;
        let mut ms = Vec::new();
        for high in [0, 1, (w.mask() >> g.k.bits()) / 2, w.mask() >> g.k.bits()] {
            for low in [0, 1, g.k.half() - 1, g.k.half(), g.k.mask()] {
                ms.push(w.reduce((high << g.k.bits()) | low));
            }
        }
        let mut prg = Prg::new(&[9; 16]);
        ms.extend((0..8).map(|_| w.reduce(prg.next_u64())));
        ms
    }

    #[test]
    fn one_round_relu_equals_the_two_round_gate_on_every_input_in_range() {
        for (n, k) in [(8, 7), (8, 3), (10, 6), (7, 2)] {
            let (n, k) = (Width::of(n), Width::of(k));
            let g = RingRelu::new(n, k).unwrap();
            let oracle = relu_value(n, k).unwrap();
            let ds: Vec<u64> = (0..=n.mask()).filter(|d| in_range(&g, *d)).collect();
            for (i, r) in edge_masks(&g).iter().enumerate() {
                let out = run(&g, &ds, Some(&vec![*r; ds.len()]), i as u8);
                for (d, o) in ds.iter().zip(&out) {
                    let mut want = [0u64; 2];
                    oracle.reference(*d, &mut want);
                    assert_eq!(g.reference(*d), want[0], "spec d={d}");
                    assert_eq!(*o, want[0], "n={n:?} k={k:?} d={d} r={r}");
                }
            }
        }
    }

    #[test]
    fn shapes_outside_the_gap_are_refused() {
        assert!(RingRelu::new(Width::W64, Width::of(64)).is_err());
        assert!(RingRelu::new(Width::W64, Width::of(1)).is_err());
        let g = RingRelu::new(Width::W64, Width::of(32)).unwrap();
        let c = g.cost();
        assert_eq!((c.rounds, c.comm_bits), (1, 64));
        // One pair key: 32 levels of a seed and two value corrections.
        assert_eq!(c.key_bytes_p0, 32 * (16 + 16) + 16);
        assert_eq!(c.key_bytes_p0, g.key_params().body_len());
    }

    /// A planted fault: one bit of the pair's second value correction
    /// (the `[r·s]` word) flipped at some level of every P0 key. Every
    /// input whose walk takes that level's sibling gets a wrong ReLU; the
    /// first word's correction alone flipped does the same to `[s]`.
    #[test]
    fn a_flipped_value_correction_of_either_word_is_caught() {
        let (n, k) = (Width::of(10), Width::of(6));
        let g = RingRelu::new(n, k).unwrap();
        let p = g.key_params();
        let ds: Vec<u64> = (0..=n.mask()).filter(|d| in_range(&g, *d)).collect();
        let clean = run(&g, &ds, None, 2);
        let last = p.levels() - 1;
        for (word, level) in [(0usize, 0u32), (1, 0), (1, last), (0, last)] {
            let at = p.cw_offset(level) + 16 + word * (p.value_bytes() / 2);
            let out = run_tampered(&g, &ds, None, 2, |keys| {
                for key in keys.chunks_exact_mut(p.key_len()) {
                    key[at] ^= 1;
                }
            });
            let wrong = out.iter().zip(&clean).filter(|(a, b)| a != b).count();
            assert!(wrong > 0, "word {word} level {level}: no output changed");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]
        #[test]
        fn one_round_relu_random_at_64_bits(
            ds in proptest::collection::vec(any::<u64>(), 64),
            rs in proptest::collection::vec(any::<u64>(), 64),
            k in 2u32..=63,
        ) {
            let (n, k) = (Width::W64, Width::of(k));
            let g = RingRelu::new(n, k).unwrap();
            let inside: Vec<u64> = ds.iter().map(|d| n.from_signed(k.to_signed(k.reduce(*d)))).collect();
            let out = run(&g, &inside, Some(&rs), 5);
            let oracle = relu_value(n, k).unwrap();
            for (d, o) in inside.iter().zip(&out) {
                let mut want = [0u64; 2];
                oracle.reference(*d, &mut want);
                prop_assert_eq!(*o, want[0], "d={} k={:?}", d, k);
            }
        }
    }
}
