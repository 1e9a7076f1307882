//! GGUF, llama.cpp's single-file model format: metadata (hyper-parameters,
//! the tokenizer, the chat template) and tensors, some block-quantized.
//!
//! ```text
//! "GGUF" · version u32 (2 or 3) · tensor count u64 · metadata count u64
//! metadata:  key (u64 length + UTF-8) · value type u32 · value
//! tensors:   name · dims u32 · ne[dims] u64 (ne[0] varies fastest) · type u32 · offset u64
//! padding to `general.alignment` (default 32) · tensor data
//! ```
//!
//! Everything is little-endian. A value is one of twelve scalar types, a
//! string (u64 length + bytes), or an array (element type u32, count u64,
//! elements), arrays of arrays included. Tensor offsets count from the start
//! of the data section and are multiples of the alignment.
//!
//! Decisions (see `docs/DECODERS.md`):
//! - Our own reader, not a crate: the crates on crates.io either stop at
//!   the metadata (`gguf`, `gguf-rs`) or come with a whole tensor library
//!   (`candle-core`), and none claims to survive hostile input. This one is
//!   about 1,100 lines with docs, fuzzed (`fuzz/fuzz_targets/gguf.rs`), and every
//!   count and size it reads is checked against the bytes that remain
//!   before anything is allocated, so a malformed file gives a
//!   [`GgufError`], never a panic or a huge allocation.
//! - The file is read into memory, not mapped: host allows `unsafe` only
//!   for mapping key sections, and the weights are dequantized to f32 at
//!   load time anyway, which needs several times the file's size.
//! - Version 1 (u32 counts) is refused, as llama.cpp does. Big-endian files
//!   (version 3 written byte-swapped) are recognised and refused.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

mod gemma3;
mod llama;
pub use llama::gguf_in;
mod parse;
mod quant;
mod qwen2;
mod spm;
mod tokenizer;
mod write;

pub use quant::TensorType;
pub use spm::Spm;
pub use write::Writer;

/// The `general.alignment` llama.cpp assumes when the key is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// A metadata value's type, with its id in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // the names are the format's
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)] // one variant per [`ValueType`]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    /// The element type (kept for empty arrays) and the elements, each of
    /// that type.
    Array(ValueType, Vec<Value>),
}

impl Value {
    /// The value's type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F32(_) => ValueType::F32,
            Value::F64(_) => ValueType::F64,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(..) => ValueType::Array,
        }
    }

    /// Any integer type holding a value that fits `u64`: writers differ in
    /// the width they choose for the same key (llama.cpp writes u32, others
    /// i32 or u64).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// An `F32`, or an `F64` narrowed to f32.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// A string's text.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// An array's elements.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(_, items) => Some(items),
            _ => None,
        }
    }
}

/// Where a tensor is and what it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Its name (`blk.0.attn_q.weight`).
    pub name: String,
    /// ggml's `ne`: `dims[0]` varies fastest, so a PyTorch `[out, in]`
    /// matrix is `[in, out]` here.
    pub dims: Vec<u64>,
    /// How its elements are stored.
    pub ty: TensorType,
    /// Where its bytes start, counted from the start of the file.
    pub start: usize,
    /// How many bytes it occupies.
    pub len: usize,
}

impl TensorInfo {
    /// The number of elements (1 for a tensor with no dimensions).
    pub fn elements(&self) -> u64 {
        // The parser proved that this product fits.
        self.dims.iter().product()
    }
}

