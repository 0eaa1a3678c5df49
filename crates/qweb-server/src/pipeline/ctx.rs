//! What the pipeline serves one worker's requests with, in one configuration generation.

use std::rc::Rc;
use std::sync::Arc;

use tokio::sync::watch;

use crate::config::{AccessFormat, Limits};
use crate::pipeline::routes::Route;
use qweb_observe::log_limit::PerPeer;
use qweb_observe::metrics::{RouteMetrics, WorkerMetrics};

/// Worker-wide state of one configuration generation, shared by its connections through
/// `Rc`. The runtime builds it (its `worker` module) and counts its connections.
pub(crate) struct WorkerCtx {
    pub limits: Limits,
    pub routes: Vec<Route>,
    /// The `[[site]]`s (`routes` are the top-level ones).
    pub sites: crate::pipeline::sites::Sites,
    pub access_log: bool,
    /// The access-log line format.
    pub log_format: AccessFormat,
    /// Becomes `true` when the server shuts down.
    pub shutdown: watch::Receiver<bool>,
    /// Becomes `true` when a reload replaced this generation: its connections close after
    /// their current request.
    pub retire: watch::Sender<bool>,
    /// This worker's counters (also read by `/metrics`).
    pub metrics: Arc<WorkerMetrics>,
    /// The metrics of requests no route matched.
    pub unmatched: Rc<RouteMetrics>,
    /// Response compression on this worker (`None`: off).
    pub compression: Option<Rc<crate::pipeline::compress::Compressor>>,
    /// Log lines about misbehaving peers: one per peer per minute.
    pub peer_log: PerPeer,
    /// The tunnels (WebSockets...) of this generation's connections.
    pub tunnels: Rc<qweb_session::tunnel::Tunnels>,
    /// The ACME HTTP-01 answers (sites with `acme`).
    pub acme: Option<Arc<qweb_tls::Managed>>,
    /// The proxy cache of the routes with `cache` (the server's one store).
    pub cache: crate::pipeline::cache::CacheCtx,
    /// The connections per client address (the server's one table, kept across reloads).
    pub client_slots: Arc<qweb_session::client_slots::ClientSlots>,
}

impl crate::conn::Host for WorkerCtx {
    fn limits(&self) -> &Limits {
        &self.limits
    }

    fn metrics(&self) -> &WorkerMetrics {
        &self.metrics
    }

    fn peer_log(&self) -> &PerPeer {
        &self.peer_log
    }

    fn shutdown(&self) -> watch::Receiver<bool> {
        self.shutdown.clone()
    }

    fn retired(&self) -> watch::Receiver<bool> {
        self.retire.subscribe()
    }

    fn refused_log(&self) -> Option<AccessFormat> {
        self.access_log.then_some(self.log_format)
    }

    fn tunnels(&self) -> &Rc<qweb_session::tunnel::Tunnels> {
        &self.tunnels
    }

    fn client_slots(&self) -> &Arc<qweb_session::client_slots::ClientSlots> {
        &self.client_slots
    }
}
