//! `<topic>/kn_presence` (docs/PRESENCE.md): who is connected to a topic
//! now, kept as an ordinary topic that the server writes, one event per
//! journal (its `kn_id` derived from the journal's name), a `join` while
//! the journal has a live tunnel and a `leave` once it has had none for
//! `Config::presence_debounce`.
//!
//! Nothing here runs for a topic nobody asks about, and nothing on the
//! post path: a *presence pass* runs only where someone reads
//! `kn_presence` (a tunnel on it, every `Config::presence_pass`; a read
//! or a new route from it, once). The pass compares who is connected —
//! the active routes of the topic into local journals, each journal's
//! mark (its byte of `.kn_readers`) held by a live tunnel in any process
//! (readers.rs) —
//! with the topic's current events, and posts the differences. The
//! passes of all readers, in any process on any host, take turns under
//! one lock (`.presence` in the topic's directory, which also keeps the
//! journals found absent and since when, for the debounce), so each
//! change is posted once and every reader sees the same events, through
//! the ordinary tunnel machinery.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write as _};
use std::path::Path;
use std::time::UNIX_EPOCH;

use crate::access::Principal;
use crate::error::{Error, Result};
use crate::event::{format_time, Event, KN_EXPIRES, KN_ID, KN_PAYLOAD, KN_PRESENCE, KN_PRESENCE_JOURNAL, KN_PRESENCE_LEFT, KN_PRESENCE_ROUTE, KN_PRESENCE_SINCE};
use crate::ids::now;
use crate::shared::LockKind;
use crate::topic::Topic;

use super::read::Selection;
use super::{Destination, Store};

/// The file, in a `kn_presence` topic's directory, whose lock orders the
/// presence passes and whose content lists the journals found absent:
/// one line each, `<seconds since the epoch> <journal>`.
const STATE_FILE: &str = ".presence";

/// How long a `leave` stays in the topic (its `kn_expires`): a reader
/// that reconnects within it resumes past it; afterwards a read gives
/// only the journals connected.
pub const LEAVE_KEPT_SECS: u64 = 300;

/// In the store root: the `kn_presence` topics that static routes read,
/// one per line, for [`Store::pass_routed_presence`].
const ROUTED_FILE: &str = ".presence-routed";

/// What one presence pass posted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PresenceChanges {
    /// The journals that joined, in name order.
    pub joined: Vec<Topic>,
    /// The journals that left, in name order.
    pub left: Vec<Topic>,
    /// False when another pass held the lock (it posts what changed).
    pub ran: bool,
}

/// A subscriber of the topic: a journal routed from it.
struct Subscriber {
    route: Route,
    /// When its current run of tunnels began (`.readers`'s mtime).
    since: f64,
}

/// The route that makes a journal a subscriber: its id and its creator.
struct Route {
    id: Vec<u8>,
    creator: Principal,
}

impl Store {
    /// Brings the presence topic `presence` (`T/kn_presence`) up to date
    /// with who is connected to `T` now (docs/PRESENCE.md): posts a
    /// `join` for each journal routed from `T` with a live tunnel that the
    /// topic does not show as joined, and a `leave` for each it shows
    /// that has had no live tunnel for `presence_debounce`. Returns at
    /// once, posting nothing, when another pass (of any process) runs.
    pub fn presence_pass(&self, presence: &Topic) -> Result<PresenceChanges> {
        self.presence_pass_with(presence, false)
    }

    /// [`Store::presence_pass`] for the periodic passes (a tunnel's, the
    /// sweep's): none when any process finished one less than half a
    /// `presence_pass` ago, so that many readers of one topic share about
    /// two passes a period instead of each making its own.
    pub(super) fn presence_pass_if_due(&self, presence: &Topic) -> Result<PresenceChanges> {
        self.presence_pass_with(presence, true)
    }

    fn presence_pass_with(&self, presence: &Topic, only_if_due: bool) -> Result<PresenceChanges> {
        let mut changes = PresenceChanges::default();
        let Some(owner) = presence.parent().filter(|_| presence.is_presence()) else {
            return Ok(changes);
        };
        if !self.dir(&owner).is_dir() {
            return Ok(changes); // no topic, no routes
        }
        let dir = self.dir(presence);
        if !dir.is_dir() {
            // Asked about for the first time: created, as a tunnel
            // creates its topic (announced in the owner's `kn_subtopics`).
            let mut report = super::report::PostReport::default();
            let jobs = self.ensure_topic(presence, &mut report)?;
            self.run_forwarding(jobs.into(), &mut report)?;
        }
        let path = dir.join(STATE_FILE);
        let mut state = match crate::log::open_shared(&path, false) {
            Ok(file) => file,
            // The topic was removed meanwhile: nobody reads it.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(changes),
            Err(e) => return Err(Error::io("cannot open", &path, e)),
        };
        match crate::shared::try_lock(&state, LockKind::Exclusive, &self.config) {
            Ok(true) => {}
            Ok(false) => return Ok(changes),
            Err(e) => return Err(Error::io("cannot lock", &path, e)),
        }
        // The state file's mtime: when the last pass ended (set below).
        let last = state.metadata().and_then(|m| m.modified()).ok();
        let recent = last.and_then(|t| t.elapsed().ok()).is_some_and(|age| age < self.config.presence_pass / 2);
        if only_if_due && recent {
            crate::shared::unlock(&state, &self.config);
            return Ok(changes);
        }
        changes.ran = true;
        let result = self.presence_pass_locked(presence, &owner, &mut state, &path, &mut changes);
        touch_now(&state);
        crate::shared::unlock(&state, &self.config);
        result.map(|()| changes)
    }

