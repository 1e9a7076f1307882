//! llama.cpp's SentencePiece tokenizer (`tokenizer.ggml.model = llama`,
//! `llm_tokenizer_spm` in `src/llama-vocab.cpp`), written from its
//! algorithm, for Gemma 3's GGUF vocabulary and others like it.
//!
//! Encoding, as llama.cpp does it with special tokens parsed:
//!
//! 1. The special tokens (token types 2 unknown, 3 control, 4
//!    user-defined: Gemma 3's `<start_of_turn>`, its runs of newlines,
//!    spaces and tabs, its HTML tags) are cut out of the text first, the
//!    longest token text first, every occurrence in every piece of text
//!    still left. llama.cpp sorts them with an unstable sort, so the order
//!    of two equally long texts is unspecified there; here it is by id. It
//!    matters only where two such texts overlap in the input.
//! 2. Each plain-text fragment gets a leading space when
//!    `tokenizer.ggml.add_space_prefix` is set (default true; Gemma 3:
//!    false), has every space replaced by `▁` (U+2581), and is split into
//!    characters. The adjacent pair whose concatenation is in the
//!    vocabulary with the highest score is merged, ties going to the
//!    leftmost pair, until no pair is in the vocabulary.
//! 3. A final piece that is not a token (only an unmerged character can
//!    be one) is written as its UTF-8 bytes, `<0xXX>` each.
//! 4. BOS comes first when `tokenizer.ggml.add_bos_token` is set (default
//!    true).
//!
//! Decoding writes control, unknown and user-defined tokens as their text,
//! normal tokens with `▁` turned back into spaces, byte tokens as their
//! byte (then fused into UTF-8, invalid sequences becoming U+FFFD), unused
//! tokens as nothing, and drops one leading space when
//! `add_space_prefix` is set, as `llama_vocab::detokenize` does.
//!
//! Decision: the merge loop itself, not a Hugging Face `tokenizers` BPE
//! spec. The spec (merges derived from the scores: every split of a token
//! into two tokens, ranked by the token's score; `byte_fallback`; a `▁`
//! normalizer; the special tokens as added tokens) was tried with the
//! `tokenizers` Python package in `tests/fixtures/make_gemma3_tokens.py
//! --cross-check` and gave llama.cpp's ids on all 224 texts checked, but
//! it needs 513,511 merges for Gemma 3 (5.4 s to build in that package,
//! where this takes about 0.15 s: one hash map), and it differs from
//! llama.cpp by construction in three places: added tokens are matched
//! leftmost-longest, not longest-first; two pairs of equal score are
//! ordered by merge rank, not by position; and a character outside the
//! vocabulary becomes bytes at once instead of staying mergeable.
//!
//! Not done, because they do not change Gemma 3's ids: llama.cpp also marks
//! tokens whose text looks like an end of turn (`<end_of_turn>`, `</s>`, …)
//! as control when the file did not (of those texts Gemma 3 has
//! `<end_of_turn>` and `<eos>`, control, and `</s>`, user-defined: all
//! matched in text already), and honours per-model `lstrip`/`rstrip` flags
//! that it sets only for Phi-3 and some BERTs.
//!
//! Gemma 3's chat format, for the chat template this file does not carry:
//! Google's `chat_template` as printed from the Hugging Face tokenizer and
//! stored in unslothai/unsloth `unsloth/chat_templates.py` (the same text
//! is in several other public repositories). The template writes
//! `bos_token` itself, then per message `<start_of_turn>` + role (`model`
//! for the assistant) + `\n` + the trimmed content + `<end_of_turn>\n`,
//! and with `add_generation_prompt` ends with `<start_of_turn>model\n`.
//! One user message "Hi" renders as
//! `<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n`. A
//! system message is no turn of its own: its text and a blank line open
//! the first user turn's content. Roles must alternate user/model. Since
//! `Tokenizer::encode` writes BOS itself for this vocabulary, a rendered
//! prompt must leave its `<bos>` out, or BOS comes twice (llama.cpp warns
//! of that case).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use super::{Gguf, Value};
use crate::model::ModelError;

