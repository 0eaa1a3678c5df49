//! Issue 26's HTTP details, each with a real client: zstd responses as ONE frame (httpx 0.28,
//! curl `--compressed`, Chromium), `multipart/byteranges` (python's `email` parser, curl),
//! trailers to HTTP/1.1 clients that send `TE: trailers` (python raw socket, curl), and the
//! autoindex's sizes, times and `?format=json` (curl, python's `json`).

use std::process::Command;
use std::time::Duration;

use qweb_testkit as common;
use qweb_testkit::upstream;

/// Runs `python3 -c script args...`; panics with its output when it fails.
fn python(script: &str, args: &[&str]) -> String {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("python3 (apt-get install python3)");
    assert!(
        out.status.success(),
        "python failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs curl with `args`; its stdout (panics when it fails).
fn curl(args: &[&str]) -> Vec<u8> {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "30"])
        .args(args)
        .output()
        .expect("curl (apt-get install curl)");
    assert!(
        out.status.success(),
        "curl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn proxy(up: std::net::SocketAddr) -> String {
    format!("\n[[route]]\nprefix = \"/up\"\nupstreams = [\"{up}\"]\nstrip_prefix = true\n")
}

/// httpx as a user runs it: a client with its defaults (it advertises zstd when the
/// `zstandard` package is there), streaming; checks the coding was zstd.
const HTTPX: &str = r#"
import sys, httpx, zstandard
url, cert, kind = sys.argv[1], sys.argv[2], sys.argv[3]
with httpx.Client(verify=cert, timeout=30) as c:
    with c.stream("GET", url, headers={"accept-encoding": "zstd"}) as r:
        assert r.headers.get("content-encoding") == "zstd", dict(r.headers)
        if kind == "sse":
            n = 0
            for line in r.iter_lines():
                if line.startswith("data: event "):
                    assert line.split()[2] == str(n), line
                    n += 1
            print("events", n)
        else:
            body = b"".join(r.iter_bytes())
            print("bytes", len(body), body[:12].decode())
print("httpx", httpx.__version__)
"#;

/// Every zstd response is one frame: httpx 0.28 ("cannot use a decompressobj multiple
/// times" on a second frame) reads an SSE stream through the proxy and the first, streamed
/// fetch of a 200 KiB file (not yet in the variant cache), over HTTP/1.1 (httpx's default);
/// curl `--compressed` reads the same.
#[tokio::test]
async fn zstd_responses_decode_in_httpx_and_curl() {
    if Command::new("python3")
        .args(["-c", "import httpx, zstandard"])
        .status()
        .map_or(true, |s| !s.success())
    {
        panic!("httpx with zstd is needed: pip install 'httpx[zstd]' (see .ci/run)");
    }
    let up = upstream::start("u").await;
    let cfg = "[compression]\nchunk_size = \"16KiB\"\nflush_interval = \"10ms\"\n".to_owned()
        + &proxy(up.addr);
    let big = common::corpus::text(200 * 1024);
    let t = common::start_with(&cfg, |dir| {
        std::fs::write(dir.join("site/big.txt"), &big).unwrap();
        std::fs::write(dir.join("site/big2.txt"), &big).unwrap();
    });
    let cert = t.cert().display().to_string();
    let base = t.https();
    let (b, c) = (base.clone(), cert.clone());
    let out = tokio::task::spawn_blocking(move || {
        let sse = python(HTTPX, &[&format!("{b}/up/sse/8/30"), &c, "sse"]);
        let file = python(HTTPX, &[&format!("{b}/big.txt"), &c, "file"]);
        (sse, file)
    })
    .await
    .unwrap();
    assert!(out.0.contains("events 8"), "{}", out.0);
    assert!(out.0.contains("httpx 0."), "{}", out.0);
    let want = format!(
        "bytes {} {}",
        big.len(),
        String::from_utf8_lossy(&big[..12])
    );
    assert!(out.1.contains(&want), "{} (want {want})", out.1);
    eprintln!("{}", out.0.lines().last().unwrap_or_default());

    let (b, c) = (base.clone(), cert.clone());
    let (sse, file, headers) = tokio::task::spawn_blocking(move || {
        let args = |p: &str| {
            [
                "--compressed".to_owned(),
                "-H".to_owned(),
                "accept-encoding: zstd".to_owned(),
                "--cacert".to_owned(),
                c.clone(),
                format!("{b}{p}"),
            ]
        };
        let a = args("/up/sse/5/20");
        let sse = curl(&a.iter().map(String::as_str).collect::<Vec<_>>());
        let a = args("/big2.txt");
        let file = curl(&a.iter().map(String::as_str).collect::<Vec<_>>());
        let mut a: Vec<String> = args("/big2.txt").to_vec();
        a.extend(["-o".into(), "/dev/null".into(), "-D".into(), "-".into()]);
        let headers = curl(&a.iter().map(String::as_str).collect::<Vec<_>>());
        (sse, file, headers)
    })
    .await
    .unwrap();
    let sse = String::from_utf8(sse).unwrap();
    assert_eq!(sse.matches("data: event ").count(), 5, "{sse}");
    assert_eq!(file, big);
    let headers = String::from_utf8_lossy(&headers).to_ascii_lowercase();
    assert!(headers.contains("content-encoding: zstd"), "{headers}");
}

/// Chromium (≥ 123 advertises zstd on HTTPS) renders a 200 KiB page served as zstd, first
/// fetch (streamed) and from the variant cache; `/metrics` shows the responses were zstd.
#[test]
fn zstd_page_renders_in_chromium() {
    let Some(browser) = common::browser::Chromium::find() else {
        return;
    };
    let mut page = String::from("<!doctype html><html><body><pre>\n");
    page.push_str(&String::from_utf8_lossy(&common::corpus::text(200 * 1024)).replace('<', "("));
    page.push_str("</pre><p id=\"end\">the end</p></body></html>\n");
    let t = common::start_with(
        "[admin]\naddress = \"127.0.0.1:0\"\n[compression]\nchunk_size = \"16KiB\"\n",
        |dir| std::fs::write(dir.join("site/page.html"), &page).unwrap(),
    );
    for _ in 0..2 {
        let dom = browser.dump_dom(&format!("{}/page.html", t.https()), None);
        assert!(
            dom.contains("<p id=\"end\">the end</p>"),
            "{}",
            &dom[dom.len().saturating_sub(300)..]
        );
    }
    let m = common::metrics::scrape_blocking(t.admin.unwrap());
    let zstd = m.value("qweb_compression_responses_total", &[("codec", "zstd")]);
    assert!(zstd >= 1.0, "Chromium did not get zstd: {zstd}");
}

/// The parts of a `multipart/byteranges` body, read by python's `email` parser:
/// `(content-type, content-range, payload)` per part, as JSON.
const MULTIPART: &str = r#"
import sys, json, email, email.policy
ct, body = sys.argv[1], open(sys.argv[2], "rb").read()
msg = email.message_from_bytes(b"Content-Type: " + ct.encode() + b"\r\n\r\n" + body, policy=email.policy.HTTP)
assert msg.is_multipart(), ct
parts = [[p["Content-Type"], p["Content-Range"], p.get_payload(decode=True).decode("latin-1")] for p in msg.iter_parts()]
print(json.dumps(parts))
"#;

fn parts(content_type: &str, body: &[u8]) -> Vec<(String, String, String)> {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), body).unwrap();
    let out = python(MULTIPART, &[content_type, &f.path().display().to_string()]);
    let v: Vec<(String, String, String)> = serde_json::from_str(out.trim()).unwrap();
    v
}

