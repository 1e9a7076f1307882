//! The gate layer under memcheck: dealing, every round of `Eval`,
//! `ChainEval`, `MaxEval` and `SelectEval` through the `Protocol` trait, and
//! Φ by the compiled block program and by the per-element interpreter.
//!
//! Secret (undefined): the dealer's two seeds, every key byte and explicit
//! word the parties load, and the parties' input shares. Public (defined):
//! shapes, and every message a party sends, because it leaves the machine.
//! A party's own half of an opening is still secret when the peer's half
//! arrives, so the opened sum computed inside core would stay undefined; the
//! [`Declassify`] backend marks exactly the opened values defined where they
//! reach the backend boundary: the DCF points (x̂ plus public offsets) and
//! Φ's `x_hat`, `e` and `u` inputs. Everything else a round computes from
//! seeds and keys stays undefined, so a branch or index on it is reported.

use suffuse_accel_cpu::linalg;
use suffuse_core::batch::{BatchEval, EvalStats, MatShape};
use suffuse_core::compile::MAX_KEYS;
use suffuse_core::fss::{GenBatch, KeyBatch, Party};
use suffuse_core::gate::activation::{self, GeluForm, NexpForm, SiluForm};
use suffuse_core::gate::centre_square::{self, CentreSquare};
use suffuse_core::gate::chain::{Chain, ChainEval, MAX_STEPS};
use suffuse_core::gate::inverse::{Inverse, InverseScales, inverse, inverse_table};
use suffuse_core::gate::max::{MAX_LEVELS, MaxEval, MaxTree};
use suffuse_core::gate::relu::relu;
use suffuse_core::gate::select::{self, Select, SelectEval};
use suffuse_core::gate::trunc::{Range, Shift, trunc};
use suffuse_core::gate::trunc_open::TruncOpen;
use suffuse_core::gate::{DealScratch, Eval, Gate, PartyKeys, Protocol};
use suffuse_core::phi::program::{Inputs, Program, Section};
use suffuse_core::prg::{Block, Domain, Hasher};
use suffuse_core::ring::Width;
use suffuse_core::{Error, mpc};

use super::{HarnessResult, PublicInputs, memcheck};

/// Elements per key-generation call when dealing: small, so that every
/// gate's dealing crosses group edges under memcheck.
const DEAL_GROUP: usize = 7;

/// Elements per gate: one full bit-sliced block of 64 and a partial one.
const N: usize = 70;
/// Fraction bits.
const FRAC: u32 = 12;

/// What the gate layer's run checked.
#[derive(Default)]
pub struct GateStats {
    /// Protocols run to the end (per Φ path).
    pub protocols: usize,
    /// Outputs reconstructed and compared with the cleartext reference.
    pub checked: usize,
    /// Outputs that differed.
    pub wrong: usize,
}

impl GateStats {
    fn compare(&mut self, name: &str, got: &[u64], want: &[u64]) {
        self.protocols += 1;
        self.checked += want.len();
        let wrong = got.iter().zip(want).filter(|(g, w)| g != w).count();
        if wrong > 0 {
            println!("{name}: {wrong} of {} outputs wrong", want.len());
        }
        self.wrong += wrong;
    }
}

/// A backend that marks opened values defined as they cross the backend
/// boundary, then delegates. It declassifies nothing a party keeps secret:
/// DCF points are x̂ plus public offsets, and Φ's `x_hat`, `e` and `u` are
/// opened values; its `a` and `shares` inputs stay secret.
pub struct Declassify<'a>(pub &'a dyn BatchEval);

impl Hasher for Declassify<'_> {
    fn hash_many(&self, d: Domain, blocks: &mut [Block]) -> u64 {
        self.0.hash_many(d, blocks)
    }
}

