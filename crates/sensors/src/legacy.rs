//! The legacy mod_pubsub event store (PROTOCOL.md, appendix): reading it,
//! and importing it into a kn-journal store (`kn import-legacy`).
//!
//! A legacy `kn_events` tree has one directory per topic segment and one
//! file per event: element lines `name: value`, a blank line, the raw
//! payload. [`parse_event`] reads one file exactly as the appendix says:
//! each line split at the first `:`, leading whitespace of the value
//! stripped, `=XX` escapes decoded, CR LF line ends tolerated.
//!
//! [`import`] carries every event over, in the order the `.index` files
//! give (the replace order on ordinary topics), with `kn_time_t` and
//! `kn_expires` as they were (expired events too: they are never returned,
//! but duplicate suppression sees them), routes (`kn_routes/`) and
//! announcements (`kn_subtopics/`) as the events of our `T/kn_routes` and
//! `T/kn_subtopics`, journals' `.heartbeat` times and the root's `.names`.
//! Rerunning it imports nothing twice: ordinary topics suppress the
//! duplicates, and on journals an event identical to one already there is
//! skipped.
//!
//! ```
//! use kn_sensors::legacy::parse_event;
//! let file = b"kn_id: 42\r\nsubject: a=3Ab=0Ac\r\nkn_time_t:   979273892\r\n\r\nline 1\r\nline 2";
//! let e = parse_event(file).unwrap();
//! assert_eq!(e.get("subject"), Some(&b"a:b\nc"[..]));
//! assert_eq!(e.get("kn_time_t"), Some(&b"979273892"[..]));
//! assert_eq!(e.payload(), b"line 1\r\nline 2", "the payload is raw bytes");
//! ```

use std::collections::{HashMap, HashSet};
use std::fs;
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use kn_journal::{Event, Store, Topic, KN_EXPIRES, KN_ID, KN_PAYLOAD, KN_ROUTE_CHECKPOINT, KN_TIME_T};
use kn_journal::internal::format_time;

use crate::{SensorError, SensorErrorKind};

/// The original server refused event files larger than this.
pub const MAX_FILE_BYTES: u64 = 2 << 20;

const INDEX_FILE: &str = ".index";
const HEARTBEAT_FILE: &str = ".heartbeat";
const NAMES_FILE: &str = ".names";

/// Parses one legacy event file. `None` when the file has no blank line
/// ending its elements (a truncated write).
pub fn parse_event(bytes: &[u8]) -> Option<Event> {
    let mut event = Event::new();
    let mut pos = 0;
    loop {
        let end = bytes[pos..].iter().position(|&b| b == b'\n')? + pos;
        let mut line = &bytes[pos..end];
        pos = end + 1;
        if line.last() == Some(&b'\r') {
            line = &line[..line.len() - 1];
        }
        if line.is_empty() {
            break;
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue; // not an element line; the original skipped it too
        };
        let value = &line[colon + 1..];
        let start = value.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(value.len());
        event.set(unescape(&line[..colon]), unescape(&value[start..]));
    }
    event.set(KN_PAYLOAD, &bytes[pos..]);
    Some(event)
}

/// Decodes `=XX` escapes (uppercase or lowercase hex); a `=` not followed
/// by two hex digits stays as it is.
pub fn unescape(bytes: &[u8]) -> Vec<u8> {
    kn_journal::internal::decode_escapes(bytes, b'=')
}

/// What [`import`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImportReport {
    /// Topic directories read.
    pub topics: usize,
    /// Events stored.
    pub imported: usize,
    /// Events already in the store (a rerun): not stored again.
    pub already: usize,
    /// Of the events stored, those already expired.
    pub expired: usize,
    /// Files named in an `.index` that no longer exist (deleted or expired
    /// by the original server).
    pub gone: usize,
    /// Journal heartbeats carried over.
    pub heartbeats: usize,
    /// Server names carried over from `.names`.
    pub names: usize,
    /// Files and directories not imported, with why.
    pub warnings: Vec<String>,
}

/// Progress callbacks of [`import`]: the number of event files to read,
/// then one call per file read.
pub trait Progress {
    /// The total number of event files found.
    fn start(&mut self, files: u64);
    /// One more file done.
    fn advance(&mut self);
}

impl Progress for () {
    fn start(&mut self, _: u64) {}
    fn advance(&mut self) {}
}

impl Progress for indicatif::ProgressBar {
    fn start(&mut self, files: u64) {
        self.set_length(files);
    }
    fn advance(&mut self) {
        self.inc(1);
    }
}

