//! The long-running server: many queries, concurrently, one pooled key set
//! each ([`crate::pool`]), until SIGTERM.
//!
//! Links. P1 keeps `max_concurrent` standing links open to P0 (it dials,
//! as in the one-shot server); each carries the agreement of one query and
//! then that query's rounds, and is closed after it (P1 dials a fresh one).
//! One link per query keeps the rounds of concurrent queries apart with no
//! multiplexing, and each query's traffic figures its own.
//!
//! One query:
//! 1. A client connects to P0: mutual TLS (a client certificate), then its
//!    hello. Only then does it take one of the `max_concurrent` slots, at
//!    most `max_per_client` of them per client address.
//! 2. P0 claims the oldest unspent set in its pool (locked, ledger-checked)
//!    and proposes its id on an idle standing link. P1 claims its own file
//!    of that set (locked, ledger-checked, same plan) and holds it, or
//!    declines; P0 then skips the set (for good if P1 lacks it or has it
//!    spent) and proposes the next. Nothing is spent by either.
//! 3. P0 answers the client with the agreed set; the client joins P1 with
//!    that id, and P1 pairs the connection with the standing link holding it.
//! 4. [`crate::server`]'s query: both receive a valid input, confirm it to
//!    each other, and only then spend the set in their ledgers.
//!
//! A connection that fails its handshake or hello is dropped with a log
//! line, on its own thread, and never holds a slot. Shutdown: the stop flag
//! (SIGTERM, SIGINT) ends admission; queries in flight finish, and those
//! still running at the drain deadline have their sockets shut down.

use std::collections::HashMap;
use std::net::{IpAddr, Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{Scope, sleep};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use suffuse_core::batch::BatchEval;
use suffuse_core::fss::Party;

use crate::client::{self, Hello, Unavailable};
use crate::keyfile::Summary;
use crate::metrics::ServerMetrics;
use crate::model::ModelRef;
use crate::net::{FrameKind as Frame, Incoming, Link, Listener, NetError, Role, Timeouts};
use crate::party;
use crate::plan::{self, Plan, hex};
use crate::pool::{Claim, Pool};
use crate::server::intro::{self, Handshakes, Introduced, Place};
use crate::server::{HELLO_WAIT, ServeError, ServeOptions, net, serve_query, server_hello};

/// How a long-running server runs.
#[derive(Clone, Debug)]
pub struct ServiceOptions {
    /// Timeouts, ledger, spent files, TLS: as for one query.
    pub serve: ServeOptions,
    /// Queries served at once.
    pub max_concurrent: usize,
    /// Of those, at most this many for one client address (P0 counts;
    /// P1's slots follow P0's agreements).
    pub max_per_client: usize,
    /// How long queries in flight may take to finish after the stop flag.
    pub drain: Duration,
    /// Where the queries' outcomes are counted (`serve --metrics`).
    pub metrics: Option<Arc<ServerMetrics>>,
}

/// What a long-running server did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ServiceReport {
    /// Queries answered.
    pub served: u64,
    /// Queries that failed after admission.
    pub failed: u64,
    /// Clients turned away (pool empty, busy, shutting down).
    pub refused: u64,
    /// Connections dropped before admission (handshake or hello failed).
    pub dropped: u64,
}

/// The agreement frames' step (outside every plan, the hello's and the
/// ready round's).
const AGREE_STEP: u32 = u32::MAX - 2;

/// The longest pause before the server looks at the stop flag again.
const TICK: Duration = Duration::from_millis(200);

/// P0 and P1's agreement on a key set, over a standing link.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "agree", rename_all = "snake_case")]
enum Agree {
    /// P0: serve this set.
    Propose { key_set: String, plan_hash: String },
    /// P1: claimed; waiting for the client.
    Hold,
    /// P1: not this set; `retry` if it may serve later.
    Decline { why: String, retry: bool },
}

fn send_agree(link: &mut Link, a: &Agree) -> Result<(), NetError> {
    let bytes = serde_json::to_vec(a).unwrap_or_default();
    link.send(Frame::Hello, AGREE_STEP, &bytes)
}

