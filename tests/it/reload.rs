//! Reload under load, through the real binary: `qweb serve` in a child process, SIGHUP and
//! `qweb reload`, real TLS clients (HTTP/1.1 and h2, keep-alive and a new handshake per
//! request) while every handshake pauses on a 200 ms engine.
#![allow(unsafe_code)] // libc calls on test processes and files; each block has its SAFETY note

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use qweb_testkit::free_port;
use qweb_testkit::metrics::scrape;
use qweb_testkit::process::Qweb;
use qweb_testkit::tls::{connect, proto_builder, ClientTls, Proto};

const BIN: &str = env!("CARGO_BIN_EXE_qweb");

/// A certificate for `localhost` and 127.0.0.1 with its key, as PEM files `<name>.crt/.key`.
fn write_cert(dir: &Path, name: &str) -> Vec<u8> {
    qweb_testkit::tls::write_self_signed(dir, name, &["localhost", "127.0.0.1"])
}

/// Generation `g` ("a" or "b"): its own certificate, `/gen` from its own folder, and a route
/// only it has (`/only-a`, `/only-b`). The listeners, the engine and `/` are the same.
fn config(dir: &Path, tls_port: u16, plain_port: u16, g: &str) -> String {
    let d = dir.display();
    let admin = ADMIN_PORT.with(|p| *p);
    format!(
        "workers = 2\nstate_dir = \"{d}/state\"\nshutdown_timeout = \"10s\"\n\
         [admin]\naddress = \"127.0.0.1:{admin}\"\n\
         [offload.engines.slow]\nkind = \"pool\"\nthreads = 2\nadded_latency = \"200ms\"\n\
         [[listener]]\naddress = \"127.0.0.1:{tls_port}\"\nhttp2 = true\n[listener.tls]\n\
         certificates = [{{ cert = \"{d}/{g}.crt\", key = \"{d}/{g}.key\" }}]\n\
         [listener.offload]\nengine = \"slow\"\n\
         [[listener]]\naddress = \"127.0.0.1:{plain_port}\"\n\
         [[route]]\nprefix = \"/gen\"\nroot = \"{d}/site-{g}\"\nstrip_prefix = true\n\
         [[route]]\nprefix = \"/only-{g}\"\nroot = \"{d}/site-{g}\"\nstrip_prefix = true\n\
         [[route]]\nprefix = \"/\"\nroot = \"{d}/site\"\n"
    )
}

thread_local! {
    static ADMIN_PORT: u16 = free_port();
}

/// The admin listener (its port is fixed: a reload keeps it).
fn admin() -> std::net::SocketAddr {
    ([127, 0, 0, 1], ADMIN_PORT.with(|p| *p)).into()
}

fn tls_config(roots: &[PathBuf], h2: bool) -> rustls::ClientConfig {
    ClientTls::trusting_all(roots).proto(proto(h2)).build()
}

fn proto(h2: bool) -> Proto {
    if h2 {
        Proto::H2
    } else {
        Proto::H1
    }
}

/// A client trusting both generations' certificates. `fresh`: a new connection (and TLS
/// handshake) for every request.
fn client(roots: &[PathBuf], h2: bool, fresh: bool) -> reqwest::Client {
    let b = proto_builder(tls_config(roots, h2), proto(h2));
    let b = if fresh {
        b.pool_max_idle_per_host(0)
    } else {
        b
    };
    b.build().unwrap()
}

/// The certificate a new TLS connection to `port` is served.
async fn served_cert(roots: &[PathBuf], port: u16) -> Vec<u8> {
    let cfg = Arc::new(tls_config(roots, false));
    let tls = connect(([127, 0, 0, 1], port).into(), &cfg).await.unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    failed: AtomicU64,
    refused: AtomicU64,
    errors: Mutex<Vec<String>>,
}

