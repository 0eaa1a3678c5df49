//! `[fleet]` against a real `redis-server` (the test kit's `redis`): two or three qweb nodes
//! in one test share cache purges and list each other; a store killed, restarted, paused or
//! silent never stops a node from serving, and a purge answers within `fleet.timeout`.

use qweb_testkit as common;

use std::time::{Duration, Instant};

use common::redis::{RedisServer, SilentStore};

use crate::proxy_cache::{get_with, origin};

/// The name every node's cached route is asked under: the nodes share cache keys.
const HOST: &str = "shop.test";

fn node(up: std::net::SocketAddr, store: &str, name: &str, extra: &str) -> common::TestServer {
    common::start_with(
        &format!(
            "workers = 2\n[admin]\naddress = \"127.0.0.1:0\"\n\
             [fleet]\nstore = \"{store}\"\nnode_name = \"{name}\"\n{extra}\n\
             [[route]]\nprefix = \"/\"\nupstreams = [\"{up}\"]\ncache = {{}}\n"
        ),
        |_| {},
    )
}

/// The `Cache-Status` and body of a GET of `path` on `t`, asked as [`HOST`].
async fn get(t: &common::TestServer, path: &str) -> (String, String) {
    let (s, h, body) = get_with(&format!("{}{path}", t.http()), &[("host", HOST)]).await;
    assert_eq!(s, 200, "{body}");
    (h.get("cache-status").cloned().unwrap_or_default(), body)
}

