//! What carries a link's bytes: plain TCP or TLS over TCP, behind one
//! trait, and the frame deadline that bounds every read and write.

use std::fmt;
use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// A byte stream under a [`Link`](super::Link). Methods take `&self` so that
/// one thread can write a frame while another reads the peer's.
pub trait Transport: Send + Sync + fmt::Debug {
    /// The socket underneath: timeouts, addresses and shutdown go to it.
    /// `None` for a link held in memory, which never blocks.
    fn socket(&self) -> Option<&TcpStream>;
    /// Reads plaintext bytes; `Ok(0)` is the end of the stream.
    fn read(&self, buf: &mut [u8]) -> io::Result<usize>;
    /// Writes plaintext bytes from `bufs`, returning how many were taken.
    fn write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize>;
    /// Whether a write may be tried on a non-blocking socket and resumed
    /// later. A TLS record cut short by `WouldBlock` cannot be.
    fn resumable_writes(&self) -> bool;
}

/// Plain TCP, for `--insecure-transport` and in-process sessions.
#[derive(Debug)]
pub struct Tcp(pub TcpStream);

impl Transport for Tcp {
    fn socket(&self) -> Option<&TcpStream> {
        Some(&self.0)
    }

    fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        (&self.0).read(buf)
    }

    fn write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        (&self.0).write_vectored(bufs)
    }

    fn resumable_writes(&self) -> bool {
        true
    }
}

/// A transport whose reads and writes must all finish by one deadline: a
/// whole frame is bounded, so a peer that trickles bytes (a slowloris)
/// times out like one that sends nothing.
pub(super) struct Timed<'a> {
    transport: &'a dyn Transport,
    deadline: Option<Instant>,
    /// Used when the deadline is too far to represent.
    io: Duration,
    /// For a poll: the io timeout that replaces the deadline once the
    /// first byte is in.
    after_first: Option<Duration>,
}

impl<'a> Timed<'a> {
    /// A frame that must be done within `io` from now.
    pub(super) fn new(transport: &'a dyn Transport, io: Duration) -> Self {
        Self {
            transport,
            deadline: Instant::now().checked_add(io),
            io,
            after_first: None,
        }
    }

    /// A frame that must begin within `wait` from now and, once begun, be
    /// done within `io` from its first byte.
    pub(super) fn polled(transport: &'a dyn Transport, wait: Duration, io: Duration) -> Self {
        Self {
            after_first: Some(io),
            ..Self::new(transport, wait)
        }
    }

    /// The same deadline for another thread's half of a frame exchange.
    pub(super) fn share(&self) -> Self {
        Self { ..*self }
    }

    pub(super) fn transport(&self) -> &'a dyn Transport {
        self.transport
    }

    /// Time left, or `TimedOut` once the deadline has passed.
    fn left(&self) -> io::Result<Duration> {
        let left = match self.deadline {
            Some(d) => d.saturating_duration_since(Instant::now()),
            None => self.io,
        };
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        Ok(left)
    }
}

impl Read for Timed<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.left()?;
        if let Some(socket) = self.transport.socket() {
            socket.set_read_timeout(Some(left))?;
        }
        let n = self.transport.read(buf)?;
        if n > 0
            && let Some(io) = self.after_first.take()
        {
            *self = Self::new(self.transport, io);
        }
        Ok(n)
    }
}

impl Write for Timed<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let left = self.left()?;
        if let Some(socket) = self.transport.socket() {
            socket.set_write_timeout(Some(left))?;
        }
        self.transport.write_vectored(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
