//! Waking readers when a topic is appended to: directly when this process
//! appended ([`Hub::appending`]), through one inotify per process, shared
//! by every waiting reader, when another process did, with polling as the
//! fallback where change notification does not work.
//!
//! The inotify is the `inotify` crate's, read by a thread of the hub's own
//! and asked only for the changes that can mean an append (`IN_MODIFY`,
//! `IN_CREATE`, `IN_DELETE`, `IN_MOVED_FROM`, `IN_MOVED_TO`): not the
//! `IN_OPEN` of every tunnel's read, nor the `IN_ATTRIB` of heartbeats,
//! which a general-purpose watcher (the `notify` crate, before) asks for
//! and this process would only read and throw away, one per delivery.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use event_listener::{Event as Signal, EventListener, Listener};
use inotify::{EventMask, Inotify, WatchMask, Watches};

use crate::log::Written;

/// Per watched directory: subscribers, their wakeup signal, whether the
/// directory is really watched (else subscribers poll), and how many
/// segments the notifier saw appear in it (see [`Subscription::segments_created`]).
type Topics = Arc<Mutex<HashMap<OsString, Readers>>>;

/// The readers of one directory.
struct Readers {
    count: usize,
    signal: Arc<Signal>,
    watched: bool,
    /// Why the directory is not watched, when it is not.
    unwatched: Option<Arc<str>>,
    created: Arc<AtomicU64>,
    written: Handed,
}

/// The last records this process appended to one directory, oldest first,
/// as written (see [`Hub::appended`]): at most [`HANDED_RECORDS`], of at
/// most [`HANDED_BYTES`] together.
type Handed = Arc<Mutex<VecDeque<Arc<Written>>>>;

/// How many of its latest appends to a directory this process keeps for
/// the directory's readers: a reader further behind reads the file.
const HANDED_RECORDS: usize = 4;

/// The most bytes of records kept for one directory's readers in memory:
/// a record (or a run of records appended together) larger than this is
/// read from the file. With thousands of tunnels, each on a journal of
/// its own, this bounds what the hand-off holds (8 KiB a journal).
const HANDED_BYTES: usize = 8 << 10;

/// The watched directories by watch descriptor, for the notifier's thread.
type Watched = Arc<Mutex<HashMap<i32, PathBuf>>>;

/// The changes of a topic directory that can mean an append.
const MASK: WatchMask = WatchMask::MODIFY
    .union(WatchMask::CREATE)
    .union(WatchMask::DELETE)
    .union(WatchMask::MOVED_FROM)
    .union(WatchMask::MOVED_TO);

/// The process's inotify: adds and removes watches; its thread reads the
/// events and stops when this is dropped.
struct Watcher {
    watches: Watches,
    /// The descriptor of each watched directory.
    by_dir: HashMap<PathBuf, inotify::WatchDescriptor>,
    watched: Watched,
    /// The write end of the pipe whose closing stops the thread.
    _stop: OwnedFd,
}

impl Watcher {
    fn start(topics: Topics, own: Own) -> std::io::Result<Watcher> {
        let inotify = Inotify::init()?;
        let watches = inotify.watches();
        let mut ends = [0; 2];
        // SAFETY: pipe2 writes two descriptors into the array it is given.
        if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just created and are owned here only.
        let (stop_read, stop_write) = unsafe {
            use std::os::fd::FromRawFd;
            (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1]))
        };
        let watched: Watched = Arc::default();
        let read_watched = watched.clone();
        std::thread::Builder::new()
            .name("kn-notifier".into())
            .spawn(move || notifier(inotify, stop_read, read_watched, topics, own))?;
        Ok(Watcher { watches, by_dir: HashMap::new(), watched, _stop: stop_write })
    }

    /// Watches `dir`; `Err` says why it cannot.
    fn watch(&mut self, dir: &Path) -> Result<(), Arc<str>> {
        match self.watches.add(dir, MASK) {
            Ok(wd) => {
                self.watched.lock().unwrap_or_else(|p| p.into_inner()).insert(wd.get_watch_descriptor_id(), dir.to_path_buf());
                self.by_dir.insert(dir.to_path_buf(), wd);
                Ok(())
            }
            Err(e) => Err(unavailable("inotify_add_watch", &e, "the user's inotify watches (fs.inotify.max_user_watches) are used up")),
        }
    }

    fn unwatch(&mut self, dir: &Path) {
        if let Some(wd) = self.by_dir.remove(dir) {
            self.watched.lock().unwrap_or_else(|p| p.into_inner()).remove(&wd.get_watch_descriptor_id());
            // Fails only when the directory is gone (the watch went with it).
            let _ = self.watches.remove(wd);
        }
    }
}

