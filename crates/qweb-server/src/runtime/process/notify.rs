//! Readiness for service managers: systemd's `Type=notify` / `Type=notify-reload` protocol
//! (`sd_notify(3)`). When `NOTIFY_SOCKET` is set, qweb sends `READY=1` once it serves,
//! `RELOADING=1` (with `MONOTONIC_USEC`) when a reload begins and `READY=1` again when it
//! ended, and `STOPPING=1` when it drains. Without the variable nothing is sent.

use std::io;
use std::os::unix::net::UnixDatagram;

/// Sends `state` (newline-separated `KEY=VALUE` lines) to `$NOTIFY_SOCKET`. `Ok(false)`
/// when the variable is not set.
pub fn notify(state: &str) -> io::Result<bool> {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(false);
    };
    let sock = UnixDatagram::unbound()?;
    let bytes = std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str());
    match bytes.strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            sock.send_to_addr(state.as_bytes(), &addr)?;
        }
        None => {
            sock.send_to(state.as_bytes(), &path)?;
        }
    }
    Ok(true)
}

/// `READY=1`: serving (after start, and after a reload), with `MAINPID` (after a binary
/// upgrade the service's main process is the new one; the unit needs `NotifyAccess=all`).
pub fn ready() {
    send(&format!("READY=1\nMAINPID={}", std::process::id()));
}

/// `RELOADING=1` with the monotonic time, as `Type=notify-reload` asks.
#[allow(unsafe_code)]
pub fn reloading() {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) writes one timespec into `ts`, a valid, exclusively borrowed
    // local; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let usec = ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000;
    send(&format!("RELOADING=1\nMONOTONIC_USEC={usec}"));
}

/// `STOPPING=1`: draining.
pub fn stopping() {
    send("STOPPING=1");
}

fn send(state: &str) {
    if let Err(e) = notify(state) {
        tracing::warn!("sd_notify {state:?}: {e}");
    }
}
