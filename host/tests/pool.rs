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
    let extra = ["--max-concurrent", "3"];
    serve_in(dir, &dir.join(format!("pool{seq}")), party, peer, &extra)
}

/// A pooled server on `pool`, with its ledger in `dir/stateN`, the
/// certificates in `dir/certs`, and `extra` flags.
fn serve_in(dir: &Path, pool: &Path, party: u8, peer: &str, extra: &[&str]) -> Server {
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
        .args(["--peer", peer, "--timeout", "60"])
        .arg("--keys-dir")
        .arg(pool)
        .arg("--state-dir")
        .arg(dir.join(format!("state{p}")))
        .arg("--tls")
        .arg(dir.join("certs"))
        .args(extra)
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

/// Sets in `pool` with both key files (what the dealer counts as unspent).
fn complete_sets(pool: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(pool) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter(|e| e.path().join("p0.keys").exists() && e.path().join("p1.keys").exists())
        .count()
}

/// Issue 27, M3: `dealer --count 0 --keep-pool 2` into a folder that does
/// not exist yet, and both servers on it with `--keep-spent`: every query
/// of five in a row is served, because a kept spent file leaves the pool's
/// namespace (`pN.keys.spent`) and the dealer refills behind it.
#[test]
fn keep_pool_refills_behind_servers_that_keep_spent_files() {
    let dir = temp("refill");
    run(&["certs", "--out", dir.join("certs").to_str().unwrap()]);
    let pool = dir.join("pool16");
    let mut dealer = Command::new(BIN)
        .args(["dealer", "--model", "demo", "--seq", "16", "--count", "0"])
        .args(["--keep-pool", "2", "--out"])
        .arg(&pool)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(120);
    while complete_sets(&pool) < 2 {
        assert!(Instant::now() < until, "the dealer never filled the pool");
        assert!(dealer.try_wait().unwrap().is_none(), "the dealer exited");
        std::thread::sleep(Duration::from_millis(100));
    }
    let p0 = serve_in(&dir, &pool, 0, "unused", &["--keep-spent"]);
    let p1 = serve_in(&dir, &pool, 1, &p0.addr, &["--keep-spent"]);
    let servers = format!("{},{}", p0.addr, p1.addr);
    for i in 0..5 {
        let text = format!("refilled query {i}");
        let out = query(&servers, &dir.join("certs"), &text)
            .wait_with_output()
            .unwrap();
        let out = ok(out, &format!("query {i}"));
        let local = run(&["embed", "--model", "demo", "--max-tokens", "16", &text]);
        assert_eq!(embedding(&out.stdout), embedding(&local.stdout), "{text}");
        std::thread::sleep(Duration::from_millis(1500));
    }
    assert_eq!(ledger(&dir.join("state0")).len(), 5);
    let kept = std::fs::read_dir(&pool)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.path().join("p0.keys.spent").exists())
        .count();
    assert_eq!(kept, 5, "the spent files are kept, renamed");
    let _ = Command::new("kill")
        .args(["-TERM", &dealer.id().to_string()])
        .status();
    let _ = dealer.wait();
    assert!(p0.terminate(Duration::from_secs(30)));
    assert!(p1.terminate(Duration::from_secs(30)));
}

/// Issue 27, M4: on two machines, P1's copy of a set arrives after P0's
/// (one folder copied first, rsync lag). The query before it arrives finds
/// the pool empty; once it is there, P0 offers the set again after its
/// back-off and the next query is served.
#[test]
fn a_set_whose_second_file_arrives_late_is_served_once_it_does() {
    let dir = setup("late", "16", "1");
    let pool = dir.join("pool16");
    let id = std::fs::read_dir(&pool)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .find(|n| !n.to_string_lossy().starts_with('.'))
        .unwrap();
    let (a, b) = (dir.join("poolA"), dir.join("poolB"));
    for folder in [&a, &b, &a.join(&id), &b.join(&id)] {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(folder)
            .unwrap();
    }
    std::fs::rename(pool.join(&id).join("p0.keys"), a.join(&id).join("p0.keys")).unwrap();
    let later = dir.join("p1.keys.later");
    std::fs::rename(pool.join(&id).join("p1.keys"), &later).unwrap();
    let p0 = serve_in(&dir, &a, 0, "unused", &[]);
    let p1 = serve_in(&dir, &b, 1, &p0.addr, &[]);
    let servers = format!("{},{}", p0.addr, p1.addr);
    let certs = dir.join("certs");
    let early = query(&servers, &certs, "too early")
        .wait_with_output()
        .unwrap();
    assert!(!early.status.success(), "served without P1's keys");
    let msg = String::from_utf8_lossy(&early.stderr);
    assert!(msg.contains("key pool is empty"), "{msg}");
    std::fs::rename(&later, b.join(&id).join("p1.keys")).unwrap();
    // Past the first back-off (1 s).
    std::thread::sleep(Duration::from_millis(1500));
    let text = "served once both files are there";
    let out = ok(
        query(&servers, &certs, text).wait_with_output().unwrap(),
        "the query after the late file",
    );
    let local = run(&["embed", "--model", "demo", "--max-tokens", "16", text]);
    assert_eq!(embedding(&out.stdout), embedding(&local.stdout));
    assert!(p0.terminate(Duration::from_secs(30)));
    assert!(p1.terminate(Duration::from_secs(30)));
}

