//! The interactive steps of a plan: for each kind, the layout of its key
//! section, the dealer's side and the parties' side, in one place.
//!
//! Scalar gates are dealt and evaluated in chunks of [`CHUNK`] elements:
//! each chunk is an independent core evaluation (its element indices
//! continue the previous chunk's, so the PRF inputs never repeat), chunks
//! run in parallel on the party's threads, and one round of the step sends
//! every chunk's message in one frame.
//!
//! Key sections (per party b):
//!
//! | step | section |
//! | --- | --- |
//! | gate | seed_b · per chunk: DCF key bodies (roots are re-derived from the seed), then P1's explicit words |
//! | reciprocal / rsqrt | seed_b · per chunk, per chain step: the same |
//! | max | seed_b · per tree level: the same, for that level's ReLUs |
//! | matmul, mulrows, square | seed_b · P1: its share of the triple's product (the rest is expanded from the seeds) |

use rayon::prelude::*;
use suffuse_core::batch::BatchEval;
use suffuse_core::compile::MAX_KEYS;
use suffuse_core::fss::Party;
use suffuse_core::gate::chain::{Chain, ChainEval, MAX_STEPS, Step, step_seed};
use suffuse_core::gate::max::{MAX_LEVELS, MaxEval, MaxTree};
use suffuse_core::gate::{Eval, Gate, PartyKeys, Protocol};
use suffuse_core::prg::{Block, Hasher, Prg};

use crate::exec::{self, ExecError, Store};
use crate::net::{Link, NetError, get_words, put_words};
use crate::plan::{Built, Kind, Plan};
use zeroize::{Zeroize, Zeroizing};

/// Elements per evaluation chunk of a scalar gate.
pub const CHUNK: usize = 16 * 1024;

/// Why a step failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProtoError {
    /// The core rejected a buffer or state (a malformed key section).
    #[error("step {step}: {error}")]
    Core {
        /// The step.
        step: u32,
        /// The error.
        error: suffuse_core::Error,
    },
    /// The peer.
    #[error("step {step}: {error}")]
    Net {
        /// The step.
        step: u32,
        /// The error.
        error: NetError,
    },
    /// The interpreter.
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// A key section shorter or longer than its layout.
    #[error("step {step}: key section is malformed ({what})")]
    Section {
        /// The step.
        step: u32,
        /// What is wrong.
        what: &'static str,
    },
}

fn core(step: u32) -> impl Fn(suffuse_core::Error) -> ProtoError {
    move |source| ProtoError::Core {
        step,
        error: source,
    }
}

/// Bytes of P1's explicit words.
fn words_bytes(words: usize) -> usize {
    words * 8
}

/// A key section being consumed front to back.
struct Cursor<'a> {
    bytes: &'a [u8],
    step: u32,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        if self.bytes.len() < n {
            return Err(ProtoError::Section {
                step: self.step,
                what: "too short",
            });
        }
        let (a, b) = self.bytes.split_at(n);
        self.bytes = b;
        Ok(a)
    }

    fn seed(&mut self) -> Result<[u8; 16], ProtoError> {
        let mut s = [0u8; 16];
        s.copy_from_slice(self.take(16)?);
        Ok(s)
    }

    fn done(&self) -> Result<(), ProtoError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(ProtoError::Section {
                step: self.step,
                what: "too long",
            })
        }
    }
}

// ---------------------------------------------------------------------------
// Scalar gate material: DCF key bodies plus explicit words.

/// Bytes of one element's key bodies (roots excluded) for a gate.
fn body_bytes(g: &Gate) -> usize {
    (0..g.compiled.key_count)
        .map(|k| g.key_params(k).key_len() - 16)
        .sum()
}

/// Section bytes of `count` elements of a gate's material.
fn gate_bytes(g: &Gate, count: usize, party: Party) -> usize {
    let ex = if party == Party::P1 {
        words_bytes(count * g.explicit_words())
    } else {
        0
    };
    count * body_bytes(g) + ex
}

