//! Transformer models as users have them: Hugging Face checkpoint folders
//! (`config.json`, `model.safetensors`, `tokenizer.json` and the
//! sentence-transformers files beside them), plus small models generated
//! deterministically in code so that everything runs with no download.
//!
//! The architecture covered here is the BERT encoder (post-LayerNorm, learned
//! absolute positions), the family of all-MiniLM-L6-v2 and BERT-base. A model
//! is plain data: public weights in f32, laid out the way the linear algebra
//! uses them (`y = x·w + b`, `w` as `[inputs × outputs]`), and a tokenizer.
//!
//! This file holds the types, the digest and the client-side embedding;
//! `model/checkpoint.rs` reads and writes checkpoint folders,
//! `model/generate.rs` makes generated weights and `model/tokenizer.rs`
//! wraps the `tokenizers` crate.

use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

pub mod chat;
mod checkpoint;
mod decoder;
pub(crate) mod files;
mod generate;
pub mod gguf;
mod tokenizer;

pub use decoder::{
    Architecture, BlockForm, Decoder, DecoderConfig, DecoderLayer, GatedActivation, RopeStyle,
    Sliding,
};

pub use tokenizer::Tokenizer;

/// The shape and hyper-parameters of a BERT encoder, gathered from
/// `config.json`, the pooling configuration and `sentence_bert_config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Rows of the word-embedding table: every token id is below this.
    pub vocab_size: usize,
    /// Width of the residual stream (`hidden_size`).
    pub hidden: usize,
    /// Number of encoder layers (`num_hidden_layers`).
    pub layers: usize,
    /// Attention heads per layer; `hidden` is a multiple of it.
    pub heads: usize,
    /// Width of the feed-forward block (`intermediate_size`).
    pub intermediate: usize,
    /// Rows of the position-embedding table (`max_position_embeddings`).
    pub max_positions: usize,
    /// Rows of the token-type table (`type_vocab_size`); only type 0 is used.
    pub type_vocab: usize,
    /// The LayerNorm epsilon (`layer_norm_eps`).
    pub ln_eps: f32,
    /// The feed-forward non-linearity (`hidden_act`).
    pub activation: Activation,
    /// How token states become one sentence embedding.
    pub pooling: Pooling,
    /// Whether the pooled embedding is scaled to unit L2 norm.
    pub normalize: bool,
    /// The longest input the model is meant for, special tokens included:
    /// `max_seq_length` of `sentence_bert_config.json` when present, else
    /// `max_positions`. Never more than `max_positions`.
    pub max_tokens: usize,
}

impl Config {
    /// The configuration of [`Model::demo`]: 2 layers, hidden 64, 4 heads,
    /// intermediate 256, up to 128 tokens, mean pooling and normalization.
    pub fn demo() -> Config {
        Config {
            vocab_size: 128,
            hidden: 64,
            layers: 2,
            heads: 4,
            intermediate: 256,
            max_positions: 128,
            type_vocab: 2,
            ln_eps: 1e-12,
            activation: Activation::GeluErf,
            pooling: Pooling::Mean,
            normalize: true,
            max_tokens: 128,
        }
    }

    /// BERT-base's shape (`bert-base-uncased`): 12 layers, hidden 768, 12
    /// heads, intermediate 3072, up to 512 tokens, with mean pooling as
    /// sentence-transformers' BERT-base models use.
    pub fn bert_base() -> Config {
        Config {
            vocab_size: 30522,
            hidden: 768,
            layers: 12,
            heads: 12,
            intermediate: 3072,
            max_positions: 512,
            type_vocab: 2,
            ln_eps: 1e-12,
            activation: Activation::GeluErf,
            pooling: Pooling::Mean,
            normalize: true,
            max_tokens: 512,
        }
    }

    /// all-MiniLM-L6-v2's shape: 6 layers, hidden 384, 12 heads,
    /// intermediate 1536, up to 256 tokens, mean pooling and normalization.
    pub fn minilm() -> Config {
        Config {
            vocab_size: 30522,
            hidden: 384,
            layers: 6,
            heads: 12,
            intermediate: 1536,
            max_positions: 512,
            type_vocab: 2,
            ln_eps: 1e-12,
            activation: Activation::GeluErf,
            pooling: Pooling::Mean,
            normalize: true,
            max_tokens: 256,
        }
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads.max(1)
    }

