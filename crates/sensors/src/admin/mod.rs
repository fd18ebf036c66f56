//! The `kn` administration tool's library: how it prints events, routes
//! and figures, so that the binary is only its command line.
//!
//! Event formats ([`EventFormat`]):
//!
//! * `text`: for people. One `name: value` line per element (bytes that are
//!   not printable written `=XX` as in the simple format), a blank line, the
//!   payload, then a line `----`.
//! * `simple`: the PubSub simple format (PROTOCOL.md 3.5), byte-exact: the
//!   encoded length, a newline, the encoded event, a newline.
//! * `json`: one JSON object per line, element names to values. Names and
//!   values that are not UTF-8 are converted lossily (use `simple` for
//!   byte-exact output).
//!
//! ```
//! use kn_journal::Event;
//! use kn_sensors::admin::{write_event, EventFormat};
//!
//! let e = Event::from_pairs([("kn_id", "e1"), ("kn_payload", "hi")]);
//! let mut out = Vec::new();
//! write_event(&mut out, &e, EventFormat::Json, None).unwrap();
//! assert_eq!(out, b"{\"kn_id\":\"e1\",\"kn_payload\":\"hi\"}\n");
//! ```

pub mod receipts;
pub mod routes;
pub mod selftest;
pub mod token;

use std::io::{self, Write};
use std::path::Path;

use kn_journal::{Event, Route, Store, Topic, KN_PAYLOAD};
use kn_journal::internal::{Counters, TopicStat};

use crate::{SensorError, SensorErrorKind};

/// How `kn events`, `kn tail` and `kn export` print events.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EventFormat {
    /// For people: elements, a blank line, the payload, `----`.
    Text,
    /// The PubSub simple format, byte-exact.
    Simple,
    /// One JSON object per line (lossy for bytes that are not UTF-8).
    Json,
}

/// The element that `kn export` adds to name each event's topic (in the
/// `simple` and `text` formats; `json` wraps the event instead).
pub const EXPORT_TOPIC: &str = "kn_export_topic";

/// Writes one event. With `topic` (an export), the JSON form is
/// `{"topic": T, "event": {...}}` and the other forms carry an extra
/// `kn_export_topic` element.
pub fn write_event(out: &mut dyn Write, event: &Event, format: EventFormat, topic: Option<&Topic>) -> io::Result<()> {
    match format {
        EventFormat::Json => {
            let object = event_json(event);
            let line = match topic {
                Some(t) => serde_json::json!({ "topic": t.as_str(), "event": object }),
                None => object,
            };
            writeln!(out, "{line}")
        }
        EventFormat::Simple => {
            let mut e = event.clone();
            if let Some(t) = topic {
                e.set(EXPORT_TOPIC, t.as_str());
            }
            out.write_all(&kn_wire::simple::frame(&e))
        }
        EventFormat::Text => {
            let mut buf = Vec::new();
            if let Some(t) = topic {
                buf.extend_from_slice(format!("{EXPORT_TOPIC}: {t}\n").as_bytes());
            }
            for (name, value) in event.elements().filter(|(n, _)| *n != KN_PAYLOAD) {
                kn_wire::simple::escape(name, &mut buf);
                buf.extend_from_slice(b": ");
                kn_wire::simple::escape(value, &mut buf);
                buf.push(b'\n');
            }
            buf.push(b'\n');
            buf.extend_from_slice(event.payload());
            if !event.payload().is_empty() && !event.payload().ends_with(b"\n") {
                buf.push(b'\n');
            }
            buf.extend_from_slice(b"----\n");
            out.write_all(&buf)
        }
    }
}

/// The event as a JSON object of its elements, in name order.
pub fn event_json(event: &Event) -> serde_json::Value {
    let map: serde_json::Map<String, serde_json::Value> = event
        .elements()
        .map(|(n, v)| (String::from_utf8_lossy(n).into_owned(), serde_json::Value::String(String::from_utf8_lossy(v).into_owned())))
        .collect();
    serde_json::Value::Object(map)
}

/// Parses an event back from [`event_json`]'s form.
pub fn event_from_json(value: &serde_json::Value) -> Option<Event> {
    let map = value.as_object()?;
    let mut e = Event::new();
    for (name, value) in map {
        e.set(name.as_str(), value.as_str()?);
    }
    Some(e)
}

/// The topics of the store, sorted; without `all`, the reserved
/// `kn_routes`, `kn_subtopics` and `kn_presence` topics (and what lies
/// below them) are left out.
pub fn topics(store: &Store, all: bool) -> Result<Vec<Topic>, SensorError> {
    let topics = store.topics().map_err(|e| SensorError::from_journal(e, "cannot list topics"))?;
    Ok(topics.into_iter().filter(|t| all || !t.segments().any(|s| s == kn_journal::ROUTES_SEGMENT || s == kn_journal::SUBTOPICS_SEGMENT || s == kn_journal::PRESENCE_SEGMENT)).collect())
}

