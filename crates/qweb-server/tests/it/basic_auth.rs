//! `basic_auth` on routes and sites (issue 39, phase 8): 401 with the RFC 7617 challenge for
//! missing, wrong and malformed credentials; an unknown user costs what a known one does; no
//! path trick takes a request around it; `Authorization` is not forwarded upstream unless
//! asked; a guessing flood leaves the worker answering; past `max_pending` 503 at once; a bad
//! users file is refused by line, at start and at reload; over HTTP/1.1, HTTP/2 and HTTP/3.

use qweb_testkit as common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::h3::{aioquic, aioquic_available, H3Request};
use common::{recorder, Proto};

const TIMEOUT: Duration = Duration::from_secs(30);

const CHALLENGE: &str = "Basic realm=\"ops\", charset=\"UTF-8\"";

fn basic(user: &str, password: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

/// Writes `<dir>/users` with `(user, password, bcrypt cost)` entries.
fn users_file(dir: &Path, name: &str, users: &[(&str, &str, u32)]) {
    let mut text = String::from("# qweb test users\n\n");
    for (u, p, cost) in users {
        text.push_str(&format!("{u}:{}\n", bcrypt::hash(p, *cost).unwrap()));
    }
    std::fs::write(dir.join(name), text).unwrap();
}

/// Status and `WWW-Authenticate` of one HTTP/1.1 GET on its own connection.
async fn get(addr: SocketAddr, target: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut req = format!("GET {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (n, v) in headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    req.push_str("\r\n");
    let out = common::raw_exchange(addr, req.as_bytes(), TIMEOUT).await;
    let text = String::from_utf8_lossy(&out);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let challenge = text
        .lines()
        .find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case("www-authenticate")
                .then(|| v.trim().to_owned())
        })
        .unwrap_or_default();
    (status, challenge)
}

