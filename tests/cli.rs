//! The `qweb` binary: zero-config start, check-config, graceful shutdown on SIGTERM.

#[allow(dead_code)]
#[path = "../crates/qweb-server/tests/common/upstream.rs"]
mod upstream;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_qweb");

fn client(ca: &Path) -> reqwest::Client {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for c in qweb_tls::load_certs(ca).unwrap() {
        roots.add(c).unwrap();
    }
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(qweb_tls::provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    reqwest::Client::builder()
        .use_preconfigured_tls(cfg)
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// Starts `qweb serve` and waits for its "listening" lines; returns the child and the lines
/// it printed on stderr before the "worker(s)" line.
fn spawn_serve(args: &[&str], cwd: &Path, state: &Path) -> (Child, Vec<String>) {
    let mut child = Command::new(BIN)
        .arg("serve")
        .args(args)
        .current_dir(cwd)
        .env("QWEB_STATE_DIR", state)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = Vec::new();
    let mut reader = BufReader::new(stderr);
    loop {
        let mut l = String::new();
        if reader.read_line(&mut l).unwrap() == 0 {
            panic!("qweb exited early: {lines:?}");
        }
        let done = l.contains("worker(s)");
        lines.push(l.trim_end().to_owned());
        if done {
            break;
        }
    }
    // keep draining stderr so the server never blocks on a full pipe
    std::thread::spawn(move || for _ in reader.lines() {});
    (child, lines)
}

fn sigterm(child: &Child) {
    // SAFETY: kill(2) with a pid we own and a valid signal number.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
}

fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let start = std::time::Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if start.elapsed() > within {
            let _ = child.kill();
            panic!("qweb did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn listen_addr(lines: &[String], scheme: &str) -> String {
    lines
        .iter()
        .find_map(|l| l.split_once(&format!("listening on {scheme}://")))
        .map(|(_, rest)| rest.split('/').next().unwrap().to_owned())
        .unwrap_or_else(|| panic!("no {scheme} listener in {lines:?}"))
}

/// The README's first command: `qweb serve` with no config serves the welcome page on
/// https://127.0.0.1:8443 and http://127.0.0.1:8080 with a generated certificate that is
/// reused on the next start. (The only test that uses the fixed default ports.)
#[tokio::test(flavor = "multi_thread")]
async fn zero_config_start_serves_welcome_and_reuses_certificate() {
    let cwd = tempfile::tempdir().unwrap();
    let state = cwd.path().join("state");
    let (mut child, lines) = spawn_serve(&[], cwd.path(), &state);
    let text = lines.join("\n");
    assert!(text.contains("https://127.0.0.1:8443/"), "{text}");
    assert!(text.contains("http://127.0.0.1:8080/"), "{text}");
    let cert = state.join("selfsigned.crt");
    assert!(
        text.contains(&format!("{} (generated now)", cert.display())),
        "{text}"
    );
    let c = client(&cert);
    let r = c.get("https://127.0.0.1:8443/").send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("Welcome to qweb"));
    let r = c.get("https://localhost:8443/").send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = c.get("http://127.0.0.1:8080/").send().await.unwrap();
    assert!(r.text().await.unwrap().contains("Welcome to qweb"));
    let pem = std::fs::read(&cert).unwrap();
    sigterm(&child);
    assert!(wait_exit(&mut child, Duration::from_secs(15)).success());

    // second start: same certificate; ./public now exists and is served instead
    std::fs::create_dir(cwd.path().join("public")).unwrap();
    std::fs::write(cwd.path().join("public/index.html"), "mine").unwrap();
    let (mut child, lines) = spawn_serve(&[], cwd.path(), &state);
    let text = lines.join("\n");
    assert!(text.contains("(reused)"), "{text}");
    assert_eq!(std::fs::read(&cert).unwrap(), pem);
    let r = client(&cert)
        .get("https://127.0.0.1:8443/")
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "mine");
    sigterm(&child);
    assert!(wait_exit(&mut child, Duration::from_secs(15)).success());
}

#[test]
fn check_config_reports_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        "workers = 1\n[[listener]]\naddress = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .arg("check-config")
        .arg(&good)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok"));

    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "workers = 1\n\n[limits]\nkeepalive_timeout = \"forever\"\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .arg("check-config")
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{}:4:", bad.display())) && err.contains("limits.keepalive_timeout"),
        "{err}"
    );
    // serve refuses a bad config before binding anything
    let out = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("limits.keepalive_timeout"));
    let out = Command::new(BIN)
        .arg("check-config")
        .arg(dir.path().join("missing.toml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn help_is_useful() {
    for args in [
        &["--help"][..],
        &["serve", "--help"],
        &["check-config", "--help"],
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Usage"), "{text}");
    }
    let out = Command::new(BIN)
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("8443"));
}

