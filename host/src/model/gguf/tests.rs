//! The reader against files written here with known contents, their
//! truncations and corruptions, and the real SmolLM2 file when it is there.

use super::*;

/// Every scalar type, a string, an empty array, an array of strings and an
/// array of arrays.
fn all_values() -> Vec<(&'static str, Value)> {
    vec![
        ("t.u8", Value::U8(200)),
        ("t.i8", Value::I8(-100)),
        ("t.u16", Value::U16(60000)),
        ("t.i16", Value::I16(-30000)),
        ("t.u32", Value::U32(4_000_000_000)),
        ("t.i32", Value::I32(-2_000_000_000)),
        ("t.u64", Value::U64(u64::MAX - 1)),
        ("t.i64", Value::I64(i64::MIN + 1)),
        ("t.f32", Value::F32(-1.25e-3)),
        ("t.f64", Value::F64(std::f64::consts::PI)),
        ("t.bool", Value::Bool(true)),
        ("t.string", Value::String("héllo ✓".into())),
        ("t.empty", Value::Array(ValueType::F32, vec![])),
        (
            "t.strings",
            Value::Array(
                ValueType::String,
                vec![Value::String("a".into()), Value::String(String::new())],
            ),
        ),
        (
            "t.nested",
            Value::Array(
                ValueType::Array,
                vec![
                    Value::Array(ValueType::I32, vec![Value::I32(-1), Value::I32(7)]),
                    Value::Array(ValueType::Bool, vec![Value::Bool(false)]),
                ],
            ),
        ),
    ]
}

