//! DCF evaluation in the gate pattern (one fresh key per evaluation, more
//! keys than fit in cache) against the floors measured in the same run.
//!
//! Per record, `ns_per_eval` is wall-clock time per evaluation with all of
//! the record's threads working, and the floors are for the same threads:
//! `aes_floor_ns_per_eval = aes_calls_per_eval × hash ns/block ÷ threads` and
//! `mem_floor_ns_per_eval = key_bytes ÷ read bandwidth at that thread count`,
//! where `key_bytes` is the key bytes read per evaluation (the key length
//! divided by the points evaluated per key).
//!
//! Every hardware AES path of this CPU (`Backend::available`: VAES-512,
//! VAES-256, AES-NI) gets its own floor and its own single-threaded record
//! (`cpu-<path>`, one fresh key per evaluation), with
//! `larger_floor_ratio = ns_per_eval ÷ max(AES floor, memory floor)`: the
//! figure the target of at most 2 is about. `core-walk-<path>` runs the same
//! hashes through core's portable lockstep walk instead of the path's SIMD
//! walk, so the two are compared in one run.

use anyhow::{Context, Result, bail};
use serde::Serialize;
use suffuse_accel_cpu::{Backend, CpuEval};
use suffuse_core::batch::{BatchEval, Serial};
use suffuse_core::dcf;
use suffuse_core::fss::{KeyBatch, Output, Params, Party};
use suffuse_core::prg::{FixedKeyAes, Prg};
use suffuse_core::ring::Width;

use super::floors::{self, AesFloor, ReadBandwidth};
use super::median_seconds;

/// Keys per configuration: 2^18, ≥ 200k, so keys (≥ 180 MB) stay far out of
/// cache, as in a real gate layer.
const KEYS: usize = 1 << 18;
/// Points per key in the shared-key variant.
const SHARED_POINTS: usize = 8;
const REPS: usize = 5;

/// One measured configuration; `name`, `n`, `output`, `threads`,
/// `ns_per_eval`, `aes_calls_per_eval`, `key_bytes`, `gen_ns_per_key`,
/// `aes_floor_ns_per_eval` and `mem_floor_ns_per_eval` are the contract of
/// `target/bench/dcf.json`; the rest is context.
#[derive(Debug, Clone, Serialize)]
struct Record {
    name: String,
    n: u32,
    output: &'static str,
    threads: usize,
    ns_per_eval: f64,
    aes_calls_per_eval: f64,
    key_bytes: f64,
    gen_ns_per_key: f64,
    aes_floor_ns_per_eval: f64,
    mem_floor_ns_per_eval: f64,
    evaluator: &'static str,
    backend: &'static str,
    keys: usize,
    points_per_key: usize,
    evals: usize,
    evals_per_s_per_core: f64,
    key_bytes_per_key: usize,
    aes_floor_fraction: f64,
    mem_floor_fraction: f64,
    /// The dependent-chain bound: what a one-at-a-time evaluator can reach.
    aes_chain_ns_per_eval: f64,
    speedup_vs_1_thread: Option<f64>,
    aes_floor_ns_per_block: f64,
    read_gb_per_s: f64,
    /// `ns_per_eval` over the larger of the two floors.
    larger_floor_ratio: f64,
}

struct Shape {
    n: u32,
    output: Output,
    label: &'static str,
}

const SHAPES: [Shape; 3] = [
    Shape {
        n: 50,
        output: Output::Bit,
        label: "bit",
    },
    Shape {
        n: 64,
        output: Output::Bit,
        label: "bit",
    },
    Shape {
        n: 50,
        output: Output::Ring(Width::W64),
        label: "ring64",
    },
];

/// P0's keys of one shape, and what generating them cost.
struct Dealt {
    params: Params,
    p0_keys: Vec<u8>,
    gen_ns_per_key: f64,
}

/// Generates `KEYS` key pairs on one thread, keeping P0's keys.
fn deal(params: Params) -> Result<Dealt> {
    let aes = FixedKeyAes::new();
    let mut rng = Prg::new(&[0x5e; 16]);
    let len = params.key_len();
    let mut p0_keys = vec![0u8; KEYS * len];
    let mut p1_key = vec![0u8; len];
    let domain = params.domain();
    let start = std::time::Instant::now();
    for key0 in p0_keys.chunks_exact_mut(len) {
        let roots = [rng.next_block(), rng.next_block()];
        let alpha = domain.reduce(rng.next_u64());
        let beta = rng.next_u64();
        dcf::generate(
            &aes,
            &params,
            alpha,
            beta,
            roots,
            &mut rng,
            key0,
            &mut p1_key,
        )?;
    }
    let gen_ns_per_key = start.elapsed().as_secs_f64() * 1e9 / KEYS as f64;
    Ok(Dealt {
        params,
        p0_keys,
        gen_ns_per_key,
    })
}

/// Uniform public points, as masked wires are.
fn points(domain: Width, count: usize) -> Vec<u64> {
    let mut rng = Prg::with_stream(&[0x9b; 16], 1);
    (0..count).map(|_| domain.reduce(rng.next_u64())).collect()
}

