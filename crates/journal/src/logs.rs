//! Logs of one's own: the public face of the store's log layer for a layer
//! built above the store that keeps its own append-only logs in the same
//! root (Durable Streams, the `kn-streams` crate, under [`STREAMS_DIR`]).
//!
//! Such a log is a directory like a topic's (FORMAT.md): segments of
//! checksummed records, a `.head`, a lock, blobs shared through the root's
//! `.blobs/`. It is written through a [`Writer`] (holding the log's lock),
//! read with [`read_new`] from a [`LogCursor`], and its appends wake the
//! readers waiting on a [`Subscription`] of the store's [`Hub`]
//! ([`Store::hub`](crate::Store::hub)). What these logs mean is the upper
//! layer's business; the store only keeps their bytes, sweeps the orphan
//! blobs, and counts them ([`Usage::streams`](crate::Usage::streams)).

pub use crate::log::{
    blobs_of, cursor_at_end, last_seq_of, open_shared, read_new, release_blobs, write_cursor, Appended, LogCursor, SpaceGauge, TopicFiles,
    Writer, HEAD_FILE,
};
pub use crate::record::{crc32c, encode_event};
pub use crate::watch::{Appending, Hub, Subscription};

/// The directory of the store root that holds the Durable Streams, one
/// directory each (kept by `kn-streams`). The store knows its name only to
/// count the streams ([`Usage`](crate::Usage)) and to never take it for a
/// topic (a topic segment never starts with `.`).
pub const STREAMS_DIR: &str = ".streams";
