//! `cargo xtask mcu`: builds the Cortex-M firmware (`examples/mcu`), runs it
//! under `qemu-system-arm` with a timeout, and fails unless it reports every
//! check passed, in its default build and in its `runtime-gates` build.
//! Its output (the checks, the stack high-water mark of each core entry
//! point, flash and RAM in use) is printed as it runs.
//!
//! First, builds with planted faults (a wrong expected answer, a stack
//! overflow, a run-time gate unlike the compile-time one) must each make
//! the run fail: otherwise a pass would prove nothing.

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
/// What QEMU prints when a fault cannot be taken, as when the stack pointer
/// has left RAM (the firmware's stack sits at the bottom of RAM).
const LOCKUP: &str = "Lockup";
/// Planted faults (features of the firmware) and what must give them away.
const PLANTS: [(&str, &str); 3] = [
    ("plant-wrong-answer", "result: FAIL"),
    ("plant-stack-overflow", LOCKUP),
    ("plant-unequal-gate", "NOT EQUAL"),
];

/// The builds that must pass, in order: the default one (gates built at
/// compile time, in flash) and `runtime-gates` (each gate built at run
/// time in a RAM slot by the core's in-place constructors, checked equal
/// to the flash one, and the transcripts run on it).
const BUILDS: [Option<&str>; 2] = [None, Some("runtime-gates")];

/// How a run of the firmware ended.
struct Run {
    passed: bool,
    lines: Vec<String>,
}

/// Whether QEMU's Arm system emulator can be started.
pub fn qemu_available() -> bool {
    command::succeeds(&mut command::program(QEMU, ["--version"]))
}

/// Builds, runs and checks the firmware, after its planted faults.
pub fn run() -> Result<()> {
    if !qemu_available() {
        bail!("{QEMU} is not installed (Debian: `apt-get install qemu-system-arm`)");
    }
    command::ensure_no_std_target()?;
    let dir = command::workspace_root().join(FIRMWARE);
    command::run(command::cargo(["fmt", "--", "--check"]).current_dir(&dir))
        .context("the firmware is not rustfmt-clean")?;
    for (feature, sign) in PLANTS {
        let run = run_qemu(&build(Some(feature))?, false)?;
        if run.passed || !run.lines.iter().any(|l| l.contains(sign)) {
            for l in &run.lines {
                println!("{l}");
            }
            bail!("the planted fault `{feature}` did not fail the run with `{sign}`");
        }
        eprintln!("mcu: the planted fault `{feature}` failed the run, as it must");
    }
    for feature in BUILDS {
        if let Some(f) = feature {
            eprintln!("mcu: the `{f}` build");
        }
        let name = feature.unwrap_or("default");
        passes(&run_qemu(&build(feature)?, true)?)
            .with_context(|| format!("the firmware's {name} build"))?;
    }
    Ok(())
}

/// Fails unless the run reported every check passed, without a lockup.
fn passes(run: &Run) -> Result<()> {
    if run.lines.iter().any(|l| l.contains(LOCKUP)) {
        bail!("the CPU locked up: a fault with the stack pointer outside RAM, a stack overflow");
    }
    if !run.passed || !run.lines.iter().any(|l| l.trim() == PASS) {
        bail!("the firmware did not report `{PASS}` (see its output above)");
    }
    Ok(())
}

/// `cargo build --release` in the firmware's own workspace, with `feature`
/// when given; returns the ELF.
fn build(feature: Option<&str>) -> Result<PathBuf> {
    let dir = command::workspace_root().join(FIRMWARE);
    let target_dir = command::target_dir()?.join("mcu");
    let mut cmd = command::cargo(["build", "--release", "--locked", "--target-dir"]);
    cmd.arg(&target_dir).current_dir(&dir);
    if let Some(f) = feature {
        cmd.args(["--features", f]);
    }
    command::run(&mut cmd).context("building the firmware")?;
    let elf = target_dir.join(NO_STD_TARGET).join("release").join(BINARY);
    if !elf.is_file() {
        bail!("the build left no firmware at {}", elf.display());
    }
    Ok(elf)
}

/// Runs the ELF under QEMU, echoing its output when `echo`; fails only on
/// a timeout. Returns whether it exited successfully and what it printed.
fn run_qemu(elf: &std::path::Path, echo: bool) -> Result<Run> {
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
                if echo {
                    println!("{l}");
                }
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
    eprintln!(
        "mcu: qemu exited ({status}) after {}",
        command::seconds(start.elapsed())
    );
    Ok(Run {
        passed: status.success(),
        lines,
    })
}
