//! DCF-gate material as it lies in a key section: every key's body (its
//! root is re-derived from the section's seed), then P1's explicit words.
//! Shared by scalar gates, chain steps and max-tree levels.

use suffuse_core::batch::BatchEval;
use suffuse_core::compile::MAX_KEYS;
use suffuse_core::fss::Params;
use suffuse_core::fss::Party;
use suffuse_core::gate::centre_square::CentreSquare;
use suffuse_core::gate::ring_lut::RingLut;
use suffuse_core::gate::ring_relu::RingRelu;
use suffuse_core::gate::ring_suf::RingSuf;
use suffuse_core::gate::ring_trunc::RingTrunc;
use suffuse_core::gate::trunc_open::TruncOpen;
use suffuse_core::gate::{DealScratch, Gate, PartyKeys};
use suffuse_core::prg::{Block, Hasher};

use rayon::prelude::*;

use super::{CHUNK, Cursor, DealError, Dealt, Emit, ProtoError, core, deal_core};
use crate::net::{get_words, put_words};

/// Bytes of P1's explicit words.
pub(super) fn words_bytes(words: usize) -> usize {
    words * 8
}

/// Bytes of one element's key bodies (roots excluded) for a gate.
fn body_bytes(g: &Gate) -> usize {
    (0..g.compiled.key_count)
        .map(|k| g.key_params(k).key_len() - 16)
        .sum()
}

/// Section bytes of `count` elements of a gate's material.
pub(super) fn gate_bytes(g: &Gate, count: usize, party: Party) -> usize {
    let ex = if party == Party::P1 {
        words_bytes(count * g.explicit_words())
    } else {
        0
    };
    count * body_bytes(g) + ex
}

/// P0's full-key buffers for `count` elements (P1's keys are not
/// written: they differ only in the roots, which each party re-derives).
fn key_buffers(g: &Gate, count: usize) -> [Vec<u8>; MAX_KEYS] {
    std::array::from_fn(|k| {
        if k < g.compiled.key_count {
            vec![0u8; count * g.key_params(k).key_len()]
        } else {
            Vec::new()
        }
    })
}

/// Empty P1 key slots: a gate's `deal` then writes P0's keys alone.
fn no_keys() -> [&'static mut [u8]; MAX_KEYS] {
    std::array::from_fn(|_| &mut [][..])
}

pub(super) fn as_mut(bufs: &mut [Vec<u8>; MAX_KEYS]) -> [&mut [u8]; MAX_KEYS] {
    let mut it = bufs.iter_mut();
    std::array::from_fn(|_| it.next().map_or(&mut [][..], Vec::as_mut_slice))
}

/// Section bytes as they are dealt, in section order: runs both parties
/// hold alike (key bodies) and runs each holds its own.
#[derive(Default)]
pub(super) struct Parts {
    runs: Vec<Dealt>,
    each: [Vec<u8>; 2],
}

impl Parts {
    /// Each party's own bytes, to append to (P0's, P1's).
    pub(super) fn each(&mut self) -> &mut [Vec<u8>; 2] {
        &mut self.each
    }

    /// Appends `bytes` to both parties' sections.
    pub(super) fn same(&mut self, bytes: Vec<u8>) {
        self.close_each();
        self.runs.push(Dealt::Same(bytes));
    }

    fn close_each(&mut self) {
        if self.each.iter().any(|b| !b.is_empty()) {
            self.runs.push(Dealt::Each(std::mem::take(&mut self.each)));
        }
    }

    /// Hands every run to `emit`, in order.
    pub(super) fn emit(mut self, emit: &mut Emit<'_>) -> Result<(), DealError> {
        self.close_each();
        for run in self.runs {
            emit(run)?;
        }
        Ok(())
    }
}

/// Appends every key slot's bodies to both parties' sections, slot by
/// slot: `keys[k]` holds whole keys of `len(k)` bytes, each loses its
/// 16-byte root in place (each party re-derives its own from the section's
/// seed) and the buffer itself, left with what both parties hold alike,
/// becomes the run (no copy; the cut tail is wiped with the buffer).
fn append_bodies(out: &mut Parts, keys: &mut [Vec<u8>], len: impl Fn(usize) -> usize) {
    for (k, buf) in keys.iter_mut().enumerate() {
        let len = len(k);
        let count = buf.len() / len.max(1);
        for j in 0..count {
            buf.copy_within(j * len + 16..(j + 1) * len, j * (len - 16));
        }
        buf.truncate(count * (len - 16));
        out.same(std::mem::take(buf));
    }
}