/// Hostile: no, wrong, unknown and malformed credentials are 401 with the challenge (never a
/// panic, never a 200); a value past the length bound is not decoded, even when its first 72
/// bytes are the password (bcrypt reads no further); the right password passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_wrong_unknown_and_malformed_credentials_get_401_with_the_challenge() {
    let long = "p".repeat(72);
    let ts = common::start_with(
        "[[route]]\nprefix = \"/admin\"\nroot = \"{dir}/site\"\n\
         basic_auth = { realm = \"ops\", users = \"{dir}/users\" }\n",
        |d| {
            users_file(d, "users", &[("alice", "s3cret", 4), ("long", &long, 4)]);
            // and an argon2id user (OWASP's smallest settings: 19 MiB, 2 passes)
            use argon2::password_hash::{PasswordHasher, SaltString};
            let params = argon2::Params::new(19 * 1024, 2, 1, None).unwrap();
            let a =
                argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
            let salt = SaltString::encode_b64(b"qweb test salt!!").unwrap();
            let h = a.hash_password(b"argon-pw", &salt).unwrap().to_string();
            let mut text = std::fs::read_to_string(d.join("users")).unwrap();
            text.push_str(&format!("carol:{h}\n"));
            std::fs::write(d.join("users"), text).unwrap();
            std::fs::create_dir_all(d.join("site/admin")).unwrap();
            std::fs::write(d.join("site/admin/a.txt"), "a").unwrap();
        },
    );
    let plain = ts.addrs[1];
    let b64 = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
    let too_long = basic("long", &"p".repeat(9000));
    let cases: Vec<(&str, Vec<(&str, String)>)> = vec![
        ("none", vec![]),
        (
            "wrong password",
            vec![("Authorization", basic("alice", "s3creT"))],
        ),
        (
            "empty password",
            vec![("Authorization", basic("alice", ""))],
        ),
        (
            "argon2 wrong password",
            vec![("Authorization", basic("carol", "argon-pW"))],
        ),
        (
            "unknown user",
            vec![("Authorization", basic("mallory", "s3cret"))],
        ),
        (
            "not base64",
            vec![("Authorization", "Basic !!not*base64".into())],
        ),
        (
            "no colon",
            vec![("Authorization", format!("Basic {}", b64(b"alices3cret")))],
        ),
        (
            "not UTF-8",
            vec![(
                "Authorization",
                format!("Basic {}", b64(b"\xff\xfe:s3cret")),
            )],
        ),
        ("no token", vec![("Authorization", "Basic".into())]),
        (
            "other scheme",
            vec![("Authorization", format!("Bearer {}", b64(b"alice:s3cret")))],
        ),
        ("over the bound", vec![("Authorization", too_long)]),
        (
            "two values",
            vec![
                ("Authorization", basic("alice", "s3cret")),
                ("Authorization", basic("alice", "s3cret")),
            ],
        ),
    ];
    let mut bad = Vec::new();
    for (what, headers) in &cases {
        let h: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let (s, challenge) = get(plain, "/admin/a.txt", &h).await;
        if s != 401 || challenge != CHALLENGE {
            bad.push(format!("{what}: {s} {challenge:?}"));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    let good = basic("alice", "s3cret");
    assert_eq!(
        get(plain, "/admin/a.txt", &[("Authorization", &good)])
            .await
            .0,
        200
    );
    let lower = good.replacen("Basic", "basic", 1);
    assert_eq!(
        get(plain, "/admin/a.txt", &[("Authorization", &lower)])
            .await
            .0,
        200
    );
    let argon = basic("carol", "argon-pw");
    assert_eq!(
        get(plain, "/admin/a.txt", &[("Authorization", &argon)])
            .await
            .0,
        200,
        "argon2id"
    );
    let exact = basic("long", &long);
    assert_eq!(
        get(plain, "/admin/a.txt", &[("Authorization", &exact)])
            .await
            .0,
        200
    );
    // the other routes ask for nothing
    assert_eq!(get(plain, "/other", &[]).await.0, 404);
}

/// Paths that mean `/admin...` to qweb or to an upstream behind it (as access_rules.rs).
const AROUND: [&str; 14] = [
    "/admin",
    "/admin/",
    "/admin/x",
    "/admin;x",
    "/admin;jsessionid=1/x",
    "/admin%3bx",
    "/admin%3B/x",
    "//admin",
    "///admin/x",
    "/%61dmin",
    "/./admin",
    "/x/../admin",
    "/ADMIN",
    "/Admin;x/",
];

/// Hostile: no spelling of the path reaches a protected route's handler without credentials,
/// on proxy and static routes; a site's `basic_auth` covers its unknown paths too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_tricks_do_not_get_around_basic_auth() {
    let up = recorder::start().await;
    let ts = common::start_with(
        &format!(
            "[[route]]\nprefix = \"/admin\"\nupstreams = [\"{u}\"]\n\
             basic_auth = {{ realm = \"ops\", users = \"{{dir}}/users\" }}\n\
             [[route]]\nprefix = \"/files\"\nstrip_prefix = true\nroot = \"{{dir}}/site\"\n\
             basic_auth = {{ realm = \"ops\", users = \"{{dir}}/users\" }}\n\
             [[route]]\nprefix = \"/\"\nupstreams = [\"{u}\"]\n\
             [[site]]\nserver_names = [\"ops.test\"]\n\
             basic_auth = {{ realm = \"ops\", users = \"{{dir}}/users\" }}\n\
             route = [{{ prefix = \"/\", root = \"{{dir}}/site\" }}]\n",
            u = up.addr
        ),
        |d| {
            users_file(d, "users", &[("alice", "s3cret", 4)]);
            std::fs::write(d.join("site/a.txt"), "a").unwrap();
        },
    );
    let plain = ts.addrs[1];
    let mut bad = Vec::new();
    for path in AROUND {
        let s = get(plain, path, &[]).await.0;
        if s != 401 && s != 400 {
            bad.push(format!("{path}: {s}"));
        }
    }
    for path in [
        "/files/a.txt",
        "/files;x/a.txt",
        "//files/a.txt",
        "/files/./a.txt",
        "/%66iles/a.txt",
        "/files%2fa.txt",
    ] {
        let s = get(plain, path, &[]).await.0;
        if s != 401 && s != 400 {
            bad.push(format!("{path}: {s} (static)"));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    assert!(up.take().is_empty(), "nothing reached the upstream");
    let good = basic("alice", "s3cret");
    assert_eq!(
        get(plain, "/admin;x", &[("Authorization", &good)]).await.0,
        200
    );
    assert_eq!(
        get(plain, "/files/a.txt", &[("Authorization", &good)])
            .await
            .0,
        200
    );
    assert_eq!(
        get(plain, "/other", &[]).await.0,
        200,
        "`/` asks for nothing"
    );
    assert_eq!(up.take().len(), 2);
    // the site: every path, unknown ones included
    let site = |path: &str, auth: Option<&str>| {
        let mut req = format!("GET {path} HTTP/1.1\r\nHost: ops.test\r\nConnection: close\r\n");
        if let Some(a) = auth {
            req.push_str(&format!("Authorization: {a}\r\n"));
        }
        req.push_str("\r\n");
        req
    };
    for (path, auth, want) in [
        ("/a.txt", None, "401"),
        ("/missing", None, "401"),
        ("/a.txt", Some(good.as_str()), "200"),
        ("/missing", Some(good.as_str()), "404"),
    ] {
        let out = common::raw_exchange(plain, site(path, auth).as_bytes(), TIMEOUT).await;
        let text = String::from_utf8_lossy(&out);
        assert_eq!(text.split(' ').nth(1), Some(want), "site {path} {auth:?}");
    }
}

/// Hostile: the credentials were for qweb; a proxy route removes them unless it has
/// `forward_authorization = true`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorization_is_not_forwarded_upstream_unless_asked() {
    let up = recorder::start().await;
    let ts = common::start_with(
        &format!(
            "[[route]]\nprefix = \"/admin\"\nupstreams = [\"{u}\"]\n\
             basic_auth = {{ realm = \"ops\", users = \"{{dir}}/users\" }}\n\
             [[route]]\nprefix = \"/pass\"\nupstreams = [\"{u}\"]\n\
             basic_auth = {{ realm = \"ops\", users = \"{{dir}}/users\", forward_authorization = true }}\n\
             [[route]]\nprefix = \"/\"\nupstreams = [\"{u}\"]\n",
            u = up.addr
        ),
        |d| users_file(d, "users", &[("alice", "s3cret", 4)]),
    );
    let good = basic("alice", "s3cret");
    let plain = ts.addrs[1];
    assert_eq!(
        get(plain, "/admin/x", &[("Authorization", &good)]).await.0,
        200
    );
    assert_eq!(
        get(plain, "/pass/x", &[("Authorization", &good)]).await.0,
        200
    );
    // a route without basic_auth forwards what the client sent, as before
    assert_eq!(
        get(plain, "/open", &[("Authorization", "Bearer t")])
            .await
            .0,
        200
    );
    let got = up.take();
    let auth_of = |target: &str| {
        got.iter()
            .find(|r| r.target().starts_with(target))
            .map(|r| r.header_all("authorization"))
            .unwrap_or_else(|| panic!("{target} reached the upstream"))
    };
    let admin: Vec<_> = got.iter().filter(|r| r.target() == "/admin/x").collect();
    assert_eq!(admin.len(), 1, "{got:?}");
    assert!(
        admin[0].header_all("authorization").is_empty(),
        "{}",
        admin[0].head
    );
    assert_eq!(auth_of("/pass/x"), [good]);
    assert_eq!(auth_of("/open"), ["Bearer t"]);
}

/// HTTP/2 and HTTP/3 share the pipeline: the challenge, a refusal and a pass on each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_and_http3_are_asked_and_let_through() {
    let ts = common::start_with(
        "[[listener]]\naddress = \"127.0.0.1:0\"\nhttp3 = true\n[listener.tls]\nself_signed = true\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\n\
         [[route]]\nprefix = \"/admin\"\nroot = \"{dir}/site\"\n\
         basic_auth = { realm = \"ops\", users = \"{dir}/users\" }\n\
         [[route]]\nprefix = \"/\"\nroot = \"{dir}/site\"\n",
        |d| {
            users_file(d, "users", &[("alice", "s3cret", 4)]);
            std::fs::create_dir_all(d.join("site/admin")).unwrap();
            std::fs::write(d.join("site/admin/a.txt"), "a").unwrap();
        },
    );
    let good = basic("alice", "s3cret");
    let wrong = basic("alice", "guess");
    let cfg = Arc::new(common::tls_client_config(&ts.cert(), Proto::H2));
    let io = common::tls::connect(ts.addrs[0], &cfg).await.unwrap();
    let client = common::h2client::handshake(io).await;
    // the challenge (the kit's `get` returns trailers, not the head)
    let req = http::Request::get("https://localhost/admin/a.txt")
        .body(())
        .unwrap();
    let mut send = client.clone().ready().await.expect("a stream");
    let (resp, _) = send.send_request(req, true).expect("sent");
    let resp = tokio::time::timeout(TIMEOUT, resp)
        .await
        .expect("an answer")
        .expect("a response");
    let challenge = resp
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(
        (resp.status().as_u16(), challenge.as_deref()),
        (401, Some(CHALLENGE))
    );
    let (s, _, _) =
        common::h2client::get(&client, "/admin/a.txt", &[("authorization", &wrong)]).await;
    assert_eq!(s, 401, "h2 wrong password");
    let (s, body, _) =
        common::h2client::get(&client, "/admin/a.txt", &[("authorization", &good)]).await;
    assert_eq!((s.as_u16(), &body[..]), (200, &b"a"[..]), "h2");
    let (s, _, _) = common::h2client::get(&client, "/admin;x/a.txt", &[]).await;
    assert_eq!(s, 401, "h2 path parameter");
    if aioquic_available() {
        let ca = ts.cert();
        let tls = ts.addrs[0];
        let reqs = vec![
            H3Request::get("/admin/a.txt"),
            H3Request::get("/admin/a.txt").header("authorization", &wrong),
            H3Request::get("/admin/a.txt").header("authorization", &good),
            H3Request::get("//admin/a.txt"),
        ];
        let out = tokio::task::spawn_blocking(move || aioquic(tls, &ca, &reqs, false))
            .await
            .unwrap()
            .expect("aioquic connects");
        let statuses: Vec<u16> = out
            .iter()
            .map(|r| r.as_ref().map_or(0, |r| r.status))
            .collect();
        assert_eq!(statuses, [401, 401, 200, 401], "h3");
        let first = out[0].as_ref().unwrap();
        assert_eq!(first.header("www-authenticate"), Some(CHALLENGE));
    } else {
        eprintln!("SKIPPED (HTTP/3 part): python3 with aioquic is needed (pip install aioquic)");
    }
}

