//! One client connection of the key server: requests in, answers out as they complete,
//! within per-connection bounds (see [`ConnLimits`](crate::state::ConnLimits)).
//!
//! - **Answers waiting** (`max_answers`): every request read takes one answer slot, freed
//!   once its answer is written to the socket. With all slots taken the connection is not
//!   read any more, so a peer that sends requests and does not read answers is held back by
//!   its own socket buffers (backpressure) instead of growing the key server's memory.
//! - **Fair share of the signing pool** (`max_signing`): at most this many of a connection's
//!   requests are in the pool's queue or being signed; the next waits for one of them to
//!   finish. The pool's queue is first come, first served, so a request waits behind at most
//!   `max_signing` requests of every other connection: one flooding peer cannot starve the
//!   others.
//! - **Stalls** (`frame_timeout`): a frame begun must be complete within this long (counted
//!   from its first byte, or from the last complete frame), and a batch of answers must be
//!   written within this long; otherwise the connection is closed. An idle connection (no
//!   partial frame) is kept: clients hold their connections open between requests.
//!
//! Nothing of a connection is kept once it is closed: requests still signing are dropped
//! (the pool skips ops nobody waits for).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use qweb_offload::{channel, Engine, Op, OpOutput, SignOp, Submission};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::protocol::{ErrorCode, Frame};
use crate::shutdown::stopped;
use crate::state::State;

/// An answer on its way to the socket, holding its connection's answer slot.
struct Answer {
    frame: Frame,
    slot: OwnedSemaphorePermit,
}

/// What to do with a request.
enum Todo {
    /// Answer at once (an error).
    Answer(Frame),
    /// Sign.
    Sign(u64, Op),
}

/// Serves one client connection until it closes, fails a bound, or the server stops.
pub(crate) async fn serve_conn<S>(stream: S, state: Arc<State>, mut shutdown: watch::Receiver<bool>)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    state.metrics.connections.fetch_add(1, Relaxed);
    let limits = state.limits;
    let (mut rd, wr) = tokio::io::split(stream);
    let slots = Arc::new(Semaphore::new(limits.max_answers.max(1)));
    let signing = Arc::new(Semaphore::new(limits.max_signing.max(1)));
    // unbounded type, bounded in fact: every entry holds one of `max_answers` slots
    let (tx, rx) = mpsc::unbounded_channel::<Answer>();
    let writer = tokio::spawn(write_answers(wr, rx, limits.frame_timeout, state.clone()));
    let mut buf = BytesMut::with_capacity(8 * 1024);
    // since when the bytes in `buf` (a partial frame) wait for the rest
    let mut partial_since: Option<Instant> = None;
    'conn: loop {
        let mut decoded = false;
        loop {
            let frame = match Frame::decode(&mut buf) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    state.metrics.rejected_connections.fetch_add(1, Relaxed);
                    tracing::warn!("dropping a client connection: {e}");
                    break 'conn;
                }
            };
            decoded = true;
            // one answer slot per request: with none free, stop reading (backpressure)
            let slot = tokio::select! {
                p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break 'conn },
                _ = tx.closed() => break 'conn,
                _ = stopped(&mut shutdown) => break 'conn,
            };
            let (id, op) = match check(frame, &state) {
                Todo::Answer(frame) => {
                    let _ = tx.send(Answer { frame, slot });
                    continue;
                }
                Todo::Sign(id, op) => (id, op),
            };
            // this connection's share of the signing pool
            let turn = tokio::select! {
                p = signing.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break 'conn },
                _ = tx.closed() => break 'conn,
                _ = stopped(&mut shutdown) => break 'conn,
            };
            sign(id, op, turn, slot, &state, &tx);
        }
        partial_since = match (buf.is_empty(), decoded, partial_since) {
            (true, _, _) => None,
            (false, false, Some(t)) => Some(t),
            (false, _, _) => Some(Instant::now()),
        };
        let stall = async {
            match partial_since {
                Some(t) => tokio::time::sleep_until(t + limits.frame_timeout).await,
                None => std::future::pending().await,
            }
        };
        let n = tokio::select! {
            r = rd.read_buf(&mut buf) => r,
            _ = stall => {
                state.metrics.timed_out_connections.fetch_add(1, Relaxed);
                tracing::warn!(
                    "closing a client connection: a frame begun {:?} ago is still incomplete",
                    limits.frame_timeout
                );
                break;
            }
            _ = tx.closed() => break,
            _ = stopped(&mut shutdown) => break,
        };
        match n {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    drop(tx);
    let _ = writer.await;
    state.metrics.connections.fetch_sub(1, Relaxed);
}

