//! The `qweb` binary: zero-config start, check-config, graceful shutdown on SIGTERM.
#![allow(unsafe_code)] // libc calls on test processes and files; each block has its SAFETY note

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use qweb_testkit::process::{cpu_seconds, listen_addr, Qweb, BANNER_END};
use qweb_testkit::tls::{https_builder, ClientTls};
use qweb_testkit::upstream;

const BIN: &str = env!("CARGO_BIN_EXE_qweb");

fn client(ca: &Path) -> reqwest::Client {
    https_builder(ClientTls::trusting(ca).build())
        .build()
        .unwrap()
}

/// Starts `qweb serve ARGS` in `cwd` with `QWEB_STATE_DIR=state` and waits for its banner.
fn spawn_serve(args: &[&str], cwd: &Path, state: &Path) -> Qweb {
    let mut cmd = Command::new(BIN);
    cmd.arg("serve")
        .args(args)
        .current_dir(cwd)
        .env("QWEB_STATE_DIR", state)
        // no default configuration file (a machine's /etc/qweb/qweb.toml would be read)
        .env("QWEB_CONFIG", cwd.join("no-such-config.toml"))
        .env_remove("RUST_LOG")
        .stdout(Stdio::null());
    Qweb::spawn(cmd, BANNER_END)
}

/// The README's first command: `qweb serve` with no config serves the welcome page on
/// https://127.0.0.1:8443 and http://127.0.0.1:8080 with a generated certificate that is
/// reused on the next start. (The only test that uses the fixed default ports.)
#[tokio::test(flavor = "multi_thread")]
async fn zero_config_start_serves_welcome_and_reuses_certificate() {
    let cwd = tempfile::tempdir().unwrap();
    let state = cwd.path().join("state");
    let mut child = spawn_serve(&[], cwd.path(), &state);
    let text = child.banner.join("\n");
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
    child.signal(libc::SIGTERM);
    assert!(child.wait_exit(Duration::from_secs(15)).success());

    // second start: same certificate; ./public now exists and is served instead
    std::fs::create_dir(cwd.path().join("public")).unwrap();
    std::fs::write(cwd.path().join("public/index.html"), "mine").unwrap();
    let mut child = spawn_serve(&[], cwd.path(), &state);
    let text = child.banner.join("\n");
    assert!(text.contains("(reused)"), "{text}");
    assert_eq!(std::fs::read(&cert).unwrap(), pem);
    let r = client(&cert)
        .get("https://127.0.0.1:8443/")
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "mine");
    child.signal(libc::SIGTERM);
    assert!(child.wait_exit(Duration::from_secs(15)).success());
}

