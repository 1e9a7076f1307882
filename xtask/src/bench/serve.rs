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

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::command::{self, cargo, workspace_root};

/// Seventeen MiniLM tokens ([CLS] and [SEP] included).
const SHORT: &str = "Two servers compute a private sentence embedding together; neither sees it.";

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub fn run() -> Result<String> {
    command::run(&mut cargo([
        "build",
        "--release",
        "--quiet",
        "-p",
        "suffuse-host",
    ]))?;
    let target = command::target_dir()?;
    let bin = target.join("release/suffuse");
    let queries = env_or("SUFFUSE_BENCH_SERVE_QUERIES", 100);
    let clients = env_or("SUFFUSE_BENCH_SERVE_CLIENTS", 4);
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
    let deal_start = Instant::now();
    let dealt = dir.join("dealer.json");
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
        &s(&dealt),
    ]))?;
    let deal_s = deal_start.elapsed().as_secs_f64();
    let servers = Servers::start(&bin, &model, &dir, clients)?;
    let load = drive(&bin, &model, &dir, &servers.addrs, queries, clients);
    let rss = servers.stop();
    let (load, rss) = (load?, rss?);
    let record = json!({
        "model": model, "tokens": 17, "queries": queries, "clients": clients,
        "max_concurrent": clients, "transport": "mutual TLS over loopback",
        "pool_deal_s": deal_s, "pool_sets_per_s": queries as f64 / deal_s,
        "served": load.latencies.len(), "failed": load.failed, "wall_s": load.wall_s,
        "queries_per_s": load.latencies.len() as f64 / load.wall_s,
        "latency_s": quantiles(&load.latencies), "online_s": quantiles(&load.online),
        "peak_rss_bytes": {"p0": rss[0], "p1": rss[1]},
        "cpu": command::capture(&mut Command::new("nproc")).ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()),
    });
    println!("{}", serde_json::to_string_pretty(&record)?);
    Ok(serde_json::to_string_pretty(&record)?)
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
                .args(["--max-concurrent", &k.to_string()])
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

    /// Reads each server's peak RSS, then SIGTERMs it and checks it exits 0.
    fn stop(mut self) -> Result<[u64; 2]> {
        let mut rss = [0u64; 2];
        for (i, c) in self.children.iter_mut().enumerate() {
            rss[i] = peak_rss(c.id()).unwrap_or(0);
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
fn announced(log: &Path) -> Result<String> {
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
    wall_s: f64,
}

/// `clients` threads, each running queries one after another until
/// `queries` have been started.
fn drive(
    bin: &Path,
    model: &str,
    dir: &Path,
    addrs: &str,
    queries: usize,
    clients: usize,
) -> Result<Load> {
    let next = AtomicUsize::new(0);
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
                    let r = one_query(bin, model, dir, addrs, n);
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
        wall_s,
    })
}

fn one_query(bin: &Path, model: &str, dir: &Path, addrs: &str, n: usize) -> Result<(f64, f64)> {
    let report: PathBuf = dir.join(format!("query-{n}.json"));
    let start = Instant::now();
    let out = Command::new(bin)
        .args([
            "query",
            "--model",
            model,
            "--servers",
            addrs,
            "--timeout",
            "300",
        ])
        .arg("--tls")
        .arg(dir.join("certs"))
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
