//! ggml tensor types: their block geometry, and dequantization of the ones
//! a Llama checkpoint of ours needs.
//!
//! A quantized type stores `block` consecutive elements of a row in
//! `block_bytes` bytes. The two block formats dequantized here (ggml's
//! `ggml-common.h` and `dequantize_row_*` in `ggml-quants.c`):
//!
//! ```text
//! Q8_0  d: f16 · q[32]: i8                 x_j = q_j · d
//! Q4_1  d: f16 · m: f16 · q[16]: u8        x_j = (q_j & 15) · d + m,  x_{j+16} = (q_j >> 4) · d + m
//! ```
//!
//! The products and sums are single f32 operations, unfused, exactly as
//! the C is written (`x0*d + m` with `int` `x0` converted to float), so the
//! result is bit for bit what ggml's reference code computes when the C
//! compiler does not contract it into an FMA, and what the `gguf` Python
//! package computes (checked by `tests/fixtures/make_smollm2.py`).

use crate::model::checkpoint::f16_to_f32;

/// A ggml tensor type, by its id in the file.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TensorType(u32);

/// (id, name, elements per block, bytes per block) for every type ggml
/// (2026-08) defines, from its `type_traits` and block structs. gguf-py's
/// `GGML_QUANT_SIZES` agrees except for Q8_1, where it says 40 bytes and
/// ggml's `static_assert` says 36; ggml reads the files, so 36. A type
/// absent here cannot be sized, so a file using it is refused with
/// [`super::GgufError::UnknownType`].
const TYPES: &[(u32, &str, u64, u64)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 36),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
    (40, "NVFP4", 64, 36),
    (41, "Q1_0", 128, 18),
    (42, "Q2_0", 64, 18),
];

impl TensorType {
    /// 32-bit IEEE floats.
    pub const F32: TensorType = TensorType(0);
    /// 16-bit IEEE floats.
    pub const F16: TensorType = TensorType(1);
    /// 4-bit quants with an f16 scale and an f16 minimum per 32.
    pub const Q4_1: TensorType = TensorType(3);
    /// 8-bit quants with an f16 scale per 32.
    pub const Q8_0: TensorType = TensorType(8);
    /// bfloat16: the top half of an f32.
    pub const BF16: TensorType = TensorType(30);

    /// The type with this id, if its geometry is known.
    pub fn from_id(id: u32) -> Option<TensorType> {
        TYPES.iter().any(|t| t.0 == id).then_some(TensorType(id))
    }

    /// Its id in the file.
    pub fn id(self) -> u32 {
        self.0
    }

    fn entry(self) -> (u32, &'static str, u64, u64) {
        // Only `from_id` and the constants above make a `TensorType`.
        TYPES
            .iter()
            .copied()
            .find(|t| t.0 == self.0)
            .unwrap_or((self.0, "?", 1, 1))
    }

    /// ggml's name for it (`Q4_1`).
    pub fn name(self) -> &'static str {
        self.entry().1
    }

    /// (elements per block, bytes per block).
    pub fn block(self) -> (u64, u64) {
        let (_, _, elements, bytes) = self.entry();
        (elements, bytes)
    }
}

impl std::fmt::Display for TensorType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::fmt::Debug for TensorType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The f32 values of `bytes` stored as `ty`, or `None` for a type this
/// crate does not dequantize. A trailing partial block is ignored; the
/// parser has already proved that a tensor's bytes are whole blocks.
pub(super) fn dequantize(ty: TensorType, bytes: &[u8]) -> Option<Vec<f32>> {
    let le16 = |b: &[u8]| u16::from_le_bytes([b[0], b[1]]);
    Some(match ty {
        TensorType::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        TensorType::F16 => bytes.chunks_exact(2).map(|b| f16_to_f32(le16(b))).collect(),
        TensorType::BF16 => bytes
            .chunks_exact(2)
            .map(|b| f32::from_bits(u32::from(le16(b)) << 16))
            .collect(),
        TensorType::Q8_0 => bytes.chunks_exact(34).flat_map(q8_0).collect(),
        TensorType::Q4_1 => bytes.chunks_exact(20).flat_map(q4_1).collect(),
        _ => return None,
    })
}

/// One Q8_0 block (34 bytes) to 32 values.
fn q8_0(block: &[u8]) -> [f32; 32] {
    let d = f16_to_f32(u16::from_le_bytes([block[0], block[1]]));
    std::array::from_fn(|j| f32::from(block[2 + j] as i8) * d)
}

/// One Q4_1 block (20 bytes) to 32 values: the low nibbles of the 16 quant
/// bytes are elements 0–15, the high nibbles 16–31.
fn q4_1(block: &[u8]) -> [f32; 32] {
    let d = f16_to_f32(u16::from_le_bytes([block[0], block[1]]));
    let m = f16_to_f32(u16::from_le_bytes([block[2], block[3]]));
    std::array::from_fn(|j| {
        let q = block[4 + j % 16];
        let nibble = if j < 16 { q & 0x0f } else { q >> 4 };
        f32::from(nibble) * d + m
    })
}