/// llama.cpp's token types (`llama_token_type`).
const UNKNOWN: i32 = 2;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;
const BYTE: i32 = 6;

/// SentencePiece's visible space.
const SPACE: char = '\u{2581}';

/// A SentencePiece vocabulary read from GGUF metadata, and how to encode
/// with it.
#[derive(Clone, PartialEq)]
pub struct Spm {
    tokens: Vec<String>,
    scores: Vec<f32>,
    types: Vec<i32>,
    ids: HashMap<String, u32>,
    /// Special tokens, longest text first (then by id).
    specials: Vec<u32>,
    /// The token of each byte, `<0xXX>` (or the byte itself as a token).
    bytes: Vec<Option<u32>>,
    /// The BOS token, when it is to be written.
    bos: Option<u32>,
    add_space_prefix: bool,
}

/// A text fragment (a byte range of the input) or a special token.
#[derive(Clone, Copy, Debug)]
enum Part {
    Text(usize, usize),
    Token(u32),
}

fn err(message: String) -> ModelError {
    ModelError::Tokenizer(message)
}

impl Spm {
    /// Reads `tokenizer.ggml.{tokens, scores, token_type, bos_token_id,
    /// add_bos_token, add_space_prefix}`. Scores and types may be absent
    /// (0 and normal, as llama.cpp assumes); when present they must hold one
    /// entry per token.
    pub fn from_gguf(g: &Gguf) -> Result<Spm, ModelError> {
        let tokens = read_tokens(g)?;
        let n = tokens.len();
        let scores = read_scores(g, n)?;
        let types = read_types(g, n)?;
        let mut ids = HashMap::with_capacity(n);
        for (id, t) in tokens.iter().enumerate() {
            if ids.insert(t.clone(), id as u32).is_some() {
                return Err(err(format!(
                    "token `{t}` occurs twice in tokenizer.ggml.tokens"
                )));
            }
        }
        let mut specials: Vec<u32> = (0..n as u32)
            .filter(|&id| matches!(types[id as usize], UNKNOWN | CONTROL | USER_DEFINED))
            .collect();
        specials.sort_by_key(|&id| std::cmp::Reverse(tokens[id as usize].len()));
        let bytes = (0..=255u8).map(|b| byte_token(&ids, b)).collect();
        let bos = read_bos(g, n)?;
        let add_space_prefix = flag(g, "tokenizer.ggml.add_space_prefix", true)?;
        Ok(Spm {
            tokens,
            scores,
            types,
            ids,
            specials,
            bytes,
            bos,
            add_space_prefix,
        })
    }

