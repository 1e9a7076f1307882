//! `POST /v1/chat/completions` and `POST /v1/completions`: one secure
//! generation per request ([`crate::generate::query_until`]), its tokens
//! sent as they are picked.
//!
//! The query runs on a blocking thread and sends each token's text over a
//! channel. A client that goes away drops the receiving end; the next
//! token's send fails, and the generation stops as at end of sequence: the
//! servers are told to stop, learn how many passes ran, and the key set
//! stays spent.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt as _;
use tokio::sync::mpsc;

use super::admit::Ticket;
use super::api::{self, ChatRequest, CompletionRequest, Finish, Header, Kind, Params, Usage};
use super::error::ApiError;
use super::text::{self, Streamed};
use super::{Gateway, Route, Seen};
use crate::dealer::random;
use crate::generate::{self, Sampling};
use crate::model::chat::Message;
use crate::model::{Decoder, Transformer};
use crate::plan::hex;

/// What the query thread tells the handler.
#[derive(Debug)]
enum Event {
    /// Text that may go out (one per token; may be empty).
    Piece(String),
    /// The end.
    Done(Finish, Usage),
    /// The query failed.
    Failed(ApiError),
}

/// A checked request, ready to run.
struct Job {
    route: usize,
    ids: Vec<u32>,
    sampling: Sampling,
    max_tokens: Option<usize>,
    stops: Vec<String>,
    stream: bool,
    header: Header,
}

/// `POST /v1/chat/completions`.
pub async fn chat(State(gw): State<Arc<Gateway>>, body: Bytes) -> Response {
    match chat_job(&gw, &body) {
        Ok(job) => run(gw, job).await,
        Err(e) => e.into_response(),
    }
}

/// `POST /v1/completions`.
pub async fn completion(State(gw): State<Arc<Gateway>>, body: Bytes) -> Response {
    match completion_job(&gw, &body) {
        Ok(job) => run(gw, job).await,
        Err(e) => e.into_response(),
    }
}

