//! A user-space network: a TCP relay that delays every byte by a one-way
//! latency and paces it at a bandwidth, in each direction on its own. These
//! machines have no `netem`, so `bench net` puts one relay in front of each
//! listening server and points the other parties at it. TLS stays end to
//! end: the relay forwards bytes it cannot read.
//!
//! The model of one direction (a link with a serialising sender):
//! - a chunk of `L` bytes read at time `t` starts its transmission at
//!   `max(t, free)`, where `free` is when the previous chunk finished;
//! - it takes `L / bandwidth`, so `free` moves to the end of it;
//! - it arrives one latency after that, and is written then.
//!
//! So a round trip adds `2 · latency` and a message of `L` bytes
//! `L / bandwidth`, the terms of the model `bench net` compares with.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// One direction's delay and pace.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    /// One-way latency (half the round-trip time).
    pub latency: Duration,
    /// Bytes per second; `None` for no limit.
    pub bytes_per_s: Option<f64>,
}

/// When the chunks of one direction are released: the pure half of the
/// relay, so that the schedule is tested without a clock.
#[derive(Debug)]
pub struct Pace {
    link: Link,
    /// When the sender finishes the chunk before.
    free: Option<Instant>,
}

impl Pace {
    pub fn new(link: Link) -> Pace {
        Pace { link, free: None }
    }

    /// When a chunk of `len` bytes read at `read` is to be written.
    pub fn release(&mut self, read: Instant, len: usize) -> Instant {
        let start = self.free.map_or(read, |f| f.max(read));
        let send = self
            .link
            .bytes_per_s
            .map_or(Duration::ZERO, |r| Duration::from_secs_f64(len as f64 / r));
        let done = start + send;
        self.free = Some(done);
        done + self.link.latency
    }
}

/// Bytes read at a time.
const CHUNK: usize = 64 * 1024;

/// A running relay: accepts on its own address and forwards each
/// connection to `target` through a [`Link`] each way, until dropped.
pub struct Relay {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl Relay {
    /// Listens on a free loopback port.
    pub fn start(target: SocketAddr, link: Link) -> Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0").context("binding a relay")?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let accept = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if flag.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(inbound) = conn else { continue };
                match TcpStream::connect(target) {
                    Ok(outbound) => splice(inbound, outbound, link),
                    Err(_) => drop(inbound),
                }
            }
        });
        Ok(Relay {
            addr,
            stop,
            accept: Some(accept),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Relay {
    /// Ends the accept loop (a connection to itself wakes it); the
    /// forwarding threads end with their connections.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

/// Forwards both directions of a connection pair, each on a reader and a
/// writer thread.
fn splice(a: TcpStream, b: TcpStream, link: Link) {
    for s in [&a, &b] {
        let _ = s.set_nodelay(true);
    }
    let pairs = [(&a, &b), (&b, &a)];
    for (from, to) in pairs {
        let (Ok(from), Ok(to)) = (from.try_clone(), to.try_clone()) else {
            continue;
        };
        let (tx, rx) = channel();
        std::thread::spawn(move || read_side(from, &tx));
        std::thread::spawn(move || write_side(to, &rx, Pace::new(link)));
    }
}

/// What a reader hands its writer: a chunk and when it was read; `None`
/// when the source closed.
type Chunk = Option<(Instant, Vec<u8>)>;

fn read_side(mut from: TcpStream, tx: &Sender<Chunk>) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if tx.send(Some((Instant::now(), buf[..n].to_vec()))).is_err() {
                    break;
                }
            }
        }
    }
    let _ = tx.send(None);
}

fn write_side(mut to: TcpStream, rx: &Receiver<Chunk>, mut pace: Pace) {
    while let Ok(Some((read, bytes))) = rx.recv() {
        let due = pace.release(read, bytes.len());
        let wait = due.saturating_duration_since(Instant::now());
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
        if to.write_all(&bytes).is_err() {
            break;
        }
    }
    // The source closed (or the sink failed): pass the end on.
    let _ = to.shutdown(Shutdown::Write);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_leave_one_latency_after_their_transmission() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut p = Pace::new(Link {
            latency: ms(2),
            bytes_per_s: Some(1000.0),
        });
        // 10 bytes at 1000 B/s: 10 ms to send, then 2 ms on the wire.
        assert_eq!(p.release(t0, 10), t0 + ms(12));
        // Read while the sender is busy: it waits for the sender.
        assert_eq!(p.release(t0 + ms(5), 5), t0 + ms(17));
        // Read after the sender went idle: it starts when read.
        assert_eq!(p.release(t0 + ms(100), 1), t0 + ms(103));
        let mut direct = Pace::new(Link {
            latency: Duration::ZERO,
            bytes_per_s: None,
        });
        assert_eq!(direct.release(t0, 1 << 20), t0);
    }

    #[test]
    fn a_relay_forwards_both_ways_whole_and_in_order_and_passes_the_end_on() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let target = server.local_addr().unwrap();
        let echo = std::thread::spawn(move || {
            let (mut s, _) = server.accept().unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap();
            s.write_all(&got).unwrap();
        });
        let relay = Relay::start(
            target,
            Link {
                latency: Duration::from_millis(1),
                bytes_per_s: Some(50e6),
            },
        )
        .unwrap();
        let mut c = TcpStream::connect(relay.addr()).unwrap();
        let sent: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        c.write_all(&sent).unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let mut back = Vec::new();
        c.read_to_end(&mut back).unwrap();
        assert!(back == sent, "the bytes came back changed");
        echo.join().unwrap();
    }
}
