//! [`StreamWatch`]: the wakeups of a live read (long-poll, SSE).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Wakeups for a live read: a change in the stream's directory or its
/// bound topic's. Hints only: re-read after each.
pub struct StreamWatch {
    pub(crate) subs: Vec<kn_journal::internal::logs::Subscription>,
    pub(crate) poll: std::time::Duration,
    pub(crate) _live: Live,
}

/// Counts a [`StreamWatch`] in `Streams::live` while it lives.
pub(crate) struct Live(Arc<AtomicUsize>);

impl Live {
    pub(crate) fn new(count: &Arc<AtomicUsize>) -> Live {
        count.fetch_add(1, Ordering::SeqCst);
        Live(count.clone())
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl StreamWatch {
    /// Listeners to await (each a `Future`); arm them before re-reading.
    pub fn listen(&self) -> Vec<event_listener::EventListener> {
        self.subs.iter().map(|s| s.listen()).collect()
    }

    /// How long to sleep between re-reads when a directory is not
    /// watched (no change notification).
    pub fn poll_interval(&self) -> std::time::Duration {
        if self.subs.iter().all(|s| s.is_notified()) { std::time::Duration::from_secs(3600) } else { self.poll }
    }

    /// Blocks until a change or `timeout` (CGI processes).
    pub fn wait(&self, timeout: std::time::Duration) {
        let listeners = self.listen();
        // One listener is awaited; with a bound topic, poll the other.
        let timeout = if listeners.len() > 1 { timeout.min(self.poll) } else { timeout.min(self.poll_interval()) };
        match listeners.into_iter().next() {
            Some(l) => {
                kn_journal::internal::logs::Subscription::wait(l, timeout);
            }
            None => std::thread::sleep(timeout),
        }
    }
}