impl BatchEval for Declassify<'_> {
    fn name(&self) -> &'static str {
        "declassify"
    }

    fn aes_path(&self) -> &'static str {
        self.0.aes_path()
    }

    fn preferred_batch(&self) -> usize {
        self.0.preferred_batch()
    }

    fn generate(
        &self,
        batch: &GenBatch<'_>,
        key0: &mut [u8],
        key1: &mut [u8],
    ) -> Result<EvalStats, Error> {
        self.0.generate(batch, key0, key1)
    }

    fn matmul(&self, shape: &MatShape, a: &[u64], b: &[u64], c: &mut [u64]) -> Result<(), Error> {
        self.0.matmul(shape, a, b, c)
    }

    fn eval(
        &self,
        keys: &KeyBatch<'_>,
        points: &[u64],
        out: &mut [u64],
    ) -> Result<EvalStats, Error> {
        memcheck::declassify_shared(points);
        self.0.eval(keys, points, out)
    }

    fn eval_full_domain(&self, keys: &KeyBatch<'_>, out: &mut [u64]) -> Result<EvalStats, Error> {
        self.0.eval_full_domain(keys, out)
    }

    fn lookup(
        &self,
        keys: &KeyBatch<'_>,
        (points, table): (&[u64], &[u64]),
        domain: &mut [u64],
        out: &mut [u64],
    ) -> Result<EvalStats, Error> {
        // The opened indices are public, as `eval`'s points are.
        memcheck::declassify_shared(points);
        self.0.lookup(keys, (points, table), domain, out)
    }

    fn eval_phi(
        &self,
        prog: &Program,
        section: Section,
        party: Party,
        input: &Inputs<'_>,
        out: &mut [u64],
        cols: &mut [u64],
    ) -> Result<(), Error> {
        memcheck::declassify_shared(input.x_hat);
        memcheck::declassify_shared(input.e);
        memcheck::declassify_shared(input.u);
        self.0.eval_phi(prog, section, party, input, out, cols)
    }
}

/// Runs both parties round by round; each message is declassified as it
/// leaves its party (it goes on the wire).
fn run_pair(
    p0: &mut dyn Protocol,
    p1: &mut dyn Protocol,
    backend: &dyn BatchEval,
) -> HarnessResult<()> {
    for i in 0..p0.rounds() {
        let mut m0 = vec![0u8; p0.send_len(i)];
        let mut m1 = vec![0u8; p1.send_len(i)];
        p0.prepare(i, &mut m0)?;
        p1.prepare(i, &mut m1)?;
        memcheck::declassify(m0.as_mut_slice());
        memcheck::declassify(m1.as_mut_slice());
        p0.finish(i, &m1, backend)?;
        p1.finish(i, &m0, backend)?;
    }
    Ok(())
}

/// Both parties' output shares, declassified (the harness's final check).
fn outputs(p0: &dyn Protocol, p1: &dyn Protocol) -> HarnessResult<[Vec<u64>; 2]> {
    let mut o = [vec![0u64; p0.output_len()], vec![0u64; p1.output_len()]];
    p0.output(&mut o[0])?;
    p1.output(&mut o[1])?;
    memcheck::declassify(o[0].as_mut_slice());
    memcheck::declassify(o[1].as_mut_slice());
    Ok(o)
}

/// One gate's (or one chain step's, one tree level's) dealt material.
struct Dealt {
    dcf: [Vec<Vec<u8>>; 2],
    explicit: Vec<u64>,
}

impl Dealt {
    /// Deals with `deal` into buffers of `key_lens[k] · count` bytes, then
    /// marks everything secret again (the parties load it from key files).
    fn new(
        key_lens: &[usize],
        count: usize,
        explicit_words: usize,
        deal: impl FnOnce(
            &mut [&mut [u8]; MAX_KEYS],
            &mut [&mut [u8]; MAX_KEYS],
            &mut [u64],
        ) -> Result<(), Error>,
    ) -> HarnessResult<Dealt> {
        let buffers = || -> Vec<Vec<u8>> {
            (0..MAX_KEYS)
                .map(|k| vec![0u8; key_lens.get(k).copied().unwrap_or(0) * count])
                .collect()
        };
        let (mut d0, mut d1) = (buffers(), buffers());
        let mut explicit = vec![0u64; count * explicit_words];
        {
            let mut a = slices(&mut d0);
            let mut b = slices(&mut d1);
            deal(&mut a, &mut b, &mut explicit)?;
        }
        for key in d0.iter_mut().chain(d1.iter_mut()) {
            memcheck::mark_secret(key.as_mut_slice());
        }
        memcheck::mark_secret(explicit.as_mut_slice());
        Ok(Dealt {
            dcf: [d0, d1],
            explicit,
        })
    }

    fn keys(&self, p: usize) -> PartyKeys<'_> {
        let dcf = &self.dcf[p];
        PartyKeys {
            dcf: core::array::from_fn(|k| dcf[k].as_slice()),
            roots: [&[]; MAX_KEYS],
            explicit: if p == 1 { &self.explicit } else { &[] },
        }
    }
}

fn slices(v: &mut [Vec<u8>]) -> [&mut [u8]; MAX_KEYS] {
    let mut it = v.iter_mut();
    core::array::from_fn(|_| it.next().map_or(&mut [][..], Vec::as_mut_slice))
}