    /// Checks that the numbers describe a model that can exist: every size
    /// positive, `heads` dividing `hidden`, `max_tokens ≤ max_positions`, a
    /// vocabulary big enough for the special tokens and a positive, finite
    /// epsilon.
    pub fn check(&self) -> Result<(), ModelError> {
        let bad = |why: String| Err(ModelError::InvalidConfig(why));
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("hidden", self.hidden),
            ("layers", self.layers),
            ("heads", self.heads),
            ("intermediate", self.intermediate),
            ("max_positions", self.max_positions),
            ("type_vocab", self.type_vocab),
            ("max_tokens", self.max_tokens),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return bad(format!("{name} is 0"));
        }
        if !self.hidden.is_multiple_of(self.heads) {
            return bad(format!(
                "hidden size {} is not a multiple of the {} heads",
                self.hidden, self.heads
            ));
        }
        if self.max_tokens > self.max_positions {
            return bad(format!(
                "max_tokens {} exceeds the {} position embeddings",
                self.max_tokens, self.max_positions
            ));
        }
        if self.vocab_size < tokenizer::SPECIAL_TOKENS.len() {
            return bad(format!(
                "vocab_size {} cannot hold the {} special tokens",
                self.vocab_size,
                tokenizer::SPECIAL_TOKENS.len()
            ));
        }
        if !(self.ln_eps.is_finite() && self.ln_eps > 0.0) {
            return bad(format!(
                "layer_norm_eps {} is not a positive number",
                self.ln_eps
            ));
        }
        Ok(())
    }
}

/// The feed-forward non-linearity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `x·Φ(x) = ½x(1 + erf(x/√2))`: BERT's `"gelu"`.
    GeluErf,
    /// `½x(1 + tanh(√(2/π)(x + 0.044715x³)))`: `"gelu_new"`,
    /// `"gelu_pytorch_tanh"` (GPT-2's form).
    GeluTanh,
}

impl Activation {
    /// Reads a Hugging Face `hidden_act` string.
    pub fn from_hf(name: &str) -> Result<Activation, ModelError> {
        match name {
            "gelu" => Ok(Activation::GeluErf),
            "gelu_new" | "gelu_pytorch_tanh" => Ok(Activation::GeluTanh),
            other => Err(ModelError::UnsupportedActivation(other.to_string())),
        }
    }

    /// The Hugging Face `hidden_act` string written for this activation.
    pub fn hf_name(self) -> &'static str {
        match self {
            Activation::GeluErf => "gelu",
            Activation::GeluTanh => "gelu_new",
        }
    }
}

/// How the final token states become one sentence embedding.
///
/// A folder with no sentence-transformers pooling module gets [`Pooling::Cls`]:
/// a plain BERT checkpoint summarizes a sequence by its `[CLS]` position,
/// and sentence-transformers' CLS pooling takes that state as it is. The
/// checkpoint's `pooler` head (dense + tanh, trained for next-sentence
/// prediction) is not applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// The average of the states of the real (non-padding) tokens.
    Mean,
    /// The state of the first token (`[CLS]`).
    Cls,
}

/// A dense layer `y = x·w + b`.
#[derive(Clone, PartialEq)]
pub struct Linear {
    /// `[inputs × outputs]`, row-major: row `i` holds input `i`'s weights to
    /// every output. Hugging Face `nn.Linear` stores `[outputs, inputs]`, so
    /// loading transposes.
    pub w: Matrix,
    /// `[outputs]`.
    pub b: Vec<f32>,
    /// Input width.
    pub inputs: usize,
    /// Output width.
    pub outputs: usize,
}

/// A dense layer's weights, `[inputs × outputs]` row-major as
/// [`Linear::w`] reads: held as `f32`, or left in the GGUF file's bytes as
/// the file stores them (`[outputs][inputs]`, quantized) and dequantized
/// and transposed when read. A GGUF decoder's matrices are read a few
/// times while a plan is built (its fixed-point words are what the servers
/// multiply by), so holding their `f32`s beside the words would cost 4
/// bytes a weight for nothing (docs/BACKENDS.md, "Weights left in the
/// GGUF file").
#[derive(Clone)]
pub enum Matrix {
    /// The values, `[inputs × outputs]`.
    Held(Vec<f32>),
    /// A tensor of a GGUF file.
    Stored(gguf::Stored),
}

