//! Waking readers when another process appends: one inotify (via the
//! `notify` crate) per process, shared by every waiting reader, with
//! polling as the fallback where change notification does not work.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use event_listener::{Event as Signal, EventListener, Listener};
use notify::{RecursiveMode, Watcher};

type Topics = Arc<Mutex<HashMap<PathBuf, (usize, Arc<Signal>)>>>;

/// The process-wide change notifier. Cheap to share; created lazily by the
/// store on the first wait.
pub(crate) struct Hub {
    topics: Topics,
    watcher: Mutex<Option<notify::RecommendedWatcher>>,
}

impl Hub {
    pub(crate) fn new() -> Hub {
        let topics: Topics = Arc::default();
        let seen = topics.clone();
        let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            let Ok(event) = res else { return };
            let Ok(map) = seen.lock() else { return };
            for path in &event.paths {
                // Only appends matter: segment files. Heartbeats and the
                // writer's head would only cause idle wakeups.
                let is_segment = path.file_name().map(crate::log::is_segment_file).unwrap_or(false);
                if !is_segment {
                    continue;
                }
                if let Some((_, signal)) = path.parent().and_then(|dir| map.get(dir)) {
                    signal.notify(usize::MAX);
                }
            }
        })
        .ok();
        Hub { topics, watcher: Mutex::new(watcher) }
    }

    /// Starts delivering wakeups for appends in `dir`.
    pub(crate) fn subscribe(self: &Arc<Hub>, dir: &Path) -> Subscription {
        let mut map = self.topics.lock().unwrap_or_else(|p| p.into_inner());
        let entry = map.entry(dir.to_path_buf()).or_insert_with(|| (0, Arc::new(Signal::new())));
        entry.0 += 1;
        let signal = entry.1.clone();
        let mut watching = false;
        if entry.0 == 1 {
            if let Ok(mut guard) = self.watcher.lock() {
                if let Some(w) = guard.as_mut() {
                    watching = w.watch(dir, RecursiveMode::NonRecursive).is_ok();
                }
            }
        } else {
            watching = self.watcher.lock().map(|g| g.is_some()).unwrap_or(false);
        }
        Subscription { hub: self.clone(), dir: dir.to_path_buf(), signal, watching }
    }

    fn unsubscribe(&self, dir: &Path) {
        let mut map = self.topics.lock().unwrap_or_else(|p| p.into_inner());
        let Some(entry) = map.get_mut(dir) else { return };
        entry.0 -= 1;
        if entry.0 == 0 {
            map.remove(dir);
            if let Ok(mut guard) = self.watcher.lock() {
                if let Some(w) = guard.as_mut() {
                    let _ = w.unwatch(dir);
                }
            }
        }
    }
}

/// Wakeups for one topic directory. Wakeups are hints: after one, re-read
/// from your cursor. Dropping the subscription stops the watch when no one
/// else waits on that topic.
pub(crate) struct Subscription {
    hub: Arc<Hub>,
    dir: PathBuf,
    signal: Arc<Signal>,
    watching: bool,
}

impl Subscription {
    /// A listener armed now: it fires on the next append. Arm it before
    /// re-reading, then wait on it, so no append slips in between.
    pub(crate) fn listen(&self) -> EventListener {
        self.signal.listen()
    }

    /// Waits on an armed listener for at most `timeout`.
    pub(crate) fn wait(listener: EventListener, timeout: Duration) -> bool {
        listener.wait_timeout(timeout).is_some()
    }

    /// False when change notification is unavailable and readers poll.
    pub(crate) fn is_notified(&self) -> bool {
        self.watching
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.hub.unsubscribe(&self.dir);
    }
}
