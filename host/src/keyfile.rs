//! Key files: one per party per dealer run, written and read as streams.
//!
//! ```text
//! header   magic "SUFFKEYS" · version u32 · party u8 · 3 reserved bytes (0)
//!          plan hash [32] · key-set id [16] · steps u32
//!          summary length u32 · summary (UTF-8 JSON, ≤ 64 KiB)
//! section  per step, in order: magic "SECT" · step u32 · length u64 · payload
//!          · digest [32]
//! end      magic "DONE" · steps u32
//! ```
//!
//! Integrity: each section's digest is BLAKE3 over the previous digest
//! (for the first section, the BLAKE3 of the header bytes), the step, the
//! length and the payload. A server checks it as it streams the section,
//! before any key in it is used, so a flipped bit, a truncated, reordered
//! or spliced section, or a header from another file stops the query
//! before an output share leaves the server. It guards against accidents
//! and against anyone who can write but not read the file; one who can
//! read a key file holds its secrets already.
//!
//! A server maps sections of 1 MiB or more instead of copying them out of
//! the page cache, where the file is its user's own and no other user may
//! write to it; each is hashed where it lies, before use, as a read one is.
//! Anyone else's file is read as before. `mapped` says what mapping
//! assumes and what it risks.
//!
//! All integers are little-endian. The summary names the model and the
//! shape, so a server can rebuild the plan from the file and compare
//! hashes before any work. Section payloads are laid out by
//! [`crate::proto`]; their lengths follow from the plan and are checked
//! before a payload is read, so a corrupt length can neither over-allocate
//! nor desynchronize the stream. The key-set id is random per dealer run:
//! the two servers compare theirs before starting, and a spent key set is
//! refused by id ([`crate::ledger`]), whatever its file is called.
//!
//! Opening a file walks its section headers (not their payloads) to the
//! end marker, so a file cut short or grown is refused at once, before any
//! round and before its key set is spent; [`KeyReader::check`] then holds
//! that section table against the plan's.
//!
//! Files are created 0600 and never overwritten: a dealer run that finds a
//! key file in its way stops. A file is written back to disk while it is
//! being written (every 64 MiB, by a thread of its own) and fsync'd when
//! finished, so the dealer returns once both files are durable without
//! waiting for all of them at the end.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Cursor, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{SyncSender, sync_channel};

use blake3::Hasher as Chain;

mod direct;
mod mapped;

use crate::ledger::{Ledger, LedgerError};
use crate::wipe::Wiped;
use mapped::Mapped;

use serde::{Deserialize, Serialize};

/// File magic.
pub const MAGIC: [u8; 8] = *b"SUFFKEYS";
/// Format version: 2 added the section digests (SHA-256); 3 made them
/// BLAKE3, 2.2× faster on AVX2 (SHA-NI 1.58 GB/s, BLAKE3 3.55 GB/s on the
/// development machine), where hashing was a fifth of the online phase.
pub const VERSION: u32 = 3;
pub(crate) const SECTION: [u8; 4] = *b"SECT";
pub(crate) const END: [u8; 4] = *b"DONE";
/// Longest summary accepted.
pub const MAX_SUMMARY: usize = 64 * 1024;

/// What a key file says about itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// The model's name.
    pub model: String,
    /// The model's digest (hex).
    pub model_digest: String,
    /// Sentences per run.
    pub batch: usize,
    /// Tokens per sentence (a decoder's prompt bucket).
    pub seq: usize,
    /// A decoder's decode passes after the prefill (0 for an encoder).
    #[serde(default)]
    pub decode_steps: usize,
}

impl Summary {
    /// The shape the keys were dealt for.
    pub fn shape(&self) -> crate::plan::Shape {
        crate::plan::Shape {
            batch: self.batch,
            seq: self.seq,
            decode_steps: self.decode_steps,
        }
    }
}

/// A key file's header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// 0 or 1.
    pub party: u8,
    /// The plan's hash.
    pub plan_hash: [u8; 32],
    /// Random per dealer run.
    pub key_set: [u8; 16],
    /// Sections that follow.
    pub steps: u32,
    /// Model and shape.
    pub summary: Summary,
}

/// Why a key file cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyFileError {
    /// Not a key file.
    #[error("{path}: not a suffuse key file (bad magic)")]
    BadMagic {
        /// The file.
        path: PathBuf,
    },
    /// Written by another format version.
    #[error(
        "{path}: key file format version {found}, this build reads version {VERSION} (deal new \
         keys with this build)"
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// Its version.
        found: u32,
    },
    /// A malformed header field.
    #[error("{path}: malformed header: {what}")]
    Header {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// The file ends early.
    #[error("{path}: truncated while reading {what}")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// What was being read.
        what: String,
    },
    /// The file is shorter than its own sections say: found when it is
    /// opened, before any key in it is used or spent.
    #[error(
        "{path}: the file is cut short: it has {size} bytes, but {what} ends at byte {need} \
         (copy it again whole, or deal new keys)"
    )]
    Short {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// Where the part reaches.
        need: u64,
        /// The part that does not fit.
        what: String,
    },
    /// A section that is not the one the plan expects.
    #[error("{path}: section {found} where step {want} was expected")]
    Step {
        /// The file.
        path: PathBuf,
        /// Expected step.
        want: u32,
        /// Found.
        found: u32,
    },
    /// A section of the wrong length.
    #[error("{path}: step {step} has {found} bytes of keys, the plan needs {want}")]
    Length {
        /// The file.
        path: PathBuf,
        /// The step.
        step: u32,
        /// Needed.
        want: u64,
        /// Found.
        found: u64,
    },
    /// A section whose digest does not match: the file was corrupted.
    #[error("{path}: step {step}'s keys are corrupt (their digest does not match)")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The step.
        step: u32,
    },
    /// Bytes where the end marker should be, or a missing end marker.
    #[error("{path}: {what}")]
    Trailer {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// The key file was made for another plan.
    #[error(
        "{path}: these keys were dealt for plan {found}, but this model and shape give plan \
         {want} (a different model, sequence length or suffuse version)"
    )]
    PlanMismatch {
        /// The file.
        path: PathBuf,
        /// This party's plan hash.
        want: String,
        /// The file's.
        found: String,
    },
    /// The keys are for the other party.
    #[error("{path}: these are party {found}'s keys, not party {want}'s")]
    Party {
        /// The file.
        path: PathBuf,
        /// Expected.
        want: u8,
        /// Found.
        found: u8,
    },
    /// The key set was spent before, or the ledger failed.
    #[error("{path}: {error}")]
    Spent {
        /// The file.
        path: PathBuf,
        /// The ledger's answer.
        error: LedgerError,
    },
    /// A file where the dealer would write a key file: key sets are never
    /// overwritten.
    #[error("{path}: a key file is already there; deal into an empty folder")]
    Exists {
        /// The file.
        path: PathBuf,
    },
    /// I/O.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
}

impl KeyFileError {
    /// What a peer or a client is told of this error: its kind, without
    /// the file's path or the ledger's (the server's log has the whole
    /// error).
    pub fn summary(&self) -> &'static str {
        match self {
            KeyFileError::Corrupt { .. } => "a section of its key file is corrupt",
            KeyFileError::Spent { .. } => "its key set is spent, or its ledger failed",
            KeyFileError::PlanMismatch { .. } | KeyFileError::Party { .. } => {
                "its key file is for another plan or party"
            }
            KeyFileError::Io { .. } => "its key file could not be read",
            _ => "its key file is malformed",
        }
    }
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> KeyFileError + '_ {
    move |source| KeyFileError::Io {
        path: path.to_path_buf(),
        error: source,
    }
}

