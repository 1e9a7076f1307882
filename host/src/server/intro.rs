//! Introductions: each accepted connection is secured and reads its hello
//! on a thread of its own, so a silent, trickling or hostile connection
//! delays no one else. Both servers, the one-query server and the pool,
//! take their connections through here.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::client::{self, Hello};
use crate::net::{Incoming, Link, Role, Security, Timeouts};

/// Connections being introduced at once; more are dropped at once, so a
/// flood of handshakes cannot exhaust threads.
pub(crate) const MAX_HANDSHAKES: usize = 64;

/// A connection that is secured and sent a hello frame.
pub(crate) struct Introduced {
    pub(crate) link: Link,
    /// The role its certificate names (TLS); none on plain TCP.
    pub(crate) role: Option<Role>,
    /// Its hello, or why the frame is not one.
    pub(crate) hello: Result<Hello, String>,
    /// Its address and certificate's role, for log lines.
    pub(crate) from: String,
}

/// Where a connection comes from, for log lines.
pub(crate) fn origin(incoming: &Incoming) -> String {
    label(incoming.peer_addr())
}

/// Where an introduced link comes from, for log lines.
pub(crate) fn link_origin(link: &Link) -> String {
    label(link.peer_addr())
}

fn label(addr: Result<std::net::SocketAddr, crate::net::NetError>) -> String {
    addr.map_or_else(|_| "?".to_string(), |a| a.to_string())
}

/// Secures `incoming` and reads its hello, both within `within` of the
/// call; the link then has `io` per frame. `Err` is where it came from
/// and why it was dropped.
pub(crate) fn introduce(
    incoming: Incoming,
    within: Duration,
    io: Duration,
    sec: &Security,
) -> Result<Introduced, String> {
    let start = Instant::now();
    let from = origin(&incoming);
    let t = Timeouts {
        connect: within,
        io: within,
    };
    let (mut link, role) = incoming
        .secure(t, sec)
        .map_err(|e| format!("{from}: {e}"))?;
    let from = match role {
        Some(role) => format!("{from} (certificate of {role})"),
        None => from,
    };
    let left = within.saturating_sub(start.elapsed());
    link.set_io_timeout(left.max(Duration::from_millis(1)));
    let hello = client::recv_hello(&mut link).map_err(|e| format!("{from}: {e}"))?;
    link.set_io_timeout(io);
    Ok(Introduced {
        link,
        role,
        hello,
        from,
    })
}

/// Counts the introductions in progress, up to [`MAX_HANDSHAKES`].
#[derive(Debug, Default)]
pub(crate) struct Handshakes(AtomicUsize);

/// One introduction's place; it is given back when dropped.
pub(crate) struct Place(Arc<Handshakes>);

impl Handshakes {
    /// A place, or `None` when all are taken.
    pub(crate) fn enter(self: &Arc<Self>) -> Option<Place> {
        if self.0.fetch_add(1, Ordering::AcqRel) >= MAX_HANDSHAKES {
            self.0.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Place(Arc::clone(self)))
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::AcqRel);
    }
}
