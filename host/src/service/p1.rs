//! P1's side: standing links to P0, sets held on P0's proposal, clients
//! joining the set they were told.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, MutexGuard, PoisonError};
use std::thread::sleep;
use std::time::Duration;

use super::{Agree, Shared, SlotGuard, TICK, send_agree};
use crate::client::{self, Hello, Unavailable};
use crate::net::{FrameKind as Frame, Link, NetError, Role, Timeouts};
use crate::plan::Plan;
use crate::pool::{Claim, parse_id};
use crate::server::{CLIENT_WAIT, HELLO_WAIT, ServeError, net};

/// The longest pause between two attempts to reach P0.
const REDIAL_MAX: Duration = Duration::from_secs(2);

impl Shared<'_> {
    /// One standing link: dialed, used for at most one query, dialed
    /// again, until the stop flag.
    pub(super) fn standby(&self, p0: &str) {
        let mut pause = Duration::from_millis(50);
        let mut warned = false;
        while !self.stopping() {
            match self.dial(p0) {
                Ok(link) => {
                    pause = Duration::from_millis(50);
                    warned = false;
                    self.stand(link);
                }
                Err(e) => {
                    if !warned {
                        self.log(&format!("cannot reach P0 at {p0} ({e}); retrying"));
                        warned = true;
                    }
                    sleep(pause);
                    pause = (pause * 2).min(REDIAL_MAX);
                }
            }
        }
    }

    fn dial(&self, p0: &str) -> Result<Link, ServeError> {
        let t = Timeouts {
            connect: 5 * TICK,
            io: self.t().io.min(HELLO_WAIT),
        };
        let sec = &self.opts.serve.security;
        let mut link = Link::connect_secured(p0, t, sec, Role::P0).map_err(net("dialing P0"))?;
        let mine = Hello::Standby {
            party: 1,
            model_digest: self.digest.clone(),
        };
        client::send_hello(&mut link, &mine).map_err(net("greeting P0"))?;
        match client::recv_hello(&mut link).map_err(net("greeting P0"))? {
            Ok(Hello::Standby {
                party: 0,
                model_digest,
            }) if model_digest == self.digest => Ok(link),
            other => Err(ServeError::Mismatch(format!(
                "P0 answered a standing link with {other:?}"
            ))),
        }
    }

    /// Waits on a standing link for P0's proposals; serves the first set
    /// it can hold. Returns when the link is spent, broken, or stopping.
    fn stand(&self, mut link: Link) {
        loop {
            if self.stopping() {
                return;
            }
            let bytes = match link.recv_polled(Frame::Hello, super::AGREE_STEP, None, TICK) {
                Ok(b) => b,
                Err(NetError::Timeout { .. }) => continue,
                Err(_) => return,
            };
            link.set_io_timeout(self.t().io);
            let (key_set, plan_hash) = match serde_json::from_slice(&bytes) {
                Ok(Agree::Propose { key_set, plan_hash }) => (key_set, plan_hash),
                _ => return link.abort("expected a key-set proposal"),
            };
            match self.hold(&key_set, &plan_hash) {
                Ok((plan, claim)) => return self.serve_held(&plan, claim, link),
                Err((why, retry)) => {
                    if send_agree(&mut link, &Agree::Decline { why, retry }).is_err() {
                        return;
                    }
                }
            }
        }
    }

    /// Claims this server's file of the proposed set; or why not, and
    /// whether it may serve later.
    fn hold(&self, key_set: &str, plan_hash: &str) -> Result<(Arc<Plan>, Claim), (String, bool)> {
        if self.stopping() {
            return Err(("P1 is shutting down".into(), true));
        }
        let id = parse_id(key_set).ok_or_else(|| (format!("malformed id {key_set:?}"), false))?;
        let claim = self
            .pool
            .claim(&id, &self.opts.serve.ledger)
            .map_err(|e| (e.to_string(), !e.is_final()))?;
        let plan = self
            .checked_plan(&claim)
            .map_err(|e| (e.to_string(), false))?;
        if plan.hash_hex() != plan_hash {
            self.pool.forget(&id);
            let why = format!(
                "P0 runs plan {plan_hash}, this set is for {}",
                plan.hash_hex()
            );
            return Err((why, false));
        }
        Ok((plan, claim))
    }

    /// Tells P0 the set is held, waits for the client to join it, serves.
    fn serve_held(&self, plan: &Plan, claim: Claim, mut peer: Link) {
        let id = *claim.id();
        // Counted before P0 hears of it, so a stop now still waits for it.
        self.slots.update(|s| s.add(None));
        let _slot = SlotGuard(self, None);
        let (tx, rx) = sync_channel(1);
        self.pending_map().insert(id, tx);
        let joined = match send_agree(&mut peer, &Agree::Hold) {
            Ok(()) => rx.recv_timeout(self.t().connect.min(CLIENT_WAIT)).ok(),
            Err(_) => None,
        };
        self.pending_map().remove(&id);
        match joined {
            Some(client) => self.finish_query(plan, claim, peer, client),
            None => {
                self.counts.failed.fetch_add(1, Ordering::Relaxed);
                peer.abort("the client never joined P1");
                self.log("a held key set's client never joined; released unspent");
            }
        }
    }

    fn pending_map(&self) -> MutexGuard<'_, HashMap<[u8; 16], SyncSender<Link>>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An authenticated client joining a held set.
    pub(super) fn join_at_p1(&self, mut link: Link, key_set: &str) {
        if let Some(tx) = parse_id(key_set).and_then(|id| self.pending_map().remove(&id)) {
            match tx.try_send(link) {
                Ok(()) => return,
                Err(TrySendError::Full(l) | TrySendError::Disconnected(l)) => link = l,
            }
        }
        self.refuse(&mut link, Unavailable::UnknownQuery);
    }
}
