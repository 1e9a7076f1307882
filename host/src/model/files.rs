//! Reading a model's files whole, with memory bounded by what the file
//! really holds: `std::fs::read` reserves the size the file claims, and a
//! sparse file claims any size for free (a 1 TiB hole costs a few KB of
//! disk), so a wrong model file could exhaust memory before any check ran
//! (issue 27).

use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Files at least this large are checked for holes.
const SPARSE_CHECK_FROM: u64 = 1 << 20;

/// A file whose allocated blocks cover less than this share of its length
/// is taken for sparse (a model file is dense; a compressing filesystem
/// shrinks quantized weights far less than this).
const MIN_ALLOCATED_SHARE: u64 = 8;

fn invalid(what: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what)
}

/// The whole of `path`, refused with a typed error instead of read when it
/// is not a regular file (a FIFO would block the open), when it is sparse,
/// or when its length cannot be allocated (a memory limit).
pub fn read_whole(path: &Path) -> std::io::Result<Vec<u8>> {
    let nonblock = rustix::fs::OFlags::NONBLOCK.bits();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(i32::try_from(nonblock).unwrap_or(0))
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(invalid("not a regular file".into()));
    }
    let len = meta.len();
    if len >= SPARSE_CHECK_FROM && meta.blocks().saturating_mul(512) < len / MIN_ALLOCATED_SHARE {
        return Err(invalid(format!(
            "a sparse file: it claims {len} bytes but holds {} on disk; a model file holds its bytes",
            meta.blocks().saturating_mul(512)
        )));
    }
    let want =
        usize::try_from(len).map_err(|_| invalid(format!("{len} bytes do not fit memory")))?;
    let mut bytes = Vec::new();
    bytes.try_reserve_exact(want).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::OutOfMemory,
            format!("cannot allocate {len} bytes to read it (a memory limit?)"),
        )
    })?;
    // Never more than the length checked above, if the file grows.
    file.take(len).read_to_end(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn sparse_files_and_fifos_are_refused_and_dense_ones_read() {
        let d = std::env::temp_dir().join(format!("suffuse-model-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let sparse = d.join("model.safetensors");
        std::fs::write(&sparse, b"{}").unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&sparse)
            .unwrap()
            .set_len(1 << 40)
            .unwrap();
        let t = std::time::Instant::now();
        let e = read_whole(&sparse).unwrap_err();
        assert!(e.to_string().contains("sparse"), "{e}");
        assert!(t.elapsed().as_secs() < 5);
        let fifo = d.join("fifo.gguf");
        assert!(
            std::process::Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap()
                .success()
        );
        assert!(
            read_whole(&fifo)
                .unwrap_err()
                .to_string()
                .contains("regular")
        );
        let dense = d.join("config.json");
        std::fs::write(&dense, vec![7u8; 3 << 20]).unwrap();
        assert_eq!(read_whole(&dense).unwrap().len(), 3 << 20);
        let _ = std::fs::remove_dir_all(&d);
    }
}
