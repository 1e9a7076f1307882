//! Secure inference over a simulated network: the dealer, both servers and
//! the client as separate `suffuse` processes over mutual TLS, with a
//! user-space relay ([`super::relay`]) in front of each server, so that
//! the P1 → P0 link and the client's link to each server carry a one-way
//! latency and a bandwidth in each direction. Each case runs at zero
//! delay (the relays only copy), on a LAN (0.5 ms RTT, 1 GB/s) and on a
//! WAN (4 ms RTT, 400 MB/s), the settings of seed 001.
//!
//! Beside each measured online time the record has the model
//! `compute + bytes / bandwidth + rounds · RTT`: `compute` is the same
//! case's zero-delay time, `bytes` the larger of the two servers' sent
//! bytes, `rounds` the servers' rounds (the client's legs add about one
//! RTT per pass on top). For BERT-base's shape the published projections
//! of FuseFSS and SIGMA under the same model stand beside it, and the
//! record says what the network adds (the setting's time minus the
//! zero-delay time) against what it adds to FuseFSS (9.94 − 1.15 s on the
//! WAN).
//!
//! Both servers send a round's message at once, so in practice a round
//! costs one one-way latency, not a round trip: the record has that
//! model too.
//!
//! Cases: BERT-base's shape at 128 tokens (generated weights), and, when
//! `models/SmolLM2-135M-Instruct` is present, SmolLM2's prefill at bucket
//! 64 plus 8 decode passes. `SUFFUSE_NET_CASES` and `SUFFUSE_NET_SETTINGS`
//! (comma-separated names) pick some of them; `SUFFUSE_NET_RUNS` (default
//! 1) repeats each, the settings in turn, and records the median.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::e2e::{Anchor, FUSEFSS_BERT_BASE, PARAGRAPH, PROMPT_64, SIGMA_BERT_BASE};
use super::relay::{Link, Relay};
use super::serve::announced;
use crate::command;

/// A network setting.
struct Setting {
    name: &'static str,
    rtt: Duration,
    bytes_per_s: Option<f64>,
    /// Which of a [`Projection`]'s figures is for this setting (none for
    /// zero delay, the baseline).
    projected: Option<usize>,
}

const SETTINGS: &[Setting] = &[
    Setting {
        name: "zero",
        rtt: Duration::ZERO,
        bytes_per_s: None,
        projected: None,
    },
    Setting {
        name: "lan",
        rtt: Duration::from_micros(500),
        bytes_per_s: Some(1e9),
        projected: Some(0),
    },
    Setting {
        name: "wan",
        rtt: Duration::from_millis(4),
        bytes_per_s: Some(400e6),
        projected: Some(1),
    },
];

impl Setting {
    fn link(&self) -> Link {
        Link {
            latency: self.rtt / 2,
            bytes_per_s: self.bytes_per_s,
        }
    }
}

struct Case {
    name: &'static str,
    model: &'static str,
    seq: usize,
    text: &'static str,
    /// A decoder: new tokens (the prefill's and one per decode pass).
    generate: Option<usize>,
    /// Published projections under seed 001's model.
    anchors: &'static [Projection],
}

/// A system's published zero-delay figure and its own LAN and WAN
/// projections (seed 001: "BERT-base-128 corresponds to 3.99/3.36 s (LAN)
/// and 11.12/9.94 s (WAN) for Sigma/FuseFSS").
struct Projection {
    anchor: &'static Anchor,
    lan_wan_s: [f64; 2],
}

const CASES: &[Case] = &[
    Case {
        name: "bert-base-shape-128",
        model: "generated-bert-base",
        seq: 128,
        text: PARAGRAPH,
        generate: None,
        anchors: &[
            Projection {
                anchor: &FUSEFSS_BERT_BASE,
                lan_wan_s: [3.36, 9.94],
            },
            Projection {
                anchor: &SIGMA_BERT_BASE,
                lan_wan_s: [3.99, 11.12],
            },
        ],
    },
    Case {
        name: "smollm2-64-decode-8",
        model: "models/SmolLM2-135M-Instruct",
        seq: 64,
        text: PROMPT_64,
        generate: Some(9),
        anchors: &[],
    },
];

