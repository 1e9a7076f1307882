//! A chain on every element (a reciprocal or rsqrt, or a one-round
//! truncation of a per-row scalar): its gate steps' material one after
//! another in the section (a one-round step's ring-output keys, then P1's
//! words), its multiplications' Beaver words for P1.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use rayon::prelude::*;
use suffuse_core::batch::BatchEval;
use suffuse_core::compile::MAX_KEYS;
use suffuse_core::fss::Party;
use suffuse_core::gate::chain::{Chain, ChainEval, MAX_STEPS, Step as ChainStep, step_seed};
use suffuse_core::gate::ring_lut::RingLut;
use suffuse_core::gate::{DealScratch, PartyKeys, SingleKey};
use suffuse_core::prg::Hasher;

use super::material::{
    DealBuffers, Material, Parts, RingShape, deal_material, deal_ring_material, gate_bytes,
    load_material, load_ring_material, words_bytes,
};
use super::{At, Cursor, DealError, Emit, Online, ProtoError, Step, core, deal_core};
use crate::exec::{ExecError, Store};
use crate::net::{get_words, put_words};

/// Lookup tables by gate: public, the same for every query, built once per
/// process (a few hundred KB each, a handful per model).
fn table(g: &RingLut) -> Result<Arc<Vec<u64>>, suffuse_core::Error> {
    static TABLES: OnceLock<Mutex<HashMap<RingLut, Arc<Vec<u64>>>>> = OnceLock::new();
    let cache = TABLES.get_or_init(Mutex::default);
    if let Some(t) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(g) {
        return Ok(t.clone());
    }
    let mut t = vec![0u64; g.table_words()];
    g.fill_table(&mut t)?;
    let t = Arc::new(t);
    let mut map = cache.lock().unwrap_or_else(|e| e.into_inner());
    Ok(map.entry(*g).or_insert(t).clone())
}

/// `Kind::Chain`: the chain `c` on every element of tensor `x`.
pub(super) struct RowChain<'a> {
    pub(super) at: At<'a>,
    pub(super) c: &'a Chain,
    pub(super) x: usize,
}

impl RowChain<'_> {
    fn n(&self) -> usize {
        self.at.plan.tensors[self.x].len()
    }

    fn step_bytes(&self, s: usize, party: Party) -> usize {
        match &self.c.steps[s] {
            ChainStep::Gate { gate, .. } => gate_bytes(gate, self.n(), party),
            ChainStep::Trunc { gate, .. } => RingShape::trunc(gate).bytes(self.n(), party),
            ChainStep::Suf { gate, .. } => RingShape::suf(gate).bytes(self.n(), party),
            ChainStep::Lut { gate, .. } => RingShape::lut(gate).bytes(self.n(), party),
            ChainStep::Mul { .. } if party == Party::P1 => words_bytes(self.n()),
            ChainStep::Mul { .. } => 0,
        }
    }

    /// Deals one-round step `s` (ring-output keys of `shape`) and appends
    /// its material.
    fn deal_one_round(
        &self,
        fss: &dyn BatchEval,
        seeds: [[u8; 16]; 2],
        s: usize,
        shape: RingShape,
        out: &mut Parts,
    ) -> Result<(), DealError> {
        let n = self.n();
        deal_ring_material(shape, (self.at.step, n), out, |k0, k1, ex, random| {
            let scratch = &mut DealScratch::new(&mut [], &mut []);
            self.c
                .deal_step(s, fss, seeds, 0, n, k0, k1, ex, random, scratch)
        })
    }

    /// A party's material for every chain step, in section order.
    fn load<'s>(
        &self,
        h: &dyn Hasher,
        party: Party,
        seed: &[u8; 16],
        cur: &mut Cursor<'s>,
    ) -> Result<Vec<Material<'s>>, ProtoError> {
        let n = self.n();
        let mut mats = Vec::with_capacity(self.c.count);
        for s in 0..self.c.count {
            mats.push(match &self.c.steps[s] {
                ChainStep::Gate { gate, .. } => {
                    let ss = step_seed(h, seed, s);
                    load_material(gate, h, party, &ss, 0, n, cur)?
                }
                ChainStep::Trunc { gate, .. } => {
                    let ss = step_seed(h, seed, s);
                    load_ring_material(RingShape::trunc(gate), party, n, cur, |roots| {
                        gate.derive_roots(h, party, &ss, 0, &mut roots[0])
                    })?
                }
                ChainStep::Suf { gate, .. } => {
                    let ss = step_seed(h, seed, s);
                    load_ring_material(RingShape::suf(gate), party, n, cur, |roots| {
                        let mut roots = roots.each_mut().map(|r| &mut r[..]);
                        gate.derive_roots(h, party, &ss, 0, &mut roots)
                    })?
                }
                ChainStep::Lut { gate, .. } => {
                    let ss = step_seed(h, seed, s);
                    load_ring_material(RingShape::lut(gate), party, n, cur, |roots| {
                        gate.derive_roots(h, party, &ss, 0, &mut roots[0])
                    })?
                }
                ChainStep::Mul { .. } => Material::words(match party {
                    Party::P0 => Vec::new(),
                    Party::P1 => get_words(cur.take(words_bytes(n))?),
                }),
            });
        }
        cur.done()?;
        Ok(mats)
    }
}

