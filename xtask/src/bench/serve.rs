//! The key-pool server under load: a pool dealt beforehand (`suffuse dealer
//! --count`), both servers as `suffuse serve --keys-dir` over mutual TLS on
//! loopback, and concurrent clients (`suffuse query` processes) sending
//! MiniLM queries of 17 tokens until the pool's sets are all spent.
//!
//! Reported: queries per second over the whole load, latency per query
//! (p50/p99) both as the client process's wall time (start, model load,
//! TLS, agreement, query) and as the online time inside it, and each
//! server's peak RSS (`VmHWM`, read before SIGTERM). `SUFFUSE_BENCH_SERVE_QUERIES`
//! and `SUFFUSE_BENCH_SERVE_CLIENTS` override the 100 queries and 4 clients.
//!
//! Then the refill: a `dealer --keep-pool` beside the same servers while
//! `SUFFUSE_BENCH_SERVE_REFILL_QUERIES` (default half the queries; 0 skips
//! it) more are served, reporting sets dealt and spent per minute and the
//! pool level each second (`SUFFUSE_BENCH_SERVE_KEEP`, default twice the
//! clients).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::command::{self, workspace_root};

/// Seventeen MiniLM tokens (`[CLS]` and `[SEP]` included).
const SHORT: &str = "Two servers compute a private sentence embedding together; neither sees it.";

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub fn run() -> Result<String> {
    let bin = super::release_suffuse()?;
    let target = command::target_dir()?;
    let queries = env_or("SUFFUSE_BENCH_SERVE_QUERIES", 100);
    let clients = env_or("SUFFUSE_BENCH_SERVE_CLIENTS", 4);
    let refill_queries = env_or("SUFFUSE_BENCH_SERVE_REFILL_QUERIES", queries / 2);
    let keep = env_or("SUFFUSE_BENCH_SERVE_KEEP", 2 * clients);
    let minilm = workspace_root().join("models/all-MiniLM-L6-v2");
    let model = match minilm.exists() {
        true => minilm.to_string_lossy().into_owned(),
        false => {
            println!("{} is absent: generated-minilm instead", minilm.display());
            "generated-minilm".to_string()
        }
    };
    let dir = target.join("bench/serve-run");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let s = |p: &Path| p.to_string_lossy().into_owned();
    command::run(Command::new(&bin).args(["certs", "--out", &s(&dir.join("certs"))]))?;
    let load_before = loadavg();
    let deal_start = Instant::now();
    command::run(Command::new(&bin).args([
        "dealer",
        "--model",
        &model,
        "--seq",
        "17",
        "--count",
        &queries.to_string(),
        "--out",
        &s(&dir.join("pool")),
        "--report-json",
        &s(&dir.join("dealer.json")),
    ]))?;
    let deal_s = deal_start.elapsed().as_secs_f64();
    let servers = Servers::start(&bin, &model, &dir, clients)?;
    let run = Run {
        bin: &bin,
        model: &model,
        dir: &dir,
        addrs: &servers.addrs,
    };
    let load = drive(&run, queries, clients, false);
    let rss_load = servers.peak_rss();
    let refill = match (&load, refill_queries) {
        (Ok(_), 1..) => Some(refill(&run, refill_queries, clients, keep)),
        _ => None,
    };
    let rss = servers.stop();
    let (load, rss) = (load?, rss?);
    let refill = refill.transpose()?;
    let record = json!({
        "model": model, "tokens": 17, "queries": queries, "clients": clients,
        "max_concurrent": clients, "transport": "mutual TLS over loopback",
        "pool_deal_s": deal_s, "pool_sets_per_min": 60.0 * queries as f64 / deal_s,
        "load": load.json(),
        "peak_rss_bytes_after_load": {"p0": rss_load[0], "p1": rss_load[1]},
        "peak_rss_bytes": {"p0": rss[0], "p1": rss[1]},
        "refill": refill,
        "cpu": cpu_name(), "cores": std::thread::available_parallelism().map(|n| n.get()).ok(),
        "loadavg_before": load_before, "loadavg_after": loadavg(),
    });
    println!("{}", serde_json::to_string_pretty(&record)?);
    Ok(serde_json::to_string_pretty(&record)?)
}

/// What every query of the load needs to reach the servers.
struct Run<'a> {
    bin: &'a Path,
    model: &'a str,
    dir: &'a Path,
    addrs: &'a str,
}

