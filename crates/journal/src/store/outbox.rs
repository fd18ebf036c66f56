//! The forwarding outbox: how far each topic's events have been forwarded
//! along its routes (`.forwarded`, FORMAT.md "Forwarding"), which routes lag
//! behind (a transient failure waiting for its retry, a new route's
//! initial population), and the drain that completes what is pending.
//!
//! A post stores its event first and forwards it after; the cursor in
//! `.forwarded` moves past the event only once every route has it (or has
//! been poisoned, or keeps it as a lagging route). Whoever forwards next
//! on the topic (the next writer, [`Store::complete_forwarding`] from the
//! sweep, `serve` or `kn`) first delivers what lies between the cursor and
//! its own event: a notify killed at any point after its store loses no
//! delivery. Redelivered copies are recognised: an ordinary destination
//! suppresses the duplicate by `kn_id`, a journal is searched for the copy
//! before it is appended again.
//!
//! Three floors, each importing only those below: this file (the drain,
//! `complete_*`, the events in flight), `outbox_delivery.rs` (delivering
//! one event along routes, retries and poisoning) and `outbox_state.rs`
//! (the `.forwarded` encoding, the `Outbox` lock, `.outbox/`).

use std::collections::VecDeque;
use std::fs::{self, File};
use std::io::ErrorKind as IoKind;
use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, ErrorKind, Result};
use crate::event::*;
use crate::ids::now;
use crate::log::{self, SharedPayload};
use crate::topic::Topic;

use super::job::{Job, SourceUrls};
use super::outbox_delivery::BATCH;
use super::outbox_state::{hex, read_state, unhex, Lag, Outbox, State, FORWARDED_FILE, OUTBOX_DIR};
use super::report::PostReport;
use super::read::Selection;
use super::routes::{ListedRoute, RouteList};
use super::{Destination, Store};

/// How many copies' own forwarding jobs and reported writes a drain
/// without a post of its own holds before it stops and leaves the rest
/// pending for its caller's next pass.
const HELD: usize = 20_000;

/// An event of a post of this process, stored and being forwarded inline
/// ([`Store::list_in_flight`]), listed until its drain is over.
///
/// Posts to one routed topic at once (the threads of `serve`) store
/// their events in one order and take the topic's `.forwarded` lock in
/// another: the first drain finds the events of the others stored and
/// not yet forwarded, and forwards them first, in order. It takes them
/// from this list instead of reading them back from the log, which means
/// scanning the topic's newest segment (a few milliseconds for a full
/// one, under the lock every other post to the topic is waiting for).
/// Events stored by another process, or by a post killed before its
/// drain, are read from the log as before.
pub(super) struct InFlight<'a> {
    store: &'a Store,
    topic: Topic,
    seq: u64,
}

impl InFlight<'_> {
    /// The guard of the event `seq` of `topic`, listed by
    /// [`Store::list_in_flight`]: unlisted when dropped.
    pub(super) fn listed<'a>(store: &'a Store, topic: &Topic, seq: u64) -> InFlight<'a> {
        InFlight { store, topic: topic.clone(), seq }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut in_flight = self.store.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(events) = in_flight.get_mut(&self.topic) {
            events.retain(|(seq, _)| *seq != self.seq);
            if events.is_empty() {
                in_flight.remove(&self.topic);
            }
        }
    }
}


/// The event a post forwards itself (already in memory).
pub(super) struct Own<'a> {
    pub(super) seq: u64,
    pub(super) event: &'a Event,
    pub(super) payload: Option<&'a Arc<SharedPayload>>,
}

impl Store {
    /// Completes the pending forwarding of `topic`: the events stored but
    /// not yet forwarded (their notify was killed, or could not read the
    /// routes), the routes whose retry is due and new routes' initial
    /// populations. For the sweep, `serve`'s background pass, `kn` and a
    /// server right after a route's reply. Returns what it stored and
    /// poisoned; a topic without routes costs a directory lookup.
    pub fn complete_forwarding(&self, topic: &Topic) -> Result<PostReport> {
        // Readers of this process woken in groups, as a post's fan-out.
        let _wakes = crate::watch::WakeBatch::open();
        let mut report = PostReport::default();
        let mut queue = VecDeque::new();
        let result = self.complete_forwarding_into(topic, &mut report, &mut queue);
        self.run_forwarding(queue, &mut report)?;
        result.map(|_| report)
    }

