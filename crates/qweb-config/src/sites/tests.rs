use super::server_name;
use crate::Config;

fn parse(text: &str) -> Result<Config, String> {
    let dir = std::env::temp_dir();
    let text = text.replace("{dir}", &dir.display().to_string());
    Config::from_str_at(&text, Some(&dir.join("test.toml"))).map_err(|e| e.to_string())
}

const SITE: &str = "[[site.route]]\nprefix = \"/\"\nroot = \"{dir}\"\n";

#[test]
fn two_sites_claiming_one_name_are_refused_naming_both_keys() {
    let text = format!(
        "[[site]]\nserver_names = [\"a.test\", \"b.test\"]\n{SITE}\
         [[site]]\nserver_names = [\"B.Test.\"]\n{SITE}"
    );
    let e = parse(&text).unwrap_err();
    assert!(e.contains("key `site[1].server_names[0]`"), "{e}");
    assert!(
        e.contains("already claimed by site[0].server_names[1]"),
        "{e}"
    );
    assert!(e.contains("test.toml:7:"), "{e}");
    // a wildcard and an exact name under it are different names
    let ok = format!(
        "[[site]]\nserver_names = [\"*.a.test\"]\n{SITE}\
         [[site]]\nserver_names = [\"x.a.test\"]\n{SITE}"
    );
    parse(&ok).unwrap();
}

#[test]
fn site_keys_are_validated() {
    let e = parse(&format!(
        "[[site]]\nserver_names = [\"a.test:443\"]\n{SITE}"
    ))
    .unwrap_err();
    assert!(
        e.contains("key `site[0].server_names[0]`") && e.contains("no port"),
        "{e}"
    );
    let e = parse(&format!("[[site]]\n{SITE}")).unwrap_err();
    assert!(e.contains("key `site[0].server_names`"), "{e}");
    let e = parse("[[site]]\nserver_names = [\"a.test\"]\n").unwrap_err();
    assert!(e.contains("key `site[0].route`"), "{e}");
    let e = parse(
        "[[site]]\nserver_names = [\"a.test\"]\n[[site.route]]\nprefix = \"x\"\nroot = \"{dir}\"\n",
    )
    .unwrap_err();
    assert!(e.contains("key `site[0].route[0].prefix`"), "{e}");
    let e = parse(&format!(
        "[[site]]\ndefault = true\n{SITE}[[site]]\ndefault = true\n{SITE}"
    ))
    .unwrap_err();
    assert!(
        e.contains("key `site[1].default`") && e.contains("site[0].default"),
        "{e}"
    );
    let e = parse(&format!(
        "[[route]]\nprefix = \"/\"\nroot = \"{{dir}}\"\n[[site]]\ndefault = true\n{SITE}"
    ))
    .unwrap_err();
    assert!(e.contains("key `site[0].default`"), "{e}");
    let e = parse(&format!(
        "[[site]]\nserver_names = [\"a.test\"]\ncertificates = [{{ cert = \"/nonexistent.crt\", key = \"/nonexistent.key\" }}]\n{SITE}"
    ))
    .unwrap_err();
    assert!(e.contains("key `site[0].certificates[0].cert`"), "{e}");
}

#[test]
fn default_site_is_the_top_level_routes_else_the_first() {
    let two = format!(
        "[[site]]\nserver_names = [\"a.test\"]\n{SITE}[[site]]\nserver_names = [\"b.test\"]\n{SITE}"
    );
    assert_eq!(parse(&two).unwrap().sites.default, Some(0));
    let with_top = format!("[[route]]\nprefix = \"/\"\nroot = \"{{dir}}\"\n{two}");
    assert_eq!(parse(&with_top).unwrap().sites.default, None);
    let chosen = format!(
        "[[site]]\nserver_names = [\"a.test\"]\n{SITE}[[site]]\nserver_names = [\"b.test\"]\ndefault = true\n{SITE}"
    );
    assert_eq!(parse(&chosen).unwrap().sites.default, Some(1));
}

