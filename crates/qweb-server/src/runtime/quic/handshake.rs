//! Asynchronous offload of QUIC handshakes (listener `[offload] mode = "async"`): the QUIC
//! handshake's private-key signature goes to the worker's engine while the worker serves every
//! other connection and stream, as TCP handshakes do (qweb-tls `handshake.rs`).
//!
//! quinn drives the TLS session synchronously: it hands a `CRYPTO` frame's bytes to
//! `crypto::Session::read_handshake` and asks `write_handshake` for the answer. The wrapper
//! here, [`OffloadingConfig`] / `OffloadingSession`, runs each `read_handshake` of rustls'
//! session as a job (qweb-offload's stackful coroutines). When the signer inside it pauses on
//! the signature op, `read_handshake` returns at once with the rustls session still inside
//! the paused job; until the op is back the wrapper reports a handshake in progress with
//! nothing to write and no keys, and keeps any further handshake bytes. The op runs on the
//! worker's offloader as a future polled by the connection's own driver task through
//! `crypto::Session::poll_resumed`, a method our patched quinn-proto adds (vendor/quinn-proto
//! `QWEB.md`; the patched quinn calls `Connection::poll_crypto` on every poll of a
//! connection's driver). When the engine answers, the driver is woken, the job resumes, rustls
//! finishes its flight and quinn sends it: what the packet that carried the ClientHello would
//! have done had the signature been synchronous.
//!
//! A connection that goes away while its signature is out (idle or handshake timeout, the
//! worker stopping) drops the session: the paused job is unwound and the op's future dropped.
//! Jobs and the offloader are per-thread (`!Send`); quinn wants `Send` sessions, so they are
//! held in `SendWrapper`s: quinn's endpoint and connection drivers are tasks of the worker's
//! current-thread runtime, so every call reaches them on the thread that made them (a call
//! from another thread would panic instead of racing).

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};

use quinn::crypto::rustls::QuicServerConfig;
use quinn::crypto::ServerConfig as _;
use quinn::crypto::{
    self, ExportKeyingMaterialError, KeyPair, Keys, PacketKey, UnsupportedVersion,
};
use quinn::{ConnectionId, Side, TransportErrorCode};
use quinn_proto::transport_parameters::TransportParameters;
use quinn_proto::TransportError;
use qweb_offload::job::{Job, Step};
use qweb_offload::{Offloader, OpResult};
use send_wrapper::SendWrapper;

use qweb_observe::metrics::WorkerMetrics;

/// Handshake bytes a session keeps while its signature is out (a TLS ClientHello is one
/// message; nothing else may follow it before the server's flight). Past it, the connection
/// is closed with `CRYPTO_BUFFER_EXCEEDED`.
const MAX_HELD_INPUT: usize = 16 * 1024;

/// The worker's side of async offload: its offloader and its gauges.
struct Worker {
    offloader: Rc<Offloader>,
    metrics: Arc<WorkerMetrics>,
}

/// quinn's server crypto configuration for a listener in mode `async`: rustls' QUIC
/// configuration whose sessions run their handshake steps as jobs on this worker.
pub(crate) struct OffloadingConfig {
    inner: Arc<QuicServerConfig>,
    worker: SendWrapper<Rc<Worker>>,
}

impl OffloadingConfig {
    /// Wraps `inner` for this worker (to be used by this worker's endpoint only).
    pub(crate) fn new(
        inner: Arc<QuicServerConfig>,
        offloader: Rc<Offloader>,
        metrics: Arc<WorkerMetrics>,
    ) -> Self {
        OffloadingConfig {
            inner,
            worker: SendWrapper::new(Rc::new(Worker { offloader, metrics })),
        }
    }
}

impl crypto::ServerConfig for OffloadingConfig {
    fn initial_keys(
        &self,
        version: u32,
        dst_cid: &ConnectionId,
    ) -> Result<Keys, UnsupportedVersion> {
        self.inner.initial_keys(version, dst_cid)
    }

    fn retry_tag(&self, version: u32, orig_dst_cid: &ConnectionId, packet: &[u8]) -> [u8; 16] {
        self.inner.retry_tag(version, orig_dst_cid, packet)
    }

