//! Matrix products over the ring ℤ/2^64.
//!
//! The parties multiply secret shares (uniform words) by public weights
//! (small signed fixed-point values, sign-extended to 64 bits) and, in
//! Beaver's protocol, shares by shares. Both are the same operation: every
//! entry of `C = A·B` is
//!
//! ```text
//! c[i][j] = Σ_p a[i][p] · b[p][j]   mod 2^64,
//! ```
//!
//! computed with wrapping multiplication and addition. Reduction mod 2^64 is
//! a ring homomorphism from ℤ, so the result does not depend on the order of
//! the sum or on how the inputs are represented (a weight −3 stored as
//! 2^64 − 3 multiplies as −3), which is what lets the blocked, vectorised and
//! threaded paths here agree bit for bit with [`matmul_naive`].
//!
//! # How it is fast
//!
//! Floating point is no use (a 53-bit mantissa loses the high bits), so the
//! multiply is the 64-bit integer one: `vpmullq` on AVX-512DQ, eight lanes
//! per instruction; on AVX2, three 32-bit `vpmuludq` per four lanes (`avx2`:
//! 4.0 GMAC/s on one Zen 3 core against 2.95 for scalar); or scalar
//! `imul`/`mul` elsewhere. None is cheap
//! (`vpmullq` is three µops with a 15-cycle latency on Intel cores), so a
//! product is compute-bound at a few multiply-adds per cycle and the layout
//! only has to keep the multiplier fed:
//!
//! - a register tile of `MR × NR` entries of `C` stays in registers for a
//!   whole `KC`-deep slice of the inner dimension;
//! - for each slice, a tile's columns of `B` are packed into `NR`-wide
//!   panels (`KC × NC`, in L2) and its rows of `A` into `MR`-row slivers
//!   (`MC × KC`, in L2); each panel then stays in L1 while the slivers
//!   stream past it. Packing is also what lets both layouts of `B` (`b` or
//!   `bᵀ`) feed the same kernel;
//! - tiles of `C` are rayon tasks in whatever pool the caller runs in,
//!   shaped so that the packing they repeat is smallest (`plan`).
//!
//! [`Path`] chooses the kernel once per process from the CPU's features.
//! The AVX-512 kernel is a short piece of assembly (see `avx512` for why);
//! everything around it, and the portable kernel, is generic Rust shared by
//! both paths.
//!
//! # Timing
//!
//! Every branch, loop bound and memory address depends only on `m`, `k`,
//! `n`, the path and the thread count, never on the values, and the 64-bit
//! multiplies used (`vpmullq`, `imul`) take the same time for every
//! operand on x86-64; so the running time says nothing about the shares.

use std::sync::OnceLock;

use rayon::prelude::*;
use suffuse_core::batch::Turned;

/// Depth of one packed panel of `B`: `KC × NR` words stay in L1 while the
/// slivers of `A` stream past.
const KC: usize = 256;

/// Below this many multiply-adds a product runs as one task: splitting it
/// would cost more in scheduling than it saves.
const PAR_MIN_MACS: usize = 1 << 18;

/// Tasks per thread: enough to balance uneven tiles and busy pools.
const TASKS_PER_THREAD: usize = 4;

/// Rows of `A` packed at a time: `MC × KC` words (256 KiB) stay in L2
/// while the panels of `B` pass over them.
const MC: usize = 128;

/// Most columns of `C` in one tile: its packed `KC × NC` block of `B`
/// (512 KiB) stays in L2 with the packed rows of `A` (current server cores
/// have 1–2 MiB of L2).
const NC: usize = 256;

/// A matrix operand, for errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operand {
    /// The left factor `a`.
    A,
    /// The right factor `b`.
    B,
    /// The right factor given transposed, `bt`.
    Bt,
    /// The output `c`.
    C,
}

impl core::fmt::Display for Operand {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Operand::A => "a",
            Operand::B => "b",
            Operand::Bt => "bt",
            Operand::C => "c",
        })
    }
}

/// Why a product was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LinalgError {
    /// A slice's length is not `rows × cols` for the shape given (or
    /// `rows × cols` overflows `usize`, which no slice can match).
    Shape {
        /// The slice at fault.
        operand: Operand,
        /// Rows it should have.
        rows: usize,
        /// Columns it should have.
        cols: usize,
        /// Its length.
        len: usize,
    },
}

