//! The `keyserver` engine against an in-process key server over a real Unix socket: many
//! ops in flight, answers matched by id, signatures verify, metrics on both sides.

#![allow(unsafe_code)] // libc calls on test processes and files; each block has its SAFETY note

use std::sync::Arc;
use std::time::Duration;

use aws_lc_rs::signature::{UnparsedPublicKey, ECDSA_P256_SHA256_ASN1, RSA_PSS_2048_8192_SHA256};
use qweb_keyserver::client::{ClientConfig, Endpoint, KeyserverEngine};
use qweb_keyserver::server::{start, KeyserverConfig};
use qweb_offload::{
    channel, Engine, KeyId, KeyRef, Op, OpError, OpOutput, SignOp, SignScheme, Submission,
};

struct Key {
    id: KeyId,
    public: Vec<u8>,
}

fn gen(dir: &std::path::Path, name: &str, rsa: bool) -> (std::path::PathBuf, Key) {
    let kp = if rsa {
        rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048).unwrap()
    } else {
        rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap()
    };
    let path = dir.join(format!("{name}.key"));
    std::fs::write(&path, kp.serialize_pem()).unwrap();
    let key = Key {
        id: KeyId::of_spki(&kp.public_key_der()),
        public: kp.public_key_raw().to_vec(),
    };
    (path, key)
}

fn op(key: &Key, scheme: SignScheme, msg: &[u8]) -> Op {
    Op::Sign(SignOp {
        key: KeyRef {
            id: key.id,
            local: None,
        },
        scheme,
        message: msg.to_vec(),
    })
}

#[test]
fn many_ops_in_flight_verify_and_unknown_keys_fail() {
    let dir = tempfile::tempdir().unwrap();
    let (rsa_path, rsa) = gen(dir.path(), "rsa", true);
    let (ec_path, ec) = gen(dir.path(), "ec", false);
    let sock = dir.path().join("ks.sock");
    let ks = start(KeyserverConfig {
        generated_keys: None,
        keys: vec![rsa_path, ec_path],
        threads: 2,
        queue: 4096,
        // SAFETY: getuid(2) has no preconditions.
        unix: Some((sock.clone(), vec![unsafe { libc::getuid() }])),
        tls: None,
        admin: Some("127.0.0.1:0".parse().unwrap()),
        limits: Default::default(),
        added_latency: Duration::from_millis(30),
        ticket_rotation: Duration::from_secs(12 * 3600),
    })
    .unwrap();
    assert_eq!(ks.key_ids.len(), 2);
    assert!(ks.key_ids.contains(&rsa.id) && ks.key_ids.contains(&ec.id));

    let engine = KeyserverEngine::new(
        "ks",
        ClientConfig {
            servers: vec![Endpoint::Unix(sock)],
            connections: 2,
            max_in_flight: 1024,
            timeout: Duration::from_secs(10),
            tls: None,
        },
    )
    .unwrap();
    // 200 ops at once; with 30 ms added latency they only finish quickly if they overlap
    let mut waits = Vec::new();
    let mut batch = Vec::new();
    for i in 0..200u32 {
        let msg = format!("message {i}").into_bytes();
        let (k, scheme) = if i % 2 == 0 {
            (&rsa, SignScheme::RsaPssSha256)
        } else {
            (&ec, SignScheme::EcdsaP256Sha256)
        };
        let (c, w) = channel();
        batch.push(Submission::new(op(k, scheme, &msg), c));
        waits.push((i, msg, w));
    }
    assert!(engine.submit(batch).is_empty());
    for (i, msg, w) in waits {
        let Ok(OpOutput::Signature(sig)) = w.wait(Duration::from_secs(20)) else {
            panic!("op {i} failed")
        };
        let (alg, key): (&dyn aws_lc_rs::signature::VerificationAlgorithm, &Key) = if i % 2 == 0 {
            (&RSA_PSS_2048_8192_SHA256, &rsa)
        } else {
            (&ECDSA_P256_SHA256_ASN1, &ec)
        };
        UnparsedPublicKey::new(alg, &key.public)
            .verify(&msg, &sig)
            .unwrap_or_else(|_| panic!("signature {i} does not verify (answers mixed up?)"));
    }
    assert!(
        engine
            .metrics()
            .in_flight_peak
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 100
    );

    // an unknown key id and a scheme that does not fit the key are errors, not hangs
    let stranger = Key {
        id: KeyId([7; 32]),
        public: vec![],
    };
    for o in [
        op(&stranger, SignScheme::EcdsaP256Sha256, b"x"),
        op(&ec, SignScheme::RsaPssSha256, b"x"),
    ] {
        let (c, w) = channel();
        assert!(engine.submit(vec![Submission::new(o, c)]).is_empty());
        match w.wait(Duration::from_secs(10)) {
            Err(OpError::Failed(m)) => assert!(
                m.contains("unknown key") || m.contains("bad request"),
                "{m}"
            ),
            other => panic!("{other:?}"),
        }
    }

    // key server metrics
    let admin = ks.admin_addr.unwrap();
    let m = qweb_testkit::metrics::scrape_blocking(admin);
    assert_eq!(m.value("qweb_keyserver_requests_total", &[]), 202.0, "{m}");
    assert_eq!(m.value("qweb_keyserver_errors_total", &[]), 2.0, "{m}");
    assert_eq!(
        m.value(
            "qweb_offload_op_latency_seconds_count",
            &[("engine", "keyserver")]
        ),
        200.0,
        "{m}"
    );
    drop(engine);
    drop(Arc::new(ks));
}

