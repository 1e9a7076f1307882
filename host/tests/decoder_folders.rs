//! Hugging Face decoder folders, Llama and GPT-2, written here tensor by
//! tensor in Hugging Face's own layouts (`nn.Linear` `[out, in]`, GPT-2's
//! `Conv1D` `[in, out]` with `c_attn` packing q|k|v) and dtypes (F32, F16,
//! BF16), then loaded through the architecture path. Checked: the loaded
//! weights are the written ones after the layout conversion; the logits
//! follow an f64 forward pass written here from the equations, with RoPE
//! rotating half-head pairs (and not adjacent ones); and secure generation
//! over the loaded models equals the fixed-point reference bit for bit on
//! every pass. Malformed folders give typed errors.

// Tests: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use safetensors::Dtype;
use safetensors::tensor::TensorView;
use serde_json::{Value, json};
use suffuse_host::generate::{self, Sampling};
use suffuse_host::model::{Decoder, Model, ModelError, RopeStyle, Transformer};
use suffuse_host::plan::{self, Shape};
use suffuse_host::session::{self, Options};

const VOCAB: usize = 300;
const HIDDEN: usize = 32;
const LAYERS: usize = 2;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 8;
const LLAMA_FF: usize = 64;
const GPT2_FF: usize = 128;
const POSITIONS: usize = 64;

/// A fresh folder under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "suffuse-decoder-folder-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A tensor as written: Hugging Face name, dtype, shape, values.
struct Written {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    values: Vec<f32>,
}

/// A folder's contents, kept so that tests can compare against them.
struct Folder {
    config: Value,
    tokenizer: Value,
    tensors: Vec<Written>,
}

impl Folder {
    fn get(&self, name: &str) -> &[f32] {
        &self.tensors.iter().find(|t| t.name == name).unwrap().values
    }

    fn write(&self, dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        let put = |file: &str, v: &Value| {
            std::fs::write(dir.join(file), serde_json::to_vec_pretty(v).unwrap()).unwrap()
        };
        put("config.json", &self.config);
        put("tokenizer.json", &self.tokenizer);
        let all: Vec<&Written> = self.tensors.iter().collect();
        std::fs::write(dir.join("model.safetensors"), serialize(&all)).unwrap();
    }

    /// As Hugging Face saves a large checkpoint: the tensors dealt round
    /// robin into `n` shard files, and `model.safetensors.index.json`
    /// mapping each name to its shard.
    fn write_sharded(&self, dir: &Path, n: usize) {
        self.write(dir);
        std::fs::remove_file(dir.join("model.safetensors")).unwrap();
        let name = |i: usize| format!("model-{:05}-of-{n:05}.safetensors", i + 1);
        let mut map = serde_json::Map::new();
        for i in 0..n {
            let part: Vec<&Written> = self.tensors.iter().skip(i).step_by(n).collect();
            for t in &part {
                map.insert(t.name.clone(), Value::String(name(i)));
            }
            std::fs::write(dir.join(name(i)), serialize(&part)).unwrap();
        }
        let index = serde_json::json!({"metadata": {}, "weight_map": map});
        std::fs::write(
            dir.join("model.safetensors.index.json"),
            serde_json::to_vec_pretty(&index).unwrap(),
        )
        .unwrap();
    }
}

/// One safetensors file holding `tensors`.
fn serialize(tensors: &[&Written]) -> Vec<u8> {
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|t| encode(&t.values, t.dtype)).collect();
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .zip(&bytes)
        .map(|(t, b)| {
            let view = TensorView::new(t.dtype, t.shape.clone(), b).unwrap();
            (t.name.clone(), view)
        })
        .collect();
    safetensors::serialize(views, None).unwrap()
}

/// Little-endian bytes of `values` in `dtype`. The values are k/2^s with
/// |k| ≤ 64 (see [`Values`]), exact in every dtype used, so the half
/// encodings here need no rounding.
fn encode(values: &[f32], dtype: Dtype) -> Vec<u8> {
    match dtype {
        Dtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Dtype::BF16 => values
            .iter()
            .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
            .collect(),
        Dtype::F16 => values
            .iter()
            .flat_map(|v| f16_bits(*v).to_le_bytes())
            .collect(),
        Dtype::I32 => values
            .iter()
            .flat_map(|v| (*v as i32).to_le_bytes())
            .collect(),
        other => panic!("no encoder for {other:?}"),
    }
}

/// binary16 bits of a normal value with at most 10 mantissa bits (or 0).
fn f16_bits(v: f32) -> u16 {
    if v == 0.0 {
        return 0;
    }
    let b = v.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
    assert!(
        (1..31).contains(&exp) && b & 0x1fff == 0,
        "{v} is not exact in f16"
    );
    sign | ((exp as u16) << 10) | ((b >> 13) & 0x3ff) as u16
}

