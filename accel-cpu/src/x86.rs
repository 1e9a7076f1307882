//! AES-NI, VAES-256 and VAES-512 implementations of the fixed-key hashes.
//!
//! The `aes` crate's portable interface costs about 48 ns for a lone block
//! and about 2.6 ns per block in batches of 64 on the development machine
//! (it re-broadcasts round keys and falls back to one block at a time below
//! 64). These hashers keep expanded round keys resident and keep 32 blocks
//! in flight, which is what the FSS walk needs.
//!
//! Each hasher is constructed only through a runtime CPU-feature check, so
//! holding one is the witness that its instructions exist.

#![allow(unsafe_code)]

mod walk;
mod walk128;
mod walk256;

use core::arch::x86_64::*;
use suffuse_core::Error;
use suffuse_core::fss::{self, KeyBatch};
use suffuse_core::prg::{Block, Domain, Hasher, domain_key};

/// AES-128 round keys of one fixed key.
#[derive(Clone, Copy)]
struct RoundKeys([__m128i; 11]);

macro_rules! expand_round {
    ($rk:expr, $i:expr, $rcon:expr) => {{
        let t = _mm_shuffle_epi32(_mm_aeskeygenassist_si128($rk[$i], $rcon), 0xff);
        let mut k = $rk[$i];
        k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
        k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
        k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
        $rk[$i + 1] = _mm_xor_si128(k, t);
    }};
}

/// # Safety
/// The CPU must support AES-NI.
#[target_feature(enable = "aes,sse2")]
unsafe fn expand(key: [u8; 16]) -> RoundKeys {
    // SAFETY: reading 16 bytes from a 16-byte array.
    let mut rk = [unsafe { _mm_loadu_si128(key.as_ptr().cast()) }; 11];
    expand_round!(rk, 0, 0x01);
    expand_round!(rk, 1, 0x02);
    expand_round!(rk, 2, 0x04);
    expand_round!(rk, 3, 0x08);
    expand_round!(rk, 4, 0x10);
    expand_round!(rk, 5, 0x20);
    expand_round!(rk, 6, 0x40);
    expand_round!(rk, 7, 0x80);
    expand_round!(rk, 8, 0x1b);
    expand_round!(rk, 9, 0x36);
    RoundKeys(rk)
}

fn index(d: Domain) -> usize {
    match d {
        Domain::Tree => 0,
        Domain::Leaf => 1,
        Domain::Value => 2,
        Domain::Prf => 3,
    }
}

/// Blocks kept in flight per inner iteration.
const WIDE: usize = 32;

/// The hashes on 128-bit AES-NI, eight blocks in flight.
#[derive(Clone, Copy)]
pub struct AesNi {
    keys: [RoundKeys; 4],
}

impl AesNi {
    /// The hasher, if this CPU has AES-NI.
    pub fn detect() -> Option<AesNi> {
        if std::is_x86_feature_detected!("aes") && std::is_x86_feature_detected!("sse2") {
            // SAFETY: AES-NI presence checked just above.
            let keys = unsafe {
                [
                    expand(domain_key(Domain::Tree)),
                    expand(domain_key(Domain::Leaf)),
                    expand(domain_key(Domain::Value)),
                    expand(domain_key(Domain::Prf)),
                ]
            };
            Some(AesNi { keys })
        } else {
            None
        }
    }
}

/// The VAES-512 walk's prefetch (the other two walks use [`Ahead`], which
/// was measured only on a CPU without AVX-512): the root and the first
/// cache line of the body (the first correction words) of the `group` keys
/// that answer queries `first..first + group`, while the walk is still on
/// the group before: one key per evaluation means every group would
/// otherwise start with a miss per key.
fn prefetch_heads(keys: &KeyBatch<'_>, per_key: usize, first: usize, group: usize) {
    for j in 0..group {
        let key = keys.key((first + j) / per_key);
        for line in [key.root(), key.body()] {
            // SAFETY: prefetching never faults; the address is inside the key.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
        }
    }
}

