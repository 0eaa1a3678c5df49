//! The load generator's `--resume-ratio` against real TLS servers on 127.0.0.1 (rustls over
//! tokio, real sockets): the client counts what rustls says happened per connection, and
//! never reports resumptions a server did not grant.
//!
//! - a server that resumes (tickets and a session cache): about the asked fraction resumes;
//! - a server that refuses every session (no tickets, no cache): connections ask, none
//!   resumes, and the run is not an error (the rows report the fraction);
//! - two servers behind the client's round-robin with different ticket keys: only tickets
//!   from the same server resume (about half of the asked);
//! - without --resume-ratio every handshake is full.
//!
//! And its `--rsa-only-ratio` (clients that cannot verify ECDSA): against a server with an
//! RSA and an ECDSA certificate that picks by the client's signature schemes, about that
//! share of the verified server signatures is RSA; against an ECDSA-only server those
//! clients fail.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use qweb_bench::load::{run_load, LoadSpec, Mode};
use qweb_bench::tls::TlsVersion;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{NoServerSessionStorage, ServerConfig, ServerSessionMemoryCache};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Clone, Copy, PartialEq)]
enum Sessions {
    /// Tickets (TLS 1.2 and 1.3) and a session-id cache.
    Resume,
    /// Nothing: every handshake full.
    Refuse,
}

fn server_config(sessions: Sessions) -> Arc<ServerConfig> {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])
        .expect("certificate");
    let cert = CertificateDer::from(ck.cert.der().to_vec());
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ck.key_pair.serialize_der()));
    let mut cfg = ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(vec![cert], key)
    .expect("server config");
    match sessions {
        Sessions::Resume => {
            cfg.ticketer = rustls::crypto::aws_lc_rs::Ticketer::new().expect("ticketer");
            cfg.session_storage = ServerSessionMemoryCache::new(1024);
        }
        Sessions::Refuse => {
            cfg.session_storage = Arc::new(NoServerSessionStorage {});
            cfg.send_tls13_tickets = 0;
        }
    }
    Arc::new(cfg)
}

/// A TLS server on 127.0.0.1:0 in its own thread: handshake, read to EOF, close.
fn serve(sessions: Sessions) -> SocketAddr {
    serve_config(server_config(sessions))
}

/// Picks the ECDSA certificate for clients that offer ECDSA P-256 signatures, else the RSA
/// one (dual certificates); without `ecdsa`, `rsa` is given to every client (whatever its
/// key).
#[derive(Debug)]
struct Dual {
    rsa: Arc<rustls::sign::CertifiedKey>,
    ecdsa: Option<Arc<rustls::sign::CertifiedKey>>,
}

impl rustls::server::ResolvesServerCert for Dual {
    fn resolve(
        &self,
        hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        let ecdsa_ok = hello
            .signature_schemes()
            .contains(&rustls::SignatureScheme::ECDSA_NISTP256_SHA256);
        match &self.ecdsa {
            Some(e) if ecdsa_ok => Some(e.clone()),
            _ => Some(self.rsa.clone()),
        }
    }
}

fn certified(alg: &'static rcgen::SignatureAlgorithm) -> Arc<rustls::sign::CertifiedKey> {
    let kp = if alg == &rcgen::PKCS_RSA_SHA256 {
        rcgen::KeyPair::generate_rsa_for(alg, rcgen::RsaKeySize::_2048)
    } else {
        rcgen::KeyPair::generate_for(alg)
    }
    .expect("key");
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".into()])
        .expect("params")
        .self_signed(&kp)
        .expect("certificate");
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(kp.serialize_der()));
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    Arc::new(
        rustls::sign::CertifiedKey::from_der(vec![cert.der().clone()], key, &provider)
            .expect("certified key"),
    )
}

/// A server with an ECDSA certificate for clients that verify it and an RSA one for the
/// others (`rsa`), or with the ECDSA one only.
fn serve_signing(rsa: bool) -> SocketAddr {
    let ecdsa = certified(&rcgen::PKCS_ECDSA_P256_SHA256);
    let resolver = if rsa {
        Dual {
            rsa: certified(&rcgen::PKCS_RSA_SHA256),
            ecdsa: Some(ecdsa),
        }
    } else {
        Dual {
            rsa: ecdsa,
            ecdsa: None,
        }
    };
    let mut cfg = ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_no_client_auth()
    .with_cert_resolver(Arc::new(resolver));
    cfg.session_storage = Arc::new(NoServerSessionStorage {});
    cfg.send_tls13_tickets = 0;
    serve_config(Arc::new(cfg))
}

fn serve_config(cfg: Arc<ServerConfig>) -> SocketAddr {
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = std_listener.local_addr().expect("addr");
    std_listener.set_nonblocking(true).expect("nonblocking");
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(std_listener).expect("listener");
            let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = tls.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                    }
                    let _ = tls.shutdown().await;
                });
            }
        });
    });
    addr
}

fn spec(addr: SocketAddr, tls: TlsVersion, ratio: f64) -> LoadSpec {
    let mut s = LoadSpec::new(format!("https://{addr}/"), Mode::Handshake);
    s.tls = tls;
    s.connections = 4;
    s.warmup = 0.3;
    s.count = Some(400);
    s.threads = Some(2);
    s.resume_ratio = ratio;
    s
}

