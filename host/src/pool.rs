//! A key pool: many one-time key sets in one folder, so that a long-running
//! server answers a stream of queries, one set each.
//!
//! ```text
//! DIR/                      0700
//!   <key-set id, 32 hex>/   0700, one per dealer run
//!     p0.keys  p1.keys      0600 (each server needs only its own)
//!   .dealing-<random>/      a set being dealt; renamed to its id when whole
//! ```
//!
//! A set appears under its id only once both files are complete (a rename
//! within the folder is atomic), so a server never sees half a set, and a
//! set's folder is never reused: ids are 128 random bits and the rename
//! refuses a folder that exists.
//!
//! Claiming: a query takes its set's file with an exclusive `flock`, which
//! of any number of threads or processes only one gets and which the
//! kernel drops when its holder dies, so a crash leaves no stale claim.
//! The claim is not the spend: the ledger records that, once both servers
//! hold a valid input ([`crate::server`]).

use std::collections::{HashMap, HashSet};
use std::fs::{File, TryLockError};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use suffuse_core::batch::BatchEval;

use crate::dealer::{self, DealReport, DealerError, random};
use crate::keyfile::{Header, KeyFileError, KeyReader};
use crate::ledger::{Ledger, LedgerError};
use crate::plan::{Plan, hex};

/// Why the pool failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// The folder or a set in it could not be read or written.
    #[error("key pool {path}: {error}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
    /// Dealing a set.
    #[error(transparent)]
    Dealer(#[from] DealerError),
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> PoolError + '_ {
    move |error| PoolError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// Why a set cannot serve a query now.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Unusable {
    /// This server has no file for the set.
    #[error("this server holds no key file for set {0}")]
    Missing(String),
    /// Another query holds it.
    #[error("key set {0} is claimed by another query")]
    Claimed(String),
    /// The ledger has it spent.
    #[error(transparent)]
    Spent(LedgerError),
    /// The file is not a usable key file for this set.
    #[error(transparent)]
    KeyFile(KeyFileError),
}

impl Unusable {
    /// Whether the set will never serve (as opposed to: not now). A
    /// missing file is not final: on two machines a server's copy of a set
    /// may arrive after its peer's (rsync lag, or one folder copied first).
    /// Nor is a file refused for its permissions: the operator's `chmod`
    /// makes it usable.
    pub fn is_final(&self) -> bool {
        let denied = |e: &KeyFileError| {
            matches!(e, KeyFileError::Io { error, .. }
                if error.kind() == std::io::ErrorKind::PermissionDenied)
        };
        match self {
            Unusable::Claimed(_) | Unusable::Missing(_) => false,
            Unusable::KeyFile(e) => !denied(e),
            Unusable::Spent(_) => true,
        }
    }
}

/// The first wait before a set that could not serve now is offered again.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);

/// The longest such wait.
const LAST_BACKOFF: Duration = Duration::from_secs(300);

/// A set put aside for a while: when it may be offered again, and the
/// wait after the next refusal.
#[derive(Clone, Copy, Debug)]
struct Deferred {
    until: Instant,
    next: Duration,
}

/// Parses a set folder's name: 32 lowercase hex digits.
pub fn parse_id(name: &str) -> Option<[u8; 16]> {
    let b = name.as_bytes();
    if b.len() != 32 {
        return None;
    }
    let nib = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut id = [0u8; 16];
    for (i, pair) in b.chunks_exact(2).enumerate() {
        id[i] = nib(pair[0])? << 4 | nib(pair[1])?;
    }
    Some(id)
}

/// One server's view of a pool: its own party's files, and the sets it
/// found unusable for good (spent, corrupt), which it stops looking at.
#[derive(Debug)]
pub struct Pool {
    dir: PathBuf,
    party: u8,
    dead: Mutex<HashSet<[u8; 16]>>,
    /// Sets the peer could not take yet, retried after a back-off.
    deferred: Mutex<HashMap<[u8; 16], Deferred>>,
}

impl Pool {
    /// The pool in `dir` (created 0700 if absent), as `party` sees it.
    pub fn open(dir: &Path, party: u8) -> Result<Pool, PoolError> {
        create_dir(dir)?;
        Ok(Pool {
            dir: dir.to_path_buf(),
            party,
            dead: Mutex::new(HashSet::new()),
            deferred: Mutex::new(HashMap::new()),
        })
    }

    /// The pool's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A set's folder.
    pub fn set_dir(&self, id: &[u8; 16]) -> PathBuf {
        self.dir.join(hex(id))
    }

    fn file(&self, id: &[u8; 16]) -> PathBuf {
        self.set_dir(id).join(format!("p{}.keys", self.party))
    }

