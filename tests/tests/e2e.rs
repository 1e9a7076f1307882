//! Secure inference end to end, in one process over loopback TCP: the
//! output must equal the cleartext fixed-point reference bit for bit, stay
//! close to the float model, and be unaffected by padding; bad keys, wrong
//! models and absent peers must fail with clear errors, not hang.

#![allow(clippy::unwrap_used)]

use std::net::TcpStream;
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use suffuse_core::fss::Party;
use suffuse_host::backend;
use suffuse_host::client;
use suffuse_host::dealer;
use suffuse_host::keyfile::KeyFileError;
use suffuse_host::ledger::Ledger;
use suffuse_host::model::{Config, Model, Pooling};
use suffuse_host::net::{Listener, Security, Timeouts};
use suffuse_host::plan::bert;
use suffuse_host::reference;
use suffuse_host::server::{self, ServeError, ServeOptions};
use suffuse_host::session::{self, Options, SessionError};

fn tokens(model: &Model, texts: &[&str]) -> Vec<Vec<u32>> {
    texts
        .iter()
        .map(|t| model.tokenizer.encode(t, model.config.max_tokens).unwrap())
        .collect()
}

fn short() -> Timeouts {
    Timeouts {
        connect: Duration::from_secs(20),
        io: Duration::from_secs(20),
    }
}

/// Server options with the ledger beside the key files; spent files are
/// kept, so that tests can show the ledger refusing them.
fn opts(files: &[PathBuf; 2], timeouts: Timeouts) -> ServeOptions {
    let dir = files[0].parent().unwrap().join("state");
    ServeOptions {
        timeouts,
        ledger: Ledger::open(&dir).unwrap(),
        keep_spent: true,
        security: Security::Insecure,
    }
}

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("suffuse-e2e-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    // 0700: keys are dealt into it, and the dealer refuses an open folder.
    std::fs::DirBuilder::new().mode(0o700).create(&d).unwrap();
    d
}

#[test]
fn demo_batch_of_different_lengths_is_bit_exact_and_close_to_float() {
    let model = Model::demo();
    let batch = tokens(
        &model,
        &[
            "the secure output must equal the reference",
            "short",
            "a sentence of middling length here",
        ],
    );
    let out = session::run(&model, &batch, &Options::default()).unwrap();
    assert_eq!(out.report.bit_exact, Some(true));
    let cos = out.report.cosine_to_float.unwrap();
    assert!(cos >= 0.999, "cosine to float {cos}");
    assert_eq!(out.embeddings.len(), 3);
    // The report adds up.
    let r = &out.report;
    assert!(r.rounds > 0 && r.comm_bytes_per_party[0] > 0 && r.key_bytes_per_party[1] > 0);
    let rounds: u64 = r.breakdown.values().map(|b| b.rounds).sum();
    assert_eq!(rounds, r.rounds);
    let keys: u64 = r.breakdown.values().map(|b| b.key_bytes_per_party[1]).sum();
    assert!(keys <= r.key_bytes_per_party[1]);
    // Every key section counts once by kind and once by gate.
    for p in 0..2 {
        let by_kind: u64 = r.breakdown.values().map(|b| b.key_bytes_per_party[p]).sum();
        let by_gate: u64 = r
            .keys_by_gate
            .values()
            .map(|g| g.key_bytes_per_party[p])
            .sum();
        assert_eq!(by_gate, by_kind, "party {p}");
    }
    assert!(r.keys_by_gate.values().all(|g| g.elements > 0));
    for gate in ["gelu", "nexp", "recip", "rsqrt", "max", "matrix product"] {
        assert!(
            r.keys_by_gate.contains_key(gate),
            "no {gate} in {:?}",
            r.keys_by_gate.keys()
        );
    }
    assert!(r.keys_by_gate.keys().any(|k| k.starts_with("trunc, ")));
    // Every round and byte sent counts once by kind of step.
    let by_step: f64 = r.rounds_by_gate.values().map(|g| g.rounds).sum();
    assert_eq!(by_step, r.rounds as f64);
    for p in 0..2 {
        let sent: f64 = r
            .rounds_by_gate
            .values()
            .map(|g| g.comm_bytes_per_party[p])
            .sum();
        let by_kind: u64 = r
            .breakdown
            .values()
            .map(|b| b.comm_bytes_per_party[p])
            .sum();
        assert_eq!(sent, by_kind as f64, "party {p}");
    }
    assert!(r.rounds_by_gate.values().all(|g| g.steps >= 1.0));
    assert!(r.rounds_by_gate["max"].rounds > 0.0);
}

