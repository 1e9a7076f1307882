//! Key sections streamed into device memory ahead of use
//! ([`BatchEval::stage`]): the party's key reader hands each section to the
//! backend as soon as it is read, the launcher copies it through pinned
//! double buffers on its own stream while the kernels of earlier steps run,
//! and when the step evaluates keys whose bodies lie in a staged section, a
//! kernel transposes them on the device (`suffuse_gather_keys`) instead of
//! the host transposing and copying them per call.
//!
//! Staged sections may hold at most half the memory budget, so that a
//! call's own buffers always have room; a section that does not fit is not
//! staged, and its keys take the host path. Sections are wiped on the
//! device when they are given back ([`BatchEval::unstage`]).
//!
//! [`BatchEval::stage`]: suffuse_core::batch::BatchEval::stage
//! [`BatchEval::unstage`]: suffuse_core::batch::BatchEval::unstage

// Launches pass raw device addresses; each unsafe block says why.
#![allow(unsafe_code)]

use suffuse_core::fss::KeyBatch;

use crate::eval::{KeysAt, grid_line, u64_of};
use crate::launcher::{Arg, Kernel, Launcher};
use crate::{CudaError, CudaEval, State, layout};

/// One staged section.
pub(crate) struct Section<L: Launcher> {
    /// The host address and length of the section's bytes.
    start: usize,
    len: usize,
    /// The device buffer's words, as the pool counts them.
    words: usize,
    buf: L::Buffer,
}

/// A batch's keys `start..end`, as the evaluation takes them.
pub(crate) type Part<'k, 'a> = (&'k KeyBatch<'a>, usize, usize);

impl<L: Launcher> State<L> {
    /// The device address of `bytes` if a staged section holds them.
    fn staged_at(&self, l: &L, bytes: &[u8]) -> Option<u64> {
        let at = bytes.as_ptr() as usize;
        self.staged
            .iter()
            .find(|s| at >= s.start && at + bytes.len() <= s.start + s.len)
            .map(|s| l.address(&s.buf) + u64_of(at - s.start))
    }

    /// The staged address of every part's bodies, if all are staged.
    pub(crate) fn staged_parts(&self, l: &L, parts: &[Part<'_, '_>]) -> Option<Vec<u64>> {
        parts
            .iter()
            .map(|(keys, a, b)| self.staged_at(l, keys.bodies(*a, *b)))
            .collect()
    }

    /// Wipes and gives back the sections `which` selects.
    fn unstage_where(&mut self, l: &L, which: impl Fn(&Section<L>) -> bool) {
        let (gone, kept): (Vec<_>, Vec<_>) = self.staged.drain(..).partition(|s| which(s));
        self.staged = kept;
        for mut s in gone {
            match l.wipe(&mut s.buf, s.words) {
                Ok(()) => self.pool.give(s.words, s.buf),
                Err(_) => {
                    drop(s.buf);
                    self.pool.release(s.words);
                }
            }
        }
    }
}

/// Bytes between consecutive key bodies of a batch.
fn body_stride(keys: &KeyBatch<'_>) -> usize {
    let p = keys.params();
    if keys.bytes().is_some() {
        p.key_len()
    } else {
        p.body_len()
    }
}

impl<L: Launcher> CudaEval<L> {
    /// Copies `bytes` to the device ahead of use, unless staged sections
    /// already hold half the budget.
    pub(crate) fn stage_section(&self, bytes: &[u8]) -> Result<(), CudaError> {
        if bytes.is_empty() {
            return Ok(());
        }
        let l = &self.launcher;
        let words = bytes.len().div_ceil(8);
        let (start, end) = (
            bytes.as_ptr() as usize,
            bytes.as_ptr() as usize + bytes.len(),
        );
        let (taken, mut buf) = {
            let mut st = self.lock();
            // A staged copy overlapping these bytes is stale: its bytes were
            // freed without being unstaged (the host's error), and these
            // reuse their memory. It must never be read for them.
            st.unstage_where(l, |s| s.start < end && start < s.start + s.len);
            let held: usize = st.staged.iter().map(|s| s.words * 8).sum();
            if held + words * 8 > st.pool.budget() / 2 {
                return Ok(());
            }
            st.pool.take(l, words)?
        };
        // The copy runs without the state lock: evaluations go on meanwhile.
        if let Err(e) = l.stage_bytes(&mut buf, bytes) {
            self.lock().pool.give(taken, buf);
            return Err(e);
        }
        self.lock().staged.push(Section {
            start: bytes.as_ptr() as usize,
            len: bytes.len(),
            words: taken,
            buf,
        });
        Ok(())
    }

