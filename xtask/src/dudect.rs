//! `cargo xtask dudect`: a dudect-style statistical timing test, the second
//! line behind `cargo xtask ct` (DESIGN.md §7). Not part of `ci`: it is slow
//! and noisy on a shared machine.
//!
//! Two classes of secret inputs, with every public input identical: a fixed
//! secret and fresh random secrets. Samples of the two classes are
//! interleaved in a public random order and timed one call at a time; Welch's
//! t-test then compares the classes' mean times. |t| above 4.5 (dudect's
//! threshold) is evidence of a secret-dependent timing difference; below it
//! says only that this many samples found none. Reported per case: t over
//! all samples and over those below the pooled 90th percentile (dudect's
//! cropping, which removes interrupt and migration outliers).
//!
//! Cases:
//! * one DCF evaluation (`dcf::eval`, k = 32, Z_2^64 output) at a fixed
//!   public point; the key is the secret (fixed α, β and roots vs random);
//! * P0's whole online phase of a 64-element GeLU (`Eval`, every round
//!   through `Protocol`, Φ by the block program), with the masks pinned so
//!   that x̂ is the same public vector in both classes; the keys, mask
//!   shares and input shares are the secret.

use std::time::Instant;

use anyhow::{Result, anyhow};
use suffuse_accel_cpu::CpuEval;
use suffuse_core::compile::MAX_KEYS;
use suffuse_core::dcf;
use suffuse_core::fss::{Kind, Output, Params, Party};
use suffuse_core::gate::activation::{self, GeluForm};
use suffuse_core::gate::{DealScratch, Eval, Gate, PartyKeys, Protocol};
use suffuse_core::prg::{Block, FixedKeyAes, Prg};
use suffuse_core::ring::Width;

use crate::command::{self, cargo};

/// Dudect's threshold on |t|.
const THRESHOLD: f64 = 4.5;

pub fn run() -> Result<()> {
    if cfg!(debug_assertions) {
        // Timing a debug build measures the debug build; rerun in release.
        return command::run(&mut cargo([
            "run",
            "--release",
            "--quiet",
            "-p",
            "xtask",
            "--",
            "dudect",
        ]))
        .map(drop);
    }
    println!("dudect: Welch t, fixed vs random secret; |t| > {THRESHOLD} flags a leak");
    let mut leaks = Vec::new();
    for (name, (all, cropped)) in [
        ("dcf eval (k = 32, Z_2^64)", dcf_case()?),
        ("gelu online, P0, 64 elements", gate_case()?),
    ] {
        println!(
            "{name:<32} n = {:>7}+{:<7} t = {:>7.2} (all), {:>7.2} (below p90)",
            all.counts[0],
            all.counts[1],
            all.t(),
            cropped.t()
        );
        if all.t().abs() > THRESHOLD && cropped.t().abs() > THRESHOLD {
            leaks.push(name);
        }
    }
    if leaks.is_empty() {
        println!("dudect: no case exceeds |t| = {THRESHOLD}");
        Ok(())
    } else {
        Err(anyhow!(
            "dudect: timing depends on the secret class in: {}",
            leaks.join(", ")
        ))
    }
}

/// Running sums for Welch's t-test over two classes.
#[derive(Default)]
struct Welch {
    counts: [f64; 2],
    sums: [f64; 2],
    squares: [f64; 2],
}

impl Welch {
    fn add(&mut self, class: usize, x: f64) {
        self.counts[class] += 1.0;
        self.sums[class] += x;
        self.squares[class] += x * x;
    }

    fn t(&self) -> f64 {
        let stat = |c: usize| {
            let n = self.counts[c];
            let mean = self.sums[c] / n;
            (mean, (self.squares[c] / n - mean * mean) * n / (n - 1.0), n)
        };
        let (m0, v0, n0) = stat(0);
        let (m1, v1, n1) = stat(1);
        (m0 - m1) / (v0 / n0 + v1 / n1).sqrt()
    }
}

/// Welch's t over all samples and over those below the pooled p90.
fn welch(samples: &[(usize, f64)]) -> (Welch, Welch) {
    let mut times: Vec<f64> = samples.iter().map(|s| s.1).collect();
    times.sort_by(f64::total_cmp);
    let p90 = times[times.len() * 9 / 10];
    let (mut all, mut cropped) = (Welch::default(), Welch::default());
    for &(class, t) in samples {
        all.add(class, t);
        if t < p90 {
            cropped.add(class, t);
        }
    }
    (all, cropped)
}

