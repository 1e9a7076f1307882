//! A TCP proxy that sits on one link of a real run and injects one fault:
//! from outside the processes, with no hook in production code.
//!
//! On plain TCP it reads whole frames (15-byte header: "SF", kind, step
//! u32, length u64) and fires on the first frame of a kind and step; on TLS
//! it counts bytes. Frames are forwarded under one lock, so once the fault
//! fires no frame in either direction slips past it.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::Instant;

/// Which way bytes flow: `Up` from the dialer (P1, the client) to the
/// target, `Down` back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    Up,
    Down,
}

/// When the fault fires.
#[derive(Clone, Copy, Debug)]
pub enum When {
    /// TLS: before forwarding byte `n` in this direction.
    Byte(Dir, usize),
    /// Plain TCP: at the first frame of this kind and step (either
    /// direction if `None`).
    Frame(Option<Dir>, u8, u32),
}

/// What happens then.
#[derive(Clone, Copy, Debug)]
pub enum Act {
    /// Drop the frame and close both sides.
    Close,
    /// Forward nothing more, hold both connections open.
    Stall,
    /// Flip one byte (of the payload at this offset; on TLS, the byte at
    /// the trigger) and go on.
    Flip(usize),
    /// Forward the header and half the payload, then close.
    Truncate,
    /// Forward the frame under the next step number.
    BadStep,
    /// Forward the frame 8 bytes short, with its header saying so.
    BadLength,
    /// Send an `Abort` frame in the frame's place and go on.
    Abort,
    /// Send a signal (`KILL`, `STOP`) to a process, then forward.
    Signal(usize, &'static str),
}

/// The process ids a `Signal` addresses, filled in as they start.
pub type Pids = Arc<Mutex<[Option<u32>; 3]>>;

struct State {
    armed: bool,
    stalled: bool,
    fired: Option<Instant>,
    sockets: Vec<TcpStream>,
}

/// A running proxy.
pub struct Proxy {
    pub addr: String,
    state: Arc<Mutex<State>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

struct Rule {
    when: When,
    act: Act,
    pids: Pids,
    state: Arc<Mutex<State>>,
}

impl Proxy {
    /// Listens on an OS-chosen loopback port and forwards every connection
    /// to `target`.
    pub fn start(target: String, when: When, act: Act, pids: Pids) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let state = Arc::new(Mutex::new(State {
            armed: true,
            stalled: false,
            fired: None,
            sockets: Vec::new(),
        }));
        let rule = Arc::new(Rule {
            when,
            act,
            pids,
            state: state.clone(),
        });
        thread::spawn(move || {
            for inbound in listener.incoming().take(8).map_while(Result::ok) {
                let Ok(outbound) = TcpStream::connect(&target) else {
                    continue;
                };
                rule.pipe(inbound, outbound);
            }
        });
        Proxy { addr, state }
    }

    /// When the fault fired, if it did.
    pub fn fired(&self) -> Option<Instant> {
        lock(&self.state).fired
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        close_all(&lock(&self.state).sockets);
    }
}

fn close_all(sockets: &[TcpStream]) {
    for s in sockets {
        let _ = s.shutdown(Shutdown::Both);
    }
}

impl Rule {
    fn pipe(self: &Arc<Self>, a: TcpStream, b: TcpStream) {
        {
            let mut st = lock(&self.state);
            st.sockets.push(a.try_clone().unwrap());
            st.sockets.push(b.try_clone().unwrap());
        }
        for (dir, from, to) in [
            (Dir::Up, a.try_clone().unwrap(), b.try_clone().unwrap()),
            (Dir::Down, b, a),
        ] {
            let rule = self.clone();
            thread::spawn(move || match rule.when {
                When::Byte(..) => rule.bytes(dir, from, to),
                When::Frame(..) => rule.frames(dir, from, to),
            });
        }
    }