    fn presence_pass_locked(
        &self,
        presence: &Topic,
        owner: &Topic,
        state: &mut File,
        path: &Path,
        changes: &mut PresenceChanges,
    ) -> Result<()> {
        let t = now();
        let mut absent = read_absent(state);
        let before = absent.clone();
        let shown = self.presence_shown(presence)?;
        let connected = self.connected_subscribers(owner)?;
        for (journal, subscriber) in &connected {
            absent.remove(journal);
            if !shown.contains_key(journal) {
                self.post(presence, join_event(journal, subscriber))?;
                changes.joined.push(journal.clone());
            }
        }
        absent.retain(|journal, _| shown.contains_key(journal));
        let debounce = self.config.presence_debounce.as_secs_f64();
        for (journal, join) in &shown {
            if connected.contains_key(journal) {
                continue;
            }
            let since = *absent.entry(journal.clone()).or_insert(t);
            if t - since >= debounce {
                self.post(presence, leave_event(journal, join, since, t))?;
                absent.remove(journal);
                changes.left.push(journal.clone());
            }
        }
        if absent != before {
            write_absent(state, &absent).map_err(|e| Error::io("cannot write", path, e))?;
        }
        Ok(())
    }

    /// Notes that a static route reads `presence` (a `kn_presence`
    /// topic), so that [`Store::pass_routed_presence`] keeps it up to date
    /// with no tunnel on it. One line appended the first time, at the end
    /// under the file's exclusive lock (not `O_APPEND`, which loses lines
    /// two CephFS hosts append: `shared::append`).
    pub(super) fn note_routed_presence(&self, presence: &Topic) -> Result<()> {
        let path = self.config.root.join(ROUTED_FILE);
        let mut file = crate::log::open_shared(&path, false).map_err(|e| Error::io("cannot open", &path, e))?;
        crate::shared::lock(&file, crate::shared::LockKind::Exclusive, &self.config).map_err(|e| Error::io("cannot lock", &path, e))?;
        let mut text = String::new();
        let _ = file.read_to_string(&mut text);
        let noted = if text.lines().any(|line| line == presence.as_str()) {
            Ok(())
        } else {
            crate::shared::append(&file, format!("{presence}\n").as_bytes()).map_err(|e| Error::io("cannot append to", &path, e))
        };
        crate::shared::unlock(&file, &self.config);
        noted
    }

    /// A presence pass on each `kn_presence` topic that static routes
    /// read ([`Store::note_routed_presence`]); one no active route reads
    /// any more is forgotten. Run by the sweep's slices (`serve` every
    /// `sweep_interval`; pubsub.cgi after a response, when a slice is
    /// due), under the sweep's lock: one process at a time. Without such
    /// topics, one failed `open`.
    pub(super) fn pass_routed_presence(&self) -> Result<()> {
        let path = self.config.root.join(ROUTED_FILE);
        let Ok(text) = std::fs::read_to_string(&path) else { return Ok(()) };
        let t = now();
        let mut kept = Vec::new();
        for line in text.lines() {
            let Ok(presence) = Topic::parse(line) else { continue };
            if !presence.is_presence() || kept.contains(&presence) {
                continue;
            }
            if self.routes(&presence).map(|routes| routes.iter().any(|r| r.is_active(t))).unwrap_or(true) {
                let _ = self.presence_pass_if_due(&presence);
                kept.push(presence);
            }
        }
        if kept.len() != text.lines().count() {
            // Rewritten whole: a route noted meanwhile is noted again by
            // its next population (rare: only when a line is dropped).
            let body: String = kept.iter().map(|p| format!("{p}\n")).collect();
            let temp = self.config.root.join(format!("{ROUTED_FILE}.{}", std::process::id()));
            crate::log::write_replacing(&temp, &path, body.as_bytes()).map_err(|e| Error::io("cannot write", &path, e))?;
        }
        Ok(())
    }

    /// The journals `presence` shows as joined, with their `join` events.
    fn presence_shown(&self, presence: &Topic) -> Result<BTreeMap<Topic, Event>> {
        let mut shown = BTreeMap::new();
        for event in self.select(presence, &Selection::all(), false)?.events {
            if event.get(KN_PRESENCE) != Some(b"join") {
                continue;
            }
            let journal = event
                .get(KN_PRESENCE_JOURNAL)
                .and_then(|j| Topic::parse_bytes(j).ok());
            if let Some(journal) = journal {
                shown.insert(journal, event);
            }
        }
        Ok(shown)
    }

