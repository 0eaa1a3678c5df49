//! Streaming a file from disk in chunks (static files larger than the open-file cache holds,
//! and precompressed sidecars).
//!
//! Reads are synchronous on the worker thread, as nginx does without `aio`: files served are
//! expected to be in the page cache, and a read of one chunk is a memcpy. Memory per response
//! is one chunk. The first chunk is small ([`FIRST_CHUNK`]) and each next one twice the last,
//! up to [`CHUNK`]: HTTP/2 reads one chunk of a stream before it waits for the client's
//! flow-control window, so a stream whose client grants no window holds 16 KiB, not 128 KiB
//! (128 such streams on one connection: 2 MiB), while a stream that flows reaches full-size
//! chunks after three.
//!
//! **File descriptors.** A body does not own its open file between frames: the file sits in
//! its worker's pool of held files, at most `file_cache.held_fds` (default 64) per worker,
//! least recently read closed first. A body asked for its next frame takes its file from the
//! pool (a hash lookup, no system call) or, when the pool closed it meanwhile, opens it again
//! beneath the route's root by the route's symlink rules and checks that it is the same file
//! (device, inode, size, modification time): a file replaced or changed since the response
//! began ends the response with an error, never sends other content. hyper's HTTP/2 server
//! polls a body again only after the client granted window for its previous chunk, so a
//! stream whose client never reads is never polled: its file is the pool's least recently
//! read and is the first closed when other responses need a place. A worker's streamed
//! responses so hold at most `held_fds` files between frames however many streams stall
//! (before: one per stream, 64 connections x 128 streams took 8 192 fds); reads are
//! positional (`pread`), so a reopened file needs no seek.

use std::cell::{Cell, RefCell};
use std::fs::File;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use lru::LruCache;

use super::cache::Identity;
use super::Root;
use qweb_http::body::BoxError;
use qweb_session::ReadAhead;

/// Largest read per frame.
pub(crate) const CHUNK: usize = 128 * 1024;
/// The first read of a body.
pub(crate) const FIRST_CHUNK: usize = 16 * 1024;
/// Files a worker keeps open between the frames of its streamed bodies, unless configured
/// (`file_cache.held_fds`).
pub(crate) const DEFAULT_HELD_FDS: usize = 64;

/// This worker's open files of streamed bodies, by body id, least recently read first out.
struct Held {
    files: LruCache<u64, File>,
    limit: usize,
}

thread_local! {
    static HELD: RefCell<Held> = RefCell::new(Held {
        files: LruCache::unbounded(),
        limit: DEFAULT_HELD_FDS,
    });
    static NEXT_ID: Cell<u64> = const { Cell::new(1) };
}

impl Held {
    /// Keeps `file` for body `id`, closing the least recently read files beyond the limit
    /// (possibly `file` itself, when the limit is 0).
    fn keep(&mut self, id: u64, file: File) {
        self.files.push(id, file);
        while self.files.len() > self.limit {
            self.files.pop_lru();
        }
    }
}

/// Sets how many files this worker keeps open between frames (`file_cache.held_fds`); files
/// beyond it are closed now.
pub(crate) fn set_held_fds(limit: usize) {
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        h.limit = limit;
        while h.files.len() > limit {
            h.files.pop_lru();
        }
    });
}

/// Files this worker holds open between frames now.
#[cfg(test)]
pub(crate) fn held_fds() -> usize {
    HELD.with(|h| h.borrow().files.len())
}

/// Where a body's file is found again after its worker closed it.
pub(crate) struct Reopen {
    /// The route's root: the file is opened beneath it, by the route's symlink rules.
    pub root: Arc<Root>,
    /// The file's path relative to the root.
    pub rel: Arc<Path>,
    /// The file as it was when the response began.
    pub identity: Identity,
}

/// `remaining` bytes of a file from `offset`.
pub(crate) struct FileBody {
    /// Key of the file in the worker's pool.
    id: u64,
    source: Reopen,
    offset: u64,
    remaining: u64,
    /// Size of the next read.
    next: usize,
    /// The response's share of its connection's read-ahead: caps `next`.
    ahead: ReadAhead,
}

impl FileBody {
    /// The bytes `offset..offset + remaining` of `file` (opened from `source`).
    pub(crate) fn new(
        file: File,
        source: Reopen,
        offset: u64,
        remaining: u64,
        ahead: ReadAhead,
    ) -> Self {
        let id = NEXT_ID.with(|n| {
            let id = n.get();
            n.set(id + 1);
            id
        });
        if remaining > 0 {
            HELD.with(|h| h.borrow_mut().keep(id, file));
        }
        FileBody {
            id,
            source,
            offset,
            remaining,
            next: FIRST_CHUNK,
            ahead,
        }
    }

    /// The same, for a body that holds no open file yet: the file is opened again from
    /// `source` (and checked to be the same file) at its first read. The parts of a
    /// `multipart/byteranges` response after the first, so that they hold no extra fd.
    pub(crate) fn reopened(source: Reopen, offset: u64, remaining: u64, ahead: ReadAhead) -> Self {
        let id = NEXT_ID.with(|n| {
            let id = n.get();
            n.set(id + 1);
            id
        });
        FileBody {
            id,
            source,
            offset,
            remaining,
            next: FIRST_CHUNK,
            ahead,
        }
    }

