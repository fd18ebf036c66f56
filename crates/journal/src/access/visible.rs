//! What a reader is shown, after the request that opened the reading was
//! allowed: the events of an introspection topic (`kn_subtopics`,
//! `kn_routes`, `kn_presence`) the reader may know of, and whether an open tunnel's
//! reader may still read its topic (docs/ACCESS.md, "What is checked").

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::event::Event;
use crate::store::Store;
use crate::topic::{Topic, PRESENCE_SEGMENT, ROUTES_SEGMENT, SUBTOPICS_SEGMENT};

use super::{Operation, Principal, Rules};

impl Rules {
    /// Whether `who`, who may read `topic`, may see `event` of it. Only
    /// introspection topics hide events: a `kn_subtopics` announcement is
    /// shown to those who may read the subtopic it announces; a route of
    /// `kn_routes` to its creator and to those who may `route` to or
    /// `delete` routes of its source, and so is a `kn_presence` event
    /// (which carries its route's creator). Anything else is shown.
    pub fn may_see(&self, who: &Principal, topic: &Topic, event: &Event) -> bool {
        let Some(owner) = topic.parent() else { return true };
        match topic.last_segment() {
            Some(SUBTOPICS_SEGMENT) => {
                let announced = std::str::from_utf8(event.payload()).ok().and_then(|segment| owner.child(segment).ok());
                announced.is_some_and(|subtopic| self.check(who, Operation::Read, &subtopic).is_ok())
            }
            // A presence event names a route's journal and creator: shown
            // to those who may see that route (docs/PRESENCE.md).
            Some(ROUTES_SEGMENT) | Some(PRESENCE_SEGMENT) => {
                (who.is_identified() && Principal::creator_of(event) == *who)
                    || self.check(who, Operation::Route, &owner).is_ok()
                    || self.check(who, Operation::Delete, &owner).is_ok()
            }
            _ => true,
        }
    }

    /// Keeps of `events` (of `topic`) those `who` may see ([`Rules::may_see`]).
    pub fn retain_visible(&self, who: &Principal, topic: &Topic, events: &mut Vec<Event>) {
        if topic.is_reserved() {
            events.retain(|e| self.may_see(who, topic, e));
        }
    }
}

/// The reader of a tunnel opened through [`Store::as_user`]: each delivery
/// checks again, against the rules in force then, that the reader may
/// still read the topic (the answer kept until the rules change), and
/// hides what an introspection topic's reader may not see.
#[derive(Debug)]
pub(crate) struct Reader {
    who: Principal,
    /// The rules' last answer, with the rules that gave it.
    last: Option<(Arc<Rules>, Option<Refusal>)>,
}

/// Why the rules refuse a reader: the error's kind and message.
type Refusal = (crate::error::ErrorKind, String);

impl Reader {
    pub(crate) fn new(who: Principal) -> Reader {
        Reader { who, last: None }
    }

    /// Filters `events`, about to be delivered from `topic`; an error
    /// ([`ErrorKind::Forbidden`](crate::ErrorKind), or `Unauthorized` for
    /// anonymous) when the reader lost the right to read it: the tunnel
    /// then ends.
    pub(crate) fn admit(&mut self, store: &Store, topic: &Topic, events: &mut Vec<Event>) -> Result<()> {
        if self.who.token_expires().is_some_and(|exp| exp <= super::token::now()) {
            events.clear();
            return Err(Error::new(crate::error::ErrorKind::Unauthorized, "this tunnel ended: its bearer token expired; reconnect with a new token"));
        }
        if events.is_empty() {
            return Ok(());
        }
        let Some(rules) = store.access_rules()? else { return Ok(()) };
        if !self.last.as_ref().is_some_and(|(given_by, _)| Arc::ptr_eq(given_by, &rules)) {
            let refused = rules.check(&self.who, Operation::Read, topic).err().map(|e| (e.kind(), e.message().to_string()));
            self.last = Some((Arc::clone(&rules), refused));
        }
        if let Some((_, Some((kind, why)))) = &self.last {
            events.clear();
            return Err(Error::new(*kind, format!("this tunnel ended: the access rules changed: {why}")));
        }
        rules.retain_visible(&self.who, topic, events);
        Ok(())
    }
}
