//! Frame headers and whole frames on arbitrary bytes: every input gets a
//! header or a `NetError`, never a panic, and what is accepted is exactly
//! what the bytes say.

#![no_main]

use libfuzzer_sys::fuzz_target;
use suffuse_host::net::{FrameHeader, FrameRef, HEADER_LEN, MAGIC, NetError, encode_frame};

fuzz_target!(|data: &[u8]| {
    check(data);
    // The magic is a needle the fuzzer seldom finds on its own (10 M runs
    // did not), so every input also goes in behind it, to reach the rest.
    let mut framed = MAGIC.to_vec();
    framed.extend_from_slice(data);
    check(&framed);
});

fn check(data: &[u8]) {
    let header = match FrameHeader::parse(data) {
        Ok(header) => header,
        Err(NetError::Truncated { need, got }) => {
            assert!(data.len() < HEADER_LEN);
            assert_eq!((need, got), (HEADER_LEN as u64, data.len() as u64));
            return;
        }
        Err(NetError::BadMagic | NetError::UnknownKind(_)) => return,
        Err(e) => panic!("header parse gave an unexpected error: {e}"),
    };
    // Accepted headers are canonical: they encode back to the same bytes.
    assert_eq!(header.encode()[..], data[..HEADER_LEN]);

    // The limit comes from the input too, so both sides of it are reached.
    let max = u64::from(data[HEADER_LEN - 1]) << 4;
    match FrameRef::split(data, max) {
        Ok((frame, rest)) => {
            assert_eq!(frame.header, header);
            assert!(header.len <= max);
            assert_eq!(frame.payload.len() as u64, header.len);
            assert_eq!(HEADER_LEN + frame.payload.len() + rest.len(), data.len());
            let wire = encode_frame(header.kind, header.step, frame.payload);
            assert_eq!(wire[..], data[..wire.len()]);
        }
        Err(NetError::TooLarge { len, max: limit }) => {
            assert_eq!(len, header.len);
            assert!(len > limit && limit <= max);
        }
        Err(NetError::Truncated { need, got }) => {
            assert_eq!(got, data.len() as u64);
            assert!(need > got);
        }
        Err(e) => panic!("frame split gave an unexpected error: {e}"),
    }
}
