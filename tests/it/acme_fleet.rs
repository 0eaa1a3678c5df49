//! ACME through the fleet's store (issue 40): qweb nodes that share no state folder, one real
//! `redis-server` as their `[fleet]` store, Caddy's ACME server as the CA, in the network
//! and mount namespaces of `acme.rs` (skipped where they are not allowed).
//!
//! Caddy validates TLS-ALPN-01 on `a.qweb.test:443`, which `/etc/hosts` names 127.0.0.1: the
//! node on 127.0.0.1:443 is the one that can order; the others (127.0.0.2, 127.0.0.3) wait
//! for its certificate while it holds the lock. The store does not share challenges.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use qweb_testkit::process::{serve_command, signal, write_file, Qweb};
use qweb_testkit::redis::RedisServer;

use super::acme::{
    in_namespaces, namespace_setup, served_leaf_at, start_ca, until, BIN, DIRECTORY,
};

const NAME: &str = "a.qweb.test";
/// The log line of a node that ordered a certificate.
const ISSUED: &str = "ACME certificate issued and served";
/// The log line of a node that serves another node's certificate.
const PICKED: &str = "ACME certificate picked up";
const WAITING: &str = "another node sharing the fleet's store is ordering this certificate";

/// Kill the node that holds the order lock mid-order: another takes over when the lock's
/// time to live ends; it orders once and every node serves that certificate within seconds,
/// from the store, without a reload; a node started while the store is down serves its own
/// copy, and the store that comes back empty gets it again.
#[test]
fn acme_through_the_fleet_store_is_ordered_once_and_served_by_every_node() {
    in_namespaces("acme_fleet::in_namespace");
}

/// Node `name`'s configuration: TLS on `addr`, its own state folder, the fleet on `store`.
fn node(dir: &Path, name: &str, addr: &str, root: &Path, store: &str) -> PathBuf {
    let www = dir.join("www");
    write_file(
        dir,
        &format!("{name}.toml"),
        &format!(
            r#"workers = 1
state_dir = "{state}"
[[listener]]
address = "{addr}"
tls = {{}}
[[site]]
server_names = ["{NAME}"]
acme = {{ directory = "{DIRECTORY}", ca_root = "{root}", challenge = "tls-alpn-01", retry_after = "2s" }}
route = [{{ prefix = "/", root = "{www}" }}]
[fleet]
store = "{store}"
node_name = "{name}"
secret = "{secret}"
"#,
            state = dir.join(name).join("state").display(),
            root = root.display(),
            www = www.display(),
            secret = "5a".repeat(32),
        ),
    )
}

/// The value of the first key matching `pattern` (`$-1`: none).
fn first_value(r: &RedisServer, pattern: &str) -> String {
    r.command(&[
        "EVAL",
        "local k = redis.call('KEYS', ARGV[1]) if #k == 0 then return false end return redis.call('GET', k[1])",
        "0",
        pattern,
    ])
}

/// How many keys match `pattern`.
fn keys(r: &RedisServer, pattern: &str) -> usize {
    let n = r.command(&["EVAL", "return #redis.call('KEYS', ARGV[1])", "0", pattern]);
    n.trim_start_matches(':').parse().unwrap()
}

const LOCK: &str = "qweb:acme:*:lock:a.qweb.test";
const CERT: &str = "qweb:acme:*:cert:a.qweb.test";

