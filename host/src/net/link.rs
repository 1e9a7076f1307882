//! TCP links: connecting, accepting, and moving frames with timeouts.

use std::collections::BTreeMap;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use super::frame::{DEFAULT_MAX_PAYLOAD, FrameHeader, FrameKind, HEADER_LEN, MAX_CONTROL_PAYLOAD};
use super::memory::{Memory, Peer};
use super::tls::{Role, TlsConfig};
use super::transport::{Tcp, Timed, Transport};
use super::{NetError, Timeouts, Traffic};

/// First pause between connect or accept attempts; it doubles up to
/// [`POLL_MAX`], so a peer that is nearly up is found quickly and one that
/// is far from up costs few wake-ups.
const POLL_MIN: Duration = Duration::from_millis(2);
const POLL_MAX: Duration = Duration::from_millis(100);

/// A payload of unknown length grows from this much as its bytes arrive, so
/// a peer must actually send what it declares before we hold memory for it.
const GROWTH_START: usize = 1 << 20;

/// A listening socket for peers to connect to.
#[derive(Debug)]
pub struct Listener {
    inner: TcpListener,
}

impl Listener {
    /// Binds to `addr`; port 0 picks a free port (see
    /// [`Listener::local_addr`]).
    pub fn bind(addr: impl ToSocketAddrs) -> Result<Self, NetError> {
        let inner = TcpListener::bind(addr).map_err(NetError::Io)?;
        // std has no accept with a timeout, so accept polls.
        inner.set_nonblocking(true).map_err(NetError::Io)?;
        Ok(Self { inner })
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> Result<SocketAddr, NetError> {
        self.inner.local_addr().map_err(NetError::Io)
    }

    /// Waits up to `t.connect` for a peer to connect, and returns the link.
    pub fn accept(&self, t: Timeouts) -> Result<Link, NetError> {
        self.accept_tcp(t).and_then(|s| Link::from_stream(s, t))
    }

    /// Waits up to `t.connect` for a connection (the outer error), then
    /// secures it as `sec` says within `t.io`, and never past `t.connect`
    /// from the call (the inner error: that
    /// connection failed, and the caller may wait for another). With TLS the
    /// peer's role comes from its certificate.
    pub fn accept_secured(&self, t: Timeouts, sec: &Security) -> Result<Accepted, NetError> {
        let deadline = Instant::now().checked_add(t.connect);
        let incoming = self.accept_incoming(t)?;
        // A handshake never outlasts the wait: a peer that stalls it cannot
        // hold the caller past its deadline.
        let left = deadline.map_or(t.io, |d| d.saturating_duration_since(Instant::now()));
        let t = Timeouts {
            connect: t.connect,
            io: t.io.min(left).max(Duration::from_millis(1)),
        };
        Ok(incoming.secure(t, sec))
    }

    /// Waits up to `t.connect` for a connection and returns it unsecured,
    /// for a server that secures it on another thread while it goes on
    /// accepting.
    pub fn accept_incoming(&self, t: Timeouts) -> Result<Incoming, NetError> {
        self.accept_tcp(t).map(Incoming)
    }

    fn accept_tcp(&self, t: Timeouts) -> Result<TcpStream, NetError> {
        let deadline = Instant::now().checked_add(t.connect);
        let mut pause = POLL_MIN;
        loop {
            match self.inner.accept() {
                Ok((stream, _)) => {
                    // Some platforms hand the listener's non-blocking flag on.
                    stream.set_nonblocking(false).map_err(NetError::Io)?;
                    return Ok(stream);
                }
                // A client that gave up between its SYN and our accept is
                // no reason to stop waiting for the next one.
                Err(e) if is_retryable(&e) => {}
                Err(e) => return Err(NetError::Io(e)),
            }
            pause = sleep_until_next(deadline, pause).ok_or(NetError::Timeout {
                during: "waiting for a peer to connect",
            })?;
        }
    }
}

/// A connection accepted and not yet secured.
#[derive(Debug)]
pub struct Incoming(TcpStream);

impl Incoming {
    /// Secures the connection as `sec` says within `t.io`; with TLS the
    /// peer's role comes from its certificate.
    pub fn secure(self, t: Timeouts, sec: &Security) -> Accepted {
        let stream = self.0;
        match sec {
            Security::Insecure => Link::from_stream(stream, t).map(|l| (l, None)),
            Security::Tls(cfg) => prepare(&stream, t).and_then(|()| {
                let (tls, role) = cfg.accept(stream, t.io)?;
                Ok((Link::over(Box::new(tls), t), Some(role)))
            }),
        }
    }

