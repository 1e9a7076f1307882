//! `cargo xtask audit`: supply-chain policy and core's structural promises,
//! checked mechanically. Writes nothing into the repository (cargo's own
//! target directory aside).
//!
//! * `cargo fetch --locked`, so that every package in the lock file is
//!   local, then `cargo deny --offline check bans licenses sources` against
//!   `deny.toml`.
//!   Advisories are left out: they need the RustSec database, which needs
//!   the network. The same for the firmware's own lock file
//!   (`examples/mcu`, a separate workspace), against the same `deny.toml`.
//! * core's normal dependency tree for the bare-metal target enables no
//!   `std` or `alloc` feature anywhere, and core type-checks for that target
//!   (which has no `std`, so no std-only crate can hide in the tree).
//! * `core/src/lib.rs` declares `#![no_std]` and `#![forbid(unsafe_code)]`
//!   and has no `extern crate alloc`.
//! * The host library denies `unsafe` everywhere but in the modules of
//!   [`HOST_UNSAFE`] (the binary's `main.rs`, for its allocator, is its
//!   own crate root and is held to the same list).

use anyhow::{Context, Result, bail};

use crate::command::{self, NO_STD_TARGET, cargo};

/// The firmware's manifest, relative to the workspace root.
const FIRMWARE_MANIFEST: &str = "examples/mcu/Cargo.toml";

pub fn run() -> Result<()> {
    let mut failures = Vec::new();

    // deny reads the metadata of every package in the lock file, for every
    // target; `--offline` fails on one not yet downloaded (a UEFI-only
    // dependency, say), so fetch them all first.
    eprintln!("==> cargo fetch");
    if let Err(e) = command::run(&mut cargo(["fetch", "--locked"])) {
        failures.push(format!("{e:#}"));
    }

    eprintln!("\n==> cargo deny");
    if let Err(e) = command::run(&mut cargo([
        "deny",
        "--workspace",
        "--offline",
        "check",
        "bans",
        "licenses",
        "sources",
    ])) {
        failures.push(format!("{e:#}"));
    }

    eprintln!("\n==> cargo deny, the firmware ({FIRMWARE_MANIFEST})");
    let firmware = command::run(&mut cargo([
        "fetch",
        "--locked",
        "--manifest-path",
        FIRMWARE_MANIFEST,
    ]))
    .and_then(|_| {
        command::run(&mut cargo([
            "deny",
            "--manifest-path",
            FIRMWARE_MANIFEST,
            "--config",
            "deny.toml",
            "--offline",
            "check",
            "bans",
            "licenses",
            "sources",
        ]))
    });
    if let Err(e) = firmware {
        failures.push(format!("{e:#}"));
    }

    eprintln!("\n==> core's dependency features for {NO_STD_TARGET}");
    match core_std_features() {
        Ok(found) if found.is_empty() => eprintln!("no `std` or `alloc` feature enabled"),
        Ok(found) => failures.push(format!(
            "core's dependency tree enables std/alloc features: {}",
            found.join("; ")
        )),
        Err(e) => failures.push(format!("{e:#}")),
    }

    eprintln!("\n==> core builds without std for {NO_STD_TARGET}");
    let no_std_build = command::ensure_no_std_target().and_then(|()| {
        command::run(&mut cargo([
            "check",
            "-p",
            "suffuse-core",
            "--target",
            NO_STD_TARGET,
        ]))
    });
    if let Err(e) = no_std_build {
        failures.push(format!("{e:#}"));
    }

    eprintln!("\n==> the host binary's features");
    match host_planted_features() {
        Ok(found) if found.is_empty() => eprintln!("no `ct-planted` (test-only leaks)"),
        Ok(found) => failures.push(format!(
            "the host build enables core's test-only `ct-planted` leaks: {}",
            found.join("; ")
        )),
        Err(e) => failures.push(format!("{e:#}")),
    }

    eprintln!("\n==> core/src/lib.rs attributes");
    match crate_root_violations() {
        Ok(v) if v.is_empty() => {
            eprintln!("#![no_std], #![forbid(unsafe_code)], no extern crate alloc")
        }
        Ok(v) => failures.extend(v),
        Err(e) => failures.push(format!("{e:#}")),
    }

    eprintln!("\n==> unsafe in host");
    match host_unsafe_violations() {
        Ok(v) if v.is_empty() => eprintln!("only in {}", HOST_UNSAFE.join(", ")),
        Ok(v) => failures.extend(v),
        Err(e) => failures.push(format!("{e:#}")),
    }

    if failures.is_empty() {
        eprintln!("\naudit: ok");
        Ok(())
    } else {
        bail!(
            "audit found {} problem(s):\n  {}",
            failures.len(),
            failures.join("\n  ")
        )
    }
}

