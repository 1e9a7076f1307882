//! The maximum of each row of a matrix, by a comparison tree: a vector
//! block, not a SUF (seeds/001 Appendix G).
//!
//! Each level pairs neighbours and keeps `max(a, b) = b + ReLU(a − b)`, so a
//! row of L values takes ⌈log2 L⌉ levels of the [`super::relu`] gate, all
//! rows of a level in one batch; an odd element passes to the next level
//! unchanged. Exact for differences inside the ReLU's effective width:
//! |a − b| < 2^(k−1).
//!
//! Cost per row: L − 1 ReLU instances; 2 rounds per level, or 1 for the
//! last levels where [`MaxTree::one_round_tail`] asks for
//! [`super::ring_relu`]'s one-round ReLU (few comparisons are left there,
//! so its larger keys cost little).
//!
//! A causal tree ([`MaxTree::causal`]) takes rows of their own lengths:
//! in every block of `period` rows, row `i` holds `i + 1` values (a causal
//! attention block's query `i` sees keys `0..=i`), the rest of its stored
//! row unread. Each row pairs its own values level by level (an odd one
//! passes up), so a row of `n` values costs `n − 1` ReLUs, and a block of
//! `L` rows `L(L−1)/2` in all; every row's tree ends within the levels of
//! the longest, so the rounds are a tree over `L` values'.

use crate::batch::BatchEval;
use crate::compile::MAX_KEYS;
use crate::error::{Error, SufError};
use crate::fss::{Params, Party};
use crate::gate::chain::step_seed;
use crate::gate::relu::relu_value;
use crate::gate::ring_relu::RingRelu;
use crate::gate::{DealScratch, Eval, Gate, PartyKeys, Protocol};
use crate::prg::Hasher;
use crate::ring::Width;

/// Row maxima of `rows × len` values.
#[derive(Debug, PartialEq, Eq)]
pub struct MaxTree {
    /// The ReLU gate every level uses.
    pub relu: Gate,
    /// Values per row.
    pub len: usize,
    /// The one-round ReLU of the last `tail` levels.
    pub ring: RingRelu,
    /// Levels at the end that use `ring`.
    pub tail: usize,
    /// Rows per causal block (row `r` holds `min(len, r % period + 1)`
    /// values), or 0: every row holds `len`.
    pub period: usize,
}

impl MaxTree {
    /// Row maxima of rows of `len` values, differences within width `k`.
    pub const fn new(ring: Width, k: Width, len: usize) -> Result<MaxTree, SufError> {
        if len == 0 {
            return Err(SufError::Capacity);
        }
        let one = match RingRelu::new(ring, k) {
            Ok(r) => r,
            Err(e) => return Err(e),
        };
        match relu_value(ring, k) {
            Ok(relu) => Ok(MaxTree {
                relu,
                len,
                ring: one,
                tail: 0,
                period: 0,
            }),
            Err(e) => Err(e),
        }
    }

    /// The same tree with its last `levels` levels (at most all) in one
    /// round each.
    pub const fn one_round_tail(mut self, levels: usize) -> MaxTree {
        self.tail = if levels < self.levels() {
            levels
        } else {
            self.levels()
        };
        self
    }

    /// The same tree over causal blocks of `period` rows (at least 1): in
    /// each, row `i` takes its first `i + 1` values (at most `len`).
    pub const fn causal(mut self, period: usize) -> MaxTree {
        self.period = if period == 0 { 1 } else { period };
        self
    }

    /// Values row `r` holds.
    pub const fn row_len(&self, r: usize) -> usize {
        if self.period == 0 {
            return self.len;
        }
        let n = r % self.period + 1;
        if n < self.len { n } else { self.len }
    }

    /// Values a row of `n` holds entering `level`.
    const fn shrink(n: usize, level: usize) -> usize {
        let mut cur = n;
        let mut l = 0;
        while l < level {
            cur = cur / 2 + cur % 2;
            l += 1;
        }
        cur
    }

    /// Values row `r` holds entering `level`.
    pub const fn row_width(&self, r: usize, level: usize) -> usize {
        Self::shrink(self.row_len(r), level)
    }

