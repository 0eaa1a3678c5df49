//! `/metrics` through the real server with a pool engine, a key server engine (an in-process
//! key server on a real Unix socket) and compression, checked by a strict OpenMetrics parser
//! (python's `prometheus_client.openmetrics.parser`, from the `python3-prometheus-client`
//! package that `.ci/run` installs).

use qweb_testkit as common;

use common::Proto;

fn write_key_and_cert(dir: &std::path::Path, name: &str) {
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
        .unwrap()
        .self_signed(&kp)
        .unwrap();
    std::fs::write(dir.join(format!("{name}.crt")), cert.pem()).unwrap();
    std::fs::write(dir.join(format!("{name}.key")), kp.serialize_pem()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_with_pool_keyserver_and_compression_parse_strictly() {
    // engine names and a route prefix with characters a label value must escape
    let dir = tempfile::tempdir().unwrap();
    write_key_and_cert(dir.path(), "ks");
    let sock = dir.path().join("ks.sock");
    let ks = super::tls_certs::in_process_keyserver(vec![dir.path().join("ks.key")], &sock);
    let ksdir = dir.path().display().to_string();
    let extra = format!(
        "workers = 2\n[admin]\naddress = \"127.0.0.1:0\"\n\
         [offload.engines.\"po\\\"ol\\\\1\"]\nkind = \"pool\"\nthreads = 1\n\
         [offload.engines.ks]\nkind = \"keyserver\"\nservers = [\"unix:{ksdir}/ks.sock\"]\n\
         [compression]\nenabled = true\nmin_size = 16\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\nself_signed = true\n\
         [listener.offload]\nengine = \"po\\\"ol\\\\1\"\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\n\
         certificates = [{{ cert = \"{ksdir}/ks.crt\" }}]\n\
         [listener.offload]\nengine = \"ks\"\n\
         [[route]]\nprefix = \"/q\\\"\\\\x\"\nroot = \"{{dir}}/site\"\n"
    );
    let t = common::start_with(&extra, |_| {});
    std::fs::write(t.site().join("index.html"), "x".repeat(4096)).unwrap();
    let admin = t.admin.unwrap();

    // traffic on every path: pool handshakes (h1, h2), key server handshakes, compression
    for proto in common::BOTH {
        let c = common::client(&t.cert(), proto);
        let r = c
            .get(format!("{}/", t.https()))
            .header("accept-encoding", "gzip")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["content-encoding"], "gzip");
    }
    let c = common::client(&dir.path().join("ks.crt"), Proto::H1);
    let r = c
        .get(format!("https://{}/nothing", t.addrs[2]))
        .send()
        .await;
    // the key server signed that handshake
    assert_eq!(r.unwrap().status(), 404);
    let r = common::plain_client()
        .get(format!("{}/", t.http()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    let m = common::metrics::scrape(admin).await;
    let (ct, text) = (&m.content_type, &m.text);
    assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
    let parsed = common::metrics::python_strict_parse(text);
    let has = |needle: &str| {
        assert!(
            // with a value (two tabs), the line ends with it: `1` is not `10`
            parsed
                .lines()
                .any(|l| if needle.matches('\t').count() == 2 {
                    l.ends_with(needle)
                } else {
                    l.contains(needle)
                }),
            "missing {needle}:\n{parsed}\n---\n{text}"
        )
    };
    for family in [
        "family\tqweb_tls_handshakes\tcounter",
        "family\tqweb_jobs_paused\tgauge",
        "family\tqweb_connections_open\tgauge",
        "family\tqweb_offload_ops_submitted\tcounter",
        "family\tqweb_offload_op_latency_seconds\thistogram",
        "family\tqweb_keyserver_up\tgauge",
        "family\tqweb_compression_bytes_in\tcounter",
        "family\tqweb_compression_cache_bytes\tgauge",
        "family\tqweb_http_route_requests\tcounter",
        "family\tqweb_http_request_duration_seconds\thistogram",
        "family\tqweb_config_reloads\tcounter",
        "family\tqweb_config\tinfo",
        "family\tqweb_build\tinfo",
    ] {
        has(family);
    }
    // one sample per engine in each engine family, labels escaped and read back whole
    has("qweb_offload_ops_submitted_total\t{\"engine\": \"inline\"}");
    has("qweb_offload_ops_submitted_total\t{\"engine\": \"ks\"}");
    has("qweb_offload_ops_submitted_total\t{\"engine\": \"po\\\"ol\\\\1\"}");
    has(&format!(
        "qweb_keyserver_up\t{{\"engine\": \"ks\", \"server\": \"unix:{}\"}}\t1",
        sock.display()
    ));
    has("qweb_compression_responses_total\t{\"codec\": \"gzip\"}\t2");
    has("qweb_http_route_requests_total\t{\"class\": \"2xx\", \"route\": \"/\"}\t3");
    has("qweb_http_route_requests_total\t{\"class\": \"4xx\", \"route\": \"/\"}\t1");
    has("qweb_http_request_duration_seconds_count\t{\"route\": \"/q\\\"\\\\x\"}\t0");
    has("qweb_http_request_duration_seconds_count\t{\"route\": \"/\"}\t4");
    has("qweb_config_reloads_total\t{\"result\": \"ok\"}\t0");
    has("qweb_build_info\t{\"version\": \"");
    has("qweb_config_info\t{\"hash\": \"");
    drop(ks);
}
