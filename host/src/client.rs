//! The client: tokens in, private embeddings out.
//!
//! Embedding lookups use public weights on the client's own input, so the
//! client does them in the clear (with the embedding LayerNorm), encodes
//! the result in fixed point and secret-shares it. With it go the attention
//! bias and the pooling mask, also secret-shared, so the servers learn the
//! padded shape and nothing about the real lengths. The servers return
//! shares of the pooled output; the client adds them, divides by the token
//! count and normalizes as the model says.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::dealer::random;
use crate::fixed::{FRAC, decode, encode};
use crate::model::{Model, ModelError, ModelRef};
use crate::net::{
    FrameKind as Frame, Link, NetError, Role, Security, Timeouts, get_words, put_words,
};
use crate::party::{InputShares, PartyReport};
use crate::plan::{Finish, Plan, PlanError, hex};
use crate::reference::ClearInputs;

/// Why the client failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The model.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The plan.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// A server.
    #[error("server {server}: {error}")]
    Net {
        /// Which.
        server: usize,
        /// The error.
        error: NetError,
    },
    /// The servers disagree with each other or with this client.
    #[error("{0}")]
    Mismatch(String),
    /// A sentence longer than the dealt sequence length.
    #[error("sentence {index} has {tokens} tokens; the servers' keys are for {seq}")]
    TooLong {
        /// Which sentence.
        index: usize,
        /// Its tokens.
        tokens: usize,
        /// The dealt length.
        seq: usize,
    },
    /// More sentences than the keys were dealt for.
    #[error("{given} sentences given; the servers' keys are for batches of {batch}")]
    Batch {
        /// Given.
        given: usize,
        /// Dealt.
        batch: usize,
    },
    /// No randomness.
    #[error(transparent)]
    Random(#[from] crate::dealer::DealerError),
    /// A server turned the client away before any work.
    #[error("server {server}: {reason}")]
    Unavailable {
        /// Which.
        server: usize,
        /// Why.
        reason: Unavailable,
    },
    /// A malformed reply.
    #[error("server {server}: malformed reply: {what}")]
    Reply {
        /// Which.
        server: usize,
        /// What.
        what: String,
    },
    /// A server closed the connection before it answered the hello.
    #[error(
        "server {server} ({addr}) closed the connection before it answered ({error}): it may be \
         serving another query (a one-query `serve --keys` serves one client and exits; \
         `serve --keys-dir` serves many), {}",
        if *.tls {
            "or it may not use TLS (give every server and the client --tls)"
        } else {
            "or it may expect TLS (give the client --tls, as its servers have)"
        }
    )]
    ClosedEarly {
        /// Which.
        server: usize,
        /// Its address.
        addr: String,
        /// The error seen.
        error: NetError,
        /// Whether this client spoke TLS.
        tls: bool,
    },
}

/// The error of server `i` at `addr` before its hello arrived: one that
/// closed the connection gets a [`ClientError::ClosedEarly`] that says
/// what that usually means.
fn before_hello<'a>(
    i: usize,
    addr: &'a str,
    sec: &Security,
) -> impl Fn(NetError) -> ClientError + 'a {
    let tls = matches!(sec, Security::Tls(_));
    move |error| match matches!(error, NetError::Disconnected) {
        true => ClientError::ClosedEarly {
            server: i,
            addr: addr.to_string(),
            error,
            tls,
        },
        false => net(i)(error),
    }
}