/// The notifier's thread: reads the inotify's events until the hub's
/// stop pipe closes, and wakes the readers of each directory an append
/// may have changed.
fn notifier(mut inotify: Inotify, stop: OwnedFd, watched: Watched, topics: Topics, own: Own) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let mut fds = [
            libc::pollfd { fd: inotify.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: stop.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: poll reads and writes only the two structs given.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if rc < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if fds[1].revents != 0 {
            return; // the hub is gone
        }
        let events = match inotify.read_events(&mut buffer) {
            Ok(events) => events,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(_) => return,
        };
        let Ok(dirs) = watched.lock() else { return };
        let mut own_writes = false;
        for event in events {
            if event.mask.contains(EventMask::Q_OVERFLOW) {
                // Events were lost (the kernel's queue overflowed): wake
                // everyone, and count no change as this process's.
                overflowed(&topics, &own);
                continue;
            }
            let (Some(dir), Some(name)) = (dirs.get(&event.wd.get_watch_descriptor_id()), event.name) else { continue };
            own_writes |= changed(&topics, &own, dir, name, event.mask.contains(EventMask::MODIFY));
        }
        drop(dirs);
        if own_writes {
            // This process is appending (a fan-out, most likely): let the
            // events of its next appends gather, to be read many at once
            // rather than one wakeup of this thread each.
            std::thread::sleep(OWN_WRITES_PAUSE);
        }
    }
}

/// How long the notifier waits before reading again after it read change
/// events of this process's own appends: during a fan-out to thousands of
/// journals the kernel then hands it tens of events per read instead of
/// one. Another process's append seen meanwhile wakes its readers at most
/// this much later; this process's own readers are woken directly.
const OWN_WRITES_PAUSE: Duration = Duration::from_millis(1);

/// Wakes every reader after lost events, and forgets the writes of this
/// process not seen yet.
fn overflowed(topics: &Topics, own: &Own) {
    own.lock().map(|own| own.values().for_each(|n| n.store(0, Ordering::SeqCst))).ok();
    topics
        .lock()
        .map(|map| {
            map.values().for_each(|r| {
                r.created.fetch_add(1, Ordering::SeqCst);
                r.signal.notify(usize::MAX);
            })
        })
        .ok();
}

/// A change of the file `name` in the watched `dir`; `written` for a
/// change of its content (`IN_MODIFY`). True when it was taken for an
/// append of this process (no one woken).
fn changed(topics: &Topics, own: &Own, dir: &Path, name: &OsStr, written: bool) -> bool {
    // Only appends matter: segment files. Heartbeats and the writer's
    // head would only cause idle wakeups.
    if !crate::log::is_segment_file(name) {
        return false;
    }
    let Ok(map) = topics.lock() else { return false };
    let Some(readers) = map.get(dir.as_os_str()) else { return false };
    if written {
        if takes_own_write(own, dir) {
            return true;
        }
    } else {
        // A segment created, renamed into place or removed: counted
        // before the wakeup, see `Subscription::segments_created`.
        readers.created.fetch_add(1, Ordering::SeqCst);
    }
    readers.signal.notify(usize::MAX);
    false
}