    fn start_session(
        self: Arc<Self>,
        version: u32,
        params: &TransportParameters,
    ) -> Box<dyn crypto::Session> {
        let inner = self.inner.clone().start_session(version, params);
        Box::new(OffloadingSession {
            config: self.inner.clone(),
            version,
            worker: SendWrapper::new((*self.worker).clone()),
            state: State::Ready(inner),
        })
    }
}

/// The result of one `read_handshake` run as a job, with the session handed back.
type Read = (Box<dyn crypto::Session>, Result<bool, TransportError>);

/// Where a session's rustls state is.
enum State {
    /// Here: calls go straight to it.
    Ready(Box<dyn crypto::Session>),
    /// Inside a job paused on an op.
    Paused(SendWrapper<Paused>),
    /// Lost: its job panicked (the connection is being closed).
    Failed,
}

/// A paused handshake step.
struct Paused {
    job: Job<Read>,
    op: Pin<Box<dyn Future<Output = OpResult>>>,
    /// Handshake bytes that arrived meanwhile, read when the job is done.
    held: Vec<u8>,
    _gauge: PausedGauge,
}

/// Counts a paused handshake in the worker's `paused` gauge (as TCP's) while it lives.
struct PausedGauge(Rc<Worker>);

impl PausedGauge {
    fn new(worker: &Rc<Worker>) -> Self {
        worker.metrics.handshake.paused.fetch_add(1, Relaxed);
        PausedGauge(worker.clone())
    }
}

impl Drop for PausedGauge {
    fn drop(&mut self) {
        self.0.metrics.handshake.paused.fetch_sub(1, Relaxed);
    }
}

/// A QUIC server session whose handshake steps run as jobs.
struct OffloadingSession {
    config: Arc<QuicServerConfig>,
    version: u32,
    worker: SendWrapper<Rc<Worker>>,
    state: State,
}

impl OffloadingSession {
    /// The session, when it is not inside a paused job.
    fn ready(&self) -> Option<&dyn crypto::Session> {
        match &self.state {
            State::Ready(s) => Some(&**s),
            State::Paused(_) | State::Failed => None,
        }
    }

    fn ready_mut(&mut self) -> Option<&mut Box<dyn crypto::Session>> {
        match &mut self.state {
            State::Ready(s) => Some(s),
            State::Paused(_) | State::Failed => None,
        }
    }

    /// Handles a job's step: keeps the session when it is done, parks it when it paused.
    fn step(
        &mut self,
        job: Job<Read>,
        step: Step<Read>,
        held: Vec<u8>,
    ) -> Poll<Result<bool, TransportError>> {
        match step {
            Step::Done(Ok((session, result))) => {
                self.state = State::Ready(session);
                match (result, held.is_empty()) {
                    (Ok(ready), false) => {
                        Poll::Ready(self.read_handshake_now(&held).map(|later| ready || later))
                    }
                    (result, _) => Poll::Ready(result),
                }
            }
            Step::Done(Err(_panic)) => {
                self.state = State::Failed;
                Poll::Ready(Err(transport_error(
                    TransportErrorCode::INTERNAL_ERROR,
                    "the TLS handshake job panicked",
                )))
            }
            Step::Paused(op) => {
                let offloader = self.worker.offloader.clone();
                self.state = State::Paused(SendWrapper::new(Paused {
                    job,
                    op: Box::pin(async move { offloader.run(op).await }),
                    held,
                    _gauge: PausedGauge::new(&self.worker),
                }));
                Poll::Pending
            }
        }
    }

    /// `read_handshake` of the session as a job; `Pending` when it paused on an op.
    fn read_handshake_now(&mut self, buf: &[u8]) -> Result<bool, TransportError> {
        let mut session = match std::mem::replace(&mut self.state, State::Failed) {
            State::Ready(s) => s,
            other => {
                self.state = other;
                return Err(transport_error(
                    TransportErrorCode::INTERNAL_ERROR,
                    "TLS session not ready",
                ));
            }
        };
        let buf = buf.to_vec();
        let (job, step) = Job::start(move || {
            let r = session.read_handshake(&buf);
            (session, r)
        });
        match self.step(job, step, Vec::new()) {
            Poll::Ready(r) => r,
            // the op goes out when the connection's driver polls `poll_resumed`
            Poll::Pending => Ok(false),
        }
    }
}