/// A test tensor: name, dims, type, stored bytes and its values.
type Sample = (&'static str, Vec<u64>, TensorType, Vec<u8>, Vec<f32>);

/// One tensor of each supported type, stored bytes and the values ggml's
/// formulas give for them.
fn all_tensors() -> Vec<Sample> {
    let f32s = [1.5f32, -2.0, 0.0, 3.0e-8, 1.0e30, -0.5];
    // f16: 1, −2, 65504 (largest), 2^-24 (smallest subnormal), −0, 0.5.
    let f16s: [(u16, f32); 6] = [
        (0x3c00, 1.0),
        (0xc000, -2.0),
        (0x7bff, 65504.0),
        (0x0001, 5.960_464_5e-8),
        (0x8000, -0.0),
        (0x3800, 0.5),
    ];
    // bf16: 1, −3, 2^-126·1.0078125 and π rounded down.
    let bf16s: [(u16, f32); 4] = [
        (0x3f80, 1.0),
        (0xc040, -3.0),
        (0x0081, f32::from_bits(0x0081_0000)),
        (0x4049, 3.140625),
    ];
    let (q8, q8_want) = q8_0_blocks();
    let (q4, q4_want) = q4_1_blocks();
    vec![
        (
            "f32",
            vec![3, 2],
            TensorType::F32,
            f32s.iter().flat_map(|v| v.to_le_bytes()).collect(),
            f32s.to_vec(),
        ),
        (
            "f16",
            vec![6],
            TensorType::F16,
            f16s.iter().flat_map(|v| v.0.to_le_bytes()).collect(),
            f16s.iter().map(|v| v.1).collect(),
        ),
        (
            "bf16",
            vec![2, 1, 2],
            TensorType::BF16,
            bf16s.iter().flat_map(|v| v.0.to_le_bytes()).collect(),
            bf16s.iter().map(|v| v.1).collect(),
        ),
        ("q8_0", vec![64], TensorType::Q8_0, q8, q8_want),
        ("q4_1", vec![32, 2], TensorType::Q4_1, q4, q4_want),
    ]
    .into_iter()
    .chain(known_answers().into_iter().map(|(name, ty, bytes, bits)| {
        let values = bits.into_iter().map(f32::from_bits).collect::<Vec<_>>();
        (name, vec![values.len() as u64], ty, bytes, values)
    }))
    .collect()
}

/// Q8_0, two blocks: d = 0.5 with q_j = j − 16, d = −2 with q_j = 127 − 8j.
/// Returns the stored bytes and their values.
fn q8_0_blocks() -> (Vec<u8>, Vec<f32>) {
    let mut q8 = Vec::new();
    let mut q8_want = Vec::new();
    for (d_bits, d, q) in [
        (
            0x3800u16,
            0.5f32,
            (0..32).map(|j| j - 16).collect::<Vec<i32>>(),
        ),
        (0xc000, -2.0, (0..32).map(|j| 127 - 8 * j).collect()),
    ] {
        q8.extend(d_bits.to_le_bytes());
        q8.extend(q.iter().map(|&v| v as i8 as u8));
        q8_want.extend(q.iter().map(|&v| v as f32 * d));
    }
    (q8, q8_want)
}

/// Q4_1, one block per row of a 32×2 matrix: d = 0.25, m = −1 with byte
/// j = j | (15 − j) << 4; then d = 1, m = 0.5 with every byte 0xf0.
/// Returns the stored bytes and their values.
fn q4_1_blocks() -> (Vec<u8>, Vec<f32>) {
    let mut q4 = Vec::new();
    let mut q4_want = vec![0.0; 64];
    q4.extend([0x00, 0x34, 0x00, 0xbc]);
    q4.extend((0..16u8).map(|j| j | (15 - j) << 4));
    for j in 0..16 {
        q4_want[j] = j as f32 * 0.25 - 1.0;
        q4_want[j + 16] = (15 - j) as f32 * 0.25 - 1.0;
    }
    q4.extend([0x00, 0x3c, 0x00, 0x38]);
    q4.extend([0xf0; 16]);
    q4_want[32..48].fill(0.5);
    q4_want[48..].fill(15.5);
    (q4, q4_want)
}

/// `tests/fixtures/make_kquants.py`'s known answers: for each block type,
/// random blocks and the f32 bits that the `gguf` package (llama.cpp's
/// Python reader) dequantized them to.
fn known_answers() -> Vec<(&'static str, TensorType, Vec<u8>, Vec<u32>)> {
    let json: serde_json::Value =
        serde_json::from_str(include_str!("kquants.json")).expect("kquants.json parses");
    let cases = json.as_object().expect("an object of cases");
    let mut out = Vec::new();
    for (name, case) in cases {
        let ty = (0..64)
            .filter_map(TensorType::from_id)
            .find(|t| t.name() == name)
            .expect("a known type");
        let hex = case["blocks"].as_str().expect("hex blocks");
        let bytes = (0..hex.len() / 2)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex"))
            .collect();
        let bits = case["values"]
            .as_array()
            .expect("values")
            .iter()
            .map(|v| u32::try_from(v.as_u64().expect("a u32")).expect("a u32"))
            .collect();
        // ggml's upper-case names: the hand-made samples above are lower case.
        out.push((ty.name(), ty, bytes, bits));
    }
    out
}

#[test]
fn block_types_dequantize_as_the_gguf_package_does_bit_for_bit() {
    let answers = known_answers();
    let names: Vec<&str> = answers.iter().map(|a| a.1.name()).collect();
    for want in ["Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"] {
        assert!(names.contains(&want), "no known answers for {want}");
    }
    for (name, ty, bytes, bits) in answers {
        let got = quant::dequantize(ty, &bytes).expect("a dequantized type");
        assert_eq!(got.len(), bits.len(), "{name}: value count");
        for (i, (g, w)) in got.iter().zip(&bits).enumerate() {
            assert_eq!(
                g.to_bits(),
                *w,
                "{name}: value {i} is {g}, gguf says {}",
                f32::from_bits(*w)
            );
        }
    }
}

fn sample(version: u32) -> Vec<u8> {
    let mut w = Writer::new(version);
    for (k, v) in all_values() {
        w.meta(k, v);
    }
    for (name, dims, ty, bytes, _) in all_tensors() {
        w.tensor(name, &dims, ty, bytes);
    }
    w.to_bytes()
}

#[test]
fn every_value_and_tensor_type_reads_back() {
    for version in [2, 3] {
        let g = Gguf::from_bytes(sample(version)).unwrap();
        assert_eq!(g.version(), version);
        assert_eq!(g.alignment(), DEFAULT_ALIGNMENT);
        let want = all_values();
        assert_eq!(g.metadata().len(), want.len());
        for ((k, v), (gk, gv)) in want.iter().zip(g.metadata()) {
            assert_eq!((*k, v), (gk.as_str(), gv));
        }
        for (name, dims, ty, bytes, values) in all_tensors() {
            let info = g.tensor(name).unwrap();
            assert_eq!((&info.dims, info.ty), (&dims, ty));
            assert_eq!(info.start % 32, 0, "{name} is aligned");
            assert_eq!(g.bytes(info), bytes);
            let got = g.dequantize(name).unwrap();
            // Bit for bit, so that −0 and 0 differ.
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&values), "{name}");
        }
    }
}

