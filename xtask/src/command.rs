//! Running the tools a task is made of: echoed, timed, and failing with the
//! exact command line that failed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// The workspace root: the parent of this crate's manifest directory.
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// `cargo` (the one that runs us, when known) with `args`, in the workspace
/// root.
pub fn cargo<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(args).current_dir(workspace_root());
    cmd
}

/// A program other than cargo with `args`, in the workspace root.
pub fn program<I, S>(name: &str, args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut cmd = Command::new(name);
    cmd.args(args).current_dir(workspace_root());
    cmd
}

/// The command line as a user would type it.
pub fn display(cmd: &Command) -> String {
    let program = cmd.get_program().to_string_lossy();
    let program = if Path::new(&*program)
        .file_stem()
        .is_some_and(|s| s == "cargo")
    {
        "cargo".into()
    } else {
        program
    };
    std::iter::once(program)
        .chain(cmd.get_args().map(|a| a.to_string_lossy()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `cmd` with inherited output; fails unless it exits successfully.
pub fn run(cmd: &mut Command) -> Result<Duration> {
    let line = display(cmd);
    eprintln!("$ {line}");
    let start = Instant::now();
    let status = cmd
        .status()
        .with_context(|| format!("could not start `{line}`"))?;
    if !status.success() {
        bail!("`{line}` failed ({status})");
    }
    Ok(start.elapsed())
}

/// Runs `cmd` capturing stdout and stderr; the caller judges the status.
pub fn capture(cmd: &mut Command) -> Result<Output> {
    let line = display(cmd);
    eprintln!("$ {line}");
    cmd.stdin(Stdio::null())
        .output()
        .with_context(|| format!("could not start `{line}`"))
}

/// Whether `cmd` can be started and exits successfully (output discarded):
/// for probing optional tools.
pub fn succeeds(cmd: &mut Command) -> bool {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The workspace's target directory as cargo resolves it (honouring
/// `CARGO_TARGET_DIR` and configuration).
pub fn target_dir() -> Result<PathBuf> {
    let out = capture(&mut cargo([
        "metadata",
        "--format-version",
        "1",
        "--no-deps",
        "--offline",
    ]))?;
    if !out.status.success() {
        bail!(
            "`cargo metadata` failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("parsing `cargo metadata` output")?;
    let dir = meta
        .get("target_directory")
        .and_then(|d| d.as_str())
        .context("`cargo metadata` output has no target_directory")?;
    Ok(PathBuf::from(dir))
}

/// The rustup target needed for the no_std build of core.
pub const NO_STD_TARGET: &str = "thumbv7em-none-eabihf";

/// Installs [`NO_STD_TARGET`] with rustup unless it is already installed.
pub fn ensure_no_std_target() -> Result<()> {
    let installed = capture(&mut program("rustup", ["target", "list", "--installed"]))
        .context("rustup is needed to check for the no_std target")?;
    let listed = String::from_utf8_lossy(&installed.stdout);
    if installed.status.success() && listed.lines().any(|l| l.trim() == NO_STD_TARGET) {
        return Ok(());
    }
    run(&mut program("rustup", ["target", "add", NO_STD_TARGET]))
        .with_context(|| format!("installing the {NO_STD_TARGET} target"))?;
    Ok(())
}

/// A duration as seconds with one decimal.
pub fn seconds(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}
