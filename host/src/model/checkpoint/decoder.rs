//! Hugging Face decoder folders: Llama (`model_type: llama`) and GPT-2
//! (`model_type: gpt2`), each `config.json`, `model.safetensors` and
//! `tokenizer.json`, read into the [`Decoder`] types.
//!
//! Layouts: Llama's projections are `nn.Linear`, stored `[outputs,
//! inputs]` and transposed on load; GPT-2's are `Conv1D`, already `[inputs,
//! outputs]`, and `c_attn` packs the query, key and value columns in that
//! order. Hugging Face's Llama rotates half-head pairs `(i, i + d_h/2)`
//! (`rotate_half`), so a folder loads as [`RopeStyle::RotateHalf`]; GGUF's
//! converter permutes the rows to adjacent pairs instead.

use std::path::Path;

use serde_json::Value;

use super::{Fields, Tensors, WeightFiles, folder_name, tokenizer};
use crate::model::{
    Architecture, BlockForm, Decoder, DecoderConfig, DecoderLayer, Linear, Matrix, ModelError,
    Norm, RopeStyle,
};

/// A Llama folder.
pub(super) fn llama(dir: &Path, f: &Fields<'_>) -> Result<Decoder, ModelError> {
    let config = llama_config(f)?;
    let biases = (
        f.bool_or("attention_bias", false)?,
        f.bool_or("mlp_bias", false)?,
    );
    let weights = WeightFiles::open(dir)?;
    // `lm_head` sits beside `model.`, so the bare name is tried too.
    let t = weights.tensors(&["model.", ""])?;
    let c = &config;
    let h = c.hidden;
    let rms = |name: &str| -> Result<Norm, ModelError> {
        Ok(Norm {
            gamma: t.get(&format!("{name}.weight"), &[h])?,
            beta: vec![0.0; h],
            eps: c.norm_eps,
        })
    };
    let layers = (0..c.layers)
        .map(|i| llama_layer(&t, c, i, biases, &rms))
        .collect::<Result<Vec<_>, ModelError>>()?;
    Ok(Decoder {
        name: folder_name(dir),
        embed: t.get("embed_tokens.weight", &[c.vocab_size, h])?.into(),
        positions: None,
        layers,
        final_norm: rms("norm")?,
        lm_head: head(&t, c, c.tied_head)?,
        tokenizer: tokenizer(dir, false, c.vocab_size)?,
        config,
    })
}

/// A Llama `config.json`'s checked configuration: SiLU, no RoPE scaling,
/// a head size given or dividing the width.
fn llama_config(f: &Fields<'_>) -> Result<DecoderConfig, ModelError> {
    let act = f.string_or("hidden_act", "silu")?;
    if act != "silu" {
        return Err(ModelError::UnsupportedActivation(format!(
            "{act} (a Llama MLP needs silu)"
        )));
    }
    refuse_rope_scaling(f)?;
    let (hidden, heads) = (f.usize("hidden_size")?, f.usize("num_attention_heads")?);
    let head_dim = match f.json.get("head_dim") {
        None | Some(Value::Null) if heads > 0 && hidden.is_multiple_of(heads) => hidden / heads,
        None | Some(Value::Null) => {
            return Err(f.error(format!(
                "no `head_dim`, and hidden_size {hidden} is not a multiple of the {heads} heads"
            )));
        }
        Some(_) => f.usize("head_dim")?,
    };
    let config = DecoderConfig {
        architecture: Architecture::Llama,
        vocab_size: f.usize("vocab_size")?,
        hidden,
        layers: f.usize("num_hidden_layers")?,
        heads,
        kv_heads: f.usize_or("num_key_value_heads", heads)?,
        head_dim,
        intermediate: f.usize("intermediate_size")?,
        rope_theta: f.f32_or("rope_theta", 10_000.0)?,
        rope_style: RopeStyle::RotateHalf,
        norm_eps: f.f32_or("rms_norm_eps", 1e-6)?,
        max_positions: f.usize_or("max_position_embeddings", 2048)?,
        tied_head: f.bool_or("tie_word_embeddings", false)?,
        bos: token(f, "bos_token_id", None)?,
        eos: token(f, "eos_token_id", None)?,
        block: BlockForm::default(),
    };
    config.check()?;
    Ok(config)
}

