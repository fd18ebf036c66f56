//! Delivering along routes (the outbox's middle floor): one event's
//! copies to each route's destination, local (stored, duplicates
//! recognised) or remote (through the store's `Remote`), the catch-up of a
//! lagging route, and what a failure does to the route (retried later or
//! poisoned). Called by the drain (`outbox.rs`); records what it did in
//! the topic's forwarding state (`outbox_state.rs`).

use std::collections::VecDeque;
use std::sync::Arc;

use crate::error::{Error, ErrorKind, Result};
use crate::event::*;
use crate::ids::now;
use crate::log::{self, SharedPayload};
use crate::remote::{self, RemoteFailure};
use crate::stats::Counter;
use crate::topic::Topic;

use super::job::{Job, SourceUrls};
use super::outbox_state::{Lag, State};
use super::report::{PostReport, Write};
use super::read::Selection;
use super::routes::ListedRoute;
use super::{Destination, Store};

/// How many events of one topic a drain reads back from the log at once;
/// more pending than this (after a long outage) is completed over several
/// drains, the oldest first.
pub(super) const BATCH: usize = 1000;

/// How many of a journal's newest events are searched for a copy before a
/// redelivery appends it (see [`Store::drain`]).
const JOURNAL_DEDUP_WINDOW: usize = 1000;

/// The longest wait between two retries, whatever `forward_backoff` and
/// the attempts say.
const MAX_BACKOFF_SECS: f64 = 3600.0;

/// What became of one delivery along one route.
pub(super) enum Delivery {
    /// Delivered, filtered out, or a duplicate: nothing more to do.
    Done,
    /// Failed for now (a local I/O error, a full disk, a remote 5xx or no
    /// answer): the route is kept and the event retried later.
    Transient(Error),
    /// Failed for now, and not to be tried again before the given seconds
    /// (a push service's `Retry-After`, `outbox_push.rs`); otherwise as
    /// `Transient`.
    Later(Error, Option<u64>),
    /// Failed for good (PROTOCOL.md 4.1): the route is poisoned.
    Permanent(Counter, Error),
}

