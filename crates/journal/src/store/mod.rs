//! The store: topics on disk and the PubSub rules of posting, routing and
//! reading (PROTOCOL.md sections 1, 2 and 4).

use std::collections::HashMap;
use std::fs;
use std::io::ErrorKind as IoKind;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use crate::config::{Config, Shared};
use crate::error::{Error, ErrorKind, Result};
use crate::event::*;
use crate::log::{self, SpaceGauge, TopicFiles};
use crate::remote::Remote;
use crate::topic::Topic;
use crate::watch::Hub;
pub use crate::ids::{fresh_id, now};

mod admin;
mod group;
mod held;
mod job;
mod lifecycle;
mod names;
mod nowait;
mod nowait_group;
mod outbox;
mod outbox_delivery;
mod outbox_push;
mod outbox_state;
mod post;
mod presence;
mod read;
mod readers;
mod receipts;
mod receipts_file;
mod report;
mod routes;
mod unread;
pub(crate) mod view;
pub(crate) mod windows;
mod follow;
mod sweep;
mod sweep_extra;
mod sweep_index;
mod sweep_removal;
mod sweep_routes;

pub use admin::TopicStat;
pub use held::HeldStatuses;
pub use lifecycle::{VerifyProblem, VerifyReport, PROBE_PREFIX};
pub use names::{own_host_name, NameKind, ServerName, NAME_TTL_SECS};
pub use presence::{presence_id, PresenceChanges, LEAVE_KEPT_SECS};
pub use report::{Poisoned, PostReport, Write, KN_POISONED};
pub use read::{Resume, Selected, Selection, Tunnel, TunnelStart, HEARTBEAT_EVERY};
pub use receipts::{Receipt, Receipts};
pub use unread::{KN_UNREAD_AFTER, KN_UNREAD_ROUTE, KN_UNREAD_TO};
pub use routes::{Route, RouteReport, KN_POISONED_BEFORE};
pub use sweep::SweepReport;
pub use sweep_removal::REMOVING_PREFIX;

use routes::RouteList;

const HEARTBEAT_FILE: &str = ".heartbeat";
const DIR_MODE: u32 = 0o2775;

/// Where a route or a name points: a topic of this store or a remote URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Destination {
    /// A topic of this store.
    Local(Topic),
    /// An absolute `http(s)://` URL of another server.
    Remote(String),
    /// A browser's push subscription: `webpush:` and its JSON
    /// (`crate::push`, docs/PROTOCOL.md "Web Push (extension)").
    Push(String),
}

/// The event store. Cheap to share between threads (`Arc<Store>`); every
/// method takes `&self`.
///
/// ```
/// use kn_journal::{Event, Selection, Store, Topic};
///
/// let dir = tempfile::tempdir().unwrap();
/// let store = Store::open(dir.path()).unwrap();
/// let chat = Topic::parse("/what/chat").unwrap();
/// let mut e = Event::new();
/// e.set("kn_id", "e1").set("kn_payload", "hello");
/// let report = store.notify(&chat, e.clone()).unwrap();
/// assert!(!report.duplicate);
/// // Posting the same event again is a duplicate on an ordinary topic.
/// assert!(store.notify(&chat, e).unwrap().duplicate);
/// let got = store.events(&chat, &Selection::all()).unwrap().events;
/// assert_eq!(got.len(), 1);
/// assert_eq!(got[0].payload(), b"hello");
/// ```
pub struct Store {
    config: Config,
    names: RwLock<Vec<names::ServerName>>,
    remote: Arc<dyn Remote>,
    hub: OnceLock<Arc<Hub>>,
    /// What the store keeps of recently written topics (see
    /// `Config::open_topics`).
    kept: Mutex<KeptCache>,
    gauge: SpaceGauge,
    /// See [`Store::filters_compiled`].
    filters_compiled: std::sync::atomic::AtomicU64,
    /// `f_type` of the store's file system (`statfs`), as found at open.
    fs_magic: i64,
    /// `Config::shared` as asked for, before `Auto` was resolved.
    shared_setting: Shared,
    /// In shared mode, `.changes` as this store appends to it.
    changes: crate::changes::ChangeLog,
    /// The access rules (`Config::access_rules`).
    access: crate::access::Source,
    /// Topics whose deferred forwarding a thread of this process is
    /// completing, each with whether it must look again when done
    /// ([`Store::complete_deferred`]).
    deferred: Mutex<HashMap<Topic, bool>>,
    /// Events of this process's posts stored and being forwarded inline,
    /// by topic, for a drain that finds them pending (`outbox::InFlight`).
    in_flight: Mutex<HashMap<Topic, Vec<(u64, Event)>>>,
    /// The posts of this process waiting for each topic, stored together
    /// (`group.rs`, `Config::group_commit`).
    groups: group::Groups,
    /// The marks of this process's tunnels on the topics they read
    /// (`readers.rs`).
    readers: Mutex<readers::Marks>,
    /// The sweep pass of a layer above the store (`sweep_extra.rs`).
    extra_sweep: OnceLock<sweep_extra::ExtraSweep>,
    /// `config`, shared with what outlives a borrow of the store (a
    /// tunnel's `SentTracker`, `receipts_file.rs`): cloned once.
    shared_config: OnceLock<Arc<Config>>,
    /// The root, open (`O_PATH`) at its first use by
    /// [`Store::checked_dir`]; `None` if it could not be opened.
    root_dir: OnceLock<Option<std::os::fd::OwnedFd>>,
    /// The window logs of sources this process has read
    /// (`windows.rs`, `Config::follow`).
    windows: windows::WindowCache,
}

