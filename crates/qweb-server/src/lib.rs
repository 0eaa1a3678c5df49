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
//! | [`config`] | the configuration, read and validated (everything reads it): the `qweb-config` crate, re-exported |
//! | `conn` | connection drivers (TLS handshake, HTTP/1, HTTP/2), idle parking, timers, flood meters |
//! | `files` | the static-file handler (the reverse proxy is the `qweb-proxy` crate) |
//! | `pipeline` | the request pipeline: service, sites, rewrite, routing, error pages, headers, compression glue |
//! | `runtime` | server, workers, listeners, TLS sessions, OCSP, admin, reload, upgrade, signals |

pub use qweb_config as config;

mod conn;

mod files;

mod pipeline;

mod runtime;

pub use config::{Config, ConfigError};

/// Fuzz entry points for the HTTP/1.1 wire layer (`crates/qweb-server/fuzz`); not an API.
#[doc(hidden)]
pub mod fuzzing {
    pub use qweb_http::h1::fuzzing::{body, head};
}
pub use qweb_observe::process_counters;
pub use runtime::process::{control, fd_limit, notify, upgrade};
pub use runtime::server::{Phase, ReloadError, RunningServer, Server, ServerError, StartInfo};

/// rustc cannot enforce layering inside one crate: this test reads the sources and fails when
/// a module imports (`crate::x`, outside comments) from its own layer's peers or any layer
/// above it.
#[cfg(test)]
mod layers {
    use std::path::Path;

    use qweb_testkit::modgraph::{rust_files, top_imports, top_module};

    /// Bottom first; modules on one line are peers and may not import each other.
    const LAYERS: &[&[&str]] = &[
        &["config"],
        &["conn"],
        &["files"],
        &["pipeline"],
        &["runtime"],
    ];

    fn rank(module: &str) -> Option<usize> {
        LAYERS.iter().position(|l| l.contains(&module))
    }

    fn violations(root: &Path) -> Vec<String> {
        let mut bad = Vec::new();
        for path in rust_files(root) {
            let rel = path.strip_prefix(root).expect("beneath src");
            let top = top_module(root, &path);
            if top == "lib" {
                continue;
            }
            let Some(own) = rank(&top) else {
                bad.push(format!("{}: module `{top}` is in no layer", rel.display()));
                continue;
            };
            let src = std::fs::read_to_string(&path).expect("readable source");
            for name in top_imports(rel, &src) {
                if name == "{" {
                    bad.push(format!(
                        "{}: `crate::{{...}}`: name each layer",
                        rel.display()
                    ));
                    continue;
                }
                if name == top {
                    continue;
                }
                match rank(&name) {
                    Some(r) if r < own => {}
                    Some(_) => bad.push(format!(
                        "{}: `{top}` imports `crate::{name}`, which is not below it",
                        rel.display()
                    )),
                    None => bad.push(format!("{}: `crate::{name}` is in no layer", rel.display())),
                }
            }
        }
        bad
    }

    #[test]
    fn imports_only_go_down() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let bad = violations(&root);
        assert!(bad.is_empty(), "layering violations:\n{}", bad.join("\n"));
    }

    #[test]
    fn the_check_sees_an_upward_import() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("conn")).expect("mkdir");
        std::fs::write(
            dir.path().join("conn/h1.rs"),
            "// crate::runtime in a comment is fine\nuse crate::config::X;\nuse crate::pipeline::Y;\n",
        )
        .expect("write");
        std::fs::write(dir.path().join("files.rs"), "use crate::runtime::Z;\n").expect("write");
        let bad = violations(dir.path());
        assert_eq!(bad.len(), 2, "{bad:?}");
        assert!(bad.iter().any(|b| b.contains("crate::pipeline")));
        assert!(bad.iter().any(|b| b.contains("crate::runtime")));
    }
}