/// The cleartext inputs for sentences padded to the plan's shape.
pub fn clear_inputs(
    model: &Model,
    plan: &ClientView,
    batch: &[Vec<u32>],
) -> Result<ClearInputs, ClientError> {
    let (b, l, d) = (plan.batch, plan.seq, plan.hidden);
    if batch.len() > b || batch.is_empty() {
        return Err(ClientError::Batch {
            given: batch.len(),
            batch: b,
        });
    }
    let too_large = || PlanError::ShapeTooLarge { batch: b, seq: l };
    let rows = b.checked_mul(l).ok_or_else(too_large)?;
    let mut x = vec![0u64; rows.checked_mul(d).ok_or_else(too_large)?];
    let mut bias = vec![plan.pad_bias; rows];
    let mut mask = vec![0u64; rows];
    for (i, tokens) in batch.iter().enumerate() {
        if tokens.len() > l || tokens.is_empty() {
            return Err(ClientError::TooLong {
                index: i,
                tokens: tokens.len(),
                seq: l,
            });
        }
        let e = model.embed_tokens(tokens)?;
        for (j, v) in e.iter().enumerate() {
            x[i * l * d + j] = encode(f64::from(*v), FRAC);
        }
        for p in 0..tokens.len() {
            bias[i * l + p] = 0;
            mask[i * l + p] = 1;
        }
    }
    // Unused batch slots repeat sentence 0: every row needs a real key.
    for i in batch.len()..b {
        let (src, dst) = x.split_at_mut(i * l * d);
        dst[..l * d].copy_from_slice(&src[..l * d]);
        let (src, dst) = bias.split_at_mut(i * l);
        dst[..l].copy_from_slice(&src[..l]);
        let (src, dst) = mask.split_at_mut(i * l);
        dst[..l].copy_from_slice(&src[..l]);
    }
    Ok(ClearInputs {
        x,
        bias,
        mask: plan.mask.then_some(mask),
    })
}

/// Splits cleartext inputs into two additive sharings.
pub fn share(inputs: &ClearInputs) -> Result<[InputShares; 2], ClientError> {
    let seed = zeroize::Zeroizing::new(random::<16>()?);
    let mut prg = suffuse_core::prg::Prg::new(&seed);
    let mut split = |v: &[u64]| -> (Vec<u64>, Vec<u64>) {
        let r: Vec<u64> = v.iter().map(|_| prg.next_u64()).collect();
        let s: Vec<u64> = v.iter().zip(&r).map(|(a, b)| a.wrapping_sub(*b)).collect();
        (r, s)
    };
    let (x0, x1) = split(&inputs.x);
    let (b0, b1) = split(&inputs.bias);
    let (m0, m1) = match &inputs.mask {
        Some(m) => {
            let (a, b) = split(m);
            (Some(a), Some(b))
        }
        None => (None, None),
    };
    Ok([
        InputShares {
            x: x0,
            bias: b0,
            mask: m0,
        },
        InputShares {
            x: x1,
            bias: b1,
            mask: m1,
        },
    ])
}

/// Turns the reconstructed output tensor into embeddings, one per given
/// sentence.
pub fn finish(plan: &ClientView, output: &[u64], batch: &[Vec<u32>]) -> Vec<Vec<f32>> {
    let d = plan.hidden;
    batch
        .iter()
        .enumerate()
        .map(|(i, tokens)| {
            let count = match plan.finish {
                Finish::MeanOverTokens => tokens.len().max(1) as f64,
                Finish::AsIs => 1.0,
            };
            let mut v: Vec<f64> = output[i * d..(i + 1) * d]
                .iter()
                .map(|x| decode(*x, FRAC) / count)
                .collect();
            if plan.normalize {
                let norm = v.iter().map(|a| a * a).sum::<f64>().sqrt();
                if norm > 0.0 {
                    for a in &mut v {
                        *a /= norm;
                    }
                }
            }
            v.into_iter().map(|a| a as f32).collect()
        })
        .collect()
}