fn recv_agree(link: &mut Link) -> Result<Agree, ServeError> {
    let bytes = link
        .recv(Frame::Hello, AGREE_STEP, None)
        .map_err(net("agreeing on a key set"))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ServeError::Mismatch(format!("malformed agreement message: {e}")))
}

/// Runs the server until `stop` is set and the queries in flight are done
/// (or the drain deadline has passed). `peer` is P0's address (P1 only).
///
/// While it starts to accept, a thread plans every shape of this model
/// that the pool holds a set for (`Plans::for_pool`): a plan takes
/// seconds (SmolLM2 at bucket 64 with 8 passes, 16–20 s on 2 cores), and
/// the first client would otherwise wait for both servers to plan, one
/// after the other. The server reports ready (`/readyz`) once that is
/// done; a client that comes sooner waits for the plan being built, never
/// builds it again. A shape dealt later is planned at its first claim.
#[allow(clippy::too_many_arguments)]
pub fn run<'a>(
    model: impl Into<ModelRef<'a>>,
    party: Party,
    pool: &Pool,
    listener: Listener,
    peer: &str,
    opts: &ServiceOptions,
    fss: &dyn BatchEval,
    stop: &AtomicBool,
) -> ServiceReport {
    let model = model.into();
    let me = u8::from(party == Party::P1);
    match pool.sweep_spent(&opts.serve.ledger, opts.serve.keep_spent) {
        Ok(0) => {}
        Ok(n) => crate::logline::line(
            me,
            &format!("cleared {n} key file(s) of sets the ledger had spent (left by a crash)"),
        ),
        Err(e) => crate::logline::line(me, &format!("sweeping spent key files: {e}")),
    }
    let s = Shared {
        model,
        digest: digest(model),
        party,
        me: u8::from(party == Party::P1),
        pool,
        opts,
        fss,
        stop,
        plans: Plans::default(),
        slots: Gate::default(),
        idle_peers: Gate::default(),
        pending: Mutex::default(),
        sockets: Mutex::default(),
        handshakes: Arc::default(),
        counts: Counts::default(),
    };
    std::thread::scope(|scope| {
        scope.spawn(|| {
            s.plans.for_pool(model, pool, s.me, stop);
            s.metric(ServerMetrics::planned);
        });
        if party == Party::P1 {
            for _ in 0..opts.max_concurrent.max(1) {
                scope.spawn(|| s.standby(peer));
            }
        }
        let since = s.accept_loop(scope, &listener);
        drop(listener);
        s.drain(since + opts.drain);
    });
    s.counts.report()
}

fn digest(model: ModelRef<'_>) -> String {
    match model {
        ModelRef::Encoder(m) => hex(&m.digest()),
        ModelRef::Decoder(m) => hex(&m.digest()),
    }
}

#[derive(Default)]
struct Counts {
    served: AtomicU64,
    failed: AtomicU64,
    refused: AtomicU64,
    dropped: AtomicU64,
}

impl Counts {
    fn report(&self) -> ServiceReport {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ServiceReport {
            served: get(&self.served),
            failed: get(&self.failed),
            refused: get(&self.refused),
            dropped: get(&self.dropped),
        }
    }
}

/// The plans a server has built, one per shape of its key sets, kept for
/// the life of the server. Each shape has its own lock, held while its plan
/// is built, so that a shape is planned once however many queries ask.
#[derive(Default)]
struct Plans {
    slots: Mutex<HashMap<(usize, usize, usize), PlanSlot>>,
    /// Plans built (for tests: a shape is built once).
    built: AtomicU64,
}

type PlanSlot = Arc<Mutex<Option<Arc<Plan>>>>;

impl Plans {
    /// Plans every shape of `model` that `party`'s pool holds a set for,
    /// until `stop` is set. Sets for another model are left to their claim,
    /// which turns them away; so is a shape that cannot be planned (logged).
    fn for_pool(&self, model: ModelRef<'_>, pool: &Pool, party: u8, stop: &AtomicBool) {
        let digest = digest(model);
        for h in crate::pool::headers(pool.dir(), party)
            .into_iter()
            .flatten()
        {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            if h.summary.model_digest == digest
                && let Err(e) = self.get(model, &h.summary, party)
            {
                let why = format!("planning for key set {}: {e}", hex(&h.key_set));
                crate::logline::line(party, &why);
            }
        }
    }

