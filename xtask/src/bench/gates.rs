//! `cargo xtask bench gates`: every gate dealt and run by two parties on
//! this machine, 128×3072 elements each (the BERT-base FFN activation
//! shape) unless noted, the parties on two threads exchanging messages
//! through in-memory channels, each evaluating its DCF keys with a
//! one-thread `CpuEval`.
//!
//! Per gate it reports online elements/s (both parties' work, wall clock,
//! key loading excluded and reported separately), key bytes per element
//! (per party, P1 — the larger), AES calls per element (one party, online),
//! rounds, communication bits per element (one party), dealer key
//! generation elements/s (two threads), and the spec's accuracy.
//!
//! For GeLU it also runs the online phase with Φ evaluated by the
//! per-element interpreter instead of the compiled block program (the
//! `interpreter` feature of suffuse-core, which only this tool enables),
//! and times both Φ paths alone on the same state, all in the same run.

use std::sync::mpsc;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use serde::Serialize;
use suffuse_accel_cpu::CpuEval;
use suffuse_core::batch::BatchEval;
use suffuse_core::compile::MAX_KEYS;
use suffuse_core::fss::Party;
use suffuse_core::gate::activation::{self, GeluForm, NexpForm, SiluForm};
use suffuse_core::gate::chain::{Chain, ChainEval, Lin, MAX_STEPS, Source, Step};
use suffuse_core::gate::inverse::{Inverse, InverseScales, inverse, inverse_table};
use suffuse_core::gate::max::{MAX_LEVELS, MaxEval, MaxTree, ONE_ROUND_TAIL};
use suffuse_core::gate::relu::{drelu, relu};
use suffuse_core::gate::reluars::reluars;
use suffuse_core::gate::ring_trunc::RingTrunc;
use suffuse_core::gate::spline::Spline;
use suffuse_core::gate::splines;
use suffuse_core::gate::trunc::{Range, Shift, trunc};
use suffuse_core::gate::trunc_open::TruncOpen;
use suffuse_core::gate::width::extend;
use suffuse_core::gate::{Cost, DealScratch, Eval, Gate, PartyKeys, Protocol};
use suffuse_core::phi::program::Section;
use suffuse_core::prg::{Block, Hasher, Prg};
use suffuse_core::ring::{Width, pow2};

/// The activation shape: 128 tokens × 3072 (BERT-base intermediate size).
const ELEMENTS: usize = 128 * 3072;
/// Fraction bits everywhere.
const FRAC: u32 = 12;

/// One JSON record; the field names are read by other tools.
#[derive(Serialize)]
struct Record {
    gate: String,
    n: u32,
    f: u32,
    k: u32,
    elements: usize,
    online_elems_per_s: f64,
    key_bytes_per_elem: f64,
    key_bytes_per_elem_p0: f64,
    aes_per_elem: f64,
    rounds: usize,
    comm_bits_per_elem: f64,
    keygen_elems_per_s: f64,
    load_s: f64,
    max_abs_err: f64,
    max_rel_err: Option<f64>,
    out_scale: u32,
    note: String,
    /// Online elements/s with Φ run by the per-element interpreter.
    #[serde(skip_serializing_if = "Option::is_none")]
    interpreter_online_elems_per_s: Option<f64>,
    /// Seconds one party spends in Φ (Beaver section and outputs) for all
    /// elements, compiled program and interpreter, on the same state.
    #[serde(skip_serializing_if = "Option::is_none")]
    phi_s: Option<[f64; 2]>,
}

/// One timed two-party run of a protocol that is not a plain gate: the
/// slower party's online seconds, the dealing's seconds, one party's bytes.
struct Timed {
    online_s: f64,
    gen_s: f64,
    sent: usize,
}

impl Record {
    /// A record from a protocol's `cost()` and one timed run over
    /// `elements` elements.
    fn of_run(
        name: &str,
        (w, k, elements): (Width, u32, usize),
        cost: &Cost,
        t: Timed,
        (out_scale, max_rel_err): (u32, Option<f64>),
        note: &str,
    ) -> Record {
        Record {
            gate: name.to_string(),
            n: w.bits(),
            f: FRAC,
            k,
            elements,
            online_elems_per_s: elements as f64 / t.online_s,
            key_bytes_per_elem: cost.key_bytes_p1 as f64,
            key_bytes_per_elem_p0: cost.key_bytes_p0 as f64,
            aes_per_elem: cost.aes_online as f64,
            rounds: cost.rounds,
            comm_bits_per_elem: t.sent as f64 * 8.0 / elements as f64,
            keygen_elems_per_s: elements as f64 / t.gen_s,
            load_s: 0.0,
            max_abs_err: 0.0,
            max_rel_err,
            out_scale,
            note: note.to_string(),
            interpreter_online_elems_per_s: None,
            phi_s: None,
        }
    }
}

/// Gates whose Φ is also run by the interpreter, for comparison.
const COMPARE_INTERPRETER: &[&str] = &["gelu"];

/// Both parties' DCF keys and P1's explicit words for one gate.
struct Dealt {
    dcf: [Vec<Vec<u8>>; 2],
    explicit: Vec<u64>,
}

impl Dealt {
    /// Party `p`'s view of the material.
    fn keys(&self, p: usize) -> PartyKeys<'_> {
        let dcf = &self.dcf[p];
        let whole: Vec<&[u8]> = dcf.iter().map(Vec::as_slice).collect();
        PartyKeys::of(&whole, &[], if p == 1 { &self.explicit } else { &[] })
    }
}

fn key_buffers(gate: &Gate, n: usize) -> Vec<Vec<u8>> {
    (0..MAX_KEYS)
        .map(|k| {
            let len = if k < gate.compiled.key_count {
                gate.key_params(k).key_len()
            } else {
                0
            };
            vec![0u8; n * len]
        })
        .collect()
}

