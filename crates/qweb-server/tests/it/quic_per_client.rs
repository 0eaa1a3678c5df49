//! `connections_per_client` over QUIC alone (issue 39, hostile: one client opening
//! connections as fast as it can). quinn's own client opens them, all at once, from one
//! address: at most `connections_per_client` stay open across the workers, the rest are
//! closed just after their handshake (`H3_EXCESSIVE_LOAD`, reason `connections_per_client`)
//! and counted, while another address is served; closing the held ones frees their slots.

use qweb_testkit as common;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::h3::{aioquic, aioquic_available, H3Request};

const LIMIT: usize = 3;

/// A QUIC client endpoint on `ip` that trusts `ca` and offers `h3`.
fn endpoint(ip: Ipv4Addr, ca: &Path) -> quinn::Endpoint {
    let tls = common::tls::ClientTls::trusting(ca)
        .alpn(&[b"h3"])
        .no_resumption()
        .build();
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).expect("a QUIC TLS config");
    let mut ep = quinn::Endpoint::client(SocketAddr::new(ip.into(), 0)).expect("a UDP socket");
    ep.set_default_client_config(quinn::ClientConfig::new(Arc::new(quic)));
    ep
}

/// How one connection attempt ended after a second.
#[derive(Debug)]
enum Outcome {
    /// Still open: the server kept it.
    Held(quinn::Connection),
    /// Closed by the server under `connections_per_client`.
    Refused,
    /// Anything else (a failed handshake, another close).
    Other(String),
}

async fn attempt(ep: quinn::Endpoint, to: SocketAddr) -> Outcome {
    let connecting = match ep.connect(to, "localhost") {
        Ok(c) => c,
        Err(e) => return Outcome::Other(e.to_string()),
    };
    let refused = |e: &quinn::ConnectionError| {
        matches!(e, quinn::ConnectionError::ApplicationClosed(c)
            if &c.reason[..] == b"connections_per_client")
    };
    let conn = match tokio::time::timeout(Duration::from_secs(10), connecting).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) if refused(&e) => return Outcome::Refused,
        Ok(Err(e)) => return Outcome::Other(e.to_string()),
        Err(_) => return Outcome::Other("handshake timed out".into()),
    };
    match tokio::time::timeout(Duration::from_secs(1), conn.closed()).await {
        Err(_) => Outcome::Held(conn),
        Ok(e) if refused(&e) => Outcome::Refused,
        Ok(e) => Outcome::Other(e.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_opening_quic_connections_at_once_holds_at_the_limit() {
    let ts = common::start_with(
        &format!(
            "workers = 2\n[admin]\naddress = \"127.0.0.1:0\"\n\
             [limits]\nconnections_per_client = {LIMIT}\n\
             [[listener]]\naddress = \"127.0.0.1:0\"\nhttp3 = true\n[listener.tls]\nself_signed = true\n\
             [[route]]\nprefix = \"/\"\nroot = \"{{dir}}/site\"\n"
        ),
        |d| std::fs::write(d.join("site/a.txt"), "a").unwrap(),
    );
    let to = ts.addrs[0];
    // 20 connections at once from 127.0.0.1, from as many UDP ports
    let flood: Vec<_> = (0..20)
        .map(|_| tokio::spawn(attempt(endpoint(Ipv4Addr::LOCALHOST, &ts.cert()), to)))
        .collect();
    let mut held = Vec::new();
    let (mut refused, mut other) = (0, Vec::new());
    for t in flood {
        match t.await.unwrap() {
            Outcome::Held(c) => held.push(c),
            Outcome::Refused => refused += 1,
            Outcome::Other(e) => other.push(e),
        }
    }
    assert!(other.is_empty(), "{other:?}");
    assert_eq!((held.len(), refused), (LIMIT, 20 - LIMIT));
    // another address is served meanwhile
    let other_client = attempt(endpoint(Ipv4Addr::new(127, 0, 0, 2), &ts.cert()), to).await;
    assert!(matches!(other_client, Outcome::Held(_)), "{other_client:?}");
    let m = ts.metrics().await;
    assert!(
        m.sum("qweb_connections_refused_per_client_total", &[]) >= (20 - LIMIT) as f64,
        "{}",
        m.sum("qweb_connections_refused_per_client_total", &[])
    );
    // the held connections closed, 127.0.0.1 is served again (an HTTP/3 request)
    for c in &held {
        c.close(0u32.into(), b"done");
    }
    drop(held);
    // (the server frees a slot when it sees the close: try until one is kept)
    let (ca, mut kept) = (ts.cert(), None);
    for _ in 0..10 {
        match attempt(endpoint(Ipv4Addr::LOCALHOST, &ca), to).await {
            Outcome::Held(c) => {
                kept = Some(c);
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let kept = kept.expect("a slot freed by the closed connections");
    kept.close(0u32.into(), b"done");
    if aioquic_available() {
        let mut last = None;
        for _ in 0..10 {
            let ca = ts.cert();
            let out = tokio::task::spawn_blocking(move || {
                aioquic(to, &ca, &[H3Request::get("/a.txt")], false)
            })
            .await
            .unwrap();
            let status = out
                .as_ref()
                .ok()
                .and_then(|o| o[0].as_ref().ok())
                .map(|r| r.status);
            if status == Some(200) {
                return;
            }
            last = Some(out);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("HTTP/3 from 127.0.0.1 not served again: {last:?}");
    }
}