/// The pool refilled while it serves: `dealer --count 0 --keep-pool keep`
/// beside the running servers, once it has filled the (spent) pool to
/// `keep`, then `queries` more queries. Clients told the pool is empty wait
/// and retry, so a dealer slower than the load shows as waits and a pool
/// level near zero, not as failures.
fn refill(run: &Run<'_>, queries: usize, clients: usize, keep: usize) -> Result<Value> {
    let log = run.dir.join("refill-dealer.log");
    let mut dealer = Command::new(run.bin)
        .args([
            "dealer", "--model", run.model, "--seq", "17", "--count", "0",
        ])
        .args(["--keep-pool", &keep.to_string()])
        .arg("--out")
        .arg(run.dir.join("pool"))
        .arg("--report-json")
        .arg(run.dir.join("refill-dealer.json"))
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .context("starting the refilling dealer")?;
    let filled = wait_for_level(&run.dir.join("pool"), keep);
    let measured = filled.and_then(|()| {
        let dealt_before = dealt_lines(&log);
        let stop = AtomicBool::new(false);
        let (load, levels) = std::thread::scope(|s| {
            let sampler = s.spawn(|| sample_levels(&run.dir.join("pool"), &stop));
            let load = drive(run, queries, clients, true);
            stop.store(true, Ordering::Relaxed);
            (load, sampler.join().unwrap_or_default())
        });
        let load = load?;
        let dealt = dealt_lines(&log) - dealt_before;
        let minutes = load.wall_s / 60.0;
        let level: Vec<f64> = levels.iter().map(|&l| l as f64).collect();
        Ok(json!({
            "keep_pool": keep, "load": load.json(),
            "sets_dealt_during_load": dealt,
            "refill_sets_per_min": dealt as f64 / minutes,
            "consumed_sets_per_min": load.latencies.len() as f64 / minutes,
            "pool_level": {"samples_1s": levels, "min": level.iter().copied().reduce(f64::min),
                "mean": level.iter().sum::<f64>() / level.len().max(1) as f64},
        }))
    });
    command::run(Command::new("kill").args(["-TERM", &dealer.id().to_string()]))?;
    if !dealer.wait()?.success() {
        bail!("the refilling dealer did not exit 0 on SIGTERM");
    }
    measured
}

/// Unspent sets: set folders that still hold P0's key file (a folder's
/// name is its id; a dealer's work in progress is hidden).
fn pool_level(pool: &Path) -> usize {
    std::fs::read_dir(pool)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                .filter(|e| e.path().join("p0.keys").exists())
                .count()
        })
        .unwrap_or(0)
}

fn wait_for_level(pool: &Path, keep: usize) -> Result<()> {
    let until = Instant::now() + Duration::from_secs(60 * keep as u64 + 120);
    while pool_level(pool) < keep {
        if Instant::now() > until {
            bail!("the refilling dealer did not fill the pool to {keep}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

fn sample_levels(pool: &Path, stop: &AtomicBool) -> Vec<usize> {
    let mut levels = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        levels.push(pool_level(pool));
        std::thread::sleep(Duration::from_secs(1));
    }
    levels
}

fn dealt_lines(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("dealt key set"))
        .count()
}

fn loadavg() -> Option<String> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.trim().to_string())
}

fn cpu_name() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("model name"))?;
    Some(line.split(':').nth(1)?.trim().to_string())
}

fn quantiles(v: &[f64]) -> Value {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let at = |q: f64| {
        v.get(((v.len() as f64 - 1.0) * q).round() as usize)
            .copied()
    };
    json!({"p50": at(0.5), "p99": at(0.99), "max": v.last()})
}

struct Servers {
    children: Vec<Child>,
    addrs: String,
}

impl Servers {
    fn start(bin: &Path, model: &str, dir: &Path, k: usize) -> Result<Servers> {
        let mut children = Vec::new();
        let mut addrs: Vec<String> = Vec::new();
        for party in 0..2u8 {
            let log = dir.join(format!("p{party}.log"));
            let peer = addrs
                .first()
                .cloned()
                .unwrap_or_else(|| "unused".to_string());
            let child = Command::new(bin)
                .args(["serve", "--party", &party.to_string(), "--model", model])
                .args([
                    "--listen",
                    "127.0.0.1:0",
                    "--peer",
                    &peer,
                    "--timeout",
                    "300",
                ])
                // Every client of the bench comes from loopback: one address.
                .args(["--max-concurrent", &k.to_string()])
                .args(["--max-per-client", &k.to_string()])
                .arg("--keys-dir")
                .arg(dir.join("pool"))
                .arg("--state-dir")
                .arg(dir.join(format!("state{party}")))
                .arg("--tls")
                .arg(dir.join("certs"))
                .stderr(std::fs::File::create(&log)?)
                .spawn()
                .context("starting a server")?;
            children.push(child);
            addrs.push(announced(&log)?);
        }
        Ok(Servers {
            children,
            addrs: addrs.join(","),
        })
    }

