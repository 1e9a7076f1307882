//! [`BatchEval`] on a [`Launcher`]: what each method uploads, launches and
//! reads back. Every method checks its buffers exactly as core's `Serial`
//! does, so misuse gets the same typed error on every backend.

// Launches pass raw device addresses; each unsafe block says why the
// arguments match the kernel and stay inside the buffers.
#![allow(unsafe_code)]

use suffuse_core::Error;
use suffuse_core::batch::{
    BatchEval, EvalJob, EvalStats, MatShape, Resident, Turned, full_domain_each,
};
use suffuse_core::fss::{self, GenBatch, KeyBatch, Kind, Output, Params};
use suffuse_core::prg::{Block, Domain, Hasher, domain_key};
use zeroize::Zeroize;

use crate::launcher::{Arg, Dims, Kernel, Launcher};
use crate::phases::{Phase, Timed};
use crate::staged::place_keys;
use crate::{CudaError, CudaEval, State, layout};

/// Bytes of shared memory the hashing kernels use: four T-tables and the
/// round keys of four domains (`AES_SHARED_BYTES` in `kernels/common.cuh`).
const AES_SHARED_BYTES: u32 = 4 * (1024 + 4 * 44);

/// Threads per side of a matrix tile (`MM_TILE` in `kernels/matmul.cu`).
const TILE: u32 = 16;

/// Blocks per grid dimension y and z, as CUDA allows.
const GRID_YZ: u32 = 65_535;

/// The domains in the order the kernels number them.
const DOMAINS: [Domain; 4] = [Domain::Tree, Domain::Leaf, Domain::Value, Domain::Prf];

fn domain_index(d: Domain) -> u32 {
    match d {
        Domain::Tree => 0,
        Domain::Leaf => 1,
        Domain::Value => 2,
        Domain::Prf => 3,
    }
}

pub(crate) fn u64_of(n: usize) -> u64 {
    n as u64
}

fn u32_of(n: usize) -> Result<u32, CudaError> {
    u32::try_from(n).map_err(|_| CudaError::Launch("a shape exceeds 32 bits"))
}

fn word_of(b: Block) -> [u64; 2] {
    [b.low64(), b.high64()]
}

fn block_of(lo: u64, hi: u64) -> Block {
    Block::from_bytes(((u128::from(hi) << 64) | u128::from(lo)).to_le_bytes())
}

/// The output width the kernels take: 0 for bits.
fn ring_bits(p: &Params) -> u32 {
    match p.output() {
        Output::Bit => 0,
        Output::Ring(w) | Output::Pair(w) => w.bits(),
    }
}

/// The kernels' shape flags: `FSS_DCF` (1) and `FSS_PAIR` (2).
fn flags(p: &Params) -> u32 {
    u32::from(p.kind() == Kind::Dcf) | (u32::from(matches!(p.output(), Output::Pair(_))) << 1)
}

/// The key shape as `suffuse_fss_eval` and `suffuse_fss_gen` take it, in
/// their order: k, the levels, ν, the bits per output word, the ring
/// width (0 for bits) and the shape flags.
fn shape_args(p: &Params) -> [Arg; 6] {
    [
        Arg::U32(p.domain().bits()),
        Arg::U32(p.levels()),
        Arg::U32(p.leaf_bits()),
        Arg::U32(p.word_bits()),
        Arg::U32(ring_bits(p)),
        Arg::U32(flags(p)),
    ]
}

/// Where a launch over `queries` queries of `words` output words each
/// reads its points and writes its outputs, in one buffer: the buffer's
/// words and the outputs' first word. One word per query evaluates in
/// place (thread q reads point q before it writes output q, and no other
/// thread touches either); a pair's two words would overwrite a later
/// query's point, so its outputs follow the points.
pub(crate) fn io_layout(queries: usize, words: usize) -> (usize, usize) {
    let out_at = if words == 1 { 0 } else { queries };
    (out_at + queries * words, out_at)
}

/// Copies a launch's outputs, `out.len()` words at `out_at` of `buf`, into
/// `out` (through `staging` where they do not start the buffer).
fn download_outputs<L: Launcher>(
    l: &L,
    buf: &L::Buffer,
    out_at: usize,
    staging: &mut Vec<u64>,
    out: &mut [u64],
) -> Result<(), CudaError> {
    if out_at == 0 {
        return l.download(buf, out);
    }
    staging.clear();
    staging.resize(out_at + out.len(), 0);
    l.download(buf, staging)?;
    out.copy_from_slice(&staging[out_at..]);
    Ok(())
}

