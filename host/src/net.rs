//! Length-prefixed frames over TCP between the client and the two servers.
//!
//! A [`Link`] is one TCP connection. Every message is one frame: a 15-byte
//! header, then the payload. All integers are little-endian.
//!
//! ```text
//! offset  size  field
//!      0     2  magic, the bytes "SF"
//!      2     1  kind: 1 Hello, 2 Input, 3 Round, 4 Output, 5 Abort
//!      3     4  step index, u32
//!      7     8  payload length in bytes, u64
//!     15   len  payload
//! ```
//!
//! The length has 8 bytes so that one frame can carry a tensor of any size
//! the protocol produces; what a receiver accepts is bounded separately
//! ([`Link::max_payload`], [`MAX_CONTROL_PAYLOAD`]). The receiver states
//! what it expects (kind, step and, where it knows it, the length), and
//! anything else is a typed [`NetError`] raised from the header alone, before
//! the payload is read or any memory is allocated for it.
//!
//! Failure is never a hang:
//! - a peer that closes the connection (or whose process dies) becomes
//!   [`NetError::Disconnected`] as soon as the kernel reports it;
//! - a peer that stays connected but does not finish a frame becomes
//!   [`NetError::Timeout`] once [`Timeouts::io`] has passed since this side
//!   started sending or waiting for it;
//! - a peer that fails on its own side can say why with [`Link::abort`], and
//!   the other side gets [`NetError::PeerAborted`] with that reason.
//!
//! The io timeout is a deadline for a whole frame, not only for silence: a
//! peer that trickles one byte at a time (a slowloris) times out like one
//! that sends nothing. It also covers the time the peer spends computing
//! before it sends, so `io` must be longer than the slowest local step
//! between two rounds plus the transfer of the largest frame.
//!
//! Each link counts bytes (headers included) and rounds, per step and in
//! total, for the report ([`Traffic`]).

mod frame;
mod link;
mod memory;
#[cfg(test)]
mod tests;
mod tls;
mod transport;

/// Appends ring words as little-endian bytes: the layout of every payload
/// and key section that carries words.
pub fn put_words(out: &mut Vec<u8>, words: &[u64]) {
    out.reserve(words.len() * 8);
    for w in words {
        out.extend_from_slice(&w.to_le_bytes());
    }
}

/// Little-endian bytes as words; a trailing partial word is ignored (callers
/// check lengths first).
pub fn get_words(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| {
            let mut a = [0u8; 8];
            a.copy_from_slice(c);
            u64::from_le_bytes(a)
        })
        .collect()
}

use std::ops::AddAssign;
use std::time::Duration;

use serde::Serialize;

pub use frame::{
    DEFAULT_MAX_PAYLOAD, FrameHeader, FrameKind, FrameRef, HEADER_LEN, MAGIC, MAX_CONTROL_PAYLOAD,
    encode_frame,
};
pub use link::{Accepted, Incoming, Link, Listener, Security};
pub(crate) use memory::Peer;
pub use tls::{Role, TlsConfig, make_certs};