    /// The number of tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the vocabulary is empty.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The BOS token written before the text, if any.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// The id of a token's text.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.ids.get(token).copied()
    }

    /// The ids of `text`, without BOS (see [`Spm::bos`]).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        let mut out = Vec::new();
        let mut prev_special = true;
        for part in self.partition(text) {
            match part {
                Part::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Part::Text(start, end) => {
                    let prefix = if self.add_space_prefix && prev_special {
                        " "
                    } else {
                        ""
                    };
                    let escaped: String = prefix
                        .chars()
                        .chain(text[start..end].chars())
                        .map(|c| if c == ' ' { SPACE } else { c })
                        .collect();
                    self.merge(&escaped, &mut out)?;
                    prev_special = false;
                }
            }
        }
        Ok(out)
    }

    /// Cuts the special tokens out of `text`, longest first.
    fn partition(&self, text: &str) -> Vec<Part> {
        let mut parts = if text.is_empty() {
            Vec::new()
        } else {
            vec![Part::Text(0, text.len())]
        };
        for &id in &self.specials {
            let needle = self.tokens[id as usize].as_str();
            if !text.contains(needle) {
                continue;
            }
            parts = parts
                .into_iter()
                .flat_map(|p| split_on(text, p, needle, id))
                .collect();
        }
        parts
    }

    /// llama.cpp's merge loop on one escaped fragment, appending its ids.
    fn merge(&self, text: &str, out: &mut Vec<u32>) -> Result<(), ModelError> {
        let mut syms: Vec<Symbol> = text
            .char_indices()
            .map(|(start, c)| Symbol {
                start,
                len: c.len_utf8(),
            })
            .collect();
        let n = syms.len();
        let mut prev: Vec<Option<usize>> = (0..n).map(|i| i.checked_sub(1)).collect();
        let mut next: Vec<Option<usize>> = (0..n).map(|i| Some(i + 1).filter(|&j| j < n)).collect();
        let mut queue = BinaryHeap::new();
        for i in 1..n {
            self.push_pair(text, &syms, i - 1, i, &mut queue);
        }
        while let Some(pair) = queue.pop() {
            let (l, r) = (syms[pair.left], syms[pair.right]);
            if l.len == 0 || r.len == 0 || l.len + r.len != pair.size {
                continue; // one side has changed since the pair was queued
            }
            syms[pair.left].len += r.len;
            syms[pair.right].len = 0;
            next[pair.left] = next[pair.right];
            if let Some(after) = next[pair.right] {
                prev[after] = Some(pair.left);
            }
            if let Some(before) = prev[pair.left] {
                self.push_pair(text, &syms, before, pair.left, &mut queue);
            }
            if let Some(after) = next[pair.left] {
                self.push_pair(text, &syms, pair.left, after, &mut queue);
            }
        }
        let mut at = (n > 0).then_some(0);
        while let Some(i) = at {
            self.emit(&text[syms[i].start..syms[i].start + syms[i].len], out)?;
            at = next[i];
        }
        Ok(())
    }

    /// Queues the pair `(left, right)` when their concatenation is a token.
    fn push_pair(
        &self,
        text: &str,
        syms: &[Symbol],
        left: usize,
        right: usize,
        queue: &mut BinaryHeap<Pair>,
    ) {
        let (l, r) = (syms[left], syms[right]);
        let joined = &text[l.start..r.start + r.len];
        if let Some(&id) = self.ids.get(joined) {
            queue.push(Pair {
                score: self.scores[id as usize],
                left,
                right,
                size: l.len + r.len,
            });
        }
    }

    /// One final piece: its token, or its bytes.
    fn emit(&self, piece: &str, out: &mut Vec<u32>) -> Result<(), ModelError> {
        if let Some(&id) = self.ids.get(piece) {
            out.push(id);
            return Ok(());
        }
        for b in piece.bytes() {
            let id = self.bytes[usize::from(b)]
                .ok_or_else(|| err(format!("the vocabulary has no token for byte 0x{b:02X}")))?;
            out.push(id);
        }
        Ok(())
    }

    /// The text of `ids`, special tokens written out.
    pub fn decode(&self, ids: &[u32]) -> Result<String, ModelError> {
        let mut bytes = Vec::new();
        for (k, &id) in ids.iter().enumerate() {
            let token = self
                .tokens
                .get(id as usize)
                .ok_or_else(|| err(format!("token id {id} is outside the vocabulary")))?;
            let start = bytes.len();
            match self.types[id as usize] {
                UNKNOWN | CONTROL | USER_DEFINED => bytes.extend(token.as_bytes()),
                BYTE => bytes.push(byte_value(token).ok_or_else(|| {
                    err(format!("byte token `{token}` is not of the form <0xXX>"))
                })?),
                UNUSED => {}
                _ => bytes.extend(token.replace(SPACE, " ").as_bytes()),
            }
            if k == 0 && self.add_space_prefix && bytes.get(start) == Some(&b' ') {
                bytes.remove(start);
            }
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

impl std::fmt::Debug for Spm {
    // The derived form would print the whole vocabulary.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spm")
            .field("tokens", &self.tokens.len())
            .field("specials", &self.specials.len())
            .field("bos", &self.bos)
            .field("add_space_prefix", &self.add_space_prefix)
            .finish_non_exhaustive()
    }
}

/// A piece of the fragment being merged: `len` bytes from `start`, 0 once
/// merged into its left neighbour.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
}