/// `Range: bytes=0-1,5-6` gets a 206 `multipart/byteranges` (HTTP/1.1 and HTTP/2, small
/// file from memory and large file streamed from disk), exactly its `Content-Length`, parsed
/// by python's `email`; overlapping ranges are merged, too many give the whole file, none
/// satisfiable is a 416, a stale If-Range the whole file, HEAD the same headers.
#[tokio::test]
async fn several_ranges_are_multipart_byteranges() {
    let small: Vec<u8> = (0..100u8).map(|i| b'a' + i % 26).collect();
    let large: Vec<u8> = (0..300_000usize).map(|i| b'a' + (i % 26) as u8).collect();
    let t = common::start_with("", |dir| {
        std::fs::write(dir.join("site/small.txt"), &small).unwrap();
        std::fs::write(dir.join("site/large.txt"), &large).unwrap();
    });
    for proto in common::BOTH {
        let c = common::client(&t.cert(), proto);
        for (name, data) in [("small.txt", &small), ("large.txt", &large)] {
            let url = format!("{}/{name}", t.https());
            let len = data.len();
            let r = c
                .get(&url)
                .header("range", "bytes=0-1,5-6,-3")
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 206, "{proto:?} {name}");
            let ct = r.headers()["content-type"].to_str().unwrap().to_owned();
            assert!(ct.starts_with("multipart/byteranges; boundary="), "{ct}");
            assert!(r.headers().get("content-range").is_none());
            let cl: usize = r.headers()["content-length"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            let body = r.bytes().await.unwrap();
            assert_eq!(body.len(), cl, "{proto:?} {name}");
            let s = |a: usize, b: usize| String::from_utf8_lossy(&data[a..b]).into_owned();
            assert_eq!(
                parts(&ct, &body),
                [
                    ("text/plain".into(), format!("bytes 0-1/{len}"), s(0, 2)),
                    ("text/plain".into(), format!("bytes 5-6/{len}"), s(5, 7)),
                    (
                        "text/plain".into(),
                        format!("bytes {}-{}/{len}", len - 3, len - 1),
                        s(len - 3, len)
                    ),
                ],
                "{proto:?} {name}"
            );
            // HEAD: the same length, no body
            let h = c
                .head(&url)
                .header("range", "bytes=0-1,5-6,-3")
                .send()
                .await
                .unwrap();
            assert_eq!(h.status(), 206);
            assert_eq!(
                h.headers()["content-length"].to_str().unwrap(),
                cl.to_string()
            );
            // overlapping and unsorted ranges are merged: no byte twice
            let r = c
                .get(&url)
                .header("range", "bytes=50-60,0-10,5-20,0-0")
                .send()
                .await
                .unwrap();
            let ct = r.headers()["content-type"].to_str().unwrap().to_owned();
            let got = parts(&ct, &r.bytes().await.unwrap());
            assert_eq!(got.len(), 2, "{got:?}");
            assert_eq!(got[0].1, format!("bytes 0-20/{len}"));
            assert_eq!(got[1].1, format!("bytes 50-60/{len}"));
            // `bytes=0-,0-,0-`: one range, the whole file once
            let r = c
                .get(&url)
                .header("range", "bytes=0-,0-,0-")
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 206);
            assert_eq!(r.bytes().await.unwrap().len(), len);
            // more than 32 ranges: the whole file, 200
            let many: Vec<String> = (0..33).map(|i| format!("{}-{}", i * 2, i * 2)).collect();
            let r = c
                .get(&url)
                .header("range", format!("bytes={}", many.join(",")))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{proto:?} {name}");
            assert_eq!(&r.bytes().await.unwrap()[..], &data[..]);
            // none satisfiable: 416
            let r = c
                .get(&url)
                .header("range", format!("bytes={len}-,{}-{}", len + 5, len + 9))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 416);
            assert_eq!(
                r.headers()["content-range"].to_str().unwrap(),
                format!("bytes */{len}")
            );
            // If-Range: the current ETag gets the parts, a stale one the whole file
            let etag = c.get(&url).send().await.unwrap().headers()["etag"].clone();
            for (tag, want) in [(etag.to_str().unwrap(), 206), ("\"stale\"", 200)] {
                let r = c
                    .get(&url)
                    .header("range", "bytes=0-1,5-6")
                    .header("if-range", tag)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), want, "{proto:?} {name} if-range {tag}");
            }
        }
    }
    // curl: the same multipart body
    let (url, cert) = (
        format!("{}/large.txt", t.https()),
        t.cert().display().to_string(),
    );
    let out = tokio::task::spawn_blocking(move || {
        curl(&["--cacert", &cert, "-D", "-", "-r", "0-1,5-6", &url])
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out);
    assert!(
        text.contains("HTTP/2 206") || text.contains("HTTP/1.1 206"),
        "{text}"
    );
    assert!(
        text.contains("Content-Range: bytes 5-6/300000\r\n\r\nfg\r\n"),
        "{text}"
    );
}