fn key_lens(gate: &Gate) -> Vec<usize> {
    (0..gate.compiled.key_count)
        .map(|k| gate.key_params(k).key_len())
        .collect()
}

/// The dealer's seeds, marked secret.
fn secret_seeds(inputs: &mut PublicInputs) -> [[u8; 16]; 2] {
    let mut seeds = [inputs.block().to_bytes(), inputs.block().to_bytes()];
    memcheck::mark_secret(&mut seeds);
    seeds
}

/// Additive shares of `xs` in `w`, marked secret.
fn secret_shares(w: Width, xs: &[u64], inputs: &mut PublicInputs) -> [Vec<u64>; 2] {
    let mut x0: Vec<u64> = xs.iter().map(|_| w.reduce(inputs.next())).collect();
    let mut x1: Vec<u64> = xs.iter().zip(&x0).map(|(x, a)| w.sub(*x, *a)).collect();
    memcheck::mark_secret(x0.as_mut_slice());
    memcheck::mark_secret(x1.as_mut_slice());
    [x0, x1]
}

/// The backends a run uses.
pub struct Backends<'a> {
    /// The one that deals (its `generate` makes the DCF keys) and expands
    /// seeds.
    pub fss: &'a dyn BatchEval,
    /// The evaluators each protocol is run on.
    pub evals: Vec<&'a dyn BatchEval>,
}

/// A plain gate: deals `N` elements, then runs both parties with Φ by the
/// block program and, on the same keys, by the interpreter.
fn gate_case(
    name: &str,
    gate: &Gate,
    xs: &[u64],
    b: &Backends<'_>,
    inputs: &mut PublicInputs,
    stats: &mut GateStats,
) -> HarnessResult<()> {
    let seeds = secret_seeds(inputs);
    let dealt = Dealt::new(&key_lens(gate), N, gate.explicit_words(), |k0, k1, ex| {
        let mut prf = vec![Block::ZERO; gate.deal_scratch_blocks(N, DEAL_GROUP)];
        let mut words = vec![0u64; DealScratch::words(DEAL_GROUP)];
        let scratch = &mut DealScratch::new(&mut prf, &mut words);
        gate.deal(b.fss, seeds, None, 0, N, k0, k1, ex, scratch)
            .map(|_| ())
    })?;
    let x = secret_shares(gate.ring(), xs, inputs);
    let outs = gate.outputs();
    let mut want = Vec::new();
    for x in xs {
        let mut o = [0u64; 2];
        gate.reference(*x, &mut o);
        want.extend_from_slice(&o[..outs]);
    }
    for eval in &b.evals {
        let backend = Declassify(*eval);
        for interpreted in [false, true] {
            let mut s0 = vec![0u64; gate.scratch_words(N)];
            let mut s1 = vec![0u64; gate.scratch_words(N)];
            let mut p0 = Eval::new(
                gate,
                b.fss,
                Party::P0,
                &seeds[0],
                None,
                0,
                N,
                dealt.keys(0),
                &x[0],
                &mut s0,
            )?;
            let mut p1 = Eval::new(
                gate,
                b.fss,
                Party::P1,
                &seeds[1],
                None,
                0,
                N,
                dealt.keys(1),
                &x[1],
                &mut s1,
            )?;
            if interpreted {
                p0.use_interpreter();
                p1.use_interpreter();
            }
            run_pair(&mut p0, &mut p1, &backend)?;
            let [o0, o1] = outputs(&p0, &p1)?;
            let got: Vec<u64> = (0..N * outs)
                .map(|i| gate.phi.outputs[i % outs].ring.add(o0[i], o1[i]))
                .collect();
            let path = if interpreted {
                "interpreter"
            } else {
                "program"
            };
            stats.compare(&format!("{name} ({}, Φ {path})", eval.name()), &got, &want);
        }
    }
    Ok(())
}