impl Matrix {
    /// The values, `[inputs × outputs]`: borrowed where held, else
    /// dequantized now (a stored matrix's values are never kept).
    pub fn values(&self) -> std::borrow::Cow<'_, [f32]> {
        match self {
            Matrix::Held(w) => std::borrow::Cow::Borrowed(w),
            Matrix::Stored(s) => std::borrow::Cow::Owned(s.values()),
        }
    }

    /// `f(i, o, w)` for every weight `w` of input `i` to output `o` of a
    /// matrix `outputs` wide, in an order that reads it where it lies in
    /// runs (a stored one a few output rows at a time, nothing dequantized
    /// beyond them).
    pub fn for_each_weight(&self, outputs: usize, mut f: impl FnMut(usize, usize, f32)) {
        match self {
            Matrix::Held(w) => {
                for (i, row) in w.chunks_exact(outputs.max(1)).enumerate() {
                    for (o, v) in row.iter().enumerate() {
                        f(i, o, *v);
                    }
                }
            }
            Matrix::Stored(s) => s.for_each_weight(f),
        }
    }

    /// The [`tensor_hash`] of [`Matrix::values`]: of a stored matrix,
    /// computed once.
    pub fn hash(&self) -> [u8; 32] {
        match self {
            Matrix::Held(w) => tensor_hash(w.len(), |f| f(w)),
            Matrix::Stored(s) => s.hash(true),
        }
    }

    /// The values to change in place, held from now on.
    pub fn held_mut(&mut self) -> &mut Vec<f32> {
        if let Matrix::Stored(s) = self {
            *self = Matrix::Held(s.values());
        }
        match self {
            Matrix::Held(w) => w,
            Matrix::Stored(_) => unreachable!("made held above"),
        }
    }

    /// Number of weights.
    pub fn len(&self) -> usize {
        match self {
            Matrix::Held(w) => w.len(),
            Matrix::Stored(s) => s.len(),
        }
    }

    /// Whether it has no weights.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// SHA-256 of `len` values handed on in runs: the count (u64, little
/// endian), then each value's `f32` bits (little endian). A decoder's
/// digest ([`Decoder::digest`]) hashes each tensor so.
pub fn tensor_hash(len: usize, runs: impl FnOnce(&mut dyn FnMut(&[f32]))) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update((len as u64).to_le_bytes());
    let mut bytes = Vec::with_capacity(4096);
    runs(&mut |run: &[f32]| {
        for chunk in run.chunks(1024) {
            bytes.clear();
            bytes.extend(chunk.iter().flat_map(|v| v.to_le_bytes()));
            h.update(&bytes);
        }
    });
    h.finalize().into()
}

/// A table of rows, `[rows × width]` row-major (a decoder's token
/// embeddings): held as `f32`, or left in the GGUF file's bytes, where a
/// table is stored row by row, and dequantized when read.
#[derive(Clone)]
pub enum Rows {
    /// The values, `[rows × width]`.
    Held(Vec<f32>),
    /// A tensor of a GGUF file with `ne = [width, rows]`.
    Stored(gguf::Stored),
}

