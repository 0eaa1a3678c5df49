//! `ticket_keys = "fleet"` against a real `redis-server`: qweb nodes (separate `Server`s)
//! share their ticket keys through the store (`openssl s_client -sess_out` on one node,
//! `-sess_in` on another); a node with another `fleet.secret` cannot read them (it serves
//! on its own keys); with the store killed the nodes keep resuming on the keys they have
//! and retire them by age; a tampered ring is refused, counted, and left alone; SIGTERM
//! with the store killed or hanging exits at once.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use qweb_server::RunningServer;
use qweb_testkit::metrics;
use qweb_testkit::process::Qweb;
use qweb_testkit::redis::RedisServer;
use qweb_testkit::start_text;

use crate::ticket_keys::{
    fetches, issue, offer, s_client, setup, shared_after_rotation, sigterm_exits_within,
};

const BIN: &str = env!("CARGO_BIN_EXE_qweb");
const SECRET: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
const OTHER: &str = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

/// A node whose TLS listener takes its ticket keys from the fleet's store, rotating every
/// `rotation`, with `secret`.
fn node(
    dir: &Path,
    redis: &RedisServer,
    name: &str,
    secret: &str,
    rotation: &str,
) -> (RunningServer, SocketAddr) {
    start_text(dir, name, &node_config(dir, redis, name, secret, rotation))
}

/// The configuration of [`node`].
fn node_config(
    dir: &Path,
    redis: &RedisServer,
    name: &str,
    secret: &str,
    rotation: &str,
) -> String {
    let d = dir.display();
    format!(
        "workers = 1\nstate_dir = \"{d}/state-{name}\"\n[log]\naccess = false\n\
         [admin]\naddress = \"127.0.0.1:0\"\n\
         [fleet]\nstore = \"{}\"\nnode_name = \"{name}\"\nsecret = \"{secret}\"\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\n\
         certificates = [{{ cert = \"{d}/site.crt\", key = \"{d}/site.key\" }}]\n\
         session_cache = 0\nticket_keys = \"fleet\"\nticket_rotation = \"{rotation}\"\n\
         [[route]]\nprefix = \"/\"\nroot = \"{d}/site\"\n",
        redis.url()
    )
}

fn key_age(server: &RunningServer) -> f64 {
    let m = metrics::of(server);
    let age = m
        .matching("qweb_tls_ticket_key_age_seconds", &[])
        .next()
        .map(|s| s.value);
    age.unwrap_or_else(|| panic!("no key age in\n{m}"))
}

#[test]
fn a_ticket_from_node_a_resumes_on_b_and_c_and_not_on_a_node_with_another_secret() {
    let dir = setup();
    let d = dir.path();
    let redis = RedisServer::start();
    let t0 = Instant::now();
    let (a, a_addr) = node(d, &redis, "a", SECRET, "10s");
    let (b, b_addr) = node(d, &redis, "b", SECRET, "10s");
    let (c, c_addr) = node(d, &redis, "c", SECRET, "10s");
    let (x, x_addr) = node(d, &redis, "x", OTHER, "10s");
    let on = [
        (b_addr, true, "A's ticket on B"),
        (c_addr, true, "A's ticket on C"),
        (x_addr, false, "A's ticket on X (another secret)"),
    ];
    issue(d, a_addr, "", &on);
    // X serves on keys of its own
    issue(d, x_addr, "-x", &[(x_addr, true, "X's ticket on X")]);
    assert!(
        fetches(&a, "ok") >= 1 && fetches(&b, "ok") >= 1,
        "{}",
        metrics::of(&b)
    );
    assert_eq!(fetches(&a, "refused"), 0);
    assert!(fetches(&x, "refused") >= 1, "{}", metrics::of(&x));
    // past a rotation (made by one node, under the lock): the old tickets still resume
    // (on C) and new ones are shared
    shared_after_rotation(d, t0, Duration::from_secs(10), c_addr, a_addr);
    // it did rotate: the keys that encrypt now are younger than the ring
    for n in [&a, &b, &c] {
        assert!(key_age(n) < 5.0, "{}", metrics::of(n));
    }
    for s in [a, b, c, x] {
        s.shutdown();
    }
}

