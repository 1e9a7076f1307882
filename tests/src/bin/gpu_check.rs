//! The device half of the GPU check bundle (`cargo xtask gpu-bundle`): what
//! only a GPU can show, run by the bundle's script on a lent machine with
//! no Rust toolchain. Each subcommand prints one JSON object on stdout.
//!
//! * `probe`: the driver, the device, NVRTC.
//! * `conformance CODE`: the whole conformance harness on the device, with
//!   kernels from `nvrtc`, the checked-in `ptx` or `auto`.
//! * `emu-vs-device N`: N random evaluations over several shapes on the
//!   device, on the CPU emulator of the same kernels and on the CPU backend;
//!   all three must agree.
//! * `bench`: DCF evaluation at n = 50 with keys resident on the device (bit
//!   output and a 64-bit payload), the full `BatchEval::eval` path, key
//!   generation on the GPU against the CPU backend on every core, a q/k/v
//!   product with RoPE folded into its weights (`turned_matmul`, SmolLM2's
//!   shape at a 64-token prefill), and the CPU backend's scaling from 2 to
//!   16 threads; every timed result is compared with the CPU backend's.
//!
//! With `--emulated` first, `emu-vs-device` and `bench` run on the CPU
//! emulator instead of a device, at 1/256 of the sizes: how the bundle's
//! logic is tested on machines without a GPU. Those figures are no claim
//! about anything.

use std::process::ExitCode;
use std::time::Instant;

use serde_json::{Value, json};
use suffuse_accel_cpu::CpuEval;
use suffuse_accel_cuda::{Code, CudaEval, Device, Launcher, layout, nvrtc};
use suffuse_core::batch::{BatchEval, Pairing, Turned};
use suffuse_core::fss::{GenBatch, KeyBatch, Kind, Output, Params, Party};
use suffuse_core::prg::{Block, Prg};
use suffuse_core::ring::Width;
use suffuse_tests::conformance;

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let emulated = args.first().is_some_and(|a| a == "--emulated");
    if emulated {
        args.remove(0);
    }
    let result = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["probe"] => probe(),
        ["conformance", code] => conform(code),
        ["emu-vs-device", n] if emulated => {
            count(n).and_then(|n| emu_vs(&CudaEval::emulated(), n >> 8))
        }
        ["emu-vs-device", n] => count(n).and_then(|n| emu_vs(&open(Code::Auto)?, n)),
        ["bench"] if emulated => bench(&CudaEval::emulated(), 8),
        ["bench"] => open(Code::Auto).and_then(|d| bench(&d, 0)),
        _ => Err(
            "usage: gpu_check [--emulated] probe | conformance auto|nvrtc|ptx | \
                  emu-vs-device N | bench"
                .into(),
        ),
    };
    match result {
        Ok(v) => {
            println!("{v}");
            if v.get("passed") == Some(&Value::Bool(false)) {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            println!("{}", json!({ "error": e }));
            eprintln!("gpu_check: {e}");
            ExitCode::FAILURE
        }
    }
}

fn count(n: &str) -> Result<usize, String> {
    n.parse().map_err(|e| format!("{n}: {e}"))
}

fn open(code: Code) -> Result<CudaEval<Device>, String> {
    CudaEval::open(0, code, None).map_err(|e| e.to_string())
}

fn probe() -> Result<Value, String> {
    let nvrtc_version = nvrtc::version().map(|(a, b)| format!("{a}.{b}"));
    let eval = open(Code::Auto)?;
    let (free, total) = eval.launcher().memory_info().map_err(|e| e.to_string())?;
    Ok(json!({
        "device": eval.device_name(),
        "kernels": eval.code().to_string(),
        "nvrtc": nvrtc_version.map_err(|e| e.to_string()),
        "memory_free_bytes": free,
        "memory_total_bytes": total,
        "budget_bytes": eval.memory_budget(),
        "self_test": eval.self_test().map_err(|e| e.to_string()),
    }))
}

fn conform(code: &str) -> Result<Value, String> {
    let code = match code {
        "auto" => Code::Auto,
        "nvrtc" => Code::Nvrtc,
        "ptx" => Code::Ptx,
        other => return Err(format!("unknown kernel source {other}")),
    };
    let eval = open(code)?.with_device_hash_min(0);
    let start = Instant::now();
    let report = conformance::run(&eval);
    Ok(json!({
        "kernels": eval.code().to_string(),
        "device": eval.device_name(),
        "passed": report.passed(),
        "calls": report.calls,
        "outputs": report.outputs,
        "failures": report.failures.iter().take(25).collect::<Vec<_>>(),
        "seconds": start.elapsed().as_secs_f64(),
        "peak_device_bytes": eval.peak_memory(),
    }))
}

