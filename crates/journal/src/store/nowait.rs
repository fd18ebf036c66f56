//! Posting without waiting: the notify a server's event loop makes when
//! every lock it needs is free and the post is a few writes to files open
//! already ([`Store::notify_nowait`]). Anything else is left, untouched,
//! to [`Store::notify`] on a thread that may wait.
//!
//! A topic with routes is posted to at once too, when its forwarding is
//! the simple kind: a few routes, each to a topic of this store whose
//! files are open, with nothing pending before the post. Every lock is
//! taken (tried) before anything is written: the topic's `.forwarded`,
//! each destination's, the topic's own. One that is busy, or a destination
//! that would need more than one append, leaves the whole post to
//! [`Store::notify`] with nothing written. Once they are all held, the
//! post is what [`Store::notify`] makes of it: the event stored, the
//! forwarding state marked tried, each copy appended, the cursor moved
//! past the event (FORMAT.md, "Posts a server makes at once").

use std::fs::File;

use crate::config::SyncPolicy;
use crate::error::Result;
use crate::event::Event;
use crate::ids::now;
use crate::log::{Appended, TopicFiles, Writer};
use crate::topic::Topic;

use super::outbox_delivery::classify_local;
use super::outbox_state::Outbox;
use super::job::SourceUrls;
use super::report::{PostReport, Write};
use super::routes::ListedRoute;
use super::{Destination, Kept, Store};

/// How many times [`Store::notify_nowait`] tries a lock, yielding the CPU
/// in between, before it leaves the post to a thread that may wait.
pub(super) const NOWAIT_LOCK_TRIES: usize = 8;

/// The most active routes a post made at once forwards along; a topic
/// with more is left to [`Store::notify`] (a fan-out is better carried
/// off the event loop, after the answer: `Config::forward_inline`).
const NOWAIT_ROUTES: usize = 4;

/// A destination of a post made at once, locked: the copy it takes
/// (`None`: the route's filter leaves the event out) and its writer.
pub(super) struct Target<'s> {
    pub(super) route: &'s ListedRoute,
    pub(super) topic: Topic,
    pub(super) copy: Option<Event>,
    pub(super) writer: Option<Writer<'s>>,
    pub(super) kept: (Option<Topic>, Kept),
}

impl Store {
    /// [`Store::notify`] when it can be made at once, for a server's event
    /// loop, which must not block: to a topic this store has posted to
    /// before (its files kept open, its routes known at the generation the
    /// head names), whose lock is free (tried a few times, yielding in
    /// between, for another thread's post to end), with no blob to store,
    /// no index to grow and no compaction due, without a sync
    /// (`sync=none`) and off shared mode. A topic with active routes
    /// qualifies when it has at most a few, each to a topic of this store
    /// kept open the same way (a journal's or an ordinary topic's, with
    /// no active route of its own), with nothing pending in its outbox and
    /// every lock free. Then the post is what [`Store::notify`] makes of
    /// it, with the same answer. `None`, having done nothing: call
    /// [`Store::notify`].
    pub fn notify_nowait(&self, topic: &Topic, event: Event) -> Option<Result<PostReport>> {
        // Posts of this process queued for the topic go together, after
        // them (group commit): this one joins them.
        if topic.is_reserved() || self.config.sync == SyncPolicy::Always || self.is_shared() || self.grouping_now(topic) {
            return None;
        }
        let mut kept = self.take_kept(topic);
        let answer = self.post_nowait(topic, event, &mut kept);
        self.put_kept(kept);
        answer
    }

