//! The window log of a source topic, `S/.windows/` (FORMAT.md, "Journals:
//! windows over their sources", from format version 5; issue 39).
//!
//! A route from a source S into a local journal J opens a *window*: from
//! S's end at that moment on, S's events that pass the route's filter are
//! J's events, numbered `s + w_base` (plus the records placed in J before
//! them: `store/view.rs`). The window log records each opening and
//! closing, written under S's append lock, so that the order of its
//! records is the order of S's events around them.
//!
//! The log is a store-internal log directory (`.lock`, `.head`,
//! `.seg-*`), written with [`Writer`](crate::log::Writer) like every log
//! and read with `read_new`; its name starts with `.`, which no topic
//! segment may, so it is never taken for a topic (`kn topics`, the
//! sweep's walk).
//!
//! Nothing writes windows yet unless `KN_FOLLOW` is on
//! (docs/design/one-copy.md, "The plan", step 3); this module is the format and its
//! reading, and the per-process cache of it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::event::Event;
use crate::log::{self, LogCursor, SpaceGauge, Writer};

/// The window log's directory name inside a source topic's directory.
pub const WINDOWS_DIR: &str = ".windows";

const W_ROUTE: &str = "w_route";
const W_JOURNAL: &str = "w_journal";
const W_FROM: &str = "w_from";
const W_UNTIL: &str = "w_until";
const W_SPENT: &str = "w_spent";
const W_BASE: &str = "w_base";
const W_LOCATION: &str = "w_location";
const W_ROUTED_FROM: &str = "w_routed_from";
const W_ROUTE_ID: &str = "w_route_id";
const W_CONVERTED: &str = "w_converted";
const W_REASON: &str = "w_reason";
const W_FILTER: &str = "w_filter";

/// The hop-by-hop elements of the events a window shows, fixed when it
/// opened (PROTOCOL.md 4: `kn_route_location`, `kn_routed_from`,
/// `kn_route_id`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hop {
    /// `kn_route_location` of the events shown.
    pub location: Vec<u8>,
    /// `kn_routed_from` of the events shown.
    pub routed_from: Vec<u8>,
    /// `kn_route_id` of the events shown.
    pub route_id: Vec<u8>,
}

/// One record of a window log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WindowChange {
    /// A window opens: S's events with seq above `from` are the journal's,
    /// at `s + base` (plus the records placed before them).
    Open {
        /// The route's `kn_id`.
        route: Vec<u8>,
        /// The journal, by canonical topic name.
        journal: String,
        /// S's last seq when the window opened.
        from: u64,
        /// The offset from S's numbers to the journal's.
        base: i64,
        /// The hop-by-hop elements of its events.
        hop: Hop,
        /// The route's `kn_content_filter`, if it has one: a window shows
        /// only the events it matches, also once the route is deleted
        /// (its tombstone has no filter).
        filter: Option<Vec<u8>>,
    },
    /// The route's window closes: it shows S's events up to `until`; every
    /// number of the journal up to `spent + base + k` counts as given.
    Close {
        /// The route's `kn_id`.
        route: Vec<u8>,
        /// The journal, by canonical topic name.
        journal: String,
        /// The last S seq the window shows.
        until: u64,
        /// S's last seq when it closed (at least `until`).
        spent: u64,
        /// Why (empty for a deletion; a poisoning's reason otherwise), so
        /// that a route record owed after a crash can be written from it.
        reason: Vec<u8>,
    },
    /// Every route of S into a journal has its window: S is version 5
    /// from here (docs/design/one-copy.md, "Opening a store of today's release").
    Converted,
}

/// A window as its records left it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    /// The route's `kn_id`.
    pub route: Vec<u8>,
    /// The journal, by canonical topic name.
    pub journal: String,
    /// S's last seq when it opened: it shows S's events above this.
    pub from: u64,
    /// The offset from S's numbers to the journal's.
    pub base: i64,
    /// The hop-by-hop elements of its events.
    pub hop: Hop,
    /// The route's `kn_content_filter`, if it has one.
    pub filter: Option<Vec<u8>>,
    /// When it closed: the last S seq it shows, and S's last seq then.
    pub closed: Option<Closed>,
    /// The seq of its opening record in the window log: windows are told
    /// apart by it (a route deleted and made again opens a new one).
    pub opened_at: u64,
    /// When the opening record was stored, in seconds since the epoch.
    pub opened_secs: u64,
}

/// How a window closed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Closed {
    /// The last S seq the window shows.
    pub until: u64,
    /// S's last seq when it closed.
    pub spent: u64,
    /// Empty for a deletion, a poisoning's reason otherwise.
    pub reason: Vec<u8>,
    /// When the closing record was stored, in seconds since the epoch.
    pub secs: u64,
}

impl Window {
    /// True while no closing record was read for it.
    pub fn is_open(&self) -> bool {
        self.closed.is_none()
    }