    /// The sets holding this party's file, oldest first (first dealt, first
    /// served), less those found unusable for good.
    pub fn ids(&self) -> Result<Vec<[u8; 16]>, PoolError> {
        let dead = self.dead.lock().unwrap_or_else(PoisonError::into_inner);
        let deferred = self.deferred.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(io(&self.dir))? {
            let entry = entry.map_err(io(&self.dir))?;
            let Some(id) = entry.file_name().to_str().and_then(parse_id) else {
                continue;
            };
            if dead.contains(&id) || deferred.get(&id).is_some_and(|d| d.until > now) {
                continue;
            }
            // A set folder without this party's file is the peer's only,
            // or spent here: not ours to offer.
            if let Ok(meta) = std::fs::metadata(self.file(&id)) {
                found.push((meta.modified().unwrap_or(SystemTime::UNIX_EPOCH), id));
            }
        }
        found.sort();
        Ok(found.into_iter().map(|(_, id)| id).collect())
    }

    /// Claims set `id` for one query: its file locked, its header checked
    /// against the id, the ledger checked. A set that can never serve is
    /// remembered and not looked at again.
    pub fn claim(&self, id: &[u8; 16], ledger: &Ledger) -> Result<Claim, Unusable> {
        let result = self.try_claim(id, ledger);
        if let Err(e) = &result
            && e.is_final()
        {
            self.forget(id);
        }
        result
    }

    fn try_claim(&self, id: &[u8; 16], ledger: &Ledger) -> Result<Claim, Unusable> {
        let path = self.file(id);
        let lock = File::open(&path).map_err(|_| Unusable::Missing(hex(id)))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err(Unusable::Claimed(hex(id))),
            Err(TryLockError::Error(error)) => {
                return Err(Unusable::KeyFile(KeyFileError::Io { path, error }));
            }
        }
        ledger
            .check_unspent(self.party, id)
            .map_err(Unusable::Spent)?;
        let reader = KeyReader::open_to_serve(&path).map_err(Unusable::KeyFile)?;
        let h = &reader.header;
        if &h.key_set != id || h.party != self.party {
            return Err(Unusable::KeyFile(KeyFileError::Header {
                path,
                what: format!(
                    "party {}'s key set {} filed as party {}'s set {}",
                    h.party,
                    hex(&h.key_set),
                    self.party,
                    hex(id)
                ),
            }));
        }
        Ok(Claim {
            id: *id,
            dir: self.set_dir(id),
            file: path,
            party: self.party,
            ledger: ledger.clone(),
            reader: Some(reader),
            _lock: lock,
        })
    }

    /// Claims the oldest set that can serve, or `None` when the pool holds
    /// none that is not claimed, spent or excluded by `skip`.
    pub fn claim_next(
        &self,
        ledger: &Ledger,
        skip: &dyn Fn(&[u8; 16]) -> bool,
    ) -> Result<Option<Claim>, PoolError> {
        for id in self.ids()? {
            if skip(&id) {
                continue;
            }
            match self.claim(&id, ledger) {
                Ok(c) => return Ok(Some(c)),
                Err(Unusable::Claimed(_)) => {}
                Err(e) => crate::logline::line(self.party, &format!("skipping a key set: {e}")),
            }
        }
        Ok(None)
    }

    /// Puts set `id` aside for a while (its peer has no copy yet, say): it
    /// is offered again after 1 s, then after twice as long at each refusal,
    /// up to 5 minutes.
    pub fn defer(&self, id: &[u8; 16]) {
        let mut deferred = self.deferred.lock().unwrap_or_else(PoisonError::into_inner);
        let wait = deferred.get(id).map_or(FIRST_BACKOFF, |d| d.next);
        let next = (wait * 2).min(LAST_BACKOFF);
        deferred.insert(
            *id,
            Deferred {
                until: Instant::now() + wait,
                next,
            },
        );
    }

    /// Clears away this party's files of sets its ledger has spent: what a
    /// crash between the ledger entry and the delete leaves (issue 27).
    /// Each is deleted, or with `keep` renamed `pN.keys.spent`, and its set
    /// folder removed once empty. Returns how many were cleared.
    pub fn sweep_spent(&self, ledger: &Ledger, keep: bool) -> Result<usize, PoolError> {
        let mut cleared = 0;
        for id in self.ids()? {
            if !matches!(
                ledger.check_unspent(self.party, &id),
                Err(LedgerError::Spent { .. })
            ) {
                continue;
            }
            let file = self.file(&id);
            let gone = match keep {
                true => std::fs::rename(&file, spent_name(&file)),
                false => std::fs::remove_file(&file),
            };
            if gone.is_ok() {
                cleared += 1;
            }
            let _ = std::fs::remove_dir(self.set_dir(&id));
        }
        Ok(cleared)
    }

    /// Stops offering set `id` for good (spent, corrupt, for another plan).
    pub fn forget(&self, id: &[u8; 16]) {
        self.dead
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(*id);
    }
}

