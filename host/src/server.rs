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
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, Instant};

use suffuse_core::batch::BatchEval;
use suffuse_core::fss::Party;

use crate::client::{self, Hello};
use crate::keyfile::{KeyFileError, KeyReader, Spent};
use crate::ledger::Ledger;
use crate::model::ModelRef;
use crate::net::{
    FrameKind as Frame, Link, Listener, NetError, Role, Security, Timeouts, get_words,
};
use crate::party::{self, InputShares, PartyError, PartyReport, PassIo};
use crate::plan::{self, Plan, PlanError, hex};
use zeroize::Zeroizing;

pub(crate) mod intro;

use intro::{Handshakes, Introduced, origin};

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

impl ServeError {
    /// What the peer and the client are told when a query fails: the error,
    /// except that one in this server's own files (key file, ledger) is
    /// told by its kind, without their paths (issue 27). The log has it
    /// whole.
    pub fn for_others(&self) -> String {
        match self {
            ServeError::KeyFile(e) | ServeError::Party(PartyError::KeyFile(e)) => {
                format!("the server failed: {}", e.summary())
            }
            other => other.to_string(),
        }
    }
}

pub(crate) fn net(during: &'static str) -> impl Fn(NetError) -> ServeError {
    move |source| ServeError::Net {
        during,
        error: source,
    }
}

/// How a server runs.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// `connect` bounds the whole wait for the peer and the client; `io`
    /// bounds every frame.
    pub timeouts: Timeouts,
    /// The spent-key ledger.
    pub ledger: Ledger,
    /// Keep a key file on disk once spent (it is deleted otherwise).
    pub keep_spent: bool,
    /// Mutual TLS as this party's role, or plain TCP.
    pub security: Security,
}

/// The longest a connection may take to introduce itself before it is
/// dropped: a legitimate peer sends its hello at once, and a silent or
/// trickling one must not hold the accept loop for a whole io timeout.
pub(crate) const HELLO_WAIT: Duration = Duration::from_secs(10);

/// The longest a server waits on its client within a query: for the input
/// after the hellos (time to greet the other server and share the input),
/// for the join at P1, and for each generation pass's input. A client
/// does nothing slow in between, and one that stays silent must not hold
/// a query slot for the whole io timeout.
pub(crate) const CLIENT_WAIT: Duration = Duration::from_secs(20);

/// Receives the client's input for `pass` within [`CLIENT_WAIT`] (or the
/// link's io timeout, if shorter).
fn recv_input(link: &mut Link, pass: u32, len: Option<usize>) -> Result<Vec<u8>, NetError> {
    let io = link.timeouts().io;
    link.set_io_timeout(io.min(CLIENT_WAIT));
    let got = link.recv(Frame::Input, pass, len);
    link.set_io_timeout(io);
    got
}

/// The step of the round in which the servers confirm that both hold a
/// valid input, before either spends its keys (outside every plan).
pub const READY_STEP: u32 = u32::MAX - 1;

/// Serves one query with the keys at `keys`, heavy operations on `fss`, and
/// returns this party's figures. `peer` is P0's address (used by P1 only).
/// Every failure is an error within the timeouts, told to the peer and the
/// client where a link to them exists.
pub fn serve<'a>(
    model: impl Into<ModelRef<'a>>,
    party: Party,
    keys: &Path,
    listener: &Listener,
    peer: &str,
    opts: &ServeOptions,
    fss: &dyn BatchEval,
) -> Result<PartyReport, ServeError> {
    let reader = KeyReader::open_unspent(keys, &opts.ledger)?;
    let plan = plan::build(model, reader.header.summary.shape())?;
    let me = u8::from(party == Party::P1);
    reader.check(me, &plan.hash, &party::key_sections(&plan, party))?;
    let hello = server_hello(&plan, me, &reader.header.key_set);
    let meet = Meeting {
        listener,
        hello: &hello,
        t: opts.timeouts,
        deadline: Instant::now().checked_add(opts.timeouts.connect),
        me,
        sec: &opts.security,
    };
    let (mut peer_link, mut client_link) = match party {
        Party::P0 => match meet.meet(true)? {
            (Some(p), c) => (p, c),
            (None, _) => return Err(ServeError::Mismatch("connections lost".into())),
        },
        Party::P1 => {
            let mut p = meet.dial_p0(peer)?;
            match meet.meet(false) {
                Ok((_, c)) => (p, c),
                Err(e) => {
                    p.abort(&e.for_others());
                    return Err(e);
                }
            }
        }
    };
    serve_query(
        &plan,
        party,
        reader,
        [&mut peer_link, &mut client_link],
        opts,
        fss,
    )
}

/// What a server tells the client and its peer about the query it serves.
pub(crate) fn server_hello(plan: &Plan, me: u8, key_set: &[u8; 16]) -> Hello {
    Hello::Server {
        party: me,
        plan_hash: plan.hash_hex(),
        key_set: hex(key_set),
        batch: plan.batch,
        seq: plan.seq,
        model: plan.model.clone(),
        view: client::ClientView::of(plan),
    }
}

