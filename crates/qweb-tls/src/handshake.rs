//! The handshake driver: runs rustls' handshake steps over a socket; in async offload mode
//! each `process_new_packets` runs as a job, so that a private-key signature inside it pauses
//! the job while the worker serves other connections, and resumes it when the engine answers.

use std::io;
use std::rc::Rc;
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::Poll;

use qweb_offload::job::{Job, Step};
use qweb_offload::Offloader;
use rustls::{ServerConfig, ServerConnection};
use tokio::io::AsyncWriteExt;

use crate::stream::{SyncIo, TlsStream};

pub use crate::stream::Transport;

/// Per-worker handshake counters the caller may observe.
#[derive(Debug, Default)]
pub struct HandshakeGauges {
    /// Jobs paused on an offloaded op right now.
    pub paused: AtomicI64,
}

/// How `process_new_packets` runs.
pub enum Driver<'a> {
    /// Directly on the worker (mode `none`, and `sync`: the signer blocks the thread).
    Direct,
    /// Directly on the worker, but taking turns (see [`HandshakeTurns`]): what a worker does
    /// in modes `none` and `sync`.
    Fair(&'a HandshakeTurns),
    /// As a job: signatures pause it and go to this worker's offloader (mode `async`).
    Job {
        /// The worker's handle on the engine.
        offloader: &'a Rc<Offloader>,
        /// Gauges to update while paused.
        gauges: &'a HandshakeGauges,
    },
}

/// Turns of one worker's handshake steps when they run on the worker (the private-key
/// signature computed in place or waited for): one step at a time, and each only after the
/// worker has polled for I/O and run what was ready.
///
/// A burst of new connections otherwise queues a burst of handshake steps (a millisecond or
/// more each with RSA-2048) ahead of the requests of connections already open: a request that
/// becomes ready behind 128 of them waits for all of them (issue 24: p99 205 ms in mode
/// `none` during a storm of full handshakes). Taking turns, a step first holds the worker's
/// one turn and then yields (tokio runs a yielded task again only after polling the I/O
/// driver and running the tasks that were ready); the other handshakes wait for the turn
/// outside the run queue. So between two handshake steps the worker serves what became ready
/// meanwhile, and a request waits for about one step, not for the whole burst. Handshakes per
/// second are unchanged: the steps take the same CPU, one after the other as before.
#[derive(Debug)]
pub struct HandshakeTurns(tokio::sync::Semaphore);

impl Default for HandshakeTurns {
    fn default() -> Self {
        HandshakeTurns(tokio::sync::Semaphore::new(1))
    }
}

impl HandshakeTurns {
    /// Waits for the turn, then yields once; the turn is held until the permit is dropped.
    /// (QUIC handshakes, stepped inside quinn, take one around the step that signs.)
    pub async fn take(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        // never closed: `None` would only mean running without a turn
        let permit = self.0.acquire().await.ok();
        tokio::task::yield_now().await;
        permit
    }
}