/// What the client needs from a plan, sent in the servers' hellos so that
/// the client never builds the plan (spectral bounds and all). Every field
/// is derived from the plan and covered by its hash; the two servers must
/// send the same view, and the model digest must be the client's own.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClientView {
    /// The model's digest (hex).
    pub model_digest: String,
    /// Sentences per run (1 for a decoder).
    pub batch: usize,
    /// Tokens per sentence, or a decoder's prompt bucket.
    pub seq: usize,
    /// Width of an embedding row.
    pub hidden: usize,
    /// Whether the client sends a pooling mask.
    pub mask: bool,
    /// The attention bias of a padded position.
    pub pad_bias: u64,
    /// How the output is finished (encoders).
    pub finish: Finish,
    /// Whether the embedding is L2-normalized (encoders).
    pub normalize: bool,
    /// Decode passes after the prefill (decoders).
    pub decode_steps: usize,
    /// Words of the output tensor.
    pub output_len: usize,
    /// Fraction bits of the output tensor.
    pub output_scale: u32,
}

impl ClientView {
    /// The view of a plan.
    pub fn of(plan: &Plan) -> ClientView {
        let out = &plan.tensors[plan.output];
        ClientView {
            model_digest: hex(&plan.model_digest),
            batch: plan.batch,
            seq: plan.seq,
            hidden: plan.hidden,
            mask: plan.inputs.mask.is_some(),
            pad_bias: plan.pad_bias,
            finish: plan.finish,
            normalize: plan.normalize,
            decode_steps: plan.shape().decode_steps,
            output_len: out.len(),
            output_scale: out.scale,
        }
    }
}

/// A client's hello and a server's answer.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Hello {
    /// A client asking for service.
    Client,
    /// A client joining, at P1, the query whose key set P0 announced.
    Join {
        /// The key set P0 announced (hex).
        key_set: String,
    },
    /// P1 offering P0 a standing link for one pooled query
    /// ([`crate::service`]).
    Standby {
        /// 0 or 1.
        party: u8,
        /// The model P1 serves (hex digest).
        model_digest: String,
    },
    /// A server that will not serve this client now, and why.
    Unavailable {
        /// Why.
        reason: Unavailable,
    },
    /// A server describing itself.
    Server {
        /// 0 or 1.
        party: u8,
        /// Its plan (hex).
        plan_hash: String,
        /// Its key set (hex); the two servers must agree.
        key_set: String,
        /// Sentences per run.
        batch: usize,
        /// Tokens per sentence.
        seq: usize,
        /// The model.
        model: String,
        /// What the client needs from the plan.
        view: ClientView,
    },
}

impl Hello {
    /// Its kind, for log lines: what a peer chose to send in it (a key-set
    /// string of any length) stays out of the log.
    pub fn kind(&self) -> &'static str {
        match self {
            Hello::Client => "client",
            Hello::Join { .. } => "join",
            Hello::Standby { .. } => "standby",
            Hello::Unavailable { .. } => "unavailable",
            Hello::Server { .. } => "server",
        }
    }
}

/// Why a server turned a client away before any work.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, thiserror::Error)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Unavailable {
    /// The key pool holds no set both servers can use: deal more.
    #[error("the key pool is empty (no unspent key set both servers hold)")]
    PoolEmpty,
    /// Every query slot stayed busy for the whole wait.
    #[error("the servers are at their concurrency limit")]
    Busy,
    /// The server is shutting down.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// P0 has no working link to P1.
    #[error("the servers cannot reach each other")]
    PeerDown,
    /// P1 knows no query for the key set the client named.
    #[error("no query is waiting for that key set")]
    UnknownQuery,
    /// This client's address already holds its share of the slots.
    #[error(
        "this client's address already runs as many queries as the servers allow one \
         client (serve --max-per-client)"
    )]
    ClientLimit,
}

/// Hello frames use step index `u32::MAX` (outside every plan).
pub const HELLO_STEP: u32 = u32::MAX;

/// Sends a hello.
pub fn send_hello(link: &mut Link, hello: &Hello) -> Result<(), NetError> {
    let bytes = serde_json::to_vec(hello).unwrap_or_default();
    link.send(Frame::Hello, HELLO_STEP, &bytes)
}

/// Receives a hello.
pub fn recv_hello(link: &mut Link) -> Result<Result<Hello, String>, NetError> {
    let bytes = link.recv(Frame::Hello, HELLO_STEP, None)?;
    Ok(serde_json::from_slice(&bytes).map_err(|e| format!("malformed hello: {e}")))
}

