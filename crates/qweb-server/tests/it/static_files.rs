//! Static files over real HTTPS (HTTP/1.1 and HTTP/2) and plain HTTP: GET and HEAD,
//! Content-Type, index files and directory redirects, errors, conditional requests, byte
//! ranges, large files, path traversal, symlinks and FIFOs.
#![allow(unsafe_code)] // libc calls on test processes and files; each block has its SAFETY note

use qweb_testkit as common;

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{client, TestServer, BOTH};
use reqwest::header::HeaderMap;

const SECRET: &str = "TOP-SECRET-7c1f0e9a-do-not-serve";

fn write(root: &Path, rel: &str, body: impl AsRef<[u8]>) {
    let p = root.join(rel);
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(p, body).unwrap();
}

/// Sets a file's modification time (so that dates in tests do not depend on the clock or on
/// the file system's timestamp granularity).
fn set_mtime(path: &Path, t: SystemTime) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_modified(t).unwrap();
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> &'a str {
    h.get(name)
        .unwrap_or_else(|| panic!("no {name} header in {h:?}"))
        .to_str()
        .unwrap()
}

/// `count` pseudo-random bytes (xorshift64*), deterministic for a seed.
fn pseudo_random(count: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(count + 8);
    while out.len() < count {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(count);
    out
}

/// Sends one raw HTTP/1.1 request on the plain listener and returns the whole answer.
async fn raw_get(t: &TestServer, target: &str) -> String {
    let req = format!("GET {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    let out = common::raw_exchange(t.addrs[1], req.as_bytes(), Duration::from_secs(10)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// The status code of a raw HTTP/1.1 answer.
fn raw_status(answer: &str) -> u16 {
    let line = answer.lines().next().unwrap_or("");
    assert!(
        line.starts_with("HTTP/1.1 "),
        "not an HTTP answer: {answer:?}"
    );
    line[9..12].parse().unwrap()
}

#[tokio::test]
async fn get_and_head_with_content_types() {
    let t = common::start();
    let site = t.site();
    let files: &[(&str, &[u8], &[&str])] = &[
        ("page.html", b"<h1>hi</h1>", &["text/html"]),
        ("style.css", b"body{}", &["text/css"]),
        (
            "app.js",
            b"let x = 1;",
            // mime_guess >= 2.0.5 says text/javascript (RFC 9239); older versions said
            // application/javascript.
            &["text/javascript", "application/javascript"],
        ),
        ("data.json", b"{\"a\":1}", &["application/json"]),
        ("notes.txt", b"plain", &["text/plain"]),
        ("img.png", b"\x89PNG\r\n\x1a\nfake", &["image/png"]),
        (
            "blob.qwebunknownext",
            b"\x00\x01\x02",
            &["application/octet-stream"],
        ),
        ("noext", b"no extension", &["application/octet-stream"]),
    ];
    for (name, body, _) in files {
        write(&site, name, body);
    }
    for proto in BOTH {
        let c = client(&t.cert(), proto);
        for (name, body, types) in files {
            let url = format!("{}/{name}", t.https());
            let get = c.get(&url).send().await.unwrap();
            assert_eq!(get.status(), 200, "{proto:?} {name}");
            let gh = get.headers().clone();
            let ct = header(&gh, "content-type");
            assert!(types.contains(&ct), "{proto:?} {name}: content-type {ct}");
            assert_eq!(header(&gh, "content-length"), body.len().to_string());
            assert_eq!(&get.bytes().await.unwrap()[..], *body, "{proto:?} {name}");

            let head = c.head(&url).send().await.unwrap();
            assert_eq!(head.status(), 200, "{proto:?} HEAD {name}");
            let hh = head.headers().clone();
            for h in [
                "content-type",
                "content-length",
                "etag",
                "last-modified",
                "accept-ranges",
            ] {
                assert_eq!(
                    header(&hh, h),
                    header(&gh, h),
                    "{proto:?} HEAD {name}: {h} differs from GET"
                );
            }
            assert!(
                head.bytes().await.unwrap().is_empty(),
                "{proto:?} HEAD {name} has a body"
            );
        }
    }
}

#[tokio::test]
async fn head_over_raw_http1_has_length_and_no_body() {
    // reqwest would hide a body sent after a HEAD answer; read the raw bytes instead.
    let t = common::start();
    write(&t.site(), "f.txt", "0123456789");
    let req = b"HEAD /f.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let out = common::raw_exchange(t.addrs[1], req, Duration::from_secs(10)).await;
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(
        text.to_ascii_lowercase()
            .contains("\r\ncontent-length: 10\r\n"),
        "{text}"
    );
    assert!(
        text.ends_with("\r\n\r\n"),
        "HEAD answer carries a body: {text:?}"
    );
}

#[tokio::test]
async fn index_redirects_and_errors() {
    let t = common::start();
    let site = t.site();
    write(&site, "index.html", "root index");
    write(&site, "dir/index.html", "dir index");
    write(&site, "dir/sub/index.html", "sub index");
    write(&site, "file.txt", "f");
    std::fs::create_dir_all(site.join("noindex")).unwrap();
    write(&site, "noindex/other.txt", "not an index");
    for proto in BOTH {
        let c = client(&t.cert(), proto);
        let base = t.https();

        let r = c.get(format!("{base}/")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(header(r.headers(), "content-type"), "text/html");
        assert_eq!(r.text().await.unwrap(), "root index");

        for (path, body) in [("/dir/", "dir index"), ("/dir/sub/", "sub index")] {
            let r = c.get(format!("{base}{path}")).send().await.unwrap();
            assert_eq!(r.status(), 200, "{proto:?} {path}");
            assert_eq!(header(r.headers(), "content-type"), "text/html");
            assert_eq!(r.text().await.unwrap(), body);
        }

        for (path, location) in [
            ("/dir", "/dir/"),
            ("/dir?x=1&y=two", "/dir/?x=1&y=two"),
            ("/dir/sub", "/dir/sub/"),
            ("/noindex", "/noindex/"),
        ] {
            let r = c.get(format!("{base}{path}")).send().await.unwrap();
            assert_eq!(r.status(), 301, "{proto:?} {path}");
            assert_eq!(
                header(r.headers(), "location"),
                location,
                "{proto:?} {path}"
            );
        }

        let r = c.get(format!("{base}/noindex/")).send().await.unwrap();
        assert_eq!(r.status(), 403, "{proto:?} directory without index");
        let body = r.text().await.unwrap();
        assert!(!body.contains("other.txt"), "directory listed: {body}");

        for path in ["/missing.html", "/dir/missing", "/missing/", "/file.txt/x"] {
            let r = c.get(format!("{base}{path}")).send().await.unwrap();
            assert_eq!(r.status(), 404, "{proto:?} {path}");
        }

        for method in [
            reqwest::Method::POST,
            reqwest::Method::PUT,
            reqwest::Method::DELETE,
            reqwest::Method::PATCH,
        ] {
            for path in ["/file.txt", "/missing"] {
                let r = c
                    .request(method.clone(), format!("{base}{path}"))
                    .body("x")
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 405, "{proto:?} {method} {path}");
                assert_eq!(header(r.headers(), "allow"), "GET, HEAD");
            }
        }
        // the file is still there and unchanged after DELETE/PUT
        let r = c.get(format!("{base}/file.txt")).send().await.unwrap();
        assert_eq!(r.text().await.unwrap(), "f");
    }
}

#[tokio::test]
async fn directory_redirect_never_points_to_another_host() {
    // `GET //evil.example` for an existing directory `evil.example`: a Location of
    // `//evil.example/` would be a scheme-relative URL, i.e. a redirect to another host.
    let t = common::start();
    std::fs::create_dir_all(t.site().join("evil.example")).unwrap();
    for (target, location) in [
        ("//evil.example", "/evil.example/"),
        ("///evil.example?q=1", "/evil.example/?q=1"),
        ("/evil.example", "/evil.example/"),
    ] {
        let answer = raw_get(&t, target).await;
        assert_eq!(raw_status(&answer), 301, "{target}:\n{answer}");
        let got = answer
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("location")
                    .then(|| v.trim().to_owned())
            })
            .unwrap_or_else(|| panic!("{target}: no Location:\n{answer}"));
        assert_eq!(got, location, "{target}");
        assert!(
            !got.starts_with("//"),
            "{target}: redirect to another host: {got}"
        );
    }
}

#[tokio::test]
async fn conditional_requests() {
    let t = common::start();
    let path = t.site().join("c.txt");
    write(&t.site(), "c.txt", "conditional body");
    let mtime = UNIX_EPOCH + Duration::from_secs(1_600_000_000);
    set_mtime(&path, mtime);
    let date = httpdate::fmt_http_date(mtime);
    let before = httpdate::fmt_http_date(mtime - Duration::from_secs(3600));
    let after = httpdate::fmt_http_date(mtime + Duration::from_secs(3600));
    for proto in BOTH {
        let c = client(&t.cert(), proto);
        let url = format!("{}/c.txt", t.https());
        let r = c.get(&url).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let etag = header(r.headers(), "etag").to_owned();
        assert!(
            etag.starts_with('"') && etag.ends_with('"') && etag.len() > 2,
            "{etag}"
        );
        assert_eq!(header(r.headers(), "last-modified"), date);

        let not_modified: Vec<Vec<(&str, String)>> = vec![
            vec![("if-none-match", etag.clone())],
            vec![("if-none-match", format!("\"nope\", {etag}, \"other\""))],
            vec![("if-none-match", format!("W/{etag}"))],
            vec![("if-none-match", "*".into())],
            vec![("if-modified-since", date.clone())],
            vec![("if-modified-since", after.clone())],
            // If-None-Match wins over If-Modified-Since
            vec![
                ("if-none-match", etag.clone()),
                ("if-modified-since", before.clone()),
            ],
        ];
        for hs in &not_modified {
            let mut req = c.get(&url);
            for (k, v) in hs {
                req = req.header(*k, v);
            }
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 304, "{proto:?} {hs:?}");
            assert_eq!(header(r.headers(), "etag"), etag);
            assert!(
                r.bytes().await.unwrap().is_empty(),
                "{proto:?} {hs:?}: 304 with a body"
            );
        }

        let modified: Vec<Vec<(&str, String)>> = vec![
            vec![("if-none-match", "\"nope\"".into())],
            vec![("if-none-match", "\"a\", \"b\"".into())],
            vec![("if-modified-since", before.clone())],
            vec![("if-modified-since", "not a date".into())],
            // a non-matching If-None-Match makes If-Modified-Since irrelevant
            vec![
                ("if-none-match", "\"nope\"".into()),
                ("if-modified-since", after.clone()),
            ],
            vec![("if-match", etag.clone())],
            vec![("if-match", "*".into())],
            vec![("if-unmodified-since", date.clone())],
        ];
        for hs in &modified {
            let mut req = c.get(&url);
            for (k, v) in hs {
                req = req.header(*k, v);
            }
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 200, "{proto:?} {hs:?}");
            assert_eq!(r.text().await.unwrap(), "conditional body");
        }

        for hs in [
            vec![("if-match", "\"nope\"".to_owned())],
            vec![("if-match", format!("W/{etag}"))],
            vec![("if-unmodified-since", before.clone())],
        ] {
            let mut req = c.get(&url);
            for (k, v) in &hs {
                req = req.header(*k, v);
            }
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 412, "{proto:?} {hs:?}");
            assert!(
                !r.text().await.unwrap().contains("conditional body"),
                "412 carried the file"
            );
        }
        // HEAD is conditional too
        let r = c
            .head(&url)
            .header("if-none-match", &etag)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 304);
    }
}

