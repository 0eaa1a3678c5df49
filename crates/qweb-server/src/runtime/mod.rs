//! The runtime, the top layer: the server and its workers (`server`, `worker`), listeners
//! (`listen`), the fleet client (`fleet`: the store the nodes share), the admin listener and its pages (`admin`, `status_page`), and, by concern, the
//! process (`process/`: signals, pid file, service manager, fd limits, binary upgrade), TLS
//! state (`tls/`: sessions, OCSP, key server clients, ACME) and QUIC (`quic/`: endpoints,
//! handshakes, the sockets' hand-over).

pub(crate) mod admin;
pub(crate) mod error;
pub(crate) mod fleet;
pub(crate) mod listen;
pub mod process;
pub mod quic;
pub(crate) mod server;
pub(crate) mod status_page;
pub(crate) mod tls;
pub(crate) mod welcome;
pub(crate) mod worker;