impl Store {
    /// Delivers one event of `source` along every active route that does
    /// not lag; a transient failure makes the route lag from this event.
    /// Fails with [`ErrorKind::TooManyDeliveries`] past `max_forwards`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn deliver_all(
        &self,
        source: &Topic,
        urls: &SourceUrls,
        active: &[&ListedRoute],
        state: &mut State,
        (seq, event, payload): (u64, &Event, Option<&Arc<SharedPayload>>),
        recovered: bool,
        report: &mut PostReport,
        queue: &mut VecDeque<Job>,
    ) -> Result<()> {
        for route in active {
            if state.lagging.iter().any(|l| l.route_id == route.route.id()) {
                continue; // it gets this event when it catches up
            }
            if report.deliveries >= self.config.max_forwards {
                return Err(Error::new(
                    ErrorKind::TooManyDeliveries,
                    format!(
                        "post to '{source}' caused more than {} deliveries (KN_MAX_FORWARDS); stopped there, the event itself was stored",
                        self.config.max_forwards
                    ),
                ));
            }
            report.deliveries += 1;
            match self.forward(urls, route, (event, payload), recovered, report, queue) {
                Delivery::Done => {
                    if recovered {
                        let _ = self.count(Counter::DeliveriesRecovered, 1);
                    }
                }
                failed => self.delivery_failed(source, route, seq, failed, state, report),
            }
        }
        Ok(())
    }

    /// What a route's failed delivery of event `seq` leaves: a transient
    /// failure makes the route lag from `seq` (poisoned at once when no
    /// retry is allowed), a permanent one poisons it.
    pub(super) fn delivery_failed(&self, source: &Topic, route: &ListedRoute, seq: u64, failed: Delivery, state: &mut State, report: &mut PostReport) {
        match failed {
            Delivery::Done => {}
            Delivery::Transient(err) => self.delivery_failed(source, route, seq, Delivery::Later(err, None), state, report),
            Delivery::Later(err, after) => {
                let _ = self.count(Counter::DeliveriesRetried, 1);
                if self.config.forward_retries == 0 {
                    self.poison(source, route.route.id(), unreachable_counter(&err), &err.to_string(), report);
                    return;
                }
                let wait = self.config.forward_backoff.as_secs_f64().max(after.unwrap_or(0) as f64).min(MAX_BACKOFF_SECS);
                let next_at = now() + wait;
                state.lagging.push(Lag { route_id: route.route.id().to_vec(), from: seq, attempts: 1, next_at });
            }
            Delivery::Permanent(counter, err) => self.poison(source, route.route.id(), counter, &err.to_string(), report),
        }
    }

    /// Delivers to each lagging route whose time has come the events it
    /// still needs (up to the cursor), in order; stops a route at its
    /// first failure (a retry later, with a doubled wait, or poisoned
    /// after `forward_retries` retries).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn catch_up(
        &self,
        source: &Topic,
        urls: &SourceUrls,
        active: &[&ListedRoute],
        state: &mut State,
        t: f64,
        report: &mut PostReport,
        queue: &mut VecDeque<Job>,
        population_cut: &mut bool,
    ) {
        let mut i = 0;
        while i < state.lagging.len() {
            let lag = state.lagging[i].clone();
            let Some(route) = active.iter().find(|r| r.route.id() == lag.route_id) else {
                state.lagging.remove(i);
                continue;
            };
            if lag.next_at > t {
                i += 1;
                continue;
            }
            let events = match self.events_between(source, lag.from.saturating_sub(1), state.cursor) {
                Ok(events) => events,
                Err(_) => {
                    i += 1;
                    continue;
                }
            };
            let complete = events.len() < BATCH;
            let mut failed = None;
            let mut cut = false;
            let mut next = lag.from;
            for (seq, mut event) in events {
                if report.deliveries >= self.config.max_forwards {
                    cut = true;
                    break;
                }
                report.deliveries += 1;
                let payload = SharedPayload::take_from(&mut event, &self.config).map(Arc::new);
                match self.forward(urls, route, (&event, payload.as_ref()), true, report, queue) {
                    Delivery::Done => {
                        next = seq + 1;
                        if lag.attempts > 0 {
                            let _ = self.count(Counter::DeliveriesRecovered, 1);
                        }
                    }
                    other => {
                        failed = Some(other);
                        next = seq;
                        break;
                    }
                }
            }
            let from = next;
            match failed {
                None if cut => {
                    // A population cut off by max_forwards ends there.
                    *population_cut = true;
                    state.lagging.remove(i);
                    continue;
                }
                None if complete => {
                    state.lagging.remove(i);
                    continue;
                }
                None => state.lagging[i].from = from,
                Some(Delivery::Permanent(counter, err)) => {
                    self.poison(source, &lag.route_id, counter, &err.to_string(), report);
                    state.lagging.remove(i);
                    continue;
                }
                Some(Delivery::Transient(err)) | Some(Delivery::Later(err, None)) => {
                    let _ = self.count(Counter::DeliveriesRetried, 1);
                    let attempts = lag.attempts + 1;
                    if attempts > self.config.forward_retries {
                        let reason = format!("{err} (no answer after {} retries)", self.config.forward_retries);
                        self.poison(source, &lag.route_id, unreachable_counter(&err), &reason, report);
                        state.lagging.remove(i);
                        continue;
                    }
                    let wait = self.config.forward_backoff.as_secs_f64() * 2f64.powi(attempts.min(30) as i32 - 1);
                    state.lagging[i] = Lag { route_id: lag.route_id, from, attempts, next_at: now() + wait.min(MAX_BACKOFF_SECS) };
                }
                Some(Delivery::Later(err, Some(after))) => {
                    // A push service's Retry-After: no sooner than it asks,
                    // and counted as a retry like any other.
                    let _ = self.count(Counter::DeliveriesRetried, 1);
                    let attempts = lag.attempts + 1;
                    if attempts > self.config.forward_retries {
                        let reason = format!("{err} (still refused after {} retries)", self.config.forward_retries);
                        self.poison(source, &lag.route_id, unreachable_counter(&err), &reason, report);
                        state.lagging.remove(i);
                        continue;
                    }
                    let backoff = self.config.forward_backoff.as_secs_f64() * 2f64.powi(attempts.min(30) as i32 - 1);
                    let wait = backoff.max(after as f64).min(MAX_BACKOFF_SECS);
                    state.lagging[i] = Lag { route_id: lag.route_id, from, attempts, next_at: now() + wait };
                }
                Some(Delivery::Done) => unreachable!("a delivery that was done is not a failure"),
            }
            i += 1;
        }
    }

    /// PROTOCOL.md 4.1: filter, transform, hop-by-hop elements, then store
    /// a local copy (its own forwarding queued) or make a remote delivery.
    /// A `recovered` copy may have been delivered before: on a journal it
    /// is searched for first.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn forward(
        &self,
        urls: &SourceUrls,
        listed: &ListedRoute,
        event: (&Event, Option<&Arc<SharedPayload>>),
        recovered: bool,
        report: &mut PostReport,
        queue: &mut VecDeque<Job>,
    ) -> Delivery {
        if let Some(refused) = self.may_deliver(listed) {
            return refused;
        }
        let Some((copy, shared)) = self.copy_for(urls, listed, event) else { return Delivery::Done };
        match listed.destination(self) {
            Ok(Destination::Local(topic)) => match self.store_copy(&topic, copy, shared, recovered, report, queue) {
                Ok(()) => Delivery::Done,
                Err(err) => classify_local(err),
            },
            Ok(Destination::Remote(url)) => self.deliver_remote(&url, copy, shared),
            Ok(Destination::Push(subscription)) => self.deliver_push(&subscription, &listed.route.event, &with_payload(copy, shared)),
            Err(reason) => Delivery::Permanent(Counter::PoisonedBadName, Error::new(ErrorKind::BadTopic, reason)),
        }
    }

    /// Whether the route's creator may still read the source and post to
    /// the destination (docs/ACCESS.md): `None` when so. Unreadable rules
    /// deliver nothing now and keep the route for a retry.
    fn may_deliver(&self, listed: &ListedRoute) -> Option<Delivery> {
        match listed.may_deliver(self) {
            Ok(None) => None,
            Ok(Some(refused)) => Some(Delivery::Permanent(Counter::PoisonedOther, Error::new(ErrorKind::Forbidden, refused))),
            Err(err) => Some(Delivery::Transient(err)),
        }
    }

    /// The copy of `event` that travels `listed` (PROTOCOL.md 4.1 steps 1
    /// to 3), with its shared payload if it still has one; `None` when the
    /// event does not travel this route (filtered out, or its transform
    /// failed or is not allowed).
    pub(super) fn copy_for(&self, urls: &SourceUrls, listed: &ListedRoute, (event, shared): (&Event, Option<&Arc<SharedPayload>>)) -> Option<(Event, Option<Arc<SharedPayload>>)> {
        let route = &listed.route;
        let route_id = route.id().to_vec();
        let payload = shared.map_or(event.payload(), |p| &p.bytes[..]);
        if !listed.passes(self, payload) || !listed.shows(self, event) {
            return None;
        }
        let mut out = event.clone();
        let mut shared = shared.cloned();
        if let Some(spec) = route.event.get("kn_content_transform") {
            let allowed = remote::parse_content_transform(spec).and_then(|(url, _)| self.config.outbound.check(url));
            allowed.ok()?;
            let payload = remote::content_transform(self.remote.as_ref(), spec, payload).ok()?;
            out.set(KN_PAYLOAD, payload);
            shared = None;
        }
        out.strip_hop_by_hop();
        let location = match route.event.get("kn_uri") {
            Some(uri) => uri.to_vec(),
            None => format!("{}/{}", urls.routes, String::from_utf8_lossy(&route_id)).into_bytes(),
        };
        out.set(KN_ROUTE_LOCATION, location).set(KN_ROUTE_ID, route_id).set(KN_ROUTED_FROM, urls.topic.as_bytes());
        Some((out, shared))
    }

    /// Delivers a copy to another server.
    fn deliver_remote(&self, url: &str, mut copy: Event, shared: Option<Arc<SharedPayload>>) -> Delivery {
        if let Some(shared) = &shared {
            copy.set(KN_PAYLOAD, shared.bytes.clone());
        }
        if let Err(err) = self.config.outbound.check(url) {
            // Refused by this server's policy: counted as a refusal.
            return Delivery::Permanent(Counter::PoisonedRefused, err);
        }
        match remote::deliver_to(self.remote.as_ref(), url, &copy) {
            Ok(()) => Delivery::Done,
            Err(RemoteFailure::Refused(err)) => Delivery::Permanent(Counter::PoisonedRefused, err),
            Err(RemoteFailure::Unusable(err)) => Delivery::Permanent(Counter::PoisonedBadName, err),
            Err(RemoteFailure::Unavailable(err)) => Delivery::Transient(err),
        }
    }

    /// Delivers `events` (after the cursor, in order, none of them tried
    /// before: a deferred notify's) along every active route that does not
    /// lag, a route at a time: the copies bound for one journal are
    /// appended together, under one lock, with one write
    /// (`Writer::append_run`), and its tunnels take them in one wakeup.
    /// What a route cannot take now makes it lag from there, as
    /// [`Store::deliver_all`] does; each event has its own
    /// `max_forwards` budget.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn deliver_run(
        &self,
        source: &Topic,
        urls: &SourceUrls,
        active: &[&ListedRoute],
        state: &mut State,
        events: Vec<(u64, Event)>,
        report: &mut PostReport,
        queue: &mut VecDeque<Job>,
    ) {
        let Some(&(first, _)) = events.first() else { return };
        let events: Vec<(u64, Event, Option<Arc<SharedPayload>>)> = events
            .into_iter()
            .map(|(seq, mut event)| {
                let payload = SharedPayload::take_from(&mut event, &self.config).map(Arc::new);
                (seq, event, payload)
            })
            .collect();
        let mut budget = vec![0usize; events.len()];
        for route in active {
            if state.lagging.iter().any(|l| l.route_id == route.route.id()) {
                continue; // it gets these events when it catches up
            }
            let failed = match self.may_deliver(route) {
                Some(refused) => Some((first, refused)),
                None => {
                    let mut copies = Vec::new();
                    for (i, (seq, event, payload)) in events.iter().enumerate() {
                        if budget[i] >= self.config.max_forwards {
                            continue; // that event's post would have stopped there
                        }
                        budget[i] += 1;
                        if let Some((copy, shared)) = self.copy_for(urls, route, (event, payload.as_ref())) {
                            copies.push((*seq, copy, shared));
                        }
                    }
                    self.deliver_copies(route, copies, report, queue)
                }
            };
            if let Some((seq, failed)) = failed {
                self.delivery_failed(source, route, seq, failed, state, report);
            }
        }
    }

    /// Delivers one route's copies in order: to a local journal together
    /// ([`Store::store_copies`]), elsewhere one by one. The first that
    /// fails, with its seq: the copies after it are not delivered.
    fn deliver_copies(
        &self,
        route: &ListedRoute,
        copies: Vec<(u64, Event, Option<Arc<SharedPayload>>)>,
        report: &mut PostReport,
        queue: &mut VecDeque<Job>,
    ) -> Option<(u64, Delivery)> {
        let first = copies.first()?.0;
        let dest = match route.destination(self) {
            Ok(dest) => dest,
            Err(reason) => return Some((first, Delivery::Permanent(Counter::PoisonedBadName, Error::new(ErrorKind::BadTopic, reason)))),
        };
        match dest {
            Destination::Local(topic) if topic.is_journal() && copies.iter().all(|(_, _, shared)| shared.is_none()) => {
                let copies = copies.into_iter().map(|(_, copy, _)| copy).collect();
                self.store_copies(&topic, copies, report, queue).err().map(|err| (first, classify_local(err)))
            }
            Destination::Local(topic) => copies.into_iter().find_map(|(seq, copy, shared)| match self.store_copy(&topic, copy, shared, false, report, queue) {
                Ok(()) => None,
                Err(err) => Some((seq, classify_local(err))),
            }),
            Destination::Remote(url) => copies.into_iter().find_map(|(seq, copy, shared)| match self.deliver_remote(&url, copy, shared) {
                Delivery::Done => None,
                failed => Some((seq, failed)),
            }),
            Destination::Push(subscription) => copies.into_iter().find_map(|(seq, copy, shared)| {
                match self.deliver_push(&subscription, &route.route.event, &with_payload(copy, shared)) {
                    Delivery::Done => None,
                    failed => Some((seq, failed)),
                }
            }),
        }
    }

    /// The kept files of `dest`, a local topic about to take forwarded
    /// copies; refused when `dest` is a stale journal (and by the
    /// failpoints of local deliveries).
    pub(super) fn copy_destination(&self, dest: &Topic) -> Result<(Option<Topic>, super::Kept)> {
        for (point, errno) in [("forward-eio", libc::EIO), ("forward-enospc", libc::ENOSPC), ("forward-emfile", libc::EMFILE)] {
            if log::failpoint(point) {
                return Err(Error::io("cannot deliver to", &self.dir(dest), std::io::Error::from_raw_os_error(errno)));
            }
        }
        let mut kept = self.take_kept(dest);
        if dest.is_journal() && self.journal_stale(dest, &mut kept.1) {
            self.put_kept(kept);
            return Err(self.stale_error(dest));
        }
        Ok(kept)
    }

    /// Stores a forwarded copy in the local topic `dest` (created if
    /// needed) and queues its own forwarding. A stale journal refuses it.
    fn store_copy(&self, dest: &Topic, copy: Event, payload: Option<Arc<SharedPayload>>, recovered: bool, report: &mut PostReport, queue: &mut VecDeque<Job>) -> Result<()> {
        let kept = self.copy_destination(dest)?;
        let create = || -> Result<()> {
            queue.extend(self.ensure_topic(dest, report)?);
            Ok(())
        };
        let search = (recovered && dest.is_journal()).then_some(&copy);
        let Some(stored) = self.append_event(dest, kept, &copy, payload.as_deref(), now(), create, search, false)? else { return Ok(()) };
        report.writes.push(Write { topic: dest.clone(), id: copy.id().unwrap_or(b"").to_vec(), checkpoint: stored.seq });
        queue.push_back(Job::stored(dest.clone(), copy, payload, stored));
        Ok(())
    }

    /// Stores `copies`, in order, in the journal `dest` (created if
    /// needed) with one append, and queues their own forwarding unless
    /// the journal is known to have no active route. A stale journal
    /// refuses them. Not listed in `report.writes`: a deferred drain's
    /// copies are as many as its events times its routes, and no answer
    /// lists them.
    fn store_copies(&self, dest: &Topic, copies: Vec<Event>, report: &mut PostReport, queue: &mut VecDeque<Job>) -> Result<()> {
        let kept = self.copy_destination(dest)?;
        let create = || -> Result<()> {
            queue.extend(self.ensure_topic(dest, report)?);
            Ok(())
        };
        let stored = self.append_copies(dest, kept, &copies, now(), create)?;
        // Queued jobs are held until the drain ends: only copies that may
        // go further. Static routes from a journal are refused, so none
        // has an active route unless a tool restored one into its
        // `kn_routes` (a route made after the append above does not
        // carry these copies: they were stored before it). Its routes are
        // read once per route generation and kept with its files, not
        // looked up per append; routes that cannot be read are taken as
        // present: the queued jobs then read them and say why.
        let t = now();
        let routed = stored.first().is_some_and(|first| {
            self.stored_routes(dest, first).map_or(true, |routes| routes.iter().any(|r| r.route.is_active(t)))
        });
        if routed {
            for (copy, stored) in copies.into_iter().zip(stored) {
                queue.push_back(Job::stored(dest.clone(), copy, None, stored));
            }
        }
        Ok(())
    }

    /// True when one of the newest events of the journal `dest` is `copy`
    /// (every element the same but the checkpoint): a redelivery of a copy
    /// already appended. Called under the journal's lock.
    pub(super) fn journal_has_copy(&self, dest: &Topic, copy: &Event, payload: Option<&SharedPayload>) -> Result<bool> {
        let mut whole;
        let copy = match payload {
            Some(payload) => {
                whole = copy.clone();
                whole.set(KN_PAYLOAD, payload.bytes.clone());
                &whole
            }
            None => copy,
        };
        let selection = Selection { max_n: Some(JOURNAL_DEDUP_WINDOW), ..Selection::none() };
        let recent = self.select_at_most(dest, &selection, true, JOURNAL_DEDUP_WINDOW, None)?;
        Ok(recent.events.into_iter().any(|mut e| {
            e.remove(KN_ROUTE_CHECKPOINT);
            e == *copy
        }))
    }
}

