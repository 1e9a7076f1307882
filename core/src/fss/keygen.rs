//! Key generation, one key or a batch of keys walked level by level.
//!
//! Generating one key is a dependent chain: each level hashes both
//! parties' seeds (two AES blocks) and the next level needs the result. A
//! batch of `L` keys walked in lockstep puts `2L` independent blocks in
//! flight per level, which is what pipelined AES needs; the maths per key is
//! the same code with one lane.

use super::{Kind, Output, Params, cond_neg, ct_eq, ct_lt, select_u64, write_word};
use crate::error::Error;
use crate::prg::{Block, Domain, HASH_CHUNK, Hasher, word_mask};
use crate::ring::{Width, cast};

/// Keys walked in lockstep by [`generate`]: two hash blocks per key fill one
/// `hash_many` call.
pub const GEN_LANES: usize = HASH_CHUNK / 2;

/// The secret inputs of a batch of key pairs: per key α, β (two words for
/// a pair, [`Output::words`]), both parties' root seeds, and the uniform
/// words ring-output DCFs draw.
///
/// Those words become the off-path value corrections, so they must come
/// from fresh dealer randomness, never from a party's seed (that party
/// could predict them). Bit-output keys and DPFs draw none.
///
/// Every field is secret; `Debug` shows only the shape.
#[derive(Clone, Copy)]
pub struct GenBatch<'a> {
    params: Params,
    alphas: &'a [u64],
    betas: &'a [u64],
    roots: &'a [[Block; 2]],
    random: &'a [u64],
}

impl core::fmt::Debug for GenBatch<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("GenBatch")
            .field("params", &self.params)
            .field("count", &self.count())
            .finish_non_exhaustive()
    }
}

impl<'a> GenBatch<'a> {
    /// A batch of `alphas.len()` keys. `roots` has one entry per key and
    /// `betas` [`Output::words`] (β is ignored for bit outputs; a pair's
    /// two side by side); `random` has [`Params::gen_random_words`] words
    /// per key, key-major.
    pub fn new(
        params: Params,
        alphas: &'a [u64],
        betas: &'a [u64],
        roots: &'a [[Block; 2]],
        random: &'a [u64],
    ) -> Result<GenBatch<'a>, Error> {
        let n = alphas.len();
        let words = n.checked_mul(params.gen_random_words());
        let beta_words = n.checked_mul(params.output().words());
        if beta_words != Some(betas.len()) || roots.len() != n || words != Some(random.len()) {
            return Err(Error::BufferLength);
        }
        Ok(GenBatch {
            params,
            alphas,
            betas,
            roots,
            random,
        })
    }

    /// The common parameters.
    pub fn params(&self) -> Params {
        self.params
    }

    /// The number of key pairs.
    pub fn count(&self) -> usize {
        self.alphas.len()
    }

    /// Every key's α (secret), for accelerators that generate elsewhere.
    pub fn alphas(&self) -> &'a [u64] {
        self.alphas
    }

    /// Every key's β, [`Output::words`] words per key (secret; ignored for
    /// bit outputs).
    pub fn betas(&self) -> &'a [u64] {
        self.betas
    }

    /// Every key's two root seeds (secret).
    pub fn roots(&self) -> &'a [[Block; 2]] {
        self.roots
    }

    /// The uniform words of ring-output DCFs, [`Params::gen_random_words`]
    /// per key, key-major (secret).
    pub fn random(&self) -> &'a [u64] {
        self.random
    }

    /// The sub-batch of keys `start..end`; panics if out of range.
    pub fn slice(&self, start: usize, end: usize) -> GenBatch<'a> {
        let w = self.params.gen_random_words();
        let b = self.params.output().words();
        GenBatch {
            params: self.params,
            alphas: &self.alphas[start..end],
            betas: &self.betas[start * b..end * b],
            roots: &self.roots[start..end],
            random: &self.random[start * w..end * w],
        }
    }
}

/// Whether `key1` fits `key0` in a key generation call: the same length,
/// or empty, which asks for P0's keys only. P1's keys are P0's but for the
/// 16-byte root, which P1 re-derives from its own seed, so a dealer that
/// stores one body for both parties need not write them.
pub fn p1_keys_fit(key0: &[u8], key1: &[u8]) -> bool {
    key1.len() == key0.len() || key1.is_empty()
}

/// Whether `key0` holds exactly `count` keys of `key_len` bytes and `key1`
/// fits it ([`p1_keys_fit`]): the one length rule of every key generation
/// call, gates' and backends' alike. A product that overflows fits nothing.
pub fn key_buffers_fit(key0: &[u8], key1: &[u8], count: usize, key_len: usize) -> bool {
    Some(key0.len()) == count.checked_mul(key_len) && p1_keys_fit(key0, key1)
}

/// `key1[span]`, or the empty buffer when only P0's keys are asked for
/// ([`p1_keys_fit`]).
pub fn p1_span(key1: &mut [u8], span: core::ops::Range<usize>) -> &mut [u8] {
    match key1.is_empty() {
        true => key1,
        false => &mut key1[span],
    }
}