#[test]
fn padding_changes_no_bit_of_any_embedding() {
    // Padded keys get probability exactly 0 and padded rows are masked out
    // of the pooling, so a sentence's fixed-point output is the same alone
    // and padded inside a batch.
    let model = Model::demo();
    let batch = tokens(
        &model,
        &["x", "two words", "and now a much longer sentence to pad to"],
    );
    let seq = batch.iter().map(Vec::len).max().unwrap();
    let plan = bert::build(&model, batch.len(), seq).unwrap();
    let inputs = client::clear_inputs(&model, &client::ClientView::of(&plan), &batch).unwrap();
    let together = reference::run(&plan, &inputs, backend::auto()).unwrap();
    let d = model.config.hidden;
    for (i, t) in batch.iter().enumerate() {
        let alone_plan = bert::build(&model, 1, t.len()).unwrap();
        let alone_inputs = client::clear_inputs(
            &model,
            &client::ClientView::of(&alone_plan),
            std::slice::from_ref(t),
        )
        .unwrap();
        let alone = reference::run(&alone_plan, &alone_inputs, backend::auto()).unwrap();
        assert_eq!(
            alone,
            together[i * d..(i + 1) * d],
            "sentence {i} changed with padding"
        );
    }
}

#[test]
fn one_token_and_odd_lengths_run() {
    let model = Model::demo();
    let cls = model.tokenizer.token_id("[CLS]").unwrap();
    for batch in [vec![vec![cls]], vec![vec![cls, 7, 9, 11, 13]]] {
        let out = session::run(&model, &batch, &Options::default()).unwrap();
        assert_eq!(out.report.bit_exact, Some(true));
    }
}

#[test]
fn cls_pooling_and_tanh_gelu_are_bit_exact() {
    let mut config = Config::demo();
    config.pooling = Pooling::Cls;
    config.normalize = false;
    config.activation = suffuse_host::model::Activation::GeluTanh;
    config.layers = 1;
    let model = Model::generated(config, 42);
    let batch = tokens(&model, &["pooling by the first token", "ok"]);
    let out = session::run(&model, &batch, &Options::default()).unwrap();
    assert_eq!(out.report.bit_exact, Some(true));
    assert!(out.report.cosine_to_float.unwrap() >= 0.999);
}

/// Deals keys for `model` into a folder.
fn deal(model: &Model, seq: usize, name: &str) -> [PathBuf; 2] {
    let plan = bert::build(model, 1, seq).unwrap();
    dealer::deal(
        &plan,
        &temp(name),
        (false, dealer::KeysFor::Now),
        backend::auto(),
    )
    .unwrap()
    .files
}

