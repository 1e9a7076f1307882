//! What the one-round gates ([`super::ring_trunc`], [`super::ring_relu`],
//! [`super::ring_suf`]) share: their ring-output keys' roots, batches and the opening of a
//! masked input, with each party's mask shares and key roots expanded
//! from its seed.

use crate::batch::BatchEval;
use crate::compile::MAX_KEYS;
use crate::error::Error;
use crate::fss::{GenBatch, KeyBatch, Params, Party, p1_span};
use crate::gate::{PartyKeys, prf_slots};
use crate::mpc;
use crate::prg::{Block, Hasher};
use crate::ring::{Width, cast};

/// Elements per group while dealing and expanding (stack buffers).
pub(crate) const GROUP: usize = 64;

/// Most PRF slots per element: a mask share, one block of words and a
/// root per key, or `TruncOpen`'s squared form (six slots).
const MAX_SLOTS: usize = 3 + MAX_KEYS;

/// A group of at most [`GROUP`] elements being dealt.
pub(crate) struct Group<'a> {
    /// The group's first element, counted from the deal's first.
    pub(crate) at: usize,
    /// Both parties' PRF blocks, `slots` per element (slot 0 the mask
    /// share).
    pub(crate) blocks: [&'a [Block]; 2],
    /// PRF slots per element.
    pub(crate) slots: usize,
    /// Each element's mask `r`.
    pub(crate) masks: &'a [u64],
}

impl Group<'_> {
    /// Elements in the group.
    pub(crate) fn len(&self) -> usize {
        self.masks.len()
    }

    /// Both parties' block of `slot` for element `e` of the group.
    pub(crate) fn block(&self, e: usize, slot: usize) -> [Block; 2] {
        self.blocks.map(|b| b[e * self.slots + slot])
    }

    /// P1's explicit words of element `e`: each value less P0's seeded
    /// share of it, two words per PRF block from `slot` on (low half,
    /// then high), reduced to `ring`.
    pub(crate) fn explicit(
        &self,
        ring: Width,
        (e, slot): (usize, usize),
        values: impl IntoIterator<Item = u64>,
        explicit: &mut [u64],
    ) {
        for (j, (v, out)) in values.into_iter().zip(explicit).enumerate() {
            let block = self.block(e, slot + j / 2)[0];
            let p0 = ring.reduce([block.low64(), block.high64()][j % 2]);
            *out = ring.sub(v, p0);
        }
    }

    /// Generates the group's keys of one key slot, rooted at PRF `slot`:
    /// thresholds `alphas`, payloads `betas` ([`Output::words`] per
    /// element, a pair's two side by side) and `random` (this key slot's
    /// fresh words, the group's only), into the group's span of
    /// `key0`/`key1`. Returns the AES calls made.
    ///
    /// [`Output::words`]: crate::fss::Output::words
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn generate(
        &self,
        fss: &dyn BatchEval,
        params: Params,
        slot: usize,
        (alphas, betas): (&[u64], &[u64]),
        random: &[u64],
        key0: &mut [u8],
        key1: &mut [u8],
    ) -> Result<u64, Error> {
        let m = self.len();
        let mut roots = [[Block::ZERO; 2]; GROUP];
        for (e, r) in roots[..m].iter_mut().enumerate() {
            *r = self.block(e, slot);
        }
        let b = m * params.output().words();
        let batch = GenBatch::new(params, &alphas[..m], &betas[..b], &roots[..m], random)?;
        let len = params.key_len();
        let span = self.at * len..(self.at + m) * len;
        Ok(fss
            .generate(&batch, &mut key0[span.clone()], p1_span(key1, span))?
            .aes_calls)
    }
}

/// Several keys of one group with the same thresholds: key i rooted at
/// PRF slot `slot + i`, with payloads `betas[i]` and fresh words from
/// key i's span of `random` (key 0's words for all `count` elements of
/// the deal, then key 1's, and so on), into `keys0[i]` / `keys1[i]`.
/// Returns the AES calls made.
#[allow(clippy::too_many_arguments)]
pub(crate) fn generate_keys(
    g: &Group<'_>,
    fss: &dyn BatchEval,
    (params, slot): (Params, usize),
    count: usize,
    (alphas, betas): (&[u64], &[[u64; GROUP]]),
    random: &[u64],
    keys0: &mut [&mut [u8]],
    keys1: &mut [&mut [u8]],
) -> Result<u64, Error> {
    let rw = params.gen_random_words();
    let mut calls = 0;
    for (i, b) in betas.iter().enumerate() {
        let words = (i * count + g.at) * rw..(i * count + g.at + g.len()) * rw;
        calls += g.generate(
            fss,
            params,
            slot + i,
            (alphas, b),
            &random[words],
            keys0[i],
            keys1[i],
        )?;
    }
    Ok(calls)
}

