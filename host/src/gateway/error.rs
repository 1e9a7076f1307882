//! OpenAI's error shape, `{"error": {"message", "type", "param", "code"}}`,
//! and the status each failure gets.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::client::{ClientError, Unavailable};
use crate::generate::GenerateError;

/// Seconds a client told the pool is empty should wait (`Retry-After`).
pub const RETRY_AFTER_S: u64 = 1;

/// A failed request, as the client will read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// OpenAI's `type`.
    pub kind: &'static str,
    /// OpenAI's `code`.
    pub code: &'static str,
    /// What happened and what to do.
    pub message: String,
    /// `Retry-After`, in seconds.
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, code: &'static str, message: String) -> Self {
        ApiError {
            status,
            kind,
            code,
            message,
            retry_after: None,
        }
    }

    /// A request this gateway cannot take as it is (400).
    pub fn bad_request(code: &'static str, message: String) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            code,
            message,
        )
    }

    /// A model no route offers (404).
    pub fn unknown_model(model: &str, offered: &str) -> Self {
        let message =
            format!("the model `{model}` does not exist here; this gateway serves: {offered}");
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            message,
        )
    }

    /// A path this gateway does not serve (404).
    pub fn not_found() -> Self {
        let message = "no such endpoint: this gateway serves /v1/chat/completions, \
                       /v1/completions, /v1/embeddings, /v1/models and /health";
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "not_found",
            message.into(),
        )
    }

    /// The queue is full (429).
    pub fn queue_full(bound: usize) -> Self {
        let message =
            format!("too many requests: {bound} are already running or waiting; retry shortly");
        let mut e = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "rate_limit_exceeded",
            message,
        );
        e.retry_after = Some(RETRY_AFTER_S);
        e
    }

    /// Something inside the gateway failed (500).
    pub fn internal(message: String) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "internal_error",
            message,
        )
    }

    /// The JSON body.
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": null,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

impl From<&ClientError> for ApiError {
    fn from(e: &ClientError) -> Self {
        let message = format!("the secure query failed: {e}");
        match e {
            ClientError::Unavailable { reason, .. } => unavailable(*reason, message),
            ClientError::TooLong { .. } => {
                ApiError::bad_request("context_length_exceeded", e.to_string())
            }
            ClientError::Model(_) | ClientError::Random(_) | ClientError::Plan(_) => {
                ApiError::internal(message)
            }
            _ => ApiError::new(
                StatusCode::BAD_GATEWAY,
                "server_error",
                "upstream_error",
                message,
            ),
        }
    }
}

impl From<&GenerateError> for ApiError {
    fn from(e: &GenerateError) -> Self {
        match e {
            GenerateError::Client(c) => c.into(),
            GenerateError::PromptTooLong { .. } => {
                ApiError::bad_request("context_length_exceeded", e.to_string())
            }
            GenerateError::NotGeneration(_) => ApiError::new(
                StatusCode::BAD_GATEWAY,
                "server_error",
                "upstream_error",
                e.to_string(),
            ),
            _ => ApiError::internal(e.to_string()),
        }
    }
}

/// A server's refusal before any work: 503, with `Retry-After` where
/// waiting helps.
fn unavailable(reason: Unavailable, message: String) -> ApiError {
    let code = match reason {
        Unavailable::PoolEmpty => "key_pool_empty",
        Unavailable::Busy | Unavailable::ClientLimit => "servers_busy",
        Unavailable::ShuttingDown => "servers_shutting_down",
        Unavailable::PeerDown => "servers_cannot_reach_each_other",
        _ => "servers_unavailable",
    };
    let mut e = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        code,
        message,
    );
    e.retry_after = Some(RETRY_AFTER_S);
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_pool_is_503_with_retry_after() {
        let e = ClientError::Unavailable {
            server: 0,
            reason: Unavailable::PoolEmpty,
        };
        let api = ApiError::from(&e);
        assert_eq!(api.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(api.code, "key_pool_empty");
        let r = api.clone().into_response();
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        assert_eq!(api.body()["error"]["type"], "server_error");
        assert!(api.message.contains("key pool is empty"), "{}", api.message);
    }

    #[test]
    fn a_prompt_over_its_bucket_is_400() {
        let e = GenerateError::PromptTooLong {
            tokens: 40,
            bucket: 32,
        };
        let api = ApiError::from(&e);
        assert_eq!(api.status, StatusCode::BAD_REQUEST);
        assert_eq!(api.code, "context_length_exceeded");
    }
}
