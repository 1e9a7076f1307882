//! [`BatchEval`], the accelerator boundary, and [`Serial`], its reference
//! implementation.
//!
//! Every heavy operation crosses this one trait, through slices only:
//!
//! | operation | method |
//! | --- | --- |
//! | DCF/DPF evaluation at public points | [`BatchEval::eval`] |
//! | DPF full-domain evaluation | [`BatchEval::eval_full_domain`] |
//! | PRG seed expansion (fixed-key AES hashes) | [`Hasher::hash_many`], a supertrait |
//! | batched key generation | [`BatchEval::generate`] |
//! | ring matrix products mod 2^64 | [`BatchEval::matmul`] |
//!
//! Implementations live outside core (`suffuse-accel-cpu`,
//! `suffuse-accel-cuda`) and must match [`Serial`] bit for bit; the shared
//! conformance harness in `suffuse-tests` checks every method. Because
//! [`Hasher`] is a supertrait, a `&dyn BatchEval` coerces to the
//! `&dyn Hasher` that core's seed expansion takes.

use crate::error::Error;
use crate::fss::{self, GenBatch, KeyBatch, Party};
use crate::phi::program::{self, Inputs, Program, Section};
use crate::prg::{FixedKeyAes, Hasher};

/// What an evaluation cost, counted where the work happened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EvalStats {
    /// AES block encryptions performed.
    pub aes_calls: u64,
}

impl core::ops::AddAssign for EvalStats {
    fn add_assign(&mut self, rhs: EvalStats) {
        self.aes_calls += rhs.aes_calls;
    }
}

/// The shape of `batches` independent ring products
/// `C_t (+)= A_t · B_t mod 2^64` (or `A_t · B_tᵀ`), all row-major and stored
/// one after another: `A_t` is `m × k`, `C_t` is `m × n`, and `B_t` is
/// `k × n`, or `n × k` when `transpose_b`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatShape {
    /// Independent products.
    pub batches: usize,
    /// Rows of `A` and `C`.
    pub m: usize,
    /// The inner dimension.
    pub k: usize,
    /// Columns of `C`.
    pub n: usize,
    /// `B` is given transposed (`n × k`), as for `Q·Kᵀ`.
    pub transpose_b: bool,
    /// Adds the product into `C` instead of overwriting it.
    pub accumulate: bool,
}

impl MatShape {
    /// Words of `A`, `B` and `C`, or `None` if one overflows `usize`.
    pub fn lens(&self) -> Option<[usize; 3]> {
        let per = |r: usize, c: usize| r.checked_mul(c)?.checked_mul(self.batches);
        Some([
            per(self.m, self.k)?,
            per(self.k, self.n)?,
            per(self.m, self.n)?,
        ])
    }

    /// Checks slice lengths against the shape.
    pub fn check(&self, a: &[u64], b: &[u64], c: &[u64]) -> Result<(), Error> {
        match self.lens() {
            Some(l) if l == [a.len(), b.len(), c.len()] => Ok(()),
            _ => Err(Error::BufferLength),
        }
    }
}

/// A product whose weights turn with each row ([`BatchEval::turned_matmul`]):
/// `C = A · B'_i` row by row, `A` is `m × k`, `B` is `k × n` and `C` is
/// `m × n`, all row-major, where row `i`'s weights `B'_i` equal `B` except in
/// the first `turned` columns, which come in pairs ([`Pairing`]): with `q`
/// the column paired with `j`,
///
/// ```text
/// B'_i[p][j] = (own[i][j]·B[p][j] + other[i][j]·B[p][q] + 2^(frac−1)) >> frac
/// ```
///
/// in signed 64-bit arithmetic (an arithmetic shift: rounded half up).
/// RoPE folded into a linear layer: `(own, other)` are a row's `(cos,
/// −sin)` at a pair's first column and `(cos, sin)` at its second. The
/// caller keeps `|own|, |other| ≤ 2^17` and the weights below 2^44 in
/// magnitude, so no sum overflows.
#[derive(Clone, Copy, Debug)]
pub struct Turned<'a> {
    /// Rows of `A` and `C`.
    pub m: usize,
    /// The inner dimension.
    pub k: usize,
    /// Columns of `B` and `C`.
    pub n: usize,
    /// Leading columns whose weights turn (at most `n`).
    pub turned: usize,
    /// Which columns are paired.
    pub pairing: Pairing,
    /// `[m × turned]`: each row's factor of a turned column's own word.
    pub own: &'a [u64],
    /// `[m × turned]`: each row's factor of its partner's word.
    pub other: &'a [u64],
    /// Fraction bits of the factors, rounded away (1 to 63).
    pub frac: u32,
}

