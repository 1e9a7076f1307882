//! A GGUF file of the `llama` architecture as a [`Decoder`].
//!
//! Facts of the format this adapter relies on (llama.cpp's
//! `convert_hf_to_gguf.py` and `llama-model.cpp`):
//! - hyper-parameters are `llama.*` keys: `embedding_length`,
//!   `block_count`, `feed_forward_length`, `attention.head_count`,
//!   `attention.head_count_kv` (absent: equal to the heads),
//!   `rope.freq_base` (absent: 10000), `attention.layer_norm_rms_epsilon`,
//!   `context_length`, and `rope.dimension_count` (absent: the head width);
//! - a tensor's `ne` lists its fastest axis first, so a matrix with
//!   `ne = [in, out]` is stored row-major as `[out][in]`, PyTorch's
//!   `nn.Linear` layout, and is transposed here into the repository's
//!   `[inputs × outputs]`; `token_embd` (`ne = [hidden, vocab]`) is
//!   already `[vocab × hidden]`;
//! - the LM head is `output.weight`, or tied to `token_embd` when absent;
//! - the converter permuted the Q and K rows so that RoPE rotates
//!   adjacent pairs `(2i, 2i+1)` ([`RopeStyle::Adjacent`]), llama.cpp's
//!   "normal" RoPE for this architecture;
//! - RMSNorm weights only, no biases anywhere.
//!
//! Other architectures with Llama's block are read by the same code, each
//! described by a [`Family`] in its own file: what differs is data
//! (`qwen2.rs`: biases on Q, K and V, rotate-half RoPE).
//!
//! Anything else is refused rather than guessed: another architecture,
//! RoPE scaling, partial rotary dimensions, a tensor this adapter does not
//! consume (biases where the family has none, `rope_freqs`), or a tensor of
//! the wrong shape.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{Gguf, GgufError, Stored};
use crate::model::{
    Architecture, BlockForm, Decoder, DecoderConfig, DecoderLayer, Linear, Matrix, ModelError,
    Norm, RopeStyle, Rows, Tokenizer,
};

/// A GGUF architecture with Llama's block: pre-norm RMSNorm, RoPE,
/// grouped-query attention and a SiLU-gated MLP, its hyper-parameters under
/// `<name>.*` and its tensors under Llama's names.
#[derive(Debug)]
pub(super) struct Family {
    /// `general.architecture`.
    pub(super) name: &'static str,
    /// How RoPE pairs a head's dimensions in this family's files.
    pub(super) rope_style: RopeStyle,
    /// Whether Q, K and V carry biases (`blk.N.attn_{q,k,v}.bias`).
    pub(super) qkv_bias: bool,
    /// The block's form beyond its tensors, from the metadata (Gemma 3:
    /// GeGLU, scaled embeddings, sliding windows, QK-norm and sandwich
    /// norms); `None` is Llama's.
    pub(super) block: Option<BlockReader>,
}

/// Reads a family's block form from the file's metadata.
pub(super) type BlockReader = fn(&Gguf, &DecoderConfig) -> Result<BlockForm, ModelError>;

/// Llama itself. Mistral's GGUF files without sliding windows use the same
/// tensors and keys under `llama`.
const LLAMA: Family = Family {
    name: "llama",
    rope_style: RopeStyle::Adjacent,
    qkv_bias: false,
    block: None,
};

/// Every family this loader reads.
const FAMILIES: [&Family; 3] = [&LLAMA, &super::qwen2::QWEN2, &super::gemma3::GEMMA3];

/// The context llama.cpp assumes when `llama.context_length` is absent.
const DEFAULT_CONTEXT: usize = 2048;

impl Decoder {
    /// The decoder a GGUF file of the `llama` or `qwen2` architecture holds, with the
    /// tokenizer from its metadata, named `name`. Quantized tensors are
    /// dequantized to f32 as ggml does, and held.
    pub fn from_gguf(g: &Gguf, name: &str) -> Result<Decoder, ModelError> {
        Decoder::read_gguf(Tensors::new(g, None), name)
    }

