//! Binary upgrade without a gap (SIGUSR2, `qweb upgrade`), as nginx and Pingora do it: the
//! running process starts the new binary with its listening sockets *inherited* (the fds stay
//! open across `exec`, named in [`FDS_ENV`]), so the kernel's accept queues are shared and no
//! connection is refused or reset; the new process starts (it adopts those sockets instead of
//! binding), then says it is ready through a socket named in [`READY_ENV`]; the old process
//! then stops accepting and drains its connections (each closes after its current request,
//! within `shutdown_timeout`) and exits.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use rustix::io::{fcntl_setfd, FdFlags};

use super::fd::is_open;

/// `addr=fd,fd;addr=fd`: the listening sockets handed to the new process.
pub const FDS_ENV: &str = "QWEB_UPGRADE_FDS";
/// The fd of the socket the new process writes `ready` to.
pub const READY_ENV: &str = "QWEB_UPGRADE_READY_FD";

/// Why an upgrade did not happen (the old process keeps serving).
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    /// The new process could not be started.
    #[error("cannot start {exe}: {source}")]
    Spawn {
        /// The binary.
        exe: String,
        /// The error.
        source: io::Error,
    },
    /// The new process exited or did not say it was ready in time.
    #[error(
        "the new process {pid} did not become ready within {within:?} ({why}); it was stopped"
    )]
    NotReady {
        /// Its pid.
        pid: u32,
        /// How long it was given.
        within: Duration,
        /// What happened.
        why: String,
    },
    /// HTTP/3's UDP sockets cannot be handed over.
    #[error(transparent)]
    Quic(#[from] crate::runtime::quic::steer::HandoffError),
    /// Preparing the sockets failed.
    #[error("cannot hand over the listening sockets: {0}")]
    Io(#[from] io::Error),
}

/// Sockets this process inherited from the one it replaces, by address, until adopted.
fn inherited() -> &'static Mutex<HashMap<SocketAddr, Vec<TcpListener>>> {
    static INHERITED: OnceLock<Mutex<HashMap<SocketAddr, Vec<TcpListener>>>> = OnceLock::new();
    INHERITED.get_or_init(|| Mutex::new(parse_inherited()))
}

fn parse_inherited() -> HashMap<SocketAddr, Vec<TcpListener>> {
    let mut out = HashMap::new();
    let Ok(spec) = std::env::var(FDS_ENV) else {
        return out;
    };
    // not passed on to processes this one starts
    std::env::remove_var(FDS_ENV);
    for part in spec.split(';').filter(|p| !p.is_empty()) {
        let Some((addr, fds)) = part.split_once('=') else {
            continue;
        };
        let Ok(addr) = addr.parse::<SocketAddr>() else {
            tracing::warn!("upgrade: ignoring {part:?} in {FDS_ENV}");
            continue;
        };
        for fd in fds.split(',').filter_map(|f| f.parse::<RawFd>().ok()) {
            // only adopt an fd that is open and a listening TCP socket of that address
            if !is_open(fd) {
                continue;
            }
            #[allow(unsafe_code)]
            // SAFETY: the previous process left `fd` open for us (it is open: fcntl above),
            // nothing else in this process owns it (it was named only in this variable, read
            // once), so taking ownership here is sound.
            let socket = unsafe { TcpListener::from_raw_fd(fd) };
            match socket.local_addr() {
                Ok(a) if a == addr => {
                    let _ = fcntl_setfd(&socket, FdFlags::CLOEXEC);
                    let _ = socket.set_nonblocking(true);
                    out.entry(addr).or_insert_with(Vec::new).push(socket);
                }
                _ => {
                    // not ours to close (it may be stdin or anything the caller passed)
                    let _ = std::os::fd::IntoRawFd::into_raw_fd(socket);
                    tracing::warn!("upgrade: fd {fd} is not a socket on {addr}: ignored");
                }
            }
        }
    }
    out
}

/// Whether sockets on `addr` were inherited (then it is ours, not another process's).
pub(crate) fn has_inherited(addr: SocketAddr) -> bool {
    addr.port() != 0
        && inherited()
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(&addr)
}

/// Takes up to `count` inherited sockets on `addr`.
pub(crate) fn take_inherited(addr: SocketAddr, count: usize) -> Vec<TcpListener> {
    let mut map = inherited().lock().unwrap_or_else(PoisonError::into_inner);
    let Some(list) = map.get_mut(&addr) else {
        return Vec::new();
    };
    let n = count.min(list.len());
    let taken: Vec<TcpListener> = list.drain(..n).collect();
    if list.is_empty() {
        map.remove(&addr);
    }
    taken
}