    /// Drops the staged copy of `bytes` (all staged sections when `None`).
    pub(crate) fn unstage_section(&self, bytes: Option<&[u8]>) {
        let l = &self.launcher;
        let mut st = self.lock();
        match bytes {
            Some(b) => {
                let at = b.as_ptr() as usize;
                st.unstage_where(l, |s| s.start == at && s.len == b.len());
            }
            None => st.unstage_where(l, |_| true),
        }
    }
}

/// Puts the keys of `parts` (one params and party) into `key_buf`
/// level-major, as [`layout::offsets`] says for their total count: from
/// their staged bodies with `suffuse_gather_keys` when `staged` gives every
/// part's device address, else transposed in `staging` and copied.
pub(crate) fn place_keys<L: Launcher>(
    l: &L,
    parts: &[Part<'_, '_>],
    staged: Option<&[u64]>,
    staging: &mut Vec<u64>,
    key_buf: &mut L::Buffer,
) -> Result<KeysAt, CudaError> {
    let Some((first, _, _)) = parts.first() else {
        return Err(CudaError::Launch("no keys to place"));
    };
    let params = first.params();
    let n: usize = parts.iter().map(|(_, a, b)| b - a).sum();
    let Some(addresses) = staged else {
        let start = std::time::Instant::now();
        let at = layout::transpose_parts(parts, staging);
        l.host_phase(crate::Phase::Pack, start);
        l.upload(key_buf, staging)?;
        return Ok(keys_at(l, parts, n, key_buf, at));
    };
    // The roots are derived on the host, never in a key section: copied.
    let at = layout::offsets(&params, n);
    staging.clear();
    for (keys, a, b) in parts {
        for i in *a..*b {
            let root = suffuse_core::prg::Block::read(keys.key(i).root());
            staging.extend_from_slice(&[root.low64(), root.high64()]);
        }
    }
    l.upload(key_buf, staging)?;
    let base = l.address(key_buf);
    let word = |i: usize| Arg::Ptr(base + 8 * u64_of(i));
    let words = layout::value_words(&params);
    let mut first_key = 0;
    for ((keys, a, b), bodies) in parts.iter().zip(addresses) {
        let count = b - a;
        let args = [
            Arg::Ptr(*bodies),
            Arg::U64(u64_of(body_stride(keys))),
            Arg::U64(u64_of(count)),
            Arg::U64(u64_of(first_key)),
            Arg::U64(u64_of(n)),
            Arg::U32(params.levels()),
            Arg::U32(u32::try_from(params.value_bytes() / words.max(1)).unwrap_or(0)),
            Arg::U32(u32::try_from(words).unwrap_or(0)),
            word(at.cw),
            word(at.vcw),
            word(at.leaf),
        ];
        // SAFETY: `suffuse_gather_keys`'s list; `bodies` addresses `count`
        // bodies `stride` bytes apart inside a staged section (checked by
        // `staged_at` against the section's length), and `key_buf` holds
        // `at.total` words for the `n` keys, of which these are keys
        // `first_key..first_key + count`.
        unsafe { l.launch(Kernel::GatherKeys, grid_line(l, count), &args) }?;
        first_key += count;
    }
    Ok(keys_at(l, parts, n, key_buf, at))
}

fn keys_at<L: Launcher>(
    l: &L,
    parts: &[Part<'_, '_>],
    n: usize,
    key_buf: &L::Buffer,
    at: layout::Offsets,
) -> KeysAt {
    let keys = parts[0].0;
    KeysAt {
        params: keys.params(),
        party: keys.party(),
        count: n,
        base: l.address(key_buf),
        at,
    }
}
