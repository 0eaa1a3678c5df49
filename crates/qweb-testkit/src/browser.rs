//! Headless Chromium for tests that need a browser's view (charset handling, content codings
//! a browser advertises).
//!
//! ```no_run
//! if let Some(b) = qweb_testkit::browser::chromium() {
//!     let dom = qweb_testkit::browser::dump_dom(&b, "https://127.0.0.1:8443/");
//!     assert!(dom.contains("<body"));
//! }
//! ```

use std::process::Command;

/// The Chromium to run: `$QWEB_CHROMIUM`, else the first of `chromium`, `chromium-browser`,
/// `google-chrome` that runs; `None` when there is none (the caller skips, saying so).
pub fn chromium() -> Option<String> {
    std::env::var("QWEB_CHROMIUM").ok().or_else(|| {
        ["chromium", "chromium-browser", "google-chrome"]
            .into_iter()
            .find(|b| {
                Command::new(b)
                    .arg("--version")
                    .output()
                    .is_ok_and(|o| o.status.success())
            })
            .map(str::to_owned)
    })
}

/// The DOM of `url` after load, as headless `browser` (a fresh profile, any certificate
/// accepted) renders it; panics when the browser fails or runs past 90 s.
pub fn dump_dom(browser: &str, url: &str) -> String {
    let profile = tempfile::tempdir().expect("profile dir");
    let out = Command::new("timeout")
        .arg("90")
        .arg(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--ignore-certificate-errors",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
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
