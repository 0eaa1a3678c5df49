//! Phase 8, authentication (issue 39): a route's (or else its site's) `basic_auth`, after the
//! access rules of phase 7 and before the cache and the handler, so that nothing stored or
//! served reaches a client without credentials.
//!
//! A bcrypt or argon2 verification is 50 to 250 ms of CPU: it never runs on a worker. It is a
//! [`CheckOp`] on the process's password engine (a [`PoolEngine`] of one thread per core
//! behind a queue of [`ENGINE_QUEUE`], started at the first verification, its threads at
//! `SCHED_IDLE`), awaited like an offloaded compression chunk; at most `max_pending` verifications of one `basic_auth` block
//! wait or run at once, and past that (or a full engine queue) a request is answered 503 with
//! `Retry-After` at once rather than queued. A success is remembered for `cache_ttl` by the
//! SHA-256 of its `Authorization` value (never the password), as Caddy does, so a browser
//! that sends its credentials with every request pays for one verification, not one per
//! request. An unknown user is checked against a hash of the file (its answer thrown away),
//! so that it costs what a known user's wrong password does.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};

use base64::Engine as _;
use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use zeroize::Zeroizing;

use crate::config::BasicAuth;
use crate::pipeline::routes::Route;
use crate::pipeline::sites::Site;
use qweb_http::body::Body;
use qweb_http::response;
use qweb_observe::metrics::BasicAuthMetrics;
use qweb_offload::{CheckOp, Engine as _, Op, OpOutput, PoolConfig, PoolEngine, Submission};

/// The longest `Authorization` value read (bytes); a longer one is answered 401 without
/// being decoded. Room for a user name and a password of about 3000 bytes each.
pub(crate) const MAX_AUTHORIZATION: usize = 8192;

/// Verifications the password engine holds waiting, every `basic_auth` block together (each
/// block is bounded first by its `max_pending`).
pub(crate) const ENGINE_QUEUE: usize = 1024;

/// The `basic_auth` that applies to a request: its route's, else its site's.
pub(crate) fn applying<'a>(
    site: Option<&'a Site>,
    route: Option<&'a Route>,
) -> Option<&'a BasicAuth> {
    route
        .and_then(|r| r.rules.basic_auth.as_ref())
        .or_else(|| site.and_then(|s| s.basic_auth.as_ref()))
}

/// Checks the request's credentials and counts the result in the route's `metrics`: `Ok`
/// lets it through; `Err` is the 401 (with the challenge) or the 503 (too many verifications
/// waiting) to answer.
pub(crate) async fn check(
    auth: &BasicAuth,
    headers: &HeaderMap,
    metrics: Option<&BasicAuthMetrics>,
) -> Result<(), Response<Body>> {
    let r = verify(auth, headers).await;
    if let Some(m) = metrics {
        match &r {
            Ok(Checked::Verified) => m.passed.inc(),
            Ok(Checked::Cached) => m.cached.inc(),
            Err(e) if e.status() == StatusCode::UNAUTHORIZED => m.refused.inc(),
            Err(_) => m.busy.inc(),
        };
    }
    r.map(|_| ())
}

/// How credentials passed.
enum Checked {
    Verified,
    Cached,
}

async fn verify(auth: &BasicAuth, headers: &HeaderMap) -> Result<Checked, Response<Body>> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        // none, or several: ask
        return Err(unauthorized(auth));
    };
    if value.len() > MAX_AUTHORIZATION {
        return Err(unauthorized(auth));
    }
    let Some((user, password)) = credentials(value.as_bytes()) else {
        return Err(unauthorized(auth));
    };
    let key = sha256(value.as_bytes());
    if auth.cache.hit(&key) {
        return Ok(Checked::Cached);
    }
    let Some(_slot) = Slot::take(auth) else {
        tracing::debug!(
            max_pending = auth.max_pending,
            "basic_auth: too many verifications waiting"
        );
        return Err(busy());
    };
    let Some(engine) = engine() else {
        return Err(busy());
    };
    let users = auth.users.clone();
    let op = Op::Check(CheckOp {
        kind: "password_verify",
        check: Arc::new(move || {
            lower_priority_once();
            users.verify(&user, &password)
        }),
    });
    let (completer, completion) = qweb_offload::channel();
    if !engine
        .submit(vec![Submission::new(op, completer)])
        .is_empty()
    {
        tracing::debug!("basic_auth: the password engine's queue is full");
        return Err(busy());
    }
    match completion.await {
        Ok(OpOutput::Checked(true)) => {
            auth.cache.insert(key);
            Ok(Checked::Verified)
        }
        Ok(_) => Err(unauthorized(auth)),
        Err(e) => {
            tracing::warn!("basic_auth: verification failed: {e}");
            Err(busy())
        }
    }
}

