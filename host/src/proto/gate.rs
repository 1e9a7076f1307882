//! A scalar gate on every element of a tensor: dealt and run in chunks of
//! [`CHUNK`](super::CHUNK) elements, every chunk's message of a round in
//! one frame.

use rayon::prelude::*;
use suffuse_core::batch::BatchEval;
use suffuse_core::fss::Party;
use suffuse_core::gate::{Eval, Gate, Protocol, Round};
use suffuse_core::prg::Hasher;

use super::material::{
    DealBuffers, Material, chunks, deal_chunks, deal_material, gate_bytes, load_material,
};
use super::{At, Cursor, DealError, Emit, Online, ProtoError, Step, core, deal_core};
use crate::exec::{ExecError, Store};

/// `Kind::Gate`: the gate `g` on every element of tensor `x`.
pub(super) struct Scalar<'a> {
    pub(super) at: At<'a>,
    pub(super) g: &'a Gate,
    pub(super) x: usize,
}

impl Step for Scalar<'_> {
    fn body_len(&self, party: Party) -> usize {
        gate_bytes(self.g, self.at.plan.tensors[self.x].len(), party)
    }

    fn deal(
        &self,
        fss: &dyn BatchEval,
        seeds: [[u8; 16]; 2],
        _: &Store,
        emit: &mut Emit<'_>,
    ) -> Result<(), DealError> {
        let g = self.g;
        deal_chunks(
            self.at.plan.tensors[self.x].len(),
            emit,
            |first, count, out| {
                let mut buf = DealBuffers::new(fss, count, |m| g.deal_scratch_blocks(count, m));
                deal_material(g, count, out, |k0, k1, ex| {
                    let s = &mut buf.scratch();
                    g.deal(fss, seeds, None, first as u64, count, k0, k1, ex, s)
                })
                .map_err(deal_core(self.at.step))
            },
        )
    }

    fn run(
        &self,
        on: &mut Online<'_>,
        seed: &[u8; 16],
        cur: &mut Cursor<'_>,
        store: &Store,
    ) -> Result<Vec<u64>, ProtoError> {
        let input = store.get(self.at.plan, self.x)?;
        run_gate(self.g, self.at.step, on, seed, cur, input)
    }

    fn reference(&self, store: &Store, _: &dyn BatchEval) -> Result<Vec<u64>, ExecError> {
        Ok(store
            .get(self.at.plan, self.x)?
            .par_iter()
            .map(|v| {
                let mut o = [0u64; 2];
                self.g.reference(*v, &mut o);
                o[0]
            })
            .collect())
    }
}

/// One chunk of a scalar gate: its material and its part of the area.
struct GateChunk<'s, 'w> {
    first: usize,
    count: usize,
    mat: Material<'s>,
    scratch: &'w mut [u64],
}

/// A chunk's first element, element count and evaluation.
type Chunk<'a> = (usize, usize, Eval<'a>);

/// Per-phase times of a gate step, printed when `SUFFUSE_TRACE` is set.
struct Trace {
    on: bool,
    t0: std::time::Instant,
    marks: Vec<(&'static str, f64)>,
}

impl Trace {
    fn start() -> Self {
        Trace {
            on: std::env::var_os("SUFFUSE_TRACE").is_some(),
            t0: std::time::Instant::now(),
            marks: Vec::new(),
        }
    }

    fn mark(&mut self, name: &'static str) {
        self.marks.push((name, self.t0.elapsed().as_secs_f64()));
    }

    fn print(&self, party: Party, step: u32, n: usize) {
        if !self.on {
            return;
        }
        let mut last = 0.0;
        let line: Vec<String> = (self.marks.iter())
            .map(|(name, t)| {
                let d = t - last;
                last = *t;
                format!("{name} {:.1}", d * 1e3)
            })
            .collect();
        eprintln!(
            "P{} step {step} gate ×{n}: {}",
            party.index(),
            line.join(", ")
        );
    }
}

fn run_gate(
    g: &Gate,
    step: u32,
    on: &mut Online<'_>,
    seed: &[u8; 16],
    cur: &mut Cursor<'_>,
    input: &[u64],
) -> Result<Vec<u64>, ProtoError> {
    let words: Vec<usize> = chunks(input.len())
        .map(|(_, count)| g.scratch_words(count))
        .collect();
    on.with_area(words.iter().sum(), |on, area| {
        let mut trace = Trace::start();
        let areas = split_mut(area, &words);
        let mut states = load_chunks(g, on, seed, cur, input.len(), areas)?;
        trace.mark("load");
        let mut evals = seed_chunks(g, on, seed, step, input, &mut states)?;
        trace.mark("seeded");
        for i in 0..g.schedule().1 {
            round(&mut evals, i, on, step)?;
            trace.mark("finish");
        }
        let y = outputs(g, &evals, input.len()).map_err(core(step))?;
        trace.mark("outputs");
        trace.print(on.party, step, input.len());
        Ok(y)
    })
}

/// Each chunk's evaluator, its seeded material unpacked into its part of
/// the area.
fn seed_chunks<'c>(
    g: &'c Gate,
    on: &Online<'_>,
    seed: &[u8; 16],
    step: u32,
    input: &[u64],
    states: &'c mut [GateChunk<'_, '_>],
) -> Result<Vec<Chunk<'c>>, ProtoError> {
    let h: &(dyn Hasher + Sync) = on.fss;
    let party = on.party;
    states
        .par_iter_mut()
        .map(|s| {
            let range = s.first..s.first + s.count;
            let keys = s.mat.party_keys();
            let ev = Eval::new(
                g,
                h,
                party,
                seed,
                None,
                s.first as u64,
                s.count,
                keys,
                &input[range],
                s.scratch,
            )?;
            Ok((s.first, s.count, ev))
        })
        .collect::<Result<_, suffuse_core::Error>>()
        .map_err(core(step))
}

