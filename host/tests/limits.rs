//! Issue 27: under a 1 GB address-space limit (`ulimit -v 1000000`), no
//! key file, frame or model file of any claimed size or sparseness makes a
//! command allocate past the limit: each gets a typed error (exit 1 and a
//! `suffuse: error:` line), never an allocation abort or the OOM killer.
//! Every forged file here is 1 TiB long and nearly all hole.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_suffuse");

/// The limit, in KiB as `ulimit -v` takes it: 1 GB.
const LIMIT_KIB: u64 = 1_000_000;

/// A claimed length far past any memory.
const TIB: u64 = 1 << 40;

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("suffuse-limits-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::DirBuilder::new().mode(0o700).create(&d).unwrap();
    d
}

/// `suffuse`, to be given its arguments, under the limit.
fn suffuse_limited() -> Command {
    let line = format!("ulimit -v {LIMIT_KIB} && exec \"$0\" \"$@\"");
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &line, BIN]).stdin(Stdio::null());
    cmd
}

/// `suffuse ARGS` under the limit, run to its end.
fn limited(args: &[&str]) -> Output {
    suffuse_limited().args(args).output().unwrap()
}

/// The demo model's keys for 16 tokens, dealt (without a limit) into
/// `dir/keys`.
fn dealt(dir: &Path) -> PathBuf {
    let keys = dir.join("keys");
    let out = Command::new(BIN)
        .args(["dealer", "--model", "demo", "--seq", "16", "--out"])
        .arg(&keys)
        .output()
        .unwrap();
    assert!(out.status.success());
    keys
}

/// A typed refusal: exit 1, a `suffuse: error:` line, no abort.
fn refused(out: &Output, what: &str) -> String {
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{what}: {err}");
    assert!(err.contains("suffuse: error:"), "{what}: {err}");
    assert!(!err.contains("memory allocation"), "{what}: {err}");
    err
}

/// `bytes`, then a hole up to 1 TiB, at `path`, mode 0600.
fn sparse(path: &Path, bytes: &[u8]) {
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(bytes).unwrap();
    f.set_len(TIB).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

#[test]
fn forged_key_files_are_refused_within_a_gigabyte() {
    let dir = temp("keys");
    let keys = dealt(&dir);
    let mut real = std::fs::read(keys.join("p0.keys")).unwrap();
    // The step count (bytes 64..68) claims 2^32 - 1 steps.
    real[64..68].copy_from_slice(&u32::MAX.to_le_bytes());
    let forged = dir.join("p0.keys");
    sparse(&forged, &real);
    let f = forged.to_str().unwrap();
    refused(&limited(&["inspect", f]), "inspect");
    let state = dir.join("state");
    let serve = limited(&[
        "serve",
        "--party",
        "0",
        "--model",
        "demo",
        "--keys",
        f,
        "--listen",
        "127.0.0.1:0",
        "--peer",
        "unused",
        "--timeout",
        "5",
        "--insecure-transport",
        "--state-dir",
        state.to_str().unwrap(),
    ]);
    refused(&serve, "serve");
    // A header alone, the rest hole.
    let head = dir.join("head.keys");
    sparse(&head, &real[..72]);
    refused(
        &limited(&["inspect", head.to_str().unwrap()]),
        "header only",
    );
}

#[test]
fn forged_model_files_are_refused_within_a_gigabyte() {
    let dir = temp("models");
    // A checkpoint folder whose weights file is a 1 TiB hole after a
    // header that claims it all.
    let folder = dir.join("bert");
    suffuse_host::model::Model::builtin("demo")
        .unwrap()
        .write_dir(&folder)
        .unwrap();
    let weights = folder.join("model.safetensors");
    let header =
        br#"{"w":{"dtype":"F32","shape":[274877906944],"data_offsets":[0,1099511627776]}}"#;
    let mut st = (header.len() as u64).to_le_bytes().to_vec();
    st.extend_from_slice(header);
    sparse(&weights, &st);
    let embed = limited(&["embed", "--model", folder.to_str().unwrap(), "a text"]);
    refused(&embed, "embed (safetensors)");
    // A GGUF file: its magic and version, then a hole.
    let gguf = dir.join("model.gguf");
    let mut g = b"GGUF".to_vec();
    g.extend_from_slice(&3u32.to_le_bytes());
    g.extend_from_slice(&u64::MAX.to_le_bytes());
    g.extend_from_slice(&u64::MAX.to_le_bytes());
    sparse(&gguf, &g);
    let generated = limited(&["generate", "--model", gguf.to_str().unwrap(), "a prompt"]);
    refused(&generated, "generate (GGUF)");
    let deal = limited(&[
        "dealer",
        "--model",
        gguf.to_str().unwrap(),
        "--seq",
        "16",
        "--out",
        dir.join("k").to_str().unwrap(),
    ]);
    refused(&deal, "dealer (GGUF)");
    // Dense and small, but lying: a GGUF header claiming 2^64 - 1 tensors
    // and metadata entries, and a safetensors header claiming 1 TiB of
    // JSON. The parsers must not reserve what they claim.
    let small = dir.join("small.gguf");
    std::fs::write(&small, &g).unwrap();
    let out = limited(&["generate", "--model", small.to_str().unwrap(), "a prompt"]);
    refused(&out, "generate (a lying GGUF header)");
    std::fs::write(&weights, TIB.to_le_bytes()).unwrap();
    let out = limited(&["embed", "--model", folder.to_str().unwrap(), "a text"]);
    refused(&out, "embed (a lying safetensors header)");
}

#[test]
fn a_frame_claiming_a_terabyte_is_refused_within_a_gigabyte() {
    let dir = temp("frames");
    let keys = dealt(&dir);
    let mut p0 = suffuse_limited()
        .args(["serve", "--party", "0", "--model", "demo", "--keys"])
        .arg(keys.join("p0.keys"))
        .args(["--listen", "127.0.0.1:0", "--peer", "unused"])
        .args(["--timeout", "5", "--insecure-transport", "--state-dir"])
        .arg(dir.join("state"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::{BufRead, BufReader, Read};
    let mut err = BufReader::new(p0.stderr.take().unwrap());
    let mut first = String::new();
    err.read_line(&mut first).unwrap();
    let addr = first.trim().rsplit(' ').next().unwrap().to_string();
    use suffuse_host::net::{FrameHeader, FrameKind};
    for kind in [FrameKind::Hello, FrameKind::Input, FrameKind::Round] {
        let frame = FrameHeader {
            kind,
            step: u32::MAX,
            len: TIB,
        }
        .encode();
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = s.write_all(&frame);
        let _ = s.write_all(&[0; 4096]);
        // The server drops the connection; it does not die.
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    }
    let status = p0.wait().unwrap();
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    // It ends at its timeout, having met no peer, with a typed error.
    assert_eq!(status.code(), Some(1), "{rest}");
    assert!(rest.contains("suffuse: error:"), "{rest}");
    assert!(!rest.contains("memory allocation"), "{rest}");
    assert!(rest.contains("dropped a connection"), "{rest}");
}