    /// Completes the forwarding a deferred notify left pending
    /// ([`Store::notify_deferring`]), as [`Store::complete_forwarding`]
    /// does; for the server that answered it, right after its answer.
    /// One thread of this process at a time drains a topic: a call made
    /// while another drains it returns at once, and that one looks again
    /// when it is done, so that posts arriving during a fan-out are
    /// carried together by its next pass.
    pub fn complete_deferred(&self, topic: &Topic) {
        {
            let mut running = self.deferred.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(again) = running.get_mut(topic) {
                *again = true;
                return;
            }
            running.insert(topic.clone(), false);
        }
        loop {
            // Errors stay in the outbox, for the topic's next writer.
            let more = self.complete_forwarding(topic).is_ok_and(|report| report.more);
            let mut running = self.deferred.lock().unwrap_or_else(|p| p.into_inner());
            match running.get_mut(topic) {
                Some(again) if *again || more => *again = false,
                _ => {
                    running.remove(topic);
                    return;
                }
            }
        }
    }

    pub(super) fn complete_forwarding_into(&self, topic: &Topic, report: &mut PostReport, queue: &mut VecDeque<Job>) -> Result<()> {
        let dir = self.checked_dir(topic)?;
        if !dir.join(FORWARDED_FILE).exists() {
            return Ok(());
        }
        let routes = self.read_routes(topic, None)?;
        self.drain(topic, None, &routes, report, queue)
    }

    /// Runs [`Store::complete_forwarding`] on every topic with lagging
    /// routes (listed in `.outbox/`). `serve` calls it in the background;
    /// returns how many topics it visited.
    pub fn complete_lagging_forwarding(&self) -> Result<usize> {
        // Status events a killed request held for a population.
        let _ = self.complete_held_statuses();
        // Escalations of unread events that are due (unread.rs).
        let _ = self.complete_unread_escalations();
        let mut visited = 0;
        for topic in self.outbox_topics()? {
            visited += 1;
            let _ = self.complete_forwarding(&topic);
        }
        Ok(visited)
    }

    /// How many deliveries are recorded as pending in the outbox (routes
    /// waiting for a retry or for their initial population, counted by
    /// the events each still needs, at most up to the topic's cursor): a
    /// gauge for `kn stat` and `/metrics`. Events of a notify that was
    /// killed are not counted until a writer sees them.
    pub fn outbox_pending(&self) -> Result<u64> {
        let mut pending = 0;
        for topic in self.outbox_topics()? {
            let path = self.dir(&topic).join(FORWARDED_FILE);
            let Ok(file) = File::open(&path) else { continue };
            let Some(state) = read_state(&file).map_err(|e| Error::io("cannot read forwarding state", &path, e))? else { continue };
            pending += state.lagging.iter().map(|l| (state.cursor + 1).saturating_sub(l.from).max(1)).sum::<u64>();
        }
        Ok(pending)
    }

