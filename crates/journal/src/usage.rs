//! How big the store is on disk: one walk of its tree ([`Usage`]), and the
//! figures a long-lived server keeps of it ([`UsageCache`]).
//!
//! A walk costs a `stat` per file: on a store of 100,000 files, tens to
//! hundreds of milliseconds of I/O. A server that walked on every scrape
//! of `/metrics` handed any client a lever on its disk and on the threads
//! its requests run on (docs/RELIABILITY.md, "Work a request makes that grows
//! with the store"). The cache walks at most once per
//! [`Config::metrics_refresh`](crate::Config::metrics_refresh), one walk
//! at a time, on a thread of its own; a scrape reads the last figures from
//! memory and never waits for a walk.

use std::fs;
use std::io::ErrorKind as IoKind;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind, Result};
use crate::store::Store;
use crate::logs::STREAMS_DIR;
use crate::topic::Topic;

/// How big the store is on disk, from one walk of its directory tree
/// (metadata only: no file is read), and the deliveries waiting in its
/// outbox.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Topic directories, the reserved `kn_routes` and `kn_subtopics`
    /// topics and journals included.
    pub topics: u64,
    /// Journals (`.../kn_journal` topics).
    pub journals: u64,
    /// Durable Streams (directories under `.streams/`; a deleted stream
    /// whose forks still live included).
    pub streams: u64,
    /// Regular files anywhere under the root (segments, indexes, blobs,
    /// `.stats`, ...).
    pub files: u64,
    /// Directories under the root (the root itself not counted).
    pub directories: u64,
    /// Bytes of those files (their lengths).
    pub bytes: u64,
    /// Deliveries waiting in the forwarding outbox
    /// ([`Store::outbox_pending`]).
    pub outbox_pending: u64,
}

impl Store {
    /// Counts the store's topics, journals, streams, files, directories
    /// and bytes with one walk of its tree, and the deliveries waiting in
    /// its outbox. Entries removed during the walk are skipped; its cost
    /// grows with the number of files (a few hundred thousand take well
    /// under a second when their metadata is cached). A server keeps a
    /// [`UsageCache`] instead of calling this per request.
    pub fn usage(&self) -> Result<Usage> {
        let mut usage = walk(self.root())?;
        usage.outbox_pending = self.outbox_pending()?;
        Ok(usage)
    }
}

fn walk(root: &Path) -> Result<Usage> {
    let mut usage = Usage::default();
    for entry in walkdir::WalkDir::new(root).min_depth(1).follow_links(false) {
        let entry = match entry {
            Ok(e) => e,
            // Removed while we walked (a compaction, a sweep); the root
            // itself missing is an error.
            Err(e) if e.depth() > 0 && e.io_error().is_some_and(|io| io.kind() == IoKind::NotFound) => continue,
            Err(e) => return Err(Error::new(ErrorKind::Io, format!("cannot walk '{}': {e}", root.display()))),
        };
        let kind = entry.file_type();
        if kind.is_dir() {
            usage.directories += 1;
            let rel = entry.path().strip_prefix(root).unwrap_or(entry.path()).to_string_lossy();
            if let Some(name) = rel.strip_prefix(STREAMS_DIR).and_then(|r| r.strip_prefix('/')) {
                // `.streams/<hash>`; `.gone-*` is a stream being removed.
                usage.streams += u64::from(entry.depth() == 2 && !name.starts_with('.'));
                continue;
            }
            if rel.starts_with('.') {
                continue;
            }
            if let Ok(topic) = Topic::parse(&rel) {
                usage.topics += 1;
                usage.journals += u64::from(topic.is_journal());
            }
        } else if kind.is_file() {
            usage.files += 1;
            match fs::symlink_metadata(entry.path()) {
                Ok(m) => usage.bytes += m.len(),
                Err(e) if e.kind() == IoKind::NotFound => usage.files -= 1,
                Err(e) => return Err(Error::io("cannot stat", entry.path(), e)),
            }
        }
    }
    Ok(usage)
}

