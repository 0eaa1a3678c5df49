//! Static files are opened beneath the document root, atomically: a directory swapped for a
//! symlink to the outside while requests run never serves an outside file. Also the
//! `symlinks` modes of a static route (`inside_root`, `refuse`, `follow`).
#![allow(unsafe_code)] // libc calls on test processes and files; each block has its SAFETY note

use qweb_testkit as common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::TestServer;
use qweb_server::config::{OpenMethod, RouteAction};
use qweb_server::{Config, Server};

const SECRET: &str = "TOP-SECRET-3b2d51c8-outside-the-root";
const INSIDE: &str = "inside the root";

/// Starts qweb like `common::start_with`, with `route` appended to the `/` route's table
/// (e.g. `symlinks = "refuse"`) and the route's files opened by `method`.
fn start_route(
    route: &str,
    extra: &str,
    method: OpenMethod,
    prepare: impl FnOnce(&Path),
) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("site")).unwrap();
    prepare(dir.path());
    let d = dir.path().display();
    let text = format!(
        "workers = 1\nstate_dir = \"{d}/state\"\n{extra}\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\nself_signed = true\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\n\
         [[route]]\nprefix = \"/\"\nroot = \"{d}/site\"\n{route}\n"
    );
    let file = dir.path().join("qweb.toml");
    std::fs::write(&file, &text).unwrap();
    let mut config = Config::from_file(&file).unwrap_or_else(|e| panic!("config: {e}\n{text}"));
    for r in &mut config.routes {
        if let RouteAction::Static(s) = &mut r.action {
            s.open_method = method;
        }
    }
    let server = Server::start(config).unwrap_or_else(|e| panic!("start: {e}"));
    let addrs = server.local_addrs().to_vec();
    let admin = server.admin_addr();
    TestServer {
        server: Some(server),
        addrs,
        admin,
        dir,
    }
}

fn write(root: &Path, rel: &str, body: impl AsRef<[u8]>) {
    let p = root.join(rel);
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(p, body).unwrap();
}

/// What the client saw during a swap race.
#[derive(Debug, Default)]
struct RaceCounts {
    requests: u64,
    inside: u64,
    secret: u64,
    refused: u64,
    gzip: u64,
    swaps: u64,
}

/// A body of at least 2 KiB (so that it is compressed) that contains `marker`.
fn big(marker: &str) -> String {
    let mut b = String::new();
    while b.len() < 2048 {
        b.push_str(marker);
        b.push('\n');
    }
    b
}

fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn gunzip(data: &[u8]) -> String {
    use std::io::Read;
    let mut s = String::new();
    flate2::read::GzDecoder::new(data)
        .read_to_string(&mut s)
        .unwrap();
    s
}

/// `site/dir/file.txt` holds [`INSIDE`], `outside/dir/file.txt` holds [`SECRET`] (with `.gz`
/// sidecars when `sidecars`: requests then ask for gzip). A thread swaps `site/dir` between
/// the real directory and an absolute symlink to `outside/dir` as fast as it can (atomic
/// `renameat2(RENAME_EXCHANGE)`, so both states last about as long), while one
/// keep-alive HTTP/1.1 client requests `/dir/file.txt` in a loop (at least `min_requests`, and
/// until both states were seen, at most 60 s).
async fn swap_race(t: &TestServer, sidecars: bool, min_requests: u64) -> RaceCounts {
    let site = t.site();
    let outside = t.dir.path().join("outside");
    for (root, marker) in [(&site, INSIDE), (&outside, SECRET)] {
        let body = big(marker);
        write(root, "dir/file.txt", &body);
        if sidecars {
            write(root, "dir/file.txt.gz", gzip(body.as_bytes()));
        }
    }
    // `dir.link` is the symlink; each exchange (one atomic renameat2) flips what `dir` is
    std::os::unix::fs::symlink(outside.join("dir"), site.join("dir.link")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let stop = stop.clone();
        let a = std::ffi::CString::new(site.join("dir").as_os_str().as_encoded_bytes()).unwrap();
        let b =
            std::ffi::CString::new(site.join("dir.link").as_os_str().as_encoded_bytes()).unwrap();
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: two valid NUL-terminated paths.
                let rc = unsafe {
                    libc::renameat2(
                        libc::AT_FDCWD,
                        a.as_ptr(),
                        libc::AT_FDCWD,
                        b.as_ptr(),
                        libc::RENAME_EXCHANGE,
                    )
                };
                assert_eq!(rc, 0, "renameat2: {}", std::io::Error::last_os_error());
                swaps += 1;
            }
            swaps
        })
    };
    let c = common::plain_client();
    let url = format!("{}/dir/file.txt", t.http());
    let mut n = RaceCounts::default();
    let started = Instant::now();
    while (n.requests < min_requests || n.inside == 0 || n.refused + n.secret == 0)
        && started.elapsed() < Duration::from_secs(60)
    {
        let mut req = c.get(&url);
        if sidecars {
            req = req.header("accept-encoding", "gzip");
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let gzipped = r
            .headers()
            .get("content-encoding")
            .is_some_and(|v| v == "gzip");
        let raw = r.bytes().await.unwrap();
        let body = if gzipped {
            n.gzip += 1;
            gunzip(&raw)
        } else {
            String::from_utf8_lossy(&raw).into_owned()
        };
        n.requests += 1;
        if body.contains(SECRET) {
            n.secret += 1;
        } else if status == 200 && body.contains(INSIDE) {
            n.inside += 1;
        } else if matches!(status, 403 | 404) {
            n.refused += 1;
        } else {
            panic!("unexpected answer {status}: {body:?} after {n:?}");
        }
    }
    stop.store(true, Ordering::Relaxed);
    n.swaps = swapper.join().unwrap();
    n
}