/// Deals `count` elements from element index `first` in groups: expands
/// both parties' first `slots` PRF slots, adds each element's mask shares
/// (slot 0, or the pinned `masks` in tests) and hands each group to
/// `group`. Returns the AES calls made.
pub(crate) fn deal_groups(
    fss: &dyn BatchEval,
    ring: Width,
    (seeds, slots): ([[u8; 16]; 2], usize),
    masks: Option<[&[u64]; 2]>,
    (first, count): (u64, usize),
    mut group: impl FnMut(&Group<'_>) -> Result<u64, Error>,
) -> Result<u64, Error> {
    if slots > MAX_SLOTS || masks.is_some_and(|[m0, m1]| m0.len() != count || m1.len() != count) {
        return Err(Error::BufferLength);
    }
    let mut b0 = [Block::ZERO; MAX_SLOTS * GROUP];
    let mut b1 = [Block::ZERO; MAX_SLOTS * GROUP];
    let mut r = [0u64; GROUP];
    let (mut calls, mut done) = (0, 0);
    while done < count {
        let m = GROUP.min(count - done);
        let at = first + cast::u64_from_usize(done);
        calls += prf_slots(fss, &seeds[0], (at, m), 0..slots, &mut b0);
        calls += prf_slots(fss, &seeds[1], (at, m), 0..slots, &mut b1);
        for (e, re) in r[..m].iter_mut().enumerate() {
            *re = match masks {
                Some([m0, m1]) => ring.add(m0[done + e], m1[done + e]),
                None => ring.add(b0[e * slots].low64(), b1[e * slots].low64()),
            };
        }
        calls += group(&Group {
            at: done,
            blocks: [&b0[..m * slots], &b1[..m * slots]],
            slots,
            masks: &r[..m],
        })?;
        done += m;
    }
    Ok(calls)
}

/// A gate with one key per element, rooted at PRF slot
/// [`SingleKey::ROOT_SLOT`] of the section's seed (a one-round truncation,
/// a one-round lookup, a truncation that opens its output): its roots'
/// re-derivation and its key batch, written once for all of them.
pub trait SingleKey {
    /// The PRF slot of each element's key root.
    const ROOT_SLOT: usize;

    /// The key's parameters.
    fn single_key(&self) -> Params;

    /// Writes each element's 16-byte key root, re-derived from `party`'s
    /// `seed`, into `roots` (16 bytes per element): for keys whose bodies
    /// stay where a key file was read. Returns the AES calls made.
    fn derive_roots(
        &self,
        h: &dyn Hasher,
        party: Party,
        seed: &[u8; 16],
        first: u64,
        roots: &mut [u8],
    ) -> Result<u64, Error> {
        derive_roots(h, party, (seed, Self::ROOT_SLOT), first, &mut [roots])
    }

    /// One party's keys of `n` elements as a batch: whole keys where
    /// `keys.roots[0]` is empty, else the roots and the bodies.
    fn key_batch<'k>(&self, party: Party, keys: &PartyKeys<'k>) -> Result<KeyBatch<'k>, Error> {
        key_batch(self.single_key(), party, keys, 0)
    }
}

/// Writes the roots of keys `j = 0..roots.len()` (PRF slot `slot + j`),
/// re-derived from `party`'s `seed`, into `roots[j]` (16 bytes per
/// element): for keys whose bodies stay where a key file was read. Returns
/// the AES calls made.
pub(crate) fn derive_roots(
    h: &dyn Hasher,
    party: Party,
    (seed, slot): (&[u8; 16], usize),
    first: u64,
    roots: &mut [&mut [u8]],
) -> Result<u64, Error> {
    let keys = roots.len();
    let count = roots.first().map_or(0, |r| r.len() / 16);
    if keys > MAX_KEYS || roots.iter().any(|r| r.len() != count * 16) {
        return Err(Error::BufferLength);
    }
    let mut blocks = [Block::ZERO; MAX_KEYS * GROUP];
    let (mut calls, mut done) = (0, 0);
    while done < count {
        let m = GROUP.min(count - done);
        let at = first + cast::u64_from_usize(done);
        calls += prf_slots(h, seed, (at, m), slot..slot + keys, &mut blocks);
        for e in 0..m {
            let to = (done + e) * 16..(done + e + 1) * 16;
            for (j, r) in roots.iter_mut().enumerate() {
                blocks[keys * e + j]
                    .with_lsb(party.index())
                    .write(&mut r[to.clone()]);
            }
        }
        done += m;
    }
    Ok(calls)
}

