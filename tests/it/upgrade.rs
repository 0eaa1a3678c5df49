//! Binary upgrade under load, through the real binary: SIGUSR2 starts a new `qweb serve`
//! with the listening sockets inherited; the old process drains and exits; clients (HTTP/1.1
//! and h2, keep-alive and a new handshake per request, handshakes paused on a 200 ms engine)
//! see no failed request and no refused connection.
#![allow(unsafe_code)] // libc calls on test processes and files; each block has its SAFETY note

use std::path::{Path, PathBuf};

use qweb_testkit::free_port;
use qweb_testkit::process::{serve_command, Qweb, BANNER_END};
use qweb_testkit::tls::{proto_builder, tls_client_config, Proto};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_qweb");

fn client(ca: &Path, h2: bool, fresh: bool) -> reqwest::Client {
    let proto = if h2 { Proto::H2 } else { Proto::H1 };
    let b = proto_builder(tls_client_config(ca, proto), proto);
    let b = if fresh {
        b.pool_max_idle_per_host(0)
    } else {
        b
    };
    b.build().unwrap()
}

/// `d/site/index.html` ("home"), a free port, and where the configuration goes.
fn home_site(d: &Path) -> (u16, PathBuf) {
    std::fs::create_dir_all(d.join("site")).unwrap();
    std::fs::write(d.join("site/index.html"), "home").unwrap();
    (free_port(), d.join("qweb.toml"))
}

