//! ggml tensor types: their block geometry, and dequantization of the ones
//! a Llama checkpoint of ours needs.
//!
//! A quantized type stores `block` consecutive elements of a row in
//! `block_bytes` bytes. The block formats dequantized here (ggml's
//! `ggml-common.h` and `dequantize_row_*` in `ggml-quants.c`; j counts the
//! 32 elements of a small block, or of a 256-element super-block's
//! sub-block):
//!
//! ```text
//! Q8_0  d: f16 · q[32]: i8                 x_j = q_j · d
//! Q4_0  d: f16 · q[16]: u8                 x_j = ((q_j & 15) − 8) · d,  x_{j+16} = ((q_j >> 4) − 8) · d
//! Q4_1  d: f16 · m: f16 · q[16]: u8        x_j = (q_j & 15) · d + m,  x_{j+16} = (q_j >> 4) · d + m
//! Q5_0  d: f16 · h: u32 · q[16]: u8        as Q4_0 with bit j of h (bit j+16 for x_{j+16}) as bit 4, − 16
//! Q4_K  d, dmin: f16 · s[12] · q[128]      8 sub-blocks of 32 with 6-bit scale sc and min m from s:
//!                                          x = (d·sc) · nibble − (dmin·m)
//! Q5_K  d, dmin: f16 · s[12] · h[32] · q[128]   as Q4_K with a fifth bit from h
//! Q6_K  ql[128] · qh[64] · sc[16]: i8 · d: f16  16 sub-blocks of 16: x = (d·sc) · (q6 − 32)
//! ```
//!
//! The products and sums are single f32 operations, unfused, in the order
//! the C writes them (`x0*d + m` with `int` `x0` converted to float), so the
//! result is bit for bit what ggml's reference code computes when the C
//! compiler does not contract it into an FMA, and what the `gguf` Python
//! package computes (`tests/fixtures/make_smollm2.py` for Q4_1 and Q8_0 in a
//! real checkpoint; `tests/fixtures/make_kquants.py`'s known answers for
//! every type here).

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
    /// 4-bit quants with an f16 scale per 32.
    pub const Q4_0: TensorType = TensorType(2);
    /// 4-bit quants with an f16 scale and an f16 minimum per 32.
    pub const Q4_1: TensorType = TensorType(3);
    /// 5-bit quants with an f16 scale per 32.
    pub const Q5_0: TensorType = TensorType(6);
    /// 4-bit quants in 256-element super-blocks with 6-bit scales and mins.
    pub const Q4_K: TensorType = TensorType(12);
    /// 5-bit quants in 256-element super-blocks with 6-bit scales and mins.
    pub const Q5_K: TensorType = TensorType(13);
    /// 6-bit quants in 256-element super-blocks with 8-bit scales.
    pub const Q6_K: TensorType = TensorType(14);
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

/// Whether [`dequantize`] reads `ty`.
pub(super) fn dequantizes(ty: TensorType) -> bool {
    dequantize(ty, &[]).is_some()
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
        TensorType::Q4_0 => bytes.chunks_exact(18).flat_map(q4_0).collect(),
        TensorType::Q5_0 => bytes.chunks_exact(22).flat_map(q5_0).collect(),
        TensorType::Q4_K => bytes.chunks_exact(144).flat_map(q4_k).collect(),
        TensorType::Q5_K => bytes.chunks_exact(176).flat_map(q5_k).collect(),
        TensorType::Q6_K => bytes.chunks_exact(210).flat_map(q6_k).collect(),
        _ => return None,
    })
}

/// The f16 at `block[at..at + 2]`.
fn half(block: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([block[at], block[at + 1]]))
}

/// One Q8_0 block (34 bytes) to 32 values.
fn q8_0(block: &[u8]) -> [f32; 32] {
    let d = half(block, 0);
    std::array::from_fn(|j| f32::from(block[2 + j] as i8) * d)
}

/// One Q4_1 block (20 bytes) to 32 values: the low nibbles of the 16 quant
/// bytes are elements 0–15, the high nibbles 16–31.
fn q4_1(block: &[u8]) -> [f32; 32] {
    let (d, m) = (half(block, 0), half(block, 2));
    std::array::from_fn(|j| {
        let q = block[4 + j % 16];
        let nibble = if j < 16 { q & 0x0f } else { q >> 4 };
        f32::from(nibble) * d + m
    })
}

