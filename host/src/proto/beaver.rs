//! Secret × secret products by Beaver triples: matrix products, row
//! products (and elementwise ones, a row product with one column) and
//! squares. Each party's triple is expanded from its seed; P1's section
//! holds only its share of the product, `C₁ = A·B − C₀`. A matrix
//! product's operand may be an opened tensor ([`crate::plan::Kind::Open`]): its masked
//! values and mask shares are at hand, so only the other operand is opened
//! (nothing at all when both are), and the dealer takes its mask from what
//! it kept of the opening.

use rayon::prelude::*;
use suffuse_core::batch::BatchEval;
use suffuse_core::fss::Party;
use suffuse_core::prg::Prg;
use zeroize::Zeroizing;

use super::material::words_bytes;
use super::{At, Cursor, DealError, Dealt, Emit, Online, ProtoError, Step};
use crate::exec::{self, ExecError, Store};
use crate::net::{get_words, put_words};
use crate::plan::{Plan, step};

/// Triple material and products of it: wiped when dropped.
type Secret = Zeroizing<Vec<u64>>;

/// `n` words from a seeded stream.
pub(super) fn words(seed: &[u8; 16], stream: u64, n: usize) -> Secret {
    let mut prg = Prg::with_stream(seed, stream);
    let mut bytes = Zeroizing::new(vec![0u8; n * 8]);
    prg.fill(&mut bytes);
    Zeroizing::new(get_words(&bytes))
}

/// A triple's `(A_b, B_b, C_0)` from party b's seed: A has `na` words, B
/// `nb`, C `nc`; C_0 only for P0 (`with_c`).
fn triple(seed: &[u8; 16], [na, nb, nc]: [usize; 3], with_c: bool) -> (Secret, Secret, Secret) {
    let c = match with_c {
        true => words(seed, 2, nc),
        false => Secret::default(),
    };
    (words(seed, 0, na), words(seed, 1, nb), c)
}

/// Bytes of `party`'s section after the seed: P1's `c` words of C₁.
fn c1_len(party: Party, c: usize) -> usize {
    usize::from(party == Party::P1) * words_bytes(c)
}

/// Both parties' triples from their seeds: `(A₀, B₀, C₀)` and `(A₁, B₁)`.
fn both(seeds: &[[u8; 16]; 2], sizes: [usize; 3]) -> [(Secret, Secret, Secret); 2] {
    [
        triple(&seeds[0], sizes, true),
        triple(&seeds[1], sizes, false),
    ]
}

/// This party's share of the product: P0 expands C₀, P1 reads C₁.
fn product_share(
    party: Party,
    seed: &[u8; 16],
    n: usize,
    cur: &mut Cursor<'_>,
) -> Result<Secret, ProtoError> {
    let c = match party {
        Party::P0 => words(seed, 2, n),
        Party::P1 => Zeroizing::new(get_words(cur.take(words_bytes(n))?)),
    };
    cur.done()?;
    Ok(c)
}

/// `x − r` elementwise.
pub(super) fn masked(x: &[u64], r: &[u64]) -> impl Iterator<Item = u64> {
    x.iter().zip(r).map(|(v, r)| v.wrapping_sub(*r))
}

/// `a + b` elementwise, wiped when dropped.
fn sum(a: &[u64], b: &[u64]) -> Secret {
    Zeroizing::new(a.iter().zip(b).map(|(x, y)| x.wrapping_add(*y)).collect())
}

/// Emits P1's share `C₁ = product − C₀` (P0's section is its seed only).
fn emit_c1(mut c1: Secret, c0: &[u64], emit: &mut Emit<'_>) -> Result<(), DealError> {
    for (x, y) in c1.iter_mut().zip(c0) {
        *x = x.wrapping_sub(*y);
    }
    let mut out = [Vec::new(), Vec::new()];
    put_words(&mut out[1], &c1);
    Ok(emit(Dealt::Each(out))?)
}

/// Opens words: sends this party's, returns the sums.
pub(super) fn open_words(
    on: &mut Online<'_>,
    step: u32,
    mine: &[u64],
) -> Result<Vec<u64>, ProtoError> {
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

/// `Kind::MatMul`: `batches` products `[m×k]·[k×n]` of tensors a and b.
pub(super) struct MatMul<'a> {
    at: At<'a>,
    a: usize,
    b: usize,
    transpose_b: bool,
    dims: [usize; 4],
}

impl<'a> MatMul<'a> {
    pub(super) fn of(at: At<'a>, s: &step::MatMul) -> Self {
        MatMul {
            at,
            a: s.a,
            b: s.b,
            transpose_b: s.transpose_b,
            dims: [s.batches, s.m, s.k, s.n],
        }
    }

    fn shape(&self, accumulate: bool) -> suffuse_core::batch::MatShape {
        let [batches, m, k, n] = self.dims;
        exec::matmul_shape(self.transpose_b, batches, m, k, n, accumulate)
    }

    /// Words of A, B and C.
    fn sizes(&self) -> [usize; 3] {
        let [batches, m, k, n] = self.dims;
        [batches * m * k, batches * k * n, batches * m * n]
    }