    /// [`Decoder::from_gguf`], keeping the file: each linear layer's
    /// matrix stays in the file's bytes ([`Matrix::Stored`]) and is
    /// dequantized, the same values, whenever it is read. The model then
    /// holds the file (its quantized bytes) instead of 4 bytes a weight.
    pub fn from_gguf_kept(g: Arc<Gguf>, name: &str) -> Result<Decoder, ModelError> {
        Decoder::read_gguf(Tensors::new(&g, Some(&g)), name)
    }

    fn read_gguf(mut t: Tensors<'_>, name: &str) -> Result<Decoder, ModelError> {
        let g = t.g;
        let (family, config) = config(g)?;
        let (h, q, kv) = (
            config.hidden,
            config.heads * config.head_dim,
            config.kv_width(),
        );
        let embed = t.table("token_embd.weight", h, config.vocab_size)?;
        let layers = (0..config.layers)
            .map(|i| layer(&mut t, family, &config, i, [h, q, kv]))
            .collect::<Result<Vec<_>, _>>()?;
        let final_norm = t.norm("output_norm.weight", h, config.norm_eps)?;
        let lm_head = match g.tensor("output.weight") {
            Some(_) => Some(t.linear("output.weight", h, config.vocab_size)?),
            None => None,
        };
        t.all_used(family.name)?;
        let tokenizer = Tokenizer::from_gguf(g)?;
        if tokenizer.id_bound() > config.vocab_size {
            return Err(ModelError::InvalidConfig(format!(
                "the tokenizer has ids up to {}, beyond the {} embedding rows",
                tokenizer.id_bound(),
                config.vocab_size
            )));
        }
        Ok(Decoder {
            name: name.to_string(),
            config: DecoderConfig {
                tied_head: lm_head.is_none(),
                ..config
            },
            embed,
            positions: None,
            layers,
            final_norm,
            lm_head,
            tokenizer,
        })
    }
}

impl Decoder {
    /// Loads a Llama-architecture GGUF file, or the one `.gguf` file of a
    /// folder; the model is named after the folder (or the file's stem).
    pub fn load_gguf(path: &Path) -> Result<Decoder, ModelError> {
        let file = match path.is_dir() {
            true => gguf_in(path)?.ok_or_else(|| ModelError::MissingFile {
                path: path.join("*.gguf"),
            })?,
            false => path.to_path_buf(),
        };
        let name = match path.is_dir() {
            true => path.file_name(),
            false => path.file_stem(),
        };
        let name = name.map_or_else(|| "gguf".into(), |n| n.to_string_lossy());
        Decoder::from_gguf_kept(Arc::new(Gguf::open(&file)?), &name)
    }
}