    /// The work of [`Store::notify_nowait`] with `kept`, taken from the
    /// cache (its files are back in it whatever happens, unless they no
    /// longer match the log).
    fn post_nowait(&self, topic: &Topic, event: Event, kept: &mut (Option<Topic>, Kept)) -> Option<Result<PostReport>> {
        kept.1.files.as_ref()?;
        // Routes as last read, seen before the lock and the fresh `kn_id`,
        // so that a post this path cannot make costs no attempt thrown
        // away. A route inactive now (expired or deleted) stays so: under
        // the lock below only their generation is checked.
        let (generation, routes) = kept.1.routes.clone()?;
        let checked = now();
        let active: Vec<&ListedRoute> = routes.iter().filter(|r| r.route.is_active(checked)).collect();
        // Another post of this process forwarding the topic now: this one
        // would find its event pending, or its lock busy (many posts at
        // once), and be made by a thread that may wait.
        if !active.is_empty() && (!self.forwards_at_once(topic, &active) || self.forwarding_now(topic)) {
            return None;
        }
        if topic.is_journal() && self.journal_stale(topic, &mut kept.1) {
            return Some(Err(self.stale_error(topic)));
        }
        let event = match self.normalise(event) {
            Ok(event) => event,
            Err(err) => return Some(Err(err)),
        };
        // An event expired already is stored and never forwarded
        // (`Store::forward_stored`): the next drain passes it by.
        if !active.is_empty() && event.is_expired(now()) {
            return None;
        }
        // With routes, the forwarding locks first, so that the topic's own
        // lock, which every post to it takes to append, is held for the
        // append alone; it is tried once (busy, another post is appending
        // and will forward: this one would find its event pending).
        let (mut outbox, mut targets) = (None, Vec::new());
        if !active.is_empty() {
            let (locked, locked_targets) = self.lock_forwarding(topic, &active, &event, &mut kept.1.forwarded)?;
            outbox = Some(locked);
            targets = locked_targets;
        }
        let tries = if active.is_empty() { NOWAIT_LOCK_TRIES } else { 1 };
        let writer = match self.try_writer(topic, &mut kept.1.files, generation, &event, tries) {
            Some(writer) if outbox.as_ref().is_none_or(|outbox| nothing_pending(outbox, writer.last_seq())) => writer,
            writer => {
                if let Some(writer) = writer {
                    kept.1.files = Some(writer.release());
                }
                self.unlock_forwarding(&mut kept.1.forwarded, outbox, targets);
                return None;
            }
        };
        let (appended, files) = self.append_held(topic, writer, &event);
        kept.1.files = Some(files);
        let id = event.id().unwrap_or(b"").to_vec();
        let mut report = PostReport { id: id.clone(), ..PostReport::default() };
        let seq = match appended {
            Ok(Appended::Stored(seq)) => seq,
            Ok(_) => {
                report.duplicate = true;
                self.unlock_forwarding(&mut kept.1.forwarded, outbox, targets);
                return Some(Ok(report));
            }
            Err(err) => {
                self.unlock_forwarding(&mut kept.1.forwarded, outbox, targets);
                return Some(Err(err));
            }
        };
        report.writes.push(Write { topic: topic.clone(), id, checkpoint: seq });
        if let Some(outbox) = outbox {
            // Stored: a forwarding state that cannot be written leaves the
            // event pending for the next drain, as when a post's own drain
            // fails ([`Store::notify`]).
            let _ = self.forward_locked(topic, seq, outbox, targets, &mut report, &mut kept.1.forwarded);
        }
        Some(Ok(report))
    }

    /// Whether the forwarding along `active` can be made at once: few
    /// enough routes for the answer to wait for them, each to a distinct
    /// topic of this store other than `topic`, with no content transform
    /// (a request to another server), and every failure a route may meet
    /// one that keeps it for a retry (poisoning writes `kn_routes`).
    pub(super) fn forwards_at_once(&self, topic: &Topic, active: &[&ListedRoute]) -> bool {
        let inline = self.config.forward_inline;
        if active.len() > NOWAIT_ROUTES || (inline > 0 && active.len() > inline) || active.len() > self.config.max_forwards || self.config.forward_retries == 0 || !self.keeps_forwarded(topic) {
            return false;
        }
        let mut seen: Vec<Topic> = Vec::with_capacity(active.len());
        for route in active {
            if route.route.event.contains("kn_content_transform") {
                return false;
            }
            match route.destination(self) {
                Ok(Destination::Local(dest)) if dest != *topic && !seen.contains(&dest) && !dest.is_reserved() => seen.push(dest),
                _ => return false,
            }
        }
        true
    }