/// A public, random interleaving of the two classes.
fn classes(count: usize) -> Vec<usize> {
    let mut prg = Prg::new(&[0xd0; 16]);
    (0..count).map(|_| (prg.next_u64() & 1) as usize).collect()
}

fn dcf_case() -> Result<(Welch, Welch)> {
    const KEYS: usize = 512;
    const SAMPLES: usize = 400_000;
    let aes = FixedKeyAes::new();
    let params = Params::new(Kind::Dcf, Width::of(32), Output::Ring(Width::W64));
    let mut prg = Prg::new(&[0x5e; 16]);
    let block = |prg: &mut Prg| {
        let mut b = [0u8; 16];
        prg.fill(&mut b);
        Block::from_bytes(b)
    };
    let fixed_roots = [block(&mut prg), block(&mut prg)];
    let mut keys: [Vec<Vec<u8>>; 2] = [Vec::new(), Vec::new()];
    for (class, list) in keys.iter_mut().enumerate() {
        for _ in 0..KEYS {
            let (alpha, beta, roots) = if class == 0 {
                (0x8765_4321, 0x0123_4567_89ab_cdef, fixed_roots)
            } else {
                let a = prg.next_u64() & 0xffff_ffff;
                (a, prg.next_u64(), [block(&mut prg), block(&mut prg)])
            };
            let mut dealer = Prg::new(&if class == 0 {
                [1; 16]
            } else {
                block(&mut prg).to_bytes()
            });
            let (mut k0, mut k1) = (vec![0u8; params.key_len()], vec![0u8; params.key_len()]);
            dcf::generate(
                &aes,
                &params,
                alpha,
                beta,
                roots,
                &mut dealer,
                &mut k0,
                &mut k1,
            )
            .map_err(|e| anyhow!("{e}"))?;
            list.push(k0);
        }
    }
    let x = 0x4242_4242;
    let mut samples = Vec::with_capacity(SAMPLES);
    for (i, class) in classes(SAMPLES).into_iter().enumerate() {
        let key = &keys[class][i % KEYS];
        let t = Instant::now();
        let y = dcf::eval(&aes, &params, Party::P0, key, x).map_err(|e| anyhow!("{e}"))?;
        let ns = t.elapsed().as_nanos() as f64;
        std::hint::black_box(y);
        samples.push((class, ns));
    }
    Ok(welch(&samples))
}

/// One dealt 64-element GeLU key set, with its pinned masks and shares.
struct Set {
    seeds: [[u8; 16]; 2],
    masks: [Vec<u64>; 2],
    dcf: [Vec<Vec<u8>>; 2],
    explicit: Vec<u64>,
    x: [Vec<u64>; 2],
}

const ELEMENTS: usize = 64;

impl Set {
    /// Deals a set whose opened x̂ is `x_hat`: fixed secrets for class 0,
    /// fresh ones from `prg` for class 1.
    fn new(gate: &Gate, h: &CpuEval, x_hat: &[u64], class: usize, prg: &mut Prg) -> Result<Set> {
        let w = gate.ring();
        let mut fixed = Prg::new(&[0xf1; 16]);
        let src: &mut Prg = if class == 0 { &mut fixed } else { prg };
        let mut seeds = [[0u8; 16]; 2];
        src.fill(&mut seeds[0]);
        src.fill(&mut seeds[1]);
        let mut word = || w.reduce(src.next_u64());
        let m0: Vec<u64> = (0..ELEMENTS).map(|_| word()).collect();
        let m1: Vec<u64> = (0..ELEMENTS).map(|_| word()).collect();
        let x0: Vec<u64> = (0..ELEMENTS).map(|_| word()).collect();
        // x = x̂ − r, shared as x0 + x1.
        let x1: Vec<u64> = (0..ELEMENTS)
            .map(|i| w.sub(w.sub(x_hat[i], w.add(m0[i], m1[i])), x0[i]))
            .collect();
        let lens: Vec<usize> = (0..MAX_KEYS)
            .map(|k| {
                if k < gate.compiled.key_count {
                    gate.key_params(k).key_len() * ELEMENTS
                } else {
                    0
                }
            })
            .collect();
        let mut dcf = [
            lens.iter().map(|l| vec![0u8; *l]).collect::<Vec<_>>(),
            lens.iter().map(|l| vec![0u8; *l]).collect(),
        ];
        let mut explicit = vec![0u64; ELEMENTS * gate.explicit_words()];
        {
            let [d0, d1] = &mut dcf;
            let mut prf = vec![Block::ZERO; gate.deal_scratch_blocks(ELEMENTS, ELEMENTS)];
            let mut words = vec![0u64; DealScratch::words(ELEMENTS)];
            let mut a: [&mut [u8]; MAX_KEYS] = slices(d0);
            let mut b: [&mut [u8]; MAX_KEYS] = slices(d1);
            gate.deal(
                h,
                seeds,
                Some([&m0, &m1]),
                0,
                ELEMENTS,
                &mut a,
                &mut b,
                &mut explicit,
                &mut DealScratch::new(&mut prf, &mut words),
            )
            .map_err(|e| anyhow!("deal: {e}"))?;
        }
        Ok(Set {
            seeds,
            masks: [m0, m1],
            dcf,
            explicit,
            x: [x0, x1],
        })
    }