/// Deterministic weights k/2^shift, k uniform in [−64, 64] (a 64-bit LCG).
struct Values(u64);

impl Values {
    fn take(&mut self, n: usize, shift: i32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 = self
                    .0
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let k = ((self.0 >> 33) % 129) as i32 - 64;
                k as f32 * 2f32.powi(-shift)
            })
            .collect()
    }

    /// Norm gains 1 + k/256 (exact in F32 and F16, not in BF16).
    fn gains(&mut self, n: usize) -> Vec<f32> {
        self.take(n, 8).into_iter().map(|v| 1.0 + v).collect()
    }

    fn tensor(&mut self, name: String, dtype: Dtype, shape: &[usize], shift: i32) -> Written {
        let values = self.take(shape.iter().product(), shift);
        Written {
            name,
            dtype,
            shape: shape.to_vec(),
            values,
        }
    }
}

/// GPT-2's byte-to-character map (`bytes_to_unicode`).
fn byte_chars() -> Vec<char> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    let mut extra = 0;
    (0u32..256)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap()
            } else {
                extra += 1;
                char::from_u32(255 + extra).unwrap()
            }
        })
        .collect()
}

/// A minimal byte-level BPE `tokenizer.json`: the 256 byte tokens (ids
/// 0–255), the special tokens at 256…, one merge (`h e`), and for Llama a
/// post-processor that prepends `<s>`.
fn tokenizer(specials: &[&str], bos: Option<&str>) -> Value {
    let mut vocab = serde_json::Map::new();
    for (id, c) in byte_chars().into_iter().enumerate() {
        vocab.insert(c.to_string(), json!(id));
    }
    let added: Vec<Value> = specials
        .iter()
        .enumerate()
        .map(|(i, s)| {
            vocab.insert(s.to_string(), json!(256 + i));
            json!({"id": 256 + i, "content": s, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    vocab.insert("he".into(), json!(256 + specials.len()));
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false,
                            "trim_offsets": true, "use_regex": true});
    let post = match bos {
        None => byte_level.clone(),
        Some(b) => json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": b, "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": b, "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {b: {"id": b, "ids": [256], "tokens": [b]}}
        }),
    };
    json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added, "normalizer": null,
        "pre_tokenizer": byte_level, "post_processor": post, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "vocab": vocab,
                  "merges": ["h e"]}
    })
}

/// A tiny `LlamaForCausalLM` (grouped-query, untied head) with its tensors
/// under `model.`, in all three float dtypes. Q and K are large so that
/// attention is sharp and the RoPE pairing shows in the logits.
fn llama() -> Folder {
    let mut r = Values(1);
    let (h, q, kv, ff) = (HIDDEN, HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, LLAMA_FF);
    let mut t = vec![r.tensor(
        "model.embed_tokens.weight".into(),
        Dtype::F32,
        &[VOCAB, h],
        6,
    )];
    for i in 0..LAYERS {
        let p = format!("model.layers.{i}");
        for norm in ["input_layernorm", "post_attention_layernorm"] {
            t.push(Written {
                name: format!("{p}.{norm}.weight"),
                dtype: Dtype::F32,
                shape: vec![h],
                values: r.gains(h),
            });
        }
        for (name, dtype, shape, shift) in [
            ("self_attn.q_proj", Dtype::BF16, [q, h], 5),
            ("self_attn.k_proj", Dtype::BF16, [kv, h], 5),
            ("self_attn.v_proj", Dtype::F16, [kv, h], 7),
            ("self_attn.o_proj", Dtype::F16, [h, q], 7),
            ("mlp.gate_proj", Dtype::F16, [ff, h], 6),
            ("mlp.up_proj", Dtype::BF16, [ff, h], 6),
            ("mlp.down_proj", Dtype::F32, [h, ff], 7),
        ] {
            t.push(r.tensor(format!("{p}.{name}.weight"), dtype, &shape, shift));
        }
    }
    t.push(Written {
        name: "model.norm.weight".into(),
        dtype: Dtype::F16,
        shape: vec![h],
        values: r.gains(h),
    });
    t.push(r.tensor("lm_head.weight".into(), Dtype::F16, &[VOCAB, h], 6));
    Folder {
        config: json!({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": VOCAB, "hidden_size": h, "intermediate_size": ff,
            "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS, "max_position_embeddings": POSITIONS,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": null,
            "hidden_act": "silu", "tie_word_embeddings": false, "attention_bias": false,
            "bos_token_id": 256, "eos_token_id": 257, "torch_dtype": "float32"
        }),
        tokenizer: tokenizer(&["<s>", "</s>"], Some("<s>")),
        tensors: t,
    }
}

