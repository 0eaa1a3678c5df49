//! `rate_limit = { ..., scope = "fleet" }` (issue 40) against a real `redis-server`: three
//! nodes under uneven load let through the fleet's rate (within 10%), where `scope = "node"`
//! lets through each node's; with the store killed each node limits at its share (rate /
//! nodes seen) and says so on `/metrics`, and counts in the store again when it is back; a
//! key of another type in the store fails the leases without stopping the fleet thread; a
//! store that stops answering holds up no request; many distinct keys stay at `max_keys` on
//! the node and expire in the store.

use qweb_testkit as common;

use std::time::{Duration, Instant};

use common::redis::RedisServer;

use crate::fleet::{metric, nodes, until};

const RATE: f64 = 100.0;
const BURST: f64 = 4.0;

fn node(store: &str, name: &str, scope: &str) -> common::TestServer {
    node_with(store, name, scope, "")
}

fn node_with(store: &str, name: &str, scope: &str, fleet: &str) -> common::TestServer {
    common::start_with(
        &format!(
            "workers = 2\n[admin]\naddress = \"127.0.0.1:0\"\n\
             [fleet]\nstore = \"{store}\"\nnode_name = \"{name}\"\n{fleet}\n\
             [[route]]\nprefix = \"/\"\nroot = \"{{dir}}/site\"\n\
             rate_limit = {{ rate = \"{RATE}/s\", burst = {BURST}, scope = \"{scope}\" }}\n"
        ),
        |d| std::fs::write(d.join("site").join("x"), "x").unwrap(),
    )
}

/// Offers `per_sec` requests a second to each node for `dur` (every request on a kept-alive
/// connection, none waiting for another): the 200s of each node, the seconds it took and the
/// 99th percentile of the answers' latency (ms, as this client saw them).
async fn offer(load: &[(&common::TestServer, f64)], dur: Duration) -> (Vec<u32>, f64, f64) {
    let client = common::plain_client();
    let start = Instant::now();
    let mut loads = Vec::new();
    for (t, per_sec) in load {
        let url = format!("{}/x", t.http());
        let client = client.clone();
        let every = Duration::from_secs_f64(1.0 / per_sec);
        loads.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            let mut sent = Vec::new();
            while start.elapsed() < dur {
                tick.tick().await;
                let (c, u) = (client.clone(), url.clone());
                sent.push(tokio::spawn(async move {
                    let t0 = Instant::now();
                    let status = c.get(u).send().await.map(|r| r.status().as_u16());
                    (status.unwrap_or(0), t0.elapsed())
                }));
            }
            let (mut ok, mut took) = (0, Vec::new());
            for s in sent {
                let (status, t) = s.await.unwrap();
                match status {
                    200 => ok += 1,
                    429 => {}
                    other => panic!("a node answered {other}"),
                }
                took.push(t);
            }
            (ok, took)
        }));
    }
    let (mut allowed, mut took) = (Vec::new(), Vec::new());
    for l in loads {
        let (ok, t) = l.await.unwrap();
        allowed.push(ok);
        took.extend(t);
    }
    took.sort();
    let p99 = took
        .get(took.len() * 99 / 100)
        .map_or(0.0, |d| d.as_secs_f64() * 1e3);
    (allowed, start.elapsed().as_secs_f64(), p99)
}

/// 600 requests a second over three nodes, 60% / 30% / 10%, for 3 s.
async fn uneven(fleet: &[common::TestServer]) -> (f64, f64, f64) {
    let load: Vec<_> = fleet.iter().zip([360.0, 180.0, 60.0]).collect();
    let (allowed, secs, p99) = offer(&load, Duration::from_secs(3)).await;
    (f64::from(allowed.iter().sum::<u32>()), secs, p99)
}