/// `qweb -t` reads a `basic_auth` users file and refuses a hash it does not accept, naming
/// the configuration's key, the users file and its line.
#[test]
fn check_config_refuses_a_users_file_naming_its_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("ops.htpasswd"),
        "# ops\n\nbob:$apr1$r31.....$HqJZimcKQFAMYayBlzkrA/\n",
    )
    .unwrap();
    let conf = dir.path().join("qweb.toml");
    std::fs::write(
        &conf,
        "workers = 1\n[[listener]]\naddress = \"127.0.0.1:0\"\n\
         [[route]]\nprefix = \"/admin\"\nroot = \".\"\n\
         basic_auth = { realm = \"ops\", users = \"ops.htpasswd\" }\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .arg("-t")
        .arg("-c")
        .arg(&conf)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    let users = dir.path().join("ops.htpasswd");
    assert!(
        err.contains("route[0].basic_auth.users")
            && err.contains(&format!("`{}` line 3", users.display()))
            && err.contains("MD5"),
        "{err}"
    );
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

/// `qweb -t` names the key of a bad `proxy_protocol` block, of a `connections_per_client`
/// that is not a number, and of bad `allow`, `forward_auth` and `upstream_proxy_protocol`
/// values (`qweb-config` `tests_traffic.rs` has every bad value of these keys).
#[test]
fn check_config_names_bad_proxy_protocol_and_connection_limits() {
    let dir = tempfile::tempdir().unwrap();
    for (text, line, key) in [
        (
            "[[listener]]\naddress = \"127.0.0.1:0\"\nproxy_protocol = { trusted = [\"10.0.0.0/8\", \"10.1/16\"] }\n",
            3,
            "listener[0].proxy_protocol.trusted[1]",
        ),
        (
            "[[listener]]\naddress = \"127.0.0.1:0\"\nproxy_protocol = { trusted = [] }\n",
            3,
            "listener[0].proxy_protocol.trusted",
        ),
        (
            "[limits]\nconnections_per_client = \"lots\"\n",
            2,
            "connections_per_client",
        ),
        ("[limits]\nconnections_per_client = -3\n", 2, "connections_per_client"),
        (
            "[[route]]\nprefix = \"/api\"\nroot = \"/tmp\"\nrate_limit = { rate = \"10/s\", scope = \"fleet\" }\n",
            4,
            "route[0].rate_limit.scope",
        ),
        (
            "[[route]]\nprefix = \"/\"\nroot = \"/tmp\"\nallow = [\"10.0.0.0/8\", \"office\"]\n",
            4,
            "route[0].allow[1]",
        ),
        (
            "[[route]]\nprefix = \"/\"\nroot = \"/tmp\"\nforward_auth = { upstream = \"127.0.0.1:9000\", timeout = \"0s\" }\n",
            4,
            "route[0].forward_auth.timeout",
        ),
        (
            "[[route]]\nprefix = \"/\"\nroot = \"/tmp\"\nforward_auth = { upstream = \"127.0.0.1:9000\", copy_headers = [\"bad name\"] }\n",
            4,
            "route[0].forward_auth.copy_headers[0]",
        ),
        (
            "[[route]]\nprefix = \"/\"\nupstreams = [\"127.0.0.1:3000\"]\nupstream_proxy_protocol = \"v3\"\n",
            4,
            "route[0].upstream_proxy_protocol",
        ),
    ] {
        let cfg = write_config(dir.path(), text);
        let out = Command::new(BIN).arg("-t").arg("-c").arg(&cfg).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{text}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("{}:{line}:", cfg.display())) && err.contains(key),
            "{text}: {err}"
        );
    }
}

#[test]
fn check_config_refuses_a_server_name_claimed_by_two_sites() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let route = format!("[[site.route]]\nprefix = \"/\"\nroot = \"{d}\"\n");
    let cfg = write_config(
        dir.path(),
        &format!(
            "[[site]]\nserver_names = [\"a.test\", \"*.b.test\"]\n{route}\
             [[site]]\nserver_names = [\"c.test\", \"*.B.test\"]\n{route}"
        ),
    );
    let out = Command::new(BIN)
        .arg("check-config")
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{}:7:", cfg.display()))
            && err.contains("site[1].server_names[1]")
            && err.contains("already claimed by site[0].server_names[1]"),
        "{err}"
    );
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
    let mut child = spawn_serve(
        &["--config", cfg.to_str().unwrap()],
        dir.path(),
        &dir.path().join("state"),
    );
    let addr = listen_addr(&child.banner, "http");
    let c = reqwest::Client::new();
    let url = format!("http://{addr}/slow/1500");
    let in_flight = tokio::spawn({
        let c = c.clone();
        async move { c.get(url).send().await?.text().await }
    });
    tokio::time::sleep(Duration::from_millis(400)).await; // the request reaches the upstream
    child.signal(libc::SIGTERM);
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
    let status = tokio::task::spawn_blocking(move || child.wait_exit(Duration::from_secs(15)))
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
    std::fs::write(dir.path().join("site/big.bin"), vec![7u8; 16 << 20]).unwrap();
    let cfg = dir.path().join("q.toml");
    std::fs::write(
        &cfg,
        "workers = 1\n[[listener]]\naddress = \"127.0.0.1:0\"\n[[route]]\nprefix = \"/\"\nroot = \"site\"\n",
    )
    .unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--config"])
        .arg(&cfg)
        .env("QWEB_STATE_DIR", dir.path().join("state"))
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped());
    let mut child = Qweb::spawn(cmd, BANNER_END);
    let addr = child.addr("http");
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let r = reqwest::get(format!("http://{addr}/hello.txt?x=1"))
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "hello world");
    let r = reqwest::get(format!("http://{addr}/missing"))
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let out = child.child().stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let next = || {
        rx.recv_timeout(Duration::from_secs(15))
            .expect("an access-log line")
    };
    let log = vec![next(), next()];
    // a quote in the target is escaped (no forged fields)
    let raw = |req: &'static [u8]| {
        let addr = addr.clone();
        async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
            s.write_all(req).await.unwrap();
            let mut b = vec![0u8; 4096];
            let _ = tokio::time::timeout(Duration::from_secs(5), s.read(&mut b)).await;
            s
        }
    };
    drop(raw(b"GET /q\"x%0A HTTP/1.1\r\nHost: a\r\n\r\n").await);
    let quoted = next();
    assert!(
        quoted.contains("\"GET /q\\x22x%0A HTTP/1.1\" 404"),
        "{quoted}"
    );
    // a request the parser refuses is logged too
    drop(raw(b"GET / HTTP/1.1\r\nHost : a\r\n\r\n").await);
    let refused = next();
    assert!(
        refused.contains("\"-\" 400 0") && refused.ends_with("refused"),
        "{refused}"
    );
    // a client that leaves in the middle of a 16 MiB body: logged when it is gone, with
    // the bytes handed over so far and the mark
    let s = raw(b"GET /big.bin HTTP/1.1\r\nHost: a\r\n\r\n").await;
    std::thread::sleep(Duration::from_millis(200));
    drop(s);
    let aborted = next();
    let f: Vec<&str> = aborted.split_whitespace().collect();
    assert!(aborted.ends_with(" aborted") && f[5] == "200", "{aborted}");
    let sent: u64 = f[6].parse().unwrap();
    assert!(sent < 16 << 20, "{aborted}");
    child.signal(libc::SIGTERM);
    assert!(child.wait_exit(Duration::from_secs(15)).success());
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