impl core::fmt::Display for LinalgError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            LinalgError::Shape {
                operand,
                rows,
                cols,
                len,
            } => {
                write!(f, "`{operand}` should be a {rows}×{cols} matrix (")?;
                match rows.checked_mul(cols) {
                    Some(want) => write!(f, "{want} elements")?,
                    None => f.write_str("more elements than fit in memory")?,
                }
                write!(f, ") but has {len} elements")
            }
        }
    }
}

impl std::error::Error for LinalgError {}

/// How the right factor is laid out in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// `b` is `k × n`, row-major.
    B,
    /// `bt` is `n × k`, row-major (so `b` column-major).
    Bt,
}

/// A kernel this CPU can run. Holding one is the witness that its
/// instructions exist: the only constructors check the CPU's features.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Path(Kind);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// AVX-512F + AVX-512DQ: `vpmullq`, eight lanes.
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// AVX2: four lanes, each product from three 32-bit `vpmuludq`.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// Whatever the compilation target offers.
    Portable,
}

impl Path {
    /// The fastest path on this CPU, detected on the first call.
    pub fn detect() -> Path {
        static DETECTED: OnceLock<Path> = OnceLock::new();
        *DETECTED.get_or_init(|| Path::available()[0])
    }

    /// Every path this CPU can run, fastest first; for tests and benchmarks
    /// that compare them.
    pub fn available() -> Vec<Path> {
        let mut paths = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512dq")
            {
                paths.push(Path(Kind::Avx512));
            }
            if std::is_x86_feature_detected!("avx2") {
                paths.push(Path(Kind::Avx2));
            }
        }
        paths.push(Path(Kind::Portable));
        paths
    }

    /// The portable path, which every CPU runs.
    pub const fn portable() -> Path {
        Path(Kind::Portable)
    }

    /// The path's name for reports.
    pub fn name(self) -> &'static str {
        match self.0 {
            #[cfg(target_arch = "x86_64")]
            Kind::Avx512 => "avx512",
            #[cfg(target_arch = "x86_64")]
            Kind::Avx2 => "avx2",
            Kind::Portable => "portable",
        }
    }

    /// The register tile, `(MR, NR)`: rows and columns of `C` per kernel call.
    fn tile(self) -> (usize, usize) {
        match self.0 {
            #[cfg(target_arch = "x86_64")]
            Kind::Avx512 => (AVX512_MR, AVX512_NR),
            #[cfg(target_arch = "x86_64")]
            Kind::Avx2 => (avx2::MR, avx2::NR),
            Kind::Portable => (PORTABLE_MR, PORTABLE_NR),
        }
    }

    /// [`matmul`] on this path.
    pub fn matmul(
        self,
        a: &[u64],
        b: &[u64],
        c: &mut [u64],
        m: usize,
        k: usize,
        n: usize,
    ) -> Result<(), LinalgError> {
        self.product(a, b, Layout::B, c, false, m, k, n)
    }

    /// [`matmul_acc`] on this path.
    pub fn matmul_acc(
        self,
        a: &[u64],
        b: &[u64],
        c: &mut [u64],
        m: usize,
        k: usize,
        n: usize,
    ) -> Result<(), LinalgError> {
        self.product(a, b, Layout::B, c, true, m, k, n)
    }

    /// [`matmul_bt`] on this path.
    pub fn matmul_bt(
        self,
        a: &[u64],
        bt: &[u64],
        c: &mut [u64],
        m: usize,
        k: usize,
        n: usize,
    ) -> Result<(), LinalgError> {
        self.product(a, bt, Layout::Bt, c, false, m, k, n)
    }

    /// `c += a·btᵀ` on this path: [`matmul_bt`] accumulating into `c`.
    pub fn matmul_bt_acc(
        self,
        a: &[u64],
        bt: &[u64],
        c: &mut [u64],
        m: usize,
        k: usize,
        n: usize,
    ) -> Result<(), LinalgError> {
        self.product(a, bt, Layout::Bt, c, true, m, k, n)
    }

    #[allow(clippy::too_many_arguments)] // the private core of the entry points
    fn product(
        self,
        a: &[u64],
        b: &[u64],
        layout: Layout,
        c: &mut [u64],
        accumulate: bool,
        m: usize,
        k: usize,
        n: usize,
    ) -> Result<(), LinalgError> {
        let b_shape = match layout {
            Layout::B => (Operand::B, k, n),
            Layout::Bt => (Operand::Bt, n, k),
        };
        check(Operand::A, a, m, k)?;
        check(b_shape.0, b, b_shape.1, b_shape.2)?;
        check(Operand::C, c, m, n)?;
        if m == 0 || n == 0 {
            return Ok(());
        }
        if k == 0 {
            if !accumulate {
                c.fill(0);
            }
            return Ok(());
        }
        let job = Job {
            a,
            b,
            layout,
            k,
            n,
            accumulate,
        };
        self.tiled(&job, c, m);
        Ok(())
    }

    /// Runs `job` over C (`m` rows) in tiles of the blocking `plan` picks,
    /// on rayon's threads when there are several tiles and threads.
    fn tiled(self, job: &Job<'_>, c: &mut [u64], m: usize) {
        let (k, n) = (job.k, job.n);
        let (mr, nr) = self.tile();
        let threads = rayon::current_num_threads();
        let (block_rows, block_cols) = plan(m, k, n, mr, nr, threads);
        if block_rows >= m && block_cols >= n {
            let mut tile = Tile {
                row0: 0,
                col0: 0,
                rows: c.chunks_exact_mut(n).collect(),
            };
            self.run(job, &mut tile);
            return;
        }
        let col_blocks = n.div_ceil(block_cols);
        let mut tiles: Vec<Tile<'_>> = (0..m.div_ceil(block_rows) * col_blocks)
            .map(|t| Tile {
                row0: t / col_blocks * block_rows,
                col0: t % col_blocks * block_cols,
                rows: Vec::with_capacity(block_rows),
            })
            .collect();
        // Split C into disjoint row segments, one list per tile, so tasks
        // write without sharing anything.
        for (r, row) in c.chunks_exact_mut(n).enumerate() {
            for (cb, segment) in row.chunks_mut(block_cols).enumerate() {
                tiles[r / block_rows * col_blocks + cb].rows.push(segment);
            }
        }
        if threads <= 1 {
            for mut tile in tiles {
                self.run(job, &mut tile);
            }
        } else {
            tiles
                .into_par_iter()
                .for_each(|mut tile| self.run(job, &mut tile));
        }
    }

    /// Runs one tile on this path's kernel.
    #[allow(unsafe_code)]
    fn run(self, job: &Job<'_>, tile: &mut Tile<'_>) {
        match self.0 {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a `Path(Kind::Avx512)` is only built by `available`,
            // after checking AVX-512F and AVX-512DQ.
            Kind::Avx512 => unsafe { tile_avx512(job, tile) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a `Path(Kind::Avx2)` is only built by `available`,
            // after checking AVX2.
            Kind::Avx2 => unsafe { tile_avx2(job, tile) },
            Kind::Portable => tile_portable(job, tile),
        }
    }
}

