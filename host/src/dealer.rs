//! The dealer: walks the plan and streams both parties' key files to disk.
//!
//! Every step gets fresh per-party seeds from the operating system, and the
//! key set a fresh random id, so no mask is ever reused across runs. Steps
//! are dealt one at a time (large gates chunk by chunk, chunks in parallel
//! on all cores) and handed to one writer thread per file, so generation,
//! P0's writes and P1's writes overlap, and memory is bounded by one step's
//! chunk window plus [`WRITE_AHEAD`] pieces per file, not by the model.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use suffuse_core::batch::BatchEval;
use suffuse_core::fss::Party;
use zeroize::Zeroize;

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
    /// A file's writer thread panicked.
    #[error("the writer of P{party}'s key file stopped unexpectedly")]
    Writer {
        /// Whose file.
        party: usize,
    },
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

/// Deals every step of `plan` into `dir/p0.keys` and `dir/p1.keys`, heavy
/// operations on `fss`.
pub fn deal(
    plan: &Plan,
    dir: &Path,
    progress: bool,
    fss: &dyn BatchEval,
) -> Result<DealReport, DealerError> {
    // Key files are secrets: the folder must be its owner's only.
    crate::keyfile::private_dir(dir).map_err(|source| KeyFileError::Io {
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
    let writers = [
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
    let bar = progress_bar(progress, steps);
    let mut by_category: Vec<(Category, [u64; 2])> =
        Category::ALL.iter().map(|c| (*c, [0, 0])).collect();
    let [w0, w1] = writers;
    let (dealt, written) = std::thread::scope(|s| {
        let (tx0, rx0) = sync_channel(WRITE_AHEAD);
        let (tx1, rx1) = sync_channel(WRITE_AHEAD);
        let h0 = s.spawn(move || write_file(w0, rx0));
        let h1 = s.spawn(move || write_file(w1, rx1));
        let dealt = deal_steps(plan, fss, [tx0, tx1], &bar, &mut by_category);
        let written = [h0, h1].map(|h| h.join());
        (dealt, written)
    });
    bar.finish_and_clear();
    // A writer's own error explains a failed hand-off better than the
    // dealer's view of it.
    let mut file_bytes = [0u64; 2];
    for (party, w) in written.into_iter().enumerate() {
        file_bytes[party] = w.map_err(|_| DealerError::Writer { party })??;
    }
    dealt?;
    Ok(DealReport {
        keygen_s: start.elapsed().as_secs_f64(),
        file_bytes,
        by_category,
        key_set,
        files,
    })
}

/// Pieces queued per file ahead of its writer.
pub const WRITE_AHEAD: usize = 8;

/// What the dealer hands a file's writer, in file order.
enum Piece {
    /// A step's section header.
    Section { step: u32, len: u64 },
    /// Section bytes.
    Bytes(Vec<u8>),
}

/// A file's writer thread: writes pieces until the dealer hangs up, then
/// finishes the file.
fn write_file(mut w: KeyWriter, rx: Receiver<Piece>) -> Result<u64, KeyFileError> {
    for piece in rx {
        match piece {
            Piece::Section { step, len } => w.section(step, len)?,
            Piece::Bytes(mut b) => {
                // Key bytes are secrets: wiped once on their way to disk, at
                // memory speed (`zeroize` on bytes, one volatile store a
                // byte, took 7 % of the dealer's CPU samples at MiniLM-128).
                let wrote = w.write(&b);
                crate::wipe::vec(&mut b);
                wrote?;
            }
        }
    }
    w.finish()
}

fn progress_bar(progress: bool, steps: u32) -> ProgressBar {
    if !progress {
        return ProgressBar::hidden();
    }
    let b = ProgressBar::with_draw_target(Some(u64::from(steps)), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("dealing {bar:40} {pos}/{len} steps {elapsed}")
    {
        b.set_style(style);
    }
    b
}

/// Deals every step, sending both files' pieces to their writers.
fn deal_steps(
    plan: &Plan,
    fss: &dyn BatchEval,
    tx: [SyncSender<Piece>; 2],
    bar: &ProgressBar,
    by_category: &mut [(Category, [u64; 2])],
) -> Result<(), DealerError> {
    for (op, s) in plan.step_of.iter().enumerate() {
        let Some(step) = *s else { continue };
        let lens = [
            proto::section_len(plan, op, Party::P0),
            proto::section_len(plan, op, Party::P1),
        ];
        for (party, (t, len)) in tx.iter().zip(lens).enumerate() {
            // A closed channel means that writer failed: stop dealing. Its
            // thread holds the reason, which the caller reports instead.
            t.send(Piece::Section { step, len })
                .map_err(|_| DealerError::Writer { party })?;
        }
        let mut seeds = [random::<16>()?, random::<16>()?];
        let mut written = [0u64; 2];
        let mut emit = |parts: [Vec<u8>; 2]| -> Result<(), KeyFileError> {
            for (p, part) in parts.into_iter().enumerate() {
                written[p] += part.len() as u64;
                // A closed channel is noticed at the next section.
                let _ = tx[p].send(Piece::Bytes(part));
            }
            Ok(())
        };
        let dealt = proto::deal(plan, op, fss, seeds, &mut emit);
        seeds.zeroize();
        dealt?;
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
    Ok(())
}
