//! qweb's server: configuration, workers and listeners, the HTTP service (static files and
//! reverse proxy), access logging, and graceful shutdown.
//!
//! [`Server::start`] binds every listener (one `SO_REUSEPORT` socket per worker), starts the
//! workers (one thread, one single-threaded event loop each) and returns a [`RunningServer`]
//! handle that knows the bound addresses and shuts the server down.
//!
//! The modules are layers, listed here from the bottom up; a module imports only from the
//! layers below it (checked by the `layers` test at the end of this file):
//!
//! | layer | what it is |
//! |---|---|
//! | [`config`] | the configuration, read and validated (everything reads it) |
//! | `http` | HTTP primitives: bodies, generated responses, path normalisation, request rules |
//! | `observe` | metrics, access log, log rate limits, process counters |
//! | `session` | one connection's state: phases, deadlines, the logged-request record, tunnels |
//! | `conn` | connection drivers (TLS handshake, HTTP/1, HTTP/2), idle parking, timers, flood meters |
//! | `files`, `proxy` | the handlers: static files and the reverse proxy |
//! | `pipeline` | the request pipeline: service, sites, rewrite, routing, error pages, headers, compression glue |
//! | `runtime` | server, workers, listeners, TLS sessions, OCSP, admin, reload, upgrade, signals |

pub mod config;

mod http;

mod observe;

mod session;

mod conn;

mod files;
mod proxy;

mod pipeline;

mod runtime;

pub use config::{Config, ConfigError};
pub use observe::process_counters;
pub use runtime::server::{Phase, ReloadError, RunningServer, Server, ServerError, StartInfo};
pub use runtime::{control, fd_limit, notify, upgrade};
