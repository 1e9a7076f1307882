//! `POST /v1/embeddings`: the secure query of `suffuse query`, one key set
//! per batch of texts (the encoder keys' `--batch`, one by default), with
//! the vectors `embed` gives.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::{Value, json};

use super::api::{self, EmbeddingRequest};
use super::error::ApiError;
use super::{Gateway, Route, Seen};
use crate::client::{self, Expect};
use crate::model::{Model, Transformer};

/// `POST /v1/embeddings`.
pub async fn embeddings(State(gw): State<Arc<Gateway>>, body: Bytes) -> Response {
    let (index, texts, base64) = match check(&gw, &body) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let Some(mut ticket) = gw.admit.enter() else {
        return ApiError::queue_full(gw.admit.bound()).into_response();
    };
    ticket.turn().await;
    let model_id = gw.opts.routes[index].id.clone();
    let job = tokio::task::spawn_blocking(move || {
        let r = embed_all(&gw, index, &texts);
        drop(ticket);
        r
    });
    match job.await {
        Ok(Ok((vectors, tokens))) => {
            axum::Json(response(&model_id, &vectors, tokens, base64)).into_response()
        }
        Ok(Err(e)) => e.into_response(),
        Err(e) => ApiError::internal(format!("the query thread failed: {e}")).into_response(),
    }
}

/// The route's index, the texts, and whether to answer in base64.
fn check(gw: &Gateway, body: &[u8]) -> Result<(usize, Vec<String>, bool), ApiError> {
    let req: EmbeddingRequest = api::parse(body)?;
    let (index, route) = gw.route(&req.model)?;
    let Transformer::Encoder(_) = &route.model else {
        return Err(ApiError::bad_request(
            "wrong_model_kind",
            format!(
                "`{}` is a decoder: ask /v1/chat/completions or /v1/completions",
                req.model
            ),
        ));
    };
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::bad_request(
                "invalid_value",
                format!("`encoding_format` must be `float` or `base64`, not `{other}`"),
            ));
        }
    };
    let texts = req.input.into_vec();
    if texts.is_empty() || texts.iter().any(String::is_empty) {
        return Err(ApiError::bad_request(
            "invalid_input",
            "`input` must be one or more non-empty texts".into(),
        ));
    }
    Ok((index, texts, base64))
}

/// Every text's embedding and the tokens embedded: one secure query per
/// batch.
fn embed_all(
    gw: &Gateway,
    index: usize,
    texts: &[String],
) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    let route = &gw.opts.routes[index];
    let Transformer::Encoder(model) = &route.model else {
        return Err(ApiError::internal("the route is not an encoder".into()));
    };
    // Longer than the model takes: refused before a server is asked.
    tokenize(model, texts, model.config.max_tokens)?;
    let mut vectors = Vec::with_capacity(texts.len());
    let mut tokens = 0;
    for chunk in texts.chunks(gw.opts.embed_batch.max(1)) {
        let (v, n) = embed_batch(gw, route, model, chunk)?;
        vectors.extend(v);
        tokens += n;
    }
    Ok((vectors, tokens))
}

fn embed_batch(
    gw: &Gateway,
    route: &Route,
    model: &Model,
    texts: &[String],
) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    let servers = [route.servers[0].as_str(), route.servers[1].as_str()];
    let expect = Expect {
        batch: gw.opts.embed_batch.max(1),
        seq: None,
    };
    let mut conn = client::connect(model, servers, gw.opts.timeouts, &gw.opts.security, expect)
        .map_err(|e| failed(route, &e))?;
    route.saw(Seen {
        plan_hash: conn.plan_hash().to_string(),
        seq: conn.seq(),
    });
    let batch = match tokenize(model, texts, conn.seq()) {
        Ok(b) => b,
        Err(e) => {
            // Nothing was sent: the set stays unspent.
            for link in conn.links() {
                link.abort("the client gave up: a text is longer than the keys");
            }
            return Err(e);
        }
    };
    let q = conn.run(model, &batch).map_err(|e| failed(route, &e))?;
    eprintln!("gateway: {}: {} embedding(s)", route.id, batch.len());
    Ok((q.embeddings, batch.iter().map(Vec::len).sum()))
}

fn failed(route: &Route, e: &client::ClientError) -> ApiError {
    let text = crate::logline::printable(&e.to_string());
    eprintln!("gateway: {}: the query failed: {text}", route.id);
    ApiError::from(e)
}

/// Token ids of each text; one longer than `limit` is refused, not cut.
fn tokenize(model: &Model, texts: &[String], limit: usize) -> Result<Vec<Vec<u32>>, ApiError> {
    texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let ids = model
                .tokenizer
                .encode(t, limit.saturating_add(1))
                .map_err(|e| {
                    ApiError::bad_request("invalid_input", format!("tokenizing input {i}: {e}"))
                })?;
            if ids.len() > limit {
                return Err(ApiError::bad_request(
                    "context_length_exceeded",
                    format!("input {i} has more than {limit} tokens, what the servers' keys take"),
                ));
            }
            Ok(ids)
        })
        .collect()
}

fn response(model: &str, vectors: &[Vec<f32>], tokens: usize, base64: bool) -> Value {
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })
}
