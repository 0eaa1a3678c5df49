//! The open-file limit. Every connection, open file and upstream connection is a file
//! descriptor; the usual soft limit (1024) is a lockout waiting to happen (a few HTTP/2 clients
//! holding 128 streams of large files each). At start qweb raises its soft limit to the hard
//! limit, as Go's runtime (and so Caddy) does; nginx needs `worker_rlimit_nofile`.

use rustix::process::{getrlimit, setrlimit, Resource};

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; returns the (old, new) soft limits
/// (`None`: unlimited).
pub fn raise_fd_limit() -> std::io::Result<(Option<u64>, Option<u64>)> {
    let mut lim = getrlimit(Resource::Nofile);
    let old = lim.current;
    if lim.current != lim.maximum {
        lim.current = lim.maximum;
        setrlimit(Resource::Nofile, lim)?;
    }
    Ok((old, lim.current))
}

/// One file descriptor kept open (on `/dev/null`) for the moment the process has no other: a
/// listener whose `accept` fails with `EMFILE`/`ENFILE` gives it back to the kernel, takes
/// the pending connection in its place, answers it (or serves it, the admin listener) and
/// closes it, then opens the reserve again, instead of leaving its clients in the backlog
/// until fds come back (as nginx does not, and a server that only sleeps does not).
pub(crate) struct FdReserve {
    fd: Option<std::os::fd::OwnedFd>,
}

/// What a plain listener out of fds answers before it closes the connection.
pub(crate) const OUT_OF_FDS_503: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
    Content-Type: text/plain\r\nContent-Length: 20\r\nConnection: close\r\nRetry-After: 1\r\n\r\n\
    server out of files\n";

/// Whether `e` says the process (`EMFILE`) or the system (`ENFILE`) is out of fds.
pub(crate) fn out_of_fds(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

impl FdReserve {
    /// Opens the reserve.
    pub(crate) fn new() -> FdReserve {
        FdReserve { fd: open_null() }
    }

    /// Gives the reserve back to the kernel (for a connection to be accepted in its place);
    /// `false` when there was none (it could not be opened again since).
    pub(crate) fn release(&mut self) -> bool {
        self.fd.take().is_some()
    }

    /// Opens the reserve again (when it is not held); `false` when that failed.
    pub(crate) fn restore(&mut self) -> bool {
        if self.fd.is_none() {
            self.fd = open_null();
        }
        self.fd.is_some()
    }

    /// After `accept` on `listener` failed with no fds left: takes one pending connection in
    /// the reserve's place, writes `answer` to it (best effort, never blocking; empty: none)
    /// and closes it, then takes the reserve again. `false` when nothing was taken (no
    /// reserve, or no connection pending): the caller backs off.
    #[allow(unsafe_code)] // accept4/recv/send/shutdown on raw fds: see each SAFETY note
    pub(crate) fn shed(&mut self, listener: std::os::fd::BorrowedFd<'_>, answer: &[u8]) -> bool {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        if !self.release() {
            self.restore();
            return false;
        }
        // SAFETY: `listener` is a valid listening socket for this call; null address
        // pointers are allowed (the peer's address is not wanted).
        let fd = unsafe {
            libc::accept4(
                listener.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            )
        };
        let shed = fd >= 0;
        if shed {
            // SAFETY: `accept4` returned a new fd that nothing else owns.
            let conn = unsafe { OwnedFd::from_raw_fd(fd) };
            if !answer.is_empty() {
                let raw = conn.as_raw_fd();
                // Read what the request sent already (closing a socket with unread bytes
                // resets it, and the answer may be lost), then answer and end our side.
                let mut buf = [0u8; 4096];
                // SAFETY: `raw` is open (owned by `conn`) and `buf` is writable for its length.
                unsafe { libc::recv(raw, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
                // SAFETY: as above; `answer` is readable for its length.
                unsafe {
                    libc::send(
                        raw,
                        answer.as_ptr().cast(),
                        answer.len(),
                        libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                    )
                };
                // SAFETY: `raw` is open.
                unsafe { libc::shutdown(raw, libc::SHUT_WR) };
            }
            drop(conn);
        }
        self.restore();
        shed
    }
}

fn open_null() -> Option<std::os::fd::OwnedFd> {
    std::fs::File::open("/dev/null").ok().map(Into::into)
}
