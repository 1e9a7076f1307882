//! The dealer: walks the plan and streams both parties' key files to disk.
//!
//! Every step gets fresh per-party seeds from the operating system, and the
//! key set a fresh random id, so no mask is ever reused across runs. Steps
//! are dealt one at a time (large gates chunk by chunk, chunks in parallel
//! on all cores) and handed to one writer thread per file, so generation,
//! P0's writes and P1's writes overlap, and memory is bounded by one step's
//! chunk window plus [`WRITE_AHEAD`] pieces per file, not by the model.
//! Key bodies, which both files hold alike ([`Dealt::Same`]), are made
//! once and one buffer goes to both writers.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use suffuse_core::batch::BatchEval;
use suffuse_core::fss::Party;
use zeroize::Zeroize;

use crate::exec::{self, Store};
use crate::keyfile::{Header, KeyFileError, KeyWriter, Summary};
use crate::plan::{Category, Plan, hex};
use crate::proto::{self, DealError, Dealt};
use crate::wipe::Wiped;

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
    /// Seconds per phase of the backend's device work, summed over its
    /// life so far ([`BatchEval::device_phases`]); empty on CPUs.
    pub device_phases: std::collections::BTreeMap<String, f64>,
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

/// Who reads the key files, and so how they are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeysFor {
    /// Servers that run now on this machine (`embed`, `generate`): through
    /// the page cache, where they find the files.
    Now,
    /// A later query (`suffuse dealer`, the key pool): around the page
    /// cache ([`KeyWriter::create_direct`]). BERT-base at 128 tokens: 20.1
    /// → 8.5 s on 2 cores, the kernel's copy gone (docs/BACKENDS.md); a
    /// server on the same machine then reads the keys from the disk.
    Later,
}

/// Deals every step of `plan` into `dir/p0.keys` and `dir/p1.keys`, heavy
/// operations on `fss`, written for `keys_for`.
pub fn deal(
    plan: &Plan,
    dir: &Path,
    (progress, keys_for): (bool, KeysFor),
    fss: &dyn BatchEval,
) -> Result<DealReport, DealerError> {
    let direct = keys_for == KeysFor::Later;
    // Key files are secrets: the folder must be its owner's only.
    crate::private::private_dir(dir).map_err(|source| KeyFileError::Io {
        path: dir.to_path_buf(),
        error: source,
    })?;
    let start = Instant::now();
    let key_set = random::<16>()?;
    let files = key_paths(dir);
    for f in &files {
        if std::fs::symlink_metadata(f).is_ok() {
            return Err(KeyFileError::Exists { path: f.clone() }.into());
        }
    }
    // Written under hidden names and linked to the real ones only when both
    // are whole, so that a failed deal (a full disk) leaves no truncated
    // `p0.keys` behind to refuse the next one (issue 27).
    let tag = hex(&random::<8>()?);
    let partial = files.clone().map(|f| partial_name(&f, &tag));
    let dealt = deal_into(plan, &partial, key_set, (progress, direct), fss);
    let published = dealt.and_then(|report| {
        publish(&partial, &files, dir)?;
        Ok(report)
    });
    for p in &partial {
        let _ = std::fs::remove_file(p);
    }
    let (file_bytes, by_category) = published?;
    Ok(DealReport {
        keygen_s: start.elapsed().as_secs_f64(),
        file_bytes,
        by_category,
        key_set,
        files,
        device_phases: crate::party::device_phases(fss),
    })
}

/// A file's hidden name while it is being dealt: `.pN.keys.dealing-TAG`.
fn partial_name(file: &Path, tag: &str) -> PathBuf {
    let name = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    file.with_file_name(format!(".{name}.dealing-{tag}"))
}

/// Links both whole files to their real names (refusing to replace any),
/// and syncs the folder.
fn publish(partial: &[PathBuf; 2], files: &[PathBuf; 2], dir: &Path) -> Result<(), DealerError> {
    for (from, to) in partial.iter().zip(files) {
        std::fs::hard_link(from, to).map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => KeyFileError::Exists { path: to.clone() },
            _ => KeyFileError::Io {
                path: to.clone(),
                error: e,
            },
        })?;
    }
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|error| KeyFileError::Io {
            path: dir.to_path_buf(),
            error,
        })?;
    Ok(())
}

/// Per category, each party's dealt bytes.
type ByCategory = Vec<(Category, [u64; 2])>;