    /// The tensors of A and B.
    fn operands(&self) -> [usize; 2] {
        [self.a, self.b]
    }
}

impl Step for MatMul<'_> {
    fn body_len(&self, party: Party) -> usize {
        c1_len(party, self.sizes()[2])
    }

    fn deal(
        &self,
        fss: &dyn BatchEval,
        seeds: [[u8; 16]; 2],
        opened: &Store,
        emit: &mut Emit<'_>,
    ) -> Result<(), DealError> {
        let sizes = self.sizes();
        // Each operand's whole mask: kept from its opening, or this
        // step's, from both seeds.
        let mut masks = [Secret::default(), Secret::default()];
        for (i, (t, m)) in self.operands().into_iter().zip(&mut masks).enumerate() {
            let stream = i as u64;
            *m = match self.at.plan.tensors[t].paired {
                true => Zeroizing::new(opened.get(self.at.plan, t)?[sizes[i]..].to_vec()),
                false => sum(
                    &words(&seeds[0], stream, sizes[i]),
                    &words(&seeds[1], stream, sizes[i]),
                ),
            };
        }
        let mut c1 = Zeroizing::new(vec![0u64; sizes[2]]);
        exec::matmul(fss, self.shape(false), &masks[0], &masks[1], &mut c1)?;
        emit_c1(c1, &words(&seeds[0], 2, sizes[2]), emit)
    }

    fn run(
        &self,
        on: &mut Online<'_>,
        seed: &[u8; 16],
        cur: &mut Cursor<'_>,
        store: &Store,
    ) -> Result<Vec<u64>, ProtoError> {
        let (plan, sizes) = (self.at.plan, self.sizes());
        let mut z = product_share(on.party, seed, sizes[2], cur)?;
        // Open E = X − A and F = Y − B for the operands not opened yet.
        let mut own = [Secret::default(), Secret::default()];
        let mut mine = Vec::new();
        for (i, (t, m)) in self.operands().into_iter().zip(&mut own).enumerate() {
            if !plan.tensors[t].paired {
                *m = words(seed, i as u64, sizes[i]);
                mine.extend(masked(store.get(plan, t)?, m));
            }
        }
        let opened = match mine.is_empty() {
            true => Vec::new(),
            false => open_words(on, self.at.step, &mine)?,
        };
        let mut fresh = opened.as_slice();
        let mut part = |i: usize| -> Result<(&[u64], &[u64]), ProtoError> {
            let t = self.operands()[i];
            if plan.tensors[t].paired {
                return Ok(store.get(plan, t)?.split_at(sizes[i]));
            }
            let (e, rest) = fresh.split_at(sizes[i]);
            fresh = rest;
            Ok((e, &own[i]))
        };
        let ((e, ta), (f, tb)) = (part(0)?, part(1)?);
        // XY = EF + EB + AF + AB: P0 takes E(F + B₀) + A₀F + C₀, P1 takes
        // E·B₁ + A₁F + C₁.
        let with_f;
        let right = match on.party {
            Party::P0 => {
                with_f = sum(f, tb);
                &with_f[..]
            }
            Party::P1 => tb,
        };
        exec::matmul(on.fss, self.shape(true), e, right, &mut z)?;
        exec::matmul(on.fss, self.shape(true), ta, f, &mut z)?;
        Ok(std::mem::take(&mut *z))
    }

    fn reference(&self, store: &Store, la: &dyn BatchEval) -> Result<Vec<u64>, ExecError> {
        let mut y = vec![0u64; self.sizes()[2]];
        let [a, b] = self.operands().map(|t| value(self.at.plan, store, t));
        exec::matmul(la, self.shape(false), &a?, &b?, &mut y)?;
        Ok(y)
    }
}

/// A tensor's values: for an opened tensor, its masked values plus its
/// mask (the reference holds the values and zeros).
fn value(plan: &Plan, store: &Store, t: usize) -> Result<Vec<u64>, ExecError> {
    let v = store.get(plan, t)?;
    Ok(match plan.tensors[t].paired {
        true => {
            let (e, a) = v.split_at(v.len() / 2);
            e.iter().zip(a).map(|(e, a)| e.wrapping_add(*a)).collect()
        }
        false => v.to_vec(),
    })
}

/// `Kind::MulRows` (`x[r, c]·v[r]` over `rows × cols`) and `Kind::Mul`
/// (elementwise: one column).
pub(super) struct RowProduct<'a> {
    at: At<'a>,
    x: usize,
    v: usize,
    rows: usize,
    cols: usize,
}

impl<'a> RowProduct<'a> {
    /// `Kind::MulRows`: each row of `x` by its factor in `v`.
    pub(super) fn rows(at: At<'a>, s: &step::MulRows) -> Self {
        let t = &at.plan.tensors[s.x];
        let (rows, cols) = (t.rows, t.cols);
        RowProduct {
            at,
            x: s.x,
            v: s.v,
            rows,
            cols,
        }
    }

    /// `Kind::Mul`: elementwise, as rows of one column.
    pub(super) fn elementwise(at: At<'a>, s: &step::Mul) -> Self {
        let rows = at.plan.tensors[s.a].len();
        RowProduct {
            at,
            x: s.a,
            v: s.b,
            rows,
            cols: 1,
        }
    }

