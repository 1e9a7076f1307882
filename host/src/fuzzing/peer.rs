//! Peers for in-memory links: one that echoes, one that says a fixed thing
//! once, and one that a fuzzer scripts.

use super::{first_step, raw_header};
use crate::net::{FrameHeader, FrameKind, HEADER_LEN, Peer};

/// Answers every frame with itself: a round gets a frame of its own kind,
/// step and length, which is all a party checks of its peer's frames.
pub(super) struct Echo;

impl Peer for Echo {
    fn answer(&mut self, written: &[u8]) -> Vec<u8> {
        written.to_vec()
    }
}

/// Sends its bytes at the first read, then closes.
pub(super) struct Once(pub(super) Option<Vec<u8>>);

impl Peer for Once {
    fn answer(&mut self, _: &[u8]) -> Vec<u8> {
        self.0.take().unwrap_or_default()
    }
}

/// Largest payload a scripted frame carries, and earlier answers kept for
/// replay: bounds that keep one execution small.
const MAX_SCRIPTED: usize = 1 << 12;
const HISTORY: usize = 16;

/// A peer whose answers a fuzzer writes. Each answer takes one opcode byte
/// and its operands from the script; an exhausted script closes the link.
///
/// | op % 8 | answer |
/// | --- | --- |
/// | 0 | an echo of what the party wrote |
/// | 1 | the same frame headers, payloads taken from the script |
/// | 2 | one frame: kind byte, step and length (each near the party's or raw), payload from the script (possibly shorter than declared) |
/// | 3 | raw bytes: a count byte, then that many |
/// | 4 | an echo cut after a 16-bit count of bytes |
/// | 5 | a replay of an earlier answer |
/// | 6 | an `Abort` frame whose reason comes from the script |
/// | 7 | nothing: the peer closes |
pub(super) struct Scripted {
    script: Vec<u8>,
    at: usize,
    history: Vec<Vec<u8>>,
}

impl Scripted {
    pub(super) fn new(script: &[u8]) -> Self {
        Self {
            script: script.to_vec(),
            at: 0,
            history: Vec::new(),
        }
    }

    fn byte(&mut self) -> Option<u8> {
        let b = *self.script.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    /// Up to `n` bytes, fewer where the script ends.
    fn take(&mut self, n: usize) -> &[u8] {
        let start = self.at;
        self.at += n.min(self.script.len() - start);
        &self.script[start..self.at]
    }

    fn word(&mut self, n: usize) -> u64 {
        self.take(n)
            .iter()
            .rev()
            .fold(0, |acc, &x| acc << 8 | u64::from(x))
    }

    /// A value near `base` (the same, one off either way) or a raw one.
    fn near(&mut self, base: u64, raw_bytes: usize) -> u64 {
        match self.byte().unwrap_or(0) % 4 {
            0 => base,
            1 => base.wrapping_add(1),
            2 => base.wrapping_sub(1),
            _ => self.word(raw_bytes),
        }
    }

    /// Frames with the party's headers and scripted payloads.
    fn repaint(&mut self, written: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(written.len());
        let mut rest = written;
        while let Ok(h) = FrameHeader::parse(rest) {
            let len = usize::try_from(h.len).unwrap_or(usize::MAX);
            let Some(next) = rest.get(HEADER_LEN + len..) else {
                break;
            };
            out.extend_from_slice(&h.encode());
            let from_script = self.take(len);
            let pad = len - from_script.len();
            out.extend_from_slice(from_script);
            out.resize(out.len() + pad, 0);
            rest = next;
        }
        out
    }

    fn frame(&mut self, written: &[u8]) -> Vec<u8> {
        let kind = self.byte().unwrap_or(FrameKind::Round.to_byte());
        let step = first_step(written).unwrap_or(0);
        let step = self.near(u64::from(step), 4) as u32;
        let len = FrameHeader::parse(written).map_or(0, |h| h.len);
        let len = self.near(len, 8);
        let given = usize::try_from(len).unwrap_or(usize::MAX).min(MAX_SCRIPTED);
        let mut out = raw_header(kind, step, len);
        out.extend_from_slice(self.take(given));
        out
    }
}

impl Peer for Scripted {
    fn answer(&mut self, written: &[u8]) -> Vec<u8> {
        let Some(op) = self.byte() else {
            return Vec::new();
        };
        let out = match op % 8 {
            0 => written.to_vec(),
            1 => self.repaint(written),
            2 => self.frame(written),
            3 => {
                let n = usize::from(self.byte().unwrap_or(0));
                self.take(n).to_vec()
            }
            4 => {
                let n = self.word(2) as usize;
                written[..n.min(written.len())].to_vec()
            }
            5 if !self.history.is_empty() => {
                let i = usize::from(self.byte().unwrap_or(0)) % self.history.len();
                self.history[i].clone()
            }
            6 => {
                let n = usize::from(self.byte().unwrap_or(0));
                let step = first_step(written).unwrap_or(0);
                let reason = self.take(n).to_vec();
                let abort = FrameKind::Abort.to_byte();
                let mut out = raw_header(abort, step, reason.len() as u64);
                out.extend_from_slice(&reason);
                out
            }
            _ => Vec::new(),
        };
        if self.history.len() < HISTORY && !out.is_empty() {
            self.history.push(out.clone());
        }
        out
    }
}