/// Full-key buffers for `count` elements.
fn key_buffers(g: &Gate, count: usize) -> [Vec<u8>; MAX_KEYS] {
    std::array::from_fn(|k| {
        if k < g.compiled.key_count {
            vec![0u8; count * g.key_params(k).key_len()]
        } else {
            Vec::new()
        }
    })
}

fn as_mut(bufs: &mut [Vec<u8>; MAX_KEYS]) -> [&mut [u8]; MAX_KEYS] {
    let [a, b, c] = bufs;
    [a.as_mut_slice(), b.as_mut_slice(), c.as_mut_slice()]
}

/// Deals `count` elements with `deal` (which fills full keys and P1's
/// explicit words) and appends both parties' section bytes.
fn deal_material(
    g: &Gate,
    count: usize,
    out: &mut [Vec<u8>; 2],
    deal: impl FnOnce(
        &mut [&mut [u8]; MAX_KEYS],
        &mut [&mut [u8]; MAX_KEYS],
        &mut [u64],
    ) -> Result<u64, suffuse_core::Error>,
) -> Result<(), suffuse_core::Error> {
    let mut k0 = key_buffers(g, count);
    let mut k1 = key_buffers(g, count);
    let mut explicit = vec![0u64; count * g.explicit_words()];
    deal(&mut as_mut(&mut k0), &mut as_mut(&mut k1), &mut explicit)?;
    for (p, keys) in [&k0, &k1].into_iter().enumerate() {
        for (k, buf) in keys.iter().enumerate().take(g.compiled.key_count) {
            let len = g.key_params(k).key_len();
            for e in 0..count {
                out[p].extend_from_slice(&buf[e * len + 16..(e + 1) * len]);
            }
        }
    }
    put_words(&mut out[1], &explicit);
    Ok(())
}

/// A party's material for `count` elements, full keys rebuilt.
struct Material {
    keys: [Vec<u8>; MAX_KEYS],
    explicit: Vec<u64>,
}

impl Drop for Material {
    fn drop(&mut self) {
        for k in &mut self.keys {
            k.zeroize();
        }
        self.explicit.zeroize();
    }
}

impl Material {
    fn party_keys(&self) -> PartyKeys<'_> {
        let [a, b, c] = &self.keys;
        PartyKeys {
            dcf: [a, b, c],
            explicit: &self.explicit,
        }
    }
}

/// Reads `count` elements' material, re-deriving the DCF roots from `seed`
/// at element offset `first`.
fn load_material(
    g: &Gate,
    h: &dyn Hasher,
    party: Party,
    seed: &[u8; 16],
    first: u64,
    count: usize,
    cur: &mut Cursor<'_>,
) -> Result<Material, ProtoError> {
    let mut keys: [Vec<u8>; MAX_KEYS] = Default::default();
    for (k, buf) in keys.iter_mut().enumerate().take(g.compiled.key_count) {
        let len = g.key_params(k).key_len();
        let bodies = cur.take(count * (len - 16))?;
        // Room for each root (filled from the seed below), then the body:
        // built by appending, so the buffer is written once.
        buf.reserve_exact(count * len);
        for body in bodies.chunks_exact(len - 16) {
            buf.extend_from_slice(&[0u8; 16]);
            buf.extend_from_slice(body);
        }
    }
    if count > 0 {
        g.fill_roots(h, party, seed, first, &mut as_mut(&mut keys))
            .map_err(core(cur.step))?;
    }
    let explicit = if party == Party::P1 {
        get_words(cur.take(words_bytes(count * g.explicit_words()))?)
    } else {
        Vec::new()
    };
    Ok(Material { keys, explicit })
}

fn chunks(n: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n.div_ceil(CHUNK)).map(move |c| (c * CHUNK, CHUNK.min(n - c * CHUNK)))
}

// ---------------------------------------------------------------------------
// Section sizes and dealing.

