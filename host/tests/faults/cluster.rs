//! One real three-process run (P0, P1, the client, from the built
//! `suffuse` binary) with its keys freshly dealt, and what became of it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::proxy::{Act, Pids, Proxy, When};

pub const BIN: &str = env!("CARGO_BIN_EXE_suffuse");

/// Which model and query a run makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Job {
    /// `demo` at 16 tokens, one embedding.
    Embed,
    /// `tiny-llama`, prompt bucket 16, up to 3 new tokens.
    Generate,
}

/// Which link a proxy sits on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum On {
    /// P1 → P0.
    Peer,
    /// The client → P0 or P1.
    Client(usize),
}

/// A change to a key file before the run.
#[derive(Clone, Copy, Debug)]
pub enum Edit {
    /// Cut party p's file at this offset.
    Truncate(usize, Offset),
    /// Flip a bit of party p's file at this offset.
    Flip(usize, Offset),
    /// Give party p's file this mode.
    Mode(usize, u32),
    /// Move party p's file to `pN.real` and serve it through a symbolic
    /// link in its place.
    Link(usize),
}

#[derive(Clone, Copy, Debug)]
pub enum Offset {
    Byte(u64),
    PerMille(u64),
    /// This many bytes before the end.
    FromEnd(u64),
}

/// How one process ended.
#[derive(Debug)]
pub struct End {
    pub status: Option<ExitStatus>,
    /// When it ended (or when the run gave up on it).
    pub at: Instant,
    pub stderr: Vec<String>,
    /// When it was sent SIGCONT, if it was stopped.
    pub resumed: Option<Instant>,
}

/// What a run left behind.
#[derive(Debug)]
pub struct Outcome {
    pub start: Instant,
    pub fired: Option<Instant>,
    /// P0, P1, the client.
    pub ends: [End; 3],
    pub stdout: String,
    /// Per party: the ledger entry exists.
    pub spent: [bool; 2],
    /// Per party: the key file is still there.
    pub keys_left: [bool; 2],
}

/// What to run.
pub struct Setup<'a> {
    pub root: &'a Path,
    pub name: &'a str,
    pub job: Job,
    pub tls: bool,
    pub timeout: u64,
    pub edit: Option<Edit>,
    pub proxy: Option<(On, When, Act)>,
    /// Slow connections held open to each server (P0, P1) from before its
    /// peer and client connect to the run's end.
    pub slow: [usize; 2],
}

impl Job {
    fn model(self) -> &'static str {
        match self {
            Job::Embed => "demo",
            Job::Generate => "tiny-llama",
        }
    }
}

fn dealt(dir: &Path, job: Job) -> String {
    let mut args = vec!["dealer", "--model", job.model(), "--seq", "16"];
    if job == Job::Generate {
        args.extend(["--max-new-tokens", "3"]);
    }
    let report = dir.join("dealer.json");
    let keys = dir.join("keys");
    let out = Command::new(BIN)
        .args(&args)
        .args(["--out", keys.to_str().unwrap()])
        .args(["--report-json", report.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(report).unwrap()).unwrap();
    r["key_set"].as_str().unwrap().to_string()
}

fn edit(dir: &Path, e: Edit) {
    use std::os::unix::fs::PermissionsExt;
    let (Edit::Truncate(p, _) | Edit::Flip(p, _) | Edit::Mode(p, _) | Edit::Link(p)) = e;
    let f = dir.join(format!("keys/p{p}.keys"));
    match e {
        Edit::Mode(_, mode) => {
            return std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        Edit::Link(_) => {
            let real = dir.join(format!("keys/p{p}.real"));
            std::fs::rename(&f, &real).unwrap();
            return std::os::unix::fs::symlink(&real, &f).unwrap();
        }
        Edit::Truncate(..) | Edit::Flip(..) => {}
    }
    let mut bytes = std::fs::read(&f).unwrap();
    let len = bytes.len() as u64;
    let at = |o: Offset| match o {
        Offset::Byte(b) => b,
        Offset::PerMille(m) => len * m / 1000,
        Offset::FromEnd(n) => len - n,
    } as usize;
    match e {
        Edit::Truncate(_, o) => bytes.truncate(at(o)),
        Edit::Flip(_, o) => bytes[at(o)] ^= 0x01,
        Edit::Mode(..) | Edit::Link(_) => {}
    }
    std::fs::write(&f, bytes).unwrap();
}

/// Drains a child's stderr into a shared list, handing its first line over.
fn drain(child: &mut Child) -> (Arc<Mutex<Vec<String>>>, mpsc::Receiver<String>) {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = mpsc::channel();
    let err = child.stderr.take().unwrap();
    let keep = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(line.clone());
            keep.lock().unwrap().push(line);
        }
    });
    (lines, rx)
}