/// A tiny `GPT2LMHeadModel` (tied head) with its tensors under
/// `transformer.`.
fn gpt2() -> Folder {
    let mut r = Values(2);
    let (h, ff) = (HIDDEN, GPT2_FF);
    let p = "transformer";
    let mut t = vec![
        r.tensor(format!("{p}.wte.weight"), Dtype::F32, &[VOCAB, h], 6),
        r.tensor(format!("{p}.wpe.weight"), Dtype::F16, &[POSITIONS, h], 8),
    ];
    let norm = |r: &mut Values, t: &mut Vec<Written>, name: String| {
        t.push(Written {
            name: format!("{name}.weight"),
            dtype: Dtype::F32,
            shape: vec![h],
            values: r.gains(h),
        });
        t.push(r.tensor(format!("{name}.bias"), Dtype::BF16, &[h], 9));
    };
    for i in 0..LAYERS {
        let l = format!("{p}.h.{i}");
        norm(&mut r, &mut t, format!("{l}.ln_1"));
        norm(&mut r, &mut t, format!("{l}.ln_2"));
        for (name, dtype, shape, shift) in [
            ("attn.c_attn", Dtype::BF16, [h, 3 * h], 5),
            ("attn.c_proj", Dtype::F16, [h, h], 7),
            ("mlp.c_fc", Dtype::F32, [h, ff], 6),
            ("mlp.c_proj", Dtype::F16, [ff, h], 7),
        ] {
            t.push(r.tensor(format!("{l}.{name}.weight"), dtype, &shape, shift));
            t.push(r.tensor(format!("{l}.{name}.bias"), Dtype::F32, &shape[1..], 8));
        }
    }
    norm(&mut r, &mut t, format!("{p}.ln_f"));
    Folder {
        config: json!({
            "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
            "vocab_size": VOCAB, "n_embd": h, "n_layer": LAYERS, "n_head": HEADS,
            "n_inner": ff, "n_positions": POSITIONS, "n_ctx": POSITIONS,
            "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new",
            "bos_token_id": 256, "eos_token_id": 256, "tie_word_embeddings": true
        }),
        tokenizer: tokenizer(&["<|endoftext|>"], None),
        tensors: t,
    }
}

/// `folder` written to a fresh directory and loaded as a decoder.
fn load(folder: &Folder, test: &str) -> (TempDir, Decoder) {
    let tmp = TempDir::new(test);
    let dir = tmp.0.join(test);
    folder.write(&dir);
    let model = Decoder::load(&dir).unwrap();
    (tmp, model)
}

/// `[rows × cols]` row-major transposed.
fn transposed(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..cols)
        .flat_map(|c| (0..rows).map(move |r| m[r * cols + c]))
        .collect()
}

#[test]
fn a_llama_folder_loads_transposed_with_rotate_half() {
    let f = llama();
    let (_tmp, m) = load(&f, "llama-layout");
    let c = &m.config;
    assert_eq!(m.name, "llama-layout");
    assert_eq!(
        (c.hidden, c.heads, c.kv_heads, c.head_dim, c.intermediate),
        (HIDDEN, HEADS, KV_HEADS, HEAD_DIM, LLAMA_FF)
    );
    assert_eq!(c.rope_style, RopeStyle::RotateHalf);
    assert_eq!((c.bos, c.eos, c.tied_head), (Some(256), Some(257), false));
    assert_eq!(*m.embed.values(), *f.get("model.embed_tokens.weight"));
    assert!(m.positions.is_none());
    for (i, l) in m.layers.iter().enumerate() {
        let p = format!("model.layers.{i}");
        assert_eq!(
            l.attn_norm.gamma,
            f.get(&format!("{p}.input_layernorm.weight"))
        );
        assert_eq!(
            l.mlp_norm.gamma,
            f.get(&format!("{p}.post_attention_layernorm.weight"))
        );
        assert!(
            l.attn_norm
                .beta
                .iter()
                .chain(&l.mlp_norm.beta)
                .all(|b| *b == 0.0)
        );
        let gate = l.gate.as_ref().unwrap();
        for (lin, name) in [
            (&l.query, "self_attn.q_proj"),
            (&l.key, "self_attn.k_proj"),
            (&l.value, "self_attn.v_proj"),
            (&l.attn_out, "self_attn.o_proj"),
            (gate, "mlp.gate_proj"),
            (&l.up, "mlp.up_proj"),
            (&l.down, "mlp.down_proj"),
        ] {
            let w = f.get(&format!("{p}.{name}.weight"));
            assert_eq!(
                *lin.w.values(),
                transposed(w, lin.outputs, lin.inputs),
                "{p}.{name}"
            );
            assert!(lin.b.iter().all(|b| *b == 0.0));
        }
    }
    assert_eq!(m.final_norm.gamma, f.get("model.norm.weight"));
    let head = m.lm_head.as_ref().unwrap();
    assert_eq!(
        *head.w.values(),
        transposed(f.get("lm_head.weight"), VOCAB, HIDDEN)
    );
    let ids = m.tokenizer.encode("hello", 64).unwrap();
    assert_eq!(ids, [256, 258, 108, 108, 111], "<s> he l l o");

    // Tied: no head of its own, a stored copy ignored.
    let mut tied = llama();
    tied.config["tie_word_embeddings"] = true.into();
    let (_tmp, m) = load(&tied, "llama-tied");
    assert!(m.lm_head.is_none() && m.config.tied_head);
}