/// Lines of `cargo tree -e normal,features` for core on the bare-metal
/// target that enable a `std` or `alloc` feature (or one named `*/std`).
fn core_std_features() -> Result<Vec<String>> {
    let out = command::capture(&mut cargo([
        "tree",
        "-p",
        "suffuse-core",
        "--target",
        NO_STD_TARGET,
        "-e",
        "normal,features",
        "--prefix",
        "none",
        "--offline",
    ]))?;
    if !out.status.success() {
        bail!(
            "`cargo tree` failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(std_feature_lines(&String::from_utf8_lossy(&out.stdout)))
}

/// Lines of `cargo tree -e normal,features` for the host binary, as
/// `cargo build -p suffuse-host` resolves it, that enable `ct-planted`.
fn host_planted_features() -> Result<Vec<String>> {
    let out = command::capture(&mut cargo([
        "tree",
        "-p",
        "suffuse-host",
        "-e",
        "normal,features",
        "--prefix",
        "none",
        "--offline",
    ]))?;
    if !out.status.success() {
        bail!(
            "`cargo tree` failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let tree = String::from_utf8_lossy(&out.stdout);
    Ok(tree
        .lines()
        .filter(|l| l.contains("feature \"ct-planted\""))
        .map(|l| l.trim().to_owned())
        .collect())
}

/// The lines of a `cargo tree -e features` listing that enable `std` or
/// `alloc` (directly or as `dep/std`), sorted and deduplicated.
fn std_feature_lines(tree: &str) -> Vec<String> {
    let mut found: Vec<String> = tree
        .lines()
        .filter(|line| {
            line.split("feature \"")
                .skip(1)
                .filter_map(|rest| rest.split('"').next())
                .any(|f| {
                    matches!(f, "std" | "alloc") || f.ends_with("/std") || f.ends_with("/alloc")
                })
        })
        .map(|line| line.trim().to_owned())
        .collect();
    found.sort();
    found.dedup();
    found
}

/// What `core/src/lib.rs` gets wrong, if anything.
fn crate_root_violations() -> Result<Vec<String>> {
    let path = command::workspace_root().join("core/src/lib.rs");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    // Attributes count only outside comments.
    let code: Vec<&str> = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or("").trim())
        .collect();
    let has = |attr: &str| code.iter().any(|l| l.replace(' ', "") == attr);
    let mut violations = Vec::new();
    if !has("#![no_std]") {
        violations.push("core/src/lib.rs lacks #![no_std]".to_owned());
    }
    if !has("#![forbid(unsafe_code)]") {
        violations.push("core/src/lib.rs lacks #![forbid(unsafe_code)]".to_owned());
    }
    if code
        .iter()
        .any(|l| l.replace(' ', "").starts_with("externcratealloc"))
    {
        violations.push("core/src/lib.rs has `extern crate alloc`".to_owned());
    }
    Ok(violations)
}

/// The host files that may hold `unsafe`, relative to `host/src`: the
/// allocator that wipes freed blocks, and the key-section mapping.
const HOST_UNSAFE: [&str; 2] = ["main.rs", "keyfile/mapped.rs"];

fn host_unsafe_violations() -> Result<Vec<String>> {
    let root = command::workspace_root().join("host/src");
    let mut files = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
        {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("reading {}", path.display()))?;
                let rel = path.strip_prefix(&root).unwrap_or(&path);
                files.push((rel.to_string_lossy().replace('\\', "/"), text));
            }
        }
    }
    Ok(unsafe_outside(&files, &HOST_UNSAFE))
}

/// `unsafe` in the code (not the comments) of a file not in `allowed`, and
/// a `lib.rs` that does not deny it.
fn unsafe_outside(files: &[(String, String)], allowed: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for (path, text) in files {
        let code = || text.lines().map(|l| l.split("//").next().unwrap_or(""));
        if path == "lib.rs" && !code().any(|l| l.replace(' ', "") == "#![deny(unsafe_code)]") {
            found.push("host/src/lib.rs lacks #![deny(unsafe_code)]".to_owned());
        }
        if allowed.contains(&path.as_str()) {
            continue;
        }
        for (i, line) in code().enumerate() {
            let refusal =
                line.contains("deny(unsafe_code)") || line.contains("forbid(unsafe_code)");
            if line.contains("unsafe") && !refusal {
                found.push(format!(
                    "host/src/{path}:{}: unsafe outside {allowed:?}",
                    i + 1
                ));
            }
        }
    }
    found.sort();
    found
}

#[cfg(test)]
mod tests {
    use super::{std_feature_lines, unsafe_outside};

    #[test]
    fn unsafe_is_found_outside_the_allowed_files_only() {
        let file = |p: &str, t: &str| (p.to_owned(), t.to_owned());
        let files = [
            file("lib.rs", "#![deny(unsafe_code)]\npub mod a;\n"),
            file("a.rs", "// unsafe in a comment is fine\nfn f() {}\n"),
            file("b.rs", "fn g() {\n    unsafe { h() }\n}\n"),
            file("c.rs", "#![allow(unsafe_code)]\n"),
            file("ok.rs", "#![allow(unsafe_code)]\nunsafe fn k() {}\n"),
        ];
        assert_eq!(
            unsafe_outside(&files, &["ok.rs"]),
            [
                "host/src/b.rs:2: unsafe outside [\"ok.rs\"]",
                "host/src/c.rs:1: unsafe outside [\"ok.rs\"]",
            ]
        );
        let forbid = [file("lib.rs", "#![forbid(unsafe_code)]\n")];
        assert_eq!(
            unsafe_outside(&forbid, &[]),
            ["host/src/lib.rs lacks #![deny(unsafe_code)]"]
        );
    }

    #[test]
    fn finds_std_and_alloc_features_only() {
        let tree = "suffuse-core v0.1.0\n\
                    subtle feature \"core_hint_black_box\"\n\
                    zeroize feature \"alloc\"\n\
                    rand_core feature \"std\"\n\
                    rand_core feature \"std\"\n\
                    heapless feature \"serde/std\"\n\
                    aes feature \"hazmat\"\n";
        assert_eq!(
            std_feature_lines(tree),
            [
                "heapless feature \"serde/std\"",
                "rand_core feature \"std\"",
                "zeroize feature \"alloc\"",
            ]
        );
    }
}
