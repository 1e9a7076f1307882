//! GGUF headers on arbitrary bytes: every input gets a parsed file or a
//! `GgufError`, never a panic or an allocation the input cannot back, and
//! every tensor of an accepted file lies inside it and dequantizes to
//! exactly its element count; a matrix left in the file (`Stored`, as a
//! kept decoder holds it) reads as the whole tensor does, row by row and
//! transposed.

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::Arc;

use suffuse_host::model::gguf::{Gguf, GgufError, Stored};

fuzz_target!(|data: &[u8]| {
    check(data.to_vec());
    // The magic and a version are needles the fuzzer would rarely find, so
    // every input also goes in behind them, to reach counts and metadata.
    let mut prefixed = b"GGUF\x03\0\0\0".to_vec();
    prefixed.extend_from_slice(data);
    check(prefixed);
});

fn check(data: Vec<u8>) {
    let len = data.len();
    match Gguf::from_bytes(data) {
        Ok(g) => {
            let g = Arc::new(g);
            for t in g.tensors() {
                assert!(t.start + t.len <= len);
                match g.dequantize(&t.name) {
                    Ok(values) => {
                        assert_eq!(values.len() as u64, t.elements());
                        stored(&g, &t.name, &t.dims, &values);
                    }
                    Err(GgufError::Unsupported { .. }) => {}
                    Err(e) => panic!("dequantizing an accepted tensor failed: {e}"),
                }
            }
        }
        Err(GgufError::Io { .. }) => panic!("parsing bytes reported an I/O error"),
        Err(_) => {}
    }
}

/// A 2-D tensor as a stored matrix: its rows in file order and its values
/// transposed are the whole tensor's `values`, bit for bit.
fn stored(g: &Arc<Gguf>, name: &str, dims: &[u64], values: &[f32]) {
    let [inputs, outputs] = dims else { return };
    let (Ok(inputs), Ok(outputs)) = (usize::try_from(*inputs), usize::try_from(*outputs)) else {
        return;
    };
    let s = Stored::new(g, name, inputs, outputs).expect("a supported 2-D tensor stays in its file");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let mut rows = Vec::with_capacity(values.len());
    s.for_each_row(|row| rows.extend_from_slice(row));
    assert_eq!(bits(&rows), bits(values));
    let t = s.values();
    for (o, row) in values.chunks_exact(inputs.max(1)).enumerate().take(4) {
        assert_eq!(bits(&s.row(o).expect("a row")), bits(row));
        for (i, v) in row.iter().enumerate() {
            assert_eq!(t[i * outputs + o].to_bits(), v.to_bits());
        }
    }
    assert!(s.row(outputs).is_none());
}
