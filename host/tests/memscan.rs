//! Secrets in memory (issue 9, item 6), shown on live processes rather
//! than asserted from the code.
//!
//! Two pool servers (`serve --keys-dir`, the built binary) serve one real
//! query on the demo model and then wait for the next one. This test is
//! their client, through the library's own `client::connect`, so it holds
//! the input shares it sends; and their parent, so ptrace rules let it
//! read each server's whole memory through `/proc/PID/mem`. It searches
//! that memory for 16-byte windows of
//! - the key file that server spent (copied aside before the query; the
//!   server deletes its own), several windows from every section;
//! - the input share it received.
//!
//! Once over plain TCP and once over mutual TLS. No window may be found.
//! As controls, the plan hash (from the key file's header), which a pool
//! server keeps for its whole life, must be found in each server, and
//! every window must be found in this test's own memory, which holds the
//! key files and the shares: the scan does see a live heap and does find
//! such windows.
//!
//! Before the fix that came with this test, it found the first 16 bytes
//! (a step seed) of the last sections in both servers: in thread stacks
//! (a seed copied by value, and the SHA-256 block buffer of a section's
//! digest) and in `read_to_end`'s stack probe buffer. See `party.rs`
//! (`ScrubStacks`) and `KeyReader::section`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{DirBuilderExt, FileExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use suffuse_host::client::{self, Expect};
use suffuse_host::model::Model;
use suffuse_host::net::{FrameKind, Role, Security, Timeouts, TlsConfig, put_words};

const BIN: &str = env!("CARGO_BIN_EXE_suffuse");

/// Tokens per query: at 32 the largest key sections (1.8 MiB) are past
/// the size from which a server maps a section rather than reading it, so
/// both kinds are scanned for.
const SEQ: usize = 32;

/// Bytes per searched window: a random window is found by chance with
/// probability 2^-128 per offset.
const W: usize = 16;

fn temp() -> PathBuf {
    let d = std::env::temp_dir().join(format!("suffuse-memscan-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::DirBuilder::new().mode(0o700).create(&d).unwrap();
    d
}

struct Server {
    child: Child,
    addr: String,
    lines: Receiver<String>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(dir: &Path, party: u8, peer: &str, tls: bool) -> Server {
    let mut child = Command::new(BIN)
        .args(["serve", "--party", &party.to_string(), "--model", "demo"])
        .args(["--listen", "127.0.0.1:0", "--peer", peer, "--timeout", "60"])
        .arg("--keys-dir")
        .arg(dir.join("pool"))
        .arg("--state-dir")
        .arg(dir.join(format!("state{party}")))
        .args(security(dir, tls))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let addr = first.rsplit(' ').next().unwrap().to_string();
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            eprintln!("server: {line}");
            let _ = tx.send(line);
        }
    });
    Server {
        child,
        addr,
        lines: rx,
    }
}

impl Server {
    fn wait_for(&self, what: &str) {
        let until = Instant::now() + Duration::from_secs(60);
        while Instant::now() < until {
            if let Ok(l) = self.lines.recv_timeout(Duration::from_millis(100))
                && l.contains(what)
            {
                return;
            }
        }
        panic!("the server never said {what:?}");
    }
}

/// Windows of every section's payload of a key file (format 2), spread
/// over the section, skipping low-entropy ones (runs of zeros, public
/// padding); and the file's plan hash.
fn key_windows(file: &[u8]) -> (Vec<[u8; W]>, [u8; 32]) {
    let plan_hash: [u8; 32] = file[16..48].try_into().unwrap();
    let summary = u32::from_le_bytes(file[68..72].try_into().unwrap()) as usize;
    let mut at = 72 + summary;
    let mut out = Vec::new();
    while &file[at..at + 4] == b"SECT" {
        let len = u64::from_le_bytes(file[at + 8..at + 16].try_into().unwrap()) as usize;
        let payload = &file[at + 16..at + 16 + len];
        out.extend(spread(payload, 8));
        at += 16 + len + 32;
    }
    assert_eq!(&file[at..at + 4], b"DONE");
    (out, plan_hash)
}

