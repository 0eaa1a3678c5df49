//! qweb's server: configuration, workers and listeners, the HTTP service (static files and
//! reverse proxy), access logging, and graceful shutdown.
//!
//! [`Server::start`] binds every listener (one `SO_REUSEPORT` socket per worker), starts the
//! workers (one thread, one single-threaded event loop each) and returns a [`RunningServer`]
//! handle that knows the bound addresses and shuts the server down.

pub mod config;

mod access_log;
mod admin;
mod body;
mod compress;
mod conn;
mod conn_state;
pub mod control;
mod error_pages;
pub mod fd_limit;
mod files;
mod h2_flood;
mod head_scan;
mod headers_rules;
mod idle;
mod lazy_timer;
mod listen;
mod log_limit;
mod metrics;
pub mod notify;
mod ocsp_fetch;
mod path;
mod plain_on_tls;
pub mod process_counters;
mod proxy;
mod request_rules;
mod response;
mod rewrite;
mod server;
mod service;
mod sites;
mod tls_session;
pub mod upgrade;
mod welcome;
mod worker;
mod write_burst;

pub use config::{Config, ConfigError};
pub use server::{Phase, ReloadError, RunningServer, Server, ServerError, StartInfo};