    /// Where it comes from.
    pub fn peer_addr(&self) -> Result<SocketAddr, NetError> {
        self.0.peer_addr().map_err(NetError::Io)
    }
}

/// Sleeps for `pause` (or until `deadline`, if sooner) and returns the next
/// pause, or `None` once the deadline has passed. `None` as the deadline
/// means a timeout too long to represent, that is, none.
fn sleep_until_next(deadline: Option<Instant>, pause: Duration) -> Option<Duration> {
    let left = match deadline {
        Some(deadline) => deadline.checked_duration_since(Instant::now())?,
        None => pause,
    };
    if left.is_zero() {
        return None;
    }
    thread::sleep(pause.min(left));
    Some((pause * 2).min(POLL_MAX))
}

/// Errors after which connecting or accepting again may succeed.
fn is_retryable(e: &io::Error) -> bool {
    use io::ErrorKind::*;
    matches!(
        e.kind(),
        WouldBlock
            | Interrupted
            | TimedOut
            | ConnectionRefused
            | ConnectionReset
            | ConnectionAborted
            | NotConnected
            | AddrNotAvailable
            | HostUnreachable
            | NetworkUnreachable
    )
}

/// One TCP connection carrying frames, with its traffic counters.
///
/// A link stays usable after an error that consumed no bytes of a frame (a
/// timeout while waiting for a frame to start, say). After one that left a
/// frame half read or half written, after an error inside
/// [`Link::exchange`] that had to tear the connection down, and after
/// [`Link::abort`], every call fails with [`NetError::Broken`].
#[derive(Debug)]
pub struct Link {
    stream: Box<dyn Transport>,
    timeouts: Timeouts,
    max_payload: u64,
    total: Traffic,
    by_step: BTreeMap<u32, Traffic>,
    /// The step of the latest call, which an abort frame is filed under.
    last_step: u32,
    /// The read side is at a frame boundary.
    read_ok: bool,
    /// The write side is at a frame boundary.
    write_ok: bool,
}

impl Link {
    /// Connects to `addr`, retrying until `t.connect` has passed: the peer
    /// may not be listening yet.
    pub fn connect(addr: impl ToSocketAddrs, t: Timeouts) -> Result<Self, NetError> {
        connect_tcp(addr, t).and_then(|s| Self::from_stream(s, t))
    }