/// The process-wide change notifier. Cheap to share; created lazily by the
/// store on the first wait.
pub struct Hub {
    topics: Topics,
    watcher: Mutex<Option<Watcher>>,
    /// Why there is no watcher, when there is none.
    no_watcher: Option<Arc<str>>,
    /// Per watched directory, the appends of this process whose change
    /// events the notifier has not seen yet (see [`Hub::appending`]).
    own: Own,
    /// The working directory when the hub was made, against which
    /// relative directories are keyed ([`Hub::key`]).
    cwd: Option<PathBuf>,
}

type Own = Arc<Mutex<HashMap<OsString, Arc<AtomicU64>>>>;

impl Hub {
    pub(crate) fn new() -> Hub {
        let topics: Topics = Arc::default();
        let own: Own = Arc::default();
        let (watcher, no_watcher) = match Watcher::start(topics.clone(), own.clone()) {
            Ok(w) => (Some(w), None),
            Err(e) => {
                let why = "the user's inotify instances (fs.inotify.max_user_instances) or this process's open files are used up";
                (None, Some(unavailable("inotify_init", &e, why)))
            }
        };
        Hub { topics, watcher: Mutex::new(watcher), no_watcher, own, cwd: std::env::current_dir().ok() }
    }

    /// Starts delivering wakeups for appends in `dir`.
    ///
    /// Lock order: `watcher`, then `topics`, never the other way round;
    /// the notifier's thread takes the watched directories, then
    /// `topics`, then `own`.
    pub fn subscribe(self: &Arc<Hub>, dir: &Path) -> Subscription {
        // Key and watch by the absolute path, as `appending` looks it up
        // (the default root is the relative `./kn_events`).
        let dir = &*self.key(dir);
        let mut watcher = self.watcher.lock().unwrap_or_else(|p| p.into_inner());
        let (first, signal, created, written) = {
            let mut map = self.topics.lock().unwrap_or_else(|p| p.into_inner());
            let entry = map.entry(dir.as_os_str().to_owned()).or_insert_with(|| Readers {
                count: 0,
                signal: Arc::new(Signal::new()),
                watched: false,
                unwatched: None,
                created: Arc::default(),
                written: Arc::default(),
            });
            entry.count += 1;
            (entry.count == 1, entry.signal.clone(), entry.created.clone(), entry.written.clone())
        };
        let unwatched = match watcher.as_mut() {
            Some(w) if first => {
                let unwatched = w.watch(dir).err();
                let mut map = self.topics.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(entry) = map.get_mut(dir.as_os_str()) {
                    entry.watched = unwatched.is_none();
                    entry.unwatched = unwatched.clone();
                }
                unwatched
            }
            Some(_) => {
                let map = self.topics.lock().unwrap_or_else(|p| p.into_inner());
                map.get(dir.as_os_str()).map_or_else(|| Some(Arc::from("not watched")), |e| e.unwatched.clone())
            }
            None => self.no_watcher.clone(),
        };
        Subscription { hub: self.clone(), dir: dir.to_path_buf(), signal, unwatched, created, written }
    }

    /// Wakes the readers of `dir` as an append seen by the notifier
    /// would: for appends seen elsewhere (`changes.rs`).
    pub(crate) fn wake(&self, dir: &Path) {
        let dir = self.key(dir);
        let map = self.topics.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(readers) = map.get(dir.as_os_str()) {
            readers.created.fetch_add(1, Ordering::SeqCst);
            readers.signal.notify(usize::MAX);
        }
    }

    /// Wakes every reader of this process.
    pub(crate) fn wake_all(&self) {
        let map = self.topics.lock().unwrap_or_else(|p| p.into_inner());
        map.values().for_each(|r| {
            r.created.fetch_add(1, Ordering::SeqCst);
            r.signal.notify(usize::MAX);
        });
    }

