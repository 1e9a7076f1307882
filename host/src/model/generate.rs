//! Deterministic generated models: realistic scales, no files.
//!
//! Each tensor draws from its own stream, seeded by SHA-256 of the model
//! seed and the tensor's name, so a tensor's values do not depend on the
//! order of generation or on the other tensors' sizes. Only integer and
//! basic f64 arithmetic is used, so the values are the same on every
//! platform.

use sha2::{Digest as _, Sha256};

use super::{Config, Embeddings, Layer, Linear, Model, Norm, Tokenizer};

/// The seed of [`Model::demo`].
pub(super) const DEMO_SEED: u64 = u64::from_le_bytes(*b"suffuse1");

/// Standard deviation of weights and embeddings, BERT's `initializer_range`.
const WEIGHT_STD: f64 = 0.02;
/// Standard deviation of biases and LayerNorm shifts: trained BERTs have
/// small but non-zero ones, and zeros would hide bias-handling bugs.
const BIAS_STD: f64 = 0.01;
/// LayerNorm scales are drawn uniformly from `1 ± GAMMA_SPREAD`.
const GAMMA_SPREAD: f64 = 0.1;

pub(super) fn model(config: Config, seed: u64) -> Model {
    if let Err(e) = config.check() {
        panic!("Model::generated: {e}");
    }
    let c = &config;
    let h = c.hidden;
    let norm = |name: &str| Norm {
        gamma: Stream::new(seed, &format!("{name}.weight"))
            .take(h, |s| 1.0 + GAMMA_SPREAD * (2.0 * s.uniform() - 1.0)),
        beta: Stream::new(seed, &format!("{name}.bias")).normals(h, BIAS_STD),
        eps: c.ln_eps,
    };
    let linear = |name: &str, inputs: usize, outputs: usize| Linear {
        w: Stream::new(seed, &format!("{name}.weight"))
            .normals(inputs * outputs, WEIGHT_STD)
            .into(),
        b: Stream::new(seed, &format!("{name}.bias")).normals(outputs, BIAS_STD),
        inputs,
        outputs,
    };
    let embeddings = Embeddings {
        word: Stream::new(seed, "embeddings.word_embeddings.weight")
            .normals(c.vocab_size * h, WEIGHT_STD),
        position: Stream::new(seed, "embeddings.position_embeddings.weight")
            .normals(c.max_positions * h, WEIGHT_STD),
        token_type: Stream::new(seed, "embeddings.token_type_embeddings.weight")
            .normals(c.type_vocab * h, WEIGHT_STD),
        norm: norm("embeddings.LayerNorm"),
    };
    let layers = (0..c.layers)
        .map(|i| {
            let p = format!("encoder.layer.{i}");
            Layer {
                query: linear(&format!("{p}.attention.self.query"), h, h),
                key: linear(&format!("{p}.attention.self.key"), h, h),
                value: linear(&format!("{p}.attention.self.value"), h, h),
                attn_out: linear(&format!("{p}.attention.output.dense"), h, h),
                attn_norm: norm(&format!("{p}.attention.output.LayerNorm")),
                ffn_in: linear(&format!("{p}.intermediate.dense"), h, c.intermediate),
                ffn_out: linear(&format!("{p}.output.dense"), c.intermediate, h),
                ffn_norm: norm(&format!("{p}.output.LayerNorm")),
            }
        })
        .collect();
    Model {
        name: format!("generated-{seed}"),
        tokenizer: Tokenizer::char_level(c.vocab_size),
        embeddings,
        layers,
        config,
    }
}

/// SplitMix64 (Steele, Lea, Flood 2014): tiny, fast and plenty for test
/// weights. Not for anything secret.
pub(super) struct Stream(u64);

impl Stream {
    pub(super) fn new(seed: u64, name: &str) -> Stream {
        let mut h = Sha256::new();
        h.update(b"suffuse generated model v1\0");
        h.update(seed.to_le_bytes());
        h.update(name.as_bytes());
        let d = h.finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&d[..8]);
        Stream(u64::from_le_bytes(first))
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub(super) fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Approximately N(0, 1): the Irwin–Hall sum of four uniforms,
    /// standardized. Bounded by ±2√3, which keeps generated weights free of
    /// outliers; shape beyond the first two moments does not matter here.
    fn normal(&mut self) -> f64 {
        let sum: f64 = (0..4).map(|_| self.uniform()).sum();
        (sum - 2.0) * 3f64.sqrt()
    }

    pub(super) fn normals(mut self, n: usize, std: f64) -> Vec<f32> {
        (0..n).map(|_| (self.normal() * std) as f32).collect()
    }

    pub(super) fn take(mut self, n: usize, mut f: impl FnMut(&mut Stream) -> f64) -> Vec<f32> {
        (0..n).map(|_| f(&mut self) as f32).collect()
    }
}
