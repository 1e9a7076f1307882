//! Distributed point functions: `f_{α,β}(x) = β` if `x = α`, else 0.
//!
//! Half-tree DPF keys with an early-terminated leaf block (see
//! [`crate::fss`]). Full-domain evaluation expands a small domain into a
//! caller buffer, which is how lookup tables are read obliviously.

use crate::error::Error;
use crate::fss::{self, KeyBatch, KeyRef, Kind, Params, Party, Tiles};
use crate::prg::{Block, FixedKeyAes, Hasher};
use crate::ring::cast;

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
    fss::gen_pair(aes, params, alpha, &[beta], roots, none, key0, key1)
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

/// `Σ_i table[(u − (first + i)) mod 2^L]·d[i]` in Z_2^64, with
/// `table.len() = 2^L` and `d.len() ≤ 2^L`: one party's share of a table
/// read at a masked index, over the domain positions `first..first +
/// d.len()` of its DPF's outputs `d`. `u` and `first` are public and steer
/// only slice bounds: two backward runs over the table, split where the
/// index wraps. Returns 0 for an empty or non-power-of-two table.
pub fn table_dot(table: &[u64], u: u64, first: usize, d: &[u64]) -> u64 {
    let size = table.len();
    if !size.is_power_of_two() || d.len() > size {
        return 0;
    }
    let mask = cast::u64_from_usize(size - 1);
    let start = cast::usize_from_small_u64(u.wrapping_sub(cast::u64_from_usize(first)) & mask);
    let dot = |t: &[u64], d: &[u64]| {
        t.iter()
            .rev()
            .zip(d)
            .fold(0u64, |a, (t, d)| a.wrapping_add(t.wrapping_mul(*d)))
    };
    // Positions first..: table indices start, start − 1, …, 0, then 2^L − 1, ….
    let run = (start + 1).min(d.len());
    let (head, tail) = d.split_at(run);
    dot(&table[start + 1 - run..=start], head).wrapping_add(dot(&table[size - tail.len()..], tail))
}

