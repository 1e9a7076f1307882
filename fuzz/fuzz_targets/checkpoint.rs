//! A Hugging Face model folder's `config.json` and `model.safetensors` on
//! arbitrary bytes, loaded as `suffuse` loads a folder: every input gets a
//! model or a `ModelError`, never a panic or an allocation the input cannot
//! back. The first byte picks what the rest replaces: `config.json`, the
//! whole safetensors file, or only its JSON header (the length prefix
//! recomputed, the genuine tensor bytes after it), the last so the fuzzer
//! mutates header text rather than the length in front of it. A fourth
//! mode makes the rest `model.safetensors.index.json` of the folder saved
//! as one shard; there a shard name that is a folder (the fixture's
//! `1_Pooling`) may end in an I/O error, which is a typed error too.

#![no_main]

use libfuzzer_sys::fuzz_target;
use suffuse_host::fuzzing::{genuine_safetensors, load_checkpoint, load_sharded};
use suffuse_host::model::{ModelError, Transformer};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let loaded = match mode % 4 {
        0 => load_checkpoint(Some(rest), None),
        1 => load_checkpoint(None, Some(rest)),
        2 => load_checkpoint(None, Some(&with_header(rest))),
        _ => match load_sharded(rest) {
            Err(ModelError::Io { .. }) => return,
            other => other,
        },
    };
    match loaded {
        Ok(Transformer::Encoder(m)) => {
            m.config.check().expect("a loaded encoder's config is valid");
            assert_eq!(m.embeddings.word.len(), m.config.vocab_size * m.config.hidden);
        }
        Ok(Transformer::Decoder(d)) => {
            d.config.check().expect("a loaded decoder's config is valid");
        }
        Err(ModelError::Io { path, error }) => {
            panic!("{}: an I/O error on a written folder: {error}", path.display())
        }
        Err(_) => {}
    }
});

/// The genuine safetensors file with its JSON header replaced by `header`.
fn with_header(header: &[u8]) -> Vec<u8> {
    let genuine = genuine_safetensors();
    let old = u64::from_le_bytes(genuine[..8].try_into().unwrap_or_default());
    let data = genuine.get(8 + old as usize..).unwrap_or_default();
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header);
    file.extend_from_slice(data);
    file
}
