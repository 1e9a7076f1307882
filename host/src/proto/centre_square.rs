//! `Kind::CentreSquare`: a LayerNorm's centring and sum of squares in one
//! round (core's `CentreSquare`): the rows `out = x − μ`, `μ` the mean's
//! gap truncation, and `sums = Σout²` per row. Dealt and run in chunks of
//! [`CHUNK`](super::CHUNK) rows; the step's output is the centred rows,
//! then the sums.
//!
//! Section (per chunk): the carry key's four bodies per row (their roots
//! re-derived from the seed), then P1's seven words per row.
//!
//! Security: core's `centre_square` module. The mean's input is opened
//! under a fresh mask ρ and each value under its own fresh mask `A_i`, as
//! the mean's truncation and a Beaver square would open them.

use suffuse_core::batch::BatchEval;
use suffuse_core::fss::Party;
use suffuse_core::gate::centre_square::CentreSquare;
use suffuse_core::prg::Hasher;

use super::material::{
    Material, RingShape, chunk_evals, chunks, chunks_bytes, deal_chunks, deal_ring_material,
    load_chunks,
};
use super::{At, Cursor, DealError, Emit, Online, ProtoError, Step, core};
use crate::exec::{ExecError, Store};

/// `Kind::CentreSquare` of the rows `x`.
pub(super) struct Centre<'a> {
    pub(super) at: At<'a>,
    pub(super) g: &'a CentreSquare,
    pub(super) x: usize,
}

impl Centre<'_> {
    fn rows(&self) -> usize {
        self.at.plan.tensors[self.x].rows
    }

    fn shape(&self) -> RingShape {
        RingShape::centre_square(self.g)
    }

    /// Each chunk's material, in section order.
    fn load<'s>(
        &self,
        h: &(dyn Hasher + Sync),
        party: Party,
        seed: &[u8; 16],
        cur: &mut Cursor<'s>,
    ) -> Result<Vec<Material<'s>>, ProtoError> {
        load_chunks(self.shape(), (self.rows(), party), cur, |first, roots| {
            let mut roots = roots.each_mut().map(|r| &mut r[..]);
            self.g
                .derive_roots(h, party, seed, first as u64, &mut roots)
        })
    }
}

impl Step for Centre<'_> {
    fn body_len(&self, party: Party) -> usize {
        chunks_bytes(self.shape(), self.rows(), party)
    }

    fn deal(
        &self,
        fss: &dyn BatchEval,
        seeds: [[u8; 16]; 2],
        _: &Store,
        emit: &mut Emit<'_>,
    ) -> Result<(), DealError> {
        let (shape, step) = (self.shape(), self.at.step);
        let keys = shape.keys;
        deal_chunks(self.rows(), emit, |first, count, out| {
            deal_ring_material(shape, (step, count), out, |k0, k1, ex, random| {
                let at = (first as u64, count);
                let (k0, k1) = (&mut k0[..keys], &mut k1[..keys]);
                self.g.deal(fss, (seeds, None), random, at, k0, k1, ex)
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
        let (rows, d) = (self.rows(), self.g.row_len());
        let (step, party) = (self.at.step, on.party);
        let h: &(dyn Hasher + Sync) = on.fss;
        let mats = self.load(h, party, seed, cur)?;
        let x = store.get(self.at.plan, self.x)?;
        on.with_area(self.g.scratch_words(rows), |on, area| {
            let words = |count| self.g.scratch_words(count);
            let mut evals = chunk_evals(rows, &mats, area, words, |(first, count), mat, mine| {
                let r = &x[first * d..(first + count) * d];
                let ev = self
                    .g
                    .eval(h, (party, seed), first as u64, mat.party_keys(), r, mine);
                ev.map_err(core(step))
            })?;
            on.drive_all(step, &mut evals)?;
            let mut out = vec![0u64; rows * d + rows];
            let (ys, sums) = out.split_at_mut(rows * d);
            for ((first, count), ev) in chunks(rows).zip(&evals) {
                let (y, v) = (
                    &mut ys[first * d..(first + count) * d],
                    &mut sums[first..first + count],
                );
                ev.outputs(y, v).map_err(core(step))?;
            }
            Ok(out)
        })
    }

    fn reference(&self, store: &Store, _: &dyn BatchEval) -> Result<Vec<u64>, ExecError> {
        let (rows, d) = (self.rows(), self.g.row_len());
        let x = store.get(self.at.plan, self.x)?;
        let mut out = vec![0u64; rows * d + rows];
        let (ys, sums) = out.split_at_mut(rows * d);
        for ((r, y), v) in x.chunks_exact(d).zip(ys.chunks_exact_mut(d)).zip(sums) {
            *v = self.g.reference(r, y);
        }
        Ok(out)
    }
}
