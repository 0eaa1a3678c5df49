//! Where a client connection keeps the tunnel its last HTTP/1.1 response started (a proxied
//! `101 Switching Protocols`, or a `CONNECT` answered 2xx), until the HTTP/1 driver has
//! written that response and can hand the raw transport (and the bytes it read after the
//! request) over; and the registry of a generation's running tunnels, with the [`Ending`]
//! that tells them to go away. HTTP/2 extended-CONNECT WebSockets register here too.
//!
//! The connection driver knows nothing of what is at the other end: it calls
//! [`Tunnel::run`] with the client's transport; the proxy implements it.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{watch, Notify};

/// A client transport handed to a tunnel.
pub trait TunnelIo: AsyncRead + AsyncWrite + Unpin {}

impl<T: AsyncRead + AsyncWrite + Unpin> TunnelIo for T {}

/// Something that carries bytes between the client and another peer once the client's
/// HTTP/1.1 exchange is over.
pub trait Tunnel {
    /// Runs the tunnel to its end; `early` are the bytes the client sent after its request
    /// head that hyper had already read; `ending` tells it to go away.
    fn run<'a>(
        self: Box<Self>,
        client: Box<dyn TunnelIo + 'a>,
        early: Bytes,
        ending: Option<Ending>,
    ) -> Pin<Box<dyn Future<Output = ()> + 'a>>;
}

/// The slot (HTTP/1.1 only: HTTP/2 tunnels run inside their stream).
#[derive(Default)]
pub struct TunnelSlot(RefCell<Option<Box<dyn Tunnel>>>);

impl TunnelSlot {
    /// The tunnel to run once the connection's HTTP/1 exchange is over, if any.
    pub fn take(&self) -> Option<Box<dyn Tunnel>> {
        self.0.borrow_mut().take()
    }

    /// Leaves a tunnel for the connection to run.
    pub fn set(&self, t: Box<dyn Tunnel>) {
        *self.0.borrow_mut() = Some(t);
    }
}

/// What tells a running tunnel to go away: the server shuts down, or the generation it
/// belongs to was retired and its `upgrade_drain_timeout` passed.
#[derive(Clone)]
pub struct Ending {
    shutdown: watch::Receiver<bool>,
    going_away: watch::Receiver<bool>,
}

impl Ending {
    /// Ends when `shutdown` (the worker stops) or `going_away` (the tunnel's generation was
    /// retired and its `upgrade_drain_timeout` passed) turns true.
    pub fn new(shutdown: watch::Receiver<bool>, going_away: watch::Receiver<bool>) -> Self {
        Ending {
            shutdown,
            going_away,
        }
    }

    /// The tunnel must end now (what [`Ending::wait`] would resolve at once for).
    pub fn said(&self) -> bool {
        *self.shutdown.borrow() || *self.going_away.borrow()
    }

    /// Resolves when the tunnel must end (never once a sender is gone: the server is being
    /// torn down and the tunnel's task with it).
    pub async fn wait(&mut self) {
        let said = tokio::select! {
            r = self.shutdown.wait_for(|s| *s) => r.is_ok(),
            r = self.going_away.wait_for(|g| *g) => r.is_ok(),
        };
        if !said {
            std::future::pending::<()>().await;
        }
    }
}

/// The tunnels of one configuration generation on a worker: which connection tasks run one
/// (a retirement keeps those past `shutdown_timeout`, up to `upgrade_drain_timeout`), and
/// the signal that tells them to go away.
pub struct Tunnels {
    /// Connection tasks running tunnels, and how many each (an HTTP/2 connection may carry
    /// several WebSockets).
    tasks: RefCell<HashMap<tokio::task::Id, usize>>,
    going_away: watch::Sender<bool>,
    /// Told when a tunnel starts (a retirement waiting for requests counts it as done).
    pub started: Notify,
}

impl Default for Tunnels {
    fn default() -> Self {
        Tunnels {
            tasks: RefCell::default(),
            going_away: watch::Sender::new(false),
            started: Notify::new(),
        }
    }
}

impl Tunnels {
    /// The connection on the current task now runs a tunnel. Returns the guard to hold while
    /// it runs, and what tells it to go away (`shutdown`, or [`Tunnels::go_away`]).
    pub fn started(self: &Rc<Self>, shutdown: watch::Receiver<bool>) -> (TunnelGuard, Ending) {
        self.started_on(tokio::task::try_id(), shutdown)
    }

    /// A tunnel carried by connection task `id` (an HTTP/2 WebSocket runs in a task of its
    /// own, but lives as long as its connection's task does).
    pub fn started_on(
        self: &Rc<Self>,
        id: Option<tokio::task::Id>,
        shutdown: watch::Receiver<bool>,
    ) -> (TunnelGuard, Ending) {
        if let Some(id) = id {
            *self.tasks.borrow_mut().entry(id).or_default() += 1;
            self.started.notify_waiters();
        }
        let ending = Ending::new(shutdown, self.going_away.subscribe());
        (TunnelGuard(self.clone(), id), ending)
    }

    /// How many tunnels run.
    pub fn count(&self) -> usize {
        self.tasks.borrow().len()
    }

    /// Whether task `id` runs a tunnel.
    pub fn runs(&self, id: tokio::task::Id) -> bool {
        self.tasks.borrow().contains_key(&id)
    }

    /// Tells every tunnel to go away (a WebSocket gets a close frame 1001 each way).
    pub fn go_away(&self) {
        self.going_away.send_replace(true);
    }
}

/// A running tunnel, registered with its generation until dropped.
pub struct TunnelGuard(Rc<Tunnels>, Option<tokio::task::Id>);

impl Drop for TunnelGuard {
    fn drop(&mut self) {
        if let Some(id) = self.1 {
            let mut tasks = self.0.tasks.borrow_mut();
            if let Some(n) = tasks.get_mut(&id) {
                *n -= 1;
                if *n == 0 {
                    tasks.remove(&id);
                }
            }
        }
    }
}