/// Why a GGUF file was refused. Offsets are byte positions in the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file could not be read.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        error: std::io::Error,
    },
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file (the first four bytes are not `GGUF`)")]
    BadMagic,
    /// A version other than 2 or 3.
    #[error("GGUF version {0} is not supported (supported: 2, 3)")]
    UnsupportedVersion(u32),
    /// Version 3 written big-endian.
    #[error("a big-endian GGUF file; only little-endian files are supported")]
    BigEndian,
    /// The file ends inside something, or a count or length promises more
    /// bytes than the file has left.
    #[error("truncated: {what} at byte {offset} needs more bytes than the file has")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Where it starts.
        offset: u64,
    },
    /// A value type id outside the format's 0–12.
    #[error("unknown metadata value type {id} at byte {offset}")]
    BadValueType {
        /// The id found.
        id: u32,
        /// Where it is.
        offset: u64,
    },
    /// Arrays nested deeper than `parse::MAX_DEPTH`.
    #[error("arrays nested more than {} deep at byte {offset}", parse::MAX_DEPTH)]
    TooDeep {
        /// Where the innermost array starts.
        offset: u64,
    },
    /// A string is not UTF-8.
    #[error("the string at byte {offset} is not UTF-8")]
    NotUtf8 {
        /// Where it starts.
        offset: u64,
    },
    /// A metadata key is empty.
    #[error("an empty metadata key at byte {offset}")]
    EmptyKey {
        /// Where it starts.
        offset: u64,
    },
    /// A metadata key occurs twice.
    #[error("metadata key `{0}` occurs twice")]
    DuplicateKey(String),
    /// `general.alignment` is not a u32 power of two.
    #[error("general.alignment must be a u32 power of two, found {0}")]
    BadAlignment(String),
    /// A tensor name occurs twice.
    #[error("tensor `{0}` occurs twice")]
    DuplicateTensor(String),
    /// A tensor has more than four dimensions.
    #[error("tensor `{tensor}` has {dims} dimensions (at most 4)")]
    TooManyDims {
        /// The tensor.
        tensor: String,
        /// Its dimension count.
        dims: u32,
    },
    /// A ggml type id this reader does not know the block size of.
    #[error("tensor `{tensor}` has unknown ggml type {id}")]
    UnknownType {
        /// The tensor.
        tensor: String,
        /// The id found.
        id: u32,
    },
    /// A row length that is not a whole number of the type's blocks.
    #[error(
        "tensor `{tensor}`: rows of {row} elements are not a multiple of {ty}'s block of {block}"
    )]
    PartialBlock {
        /// The tensor.
        tensor: String,
        /// `ne[0]`.
        row: u64,
        /// The type.
        ty: TensorType,
        /// Elements per block.
        block: u64,
    },
    /// A tensor's element count or byte size overflows.
    #[error("tensor `{0}` is too large to address")]
    TooLarge(String),
    /// A tensor's offset is not a multiple of the alignment.
    #[error("tensor `{tensor}` starts at data offset {offset}, not a multiple of {alignment}")]
    Misaligned {
        /// The tensor.
        tensor: String,
        /// Its offset in the data section.
        offset: u64,
        /// The alignment.
        alignment: u64,
    },
    /// A tensor's bytes run past the end of the file.
    #[error("tensor `{0}` runs past the end of the file")]
    OutOfBounds(String),
    /// A metadata key the caller needs is absent.
    #[error("metadata key `{0}` is missing")]
    MissingKey(String),
    /// A metadata key has a type the caller cannot use.
    #[error("metadata key `{key}` is {found:?}; expected {expected}")]
    WrongType {
        /// The key.
        key: String,
        /// What it is.
        found: ValueType,
        /// What was expected.
        expected: &'static str,
    },
    /// A tensor the caller needs is absent.
    #[error("tensor `{0}` is missing")]
    MissingTensor(String),
    /// A tensor in a type this crate cannot dequantize.
    #[error(
        "tensor `{tensor}` is {ty}; dequantization supports F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K"
    )]
    Unsupported {
        /// The tensor.
        tensor: String,
        /// Its type.
        ty: TensorType,
    },
}

/// A parsed GGUF file, holding its bytes.
pub struct Gguf {
    bytes: Vec<u8>,
    version: u32,
    alignment: u64,
    metadata: Vec<(String, Value)>,
    keys: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    names: HashMap<String, usize>,
}

impl Gguf {
    /// Reads and parses a file.
    pub fn open(path: &Path) -> Result<Gguf, GgufError> {
        let bytes = super::files::read_whole(path).map_err(|error| GgufError::Io {
            path: path.to_path_buf(),
            error,
        })?;
        Gguf::from_bytes(bytes)
    }