/// Writes one party's key file.
pub struct KeyWriter {
    out: Out,
    path: PathBuf,
    next: u32,
    steps: u32,
    bytes: u64,
    /// The digest of the previous section (or of the header).
    chain: [u8; 32],
    /// The open section's digest so far and its bytes still to come.
    open: Option<(Chain, u64)>,
}

/// Where a key file's bytes go: around the page cache where the file
/// system allows ([`direct`]), else through it, written back as they
/// come ([`WriteBehind`]).
enum Out {
    Direct(Box<direct::DirectOut>),
    Cached(BufWriter<File>, WriteBehind),
}

impl Out {
    /// `file` (just created), written directly if `direct` and the file
    /// system allows, else through the page cache written back every
    /// `every` bytes.
    fn new(path: &Path, file: File, direct: bool, every: u64) -> Out {
        let file = match direct {
            true => match direct::DirectOut::open(path, file) {
                Ok(d) => return Out::Direct(Box::new(d)),
                Err(file) => file,
            },
            false => file,
        };
        let behind = WriteBehind::new(&file, every);
        Out::Cached(BufWriter::with_capacity(1 << 20, file), behind)
    }

    fn write_all(&mut self, bytes: &[u8], written: u64) -> std::io::Result<()> {
        match self {
            Out::Direct(d) => d.write_all(bytes),
            Out::Cached(out, behind) => {
                out.write_all(bytes)?;
                behind.wrote(written);
                Ok(())
            }
        }
    }

    /// Writes everything out and syncs the file.
    fn finish(&mut self) -> std::io::Result<()> {
        match self {
            Out::Direct(d) => d.finish(),
            Out::Cached(out, behind) => {
                out.flush()?;
                behind.finish()?;
                out.get_ref().sync_all()
            }
        }
    }
}

/// Bytes a key file gathers in the page cache before [`WriteBehind`] is
/// asked to write them back.
const WRITE_BEHIND: u64 = 64 << 20;

/// Writes a file back to disk while it is still being written, on a thread
/// of its own (`fdatasync` on a second handle), so that the final
/// `fsync` waits for the last few MiB instead of the whole file. Without
/// it the kernel started writing a MiniLM-128 key file only once a tenth
/// of memory was dirty, and the two final `fsync`s took 2.4–2.5 s of the
/// dealer's 10–11 s on the development machine's disk (408 MB/s through
/// the page cache). A sync already queued absorbs further nudges.
struct WriteBehind {
    nudge: Option<SyncSender<()>>,
    /// Returns how many syncs it ran, or its first error.
    syncer: Option<std::thread::JoinHandle<std::io::Result<u64>>>,
    every: u64,
    /// `put` bytes when the syncer was last nudged.
    nudged_at: u64,
}

impl WriteBehind {
    /// Starts the syncer on a second handle of `file`, to be nudged every
    /// `every` bytes; if no thread can be had, the final `fsync` does all
    /// the work, as before.
    fn new(file: &File, every: u64) -> WriteBehind {
        let (nudge, nudges) = sync_channel::<()>(1);
        let syncer = file.try_clone().ok().and_then(|f| {
            let t = std::thread::Builder::new().name("key-file sync".into());
            t.spawn(move || {
                nudges
                    .iter()
                    .try_fold(0, |n, ()| f.sync_data().map(|()| n + 1))
            })
            .ok()
        });
        WriteBehind {
            nudge: syncer.as_ref().map(|_| nudge),
            syncer,
            every,
            nudged_at: 0,
        }
    }

    /// Nudges the syncer once another `every` bytes have been put.
    fn wrote(&mut self, bytes: u64) {
        if bytes - self.nudged_at >= self.every {
            self.nudged_at = bytes;
            if let Some(n) = &self.nudge {
                // Full: a sync is queued and will cover these bytes too.
                // Gone: the syncer failed, and `finish` reports why.
                let _ = n.try_send(());
            }
        }
    }

    /// Stops the syncer and returns how many syncs it ran, or its first
    /// error. A background `fdatasync` takes the file's write-back error
    /// for itself (the two handles share one open file description), so it
    /// must surface here.
    fn finish(&mut self) -> std::io::Result<u64> {
        self.nudge = None;
        match self.syncer.take().map(std::thread::JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(std::io::Error::other("the key file's sync thread panicked")),
            None => Ok(0),
        }
    }
}

impl std::fmt::Debug for KeyWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyWriter")
            .field("path", &self.path)
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl KeyWriter {
    /// Creates the file (mode 0600; never over an existing one) and writes
    /// the header.
    pub fn create(path: &Path, header: &Header) -> Result<KeyWriter, KeyFileError> {
        KeyWriter::create_with(path, header, false, WRITE_BEHIND)
    }

    /// [`KeyWriter::create`] for a file kept for later: written around the
    /// page cache where the file system allows (`direct`), which spares
    /// the dealer's CPU the kernel's copy and leaves no cached copy behind
    /// (a server started soon after on the same machine then reads the
    /// file from the disk).
    pub fn create_direct(path: &Path, header: &Header) -> Result<KeyWriter, KeyFileError> {
        KeyWriter::create_with(path, header, true, WRITE_BEHIND)
    }

    /// [`KeyWriter::create`], written directly if `direct` (and the file
    /// system allows), else through the page cache and written back every
    /// `every` bytes.
    fn create_with(
        path: &Path,
        header: &Header,
        direct: bool,
        every: u64,
    ) -> Result<KeyWriter, KeyFileError> {
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => KeyFileError::Exists {
                    path: path.to_path_buf(),
                },
                _ => io(path)(e),
            })?;
        let mut out = Out::new(path, file, direct, every);
        let summary = serde_json::to_vec(&header.summary).map_err(|e| KeyFileError::Header {
            path: path.to_path_buf(),
            what: e.to_string(),
        })?;
        let mut h = Vec::with_capacity(80 + summary.len());
        h.extend_from_slice(&MAGIC);
        h.extend_from_slice(&VERSION.to_le_bytes());
        h.extend_from_slice(&[header.party, 0, 0, 0]);
        h.extend_from_slice(&header.plan_hash);
        h.extend_from_slice(&header.key_set);
        h.extend_from_slice(&header.steps.to_le_bytes());
        h.extend_from_slice(&(summary.len() as u32).to_le_bytes());
        h.extend_from_slice(&summary);
        out.write_all(&h, h.len() as u64).map_err(io(path))?;
        Ok(KeyWriter {
            out,
            path: path.to_path_buf(),
            next: 0,
            steps: header.steps,
            bytes: h.len() as u64,
            chain: blake3::hash(&h).into(),
            open: None,
        })
    }

    /// Starts the next step's section of `len` bytes; the caller then
    /// writes exactly `len` bytes with [`KeyWriter::write`].
    pub fn section(&mut self, step: u32, len: u64) -> Result<(), KeyFileError> {
        self.check_closed()?;
        if step != self.next || step >= self.steps {
            return Err(KeyFileError::Step {
                path: self.path.clone(),
                want: self.next,
                found: step,
            });
        }
        self.next += 1;
        let mut h = [0u8; 16];
        h[..4].copy_from_slice(&SECTION);
        h[4..8].copy_from_slice(&step.to_le_bytes());
        h[8..].copy_from_slice(&len.to_le_bytes());
        self.put(&h)?;
        self.open = Some((section_digest(&self.chain, step, len), len));
        self.write(&[])
    }

    /// Appends payload bytes to the open section; the section's digest
    /// follows its last byte.
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), KeyFileError> {
        let Some((hash, left)) = &mut self.open else {
            return match bytes.is_empty() {
                true => Ok(()),
                false => Err(self.overrun()),
            };
        };
        *left = left
            .checked_sub(bytes.len() as u64)
            .ok_or_else(|| KeyFileError::Trailer {
                path: self.path.clone(),
                what: format!("step {} written past its length", self.next - 1),
            })?;
        hash.update(bytes);
        let done = *left == 0;
        self.put(bytes)?;
        if done && let Some((hash, _)) = self.open.take() {
            self.chain = hash.finalize().into();
            let digest = self.chain;
            self.put(&digest)?;
        }
        Ok(())
    }

    fn put(&mut self, bytes: &[u8]) -> Result<(), KeyFileError> {
        self.bytes += bytes.len() as u64;
        self.out
            .write_all(bytes, self.bytes)
            .map_err(io(&self.path))
    }

    fn overrun(&self) -> KeyFileError {
        KeyFileError::Trailer {
            path: self.path.clone(),
            what: "bytes written outside a section".into(),
        }
    }

    fn check_closed(&self) -> Result<(), KeyFileError> {
        match &self.open {
            Some(_) => Err(KeyFileError::Truncated {
                path: self.path.clone(),
                what: format!("step {}'s keys (not all written)", self.next - 1),
            }),
            None => Ok(()),
        }
    }

    /// Writes the end marker and flushes; returns the file's size.
    pub fn finish(mut self) -> Result<u64, KeyFileError> {
        self.check_closed()?;
        let mut t = [0u8; 8];
        t[..4].copy_from_slice(&END);
        t[4..].copy_from_slice(&self.steps.to_le_bytes());
        self.put(&t)?;
        self.out.finish().map_err(io(&self.path))?;
        Ok(self.bytes)
    }
}

