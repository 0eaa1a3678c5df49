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