/// Deals `count` elements with `deal` (which fills P0's full keys, given
/// empty P1 key slots, and P1's explicit words) and appends both parties'
/// section bytes: the key bodies once for both (P1's are P0's), then P1's
/// words.
pub(super) fn deal_material(
    g: &Gate,
    count: usize,
    out: &mut Parts,
    deal: impl FnOnce(
        &mut [&mut [u8]; MAX_KEYS],
        &mut [&mut [u8]; MAX_KEYS],
        &mut [u64],
    ) -> Result<u64, suffuse_core::Error>,
) -> Result<(), suffuse_core::Error> {
    let mut k0 = key_buffers(g, count);
    let mut explicit = vec![0u64; count * g.explicit_words()];
    let dealt = deal(&mut as_mut(&mut k0), &mut no_keys(), &mut explicit);
    let used = g.compiled.key_count;
    let len = |k| g.key_params(k).key_len();
    append_dealt(out, dealt.is_ok(), (&mut k0, used, len), &mut explicit);
    dealt.map(|_| ())
}

/// What a deal left, handed on: if it succeeded, the bodies of the first
/// `used` key slots (of `len(k)` bytes a key) once for both parties
/// ([`append_bodies`]), then P1's explicit words; on every path the keys
/// and the words are wiped.
fn append_dealt(
    out: &mut Parts,
    ok: bool,
    (keys, used, len): (&mut [Vec<u8>; MAX_KEYS], usize, impl Fn(usize) -> usize),
    explicit: &mut Vec<u64>,
) {
    if ok {
        append_bodies(out, &mut keys[..used], len);
        put_words(&mut out.each()[1], explicit);
    }
    for k in keys {
        crate::wipe::vec(k);
    }
    crate::wipe::vec(explicit);
}

/// Dealing scratch sized by the backend: groups of its preferred batch
/// (at most the elements dealt), with PRF room for a whole group.
pub(super) struct DealBuffers {
    blocks: Vec<Block>,
    words: Vec<u64>,
}

impl DealBuffers {
    /// For `count` elements, `blocks(group)` scratch blocks (the step's
    /// `deal_scratch_blocks` at that group size).
    pub(super) fn new(
        fss: &dyn BatchEval,
        count: usize,
        blocks: impl FnOnce(usize) -> usize,
    ) -> Self {
        let group = fss.preferred_batch().clamp(1, count.max(1));
        DealBuffers {
            blocks: vec![Block::ZERO; blocks(group)],
            words: vec![0; DealScratch::words(group)],
        }
    }

    pub(super) fn scratch(&mut self) -> DealScratch<'_> {
        DealScratch::new(&mut self.blocks, &mut self.words)
    }
}

/// A party's material for `count` elements: each key width's roots,
/// re-derived from the section's seed, and its bodies, left where the
/// section was read (no copy). The roots and P1's words are wiped on drop;
/// the bodies are the section's, wiped with it.
#[derive(Default)]
pub(super) struct Material<'s> {
    roots: [Vec<u8>; MAX_KEYS],
    bodies: [&'s [u8]; MAX_KEYS],
    pub(super) explicit: Vec<u64>,
}

impl Drop for Material<'_> {
    fn drop(&mut self) {
        for r in &mut self.roots {
            crate::wipe::vec(r);
        }
        crate::wipe::vec(&mut self.explicit);
    }
}

impl<'s> Material<'s> {
    /// Material with no DCF keys: P1's explicit words only.
    pub(super) fn words(explicit: Vec<u64>) -> Self {
        let mut mat = Material::default();
        mat.explicit = explicit;
        mat
    }

    pub(super) fn party_keys(&self) -> PartyKeys<'_> {
        PartyKeys {
            dcf: self.bodies,
            roots: std::array::from_fn(|k| self.roots[k].as_slice()),
            explicit: &self.explicit,
        }
    }
}

