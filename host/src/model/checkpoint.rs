//! Reading and writing Hugging Face / sentence-transformers checkpoint
//! folders. `config.json`'s `model_type` picks the architecture: `bert`
//! here, `llama` and `gpt2` in `checkpoint/decoder.rs`, which shares this
//! file's safetensors, JSON and tokenizer machinery.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors, View};
use serde_json::{Value, json};

use super::{
    Activation, Config, Embeddings, Layer, Linear, Model, ModelError, Norm, Pooling, Tokenizer,
    Transformer,
};

mod decoder;

/// The sentence-transformers module types a folder may list in
/// `modules.json`.
const ST_TRANSFORMER: &str = "sentence_transformers.models.Transformer";
const ST_POOLING: &str = "sentence_transformers.models.Pooling";
const ST_NORMALIZE: &str = "sentence_transformers.models.Normalize";

/// Where the pooling configuration lives when `modules.json` does not say.
const DEFAULT_POOLING_DIR: &str = "1_Pooling";

/// The architectures `config.json`'s `model_type` may name.
enum Family {
    Bert,
    Llama,
    Gpt2,
}

/// Reads `config.json` and its `model_type`.
fn config(dir: &Path) -> Result<(PathBuf, Value, Family), ModelError> {
    let path = dir.join("config.json");
    let json = read_json(&path)?;
    let model_type = Fields {
        path: &path,
        json: &json,
    }
    .string("model_type")?;
    let family = match model_type.as_str() {
        "bert" => Family::Bert,
        "llama" => Family::Llama,
        "gpt2" => Family::Gpt2,
        other => {
            return Err(ModelError::UnsupportedArchitecture(format!(
                "model_type `{other}`"
            )));
        }
    };
    Ok((path, json, family))
}

/// Loads a folder of any supported architecture.
pub(super) fn load_any(dir: &Path) -> Result<Transformer, ModelError> {
    let (path, json, family) = config(dir)?;
    let fields = Fields {
        path: &path,
        json: &json,
    };
    match family {
        Family::Bert => load_bert(dir, &fields).map(Transformer::Encoder),
        Family::Llama => decoder::llama(dir, &fields).map(Transformer::Decoder),
        Family::Gpt2 => decoder::gpt2(dir, &fields).map(Transformer::Decoder),
    }
}

/// Loads a BERT folder; a decoder's is refused by name.
pub(super) fn load(dir: &Path) -> Result<Model, ModelError> {
    let (path, json, family) = config(dir)?;
    if !matches!(family, Family::Bert) {
        return Err(ModelError::UnsupportedArchitecture(format!(
            "model_type `{}` is a decoder, not an encoder",
            json["model_type"].as_str().unwrap_or_default()
        )));
    }
    load_bert(
        dir,
        &Fields {
            path: &path,
            json: &json,
        },
    )
}

/// Loads a Llama or GPT-2 folder; an encoder's is refused by name.
pub(super) fn load_decoder(dir: &Path) -> Result<super::Decoder, ModelError> {
    match load_any(dir)? {
        Transformer::Decoder(d) => Ok(d),
        Transformer::Encoder(_) => Err(ModelError::UnsupportedArchitecture(
            "model_type `bert` is an encoder, not a decoder".into(),
        )),
    }
}

fn load_bert(dir: &Path, field: &Fields<'_>) -> Result<Model, ModelError> {
    let (config, lowercase_input) = bert_config(dir, field)?;
    let weights = WeightFiles::open(dir)?;
    let tensors = weights.tensors(&["", "bert."])?;
    let (embeddings, layers) = bert_weights(&tensors, &config)?;
    // Last, as the decoders do: a bad weight file is refused before the
    // tokenizer (the costliest part of a small folder) is built.
    Ok(Model {
        name: folder_name(dir),
        tokenizer: tokenizer(dir, lowercase_input, config.vocab_size)?,
        config,
        embeddings,
        layers,
    })
}

