//! `Kind::Open`: a tensor opened once under a fresh mask, for every later
//! product that reads it. Each party's mask share `A_b` is expanded from
//! its seed, so the section is the seed alone; the opened `E = x − A` and
//! `A_b` together are the paired output ([`crate::plan::TensorInfo::paired`]).
//!
//! Security: `E` is masked by the fresh, uniform `A`, like every Beaver
//! opening. What is new is that `A` stays in use after the opening: a
//! product reading the pair takes `E` and `A_b` in place of opening its
//! operand again, with its own dealt share of `A·B` for the other
//! operand's fresh `B`. `A` therefore masks one value only, the one `E`
//! was opened from; layout operations move value and mask together, and
//! the plan never writes an opened tensor in place (a decoder's cache
//! grows by appending rows opened under fresh masks).

use suffuse_core::batch::BatchEval;
use suffuse_core::fss::Party;
use zeroize::Zeroizing;

use super::beaver::{masked, open_words, words};
use super::{At, Cursor, Online, ProtoError, Step};
use crate::exec::{ExecError, Store};

/// `Kind::Open` of tensor `x`.
pub(super) struct Open<'a> {
    pub(super) at: At<'a>,
    pub(super) x: usize,
}

impl Open<'_> {
    fn n(&self) -> usize {
        self.at.plan.tensors[self.x].len()
    }
}

impl Step for Open<'_> {
    fn body_len(&self, _: Party) -> usize {
        0
    }

    fn mask(&self, seeds: &[[u8; 16]; 2]) -> Option<Vec<u64>> {
        let n = self.n();
        let (a0, a1) = (words(&seeds[0], 0, n), words(&seeds[1], 0, n));
        let mut out = vec![0u64; n];
        out.extend(a0.iter().zip(a1.iter()).map(|(x, y)| x.wrapping_add(*y)));
        Some(out)
    }

    fn run(
        &self,
        on: &mut Online<'_>,
        seed: &[u8; 16],
        cur: &mut Cursor<'_>,
        store: &Store,
    ) -> Result<Vec<u64>, ProtoError> {
        cur.done()?;
        let a = words(seed, 0, self.n());
        let mine: Zeroizing<Vec<u64>> =
            Zeroizing::new(masked(store.get(self.at.plan, self.x)?, &a).collect());
        let mut out = open_words(on, self.at.step, &mine)?;
        out.extend_from_slice(&a);
        Ok(out)
    }

    fn reference(&self, store: &Store, _: &dyn BatchEval) -> Result<Vec<u64>, ExecError> {
        let mut out = store.get(self.at.plan, self.x)?.to_vec();
        out.resize(2 * self.n(), 0);
        Ok(out)
    }
}