/// Bytes of step `op`'s key section for `party`.
pub fn section_len(plan: &Plan, op: usize, party: Party) -> u64 {
    let t = &plan.tensors;
    let p1 = party == Party::P1;
    let body = match (&plan.ops[op].kind, plan.built[op].as_ref()) {
        (Kind::Gate { x, .. }, Some(Built::Gate(g))) => gate_bytes(g, t[*x].len(), party),
        (Kind::Inverse { x, .. }, Some(Built::Chain(c))) => {
            let n = t[*x].len();
            (0..c.count).map(|s| chain_step_bytes(c, s, n, party)).sum()
        }
        (Kind::Max { x, .. }, Some(Built::Max(tree))) => {
            let rows = t[*x].rows;
            (0..tree.levels())
                .map(|l| gate_bytes(&tree.relu, rows * tree.pairs(l), party))
                .sum()
        }
        (Kind::MatMul { out, .. }, _) if p1 => words_bytes(t[*out].len()),
        (Kind::MulRows { out, .. }, _)
        | (Kind::Square { out, .. }, _)
        | (Kind::Mul { out, .. }, _)
            if p1 =>
        {
            words_bytes(t[*out].len())
        }
        _ => 0,
    };
    16 + body as u64
}

fn chain_step_bytes(c: &Chain, s: usize, n: usize, party: Party) -> usize {
    match &c.steps[s] {
        Step::Gate { gate, .. } => gate_bytes(gate, n, party),
        Step::Mul { .. } if party == Party::P1 => words_bytes(n),
        Step::Mul { .. } => 0,
    }
}

/// Receives both parties' section bytes as the dealer produces them.
pub type Emit<'a> = dyn FnMut([Vec<u8>; 2]) -> Result<(), crate::keyfile::KeyFileError> + 'a;

