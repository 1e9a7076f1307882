//! `Kind::TruncSquare`: a residual `x = add + ⌊y/2^f⌋` (or the truncation
//! `x = ⌊y/2^f⌋` alone, where there is no addend) whose truncation also
//! opens `x` under a fresh mask, so that each party gets its shares of
//! `x` and of `x²` in the truncation's two rounds (core's `TruncOpen`,
//! squared form). Dealt and run in chunks of [`CHUNK`](super::CHUNK)
//! elements like a scalar gate; the step's output is `x`'s shares, then
//! `x²`'s.
//!
//! Section (per chunk): the carry keys' bodies (their roots re-derived
//! from the seed), then P1's five words per element (`⌊r/2^f⌋`, `MSB(r)`
//! and ρ, as the gap truncation's, and `A²`, `2AD + D²`).
//!
//! Security: core's `trunc_open` module. Every message is masked by fresh
//! dealer randomness (`r`, ρ, `A`, `D`), each used for this one value;
//! `E = x − A_e` is public, like a Beaver opening of `x`, and `A_e` covers
//! nothing else.

use std::borrow::Cow;

use rayon::prelude::*;
use suffuse_core::batch::BatchEval;
use suffuse_core::fss::Party;
use suffuse_core::gate::trunc_open::{TruncOpen, TruncOpenEval};
use suffuse_core::gate::{Protocol, SingleKey};
use suffuse_core::prg::Hasher;

use super::material::{
    Material, RingShape, chunk_evals, chunks, chunks_bytes, deal_chunks, deal_ring_material,
    load_chunks,
};
use super::{At, Cursor, DealError, Emit, Online, ProtoError, Step, core};
use crate::exec::{ExecError, Store};

/// `Kind::TruncSquare` of input `x` and addend `add`, if any.
pub(super) struct TruncSquare<'a> {
    pub(super) at: At<'a>,
    pub(super) g: &'a TruncOpen,
    pub(super) x: usize,
    pub(super) add: Option<usize>,
}

impl TruncSquare<'_> {
    fn n(&self) -> usize {
        self.at.plan.tensors[self.x].len()
    }

    /// The input and the addend's shares (zeros where there is none: a
    /// share of 0 for each party).
    fn inputs<'s>(&self, store: &'s Store) -> Result<(&'s [u64], Cow<'s, [u64]>), ExecError> {
        let y = store.get(self.at.plan, self.x)?;
        let z = match self.add {
            Some(a) => Cow::Borrowed(store.get(self.at.plan, a)?),
            None => Cow::Owned(vec![0; y.len()]),
        };
        Ok((y, z))
    }

    fn shape(&self) -> RingShape {
        RingShape::trunc_open(self.g)
    }

    /// Each chunk's material, in section order.
    fn load<'s>(
        &self,
        h: &(dyn Hasher + Sync),
        party: Party,
        seed: &[u8; 16],
        cur: &mut Cursor<'s>,
    ) -> Result<Vec<Material<'s>>, ProtoError> {
        load_chunks(self.shape(), (self.n(), party), cur, |first, roots| {
            self.g
                .derive_roots(h, party, seed, first as u64, &mut roots[0])
        })
    }
}

impl Step for TruncSquare<'_> {
    fn body_len(&self, party: Party) -> usize {
        chunks_bytes(self.shape(), self.n(), party)
    }

    fn deal(
        &self,
        fss: &dyn BatchEval,
        seeds: [[u8; 16]; 2],
        _: &Store,
        emit: &mut Emit<'_>,
    ) -> Result<(), DealError> {
        let (shape, step) = (self.shape(), self.at.step);
        deal_chunks(self.n(), emit, |first, count, out| {
            deal_ring_material(shape, (step, count), out, |k0, k1, ex, _| {
                self.g
                    .deal(fss, seeds, None, first as u64, count, k0[0], k1[0], ex)
            })
        })
    }

    fn run(
        &self,
        on: &mut Online<'_>,
        seed: &[u8; 16],
        cur: &mut Cursor<'_>,
        store: &Store,
    ) -> Result<Vec<u64>, ProtoError> {
        let (n, step, party) = (self.n(), self.at.step, on.party);
        let h: &(dyn Hasher + Sync) = on.fss;
        let mats = self.load(h, party, seed, cur)?;
        let (y, z) = self.inputs(store)?;
        on.with_area(TruncOpen::scratch_words(n), |on, area| {
            let words = TruncOpen::scratch_words;
            let mut evals = chunk_evals(n, &mats, area, words, |(first, count), mat, mine| {
                let range = first..first + count;
                let inputs = (&y[range.clone()], &z[range]);
                let keys = mat.party_keys();
                let ev = self
                    .g
                    .eval(h, party, seed, None, first as u64, keys, inputs, mine);
                ev.map_err(core(step))
            })?;
            on.drive_all(step, &mut evals)?;
            let mut out = vec![0u64; 2 * n];
            let (xs, squares) = out.split_at_mut(n);
            for ((first, count), ev) in chunks(n).zip(&evals) {
                let range = first..first + count;
                outputs(ev, &mut xs[range.clone()], &mut squares[range]).map_err(core(step))?;
            }
            Ok(out)
        })
    }

    fn reference(&self, store: &Store, _: &dyn BatchEval) -> Result<Vec<u64>, ExecError> {
        let (y, z) = self.inputs(store)?;
        let xs: Vec<u64> = (y.par_iter().zip(z.par_iter()))
            .map(|(y, z)| self.g.reference(*y, *z))
            .collect();
        let squares: Vec<u64> = xs.par_iter().map(|x| x.wrapping_mul(*x)).collect();
        Ok([xs, squares].concat())
    }
}

/// A finished chunk's shares of `x` and of `x²`.
fn outputs(
    ev: &TruncOpenEval<'_>,
    xs: &mut [u64],
    squares: &mut [u64],
) -> Result<(), suffuse_core::Error> {
    ev.output(xs)?;
    ev.square_shares(squares)
}
