//! Steps that share rounds: a group of independent lanes (see
//! [`crate::plan::Lane`]), each run on its own thread, whose messages the
//! round multiplexer sends together.
//!
//! Each lane's steps call [`LaneLink::exchange`] as they would the link.
//! The multiplexer, on the thread that owns the link, takes from every
//! lane still running its next event in lane order: a message, or the end
//! of the lane. The messages of one such turn go out as one `Round` frame
//! (their concatenation, tagged with the first one's step) and the peer's
//! frame is cut at the same lengths. Both servers run the same plan, so
//! each lane sends the same sequence of message lengths on both sides and
//! the two frames line up; a frame of another length is the link's
//! `UnexpectedLength`, as for any step. A lane that stops without saying it
//! is done (its step failed) stops the multiplexer, which drops the other
//! lanes' replies, so every lane returns.

use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use crate::net::{Link, NetError};

/// What a lane hands the multiplexer.
enum Event {
    /// A round's message for `step`.
    Send { step: u32, bytes: Vec<u8> },
    /// The lane has sent its last message.
    Done,
}

/// A lane's end of the multiplexer, used as its link.
pub struct LaneLink {
    to: SyncSender<Event>,
    from: Receiver<Vec<u8>>,
}

/// A lane's exchange failed: the rounds stopped, because the link failed
/// or another lane of the group did (the multiplexer reports which).
#[derive(Clone, Copy, Debug, thiserror::Error)]
#[error("the rounds of this step's group stopped")]
pub struct Stopped;

impl LaneLink {
    /// One round: sends `bytes` with the other lanes' messages of this
    /// round and returns the peer's message for this lane.
    pub fn exchange(&mut self, step: u32, bytes: &[u8]) -> Result<Vec<u8>, Stopped> {
        let event = Event::Send {
            step,
            bytes: bytes.to_vec(),
        };
        self.to.send(event).map_err(|_| Stopped)?;
        self.from.recv().map_err(|_| Stopped)
    }

    /// Tells the multiplexer this lane has sent its last message.
    pub fn done(self) {
        // A multiplexer that stopped no longer listens: nothing to tell.
        let _ = self.to.send(Event::Done);
    }
}

/// The multiplexer's end of one lane.
pub struct Port {
    from: Receiver<Event>,
    to: SyncSender<Vec<u8>>,
}

/// `n` lanes' links and the multiplexer's ports to them.
pub fn lanes(n: usize) -> (Vec<LaneLink>, Vec<Port>) {
    (0..n)
        .map(|_| {
            let (to_mux, from_lane) = sync_channel(1);
            let (to_lane, from_mux) = sync_channel(1);
            (
                LaneLink {
                    to: to_mux,
                    from: from_mux,
                },
                Port {
                    from: from_lane,
                    to: to_lane,
                },
            )
        })
        .unzip()
}

/// Why the multiplexer stopped early.
#[derive(Debug)]
pub enum MuxError {
    /// The link failed in a round tagged with `step`.
    Net {
        /// The round's step tag.
        step: u32,
        /// The link's error.
        error: NetError,
    },
    /// A lane stopped without saying it was done: its step failed.
    LaneFailed,
}

