//! Controlling a running `qweb serve` from another process: its pid file in the state folder
//! (`<state_dir>/qweb.pid`), written once it serves and removed when it exits, and the
//! signals `qweb reload` sends through it (as `nginx -s reload`).

use std::io;
use std::path::{Path, PathBuf};

use rustix::process::Pid;
/// A signal to send to the running instance.
pub use rustix::process::Signal;

/// The pid file of the instance that uses `state_dir`.
pub fn pid_file(state_dir: &Path) -> PathBuf {
    state_dir.join("qweb.pid")
}

/// The running instance's pid file: written at start, removed on drop (a clean exit). The
/// process holds an exclusive `flock` on it while it runs: `qweb reload` signals the pid only
/// while that lock is held, so a stale file (a crash, the pid since reused by another
/// process) is refused instead of killing whatever owns that pid now.
#[derive(Debug)]
pub struct PidFile {
    path: PathBuf,
    /// Open (and locked) for as long as we run; close-on-exec, so a binary upgrade's new
    /// process does not inherit the lock (it writes and locks a file of its own).
    _file: std::fs::File,
}

impl PidFile {
    /// Writes this process's pid to `<state_dir>/qweb.pid` (the folder is created): through
    /// a new file (`O_CREAT|O_EXCL`, never a planted symlink), locked, then renamed into
    /// place, so that the name never shows a partial number nor an unlocked file.
    pub fn write(state_dir: &Path) -> io::Result<PidFile> {
        std::fs::create_dir_all(state_dir)?;
        let path = pid_file(state_dir);
        let file = qweb_tls::state_file::write_replacing(
            &path,
            format!("{}\n", std::process::id()).as_bytes(),
            0o644,
            |f| {
                rustix::fs::flock(f, rustix::fs::FlockOperation::NonBlockingLockExclusive)
                    .map_err(io::Error::from)
            },
        )?;
        Ok(PidFile { path, _file: file })
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        // only our own: a newer instance (binary upgrade) may have written its pid since
        if read_pid(&self.path).ok() == Some(std::process::id() as i32) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// What is wrong with `path`'s permissions (see [`qweb_tls::state_file::exposed`]).
pub fn exposed(path: &Path, secret: bool) -> Option<String> {
    qweb_tls::state_file::exposed(path, secret)
}

/// What in `config` other users can tamper with or read (logged as warnings at start): the
/// state folder (pid file, self-signed key, welcome site) when others may write it, and
/// private keys and ticket key files that others may read or write.
pub fn exposed_files(config: &crate::config::Config) -> Vec<String> {
    use crate::config::{TicketKeys, TlsConfig};
    let mut out = Vec::new();
    let mut check = |p: &Path, secret: bool| {
        if let Some(w) = exposed(p, secret) {
            if !out.contains(&w) {
                out.push(w);
            }
        }
    };
    check(&config.state_dir, false);
    for l in &config.listeners {
        match &l.tls {
            Some(TlsConfig::SelfSigned) => check(&config.state_dir.join("selfsigned.key"), true),
            Some(TlsConfig::Certificates(list)) => {
                for c in list {
                    if let Some(k) = &c.key {
                        check(k, true);
                    }
                }
            }
            None => {}
        }
        if let TicketKeys::File(p) = &l.session.ticket_keys {
            check(p, true);
        }
    }
    out
}

/// Why no running instance could be signalled.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// No pid file.
    #[error("no running qweb: no pid file at {0} (is `qweb serve` running with this state_dir?)")]
    NoPidFile(PathBuf),
    /// The pid file does not hold a pid.
    #[error("no running qweb: {path} does not hold a process id ({message})")]
    BadPidFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The process is gone (a stale pid file).
    #[error("no running qweb: process {pid} named in {path} is not running")]
    NotRunning {
        /// The pid.
        pid: i32,
        /// The file.
        path: PathBuf,
    },
    /// The pid file is not locked: no qweb holds it (a crash left it; its pid may be another
    /// program's by now).
    #[error("no running qweb: {path} names process {pid}, but no qweb holds that pid file (left by a crash?); not signalling it. Remove the file if no qweb runs with this state_dir")]
    Stale {
        /// The pid.
        pid: i32,
        /// The file.
        path: PathBuf,
    },
    /// The signal could not be sent.
    #[error("cannot signal process {pid}: {source}")]
    Signal {
        /// The pid.
        pid: i32,
        /// The error.
        source: io::Error,
    },
}

fn read_pid(path: &Path) -> Result<i32, ControlError> {
    read_pid_file(path).map(|(pid, _)| pid)
}

/// The pid in `path`, and the file, open.
fn read_pid_file(path: &Path) -> Result<(i32, std::fs::File), ControlError> {
    use std::io::Read;
    let bad = |message: String| ControlError::BadPidFile {
        path: path.to_owned(),
        message,
    };
    let mut file = std::fs::File::open(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => ControlError::NoPidFile(path.to_owned()),
        _ => bad(e.to_string()),
    })?;
    let mut text = String::new();
    (&mut file)
        .take(64)
        .read_to_string(&mut text)
        .map_err(|e| bad(e.to_string()))?;
    let pid = text
        .trim()
        .parse::<i32>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| bad(format!("{:?}", text.trim())))?;
    Ok((pid, file))
}

