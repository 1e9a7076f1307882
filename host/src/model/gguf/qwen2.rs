//! Qwen2 (Qwen2.5, Qwen2.5-Coder) from GGUF: Llama's block with biases on
//! the query, key and value projections.
//!
//! Facts of the format (llama.cpp's `convert_hf_to_gguf.py` and
//! `llama-model.cpp`, `LLM_ARCH_QWEN2`):
//! - hyper-parameters are `qwen2.*` keys with Llama's names; RoPE's base is
//!   `qwen2.rope.freq_base` (10⁶ for Qwen2.5);
//! - `blk.N.attn_{q,k,v}.bias` are F32 vectors of the projection's width,
//!   added after the product and before RoPE (the planner's fused QKV
//!   product carries them, so nothing in the planner is specific to Qwen2);
//! - the converter does not permute the Q and K rows: llama.cpp rotates
//!   this architecture with its NEOX mode, pairs `(i, i + d_h/2)`
//!   ([`RopeStyle::RotateHalf`]);
//! - the LM head is `output.weight` when the file has one (the
//!   Qwen2.5-Coder-0.5B file does, in Q8_0), else tied;
//! - the vocabulary is byte-level BPE with llama.cpp's `qwen2`
//!   pre-tokenizer (see `tokenizer.rs`).

use super::llama::Family;
use crate::model::RopeStyle;

/// `general.architecture = qwen2`.
pub(super) const QWEN2: Family = Family {
    name: "qwen2",
    rope_style: RopeStyle::RotateHalf,
    qkv_bias: true,
    block: None,
};

#[cfg(test)]
mod tests {
    use super::super::llama::tests::{load, tiny};
    use super::super::{TensorType, Value, Writer};
    use crate::model::{Linear, ModelError, RopeStyle};

    /// The tiny Llama's file as a Qwen2 file: keys renamed, a bias per
    /// projection.
    fn tiny_qwen2(biases: bool) -> Writer {
        let (d, w) = tiny();
        let mut out = Writer::new(3);
        let g = super::super::Gguf::from_bytes(w.to_bytes()).unwrap();
        for (k, v) in g.metadata() {
            match k.strip_prefix("llama.") {
                Some(rest) => out.meta(&format!("qwen2.{rest}"), v.clone()),
                None if k == "general.architecture" => out.meta(k, Value::String("qwen2".into())),
                None => out.meta(k, v.clone()),
            };
        }
        for t in g.tensors() {
            out.tensor(&t.name, &t.dims, t.ty, g.bytes(t).to_vec());
        }
        if biases {
            for i in 0..d.config.layers {
                let widths = [("q", d.layers[i].query.outputs), ("k", 32), ("v", 32)];
                for (j, (p, n)) in widths.into_iter().enumerate() {
                    let b = bias(i, j, n);
                    let bytes = b.iter().flat_map(|x| x.to_le_bytes()).collect();
                    out.tensor(
                        &format!("blk.{i}.attn_{p}.bias"),
                        &[n as u64],
                        TensorType::F32,
                        bytes,
                    );
                }
            }
        }
        out
    }

    fn bias(layer: usize, part: usize, n: usize) -> Vec<f32> {
        (0..n)
            .map(|k| (layer * 1000 + part * 100 + k) as f32 * 1e-3 - 0.5)
            .collect()
    }

    #[test]
    fn a_written_qwen2_reads_with_biases_and_rotate_half() {
        let (want, _) = tiny();
        let got = load(&tiny_qwen2(true)).unwrap();
        assert_eq!(got.config.rope_style, RopeStyle::RotateHalf);
        assert_eq!(got.config.kv_width(), 32);
        for (i, (g, w)) in got.layers.iter().zip(&want.layers).enumerate() {
            let parts: [(&Linear, &Linear); 3] =
                [(&g.query, &w.query), (&g.key, &w.key), (&g.value, &w.value)];
            for (j, (g, w)) in parts.into_iter().enumerate() {
                assert_eq!(g.w, w.w);
                assert_eq!(g.b, bias(i, j, g.outputs));
            }
            assert_eq!((&g.up, &g.down, &g.gate), (&w.up, &w.down, &w.gate));
        }
    }

    #[test]
    fn a_qwen2_file_without_its_biases_is_refused() {
        let e = load(&tiny_qwen2(false)).unwrap_err();
        assert!(
            matches!(&e, ModelError::Gguf(_)) && e.to_string().contains("attn_q.bias"),
            "{e}"
        );
    }
}
