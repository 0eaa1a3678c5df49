//! Automatic certificates from a real ACME server: Caddy's `acme_server` (its own internal
//! CA). Caddy validates HTTP-01 on port 80 and TLS-ALPN-01 on port 443 of the name, with no
//! setting to change that, so the scenario runs in a network and mount namespace of its own
//! (`unshare -n -m`, root only): a private loopback where qweb binds 80 and 443, and a
//! private `/etc/hosts` naming the test domains. Where namespaces are not allowed the test
//! says so and skips; where a tool is missing it skips too, or fails where `CI` is set.
//!
//! The outer test re-runs this test binary inside the namespaces with the inner test, which
//! refuses to run anywhere else (it bind-mounts over `/etc/hosts`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use qweb_testkit::process::{serve_command, write_file, Qweb};
use qweb_testkit::tls::ClientTls;

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_qweb");
/// Set by the outer test for the inner one.
pub(crate) const INNER: &str = "QWEB_ACME_IN_NAMESPACE";
pub(crate) const DIRECTORY: &str = "https://acme.test:9443/acme/local/directory";

/// Why the namespaced scenario cannot run here, if it cannot. A missing tool is a failure
/// under `CI` (`qweb_testkit::tools`); namespaces that are not allowed skip everywhere.
pub(crate) fn unavailable() -> Option<String> {
    for tool in ["caddy", "unshare", "ip", "curl", "mount"] {
        if !qweb_testkit::tools::require(tool) {
            return Some(format!("`{tool}` is not installed"));
        }
    }
    let ok = Command::new("unshare")
        .args(["-n", "-m", "true"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    (!ok).then(|| "`unshare -n -m` is not allowed here (needs root)".to_owned())
}

/// A fresh qweb with `acme` blocks and no certificate file serves certificates issued by
/// Caddy's ACME server (HTTP-01 for one site, TLS-ALPN-01 for the other), renews them
/// without a reload while every request succeeds, keeps serving while the CA is down and
/// renews again when it is back, and after a restart serves the saved certificate at once;
/// the state folder's files are private (0600).
#[test]
fn certificates_from_caddys_acme_server_are_issued_renewed_and_kept() {
    in_namespaces("acme::in_namespace");
}

/// Runs the ignored test `inner` of this binary inside a network and mount namespace of its
/// own (skipped where [`unavailable`]); fails when it does.
pub(crate) fn in_namespaces(inner: &str) {
    if let Some(why) = unavailable() {
        eprintln!("SKIPPED {inner}: {why}");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("unshare")
        .args(["-n", "-m", "--"])
        .arg(exe)
        .args([
            inner,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(INNER, "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "the namespaced scenario failed:\n{text}"
    );
    assert!(text.contains("1 passed"), "{text}");
    for l in text
        .lines()
        .filter(|l| l.contains("within") || l.contains("took"))
    {
        eprintln!("{l}");
    }
}

/// Caddy with `acme_server` at `acme.test:9443`, its data in `dir`.
pub(crate) fn caddy(dir: &Path) -> Qweb {
    let file = write_file(
        dir,
        "Caddyfile",
        &format!(
            "{{\n\tadmin off\n\tauto_https disable_redirects\n\thttp_port 10080\n\tlocal_certs\n\tskip_install_trust\n\tstorage file_system {}\n}}\nhttps://acme.test:9443 {{\n\ttls internal\n\tacme_server\n}}\n",
            dir.join("data").display()
        ),
    );
    let mut cmd = Command::new("caddy");
    cmd.args(["run", "--adapter", "caddyfile", "--config"])
        .arg(file)
        .env("HOME", dir)
        .env("XDG_DATA_HOME", dir.join("xdg"))
        .env("XDG_CONFIG_HOME", dir.join("xdg"))
        .stdout(Stdio::null());
    Qweb::spawn(cmd, "serving initial configuration")
}

pub(crate) fn sh(cmd: &str) {
    let s = Command::new("sh").args(["-c", cmd]).status().unwrap();
    assert!(s.success(), "{cmd}");
}

/// `curl https://NAME/` trusting `root`: status and body.
fn curl(name: &str, root: &Path) -> (u16, String) {
    let o = Command::new("curl")
        .args(["-s", "--max-time", "10", "-w", "\n%{http_code}", "--cacert"])
        .arg(root)
        .arg(format!("https://{name}/"))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let (body, code) = out.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

/// [`curl`] to `name` at the address `ip` (IPv4 or IPv6), not the one `/etc/hosts` gives.
fn curl_at(name: &str, ip: &str, root: &Path) -> (u16, String) {
    let o = Command::new("curl")
        .args(["-s", "--max-time", "10", "-w", "\n%{http_code}", "--cacert"])
        .arg(root)
        .arg("--resolve")
        .arg(format!("{name}:443:{ip}"))
        .arg(format!("https://{name}/"))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let (body, code) = out.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

/// The leaf certificate qweb serves for `name` (verified against `root`).
fn served_leaf(name: &str, root: &Path) -> Option<Vec<u8>> {
    served_leaf_at("127.0.0.1:443", name, root)
}

/// [`served_leaf`] by the listener at `addr`.
pub(crate) fn served_leaf_at(addr: &str, name: &str, root: &Path) -> Option<Vec<u8>> {
    let cfg = Arc::new(ClientTls::trusting(root).no_resumption().build());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let addr = addr.parse().unwrap();
        let sni = rustls::pki_types::ServerName::try_from(name.to_owned()).unwrap();
        let tls = qweb_testkit::tls::connect_as(addr, &cfg, sni).await.ok()?;
        let certs = tls.get_ref().1.peer_certificates()?;
        Some(certs[0].as_ref().to_vec())
    })
}

/// A handshake for `name` offering `alpn` (any certificate accepted): the protocol chosen.
fn handshake(name: &str, alpn: &[&[u8]]) -> std::io::Result<Vec<u8>> {
    let cfg = Arc::new(ClientTls::accept_any().alpn(alpn).build());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let sni = rustls::pki_types::ServerName::try_from(name.to_owned()).unwrap();
        let tls =
            qweb_testkit::tls::connect_as("127.0.0.1:443".parse().unwrap(), &cfg, sni).await?;
        Ok(tls.get_ref().1.alpn_protocol().unwrap_or_default().to_vec())
    })
}

/// Polls until `f` gives `Some` (every 200 ms, up to `limit`).
pub(crate) fn until<T>(limit: Duration, what: &str, f: impl FnMut() -> Option<T>) -> T {
    qweb_testkit::poll_until(what, limit, Duration::from_millis(200), f)
}

/// `qweb keyserver` generating keys into `dir/ks/generated`, on `dir/ks.sock`.
fn keyserver(dir: &Path) -> Qweb {
    let conf = write_file(
        dir,
        "keyserver.toml",
        &format!(
            "generated_keys = \"{}\"\n[unix]\npath = \"{}\"\n",
            dir.join("ks/generated").display(),
            dir.join("ks.sock").display()
        ),
    );
    let mut cmd = Command::new(BIN);
    cmd.args(["keyserver", "--config"])
        .arg(conf)
        .stdout(Stdio::null());
    Qweb::spawn(cmd, qweb_testkit::process::KEYSERVER_READY)
}

/// Does process `pid`'s memory hold `needle` (or its bytes reversed, as a little-endian
/// big number holds a scalar)? Reads every resident page of every readable mapping through
/// `/proc/PID/mem` (`/proc/PID/pagemap` says which pages are resident: reading the others
/// would only fault in zero pages of the allocator's reservations).
fn memory_holds(pid: u32, needle: &[u8]) -> bool {
    use std::os::unix::fs::FileExt;
    const PAGE: u64 = 4096;
    let reversed: Vec<u8> = needle.iter().rev().copied().collect();
    let finders = [
        memchr::memmem::Finder::new(needle),
        memchr::memmem::Finder::new(&reversed),
    ];
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let pagemap = std::fs::File::open(format!("/proc/{pid}/pagemap")).unwrap();
    let mut scanned = 0u64;
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        if !perms.starts_with('r') || line.ends_with("[vvar]") || line.ends_with("[vsyscall]") {
            continue;
        }
        let (a, b) = range.split_once('-').unwrap();
        let start = u64::from_str_radix(a, 16).unwrap();
        let end = u64::from_str_radix(b, 16).unwrap();
        let pages = ((end - start) / PAGE) as usize;
        let mut entries = vec![0u8; pages * 8];
        if pagemap
            .read_exact_at(&mut entries, start / PAGE * 8)
            .is_err()
        {
            continue;
        }
        let present = |i: usize| {
            let e = u64::from_le_bytes(entries[i * 8..i * 8 + 8].try_into().unwrap());
            e & (1 << 63) != 0
        };
        let mut i = 0;
        while i < pages {
            if !present(i) {
                i += 1;
                continue;
            }
            // a run of resident pages, read whole (a needle may cross pages)
            let first = i;
            while i < pages && present(i) {
                i += 1;
            }
            let mut run = vec![0u8; (i - first) * PAGE as usize];
            if mem
                .read_exact_at(&mut run, start + first as u64 * PAGE)
                .is_err()
            {
                continue;
            }
            scanned += run.len() as u64;
            if finders.iter().any(|f| f.find(&run).is_some()) {
                return true;
            }
        }
    }
    assert!(
        scanned > 1 << 20,
        "only {scanned} bytes of memory could be read"
    );
    false
}

/// The private scalar of a PEM ECDSA P-256 key (PKCS#8: the ECPrivateKey's OCTET STRING).
fn p256_scalar(key_file: &Path) -> Vec<u8> {
    let der = qweb_tls::load_private_key(key_file).unwrap();
    let der = der.secret_der();
    let at = der
        .windows(5)
        .position(|w| w == [0x02, 0x01, 0x01, 0x04, 0x20])
        .expect("an ECPrivateKey");
    der[at + 5..at + 37].to_vec()
}

fn config(dir: &Path, root: &Path, www: &Path) -> PathBuf {
    let acme = format!(
        "directory = \"{DIRECTORY}\", ca_root = \"{}\", email = \"ops@qweb.test\", renew_before = \"12h\", retry_after = \"2s\"",
        root.display()
    );
    write_file(
        dir,
        "qweb.toml",
        &format!(
            r#"workers = 2
state_dir = "{state}"
[[listener]]
address = "[::]:443"
tls = {{}}
[[listener]]
address = "[::]:80"
redirect = {{ to = "https://{{host}}{{uri}}", status = 301 }}
[[site]]
server_names = ["a.qweb.test"]
acme = {{ {acme} }}
route = [{{ prefix = "/", root = "{www}" }}]
[[site]]
server_names = ["b.qweb.test"]
acme = {{ {acme}, challenge = "tls-alpn-01" }}
route = [{{ prefix = "/", root = "{www}" }}]
[[site]]
server_names = ["c.qweb.test"]
acme = {{ {acme}, key = "keyserver:ks" }}
route = [{{ prefix = "/", root = "{www}" }}]
[offload.engines.ks]
kind = "keyserver"
servers = ["unix:{sock}"]
"#,
            state = dir.join("state").display(),
            www = www.display(),
            sock = dir.join("ks.sock").display(),
        ),
    )
}

/// Caddy's ACME server with its data in `dir/caddy`, once its root exists: the server,
/// its folder and the root's file.
pub(crate) fn start_ca(dir: &Path) -> (Qweb, PathBuf, PathBuf) {
    let cdir = dir.join("caddy");
    std::fs::create_dir_all(&cdir).unwrap();
    let ca = caddy(&cdir);
    let root = cdir.join("data/pki/authorities/local/root.crt");
    until(Duration::from_secs(20), "Caddy's root", || {
        root.exists().then_some(())
    });
    (ca, cdir, root)
}

/// Inside the namespaces only: `/etc/hosts` names `acme.test` and `names` 127.0.0.1, the
/// loopback is up.
pub(crate) fn namespace_setup(dir: &Path, names: &str) {
    assert_eq!(
        std::env::var(INNER).as_deref(),
        Ok("1"),
        "only inside the namespaces: this test mounts over /etc/hosts"
    );
    let hosts = write_file(
        dir,
        "hosts",
        &format!("127.0.0.1 localhost acme.test {names}\n"),
    );
    sh(&format!("mount --bind {} /etc/hosts", hosts.display()));
    sh("ip link set lo up");
}

/// The scenario, inside the namespaces (run by the test above).
#[test]
#[ignore = "run inside `unshare -n -m` by certificates_from_caddys_acme_server_are_issued_renewed_and_kept"]
fn in_namespace() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    namespace_setup(dir, "a.qweb.test b.qweb.test c.qweb.test");
    let www = dir.join("www");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::write(www.join("index.html"), "acme ok\n").unwrap();

    let (mut ca, cdir, root) = start_ca(dir);

    // a fresh qweb: no certificate yet, each site gets one within seconds
    let ks = keyserver(dir);
    let conf = config(dir, &root, &www);
    let q = Qweb::spawn(serve_command(BIN, &conf), "worker(s)");
    let started = Instant::now();
    for name in ["a.qweb.test", "b.qweb.test", "c.qweb.test"] {
        until(
            Duration::from_secs(30),
            &format!("a certificate for {name}"),
            || (curl(name, &root) == (200, "acme ok\n".into())).then_some(()),
        );
    }
    eprintln!("issued all three within {:?}", started.elapsed());
    // The listeners are the README's `[::]:443` and `[::]:80` (issue 41, item 2): the CA
    // validated over IPv4 (the names resolve to 127.0.0.1 here), and IPv6 clients are served
    // on the same sockets.
    for ip in ["127.0.0.1", "[::1]"] {
        assert_eq!(
            curl_at("a.qweb.test", ip, &root),
            (200, "acme ok\n".into()),
            "a.qweb.test at {ip}"
        );
    }

    // c's key exists only on the key server: not in qweb's memory, not in its state folder;
    // a's key (qweb's own) is found by the same scan, so the scan can see a key
    let generated: Vec<PathBuf> = std::fs::read_dir(dir.join("ks/generated"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(generated.len(), 1, "{generated:?}");
    let c_key = p256_scalar(&generated[0]);
    let acme_dir = std::fs::read_dir(dir.join("state/acme"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let a_key = p256_scalar(&acme_dir.join("a.qweb.test.pem"));
    let scan = Instant::now();
    assert!(
        memory_holds(q.pid(), &a_key),
        "the scan finds qweb's own key"
    );
    assert!(
        !memory_holds(q.pid(), &c_key),
        "the key server's key is in qweb's memory"
    );
    eprintln!("memory scans took {:?}", scan.elapsed());
    let c_file = std::fs::read(acme_dir.join("c.qweb.test.pem")).unwrap();
    assert!(!String::from_utf8_lossy(&c_file).contains("PRIVATE KEY"));
    for f in std::fs::read_dir(dir.join("state")).unwrap() {
        let p = f.unwrap().path();
        if p.is_file() {
            let bytes = std::fs::read(&p).unwrap();
            assert!(!bytes.windows(32).any(|w| w == c_key), "{}", p.display());
        }
    }
    q.wait_for("answered an ACME HTTP-01 challenge", 1);
    // the plain listener still redirects everything else
    let o = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "http://a.qweb.test/x",
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "301");

    // with no challenge outstanding, a client offering `acme-tls/1` alone gets no
    // certificate (and one offering it besides h2 gets the site's)
    assert!(handshake("a.qweb.test", &[b"acme-tls/1"]).is_err());
    assert_eq!(
        handshake("a.qweb.test", &[b"h2", b"acme-tls/1"]).unwrap(),
        b"h2"
    );

    // renewal (renew_before is the whole 12 h lifetime): new certificates are served
    // without a reload, and no request fails meanwhile
    let first = served_leaf("a.qweb.test", &root).unwrap();
    let first_b = served_leaf("b.qweb.test", &root).unwrap();
    let mut renewed = (false, false);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) && !(renewed.0 && renewed.1) {
        assert_eq!(curl("a.qweb.test", &root).0, 200);
        assert_eq!(curl("b.qweb.test", &root).0, 200);
        renewed.0 |= served_leaf("a.qweb.test", &root).unwrap() != first;
        renewed.1 |= served_leaf("b.qweb.test", &root).unwrap() != first_b;
    }
    assert_eq!(renewed, (true, true), "both renewed within 30 s");

    // the key server goes away: c's renewals fail (no key can be made) and are retried,
    // the other sites serve on; it comes back: c is served again
    drop(ks);
    q.wait_for("key generation on the key server", 1);
    assert_eq!(curl("a.qweb.test", &root), (200, "acme ok\n".into()));
    let ks = keyserver(dir);
    until(Duration::from_secs(30), "c served again", || {
        (curl("c.qweb.test", &root).0 == 200).then_some(())
    });

    // the CA goes away: orders fail, the current certificates are still served
    drop(ca);
    q.wait_for("cannot connect to acme.test:9443", 1);
    for _ in 0..5 {
        assert_eq!(curl("a.qweb.test", &root), (200, "acme ok\n".into()));
        assert_eq!(curl("b.qweb.test", &root).0, 200);
    }
    // it comes back: renewals resume
    ca = caddy(&cdir);
    let before = served_leaf("a.qweb.test", &root).unwrap();
    until(
        Duration::from_secs(30),
        "a renewal after the CA came back",
        || (served_leaf("a.qweb.test", &root)? != before).then_some(()),
    );
    drop(ca);

    // saved privately, and served at once by a restarted qweb (the CA is down)
    let acme_dir = dir.join("state/acme");
    let mut files = 0;
    for sub in std::fs::read_dir(&acme_dir).unwrap() {
        for f in std::fs::read_dir(sub.unwrap().path()).unwrap() {
            let f = f.unwrap();
            let mode =
                std::os::unix::fs::PermissionsExt::mode(&f.metadata().unwrap().permissions());
            assert_eq!(mode & 0o077, 0, "{} is {mode:o}", f.path().display());
            // (an order lock is there while an order is tried)
            files += usize::from(f.path().extension().is_some_and(|x| x != "lock"));
        }
    }
    assert_eq!(files, 4, "account.json, a, b and c.qweb.test.pem");
    drop(q);
    let _q = Qweb::spawn(serve_command(BIN, &conf), "worker(s)");
    assert_eq!(curl("a.qweb.test", &root), (200, "acme ok\n".into()));
    assert_eq!(curl("b.qweb.test", &root), (200, "acme ok\n".into()));
    assert_eq!(curl("c.qweb.test", &root), (200, "acme ok\n".into()));
    drop(ks);

    // a second node sharing a state folder: while another node's order lock is there it
    // does not order (the CA is down: it could not), and it serves the certificate that
    // node saves once it is there (on port 8443: the first node's dual-stack `[::]:443`
    // holds 443 on every local address, as a `0.0.0.0:443` would)
    let node1 = std::fs::read_dir(&acme_dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let shared = dir.join("state2/acme").join(node1.file_name().unwrap());
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::write(shared.join("a.qweb.test.lock"), "1\n").unwrap();
    let node2 = write_file(
        dir,
        "node2.toml",
        &format!(
            "workers = 1\nstate_dir = \"{}\"\n[[listener]]\naddress = \"127.0.0.2:8443\"\ntls = {{}}\n\
             [[site]]\nserver_names = [\"a.qweb.test\"]\n\
             acme = {{ directory = \"{DIRECTORY}\", ca_root = \"{}\" }}\n\
             route = [{{ prefix = \"/\", root = \"{}\" }}]\n",
            dir.join("state2").display(),
            root.display(),
            www.display()
        ),
    );
    let n2 = Qweb::spawn(serve_command(BIN, &node2), "worker(s)");
    n2.wait_for("another node sharing the state folder is ordering", 1);
    let curl2 = || {
        let o = Command::new("curl")
            .args([
                "-s",
                "--max-time",
                "5",
                "--resolve",
                "a.qweb.test:8443:127.0.0.2",
            ])
            .arg("--cacert")
            .arg(&root)
            .arg("https://a.qweb.test:8443/")
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert_eq!(curl2(), "", "no certificate before the other node's");
    // the other node saves its certificate and lets go of the lock
    std::fs::copy(
        node1.join("a.qweb.test.pem"),
        shared.join("a.qweb.test.pem"),
    )
    .unwrap();
    std::fs::remove_file(shared.join("a.qweb.test.lock")).unwrap();
    n2.wait_for_within(
        "picked up from the state folder",
        1,
        Duration::from_secs(15),
    );
    assert_eq!(curl2(), "acme ok\n");
    assert!(
        !shared.join("account.json").exists(),
        "the waiting node never talked to the CA"
    );
}
