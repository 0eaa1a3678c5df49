//! Issue 39's done-when: `qweb -t` names the key (and the line) of every bad value of the
//! traffic-control keys: `rate_limit`, `allow`/`deny`, `basic_auth`, `forward_auth`,
//! `proxy_protocol`, `upstream_proxy_protocol`, `connections_per_client`. `qweb -t` prints
//! this error as it is (`tests/it/cli.rs` checks a few through the binary).

use super::*;

const ROUTE: &str = "[[route]]\nprefix = \"/\"\n";

/// The error of `text`, read as `dir/q.toml`.
fn err_at(dir: &Path, text: &str) -> String {
    Config::from_str_at(text, Some(&dir.join("q.toml")))
        .map(|_| ())
        .expect_err(text)
        .to_string()
}

/// Each `(text, line, key)` is refused with `q.toml:LINE:` and ``key `KEY` ``.
fn refused_by_key(dir: &Path, cases: &[(String, usize, &str)]) {
    let mut bad = Vec::new();
    for (text, line, key) in cases {
        let e = err_at(dir, text);
        let at = format!("q.toml:{line}:");
        if !e.contains(&at) || !e.contains(&format!("key `{key}`")) {
            bad.push(format!("{key} (line {line}):\n  {text:?}\n  -> {e}"));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn every_bad_forward_auth_value_names_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let fa = |v: &str| format!("{ROUTE}root = \"/tmp\"\nforward_auth = {v}\n");
    let k = "route[0].forward_auth";
    let cases: Vec<(String, usize, String)> = vec![
        (fa("{ upstream = \"no port\" }"), 4, format!("{k}.upstream")),
        (
            fa("{ upstream = \"https://127.0.0.1:9000\" }"),
            4,
            format!("{k}.upstream"),
        ),
        (fa("{ upstream = 9000 }"), 4, format!("{k}.upstream")),
        (
            fa("{ upstream = \"127.0.0.1:9000\", path = \"check\" }"),
            4,
            format!("{k}.path"),
        ),
        (
            fa("{ upstream = \"127.0.0.1:9000\", copy_headers = [\"X-User\", \"bad name\"] }"),
            4,
            format!("{k}.copy_headers[1]"),
        ),
        (
            fa("{ upstream = \"127.0.0.1:9000\", timeout = \"0s\" }"),
            4,
            format!("{k}.timeout"),
        ),
        (
            fa("{ upstream = \"127.0.0.1:9000\", timeout = \"2m\" }"),
            4,
            format!("{k}.timeout"),
        ),
        (
            fa("{ upstream = \"127.0.0.1:9000\", timeout = \"soon\" }"),
            4,
            format!("{k}.timeout"),
        ),
        (
            fa("{ upstream = \"127.0.0.1:9000\", max_response_size = \"1GiB\" }"),
            4,
            format!("{k}.max_response_size"),
        ),
        (
            fa("{ upstream = \"127.0.0.1:9000\", copy_header = [\"X-User\"] }"),
            4,
            format!("{k}.copy_header"),
        ),
    ];
    let cases: Vec<(String, usize, &str)> = cases
        .iter()
        .map(|(t, l, k)| (t.clone(), *l, k.as_str()))
        .collect();
    refused_by_key(dir.path(), &cases);
}

#[test]
fn every_bad_basic_auth_value_names_its_key() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("users"),
        "alice:$2y$05$2ATDSb0nT4KsJnAu5QQ1Ue7dm1nFRWfUcjclf14DfYqOuvwQ1yrQS\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("md5"),
        "# ok\nbob:$apr1$abc$defghijklmnopqrstuv\n",
    )
    .unwrap();
    let ba = |v: &str| format!("{ROUTE}root = \"/tmp\"\nbasic_auth = {v}\n");
    let site = |v: &str| {
        format!("[[site]]\nserver_names = [\"a.test\"]\nbasic_auth = {v}\nroute = [{{ prefix = \"/\", root = \"/tmp\" }}]\n")
    };
    let k = "route[0].basic_auth";
    let cases: Vec<(String, usize, String)> = vec![
        (
            ba("{ realm = \"a\\\"b\", users = \"users\" }"),
            4,
            format!("{k}.realm"),
        ),
        (
            ba("{ realm = \"\", users = \"users\" }"),
            4,
            format!("{k}.realm"),
        ),
        (
            ba("{ realm = \"ops\", users = \"missing\" }"),
            4,
            format!("{k}.users"),
        ),
        (
            ba("{ realm = \"ops\", users = \"md5\" }"),
            4,
            format!("{k}.users"),
        ),
        (ba("{ realm = \"ops\" }"), 4, k.to_owned()),
        (
            ba("{ realm = \"ops\", users = \"users\", max_pending = 0 }"),
            4,
            format!("{k}.max_pending"),
        ),
        (
            ba("{ realm = \"ops\", users = \"users\", cache_size = -1 }"),
            4,
            format!("{k}.cache_size"),
        ),
        (
            ba("{ realm = \"ops\", users = \"users\", cache_size = 2000000 }"),
            4,
            format!("{k}.cache_size"),
        ),
        (
            ba("{ realm = \"ops\", users = \"users\", cache_ttl = \"2h\" }"),
            4,
            format!("{k}.cache_ttl"),
        ),
        (
            ba("{ realm = \"ops\", users = \"users\", forward_authorization = \"yes\" }"),
            4,
            format!("{k}.forward_authorization"),
        ),
        (
            site("{ realm = \"ops\", users = \"md5\" }"),
            3,
            "site[0].basic_auth.users".to_owned(),
        ),
    ];
    let cases: Vec<(String, usize, &str)> = cases
        .iter()
        .map(|(t, l, k)| (t.clone(), *l, k.as_str()))
        .collect();
    refused_by_key(dir.path(), &cases);
    // the refused hash's line is named
    let e = err_at(dir.path(), &ba("{ realm = \"ops\", users = \"md5\" }"));
    assert!(e.contains("line 2"), "{e}");
}

