//! qweb-server's integration tests in one binary: one link instead of one per file, and the
//! files' tests share the test threads. Tests that change or count something of the whole
//! process (its fd limit, its open fds, its global log subscriber) keep binaries of their own:
//! `exhaustion`, `fd_reserve`, `hostile_fd`, `hostile_proxy`, `proxy_tls`.

mod access_rules;
mod admin_listener;
mod basic_auth;
mod basic_auth_guessing;
mod client_auth;
mod compression;
mod file_cache;
mod fleet;
mod fleet_limits;
mod forward_auth;
mod h1_wire;
mod hostile;
mod hostile_conn;
mod hostile_paths;
mod hostile_trailers;
mod http3;
mod http3_pipeline;
mod http_details;
mod idle;
mod limits;
mod listen_families;
mod metrics;
mod ocsp;
mod offload;
mod protocols;
mod proxy;
mod proxy_balance;
mod proxy_body;
mod proxy_cache;
mod proxy_cache_disk;
mod proxy_cache_sendfile;
mod proxy_cache_stream;
mod proxy_grpc;
mod proxy_h2;
mod proxy_late_bytes;
mod proxy_protocol;
mod proxy_stale_pool;
mod proxy_upgrade;
mod quic_garbage;
mod quic_per_client;
mod rate_limits;
mod recipes;
mod reload_tunnels;
mod site_pages;
mod sites;
mod static_files;
mod static_symlinks;
mod status_page;
mod tls_certs;
mod tls_resumption;