impl Rows {
    /// The values, `[rows × width]`: borrowed where held, else dequantized
    /// now.
    pub fn values(&self) -> std::borrow::Cow<'_, [f32]> {
        match self {
            Rows::Held(v) => std::borrow::Cow::Borrowed(v),
            Rows::Stored(s) => {
                let mut v = Vec::with_capacity(s.len());
                s.for_each_row(|row| v.extend_from_slice(row));
                std::borrow::Cow::Owned(v)
            }
        }
    }

    /// Row `r` of a table `width` wide, or `None` past the last.
    pub fn row(&self, r: usize, width: usize) -> Option<std::borrow::Cow<'_, [f32]>> {
        match self {
            Rows::Held(v) => {
                let at = r.checked_mul(width)?;
                v.get(at..)?.get(..width).map(std::borrow::Cow::Borrowed)
            }
            Rows::Stored(s) => s.row(r).map(std::borrow::Cow::Owned),
        }
    }

    /// Every row of a table `width` wide, in order.
    pub fn for_each_row(&self, width: usize, f: impl FnMut(&[f32])) {
        match self {
            Rows::Held(v) => v.chunks_exact(width.max(1)).for_each(f),
            Rows::Stored(s) => s.for_each_row(f),
        }
    }

    /// The [`tensor_hash`] of [`Rows::values`]: of a stored table,
    /// computed once, a few rows at a time.
    pub fn hash(&self) -> [u8; 32] {
        match self {
            Rows::Held(v) => tensor_hash(v.len(), |f| f(v)),
            Rows::Stored(s) => s.hash(false),
        }
    }

    /// The table transposed, `[width × rows]`, as a matrix (a tied LM
    /// head): a stored table is the same tensor read the other way.
    pub fn transposed(&self, rows: usize, width: usize) -> Matrix {
        match self {
            Rows::Held(v) => Matrix::Held(checkpoint::transpose(v, rows, width)),
            Rows::Stored(s) => Matrix::Stored(s.clone()),
        }
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            Rows::Held(v) => v.len(),
            Rows::Stored(s) => s.len(),
        }
    }

    /// Whether it has no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl From<Vec<f32>> for Rows {
    fn from(v: Vec<f32>) -> Rows {
        Rows::Held(v)
    }
}

/// Equal values, however each is kept.
impl PartialEq for Rows {
    fn eq(&self, other: &Rows) -> bool {
        self.len() == other.len() && self.values() == other.values()
    }
}

impl std::fmt::Debug for Rows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kept = match self {
            Rows::Held(_) => "held",
            Rows::Stored(_) => "in its file",
        };
        write!(f, "Rows({} values, {kept})", self.len())
    }
}

impl From<Vec<f32>> for Matrix {
    fn from(w: Vec<f32>) -> Matrix {
        Matrix::Held(w)
    }
}

/// Equal values, however each is kept.
impl PartialEq for Matrix {
    fn eq(&self, other: &Matrix) -> bool {
        self.len() == other.len() && self.values() == other.values()
    }
}

/// LayerNorm parameters: `y = (x − mean)/√(var + eps)·gamma + beta`.
#[derive(Clone, PartialEq)]
pub struct Norm {
    /// Per-feature scale.
    pub gamma: Vec<f32>,
    /// Per-feature shift.
    pub beta: Vec<f32>,
    /// Added to the variance before the square root.
    pub eps: f32,
}

/// One post-LayerNorm encoder layer.
#[derive(Clone, Debug, PartialEq)]
pub struct Layer {
    /// Query projection, `[hidden × hidden]`.
    pub query: Linear,
    /// Key projection, `[hidden × hidden]`.
    pub key: Linear,
    /// Value projection, `[hidden × hidden]`.
    pub value: Linear,
    /// Attention output projection, `[hidden × hidden]`.
    pub attn_out: Linear,
    /// LayerNorm after the attention residual.
    pub attn_norm: Norm,
    /// Feed-forward up projection, `[hidden × intermediate]`.
    pub ffn_in: Linear,
    /// Feed-forward down projection, `[intermediate × hidden]`.
    pub ffn_out: Linear,
    /// LayerNorm after the feed-forward residual.
    pub ffn_norm: Norm,
}

/// The embedding tables and the LayerNorm applied to their sum.
#[derive(Clone, PartialEq)]
pub struct Embeddings {
    /// `[vocab_size × hidden]`.
    pub word: Vec<f32>,
    /// `[max_positions × hidden]`.
    pub position: Vec<f32>,
    /// `[type_vocab × hidden]`.
    pub token_type: Vec<f32>,
    /// The embedding LayerNorm.
    pub norm: Norm,
}