/// What a query returned.
#[derive(Clone, Debug)]
pub struct QueryOutcome {
    /// One embedding per sentence.
    pub embeddings: Vec<Vec<f32>>,
    /// The reconstructed output tensor (fixed point).
    pub output: Vec<u64>,
    /// The servers' figures.
    pub reports: [PartyReport; 2],
    /// Wall time from sending the inputs to holding the output.
    pub online_s: f64,
    /// The plan both servers ran.
    pub plan_hash: String,
}

/// Two servers that have introduced themselves and agree on a plan, ready
/// for one query.
pub struct Connected {
    links: [Link; 2],
    view: ClientView,
    plan_hash: String,
}

impl Connected {
    /// Tokens per sentence (the padded length the keys were dealt for).
    pub fn seq(&self) -> usize {
        self.view.seq
    }

    /// What the servers' plan tells the client.
    pub fn view(&self) -> &ClientView {
        &self.view
    }

    /// The connections to P0 and P1, for a protocol on top of the hello
    /// (generation).
    pub fn links(&mut self) -> &mut [Link; 2] {
        &mut self.links
    }

    /// The plan both servers run (hex).
    pub fn plan_hash(&self) -> &str {
        &self.plan_hash
    }

    /// Runs the query on `batch` (token ids). On an error the servers are
    /// told why (an `Abort` frame), so they stop instead of waiting.
    pub fn run(mut self, model: &Model, batch: &[Vec<u32>]) -> Result<QueryOutcome, ClientError> {
        let result = self.exchange(model, batch);
        if let Err(e) = &result {
            let reason = format!("the client gave up: {e}");
            for link in &mut self.links {
                link.abort(&reason);
            }
        }
        result
    }

    fn exchange(&mut self, model: &Model, batch: &[Vec<u32>]) -> Result<QueryOutcome, ClientError> {
        let plan = &self.view;
        let inputs = clear_inputs(model, plan, batch)?;
        let shares = share(&inputs)?;
        let start = Instant::now();
        for (i, (link, s)) in self.links.iter_mut().zip(&shares).enumerate() {
            let parts = [&s.x[..], &s.bias, s.mask.as_deref().unwrap_or_default()];
            // Sized once, so no reallocation leaves a share behind; wiped.
            let words: usize = parts.iter().map(|p| p.len()).sum();
            let mut payload = zeroize::Zeroizing::new(Vec::with_capacity(8 * words));
            for part in parts {
                put_words(&mut payload, part);
            }
            link.send(Frame::Input, 0, &payload).map_err(net(i))?;
        }
        let out_len = plan.output_len;
        let mut outputs = Vec::new();
        let mut reports = Vec::new();
        for (i, link) in self.links.iter_mut().enumerate() {
            let bytes = link.recv(Frame::Output, 0, None).map_err(net(i))?;
            let (words, report) = split_output(&bytes, out_len)
                .map_err(|what| ClientError::Reply { server: i, what })?;
            outputs.push(words);
            reports.push(report);
        }
        let online_s = start.elapsed().as_secs_f64();
        let output: Vec<u64> = outputs[0]
            .iter()
            .zip(&outputs[1])
            .map(|(a, b)| a.wrapping_add(*b))
            .collect();
        let embeddings = finish(plan, &output, batch);
        let [r0, r1]: [PartyReport; 2] = reports
            .try_into()
            .map_err(|_| ClientError::Mismatch("missing report".into()))?;
        Ok(QueryOutcome {
            embeddings,
            output,
            reports: [r0, r1],
            online_s,
            plan_hash: self.plan_hash.clone(),
        })
    }
}

fn net(server: usize) -> impl Fn(NetError) -> ClientError {
    move |source| ClientError::Net {
        server,
        error: source,
    }
}