    /// Parses a whole file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Gguf, GgufError> {
        let header = parse::header(&bytes)?;
        let keys = index(header.metadata.iter().map(|(k, _)| k));
        let names = index(header.tensors.iter().map(|t| &t.name));
        Ok(Gguf {
            bytes,
            version: header.version,
            alignment: header.alignment,
            metadata: header.metadata,
            keys,
            tensors: header.tensors,
            names,
        })
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The data alignment in bytes.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Every metadata entry, in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// A metadata value.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.keys.get(key).map(|&i| &self.metadata[i].1)
    }

    /// A metadata value that must be present.
    pub fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    /// A non-negative integer that fits `usize`, stored in any integer type.
    pub fn usize(&self, key: &str) -> Result<usize, GgufError> {
        let v = self.require(key)?;
        v.as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| wrong(key, v, "a non-negative integer"))
    }

    /// A float stored as F32 or F64.
    pub fn f32(&self, key: &str) -> Result<f32, GgufError> {
        let v = self.require(key)?;
        v.as_f32().ok_or_else(|| wrong(key, v, "a float"))
    }

    /// A string.
    pub fn str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| wrong(key, v, "a string"))
    }

    /// An array of strings.
    pub fn strings(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        let v = self.require(key)?;
        v.as_array()
            .and_then(|items| items.iter().map(Value::as_str).collect())
            .ok_or_else(|| wrong(key, v, "an array of strings"))
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// A tensor's description.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.names.get(name).map(|&i| &self.tensors[i])
    }

    /// A tensor's stored bytes.
    pub fn bytes(&self, info: &TensorInfo) -> &[u8] {
        // `start..start + len` was checked against the file when parsing;
        // `get` keeps a foreign `TensorInfo` from panicking.
        self.bytes
            .get(info.start..info.start.saturating_add(info.len))
            .unwrap_or(&[])
    }

    /// A tensor's values in f32, in ggml's order (`ne[0]` fastest),
    /// dequantized exactly as ggml's reference code does.
    pub fn dequantize(&self, name: &str) -> Result<Vec<f32>, GgufError> {
        let info = self
            .tensor(name)
            .ok_or_else(|| GgufError::MissingTensor(name.to_string()))?;
        quant::dequantize(info.ty, self.bytes(info)).ok_or_else(|| GgufError::Unsupported {
            tensor: info.name.clone(),
            ty: info.ty,
        })
    }
}

/// A matrix left in its GGUF file ([`crate::model::Matrix::Stored`]): a
/// tensor with `ne = [inputs, outputs]`, stored as `outputs` rows of
/// `inputs` values each, every row a whole number of its type's blocks.
#[derive(Clone)]
pub struct Stored {
    file: Arc<Gguf>,
    tensor: usize,
    inputs: usize,
    outputs: usize,
    /// Hashes of the values in file order and transposed, once computed:
    /// the bytes never change, and clones read the same tensor.
    hashes: Arc<[OnceLock<[u8; 32]>; 2]>,
}

/// Output rows dequantized together before they are written transposed,
/// so that each write of [`Stored::values`] is a run of this many values.
const ROWS_AT_ONCE: usize = 64;

impl Stored {
    /// Tensor `name` of `file`, if it has `ne = [inputs, outputs]`, a type
    /// [`Gguf::dequantize`] reads, and rows of whole blocks; `None`
    /// otherwise (the caller then dequantizes it whole, and reports what
    /// is wrong with it).
    pub fn new(file: &Arc<Gguf>, name: &str, inputs: usize, outputs: usize) -> Option<Self> {
        let tensor = *file.names.get(name)?;
        let info = &file.tensors[tensor];
        let (block, block_bytes) = info.ty.block();
        let dims = [inputs as u64, outputs as u64];
        let whole_rows = block > 0 && (inputs as u64).is_multiple_of(block);
        // In u128: a row's bytes need not fit 64 bits where there are no
        // rows (`[2^63, 0]`).
        let row_bytes = u128::from(inputs as u64 / block.max(1)) * u128::from(block_bytes);
        let sized = row_bytes * outputs as u128 == info.len as u128;
        (info.dims == dims && whole_rows && sized && quant::dequantizes(info.ty)).then(|| Stored {
            file: file.clone(),
            tensor,
            inputs,
            outputs,
            hashes: Arc::default(),
        })
    }

