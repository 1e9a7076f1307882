//! Writing GGUF files: the inverse of the parser, used to make test files
//! and to export models that were generated in code.

use super::quant::TensorType;
use super::{DEFAULT_ALIGNMENT, Value};

/// Collects metadata and tensors, then lays them out as a GGUF file.
#[derive(Clone, Debug)]
pub struct Writer {
    version: u32,
    metadata: Vec<(String, Value)>,
    tensors: Vec<Tensor>,
}

#[derive(Clone, Debug)]
struct Tensor {
    name: String,
    dims: Vec<u64>,
    ty: TensorType,
    bytes: Vec<u8>,
}

impl Default for Writer {
    fn default() -> Writer {
        Writer::new(3)
    }
}

impl Writer {
    /// An empty file of the given version (2 and 3 differ only in what
    /// readers accept; the layout is the same).
    pub fn new(version: u32) -> Writer {
        Writer {
            version,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Adds a metadata entry (`general.alignment`, a `U32`, sets the
    /// alignment the tensors are laid out with).
    pub fn meta(&mut self, key: &str, value: Value) -> &mut Writer {
        self.metadata.push((key.to_string(), value));
        self
    }

    /// Adds a tensor with its stored bytes; `dims` are ggml's `ne`
    /// (`dims[0]` varies fastest).
    pub fn tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        ty: TensorType,
        bytes: Vec<u8>,
    ) -> &mut Writer {
        self.tensors.push(Tensor {
            name: name.to_string(),
            dims: dims.to_vec(),
            ty,
            bytes,
        });
        self
    }

    /// The file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let alignment = self
            .metadata
            .iter()
            .find_map(|(k, v)| match v {
                Value::U32(a) if k == "general.alignment" && a.is_power_of_two() => {
                    Some(u64::from(*a))
                }
                _ => None,
            })
            .unwrap_or(DEFAULT_ALIGNMENT);
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_str(&mut out, key);
            out.extend((value.value_type() as u32).to_le_bytes());
            put_value(&mut out, value);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_str(&mut out, &t.name);
            out.extend((t.dims.len() as u32).to_le_bytes());
            t.dims.iter().for_each(|d| out.extend(d.to_le_bytes()));
            out.extend(t.ty.id().to_le_bytes());
            out.extend(offset.to_le_bytes());
            offset = (offset + t.bytes.len() as u64).next_multiple_of(alignment);
        }
        for t in &self.tensors {
            pad(&mut out, alignment);
            out.extend(&t.bytes);
        }
        out
    }
}

fn pad(out: &mut Vec<u8>, alignment: u64) {
    let len = (out.len() as u64).next_multiple_of(alignment);
    out.resize(len as usize, 0);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::U8(v) => out.extend(v.to_le_bytes()),
        Value::I8(v) => out.extend(v.to_le_bytes()),
        Value::U16(v) => out.extend(v.to_le_bytes()),
        Value::I16(v) => out.extend(v.to_le_bytes()),
        Value::U32(v) => out.extend(v.to_le_bytes()),
        Value::I32(v) => out.extend(v.to_le_bytes()),
        Value::U64(v) => out.extend(v.to_le_bytes()),
        Value::I64(v) => out.extend(v.to_le_bytes()),
        Value::F32(v) => out.extend(v.to_le_bytes()),
        Value::F64(v) => out.extend(v.to_le_bytes()),
        Value::Bool(v) => out.push(u8::from(*v)),
        Value::String(s) => put_str(out, s),
        Value::Array(elem, items) => {
            out.extend((*elem as u32).to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            items.iter().for_each(|v| put_value(out, v));
        }
    }
}