/// One group's walk: `(hasher, keys, per_key, first, points, out, next)`
/// evaluates queries `first..first + points.len()` (a whole group),
/// prefetching `next`, and returns its AES calls.
///
/// # Safety
/// The hasher is the walk's own witness type (its instructions exist).
type GroupWalk<H> =
    unsafe fn(&H, &KeyBatch<'_>, usize, usize, &[u64], &mut [u64], &Ahead<'_>) -> u64;

/// Runs `walk` on every whole group of `group` queries in `points` (query
/// `first + i` at `points[i]`), handing it the group after for prefetching;
/// returns how many queries it did (a multiple of `group`) and the AES calls.
fn by_groups<H>(
    (h, group, walk): (&H, usize, GroupWalk<H>),
    keys: &KeyBatch<'_>,
    per_key: usize,
    first: usize,
    points: &[u64],
    out: &mut [u64],
) -> (usize, u64) {
    let levels = keys.params().levels();
    let mut calls = 0;
    let mut q = 0;
    while q + group <= points.len() {
        let after = if q + 2 * group <= points.len() {
            group
        } else {
            0
        };
        let next = Ahead::new(keys, per_key, first + q + group, after, levels);
        let (p, o) = (&points[q..q + group], &mut out[q..q + group]);
        // SAFETY: `h` is `walk`'s witness (the `GroupWalk` contract).
        calls += unsafe { walk(h, keys, per_key, first + q, p, o, &next) };
        q += group;
    }
    (q, calls)
}

/// The next group's keys, prefetched into L2 a slice per tree level while
/// the walk is on the group before. With one key per evaluation every key is
/// its own memory stream, too many for the hardware prefetchers and too
/// far apart for prefetches a few levels ahead to hide memory's latency;
/// a whole group ahead, its lines are in L2 when the walk reaches them.
struct Ahead<'a> {
    bytes: &'a [u8],
    /// Cache lines per level.
    per_level: usize,
}

impl<'a> Ahead<'a> {
    /// The keys that answer queries `first..first + group`, spread over
    /// `levels` steps.
    fn new(keys: &KeyBatch<'a>, per_key: usize, first: usize, group: usize, levels: u32) -> Self {
        let (a, b) = (first / per_key, (first + group).div_ceil(per_key));
        let bytes = if group == 0 {
            &[][..]
        } else {
            keys.bodies(a, b)
        };
        let levels = usize::try_from(levels.max(1)).unwrap_or(1);
        let per_level = bytes.len().div_ceil(64).div_ceil(levels);
        Ahead { bytes, per_level }
    }

    /// Prefetches level `level`'s slice.
    #[inline(always)]
    fn step(&self, level: u32) {
        let from = usize::try_from(level)
            .unwrap_or(usize::MAX)
            .saturating_mul(self.per_level);
        for line in self.bytes.chunks(64).skip(from).take(self.per_level) {
            // SAFETY: prefetching never faults; the address is inside the keys.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(line.as_ptr().cast()) };
        }
    }
}

/// A lockstep group's keys and points: query `first + j`'s key body and
/// root as raw pointers (the walks load correction words by offset), and
/// its point reduced to the domain.
struct Heads<const G: usize> {
    body: [*const u8; G],
    root: [*const u8; G],
    x: [u64; G],
}

impl<const G: usize> Heads<G> {
    /// The group of queries `first..first + G`, query `q` being key
    /// `q / per_key` at `points[q − first]`; `points` holds at least `G`
    /// entries (fewer panic).
    fn new(keys: &KeyBatch<'_>, per_key: usize, first: usize, points: &[u64]) -> Self {
        let mask = keys.params().domain().mask();
        let mut h = Heads {
            body: [core::ptr::null(); G],
            root: [core::ptr::null(); G],
            x: [0; G],
        };
        // A short `points` panics here rather than leave a null pointer
        // for the walks' unsafe loads.
        for (j, point) in points[..G].iter().enumerate() {
            let key = keys.key((first + j) / per_key);
            h.body[j] = key.body().as_ptr();
            h.root[j] = key.root().as_ptr();
            h.x[j] = point & mask;
        }
        h
    }

