//! File-descriptor probes shared by the binary upgrade (`upgrade`: inherited
//! listening sockets) and the QUIC steering hand-over (`quic_steer`: inherited UDP
//! sockets and channels): both adopt fds that a previous process left open.

use std::os::fd::RawFd;

use rustix::io::{fcntl_getfd, fcntl_setfd, FdFlags};

/// Whether `fd` is open in this process (an fcntl probe).
pub(crate) fn is_open(fd: RawFd) -> bool {
    fcntl_getfd(unsafe_borrow(fd)).is_ok()
}

/// Marks an adopted fd close-on-exec (it was inherited without).
pub(crate) fn close_on_exec(fd: RawFd) {
    let _ = fcntl_setfd(unsafe_borrow(fd), FdFlags::CLOEXEC);
}

/// A borrowed fd for the `fcntl` probe.
#[allow(unsafe_code)]
fn unsafe_borrow(fd: RawFd) -> std::os::fd::BorrowedFd<'static> {
    // SAFETY: used only for one fcntl(F_GETFD) probe, which fails cleanly (EBADF) on a
    // closed fd and does not keep the borrow.
    unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }
}
