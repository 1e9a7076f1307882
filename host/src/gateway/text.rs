//! Prompts and the text that streams back: chat templates, the prompt's
//! tokens, and stop strings held back until they cannot begin a stop.

use super::error::ApiError;
use crate::model::chat::{ChatTemplate, Message};
use crate::model::{Decoder, ModelError};

/// The template of a decoder that ships none (the built-in ones): each
/// turn on a line as `role: content`, then `assistant:`. Short, since the
/// built-in decoders hold 64 positions; `suffuse generate --chat` uses it
/// too, so the two give the same prompt.
pub const FALLBACK_TEMPLATE: &str = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n\
                                     {% endfor %}{% if add_generation_prompt %}assistant:{% endif %}";

/// [`FALLBACK_TEMPLATE`], compiled.
pub fn fallback_template() -> Result<ChatTemplate, ModelError> {
    ChatTemplate::new(FALLBACK_TEMPLATE, "", "")
}

/// The prompt's token ids: none may be dropped (a prompt longer than the
/// model's positions is refused, not cut).
pub fn prompt_ids(model: &Decoder, prompt: &str) -> Result<Vec<u32>, ApiError> {
    let limit = model.config.max_positions;
    let ids = model
        .tokenizer
        .encode(prompt, limit.saturating_add(1))
        .map_err(|e| {
            ApiError::bad_request("invalid_prompt", format!("tokenizing the prompt: {e}"))
        })?;
    if ids.is_empty() {
        return Err(ApiError::bad_request(
            "invalid_prompt",
            "the prompt is empty".into(),
        ));
    }
    if ids.len() > limit {
        return Err(ApiError::bad_request(
            "context_length_exceeded",
            format!("the prompt has more than {limit} tokens, the model's positions"),
        ));
    }
    Ok(ids)
}

/// A conversation rendered by the template.
pub fn chat_prompt(template: &ChatTemplate, messages: Vec<Message>) -> Result<String, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad_request(
            "invalid_messages",
            "`messages` is empty".into(),
        ));
    }
    template.render(&messages).map_err(|e| {
        ApiError::bad_request(
            "invalid_messages",
            format!("the chat template refused: {e}"),
        )
    })
}

/// The text generated so far and how much of it went out: a tail that
/// could begin a stop string is held back until it cannot.
#[derive(Debug, Default)]
pub struct Streamed {
    text: String,
    sent: usize,
    stops: Vec<String>,
    stopped: bool,
}

impl Streamed {
    /// Nothing generated yet.
    pub fn new(stops: Vec<String>) -> Streamed {
        Streamed {
            stops,
            ..Streamed::default()
        }
    }

    /// Adds a token's text; returns what may go out now (possibly empty).
    pub fn push(&mut self, piece: &str) -> String {
        if self.stopped {
            return String::new();
        }
        let from = self.sent;
        self.text.push_str(piece);
        let hit = self
            .stops
            .iter()
            .filter_map(|s| self.text[from..].find(s.as_str()).map(|i| from + i))
            .min();
        let upto = match hit {
            Some(at) => {
                self.text.truncate(at);
                self.stopped = true;
                at
            }
            None => self.text.len() - self.held(),
        };
        self.take(upto)
    }

    /// Whether a stop string ended the text.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// What was held back, at the end.
    pub fn flush(&mut self) -> String {
        self.take(self.text.len())
    }

    /// The whole text (stop strings cut).
    pub fn text(&self) -> &str {
        &self.text
    }

    fn take(&mut self, upto: usize) -> String {
        let out = self.text.get(self.sent..upto).unwrap_or("").to_string();
        self.sent = self.sent.max(upto);
        out
    }

    /// Bytes at the end of the unsent text that begin some stop string.
    fn held(&self) -> usize {
        let unsent = &self.text[self.sent..];
        unsent
            .char_indices()
            .map(|(i, _)| &unsent[i..])
            .find(|tail| self.stops.iter().any(|s| s.starts_with(tail)))
            .map_or(0, str::len)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_stop_string_split_across_tokens_is_held_back_and_cut() {
        let mut s = Streamed::new(vec!["END".into()]);
        assert_eq!(s.push("ab"), "ab");
        assert_eq!(s.push("cE"), "c");
        assert_eq!(s.push("N"), "");
        assert_eq!(s.push("Dx"), "");
        assert!(s.stopped());
        assert_eq!(s.text(), "abc");
        assert_eq!(s.flush(), "");
    }

    #[test]
    fn a_false_start_goes_out_once_it_cannot_be_a_stop() {
        let mut s = Streamed::new(vec!["END".into()]);
        assert_eq!(s.push("xE"), "x");
        assert_eq!(s.push("é"), "Eé");
        assert_eq!(s.push("E"), "");
        assert_eq!(s.flush(), "E");
        assert!(!s.stopped());
        let mut plain = Streamed::new(Vec::new());
        assert_eq!(plain.push("a"), "a");
    }

    #[test]
    fn the_fallback_template_renders_turns_and_the_assistant_cue() {
        let t = fallback_template().unwrap();
        let p = chat_prompt(
            &t,
            vec![
                Message {
                    role: "system".into(),
                    content: "be brief".into(),
                },
                Message::user("hi"),
            ],
        )
        .unwrap();
        assert_eq!(p, "system: be brief\nuser: hi\nassistant:");
        assert_eq!(t.user_prompt("hi").unwrap(), "user: hi\nassistant:");
        assert!(chat_prompt(&t, Vec::new()).is_err());
    }
}