/// Reads `count` elements' material, re-deriving the DCF roots from `seed`
/// at element offset `first`.
pub(super) fn load_material<'s>(
    g: &Gate,
    h: &dyn Hasher,
    party: Party,
    seed: &[u8; 16],
    first: u64,
    count: usize,
    cur: &mut Cursor<'s>,
) -> Result<Material<'s>, ProtoError> {
    let mut mat = Material::default();
    for k in 0..g.compiled.key_count {
        mat.bodies[k] = cur.take(count * g.key_params(k).body_len())?;
        mat.roots[k] = vec![0u8; count * 16];
    }
    if count > 0 {
        g.derive_roots(h, party, seed, first, &mut as_mut(&mut mat.roots))
            .map_err(core(cur.step))?;
    }
    if party == Party::P1 {
        mat.explicit = get_words(cur.take(words_bytes(count * g.explicit_words()))?);
    }
    Ok(mat)
}

/// What a one-round gate's material holds per element: `keys`
/// ring-output keys alike, P1's `explicit` words, and the `random` fresh
/// dealer words its keys draw.
#[derive(Clone, Copy)]
pub(super) struct RingShape {
    pub(super) params: Params,
    pub(super) keys: usize,
    pub(super) explicit: usize,
    pub(super) random: usize,
}

impl RingShape {
    /// A one-round truncation's.
    pub(super) fn trunc(t: &RingTrunc) -> Self {
        RingShape {
            params: t.key_params(),
            keys: 1,
            explicit: t.explicit_words(),
            random: t.random_words(),
        }
    }

    /// A one-round SUF's.
    pub(super) fn suf(g: &RingSuf) -> Self {
        RingShape {
            params: g.key_params(),
            keys: g.key_count(),
            explicit: g.explicit_words(),
            random: g.random_words(),
        }
    }

    /// A one-round lookup's.
    pub(super) fn lut(g: &RingLut) -> Self {
        RingShape {
            params: g.key_params(),
            keys: 1,
            explicit: g.explicit_words(),
            random: g.random_words(),
        }
    }

    /// A truncation that opens its output (two rounds, the same layout:
    /// its carry keys, P1's words, no fresh words).
    pub(super) fn trunc_open(t: &TruncOpen) -> Self {
        RingShape {
            params: t.key_params(),
            keys: 1,
            explicit: t.explicit_words(),
            random: 0,
        }
    }

    /// A LayerNorm's centring and sum of squares (per row).
    pub(super) fn centre_square(g: &CentreSquare) -> Self {
        RingShape {
            params: g.key_params(),
            keys: g.key_count(),
            explicit: g.explicit_words(),
            random: g.random_words(),
        }
    }

    /// A one-round ReLU's.
    pub(super) fn relu(r: &RingRelu) -> Self {
        RingShape {
            params: r.key_params(),
            keys: r.key_count(),
            explicit: 0,
            random: r.random_words(),
        }
    }

    /// Section bytes of `count` elements: every key's bodies, then P1's
    /// explicit words.
    pub(super) fn bytes(&self, count: usize, party: Party) -> usize {
        let ex = if party == Party::P1 {
            words_bytes(count * self.explicit)
        } else {
            0
        };
        self.keys * count * self.params.body_len() + ex
    }
}

/// Deals `count` elements of a one-round gate with `deal` (which fills
/// P0's whole keys, key by key, given empty P1 key slots, and P1's
/// explicit words from the fresh words it is given) and appends both
/// parties' section bytes. The fresh words come from the operating
/// system: a ring-output key's value corrections must not be predictable
/// from either party's seed.
pub(super) fn deal_ring_material(
    shape: RingShape,
    (step, count): (u32, usize),
    out: &mut Parts,
    deal: impl FnOnce(
        &mut [&mut [u8]; MAX_KEYS],
        &mut [&mut [u8]; MAX_KEYS],
        &mut [u64],
        &[u64],
    ) -> Result<u64, suffuse_core::Error>,
) -> Result<(), DealError> {
    let len = shape.params.key_len();
    let mut keys: [Vec<u8>; MAX_KEYS] =
        std::array::from_fn(|k| vec![0u8; if k < shape.keys { count * len } else { 0 }]);
    let mut explicit = vec![0u64; count * shape.explicit];
    let mut bytes = vec![0u8; 8 * count * shape.random];
    getrandom::fill(&mut bytes).map_err(|e| DealError::Random {
        step,
        error: e.to_string(),
    })?;
    let mut random: Vec<u64> = bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
        .collect();
    crate::wipe::vec(&mut bytes);
    let dealt = deal(
        &mut as_mut(&mut keys),
        &mut no_keys(),
        &mut explicit,
        &random,
    );
    crate::wipe::vec(&mut random);
    append_dealt(
        out,
        dealt.is_ok(),
        (&mut keys, shape.keys, |_| len),
        &mut explicit,
    );
    dealt.map(|_| ()).map_err(deal_core(step))
}