    /// Each query's output bit: the leaf block's bit at `x mod 2^ν` (query
    /// `j`'s block is `leaf[2j..2j + 2]`, low word first) XOR its DCF
    /// accumulator's low bit (`accs[2j]`).
    fn leaf_bits(&self, leaf_bits: u32, leaf: &[u64], accs: &[u64], out: &mut [u64]) {
        let lane_mask = (1u64 << leaf_bits) - 1;
        for (j, out) in out.iter_mut().enumerate().take(G) {
            let lane = self.x[j] & lane_mask;
            let word = leaf[2 * j + usize::from(lane >= 64)];
            *out = ((word >> (lane & 63)) & 1) ^ (accs[2 * j] & 1);
        }
    }
}

/// σ(x) = swap64(x) ⊕ (x ∧ high-half): `(x_L ⊕ x_R) ‖ x_L` per 128-bit block.
#[inline(always)]
fn sigma128(x: __m128i) -> __m128i {
    // SAFETY: SSE2 is part of the x86_64 baseline.
    unsafe {
        let hi = _mm_set_epi64x(-1, 0);
        _mm_xor_si128(_mm_shuffle_epi32(x, 0x4e), _mm_and_si128(x, hi))
    }
}

/// # Safety
/// The CPU must support AES-NI.
#[target_feature(enable = "aes,sse2")]
unsafe fn hash_aesni(rk: &RoundKeys, blocks: &mut [Block]) {
    let ptr = blocks.as_mut_ptr().cast::<__m128i>();
    let n = blocks.len();
    let mut i = 0;
    while i + 8 <= n {
        let mut s = [_mm_setzero_si128(); 8];
        let mut b = [_mm_setzero_si128(); 8];
        for j in 0..8 {
            // SAFETY: i + j < n; `Block` is a transparent u128 (16 bytes).
            s[j] = sigma128(unsafe { _mm_loadu_si128(ptr.add(i + j)) });
            b[j] = _mm_xor_si128(s[j], rk.0[0]);
        }
        for k in &rk.0[1..10] {
            for v in b.iter_mut() {
                *v = _mm_aesenc_si128(*v, *k);
            }
        }
        for j in 0..8 {
            let y = _mm_xor_si128(_mm_aesenclast_si128(b[j], rk.0[10]), s[j]);
            // SAFETY: as for the load above.
            unsafe { _mm_storeu_si128(ptr.add(i + j), y) };
        }
        i += 8;
    }
    while i < n {
        // SAFETY: i < n.
        let s = sigma128(unsafe { _mm_loadu_si128(ptr.add(i)) });
        let mut v = _mm_xor_si128(s, rk.0[0]);
        for k in &rk.0[1..10] {
            v = _mm_aesenc_si128(v, *k);
        }
        let y = _mm_xor_si128(_mm_aesenclast_si128(v, rk.0[10]), s);
        // SAFETY: i < n.
        unsafe { _mm_storeu_si128(ptr.add(i), y) };
        i += 1;
    }
}

impl AesNi {
    /// Evaluates queries like `fss::eval_queries`, using the prefetching
    /// 128-bit walk for whole groups of bit-output queries and core's walk
    /// for the rest; one lane asks for core's one-at-a-time walk.
    pub fn eval_queries(
        &self,
        keys: &KeyBatch<'_>,
        per_key: usize,
        first: usize,
        points: &[u64],
        out: &mut [u64],
        lanes: usize,
    ) -> Result<u64, Error> {
        let walk = (lanes > 1).then_some(walk128::eval_bits as Walk<Self>);
        with_walk(self, walk, keys, per_key, first, (points, out), lanes)
    }
}

impl Hasher for AesNi {
    fn hash_many(&self, d: Domain, blocks: &mut [Block]) -> u64 {
        // SAFETY: an `AesNi` exists only after `detect` confirmed AES-NI.
        unsafe { hash_aesni(&self.keys[index(d)], blocks) };
        blocks.len() as u64
    }
}

