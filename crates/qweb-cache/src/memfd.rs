//! Large stored bodies live in sealed `memfd`s, mapped: the entry's body is the mapping (so
//! every path that reads bytes reads them as before), and its file lets a plain HTTP/1.1
//! response send them with `sendfile(2)` ([`qweb_http::body::FileBytes`]): the kernel takes
//! the pages into the socket without the copy from user space that a `writev` makes (30 % of
//! the worker's CPU on a 100 KiB hit, docs/BENCHMARKS.md).
//!
//! Each such body holds a descriptor, so at most [`MAX_FILES`] live at once (a quarter of the
//! open-file limit when that is less: `max_files`); beyond, bodies stay in ordinary memory. A
//! file is sealed against writes, growth, shrinking and further seals before it is mapped: its
//! content cannot change while anything reads it.

use std::fs::File;
use std::io::{self, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use qweb_http::body::FileBytes;
use rustix::fs::{fcntl_add_seals, memfd_create, MemfdFlags, SealFlags};

/// Bodies smaller than this stay in ordinary memory (a `sendfile` call of their own would
/// cost more than the copy it saves).
pub const MIN_BODY: usize = 32 * 1024;

/// Bodies in memfds at most (each holds a descriptor while it lives); fewer when the process's
/// open-file limit is small ([`max_files`]).
pub const MAX_FILES: usize = 1024;

/// [`MAX_FILES`], or a quarter of the soft `RLIMIT_NOFILE` when that is less (read once): the
/// cache never takes the descriptors its connections need (a hard limit of 1024 leaves it
/// 256).
fn max_files() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(u64::MAX);
        MAX_FILES.min(usize::try_from(soft / 4).unwrap_or(usize::MAX))
    })
}

static LIVE: AtomicUsize = AtomicUsize::new(0);

/// A mapping counted in [`LIVE`] while it lives.
struct Mapped(memmap2::Mmap);

impl AsRef<[u8]> for Mapped {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        LIVE.fetch_sub(1, Ordering::Relaxed);
    }
}

/// `body` in a sealed memfd, when it is large enough and a slot is free; `None`: keep it in
/// memory as it is (also when the kernel refuses: never an error for the caller).
pub(crate) fn seal(body: &[u8]) -> Option<FileBytes> {
    if body.len() < MIN_BODY {
        return None;
    }
    if LIVE.fetch_add(1, Ordering::Relaxed) >= max_files() {
        LIVE.fetch_sub(1, Ordering::Relaxed);
        return None;
    }
    match sealed(body) {
        Ok(f) => Some(f),
        Err(e) => {
            LIVE.fetch_sub(1, Ordering::Relaxed);
            tracing::debug!("cache body stays in memory: memfd: {e}");
            None
        }
    }
}

#[allow(unsafe_code)] // one mapping: see the SAFETY note
fn sealed(body: &[u8]) -> io::Result<FileBytes> {
    let fd = memfd_create(
        "qweb-cache",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?;
    let mut file = File::from(fd);
    file.write_all(body)?;
    fcntl_add_seals(
        &file,
        SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL,
    )?;
    // SAFETY: memmap2 asks that the file not change while mapped. It is a memfd that only this
    // function ever had, sealed above against writes, growth, shrinking and new seals: nobody,
    // this process included, can change or truncate its content from here on.
    let map = unsafe { memmap2::Mmap::map(&file)? };
    if map.len() != body.len() {
        return Err(io::Error::other("memfd mapped short"));
    }
    Ok(FileBytes {
        file: Arc::new(file),
        bytes: Bytes::from_owner(Mapped(map)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn a_large_body_is_mapped_from_a_sealed_file_with_the_same_bytes() {
        let body: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
        let f = seal(&body).expect("a memfd");
        assert_eq!(&f.bytes[..], &body[..]);
        let mut back = vec![0; body.len()];
        f.file.read_exact_at(&mut back, 0).unwrap();
        assert_eq!(back, body);
        // sealed: no write, no truncation
        assert!(f.file.write_at(b"x", 0).is_err());
        assert!(f.file.set_len(10).is_err());
        assert_eq!(f.offset_of(&f.bytes.slice(10..20)), Some(10));
        assert!(seal(&body[..MIN_BODY - 1]).is_none());
    }

    /// Many large bodies hold at most [`MAX_FILES`] descriptors; the rest stay in memory, and
    /// a slot freed is taken again.
    #[test]
    fn memfds_are_bounded() {
        let body = vec![7u8; MIN_BODY];
        let mut held = Vec::new();
        while let Some(f) = seal(&body) {
            held.push(f);
            assert!(held.len() <= max_files());
        }
        assert!(max_files() <= MAX_FILES);
        assert!(LIVE.load(Ordering::Relaxed) <= max_files());
        held.pop();
        assert!(seal(&body).is_some(), "a freed slot");
    }
}