/// Every chunk's material ([`chunks`] of `n` elements) of a one-round gate
/// of `shape`, in section order; `derive(first, roots)` writes a chunk's
/// key roots (re-derived from the section's seed).
pub(super) fn load_chunks<'s>(
    shape: RingShape,
    (n, party): (usize, Party),
    cur: &mut Cursor<'s>,
    derive: impl Fn(usize, &mut [Vec<u8>; MAX_KEYS]) -> Result<u64, suffuse_core::Error>,
) -> Result<Vec<Material<'s>>, ProtoError> {
    let mut mats = Vec::new();
    for (first, count) in chunks(n) {
        mats.push(load_ring_material(shape, party, count, cur, |roots| {
            derive(first, roots)
        })?);
    }
    cur.done()?;
    Ok(mats)
}

/// Section bytes of `n` elements of a one-round gate of `shape` dealt in
/// [`chunks`].
pub(super) fn chunks_bytes(shape: RingShape, n: usize, party: Party) -> usize {
    chunks(n).map(|(_, c)| shape.bytes(c, party)).sum()
}

/// Reads `count` elements' material of a one-round gate; `derive` writes
/// every key's roots (re-derived from the section's seed).
pub(super) fn load_ring_material<'s>(
    shape: RingShape,
    party: Party,
    count: usize,
    cur: &mut Cursor<'s>,
    derive: impl FnOnce(&mut [Vec<u8>; MAX_KEYS]) -> Result<u64, suffuse_core::Error>,
) -> Result<Material<'s>, ProtoError> {
    let mut mat = Material::default();
    for k in 0..shape.keys {
        mat.bodies[k] = cur.take(count * shape.params.body_len())?;
        mat.roots[k] = vec![0u8; count * 16];
    }
    derive(&mut mat.roots).map_err(core(cur.step))?;
    if party == Party::P1 {
        mat.explicit = get_words(cur.take(words_bytes(count * shape.explicit))?);
    }
    Ok(mat)
}

/// Deals `n` elements chunk by chunk ([`chunks`]) with `deal(first,
/// count, out)`, which appends both parties' section bytes of one chunk to
/// `out`: a window of chunks in parallel, emitted in order, so that memory
/// stays bounded.
pub(super) fn deal_chunks(
    n: usize,
    emit: &mut Emit<'_>,
    deal: impl Fn(usize, usize, &mut Parts) -> Result<(), DealError> + Sync,
) -> Result<(), DealError> {
    let list: Vec<(usize, usize)> = chunks(n).collect();
    for window in list.chunks(2 * rayon::current_num_threads().max(1)) {
        let parts: Vec<Result<Parts, DealError>> = window
            .par_iter()
            .map(|&(first, count)| {
                let mut out = Parts::default();
                deal(first, count, &mut out).map(|()| out)
            })
            .collect();
        for p in parts {
            p?.emit(emit)?;
        }
    }
    Ok(())
}

/// One evaluator per chunk of `n` elements (in [`chunks`] order), each on
/// its own `words(count)` words of `area` and its chunk's material.
pub(super) fn chunk_evals<'a, 's, E>(
    n: usize,
    mats: &'a [Material<'s>],
    mut area: &'a mut [u64],
    words: impl Fn(usize) -> usize,
    mut eval: impl FnMut((usize, usize), &'a Material<'s>, &'a mut [u64]) -> Result<E, ProtoError>,
) -> Result<Vec<E>, ProtoError> {
    let mut evals = Vec::with_capacity(mats.len());
    for (chunk, mat) in chunks(n).zip(mats) {
        let (mine, rest) = std::mem::take(&mut area).split_at_mut(words(chunk.1));
        area = rest;
        evals.push(eval(chunk, mat, mine)?);
    }
    Ok(evals)
}

/// `(first, count)` of each chunk of `n` elements.
pub(super) fn chunks(n: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n.div_ceil(CHUNK)).map(move |c| (c * CHUNK, CHUNK.min(n - c * CHUNK)))
}