/// Generates every key pair of `batch` into `key0` and `key1`
/// (`count · key_len` bytes each, key-major), walking up to `lanes` keys in
/// lockstep; an empty `key1` writes P0's keys only ([`p1_keys_fit`]).
/// `lanes = 1` is the one-at-a-time reference; any lane count writes the
/// same bytes. Returns the AES calls made.
pub fn generate<H: Hasher + ?Sized>(
    aes: &H,
    batch: &GenBatch<'_>,
    key0: &mut [u8],
    key1: &mut [u8],
    lanes: usize,
) -> Result<u64, Error> {
    let len = batch.params.key_len();
    let n = batch.count();
    if !key_buffers_fit(key0, key1, n, len) {
        return Err(Error::BufferLength);
    }
    let lanes = lanes.clamp(1, GEN_LANES);
    let mut calls = 0;
    let mut start = 0;
    while start < n {
        let end = n.min(start + lanes);
        let part = batch.slice(start, end);
        let (k0, k1) = (
            &mut key0[start * len..end * len],
            p1_span(key1, start * len..end * len),
        );
        calls += if lanes == 1 {
            gen_group::<H, 1>(aes, &part, k0, k1)
        } else {
            gen_group::<H, GEN_LANES>(aes, &part, k0, k1)
        };
        start = end;
    }
    Ok(calls)
}

/// Per-lane state of a lockstep generation group.
struct Lanes<const L: usize> {
    s: [[Block; 2]; L],
    delta: [Block; L],
    a_hi: [u64; L],
    a_lo: [u64; L],
    /// β, and a pair's second word.
    beta: [[u64; 2]; L],
}

/// One lockstep group of at most `L` key pairs.
fn gen_group<H: Hasher + ?Sized, const L: usize>(
    aes: &H,
    batch: &GenBatch<'_>,
    key0: &mut [u8],
    key1: &mut [u8],
) -> u64 {
    let p = batch.params;
    let n = batch.count();
    let len = p.key_len();
    let ring = match p.output {
        Output::Bit => None,
        Output::Ring(w) | Output::Pair(w) => Some(w),
    };
    let words = p.output.words();
    let nu = p.leaf_bits();
    let mut st = Lanes::<L> {
        s: [[Block::ZERO; 2]; L],
        delta: [Block::ZERO; L],
        a_hi: [0; L],
        a_lo: [0; L],
        beta: [[0; 2]; L],
    };
    for j in 0..n {
        // α and β are secret: reduce them instead of branching on a range check.
        let alpha = p.domain.reduce(batch.alphas[j]);
        st.a_hi[j] = alpha >> nu;
        st.a_lo[j] = alpha & ((1u64 << nu) - 1);
        for (i, b) in st.beta[j].iter_mut().enumerate().take(words) {
            *b = ring.map_or(1, |w| w.reduce(batch.betas[j * words + i]));
        }
        let [r0, r1] = batch.roots[j];
        st.s[j] = [r0.with_lsb(0), r1.with_lsb(1)];
        st.delta[j] = st.s[j][0] ^ st.s[j][1];
        st.s[j][0].write(&mut key0[j * len..]);
    }
    let mut calls = 0;
    for level in 0..p.levels() {
        calls += gen_level(aes, batch, &mut st, level, key0);
    }
    calls += gen_leaf(aes, batch, &st, key0);
    // P1's keys where asked for (an empty `key1` has no chunks): its own
    // root, then P0's body.
    for (j, key) in key1.chunks_exact_mut(len).enumerate() {
        batch.roots[j][1].with_lsb(1).write(key);
        key[16..].copy_from_slice(&key0[j * len + 16..(j + 1) * len]);
    }
    calls
}

/// One tree level of every lane: the seed correction word and, for ring
/// DCFs, the value correction.
fn gen_level<H: Hasher + ?Sized, const L: usize>(
    aes: &H,
    batch: &GenBatch<'_>,
    st: &mut Lanes<L>,
    level: u32,
    key0: &mut [u8],
) -> u64 {
    let p = batch.params;
    let n = batch.count();
    let len = p.key_len();
    let levels = p.levels();
    let off = p.cw_offset(level);
    // Both parties' nodes of every lane in one call.
    let mut h = [[Block::ZERO; 2]; L];
    h[..n].copy_from_slice(&st.s[..n]);
    let mut calls = aes.hash_many(Domain::Tree, h[..n].as_flattened_mut());
    let mut right = [[Block::ZERO; 2]; L];
    let mut a_i = [0u64; L];
    for j in 0..n {
        let [s0, s1] = st.s[j];
        let [h0, h1] = h[j];
        a_i[j] = (st.a_hi[j] >> (levels - 1 - level)) & 1;
        // Keeps the child toward α on the path (difference Δ) and makes the
        // other child's seeds equal.
        let cw = h0 ^ h1 ^ (st.delta[j] & Block::mask(a_i[j] ^ 1));
        cw.write(&mut key0[j * len + off..]);
        let l0 = h0 ^ (cw & Block::mask(s0.lsb()));
        let l1 = h1 ^ (cw & Block::mask(s1.lsb()));
        right[j] = [l0 ^ s0, l1 ^ s1];
        st.s[j] = [
            l0 ^ (s0 & Block::mask(a_i[j])),
            l1 ^ (s1 & Block::mask(a_i[j])),
        ];
    }
    if let (Kind::Dcf, Output::Ring(w) | Output::Pair(w)) = (p.kind, p.output) {
        let t0: [u64; L] = core::array::from_fn(|j| right[j][0].lsb());
        calls += aes.hash_many(Domain::Value, right[..n].as_flattened_mut());
        let (draws, outs) = (p.gen_random_words(), p.output.words());
        let vb = p.value_bytes() / outs;
        let level = cast::usize_from_u32(level);
        for j in 0..n {
            // A pair's second word comes from the value hash's high half.
            let halves = [right[j].map(Block::low64), right[j].map(Block::high64)];
            for (i, hashed) in halves.into_iter().enumerate().take(outs) {
                let random = batch.random[j * draws + level * outs + i];
                let vcw = value_cw(w, hashed, t0[j], st.beta[j][i], a_i[j], random);
                let at = j * len + off + 16 + i * vb;
                write_word(&mut key0[at..at + vb], vcw);
            }
        }
    }
    calls
}