#[test]
fn typed_accessors() {
    let g = Gguf::from_bytes(sample(3)).unwrap();
    assert_eq!(g.usize("t.u16").unwrap(), 60000);
    assert_eq!(g.usize("t.u8").unwrap(), 200);
    assert!(matches!(g.usize("t.i8"), Err(GgufError::WrongType { .. })));
    assert!(matches!(g.usize("t.none"), Err(GgufError::MissingKey(_))));
    assert_eq!(g.f32("t.f32").unwrap(), -1.25e-3);
    assert_eq!(g.str("t.string").unwrap(), "héllo ✓");
    assert_eq!(g.strings("t.strings").unwrap(), ["a", ""]);
    assert!(matches!(
        g.strings("t.nested"),
        Err(GgufError::WrongType { .. })
    ));
    assert!(matches!(
        g.dequantize("nope"),
        Err(GgufError::MissingTensor(_))
    ));
}

#[test]
fn alignment_comes_from_metadata() {
    let mut w = Writer::new(3);
    w.meta("general.alignment", Value::U32(256));
    w.tensor("a", &[3], TensorType::F32, vec![0; 12]);
    w.tensor("b", &[1], TensorType::F32, 7f32.to_le_bytes().to_vec());
    let g = Gguf::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(g.alignment(), 256);
    assert_eq!(g.tensor("a").unwrap().start % 256, 0);
    assert_eq!(
        g.tensor("b").unwrap().start - g.tensor("a").unwrap().start,
        256
    );
    assert_eq!(g.dequantize("b").unwrap(), [7.0]);

    for bad in [Value::U32(48), Value::U32(0), Value::U64(64)] {
        let mut w = Writer::new(3);
        w.meta("general.alignment", bad);
        let err = Gguf::from_bytes(w.to_bytes()).unwrap_err();
        assert!(matches!(err, GgufError::BadAlignment(_)), "{err}");
    }
}

#[test]
fn every_truncation_is_a_typed_error() {
    let full = sample(3);
    for len in 0..full.len() {
        let err = Gguf::from_bytes(full[..len].to_vec()).unwrap_err();
        assert!(
            matches!(
                err,
                GgufError::Truncated { .. } | GgufError::OutOfBounds(_) | GgufError::BadMagic
            ),
            "{len}: {err}"
        );
    }
}

#[test]
fn random_corruptions_never_panic() {
    // Flip bytes of the header region with a fixed-seed generator; every
    // outcome is fine except a panic or an allocation the file cannot back.
    let full = sample(3);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..4000 {
        let mut bytes = full.clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() % 700) as usize % bytes.len();
            bytes[at] = next() as u8;
        }
        if let Ok(g) = Gguf::from_bytes(bytes) {
            for t in g.tensors() {
                let _ = g.dequantize(&t.name);
            }
        }
    }
}

/// A file with the given header counts and a hand-made body.
fn raw(version: u32, tensors: u64, kv: u64, body: &[u8]) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend(version.to_le_bytes());
    out.extend(tensors.to_le_bytes());
    out.extend(kv.to_le_bytes());
    out.extend(body);
    out
}

fn string(s: &[u8]) -> Vec<u8> {
    let mut out = (s.len() as u64).to_le_bytes().to_vec();
    out.extend(s);
    out
}