/// One evaluator configuration over one shape's keys.
struct Run<'a> {
    variant: String,
    evaluator: &'a dyn BatchEval,
    /// The AES path and its floor.
    aes: &'a AesFloor,
    threads: usize,
    points: &'a [u64],
}

impl<'a> Run<'a> {
    fn new(
        variant: impl Into<String>,
        evaluator: &'a dyn BatchEval,
        aes: &'a AesFloor,
        threads: usize,
        points: &'a [u64],
    ) -> Run<'a> {
        Run {
            variant: variant.into(),
            evaluator,
            aes,
            threads,
            points,
        }
    }
}

struct Measured {
    ns_per_eval: f64,
    aes_calls_per_eval: f64,
    out: Vec<u64>,
}

fn measure(evaluator: &dyn BatchEval, keys: &KeyBatch<'_>, points: &[u64]) -> Result<Measured> {
    let mut out = vec![0u64; points.len()];
    let mut calls = 0;
    let secs = median_seconds(REPS, || {
        calls = evaluator.eval(keys, points, &mut out)?.aes_calls;
        Ok(())
    })?;
    let evals = points.len() as f64;
    Ok(Measured {
        ns_per_eval: secs * 1e9 / evals,
        aes_calls_per_eval: calls as f64 / evals,
        out,
    })
}

pub fn run() -> Result<String> {
    // Every hardware path, fastest first; the detected one is the first.
    let paths: Vec<Backend> = Backend::available()
        .into_iter()
        .filter(|b| !matches!(b, Backend::Portable(_)))
        .collect();
    let mut path_floors = Vec::new();
    for b in &paths {
        println!("measuring the AES floor of {} ...", b.name());
        path_floors.push(floors::measure_aes(b)?);
    }
    let aes = match path_floors.first() {
        Some(f) => f.clone(),
        None => floors::measure_aes(&Backend::detect())?,
    };
    println!("measuring read bandwidth (1 GiB buffer) ...");
    let bandwidth = floors::measure_read_bandwidth()?;
    for f in &path_floors {
        print_floors(f, &bandwidth);
    }

    let serial = Serial::new();
    let cpu1 = CpuEval::with_threads(1).context("building a 1-thread pool")?;
    let cpu2 = CpuEval::with_threads(2).context("building a 2-thread pool")?;
    let per_path: Vec<CpuEval> = paths
        .iter()
        .map(|b| cpu1.clone().with_backend(b.clone()))
        .collect();
    // The same paths through core's portable walk: what the SIMD walks buy.
    let per_path_core: Vec<CpuEval> = per_path.iter().map(|e| e.clone().core_walk()).collect();

    let mut records = Vec::new();
    for shape in &SHAPES {
        let domain = Width::new(shape.n)?;
        let params = Params::new(suffuse_core::fss::Kind::Dcf, domain, shape.output);
        println!(
            "\ndealing {KEYS} DCF keys, n = {}, {} output ...",
            shape.n, shape.label
        );
        let dealt = deal(params)?;
        let keys = KeyBatch::new(dealt.params, Party::P0, &dealt.p0_keys)?;
        let one_per_key = points(domain, KEYS);
        let shared = points(domain, KEYS * SHARED_POINTS);

        let mut runs = vec![
            Run::new("serial", &serial, &aes, 1, &one_per_key),
            Run::new("cpu", &cpu1, &aes, 1, &one_per_key),
            Run::new("cpu", &cpu2, &aes, 2, &one_per_key),
            Run::new("cpu-shared8", &cpu1, &aes, 1, &shared),
            Run::new("cpu-shared8", &cpu2, &aes, 2, &shared),
        ];
        for ((eval, core), floor) in per_path.iter().zip(&per_path_core).zip(&path_floors) {
            let variant = format!("cpu-{}", floor.backend);
            runs.push(Run::new(variant, eval, floor, 1, &one_per_key));
            let variant = format!("core-walk-{}", floor.backend);
            runs.push(Run::new(variant, core, floor, 1, &one_per_key));
        }
        let mut reference: Option<Vec<u64>> = None;
        let mut shared_reference: Option<Vec<u64>> = None;
        let mut one_thread_ns = std::collections::HashMap::new();
        for run in runs {
            let Run {
                variant,
                evaluator,
                aes,
                threads,
                points: pts,
            } = run;
            let m = measure(evaluator, &keys, pts)?;
            // Bit-for-bit agreement between evaluators, on the benchmark's
            // own data: a benchmark of a wrong answer is worthless.
            let slot = if pts.len() == KEYS {
                &mut reference
            } else {
                &mut shared_reference
            };
            match slot {
                Some(r) if *r != m.out => {
                    bail!("{variant} with {threads} thread(s) disagrees with the first evaluator")
                }
                Some(_) => {}
                None => *slot = Some(m.out.clone()),
            }
            let points_per_key = pts.len() / KEYS;
            let key_len = params.key_len();
            let key_bytes = key_len as f64 / points_per_key as f64;
            let aes_floor = m.aes_calls_per_eval * aes.hash_many_ns / threads as f64;
            let read = bandwidth.with_threads(threads);
            let mem_floor = key_bytes / read * 1e9;
            let name = format!("dcf_{}_n{}/{variant}", shape.label, shape.n);
            if threads == 1 {
                one_thread_ns.insert(variant.clone(), m.ns_per_eval);
            }
            let speedup = (threads > 1)
                .then(|| one_thread_ns.get(&variant).map(|ns| ns / m.ns_per_eval))
                .flatten();
            records.push(Record {
                name,
                n: shape.n,
                output: shape.label,
                threads,
                ns_per_eval: m.ns_per_eval,
                aes_calls_per_eval: m.aes_calls_per_eval,
                key_bytes,
                gen_ns_per_key: dealt.gen_ns_per_key,
                aes_floor_ns_per_eval: aes_floor,
                mem_floor_ns_per_eval: mem_floor,
                evaluator: evaluator.name(),
                backend: aes.backend,
                keys: KEYS,
                points_per_key,
                evals: pts.len(),
                evals_per_s_per_core: 1e9 / m.ns_per_eval / threads as f64,
                key_bytes_per_key: key_len,
                aes_floor_fraction: aes_floor / m.ns_per_eval,
                mem_floor_fraction: mem_floor / m.ns_per_eval,
                aes_chain_ns_per_eval: m.aes_calls_per_eval * aes.chain_ns,
                speedup_vs_1_thread: speedup,
                aes_floor_ns_per_block: aes.hash_many_ns,
                read_gb_per_s: read / 1e9,
                larger_floor_ratio: m.ns_per_eval / aes_floor.max(mem_floor),
            });
        }
    }
    print_table(&records);
    Ok(serde_json::to_string_pretty(&records)?)
}