/// A local delivery's error: a stale journal, a bad name or a refusal is
/// permanent; an I/O problem (EMFILE, EIO, a lock, a full disk) passes.
pub(super) fn classify_local(err: Error) -> Delivery {
    match err.kind() {
        ErrorKind::Expired => Delivery::Permanent(Counter::PoisonedStale, err),
        ErrorKind::BadTopic => Delivery::Permanent(Counter::PoisonedBadName, err),
        ErrorKind::Forbidden | ErrorKind::Unauthorized | ErrorKind::BadRequest | ErrorKind::ReservedTopic | ErrorKind::TooLarge => {
            Delivery::Permanent(Counter::PoisonedOther, err)
        }
        ErrorKind::DiskFull | ErrorKind::Io | ErrorKind::Corrupt | ErrorKind::Remote | ErrorKind::TooManyDeliveries => {
            Delivery::Transient(err)
        }
    }
}

/// `copy` with its payload back in it, if it was shared.
fn with_payload(mut copy: Event, shared: Option<Arc<SharedPayload>>) -> Event {
    if let Some(shared) = shared {
        copy.set(KN_PAYLOAD, shared.bytes.clone());
    }
    copy
}

/// The counter of a route poisoned after its retries: remote (no answer)
/// or local (the fault never cleared).
fn unreachable_counter(err: &Error) -> Counter {
    if err.kind() == ErrorKind::Remote { Counter::PoisonedUnreachable } else { Counter::PoisonedOther }
}