    /// Words of a, b and c.
    fn sizes(&self) -> [usize; 3] {
        [self.rows * self.cols, self.rows, self.rows * self.cols]
    }

    /// `x[r, c]·v[r]`, row by row.
    fn products(&self, x: &[u64], v: &[u64]) -> Vec<u64> {
        (x.chunks(self.cols.max(1)).zip(v))
            .flat_map(|(row, f)| row.iter().map(move |e| e.wrapping_mul(*f)))
            .collect()
    }
}

impl Step for RowProduct<'_> {
    fn body_len(&self, party: Party) -> usize {
        c1_len(party, self.sizes()[2])
    }

    fn deal(
        &self,
        _: &dyn BatchEval,
        seeds: [[u8; 16]; 2],
        _: &Store,
        emit: &mut Emit<'_>,
    ) -> Result<(), DealError> {
        let [(a0, b0, c0), (a1, b1, _)] = both(&seeds, self.sizes());
        let c1 = Zeroizing::new(self.products(&sum(&a0, &a1), &sum(&b0, &b1)));
        emit_c1(c1, &c0, emit)
    }

    fn run(
        &self,
        on: &mut Online<'_>,
        seed: &[u8; 16],
        cur: &mut Cursor<'_>,
        store: &Store,
    ) -> Result<Vec<u64>, ProtoError> {
        let (p0, cols) = (on.party == Party::P0, self.cols);
        let mut z = product_share(on.party, seed, self.sizes()[2], cur)?;
        let (ta, tb, _) = triple(seed, self.sizes(), false);
        let mut mine: Vec<u64> = masked(store.get(self.at.plan, self.x)?, &ta).collect();
        mine.extend(masked(store.get(self.at.plan, self.v)?, &tb));
        let opened = open_words(on, self.at.step, &mine)?;
        let (e, f) = opened.split_at(self.rows * cols);
        // x·v = e·f + e·b + a·f + c, e·f by P0 only.
        z.par_chunks_mut(cols.max(1))
            .enumerate()
            .for_each(|(r, row)| {
                for (col, zv) in row.iter_mut().enumerate() {
                    let i = r * cols + col;
                    let s = zv
                        .wrapping_add(e[i].wrapping_mul(tb[r]))
                        .wrapping_add(ta[i].wrapping_mul(f[r]));
                    *zv = s.wrapping_add(e[i].wrapping_mul(f[r]) * p0 as u64);
                }
            });
        Ok(std::mem::take(&mut *z))
    }

    fn reference(&self, store: &Store, _: &dyn BatchEval) -> Result<Vec<u64>, ExecError> {
        let (x, v) = (
            store.get(self.at.plan, self.x)?,
            store.get(self.at.plan, self.v)?,
        );
        Ok(self.products(x, v))
    }
}

/// `Kind::Square`: `x²` elementwise.
pub(super) struct Square<'a> {
    pub(super) at: At<'a>,
    pub(super) x: usize,
}

impl Square<'_> {
    /// Words of a, (no b) and c.
    fn sizes(&self) -> [usize; 3] {
        let n = self.at.plan.tensors[self.x].len();
        [n, 0, n]
    }
}

impl Step for Square<'_> {
    fn body_len(&self, party: Party) -> usize {
        c1_len(party, self.sizes()[2])
    }

    fn deal(
        &self,
        _: &dyn BatchEval,
        seeds: [[u8; 16]; 2],
        _: &Store,
        emit: &mut Emit<'_>,
    ) -> Result<(), DealError> {
        let [(a0, _, c0), (a1, _, _)] = both(&seeds, self.sizes());
        let a = sum(&a0, &a1);
        emit_c1(
            Zeroizing::new(a.iter().map(|a| a.wrapping_mul(*a)).collect()),
            &c0,
            emit,
        )
    }

    fn run(
        &self,
        on: &mut Online<'_>,
        seed: &[u8; 16],
        cur: &mut Cursor<'_>,
        store: &Store,
    ) -> Result<Vec<u64>, ProtoError> {
        let p0 = on.party == Party::P0;
        let c = product_share(on.party, seed, self.sizes()[2], cur)?;
        let (ta, _, _) = triple(seed, self.sizes(), false);
        let mine: Vec<u64> = masked(store.get(self.at.plan, self.x)?, &ta).collect();
        let e = open_words(on, self.at.step, &mine)?;
        // x² = e² + 2ea + a², e² by P0 only.
        Ok((0..e.len())
            .into_par_iter()
            .map(|i| {
                let s = c[i].wrapping_add(e[i].wrapping_mul(ta[i]).wrapping_mul(2));
                s.wrapping_add(e[i].wrapping_mul(e[i]) * p0 as u64)
            })
            .collect())
    }

    fn reference(&self, store: &Store, _: &dyn BatchEval) -> Result<Vec<u64>, ExecError> {
        Ok(store
            .get(self.at.plan, self.x)?
            .iter()
            .map(|v| v.wrapping_mul(*v))
            .collect())
    }
}