    /// The plan of a key file's shape: built (and logged) by the first
    /// caller, waited for by any other that comes while it is built.
    fn get(&self, model: ModelRef<'_>, s: &Summary, party: u8) -> Result<Arc<Plan>, ServeError> {
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
            slots
                .entry((s.batch, s.seq, s.decode_steps))
                .or_default()
                .clone()
        };
        let mut held = slot.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(p) = held.as_ref() {
            return Ok(p.clone());
        }
        let t = Instant::now();
        let plan = plan::build(model, s.shape())?;
        let what = format!(
            "planned {} x {} tokens, {} decode passes, in {:.1} s (plan {})",
            s.batch,
            s.seq,
            s.decode_steps,
            t.elapsed().as_secs_f64(),
            &hex(&plan.hash)[..16]
        );
        crate::logline::line(party, &what);
        self.built.fetch_add(1, Ordering::Relaxed);
        *held = Some(plan.clone());
        Ok(plan)
    }

    /// The shapes planned so far.
    #[cfg(test)]
    fn planned(&self) -> Vec<((usize, usize, usize), [u8; 32])> {
        let slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out: Vec<_> = slots
            .iter()
            .filter_map(|(k, v)| {
                let held = v.lock().unwrap_or_else(PoisonError::into_inner);
                held.as_ref().map(|p| (*k, p.hash))
            })
            .collect();
        out.sort_unstable();
        out
    }
}

/// A value behind a mutex with a condition variable for its waiters.
#[derive(Default)]
struct Gate<T> {
    value: Mutex<T>,
    changed: Condvar,
}