/// Timing: at bcrypt's default cost, an unknown user takes as long as a known user's wrong
/// password (both at least a good part of one verification); a verified credential is then
/// remembered, so the browser's next request costs no verification.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_user_costs_what_a_known_one_does() {
    let ts = common::start_with(
        "[admin]\naddress = \"127.0.0.1:0\"\n[[route]]\nprefix = \"/admin\"\nroot = \"{dir}/site\"\n\
         basic_auth = { realm = \"ops\", users = \"{dir}/users\" }\n",
        |d| {
            users_file(d, "users", &[("alice", "s3cret", bcrypt::DEFAULT_COST)]);
            std::fs::create_dir_all(d.join("site/admin")).unwrap();
            std::fs::write(d.join("site/admin/a.txt"), "a").unwrap();
        },
    );
    let plain = ts.addrs[1];
    let hash = bcrypt::hash("x", bcrypt::DEFAULT_COST).unwrap();
    let t = Instant::now();
    assert!(!bcrypt::verify("y", &hash).unwrap());
    let one = t.elapsed();
    let timed = |user: &'static str, password: &'static str| async move {
        let auth = basic(user, password);
        let t = Instant::now();
        let s = get(plain, "/admin/a.txt", &[("Authorization", &auth)])
            .await
            .0;
        (s, t.elapsed())
    };
    let (s_known, known) = timed("alice", "guess").await;
    let (s_unknown, unknown) = timed("mallory", "guess").await;
    assert_eq!((s_known, s_unknown), (401, 401));
    let floor = one.mul_f64(0.3);
    assert!(
        known >= floor && unknown >= floor,
        "one verification {one:?}: known user {known:?}, unknown user {unknown:?}"
    );
    let (s, first) = timed("alice", "s3cret").await;
    let (s2, second) = timed("alice", "s3cret").await;
    assert_eq!((s, s2), (200, 200));
    assert!(
        first >= floor && second < first / 3,
        "verified {first:?}, then from the cache {second:?}"
    );
    let m = ts.metrics().await;
    let count = |r: &str| {
        m.value(
            "qweb_basic_auth_requests_total",
            &[("route", "/admin"), ("result", r)],
        )
    };
    let counts = [
        count("passed"),
        count("cached"),
        count("refused"),
        count("busy"),
    ];
    assert_eq!(counts, [1.0, 1.0, 2.0, 0.0]);
}

