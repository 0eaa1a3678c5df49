use super::*;
use qweb_offload::{Fallback, Mode, Policy};

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::from_str_at(text, Some(Path::new("/etc/qweb/test.toml")))
}

fn err(text: &str) -> String {
    parse(text).unwrap_err().to_string()
}

#[test]
fn minimal_file_gets_defaults() {
    let c = parse("workers = 3\n").unwrap();
    assert_eq!(c.workers, 3);
    assert_eq!(c.listeners.len(), 2);
    assert_eq!(c.routes.len(), 1);
    assert_eq!(c.limits.max_request_header_size, 16 * 1024);
}

#[test]
fn unknown_key_names_file_line_and_key() {
    let e = err("workers = 2\n\n[limits]\nkeepalive_timeout = \"5s\"\nbogus = 1\n");
    assert!(
        e.starts_with("/etc/qweb/test.toml:5:1: key `limits.bogus`"),
        "{e}"
    );
    assert!(e.contains("unknown field `bogus`"), "{e}");
}

#[test]
fn wrong_type_names_the_key() {
    let e = err("[limits]\nkeepalive_timeout = \"5 fortnights\"\n");
    assert!(e.contains(":2:"), "{e}");
    assert!(e.contains("key `limits.keepalive_timeout`"), "{e}");
    assert!(e.contains("unknown duration unit"), "{e}");
    let e = err("workers = -1\n");
    assert!(e.contains(":1:") && e.contains("key `workers`"), "{e}");
}

#[test]
fn bad_listener_address() {
    let e = err("[[listener]]\naddress = \"localhost:http\"\n");
    assert!(e.contains(":2:11: key `listener[0].address`"), "{e}");
}

#[test]
fn missing_certificate_file() {
    let e = err(
        "[[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\ncertificates = [{ cert = \"/nonexistent/c.pem\", key = \"/nonexistent/k.pem\" }]\n",
    );
    assert!(e.contains(":4:"), "{e}");
    assert!(
        e.contains("key `listener[0].tls.certificates[0].cert`"),
        "{e}"
    );
    assert!(e.contains("cannot read /nonexistent/c.pem"), "{e}");
}

#[test]
fn tls_needs_certificates() {
    let e = err("[[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\n");
    assert!(e.contains("key `listener[0].tls`"), "{e}");
}

#[test]
fn route_errors() {
    let e = err("[[route]]\nprefix = \"/\"\nroot = \"/definitely/not/here\"\n");
    assert!(
        e.contains(":3:8: key `route[0].root`") && e.contains("not a directory"),
        "{e}"
    );
    let e = err("[[route]]\nprefix = \"api\"\nupstreams = [\"127.0.0.1:1\"]\n");
    assert!(e.contains("key `route[0].prefix`"), "{e}");
    let e = err("[[route]]\nprefix = \"/\"\n");
    assert!(e.contains("either `root`"), "{e}");
    let e = err("[[route]]\nprefix = \"/a\"\nupstreams = [\"127.0.0.1:1/x\"]\n");
    assert!(e.contains(":3:14: key `route[0].upstreams[0]`"), "{e}");
    let e = err("[[route]]\nprefix = \"/a\"\nupstreams = [\"127.0.0.1:1\"]\n[[route]]\nprefix = \"/a/\"\nupstreams = [\"127.0.0.1:2\"]\n");
    assert!(
        e.contains(":5:") && e.contains("used by another route"),
        "{e}"
    );
}

#[test]
fn zero_timeout_refused() {
    let e = err("[limits]\nheader_read_timeout = 0\n");
    assert!(e.contains(":2:1: key `limits.header_read_timeout`"), "{e}");
}