/// A tensor description: name, dims, type id and offset.
fn tensor(name: &str, dims: &[u64], ty: u32, offset: u64) -> Vec<u8> {
    let mut out = string(name.as_bytes());
    out.extend((dims.len() as u32).to_le_bytes());
    dims.iter().for_each(|d| out.extend(d.to_le_bytes()));
    out.extend(ty.to_le_bytes());
    out.extend(offset.to_le_bytes());
    out
}

fn err(bytes: Vec<u8>) -> GgufError {
    Gguf::from_bytes(bytes).unwrap_err()
}

#[test]
fn header_corruptions_are_typed_errors() {
    assert!(matches!(
        err(b"GGML\x03\0\0\0".to_vec()),
        GgufError::BadMagic
    ));
    assert!(matches!(
        err(raw(1, 0, 0, &[])),
        GgufError::UnsupportedVersion(1)
    ));
    assert!(matches!(
        err(raw(4, 0, 0, &[])),
        GgufError::UnsupportedVersion(4)
    ));
    assert!(matches!(
        err(raw(0x0300_0000, 0, 0, &[])),
        GgufError::BigEndian
    ));
    // Counts far beyond what the bytes could hold: refused, not allocated.
    assert!(matches!(
        err(raw(3, u64::MAX, 0, &[])),
        GgufError::Truncated { .. }
    ));
    assert!(matches!(
        err(raw(3, 0, u64::MAX, &[])),
        GgufError::Truncated { .. }
    ));
    assert!(
        Gguf::from_bytes(raw(3, 0, 0, &[]))
            .unwrap()
            .tensors()
            .is_empty()
    );
}

#[test]
fn metadata_corruptions_are_typed_errors() {
    let kv = |key: &[u8], ty: u32, value: &[u8]| {
        let mut b = string(key);
        b.extend(ty.to_le_bytes());
        b.extend(value);
        b
    };
    let one = |body: Vec<u8>| err(raw(3, 0, 1, &body));
    assert!(matches!(
        one(kv(b"k", 13, &[0])),
        GgufError::BadValueType { id: 13, .. }
    ));
    assert!(matches!(one(kv(b"", 0, &[0])), GgufError::EmptyKey { .. }));
    assert!(matches!(
        one(kv(b"k", 8, &string(b"\xff\xfe"))),
        GgufError::NotUtf8 { .. }
    ));
    assert!(matches!(
        one(kv(b"\xc3", 0, &[0])),
        GgufError::NotUtf8 { .. }
    ));
    let huge_string = kv(b"k", 8, &u64::MAX.to_le_bytes());
    assert!(matches!(one(huge_string), GgufError::Truncated { .. }));
    let mut huge_array = 10u32.to_le_bytes().to_vec();
    huge_array.extend((u64::MAX / 2).to_le_bytes());
    assert!(matches!(
        one(kv(b"k", 9, &huge_array)),
        GgufError::Truncated { .. }
    ));
    // Arrays of arrays, one level deeper than allowed.
    let mut deep = Vec::new();
    for _ in 0..parse::MAX_DEPTH {
        deep.extend(9u32.to_le_bytes());
        deep.extend(1u64.to_le_bytes());
    }
    deep.extend(0u32.to_le_bytes());
    deep.extend(0u64.to_le_bytes());
    assert!(matches!(one(kv(b"k", 9, &deep)), GgufError::TooDeep { .. }));
    let mut twice = kv(b"k", 0, &[1]);
    twice.extend(kv(b"k", 0, &[2]));
    assert!(matches!(err(raw(3, 0, 2, &twice)), GgufError::DuplicateKey(k) if k == "k"));
}

