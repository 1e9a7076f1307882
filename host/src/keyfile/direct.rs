//! A key file written around the page cache (`O_DIRECT`).
//!
//! Writing a key file through the page cache costs the dealer's CPU twice:
//! the kernel copies every byte into a cache page (`copy_folio_from_iter`,
//! 52 % of BERT-base's dealer samples) and first zeroes each new page (9 %).
//! With `O_DIRECT` the device reads the bytes from our buffer instead
//! (docs/BACKENDS.md, twenty-third session). Direct writes must start at,
//! and span, whole blocks of [`ALIGN`] bytes from an aligned buffer, so
//! the bytes gather in one buffer of [`CHUNK`] bytes and go out a chunk
//! at a time; the file's last partial block goes through the ordinary
//! handle the file was created with, which then syncs the whole file.
//!
//! The buffer is carved out of a plain `Vec` at an aligned offset (no
//! custom allocation) and wiped when the writer is dropped: it holds key
//! bytes.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use zeroize::Zeroize;

/// Block size direct writes are aligned to (every Linux file system's
/// logical block divides it).
const ALIGN: usize = 4096;

/// Bytes gathered before a direct write.
const CHUNK: usize = 8 << 20;

/// The writer: a second handle on the file opened with `O_DIRECT`, the
/// handle the file was created with, and the buffer.
pub(super) struct DirectOut {
    direct: File,
    plain: File,
    raw: Vec<u8>,
    /// Where the aligned buffer starts in `raw`.
    start: usize,
    /// Bytes gathered.
    len: usize,
    /// The file offset of the buffer's first byte.
    at: u64,
}

impl DirectOut {
    /// Opens `path` (just created, empty, as `plain`) a second time for
    /// direct writes; gives `plain` back when the file system refuses
    /// `O_DIRECT` (tmpfs, some network file systems), and the caller
    /// writes through the page cache.
    pub(super) fn open(path: &Path, plain: File) -> Result<DirectOut, File> {
        let Ok(flags) = i32::try_from(rustix::fs::OFlags::DIRECT.bits()) else {
            return Err(plain);
        };
        let Ok(direct) = OpenOptions::new()
            .write(true)
            .custom_flags(flags)
            .open(path)
        else {
            return Err(plain);
        };
        let raw = vec![0u8; CHUNK + ALIGN];
        let start = (ALIGN - raw.as_ptr() as usize % ALIGN) % ALIGN;
        Ok(DirectOut {
            direct,
            plain,
            raw,
            start,
            len: 0,
            at: 0,
        })
    }

    /// Appends `bytes`, writing each chunk out as it fills.
    pub(super) fn write_all(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            let n = (CHUNK - self.len).min(bytes.len());
            let at = self.start + self.len;
            self.raw[at..at + n].copy_from_slice(&bytes[..n]);
            self.len += n;
            bytes = &bytes[n..];
            if self.len == CHUNK {
                self.write_out(CHUNK)?;
            }
        }
        Ok(())
    }

    /// Writes the first `n` gathered bytes (whole blocks) directly and
    /// moves the rest to the buffer's front.
    fn write_out(&mut self, n: usize) -> io::Result<()> {
        debug_assert!(n.is_multiple_of(ALIGN) && n <= self.len);
        let start = self.start;
        self.direct
            .write_all_at(&self.raw[start..start + n], self.at)?;
        self.at += n as u64;
        self.raw.copy_within(start + n..start + self.len, start);
        self.len -= n;
        Ok(())
    }

    /// Writes what is left (whole blocks directly, the last partial block
    /// through the plain handle) and syncs the file.
    pub(super) fn finish(&mut self) -> io::Result<()> {
        let whole = self.len - self.len % ALIGN;
        if whole > 0 {
            self.write_out(whole)?;
        }
        let start = self.start;
        self.plain
            .write_all_at(&self.raw[start..start + self.len], self.at)?;
        self.at += self.len as u64;
        self.len = 0;
        self.plain.sync_all()
    }
}

impl Drop for DirectOut {
    fn drop(&mut self) {
        self.raw.zeroize();
    }
}
