//! The bridge between a stream and a PubSub topic (docs/DURABLE-STREAMS.md,
//! "The bridge"): what is notified to the bound topic is imported into the
//! stream as JSON messages, and JSON messages appended to the stream are
//! notified to the topic.
//!
//! Import is pull: whenever the stream is read or written, the topic's
//! records after the last imported checkpoint are appended to the stream,
//! each in one record that also carries the topic checkpoint it came from
//! (`ds_topic_seq`), under the stream's lock. So an event is imported once
//! even across crashes: the checkpoint is committed with the message.

use serde_json::{Map, Value};

use super::state::{name, op};
use super::{Entry, StreamResult, Streams};
use kn_journal::Event;
use kn_journal::internal::logs::{self as log, LogCursor, Writer};
use kn_journal::internal::Record;
use kn_journal::Topic;

/// The element marking an event that came from a stream (its path): the
/// stream it came from does not import it again.
pub const KN_STREAM: &str = "kn_stream";

/// The element giving the stream offset an event came from.
pub const KN_STREAM_OFFSET: &str = "kn_stream_offset";

impl Streams {
    fn topic_records(&self, entry: &mut Entry, topic: &str) -> StreamResult<Vec<Record>> {
        let Ok(t) = Topic::parse(topic) else { return Ok(Vec::new()) };
        let dir = t.dir(&self.config().root);
        if !dir.is_dir() {
            return Ok(Vec::new());
        }
        let after = entry.state.topic_seq;
        let mut cursor = match entry.topic_cursor.take() {
            Some(c) if c.last_seq() == after => c,
            _ => LogCursor::at(after, 0, 0, 0),
        };
        let mut out = Vec::new();
        loop {
            let batch = log::read_new(&dir, &mut cursor)?;
            if batch.is_empty() {
                break;
            }
            out.extend(batch);
        }
        entry.topic_cursor = Some(cursor);
        Ok(out)
    }

    pub(super) fn topic_has_new(&self, entry: &mut Entry, topic: &str) -> StreamResult<bool> {
        let Ok(t) = Topic::parse(topic) else { return Ok(false) };
        let dir = t.dir(&self.config().root);
        let end = log::cursor_at_end(&dir).map(|c| c.last_seq()).unwrap_or(0);
        let _ = entry;
        Ok(end > entry.state.topic_seq)
    }

    /// Imports the bound topic's new events (the stream is locked by `w`).
    pub(super) fn import_locked(&self, entry: &mut Entry, w: &mut Writer<'_>) -> StreamResult<()> {
        let Some(topic) = entry.state.topic.clone() else { return Ok(()) };
        if entry.state.closed || entry.state.soft_deleted {
            return Ok(());
        }
        let records = self.topic_records(entry, &topic)?;
        if records.is_empty() {
            return Ok(());
        }
        let path = entry.state.path.clone();
        let now = kn_journal::internal::now();
        for r in records {
            let mut e = Event::new();
            e.set(name::OP, op::APPEND);
            e.set(name::TOPIC_SEQ, r.seq.to_string());
            let own = r.event.get(KN_STREAM) == Some(path.as_bytes());
            if !own && !r.event.is_expired(now) {
                e.set(kn_journal::KN_PAYLOAD, event_to_json(&r.event));
            } else {
                // Still recorded, so that the checkpoint moves on.
                e.set(name::OP, op::PAD);
            }
            self.append_record(entry, w, e)?;
        }
        self.refresh(entry)
    }

    /// Notifies each message appended at checkpoint `at` to `topic`.
    pub(super) fn post_to_topic(&self, path: &str, topic: &str, at: crate::Offset, messages: &[String]) -> kn_journal::Result<()> {
        let t = Topic::parse(topic)?;
        for (i, m) in messages.iter().enumerate() {
            let event = json_to_event(path, at, i, m);
            self.store.notify(&t, event)?;
        }
        Ok(())
    }
}

/// An event as a JSON message: an object of its elements, values as
/// strings (bytes that are not UTF-8 replaced by U+FFFD).
pub fn event_to_json(event: &Event) -> String {
    let mut map = Map::new();
    for (n, v) in event.elements() {
        map.insert(String::from_utf8_lossy(n).into_owned(), Value::String(String::from_utf8_lossy(v).into_owned()));
    }
    Value::Object(map).to_string()
}

/// A JSON message (message `index` of the append at offset `at` of
/// stream `path`) as an event: an object's members become elements
/// (strings as they are, other values as their JSON text); anything else
/// becomes the `kn_payload`. Without a `kn_id` it gets one naming the
/// stream, offset and index, so that posting it again is a duplicate.
pub fn json_to_event(path: &str, at: crate::Offset, index: usize, message: &str) -> Event {
    let mut e = Event::new();
    match serde_json::from_str::<Value>(message) {
        Ok(Value::Object(map)) => {
            for (k, v) in map {
                match v {
                    Value::String(s) => e.set(k, s),
                    other => e.set(k, other.to_string()),
                };
            }
        }
        _ => {
            e.set(kn_journal::KN_PAYLOAD, message);
        }
    }
    if !e.contains(kn_journal::KN_ID) {
        let hash = xxhash_rust::xxh3::xxh3_64(path.as_bytes());
        e.set(kn_journal::KN_ID, format!("ds-{hash:016x}-{}-{index}", super::offset(at)));
    }
    e.set(KN_STREAM, path);
    e.set(KN_STREAM_OFFSET, super::offset(at));
    e
}
