//! Causal decoders: Llama-family (RMSNorm, RoPE, grouped-query attention,
//! SiLU-gated MLP) and GPT-2 (pre-LN LayerNorm, learned positions, tanh
//! GeLU). Plain data like the BERT [`Model`](super::Model): public f32
//! weights laid out as the linear algebra uses them (`y = x·w + b`, `w` as
//! `[inputs × outputs]`), filled by the checkpoint loaders (Hugging Face
//! folders, GGUF) or generated deterministically.

use sha2::{Digest as _, Sha256};

use super::generate::Stream;
use super::{Linear, ModelError, Norm, Rows, Tokenizer, tensor_hash};

/// Which decoder family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Architecture {
    /// Pre-norm RMSNorm, RoPE, grouped-query attention, gated MLP (Llama,
    /// SmolLM2, Mistral without sliding windows; with `Linear` biases and
    /// [`BlockForm`] parameters, Qwen2 and Gemma 3).
    Llama,
    /// Pre-LN LayerNorm, learned absolute positions, tanh GeLU MLP, biases
    /// everywhere (GPT-2).
    Gpt2,
}

/// How RoPE pairs the dimensions of a head it rotates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeStyle {
    /// Dimensions `(2i, 2i+1)` rotate together: GGUF files, whose converter
    /// permuted the Q and K rows into this order.
    Adjacent,
    /// Dimensions `(i, i + d_h/2)` rotate together: Hugging Face's
    /// `rotate_half` on safetensors checkpoints.
    RotateHalf,
}

/// The shape and hyper-parameters of a decoder.
#[derive(Clone, Debug, PartialEq)]
pub struct DecoderConfig {
    /// The family, which decides norms, positions and the MLP.
    pub architecture: Architecture,
    /// Rows of the token-embedding table.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden: usize,
    /// Number of blocks.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads; divides `heads` (grouped-query attention). GPT-2:
    /// equal to `heads`.
    pub kv_heads: usize,
    /// Width of one head; `heads · head_dim` is the query width.
    pub head_dim: usize,
    /// Width of the MLP.
    pub intermediate: usize,
    /// RoPE base frequency θ (Llama only).
    pub rope_theta: f32,
    /// RoPE pairing (Llama only).
    pub rope_style: RopeStyle,
    /// Epsilon of RMSNorm (Llama) or LayerNorm (GPT-2).
    pub norm_eps: f32,
    /// The longest context: positions `0..max_positions`.
    pub max_positions: usize,
    /// Whether the LM head is the token-embedding table transposed.
    pub tied_head: bool,
    /// Beginning-of-sequence token, if the model has one.
    pub bos: Option<u32>,
    /// End-of-sequence token: generation stops when it is produced.
    pub eos: Option<u32>,
    /// What differs between the Llama-like families beyond the tensors
    /// (Gemma 3: the activation, the embedding scale, sliding windows).
    pub block: BlockForm,
}

/// The gated MLP's activation: `act(x·W_gate) ⊙ x·W_up`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GatedActivation {
    /// SiLU (Llama, Qwen2).
    #[default]
    Silu,
    /// GeLU in its tanh form (Gemma's GeGLU).
    GeluTanh,
}

/// The per-family parameters of the shared block beyond its tensors; the
/// default is Llama's.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockForm {
    /// The gated MLP's activation.
    pub activation: GatedActivation,
    /// What the client multiplies a token's embedding by (Gemma: √hidden);
    /// `None` is 1. The tied head reads the table unscaled.
    pub embed_scale: Option<f32>,
    /// Local layers with a sliding window, the others global.
    pub sliding: Option<Sliding>,
    /// Every layer norms its query and key heads (`DecoderLayer::qk_norm`).
    pub qk_norm: bool,
    /// Every layer norms its attention and MLP outputs
    /// (`DecoderLayer::post_norms`).
    pub post_norms: bool,
}

/// Sliding-window attention on most layers (Gemma 3): layer `i` is local
/// when `i % period < period − 1`; a local layer's query at position `p`
/// sees keys `p − window < j ≤ p`, rotated with RoPE base `theta`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sliding {
    /// Keys a local query sees, itself included.
    pub window: usize,
    /// One global layer in every `period`, the last.
    pub period: usize,
    /// RoPE base of the local layers.
    pub theta: f32,
}

