//! The open-file cache against files changed under it: a file replaced, rewritten in place,
//! removed, grown past the cache's size, or reached through a directory swapped for a symlink
//! to the outside is seen within `file_cache.valid`; the cache stays within its bounds; hits
//! really skip the disk (the counters say so). One test function: the scenarios share one
//! server's counters, so they run in sequence (each server has its own counters, so other
//! tests running meanwhile do not move them).

use qweb_testkit as common;

use common::metrics::scrape;

use std::path::Path;
use std::time::Duration;

const VALID: Duration = Duration::from_millis(300);
const SECRET: &str = "SECRET-outside-the-root-7f3a";

async fn get(c: &reqwest::Client, url: &str) -> (u16, String) {
    let r = c.get(url).send().await.expect("request");
    let s = r.status().as_u16();
    (s, r.text().await.expect("body"))
}

fn write(root: &Path, rel: &str, body: impl AsRef<[u8]>) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, body).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_files_follow_the_disk_within_valid_and_stay_bounded() {
    let s = common::start_with(
        "[admin]\naddress = \"127.0.0.1:0\"\n\
         [file_cache]\nentries = 8\nmax_file_size = \"4KiB\"\nmemory = \"64KiB\"\nvalid = \"300ms\"\n",
        |d| {
            write(&d.join("site"), "a.txt", "version-1");
            write(&d.join("site"), "d/f.txt", "inside");
            write(&d.join("outside"), "f.txt", SECRET);
        },
    );
    let c = common::plain_client();
    let admin = s.admin.unwrap();
    let base = s.http();
    let site = s.site();
    let url = format!("{base}/a.txt");

    // a hit answers without the disk: the counters move, and the file's removal is not seen
    // before `valid`
    assert_eq!(get(&c, &url).await, (200, "version-1".into()));
    let hits = scrape(admin).await.value("qweb_file_cache_hits_total", &[]) as i64;
    assert_eq!(get(&c, &url).await, (200, "version-1".into()));
    assert!((scrape(admin).await.value("qweb_file_cache_hits_total", &[]) as i64) > hits);

    // replaced by rename (same size): seen after `valid`
    write(&site, "a.tmp", "version-2");
    std::fs::rename(site.join("a.tmp"), site.join("a.txt")).unwrap();
    tokio::time::sleep(VALID + Duration::from_millis(100)).await;
    assert_eq!(get(&c, &url).await, (200, "version-2".into()));

    // rewritten in place (same inode, same size, new mtime)
    std::fs::write(site.join("a.txt"), "version-3").unwrap();
    tokio::time::sleep(VALID + Duration::from_millis(100)).await;
    assert_eq!(get(&c, &url).await, (200, "version-3".into()));

    // a range and a conditional request from the cached entry
    let r = c
        .get(&url)
        .header("range", "bytes=2-5")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 206);
    assert_eq!(r.text().await.unwrap(), "rsio");
    let etag = c.get(&url).send().await.unwrap().headers()["etag"].clone();
    let r = c
        .get(&url)
        .header("if-none-match", etag)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 304);

    // grown past max_file_size: streamed from disk, whole
    let big = "x".repeat(100_000);
    std::fs::write(site.join("a.txt"), &big).unwrap();
    tokio::time::sleep(VALID + Duration::from_millis(100)).await;
    let (st, body) = get(&c, &url).await;
    assert_eq!((st, body.len()), (200, big.len()));
    assert_eq!(body, big);

    // removed: 404 after `valid`
    std::fs::remove_file(site.join("a.txt")).unwrap();
    tokio::time::sleep(VALID + Duration::from_millis(100)).await;
    assert_eq!(get(&c, &url).await.0, 404);

    // a cached file whose directory is swapped for a symlink to the outside: the check after
    // `valid` opens by the route's rules (inside_root refuses), never the outside file
    let durl = format!("{base}/d/f.txt");
    assert_eq!(get(&c, &durl).await, (200, "inside".into()));
    std::fs::rename(site.join("d"), s.dir.path().join("d-old")).unwrap();
    std::os::unix::fs::symlink(s.dir.path().join("outside"), site.join("d")).unwrap();
    tokio::time::sleep(VALID + Duration::from_millis(100)).await;
    let (st, body) = get(&c, &durl).await;
    assert!(!body.contains(SECRET), "outside file served from {st}");
    assert_eq!(st, 403);

    // bounds: 40 distinct files through an 8-entry cache
    for i in 0..40 {
        write(&site, &format!("many/{i}.txt"), format!("file {i}"));
    }
    for i in 0..40 {
        let (st, body) = get(&c, &format!("{base}/many/{i}.txt")).await;
        assert_eq!((st, body), (200, format!("file {i}")));
    }
    let entries = scrape(admin).await.value("qweb_file_cache_entries", &[]) as i64;
    let bytes = scrape(admin).await.value("qweb_file_cache_bytes", &[]) as i64;
    assert!((1..=8).contains(&entries), "{entries} entries held");
    assert!(bytes <= 64 << 10, "{bytes} bytes held");
    let invalidations = scrape(admin)
        .await
        .value("qweb_file_cache_invalidations_total", &[]) as i64;
    assert!(invalidations >= 4, "{invalidations} invalidations");
}

#[test]
fn file_cache_config_defaults_and_bounds() {
    let c = qweb_server::Config::from_str_at("workers = 1\n", None).unwrap();
    assert_eq!(
        c.file_cache,
        qweb_server::config::FileCacheConfig::default()
    );
    assert_eq!(c.file_cache.entries, 1024);
    assert_eq!(c.file_cache.valid, Duration::from_secs(1));
    for (text, key) in [
        (
            "[file_cache]\nmax_file_size = \"32MiB\"\n",
            "file_cache.max_file_size",
        ),
        ("[file_cache]\nvalid = \"0s\"\n", "file_cache.valid"),
        ("[file_cache]\nmemory = \"1KiB\"\n", "file_cache.memory"),
        ("[file_cache]\nentries = 99999999\n", "file_cache.entries"),
    ] {
        let e = qweb_server::Config::from_str_at(text, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("key `{key}`")), "{text}: {e}");
    }
    let off = qweb_server::Config::from_str_at("[file_cache]\nentries = 0\n", None).unwrap();
    assert_eq!(off.file_cache.entries, 0);
}
