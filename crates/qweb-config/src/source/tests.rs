//! Includes and variables, through `Config` (the typed result) and `load` (the tree).

use std::path::{Path, PathBuf};

use super::*;
use crate::Config;

fn env(name: &str) -> Result<Option<String>, String> {
    Ok(match name {
        "PORT" => Some("8443".into()),
        "WORKERS" => Some("3".into()),
        "HTTP2" => Some("false".into()),
        "NAME" => Some("example.com".into()),
        "INJECT" => Some("x\"\n[admin]\naddress = \"127.0.0.1:9\"\n".into()),
        _ => None,
    })
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(&p, text).unwrap();
    p
}

fn config(main: &Path) -> Result<Config, ConfigError> {
    let text = read_limited(main).unwrap();
    Config::from_str_with_env(&text, Some(main), &env)
}

fn err(main: &Path) -> String {
    config(main).unwrap_err().to_string()
}

const ROUTE: &str = "[[route]]\nprefix = \"/\"\nroot = \".\"\n";

#[test]
fn includes_merge_tables_and_append_arrays_of_tables() {
    let d = tempfile::tempdir().unwrap();
    let main = write(
        d.path(),
        "qweb.toml",
        "include = [\"sites/*.toml\", \"limits.toml\"]\nworkers = 1\n[[listener]]\naddress = \"127.0.0.1:0\"\n",
    );
    write(
        d.path(),
        "limits.toml",
        "[limits]\nkeepalive_timeout = \"7s\"\n",
    );
    // sorted by name; hidden files and non-matching names are not included
    write(
        d.path(),
        "sites/b.toml",
        "[[route]]\nprefix = \"/b\"\nroot = \"www\"\n",
    );
    write(
        d.path(),
        "sites/a.toml",
        "[[route]]\nprefix = \"/a\"\nroot = \"www\"\n[[listener]]\naddress = \"127.0.0.1:0\"\n",
    );
    write(d.path(), "sites/.a.toml.swp", "garbage = [");
    write(d.path(), "sites/notes.txt", "garbage = [");
    std::fs::create_dir_all(d.path().join("sites/www")).unwrap();
    let c = config(&main).unwrap();
    assert_eq!(c.listeners.len(), 2);
    assert_eq!(c.limits.keepalive_timeout.as_secs(), 7);
    let roots: Vec<_> = c
        .routes
        .iter()
        .filter_map(|r| match &r.action {
            crate::RouteAction::Static(s) => Some(s.root.clone()),
            _ => None,
        })
        .collect();
    // relative paths are relative to the file they are written in
    assert!(roots.iter().all(|r| r.ends_with("sites/www")), "{roots:?}");
    assert_eq!(c.files.len(), 4, "{:?}", c.files);
    assert!(c.files[1].ends_with("sites/a.toml"), "{:?}", c.files);
}

#[test]
fn errors_in_an_included_file_name_it() {
    let d = tempfile::tempdir().unwrap();
    let main = write(
        d.path(),
        "qweb.toml",
        "include = \"site.toml\"\nworkers = 1\n",
    );
    let inc = write(
        d.path(),
        "site.toml",
        "\n[limits]\nkeepalive_timeout = \"5 fortnights\"\n",
    );
    let e = err(&main);
    assert!(
        e.starts_with(&format!(
            "{}:3:21: key `limits.keepalive_timeout`",
            inc.display()
        )),
        "{e}"
    );
    write(d.path(), "site.toml", "[limits]\nbogus = 1\n");
    let e = err(&main);
    assert!(
        e.starts_with(&format!("{}:2:1: key `limits.bogus`", inc.display())),
        "{e}"
    );
    write(d.path(), "site.toml", "[limits\n");
    let e = err(&main);
    assert!(e.starts_with(&format!("{}:1:", inc.display())), "{e}");
}

#[test]
fn a_key_set_in_two_files_names_both() {
    let d = tempfile::tempdir().unwrap();
    let main = write(
        d.path(),
        "qweb.toml",
        "include = [\"a.toml\"]\nworkers = 1\n",
    );
    let a = write(d.path(), "a.toml", "# a\nworkers = 2\n");
    let e = err(&main);
    assert!(
        e.starts_with(&format!("{}:2:1: key `workers`", a.display())),
        "{e}"
    );
    assert!(
        e.contains(&format!("also set at {}:2:1", main.display())),
        "{e}"
    );
    write(d.path(), "a.toml", "[limits]\nkeepalive_timeout = 1\n");
    write(
        d.path(),
        "qweb.toml",
        "include = [\"a.toml\"]\n[limits]\nkeepalive_timeout = 2\n",
    );
    let e = err(&main);
    assert!(e.contains("key `limits.keepalive_timeout`"), "{e}");
}