/// Deals `n` elements on two threads (each half with its element offset).
fn deal(gate: &Gate, h: &CpuEval, seeds: [[u8; 16]; 2], n: usize) -> Result<(Dealt, f64)> {
    let mut dcf0 = key_buffers(gate, n);
    let mut dcf1 = key_buffers(gate, n);
    let ew = gate.explicit_words();
    let mut explicit = vec![0u64; n * ew];
    let half = n / 2;
    let start = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let mut parts = Vec::new();
        let mut rest0: Vec<&mut [u8]> = dcf0.iter_mut().map(|v| v.as_mut_slice()).collect();
        let mut rest1: Vec<&mut [u8]> = dcf1.iter_mut().map(|v| v.as_mut_slice()).collect();
        let mut rest_e: &mut [u64] = &mut explicit;
        for (first, count) in [(0usize, half), (half, n - half)] {
            let mut a: Vec<&mut [u8]> = Vec::new();
            let mut b: Vec<&mut [u8]> = Vec::new();
            for k in 0..MAX_KEYS {
                let len = if k < gate.compiled.key_count {
                    gate.key_params(k).key_len()
                } else {
                    0
                };
                let (x, y) = std::mem::take(&mut rest0[k]).split_at_mut(count * len);
                rest0[k] = y;
                a.push(x);
                let (x, y) = std::mem::take(&mut rest1[k]).split_at_mut(count * len);
                rest1[k] = y;
                b.push(x);
            }
            let (e, r) = std::mem::take(&mut rest_e).split_at_mut(count * ew);
            rest_e = r;
            parts.push(s.spawn(move || -> Result<()> {
                let mut a: [&mut [u8]; MAX_KEYS] = a.try_into().map_err(|_| anyhow!("keys"))?;
                let mut b: [&mut [u8]; MAX_KEYS] = b.try_into().map_err(|_| anyhow!("keys"))?;
                let group = h.preferred_batch().clamp(1, count.max(1));
                let mut prf = vec![Block::ZERO; gate.deal_scratch_blocks(count, group)];
                let mut words = vec![0u64; DealScratch::words(group)];
                gate.deal(
                    h,
                    seeds,
                    None,
                    first as u64,
                    count,
                    &mut a,
                    &mut b,
                    e,
                    &mut DealScratch::new(&mut prf, &mut words),
                )
                .map_err(|e| anyhow!("deal: {e}"))?;
                Ok(())
            }));
        }
        for p in parts {
            p.join().map_err(|_| anyhow!("dealer thread panicked"))??;
        }
        Ok(())
    })?;
    let secs = start.elapsed().as_secs_f64();
    Ok((
        Dealt {
            dcf: [dcf0, dcf1],
            explicit,
        },
        secs,
    ))
}

/// A two-party run's figures.
struct Online {
    outputs: Vec<u64>,
    online_s: f64,
    load_s: f64,
    aes_per_elem: f64,
    bytes_per_party: usize,
    /// P0's Φ seconds: compiled, interpreted.
    phi_s: [f64; 2],
}

/// One party's side of a two-party run.
struct PartyRun {
    arith: Vec<u64>,
    online: f64,
    load_s: f64,
    aes: u64,
    sent: usize,
    phi_s: [f64; 2],
}

/// How Φ runs in a two-party run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum PhiPath {
    Compiled,
    Interpreted,
}

/// Both parties of one gate on two threads.
fn run_gate(
    gate: &Gate,
    dealt: &Dealt,
    seeds: [[u8; 16]; 2],
    xs: &[u64],
    phi: PhiPath,
) -> Result<Online> {
    let n = xs.len();
    let w = gate.ring();
    let mut prg = Prg::new(&[7; 16]);
    let x0: Vec<u64> = (0..n).map(|_| w.reduce(prg.next_u64())).collect();
    let x1: Vec<u64> = xs.iter().zip(&x0).map(|(x, a)| w.sub(*x, *a)).collect();
    let (to1, from0) = mpsc::channel::<Vec<u8>>();
    let (to0, from1) = mpsc::channel::<Vec<u8>>();
    let outs = gate.outputs();
    // Both parties load their keys, then start the online phase together.
    let ready = std::sync::Barrier::new(2);
    let party = |p: usize,
                 x: Vec<u64>,
                 tx: mpsc::Sender<Vec<u8>>,
                 rx: mpsc::Receiver<Vec<u8>>|
     -> Result<PartyRun> {
        let cpu = CpuEval::with_threads(1).map_err(|e| anyhow!("{e}"))?;
        let h = cpu.backend().clone();
        let mut scratch = vec![0u64; gate.scratch_words(n)];
        let role = if p == 0 { Party::P0 } else { Party::P1 };
        let load = Instant::now();
        let mut ev = Eval::new(
            gate,
            &h,
            role,
            &seeds[p],
            None,
            0,
            n,
            dealt.keys(p),
            &x,
            &mut scratch,
        )
        .map_err(|e| anyhow!("eval: {e}"))?;
        if phi == PhiPath::Interpreted {
            ev.use_interpreter();
        }
        let load_s = load.elapsed().as_secs_f64();
        let counting = Counting::new(&cpu);
        ready.wait();
        let start = Instant::now();
        let trace = std::env::var_os("SUFFUSE_BENCH_TRACE").is_some();
        let sent = drive(&mut ev, &counting, &tx, &rx, trace.then_some(p))?;
        let t = Instant::now();
        let mut arith = vec![0u64; n * outs];
        let mut bits = vec![0u64; n * gate.bit_outputs()];
        ev.outputs(&mut arith, &mut bits)
            .map_err(|e| anyhow!("outputs: {e}"))?;
        let online = start.elapsed().as_secs_f64();
        if trace {
            eprintln!(
                "  P{p} outputs {:.3} s, key loading {load_s:.3} s",
                t.elapsed().as_secs_f64()
            );
        }
        let phi_s = if p == 0 {
            phi_seconds(&mut ev, gate, n, &cpu)?
        } else {
            [0.0; 2]
        };
        Ok(PartyRun {
            arith,
            online,
            load_s,
            aes: counting.calls(),
            sent,
            phi_s,
        })
    };
    let (r0, r1) = std::thread::scope(|s| {
        let a = s.spawn(|| party(0, x0, to1, from1));
        let b = s.spawn(|| party(1, x1, to0, from0));
        (a.join(), b.join())
    });
    let p0 = r0.map_err(|_| anyhow!("party 0 panicked"))??;
    let p1 = r1.map_err(|_| anyhow!("party 1 panicked"))??;
    let (a0, t0, l0, aes0, sent, phi_s) =
        (p0.arith, p0.online, p0.load_s, p0.aes, p0.sent, p0.phi_s);
    let (a1, t1, l1) = (p1.arith, p1.online, p1.load_s);
    let outputs = a0
        .iter()
        .zip(&a1)
        .enumerate()
        .map(|(i, (a, b))| gate.phi.outputs[i % outs.max(1)].ring.add(*a, *b))
        .collect();
    Ok(Online {
        outputs,
        online_s: t0.max(t1),
        load_s: l0.max(l1),
        aes_per_elem: aes0 as f64 / n as f64,
        bytes_per_party: sent,
        phi_s,
    })
}