/// Key generation's inputs for `part`, as `suffuse_fss_gen` reads them:
/// every α, every β, each key's two roots (two words each), then the
/// random words.
fn stage_gen_inputs(staging: &mut Vec<u64>, part: &GenBatch<'_>) {
    staging.clear();
    staging.extend_from_slice(part.alphas());
    staging.extend_from_slice(part.betas());
    for [r0, r1] in part.roots() {
        staging.extend_from_slice(&word_of(*r0));
        staging.extend_from_slice(&word_of(*r1));
    }
    staging.extend_from_slice(part.random());
}

/// `suffuse_dpf_leaves`'s arguments for `c` DPF keys of `keys`: their
/// leaf corrections and leaf seeds at `leaves`, the outputs at `out`.
fn leaves_args(
    keys: &KeyBatch<'_>,
    aes: u64,
    leaves: (u64, u64),
    out: u64,
    c: usize,
) -> Result<[Arg; 10], CudaError> {
    let p = keys.params();
    Ok([
        Arg::Ptr(aes),
        Arg::Ptr(leaves.0),
        Arg::Ptr(leaves.1),
        Arg::Ptr(out),
        Arg::U64(u64_of(c)),
        Arg::U32(p.levels()),
        Arg::U32(p.leaf_bits()),
        Arg::U32(p.lane_bits()),
        Arg::U32(ring_bits(&p)),
        Arg::U32(u32_of(keys.party().index() as usize)?),
    ])
}

/// `suffuse_fss_gen`'s arguments for `c` key pairs of `p`: inputs staged
/// at `io.0` as [`stage_gen_inputs`] lays them out (α, then β, then the
/// roots, then the random words), P0's keys written at `io.1`.
fn gen_args(p: &Params, aes: u64, io: (u64, u64), c: usize) -> Result<Vec<Arg>, CudaError> {
    let roots = c + c * p.output().words();
    let at = |i: usize| Arg::Ptr(io.0 + 8 * u64_of(i));
    let mut args = vec![
        Arg::Ptr(aes),
        at(0),
        at(c),
        at(roots),
        at(roots + 4 * c),
        Arg::Ptr(io.1),
        Arg::U64(u64_of(c)),
        Arg::U64(u64_of(p.key_len())),
    ];
    args.extend(shape_args(p));
    args.push(Arg::U32(u32_of(p.value_bytes())?));
    Ok(args)
}

/// P1's keys from P0's: P1's key is P0's body behind P1's root (lsb 1), as
/// core writes it, so P0's bytes are copied on every core and then the
/// roots replaced. `generate` checked that `key0` holds the batch's keys
/// and `key1` as many or none (P0's keys only: nothing to do).
fn p1_keys(batch: &GenBatch<'_>, key0: &[u8], key1: &mut [u8]) {
    let len = batch.params().key_len();
    crate::par::zip_chunks(key1, 1 << 20, key0, 1 << 20, |a, b| {
        a.copy_from_slice(b);
    });
    for (k1, [_, r1]) in key1.chunks_mut(len.max(1)).zip(batch.roots()) {
        k1[..16].copy_from_slice(&r1.with_lsb(1).to_bytes());
    }
}

impl<L: Launcher> State<L> {
    /// The device address of the four domains' AES keys, uploaded once.
    pub(crate) fn aes(&mut self, l: &L) -> Result<u64, CudaError> {
        if self.aes.is_none() {
            let words: Vec<u64> = DOMAINS
                .iter()
                .flat_map(|d| {
                    let k = domain_key(*d);
                    let mut lo = [0u8; 8];
                    let mut hi = [0u8; 8];
                    lo.copy_from_slice(&k[..8]);
                    hi.copy_from_slice(&k[8..]);
                    [u64::from_le_bytes(lo), u64::from_le_bytes(hi)]
                })
                .collect();
            let (_, mut buf) = self.pool.take(l, words.len())?;
            l.upload(&mut buf, &words)?;
            self.aes = Some(buf);
        }
        match &self.aes {
            Some(buf) => Ok(l.address(buf)),
            None => Err(CudaError::Launch("AES keys missing")),
        }
    }