impl crypto::Session for OffloadingSession {
    fn initial_keys(&self, dst_cid: &ConnectionId, side: Side) -> Keys {
        match self.ready() {
            Some(s) => s.initial_keys(dst_cid, side),
            // quinn asks for these when it creates the connection and on a client's Retry,
            // never in the middle of a server's handshake; a server's keys, for the version
            // the session was started with (the endpoint accepted it)
            None => match self.config.initial_keys(self.version, dst_cid) {
                Ok(keys) => keys,
                Err(_) => unreachable!("the endpoint started this session with this version"),
            },
        }
    }

    fn handshake_data(&self) -> Option<Box<dyn Any>> {
        self.ready()?.handshake_data()
    }

    fn peer_identity(&self) -> Option<Box<dyn Any>> {
        self.ready()?.peer_identity()
    }

    fn early_crypto(&self) -> Option<(Box<dyn crypto::HeaderKey>, Box<dyn PacketKey>)> {
        self.ready()?.early_crypto()
    }

    fn early_data_accepted(&self) -> Option<bool> {
        self.ready()?.early_data_accepted()
    }

    fn is_handshaking(&self) -> bool {
        self.ready().is_none_or(|s| s.is_handshaking())
    }

    fn read_handshake(&mut self, buf: &[u8]) -> Result<bool, TransportError> {
        match &mut self.state {
            State::Ready(_) => self.read_handshake_now(buf),
            State::Paused(p) => {
                if p.held.len() + buf.len() > MAX_HELD_INPUT {
                    return Err(transport_error(
                        TransportErrorCode::CRYPTO_BUFFER_EXCEEDED,
                        "handshake data while the signature is out",
                    ));
                }
                p.held.extend_from_slice(buf);
                Ok(false)
            }
            State::Failed => Err(transport_error(
                TransportErrorCode::INTERNAL_ERROR,
                "TLS session lost",
            )),
        }
    }

    fn poll_resumed(&mut self, cx: &mut Context<'_>) -> Poll<Result<bool, TransportError>> {
        let State::Paused(p) = &mut self.state else {
            return Poll::Pending;
        };
        let result = std::task::ready!(p.op.as_mut().poll(cx));
        let State::Paused(p) = std::mem::replace(&mut self.state, State::Failed) else {
            unreachable!("matched above");
        };
        let Paused { mut job, held, .. } = p.take();
        let step = job.resume(result);
        match self.step(job, step, held) {
            Poll::Ready(r) => {
                if matches!(self.state, State::Paused(_)) {
                    // the bytes held meanwhile paused it again: poll that op next turn
                    cx.waker().wake_by_ref();
                }
                Poll::Ready(r)
            }
            // paused again (a second op): poll it now so that its completion wakes us
            Poll::Pending => self.poll_resumed(cx),
        }
    }

    fn transport_parameters(&self) -> Result<Option<TransportParameters>, TransportError> {
        match self.ready() {
            Some(s) => s.transport_parameters(),
            None => Ok(None),
        }
    }

    fn write_handshake(&mut self, buf: &mut Vec<u8>) -> Option<Keys> {
        self.ready_mut()?.write_handshake(buf)
    }

    fn next_1rtt_keys(&mut self) -> Option<KeyPair<Box<dyn PacketKey>>> {
        self.ready_mut()?.next_1rtt_keys()
    }

    fn is_valid_retry(&self, orig_dst_cid: &ConnectionId, header: &[u8], payload: &[u8]) -> bool {
        self.ready()
            .is_some_and(|s| s.is_valid_retry(orig_dst_cid, header, payload))
    }

    fn export_keying_material(
        &self,
        output: &mut [u8],
        label: &[u8],
        context: &[u8],
    ) -> Result<(), ExportKeyingMaterialError> {
        match self.ready() {
            Some(s) => s.export_keying_material(output, label, context),
            None => Err(ExportKeyingMaterialError),
        }
    }
}

