//! The two floors an FSS evaluation cannot beat on one machine: AES
//! throughput with many independent blocks in flight, and the memory
//! bandwidth that streams key bytes in. Also the dependent-chain AES latency
//! that a one-evaluation-at-a-time evaluator pays.

use anyhow::Result;
use suffuse_accel_cpu::Backend;
use suffuse_core::prg::{Block, Domain, FixedKeyAes, Hasher};

use super::median_seconds;

/// Blocks hashed per pass of the throughput measurement: 64 KiB, resident
/// in L1/L2, so the measurement sees AES and not memory.
const BUFFER_BLOCKS: usize = 4096;
/// Passes over the buffer per repetition.
const PASSES: usize = 512;
/// Calls in one dependent chain.
const CHAIN: usize = 1 << 20;
/// The stream-read buffer: far larger than any L3 here.
const READ_BYTES: usize = 1 << 30;
const REPS: usize = 5;

/// AES costs measured in this run.
#[derive(Debug, Clone)]
pub struct AesFloor {
    /// The AES path measured.
    pub backend: &'static str,
    /// ns per block for the backend's `hash_many` on a large buffer: the
    /// floor the evaluation walk is compared with.
    pub hash_many_ns: f64,
    /// ns per block for the `aes` crate's raw `encrypt_blocks`
    /// (`FixedKeyAes::permute_many`).
    pub permute_many_ns: f64,
    /// ns per block for the portable hash (`FixedKeyAes::hash_many`).
    pub portable_hash_many_ns: f64,
    /// ns per call of a dependent chain through `FixedKeyAes::hash`.
    pub chain_ns: f64,
    /// ns per call of a dependent chain through the backend, one block a call.
    pub backend_chain_ns: f64,
}

fn sample_blocks(n: usize) -> Vec<Block> {
    (0..n)
        .map(|i| {
            let mut b = [0u8; 16];
            b[..8].copy_from_slice(&(i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes());
            b[8] = 0x5a;
            Block::from_bytes(b)
        })
        .collect()
}

fn ns_per_block(reps: usize, blocks: usize, mut f: impl FnMut() -> u64) -> Result<f64> {
    let secs = median_seconds(reps, || {
        std::hint::black_box(f());
        Ok(())
    })?;
    Ok(secs * 1e9 / blocks as f64)
}

/// The floors of `backend`'s AES path.
pub fn measure_aes(backend: &Backend) -> Result<AesFloor> {
    let portable = FixedKeyAes::new();
    let mut buffer = sample_blocks(BUFFER_BLOCKS);
    let total = BUFFER_BLOCKS * PASSES;

    let mut through = |f: &dyn Fn(&mut [Block]) -> u64| {
        ns_per_block(REPS, total, || {
            let mut calls = 0;
            for _ in 0..PASSES {
                calls += f(std::hint::black_box(&mut buffer));
            }
            calls
        })
    };
    let hash_many_ns = through(&|b| backend.hash_many(Domain::Tree, b))?;
    let permute_many_ns = through(&|b| portable.permute_many(b))?;
    let portable_hash_many_ns = through(&|b| Hasher::hash_many(&portable, Domain::Tree, b))?;

    let seed = sample_blocks(1)[0];
    let chain_ns = ns_per_block(REPS, CHAIN, || {
        let mut x = seed;
        for _ in 0..CHAIN {
            x = portable.hash(Domain::Tree, x);
        }
        std::hint::black_box(x).low64()
    })?;
    let backend_chain_ns = ns_per_block(REPS, CHAIN, || {
        let mut x = [seed];
        for _ in 0..CHAIN {
            backend.hash_many(Domain::Tree, &mut x);
        }
        std::hint::black_box(x)[0].low64()
    })?;
    Ok(AesFloor {
        backend: backend.name(),
        hash_many_ns,
        permute_many_ns,
        portable_hash_many_ns,
        chain_ns,
        backend_chain_ns,
    })
}

/// Stream-read bandwidth in bytes per second with 1 and 2 threads.
#[derive(Debug, Clone, Copy)]
pub struct ReadBandwidth {
    pub one_thread: f64,
    pub two_threads: f64,
}

impl ReadBandwidth {
    /// The bandwidth measured with `threads` threads (the larger count for
    /// more threads than measured).
    pub fn with_threads(&self, threads: usize) -> f64 {
        if threads <= 1 {
            self.one_thread
        } else {
            self.two_threads
        }
    }
}

/// XOR-folds a slice with eight independent accumulators, so the loop is
/// bound by loads rather than by one dependency chain.
fn fold(words: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut chunks = words.chunks_exact(8);
    for c in &mut chunks {
        for (a, w) in acc.iter_mut().zip(c) {
            *a ^= *w;
        }
    }
    let tail = chunks.remainder().iter().fold(0, |a, w| a ^ w);
    acc.iter().fold(tail, |a, w| a ^ w)
}

pub fn measure_read_bandwidth() -> Result<ReadBandwidth> {
    let words: Vec<u64> = (0..READ_BYTES / 8).map(|i| i as u64).collect();
    let one = median_seconds(REPS, || {
        std::hint::black_box(fold(std::hint::black_box(&words)));
        Ok(())
    })?;
    let two = median_seconds(REPS, || {
        let (a, b) = words.split_at(words.len() / 2);
        std::thread::scope(|s| {
            let h = s.spawn(|| fold(std::hint::black_box(a)));
            let x = fold(std::hint::black_box(b));
            std::hint::black_box(x ^ h.join().unwrap_or(0));
        });
        Ok(())
    })?;
    Ok(ReadBandwidth {
        one_thread: READ_BYTES as f64 / one,
        two_threads: READ_BYTES as f64 / two,
    })
}