impl<T> Gate<T> {
    fn lock(&self) -> MutexGuard<'_, T> {
        self.value.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until `take` gets something out of the value, or `until`
    /// passes, or `stop` is set; the wait ticks so that a stop is seen.
    fn wait_for<R>(
        &self,
        until: Instant,
        stop: &AtomicBool,
        mut take: impl FnMut(&mut T) -> Option<R>,
    ) -> Option<R> {
        let mut v = self.lock();
        loop {
            if let Some(r) = take(&mut v) {
                return Some(r);
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() || stop.load(Ordering::Relaxed) {
                return None;
            }
            v = self
                .changed
                .wait_timeout(v, left.min(TICK))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    fn update(&self, f: impl FnOnce(&mut T)) {
        f(&mut self.lock());
        self.changed.notify_all();
    }
}

/// What every thread of a server shares.
struct Shared<'a> {
    model: ModelRef<'a>,
    digest: String,
    party: Party,
    me: u8,
    pool: &'a Pool,
    opts: &'a ServiceOptions,
    fss: &'a dyn BatchEval,
    stop: &'a AtomicBool,
    plans: Plans,
    /// Queries in flight.
    slots: Gate<Slots>,
    /// P0: P1's standing links, idle.
    idle_peers: Gate<Vec<Link>>,
    /// P1: the queries holding a set, waiting for their client.
    pending: Mutex<HashMap<[u8; 16], SyncSender<Link>>>,
    /// Sockets of the queries in flight, by query, for the drain deadline.
    sockets: Mutex<HashMap<[u8; 16], Vec<TcpStream>>>,
    handshakes: Arc<Handshakes>,
    counts: Counts,
}

impl<'a> Shared<'a> {
    fn log(&self, what: &str) {
        crate::logline::line(self.me, what);
    }

    /// Counts in the metrics, if the server keeps them.
    fn metric(&self, f: impl FnOnce(&ServerMetrics)) {
        if let Some(m) = &self.opts.metrics {
            f(m);
        }
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn t(&self) -> Timeouts {
        self.opts.serve.timeouts
    }

    /// Accepts connections and hands each to its own thread, until the stop
    /// flag is set and no query is in flight (P1 must still accept the
    /// clients of queries it holds) or the drain deadline has passed.
    /// Returns when the stop was seen.
    fn accept_loop<'s>(&'s self, scope: &'s Scope<'s, '_>, listener: &Listener) -> Instant {
        let mut drain_from: Option<Instant> = None;
        self.metric(|m| m.set_accepting(true));
        loop {
            if self.stopping() {
                self.metric(|m| m.set_accepting(false));
                let since = *drain_from.get_or_insert_with(Instant::now);
                if self.slots.lock().total == 0 || since.elapsed() >= self.opts.drain {
                    return since;
                }
            }
            let t = Timeouts {
                connect: TICK,
                io: self.t().io.min(HELLO_WAIT),
            };
            let incoming = match listener.accept_incoming(t) {
                Ok(i) => i,
                Err(NetError::Timeout { .. }) => continue,
                Err(e) => {
                    self.log(&format!("accepting: {e}"));
                    sleep(TICK);
                    continue;
                }
            };
            let Some(place) = self.handshakes.enter() else {
                self.dropped(&incoming, "too many connections are introducing themselves");
                continue;
            };
            scope.spawn(move || self.connection(incoming, t.io, place));
        }
    }

    fn dropped(&self, incoming: &Incoming, why: &str) {
        self.counts.dropped.fetch_add(1, Ordering::Relaxed);
        self.metric(ServerMetrics::dropped);
        let from = intro::origin(incoming);
        self.log(&format!("dropped a connection from {from}: {why}"));
    }

    /// One accepted connection: secured and introduced within `within`
    /// (its place among the introductions then given back), dispatched.
    fn connection(&self, incoming: Incoming, within: Duration, place: Place) {
        let drop_it = |why: String| {
            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
            self.metric(ServerMetrics::dropped);
            self.log(&format!("dropped a connection from {why}"));
        };
        let introduced = intro::introduce(incoming, within, self.t().io, &self.opts.serve.security);
        drop(place);
        let Introduced {
            mut link,
            role,
            hello,
            from,
        } = match introduced {
            Ok(i) => i,
            Err(why) => return drop_it(why),
        };
        let hello = match hello {
            Ok(h) => h,
            Err(why) => {
                link.abort(&why);
                return drop_it(format!("{from}: {why}"));
            }
        };
        let is = |r: Role| role.is_none_or(|x| x == r);
        match (self.party, hello) {
            (Party::P0, Hello::Client) if is(Role::Client) => self.client_at_p0(link),
            (
                Party::P0,
                Hello::Standby {
                    party: 1,
                    model_digest,
                },
            ) if is(Role::P1) => {
                self.standby_at_p0(link, &model_digest);
            }
            (Party::P1, Hello::Join { key_set }) if is(Role::Client) => {
                self.join_at_p1(link, &key_set);
            }
            (_, other) => {
                link.abort("this server does not accept that connection");
                drop_it(format!("{from}: unexpected {} hello", other.kind()));
            }
        }
    }

    fn refuse(&self, link: &mut Link, reason: Unavailable) {
        self.counts.refused.fetch_add(1, Ordering::Relaxed);
        self.metric(|m| m.refused(refusal(reason)));
        let from = intro::link_origin(link);
        self.log(&format!("turned a client away from {from}: {reason}"));
        let _ = client::send_hello(link, &Hello::Unavailable { reason });
    }

    /// The plan of a key set's shape, built once per shape.
    fn plan(&self, claim: &Claim) -> Result<Arc<Plan>, ServeError> {
        let Some(h) = claim.header() else {
            return Err(ServeError::Mismatch("the claim's reader was taken".into()));
        };
        self.plans.get(self.model, &h.summary, self.me)
    }

    /// A claimed set's plan, checked against its header and its section
    /// table.
    fn checked_plan(&self, claim: &Claim) -> Result<Arc<Plan>, ServeError> {
        let plan = self.plan(claim)?;
        let Some(r) = claim.reader() else {
            return Err(ServeError::Mismatch("the claim's reader was taken".into()));
        };
        if r.header.plan_hash != plan.hash
            || r.header.summary.model_digest != hex(&plan.model_digest)
        {
            return Err(ServeError::Mismatch(format!(
                "key set {} was dealt for another model or plan",
                hex(claim.id())
            )));
        }
        let sections = party::key_sections(&plan, self.party);
        r.check(self.me, &plan.hash, &sections)?;
        Ok(plan)
    }

    /// Holds a slot for `client` for the life of the returned guard,
    /// waiting for one up to the connect timeout; or why there was none.
    fn take_slot(&self, client: Option<IpAddr>) -> Result<SlotGuard<'_, 'a>, Unavailable> {
        let until = Instant::now() + self.t().connect;
        let (max, per) = (self.opts.max_concurrent, self.opts.max_per_client);
        let taken = self.slots.wait_for(until, self.stop, |s| {
            (s.total < max.max(1) && s.of(client) < per.max(1)).then(|| s.add(client))
        });
        match taken {
            Some(()) => Ok(SlotGuard(self, client)),
            None if self.stopping() => Err(Unavailable::ShuttingDown),
            None if self.slots.lock().of(client) >= per.max(1) => Err(Unavailable::ClientLimit),
            None => Err(Unavailable::Busy),
        }
    }
}

/// A refusal's metric label.
fn refusal(reason: Unavailable) -> &'static str {
    match reason {
        Unavailable::PoolEmpty => "pool_empty",
        Unavailable::Busy => "busy",
        Unavailable::ShuttingDown => "shutting_down",
        Unavailable::PeerDown => "peer_down",
        Unavailable::UnknownQuery => "unknown_query",
        Unavailable::ClientLimit => "client_limit",
    }
}

/// A failed query's metric label: the kind of failure, never its text.
fn failure(e: &ServeError) -> &'static str {
    match e {
        ServeError::KeyFile(_) => "key_file",
        ServeError::Plan(_) => "plan",
        ServeError::Net {
            error: NetError::Timeout { .. },
            ..
        } => "timeout",
        ServeError::Net {
            error: NetError::Disconnected,
            ..
        } => "disconnected",
        ServeError::Net { .. } => "network",
        ServeError::Mismatch(_) => "mismatch",
        _ => "computation",
    }
}

