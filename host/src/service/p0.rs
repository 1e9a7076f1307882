//! P0's side: admits clients, claims sets, proposes them to P1.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use super::{Agree, Shared, recv_agree, send_agree};
use crate::client::{self, Hello, Unavailable};
use crate::net::Link;
use crate::plan::{Plan, hex};
use crate::pool::Claim;
use crate::server::{ServeError, net};

impl Shared<'_> {
    /// P1 offers a standing link: kept idle for the next query.
    pub(super) fn standby_at_p0(&self, mut link: Link, digest: &str) {
        if digest != self.digest {
            let why = format!("P1 serves model {digest}, this server {}", self.digest);
            link.abort(&why);
            return self.log(&why);
        }
        let mine = Hello::Standby {
            party: 0,
            model_digest: self.digest.clone(),
        };
        match client::send_hello(&mut link, &mine) {
            Ok(()) => self.idle_peers.update(|v| v.push(link)),
            Err(e) => self.log(&format!("a standing link from P1 failed: {e}")),
        }
    }

    /// An authenticated client at P0: a slot, a set agreed with P1, the
    /// query; or a typed refusal.
    pub(super) fn client_at_p0(&self, mut link: Link) {
        if self.stopping() {
            return self.refuse(&mut link, Unavailable::ShuttingDown);
        }
        let client = link.peer_addr().ok().map(|a| a.ip());
        let _slot = match self.take_slot(client) {
            Ok(slot) => slot,
            Err(reason) => return self.refuse(&mut link, reason),
        };
        match self.agree() {
            Ok((plan, claim, peer)) => self.finish_query(&plan, claim, peer, link),
            Err(reason) => self.refuse(&mut link, reason),
        }
    }

    /// Claims the oldest usable set and agrees on it with P1, set after
    /// set, until P1 holds one or the pool has none left.
    fn agree(&self) -> Result<(Arc<Plan>, Claim, Link), Unavailable> {
        let until = Instant::now() + self.t().connect;
        // Sets P1 cannot take now (another of its queries holds them).
        let mut busy = HashSet::new();
        let mut spare: Option<Link> = None;
        loop {
            let ledger = &self.opts.serve.ledger;
            let claim = match self.pool.claim_next(ledger, &|id| busy.contains(id)) {
                Ok(Some(c)) => c,
                Ok(None) => return Err(Unavailable::PoolEmpty),
                Err(e) => {
                    self.log(&e.to_string());
                    return Err(Unavailable::PoolEmpty);
                }
            };
            let plan = match self.checked_plan(&claim) {
                Ok(p) => p,
                Err(e) => {
                    self.log(&format!("skipping a key set: {e}"));
                    self.pool.forget(claim.id());
                    continue;
                }
            };
            let mut peer = match spare.take() {
                Some(l) => l,
                None => self.take_peer(until)?,
            };
            match propose(&mut peer, &claim, &plan) {
                Ok(Agree::Hold) => {
                    self.log(&format!("key set {}: agreed with P1", hex(claim.id())));
                    return Ok((plan, claim, peer));
                }
                Ok(Agree::Decline { why, retry }) => {
                    self.log(&format!("P1 declined key set {}: {why}", hex(claim.id())));
                    // A set P1 may take later (claimed by another of its
                    // queries, or its file not there yet) is skipped for
                    // this query and offered again after a back-off; one it
                    // can never take is dropped.
                    if retry {
                        busy.insert(*claim.id());
                        self.pool.defer(claim.id());
                    } else {
                        self.pool.forget(claim.id());
                    }
                    spare = Some(peer);
                }
                Ok(Agree::Propose { .. }) => self.log("P1 proposed a key set; dropping its link"),
                Err(e) => self.log(&format!("a standing link to P1 failed ({e}); next one")),
            }
        }
    }

    /// An idle standing link to P1, waiting for one until `until`.
    fn take_peer(&self, until: Instant) -> Result<Link, Unavailable> {
        self.idle_peers
            .wait_for(until, self.stop, Vec::pop)
            .ok_or(Unavailable::PeerDown)
    }
}

fn propose(peer: &mut Link, claim: &Claim, plan: &Plan) -> Result<Agree, ServeError> {
    let offer = Agree::Propose {
        key_set: hex(claim.id()),
        plan_hash: plan.hash_hex(),
    };
    send_agree(peer, &offer).map_err(net("proposing a key set to P1"))?;
    recv_agree(peer)
}
