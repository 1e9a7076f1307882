//! One server process: loads the model, checks its key file against its
//! own plan, meets its peer and a client, runs the party, returns the
//! output share.
//!
//! Connections: P1 dials P0 (`--peer`); P0 accepts its peer on its own
//! listening address. Each server accepts the client on its listening
//! address. Every connection opens with a hello; the servers compare plan
//! hashes and key-set ids before any work, and a server that fails tells
//! its peer and the client why (an `Abort` frame) before it exits.

use std::path::Path;

use suffuse_core::batch::BatchEval;
use suffuse_core::fss::Party;

use crate::client::{self, Hello};
use crate::keyfile::{KeyFileError, KeyReader};
use crate::model::ModelRef;
use crate::net::{FrameKind as Frame, Link, Listener, NetError, Timeouts, get_words};
use crate::party::{self, InputShares, PartyError, PartyReport, PassIo};
use crate::plan::{self, Plan, PlanError, Shape, hex};

/// Why a server failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The key file.
    #[error(transparent)]
    KeyFile(#[from] KeyFileError),
    /// The plan.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The network.
    #[error("{during}: {error}")]
    Net {
        /// What was going on.
        during: &'static str,
        /// The error.
        error: NetError,
    },
    /// The peer or client does not match.
    #[error("{0}")]
    Mismatch(String),
    /// The computation.
    #[error(transparent)]
    Party(#[from] PartyError),
}

fn net(during: &'static str) -> impl Fn(NetError) -> ServeError {
    move |source| ServeError::Net {
        during,
        error: source,
    }
}

/// Serves one query with the keys at `keys`, heavy operations on `fss`, and
/// returns this party's figures. `peer` is P0's address (used by P1 only).
#[allow(clippy::too_many_arguments)]
pub fn serve<'a>(
    model: impl Into<ModelRef<'a>>,
    party: Party,
    keys: &Path,
    listener: &Listener,
    peer: &str,
    timeouts: Timeouts,
    fss: &dyn BatchEval,
) -> Result<PartyReport, ServeError> {
    let reader = KeyReader::open_unspent(keys)?;
    let summary = reader.header.summary.clone();
    let shape = Shape {
        batch: summary.batch,
        seq: summary.seq,
        decode_steps: summary.decode_steps,
    };
    let plan = plan::build(model, shape)?;
    let me = u8::from(party == Party::P1);
    reader.check(me, &plan.hash)?;
    let hello = Hello::Server {
        party: me,
        plan_hash: plan.hash_hex(),
        key_set: hex(&reader.header.key_set),
        batch: plan.batch,
        seq: plan.seq,
        model: plan.model.clone(),
        view: client::ClientView::of(&plan),
    };
    let (mut peer_link, mut client_link) = match party {
        Party::P0 => accept_both(listener, &hello, timeouts)?,
        Party::P1 => {
            let mut p = Link::connect(peer, timeouts).map_err(net("connecting to P0"))?;
            client::send_hello(&mut p, &hello).map_err(net("greeting P0"))?;
            let theirs = client::recv_hello(&mut p).map_err(net("greeting P0"))?;
            check_peer(&mut p, &hello, theirs)?;
            let c = accept_client(listener, &hello, timeouts)?;
            (p, c)
        }
    };
    let result = run_query(&plan, party, reader, &mut peer_link, &mut client_link, fss);
    if let Err(e) = &result {
        let why = e.to_string();
        peer_link.abort(&why);
        client_link.abort(&why);
    }
    result
}

fn run_query(
    plan: &crate::plan::Plan,
    party: Party,
    reader: KeyReader,
    peer: &mut Link,
    client_link: &mut Link,
    fss: &dyn BatchEval,
) -> Result<PartyReport, ServeError> {
    let x_len = plan.tensors[plan.inputs.x].len();
    let b_len = plan.tensors[plan.inputs.bias].len();
    let m_len = plan.inputs.mask.map_or(0, |t| plan.tensors[t].len());
    let bytes = client_link
        .recv(Frame::Input, 0, Some(8 * (x_len + b_len + m_len)))
        .map_err(net("receiving the client's input"))?;
    let words = get_words(&bytes);
    let (x, rest) = words.split_at(x_len);
    let (bias, mask) = rest.split_at(b_len);
    let inputs = InputShares {
        x: x.to_vec(),
        bias: bias.to_vec(),
        mask: plan.inputs.mask.map(|_| mask.to_vec()),
    };
    reader.spend()?;
    let mut io = ClientPasses {
        plan,
        link: client_link,
        failed: None,
    };
    let report = party::run_passes(plan, party, reader, peer, fss, inputs, &mut io);
    match io.failed {
        Some(e) => Err(e),
        None => Ok(report?),
    }
}

