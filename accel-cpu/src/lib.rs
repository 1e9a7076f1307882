//! # suffuse-accel-cpu
//!
//! [`CpuEval`] implements [`BatchEval`], core's accelerator boundary, on
//! CPUs: DCF/DPF evaluation, seed expansion, key generation and ring matrix
//! products. Two things make it fast, in this order:
//!
//! 1. **Lanes.** Inside a chunk it walks up to 64 evaluations (or 32 key
//!    generations) level by level in lockstep, so each tree level issues 64
//!    independent AES blocks at once. One evaluation alone is a dependent
//!    chain (≈ 14 ns per AES call); independent blocks pipeline through
//!    AES-NI or VAES at a fraction of a nanosecond each.
//! 2. **Threads.** rayon spreads chunks over cores.
//!
//! The walks are core's [`suffuse_core::fss::eval_queries`] and
//! [`suffuse_core::fss::generate`], the same code
//! [`suffuse_core::batch::Serial`] runs with one lane, so the two can only
//! differ in how work is grouped. The AES path ([`Backend`]) and the matrix
//! kernel ([`linalg::Path`]) are detected once per process.

#![deny(unsafe_code)]

pub mod linalg;
#[cfg(target_arch = "x86_64")]
pub mod x86;

use std::sync::OnceLock;

use rayon::prelude::*;
use suffuse_core::Error;
use suffuse_core::batch::{
    BatchEval, EvalStats, MatShape, Turned, full_domain_each, lookup_each, lookup_slots,
};
use suffuse_core::fss::{self, GEN_LANES, GenBatch, KeyBatch};
use suffuse_core::prg::{Block, Domain, FixedKeyAes, HASH_CHUNK, Hasher};

/// The fixed-key hash implementation: the fastest this CPU supports unless
/// a test or benchmark picks another.
#[derive(Clone)]
#[allow(clippy::large_enum_variant)] // one per evaluator, never moved in a hot path
pub enum Backend {
    /// VAES-512: four blocks per instruction.
    #[cfg(target_arch = "x86_64")]
    Vaes512(x86::Vaes512),
    /// VAES-256: two blocks per instruction (AVX2 + VAES, no AVX-512).
    #[cfg(target_arch = "x86_64")]
    Vaes256(x86::Vaes256),
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
    /// The best backend on this CPU, detected on the first call and cached.
    pub fn detect() -> Backend {
        static DETECTED: OnceLock<Backend> = OnceLock::new();
        DETECTED
            .get_or_init(|| {
                let mut all = Backend::available();
                all.swap_remove(0)
            })
            .clone()
    }

    /// Every backend this CPU can run, fastest first, the portable one last:
    /// how tests and benchmarks force each path.
    pub fn available() -> Vec<Backend> {
        let mut all = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(h) = x86::Vaes512::detect() {
                all.push(Backend::Vaes512(h));
            }
            if let Some(h) = x86::Vaes256::detect() {
                all.push(Backend::Vaes256(h));
            }
            if let Some(h) = x86::AesNi::detect() {
                all.push(Backend::AesNi(h));
            }
        }
        all.push(Backend::Portable(FixedKeyAes::new()));
        all
    }

    /// The backend's name for reports.
    pub fn name(&self) -> &'static str {
        match self {
            #[cfg(target_arch = "x86_64")]
            Backend::Vaes512(_) => "vaes512",
            #[cfg(target_arch = "x86_64")]
            Backend::Vaes256(_) => "vaes256",
            #[cfg(target_arch = "x86_64")]
            Backend::AesNi(_) => "aesni",
            Backend::Portable(_) => "portable",
        }
    }
}