/// The store's [`Usage`] as a long-lived server keeps it: walked again at
/// most once per [`Config::metrics_refresh`](crate::Config::metrics_refresh)
/// (counted from the end of the last walk), never two walks at once, each
/// on a thread of its own (not a pool that requests use). Reading the
/// figures costs no I/O: a reader gets the last walk's figures and their
/// age, and, when they are due for a refresh, starts a walk that a later
/// reader will see.
///
/// ```
/// use std::sync::Arc;
/// use kn_journal::{Store};
/// use kn_journal::internal::{UsageCache};
///
/// let dir = tempfile::tempdir().unwrap();
/// let cache = UsageCache::new(Arc::new(Store::open(dir.path()).unwrap()));
/// cache.refresh(); // the first walk, in the background
/// // Many reads, one walk per refresh interval (60 s by default).
/// for _ in 0..100 {
///     let _ = cache.get();
/// }
/// assert_eq!(cache.walks(), 1);
/// ```
#[derive(Clone, Debug)]
pub struct UsageCache {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Arc<Store>,
    refresh: Duration,
    state: Mutex<State>,
    /// Walks started.
    walks: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    /// The last walk's figures and when it ended.
    last: Option<(Usage, Instant)>,
    /// A walk is running.
    walking: bool,
    /// When the last walk ended, whether it succeeded or not.
    ended: Option<Instant>,
    /// Why the last walk failed, if it did (the figures are then older).
    error: Option<String>,
}

/// The figures a [`UsageCache`] holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cached {
    /// The last successful walk's figures.
    pub usage: Usage,
    /// How long ago that walk ended.
    pub age: Duration,
}

impl UsageCache {
    /// The cache of `store`'s figures, empty until its first walk
    /// ([`UsageCache::refresh`], or the first [`UsageCache::get`]).
    pub fn new(store: Arc<Store>) -> UsageCache {
        let refresh = store.config().metrics_refresh;
        UsageCache { inner: Arc::new(Inner { store, refresh, state: Mutex::default(), walks: AtomicU64::new(0) }) }
    }

    /// The last walk's figures (`None` before the first walk ends), and a
    /// walk started in the background if they are due for a refresh.
    /// Never waits for a walk, never does I/O itself.
    pub fn get(&self) -> Option<Cached> {
        self.get_at(Instant::now())
    }

    /// Starts a walk in the background if one is due (none ran yet, or
    /// the last one ended at least `metrics_refresh` ago) and none is
    /// running; returns at once.
    pub fn refresh(&self) {
        self.refresh_at(Instant::now());
    }

    /// Walks started so far.
    pub fn walks(&self) -> u64 {
        self.inner.walks.load(Ordering::Relaxed)
    }

    /// Why the last walk failed, if it did.
    pub fn error(&self) -> Option<String> {
        self.inner.lock().error.clone()
    }

    fn get_at(&self, now: Instant) -> Option<Cached> {
        self.refresh_at(now);
        let state = self.inner.lock();
        state.last.map(|(usage, at)| Cached { usage, age: now.saturating_duration_since(at) })
    }