    /// ReLU instances at `level` over `rows` rows: `rows · pairs(level)`,
    /// or each causal row's own pairs.
    pub const fn count(&self, rows: usize, level: usize) -> usize {
        if self.period == 0 {
            return rows * self.pairs(level);
        }
        let mut n = 0;
        let mut r = 0;
        while r < rows {
            n += self.row_width(r, level) / 2;
            r += 1;
        }
        n
    }

    /// Whether `level` runs the one-round ReLU.
    pub const fn one_round(&self, level: usize) -> bool {
        level + self.tail >= self.levels()
    }

    /// Rounds of `level`.
    pub const fn level_rounds(&self, level: usize) -> usize {
        if self.one_round(level) { 1 } else { 2 }
    }

    /// The level and the round within it of tree round `i`.
    pub const fn locate(&self, i: usize) -> (usize, usize) {
        let mut i = i;
        let mut l = 0;
        while l < self.levels() {
            let r = self.level_rounds(l);
            if i < r {
                return (l, i);
            }
            i -= r;
            l += 1;
        }
        (l, 0)
    }

    /// Fresh dealer words `level` needs per ReLU.
    pub const fn random_words(&self, level: usize) -> usize {
        if self.one_round(level) {
            self.ring.random_words()
        } else {
            0
        }
    }

    /// Explicit words P1 holds per ReLU at `level`.
    pub const fn explicit_words(&self, level: usize) -> usize {
        if self.one_round(level) {
            0
        } else {
            self.relu.explicit_words()
        }
    }

    /// The parameters of `level`'s key slot `k`, if it has one.
    pub const fn key_params(&self, level: usize, k: usize) -> Option<Params> {
        if self.one_round(level) {
            if k < self.ring.key_count() {
                Some(self.ring.key_params())
            } else {
                None
            }
        } else if k < self.relu.compiled.key_count {
            Some(self.relu.key_params(k))
        } else {
            None
        }
    }

    /// Levels of the tree.
    pub const fn levels(&self) -> usize {
        let mut l = 0;
        let mut cur = self.len;
        while cur > 1 {
            cur = cur / 2 + cur % 2;
            l += 1;
        }
        l
    }

    /// Values per row entering `level`.
    pub const fn width_at(&self, level: usize) -> usize {
        let mut cur = self.len;
        let mut l = 0;
        while l < level {
            cur = cur / 2 + cur % 2;
            l += 1;
        }
        cur
    }

    /// ReLU instances per row at `level`.
    pub const fn pairs(&self, level: usize) -> usize {
        self.width_at(level) / 2
    }

    /// Rounds in total.
    pub const fn rounds(&self) -> usize {
        let mut r = 0;
        let mut l = 0;
        while l < self.levels() {
            r += self.level_rounds(l);
            l += 1;
        }
        r
    }

    /// [`DealScratch`] blocks [`MaxTree::deal_level`] wants for `rows` rows
    /// in groups of `group` (its widest level, see
    /// [`Gate::deal_scratch_blocks`]).
    pub const fn deal_scratch_blocks(&self, rows: usize, group: usize) -> usize {
        self.relu.deal_scratch_blocks(self.count(rows, 0), group)
    }

    /// Deals `level` for `rows` rows: ReLU keys for `count(rows, level)`
    /// elements, seeded from the level's derived seeds; `scratch` is
    /// [`Gate::deal`]'s; `random` holds [`MaxTree::random_words`] fresh
    /// dealer words per ReLU (a one-round level's keys draw them).
    #[allow(clippy::too_many_arguments)]
    pub fn deal_level(
        &self,
        level: usize,
        rows: usize,
        fss: &dyn BatchEval,
        seeds: [[u8; 16]; 2],
        dcf0: &mut [&mut [u8]; MAX_KEYS],
        dcf1: &mut [&mut [u8]; MAX_KEYS],
        explicit: &mut [u64],
        random: &[u64],
        scratch: &mut DealScratch<'_>,
    ) -> Result<u64, Error> {
        let s = [
            step_seed(fss, &seeds[0], level),
            step_seed(fss, &seeds[1], level),
        ];
        if self.one_round(level) {
            let [a0, ..] = dcf0;
            let [a1, ..] = dcf1;
            let count = self.count(rows, level);
            return self.ring.deal(fss, s, None, random, 0, count, [a0], [a1]);
        }
        self.relu.deal(
            fss,
            s,
            None,
            0,
            self.count(rows, level),
            dcf0,
            dcf1,
            explicit,
            scratch,
        )
    }