/// Everything that can go wrong on a link.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// The peer made no progress within the timeout.
    #[error("timed out while {during}: the peer sent or accepted nothing within the timeout")]
    Timeout {
        /// What the link was doing.
        during: &'static str,
    },
    /// The peer closed the connection, or its process died.
    #[error("the peer closed the connection")]
    Disconnected,
    /// Every attempt to connect was refused until the connect timeout: no
    /// process listens at the address.
    #[error(
        "nothing is listening at {addr}: it refused every connection for {waited_s:.0} s \
         (is the server running, and is the address right?)"
    )]
    NothingListening {
        /// The address as given.
        addr: String,
        /// How long connecting was tried.
        waited_s: f64,
    },
    /// The bytes where a frame header should start are not one of ours.
    #[error("not a suffuse frame: the header does not start with the magic bytes \"SF\"")]
    BadMagic,
    /// A frame header names a kind this build does not know.
    #[error("unknown frame kind {0:#04x}")]
    UnknownKind(u8),
    /// A well-formed frame of another kind than the one expected.
    #[error("expected a {want} frame, got a {got} frame")]
    UnexpectedKind {
        /// The kind the protocol expected here.
        want: FrameKind,
        /// The kind the peer sent.
        got: FrameKind,
    },
    /// A frame for another protocol step than the one expected: the two
    /// sides are running different plans, or one of them skipped a step.
    #[error("expected a frame for step {want}, got one for step {got}")]
    UnexpectedStep {
        /// The step this side is at.
        want: u32,
        /// The step the peer's frame belongs to.
        got: u32,
    },
    /// A frame whose payload length differs from the one the shape implies.
    #[error("expected a {want}-byte payload, the peer declared {got} bytes")]
    UnexpectedLength {
        /// The length this side expected.
        want: u64,
        /// The length in the peer's header.
        got: u64,
    },
    /// A payload over the maximum this side accepts (or sends).
    #[error("a {len}-byte payload is over the {max}-byte limit")]
    TooLarge {
        /// The declared or requested length.
        len: u64,
        /// The limit that applies.
        max: u64,
    },
    /// A byte slice ends before the frame it holds (slice parsing only; on a
    /// socket the same thing is [`NetError::Disconnected`]).
    #[error("truncated frame: it needs {need} bytes, only {got} are there")]
    Truncated {
        /// Bytes the frame needs, header included.
        need: u64,
        /// Bytes available.
        got: u64,
    },
    /// The peer gave up and said why.
    #[error("the peer aborted: {0}")]
    PeerAborted(String),
    /// An earlier error left a frame half sent or half read, so the byte
    /// stream is no longer at a frame boundary, or the link was aborted.
    #[error("the link is unusable after an earlier error or an abort")]
    Broken,
    /// TLS: certificates that cannot be loaded, or a handshake that failed
    /// (an unauthenticated peer, a wrong role, a peer speaking plain TCP).
    #[error("TLS: {0}")]
    Tls(String),
    /// Any other I/O error: address resolution, socket options, and the like.
    #[error("network I/O error: {0}")]
    Io(std::io::Error),
}

impl NetError {
    /// What an I/O error on an established link (or its TLS handshake)
    /// means for the protocol, `during` what.
    pub(crate) fn on_link(e: std::io::Error, during: &'static str) -> NetError {
        use std::io::ErrorKind::*;
        match e.kind() {
            // A socket timeout reads as `WouldBlock` on Unix, `TimedOut` elsewhere.
            WouldBlock | TimedOut => NetError::Timeout { during },
            UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe | NotConnected
            | WriteZero => NetError::Disconnected,
            _ => NetError::Io(e),
        }
    }
}

/// How long a link waits before giving up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// How long [`Link::connect`] keeps retrying, and how long
    /// [`Listener::accept`] waits for a peer.
    pub connect: Duration,
    /// The deadline for each frame on an established link: a frame not
    /// wholly sent or received this long after the call began fails with
    /// [`NetError::Timeout`]. Must be non-zero.
    pub io: Duration,
}

impl Default for Timeouts {
    /// 30 s to connect, which covers servers started a little apart by hand or
    /// by a script, and 60 s of silence, which covers the slowest local step
    /// between rounds of the models we run.
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(30),
            io: Duration::from_secs(60),
        }
    }
}

/// Bytes and rounds on a link, for one step or in total.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct Traffic {
    /// Bytes written to the socket, frame headers included.
    pub sent: u64,
    /// Bytes read from the socket, frame headers included.
    pub received: u64,
    /// Completed [`Link::exchange`] calls: each is one protocol round.
    pub rounds: u64,
}

impl AddAssign for Traffic {
    fn add_assign(&mut self, other: Self) {
        self.sent += other.sent;
        self.received += other.received;
        self.rounds += other.rounds;
    }
}