/// The GGUF file of a model folder: `None` when it has none, an error when
/// it has several (which one is meant is not for us to guess).
pub fn gguf_in(dir: &Path) -> Result<Option<PathBuf>, ModelError> {
    let io = |error| ModelError::Io {
        path: dir.to_path_buf(),
        error,
    };
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let p = entry.map_err(io)?.path();
        if p.extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
            && p.is_file()
        {
            found.push(p);
        }
    }
    found.sort();
    match found.len() {
        0 | 1 => Ok(found.pop()),
        n => Err(ModelError::InvalidConfig(format!(
            "{} holds {n} .gguf files ({}); pass the file itself",
            dir.display(),
            found
                .iter()
                .filter_map(|p| p.file_name())
                .map(|n| n.to_string_lossy())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// The family the file's `general.architecture` names.
fn family_of(g: &Gguf) -> Result<&'static Family, ModelError> {
    let arch = g.str("general.architecture")?;
    FAMILIES
        .into_iter()
        .find(|f| f.name == arch)
        .ok_or_else(|| {
            let names: Vec<&str> = FAMILIES.iter().map(|f| f.name).collect();
            ModelError::UnsupportedGguf(format!(
                "architecture `{arch}` (supported: {})",
                names.join(", ")
            ))
        })
}

/// The tokenizer's `tokenizer.ggml.{name}`, where the file has one.
fn token_id(g: &Gguf, name: &str) -> Result<Option<u32>, ModelError> {
    let k = format!("tokenizer.ggml.{name}");
    match g.get(&k) {
        None => Ok(None),
        Some(_) => u32::try_from(g.usize(&k)?)
            .map(Some)
            .map_err(|_| ModelError::InvalidConfig(format!("{k} is not a token id"))),
    }
}

/// The file's family and hyper-parameters, checked.
fn config(g: &Gguf) -> Result<(&'static Family, DecoderConfig), ModelError> {
    let family = family_of(g)?;
    let key = |k: &str| format!("{}.{k}", family.name);
    let optional = |k: &str| -> Result<Option<usize>, GgufError> {
        g.get(&key(k)).map(|_| g.usize(&key(k))).transpose()
    };
    if let Some(v) = g
        .get(&key("rope.scaling.type"))
        .filter(|v| v.as_str() != Some("none"))
    {
        return Err(ModelError::UnsupportedGguf(format!("RoPE scaling ({v:?})")));
    }
    let hidden = g.usize(&key("embedding_length"))?;
    let heads = g.usize(&key("attention.head_count"))?;
    let head_dim = match optional("attention.key_length")? {
        Some(d) => d,
        None => hidden / heads.max(1),
    };
    if let Some(rot) = optional("rope.dimension_count")?.filter(|r| *r != head_dim) {
        return Err(ModelError::InvalidConfig(format!(
            "RoPE rotates {rot} of {head_dim} dimensions per head; only full rotation is supported"
        )));
    }
    let vocab_size = g
        .tensor("token_embd.weight")
        .and_then(|t| t.dims.get(1).copied())
        .ok_or_else(|| GgufError::MissingTensor("token_embd.weight".into()))?;
    let config = DecoderConfig {
        architecture: Architecture::Llama,
        vocab_size: usize::try_from(vocab_size)
            .map_err(|_| GgufError::TooLarge("token_embd.weight".into()))?,
        hidden,
        layers: g.usize(&key("block_count"))?,
        heads,
        kv_heads: optional("attention.head_count_kv")?.unwrap_or(heads),
        head_dim,
        intermediate: g.usize(&key("feed_forward_length"))?,
        rope_theta: match g.get(&key("rope.freq_base")) {
            Some(_) => g.f32(&key("rope.freq_base"))?,
            None => 10_000.0,
        },
        rope_style: family.rope_style,
        norm_eps: g.f32(&key("attention.layer_norm_rms_epsilon"))?,
        max_positions: optional("context_length")?.unwrap_or(DEFAULT_CONTEXT),
        tied_head: true,
        bos: token_id(g, "bos_token_id")?,
        eos: token_id(g, "eos_token_id")?,
        block: BlockForm::default(),
    };
    let config = match family.block {
        Some(form) => DecoderConfig {
            block: form(g, &config)?,
            ..config
        },
        None => config,
    };
    config.check()?;
    Ok((family, config))
}

/// Block `i`; `[h, q, kv]` are the hidden, query and key/value widths.
fn layer(
    t: &mut Tensors<'_>,
    family: &Family,
    c: &DecoderConfig,
    i: usize,
    [h, q, kv]: [usize; 3],
) -> Result<DecoderLayer, ModelError> {
    let name = |part: &str| format!("blk.{i}.{part}.weight");
    let mut projection = |part: &str, outputs: usize| -> Result<Linear, ModelError> {
        let mut l = t.linear(&name(part), h, outputs)?;
        if family.qkv_bias {
            l.b = t.take(&format!("blk.{i}.{part}.bias"), &[outputs])?;
        }
        Ok(l)
    };
    Ok(DecoderLayer {
        query: projection("attn_q", q)?,
        key: projection("attn_k", kv)?,
        value: projection("attn_v", kv)?,
        attn_norm: t.norm(&name("attn_norm"), h, c.norm_eps)?,
        attn_out: t.linear(&name("attn_output"), q, h)?,
        mlp_norm: t.norm(&name("ffn_norm"), h, c.norm_eps)?,
        gate: Some(t.linear(&name("ffn_gate"), h, c.intermediate)?),
        up: t.linear(&name("ffn_up"), h, c.intermediate)?,
        down: t.linear(&name("ffn_down"), c.intermediate, h)?,
        qk_norm: match c.block.qk_norm {
            true => Some((
                t.norm(&name("attn_q_norm"), c.head_dim, c.norm_eps)?,
                t.norm(&name("attn_k_norm"), c.head_dim, c.norm_eps)?,
            )),
            false => None,
        },
        post_norms: match c.block.post_norms {
            true => Some((
                t.norm(&name("post_attention_norm"), h, c.norm_eps)?,
                t.norm(&name("post_ffw_norm"), h, c.norm_eps)?,
            )),
            false => None,
        },
    })
}

/// The file's tensors, each taken at most once, with the names taken
/// recorded so that a tensor left over is reported; with `kept`, the
/// file the matrices stay in.
struct Tensors<'a> {
    g: &'a Gguf,
    kept: Option<&'a Arc<Gguf>>,
    used: BTreeSet<String>,
}

impl<'a> Tensors<'a> {
    fn new(g: &'a Gguf, kept: Option<&'a Arc<Gguf>>) -> Tensors<'a> {
        Tensors {
            g,
            kept,
            used: BTreeSet::new(),
        }
    }

    /// A tensor's values in ggml order, its `ne` checked against `dims`.
    fn take(&mut self, name: &str, dims: &[usize]) -> Result<Vec<f32>, ModelError> {
        self.check(name, dims)?;
        Ok(self.g.dequantize(name)?)
    }

    /// Whether the tensor is there with `ne = dims`; records it as used.
    fn check(&mut self, name: &str, dims: &[usize]) -> Result<(), ModelError> {
        let info = self
            .g
            .tensor(name)
            .ok_or_else(|| GgufError::MissingTensor(name.to_string()))?;
        let got: Vec<usize> = info.dims.iter().map(|d| *d as usize).collect();
        if got != dims {
            return Err(ModelError::WrongShape {
                tensor: name.to_string(),
                want: dims.to_vec(),
                got,
            });
        }
        self.used.insert(name.to_string());
        Ok(())
    }

    /// A tensor with `ne = [inputs, outputs]` left in the file, where the
    /// file is kept and the tensor can stay ([`Stored::new`]); `None`
    /// where it is to be dequantized and held ([`Tensors::take`], which
    /// also reports what is wrong with it).
    fn stored(
        &mut self,
        name: &str,
        inputs: usize,
        outputs: usize,
    ) -> Result<Option<Stored>, ModelError> {
        match self
            .kept
            .and_then(|g| Stored::new(g, name, inputs, outputs))
        {
            Some(stored) => self.check(name, &[inputs, outputs]).map(|()| Some(stored)),
            None => Ok(None),
        }
    }

    /// A table of `rows` rows `width` wide (`ne = [width, rows]`), left in
    /// the file where it can stay.
    fn table(&mut self, name: &str, width: usize, rows: usize) -> Result<Rows, ModelError> {
        Ok(match self.stored(name, width, rows)? {
            Some(stored) => Rows::Stored(stored),
            None => Rows::Held(self.take(name, &[width, rows])?),
        })
    }

    /// An RMSNorm weight: a gain, no bias.
    fn norm(&mut self, name: &str, width: usize, eps: f32) -> Result<Norm, ModelError> {
        Ok(Norm {
            gamma: self.take(name, &[width])?,
            beta: vec![0.0; width],
            eps,
        })
    }

    /// A matrix with `ne = [inputs, outputs]` (row-major `[outputs][inputs]`)
    /// as `[inputs × outputs]`, left in the file where it can stay.
    fn linear(&mut self, name: &str, inputs: usize, outputs: usize) -> Result<Linear, ModelError> {
        let w = match self.stored(name, inputs, outputs)? {
            Some(stored) => Matrix::Stored(stored),
            None => Matrix::Held(crate::model::checkpoint::transpose(
                &self.take(name, &[inputs, outputs])?,
                outputs,
                inputs,
            )),
        };
        Ok(Linear {
            w,
            b: vec![0.0; outputs],
            inputs,
            outputs,
        })
    }

    /// Refuses a file with tensors nothing read: they would change the
    /// model's function (biases, RoPE frequency factors) if they mattered.
    fn all_used(&self, family: &str) -> Result<(), ModelError> {
        match self
            .g
            .tensors()
            .iter()
            .find(|t| !self.used.contains(&t.name))
        {
            Some(t) => Err(ModelError::UnsupportedGguf(format!(
                "tensor `{}` is not part of the {} architecture this loader reads",
                t.name, family
            ))),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::{TensorType, Value, ValueType, Writer};
    use super::*;

    /// GPT-2's byte-to-character map, the vocabulary of a byte-level BPE.
    fn byte_chars() -> Vec<Value> {
        super::super::tokenizer::tests::byte_chars()
            .into_iter()
            .map(Value::String)
            .collect()
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// A tiny generated Llama (vocabulary: the 256 bytes and two control
    /// tokens) written as llama.cpp lays it out: matrices `[out][in]`.
    pub(in super::super) fn tiny() -> (Decoder, Writer) {
        let config = DecoderConfig {
            vocab_size: 258,
            rope_style: RopeStyle::Adjacent,
            bos: Some(256),
            eos: Some(257),
            ..DecoderConfig::tiny_llama()
        };
        let d = Decoder::generated(config, 11);
        let w = written(&d, "llama");
        (d, w)
    }

    /// `d` as a GGUF file of architecture `arch`: its hyper-parameters
    /// under `arch.*`, a byte-level vocabulary of 256 bytes and two control
    /// tokens, and every tensor under llama.cpp's names.
    pub(in super::super) fn written(d: &Decoder, arch: &str) -> Writer {
        let c = &d.config;
        let mut w = Writer::new(3);
        let mut tokens = byte_chars();
        tokens.extend(["<|im_start|>", "<|im_end|>"].map(|s| Value::String(s.into())));
        let mut types = vec![Value::I32(1); 256];
        types.extend([Value::I32(3), Value::I32(3)]);
        let u = |v: usize| Value::U32(v as u32);
        let key = |k: &str| format!("{arch}.{k}");
        w.meta("general.architecture", Value::String(arch.into()))
            .meta(&key("block_count"), u(c.layers))
            .meta(&key("embedding_length"), u(c.hidden))
            .meta(&key("feed_forward_length"), u(c.intermediate))
            .meta(&key("attention.head_count"), u(c.heads))
            .meta(&key("attention.head_count_kv"), u(c.kv_heads))
            .meta(&key("attention.key_length"), u(c.head_dim))
            .meta(&key("rope.freq_base"), Value::F32(c.rope_theta))
            .meta(&key("context_length"), u(c.max_positions))
            .meta(
                &key("attention.layer_norm_rms_epsilon"),
                Value::F32(c.norm_eps),
            )
            .meta("tokenizer.ggml.model", Value::String("gpt2".into()))
            .meta("tokenizer.ggml.pre", Value::String("smollm".into()))
            .meta(
                "tokenizer.ggml.tokens",
                Value::Array(ValueType::String, tokens),
            )
            .meta(
                "tokenizer.ggml.token_type",
                Value::Array(ValueType::I32, types),
            )
            .meta(
                "tokenizer.ggml.merges",
                Value::Array(ValueType::String, vec![]),
            )
            .meta("tokenizer.ggml.bos_token_id", u(256))
            .meta("tokenizer.ggml.eos_token_id", u(257));
        if let Some(s) = c.block.sliding {
            w.meta(&key("attention.sliding_window"), u(s.window));
        }
        let dims = |a: usize, b: usize| [a as u64, b as u64];
        w.tensor(
            "token_embd.weight",
            &dims(c.hidden, c.vocab_size),
            TensorType::F32,
            f32_bytes(&d.embed.values()),
        );
        let matrix = |w: &mut Writer, name: String, l: &Linear| {
            let stored = crate::model::checkpoint::transpose(&l.w.values(), l.inputs, l.outputs);
            let ne = dims(l.inputs, l.outputs);
            w.tensor(&name, &ne, TensorType::F32, f32_bytes(&stored));
        };
        let norm = |w: &mut Writer, name: String, n: &Norm| {
            w.tensor(
                &name,
                &[n.gamma.len() as u64],
                TensorType::F32,
                f32_bytes(&n.gamma),
            );
        };
        for (i, l) in d.layers.iter().enumerate() {
            let p = |s: &str| format!("blk.{i}.{s}.weight");
            norm(&mut w, p("attn_norm"), &l.attn_norm);
            matrix(&mut w, p("attn_q"), &l.query);
            matrix(&mut w, p("attn_k"), &l.key);
            matrix(&mut w, p("attn_v"), &l.value);
            matrix(&mut w, p("attn_output"), &l.attn_out);
            norm(&mut w, p("ffn_norm"), &l.mlp_norm);
            matrix(&mut w, p("ffn_gate"), l.gate.as_ref().unwrap());
            matrix(&mut w, p("ffn_up"), &l.up);
            matrix(&mut w, p("ffn_down"), &l.down);
            if let Some((q, k)) = &l.qk_norm {
                norm(&mut w, p("attn_q_norm"), q);
                norm(&mut w, p("attn_k_norm"), k);
            }
            if let Some((a, m)) = &l.post_norms {
                norm(&mut w, p("post_attention_norm"), a);
                norm(&mut w, p("post_ffw_norm"), m);
            }
        }
        norm(&mut w, "output_norm.weight".into(), &d.final_norm);
        w
    }

    pub(in super::super) fn load(w: &Writer) -> Result<Decoder, ModelError> {
        Decoder::from_gguf(&Gguf::from_bytes(w.to_bytes()).unwrap(), "tiny")
    }

    #[test]
    fn a_written_llama_reads_back_bit_for_bit() {
        let (want, w) = tiny();
        let got = load(&w).unwrap();
        assert_eq!(got.config, want.config);
        assert_eq!(got.digest(), want.digest());
        assert_eq!(got.layers, want.layers);
        assert_eq!(got.embed, want.embed);
        assert_eq!(got.final_norm, want.final_norm);
        assert!(got.lm_head.is_none() && got.config.tied_head);
        // The tokenizer came from the metadata: control tokens are whole.
        let ids = got.tokenizer.encode("<|im_start|>hi", 10).unwrap();
        assert_eq!(ids[0], 256);
    }

    #[test]
    fn gguf_rope_rotates_adjacent_pairs() {
        let (_, w) = tiny();
        assert_eq!(load(&w).unwrap().config.rope_style, RopeStyle::Adjacent);
    }

    #[test]
    fn an_untied_head_is_read_and_transposed() {
        let (d, mut w) = tiny();
        let c = &d.config;
        let head: Vec<f32> = (0..c.hidden * c.vocab_size)
            .map(|i| i as f32 * 1e-3)
            .collect();
        // Stored [vocab][hidden]: element (t, i) at t·hidden + i.
        w.tensor(
            "output.weight",
            &[c.hidden as u64, c.vocab_size as u64],
            TensorType::F32,
            f32_bytes(&head),
        );
        let got = load(&w).unwrap();
        let h = got.lm_head.as_ref().unwrap();
        assert!(!got.config.tied_head);
        let (t, i) = (7, 3);
        assert_eq!(h.w.values()[i * c.vocab_size + t], head[t * c.hidden + i]);
        // Kept in the file, the head reads the same.
        let kept = kept(&w);
        assert!(matches!(
            kept.lm_head.as_ref().unwrap().w,
            Matrix::Stored(_)
        ));
        assert_eq!(kept.lm_head, got.lm_head);
    }

    /// [`load`] with the file kept ([`Decoder::from_gguf_kept`]).
    fn kept(w: &Writer) -> Decoder {
        let g = Arc::new(Gguf::from_bytes(w.to_bytes()).unwrap());
        Decoder::from_gguf_kept(g, "tiny").unwrap()
    }

    #[test]
    fn a_kept_file_gives_the_held_model_and_its_plan() {
        let (_, w) = tiny();
        let (held, kept) = (load(&w).unwrap(), kept(&w));
        let matrices = |d: &Decoder| -> Vec<bool> {
            let l = &d.layers[0];
            [&l.query, &l.key, &l.value, &l.attn_out, &l.up, &l.down]
                .iter()
                .map(|l| matches!(l.w, Matrix::Stored(_)))
                .collect()
        };
        assert!(matrices(&kept).iter().all(|s| *s));
        assert!(matrices(&held).iter().all(|s| !*s));
        assert_eq!(kept.layers, held.layers);
        assert_eq!(kept.digest(), held.digest());
        // The embeddings stay in the file too, and the tied head is them
        // read the other way.
        assert!(matches!(kept.embed, Rows::Stored(_)));
        assert_eq!(kept.embed, held.embed);
        assert!(matches!(kept.head().w, Matrix::Stored(_)));
        assert_eq!(kept.head(), held.head());
        let last = kept.config.vocab_size as u32 - 1;
        for token in [0, 5, last] {
            assert_eq!(
                kept.embed_token(token, 3).unwrap(),
                held.embed_token(token, 3).unwrap()
            );
        }
        assert!(kept.embed_token(last + 1, 0).is_err());
        let shape = crate::plan::Shape {
            batch: 1,
            seq: 8,
            decode_steps: 2,
        };
        let plan = |d: &Decoder| crate::plan::build(d, shape).unwrap().hash;
        assert_eq!(plan(&kept), plan(&held));
    }

    #[test]
    fn bad_files_are_typed_errors() {
        let (_, w) = tiny();
        let bytes = w.to_bytes();
        // A tensor the architecture has no place for.
        let mut extra = w.clone();
        extra.tensor("blk.0.attn_q.bias", &[64], TensorType::F32, vec![0; 256]);
        assert!(matches!(load(&extra), Err(ModelError::UnsupportedGguf(_))));
        // A misshaped tensor.
        let mut bad = Writer::new(3);
        let g = Gguf::from_bytes(bytes).unwrap();
        for (k, v) in g.metadata() {
            bad.meta(k, v.clone());
        }
        for t in g.tensors() {
            let dims = match t.name.as_str() {
                "blk.1.attn_k.weight" => vec![t.dims[1], t.dims[0]],
                _ => t.dims.clone(),
            };
            bad.tensor(&t.name, &dims, t.ty, g.bytes(t).to_vec());
        }
        assert!(matches!(load(&bad), Err(ModelError::WrongShape { .. })));
        // A missing tensor.
        let mut missing = Writer::new(3);
        for (k, v) in g.metadata() {
            missing.meta(k, v.clone());
        }
        for t in g
            .tensors()
            .iter()
            .filter(|t| t.name != "blk.1.ffn_up.weight")
        {
            missing.tensor(&t.name, &t.dims, t.ty, g.bytes(t).to_vec());
        }
        let e = load(&missing).unwrap_err().to_string();
        assert!(e.contains("blk.1.ffn_up.weight"), "{e}");
        // Another architecture.
        let mut arch = Writer::new(3);
        for (k, v) in g.metadata() {
            let v = match k.as_str() {
                "general.architecture" => Value::String("gemma".into()),
                _ => v.clone(),
            };
            arch.meta(k, v);
        }
        let e = load(&arch).unwrap_err().to_string();
        assert!(e.contains("gemma"), "{e}");
    }
}