    /// Runs `f` with `N` buffers of the given word counts, which go back to
    /// the pool afterwards, whatever `f` returns.
    pub(crate) fn with_buffers<const N: usize, R>(
        &mut self,
        l: &L,
        words: [usize; N],
        f: impl FnOnce(&mut Vec<u64>, &mut [L::Buffer]) -> Result<R, CudaError>,
    ) -> Result<R, CudaError> {
        let mut held: Vec<(usize, L::Buffer)> = Vec::with_capacity(N);
        for w in words {
            match self.pool.take(l, w) {
                Ok(b) => held.push(b),
                Err(e) => {
                    for (w, b) in held {
                        self.pool.give(w, b);
                    }
                    return Err(e);
                }
            }
        }
        let (sizes, mut bufs): (Vec<usize>, Vec<L::Buffer>) = held.into_iter().unzip();
        let mut result = f(&mut self.staging, &mut bufs);
        // Keys, shares and triples leave nothing behind on the device or in
        // the host's staging: every buffer is wiped before it is kept for
        // reuse (a wipe that fails drops the buffer instead).
        let start = std::time::Instant::now();
        crate::par::chunks(&mut self.staging, 1 << 16, Zeroize::zeroize);
        l.host_phase(Phase::Wipe, start);
        for ((w, mut b), used) in sizes.into_iter().zip(bufs).zip(words) {
            match l.wipe(&mut b, used) {
                Ok(()) => self.pool.give(w, b),
                Err(e) => {
                    drop(b);
                    self.pool.release(w);
                    if result.is_ok() {
                        result = Err(e);
                    }
                }
            }
        }
        result
    }
}

/// A one-dimensional launch over `work` items.
pub(crate) fn grid_line<L: Launcher>(l: &L, work: usize) -> Dims {
    let threads = l.threads_per_block();
    let blocks = u64_of(work).div_ceil(u64::from(threads)).max(1);
    let blocks = u32::try_from(blocks)
        .unwrap_or(u32::MAX)
        .min(l.max_blocks().max(1));
    Dims {
        grid: [blocks, 1, 1],
        block: [threads, 1, 1],
        shared_bytes: AES_SHARED_BYTES,
    }
}

/// A transposed key batch in device memory: where its parts start.
pub(crate) struct KeysAt {
    pub(crate) params: Params,
    pub(crate) party: suffuse_core::fss::Party,
    pub(crate) count: usize,
    /// The device address of the batch's first word.
    pub(crate) base: u64,
    pub(crate) at: layout::Offsets,
}

/// Launches `suffuse_fss_eval` over `count · per_key` queries of `keys`,
/// reading points at `io.0` and writing [`Output::words`] outputs per
/// query at `io.1` ([`io_layout`] places both).
///
/// # Safety
///
/// `keys.base` must address `keys.at.total` words laid out as `keys.at`
/// says, `io.0` the `count · per_key` points and `io.1` room for their
/// outputs, on `l`, the outputs in place of the points or past them.
pub(crate) unsafe fn launch_eval<L: Launcher>(
    l: &L,
    aes: u64,
    keys: &KeysAt,
    io: (u64, u64),
    per_key: usize,
) -> Result<(), CudaError> {
    let p = &keys.params;
    let queries = keys.count * per_key;
    let word = |i: usize| Arg::Ptr(keys.base + 8 * u64_of(i));
    let mut args = vec![
        Arg::Ptr(aes),
        word(keys.at.roots),
        word(keys.at.cw),
        word(keys.at.vcw),
        word(keys.at.leaf),
        Arg::Ptr(io.0),
        Arg::Ptr(io.1),
        Arg::U64(u64_of(queries)),
        Arg::U64(u64_of(per_key)),
        Arg::U64(u64_of(keys.count)),
    ];
    args.extend(shape_args(p));
    args.push(Arg::U32(u32::from(
        keys.party == suffuse_core::fss::Party::P1,
    )));
    // SAFETY: the arguments follow `suffuse_fss_eval`'s list, and the caller
    // guarantees the buffers behind them.
    unsafe { l.launch(Kernel::FssEval, grid_line(l, queries), &args) }
}

impl<L: Launcher> CudaEval<L> {
    /// Records a device failure and turns it into core's error code.
    pub(crate) fn failed(&self, e: CudaError) -> Error {
        let mut slot = self
            .last_failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *slot = Some(e.to_string());
        Error::Unsupported
    }