#[test]
fn keys_are_spent_by_a_query_not_by_a_failed_start() {
    let model = Model::demo();
    let files = deal(&model, 6, "spent");
    // The client rejects its own input after the hellos (7 tokens > 6): it
    // tells both servers, and no key has been used.
    let (served, q) = session::query_pair(
        &model,
        &files,
        &[vec![2u32; 7]],
        &opts(&files, short()),
        backend::auto(),
    )
    .unwrap();
    assert!(
        matches!(q, Err(client::ClientError::TooLong { .. })),
        "{q:?}"
    );
    for r in served {
        let e = r.unwrap_err().to_string();
        assert!(e.contains("client gave up"), "{e}");
    }
    // So the same keys still serve a query, bit-exact.
    let batch = tokens(&model, &["fine"]);
    let (served, q) = session::query_pair(
        &model,
        &files,
        &batch,
        &opts(&files, short()),
        backend::auto(),
    )
    .unwrap();
    for r in served {
        r.unwrap();
    }
    let plan = bert::build(&model, 1, 6).unwrap();
    let want = reference::run(
        &plan,
        &client::clear_inputs(&model, &client::ClientView::of(&plan), &batch).unwrap(),
        backend::auto(),
    );
    assert_eq!(q.unwrap().output, want.unwrap());
    // And then never again.
    let listener = Listener::bind("127.0.0.1:0").unwrap();
    for (party, file) in [Party::P0, Party::P1].into_iter().zip(&files) {
        let again = server::serve(
            &model,
            party,
            file,
            &listener,
            "unused",
            &opts(&files, short()),
            backend::auto(),
        );
        assert!(
            matches!(again, Err(ServeError::KeyFile(KeyFileError::Spent { .. }))),
            "{again:?}"
        );
    }
}

#[test]
fn keys_for_another_model_are_refused_before_any_work() {
    let model = Model::demo();
    let files = deal(&model, 4, "wrong-model");
    let other = Model::generated(Config::demo(), 7);
    let listener = Listener::bind("127.0.0.1:0").unwrap();
    let r = server::serve(
        &other,
        Party::P0,
        &files[0],
        &listener,
        "unused",
        &opts(&files, short()),
        backend::auto(),
    );
    assert!(
        matches!(
            r,
            Err(ServeError::KeyFile(KeyFileError::PlanMismatch { .. }))
        ),
        "{r:?}"
    );
    // And a server given the other party's keys.
    let r = server::serve(
        &model,
        Party::P0,
        &files[1],
        &listener,
        "unused",
        &opts(&files, short()),
        backend::auto(),
    );
    assert!(
        matches!(r, Err(ServeError::KeyFile(KeyFileError::Party { .. }))),
        "{r:?}"
    );
}