#[test]
fn routes_sorted_longest_first_and_relative_roots() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("site")).unwrap();
    let file = dir.path().join("q.toml");
    std::fs::write(
        &file,
        "[[route]]\nprefix = \"/\"\nroot = \"site\"\n[[route]]\nprefix = \"/api/\"\nupstreams = [\"http://127.0.0.1:9\"]\nstrip_prefix = true\n",
    )
    .unwrap();
    let c = Config::from_file(&file).unwrap();
    assert_eq!(c.routes[0].prefix, "/api");
    match &c.routes[1].action {
        RouteAction::Static(s) => assert_eq!(s.root, dir.path().join("site")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn example_config_is_valid() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/qweb.toml");
    let c = Config::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
    assert!(!c.listeners.is_empty());
}

#[test]
fn offload_errors_are_located() {
    let base = "[[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\nself_signed = true\n[listener.offload]\n";
    let e = err(&format!("{base}engine = \"gpu\"\n"));
    assert!(e.contains(":6:10: key `listener[0].offload.engine`"), "{e}");
    assert!(e.contains("no engine named `gpu` (defined: inline)"), "{e}");
    let e = err(&format!("{base}engine = \"inline\"\nmode = \"fast\"\n"));
    assert!(e.contains(":7:8: key `listener[0].offload.mode`"), "{e}");
    let e = err(&format!("{base}engine = \"inline\"\nfallback = \"pray\"\n"));
    assert!(e.contains("key `listener[0].offload.fallback`"), "{e}");
    let e =
        err("[[listener]]\naddress = \"127.0.0.1:0\"\n[listener.offload]\nengine = \"inline\"\n");
    assert!(e.contains("offload is for TLS listeners"), "{e}");
    let e = err("[offload.engines.x]\nkind = \"fpga\"\n");
    assert!(e.contains(":2:8: key `offload.engines.x.kind`"), "{e}");
    let e = err("[offload.engines.x]\nkind = \"inline\"\nthreads = 2\n");
    assert!(e.contains("key `offload.engines.x`"), "{e}");
    let e = err("[offload.engines.x]\nkind = \"pool\"\nthread = 2\n");
    assert!(e.contains("unknown field `thread`"), "{e}");
}

#[test]
fn offload_defaults() {
    let c = parse(
        "[offload.engines.p]\nkind = \"pool\"\n[[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\nself_signed = true\n[listener.offload]\nengine = \"p\"\n[[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\nself_signed = true\n[listener.offload]\nengine = \"inline\"\n",
    )
    .unwrap();
    let o = c.listeners[0].offload.as_ref().unwrap();
    assert_eq!(
        o.policy,
        Policy {
            mode: Mode::Async,
            fallback: Fallback::Software,
            timeout: Duration::from_secs(2),
        }
    );
    assert_eq!(
        c.listeners[1].offload.as_ref().unwrap().policy.mode,
        Mode::InPlace
    );
    assert!(c.offload.batch);
}

#[test]
fn static_route_symlinks() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let symlinks = |text: &str| match &parse(text).unwrap().routes[0].action {
        RouteAction::Static(s) => s.symlinks,
        _ => panic!("not static"),
    };
    let route = format!("[[route]]\nprefix = \"/\"\nroot = \"{d}\"\n");
    assert_eq!(symlinks(&route), Symlinks::InsideRoot);
    for (v, want) in [
        ("inside_root", Symlinks::InsideRoot),
        ("refuse", Symlinks::Refuse),
        ("follow", Symlinks::Follow),
    ] {
        assert_eq!(symlinks(&format!("{route}symlinks = \"{v}\"\n")), want);
    }
    let e = err(&format!("{route}symlinks = \"sometimes\"\n"));
    assert!(
        e.contains(":4:12: key `route[0].symlinks`") && e.contains("unknown symlinks mode"),
        "{e}"
    );
    let e =
        err("[[route]]\nprefix = \"/a\"\nupstreams = [\"127.0.0.1:1\"]\nsymlinks = \"refuse\"\n");
    assert!(
        e.contains(":4:12: key `route[0].symlinks`") && e.contains("for static routes"),
        "{e}"
    );
}

#[test]
fn send_timeout_and_h2_flood_budget() {
    let c = Config::from_str_at("workers = 1\n", None).unwrap();
    assert_eq!(c.limits.send_timeout, std::time::Duration::from_secs(60));
    assert_eq!(c.limits.h2_control_frames_per_second, 1000);
    let c = Config::from_str_at(
        "[limits]\nsend_timeout = \"2s\"\nh2_control_frames_per_second = 50\n",
        None,
    )
    .unwrap();
    assert_eq!(c.limits.send_timeout, std::time::Duration::from_secs(2));
    assert_eq!(c.limits.h2_control_frames_per_second, 50);
    let e = err("[limits]\nsend_timeout = 0\n");
    assert!(e.contains(":2:1: key `limits.send_timeout`"), "{e}");
    let e = err("workers = 1\n[limits]\nh2_control_frames_per_second = 0\n");
    assert!(
        e.contains(":3:1: key `limits.h2_control_frames_per_second`"),
        "{e}"
    );
}