fn transport_error(code: TransportErrorCode, reason: &str) -> TransportError {
    TransportError {
        code,
        frame: None,
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qweb_offload::{KeyId, KeyRef, Op, SignOp, SignScheme};

    /// A TLS session stand-in whose `read_handshake` asks for one signature (as rustls' signer
    /// does inside a ClientHello step) and then reports handshake data ready.
    struct Signs;

    impl crypto::Session for Signs {
        fn initial_keys(&self, _: &ConnectionId, _: Side) -> Keys {
            unreachable!("not asked in this test")
        }
        fn handshake_data(&self) -> Option<Box<dyn Any>> {
            None
        }
        fn peer_identity(&self) -> Option<Box<dyn Any>> {
            None
        }
        fn early_crypto(&self) -> Option<(Box<dyn crypto::HeaderKey>, Box<dyn PacketKey>)> {
            None
        }
        fn early_data_accepted(&self) -> Option<bool> {
            None
        }
        fn is_handshaking(&self) -> bool {
            true
        }
        fn read_handshake(&mut self, _: &[u8]) -> Result<bool, TransportError> {
            let op = Op::Sign(SignOp {
                key: KeyRef {
                    id: KeyId([0; 32]),
                    local: None,
                },
                scheme: SignScheme::EcdsaP256Sha256,
                message: b"transcript".to_vec(),
            });
            let _ = qweb_offload::job::pause(op);
            Ok(true)
        }
        fn transport_parameters(&self) -> Result<Option<TransportParameters>, TransportError> {
            Ok(None)
        }
        fn write_handshake(&mut self, _: &mut Vec<u8>) -> Option<Keys> {
            None
        }
        fn next_1rtt_keys(&mut self) -> Option<KeyPair<Box<dyn PacketKey>>> {
            None
        }
        fn is_valid_retry(&self, _: &ConnectionId, _: &[u8], _: &[u8]) -> bool {
            false
        }
        fn export_keying_material(
            &self,
            _: &mut [u8],
            _: &[u8],
            _: &[u8],
        ) -> Result<(), ExportKeyingMaterialError> {
            Err(ExportKeyingMaterialError)
        }
    }

    fn session(metrics: &Arc<WorkerMetrics>) -> OffloadingSession {
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
            .unwrap()
            .self_signed(&kp)
            .unwrap();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(kp.serialize_der().into());
        let tls = rustls::ServerConfig::builder_with_provider(Arc::new(qweb_tls::provider()))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key)
            .unwrap();
        let config = Arc::new(QuicServerConfig::try_from(Arc::new(tls)).unwrap());
        let engine = Arc::new(
            qweb_offload::PoolEngine::new("test", qweb_offload::PoolConfig::default()).unwrap(),
        );
        let offloader = Offloader::new(
            engine,
            qweb_offload::BatchConfig {
                enabled: false,
                max: 1,
            },
            std::time::Duration::from_secs(5),
        );
        OffloadingSession {
            config,
            version: 1,
            worker: SendWrapper::new(Rc::new(Worker {
                offloader,
                metrics: metrics.clone(),
            })),
            state: State::Ready(Box::new(Signs)),
        }
    }

    /// While the signature is out, the session keeps what arrives up to `MAX_HELD_INPUT` and
    /// refuses more with CRYPTO_BUFFER_EXCEEDED; it reports a handshake in progress with
    /// nothing to write, and counts as paused until it is dropped.
    #[test]
    fn bytes_held_while_paused_are_bounded() {
        use crypto::Session as _;
        let metrics = Arc::new(WorkerMetrics::default());
        let mut s = session(&metrics);
        assert!(
            !s.read_handshake(b"client hello").unwrap(),
            "paused: no handshake data yet"
        );
        assert!(matches!(s.state, State::Paused(_)));
        assert_eq!(metrics.handshake.paused.load(Relaxed), 1);
        assert!(s.is_handshaking());
        assert!(s.write_handshake(&mut Vec::new()).is_none());
        assert!(s.transport_parameters().unwrap().is_none());
        s.read_handshake(&[0; MAX_HELD_INPUT - 1]).unwrap();
        s.read_handshake(&[0]).unwrap();
        let e = s.read_handshake(&[0]).unwrap_err();
        assert_eq!(e.code, TransportErrorCode::CRYPTO_BUFFER_EXCEEDED);
        drop(s);
        assert_eq!(metrics.handshake.paused.load(Relaxed), 0, "the job unwound");
    }
}
