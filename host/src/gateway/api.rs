//! The wire format, as the `openai` package reads and writes it. Fields
//! this gateway does not know are ignored (clients send many); fields it
//! knows are checked, and a value it cannot honour is a 400, not a silent
//! default.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::error::ApiError;
use crate::generate::Sampling;

/// A text or a list of them (`stop`, `prompt`, `input`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum OneOrMany<T> {
    /// One.
    One(T),
    /// Many.
    Many(Vec<T>),
}

impl<T> OneOrMany<T> {
    /// As a list.
    pub fn into_vec(self) -> Vec<T> {
        match self {
            OneOrMany::One(t) => vec![t],
            OneOrMany::Many(v) => v,
        }
    }
}

/// A message's content: a text, or parts of which the text ones count.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// `[{"type": "text", "text": …}, …]`.
    Parts(Vec<Part>),
}

/// One part of a message's content.
#[derive(Clone, Debug, Deserialize)]
pub struct Part {
    /// `text` (others are refused).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text.
    #[serde(default)]
    pub text: Option<String>,
}

/// One chat message.
#[derive(Clone, Debug, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, …
    pub role: String,
    /// What was said (`null` for an assistant turn with none).
    #[serde(default)]
    pub content: Option<Content>,
}

impl ChatMessage {
    /// The message's text; a part that is not text is refused.
    pub fn text(&self) -> Result<String, ApiError> {
        match &self.content {
            None => Ok(String::new()),
            Some(Content::Text(t)) => Ok(t.clone()),
            Some(Content::Parts(parts)) => parts
                .iter()
                .map(|p| match (p.kind.as_str(), &p.text) {
                    ("text", Some(t)) => Ok(t.as_str()),
                    (kind, _) => Err(ApiError::bad_request(
                        "unsupported_content",
                        format!("a message part of type `{kind}` is not supported; send text"),
                    )),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(|t| t.concat()),
        }
    }
}

/// What a completion request asks for, chat or plain.
#[derive(Clone, Debug, Deserialize)]
pub struct Params {
    /// The model id.
    pub model: String,
    /// Tokens to generate at most.
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// The newer name for the same (chat).
    #[serde(default)]
    pub max_completion_tokens: Option<u64>,
    /// 0 is greedy; OpenAI's default is 1.
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Nucleus sampling.
    #[serde(default)]
    pub top_p: Option<f64>,
    /// llama.cpp's and vLLM's extension.
    #[serde(default)]
    pub top_k: Option<usize>,
    /// The sampler's seed (default: a random one).
    #[serde(default)]
    pub seed: Option<u64>,
    /// Texts that end the generation (not included in it).
    #[serde(default)]
    pub stop: Option<OneOrMany<String>>,
    /// Server-sent events, one per token.
    #[serde(default)]
    pub stream: Option<bool>,
    /// Choices: only 1.
    #[serde(default)]
    pub n: Option<u64>,
}

/// The most stop strings a request may give (OpenAI's limit).
const MAX_STOPS: usize = 4;

impl Params {
    /// The sampling settings, checked; `random_seed` when none is given.
    pub fn sampling(&self, random_seed: u64) -> Result<Sampling, ApiError> {
        let temperature = self.temperature.unwrap_or(1.0);
        if !(0.0..=2.0).contains(&temperature) {
            return Err(bad("temperature", "between 0 and 2"));
        }
        let top_p = self.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(bad("top_p", "above 0 and at most 1"));
        }
        if self.n.is_some_and(|n| n != 1) {
            return Err(bad("n", "1 (one choice per request)"));
        }
        Ok(Sampling {
            temperature,
            top_k: self.top_k.unwrap_or(0),
            top_p,
            seed: self.seed.unwrap_or(random_seed),
        })
    }

    /// Tokens to generate at most, if the request limits them.
    pub fn max_tokens(&self) -> Result<Option<usize>, ApiError> {
        match self.max_completion_tokens.or(self.max_tokens) {
            Some(0) => Err(bad("max_tokens", "at least 1")),
            Some(n) => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
            None => Ok(None),
        }
    }

    /// The stop strings, checked.
    pub fn stops(&self) -> Result<Vec<String>, ApiError> {
        let stops = self.stop.clone().map_or_else(Vec::new, OneOrMany::into_vec);
        if stops.len() > MAX_STOPS || stops.iter().any(String::is_empty) {
            return Err(bad("stop", "at most 4 non-empty strings"));
        }
        Ok(stops)
    }
}

fn bad(field: &str, what: &str) -> ApiError {
    ApiError::bad_request("invalid_value", format!("`{field}` must be {what}"))
}

/// `POST /v1/chat/completions`.
#[derive(Clone, Debug, Deserialize)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// Everything else.
    #[serde(flatten)]
    pub params: Params,
}