#[test]
fn write_burst_default_and_bounds() {
    let c = Config::from_str_at("workers = 1\n", None).unwrap();
    assert_eq!(c.limits.write_burst, 256 << 10);
    let c = Config::from_str_at("[limits]\nwrite_burst = \"1MiB\"\n", None).unwrap();
    assert_eq!(c.limits.write_burst, 1 << 20);
    let e = err("[limits]\nwrite_burst = \"1KiB\"\n");
    assert!(e.contains(":2:1: key `limits.write_burst`"), "{e}");
    assert!(e.contains("between 16KiB and 64MiB"), "{e}");
}

#[test]
fn held_fds_default_and_bound() {
    let c = Config::from_str_at("workers = 1\n", None).unwrap();
    assert_eq!(c.file_cache.held_fds, 64);
    let c = Config::from_str_at("[file_cache]\nheld_fds = 0\n", None).unwrap();
    assert_eq!(c.file_cache.held_fds, 0);
    let e = err("[file_cache]\nheld_fds = 70000\n");
    assert!(e.contains("key `file_cache.held_fds`"), "{e}");
    assert!(e.contains("at most 65536"), "{e}");
}

#[test]
fn admin_limits_defaults_keys_and_bounds() {
    let c = parse("[admin]\naddress = \"127.0.0.1:9901\"\n").unwrap();
    assert_eq!(c.admin_limits, AdminLimits::default());
    assert_eq!(c.admin_limits.max_connections, 64);
    assert_eq!(c.admin_limits.connections_per_client, 8);
    assert_eq!(c.admin_limits.header_timeout, Duration::from_secs(2));
    assert_eq!(c.admin_limits.idle_timeout, Duration::from_secs(5));
    assert_eq!(parse("").unwrap().admin_limits, AdminLimits::default());
    let c = parse(
        "[admin]\naddress = \"127.0.0.1:9901\"\nmax_connections = 16\n\
         connections_per_client = 2\nheader_timeout = \"500ms\"\nidle_timeout = \"3s\"\n",
    )
    .unwrap();
    assert_eq!(
        c.admin_limits,
        AdminLimits {
            max_connections: 16,
            connections_per_client: 2,
            header_timeout: Duration::from_millis(500),
            idle_timeout: Duration::from_secs(3),
        }
    );
    let e = err("[admin]\naddress = \"127.0.0.1:9901\"\nmax_connections = 0\n");
    assert!(e.contains(":3:1: key `admin.max_connections`"), "{e}");
    let e = err(
        "[admin]\naddress = \"127.0.0.1:9901\"\nmax_connections = 4\nconnections_per_client = 5\n",
    );
    assert!(
        e.contains(":4:1: key `admin.connections_per_client`"),
        "{e}"
    );
    assert!(e.contains("max_connections (4)"), "{e}");
    let e = err("[admin]\naddress = \"127.0.0.1:9901\"\nheader_timeout = 0\n");
    assert!(e.contains("key `admin.header_timeout`"), "{e}");
    let e = err("[admin]\naddress = \"127.0.0.1:9901\"\nidle_timeout = \"0s\"\n");
    assert!(e.contains("key `admin.idle_timeout`"), "{e}");
}

