//! `strace -c -f -p PID`: the server's syscalls while a load runs, divided by the requests the
//! load generator completed. strace slows the traced server a lot, so these runs are never
//! used for a rate.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::{Error, Result};

/// One syscall's row of the summary.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SyscallRow {
    /// Name.
    pub name: String,
    /// Calls.
    pub calls: u64,
    /// Calls that failed.
    pub errors: u64,
}

/// The parsed `-c` summary: the rows, and the total line.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Summary {
    /// Rows, most time first (strace's order).
    pub rows: Vec<SyscallRow>,
    /// Total calls.
    pub calls: u64,
    /// Total failed calls.
    pub errors: u64,
}

/// Parses strace's `-c` table.
pub fn parse(text: &str) -> Summary {
    let mut s = Summary::default();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // "% time seconds usecs/call calls [errors] syscall"
        if f.len() < 5 || f[0].parse::<f64>().is_err() {
            continue;
        }
        let name = f[f.len() - 1].to_string();
        let calls: u64 = f[3].parse().unwrap_or(0);
        let errors: u64 = if f.len() >= 6 {
            f[4].parse().unwrap_or(0)
        } else {
            0
        };
        if name == "total" {
            s.calls = calls;
            s.errors = errors;
        } else {
            s.rows.push(SyscallRow {
                name,
                calls,
                errors,
            });
        }
    }
    s
}

/// A running `strace -c -f -p PID -o FILE`; [`Tracer::finish`] detaches it and parses.
pub struct Tracer {
    child: Child,
    out: PathBuf,
}

impl Tracer {
    /// Attaches to `pids` (every process of the server: nginx's workers are already running,
    /// `-f` only follows children forked later) and their threads.
    pub fn attach(bin: &Path, pids: &[u32], out: &Path) -> Result<Tracer> {
        let _ = std::fs::remove_file(out);
        let mut cmd = Command::new(bin);
        cmd.args(["-c", "-f"]);
        for p in pids {
            cmd.arg("-p").arg(p.to_string());
        }
        let child = cmd
            .arg("-o")
            .arg(out)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| Error::io(format!("run {}", bin.display()), e))?;
        // strace attaches within milliseconds; give it a margin on a busy machine.
        std::thread::sleep(std::time::Duration::from_millis(700));
        Ok(Tracer {
            child,
            out: out.to_path_buf(),
        })
    }

    /// SIGINT (strace detaches and writes its summary), wait, parse.
    #[allow(unsafe_code)]
    pub fn finish(mut self) -> Result<Summary> {
        // SAFETY: kill(2) on our own child's pid, not reaped yet.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGINT);
        }
        let st = self
            .child
            .wait()
            .map_err(|e| Error::io("wait for strace", e))?;
        let text =
            std::fs::read_to_string(&self.out).map_err(|e| Error::path("read", &self.out, e))?;
        let s = parse(&text);
        if s.calls == 0 {
            return Err(Error::Other(format!(
                "strace ({st}) wrote no summary to {}",
                self.out.display()
            )));
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_table_parses() {
        let s = parse(include_str!("fixtures/strace-h2o.txt"));
        assert_eq!(s.calls, 24347);
        assert_eq!(s.errors, 13);
        assert_eq!(s.rows.len(), 11);
        assert_eq!(
            s.rows[0],
            SyscallRow {
                name: "writev".into(),
                calls: 5705,
                errors: 0
            }
        );
        let read = s.rows.iter().find(|r| r.name == "read").unwrap();
        assert_eq!((read.calls, read.errors), (5714, 7));
        assert_eq!(s.rows.iter().map(|r| r.calls).sum::<u64>(), s.calls);
    }

    #[test]
    fn no_table_is_no_summary() {
        assert_eq!(
            parse("strace: attach: ptrace(PTRACE_SEIZE, 1): Operation not permitted\n").calls,
            0
        );
    }
}