/// Closes inherited sockets the configuration did not adopt (a listener the new
/// configuration removed, HTTP/3's UDP sockets of workers it does not have), and says how
/// many.
pub fn close_unadopted() -> usize {
    let udp = crate::runtime::quic::steer::close_unadopted();
    let mut map = inherited().lock().unwrap_or_else(PoisonError::into_inner);
    let n = udp + map.values().map(Vec::len).sum::<usize>();
    for addr in map.keys() {
        tracing::info!("upgrade: {addr} is not in the new configuration: closed");
    }
    map.clear();
    n
}

/// HTTP/3 datagrams this process forwarded to the other process of an upgrade, and received
/// from it (see `runtime/quic/steer.rs`).
pub fn quic_forwarding() -> (u64, u64) {
    use std::sync::atomic::Ordering::Relaxed;
    (
        crate::runtime::quic::steer::FORWARDED.load(Relaxed),
        crate::runtime::quic::steer::RECEIVED.load(Relaxed),
    )
}

/// In the new process, once it serves: tells the old one (no-op when not started by an
/// upgrade).
pub fn signal_ready() {
    let Ok(fd) = std::env::var(READY_ENV) else {
        return;
    };
    std::env::remove_var(READY_ENV);
    let Ok(fd) = fd.parse::<RawFd>() else {
        return;
    };
    if !is_open(fd) {
        return;
    }
    #[allow(unsafe_code)]
    // SAFETY: the old process passed this end of its socket pair to us alone (named only in
    // READY_ENV, read once); it is open (fcntl above).
    let mut s = unsafe { UnixStream::from_raw_fd(fd) };
    if let Err(e) = s.write_all(b"ready\n") {
        tracing::warn!("upgrade: cannot tell the old process that this one is ready: {e}");
    }
}

/// In the old process: starts `exe args` with `sockets` (address, listening sockets) and
/// `quic` (HTTP/3's UDP sockets and channels) inherited, and waits up to `within` for it to be
/// ready. Returns its pid. On error the new process is stopped and nothing changed here.
pub fn start_new_binary(
    exe: &Path,
    args: &[OsString],
    sockets: &[(SocketAddr, Vec<OwnedFd>)],
    quic: crate::runtime::quic::steer::Handoff,
    within: Duration,
) -> Result<u32, UpgradeError> {
    let mut spec = String::new();
    for (addr, fds) in sockets {
        let list: Vec<String> = fds.iter().map(|f| f.as_raw_fd().to_string()).collect();
        spec.push_str(&format!("{addr}={};", list.join(",")));
    }
    let (mut ours, theirs) = UnixStream::pair()?;
    // inheritable only for the spawn: the fds are duplicates owned by `sockets` and `theirs`
    for (_, fds) in sockets {
        for f in fds {
            fcntl_setfd(f.as_fd(), FdFlags::empty()).map_err(io::Error::from)?;
        }
    }
    for f in &quic.fds {
        fcntl_setfd(f.as_fd(), FdFlags::empty()).map_err(io::Error::from)?;
    }
    fcntl_setfd(theirs.as_fd(), FdFlags::empty()).map_err(io::Error::from)?;
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .env(FDS_ENV, &spec)
        .env(READY_ENV, theirs.as_raw_fd().to_string());
    for (k, v) in &quic.env {
        cmd.env(k, v);
    }
    #[allow(unsafe_code)]
    // SAFETY: the closure runs in the forked child before exec and calls only
    // sigemptyset/sigaddset on a local set and pthread_sigmask, which are async-signal-safe;
    // it allocates nothing and touches no lock.
    unsafe {
        cmd.pre_exec(|| {
            // The new binary starts with SIGHUP, SIGUSR1 and SIGUSR2 blocked (a mask survives
            // exec): one sent before its handlers exist stays pending instead of killing it;
            // `qweb serve` unblocks them once its handlers are installed.
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for sig in [libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2] {
                libc::sigaddset(&mut set, sig);
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            Ok(())
        });
    }
    let spawned = cmd.spawn();
    drop(theirs);
    // (the new process has its own copies; ours would keep its channels open if it died)
    drop(quic);
    let mut child = spawned.map_err(|source| UpgradeError::Spawn {
        exe: exe.display().to_string(),
        source,
    })?;
    let pid = child.id();
    ours.set_read_timeout(Some(within))?;
    let mut buf = [0u8; 6];
    let why = match ours.read_exact(&mut buf) {
        Ok(()) if &buf == b"ready\n" => return Ok(pid),
        Ok(()) => format!("it said {:?}", String::from_utf8_lossy(&buf)),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => "it exited".to_owned(),
        Err(e) => e.to_string(),
    };
    let _ = child.kill();
    let _ = child.wait();
    Err(UpgradeError::NotReady { pid, within, why })
}
