//! The computation as real OS processes: `suffuse dealer`, two `suffuse
//! serve` and `suffuse query`, spawned from the built binary, must print
//! the same embedding as the in-process `suffuse embed` — bit for bit,
//! since padding to the dealt length changes no bit.
//!
//! These tests live in suffuse-host because Cargo gives a package's tests
//! the path of that package's binaries (`CARGO_BIN_EXE_suffuse`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_suffuse");

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("suffuse-proc-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    // 0700: keys are dealt into it, and the dealer refuses an open folder.
    std::fs::DirBuilder::new().mode(0o700).create(&d).unwrap();
    d
}

fn run(args: &[&str]) -> Output {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "suffuse {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Starts a server and returns it with the address it listens on (read
/// from its first line on stderr).
fn serve(party: u8, keys: &Path, peer: &str, report: &Path) -> (Child, String) {
    serve_model("demo", party, keys, peer, report)
}

fn serve_model(model: &str, party: u8, keys: &Path, peer: &str, report: &Path) -> (Child, String) {
    let mut child = Command::new(BIN)
        .args([
            "serve",
            "--party",
            &party.to_string(),
            "--model",
            model,
            "--keys",
            keys.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--peer",
            peer,
            "--timeout",
            "60",
            "--report-json",
            report.to_str().unwrap(),
            "--state-dir",
            report.parent().unwrap().join("state").to_str().unwrap(),
            "--tls",
            report.parent().unwrap().join("certs").to_str().unwrap(),
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let first = lines.next().unwrap().unwrap();
    let addr = first
        .rsplit(' ')
        .next()
        .expect("the server announces its address")
        .to_string();
    // Keep draining stderr so the server never blocks on a full pipe.
    // (shown with the test's output if it fails).
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            eprintln!("server: {line}");
        }
    });
    (child, addr)
}