/// The truncation that opens its output (`TruncOpen`, squared form, as
/// plans run it): `x = z + ⌊y/2^f⌋` opened under a fresh mask in the
/// truncation's two rounds; each message is declassified as it leaves its
/// party, and the output shares (`E + A_e`) and the shares of `x²` are
/// checked.
fn trunc_open_case(
    b: &Backends<'_>,
    inputs: &mut PublicInputs,
    stats: &mut GateStats,
) -> HarnessResult<()> {
    let ring = Width::W64;
    let g = TruncOpen::new(ring, Width::of(40), FRAC)?.squared();
    let ys = signed_inputs(ring, 40, inputs);
    let zs: Vec<u64> = (0..N).map(|_| inputs.next()).collect();
    let want: Vec<u64> = ys
        .iter()
        .zip(&zs)
        .map(|(y, z)| g.reference(*y, *z))
        .collect();
    let squares: Vec<u64> = want.iter().map(|x| ring.mul(*x, *x)).collect();
    let seeds = secret_seeds(inputs);
    let len = g.key_params().key_len();
    let dealt = Dealt::new(&[len], N, g.explicit_words(), |k0, k1, ex| {
        g.deal(b.fss, seeds, None, 0, N, k0[0], k1[0], ex)
            .map(|_| ())
    })?;
    let y = secret_shares(ring, &ys, inputs);
    let z = secret_shares(ring, &zs, inputs);
    for eval in &b.evals {
        let backend = Declassify(*eval);
        let mut s0 = vec![0u64; TruncOpen::scratch_words(N)];
        let mut s1 = vec![0u64; TruncOpen::scratch_words(N)];
        let mut p0 = g.eval(
            b.fss,
            Party::P0,
            &seeds[0],
            None,
            0,
            dealt.keys(0),
            (&y[0], &z[0]),
            &mut s0,
        )?;
        let mut p1 = g.eval(
            b.fss,
            Party::P1,
            &seeds[1],
            None,
            0,
            dealt.keys(1),
            (&y[1], &z[1]),
            &mut s1,
        )?;
        run_pair(&mut p0, &mut p1, &backend)?;
        let [o0, o1] = outputs(&p0, &p1)?;
        let got: Vec<u64> = o0.iter().zip(&o1).map(|(a, b)| ring.add(*a, *b)).collect();
        stats.compare(&format!("trunc, opened ({})", eval.name()), &got, &want);
        let (mut q0, mut q1) = (vec![0u64; N], vec![0u64; N]);
        p0.square_shares(&mut q0)?;
        p1.square_shares(&mut q1)?;
        memcheck::declassify(q0.as_mut_slice());
        memcheck::declassify(q1.as_mut_slice());
        let got: Vec<u64> = q0.iter().zip(&q1).map(|(a, b)| ring.add(*a, *b)).collect();
        stats.compare(&format!("trunc, squared ({})", eval.name()), &got, &squares);
    }
    Ok(())
}

/// A LayerNorm's centring and sum of squares in one round
/// (`CentreSquare`): rows of 24 values with their mean in the gap; each
/// message is declassified as it leaves its party, and the centred rows
/// and sums are checked.
fn centre_square_case(
    b: &Backends<'_>,
    inputs: &mut PublicInputs,
    stats: &mut GateStats,
) -> HarnessResult<()> {
    let (ring, d, rows) = (Width::W64, 24, 6);
    let g = CentreSquare::new(ring, (Width::of(40), 16), 65_536 / 24, d)?;
    let rs: Vec<u64> = signed_inputs(ring, 20, inputs)
        .into_iter()
        .cycle()
        .take(rows * d)
        .collect();
    let mut want = vec![0u64; rows * d + rows];
    {
        let (ys, vs) = want.split_at_mut(rows * d);
        for ((r, y), v) in rs.chunks_exact(d).zip(ys.chunks_exact_mut(d)).zip(vs) {
            *v = g.reference(r, y);
        }
    }
    let seeds = secret_seeds(inputs);
    let random: Vec<u64> = (0..rows * g.random_words())
        .map(|_| inputs.next())
        .collect();
    let lens = [g.key_params().key_len(); centre_square::KEYS];
    let dealt = Dealt::new(&lens, rows, g.explicit_words(), |k0, k1, ex| {
        let (k0, k1) = (
            &mut k0[..centre_square::KEYS],
            &mut k1[..centre_square::KEYS],
        );
        g.deal(b.fss, (seeds, None), &random, (0, rows), k0, k1, ex)
            .map(|_| ())
    })?;
    let r = secret_shares(ring, &rs, inputs);
    for eval in &b.evals {
        let backend = Declassify(*eval);
        let mut s0 = vec![0u64; g.scratch_words(rows)];
        let mut s1 = vec![0u64; g.scratch_words(rows)];
        let mut p0 = g.eval(
            b.fss,
            (Party::P0, &seeds[0]),
            0,
            dealt.keys(0),
            &r[0],
            &mut s0,
        )?;
        let mut p1 = g.eval(
            b.fss,
            (Party::P1, &seeds[1]),
            0,
            dealt.keys(1),
            &r[1],
            &mut s1,
        )?;
        run_pair(&mut p0, &mut p1, &backend)?;
        let [o0, o1] = outputs(&p0, &p1)?;
        let got: Vec<u64> = o0.iter().zip(&o1).map(|(a, b)| ring.add(*a, *b)).collect();
        stats.compare(&format!("centre and square ({})", eval.name()), &got, &want);
    }
    Ok(())
}

