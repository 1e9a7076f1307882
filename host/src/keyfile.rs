//! Key files: one per party per dealer run, written and read as streams.
//!
//! ```text
//! header   magic "SUFFKEYS" · version u32 · party u8 · 3 reserved bytes (0)
//!          plan hash [32] · key-set id [16] · steps u32
//!          summary length u32 · summary (UTF-8 JSON, ≤ 64 KiB)
//! section  per step, in order: magic "SECT" · step u32 · length u64 · payload
//! end      magic "DONE" · steps u32
//! ```
//!
//! All integers are little-endian. The summary names the model and the
//! shape, so a server can rebuild the plan from the file and compare
//! hashes before any work. Section payloads are laid out by
//! [`crate::proto`]; their lengths follow from the plan and are checked
//! before a payload is read, so a corrupt length can neither over-allocate
//! nor desynchronize the stream. The key-set id is random per dealer run:
//! the two servers compare theirs before starting, and a consumed file is
//! refused ([`KeyReader::spend`]).

use std::fs::{File, OpenOptions};
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// File magic.
pub const MAGIC: [u8; 8] = *b"SUFFKEYS";
/// Format version.
pub const VERSION: u32 = 1;
const SECTION: [u8; 4] = *b"SECT";
const END: [u8; 4] = *b"DONE";
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
    #[error("{path}: key file format version {found}, this build reads version {VERSION}")]
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
    /// The key file was used before.
    #[error(
        "{path}: these keys were already used (marker {marker} exists); keys are one-time, deal \
         new ones"
    )]
    AlreadyUsed {
        /// The file.
        path: PathBuf,
        /// The marker file.
        marker: PathBuf,
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

fn io(path: &Path) -> impl Fn(std::io::Error) -> KeyFileError + '_ {
    move |source| KeyFileError::Io {
        path: path.to_path_buf(),
        error: source,
    }
}

/// Writes one party's key file.
pub struct KeyWriter {
    out: BufWriter<File>,
    path: PathBuf,
    next: u32,
    steps: u32,
    bytes: u64,
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
    /// Creates the file (replacing any old one) and writes the header.
    pub fn create(path: &Path, header: &Header) -> Result<KeyWriter, KeyFileError> {
        let file = File::create(path).map_err(io(path))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
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
        out.write_all(&h).map_err(io(path))?;
        Ok(KeyWriter {
            out,
            path: path.to_path_buf(),
            next: 0,
            steps: header.steps,
            bytes: h.len() as u64,
        })
    }

    /// Starts the next step's section of `len` bytes; the caller then
    /// writes exactly `len` bytes with [`KeyWriter::write`].
    pub fn section(&mut self, step: u32, len: u64) -> Result<(), KeyFileError> {
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
        self.write(&h)
    }

    /// Appends payload bytes.
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), KeyFileError> {
        self.bytes += bytes.len() as u64;
        self.out.write_all(bytes).map_err(io(&self.path))
    }

    /// Writes the end marker and flushes; returns the file's size.
    pub fn finish(mut self) -> Result<u64, KeyFileError> {
        let mut t = [0u8; 8];
        t[..4].copy_from_slice(&END);
        t[4..].copy_from_slice(&self.steps.to_le_bytes());
        self.write(&t)?;
        self.out.flush().map_err(io(&self.path))?;
        self.out.get_ref().sync_all().map_err(io(&self.path))?;
        Ok(self.bytes)
    }
}

/// Reads one party's key file, section by section.
pub struct KeyReader {
    input: BufReader<File>,
    path: PathBuf,
    /// The header.
    pub header: Header,
    next: u32,
}

impl std::fmt::Debug for KeyReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyReader")
            .field("path", &self.path)
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

impl KeyReader {
    /// Opens a key file and reads its header.
    pub fn open(path: &Path) -> Result<KeyReader, KeyFileError> {
        let file = File::open(path).map_err(io(path))?;
        let mut input = BufReader::with_capacity(1 << 20, file);
        let header = read_header(&mut input, path)?;
        Ok(KeyReader {
            input,
            path: path.to_path_buf(),
            header,
            next: 0,
        })
    }

    /// Opens a key file that is to be consumed: refuses one that was spent
    /// before. Opening does not spend it; [`KeyReader::spend`] does, once
    /// the query's input has arrived, so a query that fails before any
    /// masked value leaves this server (a wrong client, a mismatched peer)
    /// costs no keys.
    pub fn open_unspent(path: &Path) -> Result<KeyReader, KeyFileError> {
        let reader = KeyReader::open(path)?;
        let marker = used_marker(path);
        if marker.exists() {
            return Err(KeyFileError::AlreadyUsed {
                path: path.to_path_buf(),
                marker,
            });
        }
        Ok(reader)
    }

