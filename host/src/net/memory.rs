//! A link held in memory: the far side is a [`Peer`] that answers what
//! this side wrote. It drives the protocol without sockets or threads
//! (the fuzz targets), through the same framing code as TCP and TLS.

use std::fmt;
use std::io::{self, IoSlice};
use std::net::TcpStream;
use std::sync::{Mutex, PoisonError};

use super::transport::Transport;

/// The far side of an in-memory link.
pub(crate) trait Peer: Send {
    /// The peer's next bytes, given what this side wrote since the last
    /// call; empty is the end of the stream.
    fn answer(&mut self, written: &[u8]) -> Vec<u8>;
}

/// What the peer has said but this side has not read, and what this side
/// has written since the peer last answered.
struct State {
    peer: Box<dyn Peer>,
    incoming: Vec<u8>,
    read: usize,
    written: Vec<u8>,
}

pub(crate) struct Memory(Mutex<State>);

impl Memory {
    pub(crate) fn new(peer: Box<dyn Peer>) -> Self {
        Self(Mutex::new(State {
            peer,
            incoming: Vec::new(),
            read: 0,
            written: Vec::new(),
        }))
    }
}

impl fmt::Debug for Memory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Memory { .. }")
    }
}

impl Transport for Memory {
    fn socket(&self) -> Option<&TcpStream> {
        None
    }

    fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut s = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if s.read == s.incoming.len() {
            let written = std::mem::take(&mut s.written);
            s.incoming = s.peer.answer(&written);
            s.read = 0;
        }
        let n = buf.len().min(s.incoming.len() - s.read);
        buf[..n].copy_from_slice(&s.incoming[s.read..s.read + n]);
        s.read += n;
        Ok(n)
    }

    fn write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut s = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let mut n = 0;
        for b in bufs {
            s.written.extend_from_slice(b);
            n += b.len();
        }
        Ok(n)
    }

    fn resumable_writes(&self) -> bool {
        true
    }
}
