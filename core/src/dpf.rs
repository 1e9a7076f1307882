//! Distributed point functions: `f_{α,β}(x) = β` if `x = α`, else 0.
//!
//! Half-tree DPF keys with an early-terminated leaf block (see
//! [`crate::fss`]). Full-domain evaluation expands a small domain into a
//! caller buffer, which is how lookup tables are read obliviously.

use crate::error::Error;
use crate::fss::{self, KeyBatch, KeyRef, Kind, Params, Party};
use crate::prg::{Block, FixedKeyAes, Hasher};

/// Generates DPF keys for `β·[x = α]` into `key0` and `key1` (each
/// `params.key_len()` bytes). Returns the AES calls made.
#[allow(clippy::too_many_arguments)]
pub fn generate<H: Hasher + ?Sized, R: rand_core::CryptoRng + ?Sized>(
    aes: &H,
    params: &Params,
    alpha: u64,
    beta: u64,
    roots: [Block; 2],
    rng: &mut R,
    key0: &mut [u8],
    key1: &mut [u8],
) -> Result<u64, Error> {
    if params.kind() != Kind::Dpf {
        return Err(Error::KindMismatch);
    }
    // A DPF draws no randomness; `rng` keeps the signature of
    // `dcf::generate`, which the test oracles share.
    let _ = rng;
    let none: Option<&mut crate::prg::Prg> = None;
    fss::gen_pair(aes, params, alpha, beta, roots, none, key0, key1)
}

/// Evaluates one party's DPF key at one public point (taken mod `2^k`).
pub fn eval(
    aes: &FixedKeyAes,
    params: &Params,
    party: Party,
    key: &[u8],
    x: u64,
) -> Result<u64, Error> {
    if params.kind() != Kind::Dpf {
        return Err(Error::KindMismatch);
    }
    let keys = KeyBatch::new(*params, party, key)?;
    if keys.count() != 1 {
        return Err(Error::BufferLength);
    }
    let mut out = [0u64];
    fss::eval_queries(aes, &keys, 1, 0, &[x], &mut out, 1)?;
    Ok(out[0])
}

/// Evaluates one party's DPF key at every point: `out[x] = Eval(key, x)`,
/// with `out.len() = 2^k` (k ≤ 40). Returns the AES calls made.
pub fn eval_full_domain(
    aes: &FixedKeyAes,
    params: &Params,
    party: Party,
    key: &[u8],
    out: &mut [u64],
) -> Result<u64, Error> {
    if params.kind() != Kind::Dpf {
        return Err(Error::KindMismatch);
    }
    fss::full_domain(aes, params, party, KeyRef::whole(params, key)?, out)
}
