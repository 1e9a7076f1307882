//! Chat templates: a model's own Jinja template turns a conversation into
//! the prompt text it was trained on.
//!
//! The template is rendered the way Hugging Face's `apply_chat_template`
//! renders it (`trim_blocks` and `lstrip_blocks` on; `messages`,
//! `add_generation_prompt`, `bos_token`, `eos_token` and
//! `raise_exception` defined), with `minijinja`, so a template's default
//! system prompt appears exactly when the template says. SmolLM2's, for a
//! single user message, gives
//!
//! ```text
//! <|im_start|>system
//! You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>
//! <|im_start|>user
//! What is the capital of France?<|im_end|>
//! <|im_start|>assistant
//! ```
//!
//! Python string methods inside a template (`.strip()`) are not provided;
//! such a template fails with [`ModelError::ChatTemplate`] instead of
//! rendering something else.

use minijinja::{Environment, Error, ErrorKind, context};
use serde::Serialize;

use super::ModelError;
use super::gguf::Gguf;

/// One turn of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// What was said.
    pub content: String,
}

impl Message {
    /// A user turn.
    pub fn user(content: &str) -> Message {
        Message {
            role: "user".into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template with the special tokens it may name.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

const NAME: &str = "chat";

impl ChatTemplate {
    /// Compiles `source`; `bos` and `eos` are the token texts the template
    /// sees as `bos_token` and `eos_token`.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<ChatTemplate, ModelError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function("raise_exception", |msg: String| -> Result<(), Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| ModelError::ChatTemplate(e.to_string()))?;
        Ok(ChatTemplate {
            env,
            bos: bos.into(),
            eos: eos.into(),
        })
    }

    /// `tokenizer.chat_template` of a GGUF file, with its bos and eos
    /// tokens; `None` when the file has no template.
    pub fn from_gguf(g: &Gguf) -> Result<Option<ChatTemplate>, ModelError> {
        if g.get("tokenizer.chat_template").is_none() {
            return Ok(None);
        }
        let tokens = g.strings("tokenizer.ggml.tokens")?;
        let token = |key: &str| -> Result<&str, ModelError> {
            match g.get(key) {
                None => Ok(""),
                Some(_) => tokens.get(g.usize(key)?).copied().ok_or_else(|| {
                    ModelError::Tokenizer(format!("{key} is outside the vocabulary"))
                }),
            }
        };
        let (bos, eos) = (
            token("tokenizer.ggml.bos_token_id")?,
            token("tokenizer.ggml.eos_token_id")?,
        );
        ChatTemplate::new(g.str("tokenizer.chat_template")?, bos, eos).map(Some)
    }

    /// The prompt for `messages`, ending where the assistant's reply
    /// begins (`add_generation_prompt`).
    pub fn render(&self, messages: &[Message]) -> Result<String, ModelError> {
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| ModelError::ChatTemplate(e.to_string()))?;
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => true,
                bos_token => self.bos,
                eos_token => self.eos,
            })
            .map_err(|e| ModelError::ChatTemplate(e.to_string()))
    }

    /// The prompt for one user message (what `--chat` sends).
    pub fn user_prompt(&self, text: &str) -> Result<String, ModelError> {
        self.render(&[Message::user(text)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-135M-Instruct's template, as its GGUF file stores it.
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn smollm2_template_adds_its_default_system_prompt() {
        let t = ChatTemplate::new(SMOLLM2, "<|im_start|>", "<|im_end|>").unwrap();
        assert_eq!(
            t.user_prompt("What is the capital of France?").unwrap(),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging \
             Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n\
             <|im_start|>assistant\n"
        );
        let own_system = [
            Message {
                role: "system".into(),
                content: "Be brief.".into(),
            },
            Message::user("Hi"),
        ];
        assert_eq!(
            t.render(&own_system).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
             <|im_start|>assistant\n"
        );
    }

    #[test]
    fn hugging_face_conventions() {
        // trim_blocks and lstrip_blocks: block tags leave no blank lines.
        let src = "{{ bos_token }}\n  {% for m in messages %}\n[{{ m.role }}] {{ m.content }}{{ eos_token }}\n  {% endfor %}\n";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        assert_eq!(t.user_prompt("x").unwrap(), "<s>\n[user] x</s>\n");
        let strict = "{% if messages[0].role != 'system' %}{{ raise_exception('needs a system turn') }}{% endif %}";
        let t = ChatTemplate::new(strict, "", "").unwrap();
        let err = t.user_prompt("x").unwrap_err().to_string();
        assert!(err.contains("needs a system turn"), "{err}");
        assert!(matches!(
            ChatTemplate::new("{% for %}", "", ""),
            Err(ModelError::ChatTemplate(_))
        ));
    }
}
