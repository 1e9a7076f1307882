//! Who may use the files and folders that hold secrets: key files, TLS
//! private keys, ledgers. A folder that others can use is refused before
//! anything is written into it; a secret file that others can read or
//! write is refused when it is opened, as `ssh` refuses an unprotected
//! private key, and one that its group can is accepted with a warning
//! (a service group sharing a read-only secret mount is a deliberate
//! setup; others are not).

use std::fs::Metadata;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Makes `dir` (and any missing parent) mode 0700, or checks that the
/// folder already there is its owner's alone.
///
/// Every folder suffuse writes secrets or its ledger into goes through
/// here. `mkdir` does not change the mode of a folder that exists, and
/// tightening it silently could lock others out of a shared folder they
/// rely on (`--out /tmp` would make `/tmp` private), so a folder that group
/// or others can enter, read or write is refused, before anything is
/// written, with the fix in the message.
pub fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let mode = std::fs::metadata(dir)?.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "the folder is open to group or others (mode {mode:03o}), and secrets go only \
                 into a folder its owner alone can use: `chmod 700` it, or name a new folder"
            ),
        ));
    }
    Ok(())
}

/// Checks the mode of a secret file, `meta` being its metadata (of the
/// file itself, links resolved): `Err` if others may read or write it (its
/// message for the caller to put after the path), `Ok(Some(warning))` if
/// its group may, `Ok(None)` if only its owner may.
pub fn check_file(path: &Path, meta: &Metadata) -> io::Result<Option<String>> {
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o006 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "it holds a secret but others may read or write it (mode {mode:03o}): \
                 `chmod 600` it (on a secret mount, give its files mode 0400)"
            ),
        ));
    }
    Ok((mode & 0o060 != 0).then(|| {
        format!(
            "{} holds a secret and its group may read or write it (mode {mode:03o}); \
             `chmod 600` it unless that group is meant to",
            path.display()
        )
    }))
}

/// Prints `warning` on stderr, made printable.
pub fn warn(warning: &str) {
    eprintln!("suffuse: warning: {}", crate::logline::printable(warning));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::DirBuilderExt;
    use std::path::PathBuf;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("suffuse-private-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::DirBuilder::new().mode(0o700).create(&d).unwrap();
        d
    }

    #[test]
    fn secrets_go_only_into_a_private_folder() {
        use std::os::unix::fs::PermissionsExt;
        let d = tmp("dirs");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        // Created, parents included, 0700 whatever the umask.
        let new = d.join("a/b");
        private_dir(&new).unwrap();
        assert_eq!((mode(&d.join("a")), mode(&new)), (0o700, 0o700));
        // An existing private folder is used as it is.
        private_dir(&new).unwrap();
        // One that group or others can reach is refused, and left as found.
        for open in [0o755, 0o750, 0o701, 0o702, 0o740] {
            std::fs::set_permissions(&new, std::fs::Permissions::from_mode(open)).unwrap();
            let e = private_dir(&new).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
            assert!(e.to_string().contains(&format!("mode {open:03o}")), "{e}");
            assert!(e.to_string().contains("chmod 700"), "{e}");
            assert_eq!(mode(&new), open);
        }
        // A file where the folder should be is an error too.
        std::fs::write(d.join("file"), b"").unwrap();
        assert!(private_dir(&d.join("file")).is_err());
    }

    #[test]
    fn secret_files_open_to_others_are_refused_and_to_the_group_warned_of() {
        let d = tmp("files");
        let f = d.join("p0.keys");
        std::fs::write(&f, b"").unwrap();
        let check = |m: u32| {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(m)).unwrap();
            check_file(&f, &std::fs::metadata(&f).unwrap())
        };
        for m in [0o600, 0o400, 0o700] {
            assert_eq!(check(m).unwrap(), None, "{m:03o}");
        }
        for m in [0o640, 0o620, 0o660] {
            let w = check(m).unwrap().unwrap();
            assert!(w.contains(&format!("mode {m:03o}")), "{w}");
        }
        for m in [0o644, 0o604, 0o602, 0o666] {
            let e = check(m).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
            assert!(e.to_string().contains("chmod 600"), "{e}");
        }
    }
}