/// A reciprocal or rsqrt chain over `xs`.
fn chain_case(
    name: &str,
    chain: &Chain,
    xs: &[u64],
    b: &Backends<'_>,
    inputs: &mut PublicInputs,
    stats: &mut GateStats,
) -> HarnessResult<()> {
    let n = xs.len();
    let seeds = secret_seeds(inputs);
    let mut dealt = Vec::new();
    for s in 0..chain.count {
        let lens: Vec<usize> = (0..MAX_KEYS)
            .map_while(|k| chain.key_params(s, k).map(|p| p.key_len()))
            .collect();
        // A one-round truncation's key draws fresh dealer words: secret.
        let mut random: Vec<u64> = (0..n * chain.random_words(s))
            .map(|_| inputs.next())
            .collect();
        memcheck::mark_secret(random.as_mut_slice());
        dealt.push(Dealt::new(
            &lens,
            n,
            chain.explicit_words(s),
            |k0, k1, ex| {
                let mut prf = vec![Block::ZERO; chain.deal_scratch_blocks(n, DEAL_GROUP)];
                let mut words = vec![0u64; DealScratch::words(DEAL_GROUP)];
                let scratch = &mut DealScratch::new(&mut prf, &mut words);
                chain
                    .deal_step(s, b.fss, seeds, 0, n, k0, k1, ex, &random, scratch)
                    .map(|_| ())
            },
        )?);
    }
    let x = secret_shares(chain.ring, xs, inputs);
    let want: Vec<u64> = xs.iter().map(|x| chain.reference(*x)).collect();
    // Lookup tables are public.
    let mut store = vec![0u64; chain.tables_words()];
    let tables = chain.fill_tables(&mut store)?;
    for eval in &b.evals {
        let keys = |p: usize| {
            let mut k = [PartyKeys::default(); MAX_STEPS];
            for (k, d) in k.iter_mut().zip(&dealt) {
                *k = d.keys(p);
            }
            k
        };
        let mut s0 = vec![0u64; chain.scratch_words(n)];
        let mut s1 = vec![0u64; chain.scratch_words(n)];
        let mut p0 = ChainEval::new(
            chain,
            b.fss,
            Party::P0,
            seeds[0],
            0,
            n,
            keys(0),
            &x[0],
            &mut s0,
        )?
        .with_tables(tables);
        let mut p1 = ChainEval::new(
            chain,
            b.fss,
            Party::P1,
            seeds[1],
            0,
            n,
            keys(1),
            &x[1],
            &mut s1,
        )?
        .with_tables(tables);
        run_pair(&mut p0, &mut p1, &Declassify(*eval))?;
        let [o0, o1] = outputs(&p0, &p1)?;
        let got: Vec<u64> = o0
            .iter()
            .zip(&o1)
            .map(|(a, c)| chain.ring.add(*a, *c))
            .collect();
        stats.compare(&format!("{name} ({})", eval.name()), &got, &want);
    }
    Ok(())
}

/// Row maxima of `rows` rows of `len` signed values, then of a causal
/// block's rows (row `i` over its first `i + 1`).
fn max_case(
    b: &Backends<'_>,
    inputs: &mut PublicInputs,
    stats: &mut GateStats,
) -> HarnessResult<()> {
    let len = 13;
    // Two of its four levels in one round: both kinds of level run.
    let tree = || MaxTree::new(Width::W64, Width::of(32), len).map(|t| t.one_round_tail(2));
    max_tree_case(b, inputs, stats, &tree()?, 3)?;
    max_tree_case(b, inputs, stats, &tree()?.causal(len), len + 3)
}