    fn keys(&self, p: usize) -> PartyKeys<'_> {
        PartyKeys {
            dcf: core::array::from_fn(|k| self.dcf[p][k].as_slice()),
            roots: [&[]; MAX_KEYS],
            explicit: if p == 1 { &self.explicit } else { &[] },
        }
    }

    /// Runs both parties; returns P0's online nanoseconds.
    fn time_p0(&self, gate: &Gate, cpu: &CpuEval) -> Result<f64> {
        let e = |e: suffuse_core::Error| anyhow!("{e}");
        let mut s0 = vec![0u64; gate.scratch_words(ELEMENTS)];
        let mut s1 = vec![0u64; gate.scratch_words(ELEMENTS)];
        let h = cpu.backend();
        let mut p0 = Eval::new(
            gate,
            h,
            Party::P0,
            &self.seeds[0],
            Some(&self.masks[0]),
            0,
            ELEMENTS,
            self.keys(0),
            &self.x[0],
            &mut s0,
        )
        .map_err(e)?;
        let mut p1 = Eval::new(
            gate,
            h,
            Party::P1,
            &self.seeds[1],
            Some(&self.masks[1]),
            0,
            ELEMENTS,
            self.keys(1),
            &self.x[1],
            &mut s1,
        )
        .map_err(e)?;
        let mut ns = 0.0;
        for i in 0..p0.rounds() {
            let mut m0 = vec![0u8; p0.send_len(i)];
            let mut m1 = vec![0u8; p1.send_len(i)];
            p1.prepare(i, &mut m1).map_err(e)?;
            let t = Instant::now();
            p0.prepare(i, &mut m0).map_err(e)?;
            p0.finish(i, &m1, cpu).map_err(e)?;
            ns += t.elapsed().as_nanos() as f64;
            p1.finish(i, &m0, cpu).map_err(e)?;
        }
        Ok(ns)
    }
}

fn slices(v: &mut [Vec<u8>]) -> [&mut [u8]; MAX_KEYS] {
    let mut it = v.iter_mut();
    core::array::from_fn(|_| it.next().map_or(&mut [][..], Vec::as_mut_slice))
}

fn gate_case() -> Result<(Welch, Welch)> {
    const SETS: usize = 64;
    const SAMPLES: usize = 20_000;
    let gate = activation::gelu(GeluForm::Erf, Width::W64, Width::of(26), 12)
        .map_err(|e| anyhow!("{e}"))?;
    let cpu = CpuEval::with_threads(1).map_err(|e| anyhow!("{e}"))?;
    let mut prg = Prg::new(&[0x9a; 16]);
    let x_hat: Vec<u64> = (0..ELEMENTS).map(|_| prg.next_u64()).collect();
    let fixed = Set::new(&gate, &cpu, &x_hat, 0, &mut prg)?;
    let random: Vec<Set> = (0..SETS)
        .map(|_| Set::new(&gate, &cpu, &x_hat, 1, &mut prg))
        .collect::<Result<_>>()?;
    let mut samples = Vec::with_capacity(SAMPLES);
    for (i, class) in classes(SAMPLES).into_iter().enumerate() {
        let set = if class == 0 {
            &fixed
        } else {
            &random[i % SETS]
        };
        samples.push((class, set.time_p0(&gate, &cpu)?));
    }
    Ok(welch(&samples))
}
