//! The dealer: walks the plan and streams both parties' key files to disk.
//!
//! Every step gets fresh per-party seeds from the operating system, and the
//! key set a fresh random id, so no mask is ever reused across runs. Steps
//! are dealt one at a time (large gates chunk by chunk, chunks in parallel
//! on all cores) and written as they are produced, so memory is bounded by
//! one step's chunk window, not by the model.

use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use suffuse_accel_cpu::Backend;
use suffuse_core::fss::Party;

use crate::keyfile::{Header, KeyFileError, KeyWriter, Summary};
use crate::plan::{Category, Plan, hex};
use crate::proto::{self, DealError};

/// What the dealer produced.
#[derive(Clone, Debug, Default)]
pub struct DealReport {
    /// Wall time.
    pub keygen_s: f64,
    /// File sizes, P0 and P1.
    pub file_bytes: [u64; 2],
    /// Key bytes per category, P0 and P1.
    pub by_category: Vec<(Category, [u64; 2])>,
    /// The key set's id.
    pub key_set: [u8; 16],
    /// The two files.
    pub files: [PathBuf; 2],
}

/// Why dealing failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DealerError {
    /// A step.
    #[error(transparent)]
    Deal(#[from] DealError),
    /// The files.
    #[error(transparent)]
    KeyFile(#[from] KeyFileError),
    /// No randomness from the operating system.
    #[error("the operating system's random number generator failed: {0}")]
    Random(String),
    /// A step wrote a different number of bytes than its layout says (a
    /// bug, reported rather than written).
    #[error("step {step}: dealt {got} bytes for party {party}, the layout says {want}")]
    Layout {
        /// The step.
        step: u32,
        /// The party.
        party: usize,
        /// Layout.
        want: u64,
        /// Dealt.
        got: u64,
    },
}

/// Fresh randomness from the operating system.
pub fn random<const N: usize>() -> Result<[u8; N], DealerError> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| DealerError::Random(e.to_string()))?;
    Ok(b)
}

/// The key file names inside a directory.
pub fn key_paths(dir: &Path) -> [PathBuf; 2] {
    [dir.join("p0.keys"), dir.join("p1.keys")]
}

/// Deals every step of `plan` into `dir/p0.keys` and `dir/p1.keys`.
pub fn deal(plan: &Plan, dir: &Path, progress: bool) -> Result<DealReport, DealerError> {
    std::fs::create_dir_all(dir).map_err(|source| KeyFileError::Io {
        path: dir.to_path_buf(),
        error: source,
    })?;
    let start = Instant::now();
    let key_set = random::<16>()?;
    let files = key_paths(dir);
    let steps = plan.steps() as u32;
    let summary = Summary {
        model: plan.model.clone(),
        model_digest: hex(&plan.model_digest),
        batch: plan.batch,
        seq: plan.seq,
        decode_steps: plan.shape().decode_steps,
    };
    let mut writers = [
        KeyWriter::create(
            &files[0],
            &Header {
                party: 0,
                plan_hash: plan.hash,
                key_set,
                steps,
                summary: summary.clone(),
            },
        )?,
        KeyWriter::create(
            &files[1],
            &Header {
                party: 1,
                plan_hash: plan.hash,
                key_set,
                steps,
                summary,
            },
        )?,
    ];
    let bar = if progress {
        let b = ProgressBar::with_draw_target(Some(u64::from(steps)), ProgressDrawTarget::stderr());
        if let Ok(style) =
            ProgressStyle::with_template("dealing {bar:40} {pos}/{len} steps {elapsed}")
        {
            b.set_style(style);
        }
        b
    } else {
        ProgressBar::hidden()
    };
    let h = Backend::detect();
    let mut by_category: Vec<(Category, [u64; 2])> =
        Category::ALL.iter().map(|c| (*c, [0, 0])).collect();
    for (op, s) in plan.step_of.iter().enumerate() {
        let Some(step) = *s else { continue };
        let lens = [
            proto::section_len(plan, op, Party::P0),
            proto::section_len(plan, op, Party::P1),
        ];
        for (w, len) in writers.iter_mut().zip(lens) {
            w.section(step, len)?;
        }
        let seeds = [random::<16>()?, random::<16>()?];
        let mut written = [0u64; 2];
        let mut emit = |parts: &[Vec<u8>; 2]| -> Result<(), KeyFileError> {
            for p in 0..2 {
                writers[p].write(&parts[p])?;
                written[p] += parts[p].len() as u64;
            }
            Ok(())
        };
        proto::deal(plan, op, &h, seeds, &mut emit)?;
        for p in 0..2 {
            if written[p] != lens[p] {
                return Err(DealerError::Layout {
                    step,
                    party: p,
                    want: lens[p],
                    got: written[p],
                });
            }
        }
        let cat = plan.ops[op].category;
        if let Some(entry) = by_category.iter_mut().find(|(c, _)| *c == cat) {
            entry.1[0] += lens[0];
            entry.1[1] += lens[1];
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let [w0, w1] = writers;
    let file_bytes = [w0.finish()?, w1.finish()?];
    Ok(DealReport {
        keygen_s: start.elapsed().as_secs_f64(),
        file_bytes,
        by_category,
        key_set,
        files,
    })
}
