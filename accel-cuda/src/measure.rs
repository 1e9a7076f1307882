//! Measurement with the data already on the device: how fast the kernels
//! themselves run, apart from the host's transposition and the copies over
//! PCIe. For benchmarks (`gpu_check bench`); results are checked, not just
//! timed.

// Launches pass raw device addresses; each unsafe block says why.
#![allow(unsafe_code)]

use std::time::Instant;

use suffuse_core::fss::KeyBatch;

use crate::eval::{KeysAt, launch_eval};
use crate::launcher::Launcher;
use crate::{CudaError, CudaEval, layout};

/// What [`CudaEval::time_resident_eval`] measured.
#[derive(Clone, Debug)]
pub struct ResidentTiming {
    /// Seconds per launch over all queries, keys and points in device
    /// memory, from the launch to the device's completion.
    pub launch_s: f64,
    /// Seconds to transpose and upload the keys and points once.
    pub upload_s: f64,
    /// The outputs of the last launch.
    pub outputs: Vec<u64>,
}

impl<L: Launcher> CudaEval<L> {
    /// Uploads `keys` and `points` once, then runs the evaluation `reps`
    /// times (after one warm-up launch) and returns the time per launch and
    /// the outputs, which callers compare with core's.
    pub fn time_resident_eval(
        &self,
        keys: &KeyBatch<'_>,
        points: &[u64],
        reps: usize,
    ) -> Result<ResidentTiming, CudaError> {
        let per_key = keys
            .points_per_key(points.len())
            .map_err(|_| CudaError::Launch("points are not a whole number per key"))?;
        let l = &self.launcher;
        let p = keys.params();
        let n = keys.count();
        let mut st = self.lock();
        let aes = st.aes(l)?;
        let key_words = layout::offsets(&p, n).total;
        let outputs_len = points.len() * p.output().words();
        st.with_buffers(
            l,
            [key_words, points.len(), outputs_len],
            |staging, bufs| {
                let t0 = Instant::now();
                let at = layout::transpose(keys, 0, n, staging);
                l.upload(&mut bufs[0], staging)?;
                l.upload(&mut bufs[1], points)?;
                l.synchronize()?;
                let upload_s = t0.elapsed().as_secs_f64();
                let resident = KeysAt {
                    params: p,
                    party: keys.party(),
                    count: n,
                    base: l.address(&bufs[0]),
                    at,
                };
                let io = (l.address(&bufs[1]), l.address(&bufs[2]));
                // SAFETY: the key buffer holds the transposed batch, the
                // point buffer `points.len()` words and the output buffer
                // their outputs (`Output::words` each).
                unsafe { launch_eval(l, aes, &resident, io, per_key) }?;
                l.synchronize()?;
                let t1 = Instant::now();
                for _ in 0..reps.max(1) {
                    // SAFETY: as above.
                    unsafe { launch_eval(l, aes, &resident, io, per_key) }?;
                }
                l.synchronize()?;
                #[allow(clippy::cast_precision_loss)]
                let launch_s = t1.elapsed().as_secs_f64() / reps.max(1) as f64;
                let mut outputs = vec![0u64; outputs_len];
                l.download(&bufs[2], &mut outputs)?;
                Ok(ResidentTiming {
                    launch_s,
                    upload_s,
                    outputs,
                })
            },
        )
    }
}