fn chat_job(gw: &Gateway, body: &[u8]) -> Result<Job, ApiError> {
    let req: ChatRequest = api::parse(body)?;
    let (index, route, model) = decoder(gw, &req.params.model)?;
    let messages = req
        .messages
        .iter()
        .map(|m| {
            Ok(Message {
                role: m.role.clone(),
                content: m.text()?,
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let fallback;
    let template = match &route.template {
        Some(t) => t,
        None => {
            fallback = text::fallback_template().map_err(|e| ApiError::internal(e.to_string()))?;
            &fallback
        }
    };
    let prompt = text::chat_prompt(template, messages)?;
    job(index, model, &req.params, &prompt, Kind::Chat)
}

fn completion_job(gw: &Gateway, body: &[u8]) -> Result<Job, ApiError> {
    let req: CompletionRequest = api::parse(body)?;
    let (index, _, model) = decoder(gw, &req.params.model)?;
    let prompts = req.prompt.into_vec();
    let [prompt] = prompts.as_slice() else {
        return Err(ApiError::bad_request(
            "invalid_prompt",
            format!("give one prompt per request (got {})", prompts.len()),
        ));
    };
    job(index, model, &req.params, prompt, Kind::Text)
}

/// The route named `model`, which must be a decoder.
fn decoder<'g>(gw: &'g Gateway, model: &str) -> Result<(usize, &'g Route, &'g Decoder), ApiError> {
    let (index, route) = gw.route(model)?;
    match &route.model {
        Transformer::Decoder(d) => Ok((index, route, d)),
        Transformer::Encoder(_) => Err(ApiError::bad_request(
            "wrong_model_kind",
            format!("`{model}` is an encoder: ask /v1/embeddings"),
        )),
    }
}

fn job(
    route: usize,
    model: &Decoder,
    p: &Params,
    prompt: &str,
    kind: Kind,
) -> Result<Job, ApiError> {
    let seed = random::<8>().map_err(|e| ApiError::internal(e.to_string()))?;
    let id = random::<12>().map_err(|e| ApiError::internal(e.to_string()))?;
    let prefix = match kind {
        Kind::Chat => "chatcmpl-",
        Kind::Text => "cmpl-",
    };
    Ok(Job {
        route,
        ids: text::prompt_ids(model, prompt)?,
        sampling: p.sampling(u64::from_le_bytes(seed))?,
        max_tokens: p.max_tokens()?,
        stops: p.stops()?,
        stream: p.stream.unwrap_or(false),
        header: Header {
            id: format!("{prefix}{}", hex(&id)),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            model: p.model.clone(),
            kind,
        },
    })
}

/// Queues the job (429 when the queue is full), runs it on a blocking
/// thread and answers with its events: a stream, or one response. A
/// failure before the first token gets its own status; one after it, in a
/// stream, arrives as an error event.
async fn run(gw: Arc<Gateway>, job: Job) -> Response {
    let Some(mut ticket) = gw.admit.enter() else {
        return ApiError::queue_full(gw.admit.bound()).into_response();
    };
    ticket.turn().await;
    let (tx, mut rx) = mpsc::channel(64);
    let (stream, header) = (job.stream, job.header.clone());
    tokio::task::spawn_blocking(move || work(&gw, job, &tx, ticket));
    let first = match rx.recv().await {
        None => {
            return ApiError::internal("the query thread ended without an answer".into())
                .into_response();
        }
        Some(Event::Failed(e)) => return e.into_response(),
        Some(first) => first,
    };
    if stream {
        sse(header, first, rx)
    } else {
        whole(header, first, rx).await
    }
}

fn sse(header: Header, first: Event, rx: mpsc::Receiver<Event>) -> Response {
    let events =
        futures_util::stream::unfold((rx, Some(first), false), move |(mut rx, pending, done)| {
            let header = header.clone();
            async move {
                if done {
                    return None;
                }
                let ev = match pending {
                    Some(e) => e,
                    None => rx.recv().await?,
                };
                let (data, done) = match ev {
                    Event::Piece(t) => (header.chunk(Some(&t), None, None), false),
                    Event::Done(f, u) => (header.chunk(None, Some(f), Some(u)), true),
                    Event::Failed(e) => (e.body(), true),
                };
                let sent = SseEvent::default().data(data.to_string());
                Some((Ok::<_, Infallible>(sent), (rx, None, done)))
            }
        });
    let done = futures_util::stream::once(async { Ok(SseEvent::default().data("[DONE]")) });
    Sse::new(events.chain(done)).into_response()
}

async fn whole(header: Header, first: Event, mut rx: mpsc::Receiver<Event>) -> Response {
    let mut text = String::new();
    let mut ev = Some(first);
    loop {
        match ev {
            Some(Event::Piece(t)) => text.push_str(&t),
            Some(Event::Done(f, u)) => {
                return axum::Json(header.whole(&text, f, u)).into_response();
            }
            Some(Event::Failed(e)) => return e.into_response(),
            None => {
                let e = ApiError::internal("the query thread ended without an answer".into());
                return e.into_response();
            }
        }
        ev = rx.recv().await;
    }
}

/// The query thread: the secure generation, each token's text sent as
/// it is picked. Holds `ticket` until the servers are done.
fn work(gw: &Gateway, job: Job, tx: &mpsc::Sender<Event>, ticket: Ticket) {
    let route = &gw.opts.routes[job.route];
    let Transformer::Decoder(model) = &route.model else {
        return;
    };
    let servers = [route.servers[0].as_str(), route.servers[1].as_str()];
    let mut streamed = Streamed::new(job.stops);
    let (mut count, mut last) = (0usize, None);
    let mut on_token = |t: u32| -> bool {
        count += 1;
        last = Some(t);
        if Some(t) != model.config.eos {
            let piece = model.tokenizer.decode(&[t]).unwrap_or_default();
            // The client went away: stop (`count` keeps the usage honest).
            if tx
                .blocking_send(Event::Piece(streamed.push(&piece)))
                .is_err()
            {
                return false;
            }
        }
        !streamed.stopped() && job.max_tokens.is_none_or(|m| count < m)
    };
    let (t, sec) = (gw.opts.timeouts, &gw.opts.security);
    let result = generate::query_until(
        model,
        servers,
        &job.ids,
        job.sampling,
        t,
        sec,
        &mut on_token,
    );
    let event = match result {
        Ok(o) => {
            route.saw(Seen {
                plan_hash: o.plan_hash.clone(),
                seq: o.bucket,
            });
            let rest = streamed.flush();
            if !rest.is_empty() {
                let _ = tx.blocking_send(Event::Piece(rest));
            }
            let ended = streamed.stopped() || (last.is_some() && last == model.config.eos);
            let finish = if ended { Finish::Stop } else { Finish::Length };
            eprintln!("gateway: {}: {count} token(s), {}", route.id, finish.name());
            Event::Done(finish, Usage::of(job.ids.len(), count))
        }
        Err(e) => {
            let text = crate::logline::printable(&e.to_string());
            eprintln!("gateway: {}: the query failed: {text}", route.id);
            Event::Failed(ApiError::from(&e))
        }
    };
    let _ = tx.blocking_send(event);
    drop(ticket);
}