#[test]
fn a_gpt2_folder_loads_with_c_attn_split_and_no_transpose() {
    let f = gpt2();
    let (_tmp, m) = load(&f, "gpt2-layout");
    let c = &m.config;
    assert_eq!(
        (c.hidden, c.heads, c.kv_heads, c.head_dim),
        (HIDDEN, HEADS, HEADS, HIDDEN / HEADS)
    );
    assert_eq!(
        (c.intermediate, c.max_positions, c.tied_head),
        (GPT2_FF, POSITIONS, true)
    );
    assert_eq!(*m.embed.values(), *f.get("transformer.wte.weight"));
    assert_eq!(
        m.positions.as_deref().unwrap(),
        f.get("transformer.wpe.weight")
    );
    assert!(m.lm_head.is_none());
    let h = HIDDEN;
    for (i, l) in m.layers.iter().enumerate() {
        let p = format!("transformer.h.{i}");
        let packed = f.get(&format!("{p}.attn.c_attn.weight"));
        let packed_b = f.get(&format!("{p}.attn.c_attn.bias"));
        for (part, lin) in [&l.query, &l.key, &l.value].into_iter().enumerate() {
            for row in 0..h {
                assert_eq!(
                    lin.w.values()[row * h..][..h],
                    packed[row * 3 * h + part * h..][..h]
                );
            }
            assert_eq!(lin.b, packed_b[part * h..][..h]);
        }
        for (lin, name) in [
            (&l.attn_out, "attn.c_proj"),
            (&l.up, "mlp.c_fc"),
            (&l.down, "mlp.c_proj"),
        ] {
            assert_eq!(
                *lin.w.values(),
                *f.get(&format!("{p}.{name}.weight")),
                "{p}.{name}"
            );
            assert_eq!(lin.b, f.get(&format!("{p}.{name}.bias")));
        }
        assert_eq!(l.attn_norm.beta, f.get(&format!("{p}.ln_1.bias")));
        assert_eq!(l.mlp_norm.gamma, f.get(&format!("{p}.ln_2.weight")));
        assert!(l.gate.is_none());
    }
    assert_eq!(m.final_norm.beta, f.get("transformer.ln_f.bias"));
    assert_eq!(
        m.tokenizer.encode("hello", 64).unwrap(),
        [257, 108, 108, 111]
    );
    // The bare names of a `GPT2Model` load the same.
    let mut bare = gpt2();
    for t in &mut bare.tensors {
        t.name = t.name.trim_start_matches("transformer.").to_string();
    }
    let (_tmp, b) = load(&bare, "gpt2-bare");
    assert_eq!(b.digest(), m.digest());
}

#[test]
fn architecture_dispatch_follows_model_type() {
    let tmp = TempDir::new("dispatch");
    let (l, g) = (tmp.0.join("l"), tmp.0.join("g"));
    llama().write(&l);
    gpt2().write(&g);
    assert!(matches!(Transformer::load(&l), Ok(Transformer::Decoder(_))));
    assert!(matches!(Transformer::load(&g), Ok(Transformer::Decoder(_))));
    let e = Model::load(&g).unwrap_err();
    assert!(matches!(e, ModelError::UnsupportedArchitecture(_)) && e.to_string().contains("gpt2"));
    let bert = tmp.0.join("bert");
    Model::demo().write_dir(&bert).unwrap();
    assert!(matches!(
        Transformer::load(&bert),
        Ok(Transformer::Encoder(_))
    ));
    assert!(matches!(
        Decoder::load(&bert),
        Err(ModelError::UnsupportedArchitecture(_))
    ));
}

// --- an f64 forward pass from the equations, on the tensors as written ---

