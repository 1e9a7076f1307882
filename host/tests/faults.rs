//! Fault injection into real three-process runs (issue 9, item 7).
//!
//! Each point deals fresh keys, starts `suffuse serve` twice and `suffuse
//! query` from the built binary, and injects one fault from outside the
//! processes: a proxy on one link that closes, stalls, cuts, corrupts or
//! forges a frame (or, under TLS, a byte), a SIGKILL or SIGSTOP sent when a
//! chosen frame passes, or an edited key file. Then it checks that
//! - every process ends within `--timeout` (plus slack) of the fault, or of
//!   its SIGCONT if it was stopped, with the exit the point expects, and a
//!   typed `suffuse: error:` line where it fails, never a panic;
//! - the client prints nothing (a generation: at most the tokens of passes
//!   that completed, a prefix of the fault-free run's);
//! - each server's ledger lists the key set as spent exactly when the ready
//!   round passed at that server, and its key file is gone exactly then.
//!
//! Two fault-free controls run beside the points, and the checks are shown
//! to fail on them when told to expect a fault.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "faults/cluster.rs"]
mod cluster;
#[path = "faults/proxy.rs"]
mod proxy;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use cluster::{Edit, Job, Offset, On, Outcome, Setup};
use proxy::{Act, Dir, When};
use suffuse_host::model::Transformer;
use suffuse_host::plan::{self, ChainSpec, Kind, Plan, Shape, step};

/// `--timeout` of every process: short, yet far above any step's compute.
const TIMEOUT: u64 = 15;
/// Allowance past the timeout for a loaded machine.
const SLACK: Duration = Duration::from_secs(10);
/// Points run at once.
const PARALLEL: usize = 6;

const HELLO: u8 = 1;
const INPUT: u8 = 2;
const ROUND: u8 = 3;
const OUTPUT: u8 = 4;
const READY: u32 = suffuse_host::server::READY_STEP;
const HELLO_STEP: u32 = suffuse_host::client::HELLO_STEP;

/// How a process must end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Exit {
    /// Exit code 1 with a typed error line.
    Error,
    /// Killed by the fault.
    Killed,
    /// Exit code 0.
    Success,
    /// Exit 0 or a typed error: a server whose output share left before the
    /// client's link failed cannot tell.
    Either,
}

use Exit::{Either, Error, Killed, Success};

struct Point {
    name: &'static str,
    job: Job,
    tls: bool,
    edit: Option<Edit>,
    proxy: Option<(On, When, Act)>,
    /// P0, P1, the client.
    exits: [Exit; 3],
    spent: bool,
    /// Slow connections held open to P0 and P1.
    slow: [usize; 2],
}

fn point(name: &'static str, job: Job, tls: bool) -> Point {
    Point {
        name,
        job,
        tls,
        edit: None,
        proxy: None,
        exits: [Error; 3],
        spent: true,
        slow: [0; 2],
    }
}

impl Point {
    fn on(mut self, on: On, when: When, act: Act) -> Self {
        self.proxy = Some((on, when, act));
        self
    }
    fn edit(mut self, e: Edit) -> Self {
        self.edit = Some(e);
        self
    }
    fn exits(mut self, e: [Exit; 3]) -> Self {
        self.exits = e;
        self
    }
    /// Slowloris connections to each server while it meets its peer and
    /// client: introduced on their own threads, they delay no one.
    fn slow(mut self, n: [usize; 2]) -> Self {
        self.slow = n;
        self.exits = [Success; 3];
        self
    }
    /// The ready round never passes: no key is spent.
    fn unspent(mut self) -> Self {
        self.spent = false;
        self
    }
}

/// The first step of each round kind, from the plan the servers build.
struct Steps {
    gate: u32,
    chain: u32,
    max: u32,
    matmul: u32,
    mulrows: u32,
    square: u32,
    /// A decoder's first step of its first decode pass.
    decode: u32,
}

fn first(plan: &Plan, from_op: usize, want: impl Fn(&Kind) -> bool) -> u32 {
    (from_op..plan.ops.len())
        .find_map(|op| plan.step_of[op].filter(|_| want(&plan.ops[op].kind)))
        .expect("the plan has a step of that kind")
}