/// Reads one party's key file, section by section.
pub struct KeyReader {
    /// Unbuffered: a read-ahead buffer would hold key bytes that nothing
    /// wipes. Payloads are read straight into their wiped section buffers
    /// or mapped; headers and digests cost a few small reads per section.
    input: Box<dyn ReadSeek>,
    /// A second handle on the file for mapping sections, where it may be
    /// mapped ([`mapped::mappable`]).
    mapping: Option<File>,
    /// Sections of at least this many bytes are mapped.
    map_from: usize,
    /// The path it was opened by, for messages.
    path: PathBuf,
    /// The file itself, links resolved: what spending deletes.
    real: PathBuf,
    /// `path`, if it is a symbolic link to `real`: deleted after it.
    link: Option<PathBuf>,
    /// The file's metadata at open (none for a file in memory).
    meta: Option<std::fs::Metadata>,
    /// The header.
    pub header: Header,
    next: u32,
    /// The digest of the previous section (or of the header).
    chain: [u8; 32],
    /// Each section's length, in step order, from the walk at open.
    table: Vec<u64>,
}

/// Why [`open_regular`] refused.
enum Opened {
    Io(std::io::Error),
    NotRegular,
}

/// Opens `real` (a path with no link in it) for reading: non-blocking, so
/// that a FIFO or a device in a key file's place is refused instead of
/// blocking the open (issue 27), and not following a link swapped in
/// since it was resolved. Both flags change nothing for a regular file.
fn open_regular(real: &Path) -> Result<File, Opened> {
    use std::os::unix::fs::OpenOptionsExt;
    let flags = (rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOFOLLOW).bits();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(i32::try_from(flags).unwrap_or(0))
        .open(real)
        .map_err(Opened::Io)?;
    match file.metadata() {
        Ok(m) if m.is_file() => Ok(file),
        Ok(_) => Err(Opened::NotRegular),
        Err(e) => Err(Opened::Io(e)),
    }
}

/// Bytes read and hashed at a time: a piece is hashed while it is in L2.
const READ_PIECE: usize = 256 * 1024;

/// A checked section's payload: read into a buffer, which may be longer
/// than the payload (a spent section's, reused) and is wiped whole when
/// dropped, or mapped from the file. It derefs to the payload alone.
pub struct Section(Payload);

enum Payload {
    Read { buf: Wiped, len: usize },
    Mapped(Mapped),
}

impl Default for Section {
    fn default() -> Section {
        Section(Payload::Read {
            buf: Wiped::default(),
            len: 0,
        })
    }
}

impl Section {
    /// The buffer, for the next [`KeyReader::section_in`]; a mapped
    /// section is unmapped and leaves none.
    pub fn into_buffer(self) -> Wiped {
        match self.0 {
            Payload::Read { buf, .. } => buf,
            Payload::Mapped(_) => Wiped::default(),
        }
    }

    /// Whether the payload is mapped from the file rather than read.
    #[cfg(test)]
    fn is_mapped(&self) -> bool {
        matches!(self.0, Payload::Mapped(_))
    }
}

impl std::ops::Deref for Section {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Payload::Read { buf, len } => &buf[..*len],
            Payload::Mapped(m) => m.bytes(),
        }
    }
}

/// What a key reader reads from: a file, or bytes in memory.
trait ReadSeek: Read + Seek + Send {}
impl<R: Read + Seek + Send> ReadSeek for R {}

impl std::fmt::Debug for KeyReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyReader")
            .field("path", &self.path)
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

impl KeyReader {
    /// Opens a key file, reads its header and walks its sections to the end
    /// marker: a file cut short, grown, or with a section out of place is
    /// refused here.
    ///
    /// Links are resolved: spending deletes the file itself, and then the
    /// link (a spent link's target would otherwise stay on disk).
    pub fn open(path: &Path) -> Result<KeyReader, KeyFileError> {
        let real = std::fs::canonicalize(path).map_err(io(path))?;
        let file = open_regular(&real).map_err(|e| match e {
            Opened::Io(e) => io(path)(e),
            Opened::NotRegular => KeyFileError::Header {
                path: path.to_path_buf(),
                what: "not a regular file (a key file is one)".into(),
            },
        })?;
        let meta = file.metadata().map_err(io(path))?;
        let mapping = if mapped::mappable(&file) {
            file.try_clone().ok()
        } else {
            None
        };
        let mut reader = KeyReader::walked(path, file)?;
        reader.mapping = mapping;
        let is_link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
        reader.link = is_link.then(|| path.to_path_buf());
        reader.real = real;
        reader.meta = Some(meta);
        Ok(reader)
    }

    /// [`KeyReader::open`] for a file that is to be served: one that others
    /// may read or write is refused, one its group may is opened with a
    /// warning ([`crate::private::check_file`]). `inspect` reads any.
    pub fn open_to_serve(path: &Path) -> Result<KeyReader, KeyFileError> {
        let reader = KeyReader::open(path)?;
        if let Some(meta) = &reader.meta
            && let Some(w) = crate::private::check_file(path, meta).map_err(io(path))?
        {
            crate::private::warn(&w);
        }
        Ok(reader)
    }

    /// Reads a key file held in memory as [`KeyReader::open`] reads one on
    /// disk; `name` stands for its path in errors.
    pub fn from_bytes(name: &Path, bytes: Vec<u8>) -> Result<KeyReader, KeyFileError> {
        KeyReader::walked(name, Cursor::new(bytes))
    }