impl Tally {
    fn record(&self, what: &str, r: Result<reqwest::Response, reqwest::Error>) {
        match r {
            Ok(r) if r.status() == 200 => {
                self.ok.fetch_add(1, Relaxed);
            }
            Ok(r) => {
                self.failed.fetch_add(1, Relaxed);
                self.errors
                    .lock()
                    .unwrap()
                    .push(format!("{what}: status {}", r.status()));
            }
            Err(e) => {
                let refused = format!("{e:?}").contains("ConnectionRefused");
                if refused {
                    self.refused.fetch_add(1, Relaxed);
                } else {
                    self.failed.fetch_add(1, Relaxed);
                }
                self.errors.lock().unwrap().push(format!("{what}: {e:?}"));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_reloads_under_load_lose_nothing_and_switch_certificates_and_routes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let der_a = write_cert(d, "a");
    let der_b = write_cert(d, "b");
    for (site, body) in [("site", "home"), ("site-a", "A"), ("site-b", "B")] {
        std::fs::create_dir_all(d.join(site)).unwrap();
        std::fs::write(d.join(site).join("gen.txt"), body).unwrap();
    }
    std::fs::write(d.join("site/index.html"), "home").unwrap();
    let (tls_port, plain_port) = (free_port(), free_port());
    let file = d.join("qweb.toml");
    std::fs::write(&file, config(d, tls_port, plain_port, "a")).unwrap();
    let qweb = Qweb::serve(BIN, &file);
    let roots = vec![d.join("a.crt"), d.join("b.crt")];
    let https = format!("https://127.0.0.1:{tls_port}");
    let plain = format!("http://127.0.0.1:{plain_port}");

    // continuous load: keep-alive and new-handshake clients, h1 and h2, TLS and plain
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let mut load = Vec::new();
    for (h2, fresh, what) in [
        (false, false, "h1 keep-alive"),
        (true, false, "h2 keep-alive"),
        (false, true, "h1 new handshakes"),
        (true, true, "h2 new handshakes"),
        (false, true, "h1 new handshakes 2"),
        (true, true, "h2 new handshakes 2"),
    ] {
        let (stop, tally, url) = (stop.clone(), tally.clone(), format!("{https}/"));
        let c = client(&roots, h2, fresh);
        load.push(tokio::spawn(async move {
            while !stop.load(Relaxed) {
                tally.record(what, c.get(&url).send().await);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    {
        let (stop, tally, url) = (stop.clone(), tally.clone(), format!("{plain}/gen.txt"));
        let c = reqwest::Client::builder().http1_only().build().unwrap();
        load.push(tokio::spawn(async move {
            while !stop.load(Relaxed) {
                tally.record("plain keep-alive", c.get(&url).send().await);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }

    let probe = client(&roots, false, true);
    let get = |path: &str| {
        let (probe, url) = (probe.clone(), format!("{https}{path}"));
        async move {
            let r = probe.get(url).send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.text().await.unwrap())
        }
    };
    assert_eq!(served_cert(&roots, tls_port).await, der_a);
    assert_eq!(get("/gen/gen.txt").await, (200, "A".to_owned()));
    let submitted = "qweb_offload_ops_submitted_total";
    let slow_before = scrape(admin())
        .await
        .value(submitted, &[("engine", "slow")]);
    assert!(
        slow_before >= 1.0,
        "no handshake went through the slow engine"
    );

    let mut reloads = 0;
    for i in 1..=20 {
        let g = if i % 2 == 1 { "b" } else { "a" };
        std::fs::write(&file, config(d, tls_port, plain_port, g)).unwrap();
        if i % 4 == 0 {
            // `qweb reload` finds the instance through its pid file
            let out = Command::new(BIN)
                .args(["reload", "--config"])
                .arg(&file)
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
        } else {
            qweb.signal(libc::SIGHUP);
        }
        reloads += 1;
        qweb.wait_for("configuration reloaded", reloads);
        // new connections see the new certificate and routes
        let (want, other) = if g == "b" {
            (&der_b, &der_a)
        } else {
            (&der_a, &der_b)
        };
        let got = served_cert(&roots, tls_port).await;
        assert!(&got == want && &got != other, "reload {i}: old certificate");
        assert_eq!(
            get("/gen/gen.txt").await,
            (200, g.to_uppercase()),
            "reload {i}"
        );
        assert_eq!(
            get(&format!("/only-{g}/gen.txt")).await.0,
            200,
            "reload {i}"
        );
        let gone = if g == "b" {
            "/only-a/gen.txt"
        } else {
            "/only-b/gen.txt"
        };
        assert_eq!(
            get(gone).await.0,
            404,
            "reload {i}: the old route still serves"
        );
        // some load between reloads
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // a broken configuration is refused with its location; the old one keeps serving
    let before = qweb.count("reload refused");
    std::fs::write(
        &file,
        config(d, tls_port, plain_port, "b").replace(
            "shutdown_timeout = \"10s\"",
            "shutdown_timeout = \"10 parsecs\"",
        ),
    )
    .unwrap();
    qweb.signal(libc::SIGHUP);
    let refused = qweb.wait_for("reload refused", before + 1);
    assert!(
        refused.contains("qweb.toml:3:") && refused.contains("shutdown_timeout"),
        "{refused}"
    );
    assert_eq!(served_cert(&roots, tls_port).await, der_a);
    assert_eq!(get("/gen/gen.txt").await, (200, "A".to_owned()));
    tokio::time::sleep(Duration::from_millis(300)).await;

    // the unchanged engine was kept through 20 reloads: its counters did not start over
    let slow_after = scrape(admin())
        .await
        .value(submitted, &[("engine", "slow")]);
    assert!(
        slow_after > slow_before + 20.0,
        "{slow_before} then {slow_after}"
    );
    assert_eq!(
        scrape(admin())
            .await
            .value("qweb_config_reloads_total", &[("result", "ok")]),
        20.0
    );
    assert_eq!(
        scrape(admin())
            .await
            .value("qweb_config_reloads_total", &[("result", "failed")]),
        1.0
    );

    stop.store(true, Relaxed);
    for l in load {
        l.await.unwrap();
    }
    let (ok, failed, refused) = (
        tally.ok.load(Relaxed),
        tally.failed.load(Relaxed),
        tally.refused.load(Relaxed),
    );
    eprintln!("load: {ok} ok, {failed} failed, {refused} refused over {reloads} reloads");
    assert_eq!(
        (failed, refused),
        (0, 0),
        "{:#?}",
        tally.errors.lock().unwrap()
    );
    assert!(ok > 200, "too little load to mean anything: {ok}");

    // SIGTERM: drains and exits 0
    let mut qweb = qweb;
    qweb.signal(libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = qweb.child().try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "qweb did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    assert!(
        !d.join("state/qweb.pid").exists(),
        "the pid file outlived the process"
    );
}

#[test]
fn reload_without_a_running_instance_exits_1_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let file = one_listener(dir.path());
    let out = Command::new(BIN)
        .args(["reload", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no running qweb") && err.contains("qweb.pid"),
        "{err}"
    );
    // a stale pid file (the process is gone) is no running instance either
    std::fs::create_dir_all(dir.path().join("state")).unwrap();
    std::fs::write(dir.path().join("state/qweb.pid"), "2147483000\n").unwrap();
    let out = Command::new(BIN)
        .args(["reload", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no qweb holds that pid file"), "{err}");
}

/// `dir/qweb.toml`: one plain listener on a free port, the state in `dir/state`.
fn one_listener(dir: &Path) -> PathBuf {
    let file = dir.join("qweb.toml");
    std::fs::write(
        &file,
        format!(
            "state_dir = \"{}/state\"\n[[listener]]\naddress = \"127.0.0.1:{}\"\n",
            dir.display(),
            free_port()
        ),
    )
    .unwrap();
    file
}

/// SIGHUP and SIGUSR1 while qweb starts do not kill it. Before: their default action
/// (termination) in the first ~20 ms, until the handlers were installed.
///
/// - Started with SIGHUP blocked, as `qweb upgrade` now starts the new binary, and signalled
///   at once: it unblocks it once its handlers exist and reloads after its start (before:
///   never, the mask stayed).
/// - A plain start, signalled as soon as `main` has blocked the signals (read from
///   /proc/PID/status), i.e. while the configuration loads and before the handlers exist:
///   it survives and acts on the signal once serving. (The loader's millisecond or two
///   before `main` is beyond the process's reach; `qweb upgrade` covers it by the
///   inherited mask.)
#[test]
fn signals_while_starting_are_held_not_fatal() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let file = one_listener(dir.path());
    let answers = |q: &Qweb| {
        let addr = qweb_testkit::process::listen_addr(&q.lines(), "http");
        let mut s = std::net::TcpStream::connect(&addr)
            .unwrap_or_else(|e| panic!("qweb died: {e}\n{}", q.lines().join("\n")));
        use std::io::{Read, Write};
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut got = String::new();
        s.read_to_string(&mut got).unwrap();
        assert!(got.starts_with("HTTP/1.1 "), "{got}");
    };

    // Started with SIGHUP blocked.
    let mut cmd = qweb_testkit::process::serve_command(BIN, &file);
    // SAFETY: runs in the forked child before exec; only async-signal-safe calls on a local set.
    unsafe {
        cmd.pre_exec(|| {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGHUP);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            Ok(())
        });
    }
    let q = Qweb::spawn_unready(cmd);
    q.signal(libc::SIGHUP);
    q.wait_for("configuration reloaded", 1);
    answers(&q);
    drop(q);

    // A plain start, signalled as soon as `main` has blocked the signals (seen in
    // /proc/PID/status; a signal before that, in the loader, would still be fatal and is
    // not sent), while it loads its configuration and installs its handlers.
    for sig in [libc::SIGHUP, libc::SIGUSR1] {
        let q = Qweb::spawn_unready(qweb_testkit::process::serve_command(BIN, &file));
        let status = format!("/proc/{}/status", q.pid());
        let blocked = |text: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix("SigBlk:"))
                .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
                .is_some_and(|m| m & (1 << (sig - 1)) != 0)
        };
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until && q.count("qweb: listening on") == 0 {
            if std::fs::read_to_string(&status).is_ok_and(|t| blocked(&t)) {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        q.signal(sig);
        q.wait_for("qweb: listening on", 1);
        if sig == libc::SIGHUP {
            q.wait_for("configuration reloaded", 1);
        }
        answers(&q);
    }
}

/// `Type=notify-reload`: READY=1 (with MAINPID) once serving, RELOADING=1 with
/// MONOTONIC_USEC then READY=1 around a reload, STOPPING=1 on SIGTERM.
#[test]
fn sd_notify_ready_reloading_ready_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let sock_path = dir.path().join("notify.sock");
    let sock = std::os::unix::net::UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let file = one_listener(dir.path());
    let mut child = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&file)
        .env_remove("RUST_LOG")
        .env("NOTIFY_SOCKET", &sock_path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let recv = || {
        let mut buf = [0u8; 256];
        let n = sock.recv(&mut buf).expect("a notification");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    assert_eq!(recv(), format!("READY=1\nMAINPID={}", child.id()));
    // SAFETY: kill(2) with our child's pid and a valid signal number.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGHUP) };
    assert_eq!(rc, 0);
    let reloading = recv();
    let usec: u64 = reloading
        .strip_prefix("RELOADING=1\nMONOTONIC_USEC=")
        .unwrap_or_else(|| panic!("{reloading:?}"))
        .parse()
        .unwrap();
    assert!(usec > 0);
    assert!(recv().starts_with("READY=1\n"));
    // SAFETY: as above.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
    assert_eq!(recv(), "STOPPING=1");
    assert!(child.wait().unwrap().success());
}

/// A reload that removes one plain listener and adds another: the removed port refuses
/// connections at once (not accepted into a queue nobody serves), the added one serves, the
/// kept one never stopped.
#[test]
fn reload_closes_removed_listeners_and_opens_added_ones() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("site")).unwrap();
    std::fs::write(d.join("site/index.html"), "home").unwrap();
    let (kept, removed, added) = (free_port(), free_port(), free_port());
    let file = d.join("qweb.toml");
    let config = |ports: &[u16]| {
        let mut t = format!(
            "workers = 2\nstate_dir = \"{0}/state\"\n[[route]]\nprefix = \"/\"\nroot = \"{0}/site\"\n",
            d.display()
        );
        for p in ports {
            t.push_str(&format!("[[listener]]\naddress = \"127.0.0.1:{p}\"\n"));
        }
        t
    };
    let get = |port: u16| -> std::io::Result<String> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.write_all(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    };
    std::fs::write(&file, config(&[kept, removed])).unwrap();
    let qweb = Qweb::serve(BIN, &file);
    assert!(get(kept).unwrap().ends_with("home"));
    assert!(get(removed).unwrap().ends_with("home"));
    assert!(get(added).is_err());
    std::fs::write(&file, config(&[kept, added])).unwrap();
    qweb.signal(libc::SIGHUP);
    qweb.wait_for("configuration reloaded", 1);
    assert!(get(kept).unwrap().ends_with("home"));
    assert!(get(added).unwrap().ends_with("home"));
    let e = get(removed).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
}