/// A queued merge. The queue pops the highest score first, then the
/// leftmost pair (llama.cpp's `llm_bigram_spm::comparator`).
struct Pair {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl Ord for Pair {
    fn cmp(&self, other: &Pair) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Pair {
    fn partial_cmp(&self, other: &Pair) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Pair {
    fn eq(&self, other: &Pair) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Pair {}

/// Splits a text part on every occurrence of `needle` (left to right, not
/// overlapping), the occurrences becoming `id`.
fn split_on(text: &str, part: Part, needle: &str, id: u32) -> Vec<Part> {
    let Part::Text(start, end) = part else {
        return vec![part];
    };
    let mut out = Vec::new();
    let mut from = start;
    for (at, _) in text[start..end].match_indices(needle) {
        let at = start + at;
        if at > from {
            out.push(Part::Text(from, at));
        }
        out.push(Part::Token(id));
        from = at + needle.len();
    }
    if from < end {
        out.push(Part::Text(from, end));
    }
    out
}

/// The byte `<0xXX>` stands for.
fn byte_value(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// llama.cpp's `byte_to_token`: `<0xXX>`, else the byte as a one-character
/// token (ASCII only: other single bytes are not UTF-8).
fn byte_token(ids: &HashMap<String, u32>, b: u8) -> Option<u32> {
    ids.get(&format!("<0x{b:02X}>"))
        .or_else(|| {
            b.is_ascii()
                .then(|| ids.get(&char::from(b).to_string()))
                .flatten()
        })
        .copied()
}

/// The token texts; an empty one is renamed `[EMPTY_<id>]`, as llama.cpp
/// does (an empty special token would otherwise match everywhere).
fn read_tokens(g: &Gguf) -> Result<Vec<String>, ModelError> {
    let key = "tokenizer.ggml.tokens";
    let items = array(g.require(key)?, key)?;
    items
        .iter()
        .enumerate()
        .map(|(id, v)| match v {
            Value::String(s) if s.is_empty() => Ok(format!("[EMPTY_{id}]")),
            Value::String(s) => Ok(s.clone()),
            other => Err(err(format!(
                "{key} holds {:?}, not strings",
                other.value_type()
            ))),
        })
        .collect()
}

/// f32 scores (i32 ones are converted, as llama.cpp accepts both).
fn read_scores(g: &Gguf, n: usize) -> Result<Vec<f32>, ModelError> {
    column(g, "tokenizer.ggml.scores", n, 0.0, "f32", |v| match v {
        Value::F32(s) => Some(*s),
        Value::I32(s) => Some(*s as f32),
        _ => None,
    })
}

fn read_types(g: &Gguf, n: usize) -> Result<Vec<i32>, ModelError> {
    column(g, "tokenizer.ggml.token_type", n, 1, "i32", |v| match v {
        Value::I32(t) => Some(*t),
        _ => None,
    })
}

/// One entry per token, `convert`ed; `default` for every token when the
/// key is absent.
fn column<T: Clone>(
    g: &Gguf,
    key: &str,
    n: usize,
    default: T,
    what: &str,
    convert: fn(&Value) -> Option<T>,
) -> Result<Vec<T>, ModelError> {
    let Some(v) = g.get(key) else {
        return Ok(vec![default; n]);
    };
    let items = sized(array(v, key)?, key, n)?;
    items
        .iter()
        .map(|v| {
            convert(v).ok_or_else(|| err(format!("{key} holds {:?}, not {what}", v.value_type())))
        })
        .collect()
}

/// The BOS token when `add_bos_token` (default true) is set: the
/// `bos_token_id` key, else llama.cpp's default for SPM vocabularies, 1.
fn read_bos(g: &Gguf, n: usize) -> Result<Option<u32>, ModelError> {
    if !flag(g, "tokenizer.ggml.add_bos_token", true)? {
        return Ok(None);
    }
    let bos = match g.get("tokenizer.ggml.bos_token_id") {
        Some(_) => g.usize("tokenizer.ggml.bos_token_id")?,
        None => 1,
    };
    if bos >= n {
        return Err(err(format!(
            "bos token {bos} is outside the vocabulary of {n}"
        )));
    }
    Ok(Some(bos as u32))
}

fn flag(g: &Gguf, key: &str, default: bool) -> Result<bool, ModelError> {
    match g.get(key) {
        None => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(err(format!(
            "{key} is {:?}, not a bool",
            other.value_type()
        ))),
    }
}

fn array<'a>(v: &'a Value, key: &str) -> Result<&'a [Value], ModelError> {
    v.as_array()
        .ok_or_else(|| err(format!("{key} is {:?}, not an array", v.value_type())))
}

fn sized<'a>(items: &'a [Value], key: &str, n: usize) -> Result<&'a [Value], ModelError> {
    if items.len() != n {
        return Err(err(format!(
            "{key} has {} entries for {n} tokens",
            items.len()
        )));
    }
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::super::{ValueType, Writer};
    use super::*;
    use crate::model::Tokenizer;