    fn refresh_at(&self, now: Instant) {
        {
            let mut state = self.inner.lock();
            let due = state.ended.is_none_or(|ended| now.saturating_duration_since(ended) >= self.inner.refresh);
            if state.walking || !due {
                return;
            }
            state.walking = true;
        }
        self.inner.walks.fetch_add(1, Ordering::Relaxed);
        let inner = self.inner.clone();
        let spawned = std::thread::Builder::new().name("kn-usage-walk".into()).spawn(move || inner.walk());
        if let Err(err) = spawned {
            let mut state = self.inner.lock();
            state.walking = false;
            state.ended = Some(Instant::now());
            state.error = Some(format!("cannot start a thread to walk the store: {err}"));
        }
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn walk(&self) {
        let walked = self.store.usage();
        let ended = Instant::now();
        let mut state = self.lock();
        state.walking = false;
        state.ended = Some(ended);
        match walked {
            Ok(usage) => {
                state.last = Some((usage, ended));
                state.error = None;
            }
            Err(err) => state.error = Some(err.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Config, Event, Selection};

    fn cache(refresh: Duration) -> (tempfile::TempDir, UsageCache) {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::new(dir.path());
        config.metrics_refresh = refresh;
        let store = Arc::new(Store::open_with(config).unwrap());
        (dir, UsageCache::new(store))
    }

    /// Waits for the running walk to end; returns when it ended.
    fn settled(cache: &UsageCache) -> Instant {
        for _ in 0..2000 {
            let state = cache.inner.lock();
            if !state.walking {
                return state.ended.expect("a walk ended");
            }
            drop(state);
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("the walk never ended");
    }

    #[test]
    fn usage_counts_topics_journals_streams_files_and_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let before = store.usage().unwrap();
        store.tunnel(&Topic::parse("/who/anna/kn_journal").unwrap(), &Selection::none()).unwrap();
        store.notify(&Topic::parse("/what/chat").unwrap(), Event::from_pairs([("kn_payload", "hi")])).unwrap();
        // Two streams as kn-streams lays them out (one directory each under
        // `.streams/`; its own test counts streams it created).
        for name in ["0123", "4567"] {
            let stream = dir.path().join(crate::STREAMS_DIR).join(name);
            std::fs::create_dir_all(&stream).unwrap();
            std::fs::write(stream.join(".head"), b"h").unwrap();
        }
        let after = store.usage().unwrap();
        assert_eq!(after.journals, before.journals + 1, "{after:?}");
        assert_eq!((before.streams, after.streams), (0, 2), "{after:?}");
        assert!(after.topics >= before.topics + 2, "{before:?} {after:?}");
        assert!(after.files > before.files && after.bytes > before.bytes && after.directories > before.directories, "{before:?} {after:?}");
        assert_eq!(after.outbox_pending, 0);
    }

    #[test]
    fn reads_in_a_row_walk_once_per_refresh_interval() {
        let (_dir, cache) = cache(Duration::from_secs(3600));
        assert_eq!(cache.walks(), 0, "nothing walks before it is asked");
        let t0 = Instant::now();
        cache.get_at(t0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..100 {
                        cache.get();
                    }
                });
            }
        });
        let ended = settled(&cache);
        for _ in 0..100 {
            cache.get();
        }
        assert_eq!(cache.walks(), 1, "one walk for 901 reads within the interval");
        assert!(cache.get().is_some(), "the walk's figures are kept");
        // The boundary: due exactly `metrics_refresh` after the walk ended.
        cache.get_at(ended + Duration::from_secs(3600) - Duration::from_nanos(1));
        assert_eq!(cache.walks(), 1, "not due a nanosecond before the interval has passed");
        let cached = cache.get_at(ended + Duration::from_secs(3600)).expect("the old figures meanwhile");
        assert_eq!(cache.walks(), 2, "due once the interval has passed");
        assert!(cached.age >= Duration::from_secs(3600), "{cached:?}");
    }

    #[test]
    fn one_walk_at_a_time_even_when_always_due() {
        let (_dir, cache) = cache(Duration::ZERO);
        {
            // A walk "running": no read starts another.
            cache.inner.lock().walking = true;
            for _ in 0..50 {
                assert_eq!(cache.get(), None);
            }
            assert_eq!(cache.walks(), 0);
            cache.inner.lock().walking = false;
        }
        cache.refresh();
        settled(&cache);
        assert_eq!(cache.walks(), 1);
        let first = cache.get().expect("figures after the walk");
        assert_eq!(first.usage.journals, 0);
        settled(&cache);
        assert_eq!(cache.walks(), 2, "with a zero interval every read after a walk starts one");
    }

    #[test]
    fn a_failed_walk_keeps_the_old_figures_and_says_why() {
        let (dir, cache) = cache(Duration::ZERO);
        cache.refresh();
        settled(&cache);
        let before = cache.get().expect("figures");
        settled(&cache);
        // The root gone: the walk fails, the figures stay.
        std::fs::rename(dir.path(), dir.path().with_extension("moved")).unwrap();
        cache.refresh();
        settled(&cache);
        let after = cache.get().expect("the old figures");
        assert_eq!(after.usage, before.usage);
        assert!(cache.error().is_some_and(|e| e.contains("cannot")), "{:?}", cache.error());
        std::fs::rename(dir.path().with_extension("moved"), dir.path()).unwrap();
    }
}