/// Seconds Φ takes for all elements of a finished evaluation, compiled and
/// interpreted, on the same state. The Beaver section overwrites the opened
/// values the outputs read, so it runs last.
fn phi_seconds(ev: &mut Eval<'_>, gate: &Gate, n: usize, cpu: &CpuEval) -> Result<[f64; 2]> {
    let err = |e: suffuse_core::Error| anyhow!("Φ: {e}");
    let mut buf = vec![0u64; n * gate.outputs().max(gate.plan.beaver_count)];
    let t = Instant::now();
    ev.outputs_interpreted(0, &mut buf[..n * gate.outputs()])
        .map_err(err)?;
    ev.beaver_interpreted(0, &mut buf[..n * gate.plan.beaver_count])
        .map_err(err)?;
    let interpreted = t.elapsed().as_secs_f64();
    let t = Instant::now();
    ev.run_section(Section::Outputs, cpu).map_err(err)?;
    if gate.plan.beaver_count > 0 {
        ev.run_section(Section::Beaver, cpu).map_err(err)?;
    }
    Ok([t.elapsed().as_secs_f64(), interpreted])
}

/// One party's online phase over a channel pair: every round of `ev`
/// (gate, chain or max tree alike). Returns the bytes sent; with `trace`
/// (the party index), prints each round's timing.
fn drive(
    ev: &mut dyn Protocol,
    backend: &dyn BatchEval,
    tx: &mpsc::Sender<Vec<u8>>,
    rx: &mpsc::Receiver<Vec<u8>>,
    trace: Option<usize>,
) -> Result<usize> {
    let mut sent = 0;
    for i in 0..ev.rounds() {
        let t = Instant::now();
        let mut buf = vec![0u8; ev.send_len(i)];
        ev.prepare(i, &mut buf)
            .map_err(|e| anyhow!("round {i}: prepare: {e}"))?;
        let prepared = t.elapsed().as_secs_f64();
        sent += buf.len();
        tx.send(buf).context("peer gone")?;
        let recv = rx.recv().context("peer gone")?;
        let received = t.elapsed().as_secs_f64();
        ev.finish(i, &recv, backend)
            .map_err(|e| anyhow!("round {i}: finish: {e}"))?;
        if let Some(p) = trace {
            eprintln!(
                "  P{p} round {i}: prepare {prepared:.3} s, wait {:.3} s, finish {:.3} s",
                received - prepared,
                t.elapsed().as_secs_f64() - received
            );
        }
    }
    Ok(sent)
}

/// A BatchEval that counts the AES calls the evaluator reports.
struct Counting<'a> {
    inner: &'a CpuEval,
    calls: std::sync::atomic::AtomicU64,
}