/// Validates a request: the op to sign, or the error answer.
fn check(frame: Frame, state: &State) -> Todo {
    state.metrics.requests.fetch_add(1, Relaxed);
    let error = |id, code, message: &str| {
        state.metrics.errors.fetch_add(1, Relaxed);
        Todo::Answer(Frame::Error {
            id,
            code,
            message: message.into(),
        })
    };
    if let Frame::TicketKeysRequest { id } = frame {
        return match state.tickets.snapshot() {
            Ok(keys) => Todo::Answer(Frame::TicketKeys { id, keys }),
            Err(e) => error(id, ErrorCode::Internal, &e.to_string()),
        };
    }
    if let Frame::GenerateKey { id, label } = frame {
        return match state.generated.as_ref().map(|g| g.generate(&label)) {
            None => error(
                id,
                ErrorCode::BadRequest,
                "key generation is off (no `generated_keys`)",
            ),
            Some(Ok((key, spki))) => Todo::Answer(Frame::KeyGenerated { id, key, spki }),
            Some(Err((code, message))) => error(id, code, &message),
        };
    }
    let Frame::Request {
        id,
        scheme,
        key,
        message,
    } = frame
    else {
        return error(
            frame.id(),
            ErrorCode::BadRequest,
            "only requests are accepted",
        );
    };
    let Some(local) = state.key(&key) else {
        return error(id, ErrorCode::UnknownKey, "unknown key");
    };
    if !local.schemes().contains(&scheme) {
        return error(id, ErrorCode::BadRequest, "the scheme does not fit the key");
    }
    Todo::Sign(
        id,
        Op::Sign(SignOp {
            key: qweb_offload::KeyRef {
                id: key,
                local: Some(local),
            },
            scheme,
            message,
        }),
    )
}

/// Submits the op to the pool; its answer goes to the writer when done. `turn` (the
/// connection's signing share) is held until the signature is done, `slot` until the answer
/// is written.
fn sign(
    id: u64,
    op: Op,
    turn: OwnedSemaphorePermit,
    slot: OwnedSemaphorePermit,
    state: &Arc<State>,
    tx: &mpsc::UnboundedSender<Answer>,
) {
    let (completer, completion) = channel();
    if !state
        .pool
        .submit(vec![Submission::new(op, completer)])
        .is_empty()
    {
        state.metrics.errors.fetch_add(1, Relaxed);
        let frame = Frame::Error {
            id,
            code: ErrorCode::Overloaded,
            message: "signing queue full".into(),
        };
        let _ = tx.send(Answer { frame, slot });
        return;
    }
    let (tx, state) = (tx.clone(), state.clone());
    tokio::spawn(async move {
        let result = tokio::select! {
            r = completion => r,
            // the connection is gone: drop the op (the pool skips unwanted work)
            _ = tx.closed() => return,
        };
        drop(turn);
        let frame = match result {
            Ok(OpOutput::Signature(signature)) => Frame::Response { id, signature },
            Ok(_) => {
                state.metrics.errors.fetch_add(1, Relaxed);
                Frame::Error {
                    id,
                    code: ErrorCode::Internal,
                    message: "the engine returned no signature".into(),
                }
            }
            Err(e) => {
                state.metrics.errors.fetch_add(1, Relaxed);
                Frame::Error {
                    id,
                    code: ErrorCode::Internal,
                    message: e.to_string(),
                }
            }
        };
        let _ = tx.send(Answer { frame, slot });
    });
}

/// Writes answers as they come, in batches; a batch not written within `timeout` (the peer
/// does not read) closes the connection. Returning drops the queue, which frees its slots
/// and tells the reader and the signing tasks that the connection is gone.
async fn write_answers<W>(
    mut wr: W,
    mut rx: mpsc::UnboundedReceiver<Answer>,
    timeout: Duration,
    state: Arc<State>,
) where
    W: AsyncWrite + Unpin,
{
    let mut out = BytesMut::new();
    let mut written = Vec::new();
    while let Some(a) = rx.recv().await {
        // ticket keys in this batch: `out` is wiped once it is written (or given up)
        let mut secret = matches!(a.frame, Frame::TicketKeys { .. });
        a.frame.encode(&mut out);
        written.push(a.slot);
        while let Ok(a) = rx.try_recv() {
            secret |= matches!(a.frame, Frame::TicketKeys { .. });
            a.frame.encode(&mut out);
            written.push(a.slot);
        }
        let sent = tokio::time::timeout(timeout, wr.write_all(&out)).await;
        if secret {
            zeroize::Zeroize::zeroize(&mut out[..]);
        }
        match sent {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return,
            Err(_) => {
                state.metrics.timed_out_connections.fetch_add(1, Relaxed);
                tracing::warn!(
                    "closing a client connection: it did not read its answers for {timeout:?}"
                );
                return;
            }
        }
        // the answers are out: their slots are free, the reader may go on
        written.clear();
        if out.capacity() > 64 * 1024 {
            out = BytesMut::new();
        } else {
            out.clear();
        }
    }
    let _ = wr.shutdown().await;
}