/// Reads a chunked HTTP/1.1 response on a raw socket: status line, headers, body and
/// trailers as python sees them.
const CHUNKED: &str = r#"
import sys, socket, json
host, port, path, te = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
s = socket.create_connection((host, port))
req = "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" % path
if te:
    req += "TE: %s\r\n" % te
s.sendall((req + "\r\n").encode())
f = s.makefile("rb")
status = f.readline().decode().strip()
headers = {}
while True:
    l = f.readline().decode()
    if l in ("\r\n", ""):
        break
    k, v = l.split(":", 1)
    headers[k.strip().lower()] = v.strip()
body, trailers = b"", {}
if headers.get("transfer-encoding") == "chunked":
    while True:
        n = int(f.readline().split(b";")[0], 16)
        if n == 0:
            break
        body += f.read(n)
        assert f.read(2) == b"\r\n"
    while True:
        l = f.readline().decode()
        if l in ("\r\n", ""):
            break
        k, v = l.split(":", 1)
        trailers[k.strip().lower()] = v.strip()
else:
    body = f.read()
print(json.dumps({"status": status, "headers": headers, "body": body.decode(), "trailers": trailers}))
"#;

/// An upstream's trailers reach an HTTP/1.1 client that sent `TE: trailers` (chunked, after
/// the last chunk, announced by `Trailer`), compressed or not, and never one that did not;
/// HTTP/2 clients get them as a trailing HEADERS frame. Seen by a python raw socket and curl.
#[tokio::test]
async fn upstream_trailers_reach_clients_that_asked() {
    let up = upstream::start("u").await;
    let t = common::start_with(&proxy(up.addr), |_| {});
    let addr = t.addrs[1];
    let run = move |te: &'static str| {
        let out = python(
            CHUNKED,
            &[
                &addr.ip().to_string(),
                &addr.port().to_string(),
                "/up/trailers",
                te,
            ],
        );
        serde_json::from_str::<serde_json::Value>(out.trim()).unwrap()
    };
    let (asked, not, other) =
        tokio::task::spawn_blocking(move || (run("trailers"), run(""), run("gzip")))
            .await
            .unwrap();
    assert_eq!(asked["body"], "body\n", "{asked}");
    assert_eq!(asked["headers"]["transfer-encoding"], "chunked", "{asked}");
    assert_eq!(
        asked["headers"]["trailer"], "x-checksum, x-status",
        "{asked}"
    );
    assert_eq!(asked["trailers"]["x-checksum"], "abc123", "{asked}");
    assert_eq!(asked["trailers"]["x-status"], "done", "{asked}");
    for v in [&not, &other] {
        assert_eq!(v["body"], "body\n", "{v}");
        assert!(v["trailers"].as_object().unwrap().is_empty(), "{v}");
        assert!(v["headers"].get("trailer").is_none(), "{v}");
    }
    // curl shows trailers with the headers (-D)
    let url = format!("{}/up/trailers", t.http());
    let out = tokio::task::spawn_blocking(move || {
        curl(&["-D", "-", "-o", "/dev/null", "-H", "TE: trailers", &url])
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out).to_ascii_lowercase();
    assert!(text.contains("x-checksum: abc123"), "{text}");
    // HTTP/2
    let c = common::client(&t.cert(), common::Proto::H2);
    let r = c
        .get(format!("{}/up/trailers", t.https()))
        .header("te", "trailers")
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "body\n");
    drop(up);
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// Trailers pass the compression layer (after the last compressed bytes).
#[tokio::test]
async fn trailers_follow_a_compressed_body() {
    let up = upstream::start("u").await;
    let t = common::start_with(
        &("[compression]\nmin_size = 0\n".to_owned() + &proxy(up.addr)),
        |_| {},
    );
    let url = format!("{}/up/trailers", t.http());
    let out = tokio::task::spawn_blocking(move || {
        curl(&[
            "-D",
            "-",
            "--compressed",
            "-H",
            "accept-encoding: gzip",
            "-H",
            "TE: trailers",
            &url,
        ])
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out);
    let lower = text.to_ascii_lowercase();
    assert!(lower.contains("content-encoding: gzip"), "{text}");
    assert!(lower.contains("x-status: done"), "{text}");
    assert!(text.contains("body\n"), "{text}");
}

/// The autoindex lists sizes and modification times, in HTML and as JSON
/// (`?format=json`), with hostile names (markup, quotes, a newline, bytes that are not
/// UTF-8) escaped: curl fetches, python's `json` parses.
#[tokio::test]
async fn autoindex_sizes_times_and_json() {
    use std::os::unix::ffi::OsStrExt;
    let t = common::start_with(
        "[[route]]\nprefix = \"/\"\nroot = \"{dir}/site\"\nautoindex = true\n",
        |dir| {
            let d = dir.join("site/d");
            std::fs::create_dir_all(d.join("sub")).unwrap();
            std::fs::write(d.join("<script>alert(1)"), "12345").unwrap();
            std::fs::write(d.join("q\"uo'te"), "").unwrap();
            std::fs::write(d.join("new\nline"), "x").unwrap();
            std::fs::write(d.join(std::ffi::OsStr::from_bytes(b"bad\xff\xfe")), "ab").unwrap();
            std::fs::write(d.join("a.txt"), vec![b'a'; 1000]).unwrap();
        },
    );
    let (base, cert) = (t.https(), t.cert().display().to_string());
    let (html, json) = tokio::task::spawn_blocking(move || {
        let html = curl(&["--cacert", &cert, &format!("{base}/d/")]);
        let json = curl(&["--cacert", &cert, &format!("{base}/d/?format=json")]);
        (html, json)
    })
    .await
    .unwrap();
    let html = String::from_utf8(html).expect("the listing is UTF-8");
    assert!(!html.contains("<script>"), "{html}");
    assert!(html.contains("<td>1000</td>"), "{html}");
    assert!(
        html.contains("<tr><td><a href=\"sub/\">sub/</a></td><td>-</td>"),
        "{html}"
    );
    let year = html.matches("<td>20").count();
    assert!(year >= 6, "modification times: {html}");
    let check = r#"
import sys, json
v = json.loads(sys.stdin.read())
print(json.dumps([[e["name"], e["url"], e["is_dir"], e["size"], e["mod_time"][:2], e["mod_time"][-1]] for e in v]))
"#;
    let mut child = Command::new("python3")
        .args(["-c", check])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(&json).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&json));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let want = serde_json::json!([
        [
            "<script>alert(1)",
            "%3Cscript%3Ealert%281%29",
            false,
            5,
            "20",
            "Z"
        ],
        ["a.txt", "a.txt", false, 1000, "20", "Z"],
        ["bad\u{fffd}\u{fffd}", "bad%FF%FE", false, 2, "20", "Z"],
        ["new\nline", "new%0Aline", false, 1, "20", "Z"],
        ["q\"uo'te", "q%22uo%27te", false, 0, "20", "Z"],
        ["sub/", "sub/", true, 0, "20", "Z"],
    ]);
    assert_eq!(v, want, "{}", String::from_utf8_lossy(&json));
    // the raw JSON holds no markup a sniffing browser would run
    assert!(!String::from_utf8_lossy(&json).contains('<'));
}