fn pid_alive(pid: i32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

fn read_pid(path: &PathBuf) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigusr2_hands_the_sockets_to_a_new_process_without_losing_a_request() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (tls_port, file) = home_site(d);
    let plain_port = free_port();
    std::fs::write(
        &file,
        format!(
            "workers = 2\nstate_dir = \"{0}/state\"\nshutdown_timeout = \"10s\"\n\
             [offload.engines.slow]\nkind = \"pool\"\nthreads = 2\nadded_latency = \"200ms\"\n\
             [[listener]]\naddress = \"127.0.0.1:{tls_port}\"\nhttp2 = true\n\
             [listener.tls]\nself_signed = true\n[listener.offload]\nengine = \"slow\"\n\
             [[listener]]\naddress = \"127.0.0.1:{plain_port}\"\n\
             [[route]]\nprefix = \"/\"\nroot = \"{0}/site\"\n",
            d.display()
        ),
    )
    .unwrap();
    // the new process inherits this stderr: one reader sees both
    let mut old = Qweb::serve(BIN, &file);
    let pid_file = d.join("state/qweb.pid");
    assert_eq!(read_pid(&pid_file), Some(old.pid() as i32));
    let ca = d.join("state/selfsigned.crt");

    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut load = Vec::new();
    for (h2, fresh) in [
        (false, false),
        (true, false),
        (false, true),
        (true, true),
        (false, true),
        (true, true),
    ] {
        let c = client(&ca, h2, fresh);
        let url = format!("https://localhost:{tls_port}/");
        let (stop, ok, failed, errors) = (stop.clone(), ok.clone(), failed.clone(), errors.clone());
        load.push(tokio::spawn(async move {
            while !stop.load(Relaxed) {
                match c.get(&url).send().await {
                    Ok(r) if r.status() == 200 => {
                        ok.fetch_add(1, Relaxed);
                    }
                    r => {
                        failed.fetch_add(1, Relaxed);
                        errors
                            .lock()
                            .unwrap()
                            .push(format!("h2={h2} fresh={fresh}: {r:?}"));
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    {
        let c = reqwest::Client::builder().http1_only().build().unwrap();
        let url = format!("http://127.0.0.1:{plain_port}/");
        let (stop, ok, failed, errors) = (stop.clone(), ok.clone(), failed.clone(), errors.clone());
        load.push(tokio::spawn(async move {
            while !stop.load(Relaxed) {
                match c.get(&url).send().await {
                    Ok(r) if r.status() == 200 => {
                        ok.fetch_add(1, Relaxed);
                    }
                    r => {
                        failed.fetch_add(1, Relaxed);
                        errors.lock().unwrap().push(format!("plain: {r:?}"));
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = ok.load(Relaxed);

    // SIGUSR2: the new process serves, the old one drains and exits 0
    old.signal(libc::SIGUSR2);
    old.wait_for("upgrade: process", 1);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = old.child().try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the old process did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    let new_pid = read_pid(&pid_file).expect("the new process's pid file");
    assert_ne!(new_pid, old.pid() as i32);
    assert!(pid_alive(new_pid));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Relaxed);
    for l in load {
        l.await.unwrap();
    }
    let (ok, failed) = (ok.load(Relaxed), failed.load(Relaxed));
    eprintln!("load: {ok} ok ({before} before the upgrade), {failed} failed");
    // SAFETY: kill(2) with the pid the new process wrote, a valid signal number.
    unsafe { libc::kill(new_pid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(30);
    while pid_alive(new_pid) {
        assert!(Instant::now() < deadline, "the new process did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(failed, 0, "{:#?}", errors.lock().unwrap());
    assert!(
        ok > before + 100,
        "no load after the upgrade: {ok} vs {before}"
    );
}

/// HTTP/3 across a binary upgrade: a download in flight (paced by the upstream over 4 s) on a QUIC connection of the old
/// process goes on to its last byte after the new process took the UDP sockets over (the
/// client's acknowledgements and flow-control credit reach the old process through the new
/// one, which forwards them), and a new connection is served by the new process. A second
/// upgrade while the old process still drains HTTP/3 is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http3_download_in_flight_survives_a_binary_upgrade() {
    if !qweb_testkit::tools::require("aioquic") {
        return;
    }
    let up = qweb_testkit::upstream::start("h3up").await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (port, file) = home_site(d);
    std::fs::write(
        &file,
        format!(
            "workers = 2\nstate_dir = \"{0}/state\"\nshutdown_timeout = \"30s\"\n\
             [[listener]]\naddress = \"127.0.0.1:{port}\"\nhttp3 = true\n\
             [listener.tls]\nself_signed = true\n\
             [[route]]\nprefix = \"/slow\"\nstrip_prefix = true\nupstreams = [\"{1}\"]\n\
             [[route]]\nprefix = \"/\"\nroot = \"{0}/site\"\n",
            d.display(),
            up.addr
        ),
    )
    .unwrap();
    let mut old = Qweb::serve(BIN, &file);
    let pid_file = d.join("state/qweb.pid");
    let ca = d.join("state/selfsigned.crt");
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();

    // 40 pieces of 16 KiB, 100 ms apart: about 4 s, and 640 KiB, far more than a QUIC
    // congestion window starts with (about 14 KB): the old process needs the client's
    // acknowledgements to finish. (1.9 MiB kept python busy for longer than aioquic's 10 s per
    // request on a loaded CI machine.)
    let (pieces, size) = (40usize, 16_384usize);
    let download =
        qweb_testkit::h3::aioquic_get(addr, &ca, &format!("/slow/textstream/{pieces}/{size}/100"));
    qweb_testkit::poll_until_async(
        "the download reaches the upstream",
        Duration::from_secs(10),
        Duration::from_millis(20),
        || async { (up.connections.load(Relaxed) > 0).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    old.signal(libc::SIGUSR2);
    old.wait_for("upgrade: process", 1);
    let new_pid = read_pid(&pid_file).expect("the new process's pid file");
    assert_ne!(new_pid, old.pid() as i32);

    // a new connection: the new process (the old one no longer reads the sockets)
    let fresh = qweb_testkit::h3::aioquic_get(addr, &ca, "/index.html")
        .await
        .unwrap()
        .expect("a new QUIC connection after the upgrade");
    let fresh = fresh[0].as_ref().expect("GET /index.html");
    assert_eq!((fresh.status, fresh.body.as_slice()), (200, &b"home"[..]));
    // another upgrade while the old process still drains its HTTP/3 connection: refused
    // (the next process would take the old one's mark), and the new process serves on
    qweb_testkit::process::signal(new_pid as u32, libc::SIGUSR2);
    let refused = old.wait_for("upgrade failed", 1);
    assert!(refused.contains("still drains"), "{refused}");

    let got = download
        .await
        .unwrap()
        .expect("the QUIC connection of the download");
    let got = got[0].as_ref().expect("the download");
    assert_eq!(got.status, 200);
    assert_eq!(got.body.len(), pieces * size, "the download was cut short");

    // the old process drained and exited; its datagrams came through the new one
    let status = old.wait_exit(Duration::from_secs(40));
    assert!(status.success(), "{status:?}");
    let through = old.wait_for("came through the new process", 1);
    let n: u64 = through
        .split("HTTP/3: ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(n > 0, "{through}");
    assert!(pid_alive(new_pid));
    // SAFETY: kill(2) with the pid the new process wrote, a valid signal number.
    unsafe { libc::kill(new_pid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(30);
    while pid_alive(new_pid) {
        assert!(Instant::now() < deadline, "the new process did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A lying or broken hand-over environment (fds that are stdio or closed, wrong addresses,
/// garbage) is ignored: the process binds as usual, keeps its stdio, and serves.
#[test]
fn bogus_inherited_fds_are_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (port, file) = home_site(d);
    std::fs::write(
        &file,
        format!(
            "workers = 1\nstate_dir = \"{0}/state\"\n[[listener]]\naddress = \"127.0.0.1:{port}\"\n\
             [[route]]\nprefix = \"/\"\nroot = \"{0}/site\"\n",
            d.display()
        ),
    )
    .unwrap();
    let mut cmd = serve_command(BIN, &file);
    cmd.env(
        "QWEB_UPGRADE_FDS",
        format!("127.0.0.1:{port}=0,1,2,999;nonsense;1.2.3.4:5=x,7"),
    )
    .env("QWEB_UPGRADE_READY_FD", "998")
    .env(
        "QWEB_UPGRADE_QUIC_FDS",
        format!("127.0.0.1:{port}=0:1:2,1:999:998,x:y:z;nonsense;1.2.3.4:5=0:7:8"),
    )
    .env("QWEB_UPGRADE_QUIC_MARK", "banana");
    let mut child = Qweb::spawn(cmd, BANNER_END);
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    std::io::Write::write_all(
        &mut s,
        b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let mut out = String::new();
    std::io::Read::read_to_string(&mut s, &mut out).unwrap();
    assert!(
        out.starts_with("HTTP/1.1 200") && out.ends_with("home"),
        "{out}"
    );
    // stderr (fd 2) is still ours: the stop is logged there
    child.signal(libc::SIGTERM);
    let rest = child.wait_closed(Duration::from_secs(30))[child.banner.len()..].join("\n");
    assert!(child.wait_exit(Duration::from_secs(30)).success());
    assert!(
        rest.contains("stopped") || rest.contains("shutting down"),
        "{rest}"
    );
}

/// The new binary is gone (or cannot start): the upgrade fails, the old process says so and
/// serves on.
#[test]
fn a_failed_upgrade_keeps_the_old_process_serving() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (port, file) = home_site(d);
    std::fs::write(
        &file,
        format!(
            "workers = 1\nstate_dir = \"{0}/state\"\n[[listener]]\naddress = \"127.0.0.1:{port}\"\n\
             [[route]]\nprefix = \"/\"\nroot = \"{0}/site\"\n",
            d.display()
        ),
    )
    .unwrap();
    // started through a link that is removed before the upgrade: argv[0] names nothing
    let link = d.join("qweb-link");
    std::os::unix::fs::symlink(BIN, &link).unwrap();
    let mut child = Qweb::spawn(serve_command(&link, &file), BANNER_END);
    std::fs::remove_file(&link).unwrap();
    child.signal(libc::SIGUSR2);
    child.wait_for("upgrade failed, this process serves on", 1);
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    std::io::Write::write_all(
        &mut s,
        b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let mut out = String::new();
    std::io::Read::read_to_string(&mut s, &mut out).unwrap();
    assert!(out.ends_with("home"), "{out}");
    assert!(
        child.child().try_wait().unwrap().is_none(),
        "the old process exited"
    );
}