impl DecoderConfig {
    /// Layer `l`'s window and RoPE base: `(Some(window), local θ)` for a
    /// local layer, `(None, rope_theta)` for a global one.
    pub fn attention_of(&self, l: usize) -> (Option<usize>, f32) {
        match self.block.sliding {
            Some(s) if l % s.period.max(1) < s.period.max(1) - 1 => (Some(s.window), s.theta),
            _ => (None, self.rope_theta),
        }
    }
}

impl DecoderConfig {
    /// The embedded generated Llama-style decoder: 2 layers, hidden 64, 4
    /// query heads and 2 key/value heads of 16, MLP 128, up to 64
    /// positions, tied head, vocabulary 128.
    pub fn tiny_llama() -> DecoderConfig {
        DecoderConfig {
            architecture: Architecture::Llama,
            vocab_size: 128,
            hidden: 64,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            intermediate: 128,
            rope_theta: 10_000.0,
            rope_style: RopeStyle::RotateHalf,
            norm_eps: 1e-5,
            max_positions: 64,
            tied_head: true,
            bos: Some(1),
            eos: Some(2),
            block: BlockForm::default(),
        }
    }

    /// A tiny GPT-2: 2 layers, hidden 64, 4 heads, MLP 256, 64 positions,
    /// vocabulary 128.
    pub fn tiny_gpt2() -> DecoderConfig {
        DecoderConfig {
            architecture: Architecture::Gpt2,
            heads: 4,
            kv_heads: 4,
            head_dim: 16,
            intermediate: 256,
            norm_eps: 1e-5,
            bos: Some(1),
            eos: Some(1),
            ..DecoderConfig::tiny_llama()
        }
    }

    /// A tiny Gemma 3: 3 layers (two local with a window of 4 keys, RoPE
    /// base 10⁴, then one global, base 10⁶), hidden 64, 4 query heads and
    /// one key/value head of 16, GeGLU MLP 128, QK-norm, sandwich norms,
    /// embeddings scaled by √64, 64 positions, vocabulary 128.
    pub fn tiny_gemma() -> DecoderConfig {
        DecoderConfig {
            layers: 3,
            kv_heads: 1,
            rope_theta: 1e6,
            norm_eps: 1e-6,
            block: BlockForm {
                activation: GatedActivation::GeluTanh,
                embed_scale: Some(8.0),
                sliding: Some(Sliding {
                    window: 4,
                    period: 3,
                    theta: 10_000.0,
                }),
                qk_norm: true,
                post_norms: true,
            },
            ..DecoderConfig::tiny_llama()
        }
    }

    /// GPT-2-small's shape: 12 layers, hidden 768, 12 heads, MLP 3072,
    /// 1024 positions, vocabulary 50257, `<|endoftext|>` = 50256.
    pub fn gpt2_small() -> DecoderConfig {
        DecoderConfig {
            architecture: Architecture::Gpt2,
            vocab_size: 50257,
            hidden: 768,
            layers: 12,
            heads: 12,
            kv_heads: 12,
            head_dim: 64,
            intermediate: 3072,
            rope_theta: 10_000.0,
            rope_style: RopeStyle::RotateHalf,
            norm_eps: 1e-5,
            max_positions: 1024,
            tied_head: true,
            bos: Some(50256),
            eos: Some(50256),
            block: BlockForm::default(),
        }
    }