    /// True when S's event `seq` is in the window's range (its filter and
    /// expiry aside).
    pub fn holds(&self, seq: u64) -> bool {
        seq > self.from && self.closed.as_ref().is_none_or(|c| seq <= c.until)
    }
}

/// The windows of one source, in the order they opened.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceWindows {
    /// Every window whose opening record was read, open or closed.
    pub windows: Vec<Window>,
    /// A `w_converted` record was read (the source is version 5).
    pub converted: bool,
    /// Records that were not window records (skipped; counted so that
    /// `kn doctor` can say so).
    pub unreadable: usize,
}

impl SourceWindows {
    /// The open window of `route` into `journal`, if any.
    pub fn open_window(&self, route: &[u8], journal: &str) -> Option<&Window> {
        self.windows.iter().rev().find(|w| w.is_open() && w.route == route && w.journal == journal)
    }

    /// The windows into `journal`, in the order they opened.
    pub fn into_journal<'a>(&'a self, journal: &'a str) -> impl Iterator<Item = &'a Window> + 'a {
        self.windows.iter().filter(move |w| w.journal == journal)
    }

    fn apply(&mut self, seq: u64, secs: u64, change: WindowChange) {
        match change {
            WindowChange::Open { route, journal, from, base, hop, filter } => {
                self.windows.push(Window { route, journal, from, base, hop, filter, closed: None, opened_at: seq, opened_secs: secs });
            }
            WindowChange::Close { route, journal, until, spent, reason } => {
                // A closing record without its open window (written twice
                // after a crash, or by a repair) changes nothing.
                if let Some(w) = self.windows.iter_mut().rev().find(|w| w.is_open() && w.route == route && w.journal == journal) {
                    w.closed = Some(Closed { until: until.max(w.from), spent: spent.max(until).max(w.from), reason, secs });
                }
            }
            WindowChange::Converted => self.converted = true,
        }
    }
}

impl WindowChange {
    /// The record's event (its elements, FORMAT.md's table).
    pub fn to_event(&self) -> Event {
        let mut e = Event::new();
        match self {
            WindowChange::Open { route, journal, from, base, hop, filter } => {
                if let Some(filter) = filter {
                    e.set(W_FILTER, filter.clone());
                }
                e.set(W_ROUTE, route.clone())
                    .set(W_JOURNAL, journal.as_bytes())
                    .set(W_FROM, from.to_string())
                    .set(W_BASE, base.to_string())
                    .set(W_LOCATION, hop.location.clone())
                    .set(W_ROUTED_FROM, hop.routed_from.clone())
                    .set(W_ROUTE_ID, hop.route_id.clone());
            }
            WindowChange::Close { route, journal, until, spent, reason } => {
                e.set(W_ROUTE, route.clone())
                    .set(W_JOURNAL, journal.as_bytes())
                    .set(W_UNTIL, until.to_string())
                    .set(W_SPENT, spent.to_string())
                    .set(W_REASON, reason.clone());
            }
            WindowChange::Converted => {
                e.set(W_CONVERTED, "1");
            }
        }
        e
    }

    /// The change a record's event holds; `None` when it is not one (a
    /// record of another version, or damaged past its checksum's
    /// reach: never trusted to number anything).
    pub fn from_event(e: &Event) -> Option<WindowChange> {
        if e.contains(W_CONVERTED) {
            return Some(WindowChange::Converted);
        }
        let route = e.get(W_ROUTE)?.to_vec();
        let journal = std::str::from_utf8(e.get(W_JOURNAL)?).ok()?.to_string();
        if route.is_empty() || journal.is_empty() {
            return None;
        }
        if e.contains(W_FROM) {
            let hop = Hop {
                location: e.get(W_LOCATION).unwrap_or_default().to_vec(),
                routed_from: e.get(W_ROUTED_FROM).unwrap_or_default().to_vec(),
                route_id: e.get(W_ROUTE_ID).unwrap_or_default().to_vec(),
            };
            let filter = e.get(W_FILTER).map(<[u8]>::to_vec);
            return Some(WindowChange::Open { route, journal, from: number(e, W_FROM)?, base: number(e, W_BASE)?, hop, filter });
        }
        let until = number(e, W_UNTIL)?;
        let spent = number(e, W_SPENT)?;
        Some(WindowChange::Close { route, journal, until, spent, reason: e.get(W_REASON).unwrap_or_default().to_vec() })
    }
}

fn number<T: std::str::FromStr>(e: &Event, name: &str) -> Option<T> {
    std::str::from_utf8(e.get(name)?).ok()?.parse().ok()
}

/// The window log's directory of the source topic in `source_dir`.
pub fn windows_dir(source_dir: &Path) -> PathBuf {
    source_dir.join(WINDOWS_DIR)
}