    pub(crate) fn eval_device(
        &self,
        keys: &KeyBatch<'_>,
        per_key: usize,
        points: &[u64],
        out: &mut [u64],
    ) -> Result<(), CudaError> {
        let l = &self.launcher;
        let p = keys.params();
        let words = p.output().words();
        let mut st = self.lock();
        let aes = st.aes(l)?;
        let unit = layout::words_per_key(&p) + io_layout(per_key, words).0;
        let piece = (st.pool.words_for_work(0) / unit).max(1);
        let n = keys.count();
        let mut start = 0;
        while start < n {
            let end = n.min(start + piece);
            let (q0, q1) = (start * per_key, end * per_key);
            let key_words = layout::offsets(&p, end - start).total;
            let parts = [(keys, start, end)];
            let staged = st.staged_parts(l, &parts);
            let (io_words, out_at) = io_layout(q1 - q0, words);
            st.with_buffers(l, [key_words, io_words], |staging, bufs| {
                let keys_at = place_keys(l, &parts, staged.as_deref(), staging, &mut bufs[0])?;
                l.upload(&mut bufs[1], &points[q0..q1])?;
                let io = l.address(&bufs[1]);
                // SAFETY: `place_keys` laid the keys out as `keys_at` says,
                // and the query buffer holds the `q1 − q0` points and room
                // for their outputs as `io_layout` places them.
                unsafe { launch_eval(l, aes, &keys_at, (io, io + 8 * u64_of(out_at)), per_key) }?;
                let out = &mut out[q0 * words..q1 * words];
                download_outputs(l, &bufs[1], out_at, staging, out)
            })?;
            start = end;
        }
        Ok(())
    }

    fn full_domain_device(&self, keys: &KeyBatch<'_>, out: &mut [u64]) -> Result<(), CudaError> {
        let l = &self.launcher;
        let p = keys.params();
        let (levels, k) = (p.levels(), p.domain().bits());
        let nodes = 1usize << levels;
        let size = 1usize << k;
        let mut st = self.lock();
        let aes = st.aes(l)?;
        let unit = layout::words_per_key(&p) + 4 * nodes + size;
        let piece = (st.pool.words_for_work(0) / unit).max(1);
        let n = keys.count();
        let mut start = 0;
        while start < n {
            let end = n.min(start + piece);
            let c = end - start;
            let words = [
                layout::offsets(&p, c).total,
                2 * nodes * c,
                2 * nodes * c,
                size * c,
            ];
            st.with_buffers(l, words, |staging, bufs| {
                let t = std::time::Instant::now();
                let at = layout::transpose(keys, start, end, staging);
                l.host_phase(Phase::Pack, t);
                l.upload(&mut bufs[0], staging)?;
                l.upload(&mut bufs[1], &staging[at.roots..at.roots + 2 * c])?;
                let base = l.address(&bufs[0]);
                let (mut src, mut dst) = (1, 2);
                for level in 0..levels {
                    let args = [
                        Arg::Ptr(aes),
                        Arg::Ptr(base + 8 * u64_of(at.cw)),
                        Arg::Ptr(l.address(&bufs[src])),
                        Arg::Ptr(l.address(&bufs[dst])),
                        Arg::U64(u64_of(c)),
                        Arg::U32(level),
                    ];
                    let dims = grid_line(l, c << level);
                    // SAFETY: `suffuse_dpf_level`'s list; `src` holds 2^level
                    // seeds per key (two words each) and `dst` room for twice
                    // as many, both buffers 2·2^levels·c words long.
                    unsafe { l.launch(Kernel::DpfLevel, dims, &args) }?;
                    (src, dst) = (dst, src);
                }
                let leaves = (base + 8 * u64_of(at.leaf), l.address(&bufs[src]));
                let args = leaves_args(keys, aes, leaves, l.address(&bufs[3]), c)?;
                // SAFETY: `suffuse_dpf_leaves`'s list; the seeds buffer holds
                // 2^levels leaf seeds per key and the output 2^k words per key.
                unsafe { l.launch(Kernel::DpfLeaves, grid_line(l, c * nodes), &args) }?;
                l.download(&bufs[3], &mut out[start * size..end * size])
            })?;
            start = end;
        }
        Ok(())
    }