    /// The [`crate::model::tensor_hash`] of [`Stored::values`]
    /// (`transposed`) or of the rows in file order, computed the first
    /// time it is asked for.
    pub fn hash(&self, transposed: bool) -> [u8; 32] {
        *self.hashes[usize::from(transposed)].get_or_init(|| {
            use crate::model::tensor_hash;
            match transposed {
                true => tensor_hash(self.len(), |f| f(&self.values())),
                false => tensor_hash(self.len(), |f| self.for_each_row(f)),
            }
        })
    }

    /// The values, `[inputs × outputs]`: row `i` holds input `i`'s weight
    /// to every output, each as [`Gguf::dequantize`] gives it.
    pub fn values(&self) -> Vec<f32> {
        let outputs = self.outputs;
        let mut w = vec![0.0f32; self.len()];
        self.for_each_weight(|i, o, v| w[i * outputs + o] = v);
        w
    }

    /// `f(i, o, w)` for every weight `w` of input `i` to output `o`: a few
    /// output rows are dequantized at once and visited input by input, so
    /// that a caller writing `[inputs × outputs]` writes runs of them.
    pub fn for_each_weight(&self, mut f: impl FnMut(usize, usize, f32)) {
        let inputs = self.inputs;
        self.chunks(|o0, values| {
            let n = values.len() / inputs.max(1);
            for i in 0..inputs {
                for r in 0..n {
                    f(i, o0 + r, values[r * inputs + i]);
                }
            }
        });
    }

    /// Row `o` as the file stores it (output `o`'s `inputs` weights, or
    /// token `o`'s embedding), or `None` past the last row.
    pub fn row(&self, o: usize) -> Option<Vec<f32>> {
        let (ty, bytes, row_bytes) = self.bytes();
        let row = bytes.get(o.checked_mul(row_bytes)?..)?.get(..row_bytes)?;
        (o < self.outputs).then(|| quant::dequantize(ty, row).unwrap_or_default())
    }

    /// Every row in file order, `[outputs × inputs]`, handed to `f` one
    /// at a time.
    pub fn for_each_row(&self, mut f: impl FnMut(&[f32])) {
        self.chunks(|_, values| values.chunks_exact(self.inputs.max(1)).for_each(&mut f));
    }

    /// [`ROWS_AT_ONCE`] rows at a time, dequantized, with the first's
    /// index.
    fn chunks(&self, mut f: impl FnMut(usize, &[f32])) {
        let (ty, bytes, row_bytes) = self.bytes();
        for (chunk, rows) in bytes.chunks(row_bytes.max(1) * ROWS_AT_ONCE).enumerate() {
            // `new` proved the type dequantizes and the rows are whole.
            f(
                chunk * ROWS_AT_ONCE,
                &quant::dequantize(ty, rows).unwrap_or_default(),
            );
        }
    }

    /// The tensor's type, its bytes and the bytes of one row.
    fn bytes(&self) -> (TensorType, &[u8], usize) {
        let info = &self.file.tensors[self.tensor];
        let bytes = self.file.bytes(info);
        (info.ty, bytes, bytes.len() / self.outputs.max(1))
    }

    /// Number of weights.
    pub fn len(&self) -> usize {
        self.inputs * self.outputs
    }

    /// Whether it has no weights.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl std::fmt::Debug for Gguf {
    // The derived form would print the tensor bytes and the vocabulary.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf")
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

fn index<'a>(names: impl Iterator<Item = &'a String>) -> HashMap<String, usize> {
    names.enumerate().map(|(i, n)| (n.clone(), i)).collect()
}

fn wrong(key: &str, v: &Value, expected: &'static str) -> GgufError {
    GgufError::WrongType {
        key: key.to_string(),
        found: v.value_type(),
        expected,
    }
}

#[cfg(test)]
mod tests;