/// The queries in flight, in all and by the client's address.
#[derive(Default)]
struct Slots {
    total: usize,
    by_client: HashMap<IpAddr, usize>,
}

impl Slots {
    fn of(&self, client: Option<IpAddr>) -> usize {
        client.map_or(0, |c| self.by_client.get(&c).copied().unwrap_or(0))
    }

    fn add(&mut self, client: Option<IpAddr>) {
        self.total += 1;
        if let Some(c) = client {
            *self.by_client.entry(c).or_default() += 1;
        }
    }

    fn remove(&mut self, client: Option<IpAddr>) {
        self.total = self.total.saturating_sub(1);
        if let Some(c) = client
            && let Some(n) = self.by_client.get_mut(&c)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.by_client.remove(&c);
            }
        }
    }
}

/// A slot held, for a client address (P0) or for none (P1, whose slots
/// follow P0's agreements).
struct SlotGuard<'s, 'a>(&'s Shared<'a>, Option<IpAddr>);

impl Drop for SlotGuard<'_, '_> {
    fn drop(&mut self) {
        let client = self.1;
        self.0.slots.update(|s| s.remove(client));
    }
}

mod p0;
mod p1;

impl Shared<'_> {
    /// Runs an agreed query and files its outcome.
    fn finish_query(&self, plan: &Plan, mut claim: Claim, mut peer: Link, mut client: Link) {
        let id = *claim.id();
        let handles = [&peer, &client]
            .iter()
            .filter_map(|l| l.shutdown_handle().ok())
            .collect();
        self.sockets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, handles);
        let hello = server_hello(plan, self.me, &id);
        let result = match (client::send_hello(&mut client, &hello), claim.take_reader()) {
            (Ok(()), Some(reader)) => serve_query(
                plan,
                self.party,
                reader,
                [&mut peer, &mut client],
                &self.opts.serve,
                self.fss,
            ),
            (Err(e), _) => Err(net("greeting the client")(e)),
            (_, None) => Err(ServeError::Mismatch("the claim's reader was taken".into())),
        };
        self.sockets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
        match result {
            Ok(r) => {
                self.counts.served.fetch_add(1, Ordering::Relaxed);
                self.metric(|m| m.served(&r));
                self.log(&format!(
                    "key set {}: served in {:.3} s, {} rounds",
                    hex(&id),
                    r.online_s,
                    r.rounds
                ));
            }
            Err(e) => {
                self.counts.failed.fetch_add(1, Ordering::Relaxed);
                self.metric(|m| m.failed(failure(&e)));
                self.log(&format!("key set {}: query failed: {e}", hex(&id)));
            }
        }
    }

    /// After the accept loop: waits for the queries in flight up to the
    /// drain deadline, then shuts the sockets of any left down, so that
    /// their threads end.
    fn drain(&self, until: Instant) {
        let never = AtomicBool::new(false);
        let idle = self
            .slots
            .wait_for(until, &never, |s| (s.total == 0).then_some(()));
        if idle.is_none() {
            let sockets = self.sockets.lock().unwrap_or_else(PoisonError::into_inner);
            self.log(&format!(
                "drain deadline: cutting {} query(ies) short",
                sockets.len()
            ));
            for s in sockets.values().flatten() {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        self.idle_peers.update(|v| v.clear());
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::model::{Decoder, Model};
    use crate::plan::Shape;

    /// Issue 30: a starting server plans every shape its pool holds for its
    /// own model, each once, and leaves another model's sets alone; the
    /// plans are those the sets were dealt for.
    #[test]
    fn a_starting_server_plans_the_shapes_of_its_pool() {
        use std::os::unix::fs::DirBuilderExt;
        let d = std::env::temp_dir().join(format!("suffuse-service-plans-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::DirBuilder::new().mode(0o700).create(&d).unwrap();
        let dir = d.join("pool");
        let (demo, other) = (Model::demo(), Decoder::builtin("tiny-llama").unwrap());
        let shape = |seq, decode_steps| Shape {
            batch: 1,
            seq,
            decode_steps,
        };
        let fss = crate::backend::auto();
        let mut dealt = Vec::new();
        for seq in [3, 3, 5] {
            let plan = plan::build(&demo, shape(seq, 0)).unwrap();
            crate::pool::deal_set(&plan, &dir, fss).unwrap();
            dealt.push(plan.hash);
        }
        let foreign = plan::build(&other, shape(3, 1)).unwrap();
        crate::pool::deal_set(&foreign, &dir, fss).unwrap();
        let pool = Pool::open(&dir, 1).unwrap();

        let plans = Plans::default();
        plans.for_pool(ModelRef::from(&demo), &pool, 1, &AtomicBool::new(false));
        let expect = [((1, 3, 0), dealt[0]), ((1, 5, 0), dealt[2])];
        assert_eq!(plans.planned(), expect);
        let summary = crate::pool::headers(&dir, 1)
            .into_iter()
            .flatten()
            .find(|h| h.plan_hash == dealt[2])
            .unwrap()
            .summary;
        let again = plans.get(ModelRef::from(&demo), &summary, 1).unwrap();
        assert_eq!(again.hash, dealt[2]);
        assert_eq!(plans.built.load(Ordering::Relaxed), 2, "planned twice");
        // Queries that ask for a new shape at once: one builds, the others
        // wait for it.
        let wider = Summary { seq: 9, ..summary };
        let got: Vec<_> = std::thread::scope(|scope| {
            let ask = || plans.get(ModelRef::from(&demo), &wider, 1).unwrap().hash;
            let asks: Vec<_> = (0..3).map(|_| scope.spawn(ask)).collect();
            asks.into_iter().map(|a| a.join().unwrap()).collect()
        });
        assert_eq!(plans.built.load(Ordering::Relaxed), 3, "planned twice");
        assert!(got.iter().all(|h| *h == got[0]));
        let _ = std::fs::remove_dir_all(&d);
    }
}
