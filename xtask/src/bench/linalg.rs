//! `cargo xtask bench linalg`: matrix products mod 2^64 in the shapes a
//! transformer layer makes, on one and two threads.
//!
//! Per record, `gmac_per_s` is multiply-adds per second of wall clock with
//! all of the record's threads working (a batched shape counts every head),
//! and `ns_per_mac` its inverse. Left factors are uniform words (shares);
//! right factors are small signed weights for the projections and uniform
//! words for the attention products (share × share, as in Beaver's
//! protocol). Every result is checked against another kernel path, and one
//! shape against the naive triple loop, before it is reported.
//!
//! Two-thread speedups come with `two_thread_capacity`, measured at the
//! start: what two threads of plain integer work achieve over one at that
//! moment. On a shared machine other work can take the second core, and no
//! speedup can exceed that figure.

use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use serde::Serialize;
use suffuse_accel_cpu::linalg::{self, Path};
use suffuse_core::prg::Prg;

use super::median_seconds;

/// One measured configuration. `name`, `m`, `k`, `n`, `threads`,
/// `gmac_per_s`, `ns_per_mac` and `path` are the contract of
/// `target/bench/linalg.json`; the rest is context.
#[derive(Debug, Clone, Serialize)]
struct Record {
    name: String,
    m: usize,
    k: usize,
    n: usize,
    threads: usize,
    gmac_per_s: f64,
    ns_per_mac: f64,
    path: &'static str,
    /// Independent products per call (attention heads); 1 otherwise.
    batch: usize,
    /// `b` for `matmul`, `bt` for `matmul_bt`.
    layout: &'static str,
    ms_per_call: f64,
    speedup_vs_1_thread: Option<f64>,
    /// [`two_thread_capacity`] at the start of the run, for two-thread
    /// records: the most their speedup could have been.
    two_thread_capacity: Option<f64>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Layout {
    B,
    Bt,
}

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::B => "b",
            Layout::Bt => "bt",
        }
    }
}

struct Shape {
    name: &'static str,
    m: usize,
    k: usize,
    n: usize,
    batch: usize,
    layout: Layout,
    /// Right factor: small signed weights (true) or uniform shares.
    weights: bool,
}

const SHAPES: [Shape; 6] = [
    Shape {
        name: "qkv_proj",
        m: 128,
        k: 384,
        n: 1152,
        batch: 1,
        layout: Layout::B,
        weights: true,
    },
    Shape {
        name: "ffn_down",
        m: 128,
        k: 1536,
        n: 384,
        batch: 1,
        layout: Layout::B,
        weights: true,
    },
    Shape {
        name: "ffn_up",
        m: 128,
        k: 768,
        n: 3072,
        batch: 1,
        layout: Layout::B,
        weights: true,
    },
    Shape {
        name: "out_proj_512",
        m: 512,
        k: 768,
        n: 768,
        batch: 1,
        layout: Layout::B,
        weights: true,
    },
    Shape {
        name: "attn_scores",
        m: 128,
        k: 32,
        n: 128,
        batch: 12,
        layout: Layout::Bt,
        weights: false,
    },
    Shape {
        name: "attn_values",
        m: 128,
        k: 128,
        n: 32,
        batch: 12,
        layout: Layout::B,
        weights: false,
    },
];

/// Multiply-adds per measurement: enough for a stable median, little enough
/// to keep the whole benchmark under a minute on two cores.
const MACS_PER_SHAPE: f64 = 2e9;

/// One shape's operands, `batch` products laid end to end.
struct Operands {
    a: Vec<u64>,
    b: Vec<u64>,
}

impl Operands {
    fn new(shape: &Shape, seed: u8) -> Operands {
        let mut rng = Prg::new(&[seed; 16]);
        let a = (0..shape.batch * shape.m * shape.k)
            .map(|_| rng.next_u64())
            .collect();
        let b = (0..shape.batch * shape.k * shape.n)
            .map(|_| {
                let x = rng.next_u64();
                if shape.weights {
                    // A fixed-point weight in [−2^15, 2^15), sign-extended.
                    ((x >> 48) as i16) as i64 as u64
                } else {
                    x
                }
            })
            .collect();
        Operands { a, b }
    }
}

/// The kernels a record can measure.
#[derive(Clone, Copy)]
enum Kernel {
    Path(Path),
    Naive,
}

impl Kernel {
    fn name(self) -> &'static str {
        match self {
            Kernel::Path(p) => p.name(),
            Kernel::Naive => "naive",
        }
    }

    /// Every product of the batch, one after the other; each call spreads
    /// itself over the current pool.
    fn run(self, shape: &Shape, ops: &Operands, c: &mut [u64]) -> Result<()> {
        let (m, k, n) = (shape.m, shape.k, shape.n);
        let heads = ops
            .a
            .chunks_exact(m * k)
            .zip(ops.b.chunks_exact(k * n))
            .zip(c.chunks_exact_mut(m * n));
        for ((a, b), c) in heads {
            match (self, shape.layout) {
                (Kernel::Path(p), Layout::B) => p.matmul(a, b, c, m, k, n)?,
                (Kernel::Path(p), Layout::Bt) => p.matmul_bt(a, b, c, m, k, n)?,
                (Kernel::Naive, Layout::B) => linalg::matmul_naive(a, b, c, m, k, n)?,
                (Kernel::Naive, Layout::Bt) => bail!("the naive loop takes b, not bᵀ"),
            }
        }
        Ok(())
    }
}

