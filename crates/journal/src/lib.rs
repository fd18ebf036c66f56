//! kn-journal: a durable publish/subscribe event store on plain files,
//! with every rule of the mod_pubsub protocol.
//!
//! Events are posted to *topics* (`/what/chat`) and kept in a directory
//! tree, `kn_events`, of append-only, checksummed log files
//! (`FORMAT.md` beside this crate describes them byte by byte). There is no
//! daemon and no shared memory: any number of threads and processes open
//! the same directory and post, read, route and follow topics at once,
//! and what one writes the others see. It is the store behind knpubsub's
//! `pubsub.cgi`, its built-in server and its command-line tools; this page
//! is for using it in a program of your own.
//!
//! The vocabulary is the protocol's (PROTOCOL.md): an [`Event`] is a set
//! of named byte strings (`kn_payload`, `kn_id`, anything else); an
//! ordinary [`Topic`] keeps the current event of each `kn_id` (posting the
//! same id again replaces it, posting the same event again is a
//! duplicate), a *journal* (a topic whose last segment is `kn_journal`)
//! keeps every post while a client follows it (a journal no tunnel has
//! read for 100 s is stale: a post to it fails with
//! [`ErrorKind::Expired`], and the sweep later removes it); a *route* copies
//! what is posted to one topic into another; a *tunnel* follows a topic as
//! events arrive.
//!
//! # Opening a store
//!
//! [`Store::open`] opens the store in a directory, creating it if needed,
//! with the default settings; [`Store::open_with`] takes a [`Config`],
//! whose [`Config::from_env`] reads the `KN_*` variables the server
//! reads, so that a tool sees the store as the server does.
//!
//! ```
//! use kn_journal::{Config, Store};
//!
//! let dir = tempfile::tempdir()?;
//! let store = Store::open(dir.path().join("kn_events"))?;
//! assert!(store.root().is_dir());
//!
//! // The same directory with the server's settings (KN_SYNC and the
//! // others, when set) and no free-space reserve.
//! let mut config = Config::new(dir.path().join("kn_events")).with_env()?;
//! config.reserve_bytes = 0;
//! let again = Store::open_with(config)?;
//! assert_eq!(again.root(), store.root());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Posting
//!
//! [`Store::notify`] stores an event and forwards it along the topic's
//! routes before it returns; the [`PostReport`] says what was written
//! where. An event without `kn_id` gets a fresh one.
//!
//! ```
//! use kn_journal::{Event, Store, Topic};
//!
//! let dir = tempfile::tempdir()?;
//! let store = Store::open(dir.path())?;
//! let chat = Topic::parse("/what/chat")?;
//!
//! let mut e = Event::new();
//! e.set("kn_id", "m1").set("kn_payload", "hello").set("from", "anna");
//! let report = store.notify(&chat, e.clone())?;
//! assert_eq!(report.id, b"m1");
//! assert!(!report.duplicate);
//!
//! // The same event again is a duplicate on an ordinary topic: not stored.
//! assert!(store.notify(&chat, e)?.duplicate);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Reading
//!
//! [`Store::events`] returns a topic's events, oldest first, chosen by a
//! [`Selection`]: [`Selection::all`], the newest `max_n`, those of the
//! last `max_age` seconds, or those after a checkpoint. Each event comes
//! with its `kn_route_checkpoint`, from which a reader resumes where it
//! stopped. ([`Selection::none`] selects no existing event: it is what a
//! tunnel or route opened for new events only starts with.)
//!
//! ```
//! use kn_journal::{Event, Selection, Store, Topic};
//!
//! let dir = tempfile::tempdir()?;
//! let store = Store::open(dir.path())?;
//! let log = Topic::parse("/what/log")?;
//! for text in ["one", "two", "three"] {
//!     // Each without kn_id: a fresh id each, so all three are kept.
//!     store.notify(&log, Event::from_pairs([("kn_payload", text)]))?;
//! }
//!
//! let all = store.events(&log, &Selection::all())?.events;
//! assert_eq!(all.iter().map(|e| e.payload()).collect::<Vec<_>>(), [&b"one"[..], b"two", b"three"]);
//!
//! let newest = Selection { max_n: Some(1), ..Selection::none() };
//! assert_eq!(store.events(&log, &newest)?.events[0].payload(), b"three");
//!
//! // Resume after the first event's checkpoint.
//! let checkpoint = all[0].get("kn_route_checkpoint").unwrap().to_vec();
//! let after = Selection { since_checkpoint: Some(checkpoint), ..Selection::none() };
//! assert_eq!(store.events(&log, &after)?.events.len(), 2);
//!
//! assert!(store.events(&log, &Selection::none())?.events.is_empty());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Following a topic from another thread
//!
//! [`Store::tunnel`] opens a [`Tunnel`]: the selected existing events
//! first, then [`Tunnel::wait`] returns new ones as they are stored, by
//! this process or any other (woken by inotify on a local disk within a
//! millisecond; by polling every [`Config::poll_interval`] where there is
//! none). A [`Store`] is `Send` and `Sync`: share it by reference or in an
//! `Arc`. Servers on an async runtime use [`Tunnel::listen`] and
//! [`Tunnel::next`] instead of the blocking `wait`.
//!
//! ```
//! use std::time::Duration;
//! use kn_journal::{Event, Selection, Store, Topic};
//!
//! let dir = tempfile::tempdir()?;
//! let store = Store::open(dir.path())?;
//! let chat = Topic::parse("/what/chat")?;
//! let mut tunnel = store.tunnel(&chat, &Selection::none())?.tunnel;
//!
//! std::thread::scope(|s| {
//!     let reader = s.spawn(|| {
//!         let mut seen = Vec::new();
//!         while seen.len() < 3 {
//!             for e in tunnel.wait(&store, Duration::from_secs(10)).unwrap() {
//!                 seen.push(e.payload().to_vec());
//!             }
//!         }
//!         seen
//!     });
//!     for n in 1..=3 {
//!         let e = Event::from_pairs([("kn_payload", format!("event {n}"))]);
//!         store.notify(&chat, e).unwrap();
//!     }
//!     assert_eq!(reader.join().unwrap(), [b"event 1", b"event 2", b"event 3"]);
//! });
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Routes
//!
//! [`Store::route`] makes a topic's posts flow into another topic (or,
//! when the [`Config::outbound`] policy allows it, to another server's
//! URL); the copies carry `kn_route_id` and `kn_routed_from`. A route can
//! start with existing events (`do_max_n`, `do_max_age`), filter them
//! (`kn_content_filter`), expire (`kn_expires`); [`Store::delete_route`]
//! ends it, and [`Store::routes`] lists the active ones.
//!
//! ```
//! use kn_journal::{Event, Selection, Store, Topic};
//!
//! let dir = tempfile::tempdir()?;
//! let store = Store::open(dir.path())?;
//! let chat = Topic::parse("/what/chat")?;
//! let inbox = Topic::parse("/who/anna/inbox")?;
//!
//! // Route everything posted to /what/chat into /who/anna/inbox.
//! let mut route = Event::new();
//! route.set("kn_id", "r1");
//! store.route(&chat, b"/who/anna/inbox", route)?;
//!
//! let mut e = Event::new();
//! e.set("kn_payload", "hello");
//! let report = store.notify(&chat, e)?;
//! assert!(report.writes.iter().any(|w| w.topic == inbox));
//!
//! let got = store.events(&inbox, &Selection::all())?.events;
//! assert_eq!(got[0].payload(), b"hello");
//! assert_eq!(got[0].get("kn_route_id"), Some(&b"r1"[..]));
//!
//! store.delete_route(&chat, b"r1", None)?;
//! assert!(store.routes(&chat)?.is_empty());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # The settings that matter
//!
//! Every setting is a field of [`Config`] with a `KN_*` environment
//! variable; the defaults suit a server. Those an embedder most often
//! changes:
//!
//! | field | default | what for |
//! |---|---|---|
//! | [`root`](Config::root) | `./kn_events` (`KN_EVENTS`) | where the store is |
//! | [`sync`](Config::sync) | [`SyncPolicy::None`] (`KN_SYNC`) | `Always`: `fdatasync` before a post returns, so an acknowledged event survives a power cut; `None` survives any process crash, not a power cut |
//! | [`reserve_bytes`](Config::reserve_bytes) | 64 MiB | posts fail ([`ErrorKind::DiskFull`]) when the file system has less free space, so a full disk never truncates the store |
//! | [`max_event_bytes`](Config::max_event_bytes) | 8 MiB | largest event |
//! | [`journal_max_age`](Config::journal_max_age), [`journal_max_bytes`](Config::journal_max_bytes) | 1 day, 64 MiB | a journal's retention |
//! | [`server_url`](Config::server_url) | from `.names` | which absolute URLs name topics of this store |
//! | [`outbound`](Config::outbound) | deny | which other servers routes may deliver to |
//! | [`access_rules`](Config::access_rules) | none | who may do what ([`access`]; servers use [`Store::as_user`]) |
//!
//! ```
//! use kn_journal::{Config, Store, SyncPolicy};
//!
//! let dir = tempfile::tempdir()?;
//! let mut config = Config::new(dir.path());
//! config.sync = SyncPolicy::Always;
//! config.max_event_bytes = 64 << 10;
//! let store = Store::open_with(config)?;
//! assert_eq!(store.config().sync, SyncPolicy::Always);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What is safe across processes
//!
//! * **Any number of processes and threads** may open one store and post,
//!   read, route and tunnel at once: a CGI process per request, a server,
//!   cron jobs and your tool, side by side. Writers of a topic take a
//!   `flock` on that topic's lock file, one topic at a time; readers and
//!   tunnels never lock. One process may open a store more than once.
//! * **A reader never sees half an event.** Every record is framed and
//!   checksummed; a process killed in the middle of a post leaves bytes
//!   that no reader returns and the next writer repairs.
//! * **A tunnel wakes for any process's post** (inotify on a local disk;
//!   on a FUSE or NFS mount, the store switches to shared mode by itself,
//!   see [`Config::shared`] and `FORMAT.md`, "Shared mode").
//! * **Not safe**: changing files under the root by other means than this
//!   crate (or the `kn` tool), or removing the root while processes use
//!   it.
//!
//! ```
//! use kn_journal::{Event, Selection, Store, Topic};
//!
//! let dir = tempfile::tempdir()?;
//! // Two stores on one directory, as two processes would have.
//! let writer = Store::open(dir.path())?;
//! let reader = Store::open(dir.path())?;
//! let topic = Topic::parse("/what/shared")?;
//! writer.notify(&topic, Event::from_pairs([("kn_payload", "seen by all")]))?;
//! assert_eq!(reader.events(&topic, &Selection::all())?.events[0].payload(), b"seen by all");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # File modes
//!
//! A web server and the tools that feed it usually run as different users
//! sharing a group. So that each can write what another created,
//! [`Store::open`] creates the root, and the store every topic directory,
//! with mode `2775` (setgid: new files take the directory's group), and
//! its data files with mode `0664`, **whatever the process's umask**: the
//! modes are set explicitly. A few small bookkeeping files (the `.names`
//! list, a journal's `.heartbeat`) follow the umask; give the processes a
//! umask of `002` (docs/DEPLOY.md, "The event store and its permissions").
//!
//! ```
//! use std::os::unix::fs::PermissionsExt;
//! use kn_journal::{Event, Store, Topic};
//!
//! let dir = tempfile::tempdir()?;
//! let root = dir.path().join("kn_events");
//! // Even under the strictest umask:
//! let old = unsafe { libc::umask(0o077) };
//! let store = Store::open(&root)?;
//! store.notify(&Topic::parse("/what/chat")?, Event::from_pairs([("kn_payload", "hi")]))?;
//! unsafe { libc::umask(old) };
//!
//! let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
//! assert_eq!(mode(&root), 0o2775);
//! let chat = root.join("what/chat");
//! assert_eq!(mode(&chat), 0o2775);
//! for file in std::fs::read_dir(&chat)? {
//!     let path = file?.path();
//!     if path.is_file() {
//!         assert_eq!(mode(&path), 0o664, "{}", path.display());
//!     }
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Errors
//!
//! Every failure is an [`Error`] whose [`Error::kind`] says what went
//! wrong in the protocol's terms ([`ErrorKind::status`] is the HTTP status
//! a server answers with) and whose message names the input or file.
//!
//! ```
//! use kn_journal::{ErrorKind, Topic};
//!
//! let err = Topic::parse("/what/../etc").unwrap_err();
//! assert_eq!(err.kind(), ErrorKind::BadTopic);
//! assert_eq!(err.kind().status().0, 400);
//! assert_eq!(err.to_string(), "bad topic name '/what/../etc': segment '..' starts or ends with '.'");
//! ```
//!
//! # What is stable
//!
//! kn-journal follows semantic versioning (while at 0.x, a change of the
//! minor version, 0.1 to 0.2, may break the API; a patch release never
//! does) for what this page lists, and nothing else:
//!
//! * **The store**: [`Store`] ([`open`](Store::open),
//!   [`open_with`](Store::open_with), [`notify`](Store::notify),
//!   [`events`](Store::events), [`tunnel`](Store::tunnel),
//!   [`route`](Store::route), [`delete_route`](Store::delete_route),
//!   [`routes`](Store::routes), [`sweep`](Store::sweep),
//!   [`compact`](Store::compact), [`verify`](Store::verify),
//!   [`as_user`](Store::as_user),
//!   [`root`](Store::root), [`config`](Store::config)) and what those
//!   return: [`PostReport`], [`Write`], [`Poisoned`], [`RouteReport`],
//!   [`Route`], [`Selected`], [`Resume`], [`TunnelStart`], [`Tunnel`],
//!   [`SweepReport`], [`VerifyReport`], [`VerifyProblem`],
//!   [`CompactReport`].
//! * **The protocol's vocabulary**: [`Topic`] and its reserved segments
//!   ([`JOURNAL_SEGMENT`], [`ROUTES_SEGMENT`], [`SUBTOPICS_SEGMENT`],
//!   [`PRESENCE_SEGMENT`]) and limits ([`MAX_TOPIC_DEPTH`],
//!   [`MAX_TOPIC_BYTES`], [`MAX_SEGMENT_BYTES`]); [`Event`] and the
//!   element names ([`KN_PAYLOAD`], [`KN_ID`], [`KN_TIME_T`],
//!   [`KN_EXPIRES`], [`KN_ROUTE_CHECKPOINT`], [`KN_ROUTE_ID`],
//!   [`KN_ROUTE_LOCATION`], [`KN_ROUTED_FROM`], [`STATUS`]);
//!   [`Selection`]; [`fresh_id`].
//! * **Settings and errors**: [`Config`] (its fields and `KN_*`
//!   variables: fields may be added in a minor version, so build one with
//!   [`Config::new`] or [`Config::from_env`] and set fields, as above),
//!   [`SyncPolicy`], [`Shared`], [`OutboundPolicy`], [`HttpProxy`];
//!   [`Error`], [`ErrorKind`] (non-exhaustive in spirit: match with a `_`
//!   arm), [`Result`].
//! * **Access control**: the [`access`] module ([`access::Rules`],
//!   [`access::Principal`], [`access::AsUser`]).
//! * **Outbound deliveries**: the [`Remote`] trait and [`RemoteReply`];
//!   [`HttpRemote`] and [`HttpRemoteBuilder`] with the default feature
//!   `http`.
//! * **The files**: the store's on-disk format (`FORMAT.md` beside this
//!   crate) is read by every later version; a version that changes it says
//!   so in `CHANGELOG.md` and reads the older files.
//!
//! Everything else the crate compiles is for the programs of the knpubsub
//! workspace (the server, its tools, Durable Streams, tests and benches):
//! the `#[doc(hidden)]` module `internal` (the record encoding, the
//! server's names, counters and metrics, the logs Durable Streams keeps,
//! mount checks) and the [`Store`] methods these pages do not list above
//! (a server's event loop, deferred forwarding, receipts, presence,
//! administration). They are documented for the workspace's readers and
//! may change in any release; an embedder that needs one asks for it to be
//! made stable. `CHANGELOG.md` beside this crate records each change.
//!
//! # What else is here
//!
//! * [`access`]: access rules (who may post, read, route where) and
//!   [`Store::as_user`], the checked API a server calls with its user.
//! * Durable Streams (an HTTP streaming protocol) on the same store: the
//!   `kn-streams` crate of this workspace.
//! * [`HttpRemote`]: the one outbound HTTP client (remote routes, content
//!   transforms), under the [`OutboundPolicy`].
//! * Maintenance: [`Store::sweep`] (stale journals and empty topics),
//!   compaction, verification and repair ([`Store::verify`]).
//!
//! # For contributors: where things live
//!
//! (docs/ARCHITECTURE.md has the whole project's map.)
//!
//! Data flows one way: [`Store`] -> `log` -> files; nothing below imports
//! anything above it. `lib.rs` re-exports the stable API at the root and
//! the rest in `internal`; a new public item goes into `internal` unless
//! it is meant to be stable (then it is listed above and in
//! `CHANGELOG.md`).
//!
//! * `store/mod.rs`: [`Store`] itself: opening, configuration, server names
//!   (from configuration and `.names`, never from requests) and
//!   `Store::resolve`, topic directories and their size limits, the cache
//!   of kept topic files, `raise_open_file_limit`.
//! * `store/post.rs`: [`Store::notify`] / `Store::post`: the job queue,
//!   storing an event, `kn_subtopics` announcements, forwarding, poisoning.
//! * `store/nowait.rs`: `Store::notify_nowait`, a notify made without
//!   waiting for any lock (a server's event loop), routes and all when its
//!   forwarding is the simple kind; anything else is left untouched.
//! * `store/routes.rs`: [`Store::route`], [`Store::delete_route`], [`Route`],
//!   route limits, destinations and content filters (compiled once per
//!   kept route list).
//! * `store/read.rs`: [`Store::events`], [`Selection`] (read backwards,
//!   held to `max_selected` for tunnels and new routes), resuming at a
//!   checkpoint, [`Store::tunnel`] and [`Tunnel`].
//! * `store/lifecycle.rs`: topics, compaction, verify and repair, journal
//!   heartbeats and expiry.
//! * `store/sweep.rs`: [`Store::sweep`] (a bounded slice) and
//!   `Store::sweep_all` ([`SweepReport`]): stale journals removed with
//!   the routes into them and their announcement, empty topics pruned;
//!   `store/sweep_extra.rs`: the rest of a slice (orphan blobs, and the
//!   pass a layer above registers: expired streams).
//! * `store/admin.rs`: tools' APIs: `TopicStat`, restore, setting a
//!   heartbeat.
//! * `log/`: one topic's files, knowing nothing of the store: `segment`
//!   (names, scans, reads, `LogCursor`), `head` (the `.head` and its
//!   `kn_id` index), `writer` (the locked appender), `compact`
//!   ([`CompactReport`], retention), `verify`, `blob` (large payloads
//!   stored once in the root's `.blobs/`, hard-linked into each topic
//!   that holds them; readers put them back), `blob_gc` (the sweep's
//!   bounded pass removing orphan blobs past their grace).
//! * `logs.rs` (`internal::logs`): the face of `log` and `watch` for a
//!   layer that keeps logs of its own in the store (Durable Streams, the
//!   `kn-streams` crate); nothing in this crate imports it.
//! * `watch.rs`: the process-wide change notifier that wakes tunnels.
//! * `stats.rs`: `Counters` of the sweep, the outbox and poisoned routes,
//!   shared by every process in the root's `.stats`. `metrics.rs`: the
//!   Prometheus text format (`Exposition`). `usage.rs`: the store's size
//!   from one walk (`Usage`) and a server's cache of it (`UsageCache`).
//! * `access/`: [`access`] control: the rules file ([`access::Rules`]),
//!   who asks ([`access::Principal`]), the checked request API
//!   ([`access::AsUser`], from [`Store::as_user`]), what a reader is shown
//!   ([`access::Rules::may_see`]) and anonymous visitors' sessions
//!   ([`access::SessionKey`]).
//! * `record.rs`: the record encoding; `event.rs`: [`Event`] and the `kn_`
//!   names; `topic.rs`: [`Topic`]; `config.rs`: [`Config`]; `remote.rs`:
//!   what a remote delivery is ([`Remote`]) and the outbound policy;
//!   `http.rs`: the one HTTP client, the default feature `http` (without
//!   it remote deliveries are refused); `error.rs`: [`Error`]; `ids.rs`:
//!   the clock (`now`) and [`fresh_id`].
//!
//! Every outbound HTTP request of the project (remote route deliveries,
//! content transforms, sensor posts, `kn-replay`, `kn-feed`) goes through
//! one client, [`HttpRemote`] (`http.rs`), made from the [`Config`]: its
//! timeouts, response size limit and proxy (`KN_HTTP_PROXY`, never a proxy
//! variable of the environment), no redirects for POSTs, canonical header
//! names. Which URLs it may reach is the [`OutboundPolicy`] (`remote.rs`).
//!
#![deny(missing_docs)]

