//! A public table read at a secret index in one round: the index is opened
//! under a fresh mask, and a DPF keyed on that mask, expanded over the
//! whole (small) domain, rotates the table onto it.
//!
//! # Maths
//!
//! The input `i` lies in `[0, 2^L)`, shared in Z_2^n. Open `î = i + s` for
//! a fresh mask s in Z_2^n and let `u = î mod 2^L`, `σ = s mod 2^L`, so
//! that `i = (u − σ) mod 2^L`. The dealer gives a DPF key pair over L bits
//! for `[j = σ]` with payload 1 in Z_2^n. With `D_b(j)` party b's share of
//! it at every j,
//!
//! `Σ_j T[(u − j) mod 2^L] · (D_0(j) + D_1(j)) = T[(u − σ) mod 2^L] = T[i]`,
//!
//! so each party's output share is `Σ_j T[(u − j) mod 2^L] · D_b(j)`: the
//! table is public, u is public, and the secret shares enter only as
//! factors of a sum that runs over every j (no secret index, no branch).
//! The opening reveals nothing, since s is uniform in Z_2^n; σ never
//! leaves the dealer. Both parties expand their mask shares and the key's
//! root from their seeds; the key body is the dealer's.
//!
//! # Cost
//!
//! One round, n bits sent per element; one L-bit ring-output DPF key,
//! `(L − 1)·16 + 16` bytes of correction words (no value corrections: a
//! DPF's payload sits in its leaf), for either party, and no dealt words.
//! Online, each element expands the key over its whole domain (`2^L − 1`
//! AES calls) and sums `2^L` products, so the form is for per-row scalars
//! with a table of a few thousand to a few ten thousand entries: an
//! inverse chain's final lookup ([`super::inverse`]). The table is public
//! and the same for every query, so the caller builds it once
//! ([`RingLut::fill_table`]) and keeps it.

use crate::batch::BatchEval;
use crate::error::{Error, SufError};
use crate::fss::{KeyBatch, Kind, Output, Params, Party, key_buffers_fit};
use crate::gate::inverse::InverseTable;
use crate::gate::one_round::{self, GROUP};
use crate::gate::{Cost, SingleKey};
use crate::mpc;
use crate::prg::Hasher;
use crate::ring::{Width, cast};

/// PRF slots of one element: the mask share, then the key's root.
const SLOTS: usize = 2;
const SLOT_MASK: usize = 0;
const SLOT_ROOT: usize = 1;

/// The widest index: `2^MAX_BITS` words per element evaluated.
pub const MAX_BITS: u32 = 20;

/// Table words expanded at once per evaluation chunk: the chunk holds
/// `max(1, CHUNK_WORDS >> L)` elements' full domains.
const CHUNK_WORDS: usize = 1 << 17;

/// What a table holds: a function of the index, computed exactly (integer
/// arithmetic only), so that every party, the dealer and the reference
/// build the same words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Table {
    /// A reciprocal's or rsqrt's values by octave and mantissa bucket.
    Inverse(InverseTable),
    /// `mul·i + add` (tests).
    #[cfg(test)]
    Affine {
        /// Factor.
        mul: u64,
        /// Constant.
        add: u64,
    },
}

impl Table {
    /// The entry at `i` in the ring `w`.
    pub fn entry(&self, w: Width, i: u64) -> u64 {
        match self {
            Table::Inverse(t) => w.reduce(t.entry(i)),
            #[cfg(test)]
            Table::Affine { mul, add } => w.add(w.mul(*mul, i), *add),
        }
    }
}

/// A one-round lookup of an L-bit index in a public table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RingLut {
    ring: Width,
    bits: Width,
    table: Table,
}

impl RingLut {
    /// A lookup of indices below `2^bits` (`bits ≤ MAX_BITS`, below the
    /// ring's width) into `table`, with outputs in the ring `ring`.
    pub const fn new(ring: Width, bits: Width, table: Table) -> Result<RingLut, SufError> {
        if bits.bits() > MAX_BITS || bits.bits() >= ring.bits() {
            return Err(SufError::Capacity);
        }
        Ok(RingLut { ring, bits, table })
    }

    /// The ring.
    pub const fn ring(&self) -> Width {
        self.ring
    }

    /// The key's parameters: an L-bit DPF with output in the ring.
    pub const fn key_params(&self) -> Params {
        Params::new(Kind::Dpf, self.bits, Output::Ring(self.ring))
    }

    /// Explicit words P1 holds per element: none.
    pub const fn explicit_words(&self) -> usize {
        0
    }