/// `dir` open as a place only (`O_PATH`), for `openat2` to start from.
fn open_dir_path(dir: &Path) -> Option<std::os::fd::OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new().read(true).custom_flags(libc::O_PATH | libc::O_DIRECTORY).open(dir).ok().map(std::os::fd::OwnedFd::from)
}

/// The kept topics: up to [`KEPT_PER_TOPIC`] sets of files per topic, so
/// that threads posting to one topic at once (the workers of `serve`) each
/// find files of their own instead of opening the topic afresh, and at
/// most `Config::open_topics` sets in all. When full, the topic put back
/// least recently gives its sets up for a new one, so topics written once
/// (the `kn_subtopics` announcing a new journal) do not hold the room that
/// the journals written on every post need.
#[derive(Default)]
struct KeptCache {
    topics: HashMap<Topic, Vec<Kept>>,
    count: usize,
    /// Topics in the order their entry was (re)created, oldest first; may
    /// name topics no longer kept, or one twice (skipped when evicting,
    /// and dropped when it grows past four times the kept topics).
    order: std::collections::VecDeque<Topic>,
    /// Where the sweep's next look for dead kept files starts, in the
    /// order of `topics` (see `Store::drop_dead_kept`).
    dead_check_at: usize,
}

impl KeptCache {
    /// Closes the sets of the topic put back least recently; false when
    /// nothing is kept.
    fn evict_oldest(&mut self) -> bool {
        while let Some(topic) = self.order.pop_front() {
            if let Some(sets) = self.topics.remove(&topic) {
                self.count -= sets.len();
                return true;
            }
        }
        false
    }

    /// Notes that `topic`'s entry was just created (it is in `topics`),
    /// keeping `order` short.
    fn created(&mut self, topic: &Topic) {
        self.order.push_back(topic.clone());
        if self.order.len() > 4 * self.topics.len() + 64 {
            let topics = &self.topics;
            let mut seen = std::collections::HashSet::new();
            // Keep each kept topic's latest place.
            let mut order: Vec<Topic> = self.order.drain(..).rev().filter(|t| topics.contains_key(t) && seen.insert(t.clone())).collect();
            order.reverse();
            self.order = order.into();
        }
    }
}

/// How many sets of files a store keeps of one topic: enough for the
/// threads that post to it at once; the topic's lock lets one write at a
/// time anyway.
const KEPT_PER_TOPIC: usize = 4;

/// What a `Store` keeps of a topic it writes to, between posts.
#[derive(Default)]
struct Kept {
    /// The log's open files (taken by a writer while it appends).
    files: Option<TopicFiles>,
    /// A journal's heartbeat, open: its staleness is then an `fstat`.
    heartbeat: Option<fs::File>,
    /// The topic's routes (active or not) with the route generation they
    /// were read at (see `Writer::routes_generation`).
    routes: Option<(u64, RouteList)>,
    /// A routed topic's `.forwarded`, open and unlocked, for its next
    /// drain (not a journal's: a set stays within four descriptors).
    forwarded: Option<fs::File>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("root", &self.config.root).finish()
    }
}

