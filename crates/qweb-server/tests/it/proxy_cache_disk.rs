//! The proxy cache's disk tier (`[cache] disk`, `path`) against a real origin and real files:
//! a restarted qweb serves what was stored as hits with their age; a corrupt or truncated
//! entry file is never served; a purge reaches the disk and survives a restart; the files stay
//! within `disk` with many keys; a folder that cannot be made leaves qweb serving.

use qweb_testkit as common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::proxy_cache::{cached, get, origin};

/// The entry files in `dir`.
fn entries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "qc"))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits (5 s at most) until `dir` holds `n` entry files.
async fn wait_entries(dir: &Path, n: usize) {
    let end = Instant::now() + Duration::from_secs(5);
    while entries(dir).len() != n {
        assert!(
            Instant::now() < end,
            "{} entry files, not {n}",
            entries(dir).len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The entry file whose key ends with `path`.
fn entry_of(dir: &Path, path: &str) -> PathBuf {
    entries(dir)
        .into_iter()
        .find(|f| {
            let b = std::fs::read(f).unwrap();
            b.windows(path.len() + 1)
                .any(|w| w[1..] == *path.as_bytes() && w[0].is_ascii_digit())
        })
        .unwrap_or_else(|| panic!("no entry file for {path}"))
}

/// Stops `t` (joined: its store, and so its disk writer, is done when this returns).
async fn stop(mut t: common::server::TestServer) {
    tokio::task::spawn_blocking(move || t.shutdown())
        .await
        .unwrap();
}

/// A `[cache]` in `dir` with `extra` keys, and one plain listener on `port`: a key holds the
/// authority, so a restarted qweb must listen where the first one did.
fn config(dir: &Path, port: u16, extra: &str) -> String {
    format!(
        "[cache]\npath = \"{}\"\n{extra}\n[[listener]]\naddress = \"127.0.0.1:{port}\"\n",
        dir.display()
    )
}

/// Fill, stop, start a new qweb on the same folder: the stored response is a hit with an
/// `Age` that counts the time before the restart, and the origin is not asked again.
#[tokio::test]
async fn a_restarted_server_serves_what_was_stored_with_its_age() {
    let up = origin().await;
    let keep = tempfile::tempdir().unwrap();
    let dir = keep.path().join("cache");
    let port = common::free_port();
    let t = cached(up.addr, &config(&dir, port, ""));
    let (s, h, body) = get(&format!("http://127.0.0.1:{port}/fresh/r")).await;
    assert_eq!((s, body.as_str()), (200, "fresh:1"));
    assert_eq!(h["cache-status"], "qweb; fwd=miss; stored");
    wait_entries(&dir, 1).await;
    stop(t).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let t = cached(up.addr, &config(&dir, port, ""));
    let m = t.metrics().await;
    assert_eq!(m.value("qweb_proxy_cache_disk_objects", &[]), 1.0);
    let (s, h, body) = get(&format!("http://127.0.0.1:{port}/fresh/r")).await;
    assert_eq!((s, body.as_str()), (200, "fresh:1"));
    assert_eq!(h["cache-status"], "qweb; hit");
    let age: u64 = h["age"].parse().unwrap();
    assert!((2..60).contains(&age), "age {age}");
    assert_eq!(up.count("/fresh/r"), 1);
    let m = t.metrics().await;
    assert_eq!(m.value("qweb_proxy_cache_disk_hits_total", &[]), 1.0);
}

/// A byte of a stored body flipped on disk while qweb runs (the response evicted from
/// memory, so the next request reads the file) is caught by the checksum: the origin answers,
/// the file is removed. A truncated file is dropped at the next start (its length is not its
/// header's) and never served.
#[tokio::test]
async fn a_corrupt_or_truncated_entry_file_is_never_served() {
    let up = origin().await;
    let keep = tempfile::tempdir().unwrap();
    let dir = keep.path().join("cache");
    let port = common::free_port();
    let small = "memory = \"1MiB\"\nmax_object_size = \"400KiB\"\n";
    let t = cached(up.addr, &config(&dir, port, small));
    let base = format!("http://127.0.0.1:{port}");
    assert_eq!(get(&format!("{base}/fresh/c")).await.2, "fresh:1");
    assert_eq!(get(&format!("{base}/fresh/t")).await.2, "fresh:1");
    wait_entries(&dir, 2).await;
    let f = entry_of(&dir, "/fresh/c");
    let mut bytes = std::fs::read(&f).unwrap();
    // the body's last byte ("fresh:1" ends 4 bytes before the file's end)
    let at = bytes.len() - 5;
    assert_eq!(bytes[at], b'1');
    bytes[at] = b'X';
    std::fs::write(&f, &bytes).unwrap();
    // memory evicts both (4 x 300 KB through 1 MiB), disk keeps them
    for i in 0..4 {
        get(&format!("{base}/big/300000?e={i}")).await;
    }
    let (_, h, body) = get(&format!("{base}/fresh/c")).await;
    assert_eq!(body, "fresh:2", "the corrupt entry is not served: {h:?}");
    assert_eq!(h["cache-status"], "qweb; fwd=miss; stored");
    let m = t.metrics().await;
    assert_eq!(m.value("qweb_proxy_cache_disk_dropped_total", &[]), 1.0);
    // /fresh/t is still good on disk: a disk hit
    let (_, h, body) = get(&format!("{base}/fresh/t")).await;
    assert_eq!(
        (body.as_str(), h["cache-status"].as_str()),
        ("fresh:1", "qweb; hit")
    );
    stop(t).await;
    let f = entry_of(&dir, "/fresh/t");
    let len = std::fs::metadata(&f).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(len - 3)
        .unwrap();
    let t = cached(up.addr, &config(&dir, port, small));
    let m = t.metrics().await;
    assert_eq!(m.value("qweb_proxy_cache_disk_dropped_total", &[]), 1.0);
    assert!(!f.exists(), "removed at the scan");
    let (_, h, body) = get(&format!("http://127.0.0.1:{port}/fresh/t")).await;
    assert_eq!(body, "fresh:2", "the truncated entry is not served: {h:?}");
}

/// A purge by URL and by prefix removes the disk entries: the purged responses do not come
/// back from disk, neither in the running qweb (memory evicted) nor after a restart.
#[tokio::test]
async fn a_purge_reaches_the_disk_and_survives_a_restart() {
    let up = origin().await;
    let keep = tempfile::tempdir().unwrap();
    let dir = keep.path().join("cache");
    let port = common::free_port();
    let t = cached(up.addr, &config(&dir, port, ""));
    let base = format!("http://127.0.0.1:{port}");
    let authority = base.trim_start_matches("http://").to_owned();
    for p in ["/fresh/pa", "/fresh/pp/1", "/fresh/pp/2", "/fresh/kept"] {
        assert_eq!(get(&format!("{base}{p}")).await.2, "fresh:1");
    }
    wait_entries(&dir, 4).await;
    let admin = t.admin.unwrap();
    for q in [
        format!("url=http://{authority}/fresh/pa"),
        format!("prefix=http://{authority}/fresh/pp/"),
    ] {
        let r = common::plain_client()
            .post(format!("http://{admin}/cache/purge?{q}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    wait_entries(&dir, 1).await;
    stop(t).await;
    let _t = cached(up.addr, &config(&dir, port, ""));
    let base = format!("http://127.0.0.1:{port}");
    for p in ["/fresh/pa", "/fresh/pp/1", "/fresh/pp/2"] {
        let (_, h, body) = get(&format!("{base}{p}")).await;
        assert_eq!(body, "fresh:2", "{p} came back: {h:?}");
    }
    let (_, h, _) = get(&format!("{base}/fresh/kept")).await;
    assert_eq!(h["cache-status"], "qweb; hit");
}

/// Many keys through a 1 MiB disk tier: the entry files never sum over it, least recently
/// used go first, and the gauges say so.
#[tokio::test]
async fn the_disk_tier_stays_within_its_bound_with_many_keys() {
    let up = origin().await;
    let keep = tempfile::tempdir().unwrap();
    let dir = keep.path().join("cache");
    let port = common::free_port();
    let extra = "memory = \"1MiB\"\nmax_object_size = \"64KiB\"\ndisk = \"1MiB\"\n";
    let t = cached(up.addr, &config(&dir, port, extra));
    let on_disk = || -> u64 {
        entries(&dir)
            .iter()
            .map(|f| std::fs::metadata(f).map_or(0, |m| m.len()))
            .sum()
    };
    for i in 0..300 {
        let (s, _, body) = get(&format!("http://127.0.0.1:{port}/big/10000?k={i}")).await;
        assert_eq!((s, body.len()), (200, 10000));
        assert!(on_disk() <= 1 << 20, "{i}: {} bytes on disk", on_disk());
    }
    // the writer has taken every store (written, or skipped when its queue was full)
    let end = Instant::now() + Duration::from_secs(10);
    let m = loop {
        let m = t.metrics().await;
        let taken = m.value("qweb_proxy_cache_disk_stored_total", &[])
            + m.value("qweb_proxy_cache_disk_skipped_total", &[]);
        if taken >= 300.0 {
            break m;
        }
        assert!(Instant::now() < end, "the writer took {taken} of 300");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(on_disk() <= 1 << 20);
    let bytes = m.value("qweb_proxy_cache_disk_bytes", &[]);
    let objects = m.value("qweb_proxy_cache_disk_objects", &[]);
    assert!(bytes <= (1 << 20) as f64, "{bytes}");
    assert!((60.0..=105.0).contains(&objects), "{objects}");
    assert_eq!(entries(&dir).len() as f64, objects);
    let stored = m.value("qweb_proxy_cache_disk_stored_total", &[]);
    assert!(stored >= 250.0, "{stored} written");
    assert_eq!(
        m.value("qweb_proxy_cache_disk_evictions_total", &[]),
        stored - objects
    );
}

/// A file where the folder should be (tests run as root, whose writes ignore modes): qweb
/// starts, serves, caches in memory, logs once and counts the error.
#[tokio::test]
async fn an_unusable_disk_folder_keeps_qweb_serving() {
    let up = origin().await;
    let keep = tempfile::tempdir().unwrap();
    let dir = keep.path().join("cache");
    let port = common::free_port();
    std::fs::write(&dir, b"not a folder").unwrap();
    let t = cached(up.addr, &config(&dir, port, ""));
    for i in 0..3 {
        let (s, _, body) = get(&format!("http://127.0.0.1:{port}/fresh/u")).await;
        assert_eq!((s, body.as_str()), (200, "fresh:1"), "request {i}");
    }
    let m = t.metrics().await;
    assert_eq!(m.value("qweb_proxy_cache_disk_errors_total", &[]), 1.0);
    assert_eq!(m.value("qweb_proxy_cache_disk_objects", &[]), 0.0);
    assert_eq!(m.value("qweb_proxy_cache_hits_total", &[]), 2.0);
}