/// The examples of README.md, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

pub mod access;
mod changes;
mod config;
mod error;
mod event;
#[cfg(feature = "http")]
mod http;
mod ids;
mod log;
mod logs;
mod metrics;
mod push;
mod record;
mod remote;
mod shared;
mod stats;
mod store;
mod topic;
mod usage;
mod watch;

// The stable API (see "What is stable" above).
pub use config::{Config, Shared, SyncPolicy};
pub use error::{Error, ErrorKind, Result};
pub use event::{Event, KN_EXPIRES, KN_ID, KN_PAYLOAD, KN_ROUTED_FROM, KN_ROUTE_CHECKPOINT, KN_ROUTE_ID, KN_ROUTE_LOCATION, KN_TIME_T, STATUS};
#[cfg(feature = "http")]
pub use http::{HttpRemote, HttpRemoteBuilder};
pub use ids::fresh_id;
pub use log::CompactReport;
pub use remote::{HttpProxy, OutboundPolicy, Remote, RemoteReply};
pub use store::{
    Poisoned, PostReport, Resume, Route, RouteReport, Selected, Selection, Store, SweepReport, Tunnel, TunnelStart, VerifyProblem,
    VerifyReport, Write,
};
pub use topic::{Topic, JOURNAL_SEGMENT, MAX_SEGMENT_BYTES, MAX_TOPIC_BYTES, MAX_TOPIC_DEPTH, PRESENCE_SEGMENT, ROUTES_SEGMENT, SUBTOPICS_SEGMENT};

