//! Observability: metrics (`/metrics`), the status document (`/status.json`), the access log, log rate limits and process counters. Imports only `config` and `http` below it.

pub mod access_log;
pub mod log_limit;
pub mod metrics;
pub mod process_counters;
pub mod status;