    /// Width of the key (and of the value) projection.
    pub fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Checks that the numbers describe a decoder that can exist.
    pub fn check(&self) -> Result<(), ModelError> {
        let bad = |why: String| Err(ModelError::InvalidConfig(why));
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("hidden", self.hidden),
            ("layers", self.layers),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("head_dim", self.head_dim),
            ("intermediate", self.intermediate),
            ("max_positions", self.max_positions),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return bad(format!("{name} is 0"));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "{} query heads are not a multiple of the {} key/value heads",
                self.heads, self.kv_heads
            ));
        }
        if self.architecture == Architecture::Llama && !self.head_dim.is_multiple_of(2) {
            return bad(format!(
                "RoPE needs an even head width, not {}",
                self.head_dim
            ));
        }
        if self.architecture == Architecture::Gpt2
            && (self.kv_heads != self.heads || self.heads * self.head_dim != self.hidden)
        {
            return bad("GPT-2 needs kv_heads = heads and heads·head_dim = hidden".into());
        }
        if !(self.norm_eps.is_finite() && self.norm_eps > 0.0) {
            return bad(format!("norm epsilon {} is not positive", self.norm_eps));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
            return bad(format!("RoPE base {} is not above 1", self.rope_theta));
        }
        if let Some(sc) = self
            .block
            .embed_scale
            .filter(|v| !(v.is_finite() && *v > 0.0))
        {
            return bad(format!("embedding scale {sc} is not positive"));
        }
        if let Some(w) = self.block.sliding
            && (w.window == 0 || w.period == 0 || !(w.theta.is_finite() && w.theta > 1.0))
        {
            return bad(format!(
                "sliding window {w:?} needs a window, a period and a base above 1"
            ));
        }
        for (name, t) in [("bos", self.bos), ("eos", self.eos)] {
            if let Some(t) = t.filter(|t| *t as usize >= self.vocab_size) {
                return bad(format!("{name} token {t} is outside the vocabulary"));
            }
        }
        Ok(())
    }
}

/// One pre-norm decoder block:
/// `x += attn(norm₁(x))`, `x += mlp(norm₂(x))`.
#[derive(Clone, Debug, PartialEq)]
pub struct DecoderLayer {
    /// The norm before attention. Llama's RMSNorm has `beta` all zero.
    pub attn_norm: Norm,
    /// Query projection, `[hidden × heads·head_dim]`.
    pub query: Linear,
    /// Key projection, `[hidden × kv_heads·head_dim]`.
    pub key: Linear,
    /// Value projection, `[hidden × kv_heads·head_dim]`.
    pub value: Linear,
    /// Attention output projection, `[heads·head_dim × hidden]`.
    pub attn_out: Linear,
    /// The norm before the MLP.
    pub mlp_norm: Norm,
    /// Llama's gate projection (`SiLU(x·W_gate) ⊙ x·W_up`); `None` for GPT-2.
    pub gate: Option<Linear>,
    /// Up projection, `[hidden × intermediate]` (GPT-2's `c_fc`).
    pub up: Linear,
    /// Down projection, `[intermediate × hidden]` (GPT-2's `c_proj`).
    pub down: Linear,
    /// RMSNorms of each query head and each key head before RoPE, over
    /// `head_dim` (Gemma 3's QK-norm).
    pub qk_norm: Option<(Norm, Norm)>,
    /// Norms of the attention's and of the MLP's output before each
    /// residual add (Gemma's sandwich norms).
    pub post_norms: Option<(Norm, Norm)>,
}

/// A decoder with its tokenizer.
#[derive(Clone, Debug, PartialEq)]
pub struct Decoder {
    /// A label (folder name or built-in name); not part of the digest.
    pub name: String,
    /// Shapes and hyper-parameters.
    pub config: DecoderConfig,
    /// Token embeddings `[vocab_size × hidden]` (the client looks them up).
    pub embed: Rows,
    /// GPT-2's learned positions `[max_positions × hidden]`; `None` for Llama.
    pub positions: Option<Vec<f32>>,
    /// The blocks, in order.
    pub layers: Vec<DecoderLayer>,
    /// The norm after the last block.
    pub final_norm: Norm,
    /// An untied LM head `[hidden × vocab_size]`; `None` when tied to
    /// `embed`.
    pub lm_head: Option<Linear>,
    /// Text to token ids.
    pub tokenizer: Tokenizer,
}

/// [`Decoder::generated`]'s weights: each tensor a stream named after it,
/// so the same `(config, seed)` gives the same model everywhere.
struct Generator<'c> {
    c: &'c DecoderConfig,
    seed: u64,
    llama: bool,
}