/// A BERT encoder with its tokenizer.
///
/// The fields are public plain data. [`Model::digest`] is computed from them
/// on each call, so it is never stale after an edit.
#[derive(Clone, Debug, PartialEq)]
pub struct Model {
    /// A label: the folder name for a loaded model, `demo` or
    /// `generated-SEED` for generated ones. Not part of the digest.
    pub name: String,
    /// Shapes and hyper-parameters.
    pub config: Config,
    /// The embedding tables (used by the client, in the clear).
    pub embeddings: Embeddings,
    /// The encoder layers, in order.
    pub layers: Vec<Layer>,
    /// Text to token ids.
    pub tokenizer: Tokenizer,
}

/// Any model this crate runs: the plan, the servers and the CLI dispatch on
/// it and name no architecture.
#[derive(Clone, Debug, PartialEq)]
#[allow(clippy::large_enum_variant)] // one per process, held by reference
pub enum Transformer {
    /// A BERT encoder (sentence embeddings).
    Encoder(Model),
    /// A causal decoder (text generation).
    Decoder(Decoder),
}

impl Transformer {
    /// The built-in models of both kinds, by name ([`Model::builtin`],
    /// [`Decoder::builtin`]).
    pub fn builtin(name: &str) -> Option<Transformer> {
        Model::builtin(name)
            .map(Transformer::Encoder)
            .or_else(|| Decoder::builtin(name).map(Transformer::Decoder))
    }

    /// Loads a Hugging Face folder of any supported architecture, chosen
    /// by `config.json`'s `model_type`: `bert` ([`Model::load`]), `llama`
    /// or `gpt2` ([`Decoder::load`]).
    pub fn load(dir: &Path) -> Result<Transformer, ModelError> {
        checkpoint::load_any(dir)
    }

    /// The model's label.
    pub fn name(&self) -> &str {
        match self {
            Transformer::Encoder(m) => &m.name,
            Transformer::Decoder(m) => &m.name,
        }
    }

    /// The model's digest (see [`Model::digest`], [`Decoder::digest`]).
    pub fn digest(&self) -> [u8; 32] {
        match self {
            Transformer::Encoder(m) => m.digest(),
            Transformer::Decoder(m) => m.digest(),
        }
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        match self {
            Transformer::Encoder(m) => &m.tokenizer,
            Transformer::Decoder(m) => &m.tokenizer,
        }
    }
}

/// A borrowed model of either kind: what the plan, the servers and the
/// client take, so that callers holding a [`Model`] or a [`Decoder`] pass
/// it as it is.
#[derive(Clone, Copy, Debug)]
pub enum ModelRef<'a> {
    /// A BERT encoder.
    Encoder(&'a Model),
    /// A causal decoder.
    Decoder(&'a Decoder),
}

impl ModelRef<'_> {
    /// The model's label.
    pub fn name(&self) -> &str {
        match self {
            ModelRef::Encoder(m) => &m.name,
            ModelRef::Decoder(m) => &m.name,
        }
    }
}

impl<'a> From<&'a Model> for ModelRef<'a> {
    fn from(m: &'a Model) -> ModelRef<'a> {
        ModelRef::Encoder(m)
    }
}

impl<'a> From<&'a Decoder> for ModelRef<'a> {
    fn from(m: &'a Decoder) -> ModelRef<'a> {
        ModelRef::Decoder(m)
    }
}

impl<'a> From<&'a Transformer> for ModelRef<'a> {
    fn from(m: &'a Transformer) -> ModelRef<'a> {
        match m {
            Transformer::Encoder(m) => ModelRef::Encoder(m),
            Transformer::Decoder(m) => ModelRef::Decoder(m),
        }
    }
}

