//! Where access-log lines go: stdout, or `[log] access_file` (appended, created 0640),
//! reopened by SIGUSR1 after logrotate moved it, and switched by a reload that changes the
//! path.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tracing_subscriber::fmt::MakeWriter;

enum Target {
    Stdout,
    File { path: PathBuf, file: File },
}

/// The access log's destination, shared by the logging layer and the signal loop.
#[derive(Clone)]
pub struct AccessSink(Arc<Mutex<Target>>);

fn open(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o640)
        .open(path)
}

impl AccessSink {
    /// Lines to `path`, or to stdout when `None`.
    pub fn new(path: Option<&Path>) -> io::Result<AccessSink> {
        let target = match path {
            Some(p) => Target::File {
                path: p.to_owned(),
                file: open(p)?,
            },
            None => Target::Stdout,
        };
        Ok(AccessSink(Arc::new(Mutex::new(target))))
    }

    fn lock(&self) -> MutexGuard<'_, Target> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reopens the file at its path (SIGUSR1: logrotate moved the old one away). On error
    /// the old file stays in use.
    pub fn reopen(&self) -> io::Result<()> {
        let mut t = self.lock();
        if let Target::File { path, file } = &mut *t {
            *file = open(path)?;
        }
        Ok(())
    }

    /// Switches to `path` (a reload changed `access_file`); nothing when it is the same.
    pub fn set_path(&self, path: Option<&Path>) -> io::Result<()> {
        let mut t = self.lock();
        let same = match (&*t, path) {
            (Target::Stdout, None) => true,
            (Target::File { path: old, .. }, Some(new)) => old == new,
            _ => false,
        };
        if !same {
            *t = match path {
                Some(p) => Target::File {
                    path: p.to_owned(),
                    file: open(p)?,
                },
                None => Target::Stdout,
            };
        }
        Ok(())
    }
}

/// One line being written (the layer formats a whole event, then writes it once).
pub struct SinkWriter<'a>(MutexGuard<'a, Target>);

impl Write for SinkWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut *self.0 {
            Target::Stdout => io::stdout().lock().write(buf),
            Target::File { file, .. } => file.write(buf),
        }
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match &mut *self.0 {
            Target::Stdout => io::stdout().lock().write_all(buf),
            Target::File { file, .. } => file.write_all(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut *self.0 {
            Target::Stdout => io::stdout().lock().flush(),
            Target::File { file, .. } => file.flush(),
        }
    }
}

impl<'a> MakeWriter<'a> for AccessSink {
    type Writer = SinkWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        SinkWriter(self.lock())
    }
}