#[test]
fn missing_files_folders_and_empty_globs() {
    let d = tempfile::tempdir().unwrap();
    let main = write(
        d.path(),
        "qweb.toml",
        "workers = 1\ninclude = [\"none/*.toml\", \"x/*.toml\"]\n",
    );
    std::fs::create_dir(d.path().join("x")).unwrap();
    config(&main).expect("a glob may match nothing");
    write(
        d.path(),
        "qweb.toml",
        "workers = 1\ninclude = [\"x/*.toml\", \"gone.toml\"]\n",
    );
    let e = err(&main);
    assert!(
        e.starts_with(&format!("{}:2:24: key `include[1]`", main.display())),
        "{e}"
    );
    assert!(e.contains("gone.toml") && e.contains("No such file"), "{e}");
    write(d.path(), "qweb.toml", "include = \"x\"\n");
    assert!(err(&main).contains("is a folder"), "{}", err(&main));
    write(d.path(), "qweb.toml", "include = [\"*/*.toml\"]\n");
    assert!(err(&main).contains("only the last component"));
    write(d.path(), "qweb.toml", "include = [1]\n");
    assert!(err(&main).contains("not an integer"), "{}", err(&main));
    write(d.path(), "qweb.toml", "include = \"/dev/null\"\n");
    assert!(err(&main).contains("not a regular file"), "{}", err(&main));
}

#[test]
fn cycles_duplicates_and_depth_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let main = write(d.path(), "qweb.toml", "include = \"a.toml\"\n");
    write(d.path(), "a.toml", "include = \"b.toml\"\n");
    write(d.path(), "b.toml", "include = \"a.toml\"\n");
    let e = err(&main);
    assert!(e.contains("include cycle: "), "{e}");
    assert!(e.contains("a.toml -> ") && e.contains("b.toml -> "), "{e}");
    write(d.path(), "b.toml", "include = \"../../../../..\"\n");
    assert!(err(&main).contains("is a folder"));

    write(
        d.path(),
        "qweb.toml",
        "include = [\"a.toml\", \"./a.toml\"]\n",
    );
    write(d.path(), "a.toml", "");
    let e = err(&main);
    assert!(
        e.contains("key `include[1]`") && e.contains("already included at"),
        "{e}"
    );

    // a chain deeper than the limit
    for i in 0..=MAX_INCLUDE_DEPTH + 1 {
        write(
            d.path(),
            &format!("d{i}.toml"),
            &format!("include = \"d{}.toml\"\n", i + 1),
        );
    }
    write(d.path(), "qweb.toml", "include = \"d0.toml\"\n");
    let e = err(&main);
    assert!(
        e.contains(&format!("more than {MAX_INCLUDE_DEPTH} levels")),
        "{e}"
    );
    // at the limit it loads
    write(
        d.path(),
        &format!("d{}.toml", MAX_INCLUDE_DEPTH - 1),
        "workers = 1\n",
    );
    config(&main).expect("at the depth limit");
}

#[test]
fn symlink_loops_and_huge_files_are_refused() {
    let d = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(d.path().join("l2"), d.path().join("l1")).unwrap();
    std::os::unix::fs::symlink(d.path().join("l1"), d.path().join("l2")).unwrap();
    let main = write(d.path(), "qweb.toml", "include = \"l1\"\n");
    let e = err(&main);
    assert!(
        e.contains("cannot include") && e.contains("symbolic links"),
        "{e}"
    );
    write(d.path(), "qweb.toml", "include = \"l*\"\n");
    assert!(err(&main).contains("symbolic links"));

    let big = d.path().join("big.toml");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(MAX_CONFIG_FILE_SIZE + 1).unwrap();
    write(d.path(), "qweb.toml", "include = \"big.toml\"\n");
    let e = err(&main);
    assert!(e.contains("larger than 4 MiB"), "{e}");
    let e = Config::from_file(&big).unwrap_err().to_string();
    assert!(e.contains("larger than 4 MiB"), "{e}");
}