/// Why a TLS handshake did not complete.
///
/// Converts into an [`io::Error`] (kinds `UnexpectedEof`, `ConnectionAborted`,
/// `InvalidData`, `Other`; an I/O error as itself) that carries this error as its source, so
/// a caller holding only the `io::Error` can still `downcast_ref::<HandshakeError>()`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// The peer closed the connection before the handshake was complete.
    #[error("peer closed during the handshake")]
    PeerClosed,
    /// The peer closed its end while the handshake was paused on an offloaded signature;
    /// the paused job was dropped.
    #[error("peer closed while its handshake was paused")]
    PeerGoneWhilePaused,
    /// The handshake job panicked (a bug in rustls or in an engine's signing key).
    #[error("the handshake job panicked")]
    JobPanicked,
    /// rustls refused the peer: no protocol version, cipher suite or signature scheme in
    /// common with this server and its key, or a malformed or unexpected message. The alert,
    /// if any, has been sent.
    #[error("TLS: {0}")]
    Tls(#[source] rustls::Error),
    /// Reading from or writing to the transport failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl From<HandshakeError> for io::Error {
    fn from(e: HandshakeError) -> io::Error {
        let kind = match e {
            HandshakeError::Io(io) => return io,
            HandshakeError::PeerClosed => io::ErrorKind::UnexpectedEof,
            HandshakeError::PeerGoneWhilePaused => io::ErrorKind::ConnectionAborted,
            HandshakeError::Tls(_) => io::ErrorKind::InvalidData,
            HandshakeError::JobPanicked => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}

/// Writes everything rustls wants to send.
async fn flush<IO: Transport>(conn: &mut ServerConnection, io: &mut IO) -> io::Result<()> {
    while conn.wants_write() {
        let mut out = Vec::with_capacity(4096);
        conn.write_tls(&mut out)?;
        io.write_all(&out).await?;
    }
    Ok(())
}

/// Resolves when the peer has closed its end (EOF or error) before sending anything more.
async fn peer_gone<IO: Transport>(io: &IO) {
    std::future::poll_fn(|cx| io.poll_peer_gone(cx)).await
}

/// Performs the server side of a TLS handshake on `io`.
pub async fn accept<IO: Transport>(
    io: IO,
    config: Arc<ServerConfig>,
    driver: Driver<'_>,
) -> Result<TlsStream<IO>, HandshakeError> {
    accept_for_sites(io, config, None, driver)
        .await
        .map(|(s, _)| s)
}

/// Writes the alert rustls' `Acceptor` made for a refused ClientHello.
async fn send_alert<IO: Transport>(alert: &mut rustls::server::AcceptedAlert, io: &mut IO) {
    let mut out = Vec::new();
    if alert.write_all(&mut out).is_ok() && !out.is_empty() {
        let _ = io.write_all(&out).await;
    }
}

/// [`accept`], with the configuration chosen by the ClientHello's server name among
/// `sites` (sites with a client-certificate policy of their own); the listener's `config`
/// for other names. The site whose configuration ran comes back with the stream.
pub async fn accept_for_sites<IO: Transport>(
    mut io: IO,
    config: Arc<ServerConfig>,
    sites: Option<&crate::SitePolicies>,
    driver: Driver<'_>,
) -> Result<(TlsStream<IO>, Option<usize>), HandshakeError> {
    let (mut conn, site) = match sites.filter(|s| !s.is_empty()) {
        None => (
            Box::new(ServerConnection::new(config).map_err(HandshakeError::Tls)?),
            None,
        ),
        Some(sites) => {
            let mut acceptor = rustls::server::Acceptor::default();
            let accepted = loop {
                let read = std::future::poll_fn(|cx| {
                    match acceptor.read_tls(&mut SyncIo { io: &mut io, cx }) {
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Poll::Pending,
                        r => Poll::Ready(r),
                    }
                });
                match read.await {
                    Ok(0) => return Err(HandshakeError::PeerClosed),
                    Ok(_) => {}
                    Err(e) => return Err(e.into()),
                }
                match acceptor.accept() {
                    Ok(Some(a)) => break a,
                    Ok(None) => {}
                    Err((e, mut alert)) => {
                        send_alert(&mut alert, &mut io).await;
                        return Err(HandshakeError::Tls(e));
                    }
                }
            };
            let (site, cfg) = match sites.pick(accepted.client_hello().server_name()) {
                Some((i, c)) => (Some(*i), c.clone()),
                None => (None, config),
            };
            // the ClientHello's step (the signature) runs here, as `process_new_packets` does;
            // boxed in and out: a job's closure and result must be small
            let accepted = Box::new(accepted);
            let step = move || {
                accepted
                    .into_connection(cfg)
                    .map(Box::new)
                    .map_err(Box::new)
            };
            let r = match &driver {
                Driver::Direct => step(),
                Driver::Fair(turns) => {
                    let _turn = turns.take().await;
                    step()
                }
                Driver::Job { offloader, gauges } => run_job(step, &io, offloader, gauges).await?,
            };
            match r {
                Ok(c) => (c, site),
                Err(e) => {
                    let (e, mut alert) = *e;
                    send_alert(&mut alert, &mut io).await;
                    return Err(HandshakeError::Tls(e));
                }
            }
        }
    };
    loop {
        flush(&mut conn, &mut io).await?;
        if !conn.is_handshaking() {
            break;
        }
        // read one batch of records
        let read =
            std::future::poll_fn(|cx| match conn.read_tls(&mut SyncIo { io: &mut io, cx }) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Poll::Pending,
                r => Poll::Ready(r),
            });
        match read.await {
            Ok(0) => return Err(HandshakeError::PeerClosed),
            Ok(_) => {}
            Err(e) => return Err(e.into()),
        }
        let result;
        (conn, result) = match &driver {
            Driver::Direct => {
                let r = conn.process_new_packets().map(|_| ());
                (conn, r)
            }
            Driver::Fair(turns) => {
                let _turn = turns.take().await;
                let r = conn.process_new_packets().map(|_| ());
                (conn, r)
            }
            Driver::Job { offloader, gauges } => run_as_job(conn, &io, offloader, gauges).await?,
        };
        if let Err(e) = result {
            let _ = flush(&mut conn, &mut io).await; // the alert
            return Err(HandshakeError::Tls(e));
        }
    }
    Ok((TlsStream::new(io, *conn), site))
}

/// Runs `process_new_packets` as a job; every op it pauses on is executed by the offloader
/// while this task waits (and the worker runs other tasks).
async fn run_as_job<IO: Transport>(
    mut conn: Box<ServerConnection>,
    io: &IO,
    offloader: &Rc<Offloader>,
    gauges: &HandshakeGauges,
) -> Result<(Box<ServerConnection>, Result<(), rustls::Error>), HandshakeError> {
    run_job(
        move || {
            let r = conn.process_new_packets().map(|_| ());
            (conn, r)
        },
        io,
        offloader,
        gauges,
    )
    .await
}

/// Runs `f` as a job (see [`run_as_job`]).
async fn run_job<IO: Transport, R: 'static>(
    f: impl FnOnce() -> R + 'static,
    io: &IO,
    offloader: &Rc<Offloader>,
    gauges: &HandshakeGauges,
) -> Result<R, HandshakeError> {
    let (mut job, mut step) = Job::start(f);
    loop {
        match step {
            Step::Paused(op) => {
                gauges.paused.fetch_add(1, Relaxed);
                let _unpause = Unpause(gauges);
                let result = tokio::select! {
                    r = offloader.run(op) => r,
                    _ = peer_gone(io) => {
                        // `job` is dropped on return: its stack is unwound and recycled
                        return Err(HandshakeError::PeerGoneWhilePaused);
                    }
                };
                drop(_unpause);
                step = job.resume(result);
            }
            Step::Done(Ok(out)) => return Ok(out),
            Step::Done(Err(_panic)) => {
                return Err(HandshakeError::JobPanicked);
            }
        }
    }
}