/// Appends `changes` to the window log of the source in `source_dir`
/// (created when missing), in one lock of the log; their seqs in it. The
/// caller holds S's append lock (FORMAT.md's lock order), so that the
/// records sit among S's events where they were decided.
pub fn append(source_dir: &Path, config: &Config, gauge: &SpaceGauge, changes: &[WindowChange]) -> Result<Vec<u64>> {
    let dir = windows_dir(source_dir);
    if log::failpoint("window-eio") {
        return Err(Error::io("cannot write window log", &dir, std::io::Error::from_raw_os_error(libc::EIO)));
    }
    match super::create_topic_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::io("cannot create window log", &dir, e)),
    }
    let mut writer = Writer::open(&dir, config, false)?;
    let secs = crate::ids::now() as u64;
    let mut seqs = Vec::with_capacity(changes.len());
    for change in changes {
        match writer.append(&change.to_event(), secs, gauge)? {
            log::Appended::Stored(seq) => seqs.push(seq),
            log::Appended::Duplicate => {
                return Err(Error::new(ErrorKind::Corrupt, format!("window log '{}' squashed a record", dir.display())));
            }
        }
    }
    Ok(seqs)
}

/// Reads the whole window log of the source in `source_dir` (empty when
/// it has none).
pub fn read(source_dir: &Path) -> Result<SourceWindows> {
    let mut found = SourceWindows::default();
    let mut cursor = LogCursor::at(0, 0, 0, 0);
    read_into(&windows_dir(source_dir), &mut cursor, &mut found)?;
    Ok(found)
}

fn read_into(dir: &Path, cursor: &mut LogCursor, found: &mut SourceWindows) -> Result<()> {
    if !dir.is_dir() {
        return Ok(());
    }
    loop {
        let records = log::read_new(dir, cursor)?;
        if records.is_empty() {
            return Ok(());
        }
        for r in records {
            match WindowChange::from_event(&r.event) {
                Some(change) => found.apply(r.seq, r.stored_secs, change),
                None => found.unreadable += 1,
            }
        }
    }
}

/// The windows of each source a process has read, each brought up to
/// date by reading only what its log gained since (one `stat` when it
/// gained nothing). A window log is append-only and never compacted, so
/// what was read stays true; a log whose cursor no longer fits (a source
/// removed and made again) is read again from the start.
#[derive(Default)]
pub struct WindowCache {
    sources: Mutex<HashMap<PathBuf, Cached>>,
}

/// What was read of one window log: up to `cursor`, of the directory
/// whose inode was `ino` (0: none yet).
struct Cached {
    ino: u64,
    cursor: LogCursor,
    found: SourceWindows,
}

impl Cached {
    fn empty(ino: u64) -> Cached {
        Cached { ino, cursor: LogCursor::at(0, 0, 0, 0), found: SourceWindows::default() }
    }
}

impl WindowCache {
    /// The windows of the source in `source_dir` as its log holds them now.
    pub fn get(&self, source_dir: &Path) -> Result<SourceWindows> {
        use std::os::unix::fs::MetadataExt;
        let dir = windows_dir(source_dir);
        let ino = match std::fs::metadata(&dir) {
            Ok(m) => m.ino(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(Error::io("cannot look at window log", &dir, e)),
        };
        let mut sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
        let cached = sources.entry(source_dir.to_path_buf()).or_insert_with(|| Cached::empty(ino));
        if cached.ino != ino {
            // Removed, or removed and made again: what was read is void.
            *cached = Cached::empty(ino);
        }
        if ino != 0 {
            read_into(&dir, &mut cached.cursor, &mut cached.found)?;
        }
        Ok(cached.found.clone())
    }

    /// Forgets what was read of `source_dir` (its topic was removed).
    pub fn forget(&self, source_dir: &Path) {
        self.sources.lock().unwrap_or_else(|p| p.into_inner()).remove(source_dir);
    }
}

/// What `kn doctor` says of a store's format (issue 39): how many topics
/// keep a window log (`S/.windows`, written with `Config::follow`) and how
/// many of those are converted (`w_converted`). A store is format 4 while
/// its journals hold copies, which they all do until the switch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreFormat {
    /// The format readers read: 4 (journals hold their copies) until the
    /// switch to views (docs/design/one-copy.md, step 6).
    pub version: u32,
    /// Topics with a window log.
    pub window_logs: usize,
    /// Of those, how many hold a `w_converted` record.
    pub converted: usize,
    /// Window records no reader could read (damaged past their checksum's
    /// reach, or of another version).
    pub unreadable: usize,
}

impl std::fmt::Display for StoreFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "store format {}: journals hold one copy of each event they show", self.version)?;
        if self.window_logs > 0 {
            write!(
                f,
                "; {} topics keep window logs (KN_FOLLOW, issue 39: written beside the copies, not yet read), {} converted",
                self.window_logs, self.converted
            )?;
        }
        if self.unreadable > 0 {
            write!(f, "; {} unreadable window records", self.unreadable)?;
        }
        Ok(())
    }
}