    /// Marks the fault as fired if it is still armed; returns whether this
    /// call fired it.
    fn fire(&self, st: &mut State) -> bool {
        if !st.armed {
            return false;
        }
        st.armed = false;
        st.fired = Some(Instant::now());
        true
    }

    fn signal(&self, who: usize, sig: &str) {
        if let Some(pid) = lock(&self.pids)[who] {
            let _ = std::process::Command::new("kill")
                .args([&format!("-{sig}"), &pid.to_string()])
                .status();
        }
    }

    fn bytes(&self, dir: Dir, mut from: TcpStream, mut to: TcpStream) {
        let mut seen = 0usize;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let Ok(n) = from.read(&mut buf) else { return };
            let mut st = lock(&self.state);
            if n == 0 || st.stalled {
                if n == 0 {
                    let _ = to.shutdown(Shutdown::Write);
                    return;
                }
                continue;
            }
            let chunk = &mut buf[..n];
            if let When::Byte(d, at) = self.when
                && d == dir
                && (seen..seen + n).contains(&at)
                && self.fire(&mut st)
            {
                let i = at - seen;
                match self.act {
                    Act::Flip(_) => chunk[i] ^= 0x40,
                    Act::Stall => {
                        let _ = to.write_all(&chunk[..i]);
                        st.stalled = true;
                        continue;
                    }
                    _ => {
                        let _ = to.write_all(&chunk[..i]);
                        close_all(&st.sockets);
                        return;
                    }
                }
            }
            seen += n;
            if to.write_all(chunk).is_err() {
                return;
            }
        }
    }

    fn frames(&self, dir: Dir, mut from: TcpStream, mut to: TcpStream) {
        loop {
            let Some((mut header, mut payload)) = read_frame(&mut from) else {
                let _ = to.shutdown(Shutdown::Write);
                return;
            };
            let mut st = lock(&self.state);
            if st.stalled {
                continue;
            }
            let (kind, step) = (
                header[2],
                u32::from_le_bytes(header[3..7].try_into().unwrap()),
            );
            let hit = matches!(self.when, When::Frame(d, k, s)
                if d.is_none_or(|d| d == dir) && k == kind && s == step);
            if hit && self.fire(&mut st) {
                match self.act {
                    Act::Close => {
                        close_all(&st.sockets);
                        return;
                    }
                    Act::Stall => {
                        st.stalled = true;
                        continue;
                    }
                    Act::Flip(i) => {
                        let at = i.min(payload.len().saturating_sub(1));
                        payload[at] ^= 0x40;
                    }
                    Act::Truncate => {
                        let _ = to.write_all(&header);
                        let _ = to.write_all(&payload[..payload.len() / 2]);
                        close_all(&st.sockets);
                        return;
                    }
                    Act::BadStep => header[3..7].copy_from_slice(&(step + 1).to_le_bytes()),
                    Act::BadLength => {
                        payload.truncate(payload.len().saturating_sub(8));
                        header[7..15].copy_from_slice(&(payload.len() as u64).to_le_bytes());
                    }
                    Act::Abort => {
                        let reason = b"fault injected by the test proxy";
                        header[2] = 5;
                        header[7..15].copy_from_slice(&(reason.len() as u64).to_le_bytes());
                        payload = reason.to_vec();
                    }
                    Act::Signal(who, sig) => self.signal(who, sig),
                }
            }
            if to.write_all(&header).is_err() || to.write_all(&payload).is_err() {
                return;
            }
        }
    }
}

/// One whole frame, or `None` at the end of the stream.
fn read_frame(from: &mut TcpStream) -> Option<([u8; 15], Vec<u8>)> {
    let mut header = [0u8; 15];
    from.read_exact(&mut header).ok()?;
    let len = u64::from_le_bytes(header[7..15].try_into().unwrap());
    let mut payload = vec![0u8; usize::try_from(len).ok()?.min(1 << 28)];
    from.read_exact(&mut payload).ok()?;
    Some((header, payload))
}