    /// Announces an append of this process to `dir`: call it holding the
    /// topic's lock, just before writing the record, and pass what it
    /// returns to [`Hub::appended`] once the append is done (`None`: no
    /// reader of this process waits on `dir`).
    ///
    /// Readers of this process are then woken directly by `appended`,
    /// without waiting for the notifier's thread, which under a fan-out
    /// to thousands of journals has several events per delivery to read;
    /// and the notifier skips the change event of this write instead of
    /// waking them a second time for nothing. It counts, per directory,
    /// the writes announced and not yet seen, and takes a change of a
    /// segment for them (all of them: the count goes back to zero) only
    /// while that count is above zero. A write of another process is not
    /// lost that way: appends hold the topic's lock, so the announced
    /// write comes after any write whose event the count swallows, and
    /// `appended`'s wakeup after it covers both. Nor is a write that
    /// lands right after this one swallowed with it by the kernel, which
    /// merges an event only into the last unread one when identical: every
    /// append writes the `.head` after its record, so two records' changes
    /// of a segment are never adjacent in the queue. An append that wrote
    /// nothing or failed sets the count back to zero (its wakeup still
    /// goes out); an overflow of the kernel's queue does too. A count too
    /// low only costs a wakeup for nothing.
    pub fn appending(&self, dir: &Path) -> Option<Appending> {
        let dir = self.key(dir);
        let dir = dir.as_os_str();
        let map = self.topics.lock().ok()?;
        let readers = map.get(dir)?;
        let signal = &readers.signal;
        let mut pending = None;
        if readers.watched {
            let mut own = self.own.lock().ok()?;
            let count = match own.get(dir) {
                Some(count) => count.clone(),
                None => own.entry(dir.to_owned()).or_default().clone(),
            };
            count.fetch_add(1, Ordering::SeqCst);
            pending = Some(count);
        }
        Some(Appending { signal: signal.clone(), pending, written: readers.written.clone() })
    }

    /// Wakes the readers of an append announced by [`Hub::appending`];
    /// `wrote` is false when it stored nothing (a duplicate) or failed.
    pub fn appended(&self, appending: Appending, wrote: bool) {
        self.appended_written(appending, wrote, None);
    }

    /// [`Hub::appended`], handing the record stored, as written, to the
    /// readers (the latest [`HANDED_RECORDS`] are kept, before they are
    /// woken), so that one positioned where it starts takes it from memory
    /// instead of reading the file back (`log::read_written`).
    pub(crate) fn appended_written(&self, appending: Appending, wrote: bool, written: Option<Written>) {
        let Appending { signal, pending, written: handed } = appending;
        if !wrote {
            if let Some(count) = pending {
                count.store(0, Ordering::SeqCst);
            }
        }
        if let Some(record) = written.filter(|w| wrote && w.frame.len() <= HANDED_BYTES) {
            let mut handed = handed.lock().unwrap_or_else(|p| p.into_inner());
            let mut bytes: usize = handed.iter().map(|w| w.frame.len()).sum::<usize>() + record.frame.len();
            while handed.len() >= HANDED_RECORDS || bytes > HANDED_BYTES {
                let Some(oldest) = handed.pop_front() else { break };
                bytes -= oldest.frame.len();
            }
            handed.push_back(Arc::new(record));
        }
        BATCH.with_borrow_mut(|batch| match batch {
            Some(held) => {
                if !held.iter().any(|s| Arc::ptr_eq(s, &signal)) {
                    held.push(signal);
                }
                if held.len() >= WAKE_BATCH {
                    held.drain(..).for_each(|s| {
                        s.notify(usize::MAX);
                    });
                }
            }
            None => {
                signal.notify(usize::MAX);
            }
        });
    }

    fn unsubscribe(&self, dir: &Path) {
        let mut watcher = self.watcher.lock().unwrap_or_else(|p| p.into_inner());
        let last = {
            let mut map = self.topics.lock().unwrap_or_else(|p| p.into_inner());
            let Some(entry) = map.get_mut(dir.as_os_str()) else { return };
            entry.count -= 1;
            let last = entry.count == 0;
            if last {
                map.remove(dir.as_os_str());
                self.own.lock().map(|mut own| own.remove(dir.as_os_str())).ok();
            }
            last
        };
        if last {
            if let Some(w) = watcher.as_mut() {
                w.unwatch(dir);
            }
        }
    }