/// Key `j` of one party's keys as a batch: whole keys where
/// `keys.roots[j]` is empty, else the roots and the bodies.
pub(crate) fn key_batch<'k>(
    params: Params,
    party: Party,
    keys: &PartyKeys<'k>,
    j: usize,
) -> Result<KeyBatch<'k>, Error> {
    if keys.roots[j].is_empty() {
        KeyBatch::new(params, party, keys.dcf[j])
    } else {
        KeyBatch::split(params, party, keys.roots[j], keys.dcf[j])
    }
}

/// Calls `each(i, block)` with PRF slot `slot` of `seed` for elements
/// `first..first + n` in turn. Returns the AES calls made.
pub(crate) fn each_block(
    h: &dyn Hasher,
    (seed, slot): (&[u8; 16], usize),
    first: u64,
    n: usize,
    mut each: impl FnMut(usize, Block),
) -> u64 {
    let mut blocks = [Block::ZERO; GROUP];
    let (mut calls, mut done) = (0, 0);
    while done < n {
        let m = GROUP.min(n - done);
        let at = first + cast::u64_from_usize(done);
        calls += prf_slots(h, seed, (at, m), slot..slot + 1, &mut blocks);
        for (e, b) in blocks[..m].iter().enumerate() {
            each(done + e, *b);
        }
        done += m;
    }
    calls
}

/// This party's mask shares, PRF slot `slot` of its `seed` (or `mask`, in
/// tests), into `r`. Returns the AES calls made.
pub(crate) fn mask_shares(
    h: &dyn Hasher,
    ring: Width,
    seed: (&[u8; 16], usize),
    mask: Option<&[u64]>,
    first: u64,
    r: &mut [u64],
) -> Result<u64, Error> {
    if let Some(m) = mask {
        if m.len() != r.len() {
            return Err(Error::BufferLength);
        }
        r.copy_from_slice(m);
        return Ok(0);
    }
    let n = r.len();
    Ok(each_block(h, seed, first, n, |i, b| {
        r[i] = ring.reduce(b.low64())
    }))
}

/// This party's shares of the dealt words of `n` elements, `words.len()`
/// (one or two) per element: P0 expands them from PRF slot `slot` of its
/// seed (word j is the block's j-th half), P1 reads them from `explicit`
/// (element-major), where the dealer wrote each word less P0's share; P0
/// holds no explicit words.
/// Returns the AES calls made.
pub(crate) fn dealt_words(
    h: &dyn Hasher,
    (ring, party): (Width, Party),
    (seed, slot): (&[u8; 16], usize),
    first: u64,
    explicit: &[u64],
    words: &mut [&mut [u64]],
) -> Result<u64, Error> {
    let per = words.len();
    let n = words.first().map_or(0, |w| w.len());
    if per > 2 || words.iter().any(|w| w.len() != n) {
        return Err(Error::BufferLength);
    }
    match party {
        Party::P0 if !explicit.is_empty() => Err(Error::BufferLength),
        Party::P0 => Ok(each_block(h, (seed, slot), first, n, |i, b| {
            for (j, w) in words.iter_mut().enumerate() {
                w[i] = ring.reduce([b.low64(), b.high64()][j]);
            }
        })),
        Party::P1 => {
            if explicit.len() != n * per {
                return Err(Error::BufferLength);
            }
            for (i, ex) in explicit.chunks_exact(per.max(1)).enumerate() {
                for (w, v) in words.iter_mut().zip(ex) {
                    w[i] = *v;
                }
            }
            Ok(0)
        }
    }
}

