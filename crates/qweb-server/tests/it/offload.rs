//! TLS private-key offload through the real server: modes x engines x key types x TLS
//! versions x HTTP versions, many handshakes in flight from one worker, faults, /metrics.

use qweb_testkit as common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::metrics::Metrics;
use common::Proto;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Clone, Copy, Debug)]
enum KeyType {
    Rsa,
    Ecdsa,
}

/// Writes a self-signed certificate for `localhost` and its key into `dir`.
fn write_cert(dir: &Path, kt: KeyType) -> (PathBuf, PathBuf) {
    let kp = match kt {
        KeyType::Rsa => {
            rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048)
                .unwrap()
        }
        KeyType::Ecdsa => rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap(),
    };
    let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
        .unwrap()
        .self_signed(&kp)
        .unwrap();
    let (c, k) = (
        dir.join(format!("{kt:?}.crt")),
        dir.join(format!("{kt:?}.key")),
    );
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, kp.serialize_pem()).unwrap();
    (c, k)
}

/// A server with one TLS listener using `kt` and `offload` (a `[listener.offload]` body, or
/// empty for none), `engines` (extra TOML), a plain listener and the admin listener.
fn start(
    kt: KeyType,
    engines: &str,
    offload: &str,
    workers: usize,
) -> (common::TestServer, PathBuf) {
    let offload_table = if offload.is_empty() {
        String::new()
    } else {
        format!("[listener.offload]\n{offload}\n")
    };
    let extra = format!(
        "workers = {workers}\n[admin]\naddress = \"127.0.0.1:0\"\n{engines}\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\n[listener.tls]\n\
         certificates = [{{ cert = \"{{dir}}/{kt:?}.crt\", key = \"{{dir}}/{kt:?}.key\" }}]\n\
         {offload_table}\
         [[listener]]\naddress = \"127.0.0.1:0\"\n"
    );
    let t = common::start_with(&extra, |d| {
        write_cert(d, kt);
    });
    let ca = t.dir.path().join(format!("{kt:?}.crt"));
    std::fs::write(t.site().join("index.html"), "offloaded").unwrap();
    (t, ca)
}

fn client_config(
    ca: &Path,
    version: &'static rustls::SupportedProtocolVersion,
    proto: Proto,
) -> rustls::ClientConfig {
    common::tls::ClientTls::trusting(ca)
        .versions(&[version])
        .proto(proto)
        .no_resumption()
        .build()
}

/// One full handshake (no resumption).
async fn handshake(
    addr: SocketAddr,
    cfg: Arc<rustls::ClientConfig>,
) -> std::io::Result<common::tls::TlsStream> {
    common::tls::connect(addr, &cfg).await
}