/// Runs one query once both links are up and the key set agreed: the
/// client's input, the ready round, the spend, the passes. On a failure the
/// peer and the client are told why.
pub(crate) fn serve_query(
    plan: &Plan,
    party: Party,
    reader: KeyReader,
    [peer, client_link]: [&mut Link; 2],
    opts: &ServeOptions,
    fss: &dyn BatchEval,
) -> Result<PartyReport, ServeError> {
    let result = run_query(plan, party, reader, peer, client_link, opts, fss);
    if let Err(e) = &result {
        let why = e.for_others();
        peer.abort(&why);
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
    opts: &ServeOptions,
    fss: &dyn BatchEval,
) -> Result<PartyReport, ServeError> {
    let x_len = plan.tensors[plan.inputs.x].len();
    let b_len = plan.tensors[plan.inputs.bias].len();
    let m_len = plan.inputs.mask.map_or(0, |t| plan.tensors[t].len());
    let words = x_len
        .checked_add(b_len)
        .and_then(|n| n.checked_add(m_len))
        .and_then(|n| n.checked_mul(8))
        .ok_or_else(|| ServeError::Mismatch("the plan's input is too large".into()))?;
    let bytes = Zeroizing::new(
        recv_input(client_link, 0, Some(words)).map_err(net("receiving the client's input"))?,
    );
    let words = Zeroizing::new(get_words(&bytes));
    let (x, rest) = words.split_at(x_len);
    let (bias, mask) = rest.split_at(b_len);
    let inputs = InputShares {
        x: x.to_vec(),
        bias: bias.to_vec(),
        mask: plan.inputs.mask.map(|_| mask.to_vec()),
    };
    // Both servers hold a valid input before either spends its keys: a
    // client that fails one of them costs no keys at the other.
    peer.exchange(READY_STEP, b"ready", 5)
        .map_err(net("confirming the input with the peer"))?;
    if let Spent::Undeletable(e) = reader.spend(&opts.ledger, opts.keep_spent)? {
        crate::logline::line(
            party.index() as u8,
            &format!(
                "warning: the spent key file {} could not be deleted ({e}); \
             the ledger refuses its key set from now on, but delete the file by hand \
             (docs/DEPLOY.md)",
                reader.path().display()
            ),
        );
    }
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
/// generation; any length but 0 and the pass's input is refused.
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
        let want = 8 * (x_len + b_len);
        // Exactly the pass's input or nothing (stop): the limit refuses a
        // longer frame from its header, before any of it is read.
        let cap = self.link.max_payload();
        self.link.set_max_payload(want as u64);
        let got = recv_input(self.link, pass as u32, None);
        self.link.set_max_payload(cap);
        let bytes = match got {
            Ok(b) => Zeroizing::new(b),
            Err(e) => return Err(self.fail(net("receiving the client's input")(e))),
        };
        if bytes.is_empty() {
            return Ok(None);
        }
        if bytes.len() != want {
            let why = format!(
                "pass {pass}: the client sent {} bytes of input, the plan needs {want} or 0",
                bytes.len(),
            );
            return Err(self.fail(ServeError::Mismatch(why)));
        }
        let words = Zeroizing::new(get_words(&bytes));
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

/// A connection that introduced itself.
enum Accepted {
    Peer(Link),
    Client(Link),
}

/// An introduction in the making: done, dropped (where from and why), or
/// the listener failed.
type Arrival = Result<Result<Introduced, String>, NetError>;

/// How often the accepting thread looks whether the meeting is over.
const ACCEPT_TICK: Duration = Duration::from_millis(50);

/// What a server needs to meet its peer and its client before a deadline.
struct Meeting<'a> {
    listener: &'a Listener,
    hello: &'a Hello,
    t: Timeouts,
    /// When the server stops waiting (`None`: too far to represent).
    deadline: Option<Instant>,
    /// 0 or 1.
    me: u8,
    sec: &'a Security,
}

impl Meeting<'_> {
    /// The wait left before the deadline.
    fn left(&self) -> Duration {
        match self.deadline {
            Some(d) => d.saturating_duration_since(Instant::now()),
            None => self.t.connect,
        }
    }

    /// P1: dials P0 and checks it.
    fn dial_p0(&self, addr: &str) -> Result<Link, ServeError> {
        let t = Timeouts {
            connect: self.left(),
            io: self.t.io.min(HELLO_WAIT),
        };
        let mut p =
            Link::connect_secured(addr, t, self.sec, Role::P0).map_err(net("connecting to P0"))?;
        client::send_hello(&mut p, self.hello).map_err(net("greeting P0"))?;
        let theirs = client::recv_hello(&mut p).map_err(net("greeting P0"))?;
        check_peer(&mut p, self.hello, theirs)?;
        p.set_io_timeout(self.t.io);
        Ok(p)
    }

    /// Meets a client, and the peer too if `want_peer` (P0). Connections
    /// are secured and introduce themselves on threads of their own (see
    /// [`intro`]), so one that stalls holds up no other; each gets at most
    /// [`HELLO_WAIT`] and never outlasts the deadline.
    fn meet(&self, want_peer: bool) -> Result<(Option<Link>, Link), ServeError> {
        let (tx, rx) = mpsc::channel();
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| self.admit(tx, &done));
            let met = self.gather(&rx, want_peer);
            done.store(true, Ordering::Relaxed);
            met
        })
    }

    /// Accepts connections until the meeting is over or the deadline, each
    /// introduced on a detached thread that reports to `tx`: the meeting
    /// need not wait for a stalled one to end.
    fn admit(&self, tx: Sender<Arrival>, done: &AtomicBool) {
        let places = Arc::new(Handshakes::default());
        while !done.load(Ordering::Relaxed) && !self.left().is_zero() {
            let t = Timeouts {
                connect: self.left().min(ACCEPT_TICK),
                io: HELLO_WAIT,
            };
            let incoming = match self.listener.accept_incoming(t) {
                Ok(i) => i,
                Err(NetError::Timeout { .. }) => continue,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            let Some(place) = places.enter() else {
                let why = "too many connections are introducing themselves";
                self.log(&format!(
                    "dropped a connection from {}: {why}",
                    origin(&incoming)
                ));
                continue;
            };
            let within = (self.t.io.min(HELLO_WAIT).min(self.left())).max(Duration::from_millis(1));
            let (tx, sec, io) = (tx.clone(), self.sec.clone(), self.t.io);
            let spawned = std::thread::Builder::new().spawn(move || {
                let _place = place;
                let _ = tx.send(Ok(intro::introduce(incoming, within, io, &sec)));
            });
            if let Err(e) = spawned {
                self.log(&format!("dropped a connection: no thread for it: {e}"));
            }
        }
    }

    /// Takes introductions until the wanted links are there; the deadline
    /// or a failed listener ends the wait.
    fn gather(
        &self,
        rx: &Receiver<Arrival>,
        want_peer: bool,
    ) -> Result<(Option<Link>, Link), ServeError> {
        let mut peer = None;
        let mut client = None;
        while (want_peer && peer.is_none()) || client.is_none() {
            // A closed channel means the accepting thread saw the deadline.
            let arrival = rx
                .recv_timeout(self.left())
                .unwrap_or(Err(NetError::Timeout {
                    during: "waiting for a peer to connect",
                }));
            let taken = match arrival {
                Ok(Ok(intro)) => self.take(intro, want_peer && peer.is_none(), client.is_none()),
                Ok(Err(why)) => {
                    self.log(&format!("dropped a connection from {why}"));
                    Ok(None)
                }
                Err(e) => Err(net("waiting for the peer and the client")(e)),
            };
            match taken {
                Ok(Some(Accepted::Peer(l))) => peer = Some(l),
                Ok(Some(Accepted::Client(l))) => client = Some(l),
                Ok(None) => {}
                Err(e) => {
                    for l in peer.iter_mut().chain(client.iter_mut()) {
                        l.abort(&e.for_others());
                    }
                    return Err(e);
                }
            }
        }
        match client {
            Some(c) => Ok((peer, c)),
            None => Err(ServeError::Mismatch("connections lost".into())),
        }
    }

    /// One introduced connection: a wanted client or peer is greeted; any
    /// other is refused with a log line and the wait goes on (a port scan
    /// or a health check does not end the server, only the deadline does).
    /// A peer that introduces itself and does not match is an error.
    fn take(
        &self,
        intro: Introduced,
        want_peer: bool,
        want_client: bool,
    ) -> Result<Option<Accepted>, ServeError> {
        let Introduced {
            mut link,
            role,
            hello,
            from,
        } = intro;
        match hello {
            Ok(h @ (Hello::Client | Hello::Join { .. }))
                if want_client && role.is_none_or(|r| r == Role::Client) && self.joins(&h) =>
            {
                client::send_hello(&mut link, self.hello).map_err(net("greeting the client"))?;
                Ok(Some(Accepted::Client(link)))
            }
            Ok(theirs @ Hello::Server { .. })
                if want_peer && role.is_none_or(|r| r == Role::P1) =>
            {
                client::send_hello(&mut link, self.hello).map_err(net("greeting P1"))?;
                check_peer(&mut link, self.hello, Ok(theirs))?;
                Ok(Some(Accepted::Peer(link)))
            }
            Ok(h) => {
                let kind = h.kind();
                self.log(&format!("refused an unexpected {kind} hello from {from}"));
                link.abort("this server does not accept that connection now");
                Ok(None)
            }
            Err(why) => {
                self.log(&format!("dropped a connection from {from}: {why}"));
                link.abort(&why);
                Ok(None)
            }
        }
    }

    /// A client's hello is for this query: a plain one, or one joining
    /// this server's key set.
    fn joins(&self, theirs: &Hello) -> bool {
        match (theirs, self.hello) {
            (Hello::Join { key_set }, Hello::Server { key_set: mine, .. }) => key_set == mine,
            (Hello::Join { .. }, _) => false,
            _ => true,
        }
    }

    fn log(&self, what: &str) {
        crate::logline::line(self.me, what);
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