    /// Fresh random words the dealer supplies per element: none (a DPF
    /// draws none).
    pub const fn random_words(&self) -> usize {
        0
    }

    /// Table entries.
    const fn entries(&self) -> usize {
        1 << self.bits.bits()
    }

    /// Elements whose full domains are expanded at once.
    const fn chunk(&self, n: usize) -> usize {
        let c = CHUNK_WORDS >> self.bits.bits();
        let c = if c == 0 { 1 } else { c };
        if n < c { n } else { c }
    }

    /// Scratch words an evaluator needs for `n` elements: the mask shares,
    /// the opened values and the outputs, then one chunk's full domains.
    pub const fn scratch_words(&self, n: usize) -> usize {
        3 * n + self.chunk(n) * self.entries()
    }

    /// Words of the table ([`RingLut::fill_table`]).
    pub const fn table_words(&self) -> usize {
        self.entries()
    }

    /// Writes the table, [`RingLut::table_words`] words.
    pub fn fill_table(&self, table: &mut [u64]) -> Result<(), Error> {
        if table.len() != self.entries() {
            return Err(Error::BufferLength);
        }
        for (i, t) in (0u64..).zip(table.iter_mut()) {
            *t = self.table.entry(self.ring, i);
        }
        Ok(())
    }

    /// Per-element costs (key bytes without the root, which is re-derived
    /// from the seeds).
    pub const fn cost(&self) -> Cost {
        let p = self.key_params();
        let cw = p.key_len() - 16;
        Cost {
            rounds: 1,
            comm_bits: cast::usize_from_u32(self.ring.bits()),
            key_bytes_p0: cw,
            key_bytes_p1: cw,
            aes_online: SLOTS - 1 + cast::usize_from_small_u64(p.aes_per_full_domain()),
            dcf_points: 0,
        }
    }

    /// The cleartext value: the entry at the index's low L bits.
    pub fn reference(&self, x: u64) -> u64 {
        self.table.entry(self.ring, self.bits.reduce(x))
    }

    /// Deals `count` elements from element index `first`: both parties'
    /// full keys (roots included, `count · key_len` bytes each). `masks`
    /// pins each party's mask shares (tests). Returns the AES calls made.
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
    ) -> Result<u64, Error> {
        let params = self.key_params();
        let len = params.key_len();
        if !key_buffers_fit(key0, key1, count, len) {
            return Err(Error::BufferLength);
        }
        let betas = [1u64; GROUP];
        let mut alphas = [0u64; GROUP];
        let at = (first, count);
        one_round::deal_groups(fss, self.ring, (seeds, SLOTS), masks, at, |g| {
            for (a, &s) in alphas.iter_mut().zip(g.masks) {
                *a = self.bits.reduce(s);
            }
            g.generate(fss, params, SLOT_ROOT, (&alphas, &betas), &[], key0, key1)
        })
    }

    /// Fills the mask shares of an evaluation area
    /// ([`RingLut::scratch_words`]) for `n` elements from element index
    /// `first` (expanded from `seed`, or `mask` in tests); `explicit` must
    /// be empty. Returns the AES calls made.
    #[allow(clippy::too_many_arguments)]
    pub fn load(
        &self,
        h: &dyn Hasher,
        _party: Party,
        seed: &[u8; 16],
        mask: Option<&[u64]>,
        first: u64,
        explicit: &[u64],
        area: &mut [u64],
    ) -> Result<u64, Error> {
        let n = self.elements(area.len())?;
        if !explicit.is_empty() {
            return Err(Error::BufferLength);
        }
        one_round::mask_shares(h, self.ring, (seed, SLOT_MASK), mask, first, &mut area[..n])
    }

    /// The element count of an area of `len` words: `len = 3n + c·E` with
    /// `c = min(n, chunk)` and `E` entries, so `n = len / (3 + E)` below a
    /// chunk and `(len − chunk·E) / 3` from one on.
    fn elements(&self, len: usize) -> Result<usize, Error> {
        let (e, full) = (self.entries(), self.chunk(usize::MAX));
        let small = len / (3 + e);
        let n = if small < full {
            small
        } else {
            len.saturating_sub(full * e) / 3
        };
        if self.scratch_words(n) != len {
            return Err(Error::BufferLength);
        }
        Ok(n)
    }

    /// The round's message: this party's share of `î = i + s`.
    pub fn open(&self, area: &mut [u64], x: &[u64], send: &mut [u8]) -> Result<(), Error> {
        let n = x.len();
        if area.len() != self.scratch_words(n) {
            return Err(Error::BufferLength);
        }
        let (r, rest) = area.split_at_mut(n);
        one_round::open(self.ring, r, x, &mut rest[..n], send)
    }

    /// The peer's message: opens `î`, expands the keys over their domain,
    /// rotates `table` ([`RingLut::fill_table`]'s) onto them and leaves
    /// this party's output shares in the area.
    pub fn close(
        &self,
        area: &mut [u64],
        recv: &[u8],
        (keys, table): (&KeyBatch<'_>, &[u64]),
        backend: &dyn BatchEval,
    ) -> Result<(), Error> {
        let n = keys.count();
        if area.len() != self.scratch_words(n) || table.len() != self.entries() {
            return Err(Error::BufferLength);
        }
        let (w, size) = (self.ring, self.entries());
        let (head, domains) = area.split_at_mut(3 * n);
        // The opened values overwrite the (spent) mask shares.
        let (opened, rest) = head.split_at_mut(n);
        let (mine, outs) = rest.split_at_mut(n);
        mpc::open_finish(w, mine, recv, opened)?;
        let domain = &mut domains[..self.chunk(n) * size];
        backend.lookup(keys, (opened, table), domain, outs)?;
        for o in outs.iter_mut() {
            *o = w.reduce(*o);
        }
        Ok(())
    }

    /// This party's output shares from a closed area.
    pub fn output(&self, area: &[u64], out: &mut [u64]) -> Result<(), Error> {
        let n = out.len();
        if area.len() != self.scratch_words(n) {
            return Err(Error::BufferLength);
        }
        out.copy_from_slice(&area[2 * n..3 * n]);
        Ok(())
    }
}