    /// The path `dir`'s readers are kept and watched under: `dir` itself
    /// when absolute (as a store's topic directories are when its root
    /// is), else joined to the working directory the hub was made in,
    /// without its `.` components: the default root is the relative
    /// `./kn_events`, and asking the system for the working directory
    /// on every append cost a `getcwd` each. Maps keyed by it hash its
    /// bytes, not its components one by one as a `Path` key would: every
    /// append looks it up.
    fn key<'a>(&self, dir: &'a Path) -> Cow<'a, Path> {
        if dir.is_absolute() {
            return Cow::Borrowed(dir);
        }
        match &self.cwd {
            Some(cwd) => Cow::Owned(cwd.join(dir).components().collect()),
            None => Cow::Owned(std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf())),
        }
    }
}

/// Why change notification failed: the call, its error, and, for the
/// errors of a limit reached (`EMFILE`, `ENOSPC`), `limit` saying which.
fn unavailable(call: &str, error: &std::io::Error, limit: &str) -> Arc<str> {
    match error.raw_os_error() {
        Some(libc::EMFILE | libc::ENOSPC) => Arc::from(format!("{call}: {error}: {limit}")),
        _ => Arc::from(format!("{call}: {error}")),
    }
}

/// An append announced by [`Hub::appending`], whose readers
/// [`Hub::appended`] wakes.
pub struct Appending {
    signal: Arc<Signal>,
    /// The directory's count of announced writes, if it is watched.
    pending: Option<Arc<AtomicU64>>,
    /// The directory's latest appends, kept for its readers.
    written: Handed,
}

/// True when a change of a segment of `dir` is taken for a write this
/// process announced: see [`Hub::appending`]. It takes all the writes
/// announced so far (the count goes back to zero), not one: the kernel
/// merges a change event into the one before it while that one is unread,
/// so one event may stand for several writes, and a count left above zero
/// would later swallow the event of another process's write.
fn takes_own_write(own: &Own, dir: &Path) -> bool {
    let Ok(own) = own.lock() else { return false };
    let Some(count) = own.get(dir.as_os_str()) else { return false };
    count.swap(0, Ordering::SeqCst) > 0
}

/// How many wakeups of one thread's appends [`WakeBatch`] holds at most
/// before sending them: a fan-out wakes its readers in groups (their
/// threads then find several tunnels to serve per wakeup instead of one),
/// and the first readers wait at most this many appends.
const WAKE_BATCH: usize = 64;

thread_local! {
    /// The wakeups held by this thread's [`WakeBatch`], if one is open.
    static BATCH: std::cell::RefCell<Option<Vec<Arc<Signal>>>> = const { std::cell::RefCell::new(None) };
}

/// While it lives, the wakeups of [`Hub::appended`] on this thread are sent in groups of up
/// to [`WAKE_BATCH`], the rest when it is dropped (the outermost one, if
/// nested). For one post's fan-out to many journals.
pub(crate) struct WakeBatch {
    outermost: bool,
}

impl WakeBatch {
    pub(crate) fn open() -> WakeBatch {
        let outermost = BATCH.with_borrow_mut(|batch| batch.is_none().then(|| *batch = Some(Vec::new())).is_some());
        WakeBatch { outermost }
    }
}

impl Drop for WakeBatch {
    fn drop(&mut self) {
        if !self.outermost {
            return;
        }
        let pending = BATCH.with_borrow_mut(Option::take).unwrap_or_default();
        for signal in pending {
            signal.notify(usize::MAX);
        }
    }
}

/// Wakeups for one topic directory. Wakeups are hints: after one, re-read
/// from your cursor. Dropping the subscription stops the watch when no one
/// else waits on that topic.
pub struct Subscription {
    hub: Arc<Hub>,
    dir: PathBuf,
    signal: Arc<Signal>,
    /// Why there are no change notifications, when there are none (the
    /// directory is watched when this is `None`).
    unwatched: Option<Arc<str>>,
    created: Arc<AtomicU64>,
    written: Handed,
}

