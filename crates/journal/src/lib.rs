//! kn-journal: the knpubsub event store and every PubSub rule.
//!
//! Events are stored under a `kn_events` tree, one directory per topic
//! segment, in append-only segment files of checksummed records (see
//! `FORMAT.md`). [`Store`] owns all the semantics of PROTOCOL.md sections 1,
//! 2 and 4: ordinary topics (the current event per `kn_id`) versus journals
//! (every post kept), duplicate suppression, expiry, routes and forwarding,
//! `kn_subtopics` announcements, heartbeats, and waiting for new events.
//! `pubsub.cgi` and every sensor call this crate and nothing else.
//!
//! # Where things live
//!
//! Data flows one way: [`Store`] -> `log` -> files; nothing below imports
//! anything above it.
//!
//! * `store/mod.rs`: [`Store`] itself: opening, configuration, server names
//!   (from configuration and `.names`, never from requests) and
//!   [`Store::resolve`], topic directories and their size limits, the cache
//!   of kept topic files, [`raise_open_file_limit`].
//! * `store/post.rs`: [`Store::notify`] / [`Store::post`]: the job queue,
//!   storing an event, `kn_subtopics` announcements, forwarding, poisoning.
//! * `store/nowait.rs`: [`Store::notify_nowait`], a notify made without
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
//!   [`Store::sweep_all`] ([`SweepReport`]): stale journals removed with
//!   the routes into them and their announcement, empty topics pruned;
//!   `store/sweep_extra.rs`: the rest of a slice (orphan blobs, and the
//!   pass a layer above registers: expired streams).
//! * `store/admin.rs`: tools' APIs: [`TopicStat`], restore, setting a
//!   heartbeat.
//! * `log/`: one topic's files, knowing nothing of the store: `segment`
//!   (names, scans, reads, [`LogCursor`]), `head` (the `.head` and its
//!   `kn_id` index), `writer` (the locked appender), `compact`
//!   ([`CompactReport`], retention), `verify`, `blob` (large payloads
//!   stored once in the root's `.blobs/`, hard-linked into each topic
//!   that holds them; readers put them back), `blob_gc` (the sweep's
//!   bounded pass removing orphan blobs past their grace).
//! * [`logs`]: the public face of `log` and `watch` for a layer that keeps
//!   logs of its own in the store (Durable Streams, the `kn-streams`
//!   crate); nothing in this crate imports it.
//! * `watch.rs`: the process-wide change notifier that wakes tunnels.
//! * `stats.rs`: [`Counters`] of the sweep, the outbox and poisoned routes,
//!   shared by every process in the root's `.stats`. `metrics.rs`: the
//!   Prometheus text format ([`Exposition`]). `usage.rs`: the store's size
//!   from one walk ([`Usage`]) and a server's cache of it ([`UsageCache`]).
//! * `access/`: [`access`] control: the rules file ([`access::Rules`]),
//!   who asks ([`access::Principal`]), the checked request API
//!   ([`access::AsUser`], from [`Store::as_user`]), what a reader is shown
//!   ([`access::Rules::may_see`]) and anonymous visitors' sessions
//!   ([`access::SessionKey`]).
//! * `record.rs`: the record encoding; `event.rs`: [`Event`] and the `kn_`
//!   names; `topic.rs`: [`Topic`]; `config.rs`: [`Config`]; `remote.rs`:
//!   what a remote delivery is ([`Remote`]) and the outbound policy;
//!   `http.rs`: the one HTTP client, the default feature `http` (without
//!   it remote deliveries are refused); `error.rs`: [`Error`]; `ids.rs`: the clock ([`now`]) and
//!   [`fresh_id`].
//!
//! Every outbound HTTP request of the project (remote route deliveries,
//! content transforms, sensor posts, `kn-replay`, `kn-feed`) goes through
//! one client, [`HttpRemote`] (`http.rs`), made from the [`Config`]: its
//! timeouts, response size limit and proxy (`KN_HTTP_PROXY`, never a proxy
//! variable of the environment), no redirects for POSTs, canonical header
//! names. Which URLs it may reach is the [`OutboundPolicy`] (`remote.rs`).
//!
//! ```
//! use kn_journal::{Event, Selection, Store, Topic};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let store = Store::open(dir.path()).unwrap();
//! let chat = Topic::parse("/what/chat").unwrap();
//! let inbox = Topic::parse("/who/anna/inbox").unwrap();
//!
//! // Route everything posted to /what/chat into /who/anna/inbox.
//! let mut route = Event::new();
//! route.set("kn_id", "r1");
//! store.route(&chat, b"/who/anna/inbox", route).unwrap();
//!
//! let mut e = Event::new();
//! e.set("kn_payload", "hello");
//! let report = store.notify(&chat, e).unwrap();
//! assert!(report.writes.iter().any(|w| w.topic == inbox));
//!
//! let got = store.events(&inbox, &Selection::all()).unwrap().events;
//! assert_eq!(got[0].payload(), b"hello");
//! assert_eq!(got[0].get("kn_route_id"), Some(&b"r1"[..]));
//! ```
#![deny(missing_docs)]

pub mod access;
mod changes;
mod config;
mod error;
mod event;
#[cfg(feature = "http")]
mod http;
mod ids;
mod log;
pub mod logs;
mod metrics;
mod record;
mod remote;
mod shared;
mod stats;
mod store;
mod topic;
mod usage;
mod watch;

pub use changes::CHANGES_FILE;
pub use config::{default_open_topics, Config, Shared, SyncPolicy};
pub use shared::{check_mount, magic_of, FileSystem, MountCheck, GLUSTER_MOUNT_OPTIONS, GLUSTER_VOLUME_OPTIONS};
pub use error::{Error, ErrorKind, Result};
pub use event::*;
#[cfg(feature = "http")]
pub use http::{HttpRemote, HttpRemoteBuilder};
pub use log::{CompactReport, LogCursor};
pub use logs::STREAMS_DIR;
pub use metrics::{Exposition, PROMETHEUS_CONTENT_TYPE};
pub use record::{decode as decode_record, encode as encode_record, BlobRef, Decoded, Record};
pub use remote::*;
pub use stats::{Counter, Counters, STATS_FILE};
pub use store::*;
pub use usage::{Cached, Usage, UsageCache};
pub use topic::{Topic, JOURNAL_SEGMENT, MAX_SEGMENT_BYTES, MAX_TOPIC_BYTES, MAX_TOPIC_DEPTH, ROUTES_SEGMENT, SUBTOPICS_SEGMENT};
