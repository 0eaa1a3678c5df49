//! The key server's shutdown signal, shared by its accept loops, connections and the ticket
//! key refresher.

use tokio::sync::watch;

/// Resolves once shutdown was requested (the watch guard is not held across awaits).
pub(crate) async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}
