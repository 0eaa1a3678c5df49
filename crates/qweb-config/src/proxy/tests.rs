//! Tests of the proxy route settings.

mod settings {
    use std::path::Path;

    use crate::{Config, ProxyConfig, RouteAction};

    /// The `/api` proxy route of a config with `upstreams` (a TOML list's items) and `keys`.
    pub(super) fn proxy_route(upstreams: &str, keys: &str) -> Result<ProxyConfig, String> {
        let text = format!("[[route]]\nprefix = \"/api\"\nupstreams = [{upstreams}]\n{keys}\n");
        let c = Config::from_str_at(&text, Some(Path::new("/etc/qweb/test.toml")))
            .map_err(|e| e.to_string())?;
        match &c.routes.iter().find(|r| r.prefix == "/api").unwrap().action {
            RouteAction::Proxy(p) => Ok(p.clone()),
            _ => panic!("not a proxy route"),
        }
    }

    fn route(keys: &str) -> Result<ProxyConfig, String> {
        proxy_route("\"127.0.0.1:9\"", keys)
    }

    #[test]
    fn upgrade_and_body_defaults() {
        let p = route("").unwrap();
        assert_eq!(p.upgrade, vec!["websocket".to_owned()]);
        assert_eq!(p.upgrade_idle_timeout, std::time::Duration::from_secs(300));
        assert_eq!(p.max_body_size, None);
        assert!(!p.buffer_request_body);
        let p = route(
            "upgrade = [\"WebSocket\", \"foo/2\"]\nupgrade_idle_timeout = \"30s\"\n\
             max_body_size = \"1MiB\"\nbuffer_request_body = true",
        )
        .unwrap();
        assert_eq!(p.upgrade, vec!["websocket".to_owned(), "foo/2".to_owned()]);
        assert_eq!(p.upgrade_idle_timeout, std::time::Duration::from_secs(30));
        assert_eq!(p.max_body_size, Some(1 << 20));
        assert!(p.buffer_request_body);
        assert!(route("upgrade = []").unwrap().upgrade.is_empty());
    }

    #[test]
    fn upgrade_and_body_errors_name_the_key() {
        let e = route("upgrade = [\"websocket\", \"h2c\"]").unwrap_err();
        assert!(
            e.contains(":4:") && e.contains("key `route[0].upgrade[1]`"),
            "{e}"
        );
        assert!(e.contains("smuggle"), "{e}");
        let e = route("upgrade = [\"web socket\"]").unwrap_err();
        assert!(e.contains("key `route[0].upgrade[0]`"), "{e}");
        let e = route("upgrade_idle_timeout = \"0s\"").unwrap_err();
        assert!(e.contains("key `route[0].upgrade_idle_timeout`"), "{e}");
        let e = route("max_body_size = 0").unwrap_err();
        assert!(
            e.contains(":4:") && e.contains("key `route[0].max_body_size`"),
            "{e}"
        );
        let e = route("buffer_request_body = true").unwrap_err();
        assert!(e.contains("key `route[0].buffer_request_body`"), "{e}");
        let e = route("buffer_request_body = true\nmax_body_size = \"2GiB\"").unwrap_err();
        assert!(e.contains("key `route[0].max_body_size`"), "{e}");
        let text = "[[route]]\nprefix = \"/\"\nroot = \"/tmp\"\nmax_body_size = \"1MiB\"\n";
        let e = Config::from_str_at(text, None).unwrap_err().to_string();
        assert!(e.contains("key `route[0].max_body_size`"), "{e}");
    }
}

mod balance_tests {
    use std::time::Duration;

    use crate::{Balance, HashKey};

    fn route(keys: &str) -> Result<crate::ProxyConfig, String> {
        super::settings::proxy_route("\"127.0.0.1:9\", \"127.0.0.1:10\"", keys)
    }

    #[test]
    fn defaults_and_every_key() {
        let p = route("").unwrap();
        assert_eq!(p.balance, Balance::RoundRobin);
        assert_eq!(p.weights, vec![1, 1]);
        assert_eq!((p.max_fails, p.fail_timeout), (1, Duration::from_secs(10)));
        assert!(p.health_check.is_none());
        let p = route(
            "balance = \"hash\"\nhash_key = \"cookie:sid\"\nweights = [2, 3]\nmax_fails = 0\n\
             fail_timeout = \"1s\"\n\
             health_check = { path = \"/hz?x=1\", interval = \"2s\", expect = 204, timeout = \"1s\" }",
        )
        .unwrap();
        assert_eq!(p.balance, Balance::Hash(HashKey::Cookie("sid".into())));
        assert_eq!(p.weights, vec![2, 3]);
        assert_eq!((p.max_fails, p.fail_timeout), (0, Duration::from_secs(1)));
        let hc = p.health_check.unwrap();
        assert_eq!(
            (hc.path.as_str(), hc.interval, hc.expect, hc.timeout),
            (
                "/hz?x=1",
                Duration::from_secs(2),
                204,
                Duration::from_secs(1)
            )
        );
        let p = route("balance = \"hash\"").unwrap();
        assert_eq!(p.balance, Balance::Hash(HashKey::ClientIp));
        let p = route("balance = \"least_conn\"\nhealth_check = { path = \"/\" }").unwrap();
        assert_eq!(p.balance, Balance::LeastConn);
        assert_eq!(p.health_check.unwrap().interval, Duration::from_secs(5));
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            ("balance = \"random\"", "key `route[0].balance`"),
            (
                "balance = \"hash\"\nhash_key = \"ip\"",
                "key `route[0].hash_key`",
            ),
            ("hash_key = \"client_ip\"", "key `route[0].hash_key`"),
            ("weights = [1]", "key `route[0].weights`"),
            ("weights = [1, 0]", "key `route[0].weights[1]`"),
            (
                "health_check = { path = \"hz\" }",
                "key `route[0].health_check.path`",
            ),
            (
                "health_check = { path = \"/\", expect = 99 }",
                "key `route[0].health_check.expect`",
            ),
            (
                "health_check = { path = \"/\", interval = \"1ms\" }",
                "key `route[0].health_check.interval`",
            ),
            ("health_check = { path = \"/\", every = \"1s\" }", "every"),
            ("upstream_http2 = true", "key `route[0].upstream_http2`"),
        ];
        for (keys, want) in cases {
            let e = route(keys).unwrap_err();
            assert!(e.contains(want), "{keys}: {e}");
            assert!(e.starts_with("/etc/qweb/test.toml:"), "{e}");
        }
    }
}