/// `dealer --count 0` alone deals nothing: it says so and fails, instead
/// of exiting 0 silently (issue 27).
#[test]
fn a_dealer_asked_for_nothing_says_so() {
    let dir = temp("nothing");
    let out = Command::new(BIN)
        .args([
            "dealer", "--model", "demo", "--seq", "16", "--count", "0", "--out",
        ])
        .arg(dir.join("pool"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(msg.contains("--count 0 deals nothing"), "{msg}");
    assert!(!dir.join("pool").exists(), "nothing was created");
}

/// Absurd durations and counts are refused when the command line is parsed,
/// with a clear range, instead of panicking later (issue 27): a drain or a
/// timeout of 2^64 − 1 s overflowed a deadline, `--max-concurrent 100000`
/// panicked at P1, `--max-concurrent 0` was accepted, and `--max-new-tokens
/// 0` dealt the plan of 1 (and was ignored for encoders).
#[test]
fn absurd_flag_values_are_refused_at_parse_time() {
    let serve = [
        "serve",
        "--party",
        "1",
        "--model",
        "demo",
        "--listen",
        "127.0.0.1:0",
    ];
    let cases: [&[&str]; 6] = [
        &[
            "--peer",
            "127.0.0.1:9",
            "--keys-dir",
            "p",
            "--drain",
            "18446744073709551615",
        ],
        &[
            "--peer",
            "127.0.0.1:9",
            "--keys-dir",
            "p",
            "--timeout",
            "18446744073709551615",
        ],
        &[
            "--peer",
            "127.0.0.1:9",
            "--keys-dir",
            "p",
            "--max-concurrent",
            "100000",
        ],
        &[
            "--peer",
            "127.0.0.1:9",
            "--keys-dir",
            "p",
            "--max-concurrent",
            "0",
        ],
        &["--peer", "127.0.0.1:9", "--keys-dir", "p", "--timeout", "0"],
        &[
            "--peer",
            "127.0.0.1:9",
            "--keys-dir",
            "p",
            "--drain",
            "86401",
        ],
    ];
    for extra in cases {
        let out = Command::new(BIN).args(serve).args(extra).output().unwrap();
        let msg = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?} accepted");
        assert!(msg.contains("is not in"), "{extra:?}: {msg}");
    }
    let dir = temp("absurd");
    let deal = |extra: &[&str]| {
        Command::new(BIN)
            .args(["dealer", "--seq", "16", "--out"])
            .arg(dir.join("keys"))
            .args(extra)
            .output()
            .unwrap()
    };
    let zero = deal(&["--model", "tiny-llama", "--max-new-tokens", "0"]);
    assert!(!zero.status.success());
    let encoder = deal(&["--model", "demo", "--max-new-tokens", "2"]);
    let msg = String::from_utf8_lossy(&encoder.stderr);
    assert!(
        !encoder.status.success() && msg.contains("is an encoder"),
        "{msg}"
    );
    assert!(!dir.join("keys").exists(), "nothing was dealt");
}

/// A server's key material cannot reach a core dump: its core-size limit is
/// 0 (and the process is undumpable, which `/proc` does not show to root)
/// (issue 27).
#[test]
fn a_server_writes_no_core_dump() {
    let dir = temp("core");
    run(&["certs", "--out", dir.join("certs").to_str().unwrap()]);
    let p0 = serve_in(&dir, &dir.join("pool"), 0, "unused", &[]);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", p0.child.id())).unwrap();
    let core = limits
        .lines()
        .find(|l| l.starts_with("Max core file size"))
        .unwrap();
    let fields: Vec<&str> = core.split_whitespace().collect();
    assert_eq!(&fields[4..6], ["0", "0"], "{core}");
    drop(p0);
}

/// `inspect` whose reader has gone (`| head -1`, here a pipe closed before
/// it writes) ends quietly with success instead of panicking, and a FIFO
/// in a key file's place is refused instead of blocking (issue 27).
#[test]
fn inspect_survives_a_closed_pipe_and_refuses_a_fifo() {
    let dir = temp("inspect");
    run(&[
        "dealer",
        "--model",
        "demo",
        "--seq",
        "8",
        "--out",
        dir.join("keys").to_str().unwrap(),
    ]);
    let mut child = Command::new(BIN)
        .arg("inspect")
        .arg(dir.join("keys/p0.keys"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !msg.contains("panicked"), "{msg}");
    let fifo = dir.join("fifo.keys");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let out = Command::new(BIN)
        .arg("inspect")
        .arg(&fifo)
        .output()
        .unwrap();
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && msg.contains("not a regular file"),
        "{msg}"
    );
}

/// A text longer than the keys' (or `--max-tokens`') length is truncated
/// with a warning, not silently (issue 27).
#[test]
fn a_long_text_is_truncated_with_a_warning() {
    let out = run(&[
        "embed",
        "--model",
        "demo",
        "--max-tokens",
        "8",
        "a text that is longer than eight tokens",
    ]);
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(
        msg.contains("warning: text 1 has") && msg.contains("only the first 8"),
        "{msg}"
    );
    let short = run(&["embed", "--model", "demo", "--max-tokens", "64", "short"]);
    assert!(!String::from_utf8_lossy(&short.stderr).contains("warning: text"));
}

/// An authenticated client that says hello and then nothing, as an
/// attacker holding slots would: its TLS link to P0 and the server hello
/// that gave it a key set.
fn silent_client(dir: &Path, p0: &str) -> suffuse_host::net::Link {
    use suffuse_host::client::{Hello, send_hello};
    use suffuse_host::net::{Link, Role, Security, Timeouts, TlsConfig};
    let tls = TlsConfig::load(&dir.join("certs"), Role::Client).unwrap();
    let t = Timeouts {
        connect: Duration::from_secs(10),
        io: Duration::from_secs(60),
    };
    let mut link = Link::connect_secured(p0, t, &Security::Tls(tls.into()), Role::P0).unwrap();
    send_hello(&mut link, &Hello::Client).unwrap();
    link
}

/// Whether a silent client's server hello (its admission) arrives within
/// `wait`.
fn admitted_within(link: &mut suffuse_host::net::Link, wait: Duration) -> bool {
    use suffuse_host::client::{Hello, recv_hello};
    link.set_io_timeout(wait);
    match recv_hello(link) {
        Ok(Ok(Hello::Server { .. })) => true,
        Ok(other) => panic!("expected a server hello, got {other:?}"),
        Err(_) => false,
    }
}

/// Issue 27 (low), holding slots: two silent clients from one address held
/// both slots of `--max-concurrent 2` for the whole `--timeout`. Now one
/// address gets half the slots by default, so the second silent client
/// waits although a slot is free, and a client that sends no input is
/// dropped after the client wait (20 s), well inside `--timeout 60`, which
/// admits the next one; a real query is served after both.
#[test]
fn silent_clients_cannot_hold_the_slots() {
    let dir = setup("hold", "16", "3");
    let extra = ["--max-concurrent", "2"];
    let p0 = serve_in(&dir, &dir.join("pool16"), 0, "unused", &extra);
    let p1 = serve_in(&dir, &dir.join("pool16"), 1, &p0.addr, &extra);
    let mut first = silent_client(&dir, &p0.addr);
    assert!(admitted_within(&mut first, Duration::from_secs(30)));
    let mut second = silent_client(&dir, &p0.addr);
    assert!(
        !admitted_within(&mut second, Duration::from_secs(5)),
        "a second query from the same address was admitted"
    );
    // The first never sends its input: dropped at the client wait, which
    // frees its slot for the second; ends long before --timeout 60.
    p0.wait_for("receiving the client's input");
    assert!(admitted_within(&mut second, Duration::from_secs(30)));
    drop((first, second));
    let text = "served after the silent ones";
    let out = query(
        &format!("{},{}", p0.addr, p1.addr),
        &dir.join("certs"),
        text,
    );
    let out = ok(out.wait_with_output().unwrap(), "query");
    let local = run(&["embed", "--model", "demo", "--max-tokens", "16", text]);
    assert_eq!(embedding(&out.stdout), embedding(&local.stdout));
    assert!(p0.terminate(Duration::from_secs(30)));
    assert!(p1.terminate(Duration::from_secs(30)));
}