/// The shape this client expects the servers' keys to be dealt for. What
/// the servers announce is checked against it before anything is built or
/// allocated for their shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expect {
    /// Sentences per query.
    pub batch: usize,
    /// Tokens per sentence, if the client insists on one.
    pub seq: Option<usize>,
}

/// Connects to both servers, exchanges hellos and checks that they hold
/// the same key set and plan, for `model` (by its digest), at the shape
/// `expect` allows. `timeouts.connect` bounds all of it, both servers
/// together (connections, TLS handshakes, hellos), so a stalled server ends
/// the client within it; each later frame gets `timeouts.io`.
pub fn connect<'a>(
    model: impl Into<ModelRef<'a>>,
    servers: [&str; 2],
    timeouts: Timeouts,
    sec: &Security,
    expect: Expect,
) -> Result<Connected, ClientError> {
    let (digest, hidden) = match model.into() {
        ModelRef::Encoder(m) => (hex(&m.digest()), m.config.hidden),
        ModelRef::Decoder(m) => (hex(&m.digest()), m.config.hidden),
    };
    // One server at a time, hello included: P1 accepts a client only once
    // it has met P0.
    // P1 is asked to join the key set P0 announced: a pooled P1 serves
    // many queries and pairs this connection with P0's by it.
    let deadline = Instant::now().checked_add(timeouts.connect);
    let left = || {
        deadline.map_or(timeouts.connect, |d| {
            d.saturating_duration_since(Instant::now())
        })
    };
    let mut links = Vec::with_capacity(2);
    let mut shapes: Vec<Announced> = Vec::new();
    for (i, role) in [Role::P0, Role::P1].into_iter().enumerate() {
        let wait = left();
        if wait.is_zero() {
            let during = "connecting to the servers";
            return Err(net(i)(NetError::Timeout { during }));
        }
        let joining = shapes.first().map(|(_, key_set, _)| key_set.clone());
        let to = (i, servers[i], role);
        let (link, announced) = meet(to, (timeouts, wait, &left), sec, joining)?;
        links.push(link);
        shapes.push(announced);
    }
    let links: [Link; 2] = links
        .try_into()
        .map_err(|_| ClientError::Mismatch("a server link was lost".into()))?;
    let (plan_hash, view) = agree(shapes, expect, hidden, &digest)?;
    Ok(Connected {
        links,
        view,
        plan_hash,
    })
}

/// What a server announces in its hello: plan hash, key set and view.
type Announced = (String, String, ClientView);

/// Connects to server `i` at `addr` as `role` within `wait` (the hello
/// within what `left` says is left), says hello (asking to join the key
/// set P0 announced, for P1) and reads the server's.
fn meet(
    (i, addr, role): (usize, &str, Role),
    (timeouts, wait, left): (Timeouts, Duration, &dyn Fn() -> Duration),
    sec: &Security,
    joining: Option<String>,
) -> Result<(Link, Announced), ClientError> {
    let t = Timeouts {
        connect: wait,
        io: timeouts.io.min(wait),
    };
    let early = before_hello(i, addr, sec);
    let mut link = Link::connect_secured(addr, t, sec, role).map_err(&early)?;
    // The hellos, too, within what is left.
    link.set_io_timeout(timeouts.io.min(left()).max(Duration::from_millis(1)));
    let hello = match joining {
        Some(key_set) => Hello::Join { key_set },
        None => Hello::Client,
    };
    send_hello(&mut link, &hello).map_err(&early)?;
    let announced = match recv_hello(&mut link).map_err(&early)? {
        Ok(Hello::Server {
            party,
            plan_hash,
            key_set,
            view,
            ..
        }) if usize::from(party) == i => (plan_hash, key_set, view),
        Ok(Hello::Unavailable { reason }) => {
            return Err(ClientError::Unavailable { server: i, reason });
        }
        Ok(other) => {
            return Err(ClientError::Mismatch(format!(
                "server {i} ({addr}) introduced itself as {other:?}"
            )));
        }
        Err(what) => return Err(ClientError::Reply { server: i, what }),
    };
    link.set_io_timeout(timeouts.io);
    Ok((link, announced))
}

