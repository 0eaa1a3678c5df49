//! qweb's key server: private keys live outside the web server process.
//!
//! - [`protocol`]: the wire format (length-prefixed binary frames; docs/KEYSERVER_PROTOCOL.md).
//! - [`server`]: `qweb keyserver`: loads keys, listens on a Unix socket (0600, peer uid
//!   checked) and/or TCP with mutual TLS, answers requests out of order as they complete,
//!   signing on a pool of threads.
//! - `state` and `shutdown`: what the server's connections share, and its stop signal.
//! - [`conn`]: one client connection of the key server, within per-connection bounds
//!   (answers waiting, fair share of the signing pool, stall timeout).
//! - [`accept`]: accept loops that back off and log rarely when accept fails (EMFILE).
//! - [`tickets`]: fleet-wide session ticket keys: the key server's rotating keys, and
//!   qweb's refresher that installs them in a listener's ticketer.
//! - [`client`]: the `keyserver` offload engine qweb uses: a few connections per key server,
//!   non-blocking submit, reconnect with backoff, per-op timeout, one retry on another server.

#![forbid(unsafe_code)]

pub mod accept;
pub mod client;
pub mod conn;
mod error;
mod generated;
mod keys;
mod metrics;
pub mod once;
pub mod protocol;
pub mod server;
mod shutdown;
mod state;
pub mod tickets;

pub use generated::MAX_GENERATED_KEYS;