struct Unpause<'a>(&'a HandshakeGauges);

impl Drop for Unpause<'_> {
    fn drop(&mut self) {
        self.0.paused.fetch_sub(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::HandshakeTurns;
    use std::cell::{Cell, RefCell};
    use std::rc::Rc;

    /// 20 handshake steps queued at once, the first of which makes a request ready: the
    /// number of steps done before the request runs, with turns or without.
    async fn steps_before_the_request(turns: Option<Rc<HandshakeTurns>>) -> usize {
        let steps = Rc::new(Cell::new(0));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let tx = Rc::new(RefCell::new(Some(tx)));
        let seen = steps.clone();
        let request = tokio::task::spawn_local(async move {
            let _ = rx.await;
            seen.get()
        });
        tokio::task::yield_now().await; // the request waits on its channel
        let mut burst = Vec::new();
        for _ in 0..20 {
            let (turns, steps, tx) = (turns.clone(), steps.clone(), tx.clone());
            burst.push(tokio::task::spawn_local(async move {
                let _turn = match &turns {
                    Some(t) => t.take().await,
                    None => None,
                };
                if let Some(tx) = tx.borrow_mut().take() {
                    let _ = tx.send(()); // the request becomes ready
                }
                steps.set(steps.get() + 1);
            }));
        }
        let before = request.await.unwrap();
        for b in burst {
            b.await.unwrap();
        }
        before
    }

    #[tokio::test]
    async fn a_request_made_ready_by_a_burst_runs_after_one_step_not_after_the_burst() {
        let local = tokio::task::LocalSet::new();
        let (fair, direct) = local
            .run_until(async {
                let fair = steps_before_the_request(Some(Rc::default())).await;
                let direct = steps_before_the_request(None).await;
                (fair, direct)
            })
            .await;
        assert_eq!(direct, 20, "without turns the whole burst runs first");
        assert!(
            fair <= 2,
            "with turns the request runs between steps: {fair}"
        );
    }
}
