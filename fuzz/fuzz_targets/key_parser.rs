//! `parse_key_batch` on arbitrary bytes: it must answer every input with a
//! view or a `WireError`, and a view must be exactly what the header says.

#![no_main]

use libfuzzer_sys::fuzz_target;
use suffuse_core::wire::{KEY_HEADER_LEN, key_batch_len, parse_key_batch, write_key_header};

fuzz_target!(|data: &[u8]| {
    let Ok(batch) = parse_key_batch(data) else {
        return;
    };
    let params = batch.params();
    // Accepted input is exactly a header and `count` whole keys, and the
    // header is the canonical one for what was parsed.
    assert_eq!(key_batch_len(&params, batch.count()), Some(data.len()));
    assert_eq!(
        write_key_header(&params, batch.party(), batch.count())[..],
        data[..KEY_HEADER_LEN]
    );
    assert_eq!(batch.bytes(), Some(&data[KEY_HEADER_LEN..]));
    assert_eq!(
        batch.bytes().map(<[u8]>::len),
        Some(batch.count() * params.key_len())
    );
});