/// One party's share of `table[(u − α) mod 2^L]` from its DPF key over L
/// bits at `α` with payload 1 (`table.len() = 2^L`): `Σ_j table[(u − j)
/// mod 2^L]·Eval(key, j)`, summed tile by tile as the expansion of
/// [`fss::full_domain`] writes the outputs into one window of `domain`
/// (`2^L` words of scratch), so the domain never leaves the first-level
/// cache. Returns the share and the AES calls made.
pub fn lookup<H: Hasher + ?Sized>(
    aes: &H,
    params: &Params,
    party: Party,
    key: KeyRef<'_>,
    (u, table): (u64, &[u64]),
    domain: &mut [u64],
) -> Result<(u64, u64), Error> {
    if table.len() != domain.len() {
        return Err(Error::BufferLength);
    }
    let mut sum = 0u64;
    let calls = fss::full_domain_tiles(
        aes,
        params,
        party,
        key,
        (domain, Tiles::Window),
        |first, d| {
            sum = sum.wrapping_add(table_dot(table, u, first, d));
        },
    )?;
    Ok((sum, calls))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fss::Output;
    use crate::prg::Prg;
    use crate::ring::Width;
    use proptest::prelude::*;
    use std::vec;
    use std::vec::Vec;

    const PARTIES: [Party; 2] = [Party::P0, Party::P1];

    /// A key pair over `k` bits at `alpha` with payload `beta`.
    fn deal(params: &Params, alpha: u64, beta: u64, rng: &mut Prg) -> [Vec<u8>; 2] {
        let aes = FixedKeyAes::new();
        let mut k = [vec![0u8; params.key_len()], vec![0u8; params.key_len()]];
        let [k0, k1] = &mut k;
        let roots = [rng.next_block(), rng.next_block()];
        generate(&aes, params, alpha, beta, roots, rng, k0, k1).unwrap();
        k
    }

    /// Every output group's leaf layout: bits, and each lane size.
    fn outputs() -> [Output; 5] {
        [1, 5, 13, 32, 64].map(|w| match w {
            1 => Output::Bit,
            w => Output::Ring(Width::of(w)),
        })
    }

    /// The tiled expansion equals evaluation point by point, at widths with
    /// one tile (k ≤ 7 for 64-bit lanes), several, and several top levels.
    #[test]
    fn full_domain_equals_every_point() {
        let aes = FixedKeyAes::new();
        let mut rng = Prg::new(b"dpf full domain\0");
        for k in [1, 2, 6, 7, 8, 9, 12, 14] {
            for output in outputs() {
                let params = Params::new(Kind::Dpf, Width::of(k), output);
                let alpha = Width::of(k).reduce(rng.next_u64());
                let keys = deal(&params, alpha, rng.next_u64(), &mut rng);
                for (party, key) in PARTIES.into_iter().zip(&keys) {
                    let mut full = vec![0u64; 1 << k];
                    let calls = eval_full_domain(&aes, &params, party, key, &mut full).unwrap();
                    assert_eq!(calls, params.aes_per_full_domain(), "{params:?}");
                    for (x, got) in (0u64..).zip(&full) {
                        let want = eval(&aes, &params, party, key, x).unwrap();
                        assert_eq!(*got, want, "{params:?} {party:?} α = {alpha}, x = {x}");
                    }
                }
            }
        }
    }

    /// `Σ_i T[(u − first − i) mod 2^L]·d[i]`, index by index.
    fn naive_dot(table: &[u64], u: u64, first: usize, d: &[u64]) -> u64 {
        let mask = table.len() as u64 - 1;
        d.iter().enumerate().fold(0u64, |a, (i, v)| {
            let j = u.wrapping_sub((first + i) as u64) & mask;
            a.wrapping_add(table[j as usize].wrapping_mul(*v))
        })
    }

    proptest! {
        /// The two-run dot equals the index-by-index sum for every offset
        /// and run length, across the wrap.
        #[test]
        fn table_dot_equals_the_naive_sum(
            bits in 0u32..9,
            u in any::<u64>(),
            first_frac in 0.0f64..1.0,
            len_frac in 0.0f64..=1.0,
            seed in any::<u64>(),
        ) {
            let size = 1usize << bits;
            let mut rng = Prg::with_stream(b"dpf table dot\0\0\0", seed);
            let table: Vec<u64> = (0..size).map(|_| rng.next_u64()).collect();
            let len = ((size as f64) * len_frac) as usize;
            let first = ((size as f64) * first_frac) as usize;
            let d: Vec<u64> = (0..len).map(|_| rng.next_u64()).collect();
            prop_assert_eq!(table_dot(&table, u, first, &d), naive_dot(&table, u, first, &d));
        }

        /// The fused lookup at n = 64 equals the sum over the materialized
        /// domain, and the parties' shares add up to `T[(u − α) mod 2^L]`.
        #[test]
        fn lookup_reads_the_table_at_u_minus_alpha(
            bits in 1u32..13,
            alpha in any::<u64>(),
            u in any::<u64>(),
            seed in any::<u64>(),
        ) {
            let aes = FixedKeyAes::new();
            let mut rng = Prg::with_stream(b"dpf lookup prop\0", seed);
            let params = Params::new(Kind::Dpf, Width::of(bits), Output::Ring(Width::W64));
            let size = 1usize << bits;
            let mask = size as u64 - 1;
            let table: Vec<u64> = (0..size).map(|_| rng.next_u64()).collect();
            let keys = deal(&params, alpha & mask, 1, &mut rng);
            let mut total = 0u64;
            for (party, key) in PARTIES.into_iter().zip(&keys) {
                let key = KeyRef::whole(&params, key).unwrap();
                let mut domain = vec![0u64; size];
                let (share, calls) = lookup(&aes, &params, party, key, (u, &table), &mut domain).unwrap();
                prop_assert_eq!(calls, params.aes_per_full_domain());
                let mut full = vec![0u64; size];
                fss::full_domain(&aes, &params, party, key, &mut full).unwrap();
                prop_assert_eq!(share, naive_dot(&table, u, 0, &full));
                total = total.wrapping_add(share);
            }
            prop_assert_eq!(total, table[(u.wrapping_sub(alpha) & mask) as usize]);
        }
    }

    /// Every index and every key point at small widths, both parties.
    #[test]
    fn lookup_every_index_every_alpha() {
        let aes = FixedKeyAes::new();
        let mut rng = Prg::new(b"dpf lookup exhau");
        for bits in [1u32, 2, 3, 5, 8] {
            let params = Params::new(Kind::Dpf, Width::of(bits), Output::Ring(Width::of(13)));
            let size = 1u64 << bits;
            let table: Vec<u64> = (0..size).map(|_| rng.next_u64()).collect();
            for alpha in 0..size {
                let keys = deal(&params, alpha, 1, &mut rng);
                for u in 0..size {
                    let total = PARTIES
                        .into_iter()
                        .zip(&keys)
                        .fold(0u64, |t, (party, key)| {
                            let key = KeyRef::whole(&params, key).unwrap();
                            let mut domain = vec![0u64; 1 << bits];
                            let (share, _) =
                                lookup(&aes, &params, party, key, (u, &table), &mut domain)
                                    .unwrap();
                            t.wrapping_add(share)
                        });
                    // The payload is 1 in Z_2^13: the shares' sum is the
                    // entry times 1, taken mod 2^64 by the caller's ring.
                    let want = table[(u.wrapping_sub(alpha) & (size - 1)) as usize];
                    assert_eq!(
                        total & Width::of(13).mask(),
                        want & Width::of(13).mask(),
                        "L = {bits}, α = {alpha}, u = {u}"
                    );
                }
            }
        }
    }

    #[test]
    fn lookup_refuses_a_domain_of_the_wrong_length() {
        let aes = FixedKeyAes::new();
        let mut rng = Prg::new(b"dpf lookup short");
        let params = Params::new(Kind::Dpf, Width::of(6), Output::Ring(Width::W64));
        let keys = deal(&params, 3, 1, &mut rng);
        let key = KeyRef::whole(&params, &keys[0]).unwrap();
        let table = [0u64; 64];
        for len in [0, 32, 63, 65] {
            let mut domain = vec![0u64; len];
            let r = lookup(&aes, &params, Party::P0, key, (0, &table), &mut domain);
            assert_eq!(r, Err(Error::BufferLength), "domain of {len} words");
        }
    }
}