impl Generator<'_> {
    /// A norm `width` wide: gains near 1, biases small (none for Llama).
    fn norm(&self, name: &str, width: usize) -> Norm {
        let seed = self.seed;
        Norm {
            gamma: Stream::new(seed, &format!("{name}.weight"))
                .take(width, |s| 1.0 + 0.1 * (2.0 * s.uniform() - 1.0)),
            beta: if self.llama {
                vec![0.0; width]
            } else {
                Stream::new(seed, &format!("{name}.bias")).normals(width, 0.01)
            },
            eps: self.c.norm_eps,
        }
    }

    /// A linear layer with weights N(0, 0.02²) (no biases for Llama).
    fn linear(&self, name: &str, inputs: usize, outputs: usize) -> Linear {
        let seed = self.seed;
        Linear {
            w: Stream::new(seed, &format!("{name}.weight"))
                .normals(inputs * outputs, 0.02)
                .into(),
            b: if self.llama {
                vec![0.0; outputs]
            } else {
                Stream::new(seed, &format!("{name}.bias")).normals(outputs, 0.01)
            },
            inputs,
            outputs,
        }
    }

    /// Block `i`, with the norms its configuration's block form asks for.
    fn layer(&self, i: usize) -> DecoderLayer {
        let c = self.c;
        let (h, q, kv) = (c.hidden, c.heads * c.head_dim, c.kv_width());
        let p = format!("model.layers.{i}");
        let norm = |name: &str| self.norm(&format!("{p}.{name}"), h);
        let head_norm = |name: &str| self.norm(&format!("{p}.{name}"), c.head_dim);
        let linear =
            |name: &str, inputs, outputs| self.linear(&format!("{p}.{name}"), inputs, outputs);
        DecoderLayer {
            attn_norm: norm("input_layernorm"),
            query: linear("self_attn.q_proj", h, q),
            key: linear("self_attn.k_proj", h, kv),
            value: linear("self_attn.v_proj", h, kv),
            attn_out: linear("self_attn.o_proj", q, h),
            mlp_norm: norm("post_attention_layernorm"),
            gate: self
                .llama
                .then(|| linear("mlp.gate_proj", h, c.intermediate)),
            up: linear("mlp.up_proj", h, c.intermediate),
            down: linear("mlp.down_proj", c.intermediate, h),
            qk_norm: c
                .block
                .qk_norm
                .then(|| (head_norm("self_attn.q_norm"), head_norm("self_attn.k_norm"))),
            post_norms: c.block.post_norms.then(|| {
                (
                    norm("post_attention_layernorm"),
                    norm("post_feedforward_layernorm"),
                )
            }),
        }
    }
}

impl Decoder {
    /// A decoder with deterministic pseudo-random weights of realistic scale
    /// (GPT-2's initialization: weights N(0, 0.02²), norm gains near 1) and a
    /// character-level tokenizer. The same `(config, seed)` gives the same
    /// model on every platform.
    ///
    /// # Panics
    ///
    /// If `config` fails [`DecoderConfig::check`]: a generated configuration
    /// is written by a programmer, not read from a user's file.
    pub fn generated(config: DecoderConfig, seed: u64) -> Decoder {
        if let Err(e) = config.check() {
            panic!("Decoder::generated: {e}");
        }
        let g = Generator {
            c: &config,
            seed,
            llama: config.architecture == Architecture::Llama,
        };
        let layers = (0..config.layers).map(|i| g.layer(i)).collect();
        let (c, h, llama) = (&config, config.hidden, g.llama);
        Decoder {
            name: format!("generated-decoder-{seed}"),
            embed: Stream::new(seed, "model.embed_tokens.weight")
                .normals(c.vocab_size * h, 0.02)
                .into(),
            positions: (!llama)
                .then(|| Stream::new(seed, "wpe.weight").normals(c.max_positions * h, 0.01)),
            layers,
            final_norm: g.norm("model.norm", h),
            lm_head: None,
            tokenizer: Tokenizer::char_level(c.vocab_size),
            config,
        }
    }

    /// Loads a Hugging Face decoder folder: `config.json` with
    /// `model_type` `llama` or `gpt2`, `model.safetensors` (F32, F16 or
    /// BF16) and `tokenizer.json`. Linear layers are transposed to
    /// `[inputs × outputs]` (GPT-2's `Conv1D` already is, and its packed
    /// `c_attn` is split into query, key and value); Llama's RoPE is
    /// [`RopeStyle::RotateHalf`]. Every shape is checked against the
    /// config. The model is named after the folder.
    pub fn load(dir: &std::path::Path) -> Result<Decoder, ModelError> {
        super::checkpoint::load_decoder(dir)
    }