    /// Connects to `addr` as [`Link::connect`] does and secures the link as
    /// `sec` says: with TLS, the server must prove it holds role `peer`.
    /// `t.connect` bounds the TCP connection and the handshake together;
    /// the handshake also gets at most `t.io`.
    pub fn connect_secured(
        addr: impl ToSocketAddrs,
        t: Timeouts,
        sec: &Security,
        peer: Role,
    ) -> Result<Self, NetError> {
        let began = Instant::now();
        let stream = connect_tcp(addr, t)?;
        match sec {
            Security::Insecure => Self::from_stream(stream, t),
            Security::Tls(cfg) => {
                prepare(&stream, t)?;
                let left = t.connect.saturating_sub(began.elapsed());
                let within = t.io.min(left).max(Duration::from_millis(1));
                let tls = cfg.connect(stream, peer, within)?;
                Ok(Self::over(Box::new(tls), t))
            }
        }
    }
}

/// A connection accepted and secured, with the role its certificate
/// names (none on plain TCP), or why that connection failed.
pub type Accepted = Result<(Link, Option<Role>), NetError>;

/// How links are secured.
#[derive(Clone, Debug)]
pub enum Security {
    /// Mutual TLS with this side's certificate.
    Tls(Arc<TlsConfig>),
    /// Plain TCP: only where every party says `--insecure-transport`, or
    /// inside one process.
    Insecure,
}

/// Sets `TCP_NODELAY` (every frame is a whole message the peer waits for)
/// and the io timeout on a fresh socket.
fn prepare(stream: &TcpStream, t: Timeouts) -> Result<(), NetError> {
    stream.set_nodelay(true).map_err(NetError::Io)?;
    stream.set_read_timeout(Some(t.io)).map_err(NetError::Io)?;
    stream.set_write_timeout(Some(t.io)).map_err(NetError::Io)
}

/// Connects, retrying until `t.connect` has passed.
fn connect_tcp(addr: impl ToSocketAddrs, t: Timeouts) -> Result<TcpStream, NetError> {
    let addrs: Vec<SocketAddr> = addr.to_socket_addrs().map_err(NetError::Io)?.collect();
    let began = Instant::now();
    // Whether the last attempt was refused: nothing listens there.
    let mut refused = false;
    if addrs.is_empty() {
        return Err(NetError::Io(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the address resolved to nothing to connect to",
        )));
    }
    let deadline = Instant::now().checked_add(t.connect);
    let mut pause = POLL_MIN;
    loop {
        for addr in &addrs {
            let left = match deadline {
                Some(deadline) => deadline.saturating_duration_since(Instant::now()),
                None => t.connect,
            };
            if left.is_zero() {
                break;
            }
            match TcpStream::connect_timeout(addr, left) {
                Ok(stream) => return Ok(stream),
                Err(e) if is_retryable(&e) => {
                    refused = e.kind() == io::ErrorKind::ConnectionRefused;
                }
                Err(e) => return Err(NetError::Io(e)),
            }
        }
        pause = match sleep_until_next(deadline, pause) {
            Some(p) => p,
            None if refused => {
                return Err(NetError::NothingListening {
                    addr: addrs
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", "),
                    waited_s: began.elapsed().as_secs_f64(),
                });
            }
            None => {
                return Err(NetError::Timeout {
                    during: "connecting to the peer",
                });
            }
        };
    }
}

impl Link {
    /// Wraps a connected stream as plain TCP: sets `TCP_NODELAY` and the io
    /// timeout.
    pub fn from_stream(stream: TcpStream, t: Timeouts) -> Result<Self, NetError> {
        prepare(&stream, t)?;
        Ok(Self::over(Box::new(Tcp(stream)), t))
    }

    /// A link to a peer held in memory: no socket, and no call ever waits.
    pub(crate) fn in_memory(peer: Box<dyn Peer>, t: Timeouts) -> Self {
        Self::over(Box::new(Memory::new(peer)), t)
    }

    /// A link over a transport whose socket is already set up.
    pub(super) fn over(stream: Box<dyn Transport>, t: Timeouts) -> Self {
        Self {
            stream,
            timeouts: t,
            max_payload: DEFAULT_MAX_PAYLOAD,
            total: Traffic::default(),
            by_step: BTreeMap::new(),
            last_step: 0,
            read_ok: true,
            write_ok: true,
        }
    }

    /// The timeouts the link was made with.
    pub fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    /// Sets the io timeout: from now on every frame must be done within it.
    pub fn set_io_timeout(&mut self, io: Duration) {
        self.timeouts.io = io;
    }

    /// The largest payload this link sends or accepts
    /// ([`DEFAULT_MAX_PAYLOAD`] unless set). `Hello` and `Abort` frames are
    /// further capped at [`MAX_CONTROL_PAYLOAD`].
    pub fn max_payload(&self) -> u64 {
        self.max_payload
    }

    /// Sets the largest payload this link sends or accepts.
    pub fn set_max_payload(&mut self, max: u64) {
        self.max_payload = max;
    }

