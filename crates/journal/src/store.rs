//! The store: topics on disk and the PubSub rules of posting, routing and
//! reading (PROTOCOL.md sections 1, 2 and 4).

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs;
use std::io::{ErrorKind as IoKind, Write as _};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::config::{Config, SyncPolicy};
use crate::error::{Error, ErrorKind, Result};
use crate::event::*;
use crate::log::{self, Appended, CompactReport, LogCursor, SpaceGauge, TopicFiles, Writer};
use crate::record::Record;
use crate::remote::{self, HttpRemote, Remote};
use crate::topic::Topic;
use crate::watch::{Hub, Subscription};

mod admin;
pub use admin::TopicStat;

const HEARTBEAT_FILE: &str = ".heartbeat";
const NAMES_FILE: &str = ".names";
const DIR_MODE: u32 = 0o2775;

/// Seconds since the epoch, now.
pub fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// A fresh event id that cannot collide: 96 random bits, URL-safe base64
/// (16 characters). Clients often use 8 random digits; time+pid+counter
/// ids collide across machines and restarts, these do not.
pub fn fresh_id() -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let bytes: [u8; 12] = random_bytes();
    let mut out = String::with_capacity(16);
    for chunk in bytes.chunks(3) {
        let n = (chunk[0] as u32) << 16 | (chunk[1] as u32) << 8 | chunk[2] as u32;
        for shift in [18, 12, 6, 0] {
            out.push(ALPHABET[((n >> shift) & 63) as usize] as char);
        }
    }
    out
}

/// `N` (at most 16) random bytes. Without an entropy source, the clock, the
/// process id and a counter mixed by xxh3: still unique within this
/// process.
pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    if getrandom::fill(&mut bytes).is_err() {
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let seed = format!("{}-{}-{n}", now(), std::process::id());
        bytes.copy_from_slice(&xxhash_rust::xxh3::xxh3_128(seed.as_bytes()).to_le_bytes()[..N]);
    }
    bytes
}

/// Where a route or a name points: a topic of this store or a remote URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Destination {
    /// A topic of this store.
    Local(Topic),
    /// An absolute `http(s)://` URL of another server.
    Remote(String),
}

/// One file write a post made: the event `id` stored on `topic`. Servers
/// report these as `Wrote to '<topic>' (<id>)` lines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    /// The topic written to.
    pub topic: Topic,
    /// The `kn_id` of the stored event.
    pub id: Vec<u8>,
    /// The checkpoint the event got there.
    pub checkpoint: u64,
}

/// A route that failed and was poisoned during a post.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Poisoned {
    /// The route's source topic.
    pub source: Topic,
    /// The route's id.
    pub route_id: Vec<u8>,
    /// What went wrong with the delivery.
    pub reason: String,
}

/// What a post did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PostReport {
    /// Every event stored, in order: `kn_subtopics` announcements, the event
    /// itself, then each forwarded copy.
    pub writes: Vec<Write>,
    /// The posted event repeated the current one: nothing was stored or
    /// forwarded.
    pub duplicate: bool,
    /// The `kn_id` of the posted event (given or fresh).
    pub id: Vec<u8>,
    /// Routes that failed and were poisoned.
    pub poisoned: Vec<Poisoned>,
}

/// What a route request did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouteReport {
    /// The route repeated an identical existing one: `200 Ignored route`.
    pub ignored: bool,
    /// The route's id.
    pub id: Vec<u8>,
    /// Everything stored: the route event and initially populated events.
    pub writes: Vec<Write>,
    /// Routes poisoned on the way (this one, if its destination failed).
    pub poisoned: Vec<Poisoned>,
}

/// Which existing events to send first on a new route or tunnel
/// (PROTOCOL.md 3.3). With nothing set, none.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Selection {
    /// Events stored in the last N seconds (`f64::INFINITY` for all).
    pub max_age: Option<f64>,
    /// The N most recent events.
    pub max_n: Option<usize>,
    /// Every event stored after the one with this checkpoint.
    pub since_checkpoint: Option<Vec<u8>>,
}

impl Selection {
    /// Every current event.
    pub fn all() -> Selection {
        Selection { max_age: Some(f64::INFINITY), ..Selection::default() }
    }

    /// True when nothing is asked for.
    pub fn is_empty(&self) -> bool {
        self.max_age.is_none() && self.max_n.is_none() && self.since_checkpoint.is_none()
    }

    /// Reads `do_max_age`, `do_max_n` and `do_since_checkpoint` from an
    /// event's elements (route parameters). Malformed values are errors.
    pub fn from_params(params: &Event) -> Result<Selection> {
        let mut s = Selection::default();
        if let Some(v) = params.get("do_max_age") {
            let text = String::from_utf8_lossy(v);
            let t = text.trim();
            s.max_age = Some(if t.eq_ignore_ascii_case("infinity") {
                f64::INFINITY
            } else {
                t.parse::<f64>().ok().filter(|x| *x >= 0.0).ok_or_else(|| {
                    Error::new(ErrorKind::BadRequest, format!("bad do_max_age '{t}': expected seconds or 'infinity'"))
                })?
            });
        }
        if let Some(v) = params.get("do_max_n") {
            let text = String::from_utf8_lossy(v);
            s.max_n = Some(text.trim().parse::<usize>().map_err(|_| {
                Error::new(ErrorKind::BadRequest, format!("bad do_max_n '{}': expected a count", text.trim()))
            })?);
        }
        if let Some(v) = params.get("do_since_checkpoint") {
            s.since_checkpoint = Some(v.to_vec());
        }
        Ok(s)
    }
}

/// How a `since_checkpoint` selection related to what the topic retains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resume {
    /// No checkpoint was asked for.
    NotAsked,
    /// Resumed exactly after the checkpoint.
    Exact,
    /// The checkpoint is unknown here: everything retained was selected.
    Unknown,
    /// Events after the checkpoint were already deleted by retention:
    /// everything retained was selected, with a gap before it.
    Gap,
}

/// Events selected from a topic, oldest first, each with its
/// `kn_route_checkpoint`.
#[derive(Clone, Debug, PartialEq)]
pub struct Selected {
    /// The events.
    pub events: Vec<Event>,
    /// What became of a `since_checkpoint`.
    pub resume: Resume,
}

/// A static route: an event of `T/kn_routes`.
#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    /// The topic routed from.
    pub source: Topic,
    /// The route event as stored (`kn_id`, `kn_payload` = destination,
    /// `kn_uri`, `kn_content_filter`, ...).
    pub event: Event,
}

impl Route {
    /// The route's id.
    pub fn id(&self) -> &[u8] {
        self.event.id().unwrap_or(b"")
    }

    /// The absolute destination URL; empty for an inactive (deleted or
    /// poisoned) route.
    pub fn destination(&self) -> &[u8] {
        self.event.payload()
    }