#[tokio::test]
async fn etag_changes_when_the_file_changes() {
    // without the open-file cache, which sees changes only after `file_cache.valid`
    // (tests/file_cache.rs)
    let t = common::start_with("[file_cache]\nentries = 0\n", |_| {});
    let path = t.site().join("e.txt");
    write(&t.site(), "e.txt", "version one");
    set_mtime(&path, UNIX_EPOCH + Duration::from_secs(1_600_000_000));
    for proto in BOTH {
        let c = client(&t.cert(), proto);
        let url = format!("{}/e.txt", t.https());
        let etag = |r: &reqwest::Response| header(r.headers(), "etag").to_owned();

        let r = c.get(&url).send().await.unwrap();
        let first = etag(&r);
        // stable while the file is unchanged
        let r = c.get(&url).send().await.unwrap();
        assert_eq!(etag(&r), first);

        // same size, new contents and a new modification time
        std::fs::write(&path, "version two").unwrap();
        set_mtime(&path, UNIX_EPOCH + Duration::from_secs(1_600_000_100));
        let r = c
            .get(&url)
            .header("if-none-match", &first)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{proto:?}: stale ETag still matched");
        let second = etag(&r);
        assert_ne!(second, first);
        assert_eq!(r.text().await.unwrap(), "version two");

        // new size, same modification time
        std::fs::write(&path, "version three, longer").unwrap();
        set_mtime(&path, UNIX_EPOCH + Duration::from_secs(1_600_000_100));
        let r = c
            .get(&url)
            .header("if-none-match", &second)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{proto:?}: stale ETag still matched");
        assert_ne!(etag(&r), second);
        assert_eq!(r.text().await.unwrap(), "version three, longer");

        // back to version one for the next protocol
        std::fs::write(&path, "version one").unwrap();
        set_mtime(&path, UNIX_EPOCH + Duration::from_secs(1_600_000_000));
        let r = c.get(&url).send().await.unwrap();
        assert_eq!(etag(&r), first);
    }
}