/// Hostile: 200 concurrent wrong passwords while a small request on another route is timed:
/// the verifications run off the worker (one worker here), so it keeps answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guessing_flood_leaves_the_worker_responsive() {
    let ts = common::start_with(
        "[[route]]\nprefix = \"/admin\"\nroot = \"{dir}/site\"\n\
         basic_auth = { realm = \"ops\", users = \"{dir}/users\", max_pending = 200 }\n",
        |d| {
            users_file(d, "users", &[("alice", "s3cret", 8)]);
            std::fs::write(d.join("site/small.txt"), "small").unwrap();
        },
    );
    let plain = ts.addrs[1];
    let flood: Vec<_> = (0..200)
        .map(|i| {
            tokio::spawn(async move {
                let auth = basic("alice", &format!("guess{i}"));
                get(plain, "/admin/x", &[("Authorization", &auth)]).await.0
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut lat = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        assert_eq!(get(plain, "/small.txt", &[]).await.0, 200);
        lat.push(t.elapsed());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut statuses = Vec::new();
    for f in flood {
        statuses.push(f.await.unwrap());
    }
    lat.sort_unstable();
    let p99 = lat[lat.len() * 99 / 100];
    let still_flooding = statuses.iter().all(|s| *s == 401);
    eprintln!(
        "beside 200 concurrent wrong passwords: p99 {p99:?}, max {:?}",
        lat[lat.len() - 1]
    );
    assert!(still_flooding, "{statuses:?}");
    assert!(p99 < Duration::from_millis(200), "p99 {p99:?} of {lat:?}");
}

/// Hostile: past `max_pending` verifications waiting, 503 with `Retry-After` at once rather
/// than a queue that grows with the flood.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_pending_503_at_once() {
    let ts = common::start_with(
        "[[route]]\nprefix = \"/admin\"\nroot = \"{dir}/site\"\n\
         basic_auth = { realm = \"ops\", users = \"{dir}/users\", max_pending = 2 }\n",
        |d| users_file(d, "users", &[("alice", "s3cret", bcrypt::DEFAULT_COST)]),
    );
    let plain = ts.addrs[1];
    let t = Instant::now();
    let flood: Vec<_> = (0..12)
        .map(|i| {
            tokio::spawn(async move {
                let auth = basic("alice", &format!("guess{i}"));
                let req = format!(
                    "GET /admin/x HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nAuthorization: {auth}\r\n\r\n"
                );
                let out = common::raw_exchange(plain, req.as_bytes(), TIMEOUT).await;
                let text = String::from_utf8_lossy(&out).into_owned();
                (text.split(' ').nth(1).unwrap_or("").to_owned(), text.to_ascii_lowercase().contains("retry-after: 1"), t.elapsed())
            })
        })
        .collect();
    let mut got = Vec::new();
    for f in flood {
        got.push(f.await.unwrap());
    }
    let refused: Vec<_> = got.iter().filter(|g| g.0 == "503").collect();
    let checked = got.iter().filter(|g| g.0 == "401").count();
    assert!(!refused.is_empty() && checked >= 2, "{got:?}");
    assert!(refused.iter().all(|g| g.1), "Retry-After: {got:?}");
    let slowest_401 = got
        .iter()
        .filter(|g| g.0 == "401")
        .map(|g| g.2)
        .max()
        .unwrap();
    let slowest_503 = refused.iter().map(|g| g.2).max().unwrap();
    assert!(slowest_503 < slowest_401, "503s come at once: {got:?}");
}

/// A users file with a refused hash: the configuration is refused naming the key, the file
/// and the line; on reload the configuration that runs stays (its credentials still pass),
/// and a good new file replaces the users and forgets the cached credentials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_users_file_is_refused_by_line_and_a_reload_keeps_the_old_one() {
    let dir = tempfile::tempdir().unwrap();
    for (hash, why) in [
        ("$apr1$r31.....$HqJZimcKQFAMYayBlzkrA/", "MD5"),
        ("{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=", "SHA1"),
        ("rl0uE2bHSvp5A", "DES crypt"),
        ("password", "plain-text"),
    ] {
        let ok = bcrypt::hash("x", 4).unwrap();
        std::fs::write(
            dir.path().join("bad"),
            format!("# c\nok:{ok}\nbad:{hash}\n"),
        )
        .unwrap();
        let err = qweb_server::Config::from_str_at(
            &format!(
                "[[route]]\nprefix = \"/\"\nroot = \"/tmp\"\nbasic_auth = {{ realm = \"ops\", users = \"{}/bad\" }}\n",
                dir.path().display()
            ),
            None,
        )
        .map(|_| ())
        .expect_err(hash)
        .to_string();
        assert!(
            err.contains("`route[0].basic_auth.users`")
                && err.contains("line 3")
                && err.contains(why),
            "{hash}: {err}"
        );
    }
    for (value, key) in [
        (
            "{ realm = \"o\\\"ps\", users = \"/x\" }",
            "route[0].basic_auth.realm",
        ),
        (
            "{ realm = \"ops\", users = \"/nonexistent/users\" }",
            "route[0].basic_auth.users",
        ),
    ] {
        let err = qweb_server::Config::from_str_at(
            &format!("[[route]]\nprefix = \"/\"\nroot = \"/tmp\"\nbasic_auth = {value}\n"),
            None,
        )
        .map(|_| ())
        .expect_err(value)
        .to_string();
        assert!(err.contains(&format!("`{key}`")), "{value}: {err}");
    }
    // a fixed port, which a reload keeps
    let port = common::free_port();
    let mut ts = common::start_with(
        &format!(
            "[[listener]]\naddress = \"127.0.0.1:{port}\"\n\
             [[route]]\nprefix = \"/admin\"\nroot = \"{{dir}}/site\"\n\
             basic_auth = {{ realm = \"ops\", users = \"{{dir}}/users\" }}\n"
        ),
        |d| {
            users_file(d, "users", &[("alice", "old", 4)]);
            std::fs::create_dir_all(d.join("site/admin")).unwrap();
            std::fs::write(d.join("site/admin/a.txt"), "a").unwrap();
        },
    );
    let plain = ts.addrs[0];
    let old = basic("alice", "old");
    let new = basic("alice", "new");
    assert_eq!(
        get(plain, "/admin/a.txt", &[("Authorization", &old)])
            .await
            .0,
        200
    );
    let users = ts.dir.path().join("users");
    std::fs::write(&users, "alice:$apr1$r31.....$HqJZimcKQFAMYayBlzkrA/\n").unwrap();
    let server = ts.server.as_mut().unwrap();
    let err = server
        .reload_from(None)
        .expect_err("a bad users file")
        .to_string();
    assert!(err.contains("line 1") && err.contains("MD5"), "{err}");
    assert_eq!(
        get(plain, "/admin/a.txt", &[("Authorization", &old)])
            .await
            .0,
        200,
        "kept"
    );
    users_file(ts.dir.path(), "users", &[("alice", "new", 4)]);
    ts.server
        .as_mut()
        .unwrap()
        .reload_from(None)
        .expect("a good users file");
    assert_eq!(
        get(plain, "/admin/a.txt", &[("Authorization", &old)])
            .await
            .0,
        401,
        "cache gone"
    );
    assert_eq!(
        get(plain, "/admin/a.txt", &[("Authorization", &new)])
            .await
            .0,
        200
    );
}
