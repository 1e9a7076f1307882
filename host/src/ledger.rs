//! The spent-key ledger: a server's durable record of every key set it has
//! spent, so that no key set serves twice, whatever its file is called or
//! wherever it was copied.
//!
//! One empty-ish file per spent key set, `p{party}-{key-set id}`, in the
//! state directory. Recording one is `open(O_CREAT | O_EXCL)`, atomic on a
//! local file system, so of two processes spending the same key set only one
//! succeeds; the file and then the directory are fsync'd before the server
//! sends anything that depends on the keys, so a crash cannot forget a
//! spend. Entries are never removed: key-set ids are 128 random bits, and an
//! entry costs one inode.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::plan::hex;

/// Why the ledger refused or failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerError {
    /// The key set was spent before.
    #[error(
        "key set {key_set} was already spent by party {party} (ledger entry {entry}{note}); keys \
         are one-time, deal new ones"
    )]
    Spent {
        /// The key set (hex).
        key_set: String,
        /// The party.
        party: u8,
        /// The ledger entry.
        entry: PathBuf,
        /// Said of an empty entry, which a spend on a full disk leaves.
        note: &'static str,
    },
    /// The state directory or an entry could not be read or written.
    #[error("spent-key ledger {path}: {error}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
}

/// A server's ledger of spent key sets.
#[derive(Clone, Debug)]
pub struct Ledger {
    dir: PathBuf,
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> LedgerError + '_ {
    move |error| LedgerError::Io {
        path: path.to_path_buf(),
        error,
    }
}

impl Ledger {
    /// Opens (creating, mode 0700) the ledger in `dir`.
    pub fn open(dir: &Path) -> Result<Ledger, LedgerError> {
        crate::private::private_dir(dir).map_err(io(dir))?;
        Ok(Ledger {
            dir: dir.to_path_buf(),
        })
    }

    /// The default state directory: `$XDG_STATE_HOME/suffuse`, else
    /// `$HOME/.local/state/suffuse`.
    pub fn default_dir() -> Option<PathBuf> {
        let nonempty = |v: std::ffi::OsString| (!v.is_empty()).then(|| PathBuf::from(v));
        if let Some(d) = std::env::var_os("XDG_STATE_HOME").and_then(nonempty) {
            return Some(d.join("suffuse"));
        }
        std::env::var_os("HOME")
            .and_then(nonempty)
            .map(|h| h.join(".local/state/suffuse"))
    }

    fn entry(&self, party: u8, key_set: &[u8; 16]) -> PathBuf {
        self.dir.join(format!("p{party}-{}", hex(key_set)))
    }

    /// The refusal of a spent set; an empty entry (a spend cut short by a
    /// full disk, issue 27) is named as such, since it still counts.
    fn spent(party: u8, key_set: &[u8; 16], entry: PathBuf) -> LedgerError {
        let empty = std::fs::symlink_metadata(&entry).is_ok_and(|m| m.len() == 0);
        LedgerError::Spent {
            key_set: hex(key_set),
            party,
            entry,
            note: if empty {
                ", empty: its spend was cut short, by a full disk perhaps, and it counts all the same"
            } else {
                ""
            },
        }
    }

    /// Refuses a key set this party has spent.
    pub fn check_unspent(&self, party: u8, key_set: &[u8; 16]) -> Result<(), LedgerError> {
        let entry = self.entry(party, key_set);
        match std::fs::symlink_metadata(&entry) {
            Ok(_) => Err(Ledger::spent(party, key_set, entry)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io(&entry)(e)),
        }
    }

    /// Records the key set as spent, durably; fails if it was spent already.
    pub fn spend(&self, party: u8, key_set: &[u8; 16]) -> Result<(), LedgerError> {
        let entry = self.entry(party, key_set);
        let mut f = match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&entry)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(Ledger::spent(party, key_set, entry));
            }
            Err(e) => return Err(io(&entry)(e)),
        };
        let when = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        writeln!(f, "spent at unix time {when}").map_err(io(&entry))?;
        f.sync_all().map_err(io(&entry))?;
        // The entry's name lives in the directory: sync it too.
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io(&self.dir))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// Issue 27: an empty entry (a spend cut short) counts as spent, and
    /// the refusal says that it is empty.
    #[test]
    fn an_empty_entry_counts_and_says_so() {
        let d = std::env::temp_dir().join(format!("suffuse-ledger-empty-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let l = Ledger::open(&d).unwrap();
        std::fs::write(l.entry(0, &[3; 16]), b"").unwrap();
        let e = l.check_unspent(0, &[3; 16]).unwrap_err();
        assert!(e.to_string().contains("empty"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_key_set_is_spent_once_per_party() {
        let d = std::env::temp_dir().join(format!("suffuse-ledger-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let l = Ledger::open(&d.join("state")).unwrap();
        let mode = std::fs::metadata(d.join("state")).unwrap().permissions();
        assert_eq!(mode.mode() & 0o777, 0o700);
        l.check_unspent(0, &[1; 16]).unwrap();
        l.spend(0, &[1; 16]).unwrap();
        assert!(matches!(
            l.check_unspent(0, &[1; 16]),
            Err(LedgerError::Spent { party: 0, .. })
        ));
        assert!(matches!(
            l.spend(0, &[1; 16]),
            Err(LedgerError::Spent { .. })
        ));
        // The other party's spend of the same set is its own entry.
        l.spend(1, &[1; 16]).unwrap();
        l.check_unspent(0, &[2; 16]).unwrap();
        // A second handle on the same directory sees the same ledger.
        let again = Ledger::open(&d.join("state")).unwrap();
        assert!(again.check_unspent(1, &[1; 16]).is_err());
    }
}
