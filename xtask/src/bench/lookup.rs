//! Full-domain DPF evaluation and the table lookup built on it (`RingLut`,
//! `BatchEval::lookup`), against the AES floor measured in the same run.
//!
//! Per record, `ns_per_point` is wall-clock time per domain point with all
//! of the record's threads working; `aes_floor_ns_per_point` is the AES
//! calls per point times the backend's `hash_many` ns per block, divided by
//! the threads. Every evaluator's output is checked against `Serial`'s on
//! the same keys before its time is recorded. `SUFFUSE_BENCH_LOOKUP=lookup`
//! (or `=full_domain`) runs one operation.

use anyhow::{Context, Result, bail};
use serde::Serialize;
use suffuse_accel_cpu::{Backend, CpuEval};
use suffuse_core::batch::{BatchEval, EvalStats, Serial};
use suffuse_core::dpf;
use suffuse_core::fss::{KeyBatch, Kind, Output, Params, Party};
use suffuse_core::prg::{FixedKeyAes, Prg};
use suffuse_core::ring::Width;

use super::floors::{self, AesFloor};
use super::median_seconds;

/// Domain points per configuration and repetition: 2^24, so the keys'
/// domains (128 MiB of words) stay out of cache as a layer's do.
const POINTS: usize = 1 << 24;
const REPS: usize = 5;

/// One measured configuration; the contract of `target/bench/lookup.json`.
#[derive(Debug, Clone, Serialize)]
struct Record {
    name: String,
    /// `full_domain` (`eval_full_domain`), `expand_then_sum` (the trait's
    /// default lookup: 64 domains in memory, then summed) or `lookup` (the
    /// evaluator's own).
    op: &'static str,
    /// Domain bits L.
    bits: u32,
    /// Output ring width.
    width: u32,
    evaluator: &'static str,
    backend: &'static str,
    threads: usize,
    keys: usize,
    ns_per_point: f64,
    ns_per_key: f64,
    aes_calls_per_point: f64,
    aes_floor_ns_per_point: f64,
    /// `ns_per_point` over the AES floor.
    floor_ratio: f64,
}

/// The shapes measured: an activation-sized table (8 bits), and the
/// inverses' table forms (a reciprocal's 2^14, an rsqrt's 2^16).
const SHAPES: [(u32, u32); 4] = [(8, 64), (12, 64), (14, 37), (16, 64)];

/// P0's keys of one shape.
fn deal(params: Params, keys: usize) -> Result<Vec<u8>> {
    let aes = FixedKeyAes::new();
    let mut rng = Prg::new(&[0x3c; 16]);
    let len = params.key_len();
    let mut p0 = vec![0u8; keys * len];
    let mut p1 = vec![0u8; len];
    let domain = params.domain();
    for key0 in p0.chunks_exact_mut(len) {
        let roots = [rng.next_block(), rng.next_block()];
        let alpha = domain.reduce(rng.next_u64());
        dpf::generate(&aes, &params, alpha, 1, roots, &mut rng, key0, &mut p1)?;
    }
    Ok(p0)
}

/// A public table of `2^bits` entries and one public index per key.
fn table_and_points(bits: u32, keys: usize) -> (Vec<u64>, Vec<u64>) {
    let mut rng = Prg::with_stream(&[0x71; 16], 2);
    let table = (0..1usize << bits).map(|_| rng.next_u64()).collect();
    let points = (0..keys).map(|_| rng.next_u64() >> (64 - bits)).collect();
    (table, points)
}

struct Case<'a> {
    params: Params,
    keys: &'a KeyBatch<'a>,
    table: &'a [u64],
    points: &'a [u64],
}

/// Times one operation of `evaluator` over the case; returns its output
/// (the domains, or the lookups), ns per point and AES calls per point.
fn measure(evaluator: &dyn BatchEval, case: &Case<'_>, op: &str) -> Result<(Vec<u64>, f64, f64)> {
    let size = 1usize << case.params.domain().bits();
    let n = case.keys.count();
    let mut domain = vec![0u64; n * size];
    let mut out = vec![0u64; n];
    let mut calls = 0;
    let secs = median_seconds(REPS, || {
        calls = match op {
            "full_domain" => evaluator.eval_full_domain(case.keys, &mut domain)?,
            "lookup" => {
                // Scratch for 64 keys' domains at a time, as the host gives.
                let scratch = &mut domain[..(64 * size).min(n * size)];
                evaluator.lookup(case.keys, (case.points, case.table), scratch, &mut out)?
            }
            _ => expand_then_sum(evaluator, case, &mut domain, &mut out)?,
        }
        .aes_calls;
        Ok(())
    })?;
    let points = (n * size) as f64;
    let result = if op == "full_domain" { domain } else { out };
    Ok((result, secs * 1e9 / points, calls as f64 / points))
}

