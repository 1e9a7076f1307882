//! [`Protocol`], the state machine every multi-round gate shares, and
//! [`run_pair`], the one in-memory driver of two parties.
//!
//! A protocol over a batch is built with this party's inputs, keys and
//! scratch. Then, for each round `i` in order, [`Protocol::prepare`] writes
//! the message to send and [`Protocol::finish`] consumes the peer's; when
//! every round is finished, [`Protocol::output`] writes this party's output
//! shares. Message lengths are public functions of the shape, so both
//! parties agree on them without talking, and a message of the wrong length
//! or a round out of order is an error, never a silent misuse.
//!
//! Single gates ([`super::Eval`]), chains ([`super::chain::ChainEval`]),
//! max trees ([`super::max::MaxEval`]) and select
//! ([`super::select::SelectEval`]) implement it; hosts run any of them
//! against a network the same way.

use crate::batch::BatchEval;
use crate::error::Error;

/// One party's side of a two-party protocol over a batch (sans-IO).
pub trait Protocol {
    /// Rounds of interaction.
    fn rounds(&self) -> usize;

    /// Bytes each party sends in round `round` (0 past the last round).
    fn send_len(&self, round: usize) -> usize;

    /// Words [`Protocol::output`] writes.
    fn output_len(&self) -> usize;

    /// Writes this party's message of round `round`, which must be the next
    /// unfinished round; `send` is exactly `send_len(round)` bytes.
    fn prepare(&mut self, round: usize, send: &mut [u8]) -> Result<(), Error>;

    /// Consumes the peer's message of round `round` (the one just
    /// prepared); DCF evaluation and local post-processing run on `backend`.
    fn finish(&mut self, round: usize, recv: &[u8], backend: &dyn BatchEval) -> Result<(), Error>;

    /// Writes this party's output shares (`output_len()` words) once every
    /// round has finished.
    fn output(&self, out: &mut [u64]) -> Result<(), Error>;
}

/// Bytes moved by a two-party run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Rounds.
    pub rounds: usize,
    /// Bytes each party sent.
    pub bytes_per_party: usize,
}

/// Runs both parties of a protocol in memory, exchanging messages through
/// `buf0`/`buf1` (each at least the largest round's size). For tests and
/// benchmarks; hosts run each party against a network instead.
pub fn run_pair(
    p0: &mut dyn Protocol,
    p1: &mut dyn Protocol,
    backend: &dyn BatchEval,
    buf0: &mut [u8],
    buf1: &mut [u8],
) -> Result<Traffic, Error> {
    let rounds = p0.rounds();
    if p1.rounds() != rounds {
        return Err(Error::Unsupported);
    }
    let mut bytes = 0;
    for i in 0..rounds {
        let len = p0.send_len(i);
        if p1.send_len(i) != len || buf0.len() < len || buf1.len() < len {
            return Err(Error::BufferLength);
        }
        p0.prepare(i, &mut buf0[..len])?;
        p1.prepare(i, &mut buf1[..len])?;
        p0.finish(i, &buf1[..len], backend)?;
        p1.finish(i, &buf0[..len], backend)?;
        bytes += len;
    }
    Ok(Traffic {
        rounds,
        bytes_per_party: bytes,
    })
}

/// The largest message of a protocol.
pub fn max_send_len(p: &dyn Protocol) -> usize {
    (0..p.rounds()).map(|i| p.send_len(i)).max().unwrap_or(0)
}