fn assert_never_outside(n: &RaceCounts) {
    eprintln!("{n:?}");
    assert_eq!(n.secret, 0, "the outside file was served: {n:?}");
    // the race really ran: both states of the directory were seen
    assert!(n.inside > 0 && n.refused > 0, "{n:?}");
}

#[tokio::test]
async fn swapping_a_directory_for_an_outside_symlink_never_serves_outside_files() {
    let t = common::start();
    assert_never_outside(&swap_race(&t, false, 3000).await);
}

#[tokio::test]
async fn swap_race_with_the_walk_fallback() {
    let t = start_route("", "", OpenMethod::Walk, |_| {});
    assert_never_outside(&swap_race(&t, false, 3000).await);
}

#[tokio::test]
async fn swap_race_with_precompressed_sidecars() {
    let compression = "[compression]\nenabled = true\ncodecs = [\"gzip\"]\nprecompressed = true\n";
    for method in [OpenMethod::Auto, OpenMethod::Walk] {
        let t = start_route("", compression, method, |_| {});
        let n = swap_race(&t, true, 2000).await;
        assert_never_outside(&n);
        assert!(n.gzip > 0, "{method:?}: no sidecar was served: {n:?}");
    }
}

fn mkfifo(path: &Path) {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    let rc = unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) };
    assert_eq!(rc, 0, "mkfifo: {}", std::io::Error::last_os_error());
}

/// Opens and closes the write end of a FIFO, so that a server thread blocked on it gets EOF
/// (a regression then fails the test instead of hanging it).
fn unblock(fifo: &Path) {
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(fifo);
}

/// The site of the symlink-mode tests; `outside` beside it holds the secret.
fn symlink_site(dir: &Path) {
    use std::os::unix::fs::symlink;
    let site = dir.join("site");
    let out = dir.join("outside");
    write(&out, "secret.txt", SECRET);
    write(&out, "index.html", SECRET);
    write(&site, "a/page.txt", "page");
    write(&site, "a/index.html", "a-index");
    write(&site, "b/home.html", "b-home");
    std::fs::create_dir_all(site.join("idx")).unwrap();
    symlink("../b/home.html", site.join("idx/index.html")).unwrap();
    std::fs::create_dir_all(site.join("outidx")).unwrap();
    symlink(out.join("index.html"), site.join("outidx/index.html")).unwrap();
    symlink("a/page.txt", site.join("rel-in.txt")).unwrap();
    symlink(site.join("a/page.txt"), site.join("abs-in.txt")).unwrap();
    symlink("../outside/secret.txt", site.join("rel-out.txt")).unwrap();
    symlink(out.join("secret.txt"), site.join("abs-out.txt")).unwrap();
    symlink("a", site.join("linkdir")).unwrap();
    symlink("../outside", site.join("outdir")).unwrap();
    // a file whose gzip sidecar is a symlink out of the root
    write(&site, "big.txt", big(INSIDE));
    // (written after big.txt: a sidecar is used when at least as new)
    write(&out, "big.txt.gz", gzip(big(SECRET).as_bytes()));
    symlink(out.join("big.txt.gz"), site.join("big.txt.gz")).unwrap();
    write(&site, "ok.txt", "still serving");
    mkfifo(&site.join("pipe.txt"));
}

