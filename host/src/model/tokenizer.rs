//! Text to token ids, the way sentence-transformers does it.

use std::sync::Arc;

use serde_json::json;

use super::ModelError;
use super::gguf::Spm;

/// The special tokens of a generated vocabulary, at ids 0, 1, 2, 3, 4: BERT's
/// names, so that generated and real checkpoints read alike.
pub(crate) const SPECIAL_TOKENS: [&str; 5] = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"];

/// ASCII punctuation: BERT's pre-tokenizer makes each of these a word of its
/// own, so they never need a `##` continuation form.
const PUNCTUATION: &str = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";

/// A Hugging Face tokenizer (`tokenizer.json`), or llama.cpp's
/// SentencePiece tokenizer read from a GGUF vocabulary ([`Spm`]), with the
/// truncation rule of sentence-transformers.
///
/// `tokenizer.json` files often carry the padding and truncation settings of
/// whoever saved them (all-MiniLM-L6-v2's pads and truncates to 128); those
/// are dropped on load, because padding is the batcher's business and the
/// limit is an argument of [`Tokenizer::encode`].
#[derive(Clone)]
pub struct Tokenizer {
    inner: Inner,
    /// sentence-transformers' `do_lower_case`: lowercase the text before the
    /// tokenizer sees it.
    lowercase_input: bool,
}

#[derive(Clone)]
enum Inner {
    /// A `tokenizers` tokenizer and its canonical (compact) serialization:
    /// what equality compares and what [`Tokenizer::to_json`] returns.
    Hf(Box<tokenizers::Tokenizer>, String),
    /// llama.cpp's SentencePiece tokenizer (shared: its vocabulary is large).
    Spm(Arc<Spm>),
}

impl Tokenizer {
    /// Parses a `tokenizer.json`, dropping its padding and truncation
    /// settings. `lowercase_input` is `do_lower_case` from
    /// `sentence_bert_config.json`.
    pub fn from_json(bytes: &[u8], lowercase_input: bool) -> Result<Tokenizer, ModelError> {
        let mut inner = tokenizers::Tokenizer::from_bytes(bytes)
            .map_err(|e| ModelError::Tokenizer(format!("cannot parse tokenizer.json: {e}")))?;
        inner
            .with_truncation(None)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        inner.with_padding(None);
        let json = inner
            .to_string(false)
            .map_err(|e| ModelError::Tokenizer(format!("cannot serialize tokenizer: {e}")))?;
        Ok(Tokenizer {
            inner: Inner::Hf(Box::new(inner), json),
            lowercase_input,
        })
    }

    /// llama.cpp's SentencePiece tokenizer.
    pub fn from_spm(spm: Spm) -> Tokenizer {
        Tokenizer {
            inner: Inner::Spm(Arc::new(spm)),
            lowercase_input: false,
        }
    }

