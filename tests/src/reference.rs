//! The test oracle: one-party half-tree DCF/DPF evaluation written for
//! reading, not speed, plus the cleartext functionalities.
//!
//! It follows the construction in `suffuse_core::fss`'s module docs and
//! shares nothing with core's walk except the hash `H_d` itself
//! ([`FixedKeyAes::hash`]): the key layout, the widths `ν` and the lane size
//! are recomputed here, so a disagreement with [`Params`] shows up as a test
//! failure rather than being inherited.
//!
//! One evaluation of a key over k-bit inputs, with `L = k − ν` tree levels:
//!
//! ```text
//! s ← root                        (its lsb t is the control bit)
//! for i in 0..L, x_i the i-th input bit from the top:
//!     left  ← H_tree(s) ⊕ t·CW_i
//!     right ← left ⊕ s
//!     DCF, x_i = 0:  acc ⊕= lsb(right)                          (bit output)
//!                    acc += H_value(right)_64 + lsb(right)·VCW_i  (Z_2^w output)
//!     s ← x_i ? right : left
//! leaf, j = x mod 2^ν, t = lsb(s), g = H_leaf(s):
//!     bit:    y = acc ⊕ bit_j(g ⊕ t·LCW)
//!     Z_2^w:  y = acc + lane_j(g) + t·lane_j(LCW), negated by P1
//! ```
//!
//! The module docs leave three things to the algebra of key generation,
//! which this oracle pins down: the Z_2^w leaf combines lanes additively
//! (not with ⊕), the value correction enters as `lsb(right)·VCW_i`, and it is
//! P1 whose share is negated so that `y_0 + y_1` is the output.
//!
//! A pair output ([`Output::Pair`]) is two ring outputs from one walk: word
//! `i` takes `VCW_i` (the i-th word after a level's `CW_i`), half `i` of
//! `H_value(right)` (low, then high), and leaf word `2j + i` of a block of
//! words of the ring's lane size.

use suffuse_core::fss::{Kind, Output, Params, Party};
use suffuse_core::prg::{Block, Domain, FixedKeyAes};

/// Bits per output lane of the leaf block: 1 for bit output, else the
/// smallest of 8/16/32/64 that holds `w`, twice that for a pair.
pub fn lane_bits(output: Output) -> u32 {
    match output {
        Output::Bit => 1,
        Output::Ring(w) => w.bits().next_power_of_two().max(8),
        Output::Pair(w) => 2 * w.bits().next_power_of_two().max(8),
    }
}

/// Output words per evaluation: 2 for a pair, else 1.
pub fn words(output: Output) -> usize {
    if matches!(output, Output::Pair(_)) {
        2
    } else {
        1
    }
}

/// ν: input bits resolved inside the 128-bit leaf block, at most `k`.
pub fn leaf_bits(params: &Params) -> u32 {
    let per_block = 128 / lane_bits(params.output());
    per_block.ilog2().min(params.domain().bits())
}

/// Bytes of the per-level value corrections: `⌈w/8⌉` per output word
/// for a ring or pair DCF, else 0.
pub fn value_bytes(params: &Params) -> usize {
    match (params.kind(), params.output()) {
        (Kind::Dcf, Output::Ring(w) | Output::Pair(w)) => {
            words(params.output()) * usize::try_from(w.bits().div_ceil(8)).unwrap()
        }
        _ => 0,
    }
}

/// Tree levels `L = k − ν`.
pub fn levels(params: &Params) -> u32 {
    params.domain().bits() - leaf_bits(params)
}

/// Key length: root seed, `L` levels of `CW_i ‖ VCW_i`, leaf correction.
pub fn key_len(params: &Params) -> usize {
    16 + usize::try_from(levels(params)).unwrap() * (16 + value_bytes(params)) + 16
}

fn block_at(key: &[u8], offset: usize) -> u128 {
    u128::from_le_bytes(key[offset..offset + 16].try_into().unwrap())
}

fn word_at(key: &[u8], offset: usize, len: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes[..len].copy_from_slice(&key[offset..offset + len]);
    u64::from_le_bytes(bytes)
}

fn hash(aes: &FixedKeyAes, domain: Domain, x: u128) -> u128 {
    u128::from_le_bytes(
        aes.hash(domain, Block::from_bytes(x.to_le_bytes()))
            .to_bytes(),
    )
}

fn lane(block: u128, lane_bits: u32, j: u32) -> u64 {
    let shifted = block >> (j * lane_bits);
    let low = u64::try_from(shifted & u128::from(u64::MAX)).unwrap();
    if lane_bits == 64 {
        low
    } else {
        low & ((1 << lane_bits) - 1)
    }
}

