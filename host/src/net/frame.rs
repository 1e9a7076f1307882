//! The frame header (layout in the [`net`](super) docs), parsed and
//! written. Everything here is pure and never panics: it is fuzzed
//! (`fuzz/fuzz_targets/frame.rs`).

use std::fmt;

use super::NetError;

/// The first two bytes of every frame.
pub const MAGIC: [u8; 2] = *b"SF";

/// Bytes in a frame header.
pub const HEADER_LEN: usize = 15;

/// The default largest payload a link accepts: 2 GiB. A transformer's largest
/// round (an attention matrix's worth of shares) stays well under it, and it
/// bounds what a misbehaving peer can make us allocate.
pub const DEFAULT_MAX_PAYLOAD: u64 = 2 << 30;

/// The largest payload of a [`FrameKind::Hello`] or [`FrameKind::Abort`]
/// frame, whatever a link's maximum: both carry a little metadata or a
/// message, never data, so a peer gets no more than this from us for them.
pub const MAX_CONTROL_PAYLOAD: u64 = 64 << 10;

/// What a frame carries.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// Handshake: each side's identity and parameters.
    Hello,
    /// Client → server: input shares.
    Input,
    /// Server ↔ server: one protocol round's message.
    Round,
    /// Server → client: output shares.
    Output,
    /// A peer reporting a fatal error; the payload is a UTF-8 reason.
    Abort,
}

impl FrameKind {
    /// The kind's byte on the wire.
    pub const fn to_byte(self) -> u8 {
        match self {
            Self::Hello => 1,
            Self::Input => 2,
            Self::Round => 3,
            Self::Output => 4,
            Self::Abort => 5,
        }
    }

    /// The kind with this wire byte, if there is one.
    pub const fn from_byte(byte: u8) -> Option<Self> {
        Some(match byte {
            1 => Self::Hello,
            2 => Self::Input,
            3 => Self::Round,
            4 => Self::Output,
            5 => Self::Abort,
            _ => return None,
        })
    }

    /// The largest payload accepted for this kind on a link whose maximum is
    /// `link_max`.
    pub const fn max_payload(self, link_max: u64) -> u64 {
        match self {
            Self::Hello | Self::Abort if MAX_CONTROL_PAYLOAD < link_max => MAX_CONTROL_PAYLOAD,
            _ => link_max,
        }
    }

    const fn name(self) -> &'static str {
        match self {
            Self::Hello => "Hello",
            Self::Input => "Input",
            Self::Round => "Round",
            Self::Output => "Output",
            Self::Abort => "Abort",
        }
    }
}

impl fmt::Display for FrameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A parsed frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FrameHeader {
    /// What the frame carries.
    pub kind: FrameKind,
    /// The protocol step it belongs to.
    pub step: u32,
    /// Payload length in bytes, as the sender declared it.
    pub len: u64,
}

impl FrameHeader {
    /// Parses the header at the start of `bytes` (extra bytes are ignored).
    ///
    /// Checks the magic and the kind. The length is only decoded: what is
    /// acceptable depends on the receiver, see [`FrameKind::max_payload`].
    pub fn parse(bytes: &[u8]) -> Result<Self, NetError> {
        let Some(header) = bytes.first_chunk::<HEADER_LEN>() else {
            return Err(NetError::Truncated {
                need: HEADER_LEN as u64,
                got: bytes.len() as u64,
            });
        };
        let [m0, m1, kind, s0, s1, s2, s3, l0, l1, l2, l3, l4, l5, l6, l7] = *header;
        if [m0, m1] != MAGIC {
            return Err(NetError::BadMagic);
        }
        let kind = FrameKind::from_byte(kind).ok_or(NetError::UnknownKind(kind))?;
        let step = u32::from_le_bytes([s0, s1, s2, s3]);
        let len = u64::from_le_bytes([l0, l1, l2, l3, l4, l5, l6, l7]);
        Ok(Self { kind, step, len })
    }

    /// The header's wire bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[..2].copy_from_slice(&MAGIC);
        out[2] = self.kind.to_byte();
        out[3..7].copy_from_slice(&self.step.to_le_bytes());
        out[7..].copy_from_slice(&self.len.to_le_bytes());
        out
    }
}

/// A whole frame borrowed from a byte slice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameRef<'a> {
    /// The frame's header.
    pub header: FrameHeader,
    /// Exactly `header.len` bytes.
    pub payload: &'a [u8],
}