#[tokio::test]
async fn byte_ranges() {
    let t = common::start();
    write(&t.site(), "r.txt", "0123456789");
    for proto in BOTH {
        let c = client(&t.cert(), proto);
        let url = format!("{}/r.txt", t.https());
        let r = c.get(&url).send().await.unwrap();
        assert_eq!(header(r.headers(), "accept-ranges"), "bytes");
        let etag = header(r.headers(), "etag").to_owned();

        for (range, content_range, body) in [
            ("bytes=0-4", "bytes 0-4/10", "01234"),
            ("bytes=5-", "bytes 5-9/10", "56789"),
            ("bytes=-3", "bytes 7-9/10", "789"),
            ("bytes=9-9", "bytes 9-9/10", "9"),
            ("bytes=3-100", "bytes 3-9/10", "3456789"),
            ("bytes=-100", "bytes 0-9/10", "0123456789"),
        ] {
            let r = c.get(&url).header("range", range).send().await.unwrap();
            assert_eq!(r.status(), 206, "{proto:?} {range}");
            assert_eq!(
                header(r.headers(), "content-range"),
                content_range,
                "{range}"
            );
            assert_eq!(
                header(r.headers(), "content-length"),
                body.len().to_string(),
                "{range}"
            );
            assert_eq!(r.text().await.unwrap(), body, "{proto:?} {range}");
        }

        for range in ["bytes=999-", "bytes=10-", "bytes=-0"] {
            let r = c.get(&url).header("range", range).send().await.unwrap();
            assert_eq!(r.status(), 416, "{proto:?} {range}");
            assert_eq!(header(r.headers(), "content-range"), "bytes */10");
            assert!(!r.text().await.unwrap().contains("0123456789"));
        }

        // malformed ranges and other units: the whole file (several ranges: http_details.rs)
        for range in ["bytes=5-2", "bytes=x-1", "items=0-1", "bytes=0-1,x"] {
            let r = c.get(&url).header("range", range).send().await.unwrap();
            assert_eq!(r.status(), 200, "{proto:?} {range}");
            assert!(r.headers().get("content-range").is_none(), "{range}");
            assert_eq!(header(r.headers(), "content-length"), "10");
            assert_eq!(r.text().await.unwrap(), "0123456789", "{range}");
        }

        // If-Range: a stale validator gets the whole file, the current one the range
        let r = c
            .get(&url)
            .header("range", "bytes=0-4")
            .header("if-range", "\"stale\"")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{proto:?} stale If-Range");
        assert!(r.headers().get("content-range").is_none());
        assert_eq!(r.text().await.unwrap(), "0123456789");
        let r = c
            .get(&url)
            .header("range", "bytes=0-4")
            .header("if-range", &etag)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 206, "{proto:?} current If-Range");
        assert_eq!(r.text().await.unwrap(), "01234");

        // HEAD with a range: the partial headers, no body
        let r = c
            .head(&url)
            .header("range", "bytes=2-5")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 206);
        assert_eq!(header(r.headers(), "content-range"), "bytes 2-5/10");
        assert_eq!(header(r.headers(), "content-length"), "4");
        assert!(r.bytes().await.unwrap().is_empty());
    }
}

