//! Receipts (docs/PRESENCE.md, "Receipts"): for an event of a topic,
//! which journals routed from the topic hold it, which have sent it to a
//! live client, and whose client has confirmed it.
//!
//! What a journal's clients did is kept in one small file per journal,
//! `.receipts` (`receipts_file.rs`; FORMAT.md, "Receipts"): the highest checkpoint a client
//! confirmed (an acknowledgement, or an SSE reconnection's
//! `Last-Event-ID`), and the ranges of checkpoints live tunnels sent. A
//! tunnel writes its range at most once per `Config::receipts_flush` and
//! when it ends, never on a publisher's path; a write replaces the whole
//! file by `rename` (readers take no lock and never see half of one),
//! under the file's own `flock` (writers of one journal, in any process,
//! one at a time).

use std::path::Path;

use crate::error::{Error, ErrorKind, Result};
use crate::event::*;
use crate::ids::now;
use crate::log;
use crate::topic::Topic;

use super::receipts_file::{read_receipts, update_receipts};
use super::routes::Route;
use super::{Destination, Store};

/// A copy of the event in a journal was stored at most this many seconds
/// before the event itself (clocks of two processes, whole seconds).
const CLOCK_SLACK: u64 = 2;

/// What [`Store::receipts`] found for one route of the topic into a
/// journal of this store.
#[derive(Clone, Debug, PartialEq)]
pub struct Receipt {
    /// The journal the route delivers to.
    pub journal: Topic,
    /// The route (its id, creator and `kn_unread_*` settings).
    pub route: Route,
    /// The checkpoint of the journal's copy of the event, when the
    /// journal holds one (unexpired).
    pub holds: Option<u64>,
    /// A live tunnel of the journal sent that copy to its client.
    pub sent: bool,
    /// The journal's client confirmed that copy (or a later event).
    pub confirmed: bool,
    /// Whether the asker may know the route, and so the subscriber (its
    /// journal, route and creator): always from [`Store::receipts`];
    /// [`AsUser::receipts`](crate::access::AsUser::receipts) says it by
    /// the access rules.
    pub visible: bool,
}

/// What [`Store::receipts`] returns: the event, and one [`Receipt`] per
/// active route of the topic into a journal of this store, in the order
/// of the routes.
#[derive(Clone, Debug, PartialEq)]
pub struct Receipts {
    /// The topic.
    pub topic: Topic,
    /// The event's `kn_id`.
    pub id: Vec<u8>,
    /// The event's checkpoint in the topic.
    pub checkpoint: u64,
    /// One per journal routed from the topic, at most
    /// `Config::receipts_max_journals`.
    pub journals: Vec<Receipt>,
    /// The routes into journals past `Config::receipts_max_journals`:
    /// counted, their journals not read.
    pub not_read: usize,
}

impl Store {
    /// The receipts of the current event with `kn_id` `id` of `topic`
    /// (docs/PRESENCE.md, "Receipts"); `None` when the topic has no
    /// unexpired event of that id. Reads the topic back to the event, and
    /// each routed journal back to the time the event was stored: at most
    /// `Config::receipts_max_journals` of them, in the order of the
    /// routes; the rest are counted in [`Receipts::not_read`].
    pub fn receipts(&self, topic: &Topic, id: &[u8]) -> Result<Option<Receipts>> {
        let found = self.newest_of_id(topic, id)?;
        let t = now();
        let Some(record) = found.filter(|r| !r.event.is_expired(t)) else {
            return Ok(None);
        };
        let mut journals = Vec::new();
        let mut not_read = 0;
        for route in self.routes(topic)? {
            let Ok(Destination::Local(journal)) = self.route_target(route.destination()) else {
                continue;
            };
            if !journal.is_journal() {
                continue;
            }
            if journals.len() >= self.config.receipts_max_journals {
                not_read += 1;
                continue;
            }
            let jdir = self.dir(&journal);
            let holds = self.copy_in(&jdir, id, &route, record.stored_secs)?;
            let state = read_receipts(&jdir, &self.config);
            journals.push(Receipt {
                journal,
                holds,
                sent: holds.is_some_and(|s| state.was_sent(s)),
                confirmed: holds.is_some_and(|s| s <= state.confirmed),
                route,
                visible: true,
            });
        }
        Ok(Some(Receipts {
            topic: topic.clone(),
            id: id.to_vec(),
            checkpoint: record.seq,
            journals,
            not_read,
        }))
    }

    /// The checkpoint of the newest unexpired copy, in the journal of
    /// `jdir`, of event `id` delivered along `route`, stored no earlier
    /// than the event (`stored`, whole seconds).
    fn copy_in(&self, jdir: &Path, id: &[u8], route: &Route, stored: u64) -> Result<Option<u64>> {
        if !jdir.is_dir() {
            return Ok(None);
        }
        let t = now();
        let mut found = None;
        log::read_backwards_after(jdir, 0, |r| {
            if r.stored_secs.saturating_add(CLOCK_SLACK) < stored {
                return false;
            }
            if r.event.id() == Some(id) && is_copy_along(&r.event, route) && !r.event.is_expired(t)
            {
                found = Some(r.seq);
                return false;
            }
            true
        })?;
        Ok(found)
    }

    /// Records that the client of `journal` confirmed every event up to
    /// `checkpoint` (an acknowledgement, or an SSE reconnection's
    /// `Last-Event-ID`). `Ok(None)` when the journal does not exist; a
    /// checkpoint that is not a number or lies past the journal's end is
    /// refused (`BadRequest`), as is a topic that is not a journal. Never
    /// lowers what was confirmed before.
    pub fn confirm(&self, journal: &Topic, checkpoint: &[u8]) -> Result<Option<u64>> {
        if !journal.is_journal() {
            return Err(Error::new(
                ErrorKind::BadRequest,
                format!("'{journal}' is not a journal: only a journal's client confirms events"),
            ));
        }
        let text = String::from_utf8_lossy(checkpoint);
        let digits = !text.trim().is_empty() && text.trim().bytes().all(|b| b.is_ascii_digit());
        let Some(seq) = text.trim().parse::<u64>().ok().filter(|_| digits) else {
            return Err(Error::new(ErrorKind::BadRequest, format!("bad checkpoint '{text}': expected the kn_route_checkpoint of an event of '{journal}'")));
        };
        let dir = self.checked_dir(journal)?;
        if !dir.is_dir() {
            return Ok(None);
        }
        let end = log::cursor_at_end(&dir)?.last_seq();
        if seq > end {
            return Err(Error::new(
                ErrorKind::BadRequest,
                format!("checkpoint {seq} lies past the end of '{journal}' (its last is {end}): not one this journal gave"),
            ));
        }
        update_receipts(&dir, &self.config, true, |r| {
            r.confirmed = r.confirmed.max(seq)
        })?;
        Ok(Some(seq))
    }
}

/// True when `event`, an event of a journal, came along `route`.
pub(crate) fn is_copy_along(event: &Event, route: &Route) -> bool {
    event.get(KN_ROUTE_ID) == Some(route.id())
        && event
            .get(KN_ROUTED_FROM)
            .is_some_and(|from| from.ends_with(route.source.as_str().as_bytes()))
}