fn security(s: &Setup<'_>, certs: &Path) -> Vec<String> {
    if s.tls {
        vec!["--tls".into(), certs.to_str().unwrap().into()]
    } else {
        vec!["--insecure-transport".into()]
    }
}

fn serve(s: &Setup<'_>, dir: &Path, certs: &Path, party: usize, peer: &str) -> Child {
    Command::new(BIN)
        .args([
            "serve",
            "--party",
            &party.to_string(),
            "--model",
            s.job.model(),
        ])
        .args([
            "--keys",
            dir.join(format!("keys/p{party}.keys")).to_str().unwrap(),
        ])
        .args(["--listen", "127.0.0.1:0", "--peer", peer])
        .args(["--timeout", &s.timeout.to_string()])
        .args([
            "--state-dir",
            dir.join(format!("state{party}")).to_str().unwrap(),
        ])
        .args(security(s, certs))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The address a server announces on its first stderr line.
fn address(rx: &mpsc::Receiver<String>) -> String {
    let first = rx.recv_timeout(Duration::from_secs(60)).unwrap();
    first.rsplit(' ').next().unwrap().to_string()
}

fn query(s: &Setup<'_>, certs: &Path, servers: &str) -> Child {
    let mut c = Command::new(BIN);
    c.args(["query", "--model", s.job.model(), "--servers", servers])
        .args(["--timeout", &s.timeout.to_string()])
        .args(security(s, certs));
    match s.job {
        Job::Embed => c.arg("a sentence the servers never see"),
        Job::Generate => c.args(["--generate", "a private prompt"]),
    };
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Runs the setup to the end of every process.
pub fn run(s: &Setup<'_>, certs: &Path) -> Outcome {
    let dir = s.root.join(s.name);
    std::fs::create_dir_all(&dir).unwrap();
    let key_set = dealt(&dir, s.job);
    if let Some(e) = s.edit {
        edit(&dir, e);
    }
    let pids: Pids = Arc::new(Mutex::new([None; 3]));
    let start = Instant::now();
    let proxy_to = |on: On, target: &str| {
        s.proxy
            .filter(|p| p.0 == on)
            .map(|(_, when, act)| Proxy::start(target.to_string(), when, act, pids.clone()))
    };
    let mut p0 = serve(s, &dir, certs, 0, "unused");
    let (err0, rx0) = drain(&mut p0);
    let addr0 = address(&rx0);
    let stop = Arc::new(AtomicBool::new(false));
    let slow0 = slowloris(&addr0, s.tls, s.slow[0], &stop);
    let peer = proxy_to(On::Peer, &addr0);
    let mut p1 = serve(s, &dir, certs, 1, peer.as_ref().map_or(&addr0, |p| &p.addr));
    let (err1, rx1) = drain(&mut p1);
    let addr1 = address(&rx1);
    let slow1 = slowloris(&addr1, s.tls, s.slow[1], &stop);
    let c0 = proxy_to(On::Client(0), &addr0);
    let c1 = proxy_to(On::Client(1), &addr1);
    let servers = format!(
        "{},{}",
        c0.as_ref().map_or(&addr0, |p| &p.addr),
        c1.as_ref().map_or(&addr1, |p| &p.addr)
    );
    let mut client = query(s, certs, &servers);
    let (err2, _rx2) = drain(&mut client);
    let mut out = client.stdout.take().unwrap();
    let stdout = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    *pids.lock().unwrap() = [Some(p0.id()), Some(p1.id()), Some(client.id())];
    let proxies = [peer, c0, c1];
    let fired = || proxies.iter().flatten().find_map(Proxy::fired);
    let ends = wait_all([p0, p1, client], [err0, err1, err2], s.timeout, fired);
    let fired = fired();
    drop(proxies);
    stop.store(true, Ordering::Relaxed);
    slow0
        .into_iter()
        .chain(slow1)
        .for_each(|h| h.join().unwrap());
    let entry = |p: usize| dir.join(format!("state{p}/p{p}-{key_set}")).exists();
    // A linked file counts as left while its target is there.
    let left = |p: usize| {
        dir.join(format!("keys/p{p}.keys")).exists() || dir.join(format!("keys/p{p}.real")).exists()
    };
    Outcome {
        start,
        fired,
        ends,
        stdout: stdout.join().unwrap(),
        spent: [entry(0), entry(1)],
        keys_left: [left(0), left(1)],
    }
}

/// `n` slow connections to `addr`, connected before this returns: each
/// opens a hello frame (plain TCP) or a TLS handshake record and then
/// sends one byte of it a second, a slowloris; when the server drops it,
/// it connects again, until `stop`.
fn slowloris(addr: &str, tls: bool, n: usize, stop: &Arc<AtomicBool>) -> Vec<JoinHandle<()>> {
    // Plain: a hello header (kind 1, step u32::MAX) announcing 4 KiB.
    // TLS: a handshake record header announcing 4 KiB.
    let opening: &[u8] = if tls {
        &[0x16, 0x03, 0x01, 0x10, 0x00]
    } else {
        &[
            b'S', b'F', 1, 0xff, 0xff, 0xff, 0xff, 0, 0x10, 0, 0, 0, 0, 0, 0,
        ]
    };
    let connect = move |addr: &str| {
        let mut c = TcpStream::connect(addr).ok()?;
        c.write_all(opening).ok()?;
        Some(c)
    };
    (0..n)
        .map(|_| {
            let (addr, stop) = (addr.to_string(), stop.clone());
            let mut conn = connect(&addr);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(1000));
                    let alive = conn.as_mut().is_some_and(|c| c.write_all(&[0]).is_ok());
                    if !alive {
                        conn = connect(&addr);
                    }
                }
            })
        })
        .collect()
}

