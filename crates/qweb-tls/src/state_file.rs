//! Files qweb writes into folders others may control (its state folder): each is created
//! under a fresh temporary name with `O_CREAT|O_EXCL` (which never follows a symlink, nor
//! opens a file someone placed there), then renamed over its final name (a rename replaces
//! a symlink, it does not write through it). And the start-up check of folders and secret
//! files that other users can write or read.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Writes `bytes` to `path` as a new file of `mode` (e.g. `0o600` for a key), through a
/// temporary name in the same folder; `prepare` runs on the open file before it takes its
/// name (e.g. to lock it). Returns the file, still open.
pub fn write_replacing(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    prepare: impl FnOnce(&File) -> io::Result<()>,
) -> io::Result<File> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?
        .to_string_lossy()
        .into_owned();
    let mut attempt = 0;
    let (tmp, mut file) = loop {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let tmp = dir.join(format!(
            ".{name}.{}.{nanos:08x}{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let mut opts = std::fs::OpenOptions::new();
        // create_new: O_CREAT|O_EXCL, refused when anything (a symlink too) has that name
        opts.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(mode);
        }
        match opts.open(&tmp) {
            Ok(f) => break (tmp, f),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < 16 => attempt += 1,
            Err(e) => return Err(e),
        }
    };
    let done = (|| {
        file.write_all(bytes)?;
        prepare(&file)?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = done {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(file)
}

/// What is wrong with `path`'s permissions, if anything: a folder (e.g. the state folder)
/// that users other than its owner may write, or a secret file (a private key, ticket keys)
/// that others may read or that anyone but its owner may write. `None` when fine or when it
/// cannot be read.
pub fn exposed(path: &Path, secret: bool) -> Option<String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(path).ok()?;
        let mode = meta.permissions().mode() & 0o7777;
        if meta.is_dir() {
            if mode & 0o022 != 0 {
                return Some(format!(
                    "{} (mode {mode:04o}) can be written by other users: they can replace the files qweb keeps there",
                    path.display()
                ));
            }
        } else if secret && mode & 0o026 != 0 {
            return Some(format!(
                "{} (mode {mode:04o}) can be {} by other users; make it 0600 (or 0640)",
                path.display(),
                if mode & 0o004 != 0 { "read" } else { "written" }
            ));
        }
        None
    }
    #[cfg(not(unix))]
    {
        let _ = (path, secret);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_planted_symlink_is_replaced_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let target = dir.path().join("out");
        #[cfg(unix)]
        std::os::unix::fs::symlink(&victim, &target).unwrap();
        write_replacing(&target, b"new", 0o600, |_| Ok(())).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        assert!(!std::fs::symlink_metadata(&target)
            .unwrap()
            .file_type()
            .is_symlink());
        // no temporary file left behind
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[cfg(unix)]
    #[test]
    fn exposed_folders_and_keys() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let set = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        set(dir.path(), 0o700);
        assert!(exposed(dir.path(), false).is_none());
        set(dir.path(), 0o777);
        assert!(exposed(dir.path(), false).is_some());
        set(dir.path(), 0o700);
        let key = dir.path().join("k");
        std::fs::write(&key, "k").unwrap();
        for (m, bad) in [(0o600, false), (0o640, false), (0o644, true), (0o620, true)] {
            set(&key, m);
            assert_eq!(exposed(&key, true).is_some(), bad, "{m:o}");
        }
        assert!(exposed(&key, false).is_none(), "not a secret");
    }
}