/// Imports the legacy tree at `dir` into `store` (see the module
/// documentation). Errors only when the tree cannot be read at all or the
/// store cannot be written; unreadable or oversized single files are
/// warnings in the report.
pub fn import(store: &Store, dir: &Path, progress: &mut dyn Progress) -> Result<ImportReport, SensorError> {
    if !dir.is_dir() {
        return Err(SensorError::new(SensorErrorKind::NoInput, format!("no legacy event store at '{}': not a directory", dir.display())));
    }
    let mut report = ImportReport::default();
    match fs::read(dir.join(NAMES_FILE)) {
        Ok(text) => {
            for name in String::from_utf8_lossy(&text).lines().map(str::trim).filter(|l| !l.is_empty()) {
                match store.add_server_name(name) {
                    Ok(()) => report.names += 1,
                    // A line that is no URL names nothing: skipped, said.
                    Err(e) if e.kind() == kn_journal::ErrorKind::BadRequest => report.warnings.push(format!("{}: {e}", NAMES_FILE)),
                    Err(e) => return Err(SensorError::from_journal(e, "cannot record server name")),
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(SensorError::read(&dir.join(NAMES_FILE).display().to_string(), e)),
    }
    progress.start(count_files(dir));
    import_topic(store, dir, &Topic::root(), &mut report, progress)?;
    Ok(report)
}

/// Event files below `dir` (for the progress bar).
fn count_files(dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else { return 0 };
    let mut n = 0;
    for entry in entries.flatten() {
        if entry.file_name().as_encoded_bytes().starts_with(b".") {
            continue;
        }
        match entry.file_type() {
            Ok(t) if t.is_dir() => n += count_files(&entry.path()),
            Ok(t) if t.is_file() => n += 1,
            _ => {}
        }
    }
    n
}

/// Imports one topic directory: its `kn_subtopics` first (so that the
/// announcements of the children are the imported ones), then its own
/// events, then its routes, then the other children.
fn import_topic(store: &Store, dir: &Path, topic: &Topic, report: &mut ImportReport, progress: &mut dyn Progress) -> Result<(), SensorError> {
    report.topics += 1;
    let entries = fs::read_dir(dir).map_err(|e| SensorError::read(&dir.display().to_string(), e))?;
    let mut files = Vec::new();
    let mut children = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str().map(str::to_string) else {
            report.warnings.push(format!("{}: name is not UTF-8, skipped", entry.path().display()));
            continue;
        };
        if name.starts_with('.') {
            continue;
        }
        match entry.file_type() {
            Ok(t) if t.is_dir() => children.push(name),
            Ok(t) if t.is_file() => files.push(name),
            _ => report.warnings.push(format!("{}: neither a file nor a directory, skipped", entry.path().display())),
        }
    }
    let rank = |n: &String| match n.as_str() {
        kn_journal::SUBTOPICS_SEGMENT => 0,
        kn_journal::ROUTES_SEGMENT => 2,
        _ => 3,
    };
    children.sort_by(|a, b| rank(a).cmp(&rank(b)).then(a.cmp(b)));
    let (first, rest): (Vec<String>, Vec<String>) = children.into_iter().partition(|c| rank(c) == 0);
    for child in first {
        import_child(store, dir, topic, &child, report, progress)?;
    }
    import_events(store, dir, topic, files, report, progress)?;
    if topic.is_journal() {
        if let Ok(at) = fs::metadata(dir.join(HEARTBEAT_FILE)).and_then(|m| m.modified()) {
            store.set_heartbeat(topic, at).map_err(|e| SensorError::from_journal(e, &format!("cannot set the heartbeat of '{topic}'")))?;
            report.heartbeats += 1;
        }
    }
    for child in rest {
        import_child(store, dir, topic, &child, report, progress)?;
    }
    Ok(())
}

fn import_child(
    store: &Store,
    dir: &Path,
    topic: &Topic,
    child: &str,
    report: &mut ImportReport,
    progress: &mut dyn Progress,
) -> Result<(), SensorError> {
    let path = dir.join(child);
    match topic.child(child) {
        Ok(t) => import_topic(store, &path, &t, report, progress),
        Err(e) => {
            report.warnings.push(format!("{}: not a topic name ({e}), skipped", path.display()));
            Ok(())
        }
    }
}

/// The event files of one topic in import order: as `.index` last names
/// them (a replaced event is imported once, where it was last written),
/// then files the index does not name, oldest first.
fn import_order(dir: &Path, files: Vec<String>, report: &mut ImportReport) -> Vec<String> {
    let index = fs::read(dir.join(INDEX_FILE)).unwrap_or_default();
    let listed: Vec<String> = String::from_utf8_lossy(&index).lines().map(|l| l.trim().to_string()).filter(|l| !l.is_empty()).collect();
    let present: HashSet<&String> = files.iter().collect();
    let mut last: HashMap<&String, usize> = HashMap::new();
    for (i, name) in listed.iter().enumerate() {
        last.insert(name, i);
    }
    let mut order: Vec<(usize, &String)> = last.iter().map(|(n, i)| (*i, *n)).collect();
    order.sort();
    let mut out = Vec::new();
    for (_, name) in order {
        if present.contains(name) {
            out.push(name.clone());
        } else {
            report.gone += 1;
        }
    }
    let mut unlisted: Vec<(SystemTime, &String)> = files
        .iter()
        .filter(|f| !last.contains_key(f))
        .map(|f| (fs::metadata(dir.join(f)).and_then(|m| m.modified()).unwrap_or(UNIX_EPOCH), f))
        .collect();
    unlisted.sort();
    out.extend(unlisted.into_iter().map(|(_, f)| f.clone()));
    out
}

fn import_events(
    store: &Store,
    dir: &Path,
    topic: &Topic,
    files: Vec<String>,
    report: &mut ImportReport,
    progress: &mut dyn Progress,
) -> Result<(), SensorError> {
    let order = import_order(dir, files, report);
    // On a journal, events identical to ones already there (a rerun) are
    // skipped, as many times as they are already there.
    let mut existing: HashMap<u64, usize> = HashMap::new();
    if topic.is_journal() && !order.is_empty() {
        let stored = store.stored_events(topic).map_err(|e| SensorError::from_journal(e, &format!("cannot read '{topic}'")))?;
        for event in stored {
            *existing.entry(fingerprint(&event)).or_default() += 1;
        }
    }
    let t = kn_journal::internal::now();
    for name in order {
        let path = dir.join(&name);
        let read = read_file(&path, &name);
        progress.advance();
        let (event, stored_at) = match read {
            Ok(x) => x,
            Err(why) => {
                report.warnings.push(why);
                continue;
            }
        };
        if topic.is_journal() {
            if let Some(n) = existing.get_mut(&fingerprint(&event)).filter(|n| **n > 0) {
                *n -= 1;
                report.already += 1;
                continue;
            }
        }
        let expired = event.is_expired(t);
        match store.restore(topic, event, stored_at) {
            Ok(Some(_)) => {
                report.imported += 1;
                report.expired += usize::from(expired);
            }
            Ok(None) => report.already += 1,
            Err(e) if matches!(e.kind(), kn_journal::ErrorKind::TooLarge) => report.warnings.push(format!("{}: {e}", path.display())),
            Err(e) => return Err(SensorError::from_journal(e, &format!("cannot import '{}'", path.display()))),
        }
    }
    Ok(())
}

/// Reads one event file into the event to store (every default filled in,
/// so that a rerun builds the very same event) and its modification time.
fn read_file(path: &Path, name: &str) -> Result<(Event, f64), String> {
    let meta = fs::metadata(path).map_err(|e| format!("{}: {e}, skipped", path.display()))?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(format!("{}: {} bytes, larger than the original's limit of {MAX_FILE_BYTES}, skipped", path.display(), meta.len()));
    }
    let mtime = meta.modified().ok().and_then(|m| m.duration_since(UNIX_EPOCH).ok()).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    let bytes = fs::read(path).map_err(|e| format!("{}: {e}, skipped", path.display()))?;
    let mut event = parse_event(&bytes).ok_or_else(|| format!("{}: no blank line after the elements (truncated?), skipped", path.display()))?;
    if event.id().is_none_or(|id| id.is_empty()) {
        // On an ordinary topic the file name is the kn_id.
        event.set(KN_ID, name);
    }
    if !event.contains(KN_TIME_T) {
        event.set(KN_TIME_T, format_time(mtime.floor()));
    }
    if let Some(v) = event.get(KN_EXPIRES) {
        if v.trim_ascii_start().starts_with(b"+") {
            if let Ok(Some(at)) = event.expires_at(mtime) {
                event.set(KN_EXPIRES, format_time(at));
            }
        }
    }
    event.remove(KN_ROUTE_CHECKPOINT);
    Ok((event, mtime))
}

/// Identifies an event by all its elements but the checkpoint.
fn fingerprint(event: &Event) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for (name, value) in event.elements().filter(|(n, _)| *n != KN_ROUTE_CHECKPOINT) {
        name.hash(&mut h);
        value.hash(&mut h);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_decode_anywhere_and_bad_ones_stay() {
        assert_eq!(unescape(b"=3A=3a=0A=3D"), b"::\n=");
        assert_eq!(unescape(b"a=zz=4"), b"a=zz=4");
        assert_eq!(unescape(b"="), b"=");
        assert_eq!(unescape(b"x=20"), b"x ");
    }

    #[test]
    fn lines_split_at_the_first_colon_and_keep_escaped_edges() {
        let e = parse_event(b"a: b: c\nsp:=20x=20\n\n").unwrap();
        assert_eq!(e.get("a"), Some(&b"b: c"[..]));
        assert_eq!(e.get("sp"), Some(&b" x "[..]));
        assert_eq!(e.payload(), b"");
        assert!(parse_event(b"a: b\n").is_none(), "no blank line: truncated");
    }
}