fn wait(mut child: Child, limit: Duration) -> bool {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.success();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn embedding(stdout: &[u8]) -> Vec<f64> {
    let line = String::from_utf8_lossy(stdout);
    let v: serde_json::Value = serde_json::from_str(line.lines().next().unwrap()).unwrap();
    v["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

#[test]
fn three_processes_give_the_in_process_answer() {
    let dir = temp("three");
    let text = "three processes, one answer";
    run(&[
        "dealer",
        "--model",
        "demo",
        "--seq",
        "40",
        "--out",
        dir.to_str().unwrap(),
        "--report-json",
        dir.join("dealer.json").to_str().unwrap(),
    ]);
    let state = dir.join("state");
    let inspect = run(&[
        "inspect",
        dir.join("p1.keys").to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
    ]);
    let shown = String::from_utf8_lossy(&inspect.stdout);
    assert!(
        shown.contains("party      1") && shown.contains("1 sentence(s) × 40 tokens"),
        "{shown}"
    );

    std::fs::copy(dir.join("p0.keys"), dir.join("copy.keys")).unwrap();
    let certs = dir.join("certs");
    run(&["certs", "--out", certs.to_str().unwrap()]);
    let (p0, addr0) = serve(0, &dir.join("p0.keys"), "unused", &dir.join("p0.json"));
    let (p1, addr1) = serve(1, &dir.join("p1.keys"), &addr0, &dir.join("p1.json"));
    let report = dir.join("query.json");
    let query = run(&[
        "query",
        "--model",
        "demo",
        "--servers",
        &format!("{addr0},{addr1}"),
        "--compare",
        "float",
        "--report-json",
        report.to_str().unwrap(),
        "--tls",
        certs.to_str().unwrap(),
        text,
    ]);
    assert!(wait(p0, Duration::from_secs(60)), "P0 failed");
    assert!(wait(p1, Duration::from_secs(60)), "P1 failed");
    let remote = embedding(&query.stdout);

    let local = run(&["embed", "--model", "demo", text]);
    assert_eq!(
        remote,
        embedding(&local.stdout),
        "three processes and one process differ"
    );

    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    for field in [
        "model",
        "tokens",
        "online_s",
        "comm_bytes_per_party",
        "rounds",
        "keygen_s",
        "key_bytes_per_party",
        "cosine_to_float",
        "breakdown",
        "keys_by_gate",
        "rounds_by_gate",
    ] {
        assert!(r.get(field).is_some(), "report lacks {field}: {r}");
    }
    // The servers' per-gate key counts reach the client.
    let gelu = &r["keys_by_gate"]["gelu"]["key_bytes_per_party"];
    assert!(
        gelu[0].as_u64().unwrap() > 0 && gelu[1].as_u64().unwrap() > 0,
        "{r}"
    );
    assert!(r["cosine_to_float"].as_f64().unwrap() > 0.999);
    for kind in [
        "linear",
        "attention_matmul",
        "softmax",
        "gelu",
        "layernorm",
        "truncation",
    ] {
        assert!(r["breakdown"].get(kind).is_some(), "breakdown lacks {kind}");
    }

    // The keys are spent: the files are gone, and a copy made before is
    // refused by the ledger.
    assert!(!dir.join("p0.keys").exists());
    let again = Command::new(BIN)
        .args([
            "serve",
            "--party",
            "0",
            "--model",
            "demo",
            "--keys",
            dir.join("copy.keys").to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--peer",
            "unused",
            "--state-dir",
            dir.join("state").to_str().unwrap(),
            "--insecure-transport",
        ])
        .output()
        .unwrap();
    assert!(!again.status.success());
    let msg = String::from_utf8_lossy(&again.stderr);
    assert!(msg.contains("already spent"), "{msg}");
}

#[test]
fn three_process_generation_gives_the_in_process_tokens() {
    let dir = temp("generate");
    let prompt = "a private prompt";
    run(&[
        "dealer",
        "--model",
        "tiny-llama",
        "--seq",
        "32",
        "--max-new-tokens",
        "4",
        "--out",
        dir.to_str().unwrap(),
    ]);
    let certs = dir.join("certs");
    run(&["certs", "--out", certs.to_str().unwrap()]);
    let (p0, addr0) = serve_model(
        "tiny-llama",
        0,
        &dir.join("p0.keys"),
        "unused",
        &dir.join("p0.json"),
    );
    let (p1, addr1) = serve_model(
        "tiny-llama",
        1,
        &dir.join("p1.keys"),
        &addr0,
        &dir.join("p1.json"),
    );
    let remote = dir.join("query.json");
    run(&[
        "query",
        "--model",
        "tiny-llama",
        "--generate",
        "--servers",
        &format!("{addr0},{addr1}"),
        "--report-json",
        remote.to_str().unwrap(),
        "--tls",
        certs.to_str().unwrap(),
        prompt,
    ]);
    assert!(wait(p0, Duration::from_secs(60)), "P0 failed");
    assert!(wait(p1, Duration::from_secs(60)), "P1 failed");
    let local = dir.join("local.json");
    run(&[
        "generate",
        "--model",
        "tiny-llama",
        "--max-new-tokens",
        "4",
        "--report-json",
        local.to_str().unwrap(),
        prompt,
    ]);
    let read = |p: &Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
    };
    let (r, l) = (read(&remote), read(&local));
    assert_eq!(l["bit_exact"], serde_json::Value::Bool(true));
    assert_eq!(r["generated_token_ids"], l["generated_token_ids"]);
    assert_eq!(r["prompt_token_ids"], l["prompt_token_ids"]);
    for field in [
        "prefill_online_s",
        "decode_online_s_per_token",
        "comm_bytes_per_token_per_party",
        "rounds_per_token",
        "rounds_per_layer_per_token",
        "key_bytes_per_token_per_party",
    ] {
        assert!(r[field].as_f64().is_some(), "report lacks {field}: {r}");
    }
    // The servers' per-step traffic reaches a remote client too.
    let max = &r["rounds_by_gate_per_token"]["max"]["rounds"];
    assert!(max.as_f64().unwrap() > 0.0, "{r}");
}

#[test]
fn demo_reports_bit_exact_and_json_stays_clean() {
    let dir = temp("demo");
    let report = dir.join("demo.json");
    let out = run(&["demo", "--json", "--report-json", report.to_str().unwrap()]);
    // --json: stdout is exactly one JSON document; progress went to stderr.
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["bit_exact"], serde_json::Value::Bool(true));
    let file: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(file["bit_exact"], serde_json::Value::Bool(true));
}

#[test]
fn bad_invocations_fail_with_a_message() {
    let out = Command::new(BIN)
        .args(["embed", "--model", "/nonexistent/model", "hello"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(msg.contains("/nonexistent/model"), "{msg}");

    let out = Command::new(BIN)
        .args(["inspect", "/nonexistent.keys"])
        .output()
        .unwrap();
    assert!(!out.status.success());

    let garbage = temp("garbage").join("junk.keys");
    std::fs::write(&garbage, b"not a key file at all, certainly not").unwrap();
    let out = Command::new(BIN)
        .args(["inspect", garbage.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a suffuse key file"));
}

/// Issue 27 (low), messages: what a client meets most often says what
/// happened and what to do. A server that closes the connection at once (a
/// one-query server already serving, or one speaking TLS to a plain
/// client), nothing listening, and a decoder asked for embeddings.
#[test]
fn connection_failures_say_what_happened() {
    let dir = temp("messages");
    run(&["certs", "--out", dir.join("certs").to_str().unwrap()]);
    // Closes every connection as soon as it is made.
    let closer = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closing = closer.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for c in closer.incoming() {
            drop(c);
        }
    });
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nobody = free.local_addr().unwrap().to_string();
    drop(free);
    let query = |model: &str, servers: &str, transport: &[&str]| {
        let out = Command::new(BIN)
            .args(["query", "--model", model, "--servers", servers])
            .args(["--timeout", "2"])
            .args(transport)
            .arg("a text")
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert!(out.stdout.is_empty());
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let both = format!("{closing},{closing}");
    let certs = dir.join("certs");
    let tls = ["--tls", certs.to_str().unwrap()];
    let plain = query("demo", &both, &["--insecure-transport"]);
    assert!(
        plain.contains("closed the connection before it answered"),
        "{plain}"
    );
    assert!(plain.contains("may expect TLS"), "{plain}");
    assert!(plain.contains("serving another query"), "{plain}");
    let secured = query("demo", &both, &tls);
    assert!(
        secured.contains("closed the connection before it answered"),
        "{secured}"
    );
    assert!(secured.contains("may not use TLS"), "{secured}");
    let gone = query("demo", &format!("{nobody},{nobody}"), &tls);
    assert!(
        gone.contains(&format!("nothing is listening at {nobody}")),
        "{gone}"
    );
    let decoder = query("tiny-llama", &both, &tls);
    assert!(
        decoder.contains("tiny-llama is a decoder: query it with --generate"),
        "{decoder}"
    );
}

#[test]
fn secrets_are_never_written_into_an_open_folder() {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp("open");
    let open = dir.join("open");
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(&open)
        .unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = open.to_str().unwrap();
    let embed_keys = ["embed", "--model", "demo", "--keys-dir", o, "hi"];
    // The folder is refused before the model loads (a real decoder takes
    // a minute and GBs): a model that is not there is not even looked for.
    let missing = dir.join("no-such-model.gguf");
    let m = missing.to_str().unwrap();
    let generate_keys = ["generate", "--model", m, "--keys-dir", o, "hi"];
    let embed_missing = ["embed", "--model", m, "--keys-dir", o, "hi"];
    for args in [
        &["dealer", "--model", "demo", "--seq", "8", "--out", o][..],
        &[
            "dealer", "--model", "demo", "--seq", "8", "--count", "1", "--out", o,
        ],
        &["certs", "--out", o],
        &embed_keys,
        &generate_keys,
        &embed_missing,
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        let msg = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            msg.contains(o) && msg.contains("mode 755") && msg.contains("chmod 700"),
            "{args:?}: {msg}"
        );
        // Nothing was written, and the folder keeps its mode.
        assert_eq!(std::fs::read_dir(&open).unwrap().count(), 0, "{args:?}");
        let mode = std::fs::metadata(&open).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
    }
    // A state folder open to others could lose ledger entries: refused too.
    let keys = dir.join("keys");
    run(&[
        "dealer",
        "--model",
        "demo",
        "--seq",
        "8",
        "--out",
        keys.to_str().unwrap(),
    ]);
    let p0 = keys.join("p0.keys");
    let out = Command::new(BIN)
        .args(["inspect", p0.to_str().unwrap(), "--state-dir", o])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("mode 755"));
}