#[test]
fn cache_on_a_proxy_route_and_its_store() {
    let c = parse(
        "[cache]\nmemory = \"64MiB\"\nmax_object_size = \"1MiB\"\ncollapse_timeout = \"2s\"\n\
         [[route]]\nprefix = \"/\"\nupstreams = [\"127.0.0.1:9\"]\ncache = {}\n\
         [[route]]\nprefix = \"/nc\"\nupstreams = [\"127.0.0.1:9\"]\n",
    )
    .unwrap();
    assert_eq!(c.cache.memory, 64 << 20);
    assert_eq!(c.cache.max_object_size, 1 << 20);
    assert_eq!(c.cache.collapse_timeout, Duration::from_secs(2));
    let cached = |p: &str| c.routes.iter().find(|r| r.prefix == p).unwrap().cache;
    assert_eq!(cached("/"), Some(RouteCache::default()));
    assert_eq!(cached("/nc"), None);
    let d = parse("").unwrap();
    let want = CacheConfig {
        path: Some(d.state_dir.join("cache")),
        ..CacheConfig::default()
    };
    assert_eq!(d.cache, want);
    assert_eq!(d.cache.disk, 1 << 30);
    let c = parse("[cache]\ndisk = \"0\"\npath = \"/var/cache/qweb\"\n").unwrap();
    assert_eq!(c.cache.disk, 0);
    assert_eq!(
        c.cache.path.as_deref(),
        Some(std::path::Path::new("/var/cache/qweb"))
    );
}

#[test]
fn cache_errors_name_the_key() {
    let e = err("[[route]]\nprefix = \"/\"\nroot = \"/\"\ncache = {}\n");
    assert!(
        e.contains(":4:") && e.contains("key `route[0].cache`"),
        "{e}"
    );
    assert!(e.contains("for proxy routes"), "{e}");
    let e =
        err("[[route]]\nprefix = \"/\"\nupstreams = [\"127.0.0.1:9\"]\ncache = { bogus = 1 }\n");
    assert!(
        e.contains("route[0].cache") && e.contains("unknown field `bogus`"),
        "{e}"
    );
    let e = err("[cache]\nmemory = \"1KiB\"\n");
    assert!(e.contains(":2:") && e.contains("key `cache.memory`"), "{e}");
    let e = err("[cache]\nmemory = \"8MiB\"\nmax_object_size = \"5MiB\"\n");
    assert!(
        e.contains(":3:") && e.contains("key `cache.max_object_size`"),
        "{e}"
    );
    let e = err("[cache]\ndisk = \"10KiB\"\n");
    assert!(e.contains(":2:") && e.contains("key `cache.disk`"), "{e}");
    let e = err("[cache]\nmax_object_size = \"4MiB\"\ndisk = \"2MiB\"\n");
    assert!(e.contains("key `cache.disk`"), "{e}");
    let e = err("[cache]\npath = \"\"\n");
    assert!(e.contains("key `cache.path`"), "{e}");
    let e = err("[[site]]\nserver_names = [\"a\"]\n[[site.route]]\nprefix = \"/\"\nroot = \"/\"\ncache = {}\n");
    assert!(e.contains("cache") && e.contains("for proxy routes"), "{e}");
}

#[test]
fn fleet_defaults_keys_and_bad_values() {
    assert_eq!(parse("").unwrap().fleet, None);
    let c = parse("[fleet]\nstore = \"redis://127.0.0.1:6379/0\"\n").unwrap();
    let f = c.fleet.unwrap();
    assert_eq!(f.store, "redis://127.0.0.1:6379/0");
    assert_eq!(f.key_prefix, "qweb:");
    assert_eq!(f.node_name, crate::default_node_name());
    assert!(!f.node_name.is_empty());
    assert_eq!(f.timeout, Duration::from_secs(1));
    let c = parse(
        "[fleet]\nstore = \"rediss://u:p@cache.example:6380/2\"\nnode_name = \"a\"\n\
         key_prefix = \"edge:\"\ntimeout = \"250ms\"\n",
    )
    .unwrap();
    let f = c.fleet.unwrap();
    assert_eq!(
        (f.node_name.as_str(), f.key_prefix.as_str(), f.timeout),
        ("a", "edge:", Duration::from_millis(250))
    );
    assert_eq!(f.store_redacted(), "rediss://u:***@cache.example:6380/2");
    let e = err("[fleet]\nstore = \"http://127.0.0.1:6379\"\n");
    assert!(e.contains(":2:9: key `fleet.store`"), "{e}");
    assert!(e.contains("redis:// or rediss://"), "{e}");
    let e = err("[fleet]\nstore = \"redis://:6379\"\n");
    assert!(e.contains("key `fleet.store`"), "{e}");
    let e = err("[fleet]\nstore = \"redis://h:99999/0\"\n");
    assert!(e.contains("key `fleet.store`"), "{e}");
    let e = err("[fleet]\nstore = \"redis://h:6379/x\"\n");
    assert!(e.contains("key `fleet.store`"), "{e}");
    let e = err("[fleet]\nstore = \"redis://h\"\nnode_name = \" \"\n");
    assert!(e.contains(":3:13: key `fleet.node_name`"), "{e}");
    assert!(e.contains("must not be empty"), "{e}");
    let e = err("[fleet]\nstore = \"redis://h\"\ntimeout = \"0s\"\n");
    assert!(e.contains("key `fleet.timeout`"), "{e}");
    let e = err("[fleet]\nnode_name = \"a\"\n");
    assert!(e.contains("store"), "{e}");
}

