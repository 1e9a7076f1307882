//! The long-running server as real processes over mutual TLS: a pool
//! dealt by `suffuse dealer --count`, two `suffuse serve --keys-dir`, and
//! concurrent `suffuse query` clients, with hostile connections among
//! them, an empty pool at the end, and SIGTERM.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_suffuse");

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("suffuse-pool-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    // 0700: keys are dealt into it, and the dealer refuses an open folder.
    std::fs::DirBuilder::new().mode(0o700).create(&d).unwrap();
    d
}

fn ok(out: Output, what: &str) -> Output {
    assert!(
        out.status.success(),
        "{what} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn run(args: &[&str]) -> Output {
    ok(Command::new(BIN).args(args).output().unwrap(), args[0])
}

/// A pooled server, its address, and its stderr lines.
struct Server {
    child: Child,
    addr: String,
    lines: Receiver<String>,
}

fn serve(dir: &Path, party: u8, peer: &str, seq: &str) -> Server {
    let p = party.to_string();
    let mut child = Command::new(BIN)
        .args([
            "serve",
            "--party",
            &p,
            "--model",
            "demo",
            "--listen",
            "127.0.0.1:0",
        ])
        .args(["--peer", peer, "--timeout", "60", "--max-concurrent", "3"])
        .arg("--keys-dir")
        .arg(dir.join(format!("pool{seq}")))
        .arg("--state-dir")
        .arg(dir.join(format!("state{p}")))
        .arg("--tls")
        .arg(dir.join("certs"))
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

impl Drop for Server {
    /// A failed assertion leaves no server behind.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Waits for a stderr line containing `what`.
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

    /// SIGTERM, then the exit status within `limit`.
    fn terminate(mut self, limit: Duration) -> bool {
        let pid = self.child.id().to_string();
        ok(
            Command::new("kill").args(["-TERM", &pid]).output().unwrap(),
            "kill",
        );
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.success();
            }
            if start.elapsed() > limit {
                let _ = self.child.kill();
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn query(servers: &str, certs: &Path, text: &str) -> Child {
    Command::new(BIN)
        .args([
            "query",
            "--model",
            "demo",
            "--servers",
            servers,
            "--timeout",
            "60",
        ])
        .arg("--tls")
        .arg(certs)
        .arg(text)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn embedding(stdout: &[u8]) -> Vec<f64> {
    let line = String::from_utf8_lossy(stdout);
    let v: serde_json::Value = serde_json::from_str(line.lines().next().unwrap()).unwrap();
    let e = v["embedding"].as_array().unwrap();
    e.iter().map(|x| x.as_f64().unwrap()).collect()
}

fn ledger(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy()[3..].to_string())
        .collect()
}

fn setup(name: &str, seq: &str, count: &str) -> PathBuf {
    let dir = temp(name);
    run(&["certs", "--out", dir.join("certs").to_str().unwrap()]);
    let pool = dir.join(format!("pool{seq}"));
    let pool = pool.to_str().unwrap();
    run(&[
        "dealer", "--model", "demo", "--seq", seq, "--count", count, "--out", pool,
    ]);
    dir
}

#[test]
fn a_pool_serves_concurrent_clients_once_per_set_among_hostile_connections() {
    let dir = setup("many", "16", "7");
    let pool = dir.join("pool16");
    // P1 lacks one set's file: that set must be skipped, not spent.
    let orphan = std::fs::read_dir(&pool).unwrap().next().unwrap().unwrap();
    let orphan = orphan.file_name().to_string_lossy().to_string();
    std::fs::remove_file(pool.join(&orphan).join("p1.keys")).unwrap();
    run(&["certs", "--out", dir.join("rogue").to_str().unwrap()]);

    let p0 = serve(&dir, 0, "unused", "16");
    let p1 = serve(&dir, 1, &p0.addr, "16");
    let servers = format!("{},{}", p0.addr, p1.addr);
    let certs = dir.join("certs");
    // Hostile connections first, held open while the clients run: random
    // bytes, silence, and a client whose certificate is from another CA.
    let mut junk = TcpStream::connect(&p0.addr).unwrap();
    junk.write_all(b"GET / HTTP/1.1\r\n\r\n not a handshake")
        .unwrap();
    let silent = TcpStream::connect(&p1.addr).unwrap();
    let rogue = query(&servers, &dir.join("rogue"), "an intruder");
    let texts: Vec<String> = (0..6)
        .map(|i| format!("concurrent query number {i}"))
        .collect();
    let clients: Vec<Child> = texts.iter().map(|t| query(&servers, &certs, t)).collect();
    for (text, c) in texts.iter().zip(clients) {
        let out = ok(c.wait_with_output().unwrap(), "query");
        // The servers' keys are for 16 tokens: the client truncates to them.
        let local = run(&["embed", "--model", "demo", "--max-tokens", "16", text]);
        assert_eq!(embedding(&out.stdout), embedding(&local.stdout), "{text}");
    }
    let rogue = rogue.wait_with_output().unwrap();
    assert!(
        !rogue.status.success(),
        "a client from another CA was served"
    );
    drop((junk, silent));

    // Six sets served, the seventh has no file at P1: a typed refusal.
    let empty = query(&servers, &certs, "one too many")
        .wait_with_output()
        .unwrap();
    assert!(!empty.status.success());
    let msg = String::from_utf8_lossy(&empty.stderr);
    assert!(msg.contains("key pool is empty"), "{msg}");

    let (spent0, spent1) = (ledger(&dir.join("state0")), ledger(&dir.join("state1")));
    assert_eq!(spent0.len(), 6, "{spent0:?}");
    assert_eq!(spent0, spent1);
    assert!(!spent0.contains(&orphan));
    assert!(
        pool.join(&orphan).join("p0.keys").exists(),
        "the orphan was spent"
    );
    assert!(
        p0.terminate(Duration::from_secs(30)),
        "P0 did not exit 0 on SIGTERM"
    );
    assert!(
        p1.terminate(Duration::from_secs(30)),
        "P1 did not exit 0 on SIGTERM"
    );
}

#[test]
fn sigterm_lets_the_query_in_flight_finish_and_admits_no_more() {
    let dir = setup("drain", "64", "2");
    let p0 = serve(&dir, 0, "unused", "64");
    let p1 = serve(&dir, 1, &p0.addr, "64");
    let servers = format!("{},{}", p0.addr, p1.addr);
    let certs = dir.join("certs");
    let text = "finish me after the signal";
    let client = query(&servers, &certs, text);
    p0.wait_for("agreed with P1");
    let addr0 = p0.addr.clone();
    assert!(
        p0.terminate(Duration::from_secs(60)),
        "P0 did not drain and exit 0"
    );
    let out = ok(client.wait_with_output().unwrap(), "the query in flight");
    let local = run(&["embed", "--model", "demo", "--max-tokens", "64", text]);
    assert_eq!(embedding(&out.stdout), embedding(&local.stdout));
    // P0 is gone: nothing new is admitted, and its second set is unspent.
    assert!(TcpStream::connect(&addr0).is_err());
    assert_eq!(ledger(&dir.join("state0")).len(), 1);
    assert!(
        p1.terminate(Duration::from_secs(30)),
        "P1 did not exit 0 on SIGTERM"
    );
}
