use super::*;

#[test]
fn targets_parse() {
    let t = parse_target("https://127.0.0.1:8443/a/b?x=1").unwrap();
    assert_eq!(t.addr, "127.0.0.1:8443".parse().unwrap());
    assert_eq!(t.path, "/a/b?x=1");
    assert_eq!(t.authority, "127.0.0.1:8443");
    assert!(parse_target("http://127.0.0.1/").is_err());
    assert!(parse_target("not a url").is_err());
}

#[test]
fn command_line_round_trips_the_options() {
    let mut s = LoadSpec::new("https://127.0.0.1:1/x", Mode::Handshake);
    s.tls = TlsVersion::Tls12;
    s.request = true;
    s.count = Some(100);
    s.accept_encoding = Some("gzip".into());
    assert_eq!(
        s.command_line(),
        "qweb-bench load https://127.0.0.1:1/x --mode handshake -c 64 -n 100 -w 1 \
         --tls 1.2 --http 1.1 --accept-encoding gzip --request"
    );
}

#[test]
fn error_counts_sum() {
    let mut a = ErrorCounts {
        tls: 2,
        ..Default::default()
    };
    a.add(&ErrorCounts {
        bytes: 1,
        tls: 1,
        ..Default::default()
    });
    assert_eq!(a.total(), 4);
    assert_eq!(a.tls, 3);
}