/// `x·Wᵀ` for an `nn.Linear` weight `[out, in]`, or `x·W` for a `Conv1D`
/// weight `[in, out]`; `x` is one row.
fn matvec(x: &[f64], w: &[f32], outputs: usize, conv1d: bool) -> Vec<f64> {
    let inputs = x.len();
    (0..outputs)
        .map(|o| {
            (0..inputs)
                .map(|i| {
                    x[i] * f64::from(if conv1d {
                        w[i * outputs + o]
                    } else {
                        w[o * inputs + i]
                    })
                })
                .sum()
        })
        .collect()
}

fn rms_norm(x: &[f64], g: &[f32], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps).sqrt();
    x.iter()
        .zip(g)
        .map(|(v, g)| v * inv * f64::from(*g))
        .collect()
}

fn layer_norm(x: &[f64], g: &[f32], b: &[f32], eps: f64) -> Vec<f64> {
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    let inv = 1.0 / (var + eps).sqrt();
    x.iter()
        .zip(g.iter().zip(b))
        .map(|(v, (g, b))| (v - mean) * inv * f64::from(*g) + f64::from(*b))
        .collect()
}

/// RoPE at position `pos` on one head, by hand: pairs `(i, i + d/2)`
/// (`half`) or `(2i, 2i + 1)`, angle `pos · θ^(−2i/d)`.
fn rotate(head: &mut [f64], pos: usize, theta: f64, half: bool) {
    let d = head.len();
    for i in 0..d / 2 {
        let (a, b) = if half {
            (i, i + d / 2)
        } else {
            (2 * i, 2 * i + 1)
        };
        let angle = pos as f64 * theta.powf(-2.0 * i as f64 / d as f64);
        let (x, y) = (head[a], head[b]);
        head[a] = x * angle.cos() - y * angle.sin();
        head[b] = x * angle.sin() + y * angle.cos();
    }
}

/// Causal attention of every row: `q` `[L × heads·d]`, `k`, `v`
/// `[L × kv_heads·d]`; query head `h` reads key/value head `h / group`.
fn attend(q: &[Vec<f64>], k: &[Vec<f64>], v: &[Vec<f64>], heads: usize, d: usize) -> Vec<Vec<f64>> {
    let group = heads / (k[0].len() / d);
    (0..q.len())
        .map(|i| {
            let mut out = vec![0.0; heads * d];
            for h in 0..heads {
                let (qh, kv) = (&q[i][h * d..][..d], (h / group) * d);
                let s: Vec<f64> = (0..=i)
                    .map(|j| (0..d).map(|t| qh[t] * k[j][kv + t]).sum::<f64>() / (d as f64).sqrt())
                    .collect();
                let max = s.iter().copied().fold(f64::MIN, f64::max);
                let e: Vec<f64> = s.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = e.iter().sum();
                for (j, e) in e.iter().enumerate() {
                    for t in 0..d {
                        out[h * d + t] += e / total * v[j][kv + t];
                    }
                }
            }
            out
        })
        .collect()
}

fn add(x: &mut [Vec<f64>], y: &[Vec<f64>]) {
    for (a, b) in x.iter_mut().zip(y) {
        for (a, b) in a.iter_mut().zip(b) {
            *a += b;
        }
    }
}

/// The last position's logits of the Llama folder on `tokens`.
fn llama_logits(f: &Folder, tokens: &[u32], rotate_half: bool) -> Vec<f64> {
    let (h, d, eps) = (HIDDEN, HEAD_DIM, 1e-5);
    let embed = f.get("model.embed_tokens.weight");
    let mut x: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&t| {
            embed[t as usize * h..][..h]
                .iter()
                .map(|v| f64::from(*v))
                .collect()
        })
        .collect();
    for l in 0..LAYERS {
        let w = |name: &str| f.get(&format!("model.layers.{l}.{name}"));
        let n: Vec<Vec<f64>> = x
            .iter()
            .map(|r| rms_norm(r, w("input_layernorm.weight"), eps))
            .collect();
        let heads = |r: &Vec<f64>, name: &str, count: usize, pos: usize| {
            let mut y = matvec(r, w(name), count * d, false);
            if name != "self_attn.v_proj.weight" {
                for head in y.chunks_exact_mut(d) {
                    rotate(head, pos, 10_000.0, rotate_half);
                }
            }
            y
        };
        let proj = |name: &str, count: usize| -> Vec<Vec<f64>> {
            n.iter()
                .enumerate()
                .map(|(pos, r)| heads(r, name, count, pos))
                .collect()
        };
        let (q, k, v) = (
            proj("self_attn.q_proj.weight", HEADS),
            proj("self_attn.k_proj.weight", KV_HEADS),
            proj("self_attn.v_proj.weight", KV_HEADS),
        );
        let a = attend(&q, &k, &v, HEADS, d);
        let o: Vec<Vec<f64>> = a
            .iter()
            .map(|r| matvec(r, w("self_attn.o_proj.weight"), h, false))
            .collect();
        add(&mut x, &o);
        let mlp: Vec<Vec<f64>> = x
            .iter()
            .map(|r| {
                let n = rms_norm(r, w("post_attention_layernorm.weight"), eps);
                let g = matvec(&n, w("mlp.gate_proj.weight"), LLAMA_FF, false);
                let u = matvec(&n, w("mlp.up_proj.weight"), LLAMA_FF, false);
                let s: Vec<f64> = g
                    .iter()
                    .zip(&u)
                    .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                    .collect();
                matvec(&s, w("mlp.down_proj.weight"), h, false)
            })
            .collect();
        add(&mut x, &mlp);
    }
    let last = rms_norm(x.last().unwrap(), f.get("model.norm.weight"), eps);
    matvec(&last, f.get("lm_head.weight"), VOCAB, false)
}