/// Up to `n` high-entropy windows at 8-byte offsets spread over `bytes`.
fn spread(bytes: &[u8], n: usize) -> Vec<[u8; W]> {
    let slots = bytes.len().saturating_sub(W) / 8 + 1;
    if bytes.len() < W {
        return Vec::new();
    }
    (0..n.min(slots))
        .map(|i| i * slots / n.min(slots) * 8)
        .map(|o| <[u8; W]>::try_from(&bytes[o..o + W]).unwrap())
        .filter(|w| {
            let mut seen = [false; 256];
            w.iter().for_each(|&b| seen[usize::from(b)] = true);
            seen.iter().filter(|&&s| s).count() >= 12
        })
        .collect()
}

/// Every readable mapping of process `pid`, read through /proc/PID/mem.
fn memory(pid: u32) -> Vec<Vec<u8>> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mem = std::fs::File::open(format!("/proc/{pid}/mem"))
        .expect("reading a child's memory (ptrace access to one's own child)");
    let mut regions = Vec::new();
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (range, perms) = (f.next().unwrap(), f.next().unwrap());
        if !perms.starts_with('r') || line.ends_with("[vvar]") || line.ends_with("[vsyscall]") {
            continue;
        }
        let (a, b) = range.split_once('-').unwrap();
        let (a, b) = (
            u64::from_str_radix(a, 16).unwrap(),
            u64::from_str_radix(b, 16).unwrap(),
        );
        let mut buf = vec![0u8; (b - a) as usize];
        if mem.read_exact_at(&mut buf, a).is_ok() {
            regions.push(buf);
        }
    }
    regions
}

/// How many of `windows` occur anywhere in `regions`, at any offset.
fn found(regions: &[Vec<u8>], windows: &[[u8; W]]) -> usize {
    let head = |w: &[u8]| u64::from_le_bytes(w[..8].try_into().unwrap());
    let mut by_head: HashMap<u64, Vec<usize>> = HashMap::new();
    let mut filter = vec![0u64; 1 << 14];
    let bit = |h: u64| (h.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 44) as usize;
    for (i, w) in windows.iter().enumerate() {
        by_head.entry(head(w)).or_default().push(i);
        filter[bit(head(w)) / 64] |= 1 << (bit(head(w)) % 64);
    }
    let mut hit = vec![false; windows.len()];
    const PAGE: usize = 4096;
    for r in regions {
        let ends = r.len().saturating_sub(W - 1);
        // Most mapped pages were never written: no window starts there.
        let written = (0..ends.div_ceil(PAGE)).filter(|p| {
            let page = &r[p * PAGE..((p + 1) * PAGE).min(r.len())];
            page.iter().any(|&b| b != 0)
        });
        for o in written.flat_map(|p| p * PAGE..((p + 1) * PAGE).min(ends)) {
            let h = head(&r[o..]);
            if filter[bit(h) / 64] & (1 << (bit(h) % 64)) == 0 {
                continue;
            }
            for &i in by_head.get(&h).into_iter().flatten() {
                hit[i] |= r[o..o + W] == windows[i];
            }
        }
    }
    hit.iter().filter(|&&h| h).count()
}

fn security(dir: &Path, tls: bool) -> Vec<String> {
    match tls {
        true => vec!["--tls".into(), dir.join("certs").to_string_lossy().into()],
        false => vec!["--insecure-transport".into()],
    }
}

/// Queries the two servers as `suffuse query` does, returning the input
/// payload sent to each.
fn query(dir: &Path, addrs: [&str; 2], tls: bool) -> [Vec<u8>; 2] {
    let model = Model::demo();
    let sec = match tls {
        true => Security::Tls(Arc::new(
            TlsConfig::load(&dir.join("certs"), Role::Client).unwrap(),
        )),
        false => Security::Insecure,
    };
    let t = Timeouts {
        connect: Duration::from_secs(60),
        io: Duration::from_secs(60),
    };
    let expect = Expect {
        batch: 1,
        seq: None,
    };
    let mut conn = client::connect(&model, addrs, t, &sec, expect).unwrap();
    let tokens = model
        .tokenizer
        .encode("a secret nobody keeps", SEQ)
        .unwrap();
    let inputs = client::clear_inputs(&model, conn.view(), &[tokens]).unwrap();
    let shares = client::share(&inputs).unwrap();
    let payloads = shares.each_ref().map(|s| {
        let mut p = Vec::new();
        for part in [&s.x[..], &s.bias, s.mask.as_deref().unwrap_or_default()] {
            put_words(&mut p, part);
        }
        p
    });
    for (link, p) in conn.links().iter_mut().zip(&payloads) {
        link.send(FrameKind::Input, 0, p).unwrap();
    }
    for link in conn.links() {
        link.recv(FrameKind::Output, 0, None).unwrap();
    }
    payloads
}

