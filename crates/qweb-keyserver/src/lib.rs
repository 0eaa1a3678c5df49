//! qweb's key server: private keys live outside the web server process.
//!
//! - [`protocol`]: the wire format (length-prefixed binary frames; docs/KEYSERVER_PROTOCOL.md).
//! - [`server`]: `qweb keyserver`: loads keys, listens on a Unix socket (0600, peer uid
//!   checked) and/or TCP with mutual TLS, answers requests out of order as they complete,
//!   signing on a pool of threads.
//! - [`client`]: the `keyserver` offload engine qweb uses: a few connections per key server,
//!   non-blocking submit, reconnect with backoff, per-op timeout, one retry on another server.

pub mod client;
pub mod protocol;
pub mod server;
