//! The tokenizer and the chat template a GGUF file carries in its
//! metadata.
//!
//! A `tokenizer.ggml.model = gpt2` vocabulary is byte-level BPE: the
//! tokens, the merges in rank order, and a token type per token (1 normal,
//! 3 control, 4 user-defined, …). It becomes a Hugging Face `tokenizers`
//! BPE model whose control and user-defined tokens are added tokens, so
//! that `<|im_start|>` written in a prompt is one token, as Hugging Face
//! and llama.cpp both treat it. The pre-tokenizer is the one llama.cpp
//! uses for `tokenizer.ggml.pre` (`llama-vocab.cpp`).
//!
//! A `tokenizer.ggml.model = llama` vocabulary (SentencePiece, Gemma 3's)
//! is tokenized by [`super::Spm`], llama.cpp's algorithm written out.

use serde_json::{Value as Json, json};

use super::{Gguf, Value};
use crate::model::{ModelError, Tokenizer};

/// llama.cpp's token types that are matched as whole tokens in text.
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;

impl Tokenizer {
    /// Builds the tokenizer stored in a GGUF file's metadata.
    pub fn from_gguf(g: &Gguf) -> Result<Tokenizer, ModelError> {
        let model = g.str("tokenizer.ggml.model")?;
        match model {
            "gpt2" => {}
            "llama" => return super::Spm::from_gguf(g).map(Tokenizer::from_spm),
            _ => {
                return Err(ModelError::Tokenizer(format!(
                    "tokenizer.ggml.model `{model}` is not supported (supported: gpt2, byte-level \
                     BPE; llama, SentencePiece)"
                )));
            }
        }
        let pre = match g.get("tokenizer.ggml.pre") {
            Some(_) => g.str("tokenizer.ggml.pre")?,
            None => "default",
        };
        let tokens = g.strings("tokenizer.ggml.tokens")?;
        let spec = json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added_tokens(g, &tokens)?,
            "normalizer": null,
            "pre_tokenizer": pre_tokenizer(pre)?,
            "post_processor": post_processor(g, &tokens)?,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
                        "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                      "continuing_subword_prefix": null, "end_of_word_suffix": null,
                      "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                      "vocab": vocab(&tokens)?, "merges": merges(g)?}
        });
        Tokenizer::from_json(spec.to_string().as_bytes(), false)
    }
}

/// llama.cpp's pre-tokenizer for `tokenizer.ggml.pre`, in `tokenizers`'
/// terms. The first two split with GPT-2's regex; the `smollm` family first
/// splits every digit off on its own (`\p{N}`), which is `Digits` with
/// `individual_digits`. `qwen2` splits with its own expression
/// ([`QWEN2_SPLIT`]) and then only maps bytes.
fn pre_tokenizer(pre: &str) -> Result<Json, ModelError> {
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false,
                            "trim_offsets": true, "use_regex": true});
    match pre {
        "default" | "gpt-2" | "mpt" | "olmo" | "jais" => Ok(byte_level),
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" => Ok(json!({
            "type": "Sequence",
            "pretokenizers": [{"type": "Digits", "individual_digits": true}, byte_level]
        })),
        "qwen2" | "stablelm2" => Ok(json!({
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated",
                 "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false,
                 "use_regex": false}
            ]
        })),
        other => Err(ModelError::Tokenizer(format!(
            "tokenizer.ggml.pre `{other}` is not supported (supported: default, gpt-2, mpt, olmo, \
             jais, smollm, starcoder, refact, command-r, codeshell, exaone, qwen2, stablelm2)"
        ))),
    }
}