    /// Scratch words for `rows` rows.
    pub const fn scratch_words(&self, rows: usize) -> usize {
        let n = self.count(rows, 0);
        let (gate, one) = (self.relu.scratch_words(n), RingRelu::scratch_words(n));
        rows * self.len + n + if gate > one { gate } else { one }
    }
}

/// How many last levels a planned tree runs in one round
/// ([`MaxTree::one_round_tail`]): for a row of 128 values, the last four
/// levels hold 15 of its 127 comparisons, so their keys (3.6× a two-round
/// ReLU's) add about a third to the tree's keys for four fewer rounds.
pub const ONE_ROUND_TAIL: usize = 4;

/// Most levels (rows of up to 2^16 values).
pub const MAX_LEVELS: usize = 16;

/// One party's evaluation of a [`MaxTree`], a [`Protocol`]: each level is
/// one ReLU evaluation over every pair of every row, which borrows the
/// ReLU area of scratch while it runs.
pub struct MaxEval<'a> {
    tree: &'a MaxTree,
    h: &'a (dyn Hasher + Sync),
    party: Party,
    seed: [u8; 16],
    rows: usize,
    keys: [PartyKeys<'a>; MAX_LEVELS],
    /// The current values (`rows × width`), then the differences.
    values: &'a mut [u64],
    /// The ReLU area while no level holds it.
    free: Option<&'a mut [u64]>,
    /// The level in progress.
    current: Option<Eval<'a>>,
    next: usize,
}