    /// The locked writer of `topic` from its kept `files`, if the lock is
    /// free (tried `tries` times), the files still match
    /// the log, its routes are still at `generation` and `event` is one
    /// append; else `None` with the files back in `files` (unless they no
    /// longer match the log).
    pub(super) fn try_writer(&self, topic: &Topic, files: &mut Option<TopicFiles>, generation: u64, event: &Event, tries: usize) -> Option<Writer<'_>> {
        let held = files.as_ref()?;
        // Another thread of this process posting to the topic holds the
        // lock for a few system calls: try a few times before handing
        // the post to a thread that may wait.
        if !(0..tries).any(|attempt| {
            if attempt > 0 {
                std::thread::yield_now();
            }
            held.try_lock(&self.config)
        }) {
            return None;
        }
        // The lock is held: `reopen_held` does not take it again, and
        // gives it up (closing the files) when they no longer match.
        let writer = Writer::reopen_held(&self.config, !topic.is_journal(), files.take()?).ok()??;
        if writer.routes_generation() != generation || !writer.appends_at_once(event) {
            *files = Some(writer.release());
            return None;
        }
        Some(writer)
    }

    /// Every lock the forwarding of `event` along `active` needs, tried:
    /// the topic's `.forwarded` (kept open by an earlier drain, with
    /// `forwarded` or another of the topic's kept sets), whose state the
    /// caller checks under the topic's lock (the cursor at its last event:
    /// nothing pending), and each destination's files, each to take its
    /// copy in one append. `None`, with everything given back, when one is
    /// busy or anything is otherwise.
    pub(super) fn lock_forwarding<'s>(&'s self, topic: &Topic, active: &[&'s ListedRoute], event: &Event, forwarded: &mut Option<File>) -> Option<(Outbox, Vec<Target<'s>>)> {
        // Kept with this set of the topic's files, or with another one
        // (posts at once keep several).
        let file = forwarded.take().or_else(|| self.take_forwarded(topic))?;
        let outbox = match Outbox::try_lock_kept(&self.dir(topic), file, &self.config) {
            Ok(outbox) => outbox,
            Err(file) => {
                *forwarded = file;
                return None;
            }
        };
        // A lagging route is a catch-up for a drain to make.
        if !outbox.state.as_ref().is_some_and(|state| state.lagging.is_empty()) {
            self.unlock_forwarding(forwarded, Some(outbox), Vec::new());
            return None;
        }
        let urls = SourceUrls::of(self, topic);
        let mut targets: Vec<Target<'s>> = Vec::with_capacity(active.len());
        for &route in active {
            match self.lock_target(&urls, route, event) {
                Some(target) => targets.push(target),
                None => {
                    self.unlock_forwarding(forwarded, Some(outbox), targets);
                    return None;
                }
            }
        }
        Some((outbox, targets))
    }

    /// The destination of `route`, locked for its copy of `event`: its
    /// files kept, its routes known with none active (a copy there is
    /// forwarded no further), a journal not stale, the access rules
    /// letting the route deliver, the copy one append.
    fn lock_target<'s>(&'s self, urls: &SourceUrls, route: &'s ListedRoute, event: &Event) -> Option<Target<'s>> {
        if !matches!(route.may_deliver(self), Ok(None)) {
            return None;
        }
        let Ok(Destination::Local(dest)) = route.destination(self) else { return None };
        let copy = self.copy_for(urls, route, (event, None)).map(|(copy, _)| copy);
        let Some(copy_ref) = copy.as_ref() else {
            return Some(Target { route, topic: dest, copy, writer: None, kept: (None, Kept::default()) });
        };
        let mut kept = self.copy_destination(&dest).ok()?;
        let t = now();
        let quiet = kept.1.routes.as_ref().map(|(generation, routes)| (*generation, routes.iter().all(|r| !r.route.is_active(t))));
        let writer = match quiet {
            Some((generation, true)) => self.try_writer(&dest, &mut kept.1.files, generation, copy_ref, 1),
            _ => None,
        };
        match writer {
            Some(writer) => Some(Target { route, topic: dest, copy, writer: Some(writer), kept }),
            None => {
                self.put_kept(kept);
                None
            }
        }
    }

    /// Appends `event` to `topic` with `writer` (its lock held, the append
    /// one write), unlocks, and wakes this process's readers of the topic
    /// with the record as written; the files back for the caller to keep.
    /// (Never in shared mode: nothing for `Store::changed` to record.)
    fn append_held(&self, topic: &Topic, mut writer: Writer<'_>, event: &Event) -> (Result<Appended>, TopicFiles) {
        let waking = self.appending(topic);
        let appended = writer.append(event, now().max(0.0) as u64, &self.gauge);
        let written = waking.as_ref().and_then(|_| writer.take_written());
        let files = writer.release();
        self.appended_written(waking, matches!(appended, Ok(Appended::Stored(_))), written);
        (appended, files)
    }

    /// Gives back every lock [`Store::lock_forwarding`] took, having
    /// written nothing with them: the destinations' files to the cache,
    /// the `.forwarded` file, open, to `forwarded`.
    pub(super) fn unlock_forwarding(&self, forwarded: &mut Option<File>, outbox: Option<Outbox>, targets: Vec<Target<'_>>) {
        for target in targets {
            if let Some(writer) = target.writer {
                self.keep(writer, target.kept);
            }
        }
        if let Some(outbox) = outbox {
            *forwarded = Some(outbox.release(&self.config));
        }
    }

    /// Forwards event `seq` of `topic`, stored, to the `targets` locked
    /// for it, as a post's own drain does ([`Store::drain`] with nothing
    /// pending before it): the state marked tried first, each copy
    /// appended (one that fails makes its route lag from this event), the
    /// cursor moved past it last. The `.forwarded` file, open, goes back
    /// to `forwarded`.
    fn forward_locked(&self, topic: &Topic, seq: u64, mut outbox: Outbox, targets: Vec<Target<'_>>, report: &mut PostReport, forwarded: &mut Option<File>) -> Result<()> {
        let mut state = outbox.state.clone().unwrap_or_default();
        state.tried = Some(state.tried.unwrap_or(seq).max(seq));
        if let Err(err) = outbox.save_before_delivering(&mut state, &self.config) {
            self.unlock_forwarding(forwarded, Some(outbox), targets);
            return Err(err);
        }
        for target in targets {
            let Target { route, topic: dest, copy, writer, mut kept } = target;
            let (Some(copy), Some(writer)) = (copy, writer) else { continue };
            report.deliveries += 1;
            let (appended, files) = self.append_held(&dest, writer, &copy);
            kept.1.files = Some(files);
            self.put_kept(kept);
            match appended {
                Ok(Appended::Stored(at)) => report.writes.push(Write { topic: dest, id: copy.id().unwrap_or(b"").to_vec(), checkpoint: at }),
                Ok(_) => {}
                Err(err) => self.delivery_failed(topic, route, seq, classify_local(err), &mut state, report),
            }
        }
        state.cursor = seq;
        if !state.lagging.is_empty() {
            self.mark_outbox(topic, true);
        }
        let saved = outbox.save(&mut state);
        *forwarded = Some(outbox.release(&self.config));
        saved
    }
}