/// Why a model could not be loaded, written or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// A file the model needs is not there.
    #[error("missing file {}", path.display())]
    MissingFile {
        /// The path that was looked for.
        path: PathBuf,
    },
    /// A file could not be read or written.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        error: std::io::Error,
    },
    /// A JSON file is malformed or lacks a field.
    #[error("{}: {message}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The safetensors file itself is malformed.
    #[error("{}: not a valid safetensors file: {message}", path.display())]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What the safetensors parser said.
        message: String,
    },
    /// `model_type` (or a sentence-transformers module, or a position
    /// embedding type) is not one this crate implements.
    #[error(
        "unsupported architecture: {0} (supported: BERT encoders with absolute positions, \
         Llama and GPT-2 decoders)"
    )]
    UnsupportedArchitecture(String),
    /// `hidden_act` is not a GeLU form.
    #[error("unsupported activation `{0}` (supported: gelu, gelu_new, gelu_pytorch_tanh)")]
    UnsupportedActivation(String),
    /// The pooling configuration asks for something other than mean or CLS.
    #[error(
        "unsupported pooling: {0} (supported: pooling_mode_mean_tokens or pooling_mode_cls_token alone)"
    )]
    UnsupportedPooling(String),
    /// A weight tensor is stored in a dtype other than F32, F16 or BF16.
    #[error("tensor {tensor} has dtype {dtype}; supported: F32, F16, BF16")]
    UnsupportedDtype {
        /// The tensor's name in the file.
        tensor: String,
        /// Its dtype as safetensors names it.
        dtype: String,
    },
    /// A weight tensor the architecture needs is absent.
    #[error(
        "tensor {0} is missing (looked for it bare and under the architecture's prefix: \
         `bert.`, `model.` or `transformer.`)"
    )]
    MissingTensor(String),
    /// A tensor's shape disagrees with `config.json`.
    #[error("tensor {tensor} has shape {got:?}; the config implies {want:?}")]
    WrongShape {
        /// The tensor's name in the file.
        tensor: String,
        /// The shape the configuration implies.
        want: Vec<usize>,
        /// The shape in the file.
        got: Vec<usize>,
    },
    /// The configuration is inconsistent (see [`Config::check`]).
    #[error("invalid model configuration: {0}")]
    InvalidConfig(String),
    /// The tokenizer could not be built or could not encode a text.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A token sequence is longer than the model accepts.
    #[error("{len} tokens, but the model accepts at most {max}")]
    TooManyTokens {
        /// The sequence's length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A token id is outside the vocabulary.
    #[error("token id {token} at position {position} is outside the vocabulary of {vocab_size}")]
    TokenOutOfRange {
        /// The offending id.
        token: u32,
        /// Where it is in the sequence.
        position: usize,
        /// The vocabulary size.
        vocab_size: usize,
    },
    /// A sequence with no tokens, which has no embedding.
    #[error("empty token sequence (a sequence needs at least one token)")]
    EmptySequence,
    /// A GGUF file is malformed or lacks what the model needs.
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
    /// A chat template does not compile or does not render.
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// A GGUF file holds a model this crate does not run (another
    /// architecture, RoPE scaling, tensors the architecture has no place
    /// for).
    #[error("unsupported GGUF model: {0}")]
    UnsupportedGguf(String),
}

impl Model {
    /// Loads a Hugging Face BERT checkpoint folder: `config.json`,
    /// `model.safetensors` and `tokenizer.json`, plus, when present,
    /// `modules.json`, the pooling module's `config.json` and
    /// `sentence_bert_config.json` (see [`Pooling`] for the default).
    ///
    /// Tensor names may carry a `bert.` prefix; F16 and BF16 weights are
    /// widened to f32; every shape is checked against the config; the pooler
    /// head is ignored. The model is named after the folder.
    pub fn load(dir: &Path) -> Result<Model, ModelError> {
        checkpoint::load(dir)
    }

    /// A model with deterministic pseudo-random weights of realistic scale
    /// for `config`, and a character-level tokenizer that encodes any text.
    /// The same `(config, seed)` gives the same model on every platform.
    ///
    /// # Panics
    ///
    /// If `config` fails [`Config::check`]: a generated configuration is
    /// written by a programmer, not read from a user's file.
    pub fn generated(config: Config, seed: u64) -> Model {
        generate::model(config, seed)
    }

    /// The embedded default model: [`Model::generated`] on [`Config::demo`]
    /// with a fixed seed. Needs no files.
    pub fn demo() -> Model {
        let mut model = Model::generated(Config::demo(), generate::DEMO_SEED);
        model.name = "demo".to_string();
        model
    }