/// One party's output share of `key` at `x` (taken mod `2^k`): a bit for
/// bit output, a canonical word of `Z_2^w` for ring output (a pair's first
/// word).
///
/// Panics if `key` is not exactly [`key_len`] bytes.
pub fn eval(aes: &FixedKeyAes, params: &Params, party: Party, key: &[u8], x: u64) -> u64 {
    eval_word(aes, params, party, key, x, 0)
}

/// Word `word` of one party's output share of `key` at `x`: 0 for every
/// output but a pair, whose second word is 1.
///
/// Panics if `key` is not exactly [`key_len`] bytes or `word` is out of
/// range.
pub fn eval_word(
    aes: &FixedKeyAes,
    params: &Params,
    party: Party,
    key: &[u8],
    x: u64,
    word: usize,
) -> u64 {
    assert_eq!(key.len(), key_len(params), "key length for {params:?}");
    assert!(word < words(params.output()), "word {word} of {params:?}");
    let word_bytes = value_bytes(params) / words(params.output());
    let k = params.domain().bits();
    let x = x & params.domain().mask();
    let nu = leaf_bits(params);
    let level_len = 16 + value_bytes(params);
    let dcf = params.kind() == Kind::Dcf;

    let mut s = block_at(key, 0);
    let mut acc: u64 = 0;
    for i in 0..levels(params) {
        let level = 16 + usize::try_from(i).unwrap() * level_len;
        let cw = block_at(key, level);
        let t = s & 1;
        let left = hash(aes, Domain::Tree, s) ^ (cw * t);
        let right = left ^ s;
        let x_i = (x >> (k - 1 - i)) & 1;
        if dcf && x_i == 0 {
            // The right sibling is on α's path exactly when this level
            // decides x < α, and its share carries β·[x < α] then.
            let t_right = u64::try_from(right & 1).unwrap();
            match params.output() {
                Output::Bit => acc ^= t_right,
                Output::Ring(_) | Output::Pair(_) => {
                    let at = level + 16 + word * word_bytes;
                    let vcw = word_at(key, at, word_bytes);
                    let half = u32::try_from(word).unwrap();
                    let converted = lane(hash(aes, Domain::Value, right), 64, half);
                    acc = acc
                        .wrapping_add(converted)
                        .wrapping_add(t_right.wrapping_mul(vcw));
                }
            }
        }
        s = if x_i == 1 { right } else { left };
    }

    let lcw = block_at(key, key.len() - 16);
    let t = s & 1;
    let g = hash(aes, Domain::Leaf, s);
    let j = u32::try_from(x & ((1 << nu) - 1)).unwrap();
    match params.output() {
        Output::Bit => acc ^ lane(g ^ (lcw * t), 1, j),
        Output::Ring(w) | Output::Pair(w) => {
            let n = u32::try_from(words(params.output())).unwrap();
            let lb = lane_bits(params.output()) / n;
            let j = j * n + u32::try_from(word).unwrap();
            let t = u64::try_from(t).unwrap();
            let sum = acc
                .wrapping_add(lane(g, lb, j))
                .wrapping_add(t.wrapping_mul(lane(lcw, lb, j)));
            let share = match party {
                Party::P0 => sum,
                Party::P1 => sum.wrapping_neg(),
            };
            share & w.mask()
        }
    }
}

/// The cleartext functionality: `β·[x < α]` (DCF) or `β·[x = α]` (DPF), with
/// α and x taken mod `2^k`, β mod `2^w`, and β = 1 for bit output.
pub fn ideal(params: &Params, alpha: u64, beta: u64, x: u64) -> u64 {
    let k = params.domain();
    let (alpha, x) = (k.reduce(alpha), k.reduce(x));
    let hit = match params.kind() {
        Kind::Dcf => x < alpha,
        Kind::Dpf => x == alpha,
    };
    let beta = match params.output() {
        Output::Bit => 1,
        Output::Ring(w) | Output::Pair(w) => w.reduce(beta),
    };
    if hit { beta } else { 0 }
}

/// Puts two output shares back together: XOR for bits, a sum mod `2^w`
/// for ring outputs.
pub fn reconstruct(output: Output, y0: u64, y1: u64) -> u64 {
    match output {
        Output::Bit => y0 ^ y1,
        Output::Ring(w) | Output::Pair(w) => w.add(y0, y1),
    }
}

/// Whether `y` is a canonical output word: 0 or 1 for bits, below `2^w`
/// for ring output.
pub fn is_canonical(output: Output, y: u64) -> bool {
    match output {
        Output::Bit => y <= 1,
        Output::Ring(w) | Output::Pair(w) => w.contains(y),
    }
}