/// Waits for the three processes. One found stopped (SIGSTOP by a fault)
/// is resumed once the others have ended, or once every timeout the run
/// allows has passed; a process still alive long after is killed (and
/// the checks then fail on its late end).
fn wait_all(
    mut children: [Child; 3],
    stderr: [Arc<Mutex<Vec<String>>>; 3],
    timeout: u64,
    fired: impl Fn() -> Option<Instant>,
) -> [End; 3] {
    let t = Duration::from_secs(timeout);
    let begin = Instant::now();
    let mut status: [Option<(ExitStatus, Instant)>; 3] = [None, None, None];
    let mut resumed: [Option<Instant>; 3] = [None; 3];
    while status.iter().any(Option::is_none) && begin.elapsed() < 6 * t + Duration::from_secs(30) {
        for (i, c) in children.iter_mut().enumerate() {
            if status[i].is_none()
                && let Some(s) = c.try_wait().unwrap()
            {
                status[i] = Some((s, Instant::now()));
            }
        }
        for (i, c) in children.iter().enumerate() {
            let others_done = (0..3).all(|j| j == i || status[j].is_some());
            let late = fired().is_some_and(|f| f.elapsed() > 2 * t);
            if status[i].is_none()
                && resumed[i].is_none()
                && stopped(c.id())
                && (others_done || late)
            {
                let _ = Command::new("kill")
                    .args(["-CONT", &c.id().to_string()])
                    .status();
                resumed[i] = Some(Instant::now());
            }
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    std::array::from_fn(|i| {
        if status[i].is_none() {
            let _ = children[i].kill();
            let _ = children[i].wait();
        }
        // Let the stderr reader take the last lines.
        std::thread::sleep(Duration::from_millis(50));
        End {
            status: status[i].map(|s| s.0),
            at: status[i].map_or_else(Instant::now, |s| s.1),
            stderr: stderr[i].lock().unwrap().clone(),
            resumed: resumed[i],
        }
    })
}

/// Whether a process is stopped (state `T` in /proc).
fn stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()
                .map(|r| r.trim_start().starts_with('T'))
        })
        .unwrap_or(false)
}

/// A fresh folder for the whole harness.
pub fn root() -> PathBuf {
    let d = std::env::temp_dir().join(format!("suffuse-faults-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Makes the certificates every TLS run shares.
pub fn certs(root: &Path) -> PathBuf {
    let c = root.join("certs");
    let out = Command::new(BIN)
        .args(["certs", "--out", c.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success());
    c
}