#[test]
fn fleet_ticket_keys_need_a_fleet_with_a_secret() {
    const TLS: &str = "[[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\nself_signed = true\nticket_keys = \"fleet\"\n";
    let hex = "ab".repeat(32);
    let e = err(TLS);
    assert!(e.contains("key `listener[0].tls.ticket_keys`"), "{e}");
    assert!(
        e.contains("needs a `[fleet]` section with a `secret`"),
        "{e}"
    );
    let e = err(&format!("{TLS}[fleet]\nstore = \"redis://h\"\n"));
    assert!(
        e.contains("key `listener[0].tls.ticket_keys`") && e.contains("fleet.secret"),
        "{e}"
    );
    let e = err(&format!(
        "{TLS}[fleet]\nstore = \"redis://h\"\nsecret = \"{}\"\n",
        &hex[..62]
    ));
    assert!(
        e.contains(":8:10: key `fleet.secret`") && e.contains("64 or more hex"),
        "{e}"
    );
    let e = err(&format!(
        "{TLS}[fleet]\nstore = \"redis://h\"\nsecret = \"{}zz\"\n",
        &hex[..62]
    ));
    assert!(
        e.contains("key `fleet.secret`") && e.contains("hex characters only"),
        "{e}"
    );
    let c = parse(&format!(
        "{TLS}[fleet]\nstore = \"redis://h\"\nsecret = \"{hex}\"\n"
    ))
    .unwrap();
    assert_eq!(c.listeners[0].session.ticket_keys, crate::TicketKeys::Fleet);
    let f = c.fleet.unwrap();
    let s = f.secret.as_ref().unwrap();
    assert_eq!(s.bytes(), &[0xab; 32][..]);
    // never shown
    assert!(!format!("{f:?}").contains(&hex[..8]), "{f:?}");
    // a secret alone is fine (no ticket keys through the store)
    let c = parse(&format!(
        "[fleet]\nstore = \"redis://h\"\nsecret = \"{hex}\"\n"
    ))
    .unwrap();
    assert!(c.fleet.unwrap().secret.is_some());
}

#[test]
fn a_fleet_rate_limit_needs_a_fleet() {
    const ROUTE: &str = "[[route]]\nprefix = \"/\"\nroot = \"/tmp\"\n\
                         rate_limit = { rate = \"10/s\", scope = \"fleet\" }\n";
    let e = err(ROUTE);
    assert!(
        e.contains(":4:39: key `route[0].rate_limit.scope`") && e.contains("needs a `[fleet]`"),
        "{e}"
    );
    let e = err(&ROUTE.replace("\"fleet\"", "\"world\""));
    assert!(
        e.contains("key `route[0].rate_limit.scope`") && e.contains("`world`"),
        "{e}"
    );
    let c = parse(&format!("{ROUTE}[fleet]\nstore = \"redis://h\"\n")).unwrap();
    let r = c.routes[0].rules.rate_limit.as_ref().unwrap();
    assert!(r.fleet.is_some());
    let c = parse(&ROUTE.replace("\"fleet\"", "\"node\"")).unwrap();
    assert!(c.routes[0]
        .rules
        .rate_limit
        .as_ref()
        .unwrap()
        .fleet
        .is_none());
}
