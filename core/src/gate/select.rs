//! Select: `b·y` for an XOR-shared bit b and an additively shared y.
//!
//! The dealer gives a random bit ρ (XOR- and additively shared), a random
//! `a` and `[ρ·a]`. The parties open `e = b ⊕ ρ` and `d = y − a`; then with
//! `b = e + (1 − 2e)·ρ` and `y = d + a`:
//!
//! `b·y = e·d + e·a + (1 − 2e)·(d·ρ + ρ·a)`.
//!
//! One round; n + 1 bits sent; P1 holds `[ρ]` and `[ρ·a]` explicitly, every
//! other share comes from the seeds.

use crate::batch::BatchEval;
use crate::error::Error;
use crate::fss::Party;
use crate::gate::Protocol;
use crate::mpc;
use crate::prg::{Block, Domain, Hasher};
use crate::ring::{Width, cast};

/// The select protocol over a ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Select {
    /// The ring of y.
    pub ring: Width,
}

/// Explicit words P1 holds per element: `[ρ]` and `[ρ·a]`.
pub const EXPLICIT_WORDS: usize = 2;

/// Elements per PRF batch: 2 KiB of blocks and 2 KiB of words per party on
/// the stack, small enough for a microcontroller's call budget.
const CHUNK: usize = 64;

/// Seeded words per element: ρ's XOR share (bit 0), `[a]`, P0's `[ρ]` and
/// `[ρ·a]`.
fn seeded(h: &dyn Hasher, seed: &[u8; 16], first: u64, n: usize, out: &mut [[u64; 4]]) {
    let s = Block::from_bytes(*seed);
    let mut blocks = [Block::ZERO; 2 * CHUNK];
    let mut done = 0;
    while done < n {
        let c = CHUNK.min(n - done);
        for e in 0..c {
            for slot in 0..2usize {
                let index = cast::u128_from_u64(first + cast::u64_from_usize(done + e))
                    | (cast::u128_from_u64(cast::u64_from_usize(slot)) << 64);
                blocks[2 * e + slot] = s ^ Block::from_bytes(index.to_le_bytes());
            }
        }
        h.hash_many(Domain::Prf, &mut blocks[..2 * c]);
        for e in 0..c {
            out[done + e] = [
                blocks[2 * e].low64(),
                blocks[2 * e].high64(),
                blocks[2 * e + 1].low64(),
                blocks[2 * e + 1].high64(),
            ];
        }
        done += c;
    }
}

impl Select {
    /// Bytes sent per batch of `n`.
    pub const fn send_len(&self, n: usize) -> usize {
        mpc::bits_len(n) + mpc::words_len(self.ring, n)
    }

    /// Deals `count` elements: P1's explicit words (`2·count`).
    pub fn deal(
        &self,
        h: &dyn Hasher,
        seeds: [[u8; 16]; 2],
        first: u64,
        explicit: &mut [u64],
    ) -> Result<(), Error> {
        let w = self.ring;
        let n = explicit.len() / EXPLICIT_WORDS;
        if explicit.len() != n * EXPLICIT_WORDS {
            return Err(Error::BufferLength);
        }
        let mut s0 = [[0u64; 4]; CHUNK];
        let mut s1 = [[0u64; 4]; CHUNK];
        let mut done = 0;
        while done < n {
            let c = CHUNK.min(n - done);
            seeded(h, &seeds[0], first + cast::u64_from_usize(done), c, &mut s0);
            seeded(h, &seeds[1], first + cast::u64_from_usize(done), c, &mut s1);
            for e in 0..c {
                let rho = (s0[e][0] ^ s1[e][0]) & 1;
                let a = w.add(s0[e][1], s1[e][1]);
                let rho_a = a & crate::prg::word_mask(rho);
                let out = &mut explicit[(done + e) * EXPLICIT_WORDS..];
                out[0] = w.sub(rho, s0[e][2]);
                out[1] = w.sub(w.reduce(rho_a), s0[e][3]);
            }
            done += c;
        }
        Ok(())
    }