/// What the store holds under `qweb:rl:*`: how many keys, the longest time to live (ms).
fn store_keys(redis: &RedisServer) -> (i64, i64) {
    let n = redis.command(&[
        "EVAL",
        "return #redis.call('KEYS', ARGV[1])",
        "0",
        "qweb:rl:*",
    ]);
    let ttl = redis.command(&[
        "EVAL",
        "local m = -2 for _, k in ipairs(redis.call('KEYS', ARGV[1])) do \
         m = math.max(m, redis.call('PTTL', k)) end return m",
        "0",
        "qweb:rl:*",
    ]);
    let int = |s: String| s.trim_start_matches(':').parse::<i64>().unwrap();
    (int(n), int(ttl))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_under_uneven_load_let_through_the_fleet_rate() {
    let redis = RedisServer::start();
    let fleet: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|n| node(&redis.url(), n, "fleet"))
        .collect();
    for t in &fleet {
        until(Duration::from_secs(5), "connected", || async {
            metric(t, "qweb_fleet_store_up").await == 1.0
        })
        .await;
    }
    let (allowed, secs, p99) = uneven(&fleet).await;
    let expected = RATE * secs + BURST;
    eprintln!(
        "scope = \"fleet\": {allowed} let through in {secs:.2} s ({expected:.0} expected), p99 {p99:.2} ms"
    );
    assert!(
        (allowed - expected).abs() <= 0.1 * expected,
        "fleet: {allowed} let through in {secs:.2} s, {expected:.0} expected"
    );
    let mut leases = 0.0;
    for t in &fleet {
        assert_eq!(metric(t, "qweb_rate_limit_fleet_fallback").await, 0.0);
        leases += metric(t, "qweb_fleet_rate_limit_leases_total").await;
    }
    assert!(leases > 0.0 && leases < 1800.0, "{leases} leases");
    // one key in the store, with a time to live: it is gone soon after the load
    let (n, ttl) = store_keys(&redis);
    assert!(n == 1 && (1..=2_000).contains(&ttl), "{n} keys, {ttl} ms");
    until(Duration::from_secs(3), "the key expires", || async {
        store_keys(&redis).0 == 0
    })
    .await;
    drop(fleet);

    // the control: each node on its own lets through its own rate
    let alone: Vec<_> = ["d", "e", "f"]
        .iter()
        .map(|n| node(&redis.url(), n, "node"))
        .collect();
    let (allowed, secs, p99) = uneven(&alone).await;
    let fleet_rate = RATE * secs + BURST;
    eprintln!("scope = \"node\": {allowed} let through in {secs:.2} s, p99 {p99:.2} ms");
    assert!(
        allowed > 2.0 * fleet_rate,
        "scope = \"node\": {allowed} let through in {secs:.2} s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_store_killed_each_node_limits_at_its_share_and_says_so() {
    let mut redis = RedisServer::start();
    let a = node(&redis.url(), "a", "fleet");
    let b = node(&redis.url(), "b", "fleet");
    // both list both (a lists again within its 5 s heartbeat)
    until(Duration::from_secs(12), "both list a and b", || async {
        nodes(&a).await.len() == 2 && nodes(&b).await.len() == 2
    })
    .await;
    redis.kill();
    for t in [&a, &b] {
        until(Duration::from_secs(5), "the store is away", || async {
            metric(t, "qweb_fleet_store_up").await == 0.0
        })
        .await;
    }
    let (allowed, secs, _) = offer(&[(&a, 200.0), (&b, 120.0)], Duration::from_secs(2)).await;
    // each node at rate / 2, with half the burst
    let expected = RATE / 2.0 * secs + BURST / 2.0;
    eprintln!("store away: {allowed:?} let through in {secs:.2} s ({expected:.0} each expected)");
    for (name, got) in ["a", "b"].iter().zip(&allowed) {
        let got = f64::from(*got);
        assert!(
            (got - expected).abs() <= 0.1 * expected,
            "{name}: {got} let through in {secs:.2} s, {expected:.0} expected"
        );
    }
    for t in [&a, &b] {
        assert_eq!(metric(t, "qweb_rate_limit_fleet_fallback").await, 1.0);
    }
    redis.restart();
    for t in [&a, &b] {
        until(Duration::from_secs(10), "back in the store", || async {
            metric(t, "qweb_rate_limit_fleet_fallback").await == 0.0
        })
        .await;
    }
    let before = metric(&a, "qweb_fleet_rate_limit_leases_total").await;
    let (allowed, _, _) = offer(&[(&a, 50.0)], Duration::from_millis(500)).await;
    assert!(allowed[0] > 0);
    assert!(metric(&a, "qweb_fleet_rate_limit_leases_total").await > before);
    assert_eq!(store_keys(&redis).0, 1, "counted in the store again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_key_of_another_type_fails_the_leases_and_stops_nothing() {
    let redis = RedisServer::start();
    let a = node(&redis.url(), "a", "fleet");
    until(Duration::from_secs(5), "connected", || async {
        metric(&a, "qweb_fleet_store_up").await == 1.0
    })
    .await;
    let _ = offer(&[(&a, 50.0)], Duration::from_millis(300)).await;
    let key = redis.command(&[
        "EVAL",
        "return redis.call('KEYS', ARGV[1])[1]",
        "0",
        "qweb:rl:*",
    ]);
    assert!(key.starts_with("qweb:rl:/:"), "{key}");
    // a hash where the script reads a number: the script fails, the lease with it
    redis.command(&["DEL", &key]);
    redis.command(&["HSET", &key, "tat", "garbage"]);
    let (allowed, _, _) = offer(&[(&a, 100.0)], Duration::from_millis(1500)).await;
    let failures = metric(&a, "qweb_fleet_rate_limit_lease_failures_total").await;
    assert!(failures >= 1.0, "{failures} failures");
    assert!(allowed[0] > 0, "the node decides alone meanwhile");
    // the fleet thread goes on: with the key gone, leases succeed again
    redis.command(&["DEL", &key]);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let _ = offer(&[(&a, 50.0)], Duration::from_millis(300)).await;
    assert_eq!(redis.command(&["TYPE", &key]), "+string");
    assert_eq!(
        metric(&a, "qweb_fleet_rate_limit_lease_failures_total").await,
        failures
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_stops_answering_holds_up_no_request() {
    let redis = RedisServer::start();
    let a = node_with(&redis.url(), "a", "fleet", "timeout = \"300ms\"");
    until(Duration::from_secs(5), "connected", || async {
        metric(&a, "qweb_fleet_store_up").await == 1.0
    })
    .await;
    let _ = offer(&[(&a, 50.0)], Duration::from_millis(300)).await;
    // SIGSTOP: the connection stays open, no lease is answered
    redis.pause();
    let (allowed, secs, p99) = offer(&[(&a, 200.0)], Duration::from_millis(1500)).await;
    redis.resume();
    eprintln!("store paused: {allowed:?} let through in {secs:.2} s, p99 {p99:.2} ms");
    // decided by the node alone (one node seen: the whole rate), none waiting on the store
    assert!(p99 < 250.0, "p99 {p99:.2} ms");
    let expected = RATE * secs + BURST;
    assert!(f64::from(allowed[0]) <= 1.1 * expected, "{allowed:?}");
    assert!(metric(&a, "qweb_fleet_rate_limit_lease_failures_total").await >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_distinct_keys_stay_at_max_keys_here_and_expire_in_the_store() {
    let redis = RedisServer::start();
    let a = common::start_with(
        &format!(
            "workers = 2\n[admin]\naddress = \"127.0.0.1:0\"\n\
             [fleet]\nstore = \"{}\"\nnode_name = \"a\"\n\
             [[route]]\nprefix = \"/\"\nroot = \"{{dir}}/site\"\n\
             rate_limit = {{ rate = \"10/s\", key = \"header:X-User\", max_keys = 50, scope = \"fleet\" }}\n",
            redis.url()
        ),
        |d| std::fs::write(d.join("site").join("x"), "x").unwrap(),
    );
    until(Duration::from_secs(5), "connected", || async {
        metric(&a, "qweb_fleet_store_up").await == 1.0
    })
    .await;
    let client = common::plain_client();
    let url = format!("{}/x", a.http());
    for i in 0..500 {
        let r = client
            .get(&url)
            .header("x-user", format!("u{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "a new key has its budget");
    }
    let m = common::metrics::scrape(a.admin.unwrap()).await;
    assert_eq!(m.value("qweb_rate_limit_keys", &[("route", "/")]), 50.0);
    let (n, ttl) = store_keys(&redis);
    assert!(n <= 500 && (1..=1_200).contains(&ttl), "{n} keys, {ttl} ms");
    until(Duration::from_secs(3), "the keys expire", || async {
        store_keys(&redis).0 == 0
    })
    .await;
}