    /// The file opened again from the root; an error unless it is the same file.
    fn reopen(&self) -> Result<File, BoxError> {
        let file = self.source.root.open(&self.source.rel)?;
        let meta = file.metadata()?;
        if !meta.is_file() || Identity::of(&meta) != self.source.identity {
            return Err("file changed while it was being sent".into());
        }
        Ok(file)
    }

    /// Reads `want` bytes at `self.offset` from the held file, or from the file opened
    /// again; the file is held afterwards while bytes remain.
    fn read(&self, want: usize) -> Result<Vec<u8>, BoxError> {
        let last = self.remaining == want as u64;
        HELD.with(|held| {
            let mut h = held.borrow_mut();
            if let Some(f) = h.files.get(&self.id) {
                let buf = read_exact_at(f, want, self.offset)?;
                if last {
                    h.files.pop(&self.id);
                }
                return Ok(buf);
            }
            drop(h);
            let f = self.reopen()?;
            let buf = read_exact_at(&f, want, self.offset)?;
            if !last {
                held.borrow_mut().keep(self.id, f);
            }
            Ok(buf)
        })
    }
}

/// `want` bytes of `file` from `offset`, read into a new buffer's spare capacity (never
/// zeroed first: the kernel writes every byte); a file that ends sooner is an error. The
/// zeroing was 6-7 % of a worker's samples serving 100 KiB files over HTTP/2, but the kernel's
/// copy into the cold buffer then took most of that time back (docs/bench/history.md, bc6dc92).
pub(crate) fn read_exact_at(file: &File, want: usize, offset: u64) -> Result<Vec<u8>, BoxError> {
    let mut buf = Vec::with_capacity(want);
    while buf.len() < want {
        let at = offset + buf.len() as u64;
        // `spare_capacity` extends `buf` by what the kernel wrote
        match rustix::io::pread(file, rustix::buffer::spare_capacity(&mut buf), at) {
            Ok(0) => return Err("file shrank while it was being sent".into()),
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(std::io::Error::from(e).into()),
        }
    }
    Ok(buf)
}

impl Drop for FileBody {
    fn drop(&mut self) {
        // (`try_with`: a body dropped while its thread ends finds the pool gone)
        let _ = HELD.try_with(|h| h.borrow_mut().files.pop(&self.id));
    }
}