impl Store {
    /// Opens (creating if needed) the store at `root` with the default
    /// configuration.
    pub fn open(root: impl AsRef<Path>) -> Result<Store> {
        Store::open_with(Config::new(root.as_ref()))
    }

    /// Opens the store described by `config` (see [`Config::from_env`]).
    pub fn open_with(mut config: Config) -> Result<Store> {
        if !config.root.is_dir() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(DIR_MODE)
                .create(&config.root)
                .and_then(|_| {
                    use std::os::unix::fs::PermissionsExt;
                    fs::set_permissions(&config.root, fs::Permissions::from_mode(DIR_MODE))
                })
                .map_err(|e| Error::io("cannot create event store", &config.root, e))?;
        }
        // One `statfs`: what a CGI start can afford (`/proc/mounts` is read
        // only for reports, by `Store::file_system`).
        let fs_magic = crate::shared::magic_of(&config.root);
        // Resolved once: the log layer reads `config.shared` as on or off.
        let shared_setting = config.shared;
        config.shared = if crate::shared::resolve(config.shared, fs_magic) { Shared::On } else { Shared::Off };
        let names = names::read_names(&config.root)?;
        let access = crate::access::Source::new(config.access_rules.clone());
        #[cfg(feature = "http")]
        let remote: Arc<dyn Remote> = Arc::new(crate::http::HttpRemote::from_config(&config));
        #[cfg(not(feature = "http"))]
        let remote: Arc<dyn Remote> = Arc::new(crate::remote::NoClient);
        if config.open_topics > 0 {
            // .lock, .head, the segment and a journal's heartbeat per topic.
            raise_open_file_limit((config.open_topics as u64).saturating_mul(4).saturating_add(1024));
        }
        Ok(Store {
            config,
            names: RwLock::new(names),
            remote,
            hub: OnceLock::new(),
            kept: Mutex::new(KeptCache::default()),
            gauge: SpaceGauge::default(),
            windows: Default::default(),
            filters_compiled: Default::default(),
            fs_magic,
            shared_setting,
            changes: Default::default(),
            access,
            deferred: Default::default(),
            in_flight: Default::default(),
            groups: Default::default(),
            readers: Default::default(),
            extra_sweep: OnceLock::new(),
            shared_config: OnceLock::new(),
            root_dir: OnceLock::new(),
        })
    }

    /// Replaces the HTTP implementation used for remote routes and content
    /// transforms.
    pub fn with_remote(mut self, remote: Arc<dyn Remote>) -> Store {
        self.remote = remote;
        self
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// True in shared mode: the store is on a file system that several
    /// hosts may mount ([`Config::shared`]), so this process trusts
    /// nothing it kept of a topic across a lock release (it re-reads it
    /// from the file server under the lock) and wakes its readers for
    /// other hosts' appends through `.changes` (FORMAT.md, "Shared mode").
    pub fn is_shared(&self) -> bool {
        self.config.shared == Shared::On
    }

    /// The file system the store is on: its type as found when the store
    /// was opened, its mount as `/proc/mounts` says now.
    pub fn file_system(&self) -> crate::shared::FileSystem {
        crate::shared::FileSystem::of(&self.config.root, self.fs_magic)
    }

    /// One line on the file system and the mode chosen, e.g.
    /// `fuse.glusterfs (198.18.0.1:/gt on /mnt/a): shared mode
    /// (KN_SHARED=auto)`.
    pub fn describe_mode(&self) -> String {
        crate::shared::describe(&self.file_system(), self.is_shared(), self.shared_setting)
    }

    /// What can be verified of the settings of a shared store's mount and
    /// volume (see [`check_mount`](crate::check_mount)).
    pub fn mount_checks(&self) -> Vec<crate::shared::MountCheck> {
        crate::shared::check_mount(&self.file_system())
    }

    /// In shared mode, records in `.changes` that `topic` was appended
    /// to, so that the readers of other hosts wake (best effort: without
    /// it they re-read at their poll interval).
    pub(super) fn changed(&self, topic: &Topic) {
        if self.is_shared() {
            let _ = self.changes.append(&self.config, topic);
        }
    }

    /// The access rules in force (docs/ACCESS.md): `None` without a rules
    /// file. A rules file that cannot be read or parsed is an error until
    /// it is fixed. Read again when the file changes.
    pub fn access_rules(&self) -> Result<Option<Arc<crate::access::Rules>>> {
        self.access.rules()
    }

    /// The access rules' source (and the session key it keeps).
    pub(crate) fn access_source(&self) -> &crate::access::Source {
        &self.access
    }

    /// The store's root directory.
    pub fn root(&self) -> &Path {
        &self.config.root
    }

    /// Adds `n` to one of the store's [`Counters`](crate::Counters) (kept
    /// in `.stats`, shared by every process). For rare events only: a
    /// removal, a retry, a poisoning.
    pub fn count(&self, counter: crate::Counter, n: u64) -> Result<()> {
        crate::stats::add(&self.config, counter, n)
    }

    /// Every counter of the store, as every process has added to it.
    pub fn counters(&self) -> Result<crate::Counters> {
        crate::stats::read(&self.config)
    }

    /// Resolves a topic name or absolute URL: a URL starting with one of
    /// this server's names followed by `/` is a local topic (percent escapes
    /// in it decoded); any other `http(s)://` URL is remote.
    ///
    /// ```
    /// use kn_journal::{Config, Store, Topic};
    /// use kn_journal::internal::{Destination};
    /// let dir = tempfile::tempdir().unwrap();
    /// let mut config = Config::new(dir.path());
    /// config.server_url = Some("http://example.org/kn".into());
    /// let store = Store::open_with(config).unwrap();
    /// assert_eq!(store.resolve(b"what/chat").unwrap(), Destination::Local(Topic::parse("/what/chat").unwrap()));
    /// assert_eq!(store.resolve(b"http://example.org/kn/a").unwrap(), Destination::Local(Topic::parse("/a").unwrap()));
    /// assert!(matches!(store.resolve(b"http://example.org/knfoo").unwrap(), Destination::Remote(_)));
    /// ```
    pub fn resolve(&self, name: &[u8]) -> Result<Destination> {
        let scheme = |s: &[u8]| name.get(..s.len()).is_some_and(|p| p.eq_ignore_ascii_case(s));
        if crate::push::is_push_destination(name) {
            let text = std::str::from_utf8(name).map_err(|_| Error::new(ErrorKind::BadRequest, "bad push subscription: not UTF-8"))?;
            return Ok(Destination::Push(text.to_string()));
        }
        if !(scheme(b"http://") || scheme(b"https://")) {
            return Ok(Destination::Local(Topic::parse_bytes(name)?));
        }
        let text = std::str::from_utf8(name)
            .map_err(|_| Error::new(ErrorKind::BadRequest, format!("bad URL '{}': not UTF-8", String::from_utf8_lossy(name))))?;
        if let Some(rest) = self.local_path(text) {
            let path = rest.split(['?', '#']).next().unwrap_or("");
            return Ok(Destination::Local(Topic::parse_bytes(&decode_escapes(path.as_bytes(), b'%'))?));
        }
        Ok(Destination::Remote(text.to_string()))
    }

    /// The absolute URL of a local topic.
    pub fn topic_url(&self, topic: &Topic) -> String {
        // The root topic is `<server-url>/`: the bare server URL is not a
        // local topic name (`resolve` wants the `/`), so a route to `/`
        // would have been taken for a remote destination.
        format!("{}{}", self.server_url(), topic.as_str())
    }

    /// Refuses (400) a topic name beyond `max_topic_depth` or
    /// `max_topic_bytes` (see [`Topic::check_size`]).
    pub(super) fn check_topic_size(&self, topic: &Topic) -> Result<()> {
        topic.check_size(self.config.max_topic_depth, self.config.max_topic_bytes)
    }

    fn dir(&self, topic: &Topic) -> PathBuf {
        topic.dir(&self.config.root)
    }

    /// The directory of `topic`, refused (403) when one of its components
    /// below the store root is a symbolic link: a topic never leaves the
    /// store, even if someone planted `kn_events/evil -> /elsewhere`.
    /// Missing components are fine (the topic is not created yet).
    fn checked_dir(&self, topic: &Topic) -> Result<PathBuf> {
        // A link (walked below, to name it) or no answer: walk.
        if let Some(false) = self.link_below_root(topic) {
            return Ok(self.dir(topic));
        }
        let mut dir = self.config.root.clone();
        for segment in topic.segments() {
            dir.push(segment);
            match fs::symlink_metadata(&dir) {
                Ok(meta) if meta.file_type().is_symlink() => {
                    return Err(Error::new(
                        ErrorKind::Forbidden,
                        format!("topic '{topic}' refused: {} is a symbolic link, and a topic never leaves the store", dir.display()),
                    ));
                }
                Ok(_) => {}
                Err(e) if e.kind() == IoKind::NotFound => break,
                Err(e) => return Err(Error::io("cannot check topic directory", &dir, e)),
            }
        }
        Ok(self.dir(topic))
    }

    /// Whether a component of `topic`'s path below the root is a symbolic
    /// link, told by one `openat2` from the root (`RESOLVE_NO_SYMLINKS`)
    /// instead of an `lstat` per component; a missing component ends the
    /// check there, as the walk of [`Store::checked_dir`] does. `None`
    /// where the kernel cannot tell (no `openat2`: Linux before 5.6, or a
    /// filter refusing it; no descriptor of the root): walk then.
    fn link_below_root(&self, topic: &Topic) -> Option<bool> {
        use std::os::fd::AsRawFd;
        let path = topic.segments().collect::<Vec<_>>().join("/");
        if path.is_empty() {
            return Some(false);
        }
        let root = self.root_dir.get_or_init(|| open_dir_path(&self.config.root)).as_ref()?;
        let path = std::ffi::CString::new(path).ok()?;
        // SAFETY: a plain C struct of integers, all zero a valid value.
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
        how.resolve = libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_BENEATH;
        // SAFETY: a NUL-terminated path and a struct that live across the
        // call; the descriptor it returns is closed at once.
        let fd = unsafe { libc::syscall(libc::SYS_openat2, root.as_raw_fd(), path.as_ptr(), &how as *const libc::open_how, std::mem::size_of::<libc::open_how>()) };
        if fd >= 0 {
            // SAFETY: a descriptor this call opened and nothing else holds.
            unsafe { libc::close(fd as libc::c_int) };
            return Some(false);
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::ENOENT | libc::ENOTDIR) => Some(false),
            Some(libc::ELOOP) => Some(true),
            _ => None,
        }
    }

    /// Takes one set of what the store keeps of `topic` out of the cache
    /// (an empty entry if none is there), for [`Store::put_kept`]: another
    /// thread posting to the topic meanwhile takes another set, or opens
    /// its own files.
    fn take_kept(&self, topic: &Topic) -> (Option<Topic>, Kept) {
        let Ok(mut cache) = self.kept.lock() else { return (None, Kept::default()) };
        let Some(sets) = cache.topics.get_mut(topic) else { return (None, Kept::default()) };
        let Some(kept) = sets.pop() else { return (None, Kept::default()) };
        let key = if sets.is_empty() { cache.topics.remove_entry(topic).map(|(key, _)| key) } else { Some(topic.clone()) };
        cache.count -= 1;
        (key, kept)
    }

    /// The `.forwarded` of `topic` a drain of this process left open with
    /// one of its kept sets, if any (never in shared mode, where a drain
    /// opens it afresh: a fresh `open` is what makes the file server's
    /// copy the one read).
    fn take_forwarded(&self, topic: &Topic) -> Option<fs::File> {
        if !self.keeps_forwarded(topic) {
            return None;
        }
        let mut cache = self.kept.lock().ok()?;
        cache.topics.get_mut(topic)?.iter_mut().find_map(|kept| kept.forwarded.take())
    }

    /// Whether a drain of `topic` keeps its `.forwarded` open: not a
    /// journal's (a set stays within four descriptors), not in shared mode.
    fn keeps_forwarded(&self, topic: &Topic) -> bool {
        !self.is_shared() && !topic.is_journal()
    }

    /// Leaves `file`, the `.forwarded` of `topic`, open with one of the
    /// topic's kept sets for [`Store::take_forwarded`]; closed when no
    /// set is kept (or each has one already).
    fn keep_forwarded(&self, topic: &Topic, file: fs::File) {
        if !self.keeps_forwarded(topic) {
            return;
        }
        let Ok(mut cache) = self.kept.lock() else { return };
        if let Some(kept) = cache.topics.get_mut(topic).and_then(|sets| sets.iter_mut().find(|kept| kept.forwarded.is_none())) {
            kept.forwarded = Some(file);
        }
    }

    /// True when the kept sets leave room for one more without closing
    /// another's (`Config::open_topics`).
    fn kept_has_room(&self) -> bool {
        self.kept.lock().is_ok_and(|cache| cache.count < self.config.open_topics)
    }

    /// Puts back what [`Store::take_kept`] took, within
    /// `Config::open_topics`; files only (nothing else is kept without
    /// them).
    fn put_kept(&self, (topic, kept): (Option<Topic>, Kept)) {
        let Some(topic) = topic else { return };
        // Kept files are safe in shared mode too: nothing in them is
        // trusted across a lock release. The next writer re-reads the head
        // under the lock from the file server (`Writer::reuse` drops this
        // host's cached pages first) and reopens everything when another
        // host rolled, replaced the head or deleted the segment; kept
        // routes are used only while the head's route generation, re-read
        // under the lock, is the one they were read at (FORMAT.md, "Shared
        // mode").
        if kept.files.is_none() {
            return;
        }
        if let Ok(mut cache) = self.kept.lock() {
            if cache.topics.get(&topic).is_some_and(|sets| sets.len() >= KEPT_PER_TOPIC) {
                return;
            }
            if cache.count >= self.config.open_topics && (self.config.open_topics == 0 || !cache.evict_oldest()) {
                return;
            }
            let new = !cache.topics.contains_key(&topic);
            cache.topics.entry(topic.clone()).or_default().push(kept);
            cache.count += 1;
            if new {
                cache.created(&topic);
            }
        }
    }

    /// The store's change notifier in this process, started on first use:
    /// what a layer keeping its own logs (`kn_journal::internal::logs`) subscribes to
    /// and announces its appends through, as the store does for topics.
    pub fn hub(&self) -> &Arc<Hub> {
        self.hub.get_or_init(|| {
            let hub = Arc::new(Hub::new());
            if self.is_shared() {
                // inotify sees only this host's appends.
                crate::changes::spawn_poller(&self.config, Arc::downgrade(&hub));
            }
            hub
        })
    }

    /// Announces an append of this process to `topic` (see
    /// `Hub::appending`): call it under the topic's lock just before the
    /// append, and [`Store::appended`] after.
    pub(super) fn appending(&self, topic: &Topic) -> Option<crate::watch::Appending> {
        self.hub.get()?.appending(&self.dir(topic))
    }

    /// Wakes this process's tunnels on a topic it has appended to (those
    /// of other processes wake through their notifier).
    pub(super) fn appended(&self, appending: Option<crate::watch::Appending>, wrote: bool) {
        self.appended_written(appending, wrote, None);
    }

    /// [`Store::appended`], handing them the record stored as `writer`
    /// wrote it (`Writer::take_written`), so that they need not read it
    /// back.
    pub(super) fn appended_written(&self, appending: Option<crate::watch::Appending>, wrote: bool, written: Option<log::Written>) {
        if let (Some(hub), Some(appending)) = (self.hub.get(), appending) {
            hub.appended_written(appending, wrote, written);
        }
    }
}

/// Creates one topic directory with the store's mode (setgid, group
/// writable, whatever the umask), so files inside keep the directory's
/// group. Fails with `AlreadyExists` if another process was first.
fn create_topic_dir(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::DirBuilder::new().mode(DIR_MODE).create(path)?;
    fs::set_permissions(path, fs::Permissions::from_mode(DIR_MODE))
}

/// Raises this process's soft limit on open files (`RLIMIT_NOFILE`) to
/// `wanted`, or to the hard limit if that is lower; never lowers it, and
/// ignores failure (the limit then stays as it was). [`Store::open_with`]
/// calls it to make room for the topic files it keeps; a server holding
/// thousands of tunnels calls it with `u64::MAX` (the hard limit).
///
/// ```
/// kn_journal::internal::raise_open_file_limit(1024);
/// ```
pub fn raise_open_file_limit(wanted: u64) {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit only read and write the struct given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 || limit.rlim_cur >= wanted as libc::rlim_t {
            return;
        }
        limit.rlim_cur = (wanted as libc::rlim_t).min(limit.rlim_max);
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
    }
}