/// The scenario, inside the namespaces (run by the test above).
#[test]
#[ignore = "run inside `unshare -n -m` by acme_through_the_fleet_store_is_ordered_once_and_served_by_every_node"]
fn in_namespace() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    namespace_setup(dir, NAME);
    std::fs::create_dir_all(dir.join("www")).unwrap();
    std::fs::write(dir.join("www/index.html"), "acme ok\n").unwrap();
    let mut r = RedisServer::start();
    let url = r.url();
    let (ca, _cdir, root) = start_ca(dir);

    // a takes the order lock while the CA does not answer, and is killed mid-order
    signal(ca.pid(), libc::SIGSTOP);
    let mut a = Qweb::spawn(
        serve_command(BIN, &node(dir, "a", "127.0.0.1:443", &root, &url)),
        "worker(s)",
    );
    until(Duration::from_secs(15), "a's order lock", || {
        first_value(&r, LOCK).starts_with("a:").then_some(())
    });
    let locked = Instant::now();
    a.kill();
    assert_eq!(keys(&r, CERT), 0, "a was killed before its certificate");
    signal(ca.pid(), libc::SIGCONT);

    // b waits for the dead holder's lock to expire (the store's time to live), then orders
    let b = Qweb::spawn(
        serve_command(BIN, &node(dir, "b", "127.0.0.1:443", &root, &url)),
        "worker(s)",
    );
    b.wait_for_within(WAITING, 1, Duration::from_secs(15));
    until(Duration::from_secs(90), "b takes the expired lock", || {
        first_value(&r, LOCK).starts_with("b:").then_some(())
    });
    let took = locked.elapsed();
    eprintln!("b took over the dead holder's lock after {took:?}");
    assert!(
        took >= Duration::from_secs(55),
        "{took:?}: before the lock's TTL"
    );

    // c and d start while b orders (the CA paused meanwhile): they wait, and serve b's
    // certificate once it is in the store
    signal(ca.pid(), libc::SIGSTOP);
    let c = Qweb::spawn(
        serve_command(BIN, &node(dir, "c", "127.0.0.2:443", &root, &url)),
        "worker(s)",
    );
    let dn = Qweb::spawn(
        serve_command(BIN, &node(dir, "d", "127.0.0.3:443", &root, &url)),
        "worker(s)",
    );
    c.wait_for_within(WAITING, 1, Duration::from_secs(15));
    dn.wait_for_within(WAITING, 1, Duration::from_secs(15));
    signal(ca.pid(), libc::SIGCONT);
    b.wait_for_within(ISSUED, 1, Duration::from_secs(60));
    let issued = Instant::now();
    c.wait_for_within(PICKED, 1, Duration::from_secs(10));
    dn.wait_for_within(PICKED, 1, Duration::from_secs(10));
    eprintln!(
        "c and d served b's certificate within {:?} of its issue",
        issued.elapsed()
    );
    let leaves: Vec<Vec<u8>> = ["127.0.0.1:443", "127.0.0.2:443", "127.0.0.3:443"]
        .iter()
        .map(|addr| served_leaf_at(addr, NAME, &root).unwrap_or_else(|| panic!("{addr}")))
        .collect();
    assert!(leaves.iter().all(|l| *l == leaves[0]), "the same leaf");
    // ordered once: by b; c and d never talked to the CA
    assert_eq!(
        (b.count(ISSUED), c.count(ISSUED), dn.count(ISSUED)),
        (1, 0, 0)
    );
    for n in [&c, &dn] {
        assert_eq!(n.count("ACME account created"), 0);
    }
    assert_eq!(keys(&r, CERT), 1);
    assert_eq!(keys(&r, LOCK), 0, "released");
    let copy = std::fs::read_dir(dir.join("c/state/acme"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
        .join("a.qweb.test.pem");
    assert!(copy.exists(), "c's last copy in its state folder");

    // the store goes away; c restarts meanwhile and serves its own copy
    r.kill();
    drop(c);
    let c = Qweb::spawn(
        serve_command(BIN, &node(dir, "c", "127.0.0.2:443", &root, &url)),
        "worker(s)",
    );
    assert_eq!(
        served_leaf_at("127.0.0.2:443", NAME, &root).as_ref(),
        Some(&leaves[0])
    );
    // it comes back empty (no persistence): the nodes' copy is put back
    r.restart();
    until(
        Duration::from_secs(20),
        "the certificate back in the store",
        || (keys(&r, CERT) == 1).then_some(()),
    );
    assert_eq!(c.count(ISSUED) + b.count(ISSUED) + dn.count(ISSUED), 1);
    drop(ca);
}
