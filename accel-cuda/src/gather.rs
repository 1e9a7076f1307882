//! [`BatchEval::eval_many`](suffuse_core::batch::BatchEval::eval_many) on the device: the evaluations of a whole step
//! (every chunk's keys of one key slot) in one transposition, one upload
//! and one launch, instead of one round trip per chunk.

// The launch passes raw device addresses; the unsafe block says why.
#![allow(unsafe_code)]

use suffuse_core::batch::EvalJob;

use crate::eval::{io_layout, launch_eval, u64_of};
use crate::launcher::Launcher;
use crate::staged::place_keys;
use crate::{CudaError, CudaEval, layout};

impl<L: Launcher> CudaEval<L> {
    /// Evaluates `jobs`, which share params, party and points per key, in as
    /// few launches as the budget allows (whole jobs per launch; a job too
    /// large for one goes through [`CudaEval::eval_device`] alone).
    pub(crate) fn eval_gathered(
        &self,
        jobs: &mut [EvalJob<'_>],
        per_key: usize,
    ) -> Result<(), CudaError> {
        let Some(first) = jobs.first() else {
            return Ok(());
        };
        let p = first.keys.params();
        let unit = layout::words_per_key(&p) + io_layout(per_key, p.output().words()).0;
        let room = self.lock().pool.words_for_work(0) / unit;
        let mut start = 0;
        while start < jobs.len() {
            let mut end = start;
            let mut keys = 0;
            while end < jobs.len() && keys + jobs[end].keys.count() <= room.max(1) {
                keys += jobs[end].keys.count();
                end += 1;
            }
            if end == start {
                let job = &mut jobs[start];
                self.eval_device(&job.keys, per_key, job.points, job.out)?;
                start += 1;
                continue;
            }
            self.launch_jobs(&mut jobs[start..end], per_key, keys)?;
            start = end;
        }
        Ok(())
    }

    /// One launch over `jobs` (holding `keys` keys in all).
    fn launch_jobs(
        &self,
        jobs: &mut [EvalJob<'_>],
        per_key: usize,
        keys: usize,
    ) -> Result<(), CudaError> {
        let l = &self.launcher;
        let p = jobs[0].keys.params();
        let mut st = self.lock();
        let aes = st.aes(l)?;
        let key_words = layout::offsets(&p, keys).total;
        let queries = keys * per_key;
        let (io_words, out_at) = io_layout(queries, p.output().words());
        // The batches are copied out (they borrow the key bytes, not the
        // jobs), so that the outputs can be written below.
        let batches: Vec<_> = jobs.iter().map(|j| j.keys).collect();
        let parts: Vec<_> = batches.iter().map(|k| (k, 0, k.count())).collect();
        let staged = st.staged_parts(l, &parts);
        st.with_buffers(l, [key_words, io_words], |staging, bufs| {
            let keys_at = place_keys(l, &parts, staged.as_deref(), staging, &mut bufs[0])?;
            staging.clear();
            for j in jobs.iter() {
                staging.extend_from_slice(j.points);
            }
            l.upload(&mut bufs[1], staging)?;
            let io = l.address(&bufs[1]);
            // SAFETY: `place_keys` laid the `keys` keys out as `keys_at`
            // says, and the query buffer holds their `queries` points and
            // room for their outputs as `io_layout` places them.
            unsafe { launch_eval(l, aes, &keys_at, (io, io + 8 * u64_of(out_at)), per_key) }?;
            let outputs = io_layout(queries, p.output().words()).0 - out_at;
            staging.clear();
            staging.resize(out_at + outputs, 0);
            l.download(&bufs[1], staging)?;
            let mut at = out_at;
            for j in jobs.iter_mut() {
                let len = j.out.len();
                j.out.copy_from_slice(&staging[at..at + len]);
                at += len;
            }
            Ok(())
        })
    }
}
