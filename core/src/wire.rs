//! Versioned little-endian binary formats, parsed as zero-copy views.
//!
//! Parsing checks every length, width, tag and reserved field before any
//! view is handed out, never allocates, and never panics: malformed input
//! is a [`WireError`].
//!
//! # Key batch, format version 1
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 4 | magic `SUFK` |
//! | 4 | 2 | format version (1) |
//! | 6 | 1 | kind: 0 = DCF, 1 = DPF |
//! | 7 | 1 | output: 0 = bit, 1 = ring, 2 = pair (DCF only) |
//! | 8 | 1 | input width k, 1..=64 |
//! | 9 | 1 | output width w: 1 for bit, 1..=64 for ring and pair |
//! | 10 | 1 | party: 0 or 1 |
//! | 11 | 1 | reserved, 0 |
//! | 12 | 8 | key count |
//! | 20 | count · key_len | keys, each `fss::Params::key_len()` bytes |

use crate::error::WireError;
use crate::fss::{KeyBatch, Kind, Output, Params, Party};
use crate::ring::{Width, cast};

/// Magic number of a key batch.
pub const KEY_MAGIC: [u8; 4] = *b"SUFK";
/// The key batch format version this build writes and reads.
pub const KEY_VERSION: u16 = 1;
/// Length of a key batch header.
pub const KEY_HEADER_LEN: usize = 20;

/// Total serialized length of `count` keys, or `None` on overflow.
pub fn key_batch_len(params: &Params, count: usize) -> Option<usize> {
    count
        .checked_mul(params.key_len())?
        .checked_add(KEY_HEADER_LEN)
}

/// Writes the header of a key batch of `count` keys.
pub fn write_key_header(params: &Params, party: Party, count: usize) -> [u8; KEY_HEADER_LEN] {
    let mut h = [0u8; KEY_HEADER_LEN];
    h[0..4].copy_from_slice(&KEY_MAGIC);
    h[4..6].copy_from_slice(&KEY_VERSION.to_le_bytes());
    h[6] = match params.kind() {
        Kind::Dcf => 0,
        Kind::Dpf => 1,
    };
    let (tag, w) = match params.output() {
        Output::Bit => (0, 1),
        Output::Ring(w) => (1, w.bits()),
        Output::Pair(w) => (2, w.bits()),
    };
    h[7] = tag;
    h[8] = u8::try_from(params.domain().bits()).unwrap_or(0);
    h[9] = u8::try_from(w).unwrap_or(0);
    h[10] = u8::try_from(party.index()).unwrap_or(0);
    h[12..20].copy_from_slice(&cast::u64_from_usize(count).to_le_bytes());
    h
}

/// Parses a serialized key batch into a zero-copy view of its keys.
pub fn parse_key_batch(bytes: &[u8]) -> Result<KeyBatch<'_>, WireError> {
    let header = bytes.get(..KEY_HEADER_LEN).ok_or(WireError::Truncated)?;
    if header[0..4] != KEY_MAGIC {
        return Err(WireError::BadMagic);
    }
    if u16::from_le_bytes([header[4], header[5]]) != KEY_VERSION {
        return Err(WireError::UnsupportedVersion);
    }
    let kind = match header[6] {
        0 => Kind::Dcf,
        1 => Kind::Dpf,
        _ => return Err(WireError::UnknownTag),
    };
    let domain = Width::new(u32::from(header[8])).map_err(|_| WireError::BadWidth)?;
    let output = match (header[7], header[9]) {
        (0, 1) => Output::Bit,
        (0, _) => return Err(WireError::BadWidth),
        (1, w) => Output::Ring(Width::new(u32::from(w)).map_err(|_| WireError::BadWidth)?),
        // Pairs are comparison keys only.
        (2, w) if kind == Kind::Dcf => {
            Output::Pair(Width::new(u32::from(w)).map_err(|_| WireError::BadWidth)?)
        }
        _ => return Err(WireError::UnknownTag),
    };
    let party = match header[10] {
        0 => Party::P0,
        1 => Party::P1,
        _ => return Err(WireError::UnknownTag),
    };
    if header[11] != 0 {
        return Err(WireError::ReservedNonZero);
    }
    let mut count = [0u8; 8];
    count.copy_from_slice(&header[12..20]);
    let count = usize::try_from(u64::from_le_bytes(count)).map_err(|_| WireError::CountOverflow)?;
    let params = Params::new(kind, domain, output);
    let total = key_batch_len(&params, count).ok_or(WireError::CountOverflow)?;
    if bytes.len() < total {
        return Err(WireError::Truncated);
    }
    if bytes.len() > total {
        return Err(WireError::TrailingBytes);
    }
    KeyBatch::new(params, party, &bytes[KEY_HEADER_LEN..]).map_err(|_| WireError::Truncated)
}

