//! Gemma 3 (270M, 1B) from GGUF: Llama's tensors plus QK-norm and sandwich
//! norms, with the block's other differences read as parameters.
//!
//! Facts of the format (llama.cpp's `convert_hf_to_gguf.py` `Gemma3Model`
//! and `llama-model.cpp` `LLM_ARCH_GEMMA3`):
//! - hyper-parameters are `gemma3.*` keys with Llama's names;
//!   `attention.key_length` gives the head width (256 for 270M, not
//!   hidden / heads); `attention.sliding_window` the local window (512);
//! - five of every six layers are local (`i % 6 < 5`) with RoPE base
//!   10,000, the sixth global with `rope.freq_base` (10⁶): llama.cpp sets
//!   this pattern and the local base in code, not in the file;
//! - per block, besides Llama's tensors: `attn_q_norm` and `attn_k_norm`
//!   (over the head width, before RoPE), `post_attention_norm` and
//!   `post_ffw_norm` (the outputs' norms before each residual add);
//! - RMSNorm gains are stored as `1 + w`: the converter added the one;
//! - RoPE rotates halves (NEOX mode); the MLP is GeGLU (GeLU, tanh form);
//!   embeddings are multiplied by √hidden, and the head (tied: no
//!   `output.weight`) reads the unscaled table;
//! - the vocabulary is SentencePiece's (`tokenizer.ggml.model = llama`).
//!
//! Scaled attention: llama.cpp scales Gemma 3's scores by
//! `1/√key_length`, which the planner does for every family.

use super::Gguf;
use super::llama::Family;
use crate::model::{BlockForm, DecoderConfig, GatedActivation, ModelError, RopeStyle, Sliding};

/// `general.architecture = gemma3`.
pub(super) const GEMMA3: Family = Family {
    name: "gemma3",
    rope_style: RopeStyle::RotateHalf,
    qkv_bias: false,
    block: Some(block),
};

/// One global layer in six.
const PERIOD: usize = 6;

/// The local layers' RoPE base.
const LOCAL_THETA: f32 = 10_000.0;

fn block(g: &Gguf, c: &DecoderConfig) -> Result<BlockForm, ModelError> {
    let window = g.usize("gemma3.attention.sliding_window")?;
    Ok(BlockForm {
        activation: GatedActivation::GeluTanh,
        embed_scale: Some((c.hidden as f32).sqrt()),
        sliding: Some(Sliding {
            window,
            period: PERIOD,
            theta: LOCAL_THETA,
        }),
        qk_norm: true,
        post_norms: true,
    })
}

#[cfg(test)]
mod tests {
    use super::super::Gguf;
    use super::super::llama::tests::written;
    use crate::model::{
        BlockForm, Decoder, DecoderConfig, GatedActivation, ModelError, RopeStyle, Sliding,
    };

    /// The tiny Gemma as the loader reads one: llama.cpp's pattern (one
    /// global layer in six) and local base, √hidden, GeGLU, rotate-half.
    fn tiny() -> Decoder {
        let config = DecoderConfig {
            vocab_size: 258,
            rope_style: RopeStyle::RotateHalf,
            bos: Some(256),
            eos: Some(257),
            layers: 7,
            block: BlockForm {
                activation: GatedActivation::GeluTanh,
                embed_scale: Some(8.0),
                sliding: Some(Sliding {
                    window: 4,
                    period: 6,
                    theta: 10_000.0,
                }),
                qk_norm: true,
                post_norms: true,
            },
            ..DecoderConfig::tiny_gemma()
        };
        Decoder::generated(config, 12)
    }

    fn load(d: &Decoder) -> Result<Decoder, ModelError> {
        let bytes = written(d, "gemma3").to_bytes();
        Decoder::from_gguf(&Gguf::from_bytes(bytes).unwrap(), "tiny")
    }

    #[test]
    fn a_written_gemma3_reads_back_bit_for_bit() {
        let want = tiny();
        let got = load(&want).unwrap();
        assert_eq!(got.config, want.config);
        assert_eq!(got.layers, want.layers);
        assert_eq!(got.digest(), want.digest());
        assert_eq!(got.config.attention_of(5), (None, 1e6));
        assert_eq!(got.config.attention_of(6), (Some(4), 10_000.0));
        // The client scales a token's embedding; the tied head does not.
        let e = got.embed_token(3, 0).unwrap();
        assert_eq!(e[1], got.embed.values()[3 * 64 + 1] * 8.0);
        // Head element (input 0, token 3) is embedding row 3's first value.
        assert_eq!(got.head().w.values()[3], got.embed.values()[3 * 64]);
    }

    #[test]
    fn a_gemma3_file_without_its_norms_is_refused() {
        let mut d = tiny();
        d.layers[1].qk_norm = None;
        let e = load(&d).unwrap_err().to_string();
        assert!(e.contains("blk.1.attn_q_norm.weight"), "{e}");
    }
}
