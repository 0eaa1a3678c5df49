//! Client certificates (`[listener.tls] client_auth`) with real clients against a real qweb
//! on 127.0.0.1:0 proxying to a recording upstream: reqwest over HTTP/1.1 and HTTP/2 (rustls
//! with a client certificate), curl (`--cert/--key`), `openssl s_client` (the alerts, session
//! resumption) and python's aioquic over HTTP/3. The certificates are made here with rcgen
//! (`qweb_testkit::tls::client_pki`): the CA, alice (`CN=alice,O=ops`), a client of another
//! CA, an expired one and one whose key usage is serverAuth only.
//!
//! Hostile: no certificate where one is required, another CA's, an expired one, one for
//! servers only, a forged `X-Client-Subject` from the client, a session resumed on a server
//! whose policy differs.

use qweb_testkit as common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use common::openssl::{SClient, TlsVersion as Tls};
use common::tls::{client_pki, ClientPki, ClientTls, Proto, BOTH};
use qweb_server::RunningServer;

/// The subject qweb forwards for alice.
const ALICE: &str = "CN=alice,O=ops";

struct Setup {
    dir: tempfile::TempDir,
    pki: ClientPki,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        common::tls::write_self_signed(dir.path(), "site", &["localhost"]);
        let pki = client_pki(dir.path());
        Setup { dir, pki }
    }

    fn site_cert(&self) -> std::path::PathBuf {
        self.dir.path().join("site.crt")
    }

    /// Starts qweb: one TLS listener (HTTP/3 on too) with `client_auth = { ca, required }`
    /// and `tls` more `[listener.tls]` keys, proxying `/` to `up` with the two placeholders
    /// in `request_headers`.
    fn serve(
        &self,
        name: &str,
        ca: &Path,
        required: bool,
        tls: &str,
        up: SocketAddr,
    ) -> (RunningServer, SocketAddr) {
        self.serve_at("127.0.0.1:0", name, ca, required, tls, up)
    }

    /// [`Setup::serve`] on `address`.
    fn serve_at(
        &self,
        address: &str,
        name: &str,
        ca: &Path,
        required: bool,
        tls: &str,
        up: SocketAddr,
    ) -> (RunningServer, SocketAddr) {
        let policy = format!("ca = \"{}\", required = {required}", ca.display());
        self.serve_policy(address, name, &policy, tls, up)
    }

    /// [`Setup::serve_at`] with `client_auth = { <policy> }`.
    fn serve_policy(
        &self,
        address: &str,
        name: &str,
        policy: &str,
        tls: &str,
        up: SocketAddr,
    ) -> (RunningServer, SocketAddr) {
        let d = self.dir.path().display();
        let text = format!(
            "workers = 1\nstate_dir = \"{d}/state-{name}\"\n[log]\naccess = false\n\
             [[listener]]\naddress = \"{address}\"\nhttp3 = true\n[listener.tls]\n\
             certificates = [{{ cert = \"{d}/site.crt\", key = \"{d}/site.key\" }}]\n\
             client_auth = {{ {policy} }}\n{tls}\n\
             [[route]]\nprefix = \"/\"\nupstreams = [\"{up}\"]\n\
             request_headers = {{ set = {{ \"X-Client-Subject\" = \"{{tls_client_subject}}\", \
             \"X-Client-Fingerprint\" = \"{{tls_client_fingerprint}}\" }} }}\n",
        );
        common::start_text(self.dir.path(), name, &text)
    }

    /// reqwest over `proto`, trusting the site, presenting `client` (a [`ClientPki`] stem).
    fn reqwest(&self, proto: Proto, client: Option<&str>) -> reqwest::Client {
        let mut tls = ClientTls::trusting(&self.site_cert()).proto(proto);
        if let Some(stem) = client {
            let (c, k) = self.pki.client(stem);
            tls = tls.client_cert(&c, &k);
        }
        common::tls::proto_builder(tls.build(), proto)
            .build()
            .unwrap()
    }
}