    pub(crate) fn generate_device(
        &self,
        batch: &GenBatch<'_>,
        key0: &mut [u8],
        key1: &mut [u8],
    ) -> Result<(), CudaError> {
        let l = &self.launcher;
        let p = batch.params();
        let len = p.key_len();
        let draws = p.gen_random_words();
        let words = p.output().words();
        let mut st = self.lock();
        let aes = st.aes(l)?;
        let unit = 5 + words + draws + len.div_ceil(8) + 1;
        let piece = (st.pool.words_for_work(0) / unit).max(1);
        let n = batch.count();
        let mut start = 0;
        while start < n {
            let end = n.min(start + piece);
            let part = batch.slice(start, end);
            let c = end - start;
            let out_words = (c * len).div_ceil(8);
            st.with_buffers(l, [c * (5 + words + draws), out_words], |staging, bufs| {
                stage_gen_inputs(staging, &part);
                l.upload(&mut bufs[0], staging)?;
                let io = (l.address(&bufs[0]), l.address(&bufs[1]));
                let args = gen_args(&p, aes, io, c)?;
                // SAFETY: `suffuse_fss_gen`'s list; the input buffer holds c
                // α, c·words β, 4c root words and c·draws random words at
                // the offsets passed, and the output buffer c·key_len bytes.
                unsafe { l.launch(Kernel::FssGen, grid_line(l, c), &args) }?;
                // The kernel wrote each key's bytes in order, so the words'
                // little-endian bytes are P0's keys as they are. The
                // launcher copies them out on every core, which also faults
                // in untouched pages in parallel.
                l.download_bytes(&bufs[1], &mut key0[start * len..end * len])
            })?;
            start = end;
        }
        // The device's part is done: the copies below run without the lock,
        // so that other callers' device work goes on meanwhile.
        drop(st);
        let t = std::time::Instant::now();
        p1_keys(batch, key0, key1);
        l.host_phase(Phase::Unpack, t);
        Ok(())
    }

    /// Hashes `blocks` on the device; on failure, how many leading blocks
    /// were already hashed, with the error.
    pub(crate) fn hash_device(
        &self,
        d: Domain,
        blocks: &mut [Block],
    ) -> Result<(), (usize, CudaError)> {
        let l = &self.launcher;
        let mut st = self.lock();
        let aes = st.aes(l).map_err(|e| (0, e))?;
        let piece = (st.pool.words_for_work(0) / 2).max(1);
        let mut done = 0;
        for part in blocks.chunks_mut(piece) {
            st.with_buffers(l, [2 * part.len()], |staging, bufs| {
                staging.clear();
                staging.extend(part.iter().flat_map(|b| word_of(*b)));
                l.upload(&mut bufs[0], staging)?;
                let args = [
                    Arg::Ptr(aes),
                    Arg::Ptr(l.address(&bufs[0])),
                    Arg::U64(u64_of(part.len())),
                    Arg::U32(domain_index(d)),
                ];
                // SAFETY: `suffuse_hash`'s list; the buffer holds the
                // `part.len()` blocks, two words each.
                unsafe { l.launch(Kernel::Hash, grid_line(l, part.len()), &args) }?;
                l.download(&bufs[0], staging)?;
                for (b, w) in part.iter_mut().zip(staging.chunks(2)) {
                    *b = block_of(w[0], w[1]);
                }
                Ok(())
            })
            .map_err(|e| (done, e))?;
            done += part.len();
        }
        Ok(())
    }

    pub(crate) fn matmul_device(
        &self,
        shape: &MatShape,
        a: &[u64],
        b: &[u64],
        c: &mut [u64],
    ) -> Result<(), CudaError> {
        let mut st = self.lock();
        self.matmul_with(&mut st, shape, a, Operand::Host(b), c)
    }