/// Deals every step of `plan` into the two files `files` (created new),
/// returning each file's bytes and the bytes per category.
fn deal_into(
    plan: &Plan,
    files: &[PathBuf; 2],
    key_set: [u8; 16],
    (progress, direct): (bool, bool),
    fss: &dyn BatchEval,
) -> Result<([u64; 2], ByCategory), DealerError> {
    let create = match direct {
        true => KeyWriter::create_direct,
        false => KeyWriter::create,
    };
    let steps = plan.steps() as u32;
    let header = |party: u8| Header {
        party,
        plan_hash: plan.hash,
        key_set,
        steps,
        summary: Summary {
            model: plan.model.clone(),
            model_digest: hex(&plan.model_digest),
            batch: plan.batch,
            seq: plan.seq,
            decode_steps: plan.shape().decode_steps,
        },
    };
    let writers = [
        create(&files[0], &header(0))?,
        create(&files[1], &header(1))?,
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
    Ok((file_bytes, by_category))
}

/// Pieces queued per file ahead of its writer.
pub const WRITE_AHEAD: usize = 8;

/// What the dealer hands a file's writer, in file order.
enum Piece {
    /// A step's section header.
    Section { step: u32, len: u64 },
    /// Section bytes.
    Bytes(Vec<u8>),
    /// Section bytes both files hold alike (key bodies), made and queued
    /// once: the second writer done with them frees, and so wipes, them.
    Shared(Arc<Wiped>),
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
            Piece::Shared(b) => w.write(&b)?,
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
    // The dealer's view of the opened tensors: each opening's whole mask,
    // moved by the layout operations as the parties move their pairs.
    let mut opened = Store::new(plan);
    for (op, s) in plan.step_of.iter().enumerate() {
        let Some(step) = *s else {
            if plan.tensors[plan.ops[op].kind.output()].paired {
                exec::run_local(plan, op, &mut opened, false, fss).map_err(DealError::from)?;
                opened.release_after(plan, op);
            }
            continue;
        };
        let lens = deal_step(plan, (op, step), fss, &tx, &mut opened)?;
        let cat = plan.ops[op].category;
        if let Some(entry) = by_category.iter_mut().find(|(c, _)| *c == cat) {
            entry.1[0] += lens[0];
            entry.1[1] += lens[1];
        }
        bar.inc(1);
    }
    Ok(())
}

/// Deals step `step` (operation `op`): its section headers and bytes to
/// both writers, the opened tensor's mask into `opened`. Returns each
/// party's section length, checked against what was dealt.
fn deal_step(
    plan: &Plan,
    (op, step): (usize, u32),
    fss: &dyn BatchEval,
    tx: &[SyncSender<Piece>; 2],
    opened: &mut Store,
) -> Result<[u64; 2], DealerError> {
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
    let mut emit = |dealt: Dealt| -> Result<(), KeyFileError> {
        for (p, w) in written.iter_mut().enumerate() {
            *w += dealt.len(p) as u64;
        }
        to_writers(tx, dealt);
        Ok(())
    };
    let dealt = proto::deal(plan, op, fss, seeds, opened, &mut emit);
    let mask = proto::dealt_mask(plan, op, &seeds);
    seeds.zeroize();
    dealt?;
    if let Some(mask) = mask {
        opened
            .set(plan, plan.ops[op].kind.output(), mask)
            .map_err(DealError::from)?;
    }
    opened.release_after(plan, op);
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
    Ok(lens)
}

/// Queues a run of section bytes to the writers: bytes both files hold
/// alike once, for both. A closed channel is noticed at the next section.
fn to_writers(tx: &[SyncSender<Piece>; 2], dealt: Dealt) {
    match dealt {
        Dealt::Same(bytes) => {
            let bytes = Arc::new(Wiped(bytes));
            for t in tx {
                let _ = t.send(Piece::Shared(Arc::clone(&bytes)));
            }
        }
        Dealt::Each(parts) => {
            for (t, part) in tx.iter().zip(parts) {
                let _ = t.send(Piece::Bytes(part));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::fs::DirBuilderExt;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use suffuse_core::Error;
    use suffuse_core::batch::{EvalStats, MatShape};
    use suffuse_core::fss::{GenBatch, KeyBatch};
    use suffuse_core::prg::{Block, Domain, Hasher};

    use super::*;

    /// The default backend, but key generation fails after `left` calls:
    /// a deal that breaks half-way, as a full disk does.
    struct FailsLater {
        left: AtomicUsize,
    }

    impl Hasher for FailsLater {
        fn hash_many(&self, d: Domain, blocks: &mut [Block]) -> u64 {
            crate::backend::auto().hash_many(d, blocks)
        }
    }

    impl BatchEval for FailsLater {
        fn name(&self) -> &'static str {
            "fails-later"
        }
        fn aes_path(&self) -> &'static str {
            "test"
        }
        fn preferred_batch(&self) -> usize {
            crate::backend::auto().preferred_batch()
        }
        fn eval(&self, k: &KeyBatch<'_>, p: &[u64], o: &mut [u64]) -> Result<EvalStats, Error> {
            crate::backend::auto().eval(k, p, o)
        }
        fn eval_full_domain(&self, k: &KeyBatch<'_>, o: &mut [u64]) -> Result<EvalStats, Error> {
            crate::backend::auto().eval_full_domain(k, o)
        }
        fn generate(
            &self,
            b: &GenBatch<'_>,
            k0: &mut [u8],
            k1: &mut [u8],
        ) -> Result<EvalStats, Error> {
            if self.left.fetch_sub(1, Ordering::Relaxed) == 0 {
                return Err(Error::Unsupported);
            }
            crate::backend::auto().generate(b, k0, k1)
        }
        fn matmul(&self, s: &MatShape, a: &[u64], b: &[u64], c: &mut [u64]) -> Result<(), Error> {
            crate::backend::auto().matmul(s, a, b, c)
        }
    }

    /// Issue 27: a deal that fails half-way leaves neither key file nor a
    /// hidden partial one, and the next deal into the folder succeeds.
    #[test]
    fn a_failed_deal_leaves_nothing_behind() {
        let d = std::env::temp_dir().join(format!("suffuse-dealer-fail-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::DirBuilder::new().mode(0o700).create(&d).unwrap();
        let plan = crate::fuzzing::plan();
        let failing = FailsLater {
            left: AtomicUsize::new(3),
        };
        assert!(deal(&plan, &d, (false, KeysFor::Now), &failing).is_err());
        let left: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "left behind: {left:?}");
        let r = deal(&plan, &d, (false, KeysFor::Now), crate::backend::auto()).unwrap();
        assert!(r.files.iter().all(|f| f.exists()));
        assert!(
            deal(&plan, &d, (false, KeysFor::Now), crate::backend::auto()).is_err(),
            "overwrote"
        );
        let _ = std::fs::remove_dir_all(&d);
    }
}