/// The hashes on VAES-512, four blocks per register and 32 in flight.
#[derive(Clone, Copy)]
pub struct Vaes512 {
    narrow: AesNi,
    keys: [[__m512i; 11]; 4],
    /// AVX-512DQ is present too, so the SIMD walk can run.
    walks: bool,
}

impl Vaes512 {
    /// The hasher, if this CPU has AVX-512F and VAES.
    pub fn detect() -> Option<Vaes512> {
        let narrow = AesNi::detect()?;
        if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("vaes") {
            // SAFETY: AVX-512F presence checked just above.
            let keys = narrow.keys.map(|rk| rk.0.map(|k| unsafe { broadcast(k) }));
            let walks = std::is_x86_feature_detected!("avx512dq");
            Some(Vaes512 {
                narrow,
                keys,
                walks,
            })
        } else {
            None
        }
    }
}

impl Vaes512 {
    /// Evaluates queries like `fss::eval_queries`, using the AVX-512 walk for
    /// whole groups of bit-output queries and core's walk for the rest.
    pub fn eval_queries(
        &self,
        keys: &KeyBatch<'_>,
        per_key: usize,
        first: usize,
        points: &[u64],
        out: &mut [u64],
        lanes: usize,
    ) -> Result<u64, Error> {
        let walk = self.walks.then_some(walk::eval_bits as Walk<Self>);
        with_walk(self, walk, keys, per_key, first, (points, out), lanes)
    }
}