/// llama.cpp's expression for `qwen2` (`llama-vocab.cpp`): Qwen2's
/// `tokenizer.json` pattern with its case-insensitive contractions spelt
/// out. Every digit is a piece of its own; a letter run may take one
/// leading non-letter; punctuation runs keep their trailing newlines.
const QWEN2_SPLIT: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|\
                           [^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\
                           \\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

fn vocab(tokens: &[&str]) -> Result<serde_json::Map<String, Json>, ModelError> {
    let mut vocab = serde_json::Map::with_capacity(tokens.len());
    for (id, t) in tokens.iter().enumerate() {
        if vocab.insert(t.to_string(), json!(id)).is_some() {
            return Err(ModelError::Tokenizer(format!(
                "token `{t}` occurs twice in tokenizer.ggml.tokens"
            )));
        }
    }
    Ok(vocab)
}

/// Merges are stored as `"left right"`; byte-level tokens never hold a
/// space (it is `Ġ`), so the one space separates the pair.
fn merges(g: &Gguf) -> Result<Vec<Json>, ModelError> {
    g.strings("tokenizer.ggml.merges")?
        .into_iter()
        .map(|m| match m.split_once(' ') {
            Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains(' ') => Ok(json!([a, b])),
            _ => Err(ModelError::Tokenizer(format!(
                "merge `{m}` is not two tokens separated by one space"
            ))),
        })
        .collect()
}

/// Control tokens become special added tokens, user-defined ones plain
/// added tokens; both are matched whole in the input text.
fn added_tokens(g: &Gguf, tokens: &[&str]) -> Result<Vec<Json>, ModelError> {
    let Some(types) = g.get("tokenizer.ggml.token_type") else {
        return Ok(Vec::new());
    };
    let types = types
        .as_array()
        .filter(|t| t.len() == tokens.len())
        .ok_or_else(|| {
            ModelError::Tokenizer(format!(
                "tokenizer.ggml.token_type is not an array of {} entries",
                tokens.len()
            ))
        })?;
    let mut added = Vec::new();
    for (id, (ty, token)) in types.iter().zip(tokens).enumerate() {
        let ty = match ty {
            Value::I32(t) => *t,
            other => {
                return Err(ModelError::Tokenizer(format!(
                    "tokenizer.ggml.token_type holds {:?}, not i32",
                    other.value_type()
                )));
            }
        };
        if ty == CONTROL || ty == USER_DEFINED {
            added.push(json!({"id": id, "content": token, "single_word": false,
                              "lstrip": false, "rstrip": false, "normalized": false,
                              "special": ty == CONTROL}));
        }
    }
    Ok(added)
}

/// Prepends the BOS token when `tokenizer.ggml.add_bos_token` says so
/// (SmolLM2 does not); no post-processing otherwise.
fn post_processor(g: &Gguf, tokens: &[&str]) -> Result<Json, ModelError> {
    let add_bos = matches!(
        g.get("tokenizer.ggml.add_bos_token"),
        Some(Value::Bool(true))
    );
    if !add_bos {
        return Ok(Json::Null);
    }
    let bos = g.usize("tokenizer.ggml.bos_token_id")?;
    let Some(&name) = tokens.get(bos) else {
        return Err(ModelError::Tokenizer(format!(
            "bos token {bos} is outside the vocabulary of {}",
            tokens.len()
        )));
    };
    Ok(json!({
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": name, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": name, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {name: {"id": name, "ids": [bos], "tokens": [name]}}
    }))
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::{Value, ValueType, Writer};
    use super::*;

    /// GPT-2's byte-to-character map: printable bytes stand for
    /// themselves, the rest for U+0100 onwards in byte order.
    pub(in crate::model::gguf) fn byte_chars() -> Vec<String> {
        let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
        let mut next = 256;
        (0..256u32)
            .map(|b| {
                let c = if printable(b) {
                    b
                } else {
                    next += 1;
                    next - 1
                };
                char::from_u32(c).unwrap().to_string()
            })
            .collect()
    }

    fn strings(items: &[&str]) -> Value {
        Value::Array(
            ValueType::String,
            items.iter().map(|s| Value::String(s.to_string())).collect(),
        )
    }

    /// A byte-level vocabulary: the 256 byte characters, then merged
    /// tokens, then `<|im_start|>` (control) and `<tool>` (user-defined).
    fn tiny(pre: &str, add_bos: bool) -> Gguf {
        let mut tokens = byte_chars();
        let merged = ["Ġw", "or", "Ġwor", "ld", "Ġworld", "42"];
        tokens.extend(merged.iter().map(|s| s.to_string()));
        tokens.extend(["<|im_start|>".to_string(), "<tool>".to_string()]);
        let token_refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
        let mut types = vec![Value::I32(1); tokens.len()];
        let n = types.len();
        types[n - 2] = Value::I32(CONTROL);
        types[n - 1] = Value::I32(USER_DEFINED);
        let mut w = Writer::new(3);
        w.meta("tokenizer.ggml.model", Value::String("gpt2".into()))
            .meta("tokenizer.ggml.pre", Value::String(pre.into()))
            .meta("tokenizer.ggml.tokens", strings(&token_refs))
            .meta(
                "tokenizer.ggml.token_type",
                Value::Array(ValueType::I32, types),
            )
            .meta(
                "tokenizer.ggml.merges",
                strings(&["Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "4 2"]),
            )
            .meta("tokenizer.ggml.bos_token_id", Value::U32(n as u32 - 2))
            .meta("tokenizer.ggml.add_bos_token", Value::Bool(add_bos));
        Gguf::from_bytes(w.to_bytes()).unwrap()
    }

    #[test]
    fn byte_level_bpe_with_special_tokens_in_text() {
        let t = Tokenizer::from_gguf(&tiny("gpt-2", false)).unwrap();
        let id = |s: &str| t.token_id(s).unwrap();
        let ids = t.encode(" world 42<|im_start|>w<tool>", 100).unwrap();
        assert_eq!(
            ids,
            [
                id("Ġworld"),
                id("Ġ"),
                id("42"),
                id("<|im_start|>"),
                id("w"),
                id("<tool>")
            ]
        );
    }

    #[test]
    fn smollm_splits_every_digit() {
        let t = Tokenizer::from_gguf(&tiny("smollm", false)).unwrap();
        let id = |s: &str| t.token_id(s).unwrap();
        assert_eq!(t.encode("42", 100).unwrap(), [id("4"), id("2")]);
        assert_eq!(t.encode(" world", 100).unwrap(), [id("Ġworld")]);
    }

    #[test]
    fn qwen2_splits_every_digit() {
        let t = Tokenizer::from_gguf(&tiny("qwen2", false)).unwrap();
        let id = |s: &str| t.token_id(s).unwrap();
        assert_eq!(t.encode("42", 100).unwrap(), [id("4"), id("2")]);
        assert_eq!(t.encode(" world", 100).unwrap(), [id("Ġworld")]);
    }

    #[test]
    fn bos_is_prepended_when_the_file_says_so() {
        let t = Tokenizer::from_gguf(&tiny("gpt-2", true)).unwrap();
        let bos = t.token_id("<|im_start|>").unwrap();
        assert_eq!(t.encode("w", 100).unwrap(), [bos, t.token_id("w").unwrap()]);
    }

    #[test]
    fn unsupported_or_malformed_vocabularies_are_errors() {
        let mut w = Writer::new(3);
        w.meta("tokenizer.ggml.model", Value::String("t5".into()));
        let g = Gguf::from_bytes(w.to_bytes()).unwrap();
        assert!(matches!(
            Tokenizer::from_gguf(&g),
            Err(ModelError::Tokenizer(_))
        ));
        assert!(matches!(
            Tokenizer::from_gguf(&tiny("deepseek-llm", false)),
            Err(ModelError::Tokenizer(_))
        ));
        let empty = Gguf::from_bytes(Writer::new(3).to_bytes()).unwrap();
        assert!(matches!(
            Tokenizer::from_gguf(&empty),
            Err(ModelError::Gguf(_))
        ));
    }
}