    /// This party's message: `b ⊕ ρ` bits, then `y − a` words.
    #[allow(clippy::too_many_arguments)]
    fn prepare(
        &self,
        h: &dyn Hasher,
        seed: &[u8; 16],
        first: u64,
        bits: &[u64],
        y: &[u64],
        scratch: &mut [u64],
        send: &mut [u8],
    ) -> Result<(), Error> {
        let n = bits.len();
        let w = self.ring;
        if y.len() != n || scratch.len() < 2 * n || send.len() != self.send_len(n) {
            return Err(Error::BufferLength);
        }
        let mut words = [[0u64; 4]; CHUNK];
        let mut done = 0;
        while done < n {
            let c = CHUNK.min(n - done);
            seeded(h, seed, first + cast::u64_from_usize(done), c, &mut words);
            for e in 0..c {
                scratch[done + e] = (bits[done + e] ^ words[e][0]) & 1;
                scratch[n + done + e] = w.sub(y[done + e], w.reduce(words[e][1]));
            }
            done += c;
        }
        let (b, d) = send.split_at_mut(mpc::bits_len(n));
        mpc::pack_bits(&scratch[..n], b)?;
        mpc::open_prepare(w, &scratch[n..2 * n], d)
    }

    /// Finishes: this party's shares of `b·y` into `out`.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        h: &dyn Hasher,
        party: Party,
        seed: &[u8; 16],
        first: u64,
        explicit: &[u64],
        scratch: &mut [u64],
        recv: &[u8],
        out: &mut [u64],
    ) -> Result<(), Error> {
        let n = out.len();
        let w = self.ring;
        if recv.len() != self.send_len(n) || scratch.len() < 2 * n {
            return Err(Error::BufferLength);
        }
        if party == Party::P1 && explicit.len() != n * EXPLICIT_WORDS {
            return Err(Error::BufferLength);
        }
        let (b, d) = recv.split_at(mpc::bits_len(n));
        let (e_area, d_area) = scratch.split_at_mut(n);
        for (i, e) in e_area.iter_mut().enumerate() {
            *e = (*e ^ u64::from(b[i / 8] >> (i % 8))) & 1;
        }
        if !n.is_multiple_of(8) && b.last().is_some_and(|x| x >> (n % 8) != 0) {
            return Err(Error::Wire(crate::error::WireError::ReservedNonZero));
        }
        let d_area = &mut d_area[..n];
        crate::gate::wire_add(w, d_area, d)?;
        let pb = party.index();
        let mut words = [[0u64; 4]; CHUNK];
        let mut done = 0;
        while done < n {
            let c = CHUNK.min(n - done);
            seeded(h, seed, first + cast::u64_from_usize(done), c, &mut words);
            for k in 0..c {
                let i = done + k;
                let (e, dv) = (e_area[i], d_area[i]);
                let a = w.reduce(words[k][1]);
                let (rho, rho_a) = if pb == 0 {
                    (w.reduce(words[k][2]), w.reduce(words[k][3]))
                } else {
                    (
                        explicit[i * EXPLICIT_WORDS],
                        explicit[i * EXPLICIT_WORDS + 1],
                    )
                };
                let sign = w.sub(1, w.mul(2, e));
                let mut z = w.add(w.mul(e, a), w.mul(sign, w.add(w.mul(dv, rho), rho_a)));
                if pb == 0 {
                    z = w.add(z, w.mul(e, dv));
                }
                out[i] = z;
            }
            done += c;
        }
        Ok(())
    }
}

/// Scratch words a [`SelectEval`] needs for `n` elements: the inputs, the
/// opened values and the output.
pub const fn scratch_words(n: usize) -> usize {
    5 * n
}

/// One party's select over a batch, a one-round [`Protocol`].
pub struct SelectEval<'a> {
    sel: &'a Select,
    h: &'a dyn Hasher,
    party: Party,
    seed: [u8; 16],
    first: u64,
    explicit: &'a [u64],
    n: usize,
    /// Bits, y, the opened `e` and `d`, the output; `n` words each.
    s: &'a mut [u64],
    done: bool,
}

impl core::fmt::Debug for SelectEval<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SelectEval")
            .field("party", &self.party)
            .field("n", &self.n)
            .finish_non_exhaustive()
    }
}

impl<'a> SelectEval<'a> {
    /// Prepares party `party` to select on its XOR shares `bits` and
    /// additive shares `y` of elements `first..`, with P1's `explicit`
    /// words (empty for P0).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        sel: &'a Select,
        h: &'a dyn Hasher,
        party: Party,
        seed: [u8; 16],
        first: u64,
        explicit: &'a [u64],
        bits: &[u64],
        y: &[u64],
        scratch: &'a mut [u64],
    ) -> Result<SelectEval<'a>, Error> {
        let n = bits.len();
        let want = if party == Party::P1 {
            n * EXPLICIT_WORDS
        } else {
            0
        };
        if y.len() != n || explicit.len() != want || scratch.len() < scratch_words(n) {
            return Err(Error::BufferLength);
        }
        scratch[..n].copy_from_slice(bits);
        scratch[n..2 * n].copy_from_slice(y);
        Ok(SelectEval {
            sel,
            h,
            party,
            seed,
            first,
            explicit,
            n,
            s: scratch,
            done: false,
        })
    }
}

