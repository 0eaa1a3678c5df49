//! Observability: metrics (`/metrics`), the status document (`/status.json`), the access log, log rate limits and process counters. Imports only `config` and `http` below it.

pub(crate) mod access_log;
pub(crate) mod log_limit;
pub(crate) mod metrics;
pub mod process_counters;
pub(crate) mod status;