/// How [`Turned`] pairs its columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pairing {
    /// `(2i, 2i + 1)`.
    Adjacent,
    /// `(i, i + w/2)` within each block of `w` columns.
    Halves(usize),
}

impl Turned<'_> {
    /// Checks the shape and slice lengths.
    pub fn check(&self, a: &[u64], b: &[u64], c: &[u64]) -> Result<(), Error> {
        let len = |r: usize, c: usize| r.checked_mul(c);
        let want = [
            len(self.m, self.k),
            len(self.k, self.n),
            len(self.m, self.n),
            len(self.m, self.turned),
            len(self.m, self.turned),
        ];
        let got = [a.len(), b.len(), c.len(), self.own.len(), self.other.len()];
        let sizes = want.iter().zip(got).all(|(w, g)| *w == Some(g));
        let block = match self.pairing {
            Pairing::Adjacent => 2,
            Pairing::Halves(w) => w,
        };
        let paired = block > 0 && block.is_multiple_of(2) && self.turned.is_multiple_of(block);
        if sizes && paired && self.turned <= self.n && (1..64).contains(&self.frac) {
            Ok(())
        } else {
            Err(Error::BufferLength)
        }
    }

    /// One turned weight: `(own·w + other·v + 2^(frac−1)) >> frac`.
    #[inline(always)]
    pub fn turn(w: u64, v: u64, own: u64, other: u64, frac: u32) -> u64 {
        let (w, v) = (w.cast_signed(), v.cast_signed());
        let (own, other) = (own.cast_signed(), other.cast_signed());
        let sum = own
            .wrapping_mul(w)
            .wrapping_add(other.wrapping_mul(v))
            .wrapping_add(1 << (frac - 1));
        (sum >> frac).cast_unsigned()
    }

    /// Row `i` of `C` from row `i` of `A` (`k` words): the loop every
    /// backend's row kernel runs, written so that compilers vectorise it
    /// (each pair's two columns side by side, or each block's two halves).
    #[inline(always)]
    pub fn row(&self, i: usize, a: &[u64], b: &[u64], c: &mut [u64]) {
        let (n, t, frac) = (self.n.max(1), self.turned, self.frac);
        let own = &self.own[i * t..(i + 1) * t];
        let other = &self.other[i * t..(i + 1) * t];
        c.fill(0);
        let (turned, plain) = c.split_at_mut(t);
        for (&x, w) in a.iter().zip(b.chunks_exact(n)) {
            let (wt, wp) = w.split_at(t);
            match self.pairing {
                Pairing::Adjacent => {
                    let pairs = turned.chunks_exact_mut(2).zip(wt.chunks_exact(2));
                    let factors = own.chunks_exact(2).zip(other.chunks_exact(2));
                    for ((o, w), (f, g)) in pairs.zip(factors) {
                        o[0] = o[0]
                            .wrapping_add(x.wrapping_mul(Self::turn(w[0], w[1], f[0], g[0], frac)));
                        o[1] = o[1]
                            .wrapping_add(x.wrapping_mul(Self::turn(w[1], w[0], f[1], g[1], frac)));
                    }
                }
                Pairing::Halves(width) => {
                    let blocks = turned.chunks_exact_mut(width).zip(wt.chunks_exact(width));
                    let factors = own.chunks_exact(width).zip(other.chunks_exact(width));
                    for ((o, w), (f, g)) in blocks.zip(factors) {
                        let h = width / 2;
                        let (o0, o1) = o.split_at_mut(h);
                        let (w0, w1) = w.split_at(h);
                        let (f0, f1) = f.split_at(h);
                        let (g0, g1) = g.split_at(h);
                        for j in 0..h {
                            o0[j] = o0[j].wrapping_add(
                                x.wrapping_mul(Self::turn(w0[j], w1[j], f0[j], g0[j], frac)),
                            );
                            o1[j] = o1[j].wrapping_add(
                                x.wrapping_mul(Self::turn(w1[j], w0[j], f1[j], g1[j], frac)),
                            );
                        }
                    }
                }
            }
            for (o, wj) in plain.iter_mut().zip(wp) {
                *o = o.wrapping_add(x.wrapping_mul(*wj));
            }
        }
    }
}

