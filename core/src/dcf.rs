//! Distributed comparison functions: `f_{α,β}(x) = β` if `x < α`, else 0.
//!
//! Keys are half-tree DPF keys walked as comparisons (see [`crate::fss`]).
//! With bit output (XOR shares, β = 1) an evaluation over k-bit inputs costs
//! `k − 6` AES calls and the key is `16(k − 7) + 32` bytes: 720 bytes and
//! 44 calls at k = 50. Ring output (additive shares in Z_2^w) adds one value
//! hash and `⌈w/8⌉` key bytes per level.
//!
//! The gates use one bit-output key with threshold `r mod 2^k` (the wire's
//! mask) and evaluate it at several public points, because for any public β
//! and `x = x̂ − r mod 2^k`:
//!
//! `[x < β] = DCF_r((x̂ − β) mod 2^k) ⊕ DCF_r(x̂) ⊕ [x̂ < β]`.

use crate::error::Error;
use crate::fss::{self, KeyBatch, Kind, Output, Params, Party};
use crate::prg::{Block, FixedKeyAes, Hasher};

/// Generates DCF keys for `β·[x < α]` into `key0` and `key1` (each
/// `params.key_len()` bytes). For ring output, `rng` draws the off-path
/// value corrections: it must be fresh dealer randomness, never derived
/// from a party's seed, or that party could predict them. Bit-output keys
/// draw nothing and ignore `rng`; code that deals them uses
/// [`generate_bit`], which takes none (this signature stays for the test
/// oracles that run both outputs through one function type). See
/// [`crate::fss`] for the secret-handling contract. Returns the AES calls
/// made.
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
    match (params.kind(), params.output()) {
        (Kind::Dcf, Output::Bit) => generate_bit(aes, params, alpha, roots, key0, key1),
        (Kind::Dcf, Output::Ring(_)) => {
            fss::gen_pair(aes, params, alpha, &[beta], roots, Some(rng), key0, key1)
        }
        (Kind::Dcf, Output::Pair(_)) | (Kind::Dpf, _) => Err(Error::KindMismatch),
    }
}

/// Generates pair-output DCF keys for `(β_0, β_1)·[x < α]`
/// ([`Output::Pair`]) into `key0` and `key1`; `rng` as for [`generate`].
/// Returns the AES calls made.
#[allow(clippy::too_many_arguments)]
pub fn generate_pair<H: Hasher + ?Sized, R: rand_core::CryptoRng + ?Sized>(
    aes: &H,
    params: &Params,
    alpha: u64,
    beta: [u64; 2],
    roots: [Block; 2],
    rng: &mut R,
    key0: &mut [u8],
    key1: &mut [u8],
) -> Result<u64, Error> {
    match (params.kind(), params.output()) {
        (Kind::Dcf, Output::Pair(_)) => {
            fss::gen_pair(aes, params, alpha, &beta, roots, Some(rng), key0, key1)
        }
        _ => Err(Error::KindMismatch),
    }
}

/// Generates bit-output DCF keys for `[x < α]` (β = 1) into `key0` and
/// `key1`. They draw no randomness, so none is taken. Returns the AES calls
/// made.
pub fn generate_bit<H: Hasher + ?Sized>(
    aes: &H,
    params: &Params,
    alpha: u64,
    roots: [Block; 2],
    key0: &mut [u8],
    key1: &mut [u8],
) -> Result<u64, Error> {
    if params.kind() != Kind::Dcf || params.output() != Output::Bit {
        return Err(Error::KindMismatch);
    }
    let none: Option<&mut crate::prg::Prg> = None;
    fss::gen_pair(aes, params, alpha, &[1], roots, none, key0, key1)
}

/// Evaluates one party's pair-output DCF key ([`Output::Pair`]) at one
/// public point (taken mod `2^k`): both words of its share.
pub fn eval_pair(
    aes: &FixedKeyAes,
    params: &Params,
    party: Party,
    key: &[u8],
    x: u64,
) -> Result<[u64; 2], Error> {
    if params.kind() != Kind::Dcf || !matches!(params.output(), Output::Pair(_)) {
        return Err(Error::KindMismatch);
    }
    let keys = KeyBatch::new(*params, party, key)?;
    if keys.count() != 1 {
        return Err(Error::BufferLength);
    }
    let mut out = [0u64; 2];
    fss::eval_queries(aes, &keys, 1, 0, &[x], &mut out, 1)?;
    Ok(out)
}

/// Evaluates one party's DCF key at one public point (taken mod `2^k`);
/// pair outputs take [`eval_pair`].
pub fn eval(
    aes: &FixedKeyAes,
    params: &Params,
    party: Party,
    key: &[u8],
    x: u64,
) -> Result<u64, Error> {
    if params.kind() != Kind::Dcf {
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