/// One aioquic connection to `addr` (trusting the site) presenting `client` (a [`ClientPki`]
/// stem), sending `req`.
fn h3(
    s: &Setup,
    addr: SocketAddr,
    client: Option<&str>,
    req: &common::h3::H3Request,
) -> common::h3::AioquicResult {
    let id = client.map(|stem| s.pki.client(stem));
    let id = id.as_ref().map(|(c, k)| (c.as_path(), k.as_path()));
    let site = s.site_cert();
    tokio::task::block_in_place(|| {
        common::h3::aioquic_as(addr, &site, id, std::slice::from_ref(req), false)
    })
}

/// The connection of `out` failed or answered nothing.
fn h3_refused(out: &common::h3::AioquicResult) -> bool {
    match out {
        Err(_) => true,
        Ok(list) => list.iter().all(|r| r.is_err()),
    }
}

/// SHA-256 of `cert`'s DER as openssl computes it, lower-case hex without colons.
fn openssl_fingerprint(cert: &Path) -> String {
    let out = Command::new("openssl")
        .args(["x509", "-noout", "-fingerprint", "-sha256", "-in"])
        .arg(cert)
        .output()
        .expect("openssl runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let hex = text.trim().rsplit('=').next().unwrap_or("");
    hex.replace(':', "").to_ascii_lowercase()
}

/// One `s_client` run presenting `client` (a [`ClientPki`] stem); what it printed, lower
/// case (the alert openssl reports is in it).
fn s_client(s: &Setup, addr: SocketAddr, v: Tls, client: Option<&str>) -> String {
    let mut c = SClient::new(addr, v);
    if let Some(stem) = client {
        c = presenting(s, c, stem);
    }
    let run = c.run();
    format!("{}\n{}", run.stdout, run.stderr).to_ascii_lowercase()
}

/// `c` with `-cert` and `-key` of client `stem` (a [`ClientPki`] stem).
fn presenting(s: &Setup, c: SClient, stem: &str) -> SClient {
    let (cert, key) = s.pki.client(stem);
    c.arg("-cert")
        .arg(cert.to_str().unwrap())
        .arg("-key")
        .arg(key.to_str().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h1_and_h2_forward_the_verified_subject_and_fingerprint_and_not_the_clients_own() {
    let s = Setup::new();
    let up = common::recorder::start().await;
    let (_server, addr) = s.serve("ok", &s.pki.ca, true, "", up.addr);
    let fingerprint = openssl_fingerprint(&s.pki.client("alice").0);
    assert_eq!(fingerprint.len(), 64);
    for proto in BOTH {
        let c = s.reqwest(proto, Some("alice"));
        let r = c
            .get(format!("https://localhost:{}/who", addr.port()))
            .header("x-client-subject", "CN=admin,O=root")
            .header("x-client-fingerprint", "00")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{proto:?}");
        let version = match proto {
            Proto::H1 => reqwest::Version::HTTP_11,
            Proto::H2 => reqwest::Version::HTTP_2,
        };
        assert_eq!(r.version(), version);
        assert_eq!(r.text().await.unwrap(), "up:/who");
        let got = up.take();
        assert_eq!(got.len(), 1, "{proto:?}");
        assert_eq!(got[0].header_all("x-client-subject"), [ALICE], "{proto:?}");
        assert_eq!(
            got[0].header_all("x-client-fingerprint"),
            [fingerprint.as_str()],
            "{proto:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_certificate_where_one_is_required_the_handshake_fails() {
    let s = Setup::new();
    let up = common::recorder::start().await;
    let (_server, addr) = s.serve("required", &s.pki.ca, true, "", up.addr);
    for proto in BOTH {
        let r = s
            .reqwest(proto, None)
            .get(format!("https://localhost:{}/x", addr.port()))
            .send()
            .await;
        assert!(r.is_err(), "{proto:?}: {r:?}");
    }
    for v in [Tls::V13, Tls::V12] {
        let out = tokio::task::block_in_place(|| s_client(&s, addr, v, None));
        assert!(out.contains("alert certificate required"), "{v:?}: {out}");
        assert!(!out.contains("up:/"), "{v:?}: {out}");
    }
    assert!(up.take().is_empty(), "nothing reached the upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_cas_expired_and_server_only_certificates_fail_with_their_alerts() {
    let s = Setup::new();
    let up = common::recorder::start().await;
    // required = false checks an offered certificate all the same
    for required in [true, false] {
        let (server, addr) = s.serve(&format!("bad-{required}"), &s.pki.ca, required, "", up.addr);
        for (stem, alert) in [
            ("stranger", "alert unknown ca"),
            ("expired", "alert certificate expired"),
            ("server_only", "alert unsupported certificate"),
        ] {
            for v in [Tls::V13, Tls::V12] {
                let out = tokio::task::block_in_place(|| s_client(&s, addr, v, Some(stem)));
                assert!(
                    out.contains(alert),
                    "{stem} {v:?} required={required}: {out}"
                );
                assert!(!out.contains("up:/"), "{stem}: {out}");
            }
            let r = s
                .reqwest(Proto::H2, Some(stem))
                .get(format!("https://localhost:{}/x", addr.port()))
                .send()
                .await;
            assert!(r.is_err(), "{stem}: {r:?}");
        }
        tokio::task::block_in_place(|| server.shutdown());
    }
    assert!(up.take().is_empty(), "nothing reached the upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optional_lets_an_anonymous_client_through_without_the_header() {
    let s = Setup::new();
    let up = common::recorder::start().await;
    let (_server, addr) = s.serve("optional", &s.pki.ca, false, "", up.addr);
    for proto in BOTH {
        let r = s
            .reqwest(proto, None)
            .get(format!("https://localhost:{}/anon", addr.port()))
            .header("x-client-subject", "CN=alice,O=ops")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{proto:?}");
        let got = up.take();
        assert_eq!(got.len(), 1);
        // absent, not empty: the client's own is removed
        assert_eq!(got[0].header("x-client-subject"), None, "{proto:?}");
        assert_eq!(got[0].header("x-client-fingerprint"), None, "{proto:?}");
        // and alice, on the same listener, is named
        let r = s
            .reqwest(proto, Some("alice"))
            .get(format!("https://localhost:{}/alice", addr.port()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(up.take()[0].header_all("x-client-subject"), [ALICE]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_with_cert_and_key_is_named_and_without_is_refused() {
    let s = Setup::new();
    let up = common::recorder::start().await;
    let (_server, addr) = s.serve("curl", &s.pki.ca, true, "", up.addr);
    let (cert, key) = s.pki.client("alice");
    let url = format!("https://localhost:{}/c", addr.port());
    let site = s.site_cert();
    let run = |with: bool| {
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "--max-time", "20", "--cacert"]).arg(&site);
        if with {
            cmd.arg("--cert").arg(&cert).arg("--key").arg(&key);
        }
        cmd.args(["-H", "X-Client-Subject: CN=admin", &url])
            .output()
            .expect("curl runs")
    };
    let out = tokio::task::block_in_place(|| run(true));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "up:/c");
    assert_eq!(up.take()[0].header_all("x-client-subject"), [ALICE]);
    let out = tokio::task::block_in_place(|| run(false));
    assert!(!out.status.success());
    assert!(up.take().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http3_forwards_the_subject_and_refuses_a_client_without_a_certificate() {
    if !common::h3::aioquic_available() {
        eprintln!("SKIPPED: python3 with aioquic is needed (pip install aioquic)");
        return;
    }
    let s = Setup::new();
    let up = common::recorder::start().await;
    let (_server, addr) = s.serve("h3", &s.pki.ca, true, "", up.addr);
    let (cert, _) = s.pki.client("alice");
    let req = common::h3::H3Request::get("/h3").header("x-client-subject", "CN=admin");
    let out = h3(&s, addr, Some("alice"), &req).expect("aioquic connects");
    let r = out[0].as_ref().expect("answered");
    assert_eq!(r.status, 200);
    let got = up.take();
    assert_eq!(got[0].header_all("x-client-subject"), [ALICE]);
    assert_eq!(
        got[0].header_all("x-client-fingerprint"),
        [openssl_fingerprint(&cert)]
    );
    let anon = h3(&s, addr, None, &req);
    assert!(h3_refused(&anon), "{anon:?}");
    assert!(up.take().is_empty());
}

fn key_file(path: &Path) {
    let k: Vec<u8> = (0..80u8).collect();
    std::fs::write(path, k).unwrap();
}

/// `s_client` with alice's certificate saving the session, then offering it without a
/// certificate; `(resumed, printed)` of the second.
fn resume(s: &Setup, first: SocketAddr, second: SocketAddr, v: Tls, sess: &Path) -> (bool, String) {
    resume_as(s, "alice", first, second, v, sess)
}

/// [`resume`] presenting `stem`'s certificate.
fn resume_as(
    s: &Setup,
    stem: &str,
    first: SocketAddr,
    second: SocketAddr,
    v: Tls,
    sess: &Path,
) -> (bool, String) {
    let r = presenting(s, SClient::new(first, v), stem)
        .sess_out(sess)
        .run();
    r.answered("up:/");
    assert!(!r.resumed());
    let r = SClient::new(second, v).sess_in(sess).run();
    (r.resumed(), r.stdout.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_session_keeps_its_identity_and_resumes_only_under_the_same_policy() {
    let s = Setup::new();
    let up = common::recorder::start().await;
    let keys = s.dir.path().join("keys.bin");
    key_file(&keys);
    let tk = format!("ticket_keys = \"{}\"", keys.display());
    // A and B: the same policy and keys; C: the same keys, a policy trusting another CA
    let (_a, a) = s.serve("a", &s.pki.ca, false, &tk, up.addr);
    let (_b, b) = s.serve("b", &s.pki.ca, false, &tk, up.addr);
    let other = s.dir.path().join("other-ca.crt");
    let (_c, c) = s.serve("c", &other, false, &tk, up.addr);
    for v in [Tls::V13, Tls::V12] {
        let sess = s.dir.path().join(format!("{v:?}.sess"));
        let (resumed, out) = tokio::task::block_in_place(|| resume(&s, a, a, v, &sess));
        assert!(resumed, "{v:?}: resumes on A\n{out}");
        assert!(out.contains("up:/"), "{out}");
        let got = up.take();
        assert_eq!(got.len(), 2, "{v:?}");
        assert_eq!(
            got[1].header_all("x-client-subject"),
            [ALICE],
            "{v:?}: kept"
        );
        let (resumed, _) = tokio::task::block_in_place(|| resume(&s, a, b, v, &sess));
        assert!(resumed, "{v:?}: the same policy and keys resume on B");
        assert_eq!(up.take()[1].header_all("x-client-subject"), [ALICE]);
        // C does not trust alice's CA: her session must not bring her name there
        let (resumed, out) = tokio::task::block_in_place(|| resume(&s, a, c, v, &sess));
        assert!(!resumed, "{v:?}: A's session must not resume on C\n{out}");
        let got = up.take();
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].header("x-client-subject"), None, "{v:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_changes_the_ca_resumes_no_session_of_the_old_policy() {
    let s = Setup::new();
    let up = common::recorder::start().await;
    // a fixed port: a listener on port 0 is bound anew by a reload and keeps no sessions
    // (below the kernel's range for client sockets, which could take a port from `:0`)
    let port = common::free_port();
    let at = format!("127.0.0.1:{port}");
    let (mut server, addr) = s.serve_at(&at, "reload", &s.pki.ca, false, "", up.addr);
    let other = s.dir.path().join("other-ca.crt");
    // the same listener, trusting another CA now
    let ca = s.pki.ca.display().to_string();
    let edit = (ca.as_str(), other.to_str().unwrap());
    let subjects = resume_across_a_reload(&s, &mut server, addr, "reload", "alice", edit, &up);
    for (v, subject) in subjects {
        assert_eq!(subject, None, "{v:?}: a session of the old CA resumed");
    }
    tokio::task::block_in_place(|| server.shutdown());
}

/// TLS 1.3 with a ticket (the listener's local keys survive a reload) and TLS 1.2 without
/// tickets, with a session id (the session cache survives it).
const RELOAD_RUNS: [(Tls, Option<&str>); 2] = [(Tls::V13, None), (Tls::V12, Some("-no_ticket"))];

/// `s_client` on `at` over `v` with `extra`, offering the session in `sess` (or saving one
/// there presenting `save_as`'s certificate); whether it resumed. Either way `/` answers.
fn session_run(
    s: &Setup,
    at: SocketAddr,
    (v, extra): (Tls, Option<&str>),
    sess: &Path,
    save_as: Option<&str>,
) -> bool {
    let mut c = SClient::new(at, v);
    if let Some(a) = extra {
        c = c.arg(a);
    }
    let c = match save_as {
        Some(stem) => presenting(s, c, stem).sess_out(sess),
        None => c.sess_in(sess),
    };
    let r = c.run();
    r.answered("up:/");
    r.resumed()
}

/// For each of [`RELOAD_RUNS`]: a session of `stem` on `server` (the config `name`, at a
/// fixed port `addr`) that resumes; then the config with `edit.0` replaced by `edit.1`,
/// reloaded; then the session offered again. For each run: `None` where it did not resume,
/// else the subject the upstream got.
fn resume_across_a_reload(
    s: &Setup,
    server: &mut RunningServer,
    addr: SocketAddr,
    name: &str,
    stem: &str,
    edit: (&str, &str),
    up: &common::recorder::Recorder,
) -> Vec<(Tls, Option<String>)> {
    let sess = |v: Tls| s.dir.path().join(format!("{name}-{v:?}.sess"));
    for run in RELOAD_RUNS {
        let path = sess(run.0);
        let first = tokio::task::block_in_place(|| session_run(s, addr, run, &path, Some(stem)));
        assert!(!first, "{:?}: a fresh session", run.0);
        let again = tokio::task::block_in_place(|| session_run(s, addr, run, &path, None));
        assert!(again, "{:?}: resumes before the reload", run.0);
    }
    up.take();
    let file = s.dir.path().join(format!("{name}.toml"));
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains(edit.0), "{text}");
    std::fs::write(&file, text.replace(edit.0, edit.1)).unwrap();
    tokio::task::block_in_place(|| server.reload_from(None)).unwrap();
    let addr = server.local_addrs()[0];
    RELOAD_RUNS
        .iter()
        .map(|&run| {
            let path = sess(run.0);
            let resumed = tokio::task::block_in_place(|| session_run(s, addr, run, &path, None));
            let got = up.take();
            let subject = got[0].header("x-client-subject");
            if resumed {
                // a resumed session brings its identity, or the upstream would say so
                (run.0, Some(subject.unwrap_or_default()))
            } else {
                assert_eq!(
                    subject, None,
                    "{:?}: a full handshake without a cert",
                    run.0
                );
                (run.0, None)
            }
        })
        .collect()
}

/// One listener, two sites with their own certificates: `secure.test` with `client_auth`
/// (required), `public.test` without; both proxy to `up` with the subject placeholder.
fn two_sites(s: &Setup, up: SocketAddr) -> (RunningServer, SocketAddr) {
    two_sites_with(s, up, "", "")
}

/// [`two_sites`] with `top` keys before the listeners and `listener` keys after the first
/// listener's `[listener.tls]`.
fn two_sites_with(
    s: &Setup,
    up: SocketAddr,
    top: &str,
    listener: &str,
) -> (RunningServer, SocketAddr) {
    let secure = format!("ca = \"{}\", required = true", s.pki.ca.display());
    sites_with(s, up, top, listener, [Some(&secure), None])
}

/// [`two_sites_with`] with `client_auth = { <auth> }` of `secure.test` and `public.test`
/// (`None`: no `client_auth`).
fn sites_with(
    s: &Setup,
    up: SocketAddr,
    top: &str,
    listener: &str,
    auth: [Option<&str>; 2],
) -> (RunningServer, SocketAddr) {
    let d = s.dir.path();
    common::tls::write_self_signed(d, "secure", &["secure.test"]);
    common::tls::write_self_signed(d, "public", &["public.test"]);
    let d = d.display();
    let site = |name: &str, auth: Option<&str>| {
        let auth = auth.map_or(String::new(), |a| format!("client_auth = {{ {a} }}\n"));
        format!(
            "[[site]]\nserver_names = [\"{name}.test\"]\n\
             certificates = [{{ cert = \"{d}/{name}.crt\", key = \"{d}/{name}.key\" }}]\n{auth}\
             request_headers = {{ set = {{ \"X-Client-Subject\" = \"{{tls_client_subject}}\" }} }}\n\
             [[site.route]]\nprefix = \"/\"\nupstreams = [\"{up}\"]\n"
        )
    };
    let text = format!(
        "workers = 1\nstate_dir = \"{d}/state-sites\"\n[log]\naccess = false\n{top}\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\n\
         certificates = [{{ cert = \"{d}/site.crt\", key = \"{d}/site.key\" }}]\n{listener}\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\n{}{}",
        site("secure", auth[0]),
        site("public", auth[1])
    );
    common::start_text(s.dir.path(), "sites", &text)
}

/// reqwest for `https://<name>:port`, resolving every test name to `addr`, trusting the
/// sites' certificates, presenting `client`.
fn site_client(s: &Setup, addr: SocketAddr, client: Option<&str>) -> reqwest::Client {
    let d = s.dir.path();
    let mut tls = ClientTls::trusting_all(&[d.join("secure.crt"), d.join("public.crt")]);
    if let Some(stem) = client {
        let (c, k) = s.pki.client(stem);
        tls = tls.client_cert(&c, &k);
    }
    common::tls::https_builder(tls.build())
        .resolve("secure.test", addr)
        .resolve("public.test", addr)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sites_on_one_listener_keep_their_own_policies() {
    let s = Setup::new();
    let up = common::recorder::start().await;
    let (server, addr) = two_sites(&s, up.addr);
    let port = addr.port();
    let secure = format!("https://secure.test:{port}/s");
    let public = format!("https://public.test:{port}/p");
    // the secure site: alice is named, nobody else gets through the handshake
    let r = site_client(&s, addr, Some("alice"))
        .get(&secure)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(up.take()[0].header_all("x-client-subject"), [ALICE]);
    for stem in [None, Some("stranger"), Some("expired")] {
        let r = site_client(&s, addr, stem).get(&secure).send().await;
        assert!(r.is_err(), "{stem:?}: {r:?}");
    }
    let out = tokio::task::block_in_place(|| {
        let run = SClient::new(addr, Tls::V13).servername("secure.test").run();
        format!("{}\n{}", run.stdout, run.stderr).to_ascii_lowercase()
    });
    assert!(out.contains("alert certificate required"), "{out}");
    // the public site asks for no certificate
    let r = site_client(&s, addr, None)
        .get(&public)
        .header("x-client-subject", "CN=forged")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(up.take()[0].header("x-client-subject"), None);
    assert!(up.take().is_empty());
    // a handshake under one site's policy does not serve the other site's requests
    let r = site_client(&s, addr, None)
        .get(&public)
        .header("host", format!("secure.test:{port}"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        421,
        "public.test's handshake, secure.test's Host"
    );
    let r = site_client(&s, addr, Some("alice"))
        .get(&secure)
        .header("host", format!("public.test:{port}"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        421,
        "secure.test's handshake, public.test's Host"
    );
    // no SNI: the listener's policy, not the secure site's
    let anon = common::tls::https_builder(ClientTls::accept_any().build())
        .build()
        .unwrap();
    let r = anon
        .get(format!("https://127.0.0.1:{port}/n"))
        .header("host", format!("secure.test:{port}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 421, "no SNI, secure.test's Host");
    // nor plain HTTP
    let r = common::plain_client()
        .get(format!("http://{}/h", server.local_addrs()[1]))
        .header("host", "secure.test")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 421, "plain HTTP, secure.test's Host");
    assert!(
        up.take().is_empty(),
        "no misdirected request reached the upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_policy_with_async_offload_signs_on_the_engine() {
    let s = Setup::new();
    let up = common::recorder::start().await;
    let (_server, addr) = two_sites_with(
        &s,
        up.addr,
        "[offload.engines.pool]\nkind = \"pool\"\nthreads = 1\n",
        "[listener.offload]\nengine = \"pool\"\nmode = \"async\"\n",
    );
    let port = addr.port();
    for (stem, url) in [
        (Some("alice"), format!("https://secure.test:{port}/s")),
        (None, format!("https://public.test:{port}/p")),
    ] {
        let r = site_client(&s, addr, stem).get(&url).send().await.unwrap();
        assert_eq!(r.status(), 200, "{url}");
    }
    let got = up.take();
    assert_eq!(got[0].header_all("x-client-subject"), [ALICE]);
    assert_eq!(got[1].header("x-client-subject"), None);
    let r = site_client(&s, addr, None)
        .get(format!("https://secure.test:{port}/s"))
        .send()
        .await;
    assert!(r.is_err(), "{r:?}");
}

/// The `names` policy of the listener tests: one exact name and one wildcard.
const NAMES: &str = "names = [\"api-client.example\", \"*.ops.example\"]";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_without_an_accepted_name_fails_the_handshake_with_access_denied() {
    let s = Setup::new();
    let up = common::recorder::start().await;
    let policy = format!("ca = \"{}\", {NAMES}", s.pki.ca.display());
    let (_server, addr) = s.serve_policy("127.0.0.1:0", "names", &policy, "", up.addr);
    // alice: no SAN; cn_named: the accepted name in its CN only; other_name and deep_ops:
    // DNS names the patterns do not take (two labels before `ops.example`)
    for stem in ["alice", "cn_named", "other_name", "deep_ops"] {
        for v in [Tls::V13, Tls::V12] {
            let out = tokio::task::block_in_place(|| s_client(&s, addr, v, Some(stem)));
            assert!(out.contains("alert access denied"), "{stem} {v:?}: {out}");
            assert!(!out.contains("up:/"), "{stem}: {out}");
        }
        for proto in BOTH {
            let r = s
                .reqwest(proto, Some(stem))
                .get(format!("https://localhost:{}/x", addr.port()))
                .send()
                .await;
            assert!(r.is_err(), "{stem} {proto:?}: {r:?}");
        }
    }
    // another CA's certificate is still refused by the chain check first
    let out = tokio::task::block_in_place(|| s_client(&s, addr, Tls::V13, Some("stranger")));
    assert!(out.contains("alert unknown ca"), "{out}");
    assert!(up.take().is_empty(), "nothing reached the upstream");
    for (stem, cn) in [("api", "CN=api,O=ops"), ("ops_box", "CN=box1,O=ops")] {
        for proto in BOTH {
            let r = s
                .reqwest(proto, Some(stem))
                .get(format!("https://localhost:{}/x", addr.port()))
                .send()
                .await
                .expect("an accepted name connects");
            assert_eq!(r.status(), 200, "{stem} {proto:?}");
            assert_eq!(up.take()[0].header_all("x-client-subject"), [cn]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http3_refuses_a_name_the_listener_does_not_accept() {
    if !common::h3::aioquic_available() {
        eprintln!("SKIPPED: python3 with aioquic is needed (pip install aioquic)");
        return;
    }
    let s = Setup::new();
    let up = common::recorder::start().await;
    let policy = format!("ca = \"{}\", {NAMES}", s.pki.ca.display());
    let (_server, addr) = s.serve_policy("127.0.0.1:0", "names-h3", &policy, "", up.addr);
    let req = common::h3::H3Request::get("/h3");
    let out = h3(&s, addr, Some("other_name"), &req);
    assert!(h3_refused(&out), "{out:?}");
    assert!(up.take().is_empty());
    let out = h3(&s, addr, Some("api"), &req).expect("aioquic connects");
    assert_eq!(out[0].as_ref().expect("answered").status, 200);
    assert_eq!(
        up.take()[0].header_all("x-client-subject"),
        ["CN=api,O=ops"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_of_a_policy_without_names_does_not_resume_under_one_with_names() {
    let s = Setup::new();
    let up = common::recorder::start().await;
    let keys = s.dir.path().join("keys.bin");
    key_file(&keys);
    let tk = format!("ticket_keys = \"{}\"", keys.display());
    let ca = s.pki.ca.display();
    // the same CA and ticket keys; B and C accept names, alice has none
    let open = format!("ca = \"{ca}\", required = false");
    let (_a, a) = s.serve_policy("127.0.0.1:0", "a", &open, &tk, up.addr);
    let named = format!("ca = \"{ca}\", required = false, {NAMES}");
    let (_b, b) = s.serve_policy("127.0.0.1:0", "b", &named, &tk, up.addr);
    let (_c, c) = s.serve_policy("127.0.0.1:0", "c", &named, &tk, up.addr);
    for v in [Tls::V13, Tls::V12] {
        let sess = s.dir.path().join(format!("{v:?}.sess"));
        let (resumed, out) = tokio::task::block_in_place(|| resume(&s, a, b, v, &sess));
        assert!(!resumed, "{v:?}: A's session must not resume on B\n{out}");
        let got = up.take();
        assert_eq!(got.len(), 2, "{v:?}");
        assert_eq!(
            got[1].header("x-client-subject"),
            None,
            "{v:?}: no identity"
        );
        // the same names: an accepted client's session resumes with its identity
        let (resumed, out) = tokio::task::block_in_place(|| resume_as(&s, "api", b, c, v, &sess));
        assert!(resumed, "{v:?}: B's session resumes on C\n{out}");
        let got = up.take();
        assert_eq!(
            got[1].header_all("x-client-subject"),
            ["CN=api,O=ops"],
            "{v:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sites_on_one_listener_accept_their_own_names() {
    let s = Setup::new();
    let up = common::recorder::start().await;
    // the same CA, other names: api for secure.test, the ops boxes for public.test
    let ca = s.pki.ca.display();
    let secure = format!("ca = \"{ca}\", names = [\"api-client.example\"]");
    let public = format!("ca = \"{ca}\", names = [\"*.ops.example\"]");
    let (_server, addr) = sites_with(&s, up.addr, "", "", [Some(&secure), Some(&public)]);
    let port = addr.port();
    for (stem, site, refused_on, cn) in [
        ("api", "secure", "public", "CN=api,O=ops"),
        ("ops_box", "public", "secure", "CN=box1,O=ops"),
    ] {
        let r = site_client(&s, addr, Some(stem))
            .get(format!("https://{site}.test:{port}/"))
            .send()
            .await
            .expect("accepted on its site");
        assert_eq!(r.status(), 200, "{stem} on {site}");
        assert_eq!(up.take()[0].header_all("x-client-subject"), [cn]);
        let r = site_client(&s, addr, Some(stem))
            .get(format!("https://{refused_on}.test:{port}/"))
            .send()
            .await;
        assert!(r.is_err(), "{stem} on {refused_on}: {r:?}");
        for v in [Tls::V13, Tls::V12] {
            let out = tokio::task::block_in_place(|| {
                let c = SClient::new(addr, v).servername(&format!("{refused_on}.test"));
                let run = presenting(&s, c, stem).run();
                format!("{}\n{}", run.stdout, run.stderr).to_ascii_lowercase()
            });
            assert!(out.contains("alert access denied"), "{stem} {v:?}: {out}");
        }
    }
    // alice (no SAN) is accepted on neither
    for site in ["secure", "public"] {
        let r = site_client(&s, addr, Some("alice"))
            .get(format!("https://{site}.test:{port}/"))
            .send()
            .await;
        assert!(r.is_err(), "alice on {site}: {r:?}");
    }
    assert!(
        up.take().is_empty(),
        "no refused client reached the upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_changes_the_names_resumes_no_session_of_the_old_names() {
    let s = Setup::new();
    let up = common::recorder::start().await;
    // a fixed port, as in the CA reload test above
    let port = common::free_port();
    let at = format!("127.0.0.1:{port}");
    let before = "names = [\"*.ops.example\"]";
    let policy = format!(
        "ca = \"{}\", required = false, {before}",
        s.pki.ca.display()
    );
    let (mut server, addr) = s.serve_policy(&at, "names-reload", &policy, "", up.addr);
    // ops_box is accepted before the reload and not after: its session must not bring its
    // name past the new list (the CA and `required` are the same, only `names` changed)
    let edit = (before, "names = [\"api-client.example\"]");
    let got = resume_across_a_reload(&s, &mut server, addr, "names-reload", "ops_box", edit, &up);
    for (v, subject) in got {
        assert_eq!(subject, None, "{v:?}: a session of the old names resumed");
    }
    tokio::task::block_in_place(|| server.shutdown());
}