/// A BERT folder's checked configuration (its `config.json`, and
/// sentence-transformers' modules and settings where present) and whether
/// its tokenizer lowercases.
fn bert_config(dir: &Path, field: &Fields<'_>) -> Result<(Config, bool), ModelError> {
    let hf = field.json;
    let positions = field.string_or("position_embedding_type", "absolute")?;
    if positions != "absolute" {
        return Err(ModelError::UnsupportedArchitecture(format!(
            "position_embedding_type `{positions}`"
        )));
    }
    if hf.get("is_decoder").and_then(Value::as_bool) == Some(true) {
        return Err(ModelError::UnsupportedArchitecture(
            "a BERT decoder (is_decoder: true)".into(),
        ));
    }
    let max_positions = field.usize_or("max_position_embeddings", 512)?;
    let hidden = field.usize("hidden_size")?;

    let (pooling, normalize) = sentence_transformer_modules(dir, hidden)?;

    let st_path = dir.join("sentence_bert_config.json");
    let (max_tokens, lowercase_input) = if st_path.exists() {
        let st = read_json(&st_path)?;
        let f = Fields {
            path: &st_path,
            json: &st,
        };
        (
            f.usize_or("max_seq_length", max_positions)?,
            f.bool_or("do_lower_case", false)?,
        )
    } else {
        (max_positions, false)
    };

    let config = Config {
        vocab_size: field.usize("vocab_size")?,
        hidden,
        layers: field.usize("num_hidden_layers")?,
        heads: field.usize("num_attention_heads")?,
        intermediate: field.usize("intermediate_size")?,
        max_positions,
        type_vocab: field.usize_or("type_vocab_size", 2)?,
        ln_eps: field.f32_or("layer_norm_eps", 1e-12)?,
        activation: Activation::from_hf(&field.string_or("hidden_act", "gelu")?)?,
        pooling,
        normalize,
        max_tokens,
    };
    config.check()?;
    Ok((config, lowercase_input))
}

/// A BERT's embeddings and layers from its weight files, each tensor
/// checked against the shape `c` gives it.
fn bert_weights(tensors: &Tensors<'_>, c: &Config) -> Result<(Embeddings, Vec<Layer>), ModelError> {
    let h = c.hidden;
    let norm = |prefix: &str| -> Result<Norm, ModelError> {
        Ok(Norm {
            gamma: tensors.get(&format!("{prefix}.weight"), &[h])?,
            beta: tensors.get(&format!("{prefix}.bias"), &[h])?,
            eps: c.ln_eps,
        })
    };
    let embeddings = Embeddings {
        word: tensors.get("embeddings.word_embeddings.weight", &[c.vocab_size, h])?,
        position: tensors.get(
            "embeddings.position_embeddings.weight",
            &[c.max_positions, h],
        )?,
        token_type: tensors.get(
            "embeddings.token_type_embeddings.weight",
            &[c.type_vocab, h],
        )?,
        norm: norm("embeddings.LayerNorm")?,
    };
    let layers = (0..c.layers)
        .map(|i| {
            let p = format!("encoder.layer.{i}");
            Ok(Layer {
                query: tensors.linear(&format!("{p}.attention.self.query"), h, h)?,
                key: tensors.linear(&format!("{p}.attention.self.key"), h, h)?,
                value: tensors.linear(&format!("{p}.attention.self.value"), h, h)?,
                attn_out: tensors.linear(&format!("{p}.attention.output.dense"), h, h)?,
                attn_norm: norm(&format!("{p}.attention.output.LayerNorm"))?,
                ffn_in: tensors.linear(&format!("{p}.intermediate.dense"), h, c.intermediate)?,
                ffn_out: tensors.linear(&format!("{p}.output.dense"), c.intermediate, h)?,
                ffn_norm: norm(&format!("{p}.output.LayerNorm"))?,
            })
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    Ok((embeddings, layers))
}

/// The folder's name, which names the model.
fn folder_name(dir: &Path) -> String {
    dir.canonicalize()
        .ok()
        .as_deref()
        .unwrap_or(dir)
        .file_name()
        .map_or_else(|| "model".to_string(), |n| n.to_string_lossy().into_owned())
}

/// `tokenizer.json`, whose ids must fit the vocabulary.
fn tokenizer(dir: &Path, lowercase_input: bool, vocab: usize) -> Result<Tokenizer, ModelError> {
    let tokenizer = Tokenizer::from_json(&read(&dir.join("tokenizer.json"))?, lowercase_input)?;
    if tokenizer.id_bound() > vocab {
        return Err(ModelError::InvalidConfig(format!(
            "tokenizer.json has ids up to {} but vocab_size is {vocab}",
            tokenizer.id_bound() - 1,
        )));
    }
    Ok(tokenizer)
}

/// Parses a safetensors file read from `path`.
fn parse_safetensors<'a>(path: &Path, bytes: &'a [u8]) -> Result<SafeTensors<'a>, ModelError> {
    SafeTensors::deserialize(bytes).map_err(|e| ModelError::Safetensors {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// The index Hugging Face writes beside a checkpoint saved in shards.
const SHARD_INDEX: &str = "model.safetensors.index.json";

/// A checkpoint's weight files as read: `model.safetensors`, or else the
/// shards that `model.safetensors.index.json`'s `weight_map` names, with
/// which shard holds each tensor.
struct WeightFiles {
    files: Vec<(PathBuf, Vec<u8>)>,
    /// Tensor name → index into `files`; `None` for a single file.
    map: Option<HashMap<String, usize>>,
}

impl WeightFiles {
    fn open(dir: &Path) -> Result<WeightFiles, ModelError> {
        let single = dir.join("model.safetensors");
        let index = dir.join(SHARD_INDEX);
        if single.exists() || !index.exists() {
            let bytes = read(&single)?;
            return Ok(WeightFiles {
                files: vec![(single, bytes)],
                map: None,
            });
        }
        let (names, map) = shard_map(&index)?;
        let files = names
            .into_iter()
            .map(|n| {
                let path = dir.join(n);
                read(&path).map(|b| (path, b))
            })
            .collect::<Result<_, _>>()?;
        Ok(WeightFiles {
            files,
            map: Some(map),
        })
    }

    /// Every file parsed, for lookups under `prefixes`.
    fn tensors<'a>(&'a self, prefixes: &'a [&'a str]) -> Result<Tensors<'a>, ModelError> {
        let files = self
            .files
            .iter()
            .map(|(path, bytes)| parse_safetensors(path, bytes))
            .collect::<Result<_, _>>()?;
        Ok(Tensors {
            files,
            map: self.map.as_ref(),
            prefixes,
        })
    }
}

