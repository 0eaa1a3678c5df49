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

/// The running instance's pid file: written at start, removed on drop (a clean exit).
#[derive(Debug)]
pub struct PidFile {
    path: PathBuf,
}

impl PidFile {
    /// Writes this process's pid to `<state_dir>/qweb.pid` (the folder is created).
    pub fn write(state_dir: &Path) -> io::Result<PidFile> {
        std::fs::create_dir_all(state_dir)?;
        let path = pid_file(state_dir);
        // written whole then renamed: a reader never sees a partial number
        let tmp = state_dir.join(format!(".qweb.pid.{}", std::process::id()));
        std::fs::write(&tmp, format!("{}\n", std::process::id()))?;
        std::fs::rename(&tmp, &path)?;
        Ok(PidFile { path })
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
    let text = std::fs::read_to_string(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => ControlError::NoPidFile(path.to_owned()),
        _ => ControlError::BadPidFile {
            path: path.to_owned(),
            message: e.to_string(),
        },
    })?;
    text.trim()
        .parse::<i32>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| ControlError::BadPidFile {
            path: path.to_owned(),
            message: format!("{:?}", text.trim()),
        })
}

/// Sends `signal` to the instance whose pid file is in `state_dir`; returns its pid.
pub fn signal_instance(state_dir: &Path, signal: Signal) -> Result<i32, ControlError> {
    let path = pid_file(state_dir);
    let pid = read_pid(&path)?;
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
        // a pid past pid_max: no such process
        std::fs::write(pid_file(dir.path()), "2147483000\n").unwrap();
        let e = signal_instance(dir.path(), RELOAD).unwrap_err();
        assert!(matches!(e, ControlError::NotRunning { .. }), "{e}");
    }

    #[test]
    fn the_pid_file_holds_our_pid_and_goes_with_us() {
        let dir = tempfile::tempdir().unwrap();
        let f = PidFile::write(dir.path()).unwrap();
        assert_eq!(read_pid(f.path()).unwrap(), std::process::id() as i32);
        let path = f.path().to_owned();
        drop(f);
        assert!(!path.exists());
    }
}