#[test]
fn about_the_asked_fraction_resumes_on_a_server_that_resumes() {
    let addr = serve(Sessions::Resume);
    for tls in [TlsVersion::Tls13, TlsVersion::Tls12] {
        let r = run_load(&spec(addr, tls, 0.8)).expect("run");
        assert_eq!(r.errors.total(), 0, "{:?} {:?}", r.errors, r.error_samples);
        assert_eq!(r.handshakes, 400);
        let asked = r.resume_asked as f64 / 400.0;
        assert!((0.72..=0.88).contains(&asked), "asked {asked}");
        // Every connection that asked had a session to offer after the warm-up.
        assert!(
            r.resumed + 8 >= r.resume_asked && r.resumed <= r.resume_asked,
            "{tls:?}: asked {} resumed {}",
            r.resume_asked,
            r.resumed
        );
        assert!(
            (r.resumed_fraction() - 0.8).abs() < 0.1,
            "{}",
            r.resumed_fraction()
        );
        assert!(r.human().contains("resumed"));
    }
}

#[test]
fn many_concurrent_connections_still_find_tickets() {
    // rustls' own client cache keeps 8 TLS 1.3 tickets per server: 64 connections taking
    // tickets at once would mostly find none and do full handshakes.
    let addr = serve(Sessions::Resume);
    let mut s = spec(addr, TlsVersion::Tls13, 0.8);
    s.connections = 64;
    s.count = Some(1500);
    s.warmup = 0.5;
    let r = run_load(&s).expect("run");
    assert_eq!(r.errors.total(), 0, "{:?} {:?}", r.errors, r.error_samples);
    let asked = r.resume_asked as f64 / r.handshakes as f64;
    assert!(
        (r.resumed_fraction() - asked).abs() < 0.03,
        "asked {asked}, resumed {}",
        r.resumed_fraction()
    );
}

#[test]
fn a_server_that_refuses_sessions_gets_no_resumption_counted() {
    let addr = serve(Sessions::Refuse);
    for tls in [TlsVersion::Tls13, TlsVersion::Tls12] {
        let r = run_load(&spec(addr, tls, 0.8)).expect("run");
        assert_eq!(r.errors.total(), 0, "{:?} {:?}", r.errors, r.error_samples);
        assert!(r.resume_asked > 200, "asked {}", r.resume_asked);
        assert_eq!(r.resumed, 0);
        assert_eq!(r.resumed_all, 0);
    }
}

#[test]
fn tickets_from_another_node_do_not_resume_without_shared_keys() {
    let a = serve(Sessions::Resume);
    let b = serve(Sessions::Resume);
    let mut s = spec(a, TlsVersion::Tls13, 1.0);
    s.also = vec![format!("https://{b}/")];
    s.connections = 1;
    let r = run_load(&s).expect("run");
    assert_eq!(r.errors.total(), 0, "{:?} {:?}", r.errors, r.error_samples);
    assert_eq!(r.resume_asked, 400);
    // One connection alternating A, B, A, B: each offers the newest ticket... from the other
    // node, except when a stored ticket of the same node is taken first. Nowhere near all.
    let f = r.resumed_fraction();
    assert!(
        f < 0.75,
        "resumed fraction {f} across nodes with their own keys"
    );
    assert!(s.command_line().contains(&format!("--also https://{b}/")));
}

#[test]
fn without_a_ratio_every_handshake_is_full_even_on_a_resuming_server() {
    let addr = serve(Sessions::Resume);
    let r = run_load(&spec(addr, TlsVersion::Tls13, 0.0)).expect("run");
    assert_eq!(r.errors.total(), 0, "{:?} {:?}", r.errors, r.error_samples);
    assert_eq!((r.resumed, r.resume_asked), (0, 0));
    assert_eq!(r.handshakes, 400);
    std::thread::sleep(Duration::from_millis(10));
}

#[test]
fn a_ratio_outside_zero_to_one_is_refused() {
    let mut s = spec("127.0.0.1:1".parse().unwrap(), TlsVersion::Tls13, 1.5);
    assert!(run_load(&s).is_err());
    s.resume_ratio = 0.5;
    s.mode = Mode::Keepalive;
    assert!(run_load(&s).is_err());
}

#[test]
fn rsa_only_clients_get_the_rsa_certificate_of_a_dual_server() {
    let addr = serve_signing(true);
    for tls in [TlsVersion::Tls13, TlsVersion::Tls12] {
        let mut s = spec(addr, tls, 0.0);
        s.rsa_only_ratio = 0.5;
        let r = run_load(&s).expect("run");
        assert_eq!(r.errors.total(), 0, "{:?} {:?}", r.errors, r.error_samples);
        let all = r.ecdsa_signed + r.rsa_signed;
        assert_eq!(all, r.handshakes_all, "every signature counted once");
        let share = r.rsa_signed as f64 / all as f64;
        assert!((0.4..=0.6).contains(&share), "{tls:?}: RSA share {share}");
        assert!(s.command_line().contains("--rsa-only-ratio 0.5"));
        // without the option every client verifies ECDSA, and gets it
        let r = run_load(&spec(addr, tls, 0.0)).expect("run");
        assert_eq!((r.rsa_signed, r.ecdsa_signed), (0, r.handshakes_all));
    }
}

#[test]
fn rsa_only_clients_fail_on_an_ecdsa_only_server_and_bad_ratios_are_refused() {
    let addr = serve_signing(false);
    let mut s = spec(addr, TlsVersion::Tls13, 0.0);
    s.rsa_only_ratio = 1.0;
    s.count = None;
    s.duration = 0.3;
    let r = run_load(&s).expect("run");
    assert!(r.errors.tls > 0 && r.handshakes == 0, "{:?}", r.errors);
    s.rsa_only_ratio = 1.5;
    assert!(run_load(&s).is_err());
    s.rsa_only_ratio = 0.5;
    s.resume_ratio = 0.5;
    assert!(run_load(&s).is_err());
}