/// The shard index: its distinct file names in order of first use, and
/// each tensor's position among them. A shard's name must be a plain file
/// name in the folder, so the index cannot point elsewhere.
fn shard_map(index: &Path) -> Result<(Vec<String>, HashMap<String, usize>), ModelError> {
    let json = read_json(index)?;
    let bad = |message: String| ModelError::Json {
        path: index.to_path_buf(),
        message,
    };
    let entries = json
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("expected an object `weight_map`".into()))?;
    let mut names: Vec<String> = Vec::new();
    let mut map = HashMap::with_capacity(entries.len());
    for (tensor, file) in entries {
        let file = file
            .as_str()
            .filter(|f| is_plain_file_name(f))
            .ok_or_else(|| bad(format!("{tensor}: expected a file name in this folder")))?;
        let at = match names.iter().position(|n| n == file) {
            Some(i) => i,
            None => {
                names.push(file.to_string());
                names.len() - 1
            }
        };
        map.insert(tensor.clone(), at);
    }
    Ok((names, map))
}

/// A name with no directory part that stays inside the folder.
fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\'])
}

/// Reads `modules.json` (when present) and the pooling configuration:
/// returns the pooling and whether a Normalize module follows it.
fn sentence_transformer_modules(dir: &Path, hidden: usize) -> Result<(Pooling, bool), ModelError> {
    let modules = listed_modules(dir)?;
    let pooling_path = dir.join(&modules.pooling_dir).join("config.json");
    if !pooling_path.exists() {
        if modules.pooling_listed {
            return Err(ModelError::MissingFile { path: pooling_path });
        }
        // No pooling module: the [CLS] state, as documented on `Pooling`.
        return Ok((Pooling::Cls, modules.normalize));
    }
    Ok((pooling_config(&pooling_path, hidden)?, modules.normalize))
}

/// What `modules.json` lists: where the pooling module lives, whether it
/// is listed at all, and whether a Normalize module follows it.
struct Modules {
    pooling_dir: PathBuf,
    pooling_listed: bool,
    normalize: bool,
}