/// `POST /cache/purge?url=http://HOST{path}` on `t`'s admin listener: the answer, and how long
/// it took.
async fn purge(t: &common::TestServer, path: &str) -> (serde_json::Value, Duration) {
    let admin = t.admin.unwrap();
    let start = Instant::now();
    let r = common::plain_client()
        .post(format!(
            "http://{admin}/cache/purge?url=http://{HOST}{path}"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    (v, start.elapsed())
}

async fn admin_get(t: &common::TestServer, path: &str) -> String {
    common::plain_client()
        .get(format!("http://{}{path}", t.admin.unwrap()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

async fn fleet_status(t: &common::TestServer) -> serde_json::Value {
    let doc: serde_json::Value = serde_json::from_str(&admin_get(t, "/status.json").await).unwrap();
    doc["fleet"].clone()
}

/// A sample of `/metrics` (the test kit's strict scrape; 0 when absent).
pub(crate) async fn metric(t: &common::TestServer, name: &str) -> f64 {
    common::metrics::scrape(t.admin.unwrap())
        .await
        .get(name, &[])
        .unwrap_or(0.0)
}

/// Waits up to `within` for `cond`; panics naming `what` when it does not come.
pub(crate) async fn until<F, Fut>(within: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if cond().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: not within {within:?}");
}

/// The names of the nodes `t` lists.
pub(crate) async fn nodes(t: &common::TestServer) -> Vec<String> {
    let f = fleet_status(t).await;
    let mut names: Vec<String> = f["nodes"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|n| n["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_on_one_node_reaches_the_others_and_the_nodes_list_each_other() {
    let redis = RedisServer::start();
    let up = origin().await;
    let a = node(up.addr, &redis.url(), "a", "");
    let b = node(up.addr, &redis.url(), "b", "");
    let c = node(up.addr, &redis.url(), "c", "");
    // heartbeats: every node lists the three (the list is refreshed every 5 s)
    until(Duration::from_secs(12), "a lists a, b and c", || async {
        nodes(&a).await == ["a", "b", "c"]
    })
    .await;
    let f = fleet_status(&a).await;
    assert_eq!(
        (f["node"].as_str(), f["connected"].as_bool()),
        (Some("a"), Some(true))
    );
    assert!(f["down_since"].is_null(), "{f}");
    let beat: serde_json::Value =
        serde_json::from_str(&redis.command(&["GET", "qweb:node:b"])).unwrap();
    assert_eq!(beat["pid"].as_u64(), Some(u64::from(std::process::id())));
    assert!(
        beat["started"].as_u64().is_some() && beat["version"].is_string(),
        "{beat}"
    );
    let ttl: i64 = redis
        .command(&["TTL", "qweb:node:b"])
        .trim_start_matches(':')
        .parse()
        .unwrap();
    assert!((1..=15).contains(&ttl), "{ttl}");

    for t in [&a, &b, &c] {
        assert_eq!(get(t, "/fresh/f").await.0, "qweb; fwd=miss; stored");
        assert_eq!(get(t, "/fresh/f").await.0, "qweb; hit");
    }
    let (answer, _) = purge(&b, "/fresh/f").await;
    assert_eq!(answer, serde_json::json!({ "purged": 1, "fleet": true }));
    for t in [&a, &c] {
        until(Duration::from_secs(5), "the purge is applied", || async {
            metric(t, "qweb_fleet_purges_received_total").await == 1.0
        })
        .await;
        assert_eq!(get(t, "/fresh/f").await.0, "qweb; fwd=miss; stored");
    }
    assert_eq!(get(&b, "/fresh/f").await.0, "qweb; fwd=miss; stored");
    // a node does not apply its own purge twice
    assert_eq!(metric(&b, "qweb_fleet_purges_received_total").await, 0.0);
    assert_eq!(metric(&b, "qweb_fleet_purges_published_total").await, 1.0);
    assert_eq!(metric(&b, "qweb_fleet_store_up").await, 1.0);
    let m = common::metrics::scrape(b.admin.unwrap()).await;
    assert!(m.has_type("qweb_fleet_store_up", "gauge"));
    for family in [
        "qweb_fleet_purges_published",
        "qweb_fleet_purges_received",
        "qweb_fleet_purges_unpublished",
        "qweb_fleet_errors",
        "qweb_fleet_acme_refused",
    ] {
        assert!(m.has_type(family, "counter"), "{family}");
    }
    // the other nodes' entries are gone, not refetched behind the test's back
    assert_eq!(up.count("/fresh/f"), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_serve_alone_while_the_store_is_killed_and_rejoin_when_it_is_back() {
    let mut redis = RedisServer::start();
    let up = origin().await;
    let a = node(up.addr, &redis.url(), "a", "");
    let b = node(up.addr, &redis.url(), "b", "");
    until(Duration::from_secs(12), "a lists a and b", || async {
        nodes(&a).await == ["a", "b"]
    })
    .await;
    assert_eq!(get(&a, "/fresh/k").await.0, "qweb; fwd=miss; stored");

    redis.kill();
    until(Duration::from_secs(5), "a sees the store down", || async {
        fleet_status(&a).await["connected"] == false
    })
    .await;
    let f = fleet_status(&a).await;
    assert!(f["down_since"].as_u64().is_some(), "{f}");
    assert_eq!(metric(&a, "qweb_fleet_store_up").await, 0.0);
    assert!(metric(&a, "qweb_fleet_errors_total").await >= 1.0);
    // serving from the cache, purging locally
    assert_eq!(get(&a, "/fresh/k").await.0, "qweb; hit");
    let (answer, took) = purge(&a, "/fresh/k").await;
    assert_eq!(answer, serde_json::json!({ "purged": 1, "fleet": false }));
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert_eq!(metric(&a, "qweb_fleet_purges_unpublished_total").await, 1.0);
    assert_eq!(get(&a, "/fresh/k").await.0, "qweb; fwd=miss; stored");

    // back on the same port: both reconnect (backoff at most 5 s) and write their heartbeats
    redis.restart();
    let back = Instant::now();
    until(Duration::from_secs(10), "both rejoin", || async {
        fleet_status(&a).await["connected"] == true
            && fleet_status(&b).await["connected"] == true
            && redis.command(&["EXISTS", "qweb:node:a"]) == ":1"
            && redis.command(&["EXISTS", "qweb:node:b"]) == ":1"
    })
    .await;
    eprintln!("rejoined {:?} after the restart", back.elapsed());
    assert_eq!(get(&b, "/fresh/k").await.0, "qweb; fwd=miss; stored");
    let (answer, _) = purge(&a, "/fresh/k").await;
    assert_eq!(answer, serde_json::json!({ "purged": 1, "fleet": true }));
    until(Duration::from_secs(5), "b applies the purge", || async {
        metric(&b, "qweb_fleet_purges_received_total").await == 1.0
    })
    .await;
    assert_eq!(get(&b, "/fresh/k").await.0, "qweb; fwd=miss; stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_store_holds_up_neither_the_start_nor_a_purge() {
    let silent = SilentStore::start();
    let up = origin().await;
    let start = Instant::now();
    let a = node(up.addr, &silent.url(), "a", "timeout = \"500ms\"");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(get(&a, "/fresh/s").await.0, "qweb; fwd=miss; stored");
    assert_eq!(get(&a, "/fresh/s").await.0, "qweb; hit");
    let (answer, took) = purge(&a, "/fresh/s").await;
    assert_eq!(answer, serde_json::json!({ "purged": 1, "fleet": false }));
    assert!(took < Duration::from_secs(1), "{took:?}");
    let f = fleet_status(&a).await;
    assert_eq!(f["connected"], false, "{f}");
    assert!(f["down_since"].as_u64().is_some(), "{f}");
    // each try ends within the timeout: errors count up while the store says nothing
    until(Duration::from_secs(5), "the tries time out", || async {
        metric(&a, "qweb_fleet_errors_total").await >= 2.0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_waits_at_most_the_timeout_on_a_store_that_stops_answering() {
    let redis = RedisServer::start();
    let up = origin().await;
    let a = node(up.addr, &redis.url(), "a", "timeout = \"500ms\"");
    until(Duration::from_secs(10), "a connects", || async {
        fleet_status(&a).await["connected"] == true
    })
    .await;
    assert_eq!(get(&a, "/fresh/p").await.0, "qweb; fwd=miss; stored");
    // SIGSTOP: the connection stays open, nothing answers on it
    redis.pause();
    let (answer, took) = purge(&a, "/fresh/p").await;
    redis.resume();
    assert_eq!(answer["purged"], 1, "{answer}");
    assert!(took < Duration::from_millis(1500), "{took:?}");
    assert_eq!(answer["fleet"], false, "{answer}");
    assert_eq!(get(&a, "/fresh/p").await.0, "qweb; fwd=miss; stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rediss_store_whose_handshake_fails_leaves_the_node_serving() {
    // a plain Redis behind rediss://: the TLS handshake fails, the node says so and retries
    // (the fleet thread lives on: no panic for want of a TLS provider)
    let redis = RedisServer::start();
    let up = origin().await;
    let url = redis.url().replace("redis://", "rediss://");
    let a = node(up.addr, &url, "a", "timeout = \"500ms\"");
    until(Duration::from_secs(8), "two failed tries", || async {
        metric(&a, "qweb_fleet_errors_total").await >= 2.0
    })
    .await;
    let f = fleet_status(&a).await;
    assert_eq!(f["connected"], false, "{f}");
    assert_eq!(get(&a, "/fresh/t").await.0, "qweb; fwd=miss; stored");
    assert_eq!(redis.command(&["EXISTS", "qweb:node:a"]), ":0");
}

/// The HTML `/status` in a real browser lists the nodes (as text) and the store's state.
#[test]
fn the_status_page_lists_the_nodes() {
    let Some(browser) = common::browser::Chromium::find() else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let redis = RedisServer::start();
    let up = rt.block_on(origin());
    let a = node(up.addr, &redis.url(), "a", "");
    let _b = node(up.addr, &redis.url(), "<b>b</b>", "");
    rt.block_on(until(Duration::from_secs(12), "a lists both", || async {
        nodes(&a).await.len() == 2
    }));
    let dom = browser.dump_dom(&format!("http://{}/status", a.admin.unwrap()), Some(3000));
    assert!(dom.contains("<b id=\"fleet-node\">a</b>"), "{dom}");
    assert!(dom.contains("class=\"pill ok\">connected</span>"), "{dom}");
    assert!(dom.contains("<tr><td>a</td>"), "{dom}");
    assert!(dom.contains("<tr><td>&lt;b&gt;b&lt;/b&gt;</td>"), "{dom}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_list_is_bounded_and_takes_what_the_store_holds_as_text() {
    let redis = RedisServer::start();
    // 1100 heartbeats, one of them not JSON, one a JSON array
    let mut args = vec!["MSET".to_owned()];
    for i in 0..1100 {
        args.push(format!("qweb:node:fake{i:04}"));
        args.push(match i {
            0 => "not json".to_owned(),
            1 => "[1,2]".to_owned(),
            _ => format!("{{\"pid\":{i}}}"),
        });
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(redis.command(&args), "+OK");
    let up = origin().await;
    let a = node(up.addr, &redis.url(), "a", "");
    until(Duration::from_secs(12), "a lists 1024 nodes", || async {
        nodes(&a).await.len() == 1024
    })
    .await;
    // which 1024 of the 1101 keys SCAN gave is not fixed: the malformed two are checked alone
    assert_eq!(redis.command(&["FLUSHALL"]), "+OK");
    let malformed = [
        "MSET",
        "qweb:node:fake0000",
        "not json",
        "qweb:node:fake0001",
        "[1,2]",
    ];
    assert_eq!(redis.command(&malformed), "+OK");
    until(
        Duration::from_secs(12),
        "a lists itself and the two",
        || async { nodes(&a).await == ["a", "fake0000", "fake0001"] },
    )
    .await;
    let f = fleet_status(&a).await;
    let list = f["nodes"].as_array().unwrap();
    let first = list.iter().find(|n| n["name"] == "fake0000").unwrap();
    assert_eq!(first, &serde_json::json!({ "name": "fake0000" }));
    let second = list.iter().find(|n| n["name"] == "fake0001").unwrap();
    assert_eq!(second, &serde_json::json!({ "name": "fake0001" }));
    // a purge message that is not one is dropped and counted
    redis.command(&["PUBLISH", "qweb:purge", "{\"kind\":\"url\"}"]);
    redis.command(&["PUBLISH", "qweb:purge", "garbage"]);
    until(
        Duration::from_secs(5),
        "the bad messages are counted",
        || async { metric(&a, "qweb_fleet_errors_total").await >= 2.0 },
    )
    .await;
    assert_eq!(metric(&a, "qweb_fleet_purges_received_total").await, 0.0);
    assert_eq!(fleet_status(&a).await["connected"], true);
}