#[test]
fn an_absent_peer_times_out_and_a_vanished_one_is_reported() {
    let model = Model::demo();
    let files = deal(&model, 4, "peer");
    // P1 dials a P0 that never listens: a timeout, promptly.
    let listener = Listener::bind("127.0.0.1:0").unwrap();
    let t = Timeouts {
        connect: Duration::from_millis(500),
        io: Duration::from_millis(500),
    };
    let start = Instant::now();
    let r = server::serve(
        &model,
        Party::P1,
        &files[1],
        &listener,
        "127.0.0.1:9",
        &opts(&files, t),
        backend::auto(),
    );
    assert!(matches!(r, Err(ServeError::Net { .. })), "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(10));
    // A peer that connects and vanishes without a word.
    let listener = Listener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let ghost = std::thread::spawn(move || {
        let s = TcpStream::connect(addr).unwrap();
        drop(s);
    });
    let r = server::serve(
        &model,
        Party::P0,
        &files[0],
        &listener,
        "unused",
        &opts(&files, t),
        backend::auto(),
    );
    ghost.join().unwrap();
    assert!(matches!(r, Err(ServeError::Net { .. })), "{r:?}");
}

#[test]
fn servers_with_keys_from_different_dealer_runs_refuse_each_other() {
    let model = Model::demo();
    let a = deal(&model, 4, "set-a");
    let b = deal(&model, 4, "set-b");
    let listeners = [
        Listener::bind("127.0.0.1:0").unwrap(),
        Listener::bind("127.0.0.1:0").unwrap(),
    ];
    let p0_addr = listeners[0].local_addr().unwrap().to_string();
    let (r0, r1) = std::thread::scope(|s| {
        let h0 = s.spawn(|| {
            server::serve(
                &model,
                Party::P0,
                &a[0],
                &listeners[0],
                "",
                &opts(&a, short()),
                backend::auto(),
            )
        });
        let h1 = s.spawn(|| {
            server::serve(
                &model,
                Party::P1,
                &b[1],
                &listeners[1],
                &p0_addr,
                &opts(&b, short()),
                backend::auto(),
            )
        });
        (h0.join().unwrap(), h1.join().unwrap())
    });
    for r in [r0, r1] {
        let e = r.unwrap_err().to_string();
        assert!(e.contains("key-set") || e.contains("key set"), "{e}");
    }
}

#[test]
fn session_errors_name_the_failing_part() {
    // A sentence longer than the model allows is a plan error, not a panic.
    let model = Model::demo();
    let too_long = vec![vec![1u32; model.config.max_positions + 1]];
    let r = session::run(&model, &too_long, &Options::default());
    assert!(matches!(r, Err(SessionError::Plan(_))), "{r:?}");
}

#[test]
fn a_corrupt_key_section_stops_the_query_before_any_output() {
    let model = Model::demo();
    let files = deal(&model, 4, "corrupt");
    // One bit of P1's first section (its seed comes first).
    let mut bytes = std::fs::read(&files[1]).unwrap();
    let summary = u32::from_le_bytes(bytes[68..72].try_into().unwrap()) as usize;
    bytes[72 + summary + 16] ^= 1;
    std::fs::write(&files[1], &bytes).unwrap();
    let batch = tokens(&model, &["a"]);
    let (served, q) = session::query_pair(
        &model,
        &files,
        &batch,
        &opts(&files, short()),
        backend::auto(),
    )
    .unwrap();
    assert!(q.is_err(), "the client got an output from corrupt keys");
    let e1 = served[1].as_ref().unwrap_err().to_string();
    assert!(e1.contains("corrupt"), "{e1}");
    let e0 = served[0].as_ref().unwrap_err().to_string();
    assert!(e0.contains("corrupt"), "P0 is told why: {e0}");
}

#[test]
fn a_client_refuses_a_shape_it_did_not_ask_for_without_allocating() {
    let model = Model::demo();
    let real = client::ClientView::of(&bert::build(&model, 1, 4).unwrap());
    for batch in [1usize << 61, 1_000_000, 2] {
        let view = client::ClientView {
            batch,
            ..real.clone()
        };
        let listeners = [
            Listener::bind("127.0.0.1:0").unwrap(),
            Listener::bind("127.0.0.1:0").unwrap(),
        ];
        let addrs = listeners
            .each_ref()
            .map(|l| l.local_addr().unwrap().to_string());
        let r = std::thread::scope(|s| {
            for (party, l) in listeners.iter().enumerate() {
                let view = view.clone();
                s.spawn(move || {
                    let mut link = l.accept(short()).unwrap();
                    let _ = client::recv_hello(&mut link).unwrap();
                    let fake = client::Hello::Server {
                        party: party as u8,
                        plan_hash: "00".into(),
                        key_set: "00".into(),
                        batch,
                        seq: 4,
                        model: "demo".into(),
                        view,
                    };
                    client::send_hello(&mut link, &fake).unwrap();
                });
            }
            let expect = client::Expect {
                batch: 1,
                seq: None,
            };
            client::connect(
                &model,
                [&addrs[0], &addrs[1]],
                short(),
                &Security::Insecure,
                expect,
            )
        });
        let e = r.err().unwrap().to_string();
        assert!(e.contains("this query expects 1 sentence"), "{e}");
    }
}

#[test]
fn absurd_shapes_are_plan_errors() {
    let model = Model::demo();
    for (batch, seq) in [(1usize << 61, 4), (usize::MAX, usize::MAX), (1 << 17, 1)] {
        let r = bert::build(&model, batch, seq);
        assert!(r.is_err(), "batch {batch} × {seq} was planned");
    }
}