impl SingleKey for RingLut {
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
    use crate::prg::{FixedKeyAes, Prg};
    use proptest::prelude::*;
    use std::vec;
    use std::vec::Vec;

    /// Deals and runs both parties on shares of the indices `xs`, the
    /// masks pinned to `masks` where given (roots re-derived from the
    /// seeds for odd salts, as a key file does); returns the
    /// reconstructed outputs.
    fn run(g: &RingLut, xs: &[u64], masks: Option<&[u64]>, salt: u8) -> Vec<u64> {
        let (n, w) = (xs.len(), g.ring());
        let fss = Serial::new();
        let aes = FixedKeyAes::new();
        let setup = Setup::new(w, xs, masks, 0, salt);
        let (seeds, pinned) = (setup.seeds, setup.pinned());
        let len = g.key_params().key_len();
        let mut k = [vec![0u8; n * len], vec![0u8; n * len]];
        let [k0, k1] = &mut k;
        g.deal(&fss, seeds, pinned, 3, n, k0, k1).unwrap();
        let parties = [Party::P0, Party::P1];
        let mut roots = [vec![0u8; 16 * n], vec![0u8; 16 * n]];
        let body = [bodies(&k[0], len), bodies(&k[1], len)];
        // Scratch starts dirty: nothing may rely on zeroes.
        let mut area = [
            vec![u64::MAX; g.scratch_words(n)],
            vec![7; g.scratch_words(n)],
        ];
        let mut send = [
            vec![0u8; mpc::words_len(w, n)],
            vec![0u8; mpc::words_len(w, n)],
        ];
        for p in 0..2 {
            let mask = pinned.map(|m| m[p]);
            g.load(&aes, parties[p], &seeds[p], mask, 3, &[], &mut area[p])
                .unwrap();
            g.open(&mut area[p], &setup.x[p], &mut send[p]).unwrap();
            g.derive_roots(&aes, parties[p], &seeds[p], 3, &mut roots[p])
                .unwrap();
        }
        let mut out = [vec![0u64; n], vec![0u64; n]];
        let mut table = vec![0u64; g.table_words()];
        g.fill_table(&mut table).unwrap();
        for p in 0..2 {
            let keys = if salt % 2 == 1 {
                KeyBatch::split(g.key_params(), parties[p], &roots[p], &body[p]).unwrap()
            } else {
                KeyBatch::new(g.key_params(), parties[p], &k[p]).unwrap()
            };
            g.close(&mut area[p], &send[1 - p], (&keys, &table), &fss)
                .unwrap();
            g.output(&area[p], &mut out[p]).unwrap();
        }
        out[0]
            .iter()
            .zip(&out[1])
            .map(|(a, b)| w.add(*a, *b))
            .collect()
    }

    /// Masks with their low L bits (the key's point) and their high bits
    /// at the edges: 0, 1, the middle and the top.
    fn edge_masks(w: Width, bits: u32) -> Vec<u64> {
        let lo = Width::of(bits);
        let mut ms = Vec::new();
        for high in [0, 1, w.half() >> bits, w.mask() >> bits] {
            for low in [0, 1, lo.half(), lo.mask()] {
                ms.push(w.reduce((high << bits) | low));
            }
        }
        ms
    }