#[test]
fn tensor_corruptions_are_typed_errors() {
    let with_data = |infos: Vec<u8>, n: u64| {
        let mut b = raw(3, n, 0, &infos);
        b.resize(b.len().next_multiple_of(32) + 64, 0);
        err(b)
    };
    let one = |t: Vec<u8>| with_data(t, 1);
    assert!(matches!(
        one(tensor("t", &[1; 5], 0, 0)),
        GgufError::TooManyDims { dims: 5, .. }
    ));
    assert!(matches!(
        one(tensor("t", &[4], 4, 0)),
        GgufError::UnknownType { id: 4, .. }
    ));
    assert!(matches!(
        one(tensor("t", &[4], 99, 0)),
        GgufError::UnknownType { id: 99, .. }
    ));
    assert!(matches!(
        one(tensor("t", &[16], 8, 0)),
        GgufError::PartialBlock { row: 16, .. }
    ));
    assert!(matches!(
        one(tensor("t", &[u64::MAX, 2], 0, 0)),
        GgufError::TooLarge(_)
    ));
    assert!(matches!(
        one(tensor("t", &[1 << 62], 0, 0)),
        GgufError::TooLarge(_)
    ));
    assert!(matches!(
        one(tensor("t", &[1], 0, 4)),
        GgufError::Misaligned { offset: 4, .. }
    ));
    assert!(matches!(
        one(tensor("t", &[17], 0, 0)),
        GgufError::OutOfBounds(_)
    ));
    assert!(matches!(
        one(tensor("t", &[1], 0, 64)),
        GgufError::OutOfBounds(_)
    ));
    assert!(matches!(
        one(tensor("t", &[1], 0, u64::MAX - 31)),
        GgufError::OutOfBounds(_)
    ));
    let mut twice = tensor("t", &[1], 0, 0);
    twice.extend(tensor("t", &[1], 0, 32));
    assert!(matches!(with_data(twice, 2), GgufError::DuplicateTensor(t) if t == "t"));
    // A type the reader can size but not dequantize.
    let mut b = raw(3, 1, 0, &tensor("k", &[256], 10, 0));
    b.resize(b.len().next_multiple_of(32) + 84, 0);
    let g = Gguf::from_bytes(b).unwrap();
    let e = g.dequantize("k").unwrap_err();
    assert!(
        matches!(e, GgufError::Unsupported { ty, .. } if ty.name() == "Q2_K"),
        "{e}"
    );
}

/// The published facts of SmolLM2-135M-Instruct's GGUF, when it has been
/// fetched (`cargo xtask fetch-model smollm2`).
#[test]
fn smollm2_file_facts() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.exists() {
        eprintln!("note: {} is absent; skipping", path.display());
        return;
    }
    let g = Gguf::open(&path).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.str("general.architecture").unwrap(), "llama");
    let n = |k: &str| g.usize(&format!("llama.{k}")).unwrap();
    assert_eq!(n("block_count"), 30);
    assert_eq!(n("embedding_length"), 576);
    assert_eq!(n("feed_forward_length"), 1536);
    assert_eq!(n("attention.head_count"), 9);
    assert_eq!(n("attention.head_count_kv"), 3);
    assert_eq!(g.f32("llama.rope.freq_base").unwrap(), 100000.0);
    assert_eq!(
        g.f32("llama.attention.layer_norm_rms_epsilon").unwrap(),
        1e-5
    );
    assert_eq!(g.str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert_eq!(g.str("tokenizer.ggml.pre").unwrap(), "smollm");
    assert_eq!(g.strings("tokenizer.ggml.tokens").unwrap().len(), 49152);
    assert_eq!(g.usize("tokenizer.ggml.bos_token_id").unwrap(), 1);
    assert_eq!(g.usize("tokenizer.ggml.eos_token_id").unwrap(), 2);
    // The output head is tied: there is no `output.weight`.
    assert!(g.tensor("output.weight").is_none());
    let ty = |name: &str| g.tensor(name).unwrap().ty;
    assert_eq!(ty("token_embd.weight"), TensorType::Q8_0);
    assert_eq!(g.tensor("token_embd.weight").unwrap().dims, [576, 49152]);
    assert_eq!(ty("output_norm.weight"), TensorType::F32);
    for b in 0..30 {
        for m in [
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        ] {
            assert_eq!(ty(&format!("blk.{b}.{m}.weight")), TensorType::Q4_1);
        }
        assert_eq!(ty(&format!("blk.{b}.attn_norm.weight")), TensorType::F32);
        assert_eq!(ty(&format!("blk.{b}.ffn_norm.weight")), TensorType::F32);
    }
    assert_eq!(g.tensor("blk.0.attn_k.weight").unwrap().dims, [576, 192]);
    assert_eq!(g.tensor("blk.0.ffn_down.weight").unwrap().dims, [1536, 576]);
    let embd = g.dequantize("token_embd.weight").unwrap();
    assert_eq!(embd.len(), 576 * 49152);
    assert!(embd.iter().all(|v| v.is_finite()));
}

