//! The GGUF header: magic, version, metadata and tensor descriptions.
//!
//! Every read goes through [`Cursor`], which refuses to step past the end,
//! and every count read from the file is checked against the bytes left
//! (each element takes at least one byte) before a vector is reserved, so
//! neither a truncated nor a lying file can panic or make us allocate more
//! than the file's own size.

use std::collections::HashSet;

use super::quant::TensorType;
use super::{DEFAULT_ALIGNMENT, GgufError, TensorInfo, Value, ValueType};

/// How deep arrays of arrays may nest; deeper files are refused rather than
/// recursed into (llama.cpp refuses any nesting; the format allows it).
pub(crate) const MAX_DEPTH: usize = 4;

/// ggml's limit on tensor dimensions.
const MAX_DIMS: u32 = 4;

const MAGIC: &[u8; 4] = b"GGUF";

/// The parsed header: everything before the tensor data.
pub(super) struct Header {
    pub version: u32,
    pub alignment: u64,
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
}

/// Parses the header of a whole file and checks every tensor against it.
pub(super) fn header(bytes: &[u8]) -> Result<Header, GgufError> {
    let mut c = Cursor { bytes, pos: 0 };
    if c.take(4, "magic")? != MAGIC {
        return Err(GgufError::BadMagic);
    }
    let version = c.u32("version")?;
    match version {
        2 | 3 => {}
        // Version 3 with its bytes swapped, as a big-endian writer leaves it.
        0x0300_0000 => return Err(GgufError::BigEndian),
        other => return Err(GgufError::UnsupportedVersion(other)),
    }
    let n_tensors = c.u64("tensor count")?;
    let n_kv = c.u64("metadata count")?;
    let metadata = metadata(&mut c, n_kv)?;
    let alignment = alignment(&metadata)?;
    let raw = tensor_infos(&mut c, n_tensors)?;
    // The data section starts at the next multiple of the alignment.
    let data_start = c.pos.next_multiple_of(to_usize(alignment));
    let tensors = raw
        .into_iter()
        .map(|t| t.place(data_start, alignment, bytes.len()))
        .collect::<Result<_, _>>()?;
    Ok(Header {
        version,
        alignment,
        metadata,
        tensors,
    })
}

fn metadata(c: &mut Cursor<'_>, count: u64) -> Result<Vec<(String, Value)>, GgufError> {
    // A key-value pair takes at least 8 (key length) + 1 + 4 + 1 bytes.
    let mut out = Vec::with_capacity(c.bounded(count, 14));
    let mut seen = HashSet::new();
    for _ in 0..count {
        let at = c.offset();
        let key = c.string("metadata key")?;
        if key.is_empty() {
            return Err(GgufError::EmptyKey { offset: at });
        }
        if !seen.insert(key.clone()) {
            return Err(GgufError::DuplicateKey(key));
        }
        let ty = c.value_type()?;
        let value = c.value(ty, 0)?;
        out.push((key, value));
    }
    Ok(out)
}

/// `general.alignment`, which llama.cpp requires to be a u32 power of two.
fn alignment(metadata: &[(String, Value)]) -> Result<u64, GgufError> {
    let found = metadata.iter().find(|(k, _)| k == "general.alignment");
    match found.map(|(_, v)| v) {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(Value::U32(a)) if a.is_power_of_two() => Ok(u64::from(*a)),
        Some(other) => Err(GgufError::BadAlignment(format!("{other:?}"))),
    }
}

/// A tensor description as read, before it is placed in the file.
struct RawTensor {
    name: String,
    dims: Vec<u64>,
    ty: TensorType,
    offset: u64,
    len: u64,
}

fn tensor_infos(c: &mut Cursor<'_>, count: u64) -> Result<Vec<RawTensor>, GgufError> {
    // A description takes at least 8 + 4 + 4 + 8 bytes.
    let mut out = Vec::with_capacity(c.bounded(count, 24));
    let mut seen = HashSet::new();
    for _ in 0..count {
        let name = c.string("tensor name")?;
        if !seen.insert(name.clone()) {
            return Err(GgufError::DuplicateTensor(name));
        }
        let n_dims = c.u32("dimension count")?;
        if n_dims > MAX_DIMS {
            return Err(GgufError::TooManyDims {
                tensor: name,
                dims: n_dims,
            });
        }
        let dims = (0..n_dims)
            .map(|_| c.u64("dimension"))
            .collect::<Result<Vec<_>, _>>()?;
        let id = c.u32("tensor type")?;
        let ty = TensorType::from_id(id).ok_or_else(|| GgufError::UnknownType {
            tensor: name.clone(),
            id,
        })?;
        let offset = c.u64("tensor offset")?;
        let len = byte_len(&name, &dims, ty)?;
        out.push(RawTensor {
            name,
            dims,
            ty,
            offset,
            len,
        });
    }
    Ok(out)
}