/// The client's link as the source of later passes' inputs and the sink
/// of every pass's output share. An input frame with no payload stops the
/// generation.
struct ClientPasses<'a> {
    plan: &'a Plan,
    link: &'a mut Link,
    /// The network error behind a [`PartyError::Client`], kept whole.
    failed: Option<ServeError>,
}

impl ClientPasses<'_> {
    fn fail(&mut self, e: ServeError) -> PartyError {
        let why = e.to_string();
        self.failed = Some(e);
        PartyError::Client(why)
    }
}

impl PassIo for ClientPasses<'_> {
    fn input(&mut self, pass: usize) -> Result<Option<InputShares>, PartyError> {
        let p = self.plan.passes[pass];
        let (x_len, b_len) = (
            self.plan.tensors[p.x].len(),
            self.plan.tensors[p.bias].len(),
        );
        let bytes = match self.link.recv(Frame::Input, pass as u32, None) {
            Ok(b) => b,
            Err(e) => return Err(self.fail(net("receiving the client's input")(e))),
        };
        if bytes.is_empty() {
            return Ok(None);
        }
        if bytes.len() != 8 * (x_len + b_len) {
            let why = format!(
                "pass {pass}: the client sent {} bytes of input, the plan needs {}",
                bytes.len(),
                8 * (x_len + b_len)
            );
            return Err(self.fail(ServeError::Mismatch(why)));
        }
        let words = get_words(&bytes);
        let (x, bias) = words.split_at(x_len);
        Ok(Some(InputShares {
            x: x.to_vec(),
            bias: bias.to_vec(),
            mask: None,
        }))
    }

    fn output(
        &mut self,
        pass: usize,
        share: Vec<u64>,
        so_far: &PartyReport,
    ) -> Result<(), PartyError> {
        let frame = client::output_frame(&share, so_far);
        self.link
            .send(Frame::Output, pass as u32, &frame)
            .map_err(|e| self.fail(net("sending the output share")(e)))
    }
}

/// P0: accepts connections until it has met its peer and a client.
fn accept_both(
    listener: &Listener,
    hello: &Hello,
    t: Timeouts,
) -> Result<(Link, Link), ServeError> {
    let mut peer = None;
    let mut client = None;
    while peer.is_none() || client.is_none() {
        let mut link = listener
            .accept(t)
            .map_err(net("waiting for the peer and the client"))?;
        match client::recv_hello(&mut link).map_err(net("reading a hello"))? {
            Ok(Hello::Client) if client.is_none() => {
                client::send_hello(&mut link, hello).map_err(net("greeting the client"))?;
                client = Some(link);
            }
            Ok(theirs @ Hello::Server { .. }) if peer.is_none() => {
                client::send_hello(&mut link, hello).map_err(net("greeting P1"))?;
                check_peer(&mut link, hello, Ok(theirs))?;
                peer = Some(link);
            }
            Ok(_) => link.abort("this server already has that connection"),
            Err(why) => link.abort(&why),
        }
    }
    match (peer, client) {
        (Some(p), Some(c)) => Ok((p, c)),
        _ => Err(ServeError::Mismatch("connections lost".into())),
    }
}

/// P1: accepts the client.
fn accept_client(listener: &Listener, hello: &Hello, t: Timeouts) -> Result<Link, ServeError> {
    loop {
        let mut link = listener.accept(t).map_err(net("waiting for the client"))?;
        match client::recv_hello(&mut link).map_err(net("reading a hello"))? {
            Ok(Hello::Client) => {
                client::send_hello(&mut link, hello).map_err(net("greeting the client"))?;
                return Ok(link);
            }
            Ok(_) => link.abort("expected a client"),
            Err(why) => link.abort(&why),
        }
    }
}

/// The two servers must run the same plan on the same key set.
fn check_peer(
    link: &mut Link,
    mine: &Hello,
    theirs: Result<Hello, String>,
) -> Result<(), ServeError> {
    let (
        Hello::Server {
            party: p,
            plan_hash: h,
            key_set: k,
            ..
        },
        Ok(Hello::Server {
            party: q,
            plan_hash: g,
            key_set: j,
            ..
        }),
    ) = (mine, &theirs)
    else {
        let why = format!("the peer did not introduce itself as a server: {theirs:?}");
        link.abort(&why);
        return Err(ServeError::Mismatch(why));
    };
    let why = if p == q {
        Some(format!("both servers claim to be party {p}"))
    } else if h != g {
        Some(format!("plan mismatch: this server runs {h}, the peer {g}"))
    } else if k != j {
        Some(format!(
            "key-set mismatch: this server holds {k}, the peer {j} (keys from different dealer runs)"
        ))
    } else {
        None
    };
    match why {
        Some(why) => {
            link.abort(&why);
            Err(ServeError::Mismatch(why))
        }
        None => Ok(()),
    }
}