/// Llama layer `i`, with biases on the attention's and the MLP's
/// projections where `(attn_bias, mlp_bias)` say so.
fn llama_layer(
    t: &Tensors<'_>,
    c: &DecoderConfig,
    i: usize,
    (attn_bias, mlp_bias): (bool, bool),
    rms: &dyn Fn(&str) -> Result<Norm, ModelError>,
) -> Result<DecoderLayer, ModelError> {
    let (h, q, kv, ff) = (c.hidden, c.heads * c.head_dim, c.kv_width(), c.intermediate);
    let (a, m) = (format!("layers.{i}.self_attn"), format!("layers.{i}.mlp"));
    Ok(DecoderLayer {
        attn_norm: rms(&format!("layers.{i}.input_layernorm"))?,
        query: t.linear_with(&format!("{a}.q_proj"), h, q, attn_bias)?,
        key: t.linear_with(&format!("{a}.k_proj"), h, kv, attn_bias)?,
        value: t.linear_with(&format!("{a}.v_proj"), h, kv, attn_bias)?,
        attn_out: t.linear_with(&format!("{a}.o_proj"), q, h, attn_bias)?,
        mlp_norm: rms(&format!("layers.{i}.post_attention_layernorm"))?,
        gate: Some(t.linear_with(&format!("{m}.gate_proj"), h, ff, mlp_bias)?),
        up: t.linear_with(&format!("{m}.up_proj"), h, ff, mlp_bias)?,
        down: t.linear_with(&format!("{m}.down_proj"), ff, h, mlp_bias)?,
        qk_norm: None,
        post_norms: None,
    })
}

/// A GPT-2 folder.
pub(super) fn gpt2(dir: &Path, f: &Fields<'_>) -> Result<Decoder, ModelError> {
    let config = gpt2_config(f)?;
    let weights = WeightFiles::open(dir)?;
    let t = weights.tensors(&["", "transformer."])?;
    let c = &config;
    let h = c.hidden;
    let ln = |name: &str| -> Result<Norm, ModelError> {
        Ok(Norm {
            gamma: t.get(&format!("{name}.weight"), &[h])?,
            beta: t.get(&format!("{name}.bias"), &[h])?,
            eps: c.norm_eps,
        })
    };
    let layers = (0..c.layers)
        .map(|i| gpt2_layer(&t, c, &format!("h.{i}"), &ln))
        .collect::<Result<Vec<_>, ModelError>>()?;
    Ok(Decoder {
        name: folder_name(dir),
        embed: t.get("wte.weight", &[c.vocab_size, h])?.into(),
        positions: Some(t.get("wpe.weight", &[c.max_positions, h])?),
        layers,
        final_norm: ln("ln_f")?,
        lm_head: head(&t, c, c.tied_head)?,
        tokenizer: tokenizer(dir, false, c.vocab_size)?,
        config,
    })
}

/// A GPT-2 `config.json`'s checked configuration: tanh GeLU, scores
/// scaled by 1/√d_h, heads that divide the width.
fn gpt2_config(f: &Fields<'_>) -> Result<DecoderConfig, ModelError> {
    let act = f.string_or("activation_function", "gelu_new")?;
    if !matches!(act.as_str(), "gelu_new" | "gelu_pytorch_tanh") {
        return Err(ModelError::UnsupportedActivation(format!(
            "{act} (the GPT-2 MLP here is tanh GeLU: gelu_new or gelu_pytorch_tanh)"
        )));
    }
    // Both change the attention scores' scale away from 1/√d_h.
    if !f.bool_or("scale_attn_weights", true)?
        || f.bool_or("scale_attn_by_inverse_layer_idx", false)?
    {
        return Err(ModelError::UnsupportedArchitecture(
            "GPT-2 attention scaled other than by 1/√d_h (scale_attn_weights false or \
             scale_attn_by_inverse_layer_idx true)"
                .into(),
        ));
    }
    let (hidden, heads) = (f.usize("n_embd")?, f.usize("n_head")?);
    if heads == 0 || !hidden.is_multiple_of(heads) {
        return Err(f.error(format!(
            "n_embd {hidden} is not a multiple of n_head {heads}"
        )));
    }
    let config = DecoderConfig {
        architecture: Architecture::Gpt2,
        vocab_size: f.usize("vocab_size")?,
        hidden,
        layers: f.usize("n_layer")?,
        heads,
        kv_heads: heads,
        head_dim: hidden / heads,
        intermediate: f.usize_or("n_inner", 4 * hidden)?,
        rope_theta: 10_000.0,
        rope_style: RopeStyle::RotateHalf,
        norm_eps: f.f32_or("layer_norm_epsilon", 1e-5)?,
        max_positions: f.usize_or("n_positions", 1024)?,
        tied_head: f.bool_or("tie_word_embeddings", true)?,
        // GPT2Config's defaults: `<|endoftext|>` is both.
        bos: token(f, "bos_token_id", Some(50256))?,
        eos: token(f, "eos_token_id", Some(50256))?,
        block: BlockForm::default(),
    };
    config.check()?;
    Ok(config)
}