/// `count` key pairs of `p` from `seed`, dealt by core, and their α.
fn dealt(p: &Params, count: usize, seed: &[u8; 16]) -> ([Vec<u8>; 2], Vec<u64>) {
    let mut rng = Prg::new(seed);
    let alphas: Vec<u64> = (0..count)
        .map(|_| rng.next_u64() & p.domain().mask())
        .collect();
    let betas: Vec<u64> = (0..count * p.output().words())
        .map(|_| rng.next_u64())
        .collect();
    let roots: Vec<[Block; 2]> = (0..count)
        .map(|_| [rng.next_block(), rng.next_block()])
        .collect();
    let random: Vec<u64> = (0..count * p.gen_random_words())
        .map(|_| rng.next_u64())
        .collect();
    let batch = GenBatch::new(*p, &alphas, &betas, &roots, &random).expect("batch shape");
    let len = count * p.key_len();
    let mut keys = [vec![0u8; len], vec![0u8; len]];
    let [k0, k1] = &mut keys;
    CpuEval::new().generate(&batch, k0, k1).expect("dealing");
    (keys, alphas)
}

/// Points near each α (where comparisons flip) and uniform ones.
fn points_near(alphas: &[u64], per_key: usize, rng: &mut Prg) -> Vec<u64> {
    alphas
        .iter()
        .flat_map(|a| (0..per_key).map(move |j| (*a, j)))
        .map(|(a, j)| match j % 4 {
            0 => a,
            1 => a.wrapping_sub(1),
            2 => a.wrapping_add(1),
            _ => rng.next_u64(),
        })
        .collect()
}

/// The one-round ReLU's pair key at a max tree's width.
const PAIR: Params = Params::new(Kind::Dcf, Width::of(28), Output::Pair(Width::of(64)));

fn shapes() -> [Params; 5] {
    [
        Params::dcf_bit(Width::of(50)),
        Params::new(Kind::Dcf, Width::of(50), Output::Ring(Width::of(64))),
        Params::new(Kind::Dcf, Width::of(26), Output::Ring(Width::of(13))),
        Params::new(Kind::Dpf, Width::of(64), Output::Ring(Width::of(50))),
        PAIR,
    ]
}

fn emu_vs<L: Launcher>(device: &CudaEval<L>, n: usize) -> Result<Value, String> {
    let emu = CudaEval::emulated();
    let cpu = CpuEval::new();
    let per_key = 4;
    let mut rng = Prg::new(b"gpu_check emu v1");
    let mut cases = Vec::new();
    let mut passed = true;
    for p in shapes() {
        let count = (n / shapes().len() / per_key).max(1);
        let (keys, alphas) = dealt(&p, count, b"gpu_check keys 1");
        let points = points_near(&alphas, per_key, &mut rng);
        let batch = KeyBatch::new(p, Party::P1, &keys[1]).map_err(|e| e.to_string())?;
        let mut outs = [(); 3].map(|()| vec![0u64; points.len() * p.output().words()]);
        let start = Instant::now();
        for (eval, out) in [device as &dyn BatchEval, &emu, &cpu]
            .iter()
            .zip(outs.iter_mut())
        {
            eval.eval(&batch, &points, out)
                .map_err(|e| format!("{}: {e}", eval.name()))?;
        }
        let [d, e, c] = &outs;
        let differ = (0..d.len())
            .filter(|&q| d[q] != e[q] || d[q] != c[q])
            .count();
        passed &= differ == 0;
        cases.push(json!({
            "params": format!("{p:?}"),
            "evaluations": points.len(),
            "differ": differ,
            "seconds": start.elapsed().as_secs_f64(),
        }));
    }
    Ok(json!({ "passed": passed, "cases": cases, "device": device.device_name() }))
}