/// A SIMD bit-output walk over whole groups: returns the queries done and
/// the AES calls made.
type Walk<H> = fn(&H, &KeyBatch<'_>, usize, usize, &[u64], &mut [u64]) -> (usize, u64);

/// Queries like `fss::eval_queries`: `walk` (when given) takes whole groups
/// of bit-output queries, core's walk the rest.
fn with_walk<H: Hasher>(
    h: &H,
    walk: Option<Walk<H>>,
    keys: &KeyBatch<'_>,
    per_key: usize,
    first: usize,
    (points, out): (&[u64], &mut [u64]),
    lanes: usize,
) -> Result<u64, Error> {
    // A pair's query writes two words; the SIMD walkers take bit outputs.
    let words = keys.params().output().words();
    if Some(out.len()) != points.len().checked_mul(words) {
        return Err(Error::BufferLength);
    }
    let (done, calls) = match walk {
        Some(w) if walk::supports(keys) && per_key > 0 => {
            if (first + points.len()).div_ceil(per_key) > keys.count() {
                return Err(Error::BufferLength);
            }
            w(h, keys, per_key, first, points, out)
        }
        _ => (0, 0),
    };
    let rest = fss::eval_queries(
        h,
        keys,
        per_key,
        first + done,
        &points[done..],
        &mut out[done * words..],
        lanes,
    )?;
    Ok(calls + rest)
}

/// # Safety
/// The CPU must support AVX-512F.
#[target_feature(enable = "avx512f")]
unsafe fn broadcast(k: __m128i) -> __m512i {
    _mm512_broadcast_i32x4(k)
}

/// # Safety
/// The CPU must support AVX-512F and VAES.
#[target_feature(enable = "avx512f,vaes")]
unsafe fn hash_vaes(rk: &[__m512i; 11], blocks: &mut [Block]) -> usize {
    let ptr = blocks.as_mut_ptr().cast::<__m512i>();
    let quads = blocks.len() / 4;
    let hi = _mm512_set_epi64(-1, 0, -1, 0, -1, 0, -1, 0);
    let mut q = 0;
    while q + WIDE / 4 <= quads {
        let mut s = [_mm512_setzero_si512(); WIDE / 4];
        let mut b = [_mm512_setzero_si512(); WIDE / 4];
        for j in 0..WIDE / 4 {
            // SAFETY: 4(q + j) + 3 < len; blocks are 16 contiguous bytes each.
            let x = unsafe { _mm512_loadu_si512(ptr.add(q + j).cast()) };
            s[j] = _mm512_xor_si512(
                _mm512_shuffle_epi32(x, _MM_PERM_BADC),
                _mm512_and_si512(x, hi),
            );
            b[j] = _mm512_xor_si512(s[j], rk[0]);
        }
        for k in &rk[1..10] {
            for v in b.iter_mut() {
                *v = _mm512_aesenc_epi128(*v, *k);
            }
        }
        for j in 0..WIDE / 4 {
            let y = _mm512_xor_si512(_mm512_aesenclast_epi128(b[j], rk[10]), s[j]);
            // SAFETY: as for the load above.
            unsafe { _mm512_storeu_si512(ptr.add(q + j).cast(), y) };
        }
        q += WIDE / 4;
    }
    while q < quads {
        // SAFETY: 4q + 3 < len.
        let x = unsafe { _mm512_loadu_si512(ptr.add(q).cast()) };
        let s = _mm512_xor_si512(
            _mm512_shuffle_epi32(x, _MM_PERM_BADC),
            _mm512_and_si512(x, hi),
        );
        let mut v = _mm512_xor_si512(s, rk[0]);
        for k in &rk[1..10] {
            v = _mm512_aesenc_epi128(v, *k);
        }
        let y = _mm512_xor_si512(_mm512_aesenclast_epi128(v, rk[10]), s);
        // SAFETY: as for the load above.
        unsafe { _mm512_storeu_si512(ptr.add(q).cast(), y) };
        q += 1;
    }
    quads * 4
}

impl Hasher for Vaes512 {
    fn hash_many(&self, d: Domain, blocks: &mut [Block]) -> u64 {
        let i = index(d);
        // SAFETY: a `Vaes512` exists only after `detect` confirmed AVX-512F and VAES.
        let done = unsafe { hash_vaes(&self.keys[i], blocks) };
        // SAFETY: `narrow` was detected with AES-NI.
        unsafe { hash_aesni(&self.narrow.keys[i], &mut blocks[done..]) };
        blocks.len() as u64
    }
}

/// The hashes on VAES-256 (AVX2 registers): two blocks per instruction,
/// sixteen in flight. The path for CPUs with VAES but no AVX-512, such as
/// AMD Zen 3.
#[derive(Clone, Copy)]
pub struct Vaes256 {
    narrow: AesNi,
    keys: [[__m256i; 11]; 4],
}

impl Vaes256 {
    /// The hasher, if this CPU has AVX2 and VAES.
    pub fn detect() -> Option<Vaes256> {
        let narrow = AesNi::detect()?;
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("vaes") {
            // SAFETY: AVX2 presence checked just above.
            let keys = narrow
                .keys
                .map(|rk| rk.0.map(|k| unsafe { broadcast256(k) }));
            Some(Vaes256 { narrow, keys })
        } else {
            None
        }
    }
}

/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
unsafe fn broadcast256(k: __m128i) -> __m256i {
    _mm256_broadcastsi128_si256(k)
}

/// Registers of two blocks kept in flight: VAES issues two per cycle with a
/// latency of about four, and eight leaves AVX2's other registers for the
/// round keys.
const WIDE256: usize = 8;

/// σ on both blocks of a register: `(x_L ⊕ x_R) ‖ x_L` per 128-bit lane.
#[inline(always)]
fn sigma256(x: __m256i) -> __m256i {
    // SAFETY: only called from functions with AVX2 enabled.
    unsafe {
        let hi = _mm256_set_epi64x(-1, 0, -1, 0);
        _mm256_xor_si256(_mm256_shuffle_epi32(x, 0x4e), _mm256_and_si256(x, hi))
    }
}

/// # Safety
/// The CPU must support AVX2 and VAES.
#[target_feature(enable = "avx2,vaes")]
unsafe fn hash_vaes256(rk: &[__m256i; 11], blocks: &mut [Block]) -> usize {
    let ptr = blocks.as_mut_ptr().cast::<__m256i>();
    let pairs = blocks.len() / 2;
    let mut q = 0;
    while q + WIDE256 <= pairs {
        let mut s = [_mm256_setzero_si256(); WIDE256];
        let mut b = [_mm256_setzero_si256(); WIDE256];
        for j in 0..WIDE256 {
            // SAFETY: 2(q + j) + 1 < len; blocks are 16 contiguous bytes each.
            s[j] = sigma256(unsafe { _mm256_loadu_si256(ptr.add(q + j)) });
            b[j] = _mm256_xor_si256(s[j], rk[0]);
        }
        for k in &rk[1..10] {
            for v in b.iter_mut() {
                *v = _mm256_aesenc_epi128(*v, *k);
            }
        }
        for j in 0..WIDE256 {
            let y = _mm256_xor_si256(_mm256_aesenclast_epi128(b[j], rk[10]), s[j]);
            // SAFETY: as for the load above.
            unsafe { _mm256_storeu_si256(ptr.add(q + j), y) };
        }
        q += WIDE256;
    }
    while q < pairs {
        // SAFETY: 2q + 1 < len.
        let s = sigma256(unsafe { _mm256_loadu_si256(ptr.add(q)) });
        let mut v = _mm256_xor_si256(s, rk[0]);
        for k in &rk[1..10] {
            v = _mm256_aesenc_epi128(v, *k);
        }
        let y = _mm256_xor_si256(_mm256_aesenclast_epi128(v, rk[10]), s);
        // SAFETY: as for the load above.
        unsafe { _mm256_storeu_si256(ptr.add(q), y) };
        q += 1;
    }
    pairs * 2
}

impl Vaes256 {
    /// Evaluates queries like `fss::eval_queries`, using the AVX2 walk for
    /// whole groups of bit-output queries and core's walk for the rest; one
    /// lane asks for core's one-at-a-time walk.
    pub fn eval_queries(
        &self,
        keys: &KeyBatch<'_>,
        per_key: usize,
        first: usize,
        points: &[u64],
        out: &mut [u64],
        lanes: usize,
    ) -> Result<u64, Error> {
        let walk = (lanes > 1).then_some(walk256::eval_bits as Walk<Self>);
        with_walk(self, walk, keys, per_key, first, (points, out), lanes)
    }
}

impl Hasher for Vaes256 {
    fn hash_many(&self, d: Domain, blocks: &mut [Block]) -> u64 {
        let i = index(d);
        // SAFETY: a `Vaes256` exists only after `detect` confirmed AVX2 and VAES.
        let done = unsafe { hash_vaes256(&self.keys[i], blocks) };
        // SAFETY: `narrow` was detected with AES-NI.
        unsafe { hash_aesni(&self.narrow.keys[i], &mut blocks[done..]) };
        blocks.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use suffuse_core::prg::FixedKeyAes;

    fn sample(n: usize) -> Vec<Block> {
        (0..n)
            .map(|i| {
                let mut b = [0u8; 16];
                for (j, x) in b.iter_mut().enumerate() {
                    *x = (i * 31 + j * 7) as u8 ^ 0x5a;
                }
                Block::from_bytes(b)
            })
            .collect()
    }

    fn check(h: &dyn Hasher) {
        let reference = FixedKeyAes::new();
        for n in [0, 1, 3, 4, 7, 8, 9, 31, 32, 33, 64, 100] {
            for d in [Domain::Tree, Domain::Leaf, Domain::Value, Domain::Prf] {
                let mut a = sample(n);
                let mut b = a.clone();
                assert_eq!(reference.hash_many(d, &mut a), n as u64);
                assert_eq!(h.hash_many(d, &mut b), n as u64);
                for (x, y) in a.iter().zip(b.iter()) {
                    assert_eq!(x.to_bytes(), y.to_bytes(), "n={n} {d:?}");
                }
            }
        }
    }

    #[test]
    fn aesni_matches_portable() {
        if let Some(h) = AesNi::detect() {
            check(&h);
        }
    }

    #[test]
    fn vaes256_matches_portable() {
        if let Some(h) = Vaes256::detect() {
            check(&h);
        }
    }

    #[test]
    fn vaes_matches_portable() {
        if let Some(h) = Vaes512::detect() {
            check(&h);
        }
    }
}