impl<'a> FrameRef<'a> {
    /// Splits the first frame off `bytes`, returning it and the bytes after
    /// it. A payload over `max_payload` (or over the kind's own limit) is
    /// [`NetError::TooLarge`]; fewer bytes than the header declares is
    /// [`NetError::Truncated`].
    pub fn split(bytes: &'a [u8], max_payload: u64) -> Result<(Self, &'a [u8]), NetError> {
        let header = FrameHeader::parse(bytes)?;
        let max = header.kind.max_payload(max_payload);
        if header.len > max {
            return Err(NetError::TooLarge {
                len: header.len,
                max,
            });
        }
        let body = &bytes[HEADER_LEN..];
        let Some(len) = usize::try_from(header.len)
            .ok()
            .filter(|&len| len <= body.len())
        else {
            return Err(NetError::Truncated {
                need: header.len.saturating_add(HEADER_LEN as u64),
                got: bytes.len() as u64,
            });
        };
        let (payload, rest) = body.split_at(len);
        Ok((Self { header, payload }, rest))
    }
}

/// One frame's wire bytes: header, then payload.
pub fn encode_frame(kind: FrameKind, step: u32, payload: &[u8]) -> Vec<u8> {
    let header = FrameHeader {
        kind,
        step,
        len: payload.len() as u64,
    };
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(payload);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const KINDS: [FrameKind; 5] = [
        FrameKind::Hello,
        FrameKind::Input,
        FrameKind::Round,
        FrameKind::Output,
        FrameKind::Abort,
    ];

    #[test]
    fn kind_bytes_round_trip_and_the_rest_are_unknown() {
        for byte in 0..=u8::MAX {
            match FrameKind::from_byte(byte) {
                Some(kind) => assert_eq!(kind.to_byte(), byte),
                None => assert!(byte == 0 || byte > 5),
            }
        }
        for kind in KINDS {
            assert_eq!(FrameKind::from_byte(kind.to_byte()), Some(kind));
        }
    }

    #[test]
    fn header_layout_is_little_endian() {
        let header = FrameHeader {
            kind: FrameKind::Round,
            step: 0x0403_0201,
            len: 0x0c0b_0a09_0807_0605,
        };
        let bytes = header.encode();
        assert_eq!(
            bytes,
            [b'S', b'F', 3, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
        );
        assert_eq!(FrameHeader::parse(&bytes).unwrap(), header);
    }

    #[test]
    fn parse_rejects_short_bad_magic_and_unknown_kind() {
        let good = FrameHeader {
            kind: FrameKind::Input,
            step: 7,
            len: 3,
        }
        .encode();
        for cut in 0..HEADER_LEN {
            assert!(matches!(
                FrameHeader::parse(&good[..cut]),
                Err(NetError::Truncated { need: 15, got }) if got == cut as u64
            ));
        }
        let mut bad = good;
        bad[1] = b'G';
        assert!(matches!(FrameHeader::parse(&bad), Err(NetError::BadMagic)));
        let mut bad = good;
        bad[2] = 0;
        assert!(matches!(
            FrameHeader::parse(&bad),
            Err(NetError::UnknownKind(0))
        ));
    }

    #[test]
    fn split_takes_exactly_one_frame() {
        let mut bytes = encode_frame(FrameKind::Output, 9, b"abc");
        bytes.extend_from_slice(b"rest");
        let (frame, rest) = FrameRef::split(&bytes, DEFAULT_MAX_PAYLOAD).unwrap();
        assert_eq!(frame.header.kind, FrameKind::Output);
        assert_eq!(frame.header.step, 9);
        assert_eq!(frame.payload, b"abc");
        assert_eq!(rest, b"rest");

        assert!(matches!(
            FrameRef::split(&bytes[..HEADER_LEN + 2], DEFAULT_MAX_PAYLOAD),
            Err(NetError::Truncated { need: 18, got: 17 })
        ));
        assert!(matches!(
            FrameRef::split(&bytes, 2),
            Err(NetError::TooLarge { len: 3, max: 2 })
        ));
        let huge = FrameHeader {
            kind: FrameKind::Abort,
            step: 0,
            len: u64::MAX,
        }
        .encode();
        assert!(matches!(
            FrameRef::split(&huge, u64::MAX),
            Err(NetError::TooLarge {
                len: u64::MAX,
                max: MAX_CONTROL_PAYLOAD
            })
        ));
    }
}
