//! Steps that share rounds: a group of independent lanes (see
//! [`crate::plan::Lane`]), each run on its own thread, whose messages go
//! out together.
//!
//! Every step of a query reaches the link through [`Rounds`]. Outside a
//! group one lane runs and each exchange is the link's. In a group of n
//! lanes a round is a turn: every lane still running deposits its next
//! event, a message or its end, and the lane whose deposit completes the
//! turn sends the messages as one `Round` frame (their concatenation in
//! lane order, tagged with the first one's step), cuts the peer's frame at
//! the same lengths and wakes the others. Both servers run the same plan,
//! so each lane deposits the same sequence of message lengths on both
//! sides and the two frames line up; a frame of another length is the
//! link's `UnexpectedLength`, as for any step. No thread of its own and one
//! wake per waiting lane per round: on a 2-vCPU VM a cross-thread hand-off
//! costs about 40 µs, as much as a loopback round.
//!
//! A lane that fails calls [`Rounds::fail`]: the group's rounds stop, every
//! waiting lane returns [`LaneError::Stopped`], and the group reports the
//! first cause.

use std::sync::{Condvar, Mutex, MutexGuard};

use crate::net::{Link, NetError, Traffic};

/// A lane's exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum LaneError {
    /// The link failed in the round this lane completed.
    #[error(transparent)]
    Net(NetError),
    /// The group's rounds stopped: the link failed in a round another lane
    /// completed, or another lane failed.
    #[error("the rounds of this step's group stopped")]
    Stopped,
}

/// What a lane deposited in the current turn.
enum Part {
    Send { step: u32, bytes: Vec<u8> },
    Done,
}

struct State<'l> {
    link: &'l mut Link,
    /// Per lane of the group: whether it still runs.
    live: Vec<bool>,
    /// The current turn's deposits.
    parts: Vec<Option<Part>>,
    /// The last turn's answers, taken by their lanes.
    replies: Vec<Option<Vec<u8>>>,
    /// Turns completed.
    turn: u64,
    stopped: bool,
}

/// The link, shared by the lanes of a group.
pub struct Rounds<'l> {
    state: Mutex<State<'l>>,
    turned: Condvar,
}

/// What a step needs of [`Rounds`], without its link's lifetime.
pub trait Exchange: Sync {
    /// One round of lane `lane`: see [`Rounds::exchange`].
    fn exchange(&self, lane: usize, step: u32, bytes: &[u8]) -> Result<Vec<u8>, LaneError>;
}