impl Backend {
    /// Evaluates queries like [`fss::eval_queries`], on the fastest walk this
    /// backend has, or on core's portable walk when `simd_walk` is false.
    #[allow(clippy::too_many_arguments)]
    pub fn eval_queries(
        &self,
        keys: &KeyBatch<'_>,
        per_key: usize,
        first: usize,
        points: &[u64],
        out: &mut [u64],
        lanes: usize,
        simd_walk: bool,
    ) -> Result<u64, Error> {
        if !simd_walk {
            return fss::eval_queries(self, keys, per_key, first, points, out, lanes);
        }
        match self {
            #[cfg(target_arch = "x86_64")]
            Backend::Vaes512(h) => h.eval_queries(keys, per_key, first, points, out, lanes),
            #[cfg(target_arch = "x86_64")]
            Backend::Vaes256(h) => h.eval_queries(keys, per_key, first, points, out, lanes),
            #[cfg(target_arch = "x86_64")]
            Backend::AesNi(h) => h.eval_queries(keys, per_key, first, points, out, lanes),
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
            Backend::Vaes256(h) => h.hash_many(d, blocks),
            #[cfg(target_arch = "x86_64")]
            Backend::AesNi(h) => h.hash_many(d, blocks),
            Backend::Portable(h) => h.hash_many(d, blocks),
        }
    }
}

/// Queries per rayon task: large enough to amortise scheduling, small enough
/// to balance two cores on gate-sized batches.
const CHUNK: usize = 4096;

/// Key pairs per rayon task of [`CpuEval::generate`].
const GEN_CHUNK: usize = 512;

/// The multi-core, lane-pipelined CPU evaluator.
#[derive(Debug, Clone)]
pub struct CpuEval {
    aes: Backend,
    matrix: linalg::Path,
    lanes: usize,
    simd_walk: bool,
    pool: Option<std::sync::Arc<rayon::ThreadPool>>,
}

impl Default for CpuEval {
    fn default() -> Self {
        CpuEval::new()
    }
}

impl CpuEval {
    /// An evaluator on rayon's global pool with full lanes and the detected
    /// paths.
    pub fn new() -> CpuEval {
        CpuEval {
            aes: Backend::detect(),
            matrix: linalg::Path::detect(),
            lanes: HASH_CHUNK,
            simd_walk: true,
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

    /// Uses `path` for matrix products instead of the detected one.
    pub fn with_matrix_path(mut self, path: linalg::Path) -> CpuEval {
        self.matrix = path;
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

    /// Evaluates with core's portable walk over this backend's hashes
    /// instead of the backend's SIMD walk; for measuring what the SIMD walks
    /// buy and for checking core's walk on every AES path.
    pub fn core_walk(mut self) -> CpuEval {
        self.simd_walk = false;
        self
    }

    fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(pool) => pool.install(f),
            None => f(),
        }
    }

    fn threads(&self) -> usize {
        self.pool
            .as_ref()
            .map_or_else(rayon::current_num_threads, |p| p.current_num_threads())
    }

    /// One product of a [`MatShape`] batch on the detected kernel.
    fn product(&self, shape: &MatShape, a: &[u64], b: &[u64], c: &mut [u64]) -> Result<(), Error> {
        let MatShape { m, k, n, .. } = *shape;
        let path = self.matrix;
        let done = match (shape.transpose_b, shape.accumulate) {
            (false, false) => path.matmul(a, b, c, m, k, n),
            (false, true) => path.matmul_acc(a, b, c, m, k, n),
            (true, false) => path.matmul_bt(a, b, c, m, k, n),
            (true, true) => path.matmul_bt_acc(a, b, c, m, k, n),
        };
        done.map_err(|_| Error::BufferLength)
    }
}

impl Hasher for CpuEval {
    #[inline]
    fn hash_many(&self, d: Domain, blocks: &mut [Block]) -> u64 {
        self.aes.hash_many(d, blocks)
    }
}

impl BatchEval for CpuEval {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn aes_path(&self) -> &'static str {
        self.aes.name()
    }

    /// Enough chunks to keep every thread busy several times over.
    fn preferred_batch(&self) -> usize {
        CHUNK * 4 * self.threads()
    }