/// The user and password of a `Basic` `Authorization` value; `None` when it is another
/// scheme, not base64, or has no `:` (RFC 7617: the user-id cannot contain one).
fn credentials(value: &[u8]) -> Option<(String, Zeroizing<Vec<u8>>)> {
    let value = value.trim_ascii();
    let space = value.iter().position(|&b| b == b' ')?;
    if !value[..space].eq_ignore_ascii_case(b"basic") {
        return None;
    }
    let decoded = Zeroizing::new(
        base64::engine::general_purpose::STANDARD
            .decode(value[space..].trim_ascii())
            .ok()?,
    );
    let colon = decoded.iter().position(|&b| b == b':')?;
    let user = std::str::from_utf8(&decoded[..colon]).ok()?.to_owned();
    Some((user, Zeroizing::new(decoded[colon + 1..].to_vec())))
}

fn sha256(value: &[u8]) -> [u8; 32] {
    let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, value);
    let mut out = [0; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// 401 with the block's challenge (RFC 7617 section 2).
fn unauthorized(auth: &BasicAuth) -> Response<Body> {
    let mut r = response::status(StatusCode::UNAUTHORIZED);
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, auth.challenge.clone());
    r
}

/// 503 with `Retry-After: 1`: too many verifications are waiting.
fn busy() -> Response<Body> {
    let mut r = response::status(StatusCode::SERVICE_UNAVAILABLE);
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

/// One of a block's `max_pending` verifications, given back when dropped (answered, or the
/// request went away).
struct Slot<'a>(&'a BasicAuth);

impl<'a> Slot<'a> {
    fn take(auth: &'a BasicAuth) -> Option<Slot<'a>> {
        auth.pending
            .fetch_update(Relaxed, Relaxed, |n| {
                (n < auth.max_pending).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(auth))
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Relaxed);
    }
}

/// The nice value of the password engine's threads where `SCHED_IDLE` is refused: under a
/// guessing flood they take the CPU the workers leave, not the other way round (CFS weighs
/// nice 10 at about a tenth of 0).
const ENGINE_NICE: i32 = 10;

/// Moves the calling engine thread to `SCHED_IDLE` at its first verification (Linux keeps a
/// policy per thread; the password engine's threads run nothing else), else lowers it to
/// [`ENGINE_NICE`]. Nice 10 is not enough on two cores under a flood: both engine threads are
/// always runnable, and a waking worker waits out a nice-10 thread's slice (EEVDF lets the
/// running task finish it: a few ms at each wake-up, 8 to 10 ms of small-request p99 at 1000
/// guesses/s, `tests/it/basic_auth_guessing.rs`); a `SCHED_IDLE` thread is preempted at once
/// by any waking normal thread. Where neither can be set, the thread keeps its priority.
fn lower_priority_once() {
    thread_local!(static DONE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
    DONE.with(|done| {
        if !done.replace(true) {
            #[cfg(target_os = "linux")]
            {
                let param = libc::sched_param { sched_priority: 0 };
                // SAFETY: `param` is a valid sched_param for the call; pid 0 is this thread.
                #[allow(unsafe_code)]
                let set = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
                if set == 0 {
                    return;
                }
            }
            let now = rustix::process::getpriority_process(None).unwrap_or(0);
            if now < ENGINE_NICE {
                let _ = rustix::process::setpriority_process(None, ENGINE_NICE);
            }
        }
    });
}

/// The process's password engine: one thread per core, started at the first verification
/// (`None` when its threads cannot be started: then every verification answers 503).
fn engine() -> Option<&'static PoolEngine> {
    static ENGINE: OnceLock<Option<PoolEngine>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
            PoolEngine::new(
                "basic_auth",
                PoolConfig {
                    threads,
                    queue: ENGINE_QUEUE,
                    ..PoolConfig::default()
                },
            )
            .map_err(|e| tracing::error!("basic_auth: cannot start the password engine: {e}"))
            .ok()
        })
        .as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_credentials_are_none_and_never_panic() {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let ok = format!("Basic {}", b64("alice:pa:ss"));
        let (u, p) = credentials(ok.as_bytes()).unwrap();
        assert_eq!((u.as_str(), &p[..]), ("alice", &b"pa:ss"[..]));
        let lower = format!("basic  {} ", b64("a:"));
        assert_eq!(credentials(lower.as_bytes()).unwrap().0, "a");
        for bad in [
            "".to_owned(),
            "Basic".to_owned(),
            "Basic ".to_owned(),
            "Basic !!!!".to_owned(),
            format!("Basic {}", b64("nocolon")),
            format!("Bearer {}", b64("a:b")),
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(b"\xff:x")
            ),
            "Basic YQ".to_owned(),
        ] {
            assert!(credentials(bad.as_bytes()).is_none(), "{bad:?}");
        }
    }
}