    /// This side's address.
    pub fn local_addr(&self) -> Result<SocketAddr, NetError> {
        self.socket()?.local_addr().map_err(NetError::Io)
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> Result<SocketAddr, NetError> {
        self.socket()?.peer_addr().map_err(NetError::Io)
    }

    fn socket(&self) -> Result<&TcpStream, NetError> {
        self.stream.socket().ok_or_else(|| {
            NetError::Io(io::Error::new(
                io::ErrorKind::Unsupported,
                "a link held in memory has no socket address",
            ))
        })
    }

    /// A second handle on the socket, with which another thread can shut
    /// the connection down (a server's shutdown deadline).
    pub fn shutdown_handle(&self) -> Result<TcpStream, NetError> {
        self.socket()?.try_clone().map_err(NetError::Io)
    }

    /// Traffic over the link's whole life.
    pub fn traffic(&self) -> Traffic {
        self.total
    }

    /// Traffic per step index. Steps with no traffic are absent.
    pub fn traffic_by_step(&self) -> &BTreeMap<u32, Traffic> {
        &self.by_step
    }

    /// Sends one frame.
    pub fn send(&mut self, kind: FrameKind, step: u32, payload: &[u8]) -> Result<(), NetError> {
        self.last_step = step;
        if !self.write_ok {
            return Err(NetError::Broken);
        }
        self.check_outgoing(kind, payload)?;
        let mut writer = FrameWriter::new(kind, step, payload);
        let result = writer.write_all(&mut self.timed());
        self.tally(step, writer.done as u64, 0, 0);
        result.map_err(|e| {
            self.write_ok = writer.done == 0;
            NetError::on_link(e, "sending a frame")
        })
    }

    /// Receives one frame of `kind` for `step` and returns its payload.
    ///
    /// With `expect_len`, a header declaring another length is
    /// [`NetError::UnexpectedLength`]; without, any length up to the limit
    /// (see [`Link::max_payload`]) is accepted. Either way the header is
    /// checked before the payload is read. An `Abort` frame is
    /// [`NetError::PeerAborted`] whatever was expected.
    pub fn recv(
        &mut self,
        kind: FrameKind,
        step: u32,
        expect_len: Option<usize>,
    ) -> Result<Vec<u8>, NetError> {
        self.recv_within(kind, step, expect_len, None)
    }

    /// [`Link::recv`] for a link that idles between frames: waits at most
    /// `wait` for the frame to begin, and once its first byte is in gives
    /// the rest the link's io timeout. So a poll that ends before a frame
    /// begins is `Timeout` and leaves the link usable, and a frame that
    /// begins just before the poll would end is still read whole (a whole
    /// frame under a `wait`-long io timeout would break the link there).
    pub fn recv_polled(
        &mut self,
        kind: FrameKind,
        step: u32,
        expect_len: Option<usize>,
        wait: Duration,
    ) -> Result<Vec<u8>, NetError> {
        self.recv_within(kind, step, expect_len, Some(wait))
    }

    fn recv_within(
        &mut self,
        kind: FrameKind,
        step: u32,
        expect_len: Option<usize>,
        wait: Option<Duration>,
    ) -> Result<Vec<u8>, NetError> {
        self.last_step = step;
        if !self.read_ok {
            return Err(NetError::Broken);
        }
        let want = self.expect(kind, step, expect_len)?;
        let mut received = 0;
        let mut timed = match wait {
            None => self.timed(),
            Some(w) => Timed::polled(&*self.stream, w, self.timeouts.io),
        };
        let result = read_frame(&mut timed, &want, &mut received);
        self.tally(step, 0, received, 0);
        if result.is_err() && received > 0 {
            self.read_ok = false;
        }
        result
    }

    /// One protocol round: sends `payload` as a `Round` frame for `step` and
    /// returns the peer's `Round` frame for the same step, which must be
    /// `expect_len` bytes long.
    ///
    /// Both servers call this at the same time, so the send and the receive
    /// run concurrently: two peers writing hundreds of MB at each other
    /// would otherwise both block on full socket buffers, neither reading.
    pub fn exchange(
        &mut self,
        step: u32,
        payload: &[u8],
        expect_len: usize,
    ) -> Result<Vec<u8>, NetError> {
        self.swap(FrameKind::Round, step, payload, Some(expect_len))
    }

    /// The handshake: sends `mine` as a `Hello` frame (step 0) and returns the
    /// peer's, which may have any length up to [`MAX_CONTROL_PAYLOAD`]. Both
    /// sides may call it at the same time. Comparing the two is the
    /// caller's business.
    pub fn hello(&mut self, mine: &[u8]) -> Result<Vec<u8>, NetError> {
        self.swap(FrameKind::Hello, 0, mine, None)
    }

    /// Tells the peer this side is giving up, and why, then closes this
    /// side's half of the connection. Best effort: nothing is sent when a
    /// frame was left half written (the peer then sees the connection close),
    /// and the send gives up after the io timeout. The reason is cut to
    /// [`MAX_CONTROL_PAYLOAD`] bytes. The link is unusable afterwards.
    pub fn abort(&mut self, reason: &str) {
        if self.write_ok {
            let mut end = reason.len().min(MAX_CONTROL_PAYLOAD as usize);
            while !reason.is_char_boundary(end) {
                end -= 1;
            }
            // Best effort by contract: the peer may already be gone.
            let _ = self.send(FrameKind::Abort, self.last_step, &reason.as_bytes()[..end]);
        }
        // A FIN after the reason, so the peer's next read ends promptly.
        if let Some(socket) = self.stream.socket() {
            let _ = socket.shutdown(Shutdown::Write);
        }
        self.read_ok = false;
        self.write_ok = false;
    }

    /// What a receive for `kind`, `step` and `len` must find, or `TooLarge`
    /// if this side could never accept `len`.
    fn expect(&self, kind: FrameKind, step: u32, len: Option<usize>) -> Result<Expect, NetError> {
        let max = kind.max_payload(self.max_payload);
        if let Some(len) = len
            && len as u64 > max
        {
            return Err(NetError::TooLarge {
                len: len as u64,
                max,
            });
        }
        Ok(Expect {
            kind,
            step,
            len,
            max,
        })
    }

    /// Refuses to send what the peer would refuse to receive, with the same
    /// error it would give.
    fn check_outgoing(&self, kind: FrameKind, payload: &[u8]) -> Result<(), NetError> {
        let max = kind.max_payload(self.max_payload);
        let len = payload.len() as u64;
        if len > max {
            return Err(NetError::TooLarge { len, max });
        }
        Ok(())
    }

    /// Sends and receives one frame of `kind` at once (see
    /// [`Link::exchange`]). A `Round` counts as a round.
    fn swap(
        &mut self,
        kind: FrameKind,
        step: u32,
        payload: &[u8],
        expect_len: Option<usize>,
    ) -> Result<Vec<u8>, NetError> {
        self.last_step = step;
        if !self.read_ok || !self.write_ok {
            return Err(NetError::Broken);
        }
        self.check_outgoing(kind, payload)?;
        let want = self.expect(kind, step, expect_len)?;
        let mut writer = FrameWriter::new(kind, step, payload);
        let mut received = 0;
        let mut stream = self.timed();

        // Most rounds are small enough for the socket buffer to take whole;
        // writing without blocking first saves a thread for them.
        let first = if stream.transport().resumable_writes() {
            write_nonblocking(stream.transport(), &mut writer)
        } else {
            Ok(())
        };
        let result = match first {
            Err(e) => {
                self.write_ok = writer.done == 0;
                Err(NetError::on_link(e, "sending a frame"))
            }
            Ok(()) if writer.is_done() => {
                let result = read_frame(&mut stream, &want, &mut received);
                if result.is_err() && received > 0 {
                    self.read_ok = false;
                }
                result
            }
            Ok(()) => {
                let result = write_while_reading(&mut stream, &mut writer, &want, &mut received);
                if result.is_err() {
                    // The connection may have been shut down to stop the
                    // other half; either way neither side is at a boundary
                    // we can vouch for.
                    self.read_ok = false;
                    self.write_ok = false;
                }
                result
            }
        };
        let rounds = u64::from(result.is_ok() && kind == FrameKind::Round);
        self.tally(step, writer.done as u64, received, rounds);
        result
    }

    /// The transport with a fresh frame deadline: a whole frame, not only a
    /// silence, must fit in the io timeout.
    fn timed(&self) -> Timed<'_> {
        Timed::new(&*self.stream, self.timeouts.io)
    }