/// [`BatchEval::turned_matmul`] one row after another: the reference every
/// backend must match.
pub fn turned_reference(t: &Turned<'_>, a: &[u64], b: &[u64], c: &mut [u64]) -> Result<(), Error> {
    t.check(a, b, c)?;
    for (i, ci) in c.chunks_exact_mut(t.n.max(1)).enumerate() {
        t.row(i, &a[i * t.k..(i + 1) * t.k], b, ci);
    }
    Ok(())
}

/// One evaluation request of [`BatchEval::eval_many`]: `keys` at `points`,
/// into `out`, as [`BatchEval::eval`] takes them.
#[derive(Debug)]
pub struct EvalJob<'a> {
    /// The keys.
    pub keys: KeyBatch<'a>,
    /// The points, a whole number per key.
    pub points: &'a [u64],
    /// The outputs, as many as points.
    pub out: &'a mut [u64],
}

/// A public operand that stays the same for the life of a process, such as
/// a model's weight matrix: a backend with its own memory keeps it there
/// across calls instead of copying it for every product.
///
/// `id` names the contents: two operands with the same `id` must hold the
/// same words (the host derives it from the model's digest and the layer).
#[derive(Clone, Copy, Debug)]
pub struct Resident<'a> {
    /// What the words are, for the process's life.
    pub id: [u8; 16],
    /// The words.
    pub words: &'a [u64],
}

/// The accelerator boundary: every heavy operation of dealing and of the
/// online phase, over caller slices.
///
/// `Sync` because hosts share one backend across their threads.
pub trait BatchEval: Hasher + Sync {
    /// A short name for reports, such as `"serial"` or `"cpu"`.
    fn name(&self) -> &'static str;

    /// The AES implementation behind the hashes, for reports (`"aes-crate"`,
    /// `"aesni"`, `"vaes256"`, `"vaes512"`, ...).
    fn aes_path(&self) -> &'static str;

    /// The device the backend runs on, for reports; `None` for backends
    /// that run on the host's CPUs.
    fn device(&self) -> Option<&str> {
        None
    }

    /// The most device memory the backend has held at once so far, in
    /// bytes, for reports; `None` for backends without device memory.
    fn device_peak_bytes(&self) -> Option<u64> {
        None
    }