#[test]
fn too_many_files_are_refused() {
    let d = tempfile::tempdir().unwrap();
    for i in 0..MAX_CONFIG_FILES {
        write(d.path(), &format!("many/{i:05}.toml"), "");
    }
    let main = write(d.path(), "qweb.toml", "include = \"many/*.toml\"\n");
    let e = err(&main);
    assert!(
        e.contains(&format!("more than {MAX_CONFIG_FILES} configuration files")),
        "{e}"
    );
    std::fs::remove_file(d.path().join("many/00000.toml")).unwrap();
    config(&main).expect("exactly the limit");
}

#[test]
fn variables_in_values() {
    let d = tempfile::tempdir().unwrap();
    let main = write(
        d.path(),
        "qweb.toml",
        "workers = \"${WORKERS}\"\n[[listener]]\naddress = \"127.0.0.1:${PORT}\"\nhttp2 = \"${HTTP2}\"\n[limits]\nkeepalive_timeout = \"${KEEPALIVE:-9s}\"\n",
    );
    let c = config(&main).unwrap();
    assert_eq!(c.workers, 3);
    assert_eq!(c.listeners[0].address.port(), 8443);
    assert!(!c.listeners[0].http2);
    assert_eq!(c.limits.keepalive_timeout.as_secs(), 9);

    write(
        d.path(),
        "qweb.toml",
        "workers = 1\n\n[[listener]]\naddress = \"127.0.0.1:${UNSET_PORT}\"\n",
    );
    let e = err(&main);
    assert!(
        e.starts_with(&format!(
            "{}:4:22: key `listener[0].address`",
            main.display()
        )),
        "{e}"
    );
    assert!(e.contains("`UNSET_PORT` is not set"), "{e}");
    // a variable that is not a number where one is expected
    write(
        d.path(),
        "qweb.toml",
        "workers = 1\n[limits]\nmax_connections_per_worker = \"${NAME}\"\n",
    );
    let e = err(&main);
    assert!(
        e.contains(":3:30: key `limits.max_connections_per_worker`"),
        "{e}"
    );
    assert!(
        e.contains("`NAME` is \"example.com\": expected an integer"),
        "{e}"
    );
    // a literal string is not converted
    write(
        d.path(),
        "qweb.toml",
        "[limits]\nmax_connections_per_worker = \"5\"\n",
    );
    assert!(
        err(&main).contains("invalid type: string"),
        "{}",
        err(&main)
    );
}

#[test]
fn a_variable_cannot_inject_toml() {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir(d.path().join("www")).unwrap();
    let main = write(
        d.path(),
        "qweb.toml",
        "[[route]]\nprefix = \"/\"\nroot = \"www\"\nindex = \"${INJECT}\"\n",
    );
    let c = config(&main).unwrap();
    assert!(c.admin.is_none());
    match &c.routes[0].action {
        crate::RouteAction::Static(s) => assert!(s.index.contains("[admin]")),
        _ => panic!("static route"),
    }
}

#[test]
fn includes_may_use_variables_and_escapes_stay_literal() {
    let d = tempfile::tempdir().unwrap();
    let main = write(
        d.path(),
        "qweb.toml",
        &format!("include = \"${{SITES:-conf.d}}/*.toml\"\n{ROUTE}index = \"$${{NAME}}\"\n"),
    );
    write(d.path(), "conf.d/x.toml", "workers = \"${WORKERS}\"\n");
    let c = config(&main).unwrap();
    assert_eq!(c.workers, 3);
    match &c.routes[0].action {
        crate::RouteAction::Static(s) => assert_eq!(s.index, "${NAME}"),
        _ => panic!("static route"),
    }
}

#[test]
fn globs() {
    for (p, n, ok) in [
        ("*.toml", "a.toml", true),
        ("*.toml", "a.toml.bak", false),
        ("site-?.toml", "site-1.toml", true),
        ("site-?.toml", "site-12.toml", false),
        ("[ab]*", "b", true),
        ("[!ab]*", "b", false),
        ("[a-c].t", "c.t", true),
        ("[*]", "*", true),
        ("[x", "[x", true),
        (
            "*a*a*a*a*b",
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            false,
        ),
        ("**", "", true),
    ] {
        assert_eq!(glob_match(p.as_bytes(), n.as_bytes()), ok, "{p} {n}");
    }
}