/// `SUFFUSE_BENCH_LOOKUP=full_domain,lookup` (any of `full_domain`,
/// `expand_then_sum`, `lookup`) runs those operations only.
fn selected(op: &str) -> bool {
    std::env::var("SUFFUSE_BENCH_LOOKUP").map_or(true, |v| v.split(',').any(|o| o == op))
}

/// The trait's default lookup, spelled out: 64 keys' domains expanded
/// into memory by `eval_full_domain`, then summed (the oracle of the
/// fused form; what `CpuEval` did before it).
fn expand_then_sum(
    evaluator: &dyn BatchEval,
    case: &Case<'_>,
    domain: &mut [u64],
    out: &mut [u64],
) -> Result<EvalStats> {
    let size = case.table.len();
    let mut stats = EvalStats::default();
    for (c, o) in out.chunks_mut(64).enumerate() {
        let (at, m) = (c * 64, o.len());
        let d = &mut domain[..m * size];
        stats.aes_calls += evaluator
            .eval_full_domain(&case.keys.slice(at, at + m), d)?
            .aes_calls;
        for (e, de) in d.chunks_exact(size).enumerate() {
            o[e] = dpf::table_dot(case.table, case.points[at + e], 0, de);
        }
    }
    Ok(stats)
}

pub fn run() -> Result<String> {
    let backend = Backend::detect();
    println!("measuring the AES floor of {} ...", backend.name());
    let floor: AesFloor = floors::measure_aes(&backend)?;
    let serial = Serial::new();
    let cpu1 = CpuEval::with_threads(1).context("building a 1-thread pool")?;
    let cpu2 = CpuEval::with_threads(2).context("building a 2-thread pool")?;
    let evaluators: [(&dyn BatchEval, usize); 3] = [(&serial, 1), (&cpu1, 1), (&cpu2, 2)];

    let mut records = Vec::new();
    for (bits, width) in SHAPES {
        let params = Params::new(
            Kind::Dpf,
            Width::new(bits)?,
            Output::Ring(Width::new(width)?),
        );
        let count = POINTS >> bits;
        println!("\ndealing {count} DPF keys over {bits} bits, {width}-bit output ...");
        let bytes = deal(params, count)?;
        let keys = KeyBatch::new(params, Party::P0, &bytes)?;
        let (table, points) = table_and_points(bits, count);
        let case = Case {
            params,
            keys: &keys,
            table: &table,
            points: &points,
        };
        // Every lookup, by either form and evaluator, must give the first
        // one's answers; every full domain likewise.
        let (mut domains, mut sums): (Option<Vec<u64>>, Option<Vec<u64>>) = (None, None);
        for op in ["full_domain", "expand_then_sum", "lookup"] {
            if !selected(op) {
                continue;
            }
            for (evaluator, threads) in evaluators {
                let (out, ns, calls) = measure(evaluator, &case, op)?;
                let reference = if op == "full_domain" {
                    &mut domains
                } else {
                    &mut sums
                };
                match reference {
                    Some(r) if *r != out => bail!(
                        "{op} at L = {bits}: {} with {threads} thread(s) disagrees with the first",
                        evaluator.name()
                    ),
                    Some(_) => {}
                    None => *reference = Some(out),
                }
                let aes_floor = calls * floor.hash_many_ns / threads as f64;
                records.push(Record {
                    name: format!("{op}_l{bits}_w{width}/{}/{threads}", evaluator.name()),
                    op,
                    bits,
                    width,
                    evaluator: evaluator.name(),
                    backend: evaluator.aes_path(),
                    threads,
                    keys: count,
                    ns_per_point: ns,
                    ns_per_key: ns * (1u64 << bits) as f64,
                    aes_calls_per_point: calls,
                    aes_floor_ns_per_point: aes_floor,
                    floor_ratio: ns / aes_floor,
                });
            }
        }
    }
    print_table(&records, &floor);
    Ok(serde_json::to_string_pretty(&records)?)
}

fn print_table(records: &[Record], floor: &AesFloor) {
    println!(
        "\nAES floor ({}): {:.3} ns per block on one core",
        floor.backend, floor.hash_many_ns
    );
    println!(
        "{:<34} {:>8} {:>12} {:>10} {:>8}",
        "case", "keys", "ns/point", "AES/point", "/floor"
    );
    for r in records {
        println!(
            "{:<34} {:>8} {:>12.3} {:>10.3} {:>8.2}",
            r.name, r.keys, r.ns_per_point, r.aes_calls_per_point, r.floor_ratio
        );
    }
}