#[tokio::test]
async fn symlink_modes() {
    const FORBIDDEN: (u16, &str) = (403, "");
    let page = (200, "page");
    let secret = (200, SECRET);
    // (path, inside_root, refuse, follow); a body "" is not checked
    #[rustfmt::skip]
    let table: &[(&str, [(u16, &str); 3])] = &[
        ("/a/page.txt",         [page, page, page]),
        ("/rel-in.txt",         [page, FORBIDDEN, page]),
        // RESOLVE_BENEATH refuses absolute symlinks, even to inside the root
        ("/abs-in.txt",         [FORBIDDEN, FORBIDDEN, page]),
        ("/rel-out.txt",        [FORBIDDEN, FORBIDDEN, secret]),
        ("/abs-out.txt",        [FORBIDDEN, FORBIDDEN, secret]),
        ("/linkdir/page.txt",   [page, FORBIDDEN, page]),
        ("/linkdir/",           [(200, "a-index"), FORBIDDEN, (200, "a-index")]),
        ("/linkdir",            [(301, ""), FORBIDDEN, (301, "")]),
        ("/outdir/secret.txt",  [FORBIDDEN, FORBIDDEN, secret]),
        ("/outdir/",            [FORBIDDEN, FORBIDDEN, secret]),
        // a symlinked index file that leaves its directory but not the root
        ("/idx/",               [(200, "b-home"), FORBIDDEN, (200, "b-home")]),
        ("/outidx/",            [FORBIDDEN, FORBIDDEN, secret]),
        ("/pipe.txt",           [FORBIDDEN, FORBIDDEN, FORBIDDEN]),
        ("/missing.txt",        [(404, ""), (404, ""), (404, "")]),
        ("/a/page.txt/",        [(404, ""), (404, ""), (404, "")]),
    ];
    let compression = "[compression]\nenabled = true\ncodecs = [\"gzip\"]\nprecompressed = true\n";
    for method in [OpenMethod::Auto, OpenMethod::Walk] {
        for (i, mode) in ["inside_root", "refuse", "follow"].into_iter().enumerate() {
            let t = start_route(
                &format!("symlinks = \"{mode}\""),
                compression,
                method,
                symlink_site,
            );
            let c = common::plain_client();
            for (path, want) in table {
                let (status, body) = want[i];
                let r = tokio::time::timeout(
                    Duration::from_secs(5),
                    c.get(format!("{}{path}", t.http())).send(),
                )
                .await;
                let Ok(r) = r else {
                    unblock(&t.site().join("pipe.txt"));
                    panic!("{method:?} {mode} {path}: the server blocked");
                };
                let r = r.unwrap();
                let got = r.status().as_u16();
                let text = r.text().await.unwrap();
                let what = format!("{method:?} {mode} {path}: {got} {text:?}");
                assert_eq!(got, status, "{what}");
                if mode != "follow" {
                    assert!(!text.contains(SECRET), "{what}");
                }
                if !body.is_empty() {
                    assert_eq!(text, body, "{what}");
                }
            }
            // the worker is not stuck after the FIFO
            let r = c.get(format!("{}/ok.txt", t.http())).send().await.unwrap();
            assert_eq!(r.text().await.unwrap(), "still serving");
            // a sidecar is opened like the file: its outside symlink is served only by "follow"
            let r = c
                .get(format!("{}/big.txt", t.http()))
                .header("accept-encoding", "gzip")
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            assert_eq!(r.headers()["content-encoding"], "gzip");
            let text = gunzip(&r.bytes().await.unwrap());
            let want = if mode == "follow" { SECRET } else { INSIDE };
            assert!(text.contains(want), "{method:?} {mode} /big.txt: {text:?}");
        }
    }
}