    /// The products of `shape`, in pieces of whole batches that fit the
    /// budget, with `b` from the host or already on the device.
    pub(crate) fn matmul_with(
        &self,
        st: &mut State<Timed<L>>,
        shape: &MatShape,
        a: &[u64],
        b: Operand<'_>,
        c: &mut [u64],
    ) -> Result<(), CudaError> {
        let l = &self.launcher;
        let MatShape { m, k, n, .. } = *shape;
        let (pa, pb, pc) = (m * k, k * n, m * n);
        let copied_b = if matches!(b, Operand::Host(_)) { pb } else { 0 };
        let piece = (st.pool.words_for_work(0) / (pa + copied_b + pc).max(1)).max(1);
        let mut t = 0;
        while t < shape.batches {
            let end = shape.batches.min(t + piece);
            let bt = end - t;
            st.with_buffers(l, [bt * pa, bt * copied_b, bt * pc], |_, bufs| {
                l.upload(&mut bufs[0], &a[t * pa..end * pa])?;
                let b_at = match b {
                    Operand::Host(words) => {
                        l.upload(&mut bufs[1], &words[t * pb..end * pb])?;
                        l.address(&bufs[1])
                    }
                    Operand::Device(at) => at + 8 * u64_of(t * pb),
                };
                if shape.accumulate {
                    l.upload(&mut bufs[2], &c[t * pc..end * pc])?;
                }
                let args = [
                    Arg::Ptr(l.address(&bufs[0])),
                    Arg::Ptr(b_at),
                    Arg::Ptr(l.address(&bufs[2])),
                    Arg::U64(u64_of(bt)),
                    Arg::U64(u64_of(m)),
                    Arg::U64(u64_of(k)),
                    Arg::U64(u64_of(n)),
                    Arg::U32(u32::from(shape.transpose_b)),
                    Arg::U32(u32::from(shape.accumulate)),
                ];
                // SAFETY: `suffuse_matmul`'s list; the buffers hold bt
                // products' A (m·k) and C (m·n) words, and B's address holds
                // bt products' k·n words (copied here or resident).
                unsafe { l.launch(Kernel::Matmul, matmul_dims(m, n, bt), &args) }?;
                l.download(&bufs[2], &mut c[t * pc..end * pc])
            })?;
            t = end;
        }
        Ok(())
    }
}

/// Where a matrix operand is: in host memory, to be copied, or on the
/// device already.
#[derive(Clone, Copy)]
pub(crate) enum Operand<'a> {
    /// Host words, copied for the call.
    Host(&'a [u64]),
    /// A device address holding the words.
    Device(u64),
}

/// The grid of `bt` products of `m × n` outputs: one block per tile.
pub(crate) fn matmul_dims(m: usize, n: usize, bt: usize) -> Dims {
    let tiles = |x: usize| {
        u32::try_from(u64_of(x).div_ceil(u64::from(TILE)))
            .unwrap_or(u32::MAX)
            .max(1)
    };
    Dims {
        grid: [
            tiles(n).min(i32::MAX as u32),
            tiles(m).min(GRID_YZ),
            u32::try_from(bt).unwrap_or(u32::MAX).clamp(1, GRID_YZ),
        ],
        block: [TILE, TILE, 1],
        shared_bytes: 2 * TILE * TILE * 8,
    }
}

impl<L: Launcher> Hasher for CudaEval<L> {
    /// On the device from [`DEVICE_HASH_MIN`](crate::DEVICE_HASH_MIN)
    /// blocks up, on the host below. A device failure falls back to the
    /// host's AES, which computes the same hash, and is recorded
    /// ([`CudaEval::last_failure`]): this method cannot return an error.
    fn hash_many(&self, d: Domain, blocks: &mut [Block]) -> u64 {
        if blocks.len() < self.device_hash_min.max(1) {
            return self.host.hash_many(d, blocks);
        }
        if let Err((done, e)) = self.hash_device(d, blocks) {
            let _ = self.failed(e);
            self.host.hash_many(d, &mut blocks[done..]);
        }
        u64_of(blocks.len())
    }
}