impl<'l> Rounds<'l> {
    /// One lane on `link`.
    pub fn new(link: &'l mut Link) -> Rounds<'l> {
        Rounds {
            state: Mutex::new(State {
                link,
                live: vec![true],
                parts: vec![None],
                replies: vec![None],
                turn: 0,
                stopped: false,
            }),
            turned: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<'l>> {
        // A lane that panicked holding the lock fails the whole query
        // through its join; the state itself stays consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a group of `lanes` lanes (lane 0 is the caller's).
    pub fn begin(&self, lanes: usize) {
        let mut s = self.lock();
        s.live = vec![true; lanes];
        s.parts = (0..lanes).map(|_| None).collect();
        s.replies = vec![None; lanes];
    }

    /// Ends the group: one lane again. Whether its rounds stopped.
    pub fn end(&self) -> bool {
        let mut s = self.lock();
        let stopped = s.stopped;
        s.live = vec![true];
        s.parts = vec![None];
        s.replies = vec![None];
        s.stopped = false;
        stopped
    }

    /// The link's traffic so far.
    pub fn traffic(&self) -> Traffic {
        self.lock().link.traffic()
    }

    /// `f` of the link's traffic so far per step
    /// ([`Link::traffic_by_step`]).
    pub fn with_traffic_by_step<R>(
        &self,
        f: impl FnOnce(&std::collections::BTreeMap<u32, Traffic>) -> R,
    ) -> R {
        f(self.lock().link.traffic_by_step())
    }

    /// Lane `lane` has sent its last message. It may complete a turn, whose
    /// exchange then fails here if the link does.
    pub fn done(&self, lane: usize) -> Result<(), LaneError> {
        let mut s = self.lock();
        if s.stopped {
            return Err(LaneError::Stopped);
        }
        s.parts[lane] = Some(Part::Done);
        self.complete(&mut s)
    }

    /// Stops the group's rounds: every lane waiting, or coming to wait,
    /// returns [`LaneError::Stopped`].
    pub fn fail(&self) {
        self.lock().stopped = true;
        self.turned.notify_all();
    }

    /// Sends the turn's messages if every live lane has deposited.
    fn complete(&self, s: &mut State<'l>) -> Result<(), LaneError> {
        let ready = s
            .live
            .iter()
            .zip(&s.parts)
            .all(|(live, part)| !live || part.is_some());
        if !ready {
            return Ok(());
        }
        let mut step = None;
        let mut frame = Vec::new();
        let mut lens = Vec::with_capacity(s.parts.len());
        for (l, part) in s.parts.iter_mut().enumerate() {
            match part.take() {
                Some(Part::Send { step: st, bytes }) => {
                    step.get_or_insert(st);
                    frame.extend_from_slice(&bytes);
                    lens.push((l, bytes.len()));
                }
                Some(Part::Done) => s.live[l] = false,
                None => {}
            }
        }
        if let Some(step) = step {
            match s.link.exchange(step, &frame, frame.len()) {
                Ok(recv) => {
                    let mut at = 0;
                    for (l, len) in lens {
                        s.replies[l] = Some(recv[at..at + len].to_vec());
                        at += len;
                    }
                }
                Err(e) => {
                    s.stopped = true;
                    self.turned.notify_all();
                    return Err(LaneError::Net(e));
                }
            }
            s.turn += 1;
            self.turned.notify_all();
        }
        Ok(())
    }
}

impl Exchange for Rounds<'_> {
    /// One round: deposits `bytes` as lane `lane`'s message of this turn,
    /// completes the turn if it is the last deposit, else waits for it;
    /// returns the peer's message for this lane.
    fn exchange(&self, lane: usize, step: u32, bytes: &[u8]) -> Result<Vec<u8>, LaneError> {
        let mut s = self.lock();
        if s.stopped {
            return Err(LaneError::Stopped);
        }
        if s.live.len() == 1 {
            // Outside a group: the link's own exchange, no copies.
            return s
                .link
                .exchange(step, bytes, bytes.len())
                .map_err(LaneError::Net);
        }
        let turn = s.turn;
        s.parts[lane] = Some(Part::Send {
            step,
            bytes: bytes.to_vec(),
        });
        self.complete(&mut s)?;
        while s.turn == turn && !s.stopped {
            s = self.turned.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        if s.turn == turn {
            return Err(LaneError::Stopped);
        }
        s.replies[lane].take().ok_or(LaneError::Stopped)
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

    /// One party: a round alone, then a group of lanes with `rounds[l]`
    /// rounds each (every answer checked against the peer's message), then
    /// a round alone again; returns the link's rounds.
    fn party(link: &mut Link, me: u8, rounds: &[usize]) -> u64 {
        let shared = Rounds::new(link);
        let alone = shared.exchange(0, 1, &[me; 5]).unwrap();
        assert_eq!(alone, [1 - me; 5]);
        shared.begin(rounds.len());
        thread::scope(|s| {
            for (l, &n) in rounds.iter().enumerate() {
                let shared = &shared;
                s.spawn(move || {
                    for r in 0..n {
                        let got = shared
                            .exchange(l, 7 + l as u32, &message(me, l, r))
                            .unwrap();
                        assert_eq!(got, message(1 - me, l, r), "lane {l} round {r}");
                    }
                    shared.done(l).unwrap();
                });
            }
        });
        assert!(!shared.end());
        assert_eq!(shared.exchange(0, 2, &[me; 3]).unwrap(), [1 - me; 3]);
        shared.traffic().rounds
    }

    #[test]
    fn lanes_share_rounds_and_each_gets_its_own_answer() {
        for rounds in [
            vec![3, 1],
            vec![1, 3],
            vec![2, 2, 5],
            vec![0, 4],
            vec![4],
            vec![0, 0],
        ] {
            let (mut a, mut b) = pair();
            let r = rounds.clone();
            let peer = thread::spawn(move || party(&mut b, 1, &r));
            let mine = party(&mut a, 0, &rounds);
            let most = *rounds.iter().max().unwrap() as u64;
            assert_eq!(mine, most + 2, "{rounds:?}");
            assert_eq!(peer.join().unwrap(), mine);
        }
    }

    #[test]
    fn a_failed_lane_stops_the_group_and_the_others_see_it() {
        let (mut a, _b) = pair();
        let shared = Rounds::new(&mut a);
        shared.begin(2);
        thread::scope(|s| {
            let waiting = s.spawn(|| shared.exchange(1, 3, &[1, 2, 3]));
            // Lane 0 fails before its first message.
            thread::sleep(Duration::from_millis(20));
            shared.fail();
            assert!(matches!(waiting.join().unwrap(), Err(LaneError::Stopped)));
        });
        assert!(matches!(
            shared.exchange(0, 4, &[0]),
            Err(LaneError::Stopped)
        ));
        assert!(shared.end());
        assert_eq!(shared.traffic().rounds, 0);
    }

    #[test]
    fn a_peer_that_goes_away_is_the_links_error_and_every_lane_stops() {
        let (mut a, b) = pair();
        drop(b);
        let shared = Rounds::new(&mut a);
        shared.begin(2);
        let outs: Vec<_> = thread::scope(|s| {
            let lanes: Vec<_> = (0..2)
                .map(|l| {
                    let shared = &shared;
                    s.spawn(move || shared.exchange(l, 5, &[9; 4]))
                })
                .collect();
            lanes.into_iter().map(|h| h.join().unwrap()).collect()
        });
        // One lane completed the turn and saw the link's error, the other
        // saw the rounds stop.
        let net = outs
            .iter()
            .filter(|o| matches!(o, Err(LaneError::Net(_))))
            .count();
        let stopped = outs
            .iter()
            .filter(|o| matches!(o, Err(LaneError::Stopped)))
            .count();
        assert_eq!((net, stopped), (1, 1), "{outs:?}");
        assert!(shared.end());
    }
}