/// One query and the scan of both servers; what went wrong.
fn scan(dir: &Path, tls: bool) -> Vec<String> {
    let pool = dir.join("pool");
    let out = Command::new(BIN)
        .args([
            "dealer",
            "--model",
            "demo",
            "--seq",
            &SEQ.to_string(),
            "--count",
            "1",
        ])
        .arg("--out")
        .arg(&pool)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let set = std::fs::read_dir(&pool)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| !p.file_name().unwrap().to_string_lossy().starts_with('.'))
        .unwrap();
    let files = [0, 1].map(|p| std::fs::read(set.join(format!("p{p}.keys"))).unwrap());

    let p0 = serve(dir, 0, "unused", tls);
    let p1 = serve(dir, 1, &p0.addr, tls);
    let inputs = query(dir, [&p0.addr, &p1.addr], tls);
    p0.wait_for("served in");
    p1.wait_for("served in");

    let mut failures = Vec::new();
    let mode = if tls { "TLS" } else { "plain TCP" };
    for (party, server) in [&p0, &p1].into_iter().enumerate() {
        let (keys, plan_hash) = key_windows(&files[party]);
        let input = spread(&inputs[party], inputs[party].len() / 64);
        let control = [
            plan_hash[..W].try_into().unwrap(),
            plan_hash[W..].try_into().unwrap(),
        ];
        let start = Instant::now();
        let regions = memory(server.child.id());
        let bytes: usize = regions.iter().map(Vec::len).sum();
        let counts = [
            found(&regions, &keys),
            found(&regions, &input),
            found(&regions, &control),
        ];
        eprintln!(
            "{mode}, P{party}: {:.1} MiB in {} regions read and searched in {:.2} s: \
             key windows {}/{}, input-share windows {}/{}, plan hash (control) {}/2",
            bytes as f64 / (1 << 20) as f64,
            regions.len(),
            start.elapsed().as_secs_f64(),
            counts[0],
            keys.len(),
            counts[1],
            input.len(),
            counts[2],
        );
        assert!(keys.len() > 100 && input.len() > 100);
        if counts[2] != 2 {
            failures.push(format!("{mode}, P{party}: the control was not found"));
        }
        if counts[0] + counts[1] > 0 {
            failures.push(format!("{mode}, P{party}: secrets found: {counts:?}"));
        }
    }
    // The search can fail: this process holds both key files and both
    // input payloads, and every window is found in its memory.
    let own = memory(std::process::id());
    for party in 0..2 {
        let keys = key_windows(&files[party]).0;
        let input = spread(&inputs[party], inputs[party].len() / 64);
        assert_eq!(found(&own, &keys), keys.len(), "P{party}'s key windows");
        assert_eq!(found(&own, &input), input.len(), "P{party}'s input windows");
    }
    failures
}

#[test]
fn a_server_holds_no_spent_key_or_input_share_after_its_query() {
    let dir = temp();
    let certs = dir.join("certs");
    let out = Command::new(BIN)
        .args(["certs", "--out"])
        .arg(&certs)
        .output()
        .unwrap();
    assert!(out.status.success());
    let mut failures = Vec::new();
    for tls in [false, true] {
        let run = dir.join(if tls { "tls" } else { "plain" });
        std::fs::DirBuilder::new().mode(0o700).create(&run).unwrap();
        std::os::unix::fs::symlink(&certs, run.join("certs")).unwrap();
        failures.extend(scan(&run, tls));
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{failures:?}");
}