    fn walked<R: Read + Seek + Send + 'static>(
        path: &Path,
        mut input: R,
    ) -> Result<KeyReader, KeyFileError> {
        let size = input.seek(SeekFrom::End(0)).map_err(io(path))?;
        input.rewind().map_err(io(path))?;
        let (header, chain) = read_header(&mut input, path)?;
        let start = input.stream_position().map_err(io(path))?;
        let table = walk(&mut input, start, size, header.steps, path)?;
        input.seek(SeekFrom::Start(start)).map_err(io(path))?;
        Ok(KeyReader {
            input: Box::new(input),
            mapping: None,
            map_from: mapped::MAP_FROM,
            path: path.to_path_buf(),
            real: path.to_path_buf(),
            link: None,
            meta: None,
            header,
            next: 0,
            chain,
            table,
        })
    }

    /// Opens a key file that is to be consumed: refuses a key set that
    /// `ledger` records as spent by `party`. Opening does not spend it;
    /// [`KeyReader::spend`] does, once both servers hold the query's input,
    /// so a query that fails before any masked value leaves this server (a
    /// wrong client, a mismatched peer) costs no keys.
    pub fn open_unspent(path: &Path, ledger: &Ledger) -> Result<KeyReader, KeyFileError> {
        let reader = KeyReader::open_to_serve(path)?;
        let h = &reader.header;
        ledger
            .check_unspent(h.party, &h.key_set)
            .map_err(|error| KeyFileError::Spent {
                path: path.to_path_buf(),
                error,
            })?;
        Ok(reader)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records the key set as spent in `ledger` (durably, and only once of
    /// any number of processes holding it), then deletes this file unless
    /// `keep`: call it before the first message that depends on the keys.
    /// The open reader still streams the deleted file. An entry stays after
    /// a crash: keys that may have been partly used must never be used
    /// again.
    ///
    /// A file that cannot be deleted (a read-only secret mount, a folder
    /// the server may read but not write) is kept with a warning
    /// ([`Spent::Undeletable`]), not an error: the ledger entry is already
    /// durable and refuses the set again under any name, and failing here
    /// would burn the set without an answer (issue 27, M2; `docs/DEPLOY.md`).
    pub fn spend(&self, ledger: &Ledger, keep: bool) -> Result<Spent, KeyFileError> {
        let h = &self.header;
        ledger
            .spend(h.party, &h.key_set)
            .map_err(|error| KeyFileError::Spent {
                path: self.path.clone(),
                error,
            })?;
        if keep {
            return Ok(Spent::Kept);
        }
        let spent = match std::fs::remove_file(&self.real) {
            Ok(()) => Spent::Deleted,
            Err(error) => return Ok(Spent::Undeletable(error)),
        };
        Ok(match self.link.as_deref().map(std::fs::remove_file) {
            Some(Err(error)) if error.kind() != std::io::ErrorKind::NotFound => {
                Spent::Undeletable(error)
            }
            _ => spent,
        })
    }

    /// Checks the header against this party's plan, whose key sections are
    /// `sections` (`(step, length)` in step order), and the section table
    /// found at open against those: a wrong count or length is refused
    /// before any round.
    pub fn check(
        &self,
        party: u8,
        plan_hash: &[u8; 32],
        sections: &[(u32, u64)],
    ) -> Result<(), KeyFileError> {
        if self.header.party != party {
            return Err(KeyFileError::Party {
                path: self.path.clone(),
                want: party,
                found: self.header.party,
            });
        }
        if &self.header.plan_hash != plan_hash {
            return Err(KeyFileError::PlanMismatch {
                path: self.path.clone(),
                want: crate::plan::hex(plan_hash),
                found: crate::plan::hex(&self.header.plan_hash),
            });
        }
        self.check_table(sections)
    }

    fn check_table(&self, sections: &[(u32, u64)]) -> Result<(), KeyFileError> {
        if self.header.steps as usize != sections.len() {
            return Err(KeyFileError::Header {
                path: self.path.clone(),
                what: format!(
                    "{} steps, the plan has {}",
                    self.header.steps,
                    sections.len()
                ),
            });
        }
        for (i, ((step, want), found)) in (0u32..).zip(sections.iter().zip(&self.table)) {
            if *step != i {
                return Err(KeyFileError::Step {
                    path: self.path.clone(),
                    want: *step,
                    found: i,
                });
            }
            if want != found {
                return Err(KeyFileError::Length {
                    path: self.path.clone(),
                    step: i,
                    want: *want,
                    found: *found,
                });
            }
        }
        Ok(())
    }

    /// Reads step `step`'s section, which must be `len` bytes, and checks
    /// its digest before returning it.
    pub fn section(&mut self, step: u32, len: u64) -> Result<Section, KeyFileError> {
        self.section_in(step, len, Wiped::default())
    }

    /// [`KeyReader::section`], read into `spare` (a spent section's buffer,
    /// given back) when it is long enough: a fresh buffer costs a zeroing
    /// pass, its pages' first touch and a wipe when freed, three passes
    /// over memory per key byte beside the one read and the one hash.
    pub fn section_in(
        &mut self,
        step: u32,
        len: u64,
        spare: Wiped,
    ) -> Result<Section, KeyFileError> {
        let n = self.checked_header(step, len)?;
        if let Some(mapped) = self.mapped(n)? {
            return self.checked_in_place(step, len, mapped);
        }
        // Read straight into the wiped buffer. Not `read_to_end`: it reads
        // a short section (a lone 16-byte seed) through a stack probe
        // buffer that nothing wipes, where the memory scan found it.
        let mut buf = spare;
        if buf.len() < n {
            buf = Wiped(vec![0u8; n]);
        }
        let what = format!("step {step}'s keys");
        let mut hash = section_digest(&self.chain, step, len);
        // Each piece is hashed while it is still in cache.
        for piece in buf[..n].chunks_mut(READ_PIECE) {
            read_exact(&mut self.input, piece, &self.path, &what)?;
            hash.update(piece);
        }
        self.check_digest(step, hash)?;
        Ok(Section(Payload::Read { buf, len: n }))
    }

    /// This reader, mapping sections of `n` bytes or more.
    #[cfg(test)]
    pub(crate) fn mapping_from(mut self, n: usize) -> KeyReader {
        self.map_from = n;
        self
    }

    /// The next `n` bytes mapped, where the file may be mapped and `n` is
    /// at least `map_from`; `None` where they are to be read instead,
    /// which is also what a refused mapping falls back to.
    fn mapped(&mut self, n: usize) -> Result<Option<Mapped>, KeyFileError> {
        let Some(file) = self.mapping.as_ref().filter(|_| n >= self.map_from) else {
            return Ok(None);
        };
        let at = self.input.stream_position().map_err(io(&self.path))?;
        Ok(Mapped::section(file, at, n).ok())
    }

    /// Hashes a mapped payload where it lies, steps the stream past it and
    /// checks its digest.
    fn checked_in_place(
        &mut self,
        step: u32,
        len: u64,
        mapped: Mapped,
    ) -> Result<Section, KeyFileError> {
        let mut hash = section_digest(&self.chain, step, len);
        hash.update(mapped.bytes());
        // A length walked at open lies inside the file, so it fits an i64.
        let past = i64::try_from(len).unwrap_or(i64::MAX);
        self.input.seek_relative(past).map_err(io(&self.path))?;
        self.check_digest(step, hash)?;
        Ok(Section(Payload::Mapped(mapped)))
    }

    /// Reads the next section header and holds it against `(step, len)`;
    /// returns the length as a `usize`.
    fn checked_header(&mut self, step: u32, len: u64) -> Result<usize, KeyFileError> {
        let (found, found_len) = self.section_header()?;
        if found != step {
            return Err(KeyFileError::Step {
                path: self.path.clone(),
                want: step,
                found,
            });
        }
        let wrong = || KeyFileError::Length {
            path: self.path.clone(),
            step,
            want: len,
            found: found_len,
        };
        if found_len != len {
            return Err(wrong());
        }
        usize::try_from(len).map_err(|_| wrong())
    }

    /// Reads the section's stored digest and compares it with `hash`.
    fn check_digest(&mut self, step: u32, hash: Chain) -> Result<(), KeyFileError> {
        let mut stored = [0u8; 32];
        let what = format!("step {step}'s digest");
        read_exact(&mut self.input, &mut stored, &self.path, &what)?;
        let digest: [u8; 32] = hash.finalize().into();
        if digest != stored {
            return Err(KeyFileError::Corrupt {
                path: self.path.clone(),
                step,
            });
        }
        self.chain = digest;
        self.next += 1;
        Ok(())
    }

    /// Reads the next section header: `(step, length)`.
    pub fn section_header(&mut self) -> Result<(u32, u64), KeyFileError> {
        let mut h = [0u8; 16];
        let what = format!("the header of step {}", self.next);
        read_exact(&mut self.input, &mut h, &self.path, &what)?;
        if h[..4] != SECTION {
            return Err(KeyFileError::Trailer {
                path: self.path.clone(),
                what: format!(
                    "expected the section of step {}, found other bytes",
                    self.next
                ),
            });
        }
        Ok((le_u32(&h[4..8]), le_u64(&h[8..16])))
    }

    /// Reads past a section's payload, checking its digest (for
    /// inspection). `step` and `len` are from [`KeyReader::section_header`].
    pub fn skip(&mut self, step: u32, len: u64) -> Result<(), KeyFileError> {
        let mut hash = section_digest(&self.chain, step, len);
        let copied =
            std::io::copy(&mut (&mut self.input).take(len), &mut hash).map_err(io(&self.path))?;
        if copied != len {
            return Err(KeyFileError::Truncated {
                path: self.path.clone(),
                what: format!("step {step}'s keys"),
            });
        }
        self.check_digest(step, hash)
    }

    /// Checks the end marker after the last section. The file stays open
    /// until the reader is dropped: closing a spent (unlinked) file frees
    /// its blocks, which the caller may want off its critical path.
    pub fn finish(&mut self) -> Result<(), KeyFileError> {
        let mut t = [0u8; 8];
        read_exact(&mut self.input, &mut t, &self.path, "the end marker")?;
        if t[..4] != END || le_u32(&t[4..]) != self.header.steps {
            return Err(KeyFileError::Trailer {
                path: self.path.clone(),
                what: "bad end marker".into(),
            });
        }
        let mut extra = [0u8; 1];
        match self.input.read(&mut extra) {
            Ok(0) => Ok(()),
            Ok(_) => Err(KeyFileError::Trailer {
                path: self.path.clone(),
                what: "bytes after the end marker".into(),
            }),
            Err(e) => Err(io(&self.path)(e)),
        }
    }
}

/// What [`KeyReader::spend`] did with the file once the ledger had the set.
#[derive(Debug)]
#[must_use]
pub enum Spent {
    /// Deleted.
    Deleted,
    /// Kept, as asked (`--keep-spent`).
    Kept,
    /// Kept because deleting it failed; the ledger refuses the set anyway.
    Undeletable(std::io::Error),
}

/// Walks the sections that start at byte `start` of a `size`-byte file,
/// reading only their 16-byte headers: each must name the next step and end
/// inside the file, and the end marker must end the file. Returns their
/// lengths. Every section takes at least 48 bytes, so a forged step count
/// costs at most `size / 48` reads.
///
/// The table grows as headers are read, never from the header's step count
/// or the file's size: a sparse file claims any size for free, and a
/// reservation sized from it (`size / 48` entries of a forged 1 TiB file is
/// 22 G entries) was allocated, then zeroed by the wiping allocator when
/// freed, until the OOM killer came (issue 27).
fn walk(
    r: &mut (impl Read + Seek),
    start: u64,
    size: u64,
    steps: u32,
    path: &Path,
) -> Result<Vec<u64>, KeyFileError> {
    let short = |need: u64, what: String| KeyFileError::Short {
        path: path.to_path_buf(),
        size,
        need,
        what,
    };
    let mut table = Vec::new();
    let mut at = start;
    for step in 0..steps {
        let what = || format!("the section of step {step}");
        if at.saturating_add(16) > size {
            return Err(short(at.saturating_add(16), what()));
        }
        r.seek(SeekFrom::Start(at)).map_err(io(path))?;
        let mut h = [0u8; 16];
        read_exact(r, &mut h, path, &what())?;
        if h[..4] != SECTION || le_u32(&h[4..8]) != step {
            return Err(KeyFileError::Trailer {
                path: path.to_path_buf(),
                what: format!("byte {at}: expected the section of step {step}, found other bytes"),
            });
        }
        let len = le_u64(&h[8..16]);
        let end = at.checked_add(16 + 32).and_then(|a| a.checked_add(len));
        at = end
            .filter(|&e| e <= size)
            .ok_or_else(|| short(end.unwrap_or(u64::MAX), what()))?;
        table.push(len);
    }
    let end = at.saturating_add(8);
    if end > size {
        return Err(short(end, "the end marker".into()));
    }
    let trailer = |what: String| KeyFileError::Trailer {
        path: path.to_path_buf(),
        what,
    };
    if end < size {
        return Err(trailer(format!(
            "{} bytes after the end marker",
            size - end
        )));
    }
    r.seek(SeekFrom::Start(at)).map_err(io(path))?;
    let mut t = [0u8; 8];
    read_exact(r, &mut t, path, "the end marker")?;
    if t[..4] != END || le_u32(&t[4..]) != steps {
        return Err(trailer("bad end marker".into()));
    }
    Ok(table)
}

/// A section's digest, started: the chain, the step and the length; the
/// payload follows.
pub(crate) fn section_digest(chain: &[u8; 32], step: u32, len: u64) -> Chain {
    let mut h = Chain::new();
    h.update(chain);
    h.update(&step.to_le_bytes());
    h.update(&len.to_le_bytes());
    h
}

fn le_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

fn read_exact(
    r: &mut impl Read,
    buf: &mut [u8],
    path: &Path,
    what: &str,
) -> Result<(), KeyFileError> {
    r.read_exact(buf).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            KeyFileError::Truncated {
                path: path.to_path_buf(),
                what: what.to_string(),
            }
        } else {
            io(path)(e)
        }
    })
}