/// A checkpoint under `models/` and (tensor, type, SHA-256) of some tensors.
type Digests = (
    &'static str,
    &'static [(&'static str, &'static str, &'static str)],
);

/// The two K-quant checkpoints' tensors the test below digests, one of
/// each quantized type in each file: the SHA-256 of the little-endian f32
/// values, as `gguf.quants.dequantize` (gguf 0.17.1) gave them.
const DIGESTS: [Digests; 2] = [
    (
        "Qwen2.5-Coder-0.5B-Instruct/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        &[
            (
                "blk.0.ffn_down.weight",
                "Q6_K",
                "ab075951878740c9f8ad4cf65c0ce93f5c0c048c0110a555d872725bba271996",
            ),
            (
                "blk.0.ffn_gate.weight",
                "Q5_0",
                "210e767c19efd42af0ee10bc30136a2d69b9d004e5c51603b89f57da1504d732",
            ),
            (
                "blk.0.attn_v.weight",
                "Q8_0",
                "eaf7101a791d9c8de19271ec4dfaa0bd3f3e1d91d30d9685bc7199cde97408ff",
            ),
            (
                "blk.11.ffn_down.weight",
                "Q4_K",
                "f48a7c976f6fce6b8cd9515c4cb0721f8ebe8328d7d2fcf07bf0cd208cc17536",
            ),
        ],
    ),
    (
        "gemma-3-270m/gemma-3-270m-q4_k_m.gguf",
        &[
            (
                "blk.0.attn_k.weight",
                "Q5_0",
                "e9148680cf79c2265aa182d501323da97bf5f038a92e860172e2f071e5f1ae24",
            ),
            (
                "blk.0.attn_output.weight",
                "Q4_K",
                "84421b360695121d4fa8c5b47aa4b9729eb814b9608b4856a3af07a1736cf47f",
            ),
            (
                "blk.0.attn_v.weight",
                "Q8_0",
                "7f2d145de2fbde18074eb84ca7f5b6d2c44308ed933e8f8520a0bbb4c663d11e",
            ),
            (
                "blk.0.ffn_down.weight",
                "Q6_K",
                "b718ca6bf05ad89435100bb9da1f6a6300a627c3396bc3bdb91809ca7dcdb4d8",
            ),
        ],
    ),
];

/// Tensors of the two K-quant checkpoints (`cargo xtask fetch-model
/// qwen2.5-coder-0.5b`, `gemma3-270m`), when fetched, dequantized here and
/// by the `gguf` package ([`DIGESTS`]). Every tensor of both files must
/// also dequantize to its element count.
#[test]
fn k_quant_checkpoints_dequantize_as_the_gguf_package_does() {
    use sha2::{Digest, Sha256};
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models");
    for (file, tensors) in DIGESTS {
        let path = root.join(file);
        if !path.exists() {
            eprintln!("note: {} is absent; skipping", path.display());
            continue;
        }
        let g = Gguf::open(&path).unwrap();
        for (name, ty, digest) in tensors {
            assert_eq!(g.tensor(name).unwrap().ty.name(), *ty, "{name}");
            let values = g.dequantize(name).unwrap();
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            let got = crate::plan::hex(&Sha256::digest(&bytes));
            assert_eq!(got, *digest, "{file}: {name} ({ty})");
        }
        for t in g.tensors() {
            let values = g.dequantize(&t.name).unwrap();
            assert_eq!(values.len() as u64, t.elements(), "{}", t.name);
        }
    }
}

/// A file holding `tensors` (name, `ne`, type, bytes) and nothing else.
fn holding(tensors: &[(&str, [u64; 2], TensorType, Vec<u8>)]) -> Arc<Gguf> {
    let mut w = Writer::new(3);
    for (name, ne, ty, bytes) in tensors {
        w.tensor(name, ne, *ty, bytes.clone());
    }
    Arc::new(Gguf::from_bytes(w.to_bytes()).expect("a well-formed file"))
}