    fn outbox_topics(&self) -> Result<Vec<Topic>> {
        let dir = self.config.root.join(OUTBOX_DIR);
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == IoKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io("cannot list", &dir, e)),
        };
        let mut topics = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(bytes) = name.to_str().and_then(unhex) else { continue };
            match Topic::parse_bytes(&bytes) {
                Ok(topic) => topics.push(topic),
                Err(_) => {
                    let _ = fs::remove_file(entry.path());
                }
            }
        }
        Ok(topics)
    }

    /// Lists `topic` in `.outbox/` (it has lagging routes) or takes it off.
    pub(super) fn mark_outbox(&self, topic: &Topic, lagging: bool) {
        let dir = self.config.root.join(OUTBOX_DIR);
        let path = dir.join(hex(topic.as_str().as_bytes()));
        if !lagging {
            let _ = fs::remove_file(&path);
            return;
        }
        if path.exists() {
            return;
        }
        if !dir.is_dir() {
            let _ = super::create_topic_dir(&dir);
        }
        let _ = log::open_shared(&path, false);
    }

    /// Whether the topic in `dir` has events not yet forwarded or lagging
    /// routes; starts its state (nothing pending) when it has none. Reads
    /// no route.
    pub(super) fn forwarding_pending(&self, dir: &Path) -> Result<bool> {
        let mut outbox = Outbox::lock(dir, &self.config)?;
        let end = log::cursor_at_end(dir)?.last_seq();
        match outbox.state.clone() {
            None => {
                outbox.save(&mut State::at(end))?;
                Ok(false)
            }
            Some(state) => Ok(state.cursor < end || !state.lagging.is_empty()),
        }
    }

    /// Records that the event `seq` of `topic`, just stored by a deferred
    /// notify, is to be forwarded: lists the topic in `.outbox/`, so that
    /// a background pass completes it should the caller not (the drain
    /// that delivers it takes the topic off), and starts the topic's
    /// state if it has none, with the event pending.
    pub(super) fn record_deferred(&self, topic: &Topic, seq: u64) -> Result<()> {
        let dir = self.dir(topic);
        self.mark_outbox(topic, true);
        if dir.join(FORWARDED_FILE).exists() {
            return Ok(());
        }
        let mut outbox = Outbox::lock(&dir, &self.config)?;
        if outbox.state.is_some() {
            return Ok(());
        }
        outbox.save(&mut State::at(seq.saturating_sub(1)))
    }

    /// Records that route `route_id` of `from` is to carry the current
    /// events from `first` on (its initial population) before anything
    /// newer, then leaves them for [`Store::complete_forwarding`].
    pub(super) fn record_population(&self, from: &Topic, route_id: &[u8], first: u64) -> Result<()> {
        let dir = self.checked_dir(from)?;
        let mut outbox = Outbox::lock(&dir, &self.config)?;
        let end = log::cursor_at_end(&dir)?.last_seq();
        let mut state = outbox.state.clone().unwrap_or(State::at(end));
        state.lagging.retain(|l| l.route_id != route_id);
        state.lagging.push(Lag { route_id: route_id.to_vec(), from: first, attempts: 0, next_at: 0.0 });
        self.mark_outbox(from, true);
        outbox.save(&mut state)
    }

    /// Forwards the pending events of `topic` along `routes` (the own
    /// event of a post last), under the topic's `.forwarded` lock: every
    /// event after the cursor to every active route that does not lag,
    /// then the lagging routes whose retry is due. Local copies are
    /// stored at once; their own forwarding is queued for after the lock
    /// is released. Fails only with the own event's
    /// [`ErrorKind::TooManyDeliveries`] or an I/O error of the state.
    pub(super) fn drain(&self, topic: &Topic, own: Option<Own<'_>>, routes: &RouteList, report: &mut PostReport, queue: &mut VecDeque<Job>) -> Result<()> {
        let first = own.as_ref().map_or(u64::MAX, |own| own.seq);
        self.drain_from(topic, own, first, routes, report, queue)
    }

    /// [`Store::drain`] for a group of posts stored together, whose
    /// events from `first` to the own event's are this drain's: a topic
    /// without a forwarding state starts it just before `first` (nothing
    /// older is known to be pending), not before the own event.
    pub(super) fn drain_from(&self, topic: &Topic, own: Option<Own<'_>>, first: u64, routes: &RouteList, report: &mut PostReport, queue: &mut VecDeque<Job>) -> Result<()> {
        let dir = self.dir(topic);
        let mut outbox = Outbox::lock_kept(&dir, self.take_forwarded(topic), &self.config)?;
        let t = now();
        let end = match &own {
            Some(own) => own.seq,
            None => log::cursor_at_end(&dir)?.last_seq(),
        };
        // The last event before the post's own (without one, the end).
        let upto = end.saturating_sub(u64::from(own.is_some()));
        let mut state = match outbox.state.clone() {
            Some(state) => state,
            // New (or unreadable): nothing before this post (or its
            // group) is pending.
            None => State::at(upto.min(first.saturating_sub(1))),
        };
        let before = state.clone();
        // Events pending before this drain's own (a deferred notify's,
        // which listed the topic in `.outbox/`, or a killed one's).
        let had_pending = state.cursor < upto;
        let active: Vec<&ListedRoute> = routes.iter().filter(|r| r.route.is_active(t)).collect();
        state.lagging.retain(|l| active.iter().any(|r| r.route.id() == l.route_id));
        let urls = SourceUrls::of(self, topic);
        let mut result = Ok(());
        if active.is_empty() {
            // Nothing to deliver, and nothing pending for routes made later.
            state.cursor = state.cursor.max(end);
        }
        if state.cursor < end {
            // Pending: what lies after the cursor, up to the post's own
            // event (excluded) or, without one, up to the end; read back
            // from the log [`BATCH`] events at a time, oldest first.
            // From the moment this drain starts, every event up to `end`
            // may be delivered in part: the state says so first. Those
            // after the old mark no drain had started on.
            let tried = state.tried.unwrap_or(end);
            state.tried = Some(tried.max(end));
            outbox.save_before_delivering(&mut state, &self.config)?;
            // What a drain holds until it ends (the copies' own forwarding,
            // the writes it reports) is bounded: a drain without a post of
            // its own stops there and leaves the rest pending
            // (`report.more`), in order.
            let held = |queue: &VecDeque<Job>, report: &PostReport| own.is_none() && queue.len() + report.writes.len() >= HELD;
            let ordinary = active.iter().filter(|r| matches!(r.destination(self), Ok(Destination::Local(t)) if !t.is_journal())).count();
            let chunk = HELD.checked_div(ordinary).map_or(BATCH, |n| n.max(1));
            let mut stopped = false;
            'drain: while state.cursor < upto {
                let mut pending = self.events_between(topic, state.cursor, upto)?;
                let complete = pending.len() < BATCH;
                let mut untried = pending.iter().position(|(seq, _)| *seq > tried).map_or(Vec::new(), |at| pending.split_off(at));
                for (seq, mut event) in pending {
                    if held(queue, report) {
                        stopped = true;
                        break 'drain;
                    }
                    // Each recovered event has the budget its own post had:
                    // past `max_forwards` its forwarding stops there, as its
                    // post's would have.
                    let payload = SharedPayload::take_from(&mut event, &self.config).map(Arc::new);
                    let mut own_report = PostReport::default();
                    let _ = self.deliver_all(topic, &urls, &active, &mut state, (seq, &event, payload.as_ref()), true, &mut own_report, queue);
                    report.writes.append(&mut own_report.writes);
                    report.poisoned.append(&mut own_report.poisoned);
                    state.cursor = seq;
                }
                while let Some(&(last, _)) = untried.get(chunk.min(untried.len()).wrapping_sub(1)) {
                    if held(queue, report) {
                        stopped = true;
                        break 'drain;
                    }
                    let rest = untried.split_off(chunk.min(untried.len()));
                    self.deliver_run(topic, &urls, &active, &mut state, std::mem::replace(&mut untried, rest), report, queue);
                    state.cursor = last;
                }
                if complete {
                    // The rest up to `upto` is not current (superseded,
                    // expired): nothing to forward.
                    state.cursor = state.cursor.max(upto);
                }
            }
            if stopped {
                report.more = true;
            } else if let Some(own) = own.filter(|o| o.seq > state.cursor) {
                // Another drain may have reached it (and been killed).
                let recovered = own.seq <= tried;
                result = self.deliver_all(topic, &urls, &active, &mut state, (own.seq, own.event, own.payload), recovered, report, queue);
                state.cursor = own.seq;
            } else if state.cursor < end {
                state.cursor = end;
            }
        }
        let mut cut = false;
        self.catch_up(topic, &urls, &active, &mut state, t, report, queue, &mut cut);
        if cut && result.is_ok() {
            result = Err(Error::new(
                ErrorKind::TooManyDeliveries,
                format!("forwarding from '{topic}' took more than {} deliveries (KN_MAX_FORWARDS); stopped there", self.config.max_forwards),
            ));
        }
        if state != before || outbox.state.is_none() {
            let lagging = !state.lagging.is_empty();
            let was_lagging = !before.lagging.is_empty();
            // A deferred notify listed the topic too: events were pending
            // (and still are, after a drain that stopped at its bound).
            if lagging != was_lagging || outbox.state.is_none() || had_pending {
                self.mark_outbox(topic, lagging || report.more);
            }
            outbox.save(&mut state)?;
        }
        self.keep_forwarded(topic, outbox.release(&self.config));
        result
    }

    /// The current (unexpired, not superseded) events of `topic` with a
    /// seq in `(after, upto]`, oldest first, at most [`BATCH`]: those of
    /// posts of this process still forwarding them when they are all
    /// such ([`InFlight`]), else read back from the log.
    pub(super) fn events_between(&self, topic: &Topic, after: u64, upto: u64) -> Result<Vec<(u64, Event)>> {
        if after >= upto {
            return Ok(Vec::new());
        }
        if let Some(events) = self.in_flight_between(topic, after, upto) {
            return Ok(events);
        }
        let selection = Selection { since_checkpoint: Some(after.to_string().into_bytes()), ..Selection::none() };
        // `upto` is at or before the end: `after` resumes exactly.
        let selected = self.select_at_most(topic, &selection, false, usize::MAX, Some(upto))?;
        let mut out = Vec::new();
        for mut event in selected.events {
            let seq = event.checkpoint().and_then(|c| std::str::from_utf8(c).ok()).and_then(|c| c.parse::<u64>().ok()).unwrap_or(0);
            if seq <= after || seq > upto {
                continue;
            }
            event.remove(KN_ROUTE_CHECKPOINT);
            out.push((seq, event));
            if out.len() == BATCH {
                break;
            }
        }
        Ok(out)
    }

    /// Lists the event `seq` of `topic` (just stored, with no payload kept
    /// apart) as in flight ([`InFlight`]), before the topic's lock is
    /// released: no other post's drain can find it pending unlisted.
    pub(super) fn list_in_flight(&self, topic: &Topic, seq: u64, event: &Event) {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        in_flight.entry(topic.clone()).or_default().push((seq, event.clone()));
    }

    /// Whether a post of this process is forwarding an event of `topic`
    /// now (listed by [`Store::list_in_flight`]): a post made at once
    /// would find it pending, or the forwarding lock busy.
    pub(super) fn forwarding_now(&self, topic: &Topic) -> bool {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner()).contains_key(topic)
    }

    /// The events of `topic` in `(after, upto]` as [`Store::events_between`]
    /// gives them, when posts of this process hold every one in flight;
    /// `None` when one is not (stored by another process, by a post
    /// killed before its drain, or a `kn_subtopics` announcement).
    fn in_flight_between(&self, topic: &Topic, after: u64, upto: u64) -> Option<Vec<(u64, Event)>> {
        let in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        let listed = in_flight.get(topic)?;
        let mut between: Vec<&(u64, Event)> = listed.iter().filter(|(seq, _)| *seq > after && *seq <= upto).collect();
        if between.len() as u64 != upto - after {
            return None;
        }
        between.sort_unstable_by_key(|(seq, _)| *seq);
        let t = now();
        let ordinary = !topic.is_journal();
        // As read back from the log: an event superseded by a later one
        // of the same id (on an ordinary topic), or expired, is left out.
        let superseded = |seq: u64, event: &Event| ordinary && listed.iter().any(|(later, e)| *later > seq && e.id() == event.id());
        Some(
            between
                .into_iter()
                .filter(|(seq, event)| !superseded(*seq, event) && !event.is_expired(t))
                .take(BATCH)
                .map(|(seq, event)| (*seq, event.clone()))
                .collect(),
        )
    }

    /// Runs the forwarding of the copies a drain stored (each under its own
    /// topic's lock, one at a time). Only `max_forwards` stops it.
    pub(super) fn run_forwarding(&self, mut queue: VecDeque<Job>, report: &mut PostReport) -> Result<()> {
        while let Some(job) = queue.pop_front() {
            if let Err(err) = self.forward_stored(job, report, &mut queue) {
                if err.kind() == ErrorKind::TooManyDeliveries {
                    return Err(err);
                }
                // Anything else (the routes or the state could not be
                // read) leaves the event pending in that topic's outbox:
                // its next writer completes it.
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_in_flight_are_taken_only_when_every_one_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let topic = Topic::parse("/t").unwrap();
        let event = |id: &str, payload: &str| {
            let mut e = Event::new();
            e.set("kn_id", id).set("kn_payload", payload);
            e
        };
        let expired = {
            let mut e = event("gone", "x");
            e.set("kn_expires", "1");
            e
        };
        let list = |seq: u64, e: &Event| {
            store.list_in_flight(&topic, seq, e);
            InFlight::listed(&store, &topic, seq)
        };
        let a = list(3, &event("a", "1"));
        let c = list(5, &event("a", "2"));
        assert_eq!(store.in_flight_between(&topic, 2, 5), None, "seq 4 is not in flight");
        let b = list(4, &expired);
        let got = store.in_flight_between(&topic, 2, 5).unwrap();
        // 3 superseded by 5 (same kn_id), 4 expired: as read from the log.
        assert_eq!(got.iter().map(|(seq, _)| *seq).collect::<Vec<_>>(), [5]);
        assert_eq!(got[0].1.payload(), b"2");
        assert_eq!(store.in_flight_between(&topic, 2, 4).unwrap(), Vec::new(), "3 is superseded by 5, in flight too");
        assert_eq!(store.in_flight_between(&Topic::parse("/other").unwrap(), 2, 5), None);
        drop(b);
        assert_eq!(store.in_flight_between(&topic, 2, 5), None, "4 is no longer listed");
        drop((a, c));
        assert!(store.in_flight.lock().unwrap().is_empty());
    }
}