/// One Q4_0 block (18 bytes) to 32 values: nibbles as in Q4_1, centred on 8.
fn q4_0(block: &[u8]) -> [f32; 32] {
    let d = half(block, 0);
    std::array::from_fn(|j| {
        let q = block[2 + j % 16];
        let nibble = if j < 16 { q & 0x0f } else { q >> 4 };
        // ggml: an `int` difference, converted to float, times d.
        (i32::from(nibble) - 8) as f32 * d
    })
}

/// One Q5_0 block (22 bytes) to 32 values: Q4_0's nibbles with a fifth bit
/// from the 32-bit word `h` (bit j for element j), centred on 16.
fn q5_0(block: &[u8]) -> [f32; 32] {
    let d = half(block, 0);
    let h = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
    std::array::from_fn(|j| {
        let q = block[6 + j % 16];
        let nibble = if j < 16 { q & 0x0f } else { q >> 4 };
        let high = u8::from((h >> j) & 1 == 1) << 4;
        (i32::from(nibble | high) - 16) as f32 * d
    })
}

/// The 6-bit scale and min of sub-block `j` (0–7) of a Q4_K or Q5_K
/// super-block, from its 12 packed bytes (ggml's `get_scale_min_k4`): the
/// first four pairs are the low 6 bits of bytes 0–3 and 4–7, the last four
/// take their low 4 bits from bytes 8–11 and their top 2 from the spare
/// bits of bytes 0–7.
fn scale_min(s: &[u8], j: usize) -> (f32, f32) {
    let (sc, m) = if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    };
    (f32::from(sc), f32::from(m))
}

/// A Q4_K or Q5_K super-block: 8 sub-blocks of 32 with `d·sc` and
/// `dmin·m`; `q(j, i)` is the quant of element i of sub-block j.
fn k_block(block: &[u8], q: impl Fn(usize, usize) -> u8) -> [f32; 256] {
    let (d, dmin) = (half(block, 0), half(block, 2));
    let scales: [(f32, f32); 8] = std::array::from_fn(|j| {
        let (sc, m) = scale_min(&block[4..16], j);
        (d * sc, dmin * m)
    });
    std::array::from_fn(|e| {
        let (j, i) = (e / 32, e % 32);
        let (ds, ms) = scales[j];
        ds * f32::from(q(j, i)) - ms
    })
}

/// One Q4_K super-block (144 bytes) to 256 values. Sub-blocks 2k and
/// 2k + 1 are the low and high nibbles of quant bytes 32k..32k + 32.
fn q4_k(block: &[u8]) -> [f32; 256] {
    let qs = &block[16..144];
    k_block(block, |j, i| {
        let q = qs[32 * (j / 2) + i];
        if j % 2 == 0 { q & 0x0f } else { q >> 4 }
    })
}

/// One Q5_K super-block (176 bytes) to 256 values: Q4_K's nibbles (quant
/// bytes after 32 bytes of high bits) plus bit j of `h[i]` as bit 4.
fn q5_k(block: &[u8]) -> [f32; 256] {
    let (qh, qs) = (&block[16..48], &block[48..176]);
    k_block(block, |j, i| {
        let q = qs[32 * (j / 2) + i];
        let nibble = if j % 2 == 0 { q & 0x0f } else { q >> 4 };
        nibble | (((qh[i] >> j) & 1) << 4)
    })
}

/// One Q6_K super-block (210 bytes) to 256 values. Each half of 128 takes
/// 64 low-nibble bytes and 32 bytes of 2-bit highs: element 32r + l of the
/// half (r = 0–3, l = 0–31) has low nibble `ql[l + 32(r % 2)]` (low half
/// for r < 2, high half after) and high bits `qh[l] >> 2r`; sub-blocks of
/// 16 have an i8 scale each, and x = (d·sc) · (q − 32).
fn q6_k(block: &[u8]) -> [f32; 256] {
    let (ql, qh, sc) = (&block[..128], &block[128..192], &block[192..208]);
    let d = half(block, 208);
    std::array::from_fn(|e| {
        let (n, r, l) = (e / 128, (e % 128) / 32, e % 32);
        let low = ql[64 * n + l + 32 * (r % 2)];
        let low = if r < 2 { low & 0x0f } else { low >> 4 };
        let high = (qh[32 * n + l] >> (2 * r)) & 3;
        let q = i32::from(low | (high << 4)) - 32;
        let scale = f32::from(sc[8 * n + 2 * r + l / 16] as i8);
        d * scale * q as f32
    })
}