/// A set claimed for one query: its reader, and the lock that keeps every
/// other query off it until this one ends.
#[derive(Debug)]
pub struct Claim {
    id: [u8; 16],
    dir: PathBuf,
    /// This party's file of the set, and the ledger that says whether the
    /// query spent it.
    file: PathBuf,
    party: u8,
    ledger: Ledger,
    reader: Option<KeyReader>,
    _lock: File,
}

impl Claim {
    /// The set's id.
    pub fn id(&self) -> &[u8; 16] {
        &self.id
    }

    /// The reader, positioned after the header (once).
    pub fn take_reader(&mut self) -> Option<KeyReader> {
        self.reader.take()
    }

    /// The reader's header, while the claim holds it.
    pub fn header(&self) -> Option<&crate::keyfile::Header> {
        self.reader.as_ref().map(|r| &r.header)
    }

    /// The reader, while the claim holds it.
    pub fn reader(&self) -> Option<&KeyReader> {
        self.reader.as_ref()
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        // A spent file that is still there (`--keep-spent`, or one that
        // could not be deleted) leaves the pool's namespace: renamed
        // `pN.keys.spent`, it is kept, but no server offers it and the
        // dealer's `--keep-pool` no longer counts its set as unspent.
        if self.file.exists() && self.ledger.check_unspent(self.party, &self.id).is_err() {
            let _ = std::fs::rename(&self.file, spent_name(&self.file));
        }
        // The last server to spend its file removes the emptied set folder;
        // while the other file is there the removal fails, as it should.
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Where a kept spent key file goes: `pN.keys.spent` beside it.
fn spent_name(file: &Path) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(".spent");
    PathBuf::from(name)
}

fn create_dir(dir: &Path) -> Result<(), PoolError> {
    crate::private::private_dir(dir).map_err(io(dir))
}

/// Deals one key set for `plan` into the pool at `dir`: both files in a
/// hidden folder first, then renamed to the set's id.
pub fn deal_set(plan: &Plan, dir: &Path, fss: &dyn BatchEval) -> Result<DealReport, PoolError> {
    create_dir(dir)?;
    let temp = dir.join(format!("{DEALING}{}", hex(&random::<8>()?)));
    create_dir(&temp)?;
    // Held while this process deals: a later dealer's sweep takes the
    // folder for stale only once the lock is free (its holder died).
    let lock_path = temp.join(LOCK);
    let lock = File::create(&lock_path)
        .and_then(|f| f.lock().map(|()| f))
        .map_err(io(&lock_path))?;
    let dealt = dealer::deal(plan, &temp, (false, dealer::KeysFor::Later), fss)
        .map_err(PoolError::from)
        .and_then(|r| {
            std::fs::remove_file(&lock_path)
                .map(|()| r)
                .map_err(io(&lock_path))
        });
    let mut report = match dealt {
        Ok(r) => r,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&temp);
            return Err(e);
        }
    };
    drop(lock);
    let target = dir.join(hex(&report.key_set));
    // rename(2) would replace an empty folder of that name: refuse any.
    if std::fs::symlink_metadata(&target).is_ok() {
        let _ = std::fs::remove_dir_all(&temp);
        let error = std::io::Error::new(std::io::ErrorKind::AlreadyExists, "set folder exists");
        return Err(io(&target)(error));
    }
    std::fs::rename(&temp, &target).map_err(io(&target))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))?;
    report.files = dealer::key_paths(&target);
    Ok(report)
}

/// The prefix of a set folder being dealt.
const DEALING: &str = ".dealing-";

/// The lock file a dealer holds inside the folder it deals into.
const LOCK: &str = ".lock";

/// A folder being dealt with no lock file yet is taken for stale after this
/// long without a change.
const STALE_UNLOCKED: Duration = Duration::from_secs(600);

/// Removes the `.dealing-*` folders that dealers killed mid-deal left
/// behind (hundreds of MB each): those whose lock no process holds. Run
/// when a dealer starts; returns how many it removed.
pub fn sweep_stale_deals(dir: &Path) -> Result<usize, PoolError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io(dir)(e)),
    };
    let mut removed = 0;
    for entry in entries {
        let entry = entry.map_err(io(dir))?;
        if !entry.file_name().to_string_lossy().starts_with(DEALING) {
            continue;
        }
        let path = entry.path();
        let stale = match File::open(path.join(LOCK)) {
            Ok(f) => f.try_lock().is_ok(),
            Err(_) => entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > STALE_UNLOCKED),
        };
        if stale && std::fs::remove_dir_all(&path).is_ok() {
            removed += 1;
        }
    }
    Ok(removed)
}

