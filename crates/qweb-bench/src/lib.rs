//! qweb-bench: the load generator and the experiment runner that reproduce the QWEB paper's
//! measurements on this machine, with qweb, nginx, h2o and Caddy side by side.
//!
//! - [`load`]: the load generator (`qweb-bench load`): full TLS handshakes without resumption
//!   (handshake rate) or keep-alive requests (throughput and latency percentiles), HTTP/1.1 or
//!   HTTP/2, TLS 1.2 or 1.3, every response checked (status, body bytes, encoding).
//! - [`runner`]: the experiment runner (`qweb-bench run`): generates certificates, files and
//!   configurations, starts qweb and its [`peers`], runs the matrix A–I and the engine-latency
//!   sweep (with the external [`clients`] wrk, h2load and strace in G), and writes markdown
//!   tables, JSON and SVG charts.
//! - [`zipf`]: the proxy cache's eviction policy against LRU on a Zipf trace with one-time
//!   keys (`qweb-bench zipf`), on `qweb_cache::Store` directly.
//! - The pure parts ([`stats`], [`report`], [`svg`], [`configs`], [`peers`]' configurations,
//!   the [`clients`]' output parsers, [`procs::parse_metric`]) are unit tested without network
//!   or servers.

pub mod certs;
pub mod clients;
pub mod configs;
pub mod error;
pub mod load;
pub mod peers;
pub mod procs;
pub mod report;
pub mod runner;
pub mod stats;
pub mod svg;
pub mod tls;
pub mod zipf;

pub use error::{Error, Result};

/// Raises this process's open-file limit (soft to hard; as root also the hard limit) to at
/// least `want`, and returns the soft limit now in force. Children inherit it.
#[allow(unsafe_code)]
pub fn raise_fd_limit(want: u64) -> u64 {
    // SAFETY: getrlimit/setrlimit only read/write the plain struct passed by pointer.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 0;
        }
        if lim.rlim_cur >= want {
            return lim.rlim_cur;
        }
        if lim.rlim_max < want {
            let raised = libc::rlimit {
                rlim_cur: want,
                rlim_max: want,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                return want;
            }
        }
        lim.rlim_cur = lim.rlim_max.min(want.max(lim.rlim_cur));
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur
    }
}

/// Number of CPUs this process may run on.
pub fn cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}