fn max_tree_case(
    b: &Backends<'_>,
    inputs: &mut PublicInputs,
    stats: &mut GateStats,
    tree: &MaxTree,
    rows: usize,
) -> HarnessResult<()> {
    let (ring, len) = (tree.relu.ring(), tree.len);
    let seeds = secret_seeds(inputs);
    let mut dealt = Vec::new();
    for l in 0..tree.levels() {
        let count = tree.count(rows, l);
        let lens: Vec<usize> = (0..MAX_KEYS)
            .map_while(|k| tree.key_params(l, k).map(|p| p.key_len()))
            .collect();
        // A one-round level's keys draw fresh dealer words: secret.
        let mut random: Vec<u64> = (0..count * tree.random_words(l))
            .map(|_| inputs.next())
            .collect();
        memcheck::mark_secret(random.as_mut_slice());
        dealt.push(Dealt::new(
            &lens,
            count,
            tree.explicit_words(l),
            |k0, k1, ex| {
                let mut prf = vec![Block::ZERO; tree.deal_scratch_blocks(rows, DEAL_GROUP)];
                let mut words = vec![0u64; DealScratch::words(DEAL_GROUP)];
                let scratch = &mut DealScratch::new(&mut prf, &mut words);
                tree.deal_level(l, rows, b.fss, seeds, k0, k1, ex, &random, scratch)
                    .map(|_| ())
            },
        )?);
    }
    let values: Vec<u64> = (0..rows * len)
        .map(|_| ring.from_signed((inputs.next() as i64) >> 40))
        .collect();
    let v = secret_shares(ring, &values, inputs);
    let want: Vec<u64> = values
        .chunks(len)
        .enumerate()
        .map(|(i, r)| {
            r[..tree.row_len(i)]
                .iter()
                .copied()
                .max_by_key(|v| ring.to_signed(*v))
                .unwrap_or(0)
        })
        .collect();
    for eval in &b.evals {
        let keys = |p: usize| {
            let mut k = [PartyKeys::default(); MAX_LEVELS];
            for (k, d) in k.iter_mut().zip(&dealt) {
                *k = d.keys(p);
            }
            k
        };
        let mut s0 = vec![0u64; tree.scratch_words(rows)];
        let mut s1 = vec![0u64; tree.scratch_words(rows)];
        let mut p0 = MaxEval::new(
            tree,
            b.fss,
            Party::P0,
            seeds[0],
            rows,
            &v[0],
            keys(0),
            &mut s0,
        )?;
        let mut p1 = MaxEval::new(
            tree,
            b.fss,
            Party::P1,
            seeds[1],
            rows,
            &v[1],
            keys(1),
            &mut s1,
        )?;
        run_pair(&mut p0, &mut p1, &Declassify(*eval))?;
        let [o0, o1] = outputs(&p0, &p1)?;
        let got: Vec<u64> = o0.iter().zip(&o1).map(|(a, c)| ring.add(*a, *c)).collect();
        let kind = if tree.period == 0 { "" } else { "causal " };
        stats.compare(&format!("{kind}max tree ({})", eval.name()), &got, &want);
    }
    Ok(())
}

/// `bit · y` on XOR-shared bits and additive shares of y.
fn select_case(
    b: &Backends<'_>,
    inputs: &mut PublicInputs,
    stats: &mut GateStats,
) -> HarnessResult<()> {
    let sel = Select { ring: Width::W64 };
    let seeds = secret_seeds(inputs);
    let mut explicit = vec![0u64; N * select::EXPLICIT_WORDS];
    sel.deal(b.fss, seeds, 0, &mut explicit)?;
    memcheck::mark_secret(explicit.as_mut_slice());
    let bits: Vec<u64> = (0..N).map(|_| inputs.next() & 1).collect();
    let ys: Vec<u64> = (0..N).map(|_| inputs.next()).collect();
    let mut b0: Vec<u64> = (0..N).map(|_| inputs.next() & 1).collect();
    let mut b1: Vec<u64> = bits.iter().zip(&b0).map(|(x, a)| x ^ a).collect();
    memcheck::mark_secret(b0.as_mut_slice());
    memcheck::mark_secret(b1.as_mut_slice());
    let y = secret_shares(sel.ring, &ys, inputs);
    let want: Vec<u64> = bits.iter().zip(&ys).map(|(b, y)| b * y).collect();
    for eval in &b.evals {
        let mut s0 = vec![0u64; select::scratch_words(N)];
        let mut s1 = vec![0u64; select::scratch_words(N)];
        let mut p0 = SelectEval::new(
            &sel,
            b.fss,
            Party::P0,
            seeds[0],
            0,
            &[],
            &b0,
            &y[0],
            &mut s0,
        )?;
        let mut p1 = SelectEval::new(
            &sel,
            b.fss,
            Party::P1,
            seeds[1],
            0,
            &explicit,
            &b1,
            &y[1],
            &mut s1,
        )?;
        run_pair(&mut p0, &mut p1, &Declassify(*eval))?;
        let [o0, o1] = outputs(&p0, &p1)?;
        let got: Vec<u64> = o0
            .iter()
            .zip(&o1)
            .map(|(a, c)| a.wrapping_add(*c))
            .collect();
        stats.compare(&format!("select ({})", eval.name()), &got, &want);
    }
    Ok(())
}