/// The benchmarks at 1/2^`shift` of their full sizes.
fn bench<L: Launcher>(device: &CudaEval<L>, shift: u32) -> Result<Value, String> {
    let cpu = CpuEval::new();
    let mut rng = Prg::new(b"gpu_check bench1");
    let mut results = Vec::new();
    let mut passed = true;
    for (p, count) in [
        (Params::dcf_bit(Width::of(50)), 1 << (21 - shift)),
        (
            Params::new(Kind::Dcf, Width::of(50), Output::Ring(Width::of(64))),
            1 << (20 - shift),
        ),
        (PAIR, 1 << (20 - shift)),
    ] {
        let (keys, alphas) = dealt(&p, count, b"gpu_check keys 2");
        let points = points_near(&alphas, 4, &mut rng);
        let batch = KeyBatch::new(p, Party::P0, &keys[0]).map_err(|e| e.to_string())?;
        let (r, ok) = bench_eval(device, &cpu, &batch, &points)?;
        passed &= ok;
        results.push(r);
    }
    let (keygen, ok) = bench_gen(device, Params::dcf_bit(Width::of(50)), shift)?;
    passed &= ok;
    let (keygen_pair, ok) = bench_gen(device, PAIR, shift)?;
    passed &= ok;
    let (turned, ok) = bench_turned(device, &cpu, shift)?;
    passed &= ok;
    Ok(json!({
        "device": device.device_name(),
        "backend": device.name(),
        "passed": passed,
        "eval": results,
        "keygen": keygen,
        "keygen_pair": keygen_pair,
        "turned_matmul": turned,
        "cpu_scaling": cpu_scaling(shift)?,
        "peak_device_bytes": device.peak_memory(),
    }))
}

fn per_second(items: usize, seconds: f64) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let items = items as f64;
    items / seconds.max(1e-12)
}

/// One shape: keys resident, the whole `eval` path, and the CPU backend.
fn bench_eval<L: Launcher>(
    device: &CudaEval<L>,
    cpu: &CpuEval,
    batch: &KeyBatch<'_>,
    points: &[u64],
) -> Result<(Value, bool), String> {
    let resident = device
        .time_resident_eval(batch, points, 5)
        .map_err(|e| e.to_string())?;
    let words = batch.params().output().words();
    let mut want = vec![0u64; points.len() * words];
    let t = Instant::now();
    cpu.eval(batch, points, &mut want)
        .map_err(|e| e.to_string())?;
    let cpu_s = t.elapsed().as_secs_f64();
    let mut got = vec![0u64; points.len() * words];
    let before = device.phase_seconds();
    let t = Instant::now();
    device
        .eval(batch, points, &mut got)
        .map_err(|e| e.to_string())?;
    let full_s = t.elapsed().as_secs_f64();
    let phases = phases_since(&before, &device.phase_seconds());
    let ok = got == want && resident.outputs == want;
    Ok((
        json!({
            "params": format!("{:?}", batch.params()),
            "keys": batch.count(),
            "evaluations": points.len(),
            "resident_evals_per_s": per_second(points.len(), resident.launch_s),
            "resident_launch_s": resident.launch_s,
            "upload_s": resident.upload_s,
            "full_path_evals_per_s": per_second(points.len(), full_s),
            "full_path_phases_s": phases,
            "key_bytes": layout::offsets(&batch.params(), batch.count()).total * 8,
            "cpu_evals_per_s": per_second(points.len(), cpu_s),
            "cpu_threads": rayon_threads(),
            "equal_to_cpu": ok,
        }),
        ok,
    ))
}