#[test]
fn every_bad_access_rate_and_proxy_protocol_value_names_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let route = |v: &str| format!("{ROUTE}root = \"/tmp\"\n{v}\n");
    let cases: Vec<(String, usize, &str)> = vec![
        (route("allow = [\"10.0.0.0/33\"]"), 4, "route[0].allow[0]"),
        (route("allow = \"10.0.0.0/8\""), 4, "route[0].allow"),
        (route("deny = [\"::1\", \"localhost\"]"), 4, "route[0].deny[1]"),
        (
            "[[site]]\nserver_names = [\"a.test\"]\nallow = [\"office\"]\nroute = [{ prefix = \"/\", root = \"/tmp\" }]\n"
                .to_owned(),
            3,
            "site[0].allow[0]",
        ),
        (
            "[[site]]\nserver_names = [\"a.test\"]\ndeny = [\"1.2.3.4/40\"]\nroute = [{ prefix = \"/\", root = \"/tmp\" }]\n"
                .to_owned(),
            3,
            "site[0].deny[0]",
        ),
        (route("rate_limit = { rate = 10 }"), 4, "route[0].rate_limit.rate"),
        (
            route("rate_limit = { rate = \"0/s\" }"),
            4,
            "route[0].rate_limit.rate",
        ),
        (
            route("rate_limit = { rate = \"10/s\", burst = \"five\" }"),
            4,
            "route[0].rate_limit.burst",
        ),
        (
            route("rate_limit = { rate = \"10/s\", key = \"header:\" }"),
            4,
            "route[0].rate_limit.key",
        ),
        (
            route("rate_limit = { rate = \"10/s\", dry_run = 1 }"),
            4,
            "route[0].rate_limit.dry_run",
        ),
        (
            "[[route]]\nprefix = \"/\"\nupstreams = [\"127.0.0.1:3000\"]\nupstream_proxy_protocol = \"v3\"\n"
                .to_owned(),
            4,
            "route[0].upstream_proxy_protocol",
        ),
        (
            "[[listener]]\naddress = \"127.0.0.1:0\"\nproxy_protocol = { trusted = \"10.0.0.0/8\" }\n"
                .to_owned(),
            3,
            "listener[0].proxy_protocol.trusted",
        ),
        (
            "[[listener]]\naddress = \"127.0.0.1:0\"\nproxy_protocol = { trusted = [\"10.0.0.0/8\"], timeout = \"1s\" }\n"
                .to_owned(),
            3,
            "listener[0].proxy_protocol.timeout",
        ),
        (
            "[limits]\nmax_connections_per_worker = 100\nconnections_per_client = 1.5\n".to_owned(),
            3,
            "limits.connections_per_client",
        ),
    ];
    refused_by_key(dir.path(), &cases);
}
