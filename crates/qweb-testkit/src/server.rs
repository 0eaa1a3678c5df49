//! qweb in this process: [`start_with`] a generated config (an HTTPS listener with a
//! self-signed certificate, a plain one, a document root) for qweb-server's tests, or
//! [`start_text`] a config of the test's own.
//!
//! ```no_run
//! use qweb_testkit::server::{start_text, start_with};
//! let t = start_with("[compression]\n", |dir| {
//!     std::fs::write(dir.join("site/a.txt"), "hello").unwrap();
//! });
//! let url = format!("{}/a.txt", t.https()); // and t.http(), t.cert(), t.admin
//! let dir = tempfile::tempdir().unwrap();
//! let (server, addr) = start_text(dir.path(), "a", "workers = 1\n[[listener]]\naddress = \"127.0.0.1:0\"\n");
//! server.shutdown();
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use qweb_server::{Config, RunningServer, Server};

/// A running qweb with its temporary folder.
pub struct TestServer {
    pub server: Option<RunningServer>,
    /// Listener addresses in config order.
    pub addrs: Vec<SocketAddr>,
    /// The admin listener, when the config has `[admin]`.
    pub admin: Option<SocketAddr>,
    pub dir: tempfile::TempDir,
}

impl TestServer {
    /// The first TLS listener's base URL (`https://127.0.0.1:PORT`).
    pub fn https(&self) -> String {
        format!("https://{}", self.addrs[0])
    }
    /// The second (plain) listener's base URL.
    pub fn http(&self) -> String {
        format!("http://{}", self.addrs[1])
    }
    /// Document root created for the test (`<dir>/site`).
    pub fn site(&self) -> PathBuf {
        self.dir.path().join("site")
    }
    /// The self-signed certificate's path.
    pub fn cert(&self) -> PathBuf {
        self.dir.path().join("state/selfsigned.crt")
    }
    /// A TLS connection to the first (TLS) listener, trusting [`TestServer::cert`], ALPN for
    /// `proto`, SNI `localhost`.
    pub async fn tls(&self, proto: crate::Proto) -> crate::tls::TlsStream {
        let cfg = std::sync::Arc::new(crate::tls_client_config(&self.cert(), proto));
        crate::tls::connect(self.addrs[0], &cfg)
            .await
            .unwrap_or_else(|e| panic!("TLS connect to {}: {e}", self.addrs[0]))
    }
    /// A strict scrape of the admin listener's `/metrics` ([`crate::metrics::scrape`]); panics
    /// when the config has no `[admin]`.
    pub async fn metrics(&self) -> crate::metrics::Metrics {
        crate::metrics::scrape(self.admin.expect("an [admin] listener")).await
    }
    /// Shuts down and waits. Call it from `spawn_blocking` when clients on the test's
    /// runtime still hold connections (an HTTP/2 GOAWAY needs the client to answer).
    pub fn shutdown(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        // Not joined here: the test's runtime (and its clients) must be free to wind down.
        if let Some(s) = self.server.take() {
            std::thread::spawn(move || s.shutdown());
        }
    }
}

/// Starts qweb with the default test listeners (HTTPS with the self-signed cert, then plain
/// HTTP, both on 127.0.0.1:0), one worker unless `extra` says otherwise, `<dir>/site` as the
/// document root of `/` (create files with [`TestServer::site`] after start or in `prepare`),
/// and `extra` appended to the config (`{dir}` is replaced by the temp folder).
pub fn start_with(extra: &str, prepare: impl FnOnce(&Path)) -> TestServer {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("site")).expect("site");
    prepare(dir.path());
    let d = dir.path().display().to_string();
    let mut text = String::new();
    if !extra.contains("workers") {
        text.push_str("workers = 1\n");
    }
    text.push_str(&format!("state_dir = \"{d}/state\"\n"));
    text.push_str(&extra.replace("{dir}", &d));
    if !extra.contains("[[listener]]") {
        text.push_str(
            "\n[[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\nself_signed = true\n\
             [[listener]]\naddress = \"127.0.0.1:0\"\n",
        );
    }
    if !extra.contains("prefix = \"/\"") && !extra.contains("[[route]]\nprefix = \"/\"") {
        text.push_str(&format!(
            "\n[[route]]\nprefix = \"/\"\nroot = \"{d}/site\"\n"
        ));
    }
    let file = dir.path().join("qweb.toml");
    std::fs::write(&file, &text).expect("write config");
    let config = Config::from_file(&file).unwrap_or_else(|e| panic!("config: {e}\n{text}"));
    let server = Server::start(config).unwrap_or_else(|e| panic!("start: {e}"));
    let addrs = server.local_addrs().to_vec();
    let admin = server.admin_addr();
    TestServer {
        server: Some(server),
        addrs,
        admin,
        dir,
    }
}

/// Starts qweb with the default test setup.
pub fn start() -> TestServer {
    start_with("", |_| {})
}

/// Sends raw bytes on a plain TCP connection and returns everything the server sent until it
/// closed the connection (or `timeout` passed).
pub async fn raw_exchange(
    addr: SocketAddr,
    request: &[u8],
    timeout: std::time::Duration,
) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(request).await.expect("write");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(timeout, s.read_to_end(&mut out)).await;
    out
}

/// Starts qweb from the config file `path`; panics with the file's text when it does not
/// load or start.
pub fn start_file(path: &Path) -> RunningServer {
    let config = Config::from_file(path).unwrap_or_else(|e| {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        panic!("config: {e}\n{text}")
    });
    Server::start(config).unwrap_or_else(|e| panic!("start: {e}"))
}

/// Writes `text` to `<dir>/<name>.toml` and starts qweb from it; returns the server and its
/// first listener's address.
pub fn start_text(dir: &Path, name: &str, text: &str) -> (RunningServer, SocketAddr) {
    let file = crate::process::write_file(dir, &format!("{name}.toml"), text);
    let server = start_file(&file);
    let addr = server.local_addrs()[0];
    (server, addr)
}