/// A q/k/v product with RoPE in its weights at SmolLM2's shape (576 inputs,
/// 960 outputs, 768 turned in adjacent pairs; 64 rows, fewer by `shift`):
/// the device's whole call, uploads included, against the CPU backend.
fn bench_turned<L: Launcher>(
    device: &CudaEval<L>,
    cpu: &CpuEval,
    shift: u32,
) -> Result<(Value, bool), String> {
    let (m, k, n, t) = ((64usize >> shift).max(1), 576, 960, 768);
    let mut rng = Prg::new(b"gpu_check turn 1");
    let [a, b, own, other] = conformance::turned_operands(&mut rng, [m, k, n, t]);
    let turned = Turned {
        m,
        k,
        n,
        turned: t,
        pairing: Pairing::Adjacent,
        own: &own,
        other: &other,
        frac: 16,
    };
    let timed = |eval: &dyn BatchEval| -> Result<(f64, Vec<u64>), String> {
        let mut c = vec![0u64; m * n];
        let start = Instant::now();
        eval.turned_matmul(&turned, &a, &b, &mut c)
            .map_err(|e| e.to_string())?;
        Ok((start.elapsed().as_secs_f64(), c))
    };
    let (cpu_s, want) = timed(cpu)?;
    let (device_s, got) = timed(device)?;
    let ok = got == want;
    Ok((
        json!({
            "m": m, "k": k, "n": n, "turned": t,
            "device_s": device_s,
            "cpu_s": cpu_s,
            "cpu_threads": rayon_threads(),
            "equal_to_cpu": ok,
        }),
        ok,
    ))
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// Key generation on the GPU against the CPU backend on every core.
fn bench_gen<L: Launcher>(
    device: &CudaEval<L>,
    p: Params,
    shift: u32,
) -> Result<(Value, bool), String> {
    let count = 1 << (20 - shift);
    let mut rng = Prg::new(b"gpu_check gen v1");
    let alphas: Vec<u64> = (0..count).map(|_| rng.next_u64()).collect();
    let mut words = |n: usize| -> Vec<u64> { (0..n).map(|_| rng.next_u64()).collect() };
    let betas = words(count * p.output().words());
    let random = words(count * p.gen_random_words());
    let roots: Vec<[Block; 2]> = (0..count)
        .map(|_| [rng.next_block(), rng.next_block()])
        .collect();
    let batch = GenBatch::new(p, &alphas, &betas, &roots, &random).map_err(|e| e.to_string())?;
    let len = count * p.key_len();
    let timed = |eval: &dyn BatchEval| -> Result<(f64, [Vec<u8>; 2]), String> {
        let mut keys = [vec![0u8; len], vec![0u8; len]];
        let [k0, k1] = &mut keys;
        let t = Instant::now();
        eval.generate(&batch, k0, k1).map_err(|e| e.to_string())?;
        Ok((t.elapsed().as_secs_f64(), keys))
    };
    let before = device.phase_seconds();
    let (gpu_s, on_gpu) = timed(device)?;
    let phases = phases_since(&before, &device.phase_seconds());
    let (cpu_s, on_cpu) = timed(&CpuEval::new())?;
    let ok = on_gpu == on_cpu;
    Ok((
        json!({
            "params": format!("{p:?}"),
            "key_pairs": count,
            "gpu_pairs_per_s": per_second(count, gpu_s),
            "cpu_pairs_per_s": per_second(count, cpu_s),
            "cpu_threads": rayon_threads(),
            "gpu_over_cpu": cpu_s / gpu_s.max(1e-12),
            "gpu_phases_s": phases,
            "key_bytes": len,
            "equal_to_cpu": ok,
        }),
        ok,
    ))
}

/// Seconds per device phase between two [`CudaEval::phase_seconds`].
fn phases_since(before: &[(&str, f64)], after: &[(&'static str, f64)]) -> Value {
    let map: serde_json::Map<String, Value> = after
        .iter()
        .zip(before)
        .map(|((name, a), (_, b))| ((*name).to_owned(), json!(a - b)))
        .collect();
    Value::Object(map)
}

/// The CPU backend's DCF evaluation on 2, 4, 8 and 16 threads.
fn cpu_scaling(shift: u32) -> Result<Value, String> {
    let p = Params::dcf_bit(Width::of(50));
    let (keys, alphas) = dealt(&p, 1 << (18 - shift), b"gpu_check keys 3");
    let mut rng = Prg::new(b"gpu_check scale1");
    let points = points_near(&alphas, 4, &mut rng);
    let batch = KeyBatch::new(p, Party::P0, &keys[0]).map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    for threads in [2, 4, 8, 16] {
        let eval = CpuEval::with_threads(threads).map_err(|e| e.to_string())?;
        let mut out = vec![0u64; points.len()];
        eval.eval(&batch, &points, &mut out)
            .map_err(|e| e.to_string())?;
        let t = Instant::now();
        eval.eval(&batch, &points, &mut out)
            .map_err(|e| e.to_string())?;
        let s = t.elapsed().as_secs_f64();
        rows.push(json!({
            "threads": threads,
            "evals_per_s": per_second(points.len(), s),
            "aes": eval.aes_path(),
        }));
    }
    Ok(json!({ "params": format!("{p:?}"), "evaluations": points.len(), "rows": rows }))
}