    /// True when the route forwards events: a destination and not expired.
    pub fn is_active(&self, now: f64) -> bool {
        !self.destination().is_empty() && !self.event.is_expired(now)
    }
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
    names: RwLock<Vec<String>>,
    remote: Arc<dyn Remote>,
    hub: OnceLock<Arc<Hub>>,
    /// What the store keeps of recently written topics (see
    /// `Config::open_topics`).
    kept: Mutex<KeptCache>,
    gauge: SpaceGauge,
}

/// The kept topics: up to [`KEPT_PER_TOPIC`] sets of files per topic, so
/// that threads posting to one topic at once (the workers of `serve`) each
/// find files of their own instead of opening the topic afresh, and at
/// most `Config::open_topics` sets in all.
#[derive(Default)]
struct KeptCache {
    topics: HashMap<Topic, Vec<Kept>>,
    count: usize,
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
}

/// A topic's routes as a post reads them, each with its destination
/// resolved at most once (resolving depends only on this store's names:
/// [`Store::add_server_name`] drops every kept list when they change).
type RouteList = Arc<Vec<(Route, OnceLock<std::result::Result<Destination, String>>)>>;

/// An event just stored by [`Store::append_event`].
struct Stored {
    seq: u64,
    /// The topic's route generation when it was stored.
    routes_generation: u64,
    /// The topic's routes as of that generation, when the store kept them.
    routes: Option<RouteList>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("root", &self.config.root).finish()
    }
}

/// The URLs a forwarded copy names its source topic by.
struct SourceUrls {
    /// The source topic's URL (`kn_routed_from`).
    topic: String,
    /// The URL of its `kn_routes` (`kn_route_location` is below it).
    routes: String,
}

impl SourceUrls {
    fn of(store: &Store, source: &Topic) -> SourceUrls {
        SourceUrls { topic: store.topic_url(source), routes: store.topic_url(&source.routes()) }
    }
}

/// One unit of work of the forwarding engine.
struct Job {
    topic: Topic,
    event: Event,
    /// Set when the job is a delivery along a route: failure poisons it.
    via: Option<(Topic, Vec<u8>)>,
    /// Store first (false for announcements already stored).
    store: bool,
}

impl Store {
    /// Opens (creating if needed) the store at `root` with the default
    /// configuration.
    pub fn open(root: impl AsRef<Path>) -> Result<Store> {
        Store::open_with(Config::new(root.as_ref()))
    }