/// Reads the header; returns it with its digest, the start of the chain.
fn read_header(r: &mut impl Read, path: &Path) -> Result<(Header, [u8; 32]), KeyFileError> {
    let mut fixed = [0u8; 8 + 4 + 4 + 32 + 16 + 4 + 4];
    // The magic first: a file that is not a key file should say so, however
    // short it is.
    read_exact(r, &mut fixed[..8], path, "the header")?;
    if fixed[..8] != MAGIC {
        return Err(KeyFileError::BadMagic {
            path: path.to_path_buf(),
        });
    }
    read_exact(r, &mut fixed[8..], path, "the header")?;
    parse_header(&fixed, r, path)
}

/// Parses the fixed header bytes, reading the summary from `r`.
fn parse_header(
    fixed: &[u8; 72],
    r: &mut impl Read,
    path: &Path,
) -> Result<(Header, [u8; 32]), KeyFileError> {
    if fixed[..8] != MAGIC {
        return Err(KeyFileError::BadMagic {
            path: path.to_path_buf(),
        });
    }
    let version = le_u32(&fixed[8..12]);
    if version != VERSION {
        return Err(KeyFileError::Version {
            path: path.to_path_buf(),
            found: version,
        });
    }
    let bad = |what: &str| KeyFileError::Header {
        path: path.to_path_buf(),
        what: what.to_string(),
    };
    let party = fixed[12];
    if party > 1 {
        return Err(bad(&format!("party {party} (must be 0 or 1)")));
    }
    if fixed[13..16] != [0, 0, 0] {
        return Err(bad("reserved bytes are not zero"));
    }
    let mut plan_hash = [0u8; 32];
    plan_hash.copy_from_slice(&fixed[16..48]);
    let mut key_set = [0u8; 16];
    key_set.copy_from_slice(&fixed[48..64]);
    let steps = le_u32(&fixed[64..68]);
    let len = le_u32(&fixed[68..72]) as usize;
    if len > MAX_SUMMARY {
        return Err(bad(&format!(
            "summary of {len} bytes (at most {MAX_SUMMARY})"
        )));
    }
    let mut summary = vec![0u8; len];
    read_exact(r, &mut summary, path, "the summary")?;
    let chain = Chain::new()
        .update(fixed)
        .update(&summary)
        .finalize()
        .into();
    let summary: Summary =
        serde_json::from_slice(&summary).map_err(|e| bad(&format!("summary: {e}")))?;
    let header = Header {
        party,
        plan_hash,
        key_set,
        steps,
        summary,
    };
    Ok((header, chain))
}