    /// A character-level WordPiece tokenizer with BERT's normalizer
    /// (lowercasing, accent stripping) and pre-tokenizer, and
    /// `[CLS] … [SEP]` post-processing.
    ///
    /// Ids: the [`SPECIAL_TOKENS`] at 0–4, then `a`–`z`, `0`–`9`, ASCII
    /// punctuation, then the `##` continuations of letters and digits (109
    /// entries in all), then `[unusedN]` up to `vocab_size`. A smaller
    /// `vocab_size` cuts the list short, and words using a character past
    /// the cut become `[UNK]`, as do words with characters outside ASCII.
    pub(crate) fn char_level(vocab_size: usize) -> Tokenizer {
        let alnum: Vec<String> = ('a'..='z').chain('0'..='9').map(String::from).collect();
        let mut entries: Vec<String> = SPECIAL_TOKENS.iter().map(|s| s.to_string()).collect();
        entries.extend(alnum.iter().cloned());
        entries.extend(PUNCTUATION.chars().map(String::from));
        entries.extend(alnum.iter().map(|c| format!("##{c}")));
        let size = vocab_size.max(SPECIAL_TOKENS.len());
        let fill = size.saturating_sub(entries.len());
        entries.extend((0..fill).map(|i| format!("[unused{i}]")));
        entries.truncate(size);

        let vocab: serde_json::Map<String, serde_json::Value> = entries
            .iter()
            .enumerate()
            .map(|(id, t)| (t.clone(), json!(id)))
            .collect();
        let added: Vec<serde_json::Value> = SPECIAL_TOKENS
            .iter()
            .enumerate()
            .map(|(id, t)| {
                json!({"id": id, "content": t, "single_word": false, "lstrip": false,
                       "rstrip": false, "normalized": false, "special": true})
            })
            .collect();
        let special = |name: &str, id: usize| json!({"id": name, "ids": [id], "tokens": [name]});
        let spec = json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": {"type": "BertNormalizer", "clean_text": true,
                           "handle_chinese_chars": true, "strip_accents": null, "lowercase": true},
            "pre_tokenizer": {"type": "BertPreTokenizer"},
            "post_processor": {
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}},
                           {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                         {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": "[SEP]", "type_id": 0}},
                         {"Sequence": {"id": "B", "type_id": 1}},
                         {"SpecialToken": {"id": "[SEP]", "type_id": 1}}],
                "special_tokens": {"[CLS]": special("[CLS]", 2), "[SEP]": special("[SEP]", 3)}
            },
            "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
            "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                      "max_input_chars_per_word": 100, "vocab": vocab}
        });
        match Tokenizer::from_json(spec.to_string().as_bytes(), false) {
            Ok(t) => t,
            // The JSON above is a constant shape; failing to parse it is a
            // bug in this function, not an input error.
            Err(e) => panic!("the generated tokenizer.json does not parse: {e}"),
        }
    }

    /// Token ids of `text`: the tokenizer's own special tokens around it (for
    /// BERT `[CLS] … [SEP]`, as the post-processor in `tokenizer.json` says),
    /// truncated to at most `max_tokens` ids *including* the special tokens,
    /// by dropping text tokens from the end so that `[SEP]` stays last. This
    /// is what sentence-transformers does with `max_seq_length`.
    pub fn encode(&self, text: &str, max_tokens: usize) -> Result<Vec<u32>, ModelError> {
        let lowered;
        let text = if self.lowercase_input {
            lowered = text.to_lowercase();
            lowered.as_str()
        } else {
            text
        };
        let specials = self.special_token_count();
        let room = max_tokens.checked_sub(specials).ok_or_else(|| {
            ModelError::Tokenizer(format!(
                "max_tokens {max_tokens} leaves no room for the {specials} special tokens"
            ))
        })?;
        let inner = match &self.inner {
            Inner::Hf(inner, _) => inner,
            Inner::Spm(spm) => {
                let mut ids: Vec<u32> = spm.bos().into_iter().collect();
                let plain = spm.encode(text)?;
                ids.extend(&plain[..plain.len().min(room)]);
                return Ok(ids);
            }
        };
        let mut plain = inner
            .encode(text, false)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        plain.truncate(room, 0, tokenizers::TruncationDirection::Right);
        let full = inner
            .post_process(plain, None, true)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        Ok(full.get_ids().to_vec())
    }

    /// How many special tokens the post-processor adds to one sequence (2
    /// for BERT: `[CLS]` and `[SEP]`; 1 for a SentencePiece BOS).
    pub fn special_token_count(&self) -> usize {
        match &self.inner {
            Inner::Hf(inner, _) => inner
                .get_post_processor()
                .map_or(0, |p| tokenizers::PostProcessor::added_tokens(p, false)),
            Inner::Spm(spm) => usize::from(spm.bos().is_some()),
        }
    }

    /// The text of token ids, special tokens included (a generated token
    /// is shown as the model produced it).
    pub fn decode(&self, ids: &[u32]) -> Result<String, ModelError> {
        match &self.inner {
            Inner::Hf(inner, _) => inner
                .decode(ids, false)
                .map_err(|e| ModelError::Tokenizer(e.to_string())),
            Inner::Spm(spm) => spm.decode(ids),
        }
    }

    /// The id of a token string, if the vocabulary has it.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        match &self.inner {
            Inner::Hf(inner, _) => inner.token_to_id(token),
            Inner::Spm(spm) => spm.token_id(token),
        }
    }

    /// The largest id the tokenizer can produce, plus one.
    pub fn id_bound(&self) -> usize {
        match &self.inner {
            Inner::Hf(inner, _) => inner
                .get_vocab(true)
                .values()
                .map(|&id| id as usize + 1)
                .max()
                .unwrap_or(0),
            Inner::Spm(spm) => spm.len(),
        }
    }

    /// Whether sentence-transformers' `do_lower_case` is set.
    pub fn lowercase_input(&self) -> bool {
        self.lowercase_input
    }

    /// The tokenizer as compact `tokenizer.json` text (without padding or
    /// truncation settings); `None` for a SentencePiece tokenizer read from
    /// GGUF, which has no such form.
    pub fn to_json(&self) -> Option<&str> {
        match &self.inner {
            Inner::Hf(_, json) => Some(json),
            Inner::Spm(_) => None,
        }
    }
}

impl PartialEq for Tokenizer {
    fn eq(&self, other: &Tokenizer) -> bool {
        let same = match (&self.inner, &other.inner) {
            (Inner::Hf(_, a), Inner::Hf(_, b)) => a == b,
            (Inner::Spm(a), Inner::Spm(b)) => a == b,
            _ => false,
        };
        same && self.lowercase_input == other.lowercase_input
    }
}

impl std::fmt::Debug for Tokenizer {
    // The derived form would print the whole vocabulary.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let vocab = match &self.inner {
            Inner::Hf(inner, _) => inner.get_vocab_size(true),
            Inner::Spm(spm) => spm.len(),
        };
        f.debug_struct("Tokenizer")
            .field("vocab", &vocab)
            .field("special_tokens", &self.special_token_count())
            .field("lowercase_input", &self.lowercase_input)
            .finish_non_exhaustive()
    }
}