/// This party's shares of `count` dealt words per element of `n`
/// elements, word-major into `shares` (`count·n` words): P0 expands them
/// from the PRF slots from `slot` of its seed (two a block: word j is the
/// low or high half of block `j / 2`), P1 reads them from `explicit`
/// (element-major), where the dealer wrote each word less P0's share.
/// Returns the AES calls made.
pub(crate) fn word_areas(
    h: &dyn Hasher,
    (ring, party): (Width, Party),
    (seed, slot): (&[u8; 16], usize),
    (first, n, count): (u64, usize, usize),
    explicit: &[u64],
    shares: &mut [u64],
) -> Result<u64, Error> {
    let want = if party == Party::P1 { n * count } else { 0 };
    if explicit.len() != want || shares.len() != n * count {
        return Err(Error::BufferLength);
    }
    let mut calls = 0;
    for block in 0..count.div_ceil(2) {
        let pair = 2 * block..(2 * block + 2).min(count);
        match party {
            Party::P0 => {
                calls += each_block(h, (seed, slot + block), first, n, |i, b| {
                    for j in pair.clone() {
                        shares[j * n + i] = ring.reduce([b.low64(), b.high64()][j % 2]);
                    }
                });
            }
            Party::P1 => {
                for j in pair {
                    for i in 0..n {
                        shares[j * n + i] = explicit[i * count + j];
                    }
                }
            }
        }
    }
    Ok(calls)
}

/// How many elements an evaluation area of `len` words holds at `per`
/// words each, checking that it holds whole ones.
pub(crate) fn area_elements(len: usize, per: usize) -> Result<usize, Error> {
    if per == 0 || !len.is_multiple_of(per) {
        return Err(Error::BufferLength);
    }
    Ok(len / per)
}

/// The opening's message: this party's share of `x + r` into `mine`, then
/// packed into `send`.
pub(crate) fn open(
    ring: Width,
    r: &[u64],
    x: &[u64],
    mine: &mut [u64],
    send: &mut [u8],
) -> Result<(), Error> {
    if r.len() != x.len() || mine.len() != x.len() {
        return Err(Error::BufferLength);
    }
    for ((o, x), r) in mine.iter_mut().zip(x).zip(r) {
        *o = ring.add(*x, *r);
    }
    mpc::open_prepare(ring, mine, send)
}

/// What the one-round gates' two-party tests share.
#[cfg(test)]
pub(crate) mod testing {
    use crate::prg::Prg;
    use crate::ring::Width;
    use std::vec::Vec;

    /// A test's start, all drawn from `salt`: both parties' seeds, their
    /// mask shares (P1's making the pinned masks, where given), the
    /// dealer's fresh words and both parties' shares of the inputs.
    pub(crate) struct Setup {
        pub(crate) seeds: [[u8; 16]; 2],
        masks: Option<[Vec<u64>; 2]>,
        pub(crate) random: Vec<u64>,
        pub(crate) x: [Vec<u64>; 2],
    }

    impl Setup {
        /// For inputs `xs` in the ring `w`, masks pinned to `masks`, and
        /// `random` fresh words.
        pub(crate) fn new(
            w: Width,
            xs: &[u64],
            masks: Option<&[u64]>,
            random: usize,
            salt: u8,
        ) -> Setup {
            let n = xs.len();
            let mut prg = Prg::new(&[salt ^ 0x33; 16]);
            let m0: Vec<u64> = (0..n).map(|_| w.reduce(prg.next_u64())).collect();
            let masks = masks.map(|m| {
                let m1 = m.iter().zip(&m0).map(|(r, a)| w.sub(*r, *a)).collect();
                [m0, m1]
            });
            let random = (0..random).map(|_| prg.next_u64()).collect();
            let x0: Vec<u64> = (0..n).map(|_| w.reduce(prg.next_u64())).collect();
            let x1 = xs.iter().zip(&x0).map(|(x, a)| w.sub(*x, *a)).collect();
            Setup {
                seeds: [[salt; 16], [salt ^ 0x5a; 16]],
                masks,
                random,
                x: [x0, x1],
            }
        }

        /// Both parties' pinned mask shares, if pinned.
        pub(crate) fn pinned(&self) -> Option<[&[u64]; 2]> {
            self.masks.as_ref().map(|[a, b]| [&a[..], &b[..]])
        }
    }

    /// The bodies of whole keys of `len` bytes, their roots dropped, as a
    /// key file stores them.
    pub(crate) fn bodies(keys: &[u8], len: usize) -> Vec<u8> {
        keys.chunks(len).flat_map(|c| c[16..].to_vec()).collect()
    }
}
