//! Headless Chromium: the page as a real browser built it (`--dump-dom`), after its scripts
//! ran. Tests skip (with a printed `SKIPPED` line) where no browser is installed; `.ci/run`
//! installs one.
//!
//! ```no_run
//! use qweb_testkit::browser::Chromium;
//! let Some(browser) = Chromium::find() else { return };
//! // scripts run for 3 s of virtual time (timers, fetches) before the dump
//! let dom = browser.dump_dom("http://127.0.0.1:8080/status", Some(3000));
//! assert!(dom.contains("</html>"));
//! ```

use std::process::Command;

/// A Chromium binary and a profile folder of its own (removed on drop).
pub struct Chromium {
    bin: String,
    profile: tempfile::TempDir,
}

impl Chromium {
    /// `QWEB_CHROMIUM`, else the first of `chromium`, `chromium-browser`, `google-chrome`
    /// that runs; `None` (after printing a `SKIPPED` line) when there is none.
    pub fn find() -> Option<Chromium> {
        let bin = std::env::var("QWEB_CHROMIUM").ok().or_else(|| {
            ["chromium", "chromium-browser", "google-chrome"]
                .into_iter()
                .find(|b| {
                    Command::new(b)
                        .arg("--version")
                        .output()
                        .is_ok_and(|o| o.status.success())
                })
                .map(str::to_owned)
        });
        let Some(bin) = bin else {
            eprintln!("SKIPPED: no chromium (apt-get install chromium, or set QWEB_CHROMIUM)");
            return None;
        };
        let profile = tempfile::tempdir().expect("chromium profile dir");
        Some(Chromium { bin, profile })
    }

    /// The DOM of `url` once loaded, serialized; with `virtual_time_ms`, the page's timers and
    /// fetches run for that long of virtual time first. Certificate errors are ignored (test
    /// CAs). Panics when the browser fails.
    pub fn dump_dom(&self, url: &str, virtual_time_ms: Option<u32>) -> String {
        let mut cmd = Command::new("timeout");
        cmd.arg("90").arg(&self.bin).args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--ignore-certificate-errors",
        ]);
        cmd.arg(format!("--user-data-dir={}", self.profile.path().display()));
        if let Some(ms) = virtual_time_ms {
            cmd.arg(format!("--virtual-time-budget={ms}"));
        }
        let out = cmd
            .arg("--dump-dom")
            .arg(url)
            .output()
            .expect("run chromium");
        assert!(
            out.status.success(),
            "chromium failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("dom is utf-8")
    }
}