/// The value correction of one level from the hashed right siblings'
/// words (both parties').
fn value_cw(w: Width, hashed: [u64; 2], t0: u64, beta: u64, a_i: u64, random: u64) -> u64 {
    let [v0, v1] = hashed;
    // On path (α_i = 1): P0's +(v0 + t0·V) and P1's −(v1 + t1·V) must sum to
    // β, so V = (β − v0 + v1)·(t0 − t1) with t0 − t1 = ±1.
    let on = w.add(w.sub(beta, v0), v1);
    let on = cond_neg(w, on, t0 ^ 1);
    // Off path the siblings' seeds are equal and V cancels; a random V makes
    // the two cases look alike.
    select_u64(a_i, w.reduce(random), on)
}

/// The leaf correction block of every lane.
fn gen_leaf<H: Hasher + ?Sized, const L: usize>(
    aes: &H,
    batch: &GenBatch<'_>,
    st: &Lanes<L>,
    key0: &mut [u8],
) -> u64 {
    let p = batch.params;
    let n = batch.count();
    let len = p.key_len();
    let dcf = p.kind == Kind::Dcf;
    let word_bits = p.word_bits();
    // Word i of a ring block belongs to lane i / words; a pair's second
    // word (odd i) carries β's second word.
    let words = cast::u32_from_small_usize(p.output.words());
    let mut g = [[Block::ZERO; 2]; L];
    g[..n].copy_from_slice(&st.s[..n]);
    let calls = aes.hash_many(Domain::Leaf, g[..n].as_flattened_mut());
    for j in 0..n {
        let a_lo = st.a_lo[j];
        let payload_bit = |i: u32| -> u64 {
            let i = u64::from(i);
            if dcf { ct_lt(i, a_lo) } else { ct_eq(i, a_lo) }
        };
        let [g0, g1] = g[j];
        let lcw = match p.output {
            // The payload block in closed form (128 lane steps were half
            // of the dealer's key generation).
            Output::Bit => {
                g0 ^ g1
                    ^ if dcf {
                        Block::below(a_lo)
                    } else {
                        Block::unit(a_lo)
                    }
            }
            Output::Ring(w) | Output::Pair(w) => {
                let flip = st.s[j][0].lsb() ^ 1;
                let beta = st.beta[j];
                Block::from_lanes(word_bits, |i| {
                    let beta = beta[cast::usize_from_u32(i % words)];
                    // Through the optimisation barrier: a plain `0 − bit`
                    // here was compiled into a select on α's low bits
                    // (`cargo xtask ct` caught it, 2026-11-27).
                    let pj = beta & word_mask(payload_bit(i / words));
                    let v = w.add(
                        w.sub(pj, w.reduce(g0.lane(word_bits, i))),
                        w.reduce(g1.lane(word_bits, i)),
                    );
                    cond_neg(w, v, flip)
                })
            }
        };
        lcw.write(&mut key0[j * len + p.leaf_offset()..]);
    }
    calls
}

#[cfg(test)]
mod tests {
    use super::key_buffers_fit;

    /// `count` keys of `len` bytes in `key0`, and `key1` of the same length
    /// or empty; anything else, an overflowing product included, is
    /// refused.
    #[test]
    fn key_buffers_fit_takes_whole_batches_and_p0_alone() {
        let (k0, k1) = ([0u8; 12], [0u8; 12]);
        assert!(key_buffers_fit(&k0, &k1, 3, 4));
        assert!(key_buffers_fit(&k0, &[], 3, 4));
        assert!(key_buffers_fit(&[], &[], 0, 4));
        assert!(!key_buffers_fit(&k0, &k1[..8], 3, 4));
        assert!(!key_buffers_fit(&k0[..8], &k1[..8], 3, 4));
        assert!(!key_buffers_fit(&k0, &k1, 4, 4));
        assert!(!key_buffers_fit(&[], &[], usize::MAX, 2));
    }
}
