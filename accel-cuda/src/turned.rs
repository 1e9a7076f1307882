//! Products with RoPE folded into the weights row by row
//! ([`BatchEval::turned_matmul`](suffuse_core::batch::BatchEval::turned_matmul),
//! `suffuse_turned_matmul` in `kernels/matmul.cu`): the weights and each
//! row's factors are uploaded once per call, the rows in pieces that fit
//! the memory budget.

// The launch passes raw device addresses; its unsafe block says why the
// buffers hold what the kernel reads.
#![allow(unsafe_code)]

use suffuse_core::batch::{Pairing, Turned};

use crate::eval::{matmul_dims, u64_of};
use crate::launcher::{Arg, Kernel, Launcher};
use crate::{CudaError, CudaEval};

impl<L: Launcher> CudaEval<L> {
    /// `c = a·B` with `t`'s factors applied, `t` checked by the caller.
    pub(crate) fn turned_matmul_device(
        &self,
        t: &Turned<'_>,
        a: &[u64],
        b: &[u64],
        c: &mut [u64],
    ) -> Result<(), CudaError> {
        let mut st = self.lock();
        let l = &self.launcher;
        let (k, n, tn) = (t.k, t.n, t.turned);
        let block = match t.pairing {
            Pairing::Adjacent => 2,
            Pairing::Halves(w) => w,
        };
        // Words per row of A, C and both factor tables; B once per piece.
        let per_row = (k + n + 2 * tn).max(1);
        let budget = st.pool.words_for_work(0).saturating_sub(k * n);
        let piece = (budget / per_row).max(1);
        let mut r = 0;
        while r < t.m {
            let end = t.m.min(r + piece);
            let rows = end - r;
            let sizes = [rows * k, k * n, rows * n, rows * tn, rows * tn];
            st.with_buffers(l, sizes, |_, bufs| {
                l.upload(&mut bufs[0], &a[r * k..end * k])?;
                l.upload(&mut bufs[1], b)?;
                l.upload(&mut bufs[3], &t.own[r * tn..end * tn])?;
                l.upload(&mut bufs[4], &t.other[r * tn..end * tn])?;
                let args = [
                    Arg::Ptr(l.address(&bufs[0])),
                    Arg::Ptr(l.address(&bufs[1])),
                    Arg::Ptr(l.address(&bufs[2])),
                    Arg::Ptr(l.address(&bufs[3])),
                    Arg::Ptr(l.address(&bufs[4])),
                    Arg::U64(u64_of(rows)),
                    Arg::U64(u64_of(k)),
                    Arg::U64(u64_of(n)),
                    Arg::U64(u64_of(tn)),
                    Arg::U64(u64_of(block)),
                    Arg::U32(t.frac),
                ];
                // SAFETY: `suffuse_turned_matmul`'s list; the buffers hold
                // the piece's rows of A (rows·k), B (k·n), C (rows·n) and
                // both factor tables (rows·turned), and `Turned::check`
                // holds: turned ≤ n, a whole number of blocks of an even
                // width, 1 ≤ frac ≤ 63.
                // One block per tile of C; the kernel uses the first half of
                // the two tiles' shared memory `matmul_dims` gives.
                unsafe { l.launch(Kernel::TurnedMatmul, matmul_dims(rows, n, 1), &args) }?;
                l.download(&bufs[2], &mut c[r * n..end * n])
            })?;
            r = end;
        }
        Ok(())
    }
}
