//! What a post did ([`PostReport`]: the writes, the routes poisoned): the
//! lowest floor of `store/`, which every operation that posts reports
//! with (post, the outbox, routes, reads, the sweep).

use crate::topic::Topic;

/// One file write a post made: the event `id` stored on `topic`. Servers
/// report these as `Wrote to '<topic>' (<id>)` lines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    /// The topic written to.
    pub topic: Topic,
    /// The `kn_id` of the stored event.
    pub id: Vec<u8>,
    /// The checkpoint the event got there.
    pub checkpoint: u64,
}

/// The element of a poisoned route (PROTOCOL.md 4.1 step 5) that says why
/// its delivery failed.
pub const KN_POISONED: &[u8] = b"kn_poisoned";

/// A route that failed and was poisoned during a post.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Poisoned {
    /// The route's source topic.
    pub source: Topic,
    /// The route's id.
    pub route_id: Vec<u8>,
    /// What went wrong with the delivery.
    pub reason: String,
}

/// What a post did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PostReport {
    /// Every event stored, in order: `kn_subtopics` announcements, the event
    /// itself, then each forwarded copy.
    pub writes: Vec<Write>,
    /// The posted event repeated the current one: nothing was stored or
    /// forwarded.
    pub duplicate: bool,
    /// The `kn_id` of the posted event (given or fresh).
    pub id: Vec<u8>,
    /// Routes that failed and were poisoned.
    pub poisoned: Vec<Poisoned>,
    /// The event was stored and its forwarding left pending in the
    /// outbox ([`Store::notify_deferring`](crate::Store::notify_deferring)): the caller completes it with
    /// [`Store::complete_deferred`](crate::Store::complete_deferred) once it has answered. `writes` then
    /// holds no forwarded copy.
    pub forwarding_deferred: bool,
    /// Deliveries along routes so far, counted against `max_forwards`
    /// across every `run` sharing this report (a route's initial
    /// population runs once per event).
    pub(super) deliveries: usize,
    /// A drain stopped before the end of what was pending, with as much
    /// as it may hold: more is left for the next.
    pub(super) more: bool,
}