/// Parses a header from a byte slice (for fuzzing and inspection).
pub fn parse_header_bytes(bytes: &[u8]) -> Result<Header, KeyFileError> {
    let path = Path::new("<bytes>");
    let mut r = bytes;
    read_header(&mut r, path).map(|(h, _)| h)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::DirBuilderExt;

    use super::*;

    fn header() -> Header {
        Header {
            party: 1,
            plan_hash: [7; 32],
            key_set: [9; 16],
            steps: 2,
            summary: Summary {
                model: "m".into(),
                model_digest: "00".into(),
                batch: 1,
                seq: 3,
                decode_steps: 0,
            },
        }
    }

    fn write(dir: &Path) -> PathBuf {
        let p = dir.join("k.p1");
        let mut w = KeyWriter::create(&p, &header()).unwrap();
        w.section(0, 3).unwrap();
        w.write(&[1, 2, 3]).unwrap();
        w.section(1, 0).unwrap();
        w.finish().unwrap();
        p
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("suffuse-keyfile-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        // 0700: keys are dealt into it, and the dealer refuses an open folder.
        std::fs::DirBuilder::new().mode(0o700).create(&d).unwrap();
        d
    }

    #[test]
    fn round_trip_and_checks() {
        let d = tmp("rt");
        let p = write(&d);
        let mut r = KeyReader::open(&p).unwrap();
        assert_eq!(r.header, header());
        r.check(1, &[7; 32], SECTIONS).unwrap();
        assert!(matches!(
            r.check(0, &[7; 32], SECTIONS),
            Err(KeyFileError::Party { .. })
        ));
        assert!(matches!(
            r.check(1, &[8; 32], SECTIONS),
            Err(KeyFileError::PlanMismatch { .. })
        ));
        assert_eq!(&*r.section(0, 3).unwrap(), &[1, 2, 3]);
        assert!(r.section(1, 0).unwrap().is_empty());
        r.finish().unwrap();
    }

    /// Issue 27: a real file with its step count forged to 2^32 − 1 and
    /// extended to 1 TiB with a seek (a sparse file, a few KB on disk) is
    /// refused with a typed error after one section, allocating nothing
    /// sized by the forged count or the claimed size.
    #[test]
    fn a_forged_step_count_in_a_sparse_file_is_refused_cheaply() {
        let d = tmp("sparse");
        let p = write(&d);
        let mut bytes = std::fs::read(&p).unwrap();
        bytes[64..68].copy_from_slice(&u32::MAX.to_le_bytes());
        std::fs::write(&p, &bytes).unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.set_len(1 << 40).unwrap();
        drop(f);
        let t = std::time::Instant::now();
        let e = KeyReader::open(&p).map(|_| ()).unwrap_err();
        assert!(t.elapsed().as_secs() < 10, "took {:?}", t.elapsed());
        // The walk read the forged count: it found no section of step 2.
        let message = e.to_string();
        assert!(message.contains("step 2"), "{message}");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Written around the page cache: sections crossing the 8 MiB chunks
    /// (five whole and a part, so that a chunk is gathered while two are
    /// on their way and each of the three buffers is used again) and
    /// ending off a block boundary read back whole, through either path
    /// (where /tmp refuses `O_DIRECT`, through the page cache).
    #[test]
    fn a_directly_written_file_reads_back_whole() {
        let d = tmp("direct");
        let p = d.join("k.p0");
        let mut w = KeyWriter::create_with(&p, &header(), true, WRITE_BEHIND).unwrap();
        let big: Vec<u8> = (0..(41 << 20) + 12_345u32)
            .map(|i| (i % 251) as u8)
            .collect();
        w.section(0, big.len() as u64).unwrap();
        for piece in big.chunks(3 << 20) {
            w.write(piece).unwrap();
        }
        w.section(1, 5).unwrap();
        w.write(b"tail!").unwrap();
        let size = w.finish().unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), size);
        let mut r = KeyReader::open(&p).unwrap();
        assert_eq!(&*r.section(0, big.len() as u64).unwrap(), &big[..]);
        assert_eq!(&*r.section(1, 5).unwrap(), b"tail!");
        r.finish().unwrap();
    }

    #[test]
    fn a_file_written_back_as_it_grows_reads_back_whole() {
        let d = tmp("behind");
        let p = d.join("k.p1");
        // Written back every 64 bytes: the syncer is nudged many times.
        let mut w = KeyWriter::create_with(&p, &header(), false, 64).unwrap();
        let payload: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        w.section(0, 1000).unwrap();
        for piece in payload.chunks(100) {
            w.write(piece).unwrap();
        }
        w.section(1, 0).unwrap();
        w.finish().unwrap();
        let mut r = KeyReader::open(&p).unwrap();
        assert_eq!(&*r.section(0, 1000).unwrap(), &payload[..]);
        assert!(r.section(1, 0).unwrap().is_empty());
        r.finish().unwrap();
    }

    #[test]
    fn the_syncer_runs_once_per_queued_nudge_and_stops_at_finish() {
        let d = tmp("syncer");
        let f = File::create(d.join("f")).unwrap();
        let mut b = WriteBehind::new(&f, 10);
        b.wrote(9);
        assert_eq!(b.nudged_at, 0, "below the threshold: no nudge");
        b.wrote(10);
        assert_eq!(b.nudged_at, 10);
        // The one queued nudge is taken before the hang-up ends the thread.
        assert_eq!(b.finish().unwrap(), 1);
        // Finished: nudges go nowhere, and a second finish has nothing to stop.
        b.wrote(100);
        assert_eq!(b.finish().unwrap(), 0);
        let mut idle = WriteBehind::new(&f, 10);
        assert_eq!(idle.finish().unwrap(), 0);
    }

    #[test]
    fn a_spare_buffer_is_reused_and_only_the_payload_shows() {
        let d = tmp("spare");
        let p = write(&d);
        let mut r = KeyReader::open(&p).unwrap();
        // Too short a spare is replaced by a buffer of the section's length.
        let s = r.section_in(0, 3, Wiped(vec![9u8; 2])).unwrap();
        assert_eq!(&*s, &[1, 2, 3]);
        assert_eq!(s.into_buffer().len(), 3);
        // A longer one is read into; the section is its first bytes alone.
        let mut r = KeyReader::open(&p).unwrap();
        let spare = Wiped(vec![9u8; 64]);
        let at = spare.as_ptr();
        let s = r.section_in(0, 3, spare).unwrap();
        assert_eq!(&*s, &[1, 2, 3]);
        let buf = s.into_buffer();
        assert_eq!((buf.as_ptr(), buf.len()), (at, 64));
        assert_eq!(&buf[3..], &[9u8; 61][..]);
        let s = r.section_in(1, 0, buf).unwrap();
        assert!(s.is_empty());
        r.finish().unwrap();
    }

    #[test]
    fn wrong_lengths_and_steps_are_typed_errors() {
        let d = tmp("len");
        let p = write(&d);
        let mut r = KeyReader::open(&p).unwrap();
        assert!(matches!(r.section(0, 4), Err(KeyFileError::Length { .. })));
        let mut r = KeyReader::open(&p).unwrap();
        assert!(matches!(r.section(1, 3), Err(KeyFileError::Step { .. })));
    }

    /// The plan of [`write`]'s file.
    const SECTIONS: &[(u32, u64)] = &[(0, 3), (1, 0)];

    #[test]
    fn every_truncation_or_growth_is_refused_at_open() {
        let d = tmp("trunc");
        let p = write(&d);
        let full = std::fs::read(&p).unwrap();
        let head = full.len() - (16 + 3 + 32) - (16 + 32) - 8;
        for cut in 0..full.len() {
            std::fs::write(&p, &full[..cut]).unwrap();
            let result = KeyReader::open(&p);
            // Past the header, the walk names the cut: nothing is read
            // ahead of a section, let alone used.
            match result {
                Err(KeyFileError::Short { size, need, .. }) => assert!(size < need && cut >= head),
                Err(_) => assert!(cut < head + 16, "a cut at {cut} is not called short"),
                Ok(_) => panic!("a file cut at {cut} bytes was opened"),
            }
        }
        let mut grown = full.clone();
        grown.push(0);
        std::fs::write(&p, &grown).unwrap();
        assert!(matches!(
            KeyReader::open(&p),
            Err(KeyFileError::Trailer { .. })
        ));
        let mut marker = full.clone();
        *marker.last_mut().unwrap() ^= 1;
        std::fs::write(&p, &marker).unwrap();
        assert!(matches!(
            KeyReader::open(&p),
            Err(KeyFileError::Trailer { .. })
        ));
    }

    #[test]
    fn a_section_table_unlike_the_plans_is_refused() {
        let d = tmp("table");
        let r = KeyReader::open(&write(&d)).unwrap();
        assert!(matches!(
            r.check(1, &[7; 32], &[(0, 3)]),
            Err(KeyFileError::Header { .. })
        ));
        assert!(matches!(
            r.check(1, &[7; 32], &[(0, 3), (1, 8)]),
            Err(KeyFileError::Length { step: 1, .. })
        ));
        r.check(1, &[7; 32], SECTIONS).unwrap();
    }

    #[test]
    fn every_flipped_bit_is_detected() {
        let d = tmp("flip");
        let p = write(&d);
        let full = std::fs::read(&p).unwrap();
        // Read, and with every non-empty section mapped.
        for map_from in [mapped::MAP_FROM, 1] {
            for byte in 0..full.len() {
                for bit in 0..8 {
                    let mut bad = full.clone();
                    bad[byte] ^= 1 << bit;
                    std::fs::write(&p, &bad).unwrap();
                    let result = KeyReader::open(&p).and_then(|r| {
                        let mut r = r.mapping_from(map_from);
                        r.check(1, &[7; 32], SECTIONS)?;
                        r.section(0, 3)?;
                        r.section(1, 0)?;
                        r.finish()
                    });
                    assert!(
                        result.is_err(),
                        "a flip of bit {bit} of byte {byte} went unseen (mapping from {map_from})"
                    );
                }
            }
        }
    }

    /// Sections of 3 bytes, 5000 bytes and just over [`mapped::MAP_FROM`],
    /// with bytes that differ from place to place.
    fn write_long(dir: &Path) -> (PathBuf, Vec<Vec<u8>>) {
        let lens = [3, 5000, mapped::MAP_FROM + 17];
        let bodies: Vec<Vec<u8>> = (0u64..)
            .zip(lens)
            .map(|(s, n)| {
                (0..n as u64)
                    .map(|i| (i.wrapping_mul(2654435761) >> 7 ^ s) as u8)
                    .collect()
            })
            .collect();
        let p = dir.join("long.p1");
        let h = Header {
            steps: 3,
            ..header()
        };
        let mut w = KeyWriter::create(&p, &h).unwrap();
        for (step, body) in (0u32..).zip(&bodies) {
            w.section(step, body.len() as u64).unwrap();
            w.write(body).unwrap();
        }
        w.finish().unwrap();
        (p, bodies)
    }

    /// Reads every section of `r`: its bytes and whether it was mapped.
    fn read_all(mut r: KeyReader, bodies: &[Vec<u8>]) -> Vec<(Vec<u8>, bool)> {
        let out = (0u32..)
            .zip(bodies)
            .map(|(step, b)| {
                let s = r.section(step, b.len() as u64).unwrap();
                (s.to_vec(), s.is_mapped())
            })
            .collect();
        r.finish().unwrap();
        out
    }

    #[test]
    fn mapped_sections_hold_what_read_ones_do() {
        let d = tmp("mapped");
        let (p, bodies) = write_long(&d);
        let read = |r: KeyReader| read_all(r, &bodies);
        let in_memory = read(KeyReader::from_bytes(&p, std::fs::read(&p).unwrap()).unwrap());
        let default = read(KeyReader::open(&p).unwrap());
        let all = read(KeyReader::open(&p).unwrap().mapping_from(1));
        for (i, body) in bodies.iter().enumerate() {
            assert_eq!(&in_memory[i].0, body);
            assert_eq!(&default[i].0, body);
            assert_eq!(&all[i].0, body);
        }
        let mapped = |v: &[(Vec<u8>, bool)]| v.iter().map(|s| s.1).collect::<Vec<_>>();
        assert_eq!(mapped(&in_memory), [false, false, false]);
        assert_eq!(mapped(&default), [false, false, true]);
        assert_eq!(mapped(&all), [true, true, true]);
    }

    #[test]
    fn a_file_others_may_write_is_read_not_mapped() {
        use std::os::unix::fs::PermissionsExt;
        let d = tmp("shared");
        let (p, bodies) = write_long(&d);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o620)).unwrap();
        let sections = read_all(KeyReader::open(&p).unwrap().mapping_from(1), &bodies);
        assert!(
            sections
                .iter()
                .all(|(bytes, mapped)| !mapped && !bytes.is_empty())
        );
    }

    #[test]
    fn sections_from_another_file_are_refused() {
        // Same header shape and lengths, another key set: splicing its
        // first section into this file breaks the chain.
        let d = tmp("splice");
        let p = write(&d);
        let mut other = header();
        other.key_set = [8; 16];
        let q = d.join("other");
        let mut w = KeyWriter::create(&q, &other).unwrap();
        w.section(0, 3).unwrap();
        w.write(&[1, 2, 3]).unwrap();
        w.section(1, 0).unwrap();
        w.finish().unwrap();
        let (a, b) = (std::fs::read(&p).unwrap(), std::fs::read(&q).unwrap());
        let head = a.len() - (16 + 3 + 32) - (16 + 32) - 8;
        let mut spliced = a[..head].to_vec();
        spliced.extend_from_slice(&b[head..]);
        std::fs::write(&p, &spliced).unwrap();
        let mut r = KeyReader::open(&p).unwrap();
        assert!(matches!(
            r.section(0, 3),
            Err(KeyFileError::Corrupt { step: 0, .. })
        ));
    }

    #[test]
    fn a_writer_refuses_short_and_long_sections() {
        let d = tmp("short");
        let mut w = KeyWriter::create(&d.join("a"), &header()).unwrap();
        w.section(0, 3).unwrap();
        w.write(&[1, 2]).unwrap();
        assert!(w.section(1, 0).is_err());
        let mut w = KeyWriter::create(&d.join("b"), &header()).unwrap();
        w.section(0, 3).unwrap();
        assert!(w.write(&[1, 2, 3, 4]).is_err());
    }

    #[test]
    fn garbage_headers_are_rejected_without_panicking() {
        assert!(matches!(
            parse_header_bytes(b""),
            Err(KeyFileError::Truncated { .. })
        ));
        let mut h = vec![0u8; 72];
        assert!(matches!(
            parse_header_bytes(&h),
            Err(KeyFileError::BadMagic { .. })
        ));
        h[..8].copy_from_slice(&MAGIC);
        h[8] = 9;
        assert!(matches!(
            parse_header_bytes(&h),
            Err(KeyFileError::Version { found: 9, .. })
        ));
        h[8] = VERSION as u8;
        h[12] = 2;
        assert!(matches!(
            parse_header_bytes(&h),
            Err(KeyFileError::Header { .. })
        ));
        h[12] = 0;
        h[68..72].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            parse_header_bytes(&h),
            Err(KeyFileError::Header { .. })
        ));
        h[68..72].copy_from_slice(&2u32.to_le_bytes());
        h.extend_from_slice(b"{}");
        assert!(matches!(
            parse_header_bytes(&h),
            Err(KeyFileError::Header { .. })
        ));
    }

    #[test]
    fn a_spent_key_set_is_refused_under_any_name() {
        let d = tmp("once");
        let p = write(&d);
        let ledger = Ledger::open(&d.join("state")).unwrap();
        let copy = d.join("renamed.keys");
        std::fs::copy(&p, &copy).unwrap();
        let first = KeyReader::open_unspent(&p, &ledger).unwrap();
        // Opened twice before either spends: only one spend succeeds.
        let second = KeyReader::open_unspent(&copy, &ledger).unwrap();
        assert!(matches!(first.spend(&ledger, false), Ok(Spent::Deleted)));
        assert!(!p.exists(), "a spent key file is deleted");
        assert!(matches!(
            second.spend(&ledger, true),
            Err(KeyFileError::Spent { .. })
        ));
        assert!(matches!(
            KeyReader::open_unspent(&copy, &ledger),
            Err(KeyFileError::Spent { .. })
        ));
    }

    /// Issue 27: a FIFO in a key file's place is refused at once instead of
    /// blocking the open until a writer comes.
    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let d = tmp("fifo");
        let p = d.join("fifo.keys");
        let made = std::process::Command::new("mkfifo")
            .arg(&p)
            .status()
            .unwrap();
        assert!(made.success());
        let t = std::time::Instant::now();
        let e = KeyReader::open(&p).map(|_| ()).unwrap_err();
        assert!(t.elapsed().as_secs() < 5);
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Issue 27, M2: a key file the server cannot delete (its folder made
    /// undeletable: immutable as root, read-only otherwise) is spent in the
    /// ledger and kept with a warning instead of failing the query; the
    /// ledger still refuses it.
    /// Issue 27 (low): a symlinked key file was spent by deleting the link,
    /// leaving the one-time file itself on disk. Both go now.
    #[test]
    fn a_linked_key_file_is_spent_whole() {
        let d = tmp("linked");
        let p = write(&d);
        let link = d.join("p1.keys");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        let ledger = Ledger::open(&d.join("state")).unwrap();
        let reader = KeyReader::open_unspent(&link, &ledger).unwrap();
        assert_eq!(reader.path(), link, "messages name the path given");
        assert!(matches!(reader.spend(&ledger, false), Ok(Spent::Deleted)));
        assert!(!p.exists(), "the linked file was left behind");
        assert!(std::fs::symlink_metadata(&link).is_err(), "the link stays");
    }

    /// Issue 27 (low): key files open to others were accepted silently.
    #[test]
    fn a_key_file_others_may_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let d = tmp("modes");
        let p = write(&d);
        for (mode, opens) in [(0o644, false), (0o606, false), (0o640, true), (0o400, true)] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            let r = KeyReader::open_to_serve(&p);
            assert_eq!(r.is_ok(), opens, "{mode:03o}");
            assert!(KeyReader::open(&p).is_ok(), "inspect reads any");
            if let Err(e) = r {
                assert!(e.to_string().contains("chmod 600"), "{e}");
            }
        }
    }

    #[test]
    fn an_undeletable_key_file_is_spent_and_kept() {
        use std::os::unix::fs::PermissionsExt;
        let d = tmp("undeletable");
        let keys = d.join("keys");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&keys)
            .unwrap();
        let p = write(&keys);
        let ledger = Ledger::open(&d.join("state")).unwrap();
        let reader = KeyReader::open_unspent(&p, &ledger).unwrap();
        let root = rustix::process::geteuid().is_root();
        let locked = if root {
            std::process::Command::new("chattr")
                .arg("+i")
                .arg(&keys)
                .status()
        } else {
            std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o500))
                .map(|()| std::process::ExitStatus::default())
        };
        assert!(
            locked.is_ok_and(|s| s.success()),
            "could not lock {}",
            keys.display()
        );
        let spent = reader.spend(&ledger, false);
        let unlock = if root {
            std::process::Command::new("chattr")
                .arg("-i")
                .arg(&keys)
                .status()
                .map(|_| ())
        } else {
            std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o700))
        };
        unlock.unwrap();
        assert!(matches!(spent, Ok(Spent::Undeletable(_))), "{spent:?}");
        assert!(p.exists(), "the file stays");
        assert!(matches!(
            KeyReader::open_unspent(&p, &ledger),
            Err(KeyFileError::Spent { .. })
        ));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn key_files_are_private_and_never_overwritten() {
        use std::os::unix::fs::PermissionsExt;
        let d = tmp("private");
        let p = write(&d);
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(matches!(
            KeyWriter::create(&p, &header()),
            Err(KeyFileError::Exists { .. })
        ));
    }
}
