//! Device memory under a budget: buffers are reused across calls, and
//! nothing is allocated past the budget the user set.
//!
//! The budget bounds everything [`CudaEval`](crate::CudaEval) holds on the
//! device: the buffers of the call in flight, the buffers kept for reuse and
//! resident public operands. A call larger than the budget is cut into
//! pieces by its caller ([`Pool::words_for_work`]); a single piece that does
//! not fit is an error, never an allocation past the budget.

use crate::CudaError;
use crate::launcher::Launcher;

/// Buffers kept for reuse, the budget and what has been used.
pub struct Pool<L: Launcher> {
    free: Vec<(usize, L::Buffer)>,
    held_bytes: usize,
    peak_bytes: usize,
    budget_bytes: usize,
}

impl<L: Launcher> Pool<L> {
    /// An empty pool that never holds more than `budget_bytes`.
    pub fn new(budget_bytes: usize) -> Pool<L> {
        Pool {
            free: Vec::new(),
            held_bytes: 0,
            peak_bytes: 0,
            budget_bytes,
        }
    }

    /// The budget in bytes.
    pub fn budget(&self) -> usize {
        self.budget_bytes
    }

    /// The most device memory held at once so far, in bytes.
    pub fn peak(&self) -> usize {
        self.peak_bytes
    }

    /// Words a call may spend on its working buffers: the budget less what
    /// stays resident, halved so that buffers kept from earlier calls rarely
    /// need to be dropped.
    pub fn words_for_work(&self, resident_bytes: usize) -> usize {
        self.budget_bytes.saturating_sub(resident_bytes) / 8 / 2
    }

    /// A buffer of at least `words` words: a kept one of close size, or a
    /// new one if the budget allows after dropping kept buffers.
    pub fn take(&mut self, launcher: &L, words: usize) -> Result<(usize, L::Buffer), CudaError> {
        let words = words.max(1);
        let fit = (self.free.iter().enumerate())
            .filter(|(_, (w, _))| *w >= words && *w <= words.saturating_mul(2))
            .min_by_key(|(_, (w, _))| *w)
            .map(|(i, _)| i);
        if let Some(i) = fit {
            return Ok(self.free.swap_remove(i));
        }
        let bytes = words.saturating_mul(8);
        while self.held_bytes.saturating_add(bytes) > self.budget_bytes && !self.free.is_empty() {
            let largest = (self.free.iter().enumerate())
                .max_by_key(|(_, (w, _))| *w)
                .map_or(0, |(i, _)| i);
            let (w, buf) = self.free.swap_remove(largest);
            drop(buf);
            self.held_bytes -= w * 8;
        }
        if self.held_bytes.saturating_add(bytes) > self.budget_bytes {
            return Err(CudaError::OverBudget {
                needed: bytes,
                held: self.held_bytes,
                budget: self.budget_bytes,
            });
        }
        let buf = launcher.alloc(words)?;
        self.held_bytes += bytes;
        self.peak_bytes = self.peak_bytes.max(self.held_bytes);
        Ok((words, buf))
    }

    /// Keeps `buf` (of `words` words) for reuse.
    pub fn give(&mut self, words: usize, buf: L::Buffer) {
        self.free.push((words, buf));
    }

    /// Forgets a buffer of `words` words that was taken and then dropped
    /// for good (an evicted resident operand).
    pub fn release(&mut self, words: usize) {
        self.held_bytes = self.held_bytes.saturating_sub(words.max(1) * 8);
    }
}