impl<'a> Counting<'a> {
    fn new(inner: &'a CpuEval) -> Counting<'a> {
        Counting {
            inner,
            calls: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn calls(&self) -> u64 {
        self.calls.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl suffuse_core::prg::Hasher for Counting<'_> {
    fn hash_many(
        &self,
        d: suffuse_core::prg::Domain,
        blocks: &mut [suffuse_core::prg::Block],
    ) -> u64 {
        self.inner.hash_many(d, blocks)
    }
}

impl BatchEval for Counting<'_> {
    fn name(&self) -> &'static str {
        "counting"
    }

    fn aes_path(&self) -> &'static str {
        self.inner.aes_path()
    }

    fn preferred_batch(&self) -> usize {
        self.inner.preferred_batch()
    }

    fn generate(
        &self,
        batch: &suffuse_core::fss::GenBatch<'_>,
        key0: &mut [u8],
        key1: &mut [u8],
    ) -> Result<suffuse_core::batch::EvalStats, suffuse_core::Error> {
        self.inner.generate(batch, key0, key1)
    }

    fn matmul(
        &self,
        shape: &suffuse_core::batch::MatShape,
        a: &[u64],
        b: &[u64],
        c: &mut [u64],
    ) -> Result<(), suffuse_core::Error> {
        self.inner.matmul(shape, a, b, c)
    }

    fn eval(
        &self,
        keys: &suffuse_core::fss::KeyBatch<'_>,
        points: &[u64],
        out: &mut [u64],
    ) -> Result<suffuse_core::batch::EvalStats, suffuse_core::Error> {
        let s = self.inner.eval(keys, points, out)?;
        self.calls
            .fetch_add(s.aes_calls, std::sync::atomic::Ordering::Relaxed);
        Ok(s)
    }

    fn eval_full_domain(
        &self,
        keys: &suffuse_core::fss::KeyBatch<'_>,
        out: &mut [u64],
    ) -> Result<suffuse_core::batch::EvalStats, suffuse_core::Error> {
        self.inner.eval_full_domain(keys, out)
    }
}

/// Inputs: signed values spread over the k-bit range, biased toward the
/// function's interesting region (|x| < 8 real) half the time.
fn inputs(w: Width, k: u32, n: usize, seed: u8) -> Vec<u64> {
    let mut prg = Prg::new(&[seed; 16]);
    (0..n)
        .map(|i| {
            let r = prg.next_u64() as i64;
            let v = if i % 2 == 0 {
                r >> (64 - (FRAC + 4))
            } else {
                r >> (64 - (k - 1))
            };
            w.from_signed(v)
        })
        .collect()
}

/// Max |spline − f| (real units) over the inputs, at the gate's scales.
fn spline_error(gate: &Gate, f: fn(f64) -> f64, out_scale: u32, lo: f64, hi: f64) -> f64 {
    let w = gate.ring();
    let mut worst = 0.0f64;
    let step = 1.0 / pow2(FRAC);
    let mut x = lo;
    let mut out = [0u64; 2];
    while x < hi {
        let xi = w.from_signed((x * pow2(FRAC)) as i64);
        gate.reference(xi, &mut out);
        let got = w.to_signed(out[0]) as f64 / pow2(out_scale);
        worst = worst.max((got - f(x)).abs());
        x += step;
    }
    worst
}

fn gelu_erf(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

fn gelu_tanh(x: f64) -> f64 {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (c * (x + 0.044_715 * x * x * x)).tanh())
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// Whether `name` is selected by `SUFFUSE_BENCH_GATES` (a comma-separated
/// list; all gates when unset).
fn wanted(name: &str) -> bool {
    match std::env::var("SUFFUSE_BENCH_GATES") {
        Ok(list) => list.split(',').any(|g| g.trim() == name),
        Err(_) => true,
    }
}

/// Deals, runs and checks one gate against its cleartext reference.
#[allow(clippy::too_many_arguments)]
fn measure(
    name: &str,
    gate: &Gate,
    k: u32,
    n: usize,
    xs: &[u64],
    out_scale: u32,
    max_abs_err: f64,
    note: &str,
) -> Result<Option<Record>> {
    if !wanted(name) {
        return Ok(None);
    }
    let backend = CpuEval::new();
    let seeds = [[0x11; 16], [0x22; 16]];
    let (dealt, gen_s) = deal(gate, &backend, seeds, n)?;
    // The machine is shared and noisy: the median of three online runs
    // (the same keys, which only a benchmark may reuse).
    let median = |phi: PhiPath| -> Result<Online> {
        let mut runs = Vec::new();
        for _ in 0..3 {
            runs.push(run_gate(gate, &dealt, seeds, xs, phi)?);
        }
        runs.sort_by(|a, b| a.online_s.total_cmp(&b.online_s));
        Ok(runs.swap_remove(1))
    };
    let compare = COMPARE_INTERPRETER.contains(&name);
    // Interleaved so that both see the same machine load.
    let interpreted = if compare {
        Some(median(PhiPath::Interpreted)?)
    } else {
        None
    };
    let on = median(PhiPath::Compiled)?;
    // Bit-exact against the cleartext reference, on a sample.
    let outs = gate.outputs();
    let mut want = [0u64; 2];
    for (i, x) in xs.iter().enumerate().step_by(97).filter(|_| outs > 0) {
        gate.reference(*x, &mut want);
        if on.outputs[i * outs] != want[0] {
            bail!("{name}: two-party output differs from the reference at x = {x:#x}");
        }
    }
    let cost = gate.cost();
    let rec = Record {
        gate: name.to_string(),
        n: gate.ring().bits(),
        f: FRAC,
        k,
        elements: n,
        online_elems_per_s: n as f64 / on.online_s,
        key_bytes_per_elem: cost.key_bytes_p1 as f64,
        key_bytes_per_elem_p0: cost.key_bytes_p0 as f64,
        aes_per_elem: on.aes_per_elem,
        rounds: cost.rounds,
        comm_bits_per_elem: on.bytes_per_party as f64 * 8.0 / n as f64,
        keygen_elems_per_s: n as f64 / gen_s,
        load_s: on.load_s,
        max_abs_err,
        max_rel_err: None,
        out_scale,
        note: note.to_string(),
        interpreter_online_elems_per_s: interpreted.as_ref().map(|i| n as f64 / i.online_s),
        phi_s: compare.then_some(on.phi_s),
    };
    print_record(&rec);
    if let (Some(i), Some([c, p])) = (&interpreted, rec.phi_s) {
        println!(
            "  {name}: online {:.0} el/s compiled vs {:.0} el/s interpreted ({:.2}×); \
             Φ alone (P0, all elements) {c:.3} s compiled vs {p:.3} s interpreted ({:.2}×)",
            rec.online_elems_per_s,
            n as f64 / i.online_s,
            i.online_s / on.online_s,
            p / c
        );
    }
    Ok(Some(rec))
}

fn print_header() {
    println!(
        "{:<22} {:>3} {:>3} {:>8} {:>12} {:>9} {:>9} {:>8} {:>6} {:>10} {:>12} {:>10}",
        "gate",
        "n",
        "k",
        "elems",
        "online el/s",
        "keyB P1",
        "keyB P0",
        "AES/el",
        "rounds",
        "comm b/el",
        "keygen el/s",
        "max err"
    );
}

fn print_record(r: &Record) {
    println!(
        "{:<22} {:>3} {:>3} {:>8} {:>12.0} {:>9.1} {:>9.1} {:>8.1} {:>6} {:>10.1} {:>12.0} {:>10.2e}",
        r.gate,
        r.n,
        r.k,
        r.elements,
        r.online_elems_per_s,
        r.key_bytes_per_elem,
        r.key_bytes_per_elem_p0,
        r.aes_per_elem,
        r.rounds,
        r.comm_bits_per_elem,
        r.keygen_elems_per_s,
        r.max_abs_err.max(r.max_rel_err.unwrap_or(0.0))
    );
}

fn spline_record(
    name: &str,
    gate: Gate,
    k: u32,
    spline: &Spline,
    f: fn(f64) -> f64,
    note: &str,
) -> Result<Option<Record>> {
    if !wanted(name) {
        return Ok(None);
    }
    let out_scale = activation::out_scale(spline, FRAC, activation::COEFF_BITS);
    let err = spline_error(&gate, f, out_scale, -16.0, 16.0);
    let xs = inputs(gate.ring(), k, ELEMENTS, 3);
    measure(name, &gate, k, ELEMENTS, &xs, out_scale, err, note)
}

/// Runs every gate bench; returns the JSON array.
pub fn run() -> Result<String> {
    let mut records = Vec::new();
    print_header();
    records.extend(activation_records()?);
    records.extend(truncation_records()?);
    records.extend(nexp_records()?);
    let n = Width::W64;
    let xs = inputs(n, 20, ELEMENTS, 6);
    records.extend(measure(
        "extend",
        &extend(n, Width::of(20), true).map_err(suf_err)?,
        20,
        ELEMENTS,
        &xs,
        FRAC,
        0.0,
        "20 → 64 bits",
    )?);
    records.extend(chain_records()?);
    records.extend(max_record()?);
    serde_json::to_string_pretty(&records).context("serializing records")
}

fn suf_err(e: suffuse_core::SufError) -> anyhow::Error {
    anyhow!("{e}")
}

/// The spline activations (every GeLU form, Beaver-style and with dealer
/// monomials, and every SiLU form), ReLU and DReLU, at
/// BERT-class width (k = 26, f = 12) and full width.
fn activation_records() -> Result<Vec<Record>> {
    let n = Width::W64;
    let mut records = Vec::new();
    for (k, note) in [(26u32, "BERT-class width"), (64, "full width")] {
        let w = Width::of(k);
        for (name, form, spline) in [
            ("gelu", GeluForm::Erf, &splines::GELU_ERF),
            ("gelu_tanh", GeluForm::Tanh, &splines::GELU_TANH),
            (
                "gelu_tanh_fine",
                GeluForm::TanhFine,
                &splines::GELU_TANH_FINE,
            ),
            (
                "gelu_tanh_linear",
                GeluForm::TanhLinear,
                &splines::GELU_TANH_LINEAR,
            ),
        ] {
            let real = if form == GeluForm::Erf {
                gelu_erf
            } else {
                gelu_tanh
            };
            let gate = activation::gelu(form, n, w, FRAC).map_err(suf_err)?;
            records.extend(spline_record(name, gate, k, spline, real, note)?);
            // The plans' form outside decode passes: dealer monomials.
            let gate = activation::gelu_monomials(form, n, w, FRAC).map_err(suf_err)?;
            let name = format!("{name}_monomials");
            records.extend(spline_record(&name, gate, k, spline, real, note)?);
        }
        for (name, form, spline) in [
            ("silu", SiluForm::Quadratic, &splines::SILU),
            ("silu_linear", SiluForm::Linear, &splines::SILU_LINEAR),
        ] {
            let gate = activation::silu(form, n, w, FRAC).map_err(suf_err)?;
            records.extend(spline_record(name, gate, k, spline, silu, note)?);
        }
        let xs = inputs(n, k, ELEMENTS, 4);
        for (name, gate, scale) in [
            ("relu", relu(n, w).map_err(suf_err)?, FRAC),
            ("drelu", drelu(n, w).map_err(suf_err)?, 0),
        ] {
            records.extend(measure(name, &gate, k, ELEMENTS, &xs, scale, 0.0, note)?);
        }
    }
    Ok(records)
}

/// Truncations (exact ARS, TR, gap ARS) and ReluARS at the width of a
/// BERT-class product (k = 40) and full width.
fn truncation_records() -> Result<Vec<Record>> {
    let n = Width::W64;
    let mut records = Vec::new();
    for (k, note) in [(40u32, "BERT-class width"), (64, "full width")] {
        let w = Width::of(k);
        let xs = inputs(n, k, ELEMENTS, 5);
        let mut gates = vec![
            (
                "trunc",
                trunc(n, w, FRAC, Shift::Arithmetic, Range::Exact).map_err(suf_err)?,
                FRAC,
                format!("exact ARS, {note}"),
            ),
            (
                "trunc_reduce",
                trunc(n, w, FRAC, Shift::Reduce, Range::Exact).map_err(suf_err)?,
                FRAC,
                format!("TR into Z_2^52, {note}"),
            ),
        ];
        if k < 64 {
            gates.push((
                "trunc_gap",
                trunc(n, w, FRAC, Shift::Arithmetic, Range::Gap).map_err(suf_err)?,
                FRAC,
                format!("ARS with one bit of slack, {note}"),
            ));
            gates.push((
                "reluars",
                reluars(n, w, FRAC, Range::Gap).map_err(suf_err)?,
                0,
                format!("gap, {note}"),
            ));
        } else {
            gates.push((
                "reluars",
                reluars(n, w, FRAC, Range::Exact).map_err(suf_err)?,
                0,
                format!("exact, {note}"),
            ));
        }
        for (name, gate, scale, what) in &gates {
            records.extend(measure(name, gate, k, ELEMENTS, &xs, *scale, 0.0, what)?);
        }
    }
    Ok(records)
}

/// nExp at the softmax's range (k = 24) and full width, with its error;
/// `nexp_linear` (decode passes' degree-1 form) at the softmax's range.
fn nexp_records() -> Result<Vec<Record>> {
    let n = Width::W64;
    let mut records = Vec::new();
    for (name, form, k, note) in [
        ("nexp", NexpForm::Quadratic, 24u32, "softmax range"),
        ("nexp", NexpForm::Quadratic, 64, "full width"),
        ("nexp_linear", NexpForm::Linear, 24, "softmax range"),
    ] {
        let gate = activation::nexp(form, n, Width::of(k), FRAC).map_err(suf_err)?;
        let spline = activation::nexp_spline(form);
        let out_scale = activation::out_scale(spline, FRAC, activation::COEFF_BITS);
        let e = spline_error(&gate, |z| (-z).exp(), out_scale, 0.0, 32.0);
        let mut prg = Prg::new(&[9; 16]);
        let xs: Vec<u64> = (0..ELEMENTS)
            .map(|_| (prg.next_u64() >> (64 - 18)).min((1 << (k - 1)) - 1))
            .collect();
        records.extend(measure(name, &gate, k, ELEMENTS, &xs, out_scale, e, note)?);
    }
    Ok(records)
}

/// Reciprocal and rsqrt: chains, at the sizes a BERT layer needs them.
fn chain_records() -> Result<Vec<Record>> {
    let mut out = Vec::new();
    let count = 128 * 12 * 8;
    for (name, kind, sc, lo, hi, note) in [
        (
            "recip",
            Inverse::Recip,
            InverseScales {
                frac_in: FRAC,
                k_in: 23,
                lo_bits: FRAC,
                frac_out: 24,
            },
            1u64 << FRAC,
            1u64 << 22,
            "softmax denominator in [1, 1024), f = 12",
        ),
        (
            "rsqrt",
            Inverse::Rsqrt,
            InverseScales {
                frac_in: 24,
                k_in: 44,
                lo_bits: 0,
                frac_out: 24,
            },
            1u64 << 12,
            1u64 << 44,
            "variance at f = 24 in [2^-12, 2^20)",
        ),
    ] {
        for (name, table) in [(name.to_string(), false), (format!("{name}_table"), true)] {
            chain_record(&mut out, (&name, table, kind), (sc, lo, hi), count, note)?;
        }
    }
    trunc_one_round_record(&mut out, count)?;
    out.extend(trunc_open_record(count)?);
    Ok(out)
}

/// One inverse chain's record: the spline form on `count` elements, the
/// table form (the one decode passes run) on 256.
fn chain_record(
    out: &mut Vec<Record>,
    (name, table, kind): (&str, bool, Inverse),
    (sc, lo, hi): (InverseScales, u64, u64),
    count: usize,
    note: &str,
) -> Result<()> {
    let err = |e: suffuse_core::SufError| anyhow!("{e}");
    let n = Width::W64;
    if !wanted(name) {
        return Ok(());
    }
    let (chain, count) = match table {
        true => (inverse_table(kind, n, sc).map_err(err)?, 256),
        false => (inverse(kind, n, sc).map_err(err)?, count),
    };
    {
        // Relative error over the range (strided sweep of the reference).
        let mut rel = 0.0f64;
        let stride = (hi - lo) / 400_000 + 1;
        let mut v = lo;
        while v < hi {
            let y = chain.reference(v) as i64 as f64 / pow2(sc.frac_out);
            let want = kind.real(v as f64 / pow2(sc.frac_in));
            rel = rel.max((y - want).abs() / want);
            v += stride;
        }
        let mut prg = Prg::new(&[10; 16]);
        let xs: Vec<u64> = (0..count)
            .map(|_| lo + prg.next_u64() % (hi - lo))
            .collect();
        if let Some(rec) = run_chain_bench(name, &chain, sc.k_in, &xs, sc.frac_out, rel, note)? {
            out.push(rec);
        }
    }
    Ok(())
}

/// The one-round truncation's record.
fn trunc_one_round_record(out: &mut Vec<Record>, count: usize) -> Result<()> {
    let err = |e: suffuse_core::SufError| anyhow!("{e}");
    let n = Width::W64;
    // The one-round truncation that per-row scalars and the chains use, as
    // a one-step chain, beside `trunc_gap` (the same function in two
    // rounds).
    if wanted("trunc_one_round") {
        let k = 40;
        let chain = Chain::new(n)
            .then(Step::Trunc {
                gate: RingTrunc::new(n, Width::of(k), FRAC, Shift::Arithmetic).map_err(err)?,
                input: Lin::of(Source::Input),
            })
            .output(Source::Output { step: 0, index: 0 });
        let xs = inputs(n, k, count, 7);
        let note = "gap ARS, ring-output carry, BERT-class width";
        out.extend(run_chain_bench(
            "trunc_one_round",
            &chain,
            k,
            &xs,
            FRAC,
            0.0,
            note,
        )?);
    }
    Ok(())
}

/// The truncation that opens its output (`TruncOpen`, squared form, as a
/// decoder's residual norms run it), beside `trunc_gap`: dealt on the CPU
/// backend, both parties on one thread each over channels, their output
/// shares (`E + A_e`) and their shares of its square checked against the
/// reference.
fn trunc_open_record(count: usize) -> Result<Option<Record>> {
    let name = "trunc_open";
    if !wanted(name) {
        return Ok(None);
    }
    let (w, k) = (Width::W64, 40u32);
    let g = TruncOpen::new(w, Width::of(k), FRAC)
        .map_err(suf_err)?
        .squared();
    let backend = CpuEval::new();
    let seeds = [[0x41; 16], [0x42; 16]];
    let len = g.key_params().key_len();
    let (mut k0, mut k1) = (vec![0u8; count * len], vec![0u8; count * len]);
    let mut explicit = vec![0u64; count * g.explicit_words()];
    let start = Instant::now();
    g.deal(
        &backend,
        seeds,
        None,
        0,
        count,
        &mut k0,
        &mut k1,
        &mut explicit,
    )
    .map_err(|e| anyhow!("{e}"))?;
    let gen_s = start.elapsed().as_secs_f64();
    let ys = inputs(w, k, count, 8);
    let zs = inputs(w, 64, count, 9);
    let mut prg = Prg::new(&[13; 16]);
    let share = |v: &[u64], prg: &mut Prg| -> [Vec<u64>; 2] {
        let a: Vec<u64> = v.iter().map(|_| w.reduce(prg.next_u64())).collect();
        let b = v.iter().zip(&a).map(|(x, a)| w.sub(*x, *a)).collect();
        [a, b]
    };
    let (y, z) = (share(&ys, &mut prg), share(&zs, &mut prg));
    let (to1, from0) = mpsc::channel::<Vec<u8>>();
    let (to0, from1) = mpsc::channel::<Vec<u8>>();
    let keys = [&k0, &k1];
    let party = |p: usize,
                 tx: mpsc::Sender<Vec<u8>>,
                 rx: mpsc::Receiver<Vec<u8>>|
     -> Result<([Vec<u64>; 2], f64, usize)> {
        let cpu = CpuEval::with_threads(1).map_err(|e| anyhow!("{e}"))?;
        let role = if p == 0 { Party::P0 } else { Party::P1 };
        let pk = PartyKeys::of(&[keys[p]], &[], if p == 1 { &explicit } else { &[] });
        let mut area = vec![0u64; TruncOpen::scratch_words(count)];
        let start = Instant::now();
        let mut ev = g
            .eval(
                cpu.backend(),
                role,
                &seeds[p],
                None,
                0,
                pk,
                (&y[p], &z[p]),
                &mut area,
            )
            .map_err(|e| anyhow!("{name}: {e}"))?;
        let sent = drive(&mut ev, &cpu, &tx, &rx, None)?;
        let (mut x, mut sq) = (vec![0u64; count], vec![0u64; count]);
        ev.output(&mut x).map_err(|e| anyhow!("{name}: {e}"))?;
        ev.square_shares(&mut sq)
            .map_err(|e| anyhow!("{name}: {e}"))?;
        Ok(([x, sq], start.elapsed().as_secs_f64(), sent))
    };
    let (r0, r1) = std::thread::scope(|s| {
        let a = s.spawn(|| party(0, to1, from1));
        let b = s.spawn(|| party(1, to0, from0));
        (a.join(), b.join())
    });
    let (x0, t0, sent) = r0.map_err(|_| anyhow!("party 0 panicked"))??;
    let (x1, t1, _) = r1.map_err(|_| anyhow!("party 1 panicked"))??;
    for i in 0..count {
        let x = g.reference(ys[i], zs[i]);
        if w.add(x0[0][i], x1[0][i]) != x || w.add(x0[1][i], x1[1][i]) != w.mul(x, x) {
            bail!(
                "{name}: the output or its square differs from the reference at y = {:#x}",
                ys[i]
            );
        }
    }
    let timed = Timed {
        online_s: t0.max(t1),
        gen_s,
        sent,
    };
    let note = "gap ARS plus an addend, output opened under A + e·D, and its square";
    let rec = Record::of_run(name, (w, k, count), &g.cost(), timed, (FRAC, None), note);
    print_record(&rec);
    Ok(Some(rec))
}

fn run_chain_bench(
    name: &str,
    chain: &Chain,
    k: u32,
    xs: &[u64],
    out_scale: u32,
    rel: f64,
    note: &str,
) -> Result<Option<Record>> {
    if !wanted(name) {
        return Ok(None);
    }
    let n = xs.len();
    let w = chain.ring;
    let backend = CpuEval::new();
    let seeds = [[0x31; 16], [0x32; 16]];
    let start = Instant::now();
    let mut dealt: Vec<Dealt> = Vec::new();
    let mut prg_fresh = Prg::new(&[0x33; 16]);
    for s in 0..chain.count {
        let buffers = || -> Vec<Vec<u8>> {
            (0..MAX_KEYS)
                .map(|k| vec![0u8; chain.key_params(s, k).map_or(0, |p| n * p.key_len())])
                .collect()
        };
        let (mut d0, mut d1) = (buffers(), buffers());
        // A one-round truncation's key draws fresh dealer words.
        let random: Vec<u64> = (0..n * chain.random_words(s))
            .map(|_| prg_fresh.next_u64())
            .collect();
        let mut ex = vec![0u64; n * chain.explicit_words(s)];
        {
            let mut a: [&mut [u8]; MAX_KEYS] = d0
                .iter_mut()
                .map(|v| v.as_mut_slice())
                .collect::<Vec<_>>()
                .try_into()
                .map_err(|_| anyhow!("keys"))?;
            let mut b: [&mut [u8]; MAX_KEYS] = d1
                .iter_mut()
                .map(|v| v.as_mut_slice())
                .collect::<Vec<_>>()
                .try_into()
                .map_err(|_| anyhow!("keys"))?;
            let group = backend.preferred_batch().clamp(1, n.max(1));
            let mut prf = vec![Block::ZERO; chain.deal_scratch_blocks(n, group)];
            let mut words = vec![0u64; DealScratch::words(group)];
            let scratch = &mut DealScratch::new(&mut prf, &mut words);
            chain
                .deal_step(
                    s, &backend, seeds, 0, n, &mut a, &mut b, &mut ex, &random, scratch,
                )
                .map_err(|e| anyhow!("{e}"))?;
        }
        dealt.push(Dealt {
            dcf: [d0, d1],
            explicit: ex,
        });
    }
    let gen_s = start.elapsed().as_secs_f64();
    let mut prg = Prg::new(&[12; 16]);
    let x0: Vec<u64> = (0..n).map(|_| w.reduce(prg.next_u64())).collect();
    let x1: Vec<u64> = xs.iter().zip(&x0).map(|(x, a)| w.sub(*x, *a)).collect();
    let (to1, from0) = mpsc::channel::<Vec<u8>>();
    let (to0, from1) = mpsc::channel::<Vec<u8>>();
    let dealt = &dealt;
    let party = |p: usize,
                 x: Vec<u64>,
                 tx: mpsc::Sender<Vec<u8>>,
                 rx: mpsc::Receiver<Vec<u8>>|
     -> Result<(Vec<u64>, f64, usize)> {
        let cpu = CpuEval::with_threads(1).map_err(|e| anyhow!("{e}"))?;
        let h: &(dyn Hasher + Sync) = cpu.backend();
        let mut keys = [PartyKeys::default(); MAX_STEPS];
        for (k, d) in keys.iter_mut().zip(dealt.iter()) {
            *k = d.keys(p);
        }
        let mut scratch = vec![0u64; chain.scratch_words(n)];
        let role = if p == 0 { Party::P0 } else { Party::P1 };
        let mut store = vec![0u64; chain.tables_words()];
        let tables = chain.fill_tables(&mut store).map_err(|e| anyhow!("{e}"))?;
        let mut ev = ChainEval::new(chain, h, role, seeds[p], 0, n, keys, &x, &mut scratch)
            .map_err(|e| anyhow!("{e}"))?
            .with_tables(tables);
        let start = Instant::now();
        let sent = drive(&mut ev, &cpu, &tx, &rx, None)?;
        let mut y = vec![0u64; n];
        ev.output(&mut y).map_err(|e| anyhow!("{e}"))?;
        Ok((y, start.elapsed().as_secs_f64(), sent))
    };
    let (r0, r1) = std::thread::scope(|s| {
        let a = s.spawn(|| party(0, x0, to1, from1));
        let b = s.spawn(|| party(1, x1, to0, from0));
        (a.join(), b.join())
    });
    let (y0, t0, sent) = r0.map_err(|_| anyhow!("party 0 panicked"))??;
    let (y1, t1, _) = r1.map_err(|_| anyhow!("party 1 panicked"))??;
    for (i, x) in xs.iter().enumerate().step_by(31) {
        if w.add(y0[i], y1[i]) != chain.reference(*x) {
            bail!("{name}: two-party output differs from the reference at x = {x:#x}");
        }
    }
    let timed = Timed {
        online_s: t0.max(t1),
        gen_s,
        sent,
    };
    let shape = (w, k, n);
    let rec = Record::of_run(
        name,
        shape,
        &chain.cost(),
        timed,
        (out_scale, Some(rel)),
        note,
    );
    print_record(&rec);
    Ok(Some(rec))
}

/// Row maxima of 128×12×8 rows of 128 scores (the softmax max).
fn max_record() -> Result<Option<Record>> {
    if !wanted("max") {
        return Ok(None);
    }
    let n = Width::W64;
    let k = 32;
    let len = 128;
    let rows = 12 * 128;
    let tree = MaxTree::new(n, Width::of(k), len)
        .map_err(|e| anyhow!("{e}"))?
        .one_round_tail(ONE_ROUND_TAIL);
    let backend = CpuEval::new();
    let seeds = [[0x41; 16], [0x42; 16]];
    let mut fresh = Prg::new(&[0x43; 16]);
    let start = Instant::now();
    let mut dealt = Vec::new();
    for l in 0..tree.levels() {
        let count = rows * tree.pairs(l);
        let buffers = || -> Vec<Vec<u8>> {
            (0..MAX_KEYS)
                .map(|k| vec![0u8; tree.key_params(l, k).map_or(0, |p| count * p.key_len())])
                .collect()
        };
        let (mut d0, mut d1) = (buffers(), buffers());
        let mut ex = vec![0u64; count * tree.explicit_words(l)];
        let random: Vec<u64> = (0..count * tree.random_words(l))
            .map(|_| fresh.next_u64())
            .collect();
        {
            let mut a: [&mut [u8]; MAX_KEYS] = d0
                .iter_mut()
                .map(|v| v.as_mut_slice())
                .collect::<Vec<_>>()
                .try_into()
                .map_err(|_| anyhow!("keys"))?;
            let mut b: [&mut [u8]; MAX_KEYS] = d1
                .iter_mut()
                .map(|v| v.as_mut_slice())
                .collect::<Vec<_>>()
                .try_into()
                .map_err(|_| anyhow!("keys"))?;
            let group = backend.preferred_batch().clamp(1, rows * tree.pairs(0));
            let mut prf = vec![Block::ZERO; tree.deal_scratch_blocks(rows, group)];
            let mut words = vec![0u64; DealScratch::words(group)];
            let scratch = &mut DealScratch::new(&mut prf, &mut words);
            tree.deal_level(
                l, rows, &backend, seeds, &mut a, &mut b, &mut ex, &random, scratch,
            )
            .map_err(|e| anyhow!("{e}"))?;
        }
        dealt.push(Dealt {
            dcf: [d0, d1],
            explicit: ex,
        });
    }
    let gen_s = start.elapsed().as_secs_f64();
    let mut prg = Prg::new(&[13; 16]);
    let values: Vec<u64> = (0..rows * len)
        .map(|_| n.from_signed((prg.next_u64() as i64) >> 40))
        .collect();
    let v0: Vec<u64> = (0..rows * len).map(|_| prg.next_u64()).collect();
    let v1: Vec<u64> = values.iter().zip(&v0).map(|(v, a)| n.sub(*v, *a)).collect();
    let (to1, from0) = mpsc::channel::<Vec<u8>>();
    let (to0, from1) = mpsc::channel::<Vec<u8>>();
    let dealt = &dealt;
    let tree = &tree;
    let party = |p: usize,
                 v: Vec<u64>,
                 tx: mpsc::Sender<Vec<u8>>,
                 rx: mpsc::Receiver<Vec<u8>>|
     -> Result<(Vec<u64>, f64, usize)> {
        let cpu = CpuEval::with_threads(1).map_err(|e| anyhow!("{e}"))?;
        let h: &(dyn Hasher + Sync) = cpu.backend();
        let mut keys = [PartyKeys::default(); MAX_LEVELS];
        for (k, d) in keys.iter_mut().zip(dealt.iter()) {
            *k = d.keys(p);
        }
        let mut scratch = vec![0u64; tree.scratch_words(rows)];
        let role = if p == 0 { Party::P0 } else { Party::P1 };
        let mut ev = MaxEval::new(tree, h, role, seeds[p], rows, &v, keys, &mut scratch)
            .map_err(|e| anyhow!("{e}"))?;
        let start = Instant::now();
        let sent = drive(&mut ev, &cpu, &tx, &rx, None)?;
        let mut y = vec![0u64; rows];
        ev.output(&mut y).map_err(|e| anyhow!("{e}"))?;
        Ok((y, start.elapsed().as_secs_f64(), sent))
    };
    let (r0, r1) = std::thread::scope(|s| {
        let a = s.spawn(|| party(0, v0, to1, from1));
        let b = s.spawn(|| party(1, v1, to0, from0));
        (a.join(), b.join())
    });
    let (y0, t0, sent) = r0.map_err(|_| anyhow!("party 0 panicked"))??;
    let (y1, t1, _) = r1.map_err(|_| anyhow!("party 1 panicked"))??;
    for r in 0..rows {
        let want = values[r * len..(r + 1) * len]
            .iter()
            .map(|v| n.to_signed(*v))
            .max()
            .unwrap_or(0);
        if n.to_signed(n.add(y0[r], y1[r])) != want {
            bail!("max: row {r} differs from the cleartext maximum");
        }
    }
    let elements = rows * len;
    // Per input element: each level's ReLUs per row, at that level's cost
    // (the last levels' one-round ReLU holds larger keys).
    let per_row = |f: &dyn Fn(suffuse_core::gate::Cost) -> usize| -> f64 {
        (0..tree.levels())
            .map(|l| {
                let c = if tree.one_round(l) {
                    tree.ring.cost()
                } else {
                    tree.relu.cost()
                };
                (f(c) * tree.pairs(l)) as f64
            })
            .sum::<f64>()
            / len as f64
    };
    let rec = Record {
        gate: "max".to_string(),
        n: 64,
        f: FRAC,
        k,
        elements,
        online_elems_per_s: elements as f64 / t0.max(t1),
        key_bytes_per_elem: per_row(&|c| c.key_bytes_p1),
        key_bytes_per_elem_p0: per_row(&|c| c.key_bytes_p0),
        aes_per_elem: per_row(&|c| c.aes_online),
        rounds: tree.rounds(),
        comm_bits_per_elem: sent as f64 * 8.0 / elements as f64,
        keygen_elems_per_s: elements as f64 / gen_s,
        load_s: 0.0,
        max_abs_err: 0.0,
        max_rel_err: None,
        out_scale: FRAC,
        note: format!(
            "{rows} rows of {len} (BERT-base attention: 12 heads × 128 rows), last {} levels in one round",
            tree.tail
        ),
        interpreter_online_elems_per_s: None,
        phi_s: None,
    };
    print_record(&rec);
    Ok(Some(rec))
}