impl Protocol for SelectEval<'_> {
    fn rounds(&self) -> usize {
        1
    }

    fn send_len(&self, round: usize) -> usize {
        if round == 0 {
            self.sel.send_len(self.n)
        } else {
            0
        }
    }

    fn output_len(&self) -> usize {
        self.n
    }

    fn prepare(&mut self, round: usize, send: &mut [u8]) -> Result<(), Error> {
        if round != 0 || self.done {
            return Err(Error::Unsupported);
        }
        let n = self.n;
        let (inputs, rest) = self.s.split_at_mut(2 * n);
        let (bits, y) = inputs.split_at(n);
        self.sel.prepare(
            self.h,
            &self.seed,
            self.first,
            bits,
            y,
            &mut rest[..2 * n],
            send,
        )
    }

    fn finish(&mut self, round: usize, recv: &[u8], _: &dyn BatchEval) -> Result<(), Error> {
        if round != 0 || self.done {
            return Err(Error::Unsupported);
        }
        let n = self.n;
        let (opened, out) = self.s[2 * n..5 * n].split_at_mut(2 * n);
        self.sel.finish(
            self.h,
            self.party,
            &self.seed,
            self.first,
            self.explicit,
            opened,
            recv,
            out,
        )?;
        self.done = true;
        Ok(())
    }

    /// This party's shares of `b·y`.
    fn output(&self, out: &mut [u64]) -> Result<(), Error> {
        if !self.done {
            return Err(Error::Unsupported);
        }
        if out.len() != self.n {
            return Err(Error::BufferLength);
        }
        out.copy_from_slice(&self.s[4 * self.n..5 * self.n]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Serial;
    use crate::prg::{FixedKeyAes, Prg};
    use std::vec;
    use std::vec::Vec;

    #[test]
    fn select_multiplies_a_bit_by_a_value() {
        let aes = FixedKeyAes::new();
        let mut prg = Prg::new(&[6; 16]);
        for bits in [8, 64] {
            let w = Width::of(bits);
            let sel = Select { ring: w };
            let n = 300;
            let seeds = [[1u8; 16], [2u8; 16]];
            let mut explicit = vec![0u64; n * EXPLICIT_WORDS];
            sel.deal(&aes, seeds, 5, &mut explicit).unwrap();
            let b: Vec<u64> = (0..n).map(|_| prg.next_u64() & 1).collect();
            let y: Vec<u64> = (0..n).map(|_| w.reduce(prg.next_u64())).collect();
            let b0: Vec<u64> = (0..n).map(|_| prg.next_u64() & 1).collect();
            let b1: Vec<u64> = b.iter().zip(&b0).map(|(x, r)| x ^ r).collect();
            let y0: Vec<u64> = (0..n).map(|_| w.reduce(prg.next_u64())).collect();
            let y1: Vec<u64> = y.iter().zip(&y0).map(|(x, r)| w.sub(*x, *r)).collect();
            let dirty = crate::gate::testing::dirty;
            let (mut s0, mut s1) = (dirty(scratch_words(n), 0), dirty(scratch_words(n), 1));
            let mut e0 =
                SelectEval::new(&sel, &aes, Party::P0, seeds[0], 5, &[], &b0, &y0, &mut s0)
                    .unwrap();
            let mut e1 = SelectEval::new(
                &sel,
                &aes,
                Party::P1,
                seeds[1],
                5,
                &explicit,
                &b1,
                &y1,
                &mut s1,
            )
            .unwrap();
            let len = sel.send_len(n);
            let (mut m0, mut m1) = (vec![0u8; len], vec![0u8; len]);
            let traffic =
                crate::gate::run_pair(&mut e0, &mut e1, &Serial::new(), &mut m0, &mut m1).unwrap();
            assert_eq!((traffic.rounds, traffic.bytes_per_party), (1, len));
            let (mut z0, mut z1) = (vec![0u64; n], vec![0u64; n]);
            e0.output(&mut z0).unwrap();
            e1.output(&mut z1).unwrap();
            for i in 0..n {
                assert_eq!(w.add(z0[i], z1[i]), if b[i] == 1 { y[i] } else { 0 });
            }
        }
    }
}