/// Reads `dir/modules.json`; without one, the pooling module's default
/// folder, unlisted, and no Normalize.
fn listed_modules(dir: &Path) -> Result<Modules, ModelError> {
    let modules_path = dir.join("modules.json");
    let mut found = Modules {
        pooling_dir: PathBuf::from(DEFAULT_POOLING_DIR),
        pooling_listed: false,
        normalize: false,
    };
    if !modules_path.exists() {
        return Ok(found);
    }
    let modules = read_json(&modules_path)?;
    let list = modules.as_array().ok_or_else(|| ModelError::Json {
        path: modules_path.clone(),
        message: "expected an array of modules".into(),
    })?;
    for module in list {
        let kind = module
            .get("type")
            .and_then(Value::as_str)
            .ok_or_else(|| ModelError::Json {
                path: modules_path.clone(),
                message: format!("module without a string `type`: {module}"),
            })?;
        match kind {
            ST_TRANSFORMER => {}
            ST_POOLING => {
                found.pooling_listed = true;
                if let Some(p) = module.get("path").and_then(Value::as_str) {
                    found.pooling_dir = PathBuf::from(p);
                }
            }
            ST_NORMALIZE => found.normalize = true,
            other => {
                return Err(ModelError::UnsupportedArchitecture(format!(
                    "sentence-transformers module `{other}`"
                )));
            }
        }
    }
    Ok(found)
}

/// The pooling a sentence-transformers pooling `config.json` asks for:
/// mean or `[CLS]`, at the model's hidden width.
fn pooling_config(pooling_path: &Path, hidden: usize) -> Result<Pooling, ModelError> {
    let json = read_json(pooling_path)?;
    let map = json.as_object().ok_or_else(|| ModelError::Json {
        path: pooling_path.to_path_buf(),
        message: "expected an object".into(),
    })?;
    if let Some(dim) = map.get("word_embedding_dimension").and_then(Value::as_u64)
        && dim != hidden as u64
    {
        return Err(ModelError::InvalidConfig(format!(
            "{}: word_embedding_dimension {dim} differs from hidden_size {hidden}",
            pooling_path.display()
        )));
    }
    let mut modes: Vec<&str> = map
        .iter()
        .filter(|(k, v)| k.starts_with("pooling_mode_") && v.as_bool() == Some(true))
        .map(|(k, _)| k.as_str())
        .collect();
    // Newer sentence-transformers also accept a `pooling_mode` string.
    let named = map.get("pooling_mode").and_then(Value::as_str);
    match (modes.as_slice(), named) {
        (["pooling_mode_mean_tokens"], None) | ([], Some("mean")) => Ok(Pooling::Mean),
        (["pooling_mode_cls_token"], None) | ([], Some("cls")) => Ok(Pooling::Cls),
        _ => {
            modes.extend(named);
            Err(ModelError::UnsupportedPooling(if modes.is_empty() {
                format!("{} enables no pooling mode", pooling_path.display())
            } else {
                format!("{} asks for {}", pooling_path.display(), modes.join(" + "))
            }))
        }
    }
}

/// Writes `model` into the folder `dir` (made if missing) as a sentence-transformers
/// checkpoint: the Hugging Face configuration, the sentence-transformers
/// files, `tokenizer.json` and `model.safetensors`.
pub(super) fn write_dir(model: &Model, dir: &Path) -> Result<(), ModelError> {
    create_dir(dir)?;
    create_dir(&dir.join(DEFAULT_POOLING_DIR))?;
    write_json(&dir.join("config.json"), &hf_config(&model.config))?;
    write_sentence_transformers(model, dir)?;
    let json = model.tokenizer.to_json().ok_or_else(|| {
        ModelError::Tokenizer("a SentencePiece tokenizer has no tokenizer.json form".into())
    })?;
    let tokenizer: Value =
        serde_json::from_str(json).map_err(|e| ModelError::Tokenizer(e.to_string()))?;
    write_json(&dir.join("tokenizer.json"), &tokenizer)?;

    let weights_path = dir.join("model.safetensors");
    let tensors = hf_tensors(model);
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    let bytes =
        safetensors::serialize(tensors, Some(metadata)).map_err(|e| ModelError::Safetensors {
            path: weights_path.clone(),
            message: e.to_string(),
        })?;
    std::fs::write(&weights_path, bytes).map_err(|source| ModelError::Io {
        path: weights_path,
        error: source,
    })
}