/// Sets in the pool that can still serve a query, as the dealer sees them
/// when it keeps the pool topped up: both parties' key files are there.
/// A set one server has spent (its file deleted, or renamed `.spent` under
/// `--keep-spent`), or one left with a single file by a crash, does not
/// count. A pool folder that does not exist yet holds none.
pub fn unspent_sets(dir: &Path) -> Result<usize, PoolError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io(dir)(e)),
    };
    let mut n = 0;
    for entry in entries {
        let entry = entry.map_err(io(dir))?;
        if entry.file_name().to_str().and_then(parse_id).is_none() {
            continue;
        }
        let files = dealer::key_paths(&entry.path());
        if files.iter().all(|f| f.exists()) {
            n += 1;
        }
    }
    Ok(n)
}

/// The headers of `party`'s key files in the pool at `dir`, one per set
/// folder holding that file (so unspent, as this party sees it); `None`
/// for a file whose header cannot be read. A folder that cannot be listed
/// holds none.
pub fn headers(dir: &Path, party: u8) -> Vec<Option<Header>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        if entry.file_name().to_str().and_then(parse_id).is_none() {
            continue;
        }
        let Ok(f) = File::open(entry.path().join(format!("p{party}.keys"))) else {
            continue;
        };
        // The header and its summary are well under 1 MiB.
        let mut head = Vec::new();
        let header = f
            .take(1 << 20)
            .read_to_end(&mut head)
            .ok()
            .and_then(|_| crate::keyfile::parse_header_bytes(&head).ok());
        found.push(header);
    }
    found
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Issue 27: a set whose ledger entry exists but whose file a crash
    /// left behind is cleared when the server starts; an unspent one stays.
    #[test]
    fn a_starting_server_clears_files_its_ledger_has_spent() {
        use std::os::unix::fs::DirBuilderExt;
        let d = std::env::temp_dir().join(format!("suffuse-pool-orphan-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::DirBuilder::new().mode(0o700).create(&d).unwrap();
        let pool = Pool::open(&d.join("pool"), 1).unwrap();
        let ledger = Ledger::open(&d.join("state")).unwrap();
        let (spent, unspent) = ([1u8; 16], [2u8; 16]);
        for id in [spent, unspent] {
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(pool.set_dir(&id))
                .unwrap();
            std::fs::write(pool.file(&id), b"keys").unwrap();
        }
        ledger.spend(1, &spent).unwrap();
        assert_eq!(pool.sweep_spent(&ledger, false).unwrap(), 1);
        assert!(!pool.set_dir(&spent).exists());
        assert!(pool.file(&unspent).exists());
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Issue 27: a `.dealing-*` folder whose lock no one holds (its dealer
    /// was killed) is swept; one whose lock is held, or a fresh one without
    /// a lock, is left to its dealer.
    #[test]
    fn stale_half_dealt_folders_are_swept_and_live_ones_kept() {
        use std::os::unix::fs::DirBuilderExt;
        let d = std::env::temp_dir().join(format!("suffuse-pool-sweep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let mk = |name: &str| {
            let p = d.join(name);
            std::fs::DirBuilder::new()
                .mode(0o700)
                .recursive(true)
                .create(&p)
                .unwrap();
            p
        };
        let dead = mk(".dealing-dead");
        File::create(dead.join(LOCK)).unwrap();
        std::fs::write(dead.join(".p0.keys.dealing-x"), b"half a key file").unwrap();
        let live = mk(".dealing-live");
        let held = File::create(live.join(LOCK)).unwrap();
        held.lock().unwrap();
        let fresh = mk(".dealing-fresh");
        let set = mk(&hex(&[7; 16]));
        assert_eq!(sweep_stale_deals(&d).unwrap(), 1);
        assert!(!dead.exists() && live.exists() && fresh.exists() && set.exists());
        drop(held);
        assert_eq!(sweep_stale_deals(&d).unwrap(), 1);
        assert!(!live.exists() && fresh.exists());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn ids_round_trip_through_folder_names() {
        let id = [0xa5, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 0xff];
        assert_eq!(parse_id(&hex(&id)), Some(id));
        assert_eq!(parse_id(".dealing-00"), None);
        assert_eq!(parse_id(&hex(&id).to_uppercase()), None);
        assert_eq!(parse_id(&format!("{}0", hex(&id))), None);
    }
}