    /// Hands `visit` each phase of the backend's device work and the
    /// seconds spent in it so far (packing, copies, kernels, waits), for
    /// reports; backends without a device have none.
    fn device_phases(&self, visit: &mut dyn FnMut(&'static str, f64)) {
        let _ = visit;
    }

    /// Elements this backend wants per call to work at full speed: callers
    /// that can group work group at least this many (a CPU core wants
    /// thousands, a GPU millions). A hint; every size is accepted.
    fn preferred_batch(&self) -> usize;

    /// Evaluates each key at `points.len() / keys.count()` consecutive points:
    /// `out[q] = Eval(keys.key(q / per_key), points[q])`, points taken mod
    /// `2^k`. Bit outputs are 0 or 1; ring outputs are canonical words.
    fn eval(
        &self,
        keys: &KeyBatch<'_>,
        points: &[u64],
        out: &mut [u64],
    ) -> Result<EvalStats, Error>;

    /// Runs every job as [`BatchEval::eval`] does, as one call: a host
    /// gathers the evaluations of a whole step here (every chunk's keys for
    /// one key slot) so that a backend that wants large launches gets them.
    /// The default evaluates the jobs one after another.
    fn eval_many(&self, jobs: &mut [EvalJob<'_>]) -> Result<EvalStats, Error> {
        let mut stats = EvalStats::default();
        for job in jobs.iter_mut() {
            stats += self.eval(&job.keys, job.points, job.out)?;
        }
        Ok(stats)
    }

    /// Whether the host should gather a step's evaluations into
    /// [`BatchEval::eval_many`] calls rather than evaluate each chunk on its
    /// own (a GPU backend wants the former; CPUs are as fast either way).
    fn gathers(&self) -> bool {
        false
    }

    /// Announces key material that will be evaluated soon (a key section
    /// just read, ahead of its step): a backend with its own memory may
    /// start copying it there now, and later evaluate keys whose bytes lie
    /// in it from its copy. Keys are still passed to [`BatchEval::eval`] as
    /// usual; staging only changes where the backend reads them. The
    /// default does nothing.
    fn stage(&self, bytes: &[u8]) {
        let _ = bytes;
    }

    /// `bytes`, staged before, will not be evaluated again: the backend
    /// drops (and wipes) its copy. The default does nothing.
    fn unstage(&self, bytes: &[u8]) {
        let _ = bytes;
    }

    /// Evaluates each DPF key at every point of its domain:
    /// `out[i · 2^k + x] = Eval(keys.key(i), x)`.
    fn eval_full_domain(&self, keys: &KeyBatch<'_>, out: &mut [u64]) -> Result<EvalStats, Error>;

    /// Reads a public table at masked indices: key i is a DPF over L bits
    /// (`table.len() = 2^L`) and `points[i]` the opened index `u_i`, a
    /// public value; `out[i] = Σ_j table[(u_i − j) mod 2^L]·Eval(key i, j)`
    /// in Z_2^64 (the caller reduces to its ring). `domain` is scratch for
    /// a whole number of keys' full domains. The points steer slices, so
    /// they must be public; the default expands the keys chunk by chunk
    /// with [`BatchEval::eval_full_domain`] and sums (the test oracle, and
    /// the form for a backend whose full domains are fast where they are
    /// made); [`lookup_each`] sums each key's outputs as they are made.
    fn lookup(
        &self,
        keys: &KeyBatch<'_>,
        (points, table): (&[u64], &[u64]),
        domain: &mut [u64],
        out: &mut [u64],
    ) -> Result<EvalStats, Error> {
        let (n, size) = (keys.count(), table.len());
        let chunk = lookup_slots(keys, (points, table), domain, out)?;
        let mut stats = EvalStats::default();
        let mut at = 0;
        while at < n {
            let m = chunk.min(n - at);
            let d = &mut domain[..m * size];
            stats.aes_calls += self.eval_full_domain(&keys.slice(at, at + m), d)?.aes_calls;
            for (e, de) in d.chunks_exact(size).enumerate() {
                out[at + e] = crate::dpf::table_dot(table, points[at + e], 0, de);
            }
            at += m;
        }
        Ok(stats)
    }

    /// Runs `section` of a compiled Φ program over a batch for `party`
    /// ([`program::run`], whose contract this is): `out` gets the section's
    /// result, `cols` is at least [`Program::scratch_words`] words. The
    /// default is core's block-by-block evaluation on the calling thread.
    fn eval_phi(
        &self,
        prog: &Program,
        section: Section,
        party: Party,
        input: &Inputs<'_>,
        out: &mut [u64],
        cols: &mut [u64],
    ) -> Result<(), Error> {
        program::run(prog, section, party, input, out, cols)
    }

    /// Generates every key pair of `batch` into `key0` and `key1`
    /// (`count · key_len` bytes each, key-major), byte for byte what
    /// [`fss::generate`] writes; an empty `key1` asks for P0's keys only
    /// ([`fss::p1_keys_fit`]).
    fn generate(
        &self,
        batch: &GenBatch<'_>,
        key0: &mut [u8],
        key1: &mut [u8],
    ) -> Result<EvalStats, Error>;

    /// Ring matrix products mod 2^64 of shape `shape` (see [`MatShape`]);
    /// [`Error::BufferLength`] if a slice does not match it.
    fn matmul(&self, shape: &MatShape, a: &[u64], b: &[u64], c: &mut [u64]) -> Result<(), Error>;

    /// [`BatchEval::matmul`] with a `b` that the backend may keep in its
    /// own memory across calls ([`Resident`]). The default, right for
    /// backends that compute in host memory, is `matmul` itself.
    fn matmul_resident(
        &self,
        shape: &MatShape,
        a: &[u64],
        b: Resident<'_>,
        c: &mut [u64],
    ) -> Result<(), Error> {
        self.matmul(shape, a, b.words, c)
    }

    /// A product whose weights turn with each row ([`Turned`]);
    /// [`Error::BufferLength`] if a slice does not match the shape. The
    /// default is [`turned_reference`].
    fn turned_matmul(
        &self,
        t: &Turned<'_>,
        a: &[u64],
        b: &[u64],
        c: &mut [u64],
    ) -> Result<(), Error> {
        turned_reference(t, a, b, c)
    }
}

/// One evaluation at a time on the calling thread: each evaluation is a
/// dependent chain of AES calls. The reference every accelerator must match
/// and the baseline it is measured against.
#[derive(Debug, Default, Clone)]
pub struct Serial {
    aes: FixedKeyAes,
}

impl Serial {
    /// A serial evaluator.
    pub fn new() -> Serial {
        Serial {
            aes: FixedKeyAes::new(),
        }
    }
}

impl Hasher for Serial {
    fn hash_many(&self, d: crate::prg::Domain, blocks: &mut [crate::prg::Block]) -> u64 {
        self.aes.hash_many(d, blocks)
    }
}

impl BatchEval for Serial {
    fn name(&self) -> &'static str {
        "serial"
    }

    fn aes_path(&self) -> &'static str {
        "aes-crate"
    }

    fn preferred_batch(&self) -> usize {
        1
    }

    fn eval(
        &self,
        keys: &KeyBatch<'_>,
        points: &[u64],
        out: &mut [u64],
    ) -> Result<EvalStats, Error> {
        let per_key = keys.points_per_key(points.len())?;
        let aes_calls = fss::eval_queries(&self.aes, keys, per_key, 0, points, out, 1)?;
        Ok(EvalStats { aes_calls })
    }

    fn eval_full_domain(&self, keys: &KeyBatch<'_>, out: &mut [u64]) -> Result<EvalStats, Error> {
        full_domain_each(&self.aes, keys, out)
    }

    fn generate(
        &self,
        batch: &GenBatch<'_>,
        key0: &mut [u8],
        key1: &mut [u8],
    ) -> Result<EvalStats, Error> {
        let aes_calls = fss::generate(&self.aes, batch, key0, key1, 1)?;
        Ok(EvalStats { aes_calls })
    }

    fn matmul(&self, shape: &MatShape, a: &[u64], b: &[u64], c: &mut [u64]) -> Result<(), Error> {
        matmul_reference(shape, a, b, c)
    }
}

/// The textbook triple loop: `c[i][j] (+)= Σ_p a[i][p]·b[p][j]` in wrapping
/// 64-bit arithmetic, which is exact in ℤ/2^64 (shares and sign-extended
/// fixed-point weights multiply as ring elements).
pub fn matmul_reference(
    shape: &MatShape,
    a: &[u64],
    b: &[u64],
    c: &mut [u64],
) -> Result<(), Error> {
    shape.check(a, b, c)?;
    let MatShape { m, k, n, .. } = *shape;
    for t in 0..shape.batches {
        let (at, bt) = (&a[t * m * k..], &b[t * k * n..]);
        for i in 0..m {
            for j in 0..n {
                let mut sum = 0u64;
                for p in 0..k {
                    let bv = if shape.transpose_b {
                        bt[j * k + p]
                    } else {
                        bt[p * n + j]
                    };
                    sum = sum.wrapping_add(at[i * k + p].wrapping_mul(bv));
                }
                let slot = &mut c[t * m * n + i * n + j];
                *slot = if shape.accumulate {
                    slot.wrapping_add(sum)
                } else {
                    sum
                };
            }
        }
    }
    Ok(())
}

/// Checks [`BatchEval::lookup`]'s buffers (a power-of-two table, a point
/// and an output per key, scratch for at least one domain) and returns how
/// many keys' domains the scratch holds.
pub fn lookup_slots(
    keys: &KeyBatch<'_>,
    (points, table): (&[u64], &[u64]),
    domain: &[u64],
    out: &[u64],
) -> Result<usize, Error> {
    let (n, size) = (keys.count(), table.len());
    let slots = domain.len() / size.max(1);
    if !size.is_power_of_two() || points.len() != n || out.len() != n || slots == 0 {
        return Err(Error::BufferLength);
    }
    Ok(slots)
}

/// [`BatchEval::lookup`] one key at a time with [`crate::dpf::lookup`],
/// which sums each tile of a key's outputs while it is in cache; `domain`
/// is one key's full domain (`table.len()` words) of scratch. Shared by
/// evaluators that parallelise across keys.
pub fn lookup_each<H: Hasher + ?Sized>(
    aes: &H,
    keys: &KeyBatch<'_>,
    (points, table): (&[u64], &[u64]),
    domain: &mut [u64],
    out: &mut [u64],
) -> Result<EvalStats, Error> {
    if points.len() != keys.count() || out.len() != keys.count() {
        return Err(Error::BufferLength);
    }
    let (p, party) = (keys.params(), keys.party());
    let mut stats = EvalStats::default();
    for (i, (u, o)) in points.iter().zip(out.iter_mut()).enumerate() {
        let (share, calls) = crate::dpf::lookup(aes, &p, party, keys.key(i), (*u, table), domain)?;
        *o = share;
        stats.aes_calls += calls;
    }
    Ok(stats)
}

/// Full-domain evaluation of every key of a batch into consecutive blocks of
/// `out`; shared by evaluators that parallelise across keys.
pub fn full_domain_each<H: Hasher + ?Sized>(
    aes: &H,
    keys: &KeyBatch<'_>,
    out: &mut [u64],
) -> Result<EvalStats, Error> {
    let p = keys.params();
    if p.kind() != crate::fss::Kind::Dpf {
        return Err(Error::KindMismatch);
    }
    let k = p.domain().bits();
    if k > 40 {
        return Err(Error::BufferLength);
    }
    let size = 1usize << k;
    if Some(out.len()) != keys.count().checked_mul(size) {
        return Err(Error::BufferLength);
    }
    let mut stats = EvalStats::default();
    for (i, chunk) in out.chunks_mut(size).enumerate() {
        stats.aes_calls += fss::full_domain(aes, &p, keys.party(), keys.key(i), chunk)?;
    }
    Ok(stats)
}