/// `mpc` on its own: opening words and bits, with secret halves.
fn mpc_case(inputs: &mut PublicInputs, stats: &mut GateStats) -> HarnessResult<()> {
    let w = Width::of(37);
    let xs: Vec<u64> = (0..N).map(|_| w.reduce(inputs.next())).collect();
    let [x0, x1] = secret_shares(w, &xs, inputs);
    let mut m0 = vec![0u8; mpc::words_len(w, N)];
    let mut m1 = vec![0u8; mpc::words_len(w, N)];
    mpc::open_prepare(w, &x0, &mut m0)?;
    mpc::open_prepare(w, &x1, &mut m1)?;
    memcheck::declassify(m0.as_mut_slice());
    memcheck::declassify(m1.as_mut_slice());
    let mut opened = vec![0u64; N];
    mpc::open_finish(w, &x0, &m1, &mut opened)?;
    memcheck::declassify(opened.as_mut_slice());
    stats.compare("mpc open", &opened, &xs);
    let bits: Vec<u64> = xs.iter().map(|x| x & 1).collect();
    let mut b0: Vec<u64> = (0..N).map(|_| inputs.next() & 1).collect();
    let mut b1: Vec<u64> = bits.iter().zip(&b0).map(|(x, a)| x ^ a).collect();
    memcheck::mark_secret(b0.as_mut_slice());
    memcheck::mark_secret(b1.as_mut_slice());
    let mut m = vec![0u8; mpc::bits_len(N)];
    mpc::pack_bits(&b1, &mut m)?;
    memcheck::declassify(m.as_mut_slice());
    mpc::open_bits_finish(&b0, &m, &mut opened)?;
    memcheck::declassify(opened.as_mut_slice());
    stats.compare("mpc open bits", &opened, &bits);
    Ok(())
}

/// accel-cpu's matmul on secret operands, every path this CPU has, against
/// the naive product.
fn linalg_case(
    backends: &Backends<'_>,
    inputs: &mut PublicInputs,
    stats: &mut GateStats,
) -> HarnessResult<()> {
    let (m, k, n) = (5, 19, 7);
    let a: Vec<u64> = (0..m * k).map(|_| inputs.next()).collect();
    let b: Vec<u64> = (0..k * n).map(|_| inputs.next()).collect();
    let mut want = vec![0u64; m * n];
    linalg::matmul_naive(&a, &b, &mut want, m, k, n)?;
    for path in linalg::Path::available() {
        let (mut a, mut b) = (a.clone(), b.clone());
        memcheck::mark_secret(a.as_mut_slice());
        memcheck::mark_secret(b.as_mut_slice());
        let mut c = vec![0u64; m * n];
        path.matmul(&a, &b, &mut c, m, k, n)?;
        memcheck::declassify(c.as_mut_slice());
        stats.compare(&format!("matmul ({})", path.name()), &c, &want);
    }
    // The backend trait's matmul, as host's online steps call it.
    let shape = MatShape {
        batches: 1,
        m,
        k,
        n,
        transpose_b: false,
        accumulate: false,
    };
    for eval in &backends.evals {
        let (mut a, mut b) = (a.clone(), b.clone());
        memcheck::mark_secret(a.as_mut_slice());
        memcheck::mark_secret(b.as_mut_slice());
        let mut c = vec![0u64; m * n];
        eval.matmul(&shape, &a, &b, &mut c)?;
        memcheck::declassify(c.as_mut_slice());
        stats.compare(&format!("BatchEval::matmul ({})", eval.name()), &c, &want);
    }
    Ok(())
}

/// Signed fixed-point inputs within `k` bits, half of them near zero.
fn signed_inputs(ring: Width, k: u32, inputs: &mut PublicInputs) -> Vec<u64> {
    (0..N)
        .map(|i| {
            let r = inputs.next() as i64;
            let shift = if i % 2 == 0 {
                64 - (FRAC + 4)
            } else {
                64 - (k - 1)
            };
            ring.from_signed(r >> shift)
        })
        .collect()
}