#[test]
fn engine_without_a_server_times_out_ops() {
    let dir = tempfile::tempdir().unwrap();
    let engine = KeyserverEngine::new(
        "nobody",
        ClientConfig {
            servers: vec![Endpoint::Unix(dir.path().join("missing.sock"))],
            connections: 1,
            max_in_flight: 2,
            timeout: Duration::from_millis(200),
            tls: None,
        },
    )
    .unwrap();
    let key = Key {
        id: KeyId([1; 32]),
        public: vec![],
    };
    let mut waits = Vec::new();
    let mut batch = Vec::new();
    for _ in 0..3 {
        let (c, w) = channel();
        batch.push(Submission::new(
            op(&key, SignScheme::EcdsaP256Sha256, b"m"),
            c,
        ));
        waits.push(w);
    }
    // the third is over max_in_flight: refused at once
    assert_eq!(engine.submit(batch).len(), 1);
    for w in waits.into_iter().take(2) {
        assert_eq!(w.wait(Duration::from_secs(5)), Err(OpError::Timeout));
    }
    assert_eq!(engine.connected(), 0);
}

/// `qweb_keyserver_up` follows the connections: 1 while one is up, 0 once the key server is
/// gone; engine-side timeouts count as timed out, not failed.
#[test]
fn keyserver_up_gauge_and_timeouts_in_the_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let (ec_path, ec) = gen(dir.path(), "ec", false);
    let sock = dir.path().join("ks \"q\".sock");
    let ks = start(KeyserverConfig {
        generated_keys: None,
        keys: vec![ec_path],
        threads: 1,
        queue: 64,
        // SAFETY: getuid(2) has no preconditions.
        unix: Some((sock.clone(), vec![unsafe { libc::getuid() }])),
        tls: None,
        admin: None,
        limits: Default::default(),
        added_latency: Duration::from_millis(300),
        ticket_rotation: Duration::from_secs(12 * 3600),
    })
    .unwrap();
    let engine: Arc<dyn Engine> = Arc::new(
        KeyserverEngine::new(
            "ks",
            ClientConfig {
                servers: vec![Endpoint::Unix(sock.clone())],
                connections: 2,
                max_in_flight: 64,
                timeout: Duration::from_millis(100),
                tls: None,
            },
        )
        .unwrap(),
    );
    let mut registry = prometheus_client::registry::Registry::default();
    qweb_offload::EngineSet::new(vec![engine.clone()]).register(&mut registry);
    let render = || {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    };
    // the label value is escaped (the path has a quote)
    let up = format!(
        "qweb_keyserver_up{{engine=\"ks\",server=\"unix:{}\"}}",
        sock.display().to_string().replace('"', "\\\"")
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !render().contains(&format!("{up} 1")) {
        assert!(
            std::time::Instant::now() < deadline,
            "never up: {}",
            render()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // slower than the engine timeout: the engine times the op out, counted once
    let (c, w) = channel();
    assert!(engine
        .submit(vec![Submission::new(
            op(&ec, SignScheme::EcdsaP256Sha256, b"m"),
            c
        )])
        .is_empty());
    assert_eq!(w.wait(Duration::from_secs(5)), Err(OpError::Timeout));
    ks.shutdown();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !render().contains(&format!("{up} 0")) {
        assert!(
            std::time::Instant::now() < deadline,
            "never down: {}",
            render()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let text = render();
    assert!(
        text.contains("qweb_offload_ops_timed_out_total{engine=\"ks\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("qweb_offload_ops_failed_total{engine=\"ks\"} 0"),
        "{text}"
    );
    assert_eq!(text.matches("# TYPE qweb_keyserver_up gauge").count(), 1);
}