/// Whether a running qweb holds `file`'s lock (taken by [`PidFile::write`]).
fn held_by_a_running_qweb(file: &std::fs::File) -> Result<bool, io::Error> {
    use rustix::fs::{flock, FlockOperation};
    match flock(file, FlockOperation::NonBlockingLockShared) {
        Ok(()) => {
            // nobody holds it: give it back at once
            let _ = flock(file, FlockOperation::Unlock);
            Ok(false)
        }
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(true),
        Err(e) => Err(e.into()),
    }
}

/// Sends `signal` to the instance whose pid file is in `state_dir`; returns its pid.
pub fn signal_instance(state_dir: &Path, signal: Signal) -> Result<i32, ControlError> {
    let path = pid_file(state_dir);
    let (pid, file) = read_pid_file(&path)?;
    match held_by_a_running_qweb(&file) {
        Ok(true) => {}
        Ok(false) => return Err(ControlError::Stale { pid, path }),
        Err(e) => {
            return Err(ControlError::BadPidFile {
                path,
                message: format!("cannot check its lock: {e}"),
            })
        }
    }
    let target = Pid::from_raw(pid).ok_or_else(|| ControlError::BadPidFile {
        path: path.clone(),
        message: pid.to_string(),
    })?;
    rustix::process::kill_process(target, signal).map_err(|e| {
        if e == rustix::io::Errno::SRCH {
            ControlError::NotRunning { pid, path }
        } else {
            ControlError::Signal {
                pid,
                source: e.into(),
            }
        }
    })?;
    Ok(pid)
}

/// SIGHUP: reload the configuration.
pub const RELOAD: Signal = Signal::HUP;
/// SIGUSR2: binary upgrade (start the new binary with the listening sockets, then drain).
pub const UPGRADE: Signal = Signal::USR2;
/// SIGUSR1: reopen the log files.
pub const REOPEN_LOGS: Signal = Signal::USR1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_pid_file_stale_pid_and_garbage_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let e = signal_instance(dir.path(), RELOAD).unwrap_err();
        assert!(matches!(e, ControlError::NoPidFile(_)), "{e}");
        std::fs::write(pid_file(dir.path()), "not a pid\n").unwrap();
        let e = signal_instance(dir.path(), RELOAD).unwrap_err();
        assert!(matches!(e, ControlError::BadPidFile { .. }), "{e}");
        std::fs::write(pid_file(dir.path()), "-1\n").unwrap();
        assert!(signal_instance(dir.path(), RELOAD).is_err());
        // a file no qweb holds (left by a crash): refused whatever pid it names
        std::fs::write(pid_file(dir.path()), "2147483000\n").unwrap();
        let e = signal_instance(dir.path(), RELOAD).unwrap_err();
        assert!(matches!(e, ControlError::Stale { .. }), "{e}");
        // locked (as a running qweb does), naming a pid past pid_max: no such process
        let held = std::fs::File::open(pid_file(dir.path())).unwrap();
        rustix::fs::flock(&held, rustix::fs::FlockOperation::LockExclusive).unwrap();
        let e = signal_instance(dir.path(), RELOAD).unwrap_err();
        assert!(matches!(e, ControlError::NotRunning { .. }), "{e}");
    }

    #[test]
    fn the_pid_file_holds_our_pid_and_goes_with_us() {
        let dir = tempfile::tempdir().unwrap();
        let f = PidFile::write(dir.path()).unwrap();
        assert_eq!(read_pid(f.path()).unwrap(), std::process::id() as i32);
        let (_, file) = read_pid_file(f.path()).unwrap();
        assert!(
            held_by_a_running_qweb(&file).unwrap(),
            "locked while we run"
        );
        let path = f.path().to_owned();
        drop(f);
        assert!(!path.exists());
    }

    /// Whoever can write the state folder plants symlinks at the names the pid file used to
    /// be written through (`.qweb.pid.<pid>`) and at the pid file itself: the files they
    /// point at are untouched.
    #[test]
    fn the_pid_file_is_never_written_through_a_planted_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let tmp = dir.path().join(format!(".qweb.pid.{}", std::process::id()));
        std::os::unix::fs::symlink(&victim, &tmp).unwrap();
        std::os::unix::fs::symlink(&victim, pid_file(dir.path())).unwrap();
        let f = PidFile::write(dir.path()).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(read_pid(f.path()).unwrap(), std::process::id() as i32);
    }
}