/// A config file in `dir` with `body`; returns its path.
fn write_config(dir: &Path, body: &str) -> std::path::PathBuf {
    let cfg = dir.join("q.toml");
    std::fs::write(&cfg, body).unwrap();
    cfg
}

/// A second SIGTERM exits at once, even with a request in flight and a long drain deadline.
#[tokio::test(flavor = "multi_thread")]
async fn second_signal_exits_at_once() {
    let up = upstream::start("slow").await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        &format!(
            "workers = 1\nshutdown_timeout = \"60s\"\n[log]\naccess = false\n\
             [[listener]]\naddress = \"127.0.0.1:0\"\n\
             [[route]]\nprefix = \"/\"\nupstreams = [\"{}\"]\n",
            up.addr
        ),
    );
    let mut child = spawn_serve(
        &["--config", cfg.to_str().unwrap()],
        dir.path(),
        &dir.path().join("state"),
    );
    let addr = listen_addr(&child.banner, "http");
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let in_flight = tokio::spawn(async move {
        reqwest::Client::new()
            .get(format!("http://{addr}/slow/30000"))
            .send()
            .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    child.signal(libc::SIGTERM);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        child.child().try_wait().unwrap().is_none(),
        "exited on the first signal"
    );
    let start = std::time::Instant::now();
    child.signal(libc::SIGTERM);
    let status = tokio::task::spawn_blocking(move || child.wait_exit(Duration::from_secs(10)))
        .await
        .unwrap();
    let took = start.elapsed();
    assert!(took < Duration::from_secs(3), "second signal took {took:?}");
    assert_eq!(status.code(), Some(130), "{status:?}");
    in_flight.abort();
}