/// `c = a·b mod 2^64`: `a` is `m × k`, `b` is `k × n`, `c` is `m × n`, all
/// row-major; `c` is overwritten.
///
/// Every entry is `c[i][j] = Σ_p a[i][p]·b[p][j]` in wrapping 64-bit
/// arithmetic, which is exact in ℤ/2^64: shares and sign-extended
/// fixed-point weights multiply as ring elements. Runs on the fastest
/// [`Path`] and on the threads of the rayon pool it is called in.
///
/// # Errors
/// [`LinalgError::Shape`] if a slice's length does not match the shape.
pub fn matmul(
    a: &[u64],
    b: &[u64],
    c: &mut [u64],
    m: usize,
    k: usize,
    n: usize,
) -> Result<(), LinalgError> {
    Path::detect().matmul(a, b, c, m, k, n)
}

/// `c += a·b mod 2^64`: as [`matmul`], but adds the product into `c`.
///
/// # Errors
/// [`LinalgError::Shape`] if a slice's length does not match the shape.
pub fn matmul_acc(
    a: &[u64],
    b: &[u64],
    c: &mut [u64],
    m: usize,
    k: usize,
    n: usize,
) -> Result<(), LinalgError> {
    Path::detect().matmul_acc(a, b, c, m, k, n)
}

/// `c = a·bᵀ mod 2^64`: `a` is `m × k`, `bt` is `n × k` (the right factor
/// transposed, as for `Q·Kᵀ`), `c` is `m × n`; `c` is overwritten.
///
/// `c[i][j] = Σ_p a[i][p]·bt[j][p]` in wrapping 64-bit arithmetic.
///
/// # Errors
/// [`LinalgError::Shape`] if a slice's length does not match the shape.
pub fn matmul_bt(
    a: &[u64],
    bt: &[u64],
    c: &mut [u64],
    m: usize,
    k: usize,
    n: usize,
) -> Result<(), LinalgError> {
    Path::detect().matmul_bt(a, bt, c, m, k, n)
}

