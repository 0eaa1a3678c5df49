//! The runtime, the top layer: the server and its workers, listeners, engines, TLS sessions and OCSP, the admin listener, reload, binary upgrade, signals and the service manager.

pub(crate) mod acme;
pub(crate) mod admin;
pub mod control;
pub(crate) mod error;
pub(crate) mod fd;
pub mod fd_limit;
pub(crate) mod keyserver;
pub(crate) mod listen;
pub mod notify;
pub(crate) mod ocsp_fetch;
pub(crate) mod quic;
pub(crate) mod quic_handshake;
pub mod quic_steer;
pub(crate) mod server;
pub(crate) mod status_page;
pub(crate) mod tls_session;
pub mod upgrade;
pub(crate) mod welcome;
pub(crate) mod worker;