pub fn run() -> Result<String> {
    let bin = super::release_suffuse()?;
    let root = command::target_dir()?.join("bench/net-run");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let certs = root.join("certs");
    command::run(Command::new(&bin).arg("certs").arg("--out").arg(&certs))?;
    let runs = std::env::var("SUFFUSE_NET_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1usize)
        .max(1);
    let mut records = Vec::new();
    for case in CASES
        .iter()
        .filter(|c| super::chosen("SUFFUSE_NET_CASES", c.name))
    {
        let Some(model) = super::model_arg(case.name, case.model) else {
            continue;
        };
        let settings: Vec<&Setting> = SETTINGS
            .iter()
            .filter(|s| super::chosen("SUFFUSE_NET_SETTINGS", s.name))
            .collect();
        // Runs go round the settings in turn, so that a drift of the
        // machine's load falls on all of them alike.
        let mut reports: Vec<Vec<Value>> = vec![Vec::new(); settings.len()];
        for run in 0..runs {
            for (s, out) in settings.iter().zip(&mut reports) {
                println!("{} over {} (run {}/{runs})", case.name, s.name, run + 1);
                let dir = root.join(format!("{}-{}-{run}", case.name, s.name));
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
                let r = one(&bin, &model, case, s, &dir, &certs)?;
                let _ = std::fs::remove_dir_all(dir.join("keys"));
                out.push(r);
            }
        }
        let mut zero: Option<f64> = None;
        for (s, runs) in settings.iter().zip(reports) {
            let (median, all) = median_report(runs);
            if s.projected.is_none() {
                zero = median["online_s"].as_f64();
            }
            records.push(record(case, s, median, &all, zero));
        }
    }
    print_table(&records);
    Ok(serde_json::to_string_pretty(&records)?)
}

/// One case at one setting: deal, serve behind relays, query; the
/// client's report.
fn one(
    bin: &Path,
    model: &str,
    case: &Case,
    s: &Setting,
    dir: &Path,
    certs: &Path,
) -> Result<Value> {
    let keys = dir.join("keys");
    let seq = case.seq.to_string();
    let mut deal = Command::new(bin);
    deal.args(["dealer", "--model", model, "--seq", &seq])
        .arg("--out")
        .arg(&keys);
    if let Some(n) = case.generate {
        deal.args(["--max-new-tokens", &n.to_string()]);
    }
    command::run(&mut deal)?;
    // Keys are dealt long before a query: their write-back must not fall
    // into the measured run.
    command::run(&mut Command::new("sync"))?;
    let p0 = server(bin, model, 0, "unused", dir, certs)?;
    let a0: SocketAddr = announced(&dir.join("p0.log"))?.parse()?;
    let peer = Relay::start(a0, s.link())?;
    let p1 = server(bin, model, 1, &peer.addr().to_string(), dir, certs)?;
    let a1: SocketAddr = announced(&dir.join("p1.log"))?.parse()?;
    let (c0, c1) = (Relay::start(a0, s.link())?, Relay::start(a1, s.link())?);
    let report = dir.join("query.json");
    let mut query = Command::new(bin);
    query
        .args(["query", "--model", model, "--timeout", "900", "--servers"])
        .arg(format!("{},{}", c0.addr(), c1.addr()))
        .arg("--tls")
        .arg(certs)
        .arg("--report-json")
        .arg(&report);
    if case.generate.is_some() {
        query.arg("--generate");
    }
    let started = Instant::now();
    let out = command::capture(query.arg(case.text))?;
    let wall = started.elapsed().as_secs_f64();
    for (mut p, name) in [(p0, "P0"), (p1, "P1")] {
        if !out.status.success() {
            let _ = p.kill();
        }
        let status = p.wait()?;
        if out.status.success() && !status.success() {
            bail!("{name} failed: see {}", dir.display());
        }
    }
    if !out.status.success() {
        bail!(
            "{} over {}: the query failed:\n{}",
            case.name,
            s.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut r: Value = serde_json::from_slice(&std::fs::read(&report)?)?;
    r["client_wall_s"] = json!(wall);
    Ok(r)
}

fn server(
    bin: &Path,
    model: &str,
    party: u8,
    peer: &str,
    dir: &Path,
    certs: &Path,
) -> Result<Child> {
    let log = std::fs::File::create(dir.join(format!("p{party}.log")))?;
    Command::new(bin)
        .args(["serve", "--party", &party.to_string(), "--model", model])
        .arg("--keys")
        .arg(dir.join(format!("keys/p{party}.keys")))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--peer",
            peer,
            "--timeout",
            "900",
        ])
        .arg("--tls")
        .arg(certs)
        .arg("--state-dir")
        .arg(dir.join(format!("state{party}")))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("starting a server")
}

/// The report with the median online time, and every run's online time.
fn median_report(mut runs: Vec<Value>) -> (Value, Vec<f64>) {
    let online = |r: &Value| r["online_s"].as_f64().unwrap_or(f64::NAN);
    runs.sort_by(|a, b| online(a).total_cmp(&online(b)));
    let all = runs.iter().map(online).collect();
    let median = runs.swap_remove(runs.len() / 2);
    (median, all)
}

/// The record of one setting: the median run's client report, every
/// run's online time, the setting, the models' estimates and, for
/// BERT-base, the published projections.
fn record(case: &Case, s: &Setting, report: Value, all: &[f64], zero: Option<f64>) -> Value {
    let online = report["online_s"].as_f64().unwrap_or(f64::NAN);
    let rounds = report["rounds"].as_f64().unwrap_or(f64::NAN);
    let sent = |p: usize| {
        report["comm_bytes_per_party"][p]
            .as_f64()
            .unwrap_or(f64::NAN)
    };
    let bytes = sent(0).max(sent(1));
    let model = |per_round: f64| {
        zero.map(|compute| compute + s.bytes_per_s.map_or(0.0, |b| bytes / b) + rounds * per_round)
    };
    let rtt = s.rtt.as_secs_f64();
    // What the network adds to each system by its own projection.
    let anchors: Vec<Value> = s
        .projected
        .into_iter()
        .flat_map(|i| case.anchors.iter().map(move |p| (p, p.lan_wan_s[i])))
        .map(|(p, projected)| {
            json!({
                "system": p.anchor.system, "projected_s": projected,
                "network_adds_s": projected - p.anchor.online_s,
                "source": "seed 001 (Table 1 and its LAN/WAN model); ANCHORS.md",
            })
        })
        .collect();
    json!({
        "case": case.name,
        "setting": s.name,
        "rtt_ms": s.rtt.as_secs_f64() * 1e3,
        "bytes_per_s": s.bytes_per_s,
        "online_s": online,
        "online_s_runs": all,
        "rounds": rounds,
        "bytes_larger_party": bytes,
        "model_s": model(rtt),
        "model_one_way_s": model(rtt / 2.0),
        "network_adds_s": zero.map(|z| online - z),
        "anchors": anchors,
        "report": report,
    })
}

fn print_table(records: &[Value]) {
    println!(
        "\n{:<22} {:<5} {:>9} {:>9} {:>9} {:>9} {:>7} {:>10}  anchors",
        "case", "net", "online s", "model s", "1-way s", "adds s", "rounds", "bytes/party"
    );
    for r in records {
        let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        let anchors: Vec<String> = r["anchors"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| {
                format!(
                    "{} {:.2} s (adds {:.2})",
                    a["system"].as_str().unwrap_or("?"),
                    a["projected_s"].as_f64().unwrap_or(f64::NAN),
                    a["network_adds_s"].as_f64().unwrap_or(f64::NAN)
                )
            })
            .collect();
        println!(
            "{:<22} {:<5} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>7.0} {:>9.1}M  {}",
            r["case"].as_str().unwrap_or("?"),
            r["setting"].as_str().unwrap_or("?"),
            f("online_s"),
            f("model_s"),
            f("model_one_way_s"),
            f("network_adds_s"),
            f("rounds"),
            f("bytes_larger_party") / 1e6,
            anchors.join(", ")
        );
    }
    println!(
        "\nonline s: the client's online time through the relays (TLS end to end), median of \
         the runs; model s: the zero-delay time + bytes/bandwidth + rounds·RTT (seed 001's \
         model); 1-way s: the same with rounds·RTT/2, since both servers send a round's \
         message at once; adds s: online minus the zero-delay online; anchors: each system's \
         projection, and what the network adds to its published zero-delay time by it."
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The models and the projections of one record, from a report with
    /// round numbers: 1,000 rounds, 400 MB from the larger party, 20 s at
    /// zero delay, 25 s on the WAN.
    #[test]
    fn a_wan_record_carries_both_models_and_each_projection() {
        let report = json!({
            "online_s": 25.0, "rounds": 1000.0, "comm_bytes_per_party": [4e8, 3e8],
        });
        let wan = &SETTINGS[2];
        let r = record(&CASES[0], wan, report, &[25.0], Some(20.0));
        let f = |k: &str| r[k].as_f64().unwrap();
        // 20 s + 1 s of bytes + 1,000 × 4 ms (or × 2 ms one-way).
        assert!((f("model_s") - 25.0).abs() < 1e-9);
        assert!((f("model_one_way_s") - 23.0).abs() < 1e-9);
        assert!((f("network_adds_s") - 5.0).abs() < 1e-9);
        let adds: Vec<(String, f64)> = r["anchors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                let sys = a["system"].as_str().unwrap().to_string();
                (sys, a["network_adds_s"].as_f64().unwrap())
            })
            .collect();
        assert_eq!(adds.len(), 2);
        assert_eq!(adds[0].0, "FuseFSS");
        assert!((adds[0].1 - (9.94 - 1.15)).abs() < 1e-9);
        assert!((adds[1].1 - (11.12 - 1.61)).abs() < 1e-9);
        // The baseline has no projection.
        let zero = record(&CASES[0], &SETTINGS[0], json!({}), &[], None);
        assert!(zero["anchors"].as_array().unwrap().is_empty());
    }
}
