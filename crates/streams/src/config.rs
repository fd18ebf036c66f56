//! The settings of the Durable Streams front door, apart from the store's
//! own ([`kn_journal::Config`]): an embedder of the core never sees them.
//!
//! | Field | Default | Environment |
//! |---|---|---|
//! | `enabled` | on: `serve` and pubsub.cgi answer Durable Streams at `/v1/stream/` (off: `404`) | `KN_STREAMS` (`on`/`off`) |
//! | `long_poll` | 20 s a long-poll waits before `204` | `KN_STREAM_LONG_POLL_MS` |
//! | `sse_max_time` | 60 s an SSE response stays open (then the client reconnects) | `KN_STREAM_SSE_MAX_MS` |
//! | `max_append_bytes` | 8 MiB per stream `PUT`/`POST` body (more: `413`) | `KN_STREAM_MAX_APPEND_BYTES` |
//! | `max_read_bytes` | 1 MiB of data per catch-up response (more: the rest on the next read, no `Stream-Up-To-Date`) | `KN_STREAM_MAX_READ_BYTES` |
//! | `max_path_bytes` | 1024 bytes per stream path (more: `400`) | `KN_STREAM_MAX_PATH_BYTES` |
//! | `max_producers` | 10,000 idempotent producers per stream (more: `400`) | `KN_STREAM_MAX_PRODUCERS` |
//! | `max_producer_id_bytes` | 256 bytes per `Producer-Id` (more: `400`) | `KN_STREAM_MAX_PRODUCER_ID_BYTES` |
//! | `max_fork_depth` | 100 forks in a chain (a fork of a fork ...; more: `409`) | `KN_STREAM_MAX_FORK_DEPTH` |
//! | `cache` | 1024 streams whose state a process keeps in memory | `KN_STREAM_CACHE` |
//! | `cache_bytes` | 256 KiB of each cached stream's latest data kept in memory | `KN_STREAM_CACHE_BYTES` |
//! | `cache_memory` | 256 MiB: the most memory the cached streams of a process hold in all (state, producers, latest data; streams in use excepted) | `KN_STREAM_CACHE_MEMORY` |
//!
//! Orphan blobs of streams are the store's business (`KN_BLOB_GRACE`,
//! [`kn_journal::Config::blob_grace`]).

use std::time::Duration;

use kn_journal::{Error, ErrorKind};
use kn_journal::internal::env_setting;

/// The Durable Streams settings (module documentation: the table).
#[derive(Clone, Debug)]
pub struct StreamsConfig {
    /// Whether the front door (`/v1/stream/`) answers; off, every stream
    /// request is answered `404` (docs/DURABLE-STREAMS.md).
    pub enabled: bool,
    /// How long a long-poll (`live=long-poll`) waits for data before
    /// answering `204 No Content`.
    pub long_poll: Duration,
    /// How long an SSE response (`live=sse`) stays open; the client then
    /// reconnects from its last offset (the Durable Streams protocol,
    /// section 5.8: about 60 s, for CDN collapsing).
    pub sse_max_time: Duration,
    /// Largest body of a stream `PUT` or `POST`, in bytes (more: `413`).
    pub max_append_bytes: usize,
    /// Most data one catch-up read returns, in bytes (at least one
    /// record): the rest comes on the next read.
    pub max_read_bytes: usize,
    /// Longest stream path, in bytes (more: `400`).
    pub max_path_bytes: usize,
    /// Most idempotent producers one stream tracks; a new one past it is
    /// refused (`400`: producers are never forgotten, so a retry would fail
    /// as well) so that producer state cannot grow without bound.
    pub max_producers: usize,
    /// Longest `Producer-Id`, in bytes (more: `400`): with
    /// `max_producers`, what one stream's producer state holds.
    pub max_producer_id_bytes: usize,
    /// Longest chain of forks: a fork of a stream that is already this
    /// many forks down from a stream that is no fork is refused (`409`).
    /// It bounds what one delete may release up a chain.
    pub max_fork_depth: usize,
    /// Most streams whose state one process keeps in memory between
    /// requests (the rest is read again from the log when needed).
    pub cache: usize,
    /// How much of the latest data of each cached stream a process keeps
    /// in memory, in bytes, so that catch-up reads near the tail read no
    /// file (0: none).
    pub cache_bytes: usize,
    /// Most memory, in bytes (an estimate: state, producers, read
    /// positions, latest data), that the streams a process keeps in memory
    /// hold in all; past it, streams not in use are forgotten (all is in
    /// the log). Streams in use by a request are never forgotten.
    pub cache_memory: usize,
}

impl Default for StreamsConfig {
    fn default() -> StreamsConfig {
        StreamsConfig {
            enabled: true,
            long_poll: Duration::from_secs(20),
            sse_max_time: Duration::from_secs(60),
            max_append_bytes: 8 << 20,
            max_read_bytes: 1 << 20,
            max_path_bytes: 1024,
            max_producers: 10_000,
            max_producer_id_bytes: 256,
            max_fork_depth: 100,
            cache: 1024,
            cache_bytes: 256 << 10,
            cache_memory: 256 << 20,
        }
    }
}

impl StreamsConfig {
    /// The defaults overridden by the `KN_STREAM*` environment variables;
    /// a malformed one is an error naming it.
    ///
    /// ```
    /// let config = kn_streams::StreamsConfig::from_env().unwrap();
    /// assert!(config.max_append_bytes > 0);
    /// ```
    pub fn from_env() -> Result<StreamsConfig, Error> {
        let mut c = StreamsConfig::default();
        if let Some(v) = env_setting::<String>("KN_STREAMS")? {
            c.enabled = match v.trim() {
                "on" => true,
                "off" => false,
                _ => return Err(Error::new(ErrorKind::BadRequest, format!("bad value '{v}' for environment variable KN_STREAMS: expected 'on' or 'off'"))),
            };
        }
        let millis = |name| env_setting::<u64>(name).map(|v| v.map(Duration::from_millis));
        if let Some(v) = millis("KN_STREAM_LONG_POLL_MS")? {
            c.long_poll = v;
        }
        if let Some(v) = millis("KN_STREAM_SSE_MAX_MS")? {
            c.sse_max_time = v;
        }
        for (name, field) in [
            ("KN_STREAM_MAX_APPEND_BYTES", &mut c.max_append_bytes),
            ("KN_STREAM_MAX_READ_BYTES", &mut c.max_read_bytes),
            ("KN_STREAM_MAX_PATH_BYTES", &mut c.max_path_bytes),
            ("KN_STREAM_MAX_PRODUCERS", &mut c.max_producers),
            ("KN_STREAM_MAX_PRODUCER_ID_BYTES", &mut c.max_producer_id_bytes),
            ("KN_STREAM_MAX_FORK_DEPTH", &mut c.max_fork_depth),
            ("KN_STREAM_CACHE", &mut c.cache),
            ("KN_STREAM_CACHE_BYTES", &mut c.cache_bytes),
            ("KN_STREAM_CACHE_MEMORY", &mut c.cache_memory),
        ] {
            if let Some(v) = env_setting(name)? {
                *field = v;
            }
        }
        Ok(c)
    }
}
