//! `ocsp = "fetch"`: OCSP responses fetched from the certificate's responder (the `http://`
//! URL of its Authority Information Access), by POST (RFC 6960 appendix A), stapled once
//! checked, refreshed at half-life (halfway from `thisUpdate` to `nextUpdate`). When the
//! responder is down or answers wrongly the failure is logged (once until it recovers) and
//! counted, the current staple stays until its own `nextUpdate` (never past it), and qweb
//! retries after 5 s, doubling to 5 minutes.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use qweb_tls::ocsp::OcspStaple;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

/// Largest responder answer read.
const MAX_ANSWER: usize = 64 * 1024;

/// Fetches and refreshes `holder`'s staple until `shutdown` (a thread of its own).
pub(crate) fn run(holder: Arc<OcspStaple>, mut shutdown: watch::Receiver<bool>) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("OCSP fetcher: {e}");
            return;
        }
    };
    let (leaf, issuer) = holder.chain();
    let prepared = qweb_tls::ocsp::responder_url(leaf)
        .map_err(|e| e.to_string())
        .and_then(|u| u.ok_or_else(|| "no OCSP responder URL".to_owned()))
        .and_then(|url| {
            let issuer = issuer.ok_or("no issuer certificate in the chain")?;
            let req = qweb_tls::ocsp::request(leaf, issuer).map_err(|e| e.to_string())?;
            Ok((url, req))
        });
    let (url, req) = match prepared {
        Ok(p) => p,
        Err(e) => {
            holder.failed();
            tracing::error!("OCSP stapling off for this certificate: {e}");
            return;
        }
    };
    rt.block_on(async move {
        let mut healthy = true;
        let mut backoff = Duration::from_secs(5);
        loop {
            let got = fetch(&url, &req)
                .await
                .and_then(|der| holder.set(der, SystemTime::now()).map_err(|e| e.to_string()));
            let wait = match got {
                Ok(st) => {
                    if !healthy {
                        tracing::info!(%url, "OCSP responder answers again");
                    }
                    healthy = true;
                    backoff = Duration::from_secs(5);
                    let life = st
                        .next_update
                        .duration_since(st.this_update)
                        .unwrap_or_default();
                    let half = st.this_update + life / 2;
                    half.duration_since(SystemTime::now())
                        .unwrap_or_default()
                        .max(Duration::from_secs(1))
                }
                Err(e) => {
                    holder.failed();
                    if healthy {
                        tracing::warn!(%url, "OCSP fetch failed ({e}); serving the current staple while it is valid, else none");
                    }
                    healthy = false;
                    let w = backoff;
                    backoff = (backoff * 2).min(Duration::from_secs(300));
                    w
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.wait_for(|s| *s) => return,
            }
        }
    });
}

/// One POST of `req` to `url` (`http://host[:port][/path]`); the response body.
async fn fetch(url: &str, req: &[u8]) -> Result<Vec<u8>, String> {
    let rest = url.strip_prefix("http://").ok_or("not an http:// URL")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let addr = if authority.contains(':') && !authority.ends_with(']') {
        authority.to_owned()
    } else {
        format!("{authority}:80")
    };
    let work = async {
        let mut s = tokio::net::TcpStream::connect(&addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        let head = format!(
            "POST {path} HTTP/1.0\r\nHost: {authority}\r\nContent-Type: application/ocsp-request\r\nContent-Length: {}\r\n\r\n",
            req.len()
        );
        s.write_all(head.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        s.write_all(req).await.map_err(|e| e.to_string())?;
        let mut answer = Vec::new();
        let mut limited = (&mut s).take(MAX_ANSWER as u64 + 1);
        limited
            .read_to_end(&mut answer)
            .await
            .map_err(|e| e.to_string())?;
        if answer.len() > MAX_ANSWER {
            return Err("answer too large".to_owned());
        }
        Ok::<_, String>(answer)
    };
    let answer = tokio::time::timeout(Duration::from_secs(10), work)
        .await
        .map_err(|_| "no answer within 10 s".to_owned())??;
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no HTTP head")?;
    let status = answer[..split]
        .split(|b| *b == b'\n')
        .next()
        .and_then(|l| std::str::from_utf8(l).ok())
        .unwrap_or("");
    if status.split(' ').nth(1) != Some("200") {
        return Err(format!("responder answered `{}`", status.trim()));
    }
    Ok(answer[split + 4..].to_vec())
}