fn steps() -> Steps {
    let build = |name: &str, decode_steps| -> std::sync::Arc<Plan> {
        let model = Transformer::builtin(name).unwrap();
        plan::build(
            &model,
            Shape {
                batch: 1,
                seq: 16,
                decode_steps,
            },
        )
        .unwrap()
    };
    let (e, d) = (build("demo", 0), build("tiny-llama", 2));
    Steps {
        gate: first(&e, 0, |k| matches!(k, Kind::Gate(_))),
        chain: first(&e, 0, |k| {
            matches!(
                k,
                Kind::Chain(step::Chain {
                    spec: ChainSpec::Inverse(_),
                    ..
                })
            )
        }),
        max: first(&e, 0, |k| matches!(k, Kind::Max(_))),
        matmul: first(&e, 0, |k| matches!(k, Kind::MatMul(_))),
        mulrows: first(&e, 0, |k| matches!(k, Kind::MulRows(_))),
        square: first(&d, 0, |k| matches!(k, Kind::Square(_))),
        decode: first(&d, d.passes[1].first_op, |_| true),
    }
}

fn points(s: &Steps) -> Vec<Point> {
    use Job::{Embed as E, Generate as G};
    let f = |d, kind, step| When::Frame(d, kind, step);
    let (up, down) = (Some(Dir::Up), Some(Dir::Down));
    let peer = On::Peer;
    vec![
        // Connecting: nothing is spent.
        point("tls: closed before the handshake", E, true)
            .on(peer, When::Byte(Dir::Up, 0), Act::Close)
            .unspent(),
        point("tls: handshake cut", E, true)
            .on(peer, When::Byte(Dir::Down, 40), Act::Close)
            .unspent(),
        point("tls: handshake stalled", E, true)
            .on(peer, When::Byte(Dir::Up, 10), Act::Stall)
            .unspent(),
        point("tls: handshake byte flipped", E, true)
            .on(peer, When::Byte(Dir::Down, 60), Act::Flip(0))
            .unspent(),
        point("hello corrupted", E, false)
            .on(peer, f(up, HELLO, HELLO_STEP), Act::Flip(1))
            .unspent(),
        point("hello stalled", E, false)
            .on(peer, f(up, HELLO, HELLO_STEP), Act::Stall)
            .unspent(),
        point("client input stalled (P0)", E, false)
            .on(On::Client(0), f(up, INPUT, 0), Act::Stall)
            .unspent(),
        point("client input dropped (P0)", E, false)
            .on(On::Client(0), f(up, INPUT, 0), Act::Close)
            .unspent(),
        point("client input short (P1)", E, false)
            .on(On::Client(1), f(up, INPUT, 0), Act::BadLength)
            .unspent(),
        point("ready round closed", E, false)
            .on(peer, f(None, ROUND, READY), Act::Close)
            .unspent(),
        point("ready round stalled", E, false)
            .on(peer, f(None, ROUND, READY), Act::Stall)
            .unspent(),
        point("key file header flipped (P1)", E, true)
            .edit(Edit::Flip(1, Offset::Byte(20)))
            .unspent(),
        // A cut file is refused when it is opened, before any round.
        point("key file 1 byte short (P1)", E, true)
            .edit(Edit::Truncate(1, Offset::FromEnd(1)))
            .unspent(),
        point("key file cut in half (P0)", E, true)
            .edit(Edit::Truncate(0, Offset::PerMille(500)))
            .unspent(),
        // Issue 27: a key file others may read is refused at open.
        point("key file open to others (P1)", E, true)
            .edit(Edit::Mode(1, 0o644))
            .unspent(),
        // Mid key stream: spent at both, since the ready round passed.
        point("key section flipped (P0)", E, true).edit(Edit::Flip(0, Offset::PerMille(500))),
        // Each round kind.
        point("open (gate) round: peer disconnects", E, false).on(
            peer,
            f(up, ROUND, s.gate),
            Act::Close,
        ),
        point("open (gate) round: frame cut", E, false).on(
            peer,
            f(up, ROUND, s.gate),
            Act::Truncate,
        ),
        point("open (gate) round: wrong step", E, false).on(
            peer,
            f(up, ROUND, s.gate),
            Act::BadStep,
        ),
        point("chain round: peer stalls", E, false).on(peer, f(up, ROUND, s.chain), Act::Stall),
        point("chain round: forged abort", E, false).on(peer, f(up, ROUND, s.chain), Act::Abort),
        point("max round: peer disconnects", E, false).on(peer, f(down, ROUND, s.max), Act::Close),
        point("beaver matmul round: wrong length", E, false).on(
            peer,
            f(up, ROUND, s.matmul),
            Act::BadLength,
        ),
        point("beaver matmul round: SIGKILL P0", E, false)
            .on(peer, f(up, ROUND, s.matmul), Act::Signal(0, "KILL"))
            .exits([Killed, Error, Error]),
        point("beaver row product: SIGSTOP P1", E, false).on(
            peer,
            f(up, ROUND, s.mulrows),
            Act::Signal(1, "STOP"),
        ),
        point("tls: record flipped mid-run", E, true).on(
            peer,
            When::Byte(Dir::Up, 100_000),
            Act::Flip(0),
        ),
        point("mid-run: SIGKILL client", E, false)
            .on(peer, f(up, ROUND, s.gate), Act::Signal(2, "KILL"))
            .exits([Either, Either, Killed]),
        point("output share dropped (P0)", E, false)
            .on(On::Client(0), f(down, OUTPUT, 0), Act::Close)
            .exits([Either, Either, Error]),
        // Generation.
        point("generation square round: SIGKILL P1", G, false)
            .on(peer, f(up, ROUND, s.square), Act::Signal(1, "KILL"))
            .exits([Error, Killed, Error]),
        point("generation decode step: peer disconnects", G, false).on(
            peer,
            f(up, ROUND, s.decode),
            Act::Close,
        ),
        point("generation decode step: SIGSTOP P0 mid-pass", G, false).on(
            peer,
            f(up, ROUND, s.decode),
            Act::Signal(0, "STOP"),
        ),
        point("generation decode input short (P0)", G, false).on(
            On::Client(0),
            f(up, INPUT, 1),
            Act::BadLength,
        ),
        point("generation first output dropped (P1)", G, false).on(
            On::Client(1),
            f(down, OUTPUT, 0),
            Act::Close,
        ),
        point("generation: SIGKILL client in decode", G, false)
            .on(peer, f(up, ROUND, s.decode), Act::Signal(2, "KILL"))
            .exits([Error, Error, Killed]),
    ]
}