#[test]
fn names_are_checked_and_lowered() {
    assert_eq!(server_name("Example.COM.").unwrap(), "example.com");
    assert_eq!(server_name("*.example.com").unwrap(), "*.example.com");
    for bad in [
        "",
        "*",
        "*.com",
        "a.*.com",
        "example.com:443",
        "exa mple.com",
        "-a.com",
        "a..com",
        "café.com",
        "a/b",
    ] {
        assert!(server_name(bad).is_err(), "{bad:?} passed");
    }
    assert!(server_name(&"a".repeat(64)).is_err());
}

/// A site's certificates take `ocsp` and, on key-server listeners, no `key`, as a listener's
/// do; a key-less site certificate on a listener that does not sign on a key server is
/// refused at its `key`, naming that listener.
#[test]
fn site_certificates_take_ocsp_and_keyserver_keys_like_listener_ones() {
    use crate::{OcspSource, TlsConfig};
    let dir = tempfile::tempdir().unwrap();
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let c = rcgen::CertificateParams::new(vec!["a.test".into()])
        .unwrap()
        .self_signed(&kp)
        .unwrap();
    std::fs::write(dir.path().join("a.crt"), c.pem()).unwrap();
    std::fs::write(dir.path().join("a.key"), kp.serialize_pem()).unwrap();
    std::fs::write(dir.path().join("a.der"), b"read at start").unwrap();
    let file = dir.path().join("q.toml");
    let engine = "[offload.engines.ks]\nkind = \"keyserver\"\nservers = [\"unix:/tmp/x.sock\"]\n";
    let listener = |offload: &str| {
        format!(
            "[[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\ncertificates = []\n{offload}"
        )
    };
    let ks = "[listener.offload]\nengine = \"ks\"\n";
    let site = |cert: &str| {
        format!(
            "[[site]]\nserver_names = [\"a.test\"]\ncertificates = [{cert}]\n[[site.route]]\nprefix = \"/\"\nroot = \"{}\"\n",
            dir.path().display()
        )
    };
    let parse = |text: String| Config::from_str_at(&text, Some(&file));
    let cfg = parse(format!(
        "{engine}{}{}",
        listener(ks),
        site("{ cert = \"a.crt\", key = \"a.key\", ocsp = \"a.der\" }")
    ))
    .unwrap();
    let Some(TlsConfig::Certificates(list)) = &cfg.listeners[0].tls else {
        panic!("{:?}", cfg.listeners[0].tls)
    };
    assert_eq!(
        list[0].ocsp,
        Some(OcspSource::File(dir.path().join("a.der")))
    );
    let cfg = parse(format!(
        "{engine}{}{}",
        listener(ks),
        site("{ cert = \"a.crt\" }")
    ))
    .unwrap();
    let Some(TlsConfig::Certificates(list)) = &cfg.listeners[0].tls else {
        panic!("{:?}", cfg.listeners[0].tls)
    };
    assert_eq!(list[0].key, None);
    // a second TLS listener that signs in place cannot serve it
    let e = parse(format!(
        "{engine}{}{}{}",
        listener(ks),
        listener(""),
        site("{ cert = \"a.crt\" }")
    ))
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("key `site[0].certificates[0].key`")
            && e.contains("listener[1]")
            && e.contains("not a key server"),
        "{e}"
    );
    // an engine that is not a key server, or none at all
    let pool = "[offload.engines.ks]\nkind = \"pool\"\n";
    for head in [pool, ""] {
        let offload = if head.is_empty() { "" } else { ks };
        let e = parse(format!(
            "{head}{}{}",
            listener(offload),
            site("{ cert = \"a.crt\" }")
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("key `site[0].certificates[0].key`"), "{e}");
    }
    // a bad `ocsp` is refused at the site's key
    let e = parse(format!(
        "{}{}",
        listener(""),
        site("{ cert = \"a.crt\", key = \"a.key\", ocsp = \"missing.der\" }")
    ))
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("key `site[0].certificates[0].ocsp`") && e.contains("cannot read"),
        "{e}"
    );
    let e = parse(format!(
        "{}{}",
        listener(""),
        site("{ cert = \"a.crt\", key = \"a.key\", ocsp = \"fetch\" }")
    ))
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("key `site[0].certificates[0].ocsp`") && e.contains("no http:// OCSP responder"),
        "{e}"
    );
}
