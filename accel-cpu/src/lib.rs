//! # suffuse-accel-cpu
//!
//! [`CpuEval`] implements [`BatchEval`] on CPUs. Two things make it fast,
//! in this order:
//!
//! 1. **Lanes.** Inside a chunk it walks up to 64 evaluations level by level
//!    in lockstep, so each tree level issues 64 independent AES blocks at
//!    once. One evaluation alone is a dependent chain (≈ 14 ns per AES call);
//!    independent blocks pipeline through VAES at a fraction of a
//!    nanosecond each.
//! 2. **Threads.** rayon spreads chunks over cores.
//!
//! The walk itself is core's [`suffuse_core::fss::eval_queries`], the same
//! code [`suffuse_core::batch::Serial`] runs with one lane, so the two can
//! only differ in how queries are grouped.

#![deny(unsafe_code)]

pub mod linalg;
#[cfg(target_arch = "x86_64")]
pub mod x86;

use rayon::prelude::*;
use suffuse_core::Error;
use suffuse_core::batch::{BatchEval, EvalStats, full_domain_each};
use suffuse_core::fss::{self, KeyBatch};
use suffuse_core::prg::{Block, Domain, FixedKeyAes, HASH_CHUNK, Hasher};

/// The fastest hash implementation this CPU supports, chosen once.
#[derive(Clone)]
#[allow(clippy::large_enum_variant)] // one per evaluator, never moved in a hot path
pub enum Backend {
    /// VAES-512: four blocks per instruction.
    #[cfg(target_arch = "x86_64")]
    Vaes512(x86::Vaes512),
    /// AES-NI: one block per instruction, eight in flight.
    #[cfg(target_arch = "x86_64")]
    AesNi(x86::AesNi),
    /// The `aes` crate through core (software where there is no AES unit).
    Portable(FixedKeyAes),
}

impl core::fmt::Debug for Backend {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

impl Backend {
    /// Detects the best backend on this CPU.
    pub fn detect() -> Backend {
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(h) = x86::Vaes512::detect() {
                return Backend::Vaes512(h);
            }
            if let Some(h) = x86::AesNi::detect() {
                return Backend::AesNi(h);
            }
        }
        Backend::Portable(FixedKeyAes::new())
    }

    /// The backend's name for reports.
    pub fn name(&self) -> &'static str {
        match self {
            #[cfg(target_arch = "x86_64")]
            Backend::Vaes512(_) => "vaes512",
            #[cfg(target_arch = "x86_64")]
            Backend::AesNi(_) => "aesni",
            Backend::Portable(_) => "portable",
        }
    }
}

impl Backend {
    /// Evaluates queries like [`fss::eval_queries`], on the fastest walk this
    /// backend has.
    pub fn eval_queries(
        &self,
        keys: &KeyBatch<'_>,
        per_key: usize,
        first: usize,
        points: &[u64],
        out: &mut [u64],
        lanes: usize,
    ) -> Result<u64, Error> {
        match self {
            #[cfg(target_arch = "x86_64")]
            Backend::Vaes512(h) => h.eval_queries(keys, per_key, first, points, out, lanes),
            _ => fss::eval_queries(self, keys, per_key, first, points, out, lanes),
        }
    }
}

impl Hasher for Backend {
    #[inline]
    fn hash_many(&self, d: Domain, blocks: &mut [Block]) -> u64 {
        match self {
            #[cfg(target_arch = "x86_64")]
            Backend::Vaes512(h) => h.hash_many(d, blocks),
            #[cfg(target_arch = "x86_64")]
            Backend::AesNi(h) => h.hash_many(d, blocks),
            Backend::Portable(h) => h.hash_many(d, blocks),
        }
    }
}

/// Queries per rayon task: large enough to amortise scheduling, small enough
/// to balance two cores on gate-sized batches.
const CHUNK: usize = 4096;

/// The multi-core, lane-pipelined CPU evaluator.
#[derive(Debug, Clone)]
pub struct CpuEval {
    aes: Backend,
    lanes: usize,
    pool: Option<std::sync::Arc<rayon::ThreadPool>>,
}

impl Default for CpuEval {
    fn default() -> Self {
        CpuEval::new()
    }
}

impl CpuEval {
    /// An evaluator on rayon's global pool with full lanes.
    pub fn new() -> CpuEval {
        CpuEval {
            aes: Backend::detect(),
            lanes: HASH_CHUNK,
            pool: None,
        }
    }

    /// An evaluator on its own pool of `threads` threads.
    pub fn with_threads(threads: usize) -> Result<CpuEval, rayon::ThreadPoolBuildError> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .build()?;
        Ok(CpuEval {
            pool: Some(std::sync::Arc::new(pool)),
            ..CpuEval::new()
        })
    }

    /// Uses `backend` for the hashes instead of the detected one; for
    /// measuring and for testing every backend on one machine.
    pub fn with_backend(mut self, backend: Backend) -> CpuEval {
        self.aes = backend;
        self
    }

    /// The hash backend in use.
    pub fn backend(&self) -> &Backend {
        &self.aes
    }

    /// Sets how many evaluations walk in lockstep (1..=64); for measuring
    /// what lanes buy.
    pub fn lanes(mut self, lanes: usize) -> CpuEval {
        self.lanes = lanes.clamp(1, HASH_CHUNK);
        self
    }

    fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(pool) => pool.install(f),
            None => f(),
        }
    }
}

impl BatchEval for CpuEval {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn eval(
        &self,
        keys: &KeyBatch<'_>,
        points: &[u64],
        out: &mut [u64],
    ) -> Result<EvalStats, Error> {
        if points.len() != out.len() {
            return Err(Error::BufferLength);
        }
        let per_key = keys.points_per_key(points.len())?;
        let aes = &self.aes;
        let lanes = self.lanes;
        let calls = self.install(|| {
            points
                .par_chunks(CHUNK)
                .zip(out.par_chunks_mut(CHUNK))
                .enumerate()
                .map(|(i, (p, o))| aes.eval_queries(keys, per_key, i * CHUNK, p, o, lanes))
                .try_reduce(|| 0, |a, b| Ok(a + b))
        })?;
        Ok(EvalStats { aes_calls: calls })
    }

    fn eval_full_domain(&self, keys: &KeyBatch<'_>, out: &mut [u64]) -> Result<EvalStats, Error> {
        let n = keys.count();
        let k = keys.params().domain().bits();
        if n == 0 || k > 40 || Some(out.len()) != n.checked_mul(1usize << k) {
            // Serial's checks give the same typed errors for every misuse.
            return full_domain_each(&self.aes, keys, out);
        }
        let size = 1usize << k;
        let aes = &self.aes;
        let calls = self.install(|| {
            out.par_chunks_mut(size)
                .enumerate()
                .map(|(i, o)| full_domain_each(aes, &keys.slice(i, i + 1), o).map(|s| s.aes_calls))
                .try_reduce(|| 0, |a, b| Ok(a + b))
        })?;
        Ok(EvalStats { aes_calls: calls })
    }
}