    /// The built-in models, by name: `demo` ([`Model::demo`]), and
    /// generated models with real architectures' shapes, for measuring
    /// cost without a download: `generated-bert-base`
    /// ([`Config::bert_base`]) and `generated-minilm` ([`Config::minilm`]).
    /// Their weights are random at BERT's initialization scale, so they
    /// compute nothing meaningful, but every step, width bound and key has
    /// the shape the real checkpoint would give.
    pub fn builtin(name: &str) -> Option<Model> {
        let config = match name {
            "demo" => return Some(Model::demo()),
            "generated-bert-base" => Config::bert_base(),
            "generated-minilm" => Config::minilm(),
            _ => return None,
        };
        let mut model = Model::generated(config, generate::DEMO_SEED);
        model.name = name.to_string();
        Some(model)
    }

    /// The names [`Model::builtin`] knows.
    pub const BUILTIN: [&'static str; 3] = ["demo", "generated-bert-base", "generated-minilm"];

    /// Writes the model as a Hugging Face / sentence-transformers folder
    /// (F32 tensors under Hugging Face names), creating `dir` if needed.
    /// [`Model::load`] of the folder gives back this model exactly, except
    /// that its name becomes the folder's name.
    pub fn write_dir(&self, dir: &Path) -> Result<(), ModelError> {
        checkpoint::write_dir(self, dir)
    }

    /// SHA-256 of everything that determines the model's outputs from token
    /// ids: the config fields, then every tensor in canonical order (name,
    /// shape, little-endian f32 bits). Identifies the model in plans and key
    /// files. The name and the tokenizer are not included. Hashes every
    /// weight, so it costs a pass over the model (tens of ms for MiniLM).
    pub fn digest(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(b"suffuse model digest v1\0");
        let c = &self.config;
        for v in [
            c.vocab_size,
            c.hidden,
            c.layers,
            c.heads,
            c.intermediate,
            c.max_positions,
            c.type_vocab,
            c.max_tokens,
        ] {
            h.update((v as u64).to_le_bytes());
        }
        h.update(c.ln_eps.to_bits().to_le_bytes());
        h.update([
            match c.activation {
                Activation::GeluErf => 0,
                Activation::GeluTanh => 1,
            },
            match c.pooling {
                Pooling::Mean => 0,
                Pooling::Cls => 1,
            },
            u8::from(c.normalize),
        ]);
        self.for_each_tensor(|name, shape, data| {
            h.update((name.len() as u64).to_le_bytes());
            h.update(name.as_bytes());
            h.update((shape.len() as u64).to_le_bytes());
            for &d in shape {
                h.update((d as u64).to_le_bytes());
            }
            // Batched so the hasher sees large updates rather than 4 bytes
            // at a time.
            let mut buf = [0u8; 4096];
            for chunk in data.chunks(buf.len() / 4) {
                for (dst, v) in buf.chunks_exact_mut(4).zip(chunk) {
                    dst.copy_from_slice(&v.to_le_bytes());
                }
                h.update(&buf[..chunk.len() * 4]);
            }
        });
        let mut norms = vec![self.embeddings.norm.eps];
        for l in &self.layers {
            norms.extend([l.attn_norm.eps, l.ffn_norm.eps]);
        }
        for eps in norms {
            h.update(eps.to_bits().to_le_bytes());
        }
        h.finalize().into()
    }

    /// The client-side part of the model: for each token, word + position +
    /// token-type-0 embeddings, then the embedding LayerNorm. Returns
    /// `[len × hidden]`, row-major.
    pub fn embed_tokens(&self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        let c = &self.config;
        self.check_tokens(tokens)?;
        let h = c.hidden;
        let mut out = vec![0.0f32; tokens.len() * h];
        for (pos, (&t, row)) in tokens.iter().zip(out.chunks_exact_mut(h)).enumerate() {
            let word = &self.embeddings.word[t as usize * h..][..h];
            let position = &self.embeddings.position[pos * h..][..h];
            let token_type = &self.embeddings.token_type[..h];
            for (((o, &w), &p), &y) in row.iter_mut().zip(word).zip(position).zip(token_type) {
                // The order of the additions is PyTorch's:
                // (word + token_type) + position.
                *o = (w + y) + p;
            }
            self.embeddings.norm.apply(row);
        }
        Ok(out)
    }

    /// Checks that `tokens` is non-empty, fits the position table and only
    /// holds ids inside the vocabulary.
    pub fn check_tokens(&self, tokens: &[u32]) -> Result<(), ModelError> {
        let c = &self.config;
        if tokens.is_empty() {
            return Err(ModelError::EmptySequence);
        }
        if tokens.len() > c.max_positions {
            return Err(ModelError::TooManyTokens {
                len: tokens.len(),
                max: c.max_positions,
            });
        }
        if let Some((position, &token)) = tokens
            .iter()
            .enumerate()
            .find(|&(_, &t)| t as usize >= c.vocab_size)
        {
            return Err(ModelError::TokenOutOfRange {
                token,
                position,
                vocab_size: c.vocab_size,
            });
        }
        Ok(())
    }

    /// Visits every weight tensor in the canonical order (embeddings, then
    /// each layer in order), named as in a Hugging Face checkpoint without
    /// the `bert.` prefix but shaped and laid out as this crate stores it:
    /// linear weights are `[inputs, outputs]`.
    fn for_each_tensor(&self, mut f: impl FnMut(&str, &[usize], &[f32])) {
        let e = &self.embeddings;
        let c = &self.config;
        f(
            "embeddings.word_embeddings.weight",
            &[c.vocab_size, c.hidden],
            &e.word,
        );
        f(
            "embeddings.position_embeddings.weight",
            &[c.max_positions, c.hidden],
            &e.position,
        );
        f(
            "embeddings.token_type_embeddings.weight",
            &[c.type_vocab, c.hidden],
            &e.token_type,
        );
        f("embeddings.LayerNorm.weight", &[c.hidden], &e.norm.gamma);
        f("embeddings.LayerNorm.bias", &[c.hidden], &e.norm.beta);
        for (i, l) in self.layers.iter().enumerate() {
            for (part, lin) in [
                ("attention.self.query", &l.query),
                ("attention.self.key", &l.key),
                ("attention.self.value", &l.value),
                ("attention.output.dense", &l.attn_out),
                ("intermediate.dense", &l.ffn_in),
                ("output.dense", &l.ffn_out),
            ] {
                f(
                    &format!("encoder.layer.{i}.{part}.weight"),
                    &[lin.inputs, lin.outputs],
                    &lin.w.values(),
                );
                f(
                    &format!("encoder.layer.{i}.{part}.bias"),
                    &[lin.outputs],
                    &lin.b,
                );
            }
            for (part, norm) in [
                ("attention.output.LayerNorm", &l.attn_norm),
                ("output.LayerNorm", &l.ffn_norm),
            ] {
                f(
                    &format!("encoder.layer.{i}.{part}.weight"),
                    &[c.hidden],
                    &norm.gamma,
                );
                f(
                    &format!("encoder.layer.{i}.{part}.bias"),
                    &[c.hidden],
                    &norm.beta,
                );
            }
        }
    }
}

impl Norm {
    /// LayerNorm of one row in place, with the biased variance as PyTorch
    /// computes it.
    pub fn apply(&self, row: &mut [f32]) {
        let n = row.len() as f32;
        let mean = row.iter().sum::<f32>() / n;
        let var = row.iter().map(|&x| (x - mean) * (x - mean)).sum::<f32>() / n;
        let inv = 1.0 / libm::sqrtf(var + self.eps);
        for ((x, &g), &b) in row.iter_mut().zip(&self.gamma).zip(&self.beta) {
            *x = (*x - mean) * inv * g + b;
        }
    }
}

// Shapes only: the derived forms would print every weight.
impl std::fmt::Debug for Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kept = match self {
            Matrix::Held(_) => "held",
            Matrix::Stored(_) => "in its file",
        };
        write!(f, "Matrix({} weights, {kept})", self.len())
    }
}

impl std::fmt::Debug for Linear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Linear({} → {})", self.inputs, self.outputs)
    }
}

impl std::fmt::Debug for Norm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Norm({}, eps {:e})", self.gamma.len(), self.eps)
    }
}

impl std::fmt::Debug for Embeddings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embeddings")
            .field("word", &self.word.len())
            .field("position", &self.position.len())
            .field("token_type", &self.token_type.len())
            .field("norm", &self.norm)
            .finish()
    }
}
