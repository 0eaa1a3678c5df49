//! The load generator: many client connections on a multi-threaded tokio runtime, every
//! response checked, results over a measured window after a warm-up.
//!
//! Two modes:
//! - [`Mode::Handshake`]: each connection does connect → full TLS handshake (the client has no
//!   session cache and no tickets, and every connection's handshake kind is checked to be
//!   `Full`) → optionally one request → close, then starts over. Measures handshakes/s. Without
//!   a request the client sends close_notify and waits for the server to close, so the server
//!   has processed the whole handshake before the next one starts.
//! - [`Mode::Keepalive`]: each connection is opened once and sends requests back to back (or
//!   paced at `--rate`, latency then measured from the scheduled send time so a stalled server
//!   is not hidden). Measures requests/s, body bytes/s and latency percentiles.
//!
//! Client sockets close with `SO_LINGER` 0 so thousands of short connections leave no
//! TIME_WAIT entries behind to exhaust the ephemeral ports.
//!
//! The parts: `spec` (what a run is asked and what it reports), `target` (the URL resolved),
//! `shared` (what the tasks share and count), `conn` (TCP, TLS and HTTP handshakes), `fetch`
//! (HTTP/1.1 and HTTP/2 requests and the response checks), `quic` (the same over HTTP/3),
//! `tasks` (the per-connection loops of both modes) and `idle` (connections held open); this
//! file starts a run and sums its tasks' counts into the report.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::ACCEPT_ENCODING;
use http::Request;
use http_body_util::Empty;
use hyper::client::conn::{http1, http2};
use rustls::pki_types::ServerName;
use serde::Serialize;
use tokio_rustls::TlsConnector;

use crate::stats::{summarize, LatencySummary};
use crate::tls::{
    client_config_signing, resuming_configs, HttpVersion, SignatureTally, TlsVersion,
};
use crate::{Error, Result};

mod conn;
mod fetch;
mod quic;
mod shared;
mod spec;
mod target;
mod tasks;
use conn::{connect_tls, http_handshake};
use fetch::{check, fetch, Fetched};
use shared::{record_error, OpError, Shared, Stats, TaskStats};
pub use spec::{ErrorCounts, LoadReport, LoadSpec, Mode};
use target::{parse_target, Target};
use tasks::{handshake_task, keepalive_task};

enum Sender {
    H1(http1::SendRequest<Empty<Bytes>>),
    H2(http2::SendRequest<Empty<Bytes>>),
    H3(quic::H3Sender),
}

impl Clone for Sender {
    fn clone(&self) -> Self {
        match self {
            // HTTP/1.1 senders are not shared between streams; see `tasks::keepalive_task`.
            Sender::H1(_) => unreachable!("HTTP/1.1 senders are never cloned"),
            Sender::H2(s) => Sender::H2(s.clone()),
            Sender::H3(s) => Sender::H3(s.clone()),
        }
    }
}

/// Sends one request and checks the response; returns the body bytes.
async fn request(sh: &Shared, sender: &mut Sender) -> Result<u64, OpError> {
    let got = match sender {
        Sender::H3(s) => quic::fetch(sh, s).await?,
        _ => fetch(sh, sender).await?,
    };
    check(sh, got)
}

/// Runs `spec` on its own multi-threaded runtime and returns the report.
pub fn run_load(spec: &LoadSpec) -> Result<LoadReport> {
    if spec.connections == 0 {
        return Err(Error::Arg("--connections must be at least 1".into()));
    }
    if !(spec.duration > 0.0 && spec.warmup >= 0.0 && spec.timeout > 0.0) {
        return Err(Error::Arg(
            "--duration and --timeout must be > 0, --warmup >= 0".into(),
        ));
    }
    if !(0.0..=1.0).contains(&spec.resume_ratio) {
        return Err(Error::Arg("--resume-ratio must be within 0..=1".into()));
    }
    if spec.resume_ratio > 0.0 && spec.mode != Mode::Handshake {
        return Err(Error::Arg("--resume-ratio needs --mode handshake".into()));
    }
    if !(0.0..=1.0).contains(&spec.rsa_only_ratio) {
        return Err(Error::Arg("--rsa-only-ratio must be within 0..=1".into()));
    }
    if spec.rsa_only_ratio > 0.0 && (spec.mode != Mode::Handshake || spec.resume_ratio > 0.0) {
        return Err(Error::Arg(
            "--rsa-only-ratio needs --mode handshake and no --resume-ratio".into(),
        ));
    }
    if spec.http == HttpVersion::H3
        && (spec.tls != TlsVersion::Tls13 || spec.resume_ratio > 0.0 || spec.rsa_only_ratio > 0.0)
    {
        return Err(Error::Arg(
            "--http 3 needs --tls 1.3 and no --resume-ratio or --rsa-only-ratio".into(),
        ));
    }
    let tally = Arc::new(SignatureTally::default());
    let target = parse_target(&spec.url)?;
    let others = spec
        .also
        .iter()
        .map(|u| parse_target(u))
        .collect::<Result<Vec<_>>>()?;
    let (connector, resume_connector) = if spec.resume_ratio > 0.0 {
        // Enough tickets for every connection to hold one while the others come back.
        let c = resuming_configs(spec.tls, spec.http, (spec.connections * 4).max(64))?;
        (
            TlsConnector::from(c.full),
            Some(TlsConnector::from(c.resume)),
        )
    } else {
        (
            TlsConnector::from(client_config_signing(
                spec.tls,
                spec.http,
                false,
                tally.clone(),
            )?),
            None,
        )
    };
    let rsa_connector = if spec.rsa_only_ratio > 0.0 {
        Some(TlsConnector::from(client_config_signing(
            spec.tls,
            spec.http,
            true,
            tally.clone(),
        )?))
    } else {
        None
    };
    let quic = match spec.http {
        HttpVersion::H3 => Some(quic::client_config(client_config_signing(
            spec.tls,
            spec.http,
            false,
            tally.clone(),
        )?)?),
        _ => None,
    };
    crate::raise_fd_limit(spec.connections as u64 * 2 + 1024);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(spec.threads.unwrap_or_else(crate::cpus).max(1))
        .enable_all()
        .build()
        .map_err(|e| Error::io("start the client runtime", e))?;
    rt.block_on(run_async(
        spec.clone(),
        target,
        others,
        connector,
        (resume_connector, rsa_connector, quic),
        tally,
    ))
}