impl core::fmt::Debug for MaxEval<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("MaxEval")
            .field("party", &self.party)
            .field("rows", &self.rows)
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl<'a> MaxEval<'a> {
    /// Starts from this party's shares of the `rows × len` values.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        tree: &'a MaxTree,
        h: &'a (dyn Hasher + Sync),
        party: Party,
        seed: [u8; 16],
        rows: usize,
        values: &[u64],
        keys: [PartyKeys<'a>; MAX_LEVELS],
        scratch: &'a mut [u64],
    ) -> Result<MaxEval<'a>, Error> {
        if tree.levels() > MAX_LEVELS {
            return Err(Error::Suf(SufError::Capacity));
        }
        if values.len() != rows * tree.len || scratch.len() < tree.scratch_words(rows) {
            return Err(Error::BufferLength);
        }
        let (head, relu) = scratch.split_at_mut(rows * tree.len + tree.count(rows, 0));
        head[..values.len()].copy_from_slice(values);
        Ok(MaxEval {
            tree,
            h,
            party,
            seed,
            rows,
            keys,
            values: head,
            free: Some(relu),
            current: None,
            next: 0,
        })
    }

    /// Writes `level`'s differences a − b of each row's pairs, row by row
    /// (the ReLU's input), after the values; returns where they start and
    /// how many there are.
    fn differences(&mut self, level: usize) -> (usize, usize) {
        let t = self.tree;
        let w = t.relu.ring();
        let cur = t.width_at(level);
        let diff_at = self.rows * t.len;
        let mut at = diff_at;
        for r in 0..self.rows {
            for p in 0..t.row_width(r, level) / 2 {
                let a = self.values[r * cur + 2 * p];
                let b = self.values[r * cur + 2 * p + 1];
                self.values[at] = w.sub(a, b);
                at += 1;
            }
        }
        (diff_at, at - diff_at)
    }

    /// Starts a two-round `level`: its ReLU evaluator takes the area.
    fn start_level(&mut self, level: usize) -> Result<(), Error> {
        let t = self.tree;
        let (diff_at, n) = self.differences(level);
        let area = self.free.take().ok_or(Error::Unsupported)?;
        let seed = step_seed(self.h, &self.seed, level);
        let diffs = &self.values[diff_at..diff_at + n];
        let ev = Eval::new(
            &t.relu,
            self.h,
            self.party,
            &seed,
            None,
            0,
            n,
            self.keys[level],
            diffs,
            area,
        )?;
        self.current = Some(ev);
        Ok(())
    }

    /// Ends a two-round `level`: its ReLU outputs replace the differences.
    fn end_level(&mut self, level: usize) -> Result<(), Error> {
        let n = self.tree.count(self.rows, level);
        let diff_at = self.rows * self.tree.len;
        let ev = self.current.take().ok_or(Error::Unsupported)?;
        // ReLU(a − b) over the differences, in place.
        ev.outputs(&mut self.values[diff_at..diff_at + n], &mut [])?;
        self.free = Some(ev.into_scratch());
        self.compact(level);
        Ok(())
    }

    /// A one-round `level`'s message: its differences, masked.
    fn open_level(&mut self, level: usize, send: &mut [u8]) -> Result<(), Error> {
        let one = &self.tree.ring;
        let (diff_at, n) = self.differences(level);
        let seed = step_seed(self.h, &self.seed, level);
        let area = self.free.as_deref_mut().ok_or(Error::Unsupported)?;
        let area = &mut area[..RingRelu::scratch_words(n)];
        one.load(self.h, &seed, None, 0, area)?;
        one.open(area, &self.values[diff_at..diff_at + n], send)
    }

    /// A one-round `level`'s peer message: its ReLUs replace the
    /// differences.
    fn close_level(&mut self, level: usize, recv: &[u8], fss: &dyn BatchEval) -> Result<(), Error> {
        let one = &self.tree.ring;
        let n = self.tree.count(self.rows, level);
        let diff_at = self.rows * self.tree.len;
        let keys = one.key_batches(self.party, &self.keys[level])?;
        let area = self.free.as_deref_mut().ok_or(Error::Unsupported)?;
        let area = &mut area[..RingRelu::scratch_words(n)];
        one.close(area, recv, &keys, fss)?;
        one.output(self.party, area, &mut self.values[diff_at..diff_at + n])?;
        self.compact(level);
        Ok(())
    }

    /// After `level`: max = b + ReLU(a − b) (the ReLUs where the
    /// differences were); rows compact to the next width, each row's odd
    /// value passing up.
    fn compact(&mut self, level: usize) {
        let t = self.tree;
        let w = t.relu.ring();
        let cur = t.width_at(level);
        let next_w = t.width_at(level + 1);
        let mut at = self.rows * t.len;
        for r in 0..self.rows {
            let width = t.row_width(r, level);
            let pairs = width / 2;
            for p in 0..pairs {
                let b = self.values[r * cur + 2 * p + 1];
                let m = w.add(b, self.values[at]);
                at += 1;
                self.values[r * next_w + p] = m;
            }
            if width % 2 == 1 {
                self.values[r * next_w + pairs] = self.values[r * cur + width - 1];
            }
        }
    }
}