fn controls() -> Vec<Point> {
    vec![
        point("control: embedding", Job::Embed, true).exits([Success; 3]),
        point("control: generation", Job::Generate, true).exits([Success; 3]),
        // Issue 27: served through a link, spent whole (the file itself,
        // not only the link).
        point("key file served through a link (P0)", Job::Embed, true)
            .edit(Edit::Link(0))
            .exits([Success; 3]),
        // Not faults of the run: each of these slow connections would have
        // held a one-at-a-time server for 10 s, past `--timeout` in all.
        point("slowloris at both servers (TLS)", Job::Embed, true).slow([4, 2]),
        point("slowloris at both servers (plain)", Job::Embed, false).slow([4, 2]),
    ]
}

/// Everything wrong with an outcome, given what the point expects and
/// the fault-free generation's stdout.
fn violations(p: &Point, o: &Outcome, clean: &str) -> Vec<String> {
    let mut bad = Vec::new();
    let base = o.fired.unwrap_or(o.start);
    if p.proxy.is_some() && o.fired.is_none() {
        bad.push("the fault never fired".to_string());
    }
    for (i, (end, want)) in o.ends.iter().zip(p.exits).enumerate() {
        let who = ["P0", "P1", "client"][i];
        // The client, too: it meets P0 and then joins P1 within one
        // `--timeout` in all.
        let limit = Duration::from_secs(TIMEOUT) + SLACK;
        let from = end.resumed.unwrap_or(base).max(base);
        if end.at.saturating_duration_since(from) > limit {
            bad.push(format!(
                "{who} ended {:.1} s after the fault (limit {:.0} s)",
                end.at.saturating_duration_since(from).as_secs_f64(),
                limit.as_secs_f64()
            ));
        }
        if let Some(why) = exit_violation(end, want) {
            bad.push(format!("{who}: {why}"));
        }
    }
    // Issue 27: a server's abort never shows the client its file paths.
    if let Some(l) = o.ends[2].stderr.iter().find(|l| l.contains(".keys")) {
        bad.push(format!("the client was shown a key file's path: {l}"));
    }
    let client_ok = p.exits[2] == Success;
    let printed = o.stdout.trim_end();
    match p.job {
        Job::Embed if !client_ok && !printed.is_empty() => {
            bad.push(format!("the client printed {printed:?}"));
        }
        Job::Generate if !clean.starts_with(printed) => {
            bad.push(format!(
                "the client printed {printed:?}, not a prefix of {clean:?}"
            ));
        }
        _ => {}
    }
    for party in 0..2 {
        if o.spent[party] != p.spent {
            bad.push(format!(
                "P{party}'s ledger: spent {}, want {}",
                o.spent[party], p.spent
            ));
        }
        if o.keys_left[party] == o.spent[party] {
            bad.push(format!(
                "P{party}'s key file left {} while spent {}",
                o.keys_left[party], o.spent[party]
            ));
        }
    }
    bad
}