/// `POST /v1/completions`.
#[derive(Clone, Debug, Deserialize)]
pub struct CompletionRequest {
    /// The prompt: one text (a list of one is accepted).
    pub prompt: OneOrMany<String>,
    /// Everything else.
    #[serde(flatten)]
    pub params: Params,
}

/// `POST /v1/embeddings`.
#[derive(Clone, Debug, Deserialize)]
pub struct EmbeddingRequest {
    /// The model id.
    pub model: String,
    /// The texts.
    pub input: OneOrMany<String>,
    /// `float` (the default) or `base64` (the openai package's default).
    #[serde(default)]
    pub encoding_format: Option<String>,
}

/// Parses a request body, or says what is wrong with it (400).
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        let what = match e.classify() {
            serde_json::error::Category::Data => "the request body does not match the API",
            _ => "the request body is not valid JSON",
        };
        ApiError::bad_request("invalid_request_body", format!("{what}: {e}"))
    })
}

/// Tokens in and out.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Usage {
    /// The prompt's tokens.
    pub prompt_tokens: usize,
    /// Generated tokens (every pass the servers ran).
    pub completion_tokens: usize,
    /// Both.
    pub total_tokens: usize,
}

impl Usage {
    /// Usage of a prompt and a completion.
    pub fn of(prompt: usize, completion: usize) -> Usage {
        Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
        }
    }
}

/// Why a generation ended, as OpenAI names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// End of sequence or a stop string.
    Stop,
    /// `max_tokens`, or the passes the keys were dealt for.
    Length,
}

impl Finish {
    /// OpenAI's name.
    pub fn name(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

/// Whether a response is a chat one or a plain completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `chat.completion`.
    Chat,
    /// `text_completion`.
    Text,
}

/// One response or chunk's fixed fields.
#[derive(Clone, Debug)]
pub struct Header {
    /// `chatcmpl-…` or `cmpl-…`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The model id.
    pub model: String,
    /// Chat or text.
    pub kind: Kind,
}

impl Header {
    /// A chunk carrying `text` (and, at the end, why and the usage).
    pub fn chunk(&self, text: Option<&str>, finish: Option<Finish>, usage: Option<Usage>) -> Value {
        let reason = finish.map(Finish::name);
        let (object, choice) = match self.kind {
            Kind::Chat => {
                let delta = match text {
                    Some(t) => json!({"role": "assistant", "content": t}),
                    None => json!({}),
                };
                let c =
                    json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": reason});
                ("chat.completion.chunk", c)
            }
            Kind::Text => {
                let c = json!({"index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": reason});
                ("text_completion", c)
            }
        };
        let mut v = json!({
            "id": self.id, "object": object, "created": self.created,
            "model": self.model, "choices": [choice],
        });
        if let Some(u) = usage {
            v["usage"] = json!(u);
        }
        v
    }

    /// The whole response.
    pub fn whole(&self, text: &str, finish: Finish, usage: Usage) -> Value {
        let (object, choice) = match self.kind {
            Kind::Chat => (
                "chat.completion",
                json!({"index": 0, "message": {"role": "assistant", "content": text},
                       "logprobs": null, "finish_reason": finish.name()}),
            ),
            Kind::Text => (
                "text_completion",
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish.name()}),
            ),
        };
        json!({
            "id": self.id, "object": object, "created": self.created,
            "model": self.model, "choices": [choice], "usage": usage,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn malformed_and_mistyped_bodies_are_told_apart() {
        let e = parse::<ChatRequest>(b"{\"model\": ").unwrap_err();
        assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
        assert!(e.message.contains("not valid JSON"), "{}", e.message);
        let e = parse::<ChatRequest>(br#"{"model": "m", "messages": 3}"#).unwrap_err();
        assert!(e.message.contains("does not match"), "{}", e.message);
    }

    #[test]
    fn parameters_out_of_range_are_refused_and_defaults_are_openais() {
        let req: ChatRequest = parse(
            br#"{"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                "stop": "x", "extra": {"ignored": true}}"#,
        )
        .unwrap();
        assert_eq!(req.messages[0].text().unwrap(), "hi");
        let s = req.params.sampling(9).unwrap();
        assert_eq!((s.temperature, s.top_p, s.seed), (1.0, 1.0, 9));
        assert_eq!(req.params.stops().unwrap(), vec!["x".to_string()]);
        for bad in [
            r#"{"model": "m", "prompt": "p", "temperature": 3}"#,
            r#"{"model": "m", "prompt": "p", "top_p": 0}"#,
            r#"{"model": "m", "prompt": "p", "n": 2}"#,
        ] {
            let req: CompletionRequest = parse(bad.as_bytes()).unwrap();
            assert!(req.params.sampling(0).is_err(), "{bad}");
        }
        let req: CompletionRequest =
            parse(br#"{"model": "m", "prompt": "p", "max_tokens": 0}"#).unwrap();
        assert!(req.params.max_tokens().is_err());
    }
}
