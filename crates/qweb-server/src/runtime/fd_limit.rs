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