fn exit_violation(end: &cluster::End, want: Exit) -> Option<String> {
    use std::os::unix::process::ExitStatusExt;
    let status = end.status?;
    let typed = end.stderr.iter().any(|l| l.starts_with("suffuse: error: "));
    let panicked = end.stderr.iter().any(|l| l.contains("panicked"));
    let ok = match want {
        Killed => status.signal() == Some(9),
        Success => status.code() == Some(0),
        Error => status.code() == Some(1) && typed,
        Either => status.code() == Some(0) || (status.code() == Some(1) && typed),
    };
    (!ok || panicked)
        .then(|| {
            format!(
                "ended {status}, want {want:?}; last lines: {:?}",
                end.stderr.iter().rev().take(2).collect::<Vec<_>>()
            )
        })
        .or_else(|| end.status.is_none().then(|| "never ended".into()))
}

/// Runs every point, `PARALLEL` at a time.
fn run_all(points: &[Point]) -> Vec<Outcome> {
    let root = cluster::root();
    let certs = cluster::certs(&root);
    let next = Mutex::new(0usize);
    let results: Mutex<Vec<Option<Outcome>>> = Mutex::new(points.iter().map(|_| None).collect());
    std::thread::scope(|sc| {
        for _ in 0..PARALLEL {
            sc.spawn(|| {
                loop {
                    let i = {
                        let mut n = next.lock().unwrap();
                        *n += 1;
                        *n - 1
                    };
                    let Some(p) = points.get(i) else { break };
                    let setup = Setup {
                        root: &root,
                        name: &format!("point{i}"),
                        job: p.job,
                        tls: p.tls,
                        timeout: TIMEOUT,
                        edit: p.edit,
                        proxy: p.proxy,
                        slow: p.slow,
                    };
                    let o = cluster::run(&setup, &certs);
                    results.lock().unwrap()[i] = Some(o);
                }
            });
        }
    });
    let _ = std::fs::remove_dir_all(&root);
    results
        .into_inner()
        .unwrap()
        .into_iter()
        .map(Option::unwrap)
        .collect()
}

fn describe(o: &Outcome) -> String {
    let base = o.fired.unwrap_or(o.start);
    let end = |e: &cluster::End| {
        let line = e
            .stderr
            .iter()
            .rev()
            .find(|l| l.starts_with("suffuse: error: "));
        let from = e.resumed.unwrap_or(base).max(base);
        format!(
            "{} after {:.1} s {}",
            e.status.map_or("-".into(), |s| s.to_string()),
            e.at.saturating_duration_since(from).as_secs_f64(),
            line.map_or("", |l| l.trim_start_matches("suffuse: error: "))
        )
    };
    format!(
        "P0: {} | P1: {} | client: {} | spent {:?}",
        end(&o.ends[0]),
        end(&o.ends[1]),
        end(&o.ends[2]),
        o.spent
    )
}

#[test]
fn every_fault_point_ends_typed_in_time_with_an_honest_ledger() {
    let begin = Instant::now();
    let mut all = controls();
    let faults = points(&steps());
    assert!(faults.len() >= 20);
    all.extend(faults);
    let outcomes = run_all(&all);
    let clean = outcomes[1].stdout.trim_end().to_string();
    assert!(
        !clean.is_empty(),
        "the fault-free generation printed nothing"
    );
    let mut failures = Vec::new();
    for (p, o) in all.iter().zip(&outcomes) {
        let mut bad = violations(p, o, &clean);
        if p.slow != [0; 2] && o.stdout != outcomes[0].stdout {
            bad.push("the answer differs from the fault-free run's".into());
        }
        eprintln!("{:<48} {}", p.name, describe(o));
        for b in &bad {
            eprintln!("    VIOLATION: {b}");
        }
        if !bad.is_empty() {
            failures.push(p.name);
        }
    }
    // The checks can fail: a fault-free run does not pass for a fault.
    let planted = point("planted", Job::Embed, true).unspent();
    assert!(!violations(&planted, &outcomes[0], &clean).is_empty());
    eprintln!(
        "{} points in {:.1} s",
        all.len(),
        begin.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "fault points failed: {failures:?}");
}