/// The Hugging Face `config.json` of a BERT-family model.
fn hf_config(c: &Config) -> Value {
    // The shortest decimal that reads back as the same f32, so the file
    // says 1e-12 rather than 9.999999960041972e-13.
    let eps: f64 = c.ln_eps.to_string().parse().unwrap_or(f64::from(c.ln_eps));
    json!({
        "architectures": ["BertModel"],
        "model_type": "bert",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden,
        "num_hidden_layers": c.layers,
        "num_attention_heads": c.heads,
        "intermediate_size": c.intermediate,
        "max_position_embeddings": c.max_positions,
        "type_vocab_size": c.type_vocab,
        "layer_norm_eps": eps,
        "hidden_act": c.activation.hf_name(),
        "position_embedding_type": "absolute",
        "pad_token_id": 0,
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "initializer_range": 0.02,
    })
}

/// The sentence-transformers files: the pooling module's configuration,
/// `modules.json` (a Normalize module where the model normalizes) and
/// `sentence_bert_config.json`.
fn write_sentence_transformers(model: &Model, dir: &Path) -> Result<(), ModelError> {
    let c = &model.config;
    let pooling = json!({
        "word_embedding_dimension": c.hidden,
        "pooling_mode_cls_token": c.pooling == Pooling::Cls,
        "pooling_mode_mean_tokens": c.pooling == Pooling::Mean,
        "pooling_mode_max_tokens": false,
        "pooling_mode_mean_sqrt_len_tokens": false,
    });
    write_json(&dir.join(DEFAULT_POOLING_DIR).join("config.json"), &pooling)?;

    let mut modules = vec![
        json!({"idx": 0, "name": "0", "path": "", "type": ST_TRANSFORMER}),
        json!({"idx": 1, "name": "1", "path": DEFAULT_POOLING_DIR, "type": ST_POOLING}),
    ];
    if c.normalize {
        modules.push(json!({"idx": 2, "name": "2", "path": "2_Normalize", "type": ST_NORMALIZE}));
    }
    write_json(&dir.join("modules.json"), &Value::Array(modules))?;
    write_json(
        &dir.join("sentence_bert_config.json"),
        &json!({"max_seq_length": c.max_tokens,
                "do_lower_case": model.tokenizer.lowercase_input()}),
    )
}

/// Every tensor under its Hugging Face name and shape, linear weights
/// transposed back to `[outputs, inputs]`.
fn hf_tensors(model: &Model) -> Vec<(String, F32Tensor)> {
    let c = &model.config;
    let e = &model.embeddings;
    let mut out = Vec::new();
    let mut put = |name: String, shape: Vec<usize>, data: Cow<'_, [f32]>| {
        out.push((name, F32Tensor::new(shape, &data)));
    };
    let h = c.hidden;
    put(
        "embeddings.word_embeddings.weight".into(),
        vec![c.vocab_size, h],
        Cow::Borrowed(&e.word),
    );
    put(
        "embeddings.position_embeddings.weight".into(),
        vec![c.max_positions, h],
        Cow::Borrowed(&e.position),
    );
    put(
        "embeddings.token_type_embeddings.weight".into(),
        vec![c.type_vocab, h],
        Cow::Borrowed(&e.token_type),
    );
    put_norm(&mut put, "embeddings.LayerNorm", &e.norm);
    for (i, l) in model.layers.iter().enumerate() {
        let p = format!("encoder.layer.{i}");
        for (part, lin) in [
            ("attention.self.query", &l.query),
            ("attention.self.key", &l.key),
            ("attention.self.value", &l.value),
            ("attention.output.dense", &l.attn_out),
            ("intermediate.dense", &l.ffn_in),
            ("output.dense", &l.ffn_out),
        ] {
            put(
                format!("{p}.{part}.weight"),
                vec![lin.outputs, lin.inputs],
                Cow::Owned(transpose(&lin.w.values(), lin.inputs, lin.outputs)),
            );
            put(
                format!("{p}.{part}.bias"),
                vec![lin.outputs],
                Cow::Borrowed(&lin.b),
            );
        }
        for (part, norm) in [
            ("attention.output.LayerNorm", &l.attn_norm),
            ("output.LayerNorm", &l.ffn_norm),
        ] {
            put_norm(&mut put, &format!("{p}.{part}"), norm);
        }
    }
    out
}

