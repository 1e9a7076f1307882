//! Key sections mapped read-only, in place of being copied.
//!
//! Reading a section copies it out of the page cache into a zeroed heap
//! buffer, whose fresh pages the kernel zeroes first; on the 2-core
//! development machine that copy and those first touches were about a
//! tenth of the online phase's CPU samples (docs/BACKENDS.md, eleventh
//! session). A mapped section is hashed and evaluated where the page cache
//! holds it.
//!
//! This is the one module of the host library that may use `unsafe`
//! (`xtask audit` holds it to that), for one call: `mmap`. Mapping a file
//! is sound only while nothing else writes to it or truncates it; a write
//! would change bytes under a `&[u8]`, and a truncation turns a read into
//! `SIGBUS`. What makes that hold:
//! - [`mappable`] keeps a file that another user (root aside) could write
//!   to on the copying path, so the digest still stops a
//!   writer who cannot read the file, as the format promises;
//! - key files are created 0600 in a 0700 directory, and a server unlinks
//!   its file when it spends the key set, before the first message that
//!   depends on it;
//! - key bytes are secrets, and secrets never steer a branch or an index
//!   (`xtask ct`), so a byte changed under the evaluator by a process of
//!   the server's own user changes values only, never control flow or an
//!   address.
//!
//! The residual risk, written down in docs/DEPLOY.md: the server's own user
//! truncating the file during a query, or the disk failing a read of a page
//! evicted after it was hashed, stops the server with `SIGBUS` where a
//! copying read would have returned an error.

#![allow(unsafe_code)]

use std::fs::File;
use std::os::unix::fs::MetadataExt;

use memmap2::{Mmap, MmapOptions};

/// Sections shorter than this are copied: a mapping costs two system
/// calls and page-table work that a short copy does not.
pub(super) const MAP_FROM: usize = 1 << 20;

/// One section's payload, mapped read-only (memmap2 rounds the offset
/// down to a page and hides the difference).
pub(super) struct Mapped(Mmap);

impl Mapped {
    /// Maps the `len` bytes at `at` of `file`, paged in by the kernel
    /// before it returns (`MAP_POPULATE`), so the evaluator takes no page
    /// faults on them. `file` passed [`mappable`], and the caller holds
    /// `at + len` within the file's size as walked at open.
    pub(super) fn section(file: &File, at: u64, len: usize) -> std::io::Result<Mapped> {
        // SAFETY: a read-only shared mapping of a file that no other user
        // can write to (`mappable`, checked at open) and that
        // this process never writes to; see the module's documentation for
        // what the server's own user must not do meanwhile.
        let map = unsafe {
            MmapOptions::new()
                .offset(at)
                .len(len)
                .populate()
                .map(file)?
        };
        Ok(Mapped(map))
    }

    /// The payload.
    pub(super) fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Whether `file` may be mapped: a regular file that no user other than
/// this process's (root aside) may write to, that is, owned by this user
/// and without group or other write permission.
pub(super) fn mappable(file: &File) -> bool {
    file.metadata().is_ok_and(|m| {
        m.is_file() && m.mode() & 0o022 == 0 && m.uid() == rustix::process::geteuid().as_raw()
    })
}
