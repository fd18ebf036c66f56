//! The forwarding engine's unit of work ([`Job`]: an event to store, or
//! one stored whose forwarding is to run), shared by `post` (which runs
//! the queue), `outbox` (which delivers along routes) and `sweep_routes`.
//! Above `routes`, below `post` and `outbox`.

use std::sync::Arc;

use crate::error::Result;
use crate::event::Event;
use crate::log::SharedPayload;
use crate::topic::Topic;

use super::routes::RouteList;
use super::Store;

/// An event just stored by [`Store::append_event`].
pub(super) struct Stored {
    pub(super) seq: u64,
    /// The topic's route generation when it was stored (unknown for an
    /// announcement stored on the way).
    pub(super) routes_generation: Option<u64>,
    /// The topic's routes as of that generation, when the store kept them.
    pub(super) routes: Option<RouteList>,
    /// Listed as in flight ([`Store::append_event`]'s `list`): to be
    /// unlisted with `outbox::InFlight` once forwarded.
    pub(super) listed: bool,
}

impl Store {
    /// The routes of `topic` that `stored` (an append to it) holds, kept
    /// for the route generation it read under the topic's lock; else read
    /// now, and kept for that generation ([`Store::read_routes`]).
    pub(super) fn stored_routes(&self, topic: &Topic, stored: &Stored) -> Result<RouteList> {
        match &stored.routes {
            Some(routes) => Ok(Arc::clone(routes)),
            None => self.read_routes(topic, stored.routes_generation),
        }
    }
}

/// The URLs a forwarded copy names its source topic by.
pub(super) struct SourceUrls {
    /// The source topic's URL (`kn_routed_from`).
    pub(super) topic: String,
    /// The URL of its `kn_routes` (`kn_route_location` is below it).
    pub(super) routes: String,
}

impl SourceUrls {
    pub(super) fn of(store: &Store, source: &Topic) -> SourceUrls {
        SourceUrls { topic: store.topic_url(source), routes: store.topic_url(&source.routes()) }
    }
}

/// One unit of work of the forwarding engine: an event to store (the
/// post itself), or one stored already whose forwarding is to run.
pub(super) struct Job {
    pub(super) topic: Topic,
    pub(super) event: Event,
    /// The event's `kn_payload` when it is large enough for a blob: kept
    /// apart (not in `event`) and shared by every copy a route makes, so
    /// that it is stored once and linked into each topic.
    pub(super) payload: Option<Arc<SharedPayload>>,
    /// Set once the event is stored.
    pub(super) stored: Option<Stored>,
}

impl Job {
    /// The forwarding of an event stored already.
    pub(super) fn stored(topic: Topic, event: Event, payload: Option<Arc<SharedPayload>>, stored: Stored) -> Job {
        Job { topic, event, payload, stored: Some(stored) }
    }
}
