//! Headless Chromium: the page as a real browser built it (`--dump-dom`), after its scripts
//! ran. Tests skip (with a printed `SKIPPED` line) where no browser is installed, and fail
//! where `CI` is set ([`crate::tools::missing`]); `.ci/run` installs one.
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
    /// that runs; `None` (after printing a `SKIPPED` line) when there is none, a panic when
    /// there is none and `CI` is set.
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
            crate::tools::missing("chromium");
            return None;
        };
        let profile = tempfile::tempdir().expect("chromium profile dir");
        Some(Chromium { bin, profile })
    }

    /// The DOM of `url` once loaded, serialized; with `virtual_time_ms`, the page's timers and
    /// fetches run for that long of virtual time first. Certificate errors are ignored (test
    /// CAs). Panics when the browser fails.
    pub fn dump_dom(&self, url: &str, virtual_time_ms: Option<u32>) -> String {
        self.dump_dom_with(url, virtual_time_ms, &[])
    }

    /// [`Chromium::dump_dom`] with more command-line switches (e.g. [`Chromium::quic_to`]'s).
    pub fn dump_dom_with(
        &self,
        url: &str,
        virtual_time_ms: Option<u32>,
        extra: &[String],
    ) -> String {
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
        cmd.args(extra);
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

    /// The switches that make Chromium speak HTTP/3 to `addr` from the first request (not
    /// only after an `Alt-Svc`), trusting the certificate in `cert_pem` by its public key
    /// (QUIC ignores `--ignore-certificate-errors`; it takes an SPKI pin: the base64 SHA-256
    /// of the certificate's SubjectPublicKeyInfo, computed with the `openssl` command).
    pub fn quic_to(addr: std::net::SocketAddr, cert_pem: &std::path::Path) -> Vec<String> {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "openssl x509 -in '{}' -pubkey -noout | openssl pkey -pubin -outform der | openssl dgst -sha256 -binary | base64",
                cert_pem.display()
            ))
            .output()
            .expect("openssl");
        let pin = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert_eq!(pin.len(), 44, "SPKI pin of {}: {pin:?}", cert_pem.display());
        vec![
            "--enable-quic".into(),
            format!("--origin-to-force-quic-on={addr}"),
            format!("--ignore-certificate-errors-spki-list={pin}"),
        ]
    }
}