/// SIGTERM while a TLS handshake is paused on a slow offload engine: the handshake completes,
/// the request is served, then the process exits 0.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_lets_a_paused_handshake_finish() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("site")).unwrap();
    std::fs::write(dir.path().join("site/index.html"), "served").unwrap();
    let cfg = write_config(
        dir.path(),
        "workers = 1\nshutdown_timeout = \"20s\"\n[log]\naccess = false\n\
         [offload.engines.slow]\nkind = \"pool\"\nadded_latency = \"1500ms\"\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\nself_signed = true\n\
         [listener.offload]\nengine = \"slow\"\nmode = \"async\"\ntimeout = \"10s\"\n\
         [[route]]\nprefix = \"/\"\nroot = \"site\"\n",
    );
    let state = dir.path().join("state");
    let mut child = spawn_serve(&["--config", cfg.to_str().unwrap()], dir.path(), &state);
    let addr = listen_addr(&child.banner, "https");
    let c = client(&state.join("selfsigned.crt"));
    let req = tokio::spawn(async move {
        c.get(format!(
            "https://localhost:{}/",
            addr.rsplit(':').next().unwrap()
        ))
        .send()
        .await?
        .text()
        .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await; // the handshake is paused now
    child.signal(libc::SIGTERM);
    let body = req
        .await
        .unwrap()
        .expect("the paused handshake was dropped");
    assert_eq!(body, "served");
    let status = tokio::task::spawn_blocking(move || child.wait_exit(Duration::from_secs(15)))
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
}

/// Two `qweb serve` on one address: the second refuses to start (SO_REUSEPORT would let it
/// share the port silently).
#[test]
fn second_instance_on_the_same_address_refuses_to_start() {
    let port = qweb_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        &format!(
            "workers = 2\n[[listener]]\naddress = \"127.0.0.1:0\"\n\
             [[listener]]\naddress = \"127.0.0.1:{port}\"\n"
        ),
    );
    let mut first = spawn_serve(
        &["--config", cfg.to_str().unwrap()],
        dir.path(),
        &dir.path().join("state"),
    );
    let mut second = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&cfg)
        .env("QWEB_STATE_DIR", dir.path().join("state"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = String::new();
    let mut pipe = second.stderr.take().unwrap();
    // a second instance that starts never exits on its own: give it 10 s, then stop both
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = second.try_wait().unwrap() {
            break Some(s);
        }
        if start.elapsed() > Duration::from_secs(10) {
            let _ = second.kill();
            let _ = second.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    first.signal(libc::SIGTERM);
    assert!(first.wait_exit(Duration::from_secs(15)).success());
    let status = status.expect("the second instance started and shared the port");
    std::io::Read::read_to_string(&mut pipe, &mut err).unwrap();
    assert_eq!(status.code(), Some(1), "{status:?}: {err}");
    assert!(
        err.contains(&format!(
            "error: 127.0.0.1:{port} is already in use by another process (listener[1].address)"
        )),
        "{err}"
    );
}

/// With its file descriptors exhausted, the admin listener backs off instead of spinning on
/// a failing accept: the process stays under 10% of a core while clients hammer it.
#[test]
fn admin_listener_under_emfile_does_not_spin() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let admin = qweb_testkit::free_port();
    let cfg = write_config(
        dir.path(),
        &format!(
            "workers = 1\n[admin]\naddress = \"127.0.0.1:{admin}\"\n\
             max_connections = 200\nconnections_per_client = 200\nheader_timeout = \"10s\"\n\
             [[listener]]\naddress = \"127.0.0.1:0\"\n"
        ),
    );
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--config"])
        .arg(&cfg)
        .env("QWEB_STATE_DIR", dir.path().join("state"))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: only async-signal-safe setrlimit between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let r = libc::rlimit {
                rlim_cur: 64,
                rlim_max: 64,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = Qweb::spawn(cmd, BANNER_END);
    // exhaust the descriptors: connections the admin accepts and then some in its backlog
    // (one address may hold them all here: the per-client bound would otherwise keep the
    // descriptors free, which admin_listener.rs tests)
    let mut held = Vec::new();
    for _ in 0..150 {
        if let Ok(s) = std::net::TcpStream::connect(("127.0.0.1", admin)) {
            held.push(s);
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    let before = cpu_seconds(child.pid());
    let start = std::time::Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    let used = cpu_seconds(child.pid()) - before;
    let share = used / start.elapsed().as_secs_f64();
    let logged = child.count("accept failed");
    drop(held);
    child.kill();
    eprintln!(
        "admin under EMFILE: {:.1}% of a core, {logged} accept-error lines",
        share * 100.0
    );
    assert!(logged >= 1, "the accept failures were never reported");
    assert!(share < 0.10, "{:.1}% of a core", share * 100.0);
    assert!(logged <= 8, "{logged} log lines in ~3.5 s");
}

/// qweb raises its soft open-file limit to the hard limit at start (a soft limit of 1024 is a
/// lockout a few HTTP/2 clients can cause).
#[test]
fn soft_open_file_limit_is_raised_to_the_hard_limit() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        "workers = 1\n[[listener]]\naddress = \"127.0.0.1:0\"\n",
    );
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--config"])
        .arg(&cfg)
        .env("QWEB_STATE_DIR", dir.path().join("state"))
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: only async-signal-safe setrlimit between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let r = libc::rlimit {
                rlim_cur: 256,
                rlim_max: 4096,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = Qweb::spawn(cmd, BANNER_END);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.pid())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .to_owned();
    child.signal(libc::SIGTERM);
    let _ = child.wait_exit(Duration::from_secs(15));
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&f[3..5], &["4096", "4096"], "{line}");
}