/// The last position's logits of the GPT-2 folder on `tokens`.
fn gpt2_logits(f: &Folder, tokens: &[u32]) -> Vec<f64> {
    let (h, eps) = (HIDDEN, 1e-5);
    let (wte, wpe) = (
        f.get("transformer.wte.weight"),
        f.get("transformer.wpe.weight"),
    );
    let mut x: Vec<Vec<f64>> = tokens
        .iter()
        .enumerate()
        .map(|(pos, &t)| {
            (0..h)
                .map(|i| f64::from(wte[t as usize * h + i] + wpe[pos * h + i]))
                .collect()
        })
        .collect();
    let ln = |r: &[f64], name: &str| {
        layer_norm(
            r,
            f.get(&format!("{name}.weight")),
            f.get(&format!("{name}.bias")),
            eps,
        )
    };
    let conv = |r: &[f64], name: &str, outputs: usize| {
        let y = matvec(r, f.get(&format!("{name}.weight")), outputs, true);
        let b = f.get(&format!("{name}.bias"));
        y.iter()
            .zip(b)
            .map(|(y, b)| y + f64::from(*b))
            .collect::<Vec<f64>>()
    };
    for l in 0..LAYERS {
        let p = format!("transformer.h.{l}");
        let qkv: Vec<Vec<f64>> = x
            .iter()
            .map(|r| {
                conv(
                    &ln(r, &format!("{p}.ln_1")),
                    &format!("{p}.attn.c_attn"),
                    3 * h,
                )
            })
            .collect();
        let part =
            |i: usize| -> Vec<Vec<f64>> { qkv.iter().map(|r| r[i * h..][..h].to_vec()).collect() };
        let a = attend(&part(0), &part(1), &part(2), HEADS, h / HEADS);
        let o: Vec<Vec<f64>> = a
            .iter()
            .map(|r| conv(r, &format!("{p}.attn.c_proj"), h))
            .collect();
        add(&mut x, &o);
        let mlp: Vec<Vec<f64>> = x
            .iter()
            .map(|r| {
                let u = conv(
                    &ln(r, &format!("{p}.ln_2")),
                    &format!("{p}.mlp.c_fc"),
                    GPT2_FF,
                );
                let c = (2.0 / std::f64::consts::PI).sqrt();
                let g: Vec<f64> = u
                    .iter()
                    .map(|u| 0.5 * u * (1.0 + (c * (u + 0.044715 * u * u * u)).tanh()))
                    .collect();
                conv(&g, &format!("{p}.mlp.c_proj"), h)
            })
            .collect();
        add(&mut x, &mlp);
    }
    let last = ln(x.last().unwrap(), "transformer.ln_f");
    matvec(&last, wte, VOCAB, false)
}

/// The prefill logits of the fixed-point reference, as reals.
fn fixed_logits(model: &Decoder, prompt: &[u32]) -> Vec<f64> {
    let shape = Shape {
        batch: 1,
        seq: 8,
        decode_steps: 0,
    };
    let plan = plan::build(model, shape).unwrap();
    let scale = plan.tensors[plan.output].scale;
    let out = generate::reference(
        model,
        &plan,
        prompt,
        Sampling::default(),
        suffuse_host::backend::auto(),
    )
    .unwrap();
    out.logits[0]
        .iter()
        .map(|&v| v as i64 as f64 / f64::from(scale).exp2())
        .collect()
}

fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max)
}

