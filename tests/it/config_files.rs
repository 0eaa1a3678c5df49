//! The configuration as a user meets it through the `qweb` binary: includes, environment
//! variables, the default path, the check flags (`-t`, `serve --check`, `check-config`),
//! reloads that re-read included files, the split example, and the systemd unit.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use qweb_testkit::process::{serve_command, write_file, Qweb, BANNER_END};

const BIN: &str = env!("CARGO_BIN_EXE_qweb");

/// `qweb ARGS` with `env`, run to its end.
fn qweb(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("QWEB_CONFIG")
        .env_remove("RUST_LOG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run qweb")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `curl URL` (`-k`: the self-signed certificate): status and body.
fn curl(url: &str) -> (u16, String) {
    let o = Command::new("curl")
        .args(["-sk", "--max-time", "10", "-w", "\n%{http_code}", url])
        .output()
        .expect("curl (apt-get install curl)");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let (body, code) = out.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

fn site(dir: &Path, name: &str, file: &str, body: &str) -> PathBuf {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join(file), body).unwrap();
    d
}

/// `-t -c`, `serve --check --config` and `check-config`: 0 and "ok" for a valid
/// configuration (includes and variables resolved), 1 and the file, line, column and key of
/// the first error otherwise, wherever it is: the main file, an included one, a variable.
#[test]
fn check_flags_say_ok_or_where_the_error_is() {
    let d = tempfile::tempdir().unwrap();
    site(d.path(), "www", "index.html", "hi");
    let main = write_file(
        d.path(),
        "qweb.toml",
        "include = [\"conf.d/*.toml\"]\nworkers = \"${CHECK_WORKERS:-1}\"\n[[listener]]\naddress = \"127.0.0.1:${CHECK_PORT}\"\n",
    );
    std::fs::create_dir(d.path().join("conf.d")).unwrap();
    write_file(
        d.path(),
        "conf.d/route.toml",
        "[[route]]\nprefix = \"/\"\nroot = \"../www\"\n",
    );
    let m = main.to_str().unwrap();
    let env = [("CHECK_PORT", "0"), ("CHECK_WORKERS", "2")];
    for args in [
        vec!["-t", "-c", m],
        vec!["serve", "--check", "--config", m],
        vec!["check-config", m],
    ] {
        let o = qweb(&args, &env);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
        assert!(
            text(&o).contains(&format!(
                "{m} (and 1 included file(s)): ok (1 listener(s), 1 route(s), 2 worker(s))"
            )),
            "{}",
            text(&o)
        );
    }
    // an unset variable without a default: where its `${` is
    let o = qweb(&["-t", "-c", m], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains(&format!(
            "{m}:4:22: key `listener[0].address`: environment variable `CHECK_PORT` is not set"
        )),
        "{}",
        text(&o)
    );
    // an error in an included file names that file
    let inc = write_file(
        d.path(),
        "conf.d/route.toml",
        "[[route]]\nprefix = \"/\"\nroot = \"../nowhere\"\n",
    );
    let o = qweb(&["serve", "--check", "--config", m], &env);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).contains(&format!("{}:3:8: key `route[0].root`", inc.display())),
        "{}",
        text(&o)
    );
    // and serve refuses to start with it, saying the same
    let o = qweb(&["serve", "--config", m], &env);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).contains("route.toml:3:8"), "{}", text(&o));
}

/// Without `--config`, qweb reads `$QWEB_CONFIG` (standing in for /etc/qweb/qweb.toml) when
/// that file exists and says so in its banner; when it does not, `-t` checks the built-in
/// default and says why.
#[test]
fn the_default_path_is_used_when_it_exists() {
    let d = tempfile::tempdir().unwrap();
    let www = site(d.path(), "www", "index.html", "default path");
    let cfg = write_file(
        d.path(),
        "qweb.toml",
        &format!(
            "workers = 1\nstate_dir = \"state\"\n[[listener]]\naddress = \"127.0.0.1:0\"\n[[route]]\nprefix = \"/\"\nroot = \"{}\"\n",
            www.display()
        ),
    );
    let mut cmd = Command::new(BIN);
    cmd.arg("serve")
        .env("QWEB_CONFIG", &cfg)
        .env_remove("RUST_LOG")
        .env_remove("NOTIFY_SOCKET")
        .stdout(Stdio::null());
    let q = Qweb::spawn(cmd, BANNER_END);
    assert!(
        q.banner
            .iter()
            .any(|l| l == &format!("qweb: configuration {}", cfg.display())),
        "{:?}",
        q.banner
    );
    let (code, body) = curl(&format!("http://{}/", q.addr("http")));
    assert_eq!((code, body.as_str()), (200, "default path"));
    drop(q);

    let missing = d.path().join("missing.toml");
    let o = qweb(&["-t"], &[("QWEB_CONFIG", missing.to_str().unwrap())]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains(&format!(
            "the built-in default (QWEB_CONFIG={} does not exist): ok",
            missing.display()
        )),
        "{}",
        text(&o)
    );
}