    /// Every index of small domains, under every edge mask, in a narrow and
    /// a full ring.
    #[test]
    fn exhaustive_small_domains_with_edge_masks() {
        let table = Table::Affine {
            mul: 0x9e37_79b9_7f4a_7c15,
            add: 3,
        };
        for (ring, bits) in [(8, 1), (8, 4), (12, 6), (64, 5)] {
            let (w, b) = (Width::of(ring), Width::of(bits));
            let g = RingLut::new(w, b, table).unwrap();
            for (t, mask) in edge_masks(w, bits).into_iter().enumerate() {
                let xs: Vec<u64> = (0..1u64 << bits).collect();
                let masks = vec![mask; xs.len()];
                let salt = u8::try_from(t).unwrap();
                let got = run(&g, &xs, Some(&masks), salt);
                for (x, y) in xs.iter().zip(&got) {
                    assert_eq!(
                        *y,
                        g.reference(*x),
                        "ring {ring}, L {bits}, mask {mask:#x}, i {x}"
                    );
                    assert_eq!(*y, table.entry(w, *x));
                }
            }
        }
    }

    /// An area's length gives back its element count on both sides of a
    /// chunk, and any other length is refused.
    #[test]
    fn element_counts_from_area_lengths() {
        for bits in [1, 6, 14, 16] {
            let table = Table::Affine { mul: 1, add: 0 };
            let g = RingLut::new(Width::W64, Width::of(bits), table).unwrap();
            let full = g.chunk(usize::MAX);
            for n in (0..3 * full + 2).chain([1000, 4097]) {
                let len = g.scratch_words(n);
                assert_eq!(g.elements(len), Ok(n), "L = {bits}, n = {n}");
                if n > 0 {
                    assert_eq!(
                        g.elements(len + 1),
                        Err(Error::BufferLength),
                        "L = {bits}, n = {n} + 1 word"
                    );
                    assert_eq!(
                        g.elements(len - 1),
                        Err(Error::BufferLength),
                        "L = {bits}, n = {n} − 1 word"
                    );
                }
            }
        }
    }

    /// Seeded masks, many elements across evaluation chunks.
    #[test]
    fn chunks_and_seeded_masks() {
        let table = Table::Affine {
            mul: 5,
            add: 1 << 40,
        };
        let g = RingLut::new(Width::W64, Width::of(14), table).unwrap();
        let mut prg = Prg::new(&[2; 16]);
        let xs: Vec<u64> = (0..20).map(|_| prg.next_u64() >> 50).collect();
        assert!(g.chunk(xs.len()) < xs.len());
        let got = run(&g, &xs, None, 4);
        for (x, y) in xs.iter().zip(&got) {
            assert_eq!(*y, g.reference(*x));
        }
    }

    #[test]
    fn shapes_are_checked() {
        let t = Table::Affine { mul: 1, add: 0 };
        assert!(RingLut::new(Width::of(8), Width::of(8), t).is_err());
        assert!(RingLut::new(Width::W64, Width::of(MAX_BITS + 1), t).is_err());
        let g = RingLut::new(Width::W64, Width::of(4), t).unwrap();
        let mut area = vec![0u64; g.scratch_words(3) + 1];
        assert!(g.open(&mut area, &[0; 3], &mut [0u8; 24]).is_err());
        let aes = FixedKeyAes::new();
        let r = g.load(
            &aes,
            Party::P1,
            &[0; 16],
            None,
            0,
            &[1],
            &mut area[..g.scratch_words(3)],
        );
        assert!(r.is_err(), "explicit words are refused");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// n = 64: random tables, widths, indices and masks.
        #[test]
        fn random_lookups_at_n64(
            bits in 1u32..12,
            mul: u64,
            add: u64,
            seed: u64,
            mask: u64,
        ) {
            let g = RingLut::new(Width::W64, Width::of(bits), Table::Affine { mul, add }).unwrap();
            let mut prg = Prg::new(&seed.to_le_bytes().repeat(2).try_into().unwrap());
            let xs: Vec<u64> = (0..5).map(|_| prg.next_u64() >> (64 - bits)).collect();
            let masks = vec![mask; xs.len()];
            let got = run(&g, &xs, Some(&masks), 2);
            for (x, y) in xs.iter().zip(&got) {
                prop_assert_eq!(*y, g.reference(*x));
            }
        }
    }
}
