//! Forks (Durable Streams, "Forking"): what a fork copies of its source,
//! how deep a chain of forks may grow (`StreamsConfig::max_fork_depth`),
//! and the fork counters that keep a deleted source until its last fork
//! goes (docs/DURABLE-STREAMS.md, "Operations").
//!
//! A chain's length comes from clients, so nothing here recurses along
//! it: a delete that releases a chain of soft-deleted ancestors walks up
//! the chain in a loop, one ancestor at a time, each under its own lock
//! (never two at once).

use super::state::{has_data, name, op};
use super::{json, Create, Info, StreamError, StreamErrorKind, StreamResult, Streams};
use kn_journal::Event;
use kn_journal::internal::logs::{self as log, LogCursor};
use kn_journal::internal::Record;

/// A fork's source as read for the copy.
pub(super) struct ForkSource {
    pub(super) info: Info,
    pub(super) offset: u64,
    /// How many forks down from a stream that is no fork the source is
    /// (0: it is none).
    pub(super) depth: u64,
    pub(super) records: Vec<Event>,
}

impl Streams {
    /// Counts a fork of `source` created (`op::FORK_ADDED`) or deleted
    /// (`op::FORK_REMOVED`). A deleted source whose last fork went is
    /// removed, which removes one of its own source's forks, and so on up
    /// the chain: a loop, not a recursion, however long the chain.
    pub(super) fn count_fork(&self, source: &str, what: &[u8]) -> StreamResult<()> {
        let mut next = Some(source.to_owned());
        let mut what = what;
        while let Some(source) = next.take() {
            next = self.count_one_fork(&source, what)?;
            what = op::FORK_REMOVED;
        }
        Ok(())
    }

    /// One step of [`Streams::count_fork`]: counts the fork in `source`;
    /// when that removed `source` (deleted, its last fork gone), returns
    /// its own source, whose count is next.
    fn count_one_fork(&self, source: &str, what: &[u8]) -> StreamResult<Option<String>> {
        let cell = self.entry(source);
        let mut entry = self.hold(&cell);
        let Some(mut w) = self.writer(&mut entry, false)? else { return Ok(None) };
        if !entry.state.exists || !entry.state.is_of(source) {
            self.release(&mut entry, w);
            return Ok(None);
        }
        let mut e = Event::new();
        e.set(name::OP, what);
        let r = self.append_record(&mut entry, &mut w, e);
        self.release(&mut entry, w);
        r?;
        self.refresh(&mut entry)?;
        if !(entry.state.soft_deleted && entry.state.forks == 0) {
            return Ok(None);
        }
        let parent = entry.state.fork_from.clone();
        self.remove(source, &mut entry)?;
        Ok(parent)
    }

    /// The records a fork of `from` starts with, as the fork will hold
    /// them: every record up to the fork point, data as `inherit`,
    /// anything else as `pad`, so that checkpoints stay equal. Refused
    /// (`Conflict`, 409) when the fork would be deeper than
    /// `StreamsConfig::max_fork_depth`.
    pub(super) fn fork_source(&self, from: &str, req: &Create) -> StreamResult<ForkSource> {
        let from_path = source_path(from);
        self.check_path(from_path)?;
        let cell = self.entry(from_path);
        let mut entry = self.hold(&cell);
        match self.live(from_path, &mut entry) {
            Err(e) if e.kind() == StreamErrorKind::Gone => {
                return Err(StreamError::new(StreamErrorKind::Conflict, format!("stream '{from_path}' was deleted: it cannot be forked")))
            }
            r => r?,
        }
        let depth = entry.state.fork_depth();
        let max = self.streams_config().max_fork_depth;
        if depth >= max as u64 {
            return Err(StreamError::new(
                StreamErrorKind::Conflict,
                format!("stream '{from_path}' is a fork {depth} deep: a fork of it would pass the limit of {max} (KN_STREAM_MAX_FORK_DEPTH)"),
            ));
        }
        let info = Self::info(&entry);
        let at = match req.fork_offset {
            Some(at) => info.accept(at)?.seq(),
            None => info.tail.seq(),
        };
        if at > info.tail.seq() {
            return Err(StreamError::new(StreamErrorKind::BadRequest, format!("fork offset {} is beyond the source's tail {}", info.offset_at(at), info.next_offset())));
        }
        let json = info.is_json();
        let mut sub = req.fork_sub_offset;
        let mut records = Vec::new();
        let mut cursor = LogCursor::at(0, 0, 0, 0);
        'read: loop {
            let batch = log::read_new(&entry.dir, &mut cursor)?;
            if batch.is_empty() {
                break;
            }
            for r in batch {
                if r.seq <= at {
                    records.push(inherited(&r, None));
                    continue;
                }
                if sub == 0 || r.seq > info.tail.seq() {
                    break 'read;
                }
                if !has_data(&r) {
                    records.push(inherited(&r, None));
                    continue;
                }
                let payload = r.event.payload();
                let (part, used) = if json {
                    let messages = json::split(payload);
                    let n = (sub as usize).min(messages.len());
                    (messages[..n].join(",").into_bytes(), n as u64)
                } else {
                    let n = (sub as usize).min(payload.len());
                    (payload[..n].to_vec(), n as u64)
                };
                sub -= used;
                records.push(inherited(&r, Some(part)));
            }
        }
        if sub > 0 {
            return Err(StreamError::new(StreamErrorKind::BadRequest, "Stream-Fork-Sub-Offset is beyond the source's data"));
        }
        Ok(ForkSource { info, offset: at, depth, records })
    }
}

fn inherited(r: &Record, part: Option<Vec<u8>>) -> Event {
    let mut e = Event::new();
    match part {
        Some(p) => {
            e.set(name::OP, op::INHERIT);
            e.set(kn_journal::KN_PAYLOAD, p);
        }
        None if has_data(r) => {
            e.set(name::OP, op::INHERIT);
            e.set(kn_journal::KN_PAYLOAD, r.event.payload().to_vec());
        }
        None => {
            e.set(name::OP, op::PAD);
        }
    }
    e
}

/// The stream path named by `Stream-Forked-From`: a path below
/// `/v1/stream/` or the URL path itself.
pub(super) fn source_path(from: &str) -> &str {
    let p = from.trim_start_matches('/');
    p.strip_prefix("v1/stream/").unwrap_or(p)
}