/// Scrapes until `name` (summed) reaches `want` (the server counts a TLS 1.3 handshake when
/// the client's Finished arrives, a moment after the client is done), or 10 s pass.
async fn scrape_until(t: &common::TestServer, name: &str, want: f64) -> Metrics {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = t.metrics().await;
        if m.sum(name, &[]) >= want || Instant::now() > deadline {
            return m;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

const POOL: &str = "[offload.engines.pool]\nkind = \"pool\"\nthreads = 2\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mode_engine_key_and_version_serves_requests() {
    let setups: [(&str, &str); 4] = [
        ("", "none"),
        ("engine = \"inline\"\nmode = \"async\"", "inline"),
        ("engine = \"pool\"\nmode = \"sync\"", "pool"),
        ("engine = \"pool\"\nmode = \"async\"", "pool"),
    ];
    for kt in [KeyType::Rsa, KeyType::Ecdsa] {
        for (offload, engine) in setups {
            let (t, ca) = start(kt, POOL, offload, 1);
            let mut handshakes = 0.0;
            for version in [&rustls::version::TLS12, &rustls::version::TLS13] {
                for proto in common::BOTH {
                    let c = common::tls::proto_builder(client_config(&ca, version, proto), proto)
                        .pool_max_idle_per_host(0)
                        .build()
                        .unwrap();
                    let r = c
                        .get(format!("https://localhost:{}/", t.addrs[0].port()))
                        .send()
                        .await;
                    let r = r.unwrap_or_else(|e| {
                        panic!("{kt:?} {offload:?} {version:?} {proto:?}: {e:?}")
                    });
                    assert_eq!(r.status(), 200);
                    assert_eq!(r.text().await.unwrap(), "offloaded");
                    handshakes += 1.0;
                }
            }
            let m = scrape_until(&t, "qweb_tls_handshakes_total", handshakes).await;
            assert_eq!(m.sum("qweb_tls_handshakes_total", &[]), handshakes, "{m}");
            // The offload path was really taken: one signature per full handshake went to
            // the engine (none in mode none).
            let submitted = m.sum("qweb_offload_ops_submitted_total", &[("engine", engine)]);
            let expected = if offload.is_empty() { 0.0 } else { handshakes };
            assert_eq!(submitted, expected, "{kt:?} {offload:?}\n{m}");
            assert_eq!(m.sum("qweb_offload_ops_fallback_total", &[]), 0.0);
        }
    }
}

/// The paper's effect on one worker: an engine whose ops take 20 ms and that has unlimited
/// parallel slots. Async keeps many ops in flight (the handshakes overlap); sync has one at
/// a time (about 64 x 20 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_mode_keeps_many_handshakes_in_flight_on_one_worker() {
    const N: usize = 64;
    let engines = "[offload.engines.slow]\nkind = \"pool\"\nthreads = 1\nadded_latency = \"20ms\"\n[offload]\nbatch_max = 64\n";
    let mut took = Vec::new();
    for mode in ["async", "sync"] {
        let (t, ca) = start(
            KeyType::Ecdsa,
            engines,
            &format!("engine = \"slow\"\nmode = \"{mode}\"\ntimeout = \"10s\""),
            1,
        );
        let cfg = Arc::new(client_config(&ca, &rustls::version::TLS13, Proto::H1));
        let addr = t.addrs[0];
        let start = Instant::now();
        let tasks: Vec<_> = (0..N)
            .map(|_| {
                let cfg = cfg.clone();
                tokio::spawn(async move { handshake(addr, cfg).await.map(|_| ()) })
            })
            .collect();
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        let elapsed = start.elapsed();
        let m = scrape_until(&t, "qweb_tls_handshakes_total", N as f64).await;
        let peak = m.sum("qweb_offload_in_flight_peak", &[("engine", "slow")]);
        assert_eq!(m.sum("qweb_tls_handshakes_total", &[]), N as f64);
        match mode {
            "async" => assert!(peak >= (N / 2) as f64, "async peak in flight {peak}\n{m}"),
            _ => {
                assert_eq!(peak, 1.0, "sync mode must have one op in flight at a time");
                assert!(
                    elapsed >= Duration::from_millis((N as u64) * 20 * 9 / 10),
                    "{elapsed:?}"
                );
            }
        }
        took.push(elapsed);
    }
    let (async_t, sync_t) = (took[0], took[1]);
    eprintln!("{N} handshakes, 20 ms engine, 1 worker: async {async_t:?}, sync {sync_t:?}");
    assert!(async_t * 4 < sync_t, "async {async_t:?} vs sync {sync_t:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_engine_falls_back_to_software_or_fails_cleanly() {
    let engines = "[offload.engines.bad]\nkind = \"pool\"\ninject_failures = true\n";
    for mode in ["async", "sync"] {
        // default policy: software fallback, the handshake succeeds
        let (t, ca) = start(
            KeyType::Rsa,
            engines,
            &format!("engine = \"bad\"\nmode = \"{mode}\""),
            1,
        );
        let cfg = Arc::new(client_config(&ca, &rustls::version::TLS13, Proto::H1));
        handshake(t.addrs[0], cfg.clone()).await.unwrap();
        let m = scrape_until(&t, "qweb_tls_handshakes_total", 1.0).await;
        assert_eq!(
            m.sum("qweb_offload_ops_fallback_total", &[("engine", "bad")]),
            1.0,
            "{m}"
        );
        assert_eq!(
            m.sum("qweb_offload_ops_failed_total", &[("engine", "bad")]),
            1.0,
            "{m}"
        );
        drop(t);

        // fallback = "fail": the handshake fails, the server goes on serving
        let (t, ca) = start(
            KeyType::Rsa,
            engines,
            &format!("engine = \"bad\"\nmode = \"{mode}\"\nfallback = \"fail\""),
            1,
        );
        let cfg = Arc::new(client_config(&ca, &rustls::version::TLS13, Proto::H1));
        let r = handshake(t.addrs[0], cfg.clone()).await;
        assert!(r.is_err(), "{mode}: handshake should fail");
        let m = scrape_until(&t, "qweb_tls_handshakes_failed_total", 1.0).await;
        assert_eq!(m.sum("qweb_tls_handshakes_failed_total", &[]), 1.0, "{m}");
        let r = common::plain_client()
            .get(format!("{}/", t.http()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_that_never_answers_times_out() {
    let engines = "[offload.engines.stuck]\nkind = \"pool\"\nadded_latency = \"1h\"\n";
    for mode in ["async", "sync"] {
        let (t, ca) = start(
            KeyType::Ecdsa,
            engines,
            &format!("engine = \"stuck\"\nmode = \"{mode}\"\ntimeout = \"200ms\""),
            1,
        );
        let cfg = Arc::new(client_config(&ca, &rustls::version::TLS12, Proto::H1));
        let start = Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(10), handshake(t.addrs[0], cfg)).await;
        assert!(
            r.expect("handshake hung").is_ok(),
            "{mode}: software fallback after the timeout"
        );
        assert!(start.elapsed() >= Duration::from_millis(150));
        let m = scrape_until(&t, "qweb_tls_handshakes_total", 1.0).await;
        assert_eq!(
            m.sum("qweb_offload_ops_fallback_total", &[("engine", "stuck")]),
            1.0,
            "{m}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saturated_engine_falls_back_at_once() {
    let engines = "[offload.engines.tiny]\nkind = \"pool\"\nqueue = 1\nadded_latency = \"300ms\"\n";
    let (t, ca) = start(
        KeyType::Ecdsa,
        engines,
        "engine = \"tiny\"\nmode = \"async\"",
        1,
    );
    let cfg = Arc::new(client_config(&ca, &rustls::version::TLS13, Proto::H1));
    let addr = t.addrs[0];
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let cfg = cfg.clone();
            tokio::spawn(async move { handshake(addr, cfg).await.map(|_| ()) })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    let m = scrape_until(&t, "qweb_tls_handshakes_total", 16.0).await;
    assert!(
        m.sum("qweb_offload_ops_saturated_total", &[("engine", "tiny")]) >= 1.0,
        "{m}"
    );
    assert!(
        m.sum("qweb_offload_ops_fallback_total", &[("engine", "tiny")]) >= 1.0,
        "{m}"
    );
    assert_eq!(m.sum("qweb_tls_handshakes_total", &[]), 16.0);
}

/// A client that disconnects while its handshake job is paused: the job is freed at once
/// (the paused-job gauge returns to 0 long before the engine would have answered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_while_paused_frees_the_job() {
    let engines = "[offload.engines.slow]\nkind = \"pool\"\nadded_latency = \"20s\"\n";
    let (t, ca) = start(
        KeyType::Ecdsa,
        engines,
        "engine = \"slow\"\nmode = \"async\"\ntimeout = \"30s\"",
        1,
    );
    let cfg = Arc::new(client_config(&ca, &rustls::version::TLS13, Proto::H1));
    let addr = t.addrs[0];
    let clients: Vec<_> = (0..5)
        .map(|_| {
            let cfg = cfg.clone();
            tokio::spawn(async move { handshake(addr, cfg).await.map(|_| ()) })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = t.metrics().await;
        if m.sum("qweb_jobs_paused", &[]) == 5.0 {
            break;
        }
        assert!(Instant::now() < deadline, "jobs never paused:\n{m}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for c in &clients {
        c.abort(); // drops the client's socket mid-handshake
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let m = t.metrics().await;
        // (the job is freed just before its handshake's failure is counted: wait for both)
        if m.sum("qweb_jobs_paused", &[]) == 0.0
            && m.sum("qweb_tls_handshakes_failed_total", &[]) == 5.0
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "paused jobs were not freed, or not all counted as failed handshakes:\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // the worker still serves
    let r = common::plain_client()
        .get(format!("{}/", t.http()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn metrics_endpoint_speaks_prometheus() {
    let (t, _) = start(KeyType::Ecdsa, POOL, "engine = \"pool\"", 2);
    let addr = t.admin.unwrap();
    let m = common::metrics::scrape(addr).await;
    assert!(m
        .content_type
        .starts_with("application/openmetrics-text; version=1.0.0"));
    for family in [
        "# TYPE qweb_tls_handshakes counter",
        "# TYPE qweb_jobs_paused gauge",
        "# TYPE qweb_offload_ops_submitted counter",
        "# TYPE qweb_offload_op_latency_seconds histogram",
        "qweb_offload_queue_depth{engine=\"pool\"}",
        "qweb_offload_op_latency_seconds_bucket{le=\"+Inf\",engine=\"inline\"}",
        "qweb_connections_open{worker=\"1\"}",
    ] {
        assert!(m.text.contains(family), "missing {family}:\n{m}");
    }
    let r = common::plain_client()
        .get(format!("http://{addr}/other"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test]
async fn raw_tls_stream_round_trip_large() {
    // The TLS stream type under hyper: a 3 MiB body each way, TLS 1.2 and 1.3.
    let (t, ca) = start(KeyType::Rsa, POOL, "engine = \"pool\"", 1);
    let big: Vec<u8> = (0..3 * 1024 * 1024).map(|i| (i % 253) as u8).collect();
    std::fs::write(t.site().join("big.bin"), &big).unwrap();
    for version in [&rustls::version::TLS12, &rustls::version::TLS13] {
        let cfg = Arc::new(client_config(&ca, version, Proto::H1));
        let mut s = handshake(t.addrs[0], cfg).await.unwrap();
        s.write_all(b"GET /big.bin HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.unwrap();
        let split = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        assert!(out.starts_with(b"HTTP/1.1 200 OK"));
        assert_eq!(&out[split..], &big[..]);
    }
}
