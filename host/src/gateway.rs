//! `suffuse gateway`: the OpenAI HTTP API on the client's side.
//!
//! The client is the one trusted party, so the gateway runs next to the
//! app (loopback by default) and turns each request into the secure query
//! that `suffuse query` makes: [`crate::generate::query_until`] for a
//! completion, [`crate::client::connect`] and [`crate::client::Connected::run`]
//! for embeddings. Neither server sees a request; they see what they see of
//! any query (docs/GATEWAY.md).
//!
//! HTTP is axum on hyper. tokio lives only here (and in the servers'
//! metrics endpoint): each query runs on a blocking thread with the
//! library's plain-thread client, and its tokens come back over a channel,
//! one server-sent event per token as it is picked.
//!
//! | module | what it does |
//! | --- | --- |
//! | [`api`] | the wire format: requests, responses, chunks |
//! | [`error`] | OpenAI's error shape, and which failure is which status |
//! | [`admit`] | the bounded queue (429 beyond it) |
//! | [`text`] | prompts: chat templates, tokens, stop strings |
//! | [`complete`] | `/v1/chat/completions` and `/v1/completions` |
//! | [`embed`] | `/v1/embeddings` |

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use crate::model::Transformer;
use crate::model::chat::ChatTemplate;
use crate::net::{Security, Timeouts};

pub mod admit;
pub mod api;
pub mod complete;
pub mod embed;
pub mod error;
pub mod text;

use admit::Admit;
use error::ApiError;

/// One model the gateway offers and the two servers that serve it.
pub struct Route {
    /// The id clients name it by (`model` in a request).
    pub id: String,
    /// The model: the client tokenizes and embeds locally.
    pub model: Transformer,
    /// A decoder's chat template (its own, else [`text::fallback_template`]).
    pub template: Option<ChatTemplate>,
    /// P0's and P1's addresses.
    pub servers: [String; 2],
    /// What the servers' last hello said of their plan.
    pub seen: Mutex<Option<Seen>>,
}

/// What the servers' hello named, kept for `/v1/models`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Seen {
    /// The plan both servers run (hex).
    pub plan_hash: String,
    /// Tokens per query: a decoder's prompt bucket, an encoder's length.
    pub seq: usize,
}

impl Route {
    /// A route; `seen` starts empty.
    pub fn new(
        id: String,
        model: Transformer,
        template: Option<ChatTemplate>,
        servers: [String; 2],
    ) -> Route {
        Route {
            id,
            model,
            template,
            servers,
            seen: Mutex::new(None),
        }
    }

    fn saw(&self, seen: Seen) {
        *self.seen.lock().unwrap_or_else(PoisonError::into_inner) = Some(seen);
    }
}

/// How the gateway runs.
pub struct GatewayOptions {
    /// The models offered.
    pub routes: Vec<Route>,
    /// TLS as the client (or plain TCP).
    pub security: Security,
    /// Meeting the servers, and each message from them.
    pub timeouts: Timeouts,
    /// Queries run at once.
    pub max_concurrent: usize,
    /// Requests waiting for one of those, at most; more get 429.
    pub queue: usize,
    /// Sentences per embedding query (the encoder keys' `--batch`).
    pub embed_batch: usize,
}

/// What every request handler shares.
pub struct Gateway {
    opts: GatewayOptions,
    admit: Arc<Admit>,
}

impl Gateway {
    /// A gateway with its queue.
    pub fn new(opts: GatewayOptions) -> Arc<Gateway> {
        let admit = Admit::new(opts.max_concurrent, opts.queue);
        Arc::new(Gateway { opts, admit })
    }

    /// The route named `model` and its index, or the OpenAI error for an
    /// unknown model.
    fn route(&self, model: &str) -> Result<(usize, &Route), ApiError> {
        let routes = &self.opts.routes;
        routes
            .iter()
            .enumerate()
            .find(|(_, r)| r.id == model)
            .ok_or_else(|| {
                let ids: Vec<&str> = routes.iter().map(|r| r.id.as_str()).collect();
                ApiError::unknown_model(model, &ids.join(", "))
            })
    }
}

/// The gateway's routes.
pub fn router(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(complete::chat))
        .route("/v1/completions", post(complete::completion))
        .route("/v1/embeddings", post(embed::embeddings))
        .fallback(not_found)
        .with_state(gw)
}

/// Serves on `listener` until `stop` is set; requests in flight then get
/// to finish.
pub fn run(
    listener: TcpListener,
    gw: Arc<Gateway>,
    stop: Arc<AtomicBool>,
) -> Result<(), std::io::Error> {
    listener.set_nonblocking(true)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_io()
        .enable_time()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let stopped = async move {
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        };
        axum::serve(listener, router(gw))
            .with_graceful_shutdown(stopped)
            .await
    })
}

async fn health() -> Response {
    axum::Json(json!({"status": "ok"})).into_response()
}

async fn not_found() -> Response {
    ApiError::not_found().into_response()
}

/// `GET /v1/models`: every route, with the plan its servers last named.
async fn models(State(gw): State<Arc<Gateway>>) -> Response {
    let data: Vec<_> = gw
        .opts
        .routes
        .iter()
        .map(|r| {
            let seen = r
                .seen
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            let kind = match r.model {
                Transformer::Encoder(_) => "encoder",
                Transformer::Decoder(_) => "decoder",
            };
            json!({
                "id": r.id,
                "object": "model",
                "created": 0,
                "owned_by": "suffuse",
                "kind": kind,
                "servers_plan": seen,
            })
        })
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}