/// A LayerNorm's two tensors under `name`: its gains and its shifts.
fn put_norm(put: &mut impl FnMut(String, Vec<usize>, Cow<'_, [f32]>), name: &str, norm: &Norm) {
    let h = norm.gamma.len();
    put(
        format!("{name}.weight"),
        vec![h],
        Cow::Borrowed(&norm.gamma),
    );
    put(format!("{name}.bias"), vec![h], Cow::Borrowed(&norm.beta));
}

/// `[rows × cols]` row-major to `[cols × rows]` row-major.
pub(crate) fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0f32; m.len()];
    for (r, row) in m.chunks_exact(cols).enumerate().take(rows) {
        for (col, &v) in row.iter().enumerate() {
            t[col * rows + r] = v;
        }
    }
    t
}

/// An owned little-endian F32 tensor for `safetensors::serialize`.
struct F32Tensor {
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl F32Tensor {
    fn new(shape: Vec<usize>, data: &[f32]) -> F32Tensor {
        F32Tensor {
            shape,
            bytes: data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }
}

impl View for F32Tensor {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// Named lookups in a checkpoint's safetensors files, converting to f32.
struct Tensors<'a> {
    files: Vec<SafeTensors<'a>>,
    /// Which file holds each tensor (sharded checkpoints).
    map: Option<&'a HashMap<String, usize>>,
    /// Where the architecture's checkpoints put the base model, tried in
    /// order: a bare `BertModel` has no prefix while `BertFor*` heads (and
    /// bert-base-uncased) write `bert.`; `LlamaForCausalLM` writes
    /// `model.`; `GPT2LMHeadModel` writes `transformer.`.
    prefixes: &'a [&'a str],
}

impl<'a> Tensors<'a> {
    /// The tensor `name` under one of the prefixes, checked against
    /// `shape` and widened to f32.
    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, ModelError> {
        let (found, view) = self
            .prefixes
            .iter()
            .map(|p| format!("{p}{name}"))
            .find_map(|n| self.find(&n).map(|v| (n, v)))
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        if view.shape() != shape {
            return Err(ModelError::WrongShape {
                tensor: found,
                want: shape.to_vec(),
                got: view.shape().to_vec(),
            });
        }
        let data = view.data();
        let values = match view.dtype() {
            Dtype::F32 => data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F16 => data
                .chunks_exact(2)
                .map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
                .collect(),
            Dtype::BF16 => data
                .chunks_exact(2)
                .map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16))
                .collect(),
            other => {
                return Err(ModelError::UnsupportedDtype {
                    tensor: found,
                    dtype: format!("{other:?}"),
                });
            }
        };
        Ok(values)
    }

    /// The tensor `name` exactly: in the shard the index assigns it, or
    /// in the single file.
    fn find(&self, name: &str) -> Option<safetensors::tensor::TensorView<'_>> {
        let file = match self.map {
            Some(map) => self.files.get(*map.get(name)?)?,
            None => self.files.first()?,
        };
        file.tensor(name).ok()
    }

    /// A Hugging Face `nn.Linear` (`weight` `[outputs, inputs]`, `bias`
    /// `[outputs]`), transposed to this crate's `[inputs × outputs]`.
    fn linear(&self, prefix: &str, inputs: usize, outputs: usize) -> Result<Linear, ModelError> {
        self.linear_with(prefix, inputs, outputs, true)
    }

    /// [`Tensors::linear`], with a zero bias unless `bias` says the
    /// checkpoint stores one (Llama's `attention_bias`, `mlp_bias`).
    fn linear_with(
        &self,
        prefix: &str,
        inputs: usize,
        outputs: usize,
        bias: bool,
    ) -> Result<Linear, ModelError> {
        let w = self.get(&format!("{prefix}.weight"), &[outputs, inputs])?;
        Ok(Linear {
            w: transpose(&w, outputs, inputs).into(),
            b: self.bias(prefix, outputs, bias)?,
            inputs,
            outputs,
        })
    }

    /// A GPT-2 `Conv1D`: `weight` is already `[inputs, outputs]`.
    fn conv1d(&self, prefix: &str, inputs: usize, outputs: usize) -> Result<Linear, ModelError> {
        Ok(Linear {
            w: self
                .get(&format!("{prefix}.weight"), &[inputs, outputs])?
                .into(),
            b: self.bias(prefix, outputs, true)?,
            inputs,
            outputs,
        })
    }

    fn bias(&self, prefix: &str, outputs: usize, stored: bool) -> Result<Vec<f32>, ModelError> {
        if stored {
            self.get(&format!("{prefix}.bias"), &[outputs])
        } else {
            Ok(vec![0.0; outputs])
        }
    }
}