    const NORMAL: i32 = 1;

    /// Control tokens `<pad> <eos> <bos> <start_of_turn>` (ids 0–3), the
    /// user-defined `\n` and two spaces (4, 5), the 256 byte tokens (6–261),
    /// then `normal` with their scores; `extra` metadata after.
    fn vocab(normal: &[(&str, f32)], extra: &[(&str, Value)]) -> Gguf {
        let specials = ["<pad>", "<eos>", "<bos>", "<start_of_turn>"];
        let mut entries: Vec<(String, f32, i32)> = specials
            .iter()
            .map(|t| (t.to_string(), -1000.0, CONTROL))
            .collect();
        entries.push(("\n".into(), -1000.0, USER_DEFINED));
        entries.push(("  ".into(), -1000.0, USER_DEFINED));
        entries.extend((0..=255u8).map(|b| (format!("<0x{b:02X}>"), 0.0, BYTE)));
        entries.extend(normal.iter().map(|(t, s)| (t.to_string(), *s, NORMAL)));
        let column = |ty, f: &dyn Fn(&(String, f32, i32)) -> Value| {
            Value::Array(ty, entries.iter().map(f).collect())
        };
        let base = [
            ("tokenizer.ggml.model", Value::String("llama".into())),
            ("tokenizer.ggml.bos_token_id", Value::U32(2)),
            (
                "tokenizer.ggml.tokens",
                column(ValueType::String, &|e| Value::String(e.0.clone())),
            ),
            (
                "tokenizer.ggml.scores",
                column(ValueType::F32, &|e| Value::F32(e.1)),
            ),
            (
                "tokenizer.ggml.token_type",
                column(ValueType::I32, &|e| Value::I32(e.2)),
            ),
        ];
        let mut w = Writer::new(3);
        for (key, value) in &base {
            if extra.iter().all(|(k, _)| k != key) {
                w.meta(key, value.clone());
            }
        }
        for (key, value) in extra {
            w.meta(key, value.clone());
        }
        Gguf::from_bytes(w.to_bytes()).unwrap()
    }

    /// A file holding only `tokenizer.ggml.tokens`.
    fn only_tokens(tokens: &[&str]) -> Gguf {
        let tokens = tokens
            .iter()
            .map(|t| Value::String(t.to_string()))
            .collect();
        let mut w = Writer::new(3);
        w.meta(
            "tokenizer.ggml.tokens",
            Value::Array(ValueType::String, tokens),
        );
        Gguf::from_bytes(w.to_bytes()).unwrap()
    }

    const NO_PREFIX: (&str, Value) = ("tokenizer.ggml.add_space_prefix", Value::Bool(false));

    const PLAIN: [(&str, Value); 2] = [
        ("tokenizer.ggml.add_bos_token", Value::Bool(false)),
        ("tokenizer.ggml.add_space_prefix", Value::Bool(false)),
    ];

