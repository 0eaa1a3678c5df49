//! qweb's test kit: the harness every integration test of the workspace shares, written once.
//! A dev-dependency only (`publish = false`); no non-test code depends on it.
//!
//! | need | helper |
//! |---|---|
//! | qweb in this process from a generated or given config | [`server::start_with`], [`server::start_text`], [`server::start_file`] |
//! | the `qweb` binary in a child process, banner waited for, killed on drop | [`process::Qweb`] |
//! | a port fixed before start (prefer `127.0.0.1:0` everywhere else) | [`free_port`] |
//! | rustls client configs for the test CA, reqwest clients, raw TLS connect | [`tls`] |
//! | the accept-any certificate verifier | [`tls::AcceptAnyCert`] |
//! | a strict `/metrics` scrape with lookup by name and labels | [`metrics`] |
//! | `openssl s_client` runs that say whether the session resumed | [`openssl::SClient`] |
//! | an HTTP/2 client: handshake over any transport, a GET read to its end | [`h2client`] |
//! | hand-built HTTP/2 frames for hostile clients | [`h2frames`] |
//! | upstreams: hyper ([`upstream`]), raw recording ([`recorder`]), WebSocket echo ([`ws`]) | |
//! | headless Chromium: the DOM after the page's scripts ran | [`browser::Chromium`] |
//! | deterministic bodies | [`corpus`] |
//! | the import graph of a crate's module files (layers, cycles) | [`modgraph`] |
//! | an external tool a test needs: skip without it, fail under `CI` | [`tools::require`] |
//!
//! The crate root re-exports what qweb-server's tests used from their old `tests/common`
//! module, so `use qweb_testkit as common;` keeps `common::start_with(..)`,
//! `common::client(..)`, `common::upstream::start(..)` working. See README.md for one
//! example per helper.
#![allow(missing_docs)] // test-only crate; README.md documents each helper with an example

pub mod browser;
pub mod corpus;
pub mod h2client;
pub mod h2frames;
pub mod h3;
pub mod metrics;
pub mod modgraph;
pub mod openssl;
pub mod process;
pub mod recorder;
pub mod records;
pub mod redis;
pub mod server;
pub mod tls;
pub mod tools;
pub mod upstream;
pub mod wire;
pub mod ws;

pub use server::{raw_exchange, start, start_file, start_text, start_with, TestServer};
pub use tls::{client, install_provider, plain_client, tls_client_config, Proto, BOTH};

/// Calls `f` every `every` until it gives `Some`, and returns that; panics naming `what`
/// once `limit` has passed.
///
/// ```
/// use std::time::Duration;
/// let mut n = 0;
/// let got = qweb_testkit::poll_until("the third call", Duration::from_secs(5), Duration::ZERO, || {
///     n += 1;
///     (n == 3).then_some(n)
/// });
/// assert_eq!(got, 3);
/// ```
pub fn poll_until<T>(
    what: &str,
    limit: std::time::Duration,
    every: std::time::Duration,
    mut f: impl FnMut() -> Option<T>,
) -> T {
    let start = std::time::Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(every);
    }
}

/// [`poll_until`] for an async check: awaits `f()` every `every` (a tokio sleep, so the
/// runtime serves other tasks meanwhile) until it gives `Some`.
pub async fn poll_until_async<T, F>(
    what: &str,
    limit: std::time::Duration,
    every: std::time::Duration,
    mut f: impl FnMut() -> F,
) -> T
where
    F: std::future::Future<Output = Option<T>>,
{
    let start = std::time::Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(every).await;
    }
}

/// A port on 127.0.0.1, below 32768, free for TCP and UDP a moment ago: for the few tests that must put a
/// fixed port in a config before the server starts (a reload keeping its listener, a second
/// instance on the same address). Everything else binds `127.0.0.1:0` and asks the server.
///
/// ```
/// let port = qweb_testkit::free_port();
/// assert_ne!(port, 0);
/// ```
pub fn free_port() -> u16 {
    // Below the kernel's range for client sockets (32768 and up): a port taken from `:0` is
    // in that range, and a client socket of another test may take it before the server
    // binds it. The port is free for TCP and UDP (HTTP/3 binds both). Tests run in parallel
    // processes (cargo-nextest: one per test), so each process walks the range from a start of
    // its own (its pid and the clock, mixed) with a stride coprime with the span: two
    // processes do not walk side by side, and one process never returns a port twice.
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::sync::OnceLock;
    const LOW: u64 = 10_000;
    const SPAN: u64 = 22_000;
    // prime, and 22 000 = 2^4 * 5^3 * 11: coprime, so the walk visits every port of the span
    const STRIDE: u64 = 7_919;
    static START: OnceLock<u64> = OnceLock::new();
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let start = *START.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let mut x = (u64::from(std::process::id()) << 32) | u64::from(nanos);
        // splitmix64's finaliser
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^= x >> 31;
        x % SPAN
    });
    for _ in 0..SPAN {
        let k = CALLS.fetch_add(1, Relaxed) % SPAN;
        let port = u16::try_from(LOW + (start + k * STRIDE) % SPAN).expect("below 32 000");
        let tcp = std::net::TcpListener::bind(("127.0.0.1", port));
        let udp = std::net::UdpSocket::bind(("127.0.0.1", port));
        if tcp.is_ok() && udp.is_ok() {
            return port;
        }
    }
    panic!(
        "no port free for TCP and UDP between {LOW} and {}",
        LOW + SPAN
    )
}
