//! Every setting of the store, in one place.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, ErrorKind};
use crate::http::HttpProxy;
use crate::remote::OutboundPolicy;

/// When appended records reach stable storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncPolicy {
    /// The OS decides when to write back. An acknowledged event survives the
    /// death of any process (the data sits in the page cache), not a power
    /// cut or kernel crash, which may lose the last seconds of posts.
    None,
    /// `fdatasync` of the segment before a post returns, and `fsync` of the
    /// directory whenever a file or topic directory is created. An
    /// acknowledged event survives a power cut on media that honour flushes.
    Always,
}

impl std::str::FromStr for SyncPolicy {
    type Err = Error;
    fn from_str(s: &str) -> Result<SyncPolicy, Error> {
        match s.trim() {
            "none" => Ok(SyncPolicy::None),
            "always" => Ok(SyncPolicy::Always),
            other => Err(Error::new(ErrorKind::BadRequest, format!("bad sync policy '{other}': expected 'none' or 'always'"))),
        }
    }
}

/// The settings of a [`Store`](crate::Store). `Config::new` gives the
/// documented defaults; [`Config::from_env`] reads the `KN_*` variables.
///
/// | setting | default | environment |
/// |---|---|---|
/// | `root` | `./kn_events` | `KN_EVENTS` |
/// | `reserve_bytes` | 64 MiB | `KN_RESERVE_BYTES` |
/// | `sync` | `none` | `KN_SYNC` (`none`/`always`) |
/// | `max_event_bytes` | 8 MiB | `KN_MAX_EVENT_BYTES` |
/// | `segment_bytes` | 1 MiB | `KN_SEGMENT_BYTES` |
/// | `journal_max_age` | 1 day | `KN_JOURNAL_MAX_AGE` (seconds) |
/// | `journal_max_bytes` | 64 MiB | `KN_JOURNAL_MAX_BYTES` |
/// | `expired_grace` | 1 hour | `KN_EXPIRED_GRACE` (seconds) |
/// | `poll_interval` | 250 ms | `KN_POLL_MS` |
/// | `heartbeat_stale` | 100 s | — (protocol constant) |
/// | `server_url` | first line of `.names`, else `http://localhost/kn` | `KN_SERVER_URL` |
/// | `outbound` | `deny` | `KN_OUTBOUND` (`allow`, `deny` or URL prefixes) |
/// | `remote_timeout` | 5 s | `KN_REMOTE_TIMEOUT_MS` |
/// | `remote_connect_timeout` | 2 s | `KN_REMOTE_CONNECT_TIMEOUT_MS` |
/// | `remote_max_bytes` | 8 MiB per response body | `KN_REMOTE_MAX_BYTES` |
/// | `remote_max_redirects` | 5 (GETs only; POSTs follow none) | `KN_REMOTE_MAX_REDIRECTS` |
/// | `http_proxy` | none (`HTTP_PROXY` and the like are never read) | `KN_HTTP_PROXY` (`http://host:port`) |
/// | `max_forwards` | 100,000 deliveries per post (more: `508 Too many deliveries`) | `KN_MAX_FORWARDS` |
/// | `max_routes` | 10,000 active routes per topic (more: `403`) | `KN_MAX_ROUTES` |
/// | `max_filter_bytes` | 4 KiB per `kn_content_filter` | — |
/// | `blob_bytes` | 64 KiB: a longer `kn_payload` is stored once, in a blob file (0: never) | `KN_BLOB_BYTES` |
/// | `max_topic_depth` | 32 segments per topic name (more: `400`); at most [`MAX_TOPIC_DEPTH`](crate::MAX_TOPIC_DEPTH) (64), beyond which no name is valid anywhere | `KN_MAX_TOPIC_DEPTH` |
/// | `max_topic_bytes` | 1024 bytes per topic name (more: `400`); at most [`MAX_TOPIC_BYTES`](crate::MAX_TOPIC_BYTES) (1024) | `KN_MAX_TOPIC_BYTES` |
/// | `max_form_elements` | 10,000 form elements (`name=value` pairs) per request, query and body together (more: `413`) | `KN_MAX_FORM_ELEMENTS` |
/// | `max_selected` | 10,000 events a tunnel or new route starts with (older ones are left out) | `KN_MAX_SELECTED` |
/// | `open_topics` | sets of topic files kept open between posts (at most 4 per topic): a tenth of the hard open-file limit, at least 1024 (see [`default_open_topics`]) | `KN_OPEN_TOPICS` |
/// | `max_replays` | 8 replays (`kn-replay`) running at once per store (more: `503`) | `KN_MAX_REPLAYS` |
/// | `replay_max_time` | 1 hour per replay (then `kn-replay` stops) | `KN_REPLAY_MAX_TIME` (seconds) |
#[derive(Clone, Debug)]
pub struct Config {
    /// The directory holding the event tree.
    pub root: PathBuf,
    /// Posts fail with [`ErrorKind::DiskFull`] when the file system has less
    /// free space than this.
    pub reserve_bytes: u64,
    /// When appends reach stable storage.
    pub sync: SyncPolicy,
    /// Largest event (sum of element names and values) accepted.
    pub max_event_bytes: usize,
    /// A segment is sealed and a new one started once it reaches this size.
    pub segment_bytes: u64,
    /// Journal segments whose newest record is older than this are deleted.
    pub journal_max_age: Duration,
    /// Oldest journal segments are deleted while a journal holds more.
    pub journal_max_bytes: u64,
    /// Compaction keeps expired events this long so that duplicate
    /// suppression still sees them (loops of expired events must end).
    pub expired_grace: Duration,
    /// How often a waiting reader re-reads when no change notification came.
    pub poll_interval: Duration,
    /// A journal whose heartbeat is older than this is stale.
    pub heartbeat_stale: Duration,
    /// This server's own URL (`http://host/kn`); `None` means "from `.names`".
    pub server_url: Option<String>,
    /// Which remote URLs routes and content transforms may send requests to.
    pub outbound: OutboundPolicy,
    /// Whole-request timeout of outbound HTTP requests (every request of
    /// the project goes through [`HttpRemote`](crate::HttpRemote)).
    pub remote_timeout: Duration,
    /// Time an outbound HTTP request may take to open its connection.
    pub remote_connect_timeout: Duration,
    /// Largest outbound HTTP response body accepted, in bytes; a longer
    /// one fails the request.
    pub remote_max_bytes: u64,
    /// Most redirects an outbound GET follows (each hop checked against
    /// the outbound policy); POSTs follow none.
    pub remote_max_redirects: usize,
    /// The HTTP proxy of outbound requests, if any. Only this setting
    /// names one: proxy variables of the environment are never read.
    pub http_proxy: Option<HttpProxy>,
    /// Most deliveries one post may cause (a guard against routing loops
    /// that duplicate suppression cannot end, e.g. through transforms).
    pub max_forwards: usize,
    /// Most active routes one topic may have: creating one more is refused
    /// ([`ErrorKind::Forbidden`]), so that one client cannot make every
    /// post to a topic write without bound.
    pub max_routes: usize,
    /// Largest `kn_content_filter` regular expression accepted, in bytes.
    pub max_filter_bytes: usize,
    /// Most segments a topic name may have: a topic is created with all
    /// its ancestors, each announced, so one deep name would cost work
    /// growing with the square of its depth. Deeper names are refused
    /// ([`ErrorKind::BadTopic`], 400) where a topic would be created or a
    /// route made to it. A final `kn_routes`/`kn_subtopics` is not counted.
    pub max_topic_depth: usize,
    /// Longest topic name accepted, in bytes of its canonical form (as
    /// `max_topic_depth`).
    pub max_topic_bytes: usize,
    /// Most form elements (`name=value` pairs, query string and body
    /// together) one request may carry; more are refused with `413 Too
    /// many form elements` while parsing (read by `kn_cgi::Limits`).
    pub max_form_elements: usize,
    /// Most existing events a tunnel or a new route starts with
    /// (`do_max_n`, `do_max_age`, `do_since_checkpoint`): the most recent
    /// ones are kept and older ones left out, as if `do_max_n` were this
    /// (a `do_since_checkpoint` resume then reports a gap). Selection reads
    /// backwards and holds at most this many events, whatever the topic's
    /// size.
    pub max_selected: usize,
    /// How many sets of topic files a process keeps open between posts
    /// (three file descriptors each, four on a journal: its heartbeat
    /// too; up to four sets of one topic, for threads posting to it at
    /// once), so that posting again costs no `open` and no path lookup. The store
    /// raises the process's soft open-file limit to make room, within the
    /// hard limit. 0 disables it. The default ([`default_open_topics`])
    /// follows the descriptor limit, so that a server fanning out to
    /// thousands of journals keeps them all open where it may.
    pub open_topics: usize,
    /// Most replays (`kn-replay`, started by `do_method=replay` or by
    /// hand) running at once on this store, across processes: each holds
    /// one of this many slot files locked while it runs. 0 forbids
    /// replays.
    pub max_replays: usize,
    /// Longest one replay may run: `kn-replay` stops there, whatever its
    /// journal and `warp` still ask for.
    pub replay_max_time: Duration,
    /// A `kn_payload` longer than this is written once to a
    /// content-addressed blob file that every topic holding the event
    /// links to, instead of into each topic's log (FORMAT.md, "Blobs").
    /// 0 stores every payload inline.
    pub blob_bytes: usize,
}