/// Runs the group's rounds over `link` until every lane is done; returns
/// the number of rounds.
pub fn multiplex(link: &mut Link, ports: Vec<Port>) -> Result<usize, MuxError> {
    let mut live = ports;
    let mut rounds = 0;
    loop {
        let mut turn: Vec<(Port, u32, Vec<u8>)> = Vec::with_capacity(live.len());
        for port in live {
            match port.from.recv() {
                Ok(Event::Send { step, bytes }) => turn.push((port, step, bytes)),
                Ok(Event::Done) => {}
                Err(_) => return Err(MuxError::LaneFailed),
            }
        }
        let Some(step) = turn.first().map(|(_, step, _)| *step) else {
            return Ok(rounds);
        };
        let frame: Vec<u8> = turn
            .iter()
            .flat_map(|(_, _, b)| b.iter().copied())
            .collect();
        // On an error the ports drop, and every waiting lane sees `Stopped`.
        let recv = link
            .exchange(step, &frame, frame.len())
            .map_err(|error| MuxError::Net { step, error })?;
        rounds += 1;
        let mut at = 0;
        live = Vec::with_capacity(turn.len());
        for (port, _, bytes) in turn {
            let part = recv[at..at + bytes.len()].to_vec();
            at += bytes.len();
            // A lane that stopped listening has failed; its port's next
            // event says so.
            let _ = port.to.send(part);
            live.push(port);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::thread;
    use std::time::Duration;

    use super::*;
    use crate::net::{Listener, Timeouts};

    fn pair() -> (Link, Link) {
        let t = Timeouts {
            connect: Duration::from_secs(5),
            io: Duration::from_secs(20),
        };
        let listener = Listener::bind("127.0.0.1:0").unwrap();
        let client = Link::connect(listener.local_addr().unwrap(), t).unwrap();
        let server = listener.accept(t).unwrap();
        (server, client)
    }

    /// Lane `lane`'s message in round `round` from `party`: its length
    /// depends on the lane and round only, as a step's does.
    fn message(party: u8, lane: usize, round: usize) -> Vec<u8> {
        (0..3 + 2 * lane + round)
            .map(|i| (party * 100) ^ (lane as u8 * 16) ^ (round as u8) ^ i as u8)
            .collect()
    }

    /// One party: lanes with `rounds[l]` rounds each, every message
    /// checked against the peer's; returns the multiplexer's rounds and
    /// the link's.
    fn party(link: &mut Link, me: u8, rounds: &[usize]) -> (usize, u64) {
        let (links, ports) = lanes(rounds.len());
        let muxed = thread::scope(|s| {
            for (l, mut lane) in links.into_iter().enumerate() {
                let n = rounds[l];
                s.spawn(move || {
                    for r in 0..n {
                        let got = lane.exchange(7 + l as u32, &message(me, l, r)).unwrap();
                        assert_eq!(got, message(1 - me, l, r), "lane {l} round {r}");
                    }
                    lane.done();
                });
            }
            multiplex(link, ports).unwrap()
        });
        (muxed, link.traffic().rounds)
    }

    #[test]
    fn lanes_share_rounds_and_each_gets_its_own_answer() {
        for rounds in [vec![3, 1], vec![1, 3], vec![2, 2, 5], vec![0, 4], vec![4]] {
            let (mut a, mut b) = pair();
            let r = rounds.clone();
            let peer = thread::spawn(move || party(&mut b, 1, &r));
            let mine = party(&mut a, 0, &rounds);
            let most = *rounds.iter().max().unwrap();
            assert_eq!(mine, (most, most as u64), "{rounds:?}");
            assert_eq!(peer.join().unwrap(), mine);
        }
    }

    #[test]
    fn a_failed_lane_stops_the_group_and_the_others_see_it() {
        let (mut a, _b) = pair();
        let (mut links, ports) = lanes(2);
        let other = links.pop().unwrap();
        let failed = links.pop().unwrap();
        let waiting = thread::spawn(move || {
            let mut other = other;
            other.exchange(3, &[1, 2, 3])
        });
        // Lane 0 fails before its first message: it drops its link.
        drop(failed);
        assert!(matches!(
            multiplex(&mut a, ports),
            Err(MuxError::LaneFailed)
        ));
        assert!(waiting.join().unwrap().is_err());
        assert_eq!(a.traffic().rounds, 0);
    }

    #[test]
    fn a_peer_that_goes_away_is_the_links_error_and_every_lane_stops() {
        let (mut a, b) = pair();
        drop(b);
        let (links, ports) = lanes(2);
        let lanes: Vec<_> = links
            .into_iter()
            .map(|mut lane| thread::spawn(move || lane.exchange(5, &[9; 4])))
            .collect();
        assert!(matches!(
            multiplex(&mut a, ports),
            Err(MuxError::Net { step: 5, .. })
        ));
        for l in lanes {
            assert!(l.join().unwrap().is_err());
        }
    }
}