/// Every gate case, chain, tree, select, `mpc` and linalg.
pub fn run(b: &Backends<'_>, inputs: &mut PublicInputs) -> HarnessResult<GateStats> {
    let ring = Width::W64;
    let mut stats = GateStats::default();
    let k = 26;
    let xs = signed_inputs(ring, k, inputs);
    let gelu = activation::gelu(GeluForm::Erf, ring, Width::of(k), FRAC)?;
    gate_case("gelu", &gelu, &xs, b, inputs, &mut stats)?;
    // The plans' GeLU: the same spline with dealer monomials.
    let gelu = activation::gelu_monomials(GeluForm::Erf, ring, Width::of(k), FRAC)?;
    gate_case("gelu, dealer monomials", &gelu, &xs, b, inputs, &mut stats)?;
    // Decode passes' activations: pieces of degree 1, so other circuits
    // (13 and 22 intervals; Beaver and dealer-monomial Φ).
    let gelu = activation::gelu(GeluForm::TanhLinear, ring, Width::of(k), FRAC)?;
    gate_case("gelu tanh, degree 1", &gelu, &xs, b, inputs, &mut stats)?;
    let silu = activation::silu(SiluForm::Linear, ring, Width::of(k), FRAC)?;
    gate_case("silu, degree 1", &silu, &xs, b, inputs, &mut stats)?;
    gate_case(
        "relu",
        &relu(ring, Width::of(k))?,
        &xs,
        b,
        inputs,
        &mut stats,
    )?;
    let xs = signed_inputs(ring, 40, inputs);
    for (name, shift) in [
        ("trunc ARS", Shift::Arithmetic),
        ("trunc TR", Shift::Reduce),
    ] {
        let gate = trunc(ring, Width::of(40), FRAC, shift, Range::Exact)?;
        gate_case(name, &gate, &xs, b, inputs, &mut stats)?;
    }
    trunc_open_case(b, inputs, &mut stats)?;
    centre_square_case(b, inputs, &mut stats)?;
    let nexp = activation::nexp(NexpForm::Quadratic, ring, Width::of(24), FRAC)?;
    let xs: Vec<u64> = (0..N).map(|_| inputs.next() >> (64 - 18)).collect();
    gate_case("nexp", &nexp, &xs, b, inputs, &mut stats)?;
    let nexp = activation::nexp(NexpForm::Linear, ring, Width::of(24), FRAC)?;
    gate_case("nexp, degree 1", &nexp, &xs, b, inputs, &mut stats)?;
    let recip = InverseScales {
        frac_in: FRAC,
        k_in: 23,
        lo_bits: FRAC,
        frac_out: 24,
    };
    let rsqrt = InverseScales {
        frac_in: 24,
        k_in: 44,
        lo_bits: 0,
        frac_out: 24,
    };
    for (name, kind, sc, lo, hi) in [
        (
            "recip chain",
            Inverse::Recip,
            recip,
            1u64 << FRAC,
            1u64 << 22,
        ),
        ("rsqrt chain", Inverse::Rsqrt, rsqrt, 1u64 << 12, 1u64 << 44),
    ] {
        let chain = inverse(kind, ring, sc)?;
        let xs: Vec<u64> = (0..N).map(|_| lo + inputs.next() % (hi - lo)).collect();
        chain_case(name, &chain, &xs, b, inputs, &mut stats)?;
        // The table form (decode passes) on a few elements: each expands
        // a DPF over its whole domain.
        let table = inverse_table(kind, ring, sc)?;
        let name = format!("{name}, table form");
        chain_case(&name, &table, &xs[..4], b, inputs, &mut stats)?;
    }
    max_case(b, inputs, &mut stats)?;
    select_case(b, inputs, &mut stats)?;
    mpc_case(inputs, &mut stats)?;
    linalg_case(b, inputs, &mut stats)?;
    Ok(stats)
}

/// The planted run's library part: GeLU through `Serial`, whose DCF walk
/// and Φ block program carry core's `ct-planted` leaks when it is enabled.
pub fn planted(b: &Backends<'_>, inputs: &mut PublicInputs) -> HarnessResult<GateStats> {
    let ring = Width::W64;
    let mut stats = GateStats::default();
    let xs = signed_inputs(ring, 26, inputs);
    let gelu = activation::gelu(GeluForm::Erf, ring, Width::of(26), FRAC)?;
    gate_case("gelu", &gelu, &xs, b, inputs, &mut stats)?;
    Ok(stats)
}
