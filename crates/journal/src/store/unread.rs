//! Escalation of unread events (docs/PRESENCE.md, "Receipts"): a route
//! into a journal made with `kn_unread_after=SECONDS` and
//! `kn_unread_to=TOPIC` posts, for each event it delivered that the
//! journal's client has not confirmed within that time, one escalation
//! event to that topic.
//!
//! Such a route is registered in `.unread/` (FORMAT.md, "Receipts:
//! `.receipts` and `.unread/`"), one file per route, with beside it the route's cursor:
//! the journal's checkpoint up to which its copies were looked at. The
//! background passes (`serve` every second, pubsub.cgi's sweep slices,
//! `kn gc`: [`Store::complete_unread_escalations`]) take a registration's
//! lock without waiting (one process at a time checks a route), post what
//! is due and move the cursor on. Exactly once: an escalation's `kn_id`
//! and elements follow from the route and the copy alone, and it goes to
//! an ordinary topic, so posting it again after a crash between the post
//! and the cursor's write is a duplicate, neither stored nor forwarded.

use std::fs::{self, File};
use std::io::ErrorKind as IoKind;
use std::path::{Path, PathBuf};

use crate::error::{Error, ErrorKind, Result};
use crate::event::*;
use crate::ids::{fresh_id, now};
use crate::log::{self, LogCursor};
use crate::shared::LockKind;
use crate::topic::Topic;

use super::receipts::is_copy_along;
use super::receipts_file::read_receipts;
use super::routes::Route;
use super::{Destination, Store};

/// The route element: seconds a delivered event may stay unconfirmed.
pub const KN_UNREAD_AFTER: &str = "kn_unread_after";
/// The route element: the topic escalations are posted to.
pub const KN_UNREAD_TO: &str = "kn_unread_to";
/// The element of an escalation event naming its route; its presence
/// also keeps an escalation that comes back along the same route from
/// being escalated again.
pub const KN_UNREAD_ROUTE: &str = "kn_unread_route";

/// The directory of registered escalating routes, in the store root.
pub(crate) const UNREAD_DIR: &str = ".unread";

const MAGIC: &str = "KNu1";

/// A registration whose route is not (yet) there is removed once it is
/// this old, in seconds (a route request registers before it posts the
/// route).
const ORPHAN_GRACE: u64 = 60;

/// What a route's escalation asks for.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Unread {
    after: u64,
    to: Topic,
}