/// Q8_0 rows that differ from one another: row `o`'s blocks have scale
/// bits `0x3400 + o` and quants `(j + 7o) mod 256` as `i8`.
fn q8_0_rows(inputs: usize, outputs: usize) -> Vec<u8> {
    let mut bytes = Vec::new();
    for o in 0..outputs {
        for _ in 0..inputs / 32 {
            bytes.extend((0x3400u16 + o as u16).to_le_bytes());
            bytes.extend((0..32).map(|j| (j + 7 * o) as u8));
        }
    }
    bytes
}

#[test]
fn stored_matrices_read_as_the_whole_tensor_transposed() {
    // 100 outputs: one whole group of rows dequantized together and a
    // partial one; every block type of the known answers, one block a row.
    let mut tensors = vec![("q8", [64, 100], TensorType::Q8_0, q8_0_rows(64, 100))];
    let answers = known_answers();
    for (name, ty, bytes, bits) in &answers {
        let block = ty.block().0;
        tensors.push((name, [block, bits.len() as u64 / block], *ty, bytes.clone()));
    }
    let g = holding(&tensors);
    for (name, [inputs, outputs], ..) in &tensors {
        let (inputs, outputs) = (*inputs as usize, *outputs as usize);
        let s = Stored::new(&g, name, inputs, outputs).expect("a matrix of whole-block rows");
        let want =
            crate::model::checkpoint::transpose(&g.dequantize(name).unwrap(), outputs, inputs);
        let got = s.values();
        assert_eq!(got.len(), inputs * outputs, "{name}");
        assert!(
            got.iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}"
        );
        assert_eq!(s.len(), got.len());
        // In file order: row by row, and every row in turn.
        let whole = g.dequantize(name).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (o, want) in whole.chunks_exact(inputs).enumerate() {
            assert_eq!(bits(&s.row(o).unwrap()), bits(want), "{name} row {o}");
        }
        assert!(s.row(outputs).is_none() && s.row(usize::MAX).is_none());
        let mut rows = Vec::new();
        s.for_each_row(|row| rows.extend_from_slice(row));
        assert_eq!(bits(&rows), bits(&whole), "{name}");
        // Hashed as the same values held, the second time from memory.
        use crate::model::{Matrix, Rows};
        for _ in 0..2 {
            let held = Matrix::Held(got.clone()).hash();
            assert_eq!(Matrix::Stored(s.clone()).hash(), held, "{name}");
            assert_eq!(
                Rows::Stored(s.clone()).hash(),
                Rows::Held(whole.clone()).hash()
            );
        }
    }
}

#[test]
fn matrices_that_cannot_stay_in_the_file_are_refused() {
    // (A row of a block and a half does not parse: see
    // `tensor_corruptions_are_typed_errors`.)
    let g = holding(&[
        ("q8", [64, 3], TensorType::Q8_0, q8_0_rows(64, 3)),
        // A type with a known geometry that is not dequantized.
        (
            "q8_1",
            [32, 1],
            TensorType::from_id(9).unwrap(),
            vec![0; 36],
        ),
    ]);
    assert!(Stored::new(&g, "q8_1", 32, 1).is_none());
    assert!(Stored::new(&g, "absent", 64, 3).is_none());
    // Another shape than the file's.
    assert!(Stored::new(&g, "q8", 3, 64).is_none());
    assert!(Stored::new(&g, "q8", 64, 3).is_some());
}

#[test]
fn a_matrix_of_no_rows_stays_in_the_file_whatever_its_width() {
    // Found by the fuzz target: a row of 2^63 F32 values is 2^65 bytes,
    // which the size check must not overflow on.
    let wide = 15_564_440_312_192_434_176u64;
    let g = holding(&[("empty", [wide, 0], TensorType::F32, Vec::new())]);
    let s = Stored::new(&g, "empty", wide as usize, 0).expect("no rows");
    assert!(s.values().is_empty() && s.row(0).is_none());
    let mut rows = 0;
    s.for_each_row(|_| rows += 1);
    assert_eq!(rows, 0);
}