/// Deals step `op` with the per-party seeds; `emit` receives both parties'
/// section bytes in order, in pieces (the seed first). Large gates are
/// dealt chunk by chunk so that memory stays bounded.
pub fn deal(
    plan: &Plan,
    op: usize,
    fss: &dyn BatchEval,
    seeds: [[u8; 16]; 2],
    emit: &mut Emit<'_>,
) -> Result<(), DealError> {
    let h: &(dyn Hasher + Sync) = fss;
    let t = &plan.tensors;
    let step = plan.step_of[op].unwrap_or(u32::MAX);
    let c = |e: suffuse_core::Error| DealError::Core { step, error: e };
    emit([seeds[0].to_vec(), seeds[1].to_vec()])?;
    match (&plan.ops[op].kind, plan.built[op].as_ref()) {
        (Kind::Gate { x, .. }, Some(Built::Gate(g))) => {
            let list: Vec<(usize, usize)> = chunks(t[*x].len()).collect();
            // A window of chunks in parallel, written in order.
            for window in list.chunks(2 * rayon::current_num_threads().max(1)) {
                let parts: Vec<Result<[Vec<u8>; 2], suffuse_core::Error>> = window
                    .par_iter()
                    .map(|&(first, count)| {
                        let mut out = [Vec::new(), Vec::new()];
                        let mut prf = vec![Block::ZERO; g.deal_scratch_blocks(count)];
                        deal_material(g, count, &mut out, |k0, k1, ex| {
                            g.deal(h, seeds, None, first as u64, count, k0, k1, ex, &mut prf)
                        })?;
                        Ok(out)
                    })
                    .collect();
                for p in parts {
                    emit(p.map_err(c)?)?;
                }
            }
        }
        (Kind::Inverse { x, .. }, Some(Built::Chain(chain))) => {
            let n = t[*x].len();
            let mut out = [Vec::new(), Vec::new()];
            let mut prf = vec![Block::ZERO; chain.deal_scratch_blocks(n)];
            for s in 0..chain.count {
                match &chain.steps[s] {
                    Step::Gate { gate, .. } => {
                        deal_material(gate, n, &mut out, |k0, k1, ex| {
                            chain.deal_step(s, h, seeds, 0, n, k0, k1, ex, &mut prf)
                        })
                        .map_err(c)?;
                    }
                    Step::Mul { .. } => {
                        let mut ex = vec![0u64; n];
                        let mut none0: [&mut [u8]; MAX_KEYS] = [&mut [], &mut [], &mut []];
                        let mut none1: [&mut [u8]; MAX_KEYS] = [&mut [], &mut [], &mut []];
                        chain
                            .deal_step(s, h, seeds, 0, n, &mut none0, &mut none1, &mut ex, &mut [])
                            .map_err(c)?;
                        put_words(&mut out[1], &ex);
                    }
                }
            }
            emit(out)?;
        }
        (Kind::Max { x, .. }, Some(Built::Max(tree))) => {
            let rows = t[*x].rows;
            let mut prf = vec![Block::ZERO; tree.deal_scratch_blocks(rows)];
            for level in 0..tree.levels() {
                let mut out = [Vec::new(), Vec::new()];
                let count = rows * tree.pairs(level);
                deal_material(&tree.relu, count, &mut out, |k0, k1, ex| {
                    tree.deal_level(level, rows, h, seeds, k0, k1, ex, &mut prf)
                })
                .map_err(c)?;
                emit(out)?;
            }
        }
        (
            Kind::MatMul {
                transpose_b,
                batches,
                m,
                k,
                n,
                ..
            },
            _,
        ) => {
            let (a0, b0, c0) = matmul_triple(&seeds[0], *batches, *m, *k, *n, true);
            let (a1, b1, _) = matmul_triple(&seeds[1], *batches, *m, *k, *n, false);
            let a: Secret = Zeroizing::new(
                a0.iter()
                    .zip(a1.iter())
                    .map(|(x, y)| x.wrapping_add(*y))
                    .collect(),
            );
            let b: Secret = Zeroizing::new(
                b0.iter()
                    .zip(b1.iter())
                    .map(|(x, y)| x.wrapping_add(*y))
                    .collect(),
            );
            let mut c1 = Zeroizing::new(vec![0u64; batches * m * n]);
            let shape = exec::matmul_shape(*transpose_b, *batches, *m, *k, *n, false);
            exec::matmul(fss, shape, &a, &b, &mut c1)?;
            for (x, y) in c1.iter_mut().zip(c0.iter()) {
                *x = x.wrapping_sub(*y);
            }
            let mut out = [Vec::new(), Vec::new()];
            put_words(&mut out[1], &c1);
            emit(out)?;
        }
        (k @ (Kind::MulRows { .. } | Kind::Mul { .. }), _) => {
            let (_, _, rows, cols) = row_product(plan, k);
            let (a0, b0, c0) = mulrows_triple(&seeds[0], rows, cols, true);
            let (a1, b1, _) = mulrows_triple(&seeds[1], rows, cols, false);
            let mut c1 = Zeroizing::new(Vec::with_capacity(rows * cols));
            for r in 0..rows {
                let b = b0[r].wrapping_add(b1[r]);
                for col in 0..cols {
                    let i = r * cols + col;
                    c1.push(
                        a0[i]
                            .wrapping_add(a1[i])
                            .wrapping_mul(b)
                            .wrapping_sub(c0[i]),
                    );
                }
            }
            let mut out = [Vec::new(), Vec::new()];
            put_words(&mut out[1], &c1);
            emit(out)?;
        }
        (Kind::Square { x, .. }, _) => {
            let n = t[*x].len();
            let (a0, c0) = square_triple(&seeds[0], n, true);
            let (a1, _) = square_triple(&seeds[1], n, false);
            let c1: Secret = Zeroizing::new(
                (0..n)
                    .map(|i| {
                        let a = a0[i].wrapping_add(a1[i]);
                        a.wrapping_mul(a).wrapping_sub(c0[i])
                    })
                    .collect(),
            );
            let mut out = [Vec::new(), Vec::new()];
            put_words(&mut out[1], &c1);
            emit(out)?;
        }
        _ => {}
    }
    Ok(())
}