    /// The journals routed from `owner` (by an active route, the first
    /// one listed when several) whose tunnel is live now, by name.
    fn connected_subscribers(&self, owner: &Topic) -> Result<BTreeMap<Topic, Subscriber>> {
        let mut connected = BTreeMap::new();
        let t = now();
        let mut routes: HashMap<Topic, Route> = HashMap::new();
        for route in self.routes(owner)? {
            if !route.is_active(t) {
                continue;
            }
            let Ok(Destination::Local(journal)) = self.route_target(route.destination()) else {
                continue;
            };
            if journal.is_journal() {
                routes.entry(journal).or_insert_with(|| Route {
                    id: route.id().to_vec(),
                    creator: Principal::creator_of(&route.event),
                });
            }
        }
        for (journal, route) in routes {
            let dir = self.dir(&journal);
            if self.has_live_readers(&dir) {
                let since = live_since(&dir.join(super::readers::READERS_FILE)).unwrap_or(t);
                connected.insert(journal, Subscriber { route, since });
            }
        }
        Ok(connected)
    }
}

/// The presence events' `kn_id` for `journal`: stable, so that the topic
/// holds one current event per journal (a `leave` replaces the `join`).
/// FNV-1a of the name: the same in every process and on every host.
pub fn presence_id(journal: &Topic) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in journal.as_str().bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("kn_presence_{h:016x}")
}

fn join_event(journal: &Topic, subscriber: &Subscriber) -> Event {
    let mut e = Event::new();
    e.set(KN_ID, presence_id(journal))
        .set(KN_PAYLOAD, journal.as_str())
        .set(KN_PRESENCE, "join")
        .set(KN_PRESENCE_JOURNAL, journal.as_str())
        .set(KN_PRESENCE_SINCE, format_time(subscriber.since.floor()))
        .set(KN_PRESENCE_ROUTE, subscriber.route.id.clone());
    subscriber.route.creator.record_as_creator(&mut e);
    e
}

fn leave_event(journal: &Topic, join: &Event, left: f64, t: f64) -> Event {
    let mut e = Event::new();
    e.set(KN_ID, presence_id(journal))
        .set(KN_PAYLOAD, journal.as_str())
        .set(KN_PRESENCE, "leave")
        .set(KN_PRESENCE_JOURNAL, journal.as_str())
        .set(KN_PRESENCE_LEFT, format_time(left.floor()))
        .set(
            KN_EXPIRES,
            format_time((t + LEAVE_KEPT_SECS as f64).floor()),
        );
    for name in [KN_PRESENCE_SINCE, KN_PRESENCE_ROUTE] {
        if let Some(v) = join.get(name) {
            e.set(name, v);
        }
    }
    Principal::creator_of(join).record_as_creator(&mut e);
    e
}

/// Sets `file`'s times to now (any writer of the file may).
fn touch_now(file: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: futimens reads no memory when given a null pointer; the
    // descriptor is open for the call's duration.
    let _ = unsafe { libc::futimens(file.as_raw_fd(), std::ptr::null()) };
}

/// When the journal's current run of tunnels began: the first tunnel
/// opened while none was open sets the modification time of `.readers`.
fn live_since(readers: &Path) -> Option<f64> {
    let modified = std::fs::metadata(readers).ok()?.modified().ok()?;
    Some(modified.duration_since(UNIX_EPOCH).ok()?.as_secs_f64())
}

/// The journals found absent, and since when; a damaged line is skipped
/// (the journal is then found absent again, from now).
fn read_absent(state: &mut File) -> BTreeMap<Topic, f64> {
    let mut text = String::new();
    if state.seek(SeekFrom::Start(0)).is_err() || state.read_to_string(&mut text).is_err() {
        return BTreeMap::new();
    }
    text.lines()
        .filter_map(|line| {
            let (since, journal) = line.split_once(' ')?;
            Some((
                Topic::parse(journal).ok()?,
                since.parse::<f64>().ok().filter(|s| s.is_finite())?,
            ))
        })
        .collect()
}

fn write_absent(state: &mut File, absent: &BTreeMap<Topic, f64>) -> std::io::Result<()> {
    let mut text = String::new();
    for (journal, since) in absent {
        text.push_str(&format!("{since} {journal}\n"));
    }
    state.set_len(0)?;
    state.seek(SeekFrom::Start(0))?;
    state.write_all(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presence_ids_are_stable_and_distinct() {
        let a = Topic::parse("/who/anna/kn_journal").unwrap();
        let b = Topic::parse("/who/bob/kn_journal").unwrap();
        assert_eq!(presence_id(&a), presence_id(&a.clone()));
        assert_ne!(presence_id(&a), presence_id(&b));
        assert!(presence_id(&a).starts_with("kn_presence_") && presence_id(&a).len() == 28);
    }
}