/// Packs `words` of `width` bits each into `out`, least significant bit
/// first; `out` must be exactly `width.packed_len(words.len())` bytes.
/// Words are reduced modulo `2^width`.
pub fn pack(width: Width, words: &[u64], out: &mut [u8]) -> Result<(), WireError> {
    if width.packed_len(words.len()) != Some(out.len()) {
        return Err(WireError::Truncated);
    }
    let w = width.bits();
    if w.is_multiple_of(8) {
        // Whole bytes: each word is its low w/8 little-endian bytes.
        let bytes = cast::usize_from_u32(w / 8);
        for (chunk, &word) in out.chunks_exact_mut(bytes).zip(words) {
            chunk.copy_from_slice(&word.to_le_bytes()[..bytes]);
        }
        return Ok(());
    }
    let mut acc: u128 = 0;
    let mut bits = 0u32;
    let mut pos = 0;
    for &word in words {
        acc |= cast::u128_from_u64(width.reduce(word)) << bits;
        bits += w;
        while bits >= 8 {
            out[pos] = acc.to_le_bytes()[0];
            acc >>= 8;
            bits -= 8;
            pos += 1;
        }
    }
    if bits > 0 {
        out[pos] = acc.to_le_bytes()[0];
    }
    Ok(())
}

/// Unpacks `out.len()` words of `width` bits from `bytes`, the inverse of
/// [`pack`]. Padding bits in the last byte must be zero.
pub fn unpack(width: Width, bytes: &[u8], out: &mut [u64]) -> Result<(), WireError> {
    if width.packed_len(out.len()) != Some(bytes.len()) {
        return Err(WireError::Truncated);
    }
    let w = width.bits();
    if w.is_multiple_of(8) {
        // Whole bytes: nothing can be padding.
        let per = cast::usize_from_u32(w / 8);
        for (slot, chunk) in out.iter_mut().zip(bytes.chunks_exact(per)) {
            let mut b = [0u8; 8];
            b[..per].copy_from_slice(chunk);
            *slot = u64::from_le_bytes(b);
        }
        return Ok(());
    }
    let mut acc: u128 = 0;
    let mut bits = 0u32;
    let mut pos = 0;
    for slot in out.iter_mut() {
        while bits < w {
            acc |= u128::from(bytes[pos]) << bits;
            bits += 8;
            pos += 1;
        }
        *slot = cast::low_u64(acc) & width.mask();
        acc >>= w;
        bits -= w;
    }
    if acc != 0 {
        return Err(WireError::ReservedNonZero);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_round_trip() {
        for bits in [1u32, 3, 7, 8, 13, 50, 63, 64] {
            let w = Width::of(bits);
            let words: [u64; 11] = core::array::from_fn(|i| {
                cast::u64_from_usize(i).wrapping_mul(0x9e37_79b9_7f4a_7c15)
            });
            let mut bytes = [0u8; 88];
            let len = w.packed_len(words.len()).unwrap();
            pack(w, &words, &mut bytes[..len]).unwrap();
            let mut back = [0u64; 11];
            unpack(w, &bytes[..len], &mut back).unwrap();
            for (a, b) in words.iter().zip(back.iter()) {
                assert_eq!(w.reduce(*a), *b);
            }
        }
    }

    #[test]
    fn unpack_rejects_padding_and_lengths() {
        let w = Width::of(3);
        let mut out = [0u64; 2];
        assert_eq!(
            unpack(w, &[0b1100_0000], &mut out),
            Err(WireError::ReservedNonZero)
        );
        assert_eq!(unpack(w, &[0, 0], &mut out), Err(WireError::Truncated));
    }
}