/// GPT-2 block `p` (`h.{i}`): its Conv1D weights, the fused q/k/v split
/// into its three parts.
fn gpt2_layer(
    t: &Tensors<'_>,
    c: &DecoderConfig,
    p: &str,
    ln: &dyn Fn(&str) -> Result<Norm, ModelError>,
) -> Result<DecoderLayer, ModelError> {
    let (h, ff) = (c.hidden, c.intermediate);
    let [query, key, value] = split_columns(&t.conv1d(&format!("{p}.attn.c_attn"), h, 3 * h)?);
    Ok(DecoderLayer {
        attn_norm: ln(&format!("{p}.ln_1"))?,
        query,
        key,
        value,
        attn_out: t.conv1d(&format!("{p}.attn.c_proj"), h, h)?,
        mlp_norm: ln(&format!("{p}.ln_2"))?,
        gate: None,
        up: t.conv1d(&format!("{p}.mlp.c_fc"), h, ff)?,
        down: t.conv1d(&format!("{p}.mlp.c_proj"), ff, h)?,
        qk_norm: None,
        post_norms: None,
    })
}

/// The untied LM head `lm_head.weight` (`[vocab, hidden]`, no bias), or
/// `None` when tied to the embeddings (a stored copy is then ignored, as
/// Hugging Face does).
fn head(t: &Tensors<'_>, c: &DecoderConfig, tied: bool) -> Result<Option<Linear>, ModelError> {
    if tied {
        return Ok(None);
    }
    t.linear_with("lm_head", c.hidden, c.vocab_size, false)
        .map(Some)
}

/// `[inputs × 3w]` cut into its three `[inputs × w]` column blocks.
fn split_columns(packed: &Linear) -> [Linear; 3] {
    let w = packed.outputs / 3;
    std::array::from_fn(|part| Linear {
        w: Matrix::Held(
            packed
                .w
                .values()
                .chunks_exact(packed.outputs)
                .flat_map(|row| &row[part * w..(part + 1) * w])
                .copied()
                .collect(),
        ),
        b: packed.b[part * w..(part + 1) * w].to_vec(),
        inputs: packed.inputs,
        outputs: w,
    })
}

/// Llama's `rope_scaling` changes the rotation angles; only its absence
/// (or the `default` type) is the plain RoPE the plan computes.
fn refuse_rope_scaling(f: &Fields<'_>) -> Result<(), ModelError> {
    let scaling = match f.json.get("rope_scaling") {
        None | Some(Value::Null) => return Ok(()),
        Some(v) => v,
    };
    let kind = ["rope_type", "type"]
        .iter()
        .find_map(|k| scaling.get(k).and_then(Value::as_str));
    match kind {
        Some("default") => Ok(()),
        _ => Err(ModelError::UnsupportedArchitecture(format!(
            "rope_scaling {scaling} (only plain RoPE is implemented)"
        ))),
    }
}

/// A special-token id: a number, `null` (none), or a list, whose first
/// entry is taken (Llama 3 lists several end tokens; generation stops at
/// the first).
fn token(f: &Fields<'_>, key: &str, default: Option<u32>) -> Result<Option<u32>, ModelError> {
    let v = match f.json.get(key) {
        None => return Ok(default),
        Some(Value::Null) => return Ok(None),
        Some(Value::Array(list)) => match list.first() {
            None => return Ok(None),
            Some(v) => v,
        },
        Some(v) => v,
    };
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .map(Some)
        .ok_or_else(|| f.error(format!("`{key}` is {v}, not a token id")))
}
