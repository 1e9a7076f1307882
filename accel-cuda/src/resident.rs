//! Public operands kept in device memory across calls: a model's weights
//! are uploaded once per process, not once per product
//! ([`BatchEval::matmul_resident`](suffuse_core::batch::BatchEval::matmul_resident)). They count against the memory budget,
//! and the least recently used one is dropped when a new one needs room.

use suffuse_core::batch::{MatShape, Resident};

use crate::eval::Operand;
use crate::launcher::Launcher;
use crate::{CudaError, CudaEval, State};

/// One resident operand.
pub(crate) struct Entry<L: Launcher> {
    id: [u8; 16],
    /// The operand's length in words.
    len: usize,
    /// The buffer's length in words (at least `len`), as the pool counts it.
    words: usize,
    buf: L::Buffer,
    used: u64,
}

impl<L: Launcher> State<L> {
    /// The device address of operand `b`, uploaded now unless it is
    /// resident already.
    pub(crate) fn resident(&mut self, l: &L, b: &Resident<'_>) -> Result<u64, CudaError> {
        self.tick += 1;
        let tick = self.tick;
        if let Some(e) = (self.resident.iter_mut()).find(|e| e.id == b.id && e.len == b.words.len())
        {
            e.used = tick;
            return Ok(l.address(&e.buf));
        }
        // A different length under the same id is the host's error; the
        // stale copy is replaced rather than trusted.
        self.drop_resident(|e| e.id == b.id);
        let (words, mut buf) = loop {
            match self.pool.take(l, b.words.len()) {
                Ok(taken) => break taken,
                Err(CudaError::OverBudget { .. }) if !self.resident.is_empty() => {
                    let oldest = self.resident.iter().map(|e| e.used).min().unwrap_or(0);
                    self.drop_resident(|e| e.used == oldest);
                }
                Err(e) => return Err(e),
            }
        };
        if let Err(e) = l.upload(&mut buf, b.words) {
            self.pool.give(words, buf);
            return Err(e);
        }
        let at = l.address(&buf);
        self.resident.push(Entry {
            id: b.id,
            len: b.words.len(),
            words,
            buf,
            used: tick,
        });
        Ok(at)
    }

    /// Drops the resident operands `which` selects.
    fn drop_resident(&mut self, which: impl Fn(&Entry<L>) -> bool) {
        let (gone, kept): (Vec<_>, Vec<_>) = self.resident.drain(..).partition(|e| which(e));
        self.resident = kept;
        for e in gone {
            self.pool.release(e.words);
        }
    }

    /// Drops every resident operand (to make room for a call that needs
    /// the whole budget).
    pub(crate) fn drop_all_resident(&mut self) {
        self.drop_resident(|_| true);
    }
}

impl<L: Launcher> CudaEval<L> {
    /// A product with `b` resident on the device; when the budget cannot
    /// hold `b` beside the call's buffers, every resident operand is
    /// dropped and the product runs with `b` copied like any operand.
    pub(crate) fn matmul_resident_device(
        &self,
        shape: &MatShape,
        a: &[u64],
        b: &Resident<'_>,
        c: &mut [u64],
    ) -> Result<(), CudaError> {
        let l = &self.launcher;
        let first = {
            let mut st = self.lock();
            match st.resident(l, b) {
                Ok(at) => self.matmul_with(&mut st, shape, a, Operand::Device(at), c),
                Err(e) => Err(e),
            }
        };
        match first {
            Err(CudaError::OverBudget { .. }) => {
                let mut st = self.lock();
                st.drop_all_resident();
                self.matmul_with(&mut st, shape, a, Operand::Host(b.words), c)
            }
            other => other,
        }
    }
}
