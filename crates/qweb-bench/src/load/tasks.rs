//! The connection tasks: handshake mode's connect-handshake-close loop and keep-alive
//! mode's request loops on open connections.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::conn::{connect_tls, http_handshake};
use super::shared::{admit, complete, record_error, HsKind, OpError, Shared, Stats};
use super::{quic, request, Sender};
use crate::tls::HttpVersion;

/// One handshake-mode operation.
async fn handshake_op(sh: &Shared, resume: bool, rsa_only: bool) -> Result<(u64, HsKind), OpError> {
    let (mut tls, kind) = connect_tls(sh, resume, rsa_only).await?;
    if sh.spec.request {
        let (mut sender, conn) = http_handshake(sh, tls).await?;
        let n = request(sh, &mut sender).await;
        drop(sender);
        conn.abort();
        n.map(|n| (n, kind))
    } else {
        // close_notify + FIN, then wait for the server to close: it has then read our
        // Finished, i.e. completed its side of the handshake.
        let _ = tls.shutdown().await;
        let mut buf = [0u8; 4096];
        loop {
            match tls.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        Ok((0, kind))
    }
}

pub(super) async fn handshake_task(sh: Arc<Shared>, stats: Stats, index: usize) {
    let ep = match quic_endpoint(&sh, &stats) {
        Ok(ep) => ep,
        Err(()) => return,
    };
    // Whether each connection offers a session: a per-task xorshift, so runs are repeatable.
    let mut rng = (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while let Some(counted) = admit(&sh) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let draw = (rng >> 11) as f64 / (1u64 << 53) as f64;
        // one draw for both: the two options are not used together
        let resume = draw < sh.spec.resume_ratio;
        let rsa_only = draw < sh.spec.rsa_only_ratio;
        let began = Instant::now();
        let op = async {
            match &ep {
                Some(ep) => quic::handshake_op(&sh, ep)
                    .await
                    .map(|n| (n, HsKind::default())),
                None => handshake_op(&sh, resume, rsa_only).await,
            }
        };
        match tokio::time::timeout(sh.timeout, op).await {
            Ok(Ok((n, kind))) => complete(&sh, &stats, counted, began, n, Some(kind)),
            Ok(Err(e)) => {
                record_error(&stats, e);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(_) => record_error(&stats, OpError::Timeout),
        }
    }
}

/// Requests on one open connection until it fails or the run stops.
async fn request_loop(
    sh: &Shared,
    stats: &Stats,
    sender: &mut Sender,
    pace: Option<(Instant, Duration)>,
) -> bool {
    let mut next = pace.map(|(t, _)| t);
    loop {
        if let (Some(t), Some((_, iv))) = (next, pace) {
            tokio::time::sleep_until(t.into()).await;
            next = Some(t + iv);
        }
        let Some(counted) = admit(sh) else {
            return true;
        };
        let began = match (next, pace) {
            (Some(t), Some((_, iv))) => t - iv,
            _ => Instant::now(),
        };
        match tokio::time::timeout(sh.timeout, request(sh, sender)).await {
            Ok(Ok(n)) => complete(sh, stats, counted, began, n, None),
            Ok(Err(e)) => {
                record_error(stats, e);
                return false;
            }
            Err(_) => {
                record_error(stats, OpError::Timeout);
                return false;
            }
        }
    }
}

/// This task's QUIC client endpoint with `--http 3` (`None` otherwise); `Err` (recorded) when
/// it cannot bind.
fn quic_endpoint(sh: &Shared, stats: &Stats) -> Result<Option<quinn::Endpoint>, ()> {
    if sh.spec.http != HttpVersion::H3 {
        return Ok(None);
    }
    quic::endpoint(sh)
        .map(Some)
        .map_err(|e| record_error(stats, e))
}

pub(super) async fn keepalive_task(sh: Arc<Shared>, stats: Stats, index: usize) {
    let streams = match sh.spec.http {
        HttpVersion::H1 => 1,
        HttpVersion::H2 | HttpVersion::H3 => sh.spec.streams.max(1),
    };
    let ep = match quic_endpoint(&sh, &stats) {
        Ok(ep) => ep,
        Err(()) => return,
    };
    let interval = sh
        .spec
        .rate
        .map(|r| Duration::from_secs_f64((sh.spec.connections * streams) as f64 / r.max(0.001)));
    loop {
        if sh.stop.load(Relaxed) {
            return;
        }
        let setup = async {
            if let Some(ep) = &ep {
                return quic::open(&sh, ep).await;
            }
            let (tls, _) = connect_tls(&sh, false, false).await?;
            http_handshake(&sh, tls).await
        };
        let (mut sender, conn) = match tokio::time::timeout(sh.timeout, setup).await {
            Ok(Ok(x)) => x,
            Ok(Err(e)) => {
                record_error(&stats, e);
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            Err(_) => {
                record_error(&stats, OpError::Timeout);
                continue;
            }
        };
        {
            let mut s = stats.lock().unwrap_or_else(|p| p.into_inner());
            s.handshakes_all += 1;
        }
        let pace = |k: usize| {
            interval.map(|iv| {
                // Stagger the connections' schedules over one interval.
                let total = (sh.spec.connections * streams) as u32;
                let slot = (index * streams + k) as u32;
                (Instant::now() + iv / total.max(1) * slot, iv)
            })
        };
        let finished = if streams == 1 {
            request_loop(&sh, &stats, &mut sender, pace(0)).await
        } else {
            let mut set = tokio::task::JoinSet::new();
            for k in 0..streams {
                let (sh, stats, mut s, p) = (sh.clone(), stats.clone(), sender.clone(), pace(k));
                set.spawn(async move { request_loop(&sh, &stats, &mut s, p).await });
            }
            let mut all = true;
            while let Some(r) = set.join_next().await {
                all &= r.unwrap_or(false);
            }
            all
        };
        drop(sender);
        conn.abort();
        if finished {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