impl Subscription {
    /// `f` of the latest records this process appended to the directory,
    /// oldest first, as written (see [`Hub::appended`]), read in place
    /// (none if a thread panicked holding them).
    pub(crate) fn with_written<R>(&self, f: impl FnOnce(&[Arc<Written>]) -> R) -> R {
        match self.written.lock() {
            Ok(mut written) => f(written.make_contiguous()),
            Err(_) => f(&[]),
        }
    }

    /// A listener armed now: it fires on the next append. Arm it before
    /// re-reading, then wait on it, so no append slips in between.
    pub fn listen(&self) -> EventListener {
        self.signal.listen()
    }

    /// Waits on an armed listener for at most `timeout`.
    pub fn wait(listener: EventListener, timeout: Duration) -> bool {
        listener.wait_timeout(timeout).is_some()
    }

    /// False when change notification is unavailable and readers poll.
    pub fn is_notified(&self) -> bool {
        self.unwatched.is_none()
    }

    /// Why change notification is unavailable (the system call, its
    /// error and the limit to look at), when it is.
    pub(crate) fn why_not_notified(&self) -> Option<&str> {
        self.unwatched.as_deref()
    }

    /// How many times a segment of the directory was seen created,
    /// renamed into place or removed (and every wakeup of lost events or
    /// of another host's changes counts too); `None` without change
    /// notification. Counted before the wakeup that goes with it, so a
    /// reader that armed [`Subscription::listen`], then reads this, then
    /// finds the log read to its end, knows: if the count is the one it
    /// had when it last found no segment after its own, no segment has
    /// appeared since whose wakeup it will not get. Its read then need
    /// not look for the next segment by name (a path lookup per read).
    pub(crate) fn segments_created(&self) -> Option<u64> {
        self.is_notified().then(|| self.created.load(Ordering::SeqCst))
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.hub.unsubscribe(&self.dir);
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::mpsc;
    use std::time::Instant;

    /// A relative directory is keyed as its absolute path is, with or
    /// without `./`, without asking for the working directory again.
    #[test]
    fn a_relative_directory_is_keyed_as_its_absolute_path() {
        let hub = Hub::new();
        let cwd = std::env::current_dir().unwrap();
        let absolute = cwd.join("kn_events").join("what");
        assert_eq!(hub.key(Path::new("kn_events/what")), absolute.as_path());
        assert_eq!(hub.key(Path::new("./kn_events/./what")), absolute.as_path());
        assert_eq!(hub.key(&absolute), absolute.as_path());
        assert!(matches!(hub.key(&absolute), Cow::Borrowed(_)));
    }

    /// One thread keeps subscribing to new directories while another keeps
    /// appending to a watched one: the notifier's callback and `subscribe`
    /// must never wait on each other (a deadlock once did exactly this).
    #[test]
    fn subscribing_while_appends_are_delivered_never_deadlocks() {
        let root = tempfile::tempdir().unwrap();
        let hub = Arc::new(Hub::new());
        let busy = root.path().join("busy");
        std::fs::create_dir(&busy).unwrap();
        let watched = hub.subscribe(&busy);
        let (done, finished) = mpsc::channel();
        let writer_dir = busy.clone();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer_stop = stop.clone();
        let writer = std::thread::spawn(move || {
            let path = writer_dir.join(crate::log::segment_name(1));
            let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
            while !writer_stop.load(std::sync::atomic::Ordering::Relaxed) {
                f.write_all(b"x").unwrap();
            }
        });
        let subscriber_hub = hub.clone();
        let subscriber_root = root.path().to_path_buf();
        std::thread::spawn(move || {
            let end = Instant::now() + Duration::from_millis(1500);
            let mut i = 0;
            while Instant::now() < end {
                let dir = subscriber_root.join(format!("t{i}"));
                std::fs::create_dir(&dir).unwrap();
                drop(subscriber_hub.subscribe(&dir));
                i += 1;
            }
            let _ = done.send(i);
        });
        let rounds = finished.recv_timeout(Duration::from_secs(20));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(rounds.is_ok(), "subscribe and the notifier's callback deadlocked");
        writer.join().unwrap();
        drop(watched);
    }
}
