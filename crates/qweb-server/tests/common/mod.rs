//! Test harness: a real qweb server on ephemeral ports, real HTTP clients over real TLS, and a
//! real upstream HTTP server.
#![allow(dead_code)]

pub mod recorder;
pub mod upstream;
pub mod ws;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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

/// HTTP protocol a client speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    H1,
    H2,
}

pub const BOTH: [Proto; 2] = [Proto::H1, Proto::H2];

/// A rustls client config that trusts exactly the certificate in `ca_pem`, with ALPN for
/// `proto`.
pub fn tls_client_config(ca_pem: &Path, proto: Proto) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for c in qweb_tls::load_certs(ca_pem).expect("ca") {
        roots.add(c).expect("add root");
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(qweb_tls::provider()))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = match proto {
        Proto::H1 => vec![b"http/1.1".to_vec()],
        Proto::H2 => vec![b"h2".to_vec()],
    };
    cfg
}

/// A reqwest client (hyper underneath) for `proto` that verifies qweb's certificate against
/// `ca_pem`. Redirects are not followed.
pub fn client(ca_pem: &Path, proto: Proto) -> reqwest::Client {
    install_provider();
    let b = reqwest::Client::builder()
        .use_preconfigured_tls(tls_client_config(ca_pem, proto))
        .redirect(reqwest::redirect::Policy::none())
        .timeout(std::time::Duration::from_secs(20));
    let b = match proto {
        Proto::H1 => b.http1_only(),
        Proto::H2 => b.http2_prior_knowledge(),
    };
    b.build().expect("client")
}

/// reqwest asks for a process-wide default rustls provider, even for plain HTTP.
pub fn install_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// A plain-HTTP/1.1 client.
pub fn plain_client() -> reqwest::Client {
    install_provider();
    reqwest::Client::builder()
        .http1_only()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(std::time::Duration::from_secs(20))
        .build()
        .expect("client")
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