impl Protocol for MaxEval<'_> {
    fn rounds(&self) -> usize {
        self.tree.rounds()
    }

    fn send_len(&self, round: usize) -> usize {
        if round >= self.rounds() {
            return 0;
        }
        let (level, j) = self.tree.locate(round);
        let n = self.tree.count(self.rows, level);
        let g = &self.tree.relu;
        if self.tree.one_round(level) {
            crate::mpc::words_len(g.ring(), n)
        } else {
            g.round_bytes(g.schedule().0[j], n)
        }
    }

    fn output_len(&self) -> usize {
        self.rows
    }

    fn prepare(&mut self, round: usize, send: &mut [u8]) -> Result<(), Error> {
        if round != self.next || round >= self.rounds() {
            return Err(Error::Unsupported);
        }
        let (level, j) = self.tree.locate(round);
        if self.tree.one_round(level) {
            return self.open_level(level, send);
        }
        if j == 0 {
            self.start_level(level)?;
        }
        self.current
            .as_mut()
            .ok_or(Error::Unsupported)?
            .prepare(j, send)
    }

    fn finish(&mut self, round: usize, recv: &[u8], fss: &dyn BatchEval) -> Result<(), Error> {
        if round != self.next || round >= self.rounds() {
            return Err(Error::Unsupported);
        }
        let (level, j) = self.tree.locate(round);
        if self.tree.one_round(level) {
            self.close_level(level, recv, fss)?;
            self.next += 1;
            return Ok(());
        }
        let ev = self.current.as_mut().ok_or(Error::Unsupported)?;
        ev.finish(j, recv, fss)?;
        if j + 1 == ev.rounds() {
            self.end_level(level)?;
        }
        self.next += 1;
        Ok(())
    }

    /// This party's shares of the row maxima.
    fn output(&self, out: &mut [u64]) -> Result<(), Error> {
        if self.next != self.rounds() {
            return Err(Error::Unsupported);
        }
        if out.len() != self.rows {
            return Err(Error::BufferLength);
        }
        out.copy_from_slice(&self.values[..self.rows]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Serial;
    use crate::prg::FixedKeyAes;
    use crate::prg::Prg;
    use std::vec;
    use std::vec::Vec;

    fn run_max(tree: &MaxTree, rows: usize, values: &[u64]) -> Vec<u64> {
        let w = tree.relu.ring();
        let aes = FixedKeyAes::new();
        let seeds = [[1u8; 16], [2u8; 16]];
        let levels = tree.levels();
        type LevelStore = ([Vec<Vec<u8>>; 2], Vec<u64>);
        let mut store: Vec<LevelStore> = Vec::new();
        for l in 0..levels {
            let n = tree.count(rows, l);
            let mk = || -> Vec<Vec<u8>> {
                (0..MAX_KEYS)
                    .map(|k| vec![0u8; tree.key_params(l, k).map_or(0, |p| n * p.key_len())])
                    .collect()
            };
            let (mut k0, mut k1) = (mk(), mk());
            let mut ex = vec![0u64; n * tree.explicit_words(l)];
            let mut fresh = Prg::new(&[l as u8 ^ 0x42; 16]);
            let random: Vec<u64> = (0..n * tree.random_words(l))
                .map(|_| fresh.next_u64())
                .collect();
            {
                let mut d0 = crate::gate::testing::key_slices(&mut k0);
                let mut d1 = crate::gate::testing::key_slices(&mut k1);
                let mut prf = vec![crate::prg::Block::ZERO; tree.deal_scratch_blocks(rows, 5)];
                let mut words = vec![0u64; DealScratch::words(5)];
                tree.deal_level(
                    l,
                    rows,
                    &Serial::new(),
                    seeds,
                    &mut d0,
                    &mut d1,
                    &mut ex,
                    &random,
                    &mut DealScratch::new(&mut prf, &mut words),
                )
                .unwrap();
            }
            store.push(([k0, k1], ex));
        }
        let keys = |party: usize| -> [PartyKeys<'_>; MAX_LEVELS] {
            let mut k = [PartyKeys::default(); MAX_LEVELS];
            for (l, (d, ex)) in store.iter().enumerate() {
                let d = &d[party];
                k[l] = PartyKeys {
                    dcf: core::array::from_fn(|k| d.get(k).map_or(&[][..], |v| &v[..])),
                    roots: [&[]; MAX_KEYS],
                    explicit: if party == 1 { ex } else { &[] },
                };
            }
            k
        };
        let mut prg = Prg::new(&[8; 16]);
        let v0: Vec<u64> = values.iter().map(|_| w.reduce(prg.next_u64())).collect();
        let v1: Vec<u64> = values.iter().zip(&v0).map(|(v, a)| w.sub(*v, *a)).collect();
        let mut s0 = crate::gate::testing::dirty(tree.scratch_words(rows), 0);
        let mut s1 = crate::gate::testing::dirty(tree.scratch_words(rows), 1);
        let mut e0 =
            MaxEval::new(tree, &aes, Party::P0, seeds[0], rows, &v0, keys(0), &mut s0).unwrap();
        let mut e1 =
            MaxEval::new(tree, &aes, Party::P1, seeds[1], rows, &v1, keys(1), &mut s1).unwrap();
        let serial = Serial::new();
        let len = crate::gate::protocol::max_send_len(&e0);
        let (mut b0, mut b1) = (vec![0u8; len], vec![0u8; len]);
        crate::gate::run_pair(&mut e0, &mut e1, &serial, &mut b0, &mut b1).unwrap();
        let (mut o0, mut o1) = (vec![0u64; rows], vec![0u64; rows]);
        e0.output(&mut o0).unwrap();
        e1.output(&mut o1).unwrap();
        o0.iter().zip(&o1).map(|(a, b)| w.add(*a, *b)).collect()
    }

    /// The last levels in one round: the same maxima as the two-round
    /// tree (the oracle), one round fewer per one-round level.
    #[test]
    fn a_one_round_tail_gives_the_same_maxima_in_fewer_rounds() {
        let (n, k) = (Width::W64, Width::of(30));
        let mut prg = Prg::new(&[4; 16]);
        for (len, tail) in [(1, 3), (2, 1), (7, 2), (33, 3), (128, 4), (13, 9)] {
            let plain = MaxTree::new(n, k, len).unwrap();
            let tree = MaxTree::new(n, k, len).unwrap().one_round_tail(tail);
            let rows = 3;
            let values: Vec<u64> = (0..rows * len)
                .map(|_| n.from_signed((prg.next_u64() as i64) >> 36))
                .collect();
            assert_eq!(
                run_max(&tree, rows, &values),
                run_max(&plain, rows, &values)
            );
            let ones = tail.min(plain.levels());
            assert_eq!(
                tree.rounds(),
                plain.rounds() - ones,
                "len {len} tail {tail}"
            );
        }
    }

    #[test]
    fn row_maxima_for_every_length_up_to_33() {
        let (n, k) = (Width::W64, Width::of(30));
        let mut prg = Prg::new(&[3; 16]);
        for len in 1..=33 {
            let tree = MaxTree::new(n, k, len).unwrap();
            let rows = 5;
            let values: Vec<u64> = (0..rows * len)
                .map(|_| n.from_signed((prg.next_u64() as i64) >> 36))
                .collect();
            let got = run_max(&tree, rows, &values);
            for r in 0..rows {
                let want = values[r * len..(r + 1) * len]
                    .iter()
                    .map(|v| n.to_signed(*v))
                    .max()
                    .unwrap();
                assert_eq!(n.to_signed(got[r]), want, "len {len} row {r}");
            }
            assert_eq!(
                tree.rounds(),
                2 * (usize::BITS - (len - 1).leading_zeros()) as usize
            );
        }
    }

    /// A causal tree: row `r` of every block of `period` rows takes its
    /// first `r % period + 1` values (at most `len`), whatever the rest of
    /// its stored row holds; `n − 1` ReLUs for a row of `n`, in the rounds
    /// of the tree over `len`, with and without one-round levels, and for
    /// rows that end inside a block.
    #[test]
    fn causal_rows_take_their_own_lengths() {
        let (n, k) = (Width::W64, Width::of(30));
        let mut prg = Prg::new(&[5; 16]);
        for (len, period, rows, tail) in [
            (1, 1, 3, 0),
            (2, 2, 4, 1),
            (5, 5, 12, 0),
            (8, 8, 16, 2),
            (13, 13, 29, 3),
            (16, 16, 16, 4),
            (9, 4, 11, 1),
            (33, 33, 33, 9),
        ] {
            let plain = MaxTree::new(n, k, len).unwrap().one_round_tail(tail);
            let tree = MaxTree::new(n, k, len)
                .unwrap()
                .one_round_tail(tail)
                .causal(period);
            let values: Vec<u64> = (0..rows * len)
                .map(|_| n.from_signed((prg.next_u64() as i64) >> 36))
                .collect();
            let got = run_max(&tree, rows, &values);
            let mut relus = 0;
            for r in 0..rows {
                let own = (r % period + 1).min(len);
                assert_eq!(tree.row_len(r), own);
                relus += own - 1;
                let want = values[r * len..r * len + own]
                    .iter()
                    .map(|v| n.to_signed(*v))
                    .max()
                    .unwrap();
                assert_eq!(
                    n.to_signed(got[r]),
                    want,
                    "len {len} period {period} row {r}"
                );
            }
            let counted: usize = (0..tree.levels()).map(|l| tree.count(rows, l)).sum();
            assert_eq!(counted, relus, "len {len} period {period}");
            assert_eq!(tree.rounds(), plain.rounds());
        }
    }
}