    /// Each server's peak RSS so far (`VmHWM`; 0 if unreadable).
    fn peak_rss(&self) -> [u64; 2] {
        let mut rss = [0u64; 2];
        for (r, c) in rss.iter_mut().zip(&self.children) {
            *r = peak_rss(c.id()).unwrap_or(0);
        }
        rss
    }

    /// Reads each server's peak RSS, then SIGTERMs it and checks it exits 0.
    fn stop(mut self) -> Result<[u64; 2]> {
        let rss = self.peak_rss();
        for c in &self.children {
            command::run(Command::new("kill").args(["-TERM", &c.id().to_string()]))?;
        }
        for c in &mut self.children {
            if !c.wait()?.success() {
                bail!("a server did not exit 0 on SIGTERM");
            }
        }
        Ok(rss)
    }
}

/// The address a server announces on its first log line.
pub(super) fn announced(log: &Path) -> Result<String> {
    let until = Instant::now() + Duration::from_secs(120);
    while Instant::now() < until {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.contains("listening on ")) {
            return Ok(line.rsplit(' ').next().unwrap_or_default().to_string());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("{} never announced its address", log.display())
}

fn peak_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

struct Load {
    latencies: Vec<f64>,
    online: Vec<f64>,
    failed: usize,
    /// Times a client was told the pool was empty and retried.
    empty_waits: usize,
    wall_s: f64,
}

impl Load {
    fn json(&self) -> Value {
        json!({
            "served": self.latencies.len(), "failed": self.failed,
            "empty_pool_waits": self.empty_waits, "wall_s": self.wall_s,
            "queries_per_s": self.latencies.len() as f64 / self.wall_s,
            "latency_s": quantiles(&self.latencies), "online_s": quantiles(&self.online),
        })
    }
}

/// `clients` threads, each running queries one after another until
/// `queries` have been started; with `retry_empty`, a query told the pool
/// is empty waits a second and is sent again.
fn drive(run: &Run<'_>, queries: usize, clients: usize, retry_empty: bool) -> Result<Load> {
    let next = AtomicUsize::new(0);
    let waits = AtomicUsize::new(0);
    let done = Mutex::new((Vec::new(), Vec::new(), 0usize));
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..clients {
            s.spawn(|| {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= queries {
                        break;
                    }
                    let r = loop {
                        match one_query(run, n) {
                            Err(e) if retry_empty && e.to_string().contains(EMPTY) => {
                                waits.fetch_add(1, Ordering::Relaxed);
                                std::thread::sleep(Duration::from_secs(1));
                            }
                            r => break r,
                        }
                    };
                    let mut d = done.lock().unwrap_or_else(|e| e.into_inner());
                    match r {
                        Ok((wall, online)) => {
                            d.0.push(wall);
                            d.1.push(online);
                        }
                        Err(e) => {
                            eprintln!("query failed: {e:#}");
                            d.2 += 1;
                        }
                    }
                }
            });
        }
    });
    let wall_s = start.elapsed().as_secs_f64();
    let (latencies, online, failed) = done.into_inner().unwrap_or_else(|e| e.into_inner());
    Ok(Load {
        latencies,
        online,
        failed,
        empty_waits: waits.into_inner(),
        wall_s,
    })
}

/// What `suffuse query` prints when P0 finds no set both servers hold.
const EMPTY: &str = "key pool is empty";

fn one_query(run: &Run<'_>, n: usize) -> Result<(f64, f64)> {
    let report: PathBuf = run.dir.join(format!("query-{n}.json"));
    let start = Instant::now();
    let out = Command::new(run.bin)
        .args([
            "query",
            "--model",
            run.model,
            "--servers",
            run.addrs,
            "--timeout",
            "300",
        ])
        .arg("--tls")
        .arg(run.dir.join("certs"))
        .arg("--report-json")
        .arg(&report)
        .arg(SHORT)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()?;
    let wall = start.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!("{}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let r: Value = serde_json::from_slice(&std::fs::read(&report)?)?;
    let online = r["online_s"].as_f64().unwrap_or(f64::NAN);
    Ok((wall, online))
}