impl Body for FileBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.remaining == 0 {
            return Poll::Ready(None);
        }
        // Doubling up to CHUNK, but never past this response's share of its connection's
        // read-ahead (many streams on one connection: smaller chunks, down to FIRST_CHUNK).
        let cap = self.ahead.share().clamp(FIRST_CHUNK, CHUNK);
        let want = (self.remaining.min(self.next.min(cap) as u64)) as usize;
        self.next = (self.next * 2).min(CHUNK);
        let buf = match self.read(want) {
            Ok(buf) => buf,
            Err(e) => return Poll::Ready(Some(Err(e))),
        };
        self.offset += want as u64;
        self.remaining -= want as u64;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(buf)))))
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{OpenMethod, Symlinks};
    use http_body_util::BodyExt;

    /// A root with `name` holding `len` bytes (byte i is `i % 251`), and a body of all of it.
    fn body_of(dir: &Path, name: &str, len: usize) -> FileBody {
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.join(name), &data).unwrap();
        let root = Arc::new(Root::open_dir(dir, Symlinks::InsideRoot, OpenMethod::Auto).unwrap());
        let file = root.open(Path::new(name)).unwrap();
        let identity = Identity::of(&file.metadata().unwrap());
        let source = Reopen {
            root,
            rel: Path::new(name).into(),
            identity,
        };
        FileBody::new(file, source, 0, len as u64, ReadAhead::default())
    }

    /// A body whose chunks are sized by a connection with `streams` requests in flight.
    fn on_conn(mut body: FileBody, streams: usize) -> (FileBody, Vec<qweb_session::RequestGuard>) {
        let conn = std::rc::Rc::new(qweb_session::ConnState::new(([127, 0, 0, 1], 1).into()));
        let guards = (0..streams).map(|_| conn.request_started_guard()).collect();
        body.ahead = ReadAhead::of(&conn);
        (body, guards)
    }

    #[tokio::test]
    async fn many_streams_on_one_connection_share_its_read_ahead() {
        let t = tempfile::tempdir().unwrap();
        let len = 1024 * 1024;
        // 4 in flight: 256 KiB each, so chunks still grow to CHUNK
        let (mut body, _g) = on_conn(body_of(t.path(), "a", len), 4);
        let mut got = Vec::new();
        for _ in 0..5 {
            got.push(next(&mut body).await.unwrap().unwrap().len());
        }
        assert_eq!(got, [FIRST_CHUNK, 32 * 1024, 64 * 1024, CHUNK, CHUNK]);
        // 20 in flight: 1 MiB / 20 = 52 428 bytes at most
        let (mut body, _g) = on_conn(body_of(t.path(), "b", len), 20);
        let mut got = Vec::new();
        for _ in 0..5 {
            got.push(next(&mut body).await.unwrap().unwrap().len());
        }
        assert_eq!(got, [FIRST_CHUNK, 32 * 1024, 52_428, 52_428, 52_428]);
        // 128 in flight: the floor, FIRST_CHUNK
        let (mut body, guards) = on_conn(body_of(t.path(), "c", len), 128);
        for _ in 0..4 {
            assert_eq!(next(&mut body).await.unwrap().unwrap().len(), FIRST_CHUNK);
        }
        // the others finished: the whole budget is this body's again
        drop(guards);
        assert_eq!(next(&mut body).await.unwrap().unwrap().len(), CHUNK);
    }

    async fn next(body: &mut FileBody) -> Option<Result<Bytes, BoxError>> {
        Some(body.frame().await?.map(|f| f.into_data().unwrap()))
    }

    #[tokio::test]
    async fn chunks_start_small_and_grow_to_the_cap() {
        let t = tempfile::tempdir().unwrap();
        let len = 1024 * 1024 + 5;
        let mut body = body_of(t.path(), "f", len);
        let mut sizes = Vec::new();
        let mut all = Vec::new();
        while let Some(frame) = next(&mut body).await {
            let d = frame.unwrap();
            sizes.push(d.len());
            all.extend_from_slice(&d);
        }
        assert_eq!(&sizes[..4], &[FIRST_CHUNK, 32 * 1024, 64 * 1024, CHUNK]);
        assert!(sizes[3..sizes.len() - 1].iter().all(|&s| s == CHUNK));
        assert_eq!(all, std::fs::read(t.path().join("f")).unwrap());
        assert_eq!(held_fds(), 0, "a finished body holds no file");
    }

    #[tokio::test]
    async fn a_worker_holds_at_most_its_budget_of_files_and_bodies_reopen_theirs() {
        set_held_fds(2);
        let t = tempfile::tempdir().unwrap();
        let len = 300 * 1024;
        let mut bodies: Vec<FileBody> = (0..5)
            .map(|i| body_of(t.path(), &format!("f{i}"), len))
            .collect();
        assert_eq!(held_fds(), 2);
        // one frame each (as HTTP/2 streams that then stall)
        let mut got = vec![Vec::new(); 5];
        for (b, g) in bodies.iter_mut().zip(&mut got) {
            g.extend_from_slice(&next(b).await.unwrap().unwrap());
            assert!(held_fds() <= 2);
        }
        // the rest, interleaved: the closed ones are opened again
        loop {
            let mut any = false;
            for (b, g) in bodies.iter_mut().zip(&mut got) {
                if let Some(d) = next(b).await {
                    g.extend_from_slice(&d.unwrap());
                    any = true;
                }
                assert!(held_fds() <= 2);
            }
            if !any {
                break;
            }
        }
        for (i, g) in got.iter().enumerate() {
            assert_eq!(g, &std::fs::read(t.path().join(format!("f{i}"))).unwrap());
        }
        assert_eq!(held_fds(), 0);
        drop(bodies);
        set_held_fds(DEFAULT_HELD_FDS);
    }

    #[tokio::test]
    async fn a_held_file_is_read_without_opening_it_again() {
        let t = tempfile::tempdir().unwrap();
        let len = 200 * 1024;
        let mut body = body_of(t.path(), "f", len);
        let want = std::fs::read(t.path().join("f")).unwrap();
        let mut got = next(&mut body).await.unwrap().unwrap().to_vec();
        // gone from the root: only the held fd still reads it
        std::fs::remove_file(t.path().join("f")).unwrap();
        while let Some(d) = next(&mut body).await {
            got.extend_from_slice(&d.unwrap());
        }
        assert_eq!(got, want);
    }

    #[tokio::test]
    async fn a_file_replaced_while_its_fd_was_closed_is_not_sent() {
        set_held_fds(0);
        let t = tempfile::tempdir().unwrap();
        let len = 200 * 1024;
        // replaced by rename (a new inode), rewritten in place with the same size (a new
        // mtime), removed
        for how in ["rename", "rewrite", "remove"] {
            let mut body = body_of(t.path(), "f", len);
            let first = next(&mut body).await.unwrap().unwrap();
            assert_eq!(first.len(), FIRST_CHUNK);
            let f = t.path().join("f");
            match how {
                "rename" => {
                    std::fs::write(t.path().join("new"), vec![b'X'; len]).unwrap();
                    std::fs::rename(t.path().join("new"), &f).unwrap();
                }
                "rewrite" => {
                    // a coarse clock can give the same mtime: set one that differs
                    std::fs::write(&f, vec![b'X'; len]).unwrap();
                    let file = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
                    file.set_modified(std::time::SystemTime::UNIX_EPOCH)
                        .unwrap();
                }
                _ => std::fs::remove_file(&f).unwrap(),
            }
            let r = next(&mut body).await.unwrap();
            assert!(r.is_err(), "{how}: {:?}", r.map(|d| d.len()));
        }
        set_held_fds(DEFAULT_HELD_FDS);
    }
}