/// A reload (`qweb reload`, which finds the process through its pid file, and SIGHUP)
/// re-reads the included files: a site file added to `sites/` is served after it; a broken
/// one is refused with its own file and line, and the running configuration stays.
#[test]
fn reload_rereads_included_files() {
    let d = tempfile::tempdir().unwrap();
    let port = qweb_testkit::free_port();
    std::fs::create_dir(d.path().join("sites")).unwrap();
    site(d.path(), "a", "x.txt", "from a");
    site(d.path(), "b", "y.txt", "from b");
    let main = write_file(
        d.path(),
        "qweb.toml",
        &format!("include = \"sites/*.toml\"\nworkers = 1\nstate_dir = \"state\"\n[[listener]]\naddress = \"127.0.0.1:{port}\"\n"),
    );
    write_file(
        d.path(),
        "sites/a.toml",
        "[[route]]\nprefix = \"/a/\"\nroot = \"../a\"\nstrip_prefix = true\n",
    );
    let q = Qweb::spawn(serve_command(BIN, &main), BANNER_END);
    let base = format!("http://127.0.0.1:{port}");
    assert_eq!(curl(&format!("{base}/a/x.txt")).1, "from a");
    assert_eq!(curl(&format!("{base}/b/y.txt")).0, 404);

    write_file(
        d.path(),
        "sites/b.toml",
        "[[route]]\nprefix = \"/b/\"\nroot = \"../b\"\nstrip_prefix = true\n",
    );
    let o = qweb(&["reload", "--config", main.to_str().unwrap()], &[]);
    assert!(o.status.success(), "{}", text(&o));
    q.wait_for("configuration reloaded", 1);
    assert_eq!(curl(&format!("{base}/b/y.txt")).1, "from b");

    let bad = write_file(
        d.path(),
        "sites/c.toml",
        "[[route]]\nprefix = \"/c/\"\nroot = \"../b\"\nbogus = 1\n",
    );
    q.signal(libc::SIGHUP);
    let line = q.wait_for("reload refused", 1);
    assert!(
        line.contains(&format!("{}:4:1: key `route[2].bogus`", bad.display())),
        "{line}"
    );
    assert_eq!(curl(&format!("{base}/b/y.txt")).1, "from b");
    // `qweb reload` checks the file first: with the broken include it signals nothing
    let o = qweb(&["reload", "--config", main.to_str().unwrap()], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("c.toml:4:1"), "{}", text(&o));
}

/// examples/split: a configuration split into includes, ports from the environment. It
/// passes the check with its defaults, and serves (on ports the test picks through
/// `QWEB_HTTPS_PORT`/`QWEB_HTTP_PORT`) the example site over HTTPS and HTTP.
#[test]
fn the_split_example_checks_and_serves() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/split/qweb.toml");
    let e = example.to_str().unwrap();
    let o = qweb(&["-t", "-c", e], &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("(and 3 included file(s)): ok (2 listener(s), 2 route(s)"),
        "{}",
        text(&o)
    );

    let state = tempfile::tempdir().unwrap();
    let mut cmd = serve_command(BIN, &example);
    cmd.env("QWEB_HTTPS_PORT", "0")
        .env("QWEB_HTTP_PORT", "0")
        .env("QWEB_WORKERS", "1")
        .env("QWEB_STATE_DIR", state.path());
    let q = Qweb::spawn(cmd, BANNER_END);
    assert!(
        q.banner.iter().any(|l| l.contains("1 worker(s)")),
        "{:?}",
        q.banner
    );
    let index = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/site/index.html"),
    )
    .unwrap();
    for url in [
        format!("https://{}/", q.addr("https")),
        format!("http://{}/", q.addr("http")),
    ] {
        let (code, body) = curl(&url);
        assert_eq!(code, 200, "{url}");
        assert_eq!(body, index, "{url}");
    }
}

/// examples/qweb.service passes `systemd-analyze verify` without a single warning (on
/// systemd 252, Debian 12's, `Type=notify-reload` and `ReloadSignal` were warnings). The
/// unit's binary path is pointed at this build's binary, which verify checks exists.
#[test]
fn the_systemd_unit_verifies() {
    if !qweb_testkit::tools::require("systemd-analyze") {
        return;
    }
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/qweb.service"),
    )
    .unwrap();
    assert!(
        unit.contains("ExecReload=/usr/local/bin/qweb reload"),
        "{unit}"
    );
    let d = tempfile::tempdir().unwrap();
    let path = write_file(
        d.path(),
        "qweb.service",
        &unit.replace("/usr/local/bin/qweb", BIN),
    );
    let o = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .expect("systemd-analyze");
    let out = text(&o);
    let about_unit: Vec<&str> = out.lines().filter(|l| l.contains("qweb.service")).collect();
    assert!(o.status.success() && about_unit.is_empty(), "{out}");
}