    fn tally(&mut self, step: u32, sent: u64, received: u64, rounds: u64) {
        let delta = Traffic {
            sent,
            received,
            rounds,
        };
        if delta == Traffic::default() {
            return;
        }
        self.total += delta;
        *self.by_step.entry(step).or_default() += delta;
    }
}

/// What the next frame must be.
struct Expect {
    kind: FrameKind,
    step: u32,
    len: Option<usize>,
    /// The limit for `kind` on this link.
    max: u64,
}

/// One outgoing frame and how much of it has been written, so that writing
/// can stop on a full socket buffer and resume on another thread.
struct FrameWriter<'a> {
    header: [u8; HEADER_LEN],
    payload: &'a [u8],
    /// Bytes written so far, header first.
    done: usize,
}

impl<'a> FrameWriter<'a> {
    fn new(kind: FrameKind, step: u32, payload: &'a [u8]) -> Self {
        let header = FrameHeader {
            kind,
            step,
            len: payload.len() as u64,
        };
        Self {
            header: header.encode(),
            payload,
            done: 0,
        }
    }

    fn is_done(&self) -> bool {
        self.done == HEADER_LEN + self.payload.len()
    }

    /// Writes the rest of the frame, or stops at the first error (including
    /// `WouldBlock` on a non-blocking socket) with `done` up to date.
    fn write_all(&mut self, out: &mut impl Write) -> io::Result<()> {
        while !self.is_done() {
            let written = match self.header.get(self.done..) {
                // One segment for header and payload where the kernel takes
                // both, rather than a 15-byte packet ahead of every frame.
                Some(head) if !head.is_empty() => {
                    out.write_vectored(&[IoSlice::new(head), IoSlice::new(self.payload)])
                }
                _ => out.write(&self.payload[self.done - HEADER_LEN..]),
            };
            match written {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// Writes as much of the frame as the socket takes without blocking.
fn write_nonblocking(stream: &dyn Transport, writer: &mut FrameWriter<'_>) -> io::Result<()> {
    let Some(socket) = stream.socket() else {
        // A transport without a socket never blocks.
        return writer.write_all(&mut Plain(stream));
    };
    socket.set_nonblocking(true)?;
    let written = match writer.write_all(&mut Plain(stream)) {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
        other => other,
    };
    // Restore blocking mode even after an error: the timeouts rely on it.
    let restored = socket.set_nonblocking(false);
    written.and(restored)
}

/// Finishes writing the frame on a scoped thread while reading the peer's
/// frame on this one.
///
/// When either half fails, the other may be blocked on a peer that will
/// never move, so the failing half shuts the connection down to wake it.
/// The one exception is a writer that finds the peer gone: the reader then
/// wakes on its own, and may first find an `Abort` frame the peer sent
/// before leaving. The error reported is the first one, except that the
/// peer's abort reason beats whatever its leaving caused on our side.
fn write_while_reading(
    stream: &mut Timed<'_>,
    writer: &mut FrameWriter<'_>,
    want: &Expect,
    received: &mut u64,
) -> Result<Vec<u8>, NetError> {
    let socket = stream.transport().socket();
    let mut out = stream.share();
    let first: Mutex<Option<NetError>> = Mutex::new(None);
    let written = AtomicBool::new(false);
    let fail = |e: NetError, wake: bool| {
        let mut first = first.lock().unwrap_or_else(PoisonError::into_inner);
        if first.is_none() {
            if wake && let Some(socket) = socket {
                // If this fails the connection is already down, which is
                // what it is for.
                let _ = socket.shutdown(Shutdown::Both);
            }
            *first = Some(e);
        } else if matches!(e, NetError::PeerAborted(_)) {
            *first = Some(e);
        }
    };
    let payload = thread::scope(|s| {
        s.spawn(|| match writer.write_all(&mut out) {
            Ok(()) => written.store(true, Ordering::Release),
            Err(e) => {
                let e = NetError::on_link(e, "sending a frame");
                let wake = !matches!(e, NetError::Disconnected);
                fail(e, wake);
            }
        });
        match read_frame(stream, want, received) {
            Ok(payload) => Some(payload),
            Err(e) => {
                // Even a peer that has gone or aborted may hold its socket
                // open without reading, so a writer still at work is woken.
                fail(e, !written.load(Ordering::Acquire));
                None
            }
        }
    });
    match (
        first.into_inner().unwrap_or_else(PoisonError::into_inner),
        payload,
    ) {
        (Some(e), _) => Err(e),
        (None, Some(payload)) => Ok(payload),
        // Unreachable: a reader without a payload recorded its error.
        (None, None) => Err(NetError::Broken),
    }
}

/// Reads one frame, checking its header against `want` before the payload.
/// `received` counts every byte taken off the socket, even on failure.
fn read_frame(
    stream: &mut Timed<'_>,
    want: &Expect,
    received: &mut u64,
) -> Result<Vec<u8>, NetError> {
    let header = read_header(stream, received)?;
    let header = FrameHeader::parse(&header)?;
    if header.kind == FrameKind::Abort {
        return Err(read_abort(stream, header.len, received));
    }
    if header.kind != want.kind {
        return Err(NetError::UnexpectedKind {
            want: want.kind,
            got: header.kind,
        });
    }
    if header.step != want.step {
        return Err(NetError::UnexpectedStep {
            want: want.step,
            got: header.step,
        });
    }
    if header.len > want.max {
        return Err(NetError::TooLarge {
            len: header.len,
            max: want.max,
        });
    }
    if let Some(len) = want.len
        && header.len != len as u64
    {
        return Err(NetError::UnexpectedLength {
            want: len as u64,
            got: header.len,
        });
    }
    let len = usize::try_from(header.len).map_err(|_| NetError::TooLarge {
        len: header.len,
        max: usize::MAX as u64,
    })?;
    // An expected length is ours, so its memory is taken at once; any other
    // is the peer's word, and memory follows the bytes that arrive.
    let reserve = if want.len.is_some() {
        len
    } else {
        len.min(GROWTH_START)
    };
    read_payload(stream, len, reserve, received)
}

fn read_header(stream: &mut Timed<'_>, received: &mut u64) -> Result<[u8; HEADER_LEN], NetError> {
    let mut header = [0u8; HEADER_LEN];
    let mut filled = 0;
    while filled < HEADER_LEN {
        match stream.read(&mut header[filled..]) {
            Ok(0) => return Err(NetError::Disconnected),
            Ok(n) => {
                filled += n;
                *received += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if filled == 0 => {
                return Err(NetError::on_link(e, "waiting for the peer's next frame"));
            }
            Err(e) => return Err(NetError::on_link(e, "reading a frame header")),
        }
    }
    Ok(header)
}

fn read_payload(
    stream: &mut Timed<'_>,
    len: usize,
    reserve: usize,
    received: &mut u64,
) -> Result<Vec<u8>, NetError> {
    let mut payload = Vec::new();
    payload.try_reserve_exact(reserve).map_err(|_| {
        NetError::Io(io::Error::new(
            io::ErrorKind::OutOfMemory,
            format!("cannot allocate {reserve} bytes for a frame payload"),
        ))
    })?;
    // `read_to_end` keeps what it read before an error, so the count holds
    // either way, and it reads into spare capacity without zeroing it first.
    let result = (&mut *stream).take(len as u64).read_to_end(&mut payload);
    *received += payload.len() as u64;
    result.map_err(|e| NetError::on_link(e, "reading a frame payload"))?;
    if payload.len() < len {
        return Err(NetError::Disconnected);
    }
    Ok(payload)
}

/// The error an `Abort` frame of `len` bytes stands for, its reason read off
/// the socket when it is within bounds.
fn read_abort(stream: &mut Timed<'_>, len: u64, received: &mut u64) -> NetError {
    if len > MAX_CONTROL_PAYLOAD {
        return NetError::PeerAborted(format!(
            "(its {len}-byte reason is over the {MAX_CONTROL_PAYLOAD}-byte limit, not read)"
        ));
    }
    let len = len as usize;
    match read_payload(stream, len, len, received) {
        Ok(reason) => NetError::PeerAborted(String::from_utf8_lossy(&reason).into_owned()),
        Err(e) => NetError::PeerAborted(format!("(its reason was lost: {e})")),
    }
}

/// A transport as `Write`, without a deadline: for the non-blocking first
/// attempt, which never waits.
struct Plain<'a>(&'a dyn Transport);

impl Write for Plain<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.0.write_vectored(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