/// Why dealing failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DealError {
    /// The core.
    #[error("step {step}: {error}")]
    Core {
        /// The step.
        step: u32,
        /// The error.
        error: suffuse_core::Error,
    },
    /// Writing the key files.
    #[error(transparent)]
    KeyFile(#[from] crate::keyfile::KeyFileError),
    /// The interpreter.
    #[error(transparent)]
    Exec(#[from] ExecError),
}

/// `n` words from a seeded stream.
fn words(seed: &[u8; 16], stream: u64, n: usize) -> Secret {
    let mut prg = Prg::with_stream(seed, stream);
    let mut bytes = Zeroizing::new(vec![0u8; n * 8]);
    prg.fill(&mut bytes);
    Zeroizing::new(get_words(&bytes))
}

/// Triple material and products of it: wiped when dropped.
type Secret = Zeroizing<Vec<u64>>;

/// A party's matrix-triple material: `(A_b, B_b, C_0)`; C_0 only for P0.
fn matmul_triple(
    seed: &[u8; 16],
    batches: usize,
    m: usize,
    k: usize,
    n: usize,
    with_c: bool,
) -> (Secret, Secret, Secret) {
    let a = words(seed, 0, batches * m * k);
    let b = words(seed, 1, batches * k * n);
    let c = if with_c {
        words(seed, 2, batches * m * n)
    } else {
        Secret::default()
    };
    (a, b, c)
}

/// The operands and shape of a row product: `x[r, c]·v[r]` over
/// `rows × cols`. An elementwise product is one with a single column.
fn row_product(plan: &Plan, kind: &Kind) -> (usize, usize, usize, usize) {
    let t = &plan.tensors;
    match *kind {
        Kind::Mul { a, b, .. } => (a, b, t[a].len(), 1),
        Kind::MulRows { x, v, .. } => (x, v, t[x].rows, t[x].cols),
        _ => (0, 0, 0, 0),
    }
}

/// A party's row-product triple material: `(a_b, b_b, c_0)`.
fn mulrows_triple(
    seed: &[u8; 16],
    rows: usize,
    cols: usize,
    with_c: bool,
) -> (Secret, Secret, Secret) {
    let a = words(seed, 0, rows * cols);
    let b = words(seed, 1, rows);
    let c = if with_c {
        words(seed, 2, rows * cols)
    } else {
        Secret::default()
    };
    (a, b, c)
}

/// A party's square-triple material: `(a_b, c_0)`.
fn square_triple(seed: &[u8; 16], n: usize, with_c: bool) -> (Secret, Secret) {
    let a = words(seed, 0, n);
    let c = if with_c {
        words(seed, 2, n)
    } else {
        Secret::default()
    };
    (a, c)
}

// ---------------------------------------------------------------------------
// The parties' side.

/// What a party needs to run steps.
pub struct Online<'a> {
    /// Which party.
    pub party: Party,
    /// The connection to the other server.
    pub link: &'a mut Link,
    /// The backend: FSS evaluation, seed expansion, matrix products.
    pub fss: &'a dyn BatchEval,
}

impl std::fmt::Debug for Online<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Online")
            .field("party", &self.party)
            .finish_non_exhaustive()
    }
}

impl Online<'_> {
    fn exchange(&mut self, step: u32, send: &[u8]) -> Result<Vec<u8>, ProtoError> {
        self.link
            .exchange(step, send, send.len())
            .map_err(|source| ProtoError::Net {
                step,
                error: source,
            })
    }
}