impl Step for RowChain<'_> {
    fn body_len(&self, party: Party) -> usize {
        (0..self.c.count).map(|s| self.step_bytes(s, party)).sum()
    }

    fn deal(
        &self,
        fss: &dyn BatchEval,
        seeds: [[u8; 16]; 2],
        _: &Store,
        emit: &mut Emit<'_>,
    ) -> Result<(), DealError> {
        let (chain, n) = (self.c, self.n());
        let c = deal_core(self.at.step);
        let mut out = Parts::default();
        let mut buf = DealBuffers::new(fss, n, |m| chain.deal_scratch_blocks(n, m));
        for s in 0..chain.count {
            match &chain.steps[s] {
                ChainStep::Gate { gate, .. } => {
                    deal_material(gate, n, &mut out, |k0, k1, ex| {
                        chain.deal_step(s, fss, seeds, 0, n, k0, k1, ex, &[], &mut buf.scratch())
                    })
                    .map_err(&c)?;
                }
                ChainStep::Trunc { gate, .. } => {
                    self.deal_one_round(fss, seeds, s, RingShape::trunc(gate), &mut out)?;
                }
                ChainStep::Suf { gate, .. } => {
                    self.deal_one_round(fss, seeds, s, RingShape::suf(gate), &mut out)?;
                }
                ChainStep::Lut { gate, .. } => {
                    self.deal_one_round(fss, seeds, s, RingShape::lut(gate), &mut out)?;
                }
                ChainStep::Mul { .. } => {
                    let mut ex = vec![0u64; n];
                    let mut none0: [&mut [u8]; MAX_KEYS] = Default::default();
                    let mut none1: [&mut [u8]; MAX_KEYS] = Default::default();
                    chain
                        .deal_step(
                            s,
                            fss,
                            seeds,
                            0,
                            n,
                            &mut none0,
                            &mut none1,
                            &mut ex,
                            &[],
                            &mut DealScratch::new(&mut [], &mut []),
                        )
                        .map_err(&c)?;
                    put_words(&mut out.each()[1], &ex);
                }
            }
        }
        out.emit(emit)
    }

    fn run(
        &self,
        on: &mut Online<'_>,
        seed: &[u8; 16],
        cur: &mut Cursor<'_>,
        store: &Store,
    ) -> Result<Vec<u64>, ProtoError> {
        let (n, step) = (self.n(), self.at.step);
        let h: &(dyn Hasher + Sync) = on.fss;
        let mats = self.load(h, on.party, seed, cur)?;
        let mut keys = [PartyKeys::default(); MAX_STEPS];
        for (k, m) in keys.iter_mut().zip(&mats) {
            *k = m.party_keys();
        }
        let input = store.get(self.at.plan, self.x)?;
        let mut tables: [Arc<Vec<u64>>; MAX_STEPS] = Default::default();
        for (t, st) in tables.iter_mut().zip(&self.c.steps[..self.c.count]) {
            if let ChainStep::Lut { gate, .. } = st {
                *t = table(gate).map_err(core(step))?;
            }
        }
        let tables = std::array::from_fn(|s| &tables[s][..]);
        on.with_area(self.c.scratch_words(n), |on, area| {
            let mut ev = ChainEval::new(self.c, h, on.party, *seed, 0, n, keys, input, area)
                .map_err(core(step))?
                .with_tables(tables);
            on.drive(step, &mut ev)
        })
    }

    fn reference(&self, store: &Store, _: &dyn BatchEval) -> Result<Vec<u64>, ExecError> {
        Ok(store
            .get(self.at.plan, self.x)?
            .par_iter()
            .map(|v| self.c.reference(*v))
            .collect())
    }
}