    fn eval(
        &self,
        keys: &KeyBatch<'_>,
        points: &[u64],
        out: &mut [u64],
    ) -> Result<EvalStats, Error> {
        // A pair's query writes two words.
        let words = keys.params().output().words();
        if Some(out.len()) != points.len().checked_mul(words) {
            return Err(Error::BufferLength);
        }
        let per_key = keys.points_per_key(points.len())?;
        let aes = &self.aes;
        let (lanes, simd) = (self.lanes, self.simd_walk);
        let calls = self.install(|| {
            points
                .par_chunks(CHUNK)
                .zip(out.par_chunks_mut(CHUNK * words))
                .enumerate()
                .map(|(i, (p, o))| aes.eval_queries(keys, per_key, i * CHUNK, p, o, lanes, simd))
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

    /// Sums each key's outputs tile by tile as they are made
    /// ([`lookup_each`]), the keys split over the threads, each with its
    /// own key's domain of `domain` as scratch.
    fn lookup(
        &self,
        keys: &KeyBatch<'_>,
        (points, table): (&[u64], &[u64]),
        domain: &mut [u64],
        out: &mut [u64],
    ) -> Result<EvalStats, Error> {
        let slots = lookup_slots(keys, (points, table), domain, out)?;
        let (n, size) = (keys.count(), table.len());
        if n == 0 {
            return Ok(EvalStats::default());
        }
        let per = n.div_ceil(slots.min(n));
        let aes = &self.aes;
        let calls = self.install(|| {
            out.par_chunks_mut(per)
                .zip(domain.par_chunks_mut(size))
                .enumerate()
                .map(|(g, (o, d))| {
                    let (at, end) = (g * per, g * per + o.len());
                    let batch = keys.slice(at, end);
                    lookup_each(aes, &batch, (&points[at..end], table), d, o).map(|s| s.aes_calls)
                })
                .try_reduce(|| 0, |a, b| Ok(a + b))
        })?;
        Ok(EvalStats { aes_calls: calls })
    }

    fn generate(
        &self,
        batch: &GenBatch<'_>,
        key0: &mut [u8],
        key1: &mut [u8],
    ) -> Result<EvalStats, Error> {
        let len = batch.params().key_len();
        let n = batch.count();
        if !fss::key_buffers_fit(key0, key1, n, len) {
            return Err(Error::BufferLength);
        }
        let aes = &self.aes;
        let lanes = self.lanes.div_ceil(2).min(GEN_LANES);
        if n <= GEN_CHUNK {
            // One chunk: on the calling thread, no trip through the pool
            // (a gate deals its keys a group at a time from a worker).
            let calls = fss::generate(aes, batch, key0, key1, lanes)?;
            return Ok(EvalStats { aes_calls: calls });
        }
        let step = GEN_CHUNK * len.max(1);
        // An empty `key1` (P0's keys only) gives every chunk an empty one.
        let empty = std::iter::repeat_with(|| -> &mut [u8] { &mut [] });
        let pieces: Vec<(&mut [u8], &mut [u8])> = key0
            .chunks_mut(step)
            .zip(key1.chunks_mut(step).chain(empty))
            .collect();
        let calls = self.install(|| {
            pieces
                .into_par_iter()
                .enumerate()
                .map(|(i, (k0, k1))| {
                    let start = i * GEN_CHUNK;
                    let part = batch.slice(start, start + k0.len() / len);
                    fss::generate(aes, &part, k0, k1, lanes)
                })
                .try_reduce(|| 0, |a, b| Ok(a + b))
        })?;
        Ok(EvalStats { aes_calls: calls })
    }

    fn turned_matmul(
        &self,
        t: &Turned<'_>,
        a: &[u64],
        b: &[u64],
        c: &mut [u64],
    ) -> Result<(), Error> {
        t.check(a, b, c)?;
        let (k, path) = (t.k, self.matrix);
        self.install(|| {
            c.par_chunks_mut(t.n.max(1))
                .enumerate()
                .for_each(|(i, ci)| path.turned_row(t, i, &a[i * k..(i + 1) * k], b, ci));
        });
        Ok(())
    }

    fn matmul(&self, shape: &MatShape, a: &[u64], b: &[u64], c: &mut [u64]) -> Result<(), Error> {
        shape.check(a, b, c)?;
        let [la, lb, lc] = shape.lens().ok_or(Error::BufferLength)?;
        if lc == 0 {
            return Ok(());
        }
        let (pa, pb, pc) = (la / shape.batches, lb / shape.batches, lc / shape.batches);
        self.install(|| {
            if shape.batches == 1 {
                return self.product(shape, a, b, c);
            }
            c.par_chunks_mut(pc).enumerate().try_for_each(|(t, ct)| {
                self.product(
                    shape,
                    &a[t * pa..(t + 1) * pa],
                    &b[t * pb..(t + 1) * pb],
                    ct,
                )
            })
        })
    }
}