#[test]
fn llama_logits_follow_the_float_model_with_rotate_half_pairs() {
    let f = llama();
    let (_tmp, m) = load(&f, "llama-rope");
    let prompt = m.tokenizer.encode("hello, there", 8).unwrap();
    let ours = fixed_logits(&m, &prompt);
    let half = llama_logits(&f, &prompt, true);
    let adjacent = llama_logits(&f, &prompt, false);
    let (err, gap) = (max_diff(&ours, &half), max_diff(&half, &adjacent));
    eprintln!("llama: |fixed − float| ≤ {err:.4}, |rotate-half − adjacent| = {gap:.4}");
    // Fixed point (12 fraction bits; spline nExp, rsqrt and SiLU) against
    // f64: 0.06 measured on logits up to about 10.
    assert!(
        err < 0.15,
        "fixed point is {err} from the rotate-half float model"
    );
    assert!(
        gap > 20.0 * err,
        "the RoPE pairing barely shows ({gap} vs {err})"
    );
    assert!(max_diff(&ours, &adjacent) > 10.0 * err);
}

#[test]
fn gpt2_logits_follow_the_float_model() {
    let f = gpt2();
    let (_tmp, m) = load(&f, "gpt2-float");
    let prompt = m.tokenizer.encode("hello, there", 8).unwrap();
    let ours = fixed_logits(&m, &prompt);
    let want = gpt2_logits(&f, &prompt);
    let err = max_diff(&ours, &want);
    let spread = want.iter().map(|v| v.abs()).fold(0.0, f64::max);
    eprintln!("gpt2: |fixed − float| ≤ {err:.4} on logits up to {spread:.2}");
    assert!(err < 0.05, "fixed point is {err} from the float model");
}

fn generates_bit_exact(folder: &Folder, test: &str, new: usize, sampling: Sampling) {
    let (_tmp, m) = load(folder, test);
    let prompt = m.tokenizer.encode("hello there", 8).unwrap();
    let mut streamed = Vec::new();
    let g = session::generate(&m, &prompt, new, sampling, &Options::default(), &mut |t| {
        streamed.push(t)
    })
    .unwrap();
    let tokens = &g.outcome.generated.tokens;
    assert_eq!(streamed, *tokens);
    assert!(tokens.len() == new || tokens.last().copied() == m.config.eos);
    assert_eq!(g.outcome.generated.logits.len(), tokens.len());
    // Every pass's logits, prefill and each decode step, equal the
    // reference's bit for bit.
    assert_eq!(g.report.bit_exact, Some(true), "{test}: not bit-exact");
}

#[test]
fn a_loaded_llama_generates_bit_exact() {
    generates_bit_exact(&llama(), "llama-generate", 4, Sampling::default());
}

#[test]
fn a_loaded_gpt2_generates_bit_exact() {
    let sampling = Sampling {
        temperature: 0.9,
        top_k: 40,
        top_p: 0.95,
        seed: 7,
    };
    generates_bit_exact(&gpt2(), "gpt2-generate", 4, sampling);
}

// --- malformed folders ---

/// Writes `folder` after `edit`, loads it, and returns the error.
fn refused(folder: fn() -> Folder, test: &str, edit: impl FnOnce(&mut Folder)) -> ModelError {
    let mut f = folder();
    edit(&mut f);
    let tmp = TempDir::new(test);
    f.write(&tmp.0);
    Decoder::load(&tmp.0).unwrap_err()
}

fn tensor<'a>(f: &'a mut Folder, name: &str) -> &'a mut Written {
    f.tensors.iter_mut().find(|t| t.name == name).unwrap()
}

