//! A stream's state, replayed from its records: what `create`, `append`,
//! `close`, `delete` and the fork counters wrote (FORMAT.md, "Streams").
//! Every field is derived from the log alone, so a crash can leave no
//! state that the log does not say.

use std::collections::HashMap;

use kn_journal::Event;
use kn_journal::internal::Record;

use crate::offset::Epochs;

/// Element names of stream records.
pub(crate) mod name {
    pub const OP: &str = "ds_op";
    pub const PATH: &str = "ds_path";
    pub const CONTENT_TYPE: &str = "ds_content_type";
    pub const TTL: &str = "ds_ttl";
    pub const EXPIRES_AT: &str = "ds_expires_at";
    pub const CLOSE: &str = "ds_close";
    pub const FORK_FROM: &str = "ds_fork_from";
    pub const FORK_OFFSET: &str = "ds_fork_offset";
    pub const FORK_SUB: &str = "ds_fork_sub";
    pub const FORK_DEPTH: &str = "ds_fork_depth";
    pub const TOPIC: &str = "ds_topic";
    pub const CREATED: &str = "ds_created";
    pub const PRODUCER: &str = "ds_producer";
    pub const EPOCH: &str = "ds_epoch";
    pub const SEQ: &str = "ds_seq";
    pub const STREAM_SEQ: &str = "ds_stream_seq";
    pub const TOPIC_SEQ: &str = "ds_topic_seq";
    /// The incarnation's epoch, in its offsets (`offset.rs`).
    pub const OFFSET_EPOCH: &str = "ds_offset_epoch";
    /// A fork's inherited epochs (`Epochs::format_table`).
    pub const FORK_EPOCHS: &str = "ds_fork_epochs";
}

/// The operations a record can be (`ds_op`).
pub(crate) mod op {
    /// The stream's configuration; may carry its first data.
    pub const CREATE: &[u8] = b"create";
    /// Data (and, with `ds_close`, the close).
    pub const APPEND: &[u8] = b"append";
    /// A record of the source copied into a fork: data only, never state.
    pub const INHERIT: &[u8] = b"inherit";
    /// A source record that held no data, copied into a fork as nothing,
    /// so that checkpoints of the fork and its source stay equal.
    pub const PAD: &[u8] = b"pad";
    /// Close without data.
    pub const CLOSE: &[u8] = b"close";
    /// Soft delete (the stream has forks).
    pub const DELETE: &[u8] = b"delete";
    /// A fork of this stream was created / deleted.
    pub const FORK_ADDED: &[u8] = b"fork+";
    pub const FORK_REMOVED: &[u8] = b"fork-";
}

/// What a producer last had accepted: `(epoch, seq)`.
pub(crate) type ProducerState = (u64, u64);

/// Serialised whole in a stream's snapshot (`.state`, see `snapshot.rs`).
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct State {
    /// A `create` record was read.
    pub exists: bool,
    pub path: String,
    pub content_type: String,
    pub ttl: Option<u64>,
    pub expires_at: Option<String>,
    pub closed: bool,
    /// The producer tuple of the append that closed the stream.
    pub closed_by: Option<(String, u64, u64)>,
    pub soft_deleted: bool,
    pub forks: u64,
    pub fork_from: Option<String>,
    pub fork_offset: Option<u64>,
    pub fork_sub: u64,
    /// How many forks down from a stream that is no fork (0: none); a
    /// fork made by an older version, which did not count, is 1.
    #[serde(default)]
    pub fork_depth: u64,
    pub topic: Option<String>,
    /// Checkpoint of the last record holding data (0: none).
    pub tail: u64,
    pub producers: HashMap<String, ProducerState>,
    /// The bytes of the ids in `producers` (kept as they are added, so
    /// that a process's cache counts them without a walk; recounted when
    /// a snapshot is read, `State::count_producers`).
    #[serde(skip)]
    pub producer_bytes: usize,
    pub stream_seq: Option<Vec<u8>>,
    /// The bound topic's checkpoint imported last.
    pub topic_seq: u64,
    pub created: String,
    /// The epochs of this incarnation's offsets (none in a stream, or a
    /// snapshot, written before epochs: 0 everywhere).
    #[serde(default)]
    pub epochs: Epochs,
}