async fn run_async(
    spec: LoadSpec,
    target: Target,
    others: Vec<Target>,
    connector: TlsConnector,
    (resume_connector, rsa_connector, quic): (
        Option<TlsConnector>,
        Option<TlsConnector>,
        Option<quinn::ClientConfig>,
    ),
    tally: Arc<SignatureTally>,
) -> Result<LoadReport> {
    let start = Instant::now();
    let warmup_end = start + Duration::from_secs_f64(spec.warmup);
    let end = match spec.count {
        Some(_) => warmup_end + Duration::from_secs(365 * 24 * 3600),
        None => warmup_end + Duration::from_secs_f64(spec.duration),
    };
    let sh = Arc::new(Shared {
        timeout: Duration::from_secs_f64(spec.timeout),
        tickets: spec.count.map(|n| AtomicI64::new(n as i64)),
        spec,
        target,
        others,
        next_target: AtomicU64::new(0),
        connector,
        resume_connector,
        rsa_connector,
        quic,
        tally,
        start,
        warmup_end,
        end,
        last_done: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    });
    let mut all_stats = Vec::new();
    let mut handles = Vec::new();
    for i in 0..sh.spec.connections {
        let stats: Stats = Arc::default();
        all_stats.push(stats.clone());
        let sh = sh.clone();
        handles.push(tokio::spawn(async move {
            match sh.spec.mode {
                Mode::Handshake => handshake_task(sh, stats, i).await,
                Mode::Keepalive => keepalive_task(sh, stats, i).await,
            }
        }));
    }
    let measured = if sh.spec.count.is_some() {
        for h in handles {
            let _ = h.await;
        }
        let last = Duration::from_nanos(sh.last_done.load(Relaxed));
        (start + last).saturating_duration_since(warmup_end)
    } else {
        tokio::time::sleep_until(end.into()).await;
        sh.stop.store(true, Relaxed);
        for h in &handles {
            h.abort();
        }
        for h in handles {
            let _ = h.await;
        }
        end - warmup_end
    };
    let mut total = TaskStats::default();
    for s in all_stats {
        let mut s = s.lock().unwrap_or_else(|p| p.into_inner());
        total.samples.append(&mut s.samples);
        total.ops += s.ops;
        total.handshakes += s.handshakes;
        total.handshakes_all += s.handshakes_all;
        total.resumed += s.resumed;
        total.resumed_all += s.resumed_all;
        total.resume_asked += s.resume_asked;
        total.requests += s.requests;
        total.bytes += s.bytes;
        total.errors.add(&s.errors);
        for m in s.messages.drain(..) {
            if total.messages.len() < 5 {
                total.messages.push(m);
            }
        }
    }
    let secs = measured.as_secs_f64().max(1e-9);
    Ok(LoadReport {
        spec: sh.spec.clone(),
        measured_secs: secs,
        ops: total.ops,
        ops_per_sec: total.ops as f64 / secs,
        handshakes: total.handshakes,
        handshakes_all: total.handshakes_all,
        resumed: total.resumed,
        resumed_all: total.resumed_all,
        resume_asked: total.resume_asked,
        requests: total.requests,
        body_bytes: total.bytes,
        mib_per_sec: total.bytes as f64 / secs / (1024.0 * 1024.0),
        latency: summarize(&mut total.samples),
        errors: total.errors,
        error_samples: total.messages,
        ecdsa_signed: sh.tally.ecdsa.load(Relaxed),
        rsa_signed: sh.tally.rsa.load(Relaxed),
    })
}

mod idle;
pub use idle::IdleSet;

#[cfg(test)]
mod tests;
