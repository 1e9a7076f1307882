//! `cargo xtask ct`: the constant-time check (DESIGN.md §7).
//!
//! Builds `ct_harness` (in `suffuse-tests`) in release, because debug builds
//! trip false positives in `subtle`'s debug assertions, and runs it under
//! valgrind memcheck twice:
//!
//! 1. the real run, which marks every secret undefined and exercises DCF/DPF
//!    generation and evaluation: memcheck must report **no** error;
//! 2. the planted run, built with core's test-only `ct-planted` feature: a
//!    secret-indexed lookup and a secret-dependent branch in the harness, and
//!    the same two inside core, in the DCF walk and the Φ block program, run
//!    on a real GeLU evaluation. Memcheck **must** report all four, which
//!    shows the first run sees secrets inside library code.
//!
//! Memcheck sees branches and addresses that depend on secrets; it does not
//! see instructions whose latency depends on their operands.
//! `core/SIDE-CHANNELS.md` states the limits.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::command::{self, cargo};

/// Memcheck's exit status when it found errors (`--error-exitcode`).
const ERROR_EXIT: i32 = 3;

/// What memcheck says for a branch on a secret.
const BRANCH_MESSAGE: &str = "Conditional jump or move depends on uninitialised value";
/// What memcheck says for an address computed from a secret.
const ADDRESS_MESSAGE: &str = "Use of uninitialised value of size";

pub fn run() -> Result<()> {
    if !command::succeeds(&mut command::program("valgrind", ["--version"])) {
        bail!(
            "valgrind is not installed; the constant-time check needs it \
             (Debian/Ubuntu: apt-get install valgrind)"
        );
    }
    let target_dir = command::target_dir()?;
    let log_dir = target_dir.join("ct");
    std::fs::create_dir_all(&log_dir).with_context(|| format!("creating {}", log_dir.display()))?;
    // The planted build first, copied aside: the real build of the same
    // binary must not carry core's `ct-planted` leaks.
    let planted_harness = log_dir.join("ct_harness-planted");
    build_harness(&["--features", "ct-planted"])?;
    std::fs::copy(target_dir.join("release/ct_harness"), &planted_harness).with_context(|| {
        format!(
            "copying the planted harness to {}",
            planted_harness.display()
        )
    })?;
    build_harness(&[])?;
    let harness = target_dir.join("release/ct_harness");
    let real = memcheck(&harness, "real", &log_dir)?;
    real.print("real run (secrets marked undefined)");
    if !real.stdout.contains("gate layer:") {
        bail!("the real harness did not run the gate layer");
    }
    let planted = memcheck(&planted_harness, "planted", &log_dir)?;
    planted.print("planted run (deliberate leaks)");

    if !real.stdout.contains("running on valgrind: true") {
        bail!("the harness did not detect valgrind, so no secret was marked");
    }
    if real.errors != Some(0) || real.status != Some(0) {
        eprintln!(
            "\nmemcheck reports of the real run (full log: {}):",
            real.log.display()
        );
        for report in real.reports() {
            eprintln!("\n{report}");
        }
        bail!(
            "memcheck reported {} on secret inputs (exit status {}); see the reports above",
            real.errors
                .map_or("an unknown number of errors".into(), |n| format!(
                    "{n} error(s)"
                )),
            real.status_text()
        );
    }
    if !real.stdout.contains("wrong: 0") {
        bail!(
            "the harness computed wrong outputs under valgrind:\n{}",
            real.stdout
        );
    }
    let caught_branch = planted.stderr.contains(BRANCH_MESSAGE);
    let caught_address = planted.stderr.contains(ADDRESS_MESSAGE);
    if planted.status != Some(ERROR_EXIT) || !caught_branch || !caught_address {
        eprintln!(
            "\nvalgrind log of the planted run: {}",
            planted.log.display()
        );
        bail!(
            "memcheck missed planted leaks (branch caught: {caught_branch}, \
             secret index caught: {caught_address}, exit status {}); \
             the check would be vacuous",
            planted.status_text()
        );
    }
    for (leak, caller) in LIBRARY_LEAKS {
        if !planted
            .reports()
            .iter()
            .any(|r| r.contains(leak) && r.contains(caller))
        {
            bail!(
                "memcheck missed core's planted leak {leak} in {caller} \
                 (log: {}); the check would not see inside library code",
                planted.log.display()
            );
        }
    }
    eprintln!(
        "\nct: ok: no secret-dependent branch or address in the real run; \
         the planted leaks in the harness and in core's DCF walk and Φ program were caught"
    );
    Ok(())
}

/// Core's `ct-planted` leaks and the library function each sits in: the
/// planted run must report each with that caller on its stack.
const LIBRARY_LEAKS: [(&str, &str); 2] = [
    (
        "suffuse_core::planted::secret_branch",
        "suffuse_core::fss::eval_queries",
    ),
    (
        "suffuse_core::planted::secret_index",
        "suffuse_core::phi::program::run",
    ),
];

