//! [`BatchEval`], the accelerator boundary, and [`Serial`], its reference
//! implementation.
//!
//! Gates hand whole tensors of FSS evaluations to a `BatchEval` through
//! slices only. Implementations live outside core (`suffuse-accel-cpu`,
//! `suffuse-accel-cuda`) and must match [`Serial`] bit for bit; the shared
//! conformance harness in `suffuse-tests` checks that.

use crate::error::Error;
use crate::fss::{self, KeyBatch, Party};
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

/// Batched evaluation of DCF/DPF keys at public points.
pub trait BatchEval {
    /// A short name for reports, such as `"serial"` or `"cpu"`.
    fn name(&self) -> &'static str;

    /// Evaluates each key at `points.len() / keys.count()` consecutive points:
    /// `out[q] = Eval(keys.key(q / per_key), points[q])`, points taken mod
    /// `2^k`. Bit outputs are 0 or 1; ring outputs are canonical words.
    fn eval(
        &self,
        keys: &KeyBatch<'_>,
        points: &[u64],
        out: &mut [u64],
    ) -> Result<EvalStats, Error>;

    /// Evaluates each DPF key at every point of its domain:
    /// `out[i · 2^k + x] = Eval(keys.key(i), x)`.
    fn eval_full_domain(&self, keys: &KeyBatch<'_>, out: &mut [u64]) -> Result<EvalStats, Error>;

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

impl BatchEval for Serial {
    fn name(&self) -> &'static str {
        "serial"
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