    /// Opens the store described by `config` (see [`Config::from_env`]).
    pub fn open_with(config: Config) -> Result<Store> {
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
        let names = read_names(&config.root)?;
        let remote: Arc<dyn Remote> = Arc::new(HttpRemote::from_config(&config));
        if config.open_topics > 0 {
            // .lock, .head, the segment and a journal's heartbeat per topic.
            raise_open_file_limit(config.open_topics as u64 * 4 + 1024);
        }
        Ok(Store {
            config,
            names: RwLock::new(names),
            remote,
            hub: OnceLock::new(),
            kept: Mutex::new(KeptCache::default()),
            gauge: SpaceGauge::default(),
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

    /// The store's root directory.
    pub fn root(&self) -> &Path {
        &self.config.root
    }

    /// This server's URL: the configured one, else the first name in
    /// `.names`, else `http://localhost/kn`.
    pub fn server_url(&self) -> String {
        let names = self.names.read().ok();
        let url = self.named(names.as_deref().map_or(&[], Vec::as_slice)).next().unwrap_or_default().to_string();
        url
    }

    /// Every URL this store knows itself by (the configured one and the
    /// `.names` list).
    pub fn server_names(&self) -> Vec<String> {
        let names = self.names.read().ok();
        let all = self.named(names.as_deref().map_or(&[], Vec::as_slice)).map(str::to_string).collect();
        all
    }

    /// The URLs of [`Store::server_names`] in its order, borrowed from
    /// `names` (the `.names` list): this server's URL first (the
    /// configured one, else the first name, else `http://localhost/kn`),
    /// then the other names.
    fn named<'a>(&'a self, names: &'a [String]) -> impl Iterator<Item = &'a str> {
        let own = match &self.config.server_url {
            Some(url) => url.as_str(),
            None => names.first().map_or("http://localhost/kn", String::as_str),
        };
        std::iter::once(own).chain(names.iter().map(String::as_str).filter(move |n| *n != own))
    }

    /// Records that the server is reachable at `url` (kept in `.names`), so
    /// absolute URLs starting with it name local topics.
    pub fn add_server_name(&self, url: &str) -> Result<()> {
        if url.is_empty() || self.names.read().map(|n| n.iter().any(|x| x == url)).unwrap_or(false) {
            return Ok(());
        }
        let path = self.config.root.join(NAMES_FILE);
        let lock_path = self.config.root.join(log::LOCK_FILE);
        let lock = log::open_shared(&lock_path, false).map_err(|e| Error::io("cannot open lock file", &lock_path, e))?;
        lock.lock().map_err(|e| Error::io("cannot lock", &lock_path, e))?;
        let current = read_names(&self.config.root)?;
        if !current.iter().any(|x| x == url) {
            let mut f = log::open_shared(&path, true).map_err(|e| Error::io("cannot open", &path, e))?;
            f.write_all(format!("{url}\n").as_bytes()).map_err(|e| Error::io("cannot write", &path, e))?;
        }
        let mut names = read_names(&self.config.root)?;
        if !names.iter().any(|x| x == url) {
            names.push(url.to_string());
        }
        if let Ok(mut n) = self.names.write() {
            *n = names;
        }
        // Kept routes were resolved with the old names.
        if let Ok(mut kept) = self.kept.lock() {
            kept.topics.values_mut().flatten().for_each(|k| k.routes = None);
        }
        Ok(())
    }

    /// Resolves a topic name or absolute URL: a URL starting with one of
    /// this server's names followed by `/` is a local topic (percent escapes
    /// in it decoded); any other `http(s)://` URL is remote.
    ///
    /// ```
    /// use kn_journal::{Config, Destination, Store, Topic};
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
        if !(scheme(b"http://") || scheme(b"https://")) {
            return Ok(Destination::Local(Topic::parse_bytes(name)?));
        }
        let text = std::str::from_utf8(name)
            .map_err(|_| Error::new(ErrorKind::BadRequest, format!("bad URL '{}': not UTF-8", String::from_utf8_lossy(name))))?;
        let names = self.names.read().ok();
        for own in self.named(names.as_deref().map_or(&[], Vec::as_slice)) {
            if let Some(rest) = text.strip_prefix(own) {
                if rest.starts_with('/') {
                    let path = rest.split(['?', '#']).next().unwrap_or("");
                    return Ok(Destination::Local(Topic::parse_bytes(&decode_escapes(path.as_bytes(), b'%'))?));
                }
            }
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

    fn dir(&self, topic: &Topic) -> PathBuf {
        topic.dir(&self.config.root)
    }

    /// The directory of `topic`, refused (403) when one of its components
    /// below the store root is a symbolic link: a topic never leaves the
    /// store, even if someone planted `kn_events/evil -> /elsewhere`.
    /// Missing components are fine (the topic is not created yet).
    fn checked_dir(&self, topic: &Topic) -> Result<PathBuf> {
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

    // ----- posting ---------------------------------------------------------

    /// Posts `event` to `topic` as a client's notify (PROTOCOL.md 3.1 and
    /// 4): refused on `kn_routes`/`kn_subtopics` (400) and on a stale
    /// journal (404); otherwise stored and forwarded along every active
    /// route. A duplicate on an ordinary topic is neither stored nor
    /// forwarded (`report.duplicate`).
    pub fn notify(&self, topic: &Topic, event: Event) -> Result<PostReport> {
        if topic.is_reserved() {
            return Err(Error::new(
                ErrorKind::ReservedTopic,
                format!("can't post to '{topic}': kn_routes and kn_subtopics topics are written by the server only"),
            ));
        }
        self.post(topic, event)
    }

    /// Posts with forwarding like [`Store::notify`], but also to reserved
    /// topics (for tools that restore routes, and the server itself).
    pub fn post(&self, topic: &Topic, event: Event) -> Result<PostReport> {
        if topic.is_journal() {
            let mut kept = self.take_kept(topic);
            let stale = self.journal_stale(topic, &mut kept.1);
            self.put_kept(kept);
            if stale {
                return Err(self.stale_error(topic));
            }
        }
        let event = self.normalise(event)?;
        let id = event.id().unwrap_or(b"").to_vec();
        let mut report = PostReport { id, ..PostReport::default() };
        let stored = self.run(vec![Job { topic: topic.clone(), event, via: None, store: true }], &mut report)?;
        report.duplicate = !stored;
        Ok(report)
    }

    fn stale_error(&self, topic: &Topic) -> Error {
        Error::new(ErrorKind::Expired, format!("journal '{topic}' has expired: no tunnel has read it in the last {} s", self.config.heartbeat_stale.as_secs()))
    }

    /// Step 1 of PROTOCOL.md 4: absolute `kn_expires`, `kn_time_t`, a
    /// `kn_id`; the store assigns the checkpoint.
    fn normalise(&self, mut event: Event) -> Result<Event> {
        let size = event.byte_size();
        if size > self.config.max_event_bytes {
            return Err(Error::new(
                ErrorKind::TooLarge,
                format!("event of {size} bytes is larger than the maximum of {} bytes", self.config.max_event_bytes),
            ));
        }
        let t = now();
        if let Some(at) = event.expires_at(t)? {
            event.set(KN_EXPIRES, format_time(at));
        }
        if !event.contains(KN_TIME_T) {
            event.set(KN_TIME_T, format_time(t.floor()));
        }
        if event.id().map(|id| id.is_empty()).unwrap_or(true) {
            event.set(KN_ID, fresh_id());
        }
        event.remove(KN_ROUTE_CHECKPOINT);
        Ok(event)
    }

    /// The forwarding engine: a queue, not recursion, so chains of any
    /// length run in constant stack. Returns whether the first job stored.
    fn run(&self, jobs: Vec<Job>, report: &mut PostReport) -> Result<bool> {
        let mut queue: VecDeque<Job> = jobs.into();
        let mut first = true;
        let mut first_stored = false;
        let mut deliveries = 0usize;
        let mut filters: HashMap<Vec<u8>, Option<regex::bytes::Regex>> = HashMap::new();
        while let Some(job) = queue.pop_front() {
            let is_first = std::mem::take(&mut first);
            let outcome = self.run_job(&job, report, &mut queue);
            let stored = match outcome {
                Ok(Some(stored)) => stored,
                Ok(None) => continue,
                Err(err) => {
                    if is_first {
                        return Err(err);
                    }
                    if let Some((source, route_id)) = &job.via {
                        self.poison(source, route_id, &err.to_string(), report);
                    }
                    continue;
                }
            };
            if is_first {
                first_stored = true;
            }
            let t = now();
            if job.event.is_expired(t) {
                continue; // stored for duplicate suppression, never delivered
            }
            let routes = match stored {
                Some(Stored { routes: Some(routes), .. }) => routes,
                Some(Stored { routes_generation, .. }) => self.read_routes(&job.topic, Some(routes_generation))?,
                None => self.read_routes(&job.topic, None)?,
            };
            let mut urls = None;
            for (route, destination) in routes.iter().filter(|(r, _)| r.is_active(t)) {
                if deliveries >= self.config.max_forwards {
                    return Err(Error::new(
                        ErrorKind::TooManyDeliveries,
                        format!(
                            "post to '{}' caused more than {} deliveries (KN_MAX_FORWARDS); stopped there, the event itself was stored",
                            job.topic, self.config.max_forwards
                        ),
                    ));
                }
                deliveries += 1;
                let urls = urls.get_or_insert_with(|| SourceUrls::of(self, &job.topic));
                let destination = || destination.get_or_init(|| self.resolve(route.destination()).map_err(|e| e.to_string())).clone();
                self.forward(&job.topic, urls, route, destination, &job.event, &mut filters, &mut queue, report);
            }
        }
        Ok(first_stored)
    }

    /// Reads the routes of `topic` (active or not). With the route
    /// generation of a post to it (read under its lock before this), keeps
    /// them for the next posts while the generation stays the same: a
    /// route change since shows as another generation, never as routes
    /// older than this one.
    fn read_routes(&self, topic: &Topic, generation: Option<u64>) -> Result<RouteList> {
        let routes: RouteList = Arc::new(self.all_routes(topic)?.into_iter().map(|r| (r, OnceLock::new())).collect());
        if let (Some(generation), Ok(mut kept)) = (generation, self.kept.lock()) {
            for k in kept.topics.get_mut(topic).into_iter().flatten() {
                k.routes = Some((generation, Arc::clone(&routes)));
            }
        }
        Ok(routes)
    }

    /// Stores one job's event (and announces new topics). `Ok(None)`: a
    /// duplicate, nothing more to do; `Ok(Some(None))`: nothing was stored
    /// (the job carries an announcement stored already).
    fn run_job(&self, job: &Job, report: &mut PostReport, queue: &mut VecDeque<Job>) -> Result<Option<Option<Stored>>> {
        if !job.store {
            return Ok(Some(None));
        }
        let mut kept = self.take_kept(&job.topic);
        if job.via.is_some() && job.topic.is_journal() && self.journal_stale(&job.topic, &mut kept.1) {
            self.put_kept(kept);
            return Err(self.stale_error(&job.topic));
        }
        let create = || -> Result<()> {
            queue.extend(self.ensure_topic(&job.topic, report)?);
            Ok(())
        };
        let Some(stored) = self.append_event(&job.topic, kept, &job.event, now(), create)? else { return Ok(None) };
        report.writes.push(Write { topic: job.topic.clone(), id: job.event.id().unwrap_or(b"").to_vec(), checkpoint: stored.seq });
        Ok(Some(Some(stored)))
    }

    /// Appends under the topic's lock. Returns the checkpoint and the event
    /// as readers will see it, or `None` for a duplicate.
    fn store_event(&self, topic: &Topic, event: &Event) -> Result<Option<(u64, Event)>> {
        self.store_event_at(topic, event, now())
    }

    /// Appends as [`Store::store_event`], recording `stored_at` as the time
    /// the event was stored (an import keeps the original time).
    pub(crate) fn store_event_at(&self, topic: &Topic, event: &Event, stored_at: f64) -> Result<Option<(u64, Event)>> {
        let kept = self.take_kept(topic);
        let Some(stored) = self.append_event(topic, kept, event, stored_at, || Ok(()))? else { return Ok(None) };
        let mut out = event.clone();
        out.set(KN_ROUTE_CHECKPOINT, stored.seq.to_string());
        Ok(Some((stored.seq, out)))
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

    /// Puts back what [`Store::take_kept`] took, within
    /// `Config::open_topics`; files only (nothing else is kept without
    /// them).
    fn put_kept(&self, (topic, kept): (Option<Topic>, Kept)) {
        let Some(topic) = topic else { return };
        if kept.files.is_none() {
            return;
        }
        if let Ok(mut cache) = self.kept.lock() {
            if cache.count >= self.config.open_topics {
                return;
            }
            let sets = cache.topics.entry(topic).or_default();
            if sets.len() < KEPT_PER_TOPIC {
                sets.push(kept);
                cache.count += 1;
            }
        }
    }

    /// Appends `event` to `topic` under its lock, recording `stored_at` as
    /// the time it was stored; `None` for a duplicate. With the topic's
    /// files kept from an earlier post (and still matching its log, see
    /// FORMAT.md) this opens and looks up nothing; otherwise `create`
    /// first makes the topic's directory if needed, and the files are
    /// opened afresh after the symbolic-link check.
    ///
    /// A write to `T/kn_routes` first changes `T`'s route generation, and
    /// holds `T`'s lock until it is stored, so that no process goes on
    /// using routes of `T` read before (see [`Store::read_routes`]).
    fn append_event(
        &self,
        topic: &Topic,
        kept: (Option<Topic>, Kept),
        event: &Event,
        stored_at: f64,
        create: impl FnOnce() -> Result<()>,
    ) -> Result<Option<Stored>> {
        let mut create = Some(create);
        let mut prepare = || create.take().map_or(Ok(()), |c| c());
        let mut source = None;
        if topic.last_segment() == Some(crate::topic::ROUTES_SEGMENT) {
            if let Some(parent) = topic.parent() {
                // Create `kn_routes` (announcing it in the source's
                // `kn_subtopics`) before taking the source's lock: a lock
                // is only ever taken under a parent topic's lock.
                if kept.1.files.is_none() {
                    prepare()?;
                }
                let parent_kept = self.take_kept(&parent);
                let (mut writer, parent_kept) = self.writer(&parent, parent_kept, &mut prepare)?;
                writer.routes_changing()?;
                source = Some((writer, parent_kept));
            }
        }
        let (mut writer, kept) = self.writer(topic, kept, &mut prepare)?;
        let appended = writer.append(event, stored_at.max(0.0) as u64, &self.gauge);
        if matches!(appended, Ok(Appended::Stored(_))) && writer.wants_compaction() {
            // Best effort: the post is stored whatever happens here.
            let _ = writer.compact(now());
        }
        let routes_generation = writer.routes_generation();
        let routes = kept.1.routes.as_ref().filter(|(g, _)| *g == routes_generation).map(|(_, r)| Arc::clone(r));
        self.keep(writer, kept);
        if let Some((writer, kept)) = source {
            self.keep(writer, kept);
        }
        let Appended::Stored(seq) = appended? else { return Ok(None) };
        Ok(Some(Stored { seq, routes_generation, routes }))
    }

    /// A locked writer of `topic`: from the files in `kept` when they still
    /// match the log, else (after `prepare`) opened afresh, refused when a
    /// component of the topic's path is a symbolic link. Hands `kept` back
    /// (without its files) for [`Store::keep`].
    fn writer(
        &self,
        topic: &Topic,
        mut kept: (Option<Topic>, Kept),
        prepare: &mut impl FnMut() -> Result<()>,
    ) -> Result<(Writer<'_>, (Option<Topic>, Kept))> {
        let ordinary = !topic.is_journal();
        if let Some(files) = kept.1.files.take() {
            // Kept files that still match the log are the topic's own: the
            // directory they are in was checked when they were opened.
            if let Some(writer) = Writer::reopen(&self.config, ordinary, files)? {
                return Ok((writer, kept));
            }
        }
        prepare()?;
        let dir = self.checked_dir(topic)?;
        let writer = Writer::open(&dir, &self.config, ordinary)?;
        kept.0.get_or_insert_with(|| topic.clone());
        Ok((writer, kept))
    }

    /// Unlocks `writer` and keeps its files with the rest of `kept` for
    /// the next post to the topic.
    fn keep(&self, writer: Writer<'_>, mut kept: (Option<Topic>, Kept)) {
        kept.1.files = Some(writer.release());
        self.put_kept(kept);
    }

    /// Creates `topic` and its missing ancestors, storing a `kn_subtopics`
    /// announcement for each new one; returns forwarding jobs for them.
    fn ensure_topic(&self, topic: &Topic, report: &mut PostReport) -> Result<Vec<Job>> {
        let dir = self.checked_dir(topic)?;
        if dir.is_dir() {
            return Ok(Vec::new());
        }
        let mut jobs = Vec::new();
        self.create_topic_dirs(topic, |parent, segment| {
            let subtopics = parent.subtopics();
            let mut announcement = Event::new();
            announcement.set(KN_ID, fresh_id()).set(KN_PAYLOAD, segment).set(KN_TIME_T, format_time(now().floor()));
            if let Some((seq, stored)) = self.store_event(&subtopics, &announcement)? {
                report.writes.push(Write { topic: subtopics.clone(), id: stored.id().unwrap_or(b"").to_vec(), checkpoint: seq });
                jobs.push(Job { topic: subtopics, event: stored, via: None, store: false });
            }
            Ok(())
        })?;
        Ok(jobs)
    }

    /// Creates the missing directories of `topic`, top down, and calls
    /// `created(parent, segment)` for each new one other than a
    /// `kn_subtopics` (whose directory, under `parent`, exists by then): the
    /// caller announces it. Another process creating a directory first is
    /// not an error, and then that process announces it.
    pub(crate) fn create_topic_dirs(
        &self,
        topic: &Topic,
        mut created: impl FnMut(&Topic, &str) -> Result<()>,
    ) -> Result<()> {
        let mut current = Topic::root();
        for segment in topic.segments() {
            let parent = current.clone();
            current = parent.child(segment)?;
            if !self.create_dir_of(&current, &parent)? || segment == crate::topic::SUBTOPICS_SEGMENT {
                continue;
            }
            // The kn_subtopics directory itself is created (unannounced).
            self.create_dir_of(&parent.subtopics(), &parent)?;
            created(&parent, segment)?;
        }
        Ok(())
    }

    /// Creates `topic`'s directory (syncing `parent`'s with `sync=always`);
    /// false when it already existed.
    fn create_dir_of(&self, topic: &Topic, parent: &Topic) -> Result<bool> {
        let path = self.dir(topic);
        match create_topic_dir(&path) {
            Ok(()) => {
                if self.config.sync == SyncPolicy::Always {
                    log::sync_dir(&self.dir(parent))?;
                }
                Ok(true)
            }
            Err(e) if e.kind() == IoKind::AlreadyExists => Ok(false),
            Err(e) => Err(Error::io("cannot create topic directory", &path, e)),
        }
    }

    // ----- routes ----------------------------------------------------------

    /// The routes of `topic` (active and inactive), oldest first.
    pub fn all_routes(&self, topic: &Topic) -> Result<Vec<Route>> {
        let routes = topic.routes();
        if !self.dir(&routes).is_dir() {
            return Ok(Vec::new());
        }
        Ok(self
            .select(&routes, &Selection::all(), true)?
            .events
            .into_iter()
            .map(|event| Route { source: topic.clone(), event })
            .collect())
    }

    /// The active routes of `topic`: a destination and not expired.
    pub fn routes(&self, topic: &Topic) -> Result<Vec<Route>> {
        let t = now();
        Ok(self.all_routes(topic)?.into_iter().filter(|r| r.is_active(t)).collect())
    }

    /// Creates a static route from `from` to `to` (a topic name or absolute
    /// URL) with the route's elements in `params` (`kn_id`, `kn_uri`,
    /// `kn_expires`, `kn_content_filter`, `kn_content_transform`,
    /// `do_max_age`, `do_max_n`). PROTOCOL.md 3.2 and 3.3: refused from a
    /// journal (403); an identical repeat is ignored; a new route first
    /// carries the selected existing events.
    pub fn route(&self, from: &Topic, to: &[u8], params: Event) -> Result<RouteReport> {
        if from.is_journal() {
            return Err(Error::new(
                ErrorKind::Forbidden,
                format!("static routes from journal '{from}' are refused: without duplicate suppression they could loop forever"),
            ));
        }
        if to.is_empty() {
            return Err(Error::new(
                ErrorKind::BadRequest,
                format!("empty route destination from '{from}': use delete_route to delete a route"),
            ));
        }
        let destination = self.route_destination(to)?;
        let selection = Selection::from_params(&params)?;
        if let Some(filter) = params.get("kn_content_filter") {
            self.compile_filter(filter)?;
        }
        self.check_route_limit(from, params.id())?;
        let mut event = params;
        event.set(KN_PAYLOAD, destination);
        let mut report = self.post_route_event(from, event)?;
        if report.ignored || selection.is_empty() {
            return Ok(report);
        }
        let route = Route { source: from.clone(), event: self.current_route(from, &report.id)? };
        let mut post = PostReport::default();
        let mut filters = HashMap::new();
        let urls = SourceUrls::of(self, from);
        for event in self.select(from, &selection, false)?.events {
            let mut queue = VecDeque::new();
            let destination = || self.resolve(route.destination()).map_err(|e| e.to_string());
            self.forward(from, &urls, &route, destination, &event, &mut filters, &mut queue, &mut post);
            self.run_queue(queue, &mut post);
            // A failed delivery poisoned the route: it carries nothing more
            // (and a silent remote must not cost one timeout per event).
            if post.poisoned.iter().any(|p| p.source == *from && p.route_id == report.id) {
                break;
            }
        }
        report.writes.extend(post.writes);
        report.poisoned.extend(post.poisoned);
        Ok(report)
    }

    /// Refuses a new route from `from` when it has `max_routes` active
    /// ones already (replacing one of them, same `kn_id`, is allowed). The
    /// routes are counted only when the index says there may be that many.
    fn check_route_limit(&self, from: &Topic, id: Option<&[u8]>) -> Result<()> {
        let max = self.config.max_routes;
        if log::indexed_ids(&self.dir(&from.routes())) < max as u64 {
            return Ok(());
        }
        let active = self.routes(from)?;
        let replaces = id.is_some_and(|id| !id.is_empty() && active.iter().any(|r| r.id() == id));
        if active.len() < max || replaces {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::Forbidden,
            format!("'{from}' has {} active routes, the maximum (KN_MAX_ROUTES is {max}): delete one first", active.len()),
        ))
    }

    fn run_queue(&self, queue: VecDeque<Job>, report: &mut PostReport) {
        if queue.is_empty() {
            return;
        }
        // Deliveries: failures poison their routes inside `run`, so the
        // only error left is the first job's, which is a delivery too.
        let mut jobs: Vec<Job> = queue.into();
        let first = jobs.remove(0);
        let via = first.via.clone();
        if let Err(err) = self.run(vec![first], report) {
            if let Some((source, id)) = via {
                self.poison(&source, &id, &err.to_string(), report);
            }
        }
        if !jobs.is_empty() {
            self.run_queue(jobs.into(), report);
        }
    }

    fn current_route(&self, from: &Topic, id: &[u8]) -> Result<Event> {
        self.all_routes(from)?
            .into_iter()
            .find(|r| r.id() == id)
            .map(|r| r.event)
            .ok_or_else(|| Error::new(ErrorKind::Io, format!("route '{}' of '{from}' vanished", String::from_utf8_lossy(id))))
    }

    /// Deletes route `id` of `from`: it is replaced by an inactive route
    /// (empty destination), which watchers of `kn_routes` see; `expires`
    /// lets the deletion itself be reclaimed.
    pub fn delete_route(&self, from: &Topic, id: &[u8], expires: Option<&[u8]>) -> Result<RouteReport> {
        let mut event = Event::new();
        event.set(KN_ID, id).set(KN_PAYLOAD, "");
        if let Some(e) = expires {
            event.set(KN_EXPIRES, e);
        }
        self.post_route_event(from, event)
    }

    fn post_route_event(&self, from: &Topic, mut event: Event) -> Result<RouteReport> {
        if event.id().map(|i| i.is_empty()).unwrap_or(true) {
            event.set(KN_ID, fresh_id());
        }
        let post = self.post(&from.routes(), event)?;
        Ok(RouteReport { ignored: post.duplicate, id: post.id, writes: post.writes, poisoned: post.poisoned })
    }

    /// Checks a route destination (PROTOCOL.md 3.2) and makes it absolute.
    fn route_destination(&self, to: &[u8]) -> Result<Vec<u8>> {
        if let Some(&b) = to.iter().find(|&&b| b <= b' ' || b == 0x7f || matches!(b, b'"' | b'#' | b'<' | b'>')) {
            return Err(Error::new(
                ErrorKind::BadRequest,
                format!("bad route destination '{}': byte 0x{b:02X} is not allowed", String::from_utf8_lossy(to)),
            ));
        }
        match self.resolve(to)? {
            Destination::Local(topic) => {
                if topic.is_reserved() {
                    return Err(Error::new(ErrorKind::BadRequest, format!("bad route destination '{topic}': can't route into a reserved topic")));
                }
                Ok(self.topic_url(&topic).into_bytes())
            }
            Destination::Remote(url) => {
                self.config.outbound.check(&url)?;
                Ok(url.into_bytes())
            }
        }
    }

    fn compile_filter(&self, pattern: &[u8]) -> Result<regex::bytes::Regex> {
        let text = String::from_utf8_lossy(pattern);
        if pattern.len() > self.config.max_filter_bytes {
            return Err(Error::new(
                ErrorKind::BadRequest,
                format!("kn_content_filter of {} bytes is longer than the maximum of {}", pattern.len(), self.config.max_filter_bytes),
            ));
        }
        regex::bytes::RegexBuilder::new(&text)
            .size_limit(1 << 20)
            .build()
            .map_err(|e| Error::new(ErrorKind::BadRequest, format!("bad kn_content_filter '{text}': {e}")))
    }

    /// PROTOCOL.md 4.1: filter, transform, hop-by-hop elements, then queue
    /// a local delivery or make a remote one.
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        source: &Topic,
        urls: &SourceUrls,
        route: &Route,
        destination: impl FnOnce() -> std::result::Result<Destination, String>,
        event: &Event,
        filters: &mut HashMap<Vec<u8>, Option<regex::bytes::Regex>>,
        queue: &mut VecDeque<Job>,
        report: &mut PostReport,
    ) {
        let route_id = route.id().to_vec();
        if let Some(pattern) = route.event.get("kn_content_filter") {
            let regex = filters.entry(pattern.to_vec()).or_insert_with(|| self.compile_filter(pattern).ok());
            match regex {
                Some(r) if r.is_match(event.payload()) => {}
                _ => return,
            }
        }
        let mut out = event.clone();
        if let Some(spec) = route.event.get("kn_content_transform") {
            let allowed = remote::parse_content_transform(spec).and_then(|(url, _)| self.config.outbound.check(url));
            if allowed.is_err() {
                return;
            }
            match remote::content_transform(self.remote.as_ref(), spec, event.payload()) {
                Ok(payload) => {
                    out.set(KN_PAYLOAD, payload);
                }
                Err(_) => return, // the event does not travel this route
            }
        }
        out.strip_hop_by_hop();
        let location = match route.event.get("kn_uri") {
            Some(uri) => uri.to_vec(),
            None => format!("{}/{}", urls.routes, String::from_utf8_lossy(&route_id)).into_bytes(),
        };
        out.set(KN_ROUTE_LOCATION, location).set(KN_ROUTE_ID, route_id.clone()).set(KN_ROUTED_FROM, urls.topic.as_bytes());
        let via = Some((source.clone(), route_id.clone()));
        match destination() {
            Ok(Destination::Local(topic)) => queue.push_back(Job { topic, event: out, via, store: true }),
            Ok(Destination::Remote(url)) => {
                let result = self.config.outbound.check(&url).and_then(|_| remote::deliver(self.remote.as_ref(), &url, &out));
                if let Err(err) = result {
                    self.poison(source, &route_id, &err.to_string(), report);
                }
            }
            Err(err) => self.poison(source, &route_id, &err, report),
        }
    }

    /// PROTOCOL.md 4.1 step 5: replace the route, under the same id, by an
    /// inactive one that expires in 300 s.
    fn poison(&self, source: &Topic, route_id: &[u8], reason: &str, report: &mut PostReport) {
        let mut event = Event::new();
        event.set(KN_ID, route_id).set(KN_PAYLOAD, "").set(KN_EXPIRES, "+300");
        if let Ok(event) = self.normalise(event) {
            let routes = source.routes();
            if let Ok(Some((seq, _))) = self.store_event(&routes, &event) {
                report.writes.push(Write { topic: routes, id: route_id.to_vec(), checkpoint: seq });
            }
        }
        report.poisoned.push(Poisoned { source: source.clone(), route_id: route_id.to_vec(), reason: reason.to_string() });
    }

    // ----- reading ---------------------------------------------------------

    /// The selected unexpired events of `topic`, oldest first, each with its
    /// `kn_route_checkpoint`. On an ordinary topic only the current event of
    /// each `kn_id` counts, ordered by when it was last stored.
    pub fn events(&self, topic: &Topic, selection: &Selection) -> Result<Selected> {
        self.select(topic, selection, false)
    }

    fn select(&self, topic: &Topic, selection: &Selection, include_expired: bool) -> Result<Selected> {
        let dir = self.checked_dir(topic)?;
        let ordinary = !topic.is_journal();
        let t = now();
        let live = |r: &Record| include_expired || !r.event.is_expired(t);
        if let Some(cp) = &selection.since_checkpoint {
            let (after, resume) = self.resume_point(&dir, cp)?;
            let mut records = log::read_after(&dir, after)?;
            if ordinary {
                records = latest_per_id(records);
            }
            let events = records.into_iter().filter(|r| live(r)).map(with_checkpoint).collect();
            return Ok(Selected { events, resume });
        }
        if selection.is_empty() {
            return Ok(Selected { events: Vec::new(), resume: Resume::NotAsked });
        }
        let max_n = selection.max_n.unwrap_or(usize::MAX);
        // Stored times are whole seconds, as the original's file times were:
        // the window is compared at that resolution, inclusively.
        let cutoff = selection.max_age.map(|a| if a.is_finite() { (t - a).floor() } else { f64::MIN }).unwrap_or(f64::MIN);
        let mut seen: HashSet<Vec<u8>> = HashSet::new();
        let mut picked = Vec::new();
        if max_n > 0 {
            log::read_backwards(&dir, |r| {
                if (r.stored_secs as f64) < cutoff {
                    return false;
                }
                if ordinary && !seen.insert(r.event.id().unwrap_or(b"").to_vec()) {
                    return true; // superseded by a newer record
                }
                if live(&r) {
                    picked.push(r);
                }
                picked.len() < max_n
            })?;
        }
        picked.reverse();
        Ok(Selected { events: picked.into_iter().map(with_checkpoint).collect(), resume: Resume::NotAsked })
    }

    fn resume_point(&self, dir: &Path, checkpoint: &[u8]) -> Result<(u64, Resume)> {
        let parsed = std::str::from_utf8(checkpoint).ok().and_then(|s| s.trim().parse::<u64>().ok());
        let end = log::cursor_at_end(dir)?.last_seq();
        match parsed {
            Some(c) if c <= end && c > 0 => {
                // Only journal retention deletes events a client has not
                // seen; compaction of an ordinary topic removes superseded
                // and expired ones, which are no gap.
                let first = log::list_segments(dir)?.first().copied().unwrap_or(1);
                let journal = dir.file_name().map(|n| n == crate::topic::JOURNAL_SEGMENT).unwrap_or(false);
                Ok((c, if journal && first > c + 1 { Resume::Gap } else { Resume::Exact }))
            }
            _ => Ok((0, Resume::Unknown)),
        }
    }

    /// Every topic of the store, sorted (the tree, walked with `walkdir`).
    pub fn topics(&self) -> Result<Vec<Topic>> {
        let root = &self.config.root;
        let mut out = Vec::new();
        for entry in walkdir::WalkDir::new(root).min_depth(1).follow_links(false).into_iter().filter_entry(|e| {
            !e.file_name().to_string_lossy().starts_with('.')
        }) {
            let entry = entry.map_err(|e| Error::new(ErrorKind::Io, format!("cannot walk '{}': {e}", root.display())))?;
            if !entry.file_type().is_dir() {
                continue;
            }
            let rel = entry.path().strip_prefix(root).unwrap_or(entry.path());
            if let Ok(t) = Topic::parse(&rel.to_string_lossy()) {
                out.push(t);
            }
        }
        out.sort();
        Ok(out)
    }

    /// Rewrites `topic`'s sealed segments without superseded records and
    /// events expired longer than `expired_grace`; on a journal also applies
    /// retention. Safe while others read and post.
    pub fn compact(&self, topic: &Topic) -> Result<CompactReport> {
        let dir = self.dir(topic);
        if !dir.is_dir() {
            return Err(Error::new(ErrorKind::BadTopic, format!("no topic '{topic}' in the store")));
        }
        let mut writer = Writer::open(&dir, &self.config, !topic.is_journal())?;
        if topic.is_journal() {
            writer.apply_retention()?;
        }
        writer.compact(now())
    }

    /// Checks every record of every topic: the count of valid records and
    /// the bad ones found.
    pub fn verify(&self) -> Result<VerifyReport> {
        let mut report = VerifyReport::default();
        let mut dirs = vec![self.config.root.clone()];
        dirs.extend(self.topics()?.iter().map(|t| self.dir(t)));
        for dir in dirs {
            let (good, bad) = log::verify_dir(&dir)?;
            report.records += good;
            report.problems.extend(bad.into_iter().map(|(path, offset, stop)| VerifyProblem {
                path,
                offset,
                reason: match stop {
                    log::Stop::Incomplete => "incomplete record (torn tail)".to_string(),
                    log::Stop::Corrupt(why) => why,
                },
            }));
        }
        Ok(report)
    }

    /// Truncates the torn tail of every topic (what the next writer would
    /// do), making `verify` clean after a crash. Returns how many topics it
    /// touched.
    pub fn repair(&self) -> Result<usize> {
        let mut touched = 0;
        for t in std::iter::once(Topic::root()).chain(self.topics()?) {
            let dir = self.dir(&t);
            let (_, bad) = log::verify_dir(&dir)?;
            if bad.is_empty() {
                continue;
            }
            drop(Writer::open(&dir, &self.config, !t.is_journal())?);
            touched += 1;
        }
        Ok(touched)
    }

    // ----- journals and tunnels -------------------------------------------

    /// True when `journal` has no heartbeat or one older than
    /// `heartbeat_stale` (100 s). Ordinary topics are never stale.
    pub fn is_stale(&self, journal: &Topic) -> bool {
        if !journal.is_journal() {
            return false;
        }
        let path = self.dir(journal).join(HEARTBEAT_FILE);
        match fs::metadata(&path).and_then(|m| m.modified()) {
            Ok(t) => SystemTime::now().duration_since(t).unwrap_or(Duration::ZERO) > self.config.heartbeat_stale,
            Err(_) => true,
        }
    }

    /// [`Store::is_stale`], through the heartbeat in `kept` (opened and
    /// kept there when this process writes to the journal): an `fstat`
    /// instead of a path lookup. A heartbeat deleted since (expired, or
    /// replaced) is unlinked: the path decides then.
    fn journal_stale(&self, journal: &Topic, kept: &mut Kept) -> bool {
        if kept.files.is_none() {
            return self.is_stale(journal);
        }
        let linked = |f: &fs::File| f.metadata().ok().filter(|m| m.nlink() > 0);
        let meta = match kept.heartbeat.as_ref().and_then(linked) {
            Some(meta) => meta,
            None => match fs::File::open(self.dir(journal).join(HEARTBEAT_FILE)) {
                Ok(f) => {
                    let meta = linked(&f);
                    kept.heartbeat = Some(f);
                    match meta {
                        Some(meta) => meta,
                        None => return true,
                    }
                }
                Err(_) => {
                    kept.heartbeat = None;
                    return self.is_stale(journal);
                }
            },
        };
        match meta.modified() {
            Ok(t) => SystemTime::now().duration_since(t).unwrap_or(Duration::ZERO) > self.config.heartbeat_stale,
            Err(_) => true,
        }
    }

    /// Refreshes `journal`'s heartbeat (a tunnel reading it does so).
    pub fn heartbeat(&self, journal: &Topic) -> Result<()> {
        let path = self.checked_dir(journal)?.join(HEARTBEAT_FILE);
        let beat = || -> std::io::Result<()> {
            let f = log::open_shared(&path, false)?;
            // A write sets the modification time to now with write
            // permission alone; setting a time explicitly (utimensat with a
            // value) is allowed only to the file's owner, and the web server
            // and sensors of one group are different users.
            std::os::unix::fs::FileExt::write_all_at(&f, b"\n", 0)
        };
        beat().map_err(|e| Error::io("cannot refresh heartbeat", &path, e))
    }

    /// Makes `journal` stale at once (a tunnel's `kn_expires` passed).
    pub fn expire(&self, journal: &Topic) -> Result<()> {
        let path = self.checked_dir(journal)?.join(HEARTBEAT_FILE);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == IoKind::NotFound => Ok(()),
            Err(e) => Err(Error::io("cannot expire heartbeat", &path, e)),
        }
    }

    fn hub(&self) -> &Arc<Hub> {
        self.hub.get_or_init(|| Arc::new(Hub::new()))
    }

    /// Opens a tunnel on `topic` (PROTOCOL.md 3.4): creates the topic (the
    /// report lists the announcements), refreshes a journal's heartbeat,
    /// and returns the initially selected events. Then call
    /// [`Tunnel::next`] / [`Tunnel::wait`] for events as they land.
    pub fn tunnel(&self, topic: &Topic, selection: &Selection) -> Result<TunnelStart> {
        let mut report = PostReport::default();
        let jobs = self.ensure_topic(topic, &mut report)?;
        // Routes on kn_subtopics fire for the announcements.
        let mut forwarded = PostReport::default();
        self.run(jobs, &mut forwarded)?;
        report.writes.extend(forwarded.writes);
        report.poisoned.extend(forwarded.poisoned);
        if topic.is_journal() {
            self.heartbeat(topic)?;
        }
        let dir = self.dir(topic);
        let subscription = self.hub().subscribe(&dir);
        let cursor = log::cursor_at_end(&dir)?;
        let mut initial = self.select(topic, selection, false)?;
        initial.events.retain(|e| checkpoint_of(e) <= cursor.last_seq());
        let tunnel = Tunnel {
            topic: topic.clone(),
            dir,
            cursor,
            subscription,
            last_beat: Instant::now(),
            poll: self.config.poll_interval,
        };
        Ok(TunnelStart { tunnel, created: report, initial })
    }
}

/// What [`Store::tunnel`] returns.
pub struct TunnelStart {
    /// The open tunnel.
    pub tunnel: Tunnel,
    /// The topics the tunnel created, with their announcements.
    pub created: PostReport,
    /// The initially selected events, oldest first.
    pub initial: Selected,
}

/// A reader following a topic as events land. Wakeups come from the
/// process-wide change notifier; without one, [`Tunnel::wait`] polls.
pub struct Tunnel {
    topic: Topic,
    dir: PathBuf,
    cursor: LogCursor,
    subscription: Subscription,
    last_beat: Instant,
    poll: Duration,
}

/// Tunnels refresh their journal's heartbeat at least this often.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(20);

impl Tunnel {
    /// The topic followed.
    pub fn topic(&self) -> &Topic {
        &self.topic
    }

    /// The checkpoint of the last event returned.
    pub fn checkpoint(&self) -> u64 {
        self.cursor.last_seq()
    }

    /// The events stored since the last call (never blocks), oldest first,
    /// unexpired, with checkpoints. Refreshes a journal's heartbeat when due.
    pub fn next(&mut self, store: &Store) -> Result<Vec<Event>> {
        if self.topic.is_journal() && self.last_beat.elapsed() >= HEARTBEAT_EVERY {
            store.heartbeat(&self.topic)?;
            self.last_beat = Instant::now();
        }
        let t = now();
        let records = log::read_new(&self.dir, &mut self.cursor)?;
        Ok(records.into_iter().filter(|r| !r.event.is_expired(t)).map(with_checkpoint).collect())
    }

    /// Waits until new events are available or `timeout` passes, then
    /// returns them (possibly none). Wakes within a millisecond of an
    /// append by any process on a local disk; polls every
    /// `poll_interval` otherwise.
    pub fn wait(&mut self, store: &Store, timeout: Duration) -> Result<Vec<Event>> {
        let deadline = Instant::now() + timeout;
        loop {
            let listener = self.subscription.listen();
            let events = self.next(store)?;
            let left = deadline.saturating_duration_since(Instant::now());
            if !events.is_empty() || left.is_zero() {
                return Ok(events);
            }
            Subscription::wait(listener, left.min(self.poll));
        }
    }

    /// An armed wakeup for async servers: `.await` it (it is a `Future`),
    /// then call [`Tunnel::next`]. Arm it *before* calling `next` so that
    /// no append slips in between.
    pub fn listen(&self) -> event_listener::EventListener {
        self.subscription.listen()
    }

    /// The longest an async server should wait on [`Tunnel::listen`] before
    /// re-reading anyway (the polling fallback).
    pub fn poll_interval(&self) -> Duration {
        self.poll
    }

    /// False when this tunnel relies on polling alone.
    pub fn is_notified(&self) -> bool {
        self.subscription.is_notified()
    }
}

/// What [`Store::verify`] found.
#[derive(Clone, Debug, Default)]
pub struct VerifyReport {
    /// Valid records.
    pub records: usize,
    /// Bad frames: where and why.
    pub problems: Vec<VerifyProblem>,
}

/// One bad frame found by [`Store::verify`].
#[derive(Clone, Debug)]
pub struct VerifyProblem {
    /// The segment file.
    pub path: PathBuf,
    /// Offset of the bad frame.
    pub offset: u64,
    /// What is wrong.
    pub reason: String,
}

fn with_checkpoint(r: Record) -> Event {
    let mut e = r.event;
    e.set(KN_ROUTE_CHECKPOINT, r.seq.to_string());
    e
}

fn checkpoint_of(e: &Event) -> u64 {
    e.checkpoint().and_then(|c| std::str::from_utf8(c).ok()).and_then(|c| c.parse().ok()).unwrap_or(0)
}

/// Keeps the last record of each `kn_id`, in the order of those records.
fn latest_per_id(records: Vec<Record>) -> Vec<Record> {
    let mut last: HashMap<Vec<u8>, u64> = HashMap::new();
    for r in &records {
        last.insert(r.event.id().unwrap_or(b"").to_vec(), r.seq);
    }
    records.into_iter().filter(|r| last.get(r.event.id().unwrap_or(b"")) == Some(&r.seq)).collect()
}

/// Creates one topic directory with the store's mode (setgid, group
/// writable, whatever the umask), so files inside keep the directory's
/// group. Fails with `AlreadyExists` if another process was first.
fn create_topic_dir(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::DirBuilder::new().mode(DIR_MODE).create(path)?;
    fs::set_permissions(path, fs::Permissions::from_mode(DIR_MODE))
}

/// Raises the soft limit on open files towards `wanted` (never above the
/// hard limit), making room for kept topic files and many tunnels.
fn raise_open_file_limit(wanted: u64) {
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

fn read_names(root: &Path) -> Result<Vec<String>> {
    let path = root.join(NAMES_FILE);
    match fs::read_to_string(&path) {
        Ok(text) => Ok(text.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect()),
        Err(e) if e.kind() == IoKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(Error::io("cannot read", &path, e)),
    }
}