/// Checks that both servers announced the same key set and plan, at a
/// shape `expect` allows, for the model of digest `digest`: the plan hash
/// and the view.
fn agree(
    mut shapes: Vec<Announced>,
    expect: Expect,
    hidden: usize,
    digest: &str,
) -> Result<(String, ClientView), ClientError> {
    if let [a, b] = shapes.as_slice()
        && a != b
    {
        return Err(ClientError::Mismatch(format!(
            "the servers hold different key sets or plans: {a:?} vs {b:?}"
        )));
    }
    let (plan_hash, _, view) = shapes.swap_remove(0);
    check_view(&view, expect, hidden)?;
    if view.model_digest != digest {
        return Err(ClientError::Mismatch(format!(
            "the servers run model {}, but this client's model is {digest}: a different model?",
            view.model_digest
        )));
    }
    Ok((plan_hash, view))
}

/// Checks the shape the servers announce against what this client expects
/// and can hold, before anything is allocated for it: a server could
/// announce any numbers.
pub(crate) fn check_view(
    view: &ClientView,
    expect: Expect,
    hidden: usize,
) -> Result<(), ClientError> {
    if view.batch != expect.batch || expect.seq.is_some_and(|s| s != view.seq) {
        return Err(ClientError::Mismatch(format!(
            "the servers' keys are for {} sentence(s) × {} tokens; this query expects {} \
             sentence(s){}",
            view.batch,
            view.seq,
            expect.batch,
            expect
                .seq
                .map_or(String::new(), |s| format!(" × {s} tokens"))
        )));
    }
    let rows = view.batch.checked_mul(view.seq);
    let elements = rows.and_then(|r| r.checked_mul(hidden));
    let fits = |n: Option<usize>| {
        n.and_then(|n| u64::try_from(n).ok())
            .is_some_and(|n| n <= crate::plan::MAX_ELEMENTS)
    };
    if view.hidden != hidden || !fits(elements) || !fits(Some(view.output_len)) {
        return Err(ClientError::Mismatch(format!(
            "the servers announce hidden {} and {} output words for {} × {} tokens; this \
             model's hidden size is {hidden}",
            view.hidden, view.output_len, view.batch, view.seq
        )));
    }
    Ok(())
}

/// Asks two servers for the embeddings of `batch` (token ids).
pub fn query(
    model: &Model,
    servers: [&str; 2],
    batch: &[Vec<u32>],
    timeouts: Timeouts,
    sec: &Security,
) -> Result<QueryOutcome, ClientError> {
    let expect = Expect {
        batch: batch.len(),
        seq: None,
    };
    connect(model, servers, timeouts, sec, expect)?.run(model, batch)
}

/// An output frame: report length (u32), the report (JSON), the share.
pub fn output_frame(share: &[u64], report: &PartyReport) -> Vec<u8> {
    let json = serde_json::to_vec(report).unwrap_or_default();
    let mut out = Vec::with_capacity(4 + json.len() + share.len() * 8);
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&json);
    put_words(&mut out, share);
    out
}

pub(crate) fn split_output(bytes: &[u8], words: usize) -> Result<(Vec<u64>, PartyReport), String> {
    if bytes.len() < 4 {
        return Err("output frame too short".into());
    }
    let mut n = [0u8; 4];
    n.copy_from_slice(&bytes[..4]);
    let n = u32::from_le_bytes(n) as usize;
    let rest = &bytes[4..];
    if rest.len() != n + words * 8 {
        return Err(format!(
            "output frame of {} bytes, expected {} ({} words)",
            bytes.len(),
            4 + n + words * 8,
            words
        ));
    }
    let report = serde_json::from_slice(&rest[..n]).map_err(|e| format!("report: {e}"))?;
    Ok((get_words(&rest[n..]), report))
}