    fn spm(normal: &[(&str, f32)]) -> Spm {
        Spm::from_gguf(&vocab(normal, &PLAIN)).unwrap()
    }

    /// The token texts of `text`.
    fn pieces(spm: &Spm, text: &str) -> Vec<String> {
        let ids = spm.encode(text).unwrap();
        ids.iter()
            .map(|&id| spm.tokens[id as usize].clone())
            .collect()
    }

    const ABC: [(&str, f32); 3] = [("a", -1.0), ("b", -2.0), ("c", -3.0)];

    #[test]
    fn merges_the_highest_scoring_pair_first() {
        let t = spm(&[&ABC[..], &[("ab", -20.0), ("bc", -10.0)]].concat());
        assert_eq!(pieces(&t, "abc"), ["a", "bc"]);
        let t = spm(&[&ABC[..], &[("ab", -10.0), ("bc", -20.0)]].concat());
        assert_eq!(pieces(&t, "abc"), ["ab", "c"]);
        // Merged pieces merge again: ab (the best), then ab + c.
        let t = spm(&[&ABC[..], &[("ab", -10.0), ("bc", -20.0), ("abc", -30.0)]].concat());
        assert_eq!(pieces(&t, "abcab"), ["abc", "ab"]);
    }

    #[test]
    fn equal_scores_merge_the_leftmost_pair() {
        // `bc` comes first in the vocabulary; position decides, not id.
        let t = spm(&[&ABC[..], &[("bc", -10.0), ("ab", -10.0)]].concat());
        assert_eq!(pieces(&t, "abc"), ["ab", "c"]);
        assert_eq!(pieces(&t, "bcab"), ["bc", "ab"]);
        let t = spm(&[("a", -1.0), ("aa", -5.0)]);
        assert_eq!(pieces(&t, "aaa"), ["aa", "a"]);
    }

    #[test]
    fn characters_outside_the_vocabulary_become_bytes() {
        let t = spm(&[("a", -1.0), ("éa", -2.0)]);
        assert_eq!(pieces(&t, "aé"), ["a", "<0xC3>", "<0xA9>"]);
        // Outside the vocabulary alone, but still mergeable (llama.cpp).
        assert_eq!(pieces(&t, "éa"), ["éa"]);
        assert_eq!(pieces(&t, ""), Vec::<String>::new());
    }

    #[test]
    fn spaces_become_u2581_and_the_prefix_follows_the_flag() {
        let normal = [
            ("a", -1.0),
            ("b", -2.0),
            ("▁", -3.0),
            ("▁b", -4.0),
            ("▁a", -5.0),
        ];
        let t = spm(&normal);
        assert_eq!(pieces(&t, "a b"), ["a", "▁b"]);
        assert_eq!(pieces(&t, " a"), ["▁a"]);
        let prefixed = [("tokenizer.ggml.add_bos_token", Value::Bool(false))];
        let t = Spm::from_gguf(&vocab(&normal, &prefixed)).unwrap();
        assert_eq!(
            pieces(&t, "a<start_of_turn>b"),
            ["▁a", "<start_of_turn>", "▁b"]
        );
        // One leading space is dropped again when decoding.
        let ids = t.encode("a<start_of_turn>b").unwrap();
        assert_eq!(t.decode(&ids).unwrap(), "a<start_of_turn> b");
    }

    #[test]
    fn special_tokens_in_text_are_whole_tokens_longest_first() {
        let t = spm(&[
            ("a", -1.0),
            ("▁", -2.0),
            ("<", -3.0),
            ("s", -4.0),
            (">", -5.0),
        ]);
        assert_eq!(
            pieces(&t, "a<start_of_turn>\na  a   a"),
            ["a", "<start_of_turn>", "\n", "a", "  ", "a", "  ", "▁", "a"]
        );
        // Not a special token: merged from characters as usual.
        assert_eq!(pieces(&t, "<s>"), ["<", "s", ">"]);
    }