/// SIGTERM: new connections are refused, the request in flight completes, exit status 0.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_lets_in_flight_requests_finish() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let up = upstream::start("slow").await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("q.toml");
    std::fs::write(
        &cfg,
        format!(
            "workers = 2\nshutdown_timeout = \"20s\"\n[log]\naccess = false\n\
             [[listener]]\naddress = \"127.0.0.1:0\"\n\
             [[route]]\nprefix = \"/\"\nupstreams = [\"{}\"]\n",
            up.addr
        ),
    )
    .unwrap();
    let (mut child, lines) = spawn_serve(
        &["--config", cfg.to_str().unwrap()],
        dir.path(),
        &dir.path().join("state"),
    );
    let addr = listen_addr(&lines, "http");
    let c = reqwest::Client::new();
    let url = format!("http://{addr}/slow/1500");
    let in_flight = tokio::spawn({
        let c = c.clone();
        async move { c.get(url).send().await?.text().await }
    });
    tokio::time::sleep(Duration::from_millis(400)).await; // the request reaches the upstream
    sigterm(&child);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let refused = reqwest::Client::new()
        .get(format!("http://{addr}/x"))
        .timeout(Duration::from_secs(3))
        .send()
        .await;
    assert!(
        refused.is_err(),
        "a new connection was accepted after SIGTERM"
    );
    let body = in_flight.await.unwrap().expect("in-flight request failed");
    assert_eq!(body, "slow");
    let status =
        tokio::task::spawn_blocking(move || wait_exit(&mut child, Duration::from_secs(15)))
            .await
            .unwrap();
    assert!(status.success(), "{status:?}");
}

/// One access-log line per request on stdout: time, client, method, path, protocol, status,
/// bytes, duration.
#[tokio::test(flavor = "multi_thread")]
async fn access_log_line_per_request() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("site")).unwrap();
    std::fs::write(dir.path().join("site/hello.txt"), "hello world").unwrap();
    let cfg = dir.path().join("q.toml");
    std::fs::write(
        &cfg,
        "workers = 1\n[[listener]]\naddress = \"127.0.0.1:0\"\n[[route]]\nprefix = \"/\"\nroot = \"site\"\n",
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&cfg)
        .env("QWEB_STATE_DIR", dir.path().join("state"))
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut lines = Vec::new();
    loop {
        let mut l = String::new();
        assert!(err.read_line(&mut l).unwrap() > 0, "exited: {lines:?}");
        let done = l.contains("worker(s)");
        lines.push(l.trim_end().to_owned());
        if done {
            break;
        }
    }
    std::thread::spawn(move || for _ in err.lines() {});
    let addr = listen_addr(&lines, "http");
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let r = reqwest::get(format!("http://{addr}/hello.txt?x=1"))
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "hello world");
    let r = reqwest::get(format!("http://{addr}/missing"))
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let out = child.stdout.take().unwrap();
    let log = tokio::task::spawn_blocking(move || {
        let mut r = BufReader::new(out);
        let mut v = Vec::new();
        for _ in 0..2 {
            let mut l = String::new();
            r.read_line(&mut l).unwrap();
            v.push(l);
        }
        v
    })
    .await
    .unwrap();
    sigterm(&child);
    assert!(wait_exit(&mut child, Duration::from_secs(15)).success());
    // e.g. 2026-11-30T07:00:00.123456Z 127.0.0.1:5555 "GET /hello.txt?x=1 HTTP/1.1" 200 11 0.2ms
    let first: Vec<&str> = log[0].split_whitespace().collect();
    assert!(first[0].contains('T') && first[0].ends_with('Z'), "{log:?}");
    assert!(first[1].starts_with("127.0.0.1:"), "{log:?}");
    assert_eq!(
        &first[2..7],
        &["\"GET", "/hello.txt?x=1", "HTTP/1.1\"", "200", "11"],
        "{log:?}"
    );
    assert!(first[7].ends_with("ms"), "{log:?}");
    assert!(log[1].contains("\"GET /missing HTTP/1.1\" 404"), "{log:?}");
}