/// One line describing a route: id, destination (`-` when inactive:
/// deleted or poisoned), then its other elements as `name=value`; a
/// poisoned route's reason is its `kn_poisoned` element.
pub fn route_line(route: &Route) -> String {
    let destination = if route.destination().is_empty() { "-".to_string() } else { String::from_utf8_lossy(route.destination()).into_owned() };
    let mut line = format!("{}\t{}", String::from_utf8_lossy(route.id()), destination);
    for (name, value) in route.event.elements() {
        if matches!(name, b"kn_id" | b"kn_payload" | b"kn_route_checkpoint") {
            continue;
        }
        let mut v = Vec::new();
        kn_wire::simple::escape(value, &mut v);
        line.push_str(&format!("\t{}={}", String::from_utf8_lossy(name), String::from_utf8_lossy(&v)));
    }
    line
}

/// The figures of each topic given, in order.
pub fn stats(store: &Store, topics: &[Topic]) -> Result<Vec<(Topic, TopicStat)>, SensorError> {
    topics
        .iter()
        .map(|t| store.stat(t).map(|s| (t.clone(), s)).map_err(|e| SensorError::from_journal(e, &format!("cannot read '{t}'"))))
        .collect()
}

/// Writes `kn stat`'s table: a header, one row per topic, a total row.
pub fn write_stats(out: &mut dyn Write, rows: &[(Topic, TopicStat)]) -> io::Result<()> {
    writeln!(out, "{:>8} {:>8} {:>12} {:>8}  topic", "events", "records", "bytes", "segments")?;
    let mut total = TopicStat::default();
    for (topic, s) in rows {
        writeln!(out, "{:>8} {:>8} {:>12} {:>8}  {topic}", s.events, s.records, s.bytes, s.segments)?;
        total.events += s.events;
        total.records += s.records;
        total.bytes += s.bytes;
        total.segments += s.segments;
    }
    writeln!(out, "{:>8} {:>8} {:>12} {:>8}  (total of {} topics)", total.events, total.records, total.bytes, total.segments, rows.len())
}

/// Writes `kn doctor`'s report: the store's file system and mode, then
/// each checked mount or volume setting (`ok`, `WRONG` or `unverified`).
/// True when a setting is wrong.
pub fn write_doctor(out: &mut dyn Write, store: &Store) -> io::Result<bool> {
    writeln!(out, "store: {}", store.root().display())?;
    writeln!(out, "file system: {}", store.describe_mode())?;
    match store.store_format() {
        Ok(format) => writeln!(out, "{format}")?,
        Err(e) => writeln!(out, "store format: unknown ({e})")?,
    }
    let checks = store.mount_checks();
    let mut wrong = false;
    for c in &checks {
        let verdict = match c.ok {
            Some(true) => "ok",
            Some(false) => "WRONG",
            None => "unverified",
        };
        wrong |= c.ok == Some(false);
        writeln!(out, "{verdict:>10}  {} = {} (needs {})", c.setting, c.found, c.required)?;
    }
    if wrong {
        writeln!(out, "shared mode needs the settings marked WRONG: see docs/DEPLOY.md, \"Several web servers on one store\"")?;
    }
    Ok(wrong)
}

/// Writes the store's counters after `kn stat`'s table: a blank line, then
/// one `name value` line per counter, in slot order.
pub fn write_counters(out: &mut dyn Write, counters: &Counters) -> io::Result<()> {
    writeln!(out)?;
    for (counter, value) in counters.iter() {
        writeln!(out, "{} {value}", counter.name())?;
    }
    Ok(())
}

/// Writes `bytes` to `path` so that no reader ever sees half of them: into
/// a temporary file beside it (`.NAME.tmp.PID`, a name node_exporter's
/// textfile collector ignores), flushed, then renamed over `path`. On
/// failure the temporary file is removed and `path` is left as it was.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), SensorError> {
    let name = path.file_name().ok_or_else(|| SensorError::usage(format!("bad output file '{}': it names no file", path.display())))?;
    let temp = path.with_file_name(format!(".{}.tmp.{}", name.to_string_lossy(), std::process::id()));
    let fail = |what: &str, e: io::Error| {
        let kind = match e.kind() {
            io::ErrorKind::PermissionDenied | io::ErrorKind::NotFound => SensorErrorKind::CantCreate,
            _ => SensorErrorKind::TempFail,
        };
        SensorError::new(kind, format!("cannot {what} '{}': {e}", path.display()))
    };
    let written = (|| {
        let mut f = std::fs::File::create(&temp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(fail("write", e));
    }
    std::fs::rename(&temp, path).map_err(|e| {
        let _ = std::fs::remove_file(&temp);
        fail("replace", e)
    })
}
