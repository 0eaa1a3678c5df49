//! The pid file and the state folder, through the real binary: `qweb reload` and `qweb
//! upgrade` signal only a qweb that holds the pid file (never a stale pid reused by another
//! process), still reach the running one across a binary upgrade, and start-up warns about a
//! state folder others can write and a private key others can read.
#![allow(unsafe_code)] // kill(2) on test processes; each block has its SAFETY note

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use qweb_testkit::process::Qweb;

const BIN: &str = env!("CARGO_BIN_EXE_qweb");

fn write_config(dir: &Path, extra: &str) -> PathBuf {
    let file = dir.join("qweb.toml");
    std::fs::create_dir_all(dir.join("site")).unwrap();
    std::fs::write(
        &file,
        format!(
            "workers = 1\nstate_dir = \"{0}/state\"\nshutdown_timeout = \"2s\"\n{extra}\
             [[listener]]\naddress = \"127.0.0.1:0\"\n\
             [[route]]\nprefix = \"/\"\nroot = \"{0}/site\"\n",
            dir.display()
        ),
    )
    .unwrap();
    file
}

fn cli(args: &[&str], config: &Path) -> Output {
    Command::new(BIN)
        .args(args)
        .arg("--config")
        .arg(config)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

fn alive(pid: i32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// After a crash the pid file names a pid that another program now has: `qweb reload` and
/// `qweb upgrade` refuse (exit 1, saying why) and that program lives on. (Before: it got
/// SIGHUP, then SIGUSR2, and died.)
#[test]
fn a_stale_pid_file_naming_another_process_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "");
    let mut other = Command::new("sleep").arg("60").spawn().unwrap();
    let pid = other.id() as i32;
    std::fs::create_dir_all(dir.path().join("state")).unwrap();
    std::fs::write(dir.path().join("state/qweb.pid"), format!("{pid}\n")).unwrap();
    for cmd in ["reload", "upgrade"] {
        let out = cli(&[cmd], &config);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{cmd}: {err}");
        assert!(
            err.contains(&format!("names process {pid}")) && err.contains("no qweb holds"),
            "{cmd}: {err}"
        );
        // give a wrongly sent signal time to land: the process must still be there
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            other.try_wait().unwrap().is_none(),
            "{cmd} killed process {pid}"
        );
    }
    let _ = other.kill();
    let _ = other.wait();
}

/// The running qweb is reached: `qweb reload` reloads it; after `qweb upgrade` the new
/// process holds the pid file and the next `qweb reload` reaches it; once it stops, the
/// file is gone and `qweb reload` says no qweb runs.
#[test]
fn reload_and_upgrade_reach_the_qweb_that_holds_the_pid_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "");
    let pid_path = dir.path().join("state/qweb.pid");
    let q = Qweb::serve(BIN, &config);
    let first = q.pid() as i32;
    let out = cli(&["reload"], &config);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    q.wait_for("configuration reloaded", 1);

    let out = cli(&["upgrade"], &config);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    q.wait_for("stops accepting, drains and exits", 1);
    let deadline = Instant::now() + Duration::from_secs(20);
    let second = loop {
        let pid: Option<i32> = std::fs::read_to_string(&pid_path)
            .ok()
            .and_then(|t| t.trim().parse().ok());
        match pid {
            Some(p) if p != first => break p,
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "no new pid: {}",
            q.lines().join("\n")
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = cli(&["reload"], &config);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    assert!(err.contains(&format!("process {second}")), "{err}");
    q.wait_for("configuration reloaded", 2);

    // SAFETY: kill(2) with the pid of the qweb this test started (through the upgrade).
    unsafe { libc::kill(second, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(20);
    while alive(second) || pid_path.exists() {
        assert!(
            Instant::now() < deadline,
            "{second} did not stop: {}",
            q.lines().join("\n")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = cli(&["reload"], &config);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no pid file"));
}

/// A state folder anyone can write (0777) and a private key anyone can read (0644): start-up
/// says so.
#[test]
fn start_warns_about_a_state_folder_others_write_and_a_key_others_read() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    // a first start makes the self-signed pair in the state folder
    let config = write_config(
        dir.path(),
        "[[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\nself_signed = true\n",
    );
    drop(Qweb::serve(BIN, &config));
    let key = state.join("selfsigned.key");
    assert!(key.exists());
    let q = Qweb::serve(BIN, &config);
    assert!(
        !q.lines().join("\n").contains("can be"),
        "{}",
        q.lines().join("\n")
    );
    drop(q);
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let q = Qweb::serve(BIN, &config);
    let text = q.lines().join("\n");
    assert!(
        text.contains(&format!(
            "{} (mode 0777) can be written by other users",
            state.display()
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "{} (mode 0644) can be read by other users",
            key.display()
        )),
        "{text}"
    );
}