/// Slices the section per chunk, then rebuilds the chunks' keys in
/// parallel; `areas` holds each chunk's part of the evaluator area, in
/// the order of `chunks(n)`.
fn load_chunks<'s, 'w>(
    g: &Gate,
    on: &Online<'_>,
    seed: &[u8; 16],
    cur: &mut Cursor<'s>,
    n: usize,
    areas: Vec<&'w mut [u64]>,
) -> Result<Vec<GateChunk<'s, 'w>>, ProtoError> {
    let (party, step) = (on.party, cur.step);
    let h: &(dyn Hasher + Sync) = on.fss;
    let mut slices = Vec::new();
    for ((first, count), scratch) in chunks(n).zip(areas) {
        slices.push((
            first,
            count,
            cur.take(gate_bytes(g, count, party))?,
            scratch,
        ));
    }
    cur.done()?;
    slices
        .into_par_iter()
        .map(|(first, count, bytes, scratch)| {
            let mut c = Cursor { bytes, step };
            let mat = load_material(g, h, party, seed, first as u64, count, &mut c)?;
            Ok(GateChunk {
                first,
                count,
                mat,
                scratch,
            })
        })
        .collect()
}

/// Round `i` of every chunk: their messages in one frame, each chunk's
/// part of the answer back to it.
fn round(
    evals: &mut [Chunk<'_>],
    i: usize,
    on: &mut Online<'_>,
    step: u32,
) -> Result<(), ProtoError> {
    let lens: Vec<usize> = evals.iter().map(|(_, _, e)| e.send_len(i)).collect();
    let mut send = vec![0u8; lens.iter().sum()];
    let parts = split_mut(&mut send, &lens);
    (evals.par_iter_mut().zip(parts))
        .try_for_each(|((_, _, ev), buf)| ev.prepare(i, buf))
        .map_err(core(step))?;
    let recv = on.exchange(step, &send)?;
    let parts = lens.iter().scan(recv.as_slice(), |rest, l| {
        let (a, b) = rest.split_at(*l);
        *rest = b;
        Some(a)
    });
    let parts: Vec<&[u8]> = parts.collect();
    let fss = on.fss;
    let opening = evals
        .first()
        .is_some_and(|(_, _, ev)| ev.gate().schedule().0[i] == Round::Open);
    if opening && fss.gathers() {
        return open_gathered(evals, i, &parts, fss).map_err(core(step));
    }
    (evals.par_iter_mut().zip(parts))
        .try_for_each(|((_, _, ev), buf)| ev.finish(i, buf, fss))
        .map_err(core(step))
}

/// The opening round of every chunk with one backend call per key slot
/// for the whole step ([`BatchEval::eval_many`]), for backends that want
/// whole steps per launch: each chunk adds the peer's share and writes its
/// points, the backend evaluates every chunk's keys of a slot at once, and
/// each chunk forms its base nodes and carries on.
fn open_gathered(
    evals: &mut [Chunk<'_>],
    i: usize,
    parts: &[&[u8]],
    fss: &dyn BatchEval,
) -> Result<(), suffuse_core::Error> {
    (evals.par_iter_mut().zip(parts)).try_for_each(|((_, _, ev), buf)| ev.open_deferred(i, buf))?;
    for k in 0.. {
        let mut jobs = Vec::with_capacity(evals.len());
        for (_, _, ev) in evals.iter_mut() {
            if let Some(job) = ev.fss_job(k)? {
                jobs.push(job);
            }
        }
        if jobs.is_empty() {
            break;
        }
        fss.eval_many(&mut jobs)?;
    }
    evals
        .par_iter_mut()
        .try_for_each(|(_, _, ev)| ev.fss_done(fss))
}

/// `buf` cut into consecutive parts of `lens` elements.
fn split_mut<'b, T>(buf: &'b mut [T], lens: &[usize]) -> Vec<&'b mut [T]> {
    let mut parts = Vec::with_capacity(lens.len());
    let mut rest = buf;
    for l in lens {
        let (a, b) = rest.split_at_mut(*l);
        parts.push(a);
        rest = b;
    }
    parts
}

/// The first ring output of each element, chunks in place.
fn outputs(g: &Gate, evals: &[Chunk<'_>], n: usize) -> Result<Vec<u64>, suffuse_core::Error> {
    let (outs, bits) = (g.outputs(), g.bit_outputs());
    let parts: Vec<(usize, Vec<u64>)> = evals
        .par_iter()
        .map(|(first, count, ev)| {
            let mut arith = vec![0u64; count * outs];
            let mut b = vec![0u64; count * bits];
            ev.outputs(&mut arith, &mut b)?;
            Ok((*first, arith.iter().step_by(outs.max(1)).copied().collect()))
        })
        .collect::<Result<_, suffuse_core::Error>>()?;
    let mut y = vec![0u64; n];
    for (first, v) in parts {
        y[first..first + v.len()].copy_from_slice(&v);
    }
    Ok(y)
}