fn print_floors(aes: &AesFloor, bandwidth: &ReadBandwidth) {
    println!("\nAES floor of {} (one core):", aes.backend);
    println!(
        "  {:<34} {:>7.3} ns/block  {:>6.2} G blocks/s   <- the floor",
        format!("{} hash_many (many in flight)", aes.backend),
        aes.hash_many_ns,
        1.0 / aes.hash_many_ns
    );
    println!(
        "  {:<34} {:>7.3} ns/block  {:>6.2} G blocks/s",
        "aes crate permute_many (raw AES)",
        aes.permute_many_ns,
        1.0 / aes.permute_many_ns
    );
    println!(
        "  {:<34} {:>7.3} ns/block  {:>6.2} G blocks/s",
        "aes crate hash_many (portable)",
        aes.portable_hash_many_ns,
        1.0 / aes.portable_hash_many_ns
    );
    println!(
        "  {:<34} {:>7.3} ns/call",
        "dependent chain, aes crate hash", aes.chain_ns
    );
    println!(
        "  {:<34} {:>7.3} ns/call",
        format!("dependent chain, {} 1 block", aes.backend),
        aes.backend_chain_ns
    );
    println!("read bandwidth (1 GiB stream):");
    println!("  1 thread  {:>6.1} GB/s", bandwidth.one_thread / 1e9);
    println!("  2 threads {:>6.1} GB/s", bandwidth.two_threads / 1e9);
}

fn print_table(records: &[Record]) {
    println!(
        "\n{:<26} {:>2} {:>7} {:>6} {:>9} {:>11} {:>7} {:>8} {:>9} {:>9} {:>6} {:>6} {:>8} {:>9} {:>6}",
        "name",
        "n",
        "threads",
        "pts/k",
        "ns/eval",
        "Meval/s/core",
        "AES/ev",
        "keyB/ev",
        "AESfloor",
        "memfloor",
        "%AES",
        "%mem",
        "x1→2",
        "gen ns/k",
        "÷floor"
    );
    for r in records {
        println!(
            "{:<26} {:>2} {:>7} {:>6} {:>9.2} {:>11.2} {:>7.1} {:>8.1} {:>9.2} {:>9.2} {:>5.0}% {:>5.0}% {:>8} {:>9.0} {:>6.2}",
            r.name,
            r.n,
            r.threads,
            r.points_per_key,
            r.ns_per_eval,
            r.evals_per_s_per_core / 1e6,
            r.aes_calls_per_eval,
            r.key_bytes,
            r.aes_floor_ns_per_eval,
            r.mem_floor_ns_per_eval,
            100.0 * r.aes_floor_fraction,
            100.0 * r.mem_floor_fraction,
            r.speedup_vs_1_thread
                .map_or_else(|| "-".to_owned(), |s| format!("{s:.2}")),
            r.gen_ns_per_key,
            r.larger_floor_ratio
        );
    }
    println!(
        "\nns/eval: wall clock per evaluation with all threads; floors are for the same \
         threads (AES: calls × floor ns/block ÷ threads; memory: key bytes ÷ read bandwidth); \
         ÷floor: ns/eval over the larger floor (target ≤ 2 for cpu-<path>)."
    );
}
