//! The access log through the real binary: `[log] access_file` in JSON and combined formats,
//! reopened on SIGUSR1 after a logrotate-style move, format switched by a reload; and a plain
//! HTTP request on a TLS port answered with nginx's 400 page.

#![allow(unsafe_code)] // libc calls on test processes and files; each block has its SAFETY note

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_qweb");

struct Qweb {
    child: Child,
    addrs: Vec<String>,
    lines: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Qweb {
    fn start(config: &Path) -> Qweb {
        let mut child = Command::new(BIN)
            .args(["serve", "--config"])
            .arg(config)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut reader = BufReader::new(child.stderr.take().unwrap());
        let mut started = Vec::new();
        loop {
            let mut l = String::new();
            assert!(reader.read_line(&mut l).unwrap() > 0, "exited: {started:?}");
            let done = l.contains("worker(s)");
            started.push(l.trim_end().to_owned());
            if done {
                break;
            }
        }
        let addrs = started
            .iter()
            .filter_map(|l| l.split("://").nth(1))
            .filter_map(|a| a.split('/').next())
            .map(str::to_owned)
            .collect();
        let lines = Arc::new(std::sync::Mutex::new(started));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for l in reader.lines().map_while(Result::ok) {
                sink.lock().unwrap().push(l);
            }
        });
        Qweb {
            child,
            addrs,
            lines,
        }
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) with the pid of our own child and a valid signal number.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
        assert_eq!(rc, 0);
    }

    fn wait_stderr(&self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self
            .lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains(needle))
        {
            assert!(Instant::now() < deadline, "no {needle:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Qweb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until `path` has `n` lines; returns them.
fn lines_of(path: &Path, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_owned).collect();
        if lines.len() >= n {
            return lines;
        }
        assert!(
            Instant::now() < deadline,
            "{} has {lines:?}, wanted {n} lines",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn client(ca: &Path) -> reqwest::Client {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for c in qweb_tls::load_certs(ca).unwrap() {
        roots.add(c).unwrap();
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(qweb_tls::provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    reqwest::Client::builder()
        .use_preconfigured_tls(cfg)
        .http2_prior_knowledge()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A TLS listener on `port` (fixed, so that a reload keeps it).
fn config(d: &Path, port: u16, format: &str) -> String {
    let d = d.display();
    format!(
        "workers = 1\nstate_dir = \"{d}/state\"\n[log]\naccess_file = \"logs/access.log\"\n\
         format = \"{format}\"\n[[listener]]\naddress = \"127.0.0.1:{port}\"\nhttp2 = true\n\
         [listener.tls]\nself_signed = true\n\
         [[route]]\nprefix = \"/\"\nroot = \"{d}/site\"\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_file_json_reopen_on_sigusr1_and_combined_after_reload() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("site")).unwrap();
    std::fs::create_dir_all(d.join("logs")).unwrap();
    std::fs::write(d.join("site/hello.txt"), "hello").unwrap();
    let file = d.join("qweb.toml");
    let port = free_port();
    std::fs::write(&file, config(d, port, "json")).unwrap();
    let qweb = Qweb::start(&file);
    let c = client(&d.join("state/selfsigned.crt"));
    let url = format!(
        "https://localhost:{}",
        qweb.addrs[0].rsplit(':').next().unwrap()
    );
    let get = |path: &str, ua: &str| {
        c.get(format!("{url}{path}"))
            .header("user-agent", ua)
            .header("referer", "https://ref.example/\"x")
            .send()
    };
    let r = get("/hello.txt", "ua-one \"q\"").await.unwrap();
    assert_eq!(r.status(), 200);
    let log = d.join("logs/access.log");
    let first = lines_of(&log, 1);
    let v: serde_json::Value = serde_json::from_str(&first[0]).unwrap();
    assert_eq!(v["target"], "/hello.txt");
    assert_eq!(v["status"], 200);
    assert_eq!(v["bytes"], 5);
    assert_eq!(v["protocol"], "HTTP/2");
    assert_eq!(v["tls"], "TLSv1.3");
    assert_eq!(v["user_agent"], "ua-one \"q\"");
    assert_eq!(v["referer"], "https://ref.example/\"x");
    assert!(v["host"].as_str().unwrap().starts_with("localhost:"), "{v}");
    assert!(v["request_time"].as_f64().unwrap() >= 0.0);

    // logrotate: move the file away, SIGUSR1, the next line goes to a new file
    std::fs::rename(&log, d.join("logs/access.log.1")).unwrap();
    qweb.signal(libc::SIGUSR1);
    qweb.wait_stderr("access log reopened");
    assert_eq!(get("/missing", "ua-two").await.unwrap().status(), 404);
    let second = lines_of(&log, 1);
    assert!(second[0].contains("\"status\":404"), "{second:?}");
    assert_eq!(lines_of(&d.join("logs/access.log.1"), 1).len(), 1);

    // a reload switches the format for new requests
    std::fs::write(&file, config(d, port, "combined")).unwrap();
    qweb.signal(libc::SIGHUP);
    qweb.wait_stderr("configuration reloaded");
    let c2 = client(&d.join("state/selfsigned.crt"));
    let r = c2
        .get(format!("{url}/hello.txt"))
        .header("user-agent", "ua-three")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let lines = lines_of(&log, 2);
    // 127.0.0.1 - - [30/Nov/2026:07:00:00 +0000] "GET /hello.txt HTTP/2" 200 5 "-" "ua-three" 0.001 TLSv1.3
    let l = &lines[1];
    assert!(l.starts_with("127.0.0.1 - - ["), "{l}");
    assert!(
        l.contains("] \"GET /hello.txt HTTP/2\" 200 5 \"-\" \"ua-three\" "),
        "{l}"
    );
    assert!(l.ends_with(" TLSv1.3"), "{l}");
}

#[test]
fn plain_http_on_a_tls_port_gets_the_400_page() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("site")).unwrap();
    std::fs::create_dir_all(d.join("logs")).unwrap();
    let file = d.join("qweb.toml");
    std::fs::write(&file, config(d, free_port(), "qweb")).unwrap();
    let qweb = Qweb::start(&file);
    let mut s = std::net::TcpStream::connect(&qweb.addrs[0]).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nUser-Agent: curl\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{out}");
    assert!(
        out.contains("The plain HTTP request was sent to HTTPS port"),
        "{out}"
    );
    // TLS still works on the port (an empty site without index: 403)
    let rt = tokio::runtime::Runtime::new().unwrap();
    let port = qweb.addrs[0].rsplit(':').next().unwrap().to_owned();
    let ca = d.join("state/selfsigned.crt");
    let r = rt
        .block_on(async {
            client(&ca)
                .get(format!("https://localhost:{port}/"))
                .send()
                .await
        })
        .unwrap();
    assert_eq!(r.status(), 403);
}