fn text(e: &Event, n: &str) -> Option<String> {
    e.get(n).map(|v| String::from_utf8_lossy(v).into_owned())
}

fn number(e: &Event, n: &str) -> Option<u64> {
    e.get(n).and_then(|v| std::str::from_utf8(v).ok()).and_then(|v| v.parse().ok())
}

/// True when the record holds stream data.
pub(crate) fn has_data(r: &Record) -> bool {
    let op = r.event.get(name::OP).unwrap_or(b"");
    (op == op::APPEND || op == op::INHERIT || op == op::CREATE) && !r.event.payload().is_empty()
}

impl State {
    /// A live stream with nothing to do on access: no TTL to slide, no
    /// expiry, no bound topic. Only such a stream is served from memory
    /// on a server's event loop (`Streams::append_nowait`,
    /// `Streams::read_cached`).
    pub(crate) fn is_plain(&self) -> bool {
        self.exists && !self.soft_deleted && self.ttl.is_none() && self.expires_at.is_none() && self.topic.is_none()
    }

    /// True unless the stream exists under another path than `path`: the
    /// directory is named by a hash of the path (`Streams::stream_dir`),
    /// and a colliding path must never read or write another's stream.
    pub(crate) fn is_of(&self, path: &str) -> bool {
        !self.exists || self.path == path
    }

    /// Recounts `producer_bytes` (a state read from a snapshot).
    pub(crate) fn count_producers(&mut self) {
        self.producer_bytes = self.producers.keys().map(String::len).sum();
    }

    /// How many forks down from a stream that is no fork this one is.
    pub(crate) fn fork_depth(&self) -> u64 {
        if self.fork_from.is_some() { self.fork_depth.max(1) } else { 0 }
    }

    /// Applies one record, in checkpoint order.
    pub(crate) fn apply(&mut self, r: &Record) {
        let e = &r.event;
        if has_data(r) {
            self.tail = r.seq;
        }
        if let Some(t) = number(e, name::TOPIC_SEQ) {
            self.topic_seq = self.topic_seq.max(t);
        }
        let op = e.get(name::OP).unwrap_or(b"");
        if op == op::CREATE {
            let tail = self.tail;
            *self = State {
                exists: true,
                path: text(e, name::PATH).unwrap_or_default(),
                content_type: text(e, name::CONTENT_TYPE).unwrap_or_default(),
                ttl: number(e, name::TTL),
                expires_at: text(e, name::EXPIRES_AT),
                fork_from: text(e, name::FORK_FROM),
                fork_offset: number(e, name::FORK_OFFSET),
                fork_sub: number(e, name::FORK_SUB).unwrap_or(0),
                fork_depth: number(e, name::FORK_DEPTH).unwrap_or(u64::from(e.contains(name::FORK_FROM))),
                topic: text(e, name::TOPIC),
                created: text(e, name::CREATED).unwrap_or_default(),
                topic_seq: number(e, name::TOPIC_SEQ).unwrap_or(0),
                epochs: Epochs::new(
                    number(e, name::OFFSET_EPOCH).unwrap_or(0),
                    text(e, name::FORK_EPOCHS).and_then(|t| Epochs::parse_table(&t)).unwrap_or_default(),
                ),
                tail,
                ..State::default()
            };
        } else if op == op::DELETE {
            self.soft_deleted = true;
        } else if op == op::FORK_ADDED {
            self.forks += 1;
        } else if op == op::FORK_REMOVED {
            self.forks = self.forks.saturating_sub(1);
        } else if op != op::APPEND && op != op::CLOSE {
            return;
        }
        if op == op::INHERIT || op == op::PAD {
            return;
        }
        let producer = match (text(e, name::PRODUCER), number(e, name::EPOCH), number(e, name::SEQ)) {
            (Some(id), Some(epoch), Some(seq)) => {
                if self.producers.insert(id.clone(), (epoch, seq)).is_none() {
                    self.producer_bytes += id.len();
                }
                Some((id, epoch, seq))
            }
            _ => None,
        };
        if let Some(s) = e.get(name::STREAM_SEQ) {
            self.stream_seq = Some(s.to_vec());
        }
        if e.contains(name::CLOSE) && !self.closed {
            self.closed = true;
            self.closed_by = producer;
        }
    }
}
