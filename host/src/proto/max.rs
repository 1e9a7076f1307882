//! Row maxima by a tree of ReLUs of differences: one level's ReLU material
//! after another in the section.

use suffuse_core::batch::BatchEval;
use suffuse_core::fss::Party;
use suffuse_core::gate::chain::step_seed;
use suffuse_core::gate::max::{MAX_LEVELS, MaxEval, MaxTree};
use suffuse_core::gate::{DealScratch, PartyKeys};
use suffuse_core::prg::Hasher;

use super::material::{
    DealBuffers, Parts, RingShape, deal_material, deal_ring_material, gate_bytes, load_material,
    load_ring_material,
};
use super::{At, Cursor, DealError, Emit, Online, ProtoError, Step, core, deal_core};
use crate::exec::{ExecError, Store};

/// `Kind::Max`: the tree `t` over every row of tensor `x`.
pub(super) struct RowMax<'a> {
    pub(super) at: At<'a>,
    pub(super) t: &'a MaxTree,
    pub(super) x: usize,
}

impl RowMax<'_> {
    fn rows(&self) -> usize {
        self.at.plan.tensors[self.x].rows
    }
}

impl Step for RowMax<'_> {
    fn body_len(&self, party: Party) -> usize {
        let (tree, rows) = (self.t, self.rows());
        (0..tree.levels())
            .map(|l| match tree.one_round(l) {
                true => RingShape::relu(&tree.ring).bytes(tree.count(rows, l), party),
                false => gate_bytes(&tree.relu, tree.count(rows, l), party),
            })
            .sum()
    }

    fn deal(
        &self,
        fss: &dyn BatchEval,
        seeds: [[u8; 16]; 2],
        _: &Store,
        emit: &mut Emit<'_>,
    ) -> Result<(), DealError> {
        let (tree, rows) = (self.t, self.rows());
        let mut buf = DealBuffers::new(fss, tree.count(rows, 0), |m| {
            tree.deal_scratch_blocks(rows, m)
        });
        for level in 0..tree.levels() {
            let mut out = Parts::default();
            let count = tree.count(rows, level);
            if tree.one_round(level) {
                let shape = RingShape::relu(&tree.ring);
                deal_ring_material(
                    shape,
                    (self.at.step, count),
                    &mut out,
                    |k0, k1, ex, rand| {
                        let scratch = &mut DealScratch::new(&mut [], &mut []);
                        tree.deal_level(level, rows, fss, seeds, k0, k1, ex, rand, scratch)
                    },
                )?;
            } else {
                deal_material(&tree.relu, count, &mut out, |k0, k1, ex| {
                    tree.deal_level(level, rows, fss, seeds, k0, k1, ex, &[], &mut buf.scratch())
                })
                .map_err(deal_core(self.at.step))?;
            }
            out.emit(emit)?;
        }
        Ok(())
    }

    fn run(
        &self,
        on: &mut Online<'_>,
        seed: &[u8; 16],
        cur: &mut Cursor<'_>,
        store: &Store,
    ) -> Result<Vec<u64>, ProtoError> {
        let (tree, rows, step) = (self.t, self.rows(), self.at.step);
        let h: &(dyn Hasher + Sync) = on.fss;
        let mut mats = Vec::with_capacity(tree.levels());
        for level in 0..tree.levels() {
            let ls = step_seed(h, seed, level);
            let count = tree.count(rows, level);
            let party = on.party;
            mats.push(if tree.one_round(level) {
                load_ring_material(RingShape::relu(&tree.ring), party, count, cur, |roots| {
                    let [a, ..] = roots;
                    tree.ring.derive_roots(h, party, &ls, 0, [a])
                })?
            } else {
                load_material(&tree.relu, h, party, &ls, 0, count, cur)?
            });
        }
        cur.done()?;
        let mut keys = [PartyKeys::default(); MAX_LEVELS];
        for (k, m) in keys.iter_mut().zip(&mats) {
            *k = m.party_keys();
        }
        let values = store.get(self.at.plan, self.x)?;
        on.with_area(tree.scratch_words(rows), |on, area| {
            let mut ev = MaxEval::new(tree, h, on.party, *seed, rows, values, keys, area)
                .map_err(core(step))?;
            on.drive(step, &mut ev)
        })
    }

    /// Inside the proven width every ReLU of a difference is exact, so the
    /// tree computes the true maximum of each row's values (a causal row's
    /// first `MaxTree::row_len`).
    fn reference(&self, store: &Store, _: &dyn BatchEval) -> Result<Vec<u64>, ExecError> {
        let cols = self.at.plan.tensors[self.x].cols;
        Ok(store
            .get(self.at.plan, self.x)?
            .chunks(cols.max(1))
            .enumerate()
            .map(|(r, row)| {
                let own = &row[..self.t.row_len(r).min(row.len())];
                own.iter().map(|v| *v as i64).max().unwrap_or(0) as u64
            })
            .collect())
    }
}