fn build_harness(features: &[&str]) -> Result<()> {
    let mut args = vec![
        "build",
        "--release",
        "-p",
        "suffuse-tests",
        "--bin",
        "ct_harness",
    ];
    args.extend_from_slice(features);
    command::run(&mut cargo(args)).map(drop)
}

struct MemcheckRun {
    status: Option<i32>,
    /// Where valgrind's full output was written.
    log: PathBuf,
    stdout: String,
    stderr: String,
    /// From memcheck's `ERROR SUMMARY: N errors from M contexts`.
    errors: Option<u64>,
    contexts: Option<u64>,
}

impl MemcheckRun {
    fn status_text(&self) -> String {
        self.status
            .map_or("none (killed by a signal)".into(), |s| s.to_string())
    }

    /// Each memcheck error with its innermost frames and the origin of the
    /// undefined value, without the process-id prefixes.
    fn reports(&self) -> Vec<String> {
        const FRAMES: usize = 6;
        // Frames of generic code can run to kilobytes of type names.
        const LINE_CHARS: usize = 160;
        let shorten = |l: &str| -> String {
            match l.char_indices().nth(LINE_CHARS) {
                Some((cut, _)) => format!("{}…", &l[..cut]),
                None => l.to_owned(),
            }
        };
        let lines: Vec<&str> = self
            .stderr
            .lines()
            .map(|l| match l.split_once("== ") {
                Some((pid, rest)) if pid.starts_with("==") => rest,
                _ => l,
            })
            .collect();
        let mut reports = Vec::new();
        let mut i = 0;
        while i < lines.len() {
            let is_error = [
                BRANCH_MESSAGE,
                ADDRESS_MESSAGE,
                "Invalid read",
                "Invalid write",
            ]
            .iter()
            .any(|m| lines[i].starts_with(m));
            if !is_error {
                i += 1;
                continue;
            }
            let mut report = vec![shorten(lines[i])];
            let mut frames = 0;
            i += 1;
            while i < lines.len() && !lines[i].trim().is_empty() {
                let line = lines[i];
                let is_frame =
                    line.trim_start().starts_with("at ") || line.trim_start().starts_with("by ");
                if !is_frame {
                    frames = 0;
                    report.push(shorten(line));
                } else if frames < FRAMES {
                    frames += 1;
                    report.push(shorten(line));
                }
                i += 1;
            }
            reports.push(report.join("\n"));
        }
        reports
    }

    fn print(&self, what: &str) {
        eprintln!("\n{what}:");
        for line in self.stdout.lines() {
            eprintln!("  harness: {line}");
        }
        let count = |n: Option<u64>| n.map_or("?".to_owned(), |n| n.to_string());
        eprintln!(
            "  memcheck: {} error(s) from {} context(s); exit status {}",
            count(self.errors),
            count(self.contexts),
            self.status
                .map_or("none (killed)".into(), |s| s.to_string())
        );
        let kinds = [
            ("secret-dependent branches", BRANCH_MESSAGE),
            ("secret-dependent addresses", ADDRESS_MESSAGE),
        ];
        for (name, message) in kinds {
            let n = self.stderr.matches(message).count();
            if n > 0 {
                eprintln!("  memcheck: {n} report(s) of {name} (\"{message}\")");
            }
        }
    }
}

fn memcheck(harness: &Path, mode: &str, log_dir: &Path) -> Result<MemcheckRun> {
    let mut cmd = Command::new("valgrind");
    cmd.args([
        "--tool=memcheck",
        &format!("--error-exitcode={ERROR_EXIT}"),
        "--exit-on-first-error=no",
        // Origins make any report point at the secret it came from.
        "--track-origins=yes",
        "--num-callers=40",
    ])
    .arg(harness)
    .arg(mode)
    .current_dir(command::workspace_root());
    let out = command::capture(&mut cmd)
        .with_context(|| format!("running {} under valgrind", harness.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let log = log_dir.join(format!("{mode}.log"));
    std::fs::write(&log, &stderr).with_context(|| format!("writing {}", log.display()))?;
    let (errors, contexts) = error_summary(&stderr).unzip();
    Ok(MemcheckRun {
        status: out.status.code(),
        log,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr,
        errors,
        contexts,
    })
}

/// Parses `==pid== ERROR SUMMARY: 2 errors from 2 contexts (...)`.
fn error_summary(stderr: &str) -> Option<(u64, u64)> {
    let line = stderr
        .lines()
        .rev()
        .find(|l| l.contains("ERROR SUMMARY:"))?;
    let rest = line.split("ERROR SUMMARY:").nth(1)?;
    let mut words = rest.split_whitespace();
    let errors = words.next()?.parse().ok()?;
    let contexts = words.nth(2)?.parse().ok()?;
    Some((errors, contexts))
}

#[cfg(test)]
mod tests {
    use super::error_summary;

    #[test]
    fn parses_the_error_summary() {
        let s = "==12== HEAP SUMMARY:\n==12== ERROR SUMMARY: 2 errors from 1 contexts (suppressed: 0 from 0)\n";
        assert_eq!(error_summary(s), Some((2, 1)));
        assert_eq!(error_summary("nothing"), None);
    }
}
