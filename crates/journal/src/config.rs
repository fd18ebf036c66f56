//! Every setting of the store, in one place.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, ErrorKind};
use crate::remote::HttpProxy;
use crate::remote::OutboundPolicy;

// The outbound client's defaults (remote_* settings; `HttpRemote::new`).
/// Default time allowed to open a connection.
pub(crate) const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Default time allowed for a whole request, from DNS lookup to the last
/// byte of the response body.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default cap on a response body.
pub(crate) const DEFAULT_MAX_BODY: u64 = 8 * 1024 * 1024;
/// Default number of redirects a GET follows.
pub(crate) const DEFAULT_MAX_REDIRECTS: usize = 5;

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

/// Whether the store is on a file system shared by several hosts (see
/// FORMAT.md, "Shared mode").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shared {
    /// Shared when the store's root is on a FUSE or NFS mount (`statfs`).
    Auto,
    /// Always shared: nothing cached across a lock release, cross-host
    /// wake-ups through `.changes`.
    On,
    /// Never shared: a local store, whatever the file system says.
    Off,
}

impl std::str::FromStr for Shared {
    type Err = Error;
    fn from_str(s: &str) -> Result<Shared, Error> {
        match s.trim() {
            "auto" => Ok(Shared::Auto),
            "on" => Ok(Shared::On),
            "off" => Ok(Shared::Off),
            other => Err(Error::new(ErrorKind::BadRequest, format!("bad shared mode '{other}': expected 'auto', 'on' or 'off'"))),
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
/// | `shared` | `auto`: shared mode on FUSE, NFS and CephFS mounts | `KN_SHARED` (`auto`/`on`/`off`) |
/// | `changes_poll` | 5 ms: how often one process per host in shared mode reads `.changes` | `KN_CHANGES_POLL_MS` |
/// | `changes_bytes` | 1 MiB: `.changes` is emptied once it is larger | `KN_CHANGES_BYTES` |
/// | `wake_addr` | none: in shared mode, the UDP address:port this host's reader of `.changes` listens on and announces in `<root>/.wake/`, so that another host's post nudges it to read at once (docs/SCALE-OUT.md, "Wake-ups") | `KN_WAKE_ADDR` |
/// | `lock_wait` | 30 s: in shared mode, the longest wait for a file's lock before the operation fails | `KN_LOCK_WAIT_MS` |
/// | `heartbeat_stale` | 100 s (PROTOCOL.md; tunnels refresh their journal's heartbeat every fifth of it, at most every 20 s) | `KN_HEARTBEAT_STALE_MS`, for tests and benchmarks that compress time (e.g. bench/soak) |
/// | `presence_debounce` | 5 s: a journal's tunnel gone this long leaves its topics' `kn_presence` (a reconnect within it is no leave); a tunnel that died without closing leaves within this plus twice `presence_pass` (docs/PRESENCE.md) | `KN_PRESENCE_DEBOUNCE_MS` |
/// | `presence_pass` | 1 s: how often a tunnel on a `kn_presence` topic looks at who is connected (the join latency) | `KN_PRESENCE_PASS_MS` (at least 10) |
/// | `server_url` | the first pinned name in `.names`, else `serve`'s, else the last learned, else `http://localhost/kn` | `KN_SERVER_URL` |
/// | `max_names` | 32 names learned from requests' `Host` (the least recently seen pushed out; pinned and `serve`'s names not counted) | `KN_MAX_NAMES` |
/// | `outbound` | `deny` | `KN_OUTBOUND` (`allow`, `deny` or URL prefixes) |
/// | `remote_timeout` | 5 s | `KN_REMOTE_TIMEOUT_MS` |
/// | `remote_connect_timeout` | 2 s | `KN_REMOTE_CONNECT_TIMEOUT_MS` |
/// | `remote_max_bytes` | 8 MiB per response body | `KN_REMOTE_MAX_BYTES` |
/// | `remote_max_redirects` | 5 (GETs only; POSTs follow none) | `KN_REMOTE_MAX_REDIRECTS` |
/// | `http_proxy` | none (`HTTP_PROXY` and the like are never read) | `KN_HTTP_PROXY` (`http://host:port`) |
/// | `max_forwards` | 100,000 deliveries per post (more: `508 Too many deliveries`) | `KN_MAX_FORWARDS` |
/// | `forward_inline` | 32 active routes: a notify to a topic with more is answered once its event is stored, and forwarded right after, many events to a journal at a time (0: always before the answer) | `KN_FORWARD_INLINE` |
/// | `group_commit` | 64 posts: the most posts of one process waiting for the same topic that are stored together, with one lock, one write and one forwarding pass (0 or 1: each post alone) | `KN_GROUP_COMMIT` |
/// | `max_routes` | 10,000 active routes per topic (more: `403`) | `KN_MAX_ROUTES` |
/// | `max_push_routes` | 16 active Web Push routes per creator (a user, or an anonymous visitor's session) in the store (more: `403`; docs/PROTOCOL.md, "Web Push (extension)") | `KN_MAX_PUSH_ROUTES` |
/// | `push_contact` | none: no Web Push routes. Read by kn-push, not `Config`: the VAPID `sub` push services may write to, a `mailto:` or `https:` URL; set, `serve` and pubsub.cgi deliver Web Push routes (docs/DEPLOY.md, "Web Push") | `KN_PUSH_CONTACT` |
/// | `push_services` | `default`: the push services of Chrome/Edge (FCM), Firefox (Mozilla autopush), Safari (Apple) and Windows (WNS). Read by kn-push: the host names (`*.` for subdomains) a push endpoint may be on, `default` and `none` as words (docs/DEPLOY.md, "Web Push") | `KN_PUSH_SERVICES` |
/// | `push_ca_file` | none: Mozilla's roots, built in. Read by kn-push: a PEM file whose certificates a push service's must chain to instead (a private push service, tests) | `KN_PUSH_CA_FILE` (a file path) |
/// | `push_test_loopback` | off. Read by kn-push, for tests only: a push endpoint may be a loopback address literal, over plain http too, or a name that resolves to loopback | `KN_PUSH_TEST_LOOPBACK` (`1`) |
/// | `max_filter_bytes` | 4 KiB per `kn_content_filter` | — |
/// | `blob_bytes` | 64 KiB: a longer `kn_payload` is stored once, in a blob file (0: never) | `KN_BLOB_BYTES` |
/// | `max_topic_depth` | 32 segments per topic name (more: `400`); at most [`MAX_TOPIC_DEPTH`](crate::MAX_TOPIC_DEPTH) (64), beyond which no name is valid anywhere | `KN_MAX_TOPIC_DEPTH` |
/// | `max_topic_bytes` | 1024 bytes per topic name (more: `400`); at most [`MAX_TOPIC_BYTES`](crate::MAX_TOPIC_BYTES) (1024) | `KN_MAX_TOPIC_BYTES` |
/// | `max_form_elements` | 10,000 form elements (`name=value` pairs) per request, query and body together (more: `413`) | `KN_MAX_FORM_ELEMENTS` |
/// | `max_selected` | 10,000 events a tunnel or new route starts with (older ones are left out) | `KN_MAX_SELECTED` |
/// | `open_topics` | sets of topic files kept open between posts (at most 4 per topic): a tenth of the hard open-file limit, at least 1024 (see [`default_open_topics`]) | `KN_OPEN_TOPICS` |
/// | `max_replays` | 8 replays (`kn-replay`) running at once per store (more: `503`) | `KN_MAX_REPLAYS` |
/// | `replay_max_time` | 1 hour per replay (then `kn-replay` stops) | `KN_REPLAY_MAX_TIME` (seconds) |
/// | `tunnel_max_time` | none (0): how long a tunnel stays open at most, then it ends as a tunnel whose `kn_expires` came does, and the client reconnects from its last checkpoint (for a web server's graceful reload: docs/DEPLOY.md, "Many open tunnels") | `KN_TUNNEL_MAX_TIME` (seconds) |
/// | `journal_grace` | 1 hour: a journal stale this much longer is removed by the sweep | `KN_JOURNAL_GRACE` (seconds) |
/// | `topic_grace` | 1 day: an empty topic untouched this long is removed by the sweep | `KN_TOPIC_GRACE` (seconds) |
/// | `tombstone_ttl` | 300 s: the expiry of a deleted route (one without `kn_expires`) and of one the sweep removes | `KN_TOMBSTONE_TTL` (seconds) |
/// | `sweep_budget` | 16 directories per sweep slice (a request's or a `serve` round's; 0: no slices) | `KN_SWEEP_BUDGET` |
/// | `sweep_threads` | 4: threads one sweep slice removes with (no more than it has topics to look at; 1 for a small server) | `KN_SWEEP_THREADS` |
/// | `sweep_interval` | 1 s between sweep slices, across processes | `KN_SWEEP_INTERVAL_MS` |
/// | `access_rules` | none: every request may do everything | `KN_ACCESS_RULES` (a file path; docs/ACCESS.md) |
/// | `forward_retries` | 12 retries of a delivery that failed transiently (local I/O error, full disk, remote 5xx or no answer) before its route is poisoned (0: poisoned at the first failure) | `KN_FORWARD_RETRIES` |
/// | `forward_backoff` | 1 s before the first retry, doubling for each next one (at most 1 hour): 12 retries span about 68 minutes | `KN_FORWARD_BACKOFF_MS` |
/// | `sse_retry` | 1 s: the `retry:` an `sse` tunnel sends, how long `EventSource` waits before reconnecting (its own default is 3 s) | `KN_SSE_RETRY_MS` |
/// | `shutdown_grace` | 5 s: on SIGTERM, `serve` ends every tunnel at once (a `503` status event, then the response's end) and exits once its connections are done, or after this long at most | `KN_SHUTDOWN_GRACE` (seconds) |
/// | `metrics_refresh` | 60 s: least time between two walks of the store's tree for `serve`'s `/metrics` size figures ([`UsageCache`](crate::UsageCache)); a scrape never walks | `KN_METRICS_REFRESH_MS` |
/// | `max_unread_after` | 30 days: the largest `kn_unread_after` of a route (more: `400`) | `KN_MAX_UNREAD_AFTER` (seconds) |
/// | `receipts_flush` | 30 s: least time between a tunnel's start and its first write of its sent position, and between two writes (docs/PRESENCE.md, "Receipts") | `KN_RECEIPTS_FLUSH_MS` |
/// | `follow` | off: routes into local journals only copy (format version 4). On: they also write windows over their sources (`S/.windows`, FORMAT.md, "Journals: windows over their sources"), which nothing reads yet (issue 39, being built) | `KN_FOLLOW` (`on`/`off`) |
/// | `receipts_max_journals` | 1024 journals read by one `do_method=receipts` (each a read of the journal back to the event, about 1.7 ms): routes past it are counted, not read (docs/PRESENCE.md, "Receipts") | `KN_RECEIPTS_MAX_JOURNALS` |
/// | `blob_grace` | 1 hour: a blob no topic or stream links is removed by the sweep once it is this old (its last link change) | `KN_BLOB_GRACE` (seconds) |
/// | `auth_max_credentials_bytes` | 1024 bytes of `user:password` in a `serve --htpasswd` request's Basic credentials (more: `400`, never hashed) | `KN_AUTH_MAX_CREDENTIALS_BYTES` |
/// | `auth_threads` | 2 password checks of `serve --htpasswd` running at once, off the event loop | `KN_AUTH_THREADS` |
/// | `auth_queue` | 64 password checks waiting for a thread (more: `503` with `Retry-After`) | `KN_AUTH_QUEUE` |
/// | `auth_cache` | 256 recent successful password checks remembered (by a keyed hash, never the password; forgotten when the htpasswd file changes) | `KN_AUTH_CACHE` |
/// | `auth_backoff_after` | 5 wrong passwords in a row from one client address before it must wait (0: no back-off) | `KN_AUTH_BACKOFF_AFTER` |
/// | `auth_backoff_max` | 60 s: the longest wait of a client backing off (1 s after `auth_backoff_after` failures, doubling with each next one); meanwhile its checks are answered `429` with `Retry-After` | `KN_AUTH_BACKOFF_MAX_MS` |
/// | `auth_backoff_clients` | 4096 client addresses whose failures are remembered (the oldest forgotten first) | `KN_AUTH_BACKOFF_CLIENTS` |
/// | `token_keys` | none: bearer tokens (docs/ACCESS.md, "Bearer tokens") are checked with these keys, `KID=ALG:PATH` entries separated by `,` (`ALG`: `HS256` with a secret key file, `RS256`, `ES256`, `EdDSA` with a PEM public key), besides the store's own HS256 key (`.token-key`, kid `store`) once `kn token` made it | `KN_TOKEN_KEYS` |
/// | `token_issuer` | none: when set, a token's `iss` must be it | `KN_TOKEN_ISSUER` |
/// | `token_audience` | none: when set, a token's `aud` must name it | `KN_TOKEN_AUDIENCE` |
/// | `token_cookie` | `kn_token`: the cookie a bearer token is read from (empty: none) | `KN_TOKEN_COOKIE` |
/// | `token_leeway` | 30 s of clock skew allowed on a token's `exp` and `nbf` | `KN_TOKEN_LEEWAY` (seconds) |
/// | `token_max_bytes` | 8192 bytes per bearer token (more: `401`, never decoded) | `KN_TOKEN_MAX_BYTES` |
/// | `token_cache` | 1024 verified bearer tokens remembered (by their SHA-256, until they expire; the oldest forgotten first; 0: none) | `KN_TOKEN_CACHE` |
/// | `body_budget_bytes` | 256 MiB of request bodies `serve` holds at once, across all requests (past it: `503` with `Retry-After`; a body larger than the whole budget: `413`) | `KN_BODY_BUDGET_BYTES` |
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
    /// Shared mode (several hosts on one network file system): see
    /// [`Shared`]. [`Store::open_with`](crate::Store::open_with) resolves
    /// `Auto` to `On` or `Off`.
    pub shared: Shared,
    /// In shared mode, how often the one process per host that reads the
    /// store's `.changes` (the host's other processes are woken by it
    /// through a local relay) reads it, to wake tunnels for appends made
    /// on other hosts: the longest extra delay of a cross-host wake-up.
    pub changes_poll: Duration,
    /// In shared mode, `.changes` is emptied (its generation bumped) by
    /// the writer that finds it larger than this.
    pub changes_bytes: u64,
    /// In shared mode, where the hosts can reach each other: the UDP
    /// address this host's reader of `.changes` listens on and announces
    /// on the volume; a post then nudges the other announced hosts to
    /// read `.changes` at once (the poll stays the fallback).
    pub wake_addr: Option<std::net::SocketAddr>,
    /// In shared mode, the longest a process waits for a lock on the
    /// volume (a topic's `.lock`, `.changes`, `.forwarded`, `.stats`,
    /// the store's `.lock`) before the operation fails with an error
    /// naming the file. It never waits in the kernel there (see
    /// `shared::lock`); a local store waits in the kernel, unbounded.
    pub lock_wait: Duration,
    /// A journal whose heartbeat is older than this is stale (PROTOCOL.md:
    /// 100 s). Tunnels refresh their journal's heartbeat every fifth of it
    /// (at most every [`HEARTBEAT_EVERY`](crate::HEARTBEAT_EVERY)). Shorter
    /// only to compress time in tests and benchmarks.
    pub heartbeat_stale: Duration,
    /// How long a journal's tunnels must be gone before a `kn_presence`
    /// reader records it as left (docs/PRESENCE.md): a reconnect within
    /// it is no leave.
    pub presence_debounce: Duration,
    /// How often a tunnel on a `kn_presence` topic compares who is
    /// connected with what the topic says (docs/PRESENCE.md).
    pub presence_pass: Duration,
    /// This server's own URL (`http://host/kn`); `None` means "from `.names`".
    pub server_url: Option<String>,
    /// Most names learned from requests (the URLs they reached the server
    /// by) that `.names` keeps; a new one pushes out the least recently
    /// seen (crate::Store::learn_names). Pinned names and `serve`'s own
    /// are not counted. 0: none learned.
    pub max_names: usize,
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
    /// Most active routes a notify forwards along before it is answered
    /// ([`Store::notify_deferring`](crate::Store::notify_deferring)): a
    /// topic with more (a fan-out to many subscribers) has its event
    /// stored and answered at once, and its forwarding completed right
    /// after, by the caller, through the outbox (FORMAT.md, "Deferred
    /// forwarding"). 0: every notify forwards before its answer.
    pub forward_inline: usize,
    /// Most posts of this process, waiting for the same topic, that are
    /// stored together (group commit: one lock of the topic, one write of
    /// all their records, one head write, one forwarding pass; FORMAT.md,
    /// "Group commit"); the rest wait for the next group. Each post is
    /// still answered for its own event. 0 or 1: every post alone.
    pub group_commit: usize,
    /// Most active routes one topic may have: creating one more is refused
    /// ([`ErrorKind::Forbidden`]), so that one client cannot make every
    /// post to a topic write without bound.
    pub max_routes: usize,
    /// Most active Web Push routes one creator may have in the store
    /// (`store/outbox_push.rs`): a push route makes this server send to a
    /// client-supplied address, so each user's share is bounded.
    pub max_push_routes: usize,
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
    /// (three file descriptors each, four on a journal, its heartbeat
    /// too, and on a routed topic, its `.forwarded` too; up to four sets
    /// of one topic, for threads posting to it at once), so that posting
    /// again costs no `open` and no path lookup. The store
    /// raises the process's soft open-file limit to make room, within the
    /// hard limit. 0 disables it. The default ([`default_open_topics`])
    /// follows the descriptor limit, so that a server fanning out to
    /// thousands of journals keeps them all open where it may. A tunnel
    /// opening keeps its journal's files while there is room, pushing no
    /// other set out. Tunnels keep the segment they read open too, up to
    /// half this many in a process (one descriptor each; none in shared
    /// mode). So a process holding N tunnels holds N descriptors (their
    /// connections) plus at most `4.5 · open_topics` for this cache: the
    /// readers' marks take one descriptor for all its tunnels.
    pub open_topics: usize,
    /// Most replays (`kn-replay`, started by `do_method=replay` or by
    /// hand) running at once on this store, across processes: each holds
    /// one of this many slot files locked while it runs. 0 forbids
    /// replays.
    pub max_replays: usize,
    /// Longest one replay may run: `kn-replay` stops there, whatever its
    /// journal and `warp` still ask for.
    pub replay_max_time: Duration,
    /// How long a tunnel stays open at most (`Duration::ZERO`: no limit).
    pub tunnel_max_time: Duration,
    /// A `kn_payload` longer than this is written once to a
    /// content-addressed blob file that every topic holding the event
    /// links to, instead of into each topic's log (FORMAT.md, "Blobs").
    /// 0 stores every payload inline.
    pub blob_bytes: usize,
    /// How long a journal stays after it went stale (its heartbeat older
    /// than `heartbeat_stale`, or missing) before the sweep removes it
    /// with its routes and announcement (FORMAT.md, "Removal").
    pub journal_grace: Duration,
    /// How long an empty topic (no current event, no active route, no
    /// subtopic) stays untouched before the sweep removes it.
    pub topic_grace: Duration,
    /// The expiry given to a route deletion that names none, and to the
    /// deletions the sweep writes: watchers of `kn_routes` see them for
    /// this long, then compaction may reclaim them (after
    /// `expired_grace`).
    pub tombstone_ttl: Duration,
    /// Most directories one sweep slice visits (each request of
    /// `pubsub.cgi` may run one, `serve` runs one per interval); 0: none.
    pub sweep_budget: usize,
    /// Threads one sweep slice looks at its queued journals and topics
    /// with, and settles its route deletions with (at least 1): removal
    /// is file-system work, and a busy server creates sessions on many
    /// threads at once; while the sweep is behind, new sessions wait for
    /// its slices, which then want all the machine can give.
    pub sweep_threads: usize,
    /// Least time between two sweep slices, across every process of the
    /// store (a slice that is not due costs one `stat`).
    pub sweep_interval: Duration,
    /// The access rules file (docs/ACCESS.md): who may post, read, route
    /// and replay where, checked for requests made through
    /// [`Store::as_user`](crate::Store::as_user). `None`: everything is
    /// allowed. At most [`MAX_RULE_LINES`](crate::access::MAX_RULE_LINES)
    /// lines.
    pub access_rules: Option<PathBuf>,
    /// How many times a delivery that failed transiently (a local I/O
    /// error, a full disk, a remote 5xx or no answer) is retried before
    /// its route is poisoned ("no answer after the retries", PROTOCOL.md
    /// 4.1); meanwhile the route is kept and its events wait in the
    /// topic's outbox. 0 poisons at the first failure.
    pub forward_retries: u32,
    /// The wait before the first retry of a failed delivery; each next
    /// retry waits twice as long (at most an hour).
    pub forward_backoff: Duration,
    /// The `retry:` an `sse` tunnel sends first: how long a browser's
    /// `EventSource` waits before reconnecting once the tunnel ends (a
    /// server restarting, `tunnel_max_time`), instead of its default 3 s.
    pub sse_retry: Duration,
    /// How long `pubsub-cgi serve` may take to stop on SIGTERM or Ctrl-C:
    /// it stops accepting, ends every tunnel with a `503` status event and
    /// the response's end (so clients reconnect at once, to the next
    /// server), lets one-shot requests finish, and exits when its
    /// connections are done or this has passed, whichever comes first.
    pub shutdown_grace: Duration,
    /// Least time between the end of one walk of the store's tree and the
    /// start of the next, for the size figures a long-lived server keeps
    /// ([`UsageCache`](crate::UsageCache), `serve`'s `/metrics`). A scrape
    /// answers the last walk's figures and never waits for one; at most
    /// one walk runs at a time, on a thread of its own.
    pub metrics_refresh: Duration,
    /// A blob (`.blobs/<hash>`) that nothing links any more is removed by
    /// the sweep once its last link change is this old (FORMAT.md,
    /// "Blobs"): a writer about to link it has long done so.
    pub blob_grace: Duration,
    /// Longest `user:password` of Basic credentials `serve --htpasswd`
    /// checks, in bytes; longer ones are refused (`400`) before any hash
    /// is computed (Apache's MD5 costs grow with the password's length).
    pub auth_max_credentials_bytes: usize,
    /// Password checks of `serve --htpasswd` running at once, each on a
    /// blocking thread, never on the event loop.
    pub auth_threads: usize,
    /// Password checks that may wait for one of `auth_threads`; past it a
    /// request is answered `503` with `Retry-After`.
    pub auth_queue: usize,
    /// Successful password checks remembered (keyed by a hash of user,
    /// password and htpasswd line, never the password itself).
    pub auth_cache: usize,
    /// Wrong passwords in a row from one client address after which it
    /// backs off (0: never).
    pub auth_backoff_after: u32,
    /// The longest back-off of one client address.
    pub auth_backoff_max: Duration,
    /// The keys bearer tokens are checked with: `KID=ALG:PATH` entries
    /// separated by `,` (docs/ACCESS.md, "Bearer tokens"); `None`: only
    /// the store's own key (`.token-key`), if `kn token` made one.
    pub token_keys: Option<String>,
    /// When set, a bearer token's `iss` claim must be this.
    pub token_issuer: Option<String>,
    /// When set, a bearer token's `aud` claim must name this.
    pub token_audience: Option<String>,
    /// The cookie a bearer token is read from (empty: none is read).
    pub token_cookie: String,
    /// The clock skew allowed on a token's `exp` and `nbf`.
    pub token_leeway: Duration,
    /// The longest bearer token looked at, in bytes; a longer one is
    /// refused (`401`) without being decoded.
    pub token_max_bytes: usize,
    /// Verified bearer tokens remembered (by their SHA-256) so that a
    /// token presented again costs no signature check (0: none).
    pub token_cache: usize,
    /// Client addresses whose failures are remembered at once.
    pub auth_backoff_clients: usize,
    /// Bytes of request bodies `serve` holds at once across all requests.
    pub body_budget_bytes: u64,
    /// The largest `kn_unread_after` a route may ask for (more: `400`):
    /// how long an escalation's state must be kept at most
    /// (docs/PRESENCE.md, "Receipts").
    pub max_unread_after: Duration,
    /// Least time between a tunnel's start and its first write of its
    /// sent position to its journal's `.receipts`, and between two writes
    /// (the last one is written when the tunnel ends): the cost a tunnel
    /// adds to the disk is bounded by it, whatever its rate of events.
    pub receipts_flush: Duration,
    /// The most journals one `do_method=receipts` reads ([`Store::receipts`](crate::Store::receipts));
    /// the topic's routes past it are counted, not read: the work of one
    /// request is bounded whatever the number of routes.
    pub receipts_max_journals: usize,
    /// Routes into local journals write windows over their sources as
    /// well as copies (issue 39, docs/design/one-copy.md, being built):
    /// off until journals are read as views.
    pub follow: bool,
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
            presence_debounce: Duration::from_secs(5),
            presence_pass: Duration::from_secs(1),
            shared: Shared::Auto,
            changes_poll: Duration::from_millis(5),
            changes_bytes: 1 << 20,
            wake_addr: None,
            lock_wait: Duration::from_secs(30),
            server_url: None,
            max_names: 32,
            outbound: OutboundPolicy::DenyAll,
            remote_timeout: DEFAULT_TIMEOUT,
            remote_connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            remote_max_bytes: DEFAULT_MAX_BODY,
            remote_max_redirects: DEFAULT_MAX_REDIRECTS,
            http_proxy: None,
            max_forwards: 100_000,
            forward_inline: 32,
            group_commit: 64,
            max_routes: 10_000,
            max_push_routes: 16,
            max_filter_bytes: 4096,
            max_topic_depth: 32,
            max_topic_bytes: 1024,
            max_selected: 10_000,
            max_form_elements: 10_000,
            open_topics: default_open_topics(),
            max_replays: 8,
            replay_max_time: Duration::from_secs(3600),
            tunnel_max_time: Duration::ZERO,
            blob_bytes: 64 << 10,
            journal_grace: Duration::from_secs(3600),
            topic_grace: Duration::from_secs(24 * 3600),
            tombstone_ttl: Duration::from_secs(300),
            sweep_budget: 16,
            sweep_threads: 4,
            sweep_interval: Duration::from_secs(1),
            access_rules: None,
            forward_retries: 12,
            forward_backoff: Duration::from_secs(1),
            sse_retry: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(5),
            metrics_refresh: Duration::from_secs(60),
            blob_grace: Duration::from_secs(3600),
            max_unread_after: Duration::from_secs(30 * 24 * 3600),
            receipts_flush: Duration::from_secs(30),
            receipts_max_journals: 1024,
            follow: false,
            auth_max_credentials_bytes: 1024,
            auth_threads: 2,
            auth_queue: 64,
            auth_cache: 256,
            auth_backoff_after: 5,
            auth_backoff_max: Duration::from_secs(60),
            auth_backoff_clients: 4096,
            body_budget_bytes: 256 << 20,
            token_keys: None,
            token_issuer: None,
            token_audience: None,
            token_cookie: "kn_token".to_string(),
            token_leeway: Duration::from_secs(30),
            token_max_bytes: 8192,
            token_cache: 1024,
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
        use env_setting as var;
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
        if let Ok(v) = std::env::var("KN_SHARED") {
            self.shared = v.parse()?;
        }
        if let Some(v) = var::<u64>("KN_CHANGES_POLL_MS")? {
            self.changes_poll = Duration::from_millis(v.max(1));
        }
        if let Some(v) = var::<u64>("KN_CHANGES_BYTES")? {
            self.changes_bytes = v.max(4096);
        }
        if let Some(v) = var::<std::net::SocketAddr>("KN_WAKE_ADDR")? {
            self.wake_addr = Some(v);
        }
        if let Some(v) = var::<u64>("KN_LOCK_WAIT_MS")? {
            self.lock_wait = Duration::from_millis(v);
        }
        if let Ok(v) = std::env::var("KN_SERVER_URL") {
            self.server_url = Some(v);
        }
        if let Some(v) = var("KN_MAX_NAMES")? {
            self.max_names = v;
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
        if let Some(v) = var("KN_FORWARD_INLINE")? {
            self.forward_inline = v;
        }
        if let Some(v) = var("KN_GROUP_COMMIT")? {
            self.group_commit = v;
        }
        if let Some(v) = var("KN_MAX_ROUTES")? {
            self.max_routes = v;
        }
        if let Some(v) = var("KN_MAX_PUSH_ROUTES")? {
            self.max_push_routes = v;
        }
        if let Some(v) = var("KN_MAX_REPLAYS")? {
            self.max_replays = v;
        }
        if let Some(v) = var("KN_REPLAY_MAX_TIME")? {
            self.replay_max_time = Duration::from_secs(v);
        }
        if let Some(v) = var("KN_TUNNEL_MAX_TIME")? {
            self.tunnel_max_time = Duration::from_secs(v);
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
        if let Some(v) = std::env::var_os("KN_ACCESS_RULES") {
            self.access_rules = Some(PathBuf::from(v)).filter(|p| !p.as_os_str().is_empty());
        }
        if let Some(v) = var("KN_MAX_SELECTED")? {
            self.max_selected = v;
        }
        if let Some(v) = var::<u64>("KN_PRESENCE_DEBOUNCE_MS")? {
            self.presence_debounce = Duration::from_millis(v);
        }
        if let Some(v) = var::<u64>("KN_PRESENCE_PASS_MS")? {
            self.presence_pass = Duration::from_millis(v.max(10));
        }
        if let Some(v) = var::<u64>("KN_HEARTBEAT_STALE_MS")? {
            self.heartbeat_stale = Duration::from_millis(v.max(1));
        }
        if let Some(v) = var("KN_JOURNAL_GRACE")? {
            self.journal_grace = Duration::from_secs(v);
        }
        if let Some(v) = var("KN_TOPIC_GRACE")? {
            self.topic_grace = Duration::from_secs(v);
        }
        if let Some(v) = var("KN_TOMBSTONE_TTL")? {
            self.tombstone_ttl = Duration::from_secs(v);
        }
        if let Some(v) = var("KN_SWEEP_BUDGET")? {
            self.sweep_budget = v;
        }
        if let Some(v) = var("KN_SWEEP_THREADS")? {
            self.sweep_threads = v;
        }
        if let Some(v) = var("KN_SWEEP_INTERVAL_MS")? {
            self.sweep_interval = Duration::from_millis(v);
        }
        if let Some(v) = var("KN_FORWARD_RETRIES")? {
            self.forward_retries = v;
        }
        if let Some(v) = var("KN_FORWARD_BACKOFF_MS")? {
            self.forward_backoff = Duration::from_millis(v);
        }
        if let Some(v) = var("KN_SSE_RETRY_MS")? {
            self.sse_retry = Duration::from_millis(v);
        }
        if let Some(v) = var("KN_SHUTDOWN_GRACE")? {
            self.shutdown_grace = Duration::from_secs(v);
        }
        if let Some(v) = var("KN_METRICS_REFRESH_MS")? {
            self.metrics_refresh = Duration::from_millis(v);
        }
        if let Some(v) = var("KN_BLOB_GRACE")? {
            self.blob_grace = Duration::from_secs(v);
        }
        if let Some(v) = var("KN_MAX_UNREAD_AFTER")? {
            self.max_unread_after = Duration::from_secs(v);
        }
        if let Some(v) = var("KN_RECEIPTS_FLUSH_MS")? {
            self.receipts_flush = Duration::from_millis(v);
        }
        if let Some(v) = var::<usize>("KN_RECEIPTS_MAX_JOURNALS")? {
            self.receipts_max_journals = v;
        }
        if let Ok(v) = std::env::var("KN_FOLLOW") {
            self.follow = match v.trim() {
                "on" => true,
                "off" => false,
                other => return Err(Error::new(ErrorKind::BadRequest, format!("bad value for environment variable KN_FOLLOW: '{other}': expected 'on' or 'off'"))),
            };
        }
        if let Some(v) = var("KN_AUTH_MAX_CREDENTIALS_BYTES")? {
            self.auth_max_credentials_bytes = v;
        }
        if let Some(v) = var::<usize>("KN_AUTH_THREADS")? {
            self.auth_threads = v.max(1);
        }
        if let Some(v) = var("KN_AUTH_QUEUE")? {
            self.auth_queue = v;
        }
        if let Some(v) = var("KN_AUTH_CACHE")? {
            self.auth_cache = v;
        }
        if let Some(v) = var("KN_AUTH_BACKOFF_AFTER")? {
            self.auth_backoff_after = v;
        }
        if let Some(v) = var("KN_AUTH_BACKOFF_MAX_MS")? {
            self.auth_backoff_max = Duration::from_millis(v);
        }
        if let Some(v) = var("KN_AUTH_BACKOFF_CLIENTS")? {
            self.auth_backoff_clients = v;
        }
        if let Some(v) = var("KN_BODY_BUDGET_BYTES")? {
            self.body_budget_bytes = v;
        }
        if let Some(v) = var::<String>("KN_TOKEN_KEYS")? {
            self.token_keys = Some(v).filter(|v| !v.trim().is_empty());
        }
        if let Some(v) = var::<String>("KN_TOKEN_ISSUER")? {
            self.token_issuer = Some(v).filter(|v| !v.is_empty());
        }
        if let Some(v) = var::<String>("KN_TOKEN_AUDIENCE")? {
            self.token_audience = Some(v).filter(|v| !v.is_empty());
        }
        if let Some(v) = var::<String>("KN_TOKEN_COOKIE")? {
            self.token_cookie = v;
        }
        if let Some(v) = var("KN_TOKEN_LEEWAY")? {
            self.token_leeway = Duration::from_secs(v);
        }
        if let Some(v) = var("KN_TOKEN_MAX_BYTES")? {
            self.token_max_bytes = v;
        }
        if let Some(v) = var("KN_TOKEN_CACHE")? {
            self.token_cache = v;
        }
        Ok(self)
    }
}

/// The environment variable `name` parsed as a `T` (surrounding blanks
/// ignored): `None` when it is not set, an error naming it when it does
/// not parse. Every `KN_*` setting is read with it, here and by the
/// crates beside the core (`kn_streams::StreamsConfig`).
///
/// ```
/// assert_eq!(kn_journal::internal::env_setting::<u64>("KN_NO_SUCH_SETTING").unwrap(), None);
/// ```
pub fn env_setting<T: std::str::FromStr>(name: &str) -> Result<Option<T>, Error> {
    match std::env::var(name) {
        Err(_) => Ok(None),
        Ok(v) => v
            .trim()
            .parse::<T>()
            .map(Some)
            .map_err(|_| Error::new(ErrorKind::BadRequest, format!("bad value '{v}' for environment variable {name}"))),
    }
}

/// The default of [`Config::open_topics`]: a tenth of the process's hard
/// open-file limit (the sets take four descriptors at most, so at most
/// 40% of the descriptors; `serve` gives half to connections), never
/// fewer than 1024 nor more than 100,000 (an unlimited hard limit). 2,000
/// sets under a hard limit of 20,000, 6,553 under 65,536.
///
/// ```
/// assert!(kn_journal::internal::default_open_topics() >= 1024);
/// ```
pub fn default_open_topics() -> usize {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit only writes the struct given.
    let hard = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 { limit.rlim_max } else { 0 };
    usize::try_from(hard / 10).unwrap_or(usize::MAX).clamp(1024, 100_000)
}