/// The reference: `c = a·b mod 2^64` as the textbook triple loop. The test
/// oracle, and the baseline in `cargo xtask bench linalg`.
///
/// # Errors
/// [`LinalgError::Shape`] if a slice's length does not match the shape.
#[doc(hidden)]
pub fn matmul_naive(
    a: &[u64],
    b: &[u64],
    c: &mut [u64],
    m: usize,
    k: usize,
    n: usize,
) -> Result<(), LinalgError> {
    check(Operand::A, a, m, k)?;
    check(Operand::B, b, k, n)?;
    check(Operand::C, c, m, n)?;
    for i in 0..m {
        for j in 0..n {
            let mut sum = 0u64;
            for p in 0..k {
                sum = sum.wrapping_add(a[i * k + p].wrapping_mul(b[p * n + j]));
            }
            c[i * n + j] = sum;
        }
    }
    Ok(())
}

/// Runs `f` on a new rayon pool of `threads` threads, so that the products
/// it makes use exactly that many; for benchmarks that measure scaling.
///
/// # Errors
/// If rayon cannot build the pool.
#[doc(hidden)]
pub fn on_threads<R: Send>(
    threads: usize,
    f: impl FnOnce() -> R + Send,
) -> Result<R, rayon::ThreadPoolBuildError> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build()?;
    Ok(pool.install(f))
}

fn check(operand: Operand, s: &[u64], rows: usize, cols: usize) -> Result<(), LinalgError> {
    if rows.checked_mul(cols) == Some(s.len()) {
        Ok(())
    } else {
        Err(LinalgError::Shape {
            operand,
            rows,
            cols,
            len: s.len(),
        })
    }
}

/// Chooses the tile of `C` one task computes: `(rows, cols)`, multiples of
/// the register tile. The thread split comes from [`split`]; its columns are
/// then capped at [`NC`] (rounded down to whole panels), which also cuts a
/// one-thread product into cache-sized tiles.
fn plan(m: usize, k: usize, n: usize, mr: usize, nr: usize, threads: usize) -> (usize, usize) {
    let (rows, cols) = split(m, k, n, mr, nr, threads);
    (rows, cols.min(NC.max(nr) / nr * nr))
}

/// Splits `C` into about [`TASKS_PER_THREAD`] blocks per thread, or not at
/// all for one thread or a small product.
///
/// Each task packs the rows of `A` and the columns of `B` it needs, so a
/// grid of `r × c` tasks packs `A` `c` times and `B` `r` times: `k·(c·m +
/// r·n)` words. Among grids with the number of tasks wanted (or as close as
/// the shape allows), the one that copies least wins; for the usual
/// `m = 128` against wide weights that means column blocks only.
fn split(m: usize, k: usize, n: usize, mr: usize, nr: usize, threads: usize) -> (usize, usize) {
    let macs = m.saturating_mul(k).saturating_mul(n);
    if threads <= 1 || macs < PAR_MIN_MACS {
        return (m, n);
    }
    let tasks = (threads * TASKS_PER_THREAD).min(macs / (PAR_MIN_MACS / 4));
    let panels = n.div_ceil(nr);
    let slivers = m.div_ceil(mr);
    let copied = |r: usize, c: usize| c.saturating_mul(m).saturating_add(r.saturating_mul(n));
    let (row_blocks, col_blocks) = (1..=slivers.min(tasks))
        .map(|r| (r, tasks.div_ceil(r).min(panels)))
        .min_by_key(|&(r, c)| (tasks.saturating_sub(r * c), copied(r, c)))
        .unwrap_or((1, 1));
    let rows = slivers.div_ceil(row_blocks) * mr;
    let cols = panels.div_ceil(col_blocks) * nr;
    (rows, cols)
}

/// The inputs of one product, shared by its tasks.
struct Job<'a> {
    a: &'a [u64],
    b: &'a [u64],
    layout: Layout,
    k: usize,
    n: usize,
    accumulate: bool,
}

