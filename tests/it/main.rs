//! The `qweb` binary's end-to-end tests (real processes, signals, reload, upgrade, the key
//! server) in one test binary: one link instead of one per file. `soak` (ignored, run by hand
//! in release) keeps its own.

mod access_log;
mod acme;
mod acme_fleet;
mod cli;
mod config_files;
mod fleet_tickets;
mod idle_memory;
mod keyserver;
mod module_cycles;
mod ops_pidfile;
mod reload;
mod reload_sessions;
mod sizes;
mod ticket_keys;
mod upgrade;
