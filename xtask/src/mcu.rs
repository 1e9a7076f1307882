//! `cargo xtask mcu`: builds the Cortex-M firmware (`examples/mcu`), runs it
//! under `qemu-system-arm` with a timeout, and fails unless it reports every
//! check passed. Its output (the checks, the stack high-water mark of each
//! core entry point, flash and RAM in use) is printed as it runs.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::command::{self, NO_STD_TARGET};

/// The firmware crate, relative to the workspace root.
const FIRMWARE: &str = "examples/mcu";
/// The firmware binary's name.
const BINARY: &str = "suffuse-mcu";
/// The emulator, from Debian's `qemu-system-arm`.
pub const QEMU: &str = "qemu-system-arm";
/// QEMU's board: an MPS2 with the AN386 image, a Cortex-M4 with FPU.
const MACHINE: &str = "mps2-an386";
/// Longer than a run takes on a loaded 2-core machine by a wide margin; a
/// firmware that hangs (a fault loop, a lost exit) fails instead of stalling.
const TIMEOUT: Duration = Duration::from_secs(300);
/// The line the firmware prints last when every check passed.
const PASS: &str = "result: PASS";

/// Whether QEMU's Arm system emulator can be started.
pub fn qemu_available() -> bool {
    command::succeeds(&mut command::program(QEMU, ["--version"]))
}

/// Builds, runs and checks the firmware.
pub fn run() -> Result<()> {
    if !qemu_available() {
        bail!("{QEMU} is not installed (Debian: `apt-get install qemu-system-arm`)");
    }
    command::ensure_no_std_target()?;
    let elf = build()?;
    let output = run_qemu(&elf)?;
    if !output.iter().any(|l| l.trim() == PASS) {
        bail!("the firmware did not report `{PASS}` (see its output above)");
    }
    Ok(())
}

/// `cargo build --release` in the firmware's own workspace; returns the ELF.
fn build() -> Result<PathBuf> {
    let root = command::workspace_root();
    let dir = root.join(FIRMWARE);
    let target_dir = command::target_dir()?.join("mcu");
    command::run(command::cargo(["fmt", "--", "--check"]).current_dir(&dir))
        .context("the firmware is not rustfmt-clean")?;
    command::run(
        command::cargo(["build", "--release", "--locked", "--target-dir"])
            .arg(&target_dir)
            .current_dir(&dir),
    )
    .context("building the firmware")?;
    let elf = target_dir.join(NO_STD_TARGET).join("release").join(BINARY);
    if !elf.is_file() {
        bail!("the build left no firmware at {}", elf.display());
    }
    Ok(elf)
}

/// Runs the ELF under QEMU, echoing its output; fails on a non-zero exit or
/// a timeout. Returns the lines it printed.
fn run_qemu(elf: &std::path::Path) -> Result<Vec<String>> {
    let mut cmd = Command::new(QEMU);
    cmd.args([
        "-machine",
        MACHINE,
        "-cpu",
        "cortex-m4",
        "-nographic",
        "-monitor",
        "none",
        "-serial",
        "none",
        "-semihosting-config",
        "enable=on,target=native",
        "-kernel",
    ])
    .arg(elf)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let line = command::display(&cmd);
    eprintln!("$ {line}");
    let mut child = cmd
        .spawn()
        .with_context(|| format!("could not start `{line}`"))?;
    let (tx, rx) = mpsc::channel();
    let streams: Vec<Box<dyn std::io::Read + Send>> = vec![
        Box::new(child.stdout.take().context("qemu stdout")?),
        Box::new(child.stderr.take().context("qemu stderr")?),
    ];
    for stream in streams {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(stream).lines().map_while(Result::ok) {
                println!("{l}");
                let _ = tx.send(l);
            }
        });
    }
    drop(tx);
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().context("waiting for qemu")? {
            break status;
        }
        if start.elapsed() > TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            bail!("`{line}` ran longer than {} s; killed", TIMEOUT.as_secs());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let lines: Vec<String> = rx.iter().collect();
    if !status.success() {
        bail!(
            "the firmware failed ({status}) after {}",
            command::seconds(start.elapsed())
        );
    }
    eprintln!("mcu: passed in {}", command::seconds(start.elapsed()));
    Ok(lines)
}