/// Runs step `op` with its key section; writes the output share.
pub fn run(
    plan: &Plan,
    op: usize,
    on: &mut Online<'_>,
    section: &[u8],
    store: &mut Store,
) -> Result<(), ProtoError> {
    let step = plan.step_of[op].unwrap_or(u32::MAX);
    let t = &plan.tensors;
    let mut cur = Cursor {
        bytes: section,
        step,
    };
    let seed = Zeroizing::new(cur.seed()?);
    let party = on.party;
    let p0 = party == Party::P0;
    let fss = on.fss;
    let h: &(dyn Hasher + Sync) = fss;
    let out = match (&plan.ops[op].kind, plan.built[op].as_ref()) {
        (Kind::Gate { x, .. }, Some(Built::Gate(g))) => {
            let input = store.get(plan, *x)?;
            run_gate(g, step, on, &seed, &mut cur, input)?
        }
        (Kind::Inverse { x, .. }, Some(Built::Chain(chain))) => {
            let n = t[*x].len();
            let mut mats = Vec::with_capacity(chain.count);
            for s in 0..chain.count {
                match &chain.steps[s] {
                    Step::Gate { gate, .. } => {
                        let ss = step_seed(h, &seed, s);
                        mats.push(load_material(gate, h, party, &ss, 0, n, &mut cur)?);
                    }
                    Step::Mul { .. } => mats.push(Material {
                        keys: Default::default(),
                        explicit: if p0 {
                            Vec::new()
                        } else {
                            get_words(cur.take(words_bytes(n))?)
                        },
                    }),
                }
            }
            cur.done()?;
            let mut keys = [PartyKeys::default(); MAX_STEPS];
            for (k, m) in keys.iter_mut().zip(&mats) {
                *k = m.party_keys();
            }
            let mut scratch = vec![0u64; chain.scratch_words(n)];
            let input = store.get(plan, *x)?;
            let mut ev = ChainEval::new(chain, h, party, *seed, 0, n, keys, input, &mut scratch)
                .map_err(core(step))?;
            for i in 0..ev.rounds() {
                let mut send = vec![0u8; ev.send_len(i)];
                ev.prepare(i, &mut send).map_err(core(step))?;
                let recv = on.exchange(step, &send)?;
                ev.finish(i, &recv, fss).map_err(core(step))?;
            }
            let mut y = vec![0u64; n];
            ev.output(&mut y).map_err(core(step))?;
            y
        }
        (Kind::Max { x, .. }, Some(Built::Max(tree))) => {
            let rows = t[*x].rows;
            let mut mats = Vec::with_capacity(tree.levels());
            for level in 0..tree.levels() {
                let ls = step_seed(h, &seed, level);
                let count = rows * tree.pairs(level);
                mats.push(load_material(
                    &tree.relu, h, party, &ls, 0, count, &mut cur,
                )?);
            }
            cur.done()?;
            let mut keys = [PartyKeys::default(); MAX_LEVELS];
            for (k, m) in keys.iter_mut().zip(&mats) {
                *k = m.party_keys();
            }
            run_max(tree, step, on, h, *seed, rows, store.get(plan, *x)?, keys)?
        }
        (
            Kind::MatMul {
                a,
                b,
                transpose_b,
                batches,
                m,
                k,
                n,
                ..
            },
            _,
        ) => {
            let c_b = if p0 {
                Secret::default()
            } else {
                Zeroizing::new(get_words(cur.take(words_bytes(batches * m * n))?))
            };
            cur.done()?;
            let (ta, tb, c0) = matmul_triple(&seed, *batches, *m, *k, *n, p0);
            let c_b = if p0 { c0 } else { c_b };
            let x = store.get(plan, *a)?;
            let y = store.get(plan, *b)?;
            // Open E = X − A and F = Y − B.
            let mut mine: Vec<u64> = x
                .iter()
                .zip(ta.iter())
                .map(|(v, r)| v.wrapping_sub(*r))
                .collect();
            mine.extend(y.iter().zip(tb.iter()).map(|(v, r)| v.wrapping_sub(*r)));
            let opened = open_words(on, step, &mine)?;
            let (e, f) = opened.split_at(ta.len());
            // XY = EF + EB + AF + AB: P0 takes E(F + B₀) + A₀F + C₀, P1 takes
            // E·B₁ + A₁F + C₁.
            let right: Secret = if p0 {
                Zeroizing::new(
                    f.iter()
                        .zip(tb.iter())
                        .map(|(u, v)| u.wrapping_add(*v))
                        .collect(),
                )
            } else {
                tb
            };
            let mut z = c_b;
            let shape = exec::matmul_shape(*transpose_b, *batches, *m, *k, *n, true);
            exec::matmul(fss, shape, e, &right, &mut z)?;
            exec::matmul(fss, shape, &ta, f, &mut z)?;
            std::mem::take(&mut *z)
        }
        (kind @ (Kind::MulRows { .. } | Kind::Mul { .. }), _) => {
            let (x, v, rows, cols) = row_product(plan, kind);
            let c1 = if p0 {
                Secret::default()
            } else {
                Zeroizing::new(get_words(cur.take(words_bytes(rows * cols))?))
            };
            cur.done()?;
            let (ta, tb, c0) = mulrows_triple(&seed, rows, cols, p0);
            let c = if p0 { c0 } else { c1 };
            let xs = store.get(plan, x)?;
            let vs = store.get(plan, v)?;
            let mut mine: Vec<u64> = xs
                .iter()
                .zip(ta.iter())
                .map(|(a, r)| a.wrapping_sub(*r))
                .collect();
            mine.extend(vs.iter().zip(tb.iter()).map(|(a, r)| a.wrapping_sub(*r)));
            let opened = open_words(on, step, &mine)?;
            let (e, f) = opened.split_at(rows * cols);
            let mut z = c;
            z.par_chunks_mut(cols.max(1))
                .enumerate()
                .for_each(|(r, row)| {
                    for (col, zv) in row.iter_mut().enumerate() {
                        let i = r * cols + col;
                        let mut s = zv
                            .wrapping_add(e[i].wrapping_mul(tb[r]))
                            .wrapping_add(ta[i].wrapping_mul(f[r]));
                        if p0 {
                            s = s.wrapping_add(e[i].wrapping_mul(f[r]));
                        }
                        *zv = s;
                    }
                });
            std::mem::take(&mut *z)
        }
        (Kind::Square { x, .. }, _) => {
            let n = t[*x].len();
            let c1 = if p0 {
                Secret::default()
            } else {
                Zeroizing::new(get_words(cur.take(words_bytes(n))?))
            };
            cur.done()?;
            let (ta, c0) = square_triple(&seed, n, p0);
            let c = if p0 { c0 } else { c1 };
            let xs = store.get(plan, *x)?;
            let mine: Vec<u64> = xs
                .iter()
                .zip(ta.iter())
                .map(|(a, r)| a.wrapping_sub(*r))
                .collect();
            let e = open_words(on, step, &mine)?;
            // x² = e² + 2ea + a².
            (0..n)
                .into_par_iter()
                .map(|i| {
                    let mut s = c[i].wrapping_add(e[i].wrapping_mul(ta[i]).wrapping_mul(2));
                    if p0 {
                        s = s.wrapping_add(e[i].wrapping_mul(e[i]));
                    }
                    s
                })
                .collect()
        }
        _ => return Ok(()),
    };
    store.set(plan, plan.ops[op].kind.output(), out)?;
    Ok(())
}