    /// The built-in decoders, by name: `tiny-llama` (the demo's decoder),
    /// `tiny-gpt2`, and `generated-gpt2` in GPT-2-small's shape for cost.
    pub fn builtin(name: &str) -> Option<Decoder> {
        let config = match name {
            "tiny-llama" => DecoderConfig::tiny_llama(),
            "tiny-gpt2" => DecoderConfig::tiny_gpt2(),
            "tiny-gemma" => DecoderConfig::tiny_gemma(),
            "generated-gpt2" => DecoderConfig::gpt2_small(),
            _ => return None,
        };
        let mut d = Decoder::generated(config, super::generate::DEMO_SEED);
        d.name = name.to_string();
        Some(d)
    }

    /// The names [`Decoder::builtin`] knows.
    pub const BUILTIN: [&'static str; 4] =
        ["tiny-llama", "tiny-gpt2", "tiny-gemma", "generated-gpt2"];

    /// The LM head as a linear layer `[hidden × vocab]`: the untied head,
    /// or the embedding table transposed.
    pub fn head(&self) -> Linear {
        if let Some(h) = &self.lm_head {
            return h.clone();
        }
        let (v, d) = (self.config.vocab_size, self.config.hidden);
        Linear {
            w: self.embed.transposed(v, d),
            b: vec![0.0; v],
            inputs: d,
            outputs: v,
        }
    }

    /// The client's input for token `token` at position `position`: its
    /// embedding row, plus GPT-2's learned position.
    pub fn embed_token(&self, token: u32, position: usize) -> Result<Vec<f32>, ModelError> {
        let c = &self.config;
        if token as usize >= c.vocab_size {
            return Err(ModelError::TokenOutOfRange {
                token,
                position,
                vocab_size: c.vocab_size,
            });
        }
        if position >= c.max_positions {
            return Err(ModelError::TooManyTokens {
                len: position + 1,
                max: c.max_positions,
            });
        }
        let d = c.hidden;
        let mut row = (self.embed.row(token as usize, d))
            .ok_or(ModelError::TokenOutOfRange {
                token,
                position,
                vocab_size: c.vocab_size,
            })?
            .into_owned();
        if let Some(scale) = c.block.embed_scale {
            row.iter_mut().for_each(|x| *x *= scale);
        }
        if let Some(p) = &self.positions {
            for (x, y) in row.iter_mut().zip(&p[position * d..][..d]) {
                *x += *y;
            }
        }
        Ok(row)
    }

    /// SHA-256 of everything that determines the outputs from token ids:
    /// the config, then every tensor's [`tensor_hash`] in canonical
    /// order. The name and the tokenizer are not included. A tensor left
    /// in a GGUF file is hashed once and remembered (its bytes never
    /// change), so that a client, which sends the digest with every query,
    /// does not dequantize the model each time.
    pub fn digest(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(b"suffuse decoder digest v2\0");
        let c = &self.config;
        digest_config(&mut h, c);
        let mut put = |hash: [u8; 32]| h.update(hash);
        self.digest_tensors(&mut put);
        // Only what a family sets, so that the digests of the others stay.
        if c.block != BlockForm::default() {
            let b = &c.block;
            let sliding = b
                .sliding
                .map_or([0.0; 3], |s| [s.window as f32, s.period as f32, s.theta]);
            put(held(&[
                b.activation as u8 as f32,
                b.embed_scale.unwrap_or(1.0),
            ]));
            put(held(&sliding));
        }
        for l in &self.layers {
            for (a, b) in l.qk_norm.iter().chain(&l.post_norms) {
                digest_norm(&mut put, a);
                digest_norm(&mut put, b);
            }
        }
        if let Some(head) = &self.lm_head {
            put(head.w.hash());
            put(held(&head.b));
        }
        h.finalize().into()
    }

    /// The tensors every family has, in the digest's canonical order: the
    /// embeddings, each layer's norms and linear layers, the final norm.
    fn digest_tensors(&self, put: &mut dyn FnMut([u8; 32])) {
        put(self.embed.hash());
        put(held(self.positions.as_deref().unwrap_or_default()));
        for l in &self.layers {
            digest_norm(put, &l.attn_norm);
            for lin in [&l.query, &l.key, &l.value, &l.attn_out]
                .into_iter()
                .chain(l.gate.as_ref())
                .chain([&l.up, &l.down])
            {
                put(lin.w.hash());
                put(held(&lin.b));
            }
            digest_norm(put, &l.mlp_norm);
        }
        digest_norm(put, &self.final_norm);
    }
}

/// The [`tensor_hash`] of values in hand.
fn held(values: &[f32]) -> [u8; 32] {
    tensor_hash(values.len(), |f| f(values))
}

/// [`Decoder::digest`]'s hyper-parameters: the enums and flags, the sizes,
/// the floats' bits and the control tokens.
fn digest_config(h: &mut Sha256, c: &DecoderConfig) {
    h.update([
        c.architecture as u8,
        c.rope_style as u8,
        u8::from(c.tied_head),
    ]);
    for v in [
        c.vocab_size,
        c.hidden,
        c.layers,
        c.heads,
        c.kv_heads,
        c.head_dim,
        c.intermediate,
        c.max_positions,
    ] {
        h.update((v as u64).to_le_bytes());
    }
    for v in [c.rope_theta, c.norm_eps] {
        h.update(v.to_bits().to_le_bytes());
    }
    for t in [c.bos, c.eos] {
        h.update(t.map_or(u64::MAX, u64::from).to_le_bytes());
    }
}

/// A norm's part of [`Decoder::digest`]: gains, shifts and ε.
fn digest_norm(put: &mut dyn FnMut([u8; 32]), n: &Norm) {
    put(held(&n.gamma));
    put(held(&n.beta));
    put(held(&[n.eps]));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_are_valid_and_deterministic() {
        for name in ["tiny-llama", "tiny-gpt2"] {
            let a = Decoder::builtin(name).unwrap();
            let b = Decoder::builtin(name).unwrap();
            a.config.check().unwrap();
            assert_eq!(a.digest(), b.digest());
            assert_eq!(a.head().outputs, a.config.vocab_size);
        }
        let llama = Decoder::builtin("tiny-llama").unwrap();
        assert!(llama.layers.iter().all(|l| l.gate.is_some()));
        assert_eq!(llama.layers[0].key.outputs, llama.config.kv_width());
        assert!(llama.positions.is_none());
        let gpt2 = Decoder::builtin("tiny-gpt2").unwrap();
        assert!(gpt2.layers.iter().all(|l| l.gate.is_none()));
        assert!(gpt2.positions.is_some());
        assert_ne!(llama.digest(), gpt2.digest());
        assert_eq!(
            DecoderConfig::gpt2_small()
                .check()
                .map_err(|e| e.to_string()),
            Ok(())
        );
    }

    #[test]
    fn tied_head_is_the_embedding_transposed() {
        let m = Decoder::builtin("tiny-llama").unwrap();
        let h = m.head();
        let (v, d) = (m.config.vocab_size, m.config.hidden);
        assert_eq!(h.w.values()[3 * v + 7], m.embed.values()[7 * d + 3]);
    }

    #[test]
    fn a_weight_an_embedding_or_a_gain_changes_the_digest() {
        let m = Decoder::builtin("tiny-llama").unwrap();
        let mut w = m.clone();
        w.layers[1].down.w.held_mut()[7] += 1e-3;
        let mut e = m.clone();
        if let Rows::Held(v) = &mut e.embed {
            v[3] += 1e-3;
        }
        let mut g = m.clone();
        g.final_norm.gamma[0] += 1e-3;
        let digests = [&m, &w, &e, &g].map(Decoder::digest);
        for (i, a) in digests.iter().enumerate() {
            for b in &digests[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(m.clone().digest(), digests[0]);
    }

    #[test]
    fn bad_configs_are_refused() {
        let mut c = DecoderConfig::tiny_llama();
        c.kv_heads = 3;
        assert!(c.check().is_err());
        let mut c = DecoderConfig::tiny_llama();
        c.eos = Some(500);
        assert!(c.check().is_err());
        let mut c = DecoderConfig::tiny_gpt2();
        c.kv_heads = 2;
        assert!(c.check().is_err());
    }

    #[test]
    fn embedding_rejects_bad_tokens_and_positions() {
        let m = Decoder::builtin("tiny-gpt2").unwrap();
        assert!(m.embed_token(128, 0).is_err());
        assert!(m.embed_token(5, 64).is_err());
        let e = m.embed_token(5, 3).unwrap();
        let d = m.config.hidden;
        let p = m.positions.as_ref().unwrap();
        assert_eq!(e[0], m.embed.values()[5 * d] + p[3 * d]);
    }
}