/// One task's part of `C`: its rows, each the segment of columns
/// `col0..col0 + rows[i].len()` of row `row0 + i`.
impl Path {
    /// Row `i` of a product whose weights turn with each row
    /// ([`Turned::row`]), compiled for this path's instructions: the
    /// row's loop over its turned columns vectorises with them (eight
    /// `vpmullq` lanes on AVX-512DQ).
    #[allow(unsafe_code)]
    pub fn turned_row(self, t: &Turned<'_>, i: usize, a: &[u64], b: &[u64], c: &mut [u64]) {
        match self.0 {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a `Path(Kind::Avx512)` is only built by `available`,
            // after checking AVX-512F and AVX-512DQ.
            Kind::Avx512 => unsafe { turned_row_avx512(t, i, a, b, c) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a `Path(Kind::Avx2)` is only built by `available`,
            // after checking AVX2.
            Kind::Avx2 => unsafe { turned_row_avx2(t, i, a, b, c) },
            Kind::Portable => t.row(i, a, b, c),
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq")]
fn turned_row_avx512(t: &Turned<'_>, i: usize, a: &[u64], b: &[u64], c: &mut [u64]) {
    t.row(i, a, b, c);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn turned_row_avx2(t: &Turned<'_>, i: usize, a: &[u64], b: &[u64], c: &mut [u64]) {
    t.row(i, a, b, c);
}

struct Tile<'c> {
    row0: usize,
    col0: usize,
    rows: Vec<&'c mut [u64]>,
}

#[cfg(target_arch = "x86_64")]
const AVX512_MR: usize = 8;
#[cfg(target_arch = "x86_64")]
const AVX512_NR: usize = 16;
const PORTABLE_MR: usize = 4;
const PORTABLE_NR: usize = 4;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq")]
fn tile_avx512(job: &Job<'_>, tile: &mut Tile<'_>) {
    tile_generic::<AVX512_MR, AVX512_NR>(job, tile, |a, b| avx512::kernel(a, b));
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn tile_avx2(job: &Job<'_>, tile: &mut Tile<'_>) {
    tile_generic::<{ avx2::MR }, { avx2::NR }>(job, tile, |a, b| avx2::kernel(a, b));
}

fn tile_portable(job: &Job<'_>, tile: &mut Tile<'_>) {
    tile_generic::<PORTABLE_MR, PORTABLE_NR>(job, tile, kernel);
}

/// Computes one tile, in the classic order: for each `KC` slice of the
/// inner dimension, pack the tile's columns of `B` (`KC × cols`, in L2);
/// for each `MC` rows, pack those rows of `A` (`MC × KC`, in L2); then run
/// every `MR`-row sliver of `A` against each `NR`-column panel of `B`, which
/// stays in L1 across the slivers. Inlined into each `#[target_feature]`
/// wrapper so that the packing and write-back are compiled for its
/// instructions.
#[inline(always)]
fn tile_generic<const MR: usize, const NR: usize>(
    job: &Job<'_>,
    tile: &mut Tile<'_>,
    kernel: impl Fn(&[[u64; MR]], &[[u64; NR]]) -> [[u64; NR]; MR],
) {
    let k = job.k;
    let rows = tile.rows.len();
    let cols = tile.rows.first().map_or(0, |r| r.len());
    let depth = KC.min(k);
    let panels = cols.div_ceil(NR);
    let mut b_pack = vec![[0u64; NR]; panels * depth];
    let mut a_pack = vec![[0u64; MR]; MC.min(rows).div_ceil(MR) * depth];
    for p0 in (0..k).step_by(KC) {
        let kc = KC.min(k - p0);
        let overwrite = p0 == 0 && !job.accumulate;
        let b_pack = &mut b_pack[..panels * kc];
        pack_b(job, p0, tile.col0, cols, kc, b_pack);
        for i0 in (0..rows).step_by(MC) {
            let mc = MC.min(rows - i0);
            let a_pack = &mut a_pack[..mc.div_ceil(MR) * kc];
            for (s, sliver) in a_pack.chunks_exact_mut(kc).enumerate() {
                let r0 = tile.row0 + i0 + s * MR;
                pack_a(job.a, k, r0, MR.min(mc - s * MR), p0, sliver);
            }
            for (j, panel) in b_pack.chunks_exact(kc).enumerate() {
                let (j0, nr) = (j * NR, NR.min(cols - j * NR));
                for (s, sliver) in a_pack.chunks_exact(kc).enumerate() {
                    let acc = kernel(sliver, panel);
                    let c_rows = &mut tile.rows[i0 + s * MR..i0 + mc];
                    for (row, acc) in c_rows.iter_mut().zip(&acc) {
                        let out = &mut row[j0..j0 + nr];
                        if overwrite {
                            out.copy_from_slice(&acc[..nr]);
                        } else {
                            for (c, x) in out.iter_mut().zip(&acc[..nr]) {
                                *c = c.wrapping_add(*x);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Copies `A[r0..r0 + mr][p0..p0 + kc]` into `sliver` transposed, as `kc`
/// columns of `MR`, zero beyond row `mr`, so the kernel reads one contiguous
/// stream.
#[inline(always)]
fn pack_a<const MR: usize>(
    a: &[u64],
    k: usize,
    r0: usize,
    mr: usize,
    p0: usize,
    sliver: &mut [[u64; MR]],
) {
    let kc = sliver.len();
    for i in 0..MR {
        if i < mr {
            let src = &a[(r0 + i) * k + p0..][..kc];
            for (col, &x) in sliver.iter_mut().zip(src) {
                col[i] = x;
            }
        } else {
            for col in sliver.iter_mut() {
                col[i] = 0;
            }
        }
    }
}

/// Copies `B[p0..p0 + kc][j0..j0 + cols]` into `out` as consecutive
/// panels of `kc` rows of `NR`, zero beyond column `cols`, whichever layout
/// `B` has. Rows of `b` (or of `bt`) are read in order, so the copy streams.
#[inline(always)]
fn pack_b<const NR: usize>(
    job: &Job<'_>,
    p0: usize,
    j0: usize,
    cols: usize,
    kc: usize,
    out: &mut [[u64; NR]],
) {
    match job.layout {
        Layout::B => {
            let n = job.n;
            for p in 0..kc {
                let src = &job.b[(p0 + p) * n + j0..][..cols];
                // Whole panels as fixed-size copies, which LLVM inlines as
                // vector moves; a slice copy of variable length would call
                // memmove for every 128 bytes.
                let (whole, rest) = src.as_chunks::<NR>();
                for (j, chunk) in whole.iter().enumerate() {
                    out[j * kc + p] = *chunk;
                }
                if !rest.is_empty() {
                    let row = &mut out[whole.len() * kc + p];
                    row[..rest.len()].copy_from_slice(rest);
                    row[rest.len()..].fill(0);
                }
            }
        }
        Layout::Bt => {
            let k = job.k;
            for (j, panel) in out.chunks_exact_mut(kc).enumerate() {
                for lane in 0..NR {
                    let col = j * NR + lane;
                    if col < cols {
                        let src = &job.b[(j0 + col) * k + p0..][..kc];
                        for (row, &x) in panel.iter_mut().zip(src) {
                            row[lane] = x;
                        }
                    } else {
                        for row in panel.iter_mut() {
                            row[lane] = 0;
                        }
                    }
                }
            }
        }
    }
}

/// The portable register tile: `Σ_p a[p][i]·b[p][j] mod 2^64` over a packed
/// sliver of `A` and a packed panel of `B`. `acc` is a local array of
/// constant shape and the loop has no bounds checks, so LLVM keeps `acc` in
/// registers (4 × 4 measured best for scalar `imul`: smaller tiles reload
/// more, larger ones spill more).
#[inline(always)]
fn kernel<const MR: usize, const NR: usize>(a: &[[u64; MR]], b: &[[u64; NR]]) -> [[u64; NR]; MR] {
    let mut acc = [[0u64; NR]; MR];
    for (x, y) in a.iter().zip(b) {
        for i in 0..MR {
            for j in 0..NR {
                acc[i][j] = acc[i][j].wrapping_add(x[i].wrapping_mul(y[j]));
            }
        }
    }
    acc
}

/// The AVX2 register tile. AVX2 has no 64-bit multiply, only
/// `vpmuludq` (32 × 32 → 64 bits, the low halves of each lane). With
/// `x = x₁·2^32 + x₀` and `y = y₁·2^32 + y₀`,
///
/// ```text
/// x·y ≡ x₀·y₀ + (x₁·y₀ + x₀·y₁)·2^32   (mod 2^64),
/// ```
///
/// and the shift is linear mod 2^64, so each entry keeps two sums over the
/// inner dimension, `Σ x₀·y₀` and `Σ (x₁·y₀ + x₀·y₁)`, and shifts the
/// second once at the end: three multiplies and three adds per four
/// products, no shift in the loop. `x₀` and `x₁` are broadcast as 32-bit
/// words (`vpmuludq` reads only the low word of each lane), `y₁` is one
/// shift per row of the panel. Each instruction takes the same time for
/// every operand.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use core::arch::x86_64::{
        __m256i, _mm256_add_epi64, _mm256_loadu_si256, _mm256_mul_epu32, _mm256_set1_epi32,
        _mm256_setzero_si256, _mm256_slli_epi64, _mm256_srli_epi64, _mm256_storeu_si256,
    };

    /// Rows of the tile: 2·MR accumulators, the panel row and its high
    /// halves, and the broadcasts fit in the 16 `ymm` registers.
    pub(super) const MR: usize = 4;
    /// Columns: one `ymm` of four lanes.
    pub(super) const NR: usize = 4;

    /// `Σ_p a[p][i]·b[p][j] mod 2^64` for `i < MR`, `j < NR`, over
    /// `min(a.len(), b.len())` steps.
    #[target_feature(enable = "avx2")]
    #[allow(unsafe_code)]
    pub(super) fn kernel(a: &[[u64; MR]], b: &[[u64; NR]]) -> [[u64; NR]; MR] {
        let mut low: [__m256i; MR] = [_mm256_setzero_si256(); MR];
        let mut cross: [__m256i; MR] = [_mm256_setzero_si256(); MR];
        for (x, y) in a.iter().zip(b) {
            // SAFETY: `y` is four u64s, 32 readable bytes; unaligned load.
            let y0 = unsafe { _mm256_loadu_si256(y.as_ptr().cast()) };
            let y1 = _mm256_srli_epi64::<32>(y0);
            // Each u64 of `x` as its two 32-bit words, low first (x86 is
            // little-endian): broadcast straight from memory.
            let words = x.as_ptr().cast::<i32>();
            for i in 0..MR {
                // SAFETY: words 2i and 2i + 1 lie inside `x` (2·MR words),
                // aligned as u64s are.
                let (x0, x1) = unsafe { (words.add(2 * i).read(), words.add(2 * i + 1).read()) };
                let (x0, x1) = (_mm256_set1_epi32(x0), _mm256_set1_epi32(x1));
                low[i] = _mm256_add_epi64(low[i], _mm256_mul_epu32(x0, y0));
                let c = _mm256_add_epi64(_mm256_mul_epu32(x1, y0), _mm256_mul_epu32(x0, y1));
                cross[i] = _mm256_add_epi64(cross[i], c);
            }
        }
        let mut out = [[0u64; NR]; MR];
        for i in 0..MR {
            let v = _mm256_add_epi64(low[i], _mm256_slli_epi64::<32>(cross[i]));
            // SAFETY: `out[i]` is four u64s, 32 writable bytes.
            unsafe { _mm256_storeu_si256(out[i].as_mut_ptr().cast(), v) };
        }
        out
    }
}

/// The AVX-512 register tile, in assembly.
///
/// `vpmullq` has a false dependency on its destination register on recent
/// Intel cores (LLVM models it as `false-deps-mullq`, but works around it
/// only when tuning for those CPUs): a multiply waits for whatever last
/// wrote the register it overwrites. Compiled for generic x86-64, LLVM
/// reuses one or two scratch registers for every product, which chains the
/// multiplies of a step through their 15-cycle latency. Written with
/// intrinsics, this kernel ran at 2.9 GMAC/s on the development machine (a
/// Sapphire Rapids VM), or at 9 GMAC/s when an unrelated change moved the
/// register allocation. Here every product goes to a register just cleared
/// by a zero idiom (`vpxord r, r, r`), which the core knows does not depend
/// on the old value, so no multiply waits on another: 9.6 GMAC/s.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx512 {
    use super::{AVX512_MR as MR, AVX512_NR as NR};

    /// One row of the tile: broadcast `a[p][i]` into `x`, multiply it by the
    /// two vectors of `b[p]` (zmm16, zmm17) into freshly zeroed `t` and `u`,
    /// and add those to the row's accumulators `c0` and `c1`.
    #[rustfmt::skip]
    macro_rules! row {
        ($off:literal, $x:literal, $t:literal, $u:literal, $c0:literal, $c1:literal) => {
            concat!(
                "vpbroadcastq zmm", $x, ", qword ptr [{a} + ", $off, "]\n",
                "vpxord zmm", $t, ", zmm", $t, ", zmm", $t, "\n",
                "vpmullq zmm", $t, ", zmm16, zmm", $x, "\n",
                "vpaddq zmm", $c0, ", zmm", $c0, ", zmm", $t, "\n",
                "vpxord zmm", $u, ", zmm", $u, ", zmm", $u, "\n",
                "vpmullq zmm", $u, ", zmm17, zmm", $x, "\n",
                "vpaddq zmm", $c1, ", zmm", $c1, ", zmm", $u, "\n",
            )
        };
    }

    /// `Σ_p a[p][i]·b[p][j] mod 2^64` for `i < 8`, `j < 16`, over
    /// `min(a.len(), b.len())` steps: 16 accumulators (zmm0–zmm15), each step
    /// two loads of `b`, eight broadcasts of `a` and sixteen `vpmullq`.
    #[target_feature(enable = "avx512f,avx512dq")]
    pub(super) fn kernel(a: &[[u64; MR]], b: &[[u64; NR]]) -> [[u64; NR]; MR] {
        const _: () = assert!(
            MR == 8 && NR == 16,
            "the assembly is written for an 8×16 tile"
        );
        let steps = a.len().min(b.len());
        if steps == 0 {
            return [[0; NR]; MR];
        }
        // Uninitialised: zeroing it first costs as much as the writes that
        // follow.
        let mut out = core::mem::MaybeUninit::<[[u64; NR]; MR]>::uninit();
        // SAFETY: the loop runs `steps` ≥ 1 times and step p reads the 64
        // bytes of `a[p]` and the 128 bytes of `b[p]`, both in bounds since
        // p < steps ≤ len; the stores write the 16 × 64 bytes of `out`.
        // AVX-512F/DQ are enabled for this function, which only runs on a
        // CPU that has them (see `Path`). Every register the code writes is
        // declared clobbered, and it touches no stack.
        unsafe {
            core::arch::asm!(
                "vpxorq zmm0, zmm0, zmm0",
                "vpxorq zmm1, zmm1, zmm1",
                "vpxorq zmm2, zmm2, zmm2",
                "vpxorq zmm3, zmm3, zmm3",
                "vpxorq zmm4, zmm4, zmm4",
                "vpxorq zmm5, zmm5, zmm5",
                "vpxorq zmm6, zmm6, zmm6",
                "vpxorq zmm7, zmm7, zmm7",
                "vpxorq zmm8, zmm8, zmm8",
                "vpxorq zmm9, zmm9, zmm9",
                "vpxorq zmm10, zmm10, zmm10",
                "vpxorq zmm11, zmm11, zmm11",
                "vpxorq zmm12, zmm12, zmm12",
                "vpxorq zmm13, zmm13, zmm13",
                "vpxorq zmm14, zmm14, zmm14",
                "vpxorq zmm15, zmm15, zmm15",
                ".p2align 5",
                "2:",
                "vmovdqu64 zmm16, [{b}]",
                "vmovdqu64 zmm17, [{b} + 64]",
                row!("0", "18", "22", "23", "0", "1"),
                row!("8", "19", "24", "25", "2", "3"),
                row!("16", "20", "26", "27", "4", "5"),
                row!("24", "21", "28", "29", "6", "7"),
                row!("32", "18", "22", "23", "8", "9"),
                row!("40", "19", "24", "25", "10", "11"),
                row!("48", "20", "26", "27", "12", "13"),
                row!("56", "21", "28", "29", "14", "15"),
                "add {a}, 64",
                "add {b}, 128",
                "dec {n}",
                "jnz 2b",
                "vmovdqu64 [{out}], zmm0",
                "vmovdqu64 [{out} + 64], zmm1",
                "vmovdqu64 [{out} + 128], zmm2",
                "vmovdqu64 [{out} + 192], zmm3",
                "vmovdqu64 [{out} + 256], zmm4",
                "vmovdqu64 [{out} + 320], zmm5",
                "vmovdqu64 [{out} + 384], zmm6",
                "vmovdqu64 [{out} + 448], zmm7",
                "vmovdqu64 [{out} + 512], zmm8",
                "vmovdqu64 [{out} + 576], zmm9",
                "vmovdqu64 [{out} + 640], zmm10",
                "vmovdqu64 [{out} + 704], zmm11",
                "vmovdqu64 [{out} + 768], zmm12",
                "vmovdqu64 [{out} + 832], zmm13",
                "vmovdqu64 [{out} + 896], zmm14",
                "vmovdqu64 [{out} + 960], zmm15",
                a = inout(reg) a.as_ptr() => _,
                b = inout(reg) b.as_ptr() => _,
                n = inout(reg) steps => _,
                out = in(reg) out.as_mut_ptr(),
                out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _,
                out("zmm12") _, out("zmm13") _, out("zmm14") _, out("zmm15") _,
                out("zmm16") _, out("zmm17") _, out("zmm18") _, out("zmm19") _,
                out("zmm20") _, out("zmm21") _, out("zmm22") _, out("zmm23") _,
                out("zmm24") _, out("zmm25") _, out("zmm26") _, out("zmm27") _,
                out("zmm28") _, out("zmm29") _,
                options(nostack),
            );
        }
        // SAFETY: the sixteen stores above wrote all 8 × 16 words.
        unsafe { out.assume_init() }
    }
}