impl Store {
    /// The escalation a new route's elements ask for, checked: both
    /// `kn_unread_after` (whole seconds, 1 to `max_unread_after`) and
    /// `kn_unread_to` (an ordinary topic of this store, not the source),
    /// on a route into a journal of this store; anything else `400`.
    pub(super) fn unread_of_params(
        &self,
        from: &Topic,
        params: &Event,
        journal: Option<&Topic>,
    ) -> Result<Option<Unread>> {
        let (after, to) = match (params.get(KN_UNREAD_AFTER), params.get(KN_UNREAD_TO)) {
            (None, None) => return Ok(None),
            (Some(_), None) => {
                return Err(bad(format!(
                    "{KN_UNREAD_AFTER} needs {KN_UNREAD_TO}: the topic escalations are posted to"
                )))
            }
            (None, Some(_)) => return Err(bad(format!(
                "{KN_UNREAD_TO} needs {KN_UNREAD_AFTER}: the seconds an event may stay unconfirmed"
            ))),
            (Some(after), Some(to)) => (after, to),
        };
        let text = String::from_utf8_lossy(after);
        let t = text.trim();
        let max = self.config.max_unread_after.as_secs();
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad(format!(
                "bad {KN_UNREAD_AFTER} '{text}': expected whole seconds (1 to {max})"
            )));
        }
        let after = match t.parse::<u64>() {
            Ok(0) => return Err(bad(format!("bad {KN_UNREAD_AFTER} '{text}': at least 1 second"))),
            Ok(n) if n <= max => n,
            _ => return Err(bad(format!("{KN_UNREAD_AFTER} '{text}' is larger than the maximum of {max} seconds (KN_MAX_UNREAD_AFTER)"))),
        };
        if journal.is_none() {
            return Err(bad(format!(
                "{KN_UNREAD_AFTER} is for a route into a journal of this server"
            )));
        }
        let to = match self.resolve(to) {
            Ok(Destination::Local(to)) => to,
            Ok(Destination::Remote(url) | Destination::Push(url)) => {
                return Err(bad(format!(
                    "bad {KN_UNREAD_TO} '{url}': not a topic of this server"
                )))
            }
            Err(e) => return Err(bad(format!("bad {KN_UNREAD_TO}: {}", e.message()))),
        };
        self.check_topic_size(&to)?;
        if to.is_journal() || to.is_reserved() {
            // A journal keeps every copy: a repeat after a crash would be
            // a second escalation.
            return Err(bad(format!("bad {KN_UNREAD_TO} '{to}': escalations go to an ordinary topic, not a journal or a reserved one")));
        }
        if &to == from {
            return Err(bad(format!("bad {KN_UNREAD_TO} '{to}': the route's own source would deliver its escalations again")));
        }
        Ok(Some(Unread { after, to }))
    }

    /// The escalation a stored route asks for (`None`: none, or not
    /// valid any more).
    fn unread_of_route(&self, route: &Route) -> Option<Unread> {
        let after = std::str::from_utf8(route.event.get(KN_UNREAD_AFTER)?)
            .ok()?
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|a| *a > 0)?;
        match self.resolve(route.event.get(KN_UNREAD_TO)?) {
            Ok(Destination::Local(to)) if !to.is_journal() && !to.is_reserved() => {
                Some(Unread { after, to })
            }
            _ => None,
        }
    }

    /// Registers route `id` of `from` into `journal` as escalating, its
    /// cursor at the journal's end (kept when already registered): made
    /// before the route is posted, so that no delivery escapes it.
    pub(super) fn register_unread(&self, from: &Topic, id: &[u8], journal: &Topic) -> Result<()> {
        let dir = self.config.root.join(UNREAD_DIR);
        // The store's mode: every process of the store (the web server's
        // user, the tools') writes there.
        if let Err(e) = super::create_topic_dir(&dir) {
            if e.kind() != IoKind::AlreadyExists {
                return Err(Error::io("cannot create", &dir, e));
            }
        }
        let name = registration_name(from, id);
        let path = dir.join(&name);
        let text = format!("{MAGIC}\n{}\n{}\n{}\n", from.as_str(), hex(id), journal.as_str());
        let at = dir.join(format!("{name}.at"));
        // The same route again keeps its cursor; one into another journal
        // starts at that journal's end.
        let same = fs::read_to_string(&path).is_ok_and(|old| old == text);
        if !same {
            write_replacing(&dir, &path, text.as_bytes())?;
        }
        if !same || !at.exists() {
            let jdir = self.dir(journal);
            let end = if jdir.is_dir() {
                log::cursor_at_end(&jdir)?.last_seq()
            } else {
                0
            };
            write_replacing(&dir, &at, format!("{end}\n").as_bytes())?;
        }
        Ok(())
    }

    /// Posts the escalations that are due (see the module documentation);
    /// returns how many it posted. Cheap when no route escalates (one
    /// directory read); a route another process is checking is skipped.
    pub fn complete_unread_escalations(&self) -> Result<usize> {
        let dir = self.config.root.join(UNREAD_DIR);
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == IoKind::NotFound => return Ok(0),
            Err(e) => return Err(Error::io("cannot read", &dir, e)),
        };
        let mut posted = 0;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with('.') || name.ends_with(".at") {
                continue;
            }
            posted += self.check_registration(&dir, name).unwrap_or(0);
        }
        Ok(posted)
    }

    fn check_registration(&self, dir: &Path, name: &str) -> Result<usize> {
        let path = dir.join(name);
        let Ok(file) = File::open(&path) else {
            return Ok(0);
        };
        if !crate::shared::try_lock(&file, LockKind::Exclusive, &self.config)
            .map_err(|e| Error::io("cannot lock", &path, e))?
        {
            return Ok(0); // another process is checking it
        }
        let result = self.check_locked(dir, name, &path);
        crate::shared::unlock(&file, &self.config);
        result
    }

    fn check_locked(&self, dir: &Path, name: &str, path: &Path) -> Result<usize> {
        let at_path = dir.join(format!("{name}.at"));
        let forget = || {
            let _ = fs::remove_file(path);
            let _ = fs::remove_file(&at_path);
            Ok(0)
        };
        let text = fs::read_to_string(path).unwrap_or_default();
        let mut lines = text.lines();
        let parsed = (lines.next() == Some(MAGIC))
            .then(|| Some((Topic::parse(lines.next()?).ok()?, unhex(lines.next()?)?)))
            .flatten();
        let Some((source, id)) = parsed else {
            return forget();
        };
        // Nothing new in the journal since the last check: done, without
        // reading the route (a deleted one is forgotten at the journal's
        // next event, or once the journal is gone).
        let registered = lines.next().and_then(|j| Topic::parse(j).ok());
        let cursor = fs::read_to_string(&at_path).ok().and_then(|t| t.trim().parse::<u64>().ok());
        if let (Some(journal), Some(cursor)) = (&registered, cursor) {
            let jdir = self.dir(journal);
            if jdir.is_dir() && log::cursor_at_end(&jdir)?.last_seq() <= cursor {
                return Ok(0);
            }
        }
        let t = now();
        let route = match self.route_of(&source, &id)? {
            Some(route) => route,
            None => {
                let age = fs::metadata(path)
                    .ok()
                    .and_then(|m| m.modified().ok())
                    .and_then(|m| m.elapsed().ok());
                return if age.is_some_and(|a| a.as_secs() > ORPHAN_GRACE) {
                    forget()
                } else {
                    Ok(0)
                };
            }
        };
        if !route.is_active(t) || !route.event.contains(KN_UNREAD_AFTER) {
            return forget();
        }
        // A URL this process does not know as one of the server's names
        // (a tool beside a stopped server): left to a process that does.
        let Some(unread) = self.unread_of_route(&route) else { return Ok(0) };
        let journal = match self.route_target(route.destination()) {
            Ok(Destination::Local(journal)) if journal.is_journal() => journal,
            Ok(Destination::Local(_)) => return forget(),
            _ => return Ok(0),
        };
        let jdir = self.dir(&journal);
        if !jdir.is_dir() {
            return Ok(0);
        }
        let end = log::cursor_at_end(&jdir)?.last_seq();
        let cursor = match fs::read_to_string(&at_path)
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
        {
            Some(cursor) => cursor,
            None => {
                write_replacing(dir, &at_path, format!("{end}\n").as_bytes())?;
                return Ok(0);
            }
        };
        if end <= cursor {
            return Ok(0);
        }
        let confirmed = read_receipts(&jdir, &self.config).confirmed;
        let mut reading = LogCursor::at(cursor, 0, 0, 0);
        let mut moved_to = cursor;
        let mut posted = 0;
        'read: loop {
            let records = log::read_new(&jdir, &mut reading)?;
            if records.is_empty() {
                break;
            }
            for r in records {
                let due = is_copy_along(&r.event, &route)
                    && !r.event.contains(KN_UNREAD_ROUTE)
                    && r.seq > confirmed
                    && !r.event.is_expired(t);
                if due {
                    // Stored times are whole seconds, rounded down: a
                    // second more, so that at least `after` have passed.
                    if (r.stored_secs.saturating_add(unread.after).saturating_add(1) as f64) > t {
                        break 'read; // the later copies are younger still
                    }
                    if !self.escalate(&route, &journal, &unread, name, &r)? {
                        break 'read;
                    }
                    posted += 1;
                    write_replacing(dir, &at_path, format!("{}\n", r.seq).as_bytes())?;
                }
                moved_to = r.seq;
            }
        }
        if moved_to > cursor {
            write_replacing(dir, &at_path, format!("{moved_to}\n").as_bytes())?;
        }
        Ok(posted)
    }

    /// Posts the escalation of copy `r` of `journal`: true when done (or
    /// refused for good: the creator may not post there, the topic is
    /// bad), false to try again at the next pass (an I/O error, a full
    /// disk).
    fn escalate(
        &self,
        route: &Route,
        journal: &Topic,
        unread: &Unread,
        name: &str,
        r: &crate::record::Record,
    ) -> Result<bool> {
        if let Some(rules) = self.access_rules()? {
            let creator = crate::access::Principal::creator_of(&route.event);
            if rules
                .check(&creator, crate::access::Operation::Post, &unread.to)
                .is_err()
            {
                return Ok(true);
            }
        }
        let mut event = Event::new();
        event
            .set(KN_ID, format!("kn_unread.{name}.{}", r.seq))
            .set(KN_PAYLOAD, r.event.payload())
            .set("kn_unread_topic", route.source.as_str())
            .set("kn_unread_event", r.event.id().unwrap_or(b""))
            .set("kn_unread_journal", journal.as_str())
            .set(KN_UNREAD_ROUTE, route.id())
            .set("kn_unread_checkpoint", r.seq.to_string())
            .set("kn_unread_stored", r.stored_secs.to_string())
            .set(KN_UNREAD_AFTER, unread.after.to_string());
        if let Some(creator) = crate::access::Principal::creator_of(&route.event).name() {
            event.set("kn_unread_creator", creator);
        }
        match self.notify(&unread.to, event) {
            Ok(_) => Ok(true),
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::Io | ErrorKind::DiskFull | ErrorKind::Corrupt
                ) =>
            {
                Ok(false)
            }
            Err(_) => Ok(true),
        }
    }
}

fn bad(message: String) -> Error {
    Error::new(ErrorKind::BadRequest, message)
}

/// A registration's file name: 16 hex digits of an FNV-1a hash of the
/// source and the route id (stable across processes and versions).
fn registration_name(from: &Topic, id: &[u8]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in from.as_str().as_bytes().iter().chain(b"\n").chain(id) {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Writes `bytes` to `path` whole, through a temporary file in `dir`
/// renamed over it.
fn write_replacing(dir: &Path, path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp: PathBuf = dir.join(format!(".tmp-{}-{}", std::process::id(), fresh_id()));
    log::write_replacing(&tmp, path, bytes).map_err(|e| Error::io("cannot write", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_ids_round_trip_through_hex() {
        for id in [&b""[..], b"1", b"a\nb\xff"] {
            assert_eq!(unhex(&hex(id)).as_deref(), Some(id));
        }
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
        let t = Topic::parse("/what/x").unwrap();
        assert_eq!(registration_name(&t, b"1"), registration_name(&t, b"1"));
        assert_ne!(registration_name(&t, b"1"), registration_name(&t, b"2"));
    }
}