impl Config {
    /// The defaults, with the store at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Config {
        Config {
            root: root.into(),
            reserve_bytes: 64 << 20,
            sync: SyncPolicy::None,
            max_event_bytes: 8 << 20,
            segment_bytes: 1 << 20,
            journal_max_age: Duration::from_secs(24 * 3600),
            journal_max_bytes: 64 << 20,
            expired_grace: Duration::from_secs(3600),
            poll_interval: Duration::from_millis(250),
            heartbeat_stale: Duration::from_secs(100),
            server_url: None,
            outbound: OutboundPolicy::DenyAll,
            remote_timeout: crate::http::DEFAULT_TIMEOUT,
            remote_connect_timeout: crate::http::DEFAULT_CONNECT_TIMEOUT,
            remote_max_bytes: crate::http::DEFAULT_MAX_BODY,
            remote_max_redirects: crate::http::DEFAULT_MAX_REDIRECTS,
            http_proxy: None,
            max_forwards: 100_000,
            max_routes: 10_000,
            max_filter_bytes: 4096,
            max_topic_depth: 32,
            max_topic_bytes: 1024,
            max_selected: 10_000,
            max_form_elements: 10_000,
            open_topics: default_open_topics(),
            max_replays: 8,
            replay_max_time: Duration::from_secs(3600),
            blob_bytes: 64 << 10,
        }
    }

    /// The defaults overridden by the `KN_*` environment variables; the
    /// root is `KN_EVENTS`, else `./kn_events`. A malformed variable is an
    /// error naming it.
    pub fn from_env() -> Result<Config, Error> {
        let root = std::env::var_os("KN_EVENTS").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("kn_events"));
        Config::new(root).with_env()
    }

    /// Applies the `KN_*` variables other than `KN_EVENTS` to `self`.
    pub fn with_env(mut self) -> Result<Config, Error> {
        fn var<T: std::str::FromStr>(name: &str) -> Result<Option<T>, Error> {
            match std::env::var(name) {
                Err(_) => Ok(None),
                Ok(v) => v.trim().parse::<T>().map(Some).map_err(|_| {
                    Error::new(ErrorKind::BadRequest, format!("bad value '{v}' for environment variable {name}"))
                }),
            }
        }
        if let Some(v) = var("KN_RESERVE_BYTES")? {
            self.reserve_bytes = v;
        }
        if let Ok(v) = std::env::var("KN_SYNC") {
            self.sync = v.parse()?;
        }
        if let Some(v) = var("KN_MAX_EVENT_BYTES")? {
            self.max_event_bytes = v;
        }
        if let Some(v) = var::<u64>("KN_SEGMENT_BYTES")? {
            self.segment_bytes = v.max(4096);
        }
        if let Some(v) = var("KN_JOURNAL_MAX_AGE")? {
            self.journal_max_age = Duration::from_secs(v);
        }
        if let Some(v) = var("KN_JOURNAL_MAX_BYTES")? {
            self.journal_max_bytes = v;
        }
        if let Some(v) = var("KN_EXPIRED_GRACE")? {
            self.expired_grace = Duration::from_secs(v);
        }
        if let Some(v) = var("KN_POLL_MS")? {
            self.poll_interval = Duration::from_millis(v);
        }
        if let Ok(v) = std::env::var("KN_SERVER_URL") {
            self.server_url = Some(v);
        }
        if let Ok(v) = std::env::var("KN_OUTBOUND") {
            self.outbound = v.parse()?;
        }
        if let Some(v) = var("KN_REMOTE_TIMEOUT_MS")? {
            self.remote_timeout = Duration::from_millis(v);
        }
        if let Some(v) = var("KN_REMOTE_CONNECT_TIMEOUT_MS")? {
            self.remote_connect_timeout = Duration::from_millis(v);
        }
        if let Some(v) = var("KN_REMOTE_MAX_BYTES")? {
            self.remote_max_bytes = v;
        }
        if let Some(v) = var("KN_REMOTE_MAX_REDIRECTS")? {
            self.remote_max_redirects = v;
        }
        if let Ok(v) = std::env::var("KN_HTTP_PROXY") {
            let v = v.trim();
            self.http_proxy = if v.is_empty() {
                None
            } else {
                Some(v.parse().map_err(|e: Error| {
                    Error::new(ErrorKind::BadRequest, format!("bad value for environment variable KN_HTTP_PROXY: {}", e.message()))
                })?)
            };
        }
        if let Some(v) = var("KN_OPEN_TOPICS")? {
            self.open_topics = v;
        }
        if let Some(v) = var("KN_BLOB_BYTES")? {
            self.blob_bytes = v;
        }
        if let Some(v) = var("KN_MAX_FORWARDS")? {
            self.max_forwards = v;
        }
        if let Some(v) = var("KN_MAX_ROUTES")? {
            self.max_routes = v;
        }
        if let Some(v) = var("KN_MAX_REPLAYS")? {
            self.max_replays = v;
        }
        if let Some(v) = var("KN_REPLAY_MAX_TIME")? {
            self.replay_max_time = Duration::from_secs(v);
        }
        if let Some(v) = var("KN_MAX_TOPIC_DEPTH")? {
            self.max_topic_depth = v;
        }
        if let Some(v) = var("KN_MAX_TOPIC_BYTES")? {
            self.max_topic_bytes = v;
        }
        if let Some(v) = var("KN_MAX_FORM_ELEMENTS")? {
            self.max_form_elements = v;
        }
        if let Some(v) = var("KN_MAX_SELECTED")? {
            self.max_selected = v;
        }
        Ok(self)
    }
}

/// The default of [`Config::open_topics`]: a tenth of the process's hard
/// open-file limit (the sets take four descriptors at most, so at most
/// 40% of the descriptors; `serve` gives half to connections), never
/// fewer than 1024 nor more than 100,000 (an unlimited hard limit). 2,000
/// sets under a hard limit of 20,000, 6,553 under 65,536.
///
/// ```
/// assert!(kn_journal::default_open_topics() >= 1024);
/// ```
pub fn default_open_topics() -> usize {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit only writes the struct given.
    let hard = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 { limit.rlim_max } else { 0 };
    usize::try_from(hard / 10).unwrap_or(usize::MAX).clamp(1024, 100_000)
}