/// The bytes a tensor occupies: whole blocks per row, checked for overflow.
fn byte_len(name: &str, dims: &[u64], ty: TensorType) -> Result<u64, GgufError> {
    let too_large = || GgufError::TooLarge(name.to_string());
    let elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(too_large)?;
    let (block, block_bytes) = ty.block();
    let row = dims.first().copied().unwrap_or(1);
    if row % block != 0 {
        return Err(GgufError::PartialBlock {
            tensor: name.to_string(),
            row,
            ty,
            block,
        });
    }
    (elements / block)
        .checked_mul(block_bytes)
        .ok_or_else(too_large)
}

impl RawTensor {
    /// Turns the data-relative offset into a checked range of the file.
    fn place(
        self,
        data_start: usize,
        alignment: u64,
        file_len: usize,
    ) -> Result<TensorInfo, GgufError> {
        if !self.offset.is_multiple_of(alignment) {
            return Err(GgufError::Misaligned {
                tensor: self.name,
                offset: self.offset,
                alignment,
            });
        }
        let range = usize::try_from(self.offset)
            .ok()
            .and_then(|o| o.checked_add(data_start))
            .zip(usize::try_from(self.len).ok())
            .filter(|&(start, len)| start.checked_add(len).is_some_and(|end| end <= file_len));
        let Some((start, len)) = range else {
            return Err(GgufError::OutOfBounds(self.name));
        };
        Ok(TensorInfo {
            name: self.name,
            dims: self.dims,
            ty: self.ty,
            start,
            len,
        })
    }
}

/// A read position in the file that never steps past its end.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// How many elements of at least `min_size` bytes to reserve room for:
    /// never more than the rest of the file could hold.
    fn bounded(&self, count: u64, min_size: usize) -> usize {
        usize::try_from(count)
            .unwrap_or(usize::MAX)
            .min(self.remaining() / min_size)
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], GgufError> {
        let start = self.pos;
        let out = start
            .checked_add(n)
            .and_then(|end| self.bytes.get(start..end))
            .ok_or(GgufError::Truncated {
                what,
                offset: self.offset(),
            })?;
        self.pos = start + n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A u64 length, then that many UTF-8 bytes.
    fn string(&mut self, what: &'static str) -> Result<String, GgufError> {
        let at = self.offset();
        let len = self.u64(what)?;
        let len = usize::try_from(len).map_err(|_| GgufError::Truncated { what, offset: at })?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::NotUtf8 { offset: at })
    }

    fn value_type(&mut self) -> Result<ValueType, GgufError> {
        let at = self.offset();
        let id = self.u32("value type")?;
        ValueType::from_id(id).ok_or(GgufError::BadValueType { id, offset: at })
    }

    /// One value of type `ty`; `depth` counts the arrays around it.
    fn value(&mut self, ty: ValueType, depth: usize) -> Result<Value, GgufError> {
        let what = "metadata value";
        Ok(match ty {
            ValueType::U8 => Value::U8(u8::from_le_bytes(self.array(what)?)),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array(what)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            ValueType::U32 => Value::U32(self.u32(what)?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            ValueType::U64 => Value::U64(self.u64(what)?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            // llama.cpp reads any non-zero byte as true; so do we.
            ValueType::Bool => Value::Bool(self.array::<1>(what)?[0] != 0),
            ValueType::String => Value::String(self.string(what)?),
            ValueType::Array => self.array_value(depth)?,
        })
    }

    fn array_value(&mut self, depth: usize) -> Result<Value, GgufError> {
        let at = self.offset();
        if depth >= MAX_DEPTH {
            return Err(GgufError::TooDeep { offset: at });
        }
        let elem = self.value_type()?;
        let count = self.u64("array length")?;
        let mut items = Vec::with_capacity(self.bounded(count, elem.min_size()));
        for _ in 0..count {
            items.push(self.value(elem, depth + 1)?);
        }
        Ok(Value::Array(elem, items))
    }
}

impl ValueType {
    fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        const ALL: [ValueType; 13] = [
            U8, I8, U16, I16, U32, I32, F32, Bool, String, Array, U64, I64, F64,
        ];
        ALL.get(usize::try_from(id).ok()?).copied()
    }

    /// The fewest bytes one value of this type takes in a file.
    fn min_size(self) -> usize {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// Alignments are u32 values, so they always fit.
fn to_usize(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}