impl<L: Launcher> BatchEval for CudaEval<L> {
    fn name(&self) -> &'static str {
        self.launcher.kind()
    }

    fn aes_path(&self) -> &'static str {
        "t-tables (shared memory)"
    }

    fn device(&self) -> Option<&str> {
        Some(self.launcher.device_name())
    }

    fn device_peak_bytes(&self) -> Option<u64> {
        Some(u64_of(self.peak_memory()))
    }

    fn device_phases(&self, visit: &mut dyn FnMut(&'static str, f64)) {
        for (name, s) in self.phase_seconds() {
            visit(name, s);
        }
    }

    /// A GPU wants millions of elements per launch.
    fn preferred_batch(&self) -> usize {
        1 << 22
    }

    fn eval(
        &self,
        keys: &KeyBatch<'_>,
        points: &[u64],
        out: &mut [u64],
    ) -> Result<EvalStats, Error> {
        let words = keys.params().output().words();
        if Some(out.len()) != points.len().checked_mul(words) {
            return Err(Error::BufferLength);
        }
        let per_key = keys.points_per_key(points.len())?;
        if points.is_empty() {
            return Ok(EvalStats::default());
        }
        self.eval_device(keys, per_key, points, out)
            .map_err(|e| self.failed(e))?;
        let aes_calls = keys.params().aes_per_eval() * u64_of(points.len());
        Ok(EvalStats { aes_calls })
    }

    /// Jobs with the same params, party and points per key (a step's
    /// chunks of one key slot) go to the device together.
    fn eval_many(&self, jobs: &mut [EvalJob<'_>]) -> Result<EvalStats, Error> {
        let mut stats = EvalStats::default();
        let mut start = 0;
        while start < jobs.len() {
            let first = &jobs[start];
            let (p, party) = (first.keys.params(), first.keys.party());
            let words = p.output().words();
            if Some(first.out.len()) != first.points.len().checked_mul(words) {
                return Err(Error::BufferLength);
            }
            let per_key = first.keys.points_per_key(first.points.len())?;
            let mut end = start + 1;
            while end < jobs.len() {
                let j = &jobs[end];
                let same = j.keys.params() == p
                    && j.keys.party() == party
                    && Some(j.out.len()) == j.points.len().checked_mul(words)
                    && j.keys.points_per_key(j.points.len()) == Ok(per_key);
                if !same {
                    break;
                }
                end += 1;
            }
            let group = &mut jobs[start..end];
            let queries: usize = group.iter().map(|j| j.points.len()).sum();
            if per_key > 0 && queries > 0 {
                self.eval_gathered(group, per_key)
                    .map_err(|e| self.failed(e))?;
            }
            stats.aes_calls += p.aes_per_eval() * u64_of(queries);
            start = end;
        }
        Ok(stats)
    }

    fn gathers(&self) -> bool {
        true
    }

    /// Copies the section to the device ahead of use; a failure is
    /// recorded and the section's keys take the host path.
    fn stage(&self, bytes: &[u8]) {
        if let Err(e) = self.stage_section(bytes) {
            let _ = self.failed(e);
        }
    }

    fn unstage(&self, bytes: &[u8]) {
        self.unstage_section(Some(bytes));
    }

    fn eval_full_domain(&self, keys: &KeyBatch<'_>, out: &mut [u64]) -> Result<EvalStats, Error> {
        let p = keys.params();
        let n = keys.count();
        let k = p.domain().bits();
        if p.kind() != Kind::Dpf || n == 0 || k > 40 || Some(out.len()) != n.checked_mul(1 << k) {
            // Serial's checks give the same typed errors for every misuse.
            return full_domain_each(&self.host, keys, out);
        }
        self.full_domain_device(keys, out)
            .map_err(|e| self.failed(e))?;
        let aes_calls = p.aes_per_full_domain() * u64_of(n);
        Ok(EvalStats { aes_calls })
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
        if n > 0 {
            self.generate_device(batch, key0, key1)
                .map_err(|e| self.failed(e))?;
        }
        let aes_calls = batch.params().aes_per_gen() * u64_of(n);
        Ok(EvalStats { aes_calls })
    }

    fn matmul(&self, shape: &MatShape, a: &[u64], b: &[u64], c: &mut [u64]) -> Result<(), Error> {
        shape.check(a, b, c)?;
        if c.is_empty() {
            return Ok(());
        }
        self.matmul_device(shape, a, b, c)
            .map_err(|e| self.failed(e))
    }

    fn matmul_resident(
        &self,
        shape: &MatShape,
        a: &[u64],
        b: Resident<'_>,
        c: &mut [u64],
    ) -> Result<(), Error> {
        shape.check(a, b.words, c)?;
        if c.is_empty() {
            return Ok(());
        }
        self.matmul_resident_device(shape, a, &b, c)
            .map_err(|e| self.failed(e))
    }

    fn turned_matmul(
        &self,
        t: &Turned<'_>,
        a: &[u64],
        b: &[u64],
        c: &mut [u64],
    ) -> Result<(), Error> {
        t.check(a, b, c)?;
        if c.is_empty() {
            return Ok(());
        }
        self.turned_matmul_device(t, a, b, c)
            .map_err(|e| self.failed(e))
    }
}