/// Whether `outbox`'s state, read under its lock, shows nothing pending
/// on a topic whose last event is `last` (read under the topic's lock):
/// every event forwarded, no route lagging.
pub(super) fn nothing_pending(outbox: &Outbox, last: u64) -> bool {
    outbox.state.as_ref().is_some_and(|state| state.cursor == last && state.lagging.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::outbox::InFlight;

    fn event(payload: &str) -> Event {
        let mut e = Event::new();
        e.set("kn_payload", payload);
        e
    }

    /// A store with `/t` routed to `/copies`, posted to once (so that its
    /// files, routes and `.forwarded` are kept).
    fn routed() -> (tempfile::TempDir, Store, Topic) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let topic = Topic::parse("/t").unwrap();
        store.route(&topic, b"/copies", Event::new()).unwrap();
        store.notify(&topic, event("one")).unwrap();
        (dir, store, topic)
    }

    #[test]
    fn a_routed_post_waits_for_another_post_forwarding_the_topic_now() {
        let (_dir, store, topic) = routed();
        assert!(store.notify_nowait(&topic, event("two")).is_some(), "quiet: made at once");
        // Another thread's post, stored and being forwarded.
        store.list_in_flight(&topic, 99, &event("other"));
        let other = InFlight::listed(&store, &topic, 99);
        assert!(store.notify_nowait(&topic, event("three")).is_none());
        drop(other);
        assert!(store.notify_nowait(&topic, event("three")).is_some());
        let copies = Topic::parse("/copies").unwrap();
        assert_eq!(store.events(&copies, &crate::Selection::all()).unwrap().events.len(), 3);
    }

    #[test]
    fn the_forwarding_state_kept_with_another_set_of_the_topics_files_is_used() {
        let (_dir, store, topic) = routed();
        // Two sets of the topic's files kept (as posts at once leave
        // them), `.forwarded` with the one the next post does not take.
        let mut first = store.take_kept(&topic);
        store.notify(&topic, event("two")).unwrap();
        first.1.forwarded = None;
        store.put_kept(first);
        assert!(store.notify_nowait(&topic, event("three")).is_some());
    }
}