/// Runs `kernel` on `threads` threads; returns seconds per call and the
/// output.
fn measure(
    kernel: Kernel,
    shape: &Shape,
    ops: &Operands,
    threads: usize,
    reps: usize,
) -> Result<(f64, Vec<u64>)> {
    let mut c = vec![0u64; shape.batch * shape.m * shape.n];
    let secs = linalg::on_threads(threads, || {
        median_seconds(reps, || kernel.run(shape, ops, &mut c))
    })
    .map_err(|e| anyhow!("building a {threads}-thread pool: {e}"))??;
    Ok((secs, c))
}

/// How many cores' worth of work two threads get done right now: fixed
/// integer work on one thread, then the same on each of two, wall clock
/// compared. On an idle two-core machine this is about 2; when other work
/// competes for the cores, the two-thread records cannot beat it.
fn two_thread_capacity() -> f64 {
    fn work() {
        let mut x = 1u64;
        for i in 0..200_000_000u64 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i);
        }
        std::hint::black_box(x);
    }
    let start = Instant::now();
    work();
    let one = start.elapsed().as_secs_f64();
    let start = Instant::now();
    std::thread::scope(|s| {
        s.spawn(work);
        work();
    });
    2.0 * one / start.elapsed().as_secs_f64()
}

pub fn run() -> Result<String> {
    let capacity = two_thread_capacity();
    println!("two threads currently get {capacity:.2} cores' worth of work done (2.00 when idle)");
    let detected = Path::detect();
    let available = Path::available();
    let names: Vec<&str> = available.iter().map(|p| p.name()).collect();
    println!(
        "kernel paths on this CPU: {} (using {})",
        names.join(", "),
        detected.name()
    );
    let mut records = Vec::new();
    for (i, shape) in SHAPES.iter().enumerate() {
        let ops = Operands::new(shape, i as u8 + 1);
        let macs = (shape.batch * shape.m * shape.k * shape.n) as f64;
        let reps = (MACS_PER_SHAPE / macs).clamp(5.0, 200.0) as usize;

        // The reference for this shape's outputs: the naive loop where it
        // applies and is quick enough, otherwise another kernel path.
        let reference = if shape.name == "qkv_proj" {
            Kernel::Naive
        } else {
            Kernel::Path(*available.last().context("no kernel path")?)
        };
        let mut want = vec![0u64; shape.batch * shape.m * shape.n];
        reference.run(shape, &ops, &mut want)?;

        let mut runs: Vec<(Kernel, usize, usize)> = vec![
            (Kernel::Path(detected), 1, reps),
            (Kernel::Path(detected), 2, reps),
        ];
        if shape.name == "qkv_proj" {
            for &p in &available[1..] {
                runs.push((Kernel::Path(p), 1, 5));
            }
            runs.push((Kernel::Naive, 1, 3));
        }
        let mut one_thread = None;
        for (kernel, threads, reps) in runs {
            let (secs, c) = measure(kernel, shape, &ops, threads, reps)?;
            // A benchmark of a wrong answer is worthless.
            if c != want {
                bail!(
                    "{} on {} with {threads} thread(s) disagrees with {}",
                    shape.name,
                    kernel.name(),
                    reference.name()
                );
            }
            let gmac_per_s = macs / secs / 1e9;
            let first_path = matches!(kernel, Kernel::Path(p) if p == detected);
            if first_path && threads == 1 {
                one_thread = Some(secs);
            }
            let speedup = (first_path && threads > 1)
                .then(|| one_thread.map(|t| t / secs))
                .flatten();
            records.push(Record {
                name: format!("{}/{}", shape.name, kernel.name()),
                m: shape.m,
                k: shape.k,
                n: shape.n,
                threads,
                gmac_per_s,
                ns_per_mac: 1.0 / gmac_per_s,
                path: kernel.name(),
                batch: shape.batch,
                layout: shape.layout.name(),
                ms_per_call: secs * 1e3,
                speedup_vs_1_thread: speedup,
                two_thread_capacity: (threads == 2).then_some(capacity),
            });
        }
    }
    print_table(&records);
    Ok(serde_json::to_string_pretty(&records)?)
}

fn print_table(records: &[Record]) {
    println!(
        "\n{:<22} {:>4} {:>5} {:>5} {:>5} {:>7} {:>10} {:>8} {:>8} {:>5}",
        "name", "m", "k", "n", "batch", "threads", "ms/call", "GMAC/s", "ns/MAC", "x1→2"
    );
    for r in records {
        println!(
            "{:<22} {:>4} {:>5} {:>5} {:>5} {:>7} {:>10.3} {:>8.2} {:>8.4} {:>5}",
            r.name,
            r.m,
            r.k,
            r.n,
            r.batch,
            r.threads,
            r.ms_per_call,
            r.gmac_per_s,
            r.ns_per_mac,
            r.speedup_vs_1_thread
                .map_or_else(|| "-".to_owned(), |s| format!("{s:.2}"))
        );
    }
    println!(
        "\nGMAC/s: multiply-adds mod 2^64 per second of wall clock with all threads \
         (batched shapes count every head); median of repeated calls. x1→2 is bounded \
         by the two-thread capacity printed above."
    );
}
