//! External tools that some tests drive (aioquic, Chromium, Caddy, systemd-analyze, ...):
//! one place that says whether a tool is here, and what a test does when it is not. Outside
//! CI a test without its tool prints a `SKIPPED` line and passes; where the environment
//! variable `CI` is set (non-empty; `.ci/run` sets it), a missing tool is a failure that names
//! the tool and the `.ci/run` line that installs it, so that CI cannot go green by skipping.
//!
//! ```no_run
//! // in a #[test] fn:
//! fn speaks_http3() {
//!     if !qweb_testkit::tools::require("aioquic") {
//!         return;
//!     }
//!     // ...
//! }
//! ```

use std::process::{Command, Stdio};

/// How a tool is found.
#[derive(Clone, Copy, Debug)]
enum Probe {
    /// A program on `PATH` (`command -v`).
    Program(&'static str),
    /// A python module that `python3` imports.
    Python(&'static str),
    /// Found by its own helper (e.g. `browser::Chromium::find`), which reports it
    /// missing with [`missing`].
    Own,
}

/// A tool some test needs: its name, how it is found, and what installs it.
#[derive(Clone, Copy, Debug)]
struct Tool {
    name: &'static str,
    probe: Probe,
    /// The `.ci/run` line that installs it.
    install: &'static str,
}

/// Every tool a test probes for.
const TOOLS: &[Tool] = &[
    Tool {
        name: "aioquic",
        probe: Probe::Python("aioquic"),
        install: "pip install --break-system-packages aioquic",
    },
    Tool {
        name: "h11",
        probe: Probe::Python("h11"),
        install: "pip install --break-system-packages 'httpx[zstd]'",
    },
    Tool {
        name: "httpx",
        probe: Probe::Python("httpx, zstandard"),
        install: "pip install --break-system-packages 'httpx[zstd]'",
    },
    Tool {
        name: "prometheus_client",
        probe: Probe::Python("prometheus_client"),
        install: "apt-get install -y --no-install-recommends python3 python3-prometheus-client",
    },
    Tool {
        name: "python3",
        probe: Probe::Program("python3"),
        install: "apt-get install -y --no-install-recommends python3",
    },
    Tool {
        name: "chromium",
        probe: Probe::Own,
        install: "apt-get install -y --no-install-recommends chromium (or set QWEB_CHROMIUM)",
    },
    Tool {
        name: "caddy",
        probe: Probe::Program("caddy"),
        install: "apt-get install -y --no-install-recommends caddy iproute2",
    },
    Tool {
        name: "ip",
        probe: Probe::Program("ip"),
        install: "apt-get install -y --no-install-recommends caddy iproute2",
    },
    Tool {
        name: "unshare",
        probe: Probe::Program("unshare"),
        install: "apt-get install -y util-linux (part of the base system; .ci/run assumes it)",
    },
    Tool {
        name: "mount",
        probe: Probe::Program("mount"),
        install: "apt-get install -y mount (part of the base system; .ci/run assumes it)",
    },
    Tool {
        name: "curl",
        probe: Probe::Program("curl"),
        install: "apt-get install -y --no-install-recommends curl",
    },
    Tool {
        name: "openssl",
        probe: Probe::Program("openssl"),
        install: "apt-get install -y --no-install-recommends openssl",
    },
    Tool {
        name: "systemd-analyze",
        probe: Probe::Program("systemd-analyze"),
        install: "apt-get install -y --no-install-recommends systemd",
    },
];

fn tool(name: &str) -> &'static Tool {
    TOOLS
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("tools: unknown tool `{name}` (add it to TOOLS in tools.rs)"))
}

/// Whether `CI` is set (non-empty): missing tools fail instead of skipping.
pub fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty())
}

/// Whether the tool `name` is here (one of the names in this module's table: `aioquic`,
/// `h11`, `httpx`, `prometheus_client`, `python3`, `caddy`, `ip`, `unshare`, `mount`, `curl`,
/// `openssl`, `systemd-analyze`), probed without reporting anything.
pub fn available(name: &str) -> bool {
    match tool(name).probe {
        Probe::Program(p) => Command::new("sh")
            .args(["-c", &format!("command -v {p}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success()),
        Probe::Python(m) => Command::new("python3")
            .args(["-c", &format!("import {m}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success()),
        Probe::Own => panic!("tools: `{name}` is found by its own helper, not by available()"),
    }
}

/// `true` where the tool `name` is here. Where it is not: under CI (see [`in_ci`]) panics
/// naming the tool and the `.ci/run` line that installs it; elsewhere prints a `SKIPPED`
/// line and gives `false` (the caller returns: the test passes without running).
pub fn require(name: &str) -> bool {
    available(name) || missing(name)
}

/// Reports the tool `name` missing, for a caller that probed it itself (Chromium's several
/// binaries and `QWEB_CHROMIUM`): panics under CI, else prints a `SKIPPED` line; `false`.
pub fn missing(name: &str) -> bool {
    let t = tool(name);
    let why = format!(
        "`{name}` is needed and not installed (.ci/run installs it: `{}`)",
        t.install
    );
    assert!(
        !in_ci(),
        "CI is set, so a missing tool fails the test: {why}"
    );
    eprintln!("SKIPPED: {why}");
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tool_names_how_it_is_installed() {
        for t in TOOLS {
            assert!(!t.install.is_empty(), "{}", t.name);
            assert_eq!(tool(t.name).name, t.name);
        }
    }

    /// `missing` skips outside CI and panics under it: run in a child process of this test
    /// binary with `CI` set and unset, since the variable is process-wide.
    #[test]
    fn missing_skips_outside_ci_and_fails_under_it() {
        if let Some(ci) = std::env::var_os("QWEB_TOOLS_CHILD") {
            // the child: CI as the parent set it
            assert_eq!(in_ci(), !ci.is_empty());
            assert!(!missing("caddy"));
            return;
        }
        let exe = std::env::current_exe().expect("test binary");
        let run = |ci: &str| {
            Command::new(&exe)
                .args([
                    "tools::tests::missing_skips_outside_ci_and_fails_under_it",
                    "--exact",
                    "--nocapture",
                ])
                .env("QWEB_TOOLS_CHILD", ci)
                .env("CI", ci)
                .output()
                .expect("run the test binary")
        };
        let skip = run("");
        let text = String::from_utf8_lossy(&skip.stderr);
        assert!(skip.status.success(), "{text}");
        assert!(text.contains("SKIPPED: `caddy` is needed"), "{text}");
        let fail = run("1");
        let text = String::from_utf8_lossy(&fail.stderr);
        assert!(!fail.status.success(), "{text}");
        assert!(
            text.contains("CI is set")
                && text.contains("apt-get install -y --no-install-recommends caddy"),
            "{text}"
        );
    }
}