/// Opens words: sends this party's, returns the sums.
fn open_words(on: &mut Online<'_>, step: u32, mine: &[u64]) -> Result<Vec<u64>, ProtoError> {
    let mut send = Vec::with_capacity(mine.len() * 8);
    put_words(&mut send, mine);
    let recv = on.exchange(step, &send)?;
    let theirs = get_words(&recv);
    Ok(mine
        .iter()
        .zip(&theirs)
        .map(|(a, b)| a.wrapping_add(*b))
        .collect())
}

/// One chunk of a scalar gate: its material and evaluation scratch.
struct GateChunk {
    first: usize,
    count: usize,
    mat: Material,
    scratch: Vec<u64>,
}

fn run_gate(
    g: &Gate,
    step: u32,
    on: &mut Online<'_>,
    seed: &[u8; 16],
    cur: &mut Cursor<'_>,
    input: &[u64],
) -> Result<Vec<u64>, ProtoError> {
    let party = on.party;
    let fss = on.fss;
    let h: &(dyn Hasher + Sync) = fss;
    let trace = std::env::var_os("SUFFUSE_TRACE").is_some();
    let t0 = std::time::Instant::now();
    let mut marks: Vec<(&'static str, f64)> = Vec::new();
    // Slice the section per chunk, then rebuild keys in parallel.
    let mut slices = Vec::new();
    for (first, count) in chunks(input.len()) {
        slices.push((first, count, cur.take(gate_bytes(g, count, party))?));
    }
    cur.done()?;
    let mut states: Vec<GateChunk> = slices
        .into_par_iter()
        .map(|(first, count, bytes)| {
            let mut c = Cursor { bytes, step };
            let mat = load_material(g, h, party, seed, first as u64, count, &mut c)?;
            Ok(GateChunk {
                first,
                count,
                mat,
                scratch: vec![0u64; g.scratch_words(count)],
            })
        })
        .collect::<Result<_, ProtoError>>()?;
    marks.push(("load", t0.elapsed().as_secs_f64()));
    let mut evals: Vec<(usize, usize, Eval<'_>)> = states
        .par_iter_mut()
        .map(|s| {
            let GateChunk {
                first,
                count,
                mat,
                scratch,
            } = s;
            let ev = Eval::new(
                g,
                h,
                party,
                seed,
                None,
                *first as u64,
                *count,
                mat.party_keys(),
                &input[*first..*first + *count],
                scratch,
            )?;
            Ok((*first, *count, ev))
        })
        .collect::<Result<_, suffuse_core::Error>>()
        .map_err(core(step))?;
    marks.push(("seeded", t0.elapsed().as_secs_f64()));
    let rounds = g.schedule().1;
    for i in 0..rounds {
        let lens: Vec<usize> = evals.iter().map(|(_, _, e)| e.send_len(i)).collect();
        let total: usize = lens.iter().sum();
        let mut send = vec![0u8; total];
        {
            let mut parts: Vec<&mut [u8]> = Vec::with_capacity(evals.len());
            let mut rest = send.as_mut_slice();
            for l in &lens {
                let (a, b) = rest.split_at_mut(*l);
                parts.push(a);
                rest = b;
            }
            evals
                .par_iter_mut()
                .zip(parts)
                .try_for_each(|((_, _, ev), buf)| ev.prepare(i, buf))
                .map_err(core(step))?;
        }
        let recv = on.exchange(step, &send)?;
        let mut parts: Vec<&[u8]> = Vec::with_capacity(evals.len());
        let mut rest = recv.as_slice();
        for l in &lens {
            let (a, b) = rest.split_at(*l);
            parts.push(a);
            rest = b;
        }
        evals
            .par_iter_mut()
            .zip(parts)
            .try_for_each(|((_, _, ev), buf)| ev.finish(i, buf, fss))
            .map_err(core(step))?;
        marks.push(("finish", t0.elapsed().as_secs_f64()));
    }
    let outs = g.outputs();
    let bits = g.bit_outputs();
    let mut y = vec![0u64; input.len()];
    let parts: Vec<(usize, Vec<u64>)> = evals
        .par_iter()
        .map(|(first, count, ev)| {
            let mut arith = vec![0u64; count * outs];
            let mut b = vec![0u64; count * bits];
            ev.outputs(&mut arith, &mut b)?;
            // The first ring output of each element.
            Ok((*first, arith.iter().step_by(outs.max(1)).copied().collect()))
        })
        .collect::<Result<_, suffuse_core::Error>>()
        .map_err(core(step))?;
    for (first, v) in parts {
        y[first..first + v.len()].copy_from_slice(&v);
    }
    if trace {
        marks.push(("outputs", t0.elapsed().as_secs_f64()));
        let mut last = 0.0;
        let line: Vec<String> = marks
            .iter()
            .map(|(n, t)| {
                let d = t - last;
                last = *t;
                format!("{n} {:.1}", d * 1e3)
            })
            .collect();
        eprintln!(
            "P{} step {step} gate ×{}: {}",
            party.index(),
            input.len(),
            line.join(", ")
        );
    }
    Ok(y)
}

#[allow(clippy::too_many_arguments)]
fn run_max(
    tree: &MaxTree,
    step: u32,
    on: &mut Online<'_>,
    h: &(dyn Hasher + Sync),
    seed: [u8; 16],
    rows: usize,
    values: &[u64],
    keys: [PartyKeys<'_>; MAX_LEVELS],
) -> Result<Vec<u64>, ProtoError> {
    let fss = on.fss;
    let mut scratch = vec![0u64; tree.scratch_words(rows)];
    let mut ev = MaxEval::new(tree, h, on.party, seed, rows, values, keys, &mut scratch)
        .map_err(core(step))?;
    for i in 0..ev.rounds() {
        let mut send = vec![0u8; ev.send_len(i)];
        ev.prepare(i, &mut send).map_err(core(step))?;
        let recv = on.exchange(step, &send)?;
        ev.finish(i, &recv, fss).map_err(core(step))?;
    }
    let mut y = vec![0u64; rows];
    ev.output(&mut y).map_err(core(step))?;
    Ok(y)
}