/// IEEE 754 binary16 to binary32, exactly (every half is a float).
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, _) => {
            // Subnormal: man · 2^-24, which f32 holds exactly as a normal.
            let magnitude = man as f32 / 16_777_216.0;
            return if sign == 0 { magnitude } else { -magnitude };
        }
        (0x1f, 0) => sign | 0x7f80_0000,
        (0x1f, _) => sign | 0x7fc0_0000 | (man << 13),
        _ => sign | ((exp + 127 - 15) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

/// Reads a file, turning "not found" into [`ModelError::MissingFile`].
fn read(path: &Path) -> Result<Vec<u8>, ModelError> {
    super::files::read_whole(path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            ModelError::MissingFile {
                path: path.to_path_buf(),
            }
        } else {
            ModelError::Io {
                path: path.to_path_buf(),
                error: source,
            }
        }
    })
}

fn read_json(path: &Path) -> Result<Value, ModelError> {
    serde_json::from_slice(&read(path)?).map_err(|e| ModelError::Json {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

fn write_json(path: &Path, value: &Value) -> Result<(), ModelError> {
    let mut text = serde_json::to_string_pretty(value).map_err(|e| ModelError::Json {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    text.push('\n');
    std::fs::write(path, text).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        error: source,
    })
}

fn create_dir(path: &Path) -> Result<(), ModelError> {
    std::fs::create_dir_all(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        error: source,
    })
}

/// Typed field access on a JSON object, with errors naming file and field.
struct Fields<'a> {
    path: &'a Path,
    json: &'a Value,
}

impl Fields<'_> {
    fn error(&self, message: String) -> ModelError {
        ModelError::Json {
            path: self.path.to_path_buf(),
            message,
        }
    }

    fn usize(&self, key: &str) -> Result<usize, ModelError> {
        match self.json.get(key) {
            None => Err(self.error(format!("missing field `{key}`"))),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| self.error(format!("`{key}` is {v}, not a non-negative integer"))),
        }
    }

    fn usize_or(&self, key: &str, default: usize) -> Result<usize, ModelError> {
        match self.json.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(_) => self.usize(key),
        }
    }

    fn f32_or(&self, key: &str, default: f32) -> Result<f32, ModelError> {
        match self.json.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v
                .as_f64()
                .map(|x| x as f32)
                .ok_or_else(|| self.error(format!("`{key}` is {v}, not a number"))),
        }
    }

    fn bool_or(&self, key: &str, default: bool) -> Result<bool, ModelError> {
        match self.json.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| self.error(format!("`{key}` is {v}, not a boolean"))),
        }
    }

    fn string(&self, key: &str) -> Result<String, ModelError> {
        match self.json.get(key) {
            None => Err(self.error(format!("missing field `{key}`"))),
            Some(v) => v
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| self.error(format!("`{key}` is {v}, not a string"))),
        }
    }

    fn string_or(&self, key: &str, default: &str) -> Result<String, ModelError> {
        match self.json.get(key) {
            None | Some(Value::Null) => Ok(default.to_string()),
            Some(_) => self.string(key),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::f16_to_f32;

    #[test]
    fn half_precision_decodes_exactly() {
        assert_eq!(f16_to_f32(0x0000), 0.0);
        assert!(f16_to_f32(0x8000).is_sign_negative());
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x3555), 0.333_251_95);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x83ff), -(1023.0 * 2f32.powi(-24)));
        assert_eq!(f16_to_f32(0x0400), 2f32.powi(-14));
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
        assert_eq!(f16_to_f32(0xfc00), f32::NEG_INFINITY);
        assert!(f16_to_f32(0x7e00).is_nan());
    }
}