    /// Marks the file spent (`FILE.used`, created atomically): call it
    /// before the first message that depends on the keys. Fails if the
    /// file was spent already, by this or any other process. The marker
    /// stays after a crash: keys that may have been partly used must never
    /// be used again.
    pub fn spend(&self) -> Result<(), KeyFileError> {
        let marker = used_marker(&self.path);
        let mut m = match OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&marker)
        {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(KeyFileError::AlreadyUsed {
                    path: self.path.clone(),
                    marker,
                });
            }
            Err(e) => return Err(io(&marker)(e)),
        };
        let note = format!("key set {}\n", crate::plan::hex(&self.header.key_set));
        m.write_all(note.as_bytes()).map_err(io(&marker))?;
        Ok(())
    }

    /// Checks the header against this party's plan.
    pub fn check(&self, party: u8, plan_hash: &[u8; 32]) -> Result<(), KeyFileError> {
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
        Ok(())
    }

    /// Reads step `step`'s section, which must be `len` bytes.
    pub fn section(&mut self, step: u32, len: u64) -> Result<Vec<u8>, KeyFileError> {
        let (found, found_len) = self.section_header()?;
        if found != step {
            return Err(KeyFileError::Step {
                path: self.path.clone(),
                want: step,
                found,
            });
        }
        if found_len != len {
            return Err(KeyFileError::Length {
                path: self.path.clone(),
                step,
                want: len,
                found: found_len,
            });
        }
        let n = usize::try_from(len).map_err(|_| KeyFileError::Length {
            path: self.path.clone(),
            step,
            want: len,
            found: found_len,
        })?;
        // Read straight into spare capacity: no zero-fill of a buffer the
        // size of the step's keys.
        let mut buf = Vec::with_capacity(n);
        let got = (&mut self.input)
            .take(len)
            .read_to_end(&mut buf)
            .map_err(io(&self.path))?;
        if got != n {
            return Err(KeyFileError::Truncated {
                path: self.path.clone(),
                what: format!("step {step}'s keys"),
            });
        }
        self.next += 1;
        Ok(buf)
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

    /// Skips a section's payload (for inspection).
    pub fn skip(&mut self, len: u64) -> Result<(), KeyFileError> {
        let copied = std::io::copy(&mut (&mut self.input).take(len), &mut std::io::sink())
            .map_err(io(&self.path))?;
        if copied != len {
            return Err(KeyFileError::Truncated {
                path: self.path.clone(),
                what: format!("step {}'s keys", self.next),
            });
        }
        self.next += 1;
        Ok(())
    }

    /// Checks the end marker after the last section.
    pub fn finish(mut self) -> Result<(), KeyFileError> {
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

/// The marker that records a consumed key file.
pub fn used_marker(path: &Path) -> PathBuf {
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".used");
    path.with_file_name(name)
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

fn read_header(r: &mut impl Read, path: &Path) -> Result<Header, KeyFileError> {
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
fn parse_header(fixed: &[u8; 72], r: &mut impl Read, path: &Path) -> Result<Header, KeyFileError> {
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
    let summary: Summary =
        serde_json::from_slice(&summary).map_err(|e| bad(&format!("summary: {e}")))?;
    Ok(Header {
        party,
        plan_hash,
        key_set,
        steps,
        summary,
    })
}

/// Parses a header from a byte slice (for fuzzing and inspection).
pub fn parse_header_bytes(bytes: &[u8]) -> Result<Header, KeyFileError> {
    let path = Path::new("<bytes>");
    let mut r = bytes;
    read_header(&mut r, path)
}

#[cfg(test)]
mod tests {
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
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn round_trip_and_checks() {
        let d = tmp("rt");
        let p = write(&d);
        let mut r = KeyReader::open(&p).unwrap();
        assert_eq!(r.header, header());
        r.check(1, &[7; 32]).unwrap();
        assert!(matches!(
            r.check(0, &[7; 32]),
            Err(KeyFileError::Party { .. })
        ));
        assert!(matches!(
            r.check(1, &[8; 32]),
            Err(KeyFileError::PlanMismatch { .. })
        ));
        assert_eq!(r.section(0, 3).unwrap(), vec![1, 2, 3]);
        assert!(r.section(1, 0).unwrap().is_empty());
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

    #[test]
    fn every_truncation_is_detected() {
        let d = tmp("trunc");
        let p = write(&d);
        let full = std::fs::read(&p).unwrap();
        for cut in 0..full.len() {
            std::fs::write(&p, &full[..cut]).unwrap();
            let result = KeyReader::open(&p).and_then(|mut r| {
                r.section(0, 3)?;
                r.section(1, 0)?;
                r.finish()
            });
            assert!(result.is_err(), "a file cut at {cut} bytes was accepted");
        }
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
        h[8] = 1;
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
    fn a_spent_key_file_is_refused() {
        let d = tmp("once");
        let p = write(&d);
        let first = KeyReader::open_unspent(&p).unwrap();
        // Opened twice before either spends: only one spend succeeds.
        let second = KeyReader::open_unspent(&p).unwrap();
        first.spend().unwrap();
        assert!(matches!(
            second.spend(),
            Err(KeyFileError::AlreadyUsed { .. })
        ));
        assert!(matches!(
            KeyReader::open_unspent(&p),
            Err(KeyFileError::AlreadyUsed { .. })
        ));
    }
}