#[test]
fn malformed_folders_are_refused_with_typed_errors() {
    let e = refused(llama, "bad-type", |f| {
        f.config["model_type"] = "mistral".into()
    });
    assert!(
        matches!(&e, ModelError::UnsupportedArchitecture(m) if m.contains("mistral")),
        "{e}"
    );
    let e = refused(llama, "bad-scaling", |f| {
        f.config["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0})
    });
    assert!(
        matches!(&e, ModelError::UnsupportedArchitecture(m) if m.contains("llama3")),
        "{e}"
    );
    let e = refused(llama, "bad-act", |f| f.config["hidden_act"] = "gelu".into());
    assert!(matches!(e, ModelError::UnsupportedActivation(_)), "{e}");
    let e = refused(llama, "bad-kv", |f| {
        f.config["num_key_value_heads"] = 3.into()
    });
    assert!(matches!(e, ModelError::InvalidConfig(_)), "{e}");
    let e = refused(llama, "bad-eos", |f| {
        f.config["eos_token_id"] = "end".into()
    });
    assert!(matches!(e, ModelError::Json { .. }), "{e}");
    let e = refused(gpt2, "no-field", |f| {
        f.config.as_object_mut().unwrap().remove("n_embd");
    });
    assert!(
        matches!(&e, ModelError::Json { message, .. } if message.contains("n_embd")),
        "{e}"
    );
    let e = refused(gpt2, "bad-scale", |f| {
        f.config["scale_attn_by_inverse_layer_idx"] = true.into()
    });
    assert!(matches!(e, ModelError::UnsupportedArchitecture(_)), "{e}");
    let e = refused(llama, "missing", |f| {
        f.tensors
            .retain(|t| t.name != "model.layers.1.mlp.down_proj.weight")
    });
    assert!(
        matches!(&e, ModelError::MissingTensor(t) if t == "layers.1.mlp.down_proj.weight"),
        "{e}"
    );
    let e = refused(gpt2, "misshaped", |f| {
        let t = tensor(f, "transformer.h.0.attn.c_attn.weight");
        t.shape = vec![HIDDEN, 2 * HIDDEN];
        t.values.truncate(2 * HIDDEN * HIDDEN);
    });
    assert!(
        matches!(&e, ModelError::WrongShape { got, .. } if *got == [HIDDEN, 2 * HIDDEN]),
        "{e}"
    );
    let e = refused(llama, "transposed", |f| {
        // A `gate_proj` stored as if it were a Conv1D: [in, out].
        tensor(f, "model.layers.0.mlp.gate_proj.weight").shape = vec![HIDDEN, LLAMA_FF];
    });
    assert!(
        matches!(&e, ModelError::WrongShape { want, .. } if *want == [LLAMA_FF, HIDDEN]),
        "{e}"
    );
    let e = refused(gpt2, "int-dtype", |f| {
        tensor(f, "transformer.wte.weight").dtype = Dtype::I32
    });
    assert!(
        matches!(&e, ModelError::UnsupportedDtype { dtype, .. } if dtype == "I32"),
        "{e}"
    );
    let e = refused(gpt2, "vocab", |f| f.config["vocab_size"] = 200.into());
    assert!(
        matches!(
            e,
            ModelError::InvalidConfig(_) | ModelError::WrongShape { .. }
        ),
        "{e}"
    );
}

#[test]
fn a_truncated_or_missing_file_is_an_error_not_a_panic() {
    let tmp = TempDir::new("truncated");
    gpt2().write(&tmp.0);
    let path = tmp.0.join("model.safetensors");
    let whole = std::fs::read(&path).unwrap();
    for cut in [0, 4, 8, 9, 100, whole.len() / 2, whole.len() - 1] {
        std::fs::write(&path, &whole[..cut]).unwrap();
        let e = Decoder::load(&tmp.0).unwrap_err();
        assert!(
            matches!(e, ModelError::Safetensors { .. }),
            "cut at {cut}: {e}"
        );
    }
    std::fs::write(&path, &whole).unwrap();
    std::fs::remove_file(tmp.0.join("tokenizer.json")).unwrap();
    assert!(matches!(
        Decoder::load(&tmp.0),
        Err(ModelError::MissingFile { .. })
    ));
    std::fs::write(tmp.0.join("config.json"), b"{\"model_type\": ").unwrap();
    assert!(matches!(
        Decoder::load(&tmp.0),
        Err(ModelError::Json { .. })
    ));
}

/// A checkpoint saved in shards loads to the same decoder as the single
/// file, for both architectures; an index that points outside the folder,
/// at a missing shard, or at a shard without the tensor is refused.
#[test]
fn sharded_checkpoints_load_as_the_single_file_does() {
    for (folder, arch) in [(llama as fn() -> Folder, "llama"), (gpt2, "gpt2")] {
        let f = folder();
        let tmp = TempDir::new(&format!("sharded-{arch}"));
        let (one, three) = (tmp.0.join("one"), tmp.0.join("three"));
        f.write(&one);
        f.write_sharded(&three, 3);
        let (a, b) = (Decoder::load(&one).unwrap(), Decoder::load(&three).unwrap());
        assert_eq!(a.digest(), b.digest(), "{arch}");
    }
    let tmp = TempDir::new("sharded-bad");
    let index = tmp.0.join("model.safetensors.index.json");
    let edit = |from: &str, to: &str| {
        llama().write_sharded(&tmp.0, 2);
        let text = std::fs::read_to_string(&index).unwrap();
        std::fs::write(&index, text.replacen(from, to, 1)).unwrap();
        Decoder::load(&tmp.0).unwrap_err()
    };
    let outside = edit("\"model-00001-of-00002", "\"../model-00001-of-00002");
    assert!(matches!(outside, ModelError::Json { .. }), "{outside}");
    let missing = edit("model-00002-of-00002", "model-00003-of-00002");
    assert!(
        matches!(missing, ModelError::MissingFile { .. }),
        "{missing}"
    );
    let wrong = edit(
        "\"model.embed_tokens.weight\": \"model-00001-of-00002",
        "\"model.embed_tokens.weight\": \"model-00002-of-00002",
    );
    assert!(matches!(wrong, ModelError::MissingTensor(_)), "{wrong}");
}
