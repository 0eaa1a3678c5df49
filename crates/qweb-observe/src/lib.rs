//! Observability, the leaf the layers above register with: metrics (`/metrics`), the status
//! document (`/status.json`), the access log, log rate limits and process counters. Depends on
//! `qweb-config` and on the crates whose counters it reads (`qweb-tls`, `qweb-offload`,
//! `qweb-compress`), nothing of the server.

pub mod access_log;
pub mod log_limit;
pub mod metrics;
pub mod process_counters;
pub mod status;