    #[test]
    fn bos_is_written_when_the_file_says_so_and_kept_on_truncation() {
        let t = Tokenizer::from_gguf(&vocab(&[("a", -1.0)], &[NO_PREFIX])).unwrap();
        let (bos, a) = (2, t.token_id("a").unwrap());
        assert_eq!(t.encode("aaa", 100).unwrap(), [bos, a, a, a]);
        assert_eq!(t.encode("aaa", 3).unwrap(), [bos, a, a]);
        assert_eq!(t.encode("", 3).unwrap(), [bos]);
        assert_eq!((t.special_token_count(), t.id_bound()), (1, 263));
        let t = Tokenizer::from_gguf(&vocab(&[("a", -1.0)], &PLAIN)).unwrap();
        assert_eq!(t.encode("a", 100).unwrap(), [a]);
        assert_eq!(t.special_token_count(), 0);
    }

    #[test]
    fn decoding_restores_spaces_and_fuses_bytes() {
        let normal = [("a", -1.0), ("▁", -2.0), ("▁b", -3.0)];
        let t = Tokenizer::from_gguf(&vocab(&normal, &[NO_PREFIX])).unwrap();
        let text = "<start_of_turn>a b\né 🦀  a";
        let ids = t.encode(text, 100).unwrap();
        assert_eq!(t.decode(&ids[1..]).unwrap(), text);
        assert_eq!(t.decode(&ids[..1]).unwrap(), "<bos>");
        // A lone continuation byte is not UTF-8.
        assert_eq!(t.decode(&[6 + 0xA9]).unwrap(), "\u{FFFD}");
        assert!(matches!(t.decode(&[265]), Err(ModelError::Tokenizer(_))));
    }

    fn refused(extra: &[(&str, Value)]) -> bool {
        matches!(
            Spm::from_gguf(&vocab(&[("a", -1.0)], extra)),
            Err(ModelError::Tokenizer(_))
        )
    }

    #[test]
    fn hostile_metadata_is_a_tokenizer_error() {
        let f32s = |n| Value::Array(ValueType::F32, vec![Value::F32(0.0); n]);
        assert!(refused(&[("tokenizer.ggml.scores", f32s(3))]));
        assert!(refused(&[("tokenizer.ggml.scores", Value::F32(0.0))]));
        let u32s = Value::Array(ValueType::U32, vec![Value::U32(1); 263]);
        assert!(refused(&[("tokenizer.ggml.token_type", u32s.clone())]));
        assert!(refused(&[("tokenizer.ggml.scores", u32s.clone())]));
        assert!(refused(&[("tokenizer.ggml.tokens", u32s)]));
        let twice = Spm::from_gguf(&only_tokens(&["a", "b", "a"]));
        assert!(matches!(twice, Err(ModelError::Tokenizer(_))));
        assert!(refused(&[("tokenizer.ggml.bos_token_id", Value::U32(263))]));
        assert!(refused(&[("tokenizer.ggml.add_bos_token", Value::U8(1))]));
    }

    #[test]
    fn odd_but_valid_metadata_is_read_as_llama_cpp_reads_it() {
        // No scores or types: all 0 and normal. An empty token is renamed.
        let t = Spm::from_gguf(&only_tokens(&["", "a", "b", "ab"])).unwrap();
        assert_eq!(t.tokens[0], "[EMPTY_0]");
        assert_eq!((t.bos(), t.add_space_prefix), (Some(1), true));
        // No `▁a` token and no byte tokens: the prefix space has no token.
        assert!(matches!(t.encode("ab"), Err(ModelError::Tokenizer(_))));
        // NaN scores order without panicking.
        let nan = Value::Array(ValueType::F32, vec![Value::F32(f32::NAN); 264]);
        let t = Spm::from_gguf(&vocab(
            &[("a", -1.0), ("aa", -1.0)],
            &[("tokenizer.ggml.scores", nan)],
        ));
        assert!(t.unwrap().encode("aaaa").is_ok());
    }
}