#[test]
fn with_the_store_killed_nodes_resume_on_their_keys_then_retire_them_by_age() {
    let dir = setup();
    let d = dir.path();
    let mut redis = RedisServer::start();
    // 4 s periods: the tickets are issued late in their key's period (age 3 s), so the key
    // retires (two periods after it started) at most 5 s after them, while their lifetime
    // hint (two periods, 8 s) still has the client offer them
    let (a, a_addr) = node(d, &redis, "a", SECRET, "4s");
    let (b, b_addr) = node(d, &redis, "b", SECRET, "4s");
    let deadline = Instant::now() + Duration::from_secs(10);
    while key_age(&a) < 3.0 {
        assert!(Instant::now() < deadline, "the key never reached 3 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let issued = Instant::now();
    issue(d, a_addr, "", &[]);
    redis.kill();
    let started = Instant::now();
    while fetches(&b, "failed") == 0 && started.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(fetches(&b, "failed") >= 1, "{}", metrics::of(&b));
    // the keys they have: A's ticket resumes on B with the store gone
    offer(d, "", &[(b_addr, true, "store down")]);
    assert!(
        issued.elapsed() < Duration::from_secs(5),
        "too slow for this test's timeline"
    );
    std::thread::sleep(
        (issued + Duration::from_millis(6_500)).saturating_duration_since(Instant::now()),
    );
    offer(
        d,
        "",
        &[(b_addr, false, "a ticket past its key's two periods")],
    );
    // still serving, on local keys
    issue(d, b_addr, "-local", &[(b_addr, true, "local ticket")]);
    assert!(
        issued.elapsed() < Duration::from_secs(8),
        "too slow: the lifetime hint ran out"
    );
    a.shutdown();
    b.shutdown();
}

#[test]
fn a_tampered_ring_is_refused_counted_and_left_alone() {
    let dir = setup();
    let d = dir.path();
    let redis = RedisServer::start();
    let garbage = "0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz";
    assert_eq!(
        redis.command(&["SET", "qweb:tickets:10000", garbage]),
        "+OK"
    );
    let (a, a_addr) = node(d, &redis, "a", SECRET, "10s");
    let (b, b_addr) = node(d, &redis, "b", SECRET, "10s");
    assert!(fetches(&a, "refused") >= 1, "{}", metrics::of(&a));
    assert_eq!(fetches(&a, "ok"), 0);
    // no shared keys: B does not take A's ticket, A does (its own keys)
    let on = [
        (b_addr, false, "shared from garbage"),
        (a_addr, true, "A's own keys"),
    ];
    issue(d, a_addr, "", &on);
    std::thread::sleep(Duration::from_millis(1_500));
    assert!(fetches(&b, "refused") >= 2, "{}", metrics::of(&b));
    // nobody overwrote it with a ring of its own
    assert_eq!(redis.command(&["GET", "qweb:tickets:10000"]), garbage);
    a.shutdown();
    b.shutdown();
}

/// SIGTERM with the store killed, or stopped with SIGSTOP (its connections open, nothing
/// answering for the store's 10 s timeout), and nothing in flight: `qweb serve` exits at
/// once, not after `shutdown_timeout` (30 s) nor the timeout. Nothing waits on the store:
/// not the ticket-key refresher (in its backoff sleep, or inside a request), not the fleet
/// client.
#[test]
fn sigterm_with_the_store_gone_or_hanging_exits_at_once() {
    let dir = setup();
    let d = dir.path();
    for (round, paused) in [false, true].into_iter().enumerate() {
        let mut redis = RedisServer::start();
        let text = node_config(d, &redis, &format!("p{round}"), SECRET, "4s").replacen(
            "[fleet]\n",
            "[fleet]\ntimeout = \"10s\"\n",
            1,
        );
        let text = format!("shutdown_timeout = \"30s\"\n{text}");
        let file = qweb_testkit::process::write_file(d, &format!("p{round}.toml"), &text);
        let mut q = Qweb::serve(BIN, &file);
        assert_eq!(q.count("not from the fleet's store"), 0, "{:#?}", q.lines());
        let addr: SocketAddr = q.addr("https").parse().unwrap();
        let f = d.join(format!("p{round}.sess"));
        assert!(!s_client(addr, true, &f, true));
        if paused {
            redis.pause();
            // 4 s periods: the refresher asks every second, so it is waiting on the store now
            std::thread::sleep(Duration::from_millis(1_500));
        } else {
            redis.kill();
            q.wait_for_within(
                "ticket keys: no keys from the fleet's store",
                1,
                Duration::from_secs(10),
            );
        }
        sigterm_exits_within(&mut q, &format!("paused={paused}"), Duration::from_secs(2));
    }
}