// This crate's own code names the internal items from the root as well
// (`crate::now`), as it did before they moved out of the public root.
#[allow(unused_imports)]
pub(crate) use internal::*;

/// What the other crates of the knpubsub workspace (kn-cgi, kn-sensors,
/// kn-streams, kn-wire, the tests, benches and fuzz targets) use beyond the
/// stable API: the record encoding, the server's names and counters, the
/// metrics exposition, the logs of one's own that kn-streams keeps, mount
/// checks and the like.
///
/// **Not part of the stable API**: anything here may change or go in any
/// release, a patch release included. An embedder that needs one of these
/// asks for it to be made stable instead.
#[doc(hidden)]
pub mod internal {
    pub use crate::changes::CHANGES_FILE;
    pub use crate::config::{default_open_topics, env_setting};
    pub use crate::event::{
        decode_escapes, format_time, is_hop_by_hop, parse_expires, KN_PRESENCE, KN_PRESENCE_JOURNAL, KN_PRESENCE_LEFT, KN_PRESENCE_ROUTE,
        KN_PRESENCE_SINCE,
    };
    pub use crate::ids::now;
    pub use crate::log::LogCursor;
    pub use crate::metrics::{Exposition, PROMETHEUS_CONTENT_TYPE};
    pub use crate::push::{is_push_destination, Push, PushAnswer, PUSH_PREFIX};
    pub use crate::record::{decode as decode_record, encode as encode_record, BlobRef, Decoded, Record};
    pub use crate::remote::{content_transform, deliver, deliver_to, parse_content_transform, RemoteFailure};
    pub use crate::shared::{append, check_mount, magic_of, FileSystem, MountCheck, GLUSTER_MOUNT_OPTIONS, GLUSTER_VOLUME_OPTIONS};
    pub use crate::stats::{Counter, Counters, STATS_FILE};
    pub use crate::store::{
        own_host_name, presence_id, raise_open_file_limit, Destination, HeldStatuses, NameKind, PresenceChanges, Receipt, Receipts,
        ServerName, TopicStat, HEARTBEAT_EVERY, KN_POISONED, KN_POISONED_BEFORE, KN_UNREAD_AFTER, KN_UNREAD_ROUTE, KN_UNREAD_TO,
        LEAVE_KEPT_SECS, NAME_TTL_SECS, PROBE_PREFIX, REMOVING_PREFIX,
    };
    pub use crate::usage::{Cached, Usage, UsageCache};
    pub use crate::logs::STREAMS_DIR;

    /// A journal as a view over its sources' windows (issue 39, format
    /// version 5): the numbering (`store/view.rs`).
    pub mod view {
        pub use crate::store::view::*;
    }

    /// The window logs of source topics, `S/.windows/` (FORMAT.md,
    /// "Journals: windows over their sources").
    pub mod windows {
        pub use crate::store::windows::*;
    }

    /// The logs of one's own kept in the store by a layer above it
    /// (Durable Streams, the `kn-streams` crate).
    pub mod logs {
        pub use crate::logs::*;
    }
}
