//! How `pubsub-cgi serve` stops (SIGTERM or Ctrl-C), so that a rolling
//! restart loses nothing and breaks nothing (docs/DEPLOY.md, "Rolling
//! restarts"):
//!
//! 1. it stops accepting connections;
//! 2. every tunnel ends at once with a `503 Service Unavailable` status
//!    event and the end of its response (the terminating chunk), its
//!    journal kept, so that its client reconnects at once (to the next
//!    server) and resumes from its last checkpoint;
//! 3. every connection closes once its current response is out (an idle
//!    one at once), one-shot requests finishing first;
//! 4. the server exits when they are all done, or once
//!    `Config::shutdown_grace` (`KN_SHUTDOWN_GRACE`) has passed since the
//!    signal, whichever comes first: a response still open then (a
//!    Durable Streams long-poll or SSE read) is cut, and its client
//!    reconnects as from any lost connection.

use std::time::Instant;

use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::sync::watch;

/// Resolves at the first SIGTERM or SIGINT (Ctrl-C).
pub(crate) async fn signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let term = async {
        match term.as_mut() {
            Some(t) => {
                t.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

/// What a stopping server tells its connections and its tunnels.
pub(crate) struct Shutdown {
    closing: watch::Sender<bool>,
    connections: GracefulShutdown,
}

impl Shutdown {
    pub(crate) fn new() -> Shutdown {
        Shutdown { closing: watch::channel(false).0, connections: GracefulShutdown::new() }
    }

    /// What a tunnel's task watches.
    pub(crate) fn closing(&self) -> Closing {
        Closing(self.closing.subscribe())
    }

    /// What a connection's task wraps its connection in: told to close
    /// after its current response when the server stops.
    pub(crate) fn watcher(&self) -> Watcher {
        self.connections.watcher()
    }

    /// Stops: every tunnel is told to end and every connection to close
    /// after its response; waits for them, until `deadline` at most.
    /// Returns how many connections were still open then (0: all done).
    pub(crate) async fn stop(self, deadline: Instant) -> usize {
        let _ = self.closing.send(true);
        let open = self.connections.count();
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, self.connections.shutdown()).await {
            Ok(()) => 0,
            Err(_) => open.max(1),
        }
    }
}

/// A tunnel's view of [`Shutdown`]: whether the server is stopping.
#[derive(Clone)]
pub(crate) struct Closing(watch::Receiver<bool>);

impl Closing {
    /// True once the server is stopping.
    pub(crate) fn is_closing(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once the server is stopping.
    pub(crate) async fn wait(&mut self) {
        // An error means the server is gone already: stopping too.
        let _ = self.0.wait_for(|closing| *closing).await;
    }
}