#[tokio::test]
async fn large_file_is_byte_identical() {
    let t = common::start();
    let data = pseudo_random(5 * 1024 * 1024 + 123, 0x5eed);
    write(&t.site(), "big.bin", &data);
    for proto in BOTH {
        let c = client(&t.cert(), proto);
        let url = format!("{}/big.bin", t.https());
        let r = c.get(&url).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(
            header(r.headers(), "content-length"),
            data.len().to_string()
        );
        let body = r.bytes().await.unwrap();
        assert_eq!(body.len(), data.len(), "{proto:?}");
        assert!(body[..] == data[..], "{proto:?}: large body differs");

        // a range in the middle spanning several read chunks
        let (start, end) = (1_000_003usize, 3_500_007usize);
        let r = c
            .get(&url)
            .header("range", format!("bytes={start}-{end}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 206);
        assert_eq!(
            header(r.headers(), "content-range"),
            format!("bytes {start}-{end}/{}", data.len())
        );
        let body = r.bytes().await.unwrap();
        assert_eq!(body.len(), end - start + 1);
        assert!(
            body[..] == data[start..=end],
            "{proto:?}: range body differs"
        );

        // the tail of the file
        let r = c
            .get(&url)
            .header("range", "bytes=-70000")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 206);
        let body = r.bytes().await.unwrap();
        assert!(
            body[..] == data[data.len() - 70000..],
            "{proto:?}: suffix differs"
        );
    }
    // plain HTTP as well
    let r = common::plain_client()
        .get(format!("{}/big.bin", t.http()))
        .send()
        .await
        .unwrap();
    let body = r.bytes().await.unwrap();
    assert!(body[..] == data[..], "plain: large body differs");
}

#[tokio::test]
async fn path_traversal_is_impossible() {
    let t = common::start_with("", |dir| {
        // outside the document root
        write(dir, "secret", SECRET);
        write(dir, "outside/secret", SECRET);
        // inside it
        let site = dir.join("site");
        write(&site, "index.html", "public index");
        write(&site, "a/b/page.txt", "public page");
        std::os::unix::fs::symlink(dir.join("secret"), site.join("leak")).unwrap();
        std::os::unix::fs::symlink(dir.join("secret"), site.join("leak.txt")).unwrap();
        std::os::unix::fs::symlink(dir.join("outside"), site.join("outdir")).unwrap();
        std::os::unix::fs::symlink("../secret", site.join("rel-leak")).unwrap();
        std::os::unix::fs::symlink("a/b/page.txt", site.join("inside")).unwrap();
        // absolute symlinks are refused even when they point inside (RESOLVE_BENEATH)
        std::os::unix::fs::symlink(site.join("a/b/page.txt"), site.join("abs-inside")).unwrap();
        std::os::unix::fs::symlink("a/b", site.join("linkdir")).unwrap();
    });
    // The secret really is reachable on disk next to the site: a failed traversal is not a typo.
    assert_eq!(
        std::fs::read_to_string(t.site().join("../secret")).unwrap(),
        SECRET
    );

    let traversals = [
        "/../secret",
        "/../../secret",
        "/a/../../secret",
        "/a/b/../../../secret",
        "/%2e%2e/secret",
        "/%2E%2E/secret",
        "/.%2e/secret",
        "/a/%2e%2e%2f%2e%2e%2fsecret",
        "/a%2f..%2f..%2fsecret",
        "/..%5csecret",
        "/a/..%5c..%5csecret",
        "/a%00b",
        "/secret%00.html",
        "/..",
        "/../",
        "/../site/index.html",
    ];
    for target in traversals {
        let answer = raw_get(&t, target).await;
        let status = raw_status(&answer);
        assert!(
            matches!(status, 400 | 403 | 404),
            "{target}: status {status}\n{answer}"
        );
        assert!(
            !answer.contains(SECRET),
            "{target} leaked the secret:\n{answer}"
        );
    }
    // An absolute-form target with a traversal: hyper parses the path out of it.
    let answer = raw_get(&t, "http://localhost/../secret").await;
    assert!(!answer.contains(SECRET), "absolute-form leaked:\n{answer}");

    // symlinks out of the root are refused, even when their names look harmless
    for target in [
        "/leak",
        "/leak.txt",
        "/outdir/secret",
        "/outdir/",
        "/rel-leak",
        "/abs-inside",
    ] {
        let answer = raw_get(&t, target).await;
        assert_eq!(raw_status(&answer), 403, "{target}:\n{answer}");
        assert!(
            !answer.contains(SECRET),
            "{target} leaked the secret:\n{answer}"
        );
    }
    // also over TLS, both protocols
    for proto in BOTH {
        let c = client(&t.cert(), proto);
        for path in ["/leak", "/outdir/secret", "/rel-leak"] {
            let r = c.get(format!("{}{path}", t.https())).send().await.unwrap();
            assert_eq!(r.status(), 403, "{proto:?} {path}");
            assert!(!r.text().await.unwrap().contains(SECRET));
        }
        // a symlink that stays inside the root works, for files and directories
        let r = c.get(format!("{}/inside", t.https())).send().await.unwrap();
        assert_eq!(r.status(), 200, "{proto:?} /inside");
        assert_eq!(r.text().await.unwrap(), "public page");
        let r = c
            .get(format!("{}/linkdir/page.txt", t.https()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{proto:?} /linkdir/page.txt");
        assert_eq!(r.text().await.unwrap(), "public page");
    }
    // legitimate dots and encoded characters still work
    write(&t.site(), "a/b/dots..name.txt", "dots ok");
    write(&t.site(), "a/b/sp ace.txt", "space ok");
    for (target, body) in [
        ("/a/b/dots..name.txt", "dots ok"),
        ("/a/b/sp%20ace.txt", "space ok"),
        ("/./a/./b/page.txt", "public page"),
        ("/a//b//page.txt", "public page"),
        ("/%61/b/page.txt", "public page"),
    ] {
        let answer = raw_get(&t, target).await;
        assert_eq!(raw_status(&answer), 200, "{target}:\n{answer}");
        assert!(answer.ends_with(body), "{target}:\n{answer}");
    }
}

fn mkfifo(path: &Path) {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    let rc = unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) };
    assert_eq!(rc, 0, "mkfifo: {}", std::io::Error::last_os_error());
}

/// Opens and closes the write end of every FIFO given, so that a server thread blocked in
/// opening or reading one gets EOF (otherwise a regression would hang the test when the
/// server is dropped, instead of failing it).
fn unblock(fifos: &[std::path::PathBuf]) {
    use std::os::unix::fs::OpenOptionsExt;
    for f in fifos {
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(f);
    }
}

#[tokio::test]
async fn fifo_is_refused_without_blocking() {
    let t = common::start();
    write(&t.site(), "ok.txt", "still serving");
    std::fs::create_dir_all(t.site().join("fifodir")).unwrap();
    let fifos = [
        t.site().join("pipe.txt"),
        t.site().join("fifodir/index.html"),
    ];
    for f in &fifos {
        mkfifo(f);
    }

    for proto in BOTH {
        let c = client(&t.cert(), proto);
        for path in ["/pipe.txt", "/fifodir/"] {
            let Ok(r) = tokio::time::timeout(
                Duration::from_secs(5),
                c.get(format!("{}{path}", t.https())).send(),
            )
            .await
            else {
                unblock(&fifos);
                panic!("{proto:?} {path}: the FIFO blocked the server");
            };
            let r = r.unwrap();
            assert_eq!(r.status(), 403, "{proto:?} {path}");
            // the single worker is not stuck: the next request is answered
            let Ok(r) = tokio::time::timeout(
                Duration::from_secs(5),
                c.get(format!("{}/ok.txt", t.https())).send(),
            )
            .await
            else {
                unblock(&fifos);
                panic!("{proto:?} after {path}: the server is blocked");
            };
            let r = r.unwrap();
            assert_eq!(r.status(), 200);
            assert_eq!(r.text().await.unwrap(), "still serving");
        }
    }
    // and on a fresh plain connection
    let answer = raw_get(&t, "/ok.txt").await;
    assert_eq!(raw_status(&answer), 200, "{answer}");
}

#[tokio::test]
async fn strip_prefix_static_route_redirects_under_its_mount() {
    let t = common::start_with(
        "[[route]]\nprefix = \"/static\"\nroot = \"{dir}/st\"\nstrip_prefix = true\n",
        |d| {
            std::fs::create_dir_all(d.join("st/dir")).unwrap();
            std::fs::write(d.join("st/index.html"), "root-index").unwrap();
            std::fs::write(d.join("st/dir/index.html"), "dir-index").unwrap();
        },
    );
    let c = common::plain_client();
    let r = c.get(format!("{}/static", t.http())).send().await.unwrap();
    assert_eq!(r.status(), 301);
    assert_eq!(r.headers()["location"], "/static/");
    let r = c
        .get(format!("{}/static/dir?x=1", t.http()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 301);
    assert_eq!(r.headers()["location"], "/static/dir/?x=1");
    let r = c
        .get(format!("{}/static/dir/", t.http()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "dir-index");
    let r = c.get(format!("{}/static/", t.http())).send().await.unwrap();
    assert_eq!(r.text().await.unwrap(), "root-index");
}
