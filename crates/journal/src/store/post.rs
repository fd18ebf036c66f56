//! Posting: a notify or post runs through the job queue (store the event,
//! announce new topics in `kn_subtopics`, forward along routes through the
//! outbox, `outbox.rs`), and a route that fails for good is poisoned.

use std::collections::VecDeque;
use std::io::ErrorKind as IoKind;
use std::sync::Arc;

use crate::config::SyncPolicy;
use crate::error::{Error, ErrorKind, Result};
use crate::event::*;
use crate::ids::{fresh_id, now};
use crate::log::{self, Appended, SharedPayload, Writer};
use crate::stats::Counter;
use crate::topic::Topic;

use super::{Kept, Store, create_topic_dir};
use super::job::{Job, Stored};
use super::outbox::{InFlight, Own};
use super::report::{Poisoned, PostReport, Write, KN_POISONED};
use super::routes::RouteList;

impl Store {
    /// Posts `event` to `topic` as a client's notify (PROTOCOL.md 3.1 and
    /// 4): refused on `kn_routes`/`kn_subtopics` (400) and on a stale
    /// journal (404); otherwise stored and forwarded along every active
    /// route. A duplicate on an ordinary topic is neither stored nor
    /// forwarded (`report.duplicate`).
    pub fn notify(&self, topic: &Topic, event: Event) -> Result<PostReport> {
        self.check_notify(topic)?;
        self.post_with(topic, event, false)
    }

    /// [`Store::notify`] for a server, which answers before a fan-out:
    /// on a topic with more active routes than `Config::forward_inline`,
    /// the event is stored and its forwarding left pending in the outbox
    /// (`report.forwarding_deferred`), for the caller to complete with
    /// [`Store::complete_deferred`] once it has answered. The drain that
    /// completes it delivers a route at a time, the copies bound for one
    /// journal in one append (FORMAT.md, "Deferred forwarding"). With
    /// fewer routes, exactly [`Store::notify`].
    pub fn notify_deferring(&self, topic: &Topic, event: Event) -> Result<PostReport> {
        self.check_notify(topic)?;
        self.post_with(topic, event, true)
    }

    fn check_notify(&self, topic: &Topic) -> Result<()> {
        if topic.is_presence() {
            return Err(Error::new(ErrorKind::ReservedTopic, format!("can't post to '{topic}': kn_presence topics are written by the server only")));
        }
        if topic.is_reserved() {
            return Err(Error::new(
                ErrorKind::ReservedTopic,
                format!("can't post to '{topic}': kn_routes and kn_subtopics topics are written by the server only"),
            ));
        }
        Ok(())
    }

    /// Posts with forwarding like [`Store::notify`], but also to reserved
    /// topics (for tools that restore routes, and the server itself).
    pub fn post(&self, topic: &Topic, event: Event) -> Result<PostReport> {
        self.post_with(topic, event, false)
    }

    fn post_with(&self, topic: &Topic, event: Event, defer: bool) -> Result<PostReport> {
        if topic.is_journal() {
            let mut kept = self.take_kept(topic);
            let stale = self.journal_stale(topic, &mut kept.1);
            self.put_kept(kept);
            if stale {
                return Err(self.stale_error(topic));
            }
        }
        let mut event = self.normalise(event)?;
        let payload = SharedPayload::take_from(&mut event, &self.config).map(Arc::new);
        let id = event.id().unwrap_or(b"").to_vec();
        let mut report = PostReport { id, ..PostReport::default() };
        let job = Job { topic: topic.clone(), event, payload, stored: None };
        let stored = if self.groups_posts(&job) { self.run_grouped(job, &mut report, defer)? } else { self.run(job, &mut report, defer)? };
        report.duplicate = !stored;
        Ok(report)
    }

    pub(super) fn stale_error(&self, topic: &Topic) -> Error {
        Error::new(ErrorKind::Expired, format!("journal '{topic}' has expired: no tunnel has read it in the last {} s", self.config.heartbeat_stale.as_secs()))
    }

    /// Step 1 of PROTOCOL.md 4: absolute `kn_expires`, `kn_time_t`, a
    /// `kn_id`; the store assigns the checkpoint.
    pub(super) fn normalise(&self, mut event: Event) -> Result<Event> {
        let size = event.byte_size();
        if size > self.config.max_event_bytes {
            return Err(Error::new(
                ErrorKind::TooLarge,
                format!("event of {size} bytes is larger than the maximum of {} bytes", self.config.max_event_bytes),
            ));
        }
        let t = now();
        if let Some(at) = event.expires_at(t)? {
            event.set(KN_EXPIRES, format_time(at));
        }
        if !event.contains(KN_TIME_T) {
            event.set(KN_TIME_T, format_time(t.floor()));
        }
        if event.id().map(|id| id.is_empty()).unwrap_or(true) {
            event.set(KN_ID, fresh_id());
        }
        event.remove(KN_ROUTE_CHECKPOINT);
        Ok(event)
    }

    /// The forwarding engine: stores the first job's event, then forwards
    /// it and every copy that causes through a queue, not recursion, so
    /// chains of any length run in constant stack. Returns whether the
    /// event was stored (false: a duplicate). Once it is stored, only
    /// `max_forwards` fails the post: a delivery that cannot be made now
    /// stays in the topic's outbox.
    /// With `defer`, a topic with more active routes than
    /// `Config::forward_inline` has its event's forwarding left pending
    /// ([`Store::notify_deferring`]).
    pub(super) fn run(&self, mut job: Job, report: &mut PostReport, defer: bool) -> Result<bool> {
        let _wakes = crate::watch::WakeBatch::open();
        let mut queue = VecDeque::new();
        let mut _in_flight = None;
        if job.stored.is_none() {
            let Some(stored) = self.run_job(&job, report, &mut queue)? else { return Ok(false) };
            // Unlisted once its forwarding is over (or left pending).
            _in_flight = stored.listed.then(|| InFlight::listed(self, &job.topic, stored.seq));
            job.stored = Some(stored);
        }
        if defer && self.defer_forwarding(&mut job) {
            report.forwarding_deferred = true;
        } else if let Err(err) = self.forward_stored(job, report, &mut queue) {
            if err.kind() == ErrorKind::TooManyDeliveries {
                return Err(err);
            }
        }
        self.run_forwarding(queue, report)?;
        Ok(true)
    }

    /// Whether the forwarding of `job` (stored) is left pending, for
    /// [`Store::notify_deferring`]: its topic has more active routes than
    /// `Config::forward_inline`, and the outbox recorded it. Anything that
    /// cannot be read or written here forwards before the answer instead.
    /// Routes read here are kept in `job` for that forwarding.
    pub(super) fn defer_forwarding(&self, job: &mut Job) -> bool {
        let limit = self.config.forward_inline;
        let Some(stored) = &mut job.stored else { return false };
        if limit == 0 {
            return false;
        }
        let routes = match self.stored_routes(&job.topic, stored) {
            Ok(routes) => stored.routes.insert(routes).clone(),
            Err(_) => return false,
        };
        let t = now();
        if routes.iter().filter(|r| r.route.is_active(t)).count() <= limit {
            return false;
        }
        self.record_deferred(&job.topic, stored.seq).is_ok()
    }

    /// Forwards a stored event along its topic's active routes (nothing to
    /// do, and nothing read but the routes, on a topic without any).
    pub(super) fn forward_stored(&self, job: Job, report: &mut PostReport, queue: &mut VecDeque<Job>) -> Result<()> {
        let Some(stored) = job.stored else { return Ok(()) };
        let t = now();
        if job.event.is_expired(t) {
            return Ok(()); // stored for duplicate suppression, never delivered
        }
        let routes = self.stored_routes(&job.topic, &stored)?;
        if !routes.iter().any(|r| r.route.is_active(t)) {
            return Ok(());
        }
        let own = Own { seq: stored.seq, event: &job.event, payload: job.payload.as_ref() };
        self.drain(&job.topic, Some(own), &routes, report, queue)
    }

    /// Stores one job's event (and announces new topics); `None` for a
    /// duplicate.
    fn run_job(&self, job: &Job, report: &mut PostReport, queue: &mut VecDeque<Job>) -> Result<Option<Stored>> {
        let kept = self.take_kept(&job.topic);
        let create = || -> Result<()> {
            queue.extend(self.ensure_topic(&job.topic, report)?);
            Ok(())
        };
        // Listed as in flight (`outbox::InFlight`) before the lock is let go.
        let list = job.payload.is_none();
        let Some(stored) = self.append_event(&job.topic, kept, &job.event, job.payload.as_deref(), now(), create, None, list)? else { return Ok(None) };
        report.writes.push(Write { topic: job.topic.clone(), id: job.event.id().unwrap_or(b"").to_vec(), checkpoint: stored.seq });
        Ok(Some(stored))
    }

    /// Appends under the topic's lock. Returns the checkpoint and the event
    /// as readers will see it, or `None` for a duplicate.
    pub(super) fn store_event(&self, topic: &Topic, event: &Event) -> Result<Option<(u64, Event)>> {
        self.store_event_at(topic, event, now())
    }

    /// Appends as [`Store::store_event`], recording `stored_at` as the time
    /// the event was stored (an import keeps the original time).
    pub(crate) fn store_event_at(&self, topic: &Topic, event: &Event, stored_at: f64) -> Result<Option<(u64, Event)>> {
        let kept = self.take_kept(topic);
        let Some(stored) = self.append_event(topic, kept, event, None, stored_at, || Ok(()), None, false)? else { return Ok(None) };
        let mut out = event.clone();
        out.set(KN_ROUTE_CHECKPOINT, stored.seq.to_string());
        Ok(Some((stored.seq, out)))
    }

    /// Appends `event` to `topic` under its lock, recording `stored_at` as
    /// the time it was stored; `None` for a duplicate. With the topic's
    /// files kept from an earlier post (and still matching its log, see
    /// FORMAT.md) this opens and looks up nothing; otherwise `create`
    /// first makes the topic's directory if needed, and the files are
    /// opened afresh after the symbolic-link check.
    ///
    /// A write to `T/kn_routes` first changes `T`'s route generation, and
    /// holds `T`'s lock until it is stored, so that no process goes on
    /// using routes of `T` read before (see [`Store::read_routes`]).
    ///
    /// With `search` (a redelivered copy bound for a journal), the
    /// journal's newest events are searched for it under the lock, and
    /// nothing is appended if it is there (`None`, as a duplicate).
    ///
    /// With `list` (a post's own event, forwarded by its caller), the event
    /// stored on a topic that may have routes is listed as in flight
    /// before the lock is released (`Stored::listed`; the caller unlists
    /// it with `outbox::InFlight`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn append_event(
        &self,
        topic: &Topic,
        kept: (Option<Topic>, Kept),
        event: &Event,
        payload: Option<&SharedPayload>,
        stored_at: f64,
        create: impl FnOnce() -> Result<()>,
        search: Option<&Event>,
        list: bool,
    ) -> Result<Option<Stored>> {
        let mut create = Some(create);
        let mut prepare = || create.take().map_or(Ok(()), |c| c());
        let mut source = None;
        if topic.last_segment() == Some(crate::topic::ROUTES_SEGMENT) {
            if let Some(parent) = topic.parent() {
                // Create `kn_routes` (announcing it in the source's
                // `kn_subtopics`) before taking the source's lock: a lock
                // is only ever taken under a parent topic's lock.
                if kept.1.files.is_none() {
                    prepare()?;
                }
                let parent_kept = self.take_kept(&parent);
                let (mut writer, parent_kept) = self.writer(&parent, parent_kept, &mut prepare)?;
                writer.routes_changing()?;
                // A deletion closes its window first (follow.rs).
                if let Err(e) = self.route_deleting_windows(topic, writer.last_seq(), event) {
                    self.keep(writer, parent_kept);
                    return Err(e);
                }
                source = Some((writer, parent_kept));
            }
        }
        let (mut writer, kept) = self.writer(topic, kept, &mut prepare)?;
        if let Some(copy) = search {
            match self.journal_has_copy(topic, copy, payload) {
                Ok(false) => {}
                found => {
                    self.keep(writer, kept);
                    if let Some((writer, kept)) = source {
                        self.keep(writer, kept);
                    }
                    return found.map(|_| None);
                }
            }
        }
        let stored_secs = stored_at.max(0.0) as u64;
        let waking = self.appending(topic);
        let appended = match payload {
            Some(payload) => writer.append_shared(event, Some(payload), stored_secs, &self.gauge),
            None => writer.append(event, stored_secs, &self.gauge),
        };
        let wrote = matches!(appended, Ok(Appended::Stored(_)));
        let mut listed = false;
        if let Ok(Appended::Stored(seq)) = appended {
            if list && kept.1.routes.as_ref().is_none_or(|(_, routes)| !routes.is_empty()) {
                self.list_in_flight(topic, seq, event);
                listed = true;
            }
        }
        let (routes_generation, routes, written) = self.after_append(writer, kept, waking.is_some(), wrote);
        if let (Some((source_writer, _)), true) = (&source, wrote) {
            // Under the source's lock, after the route record (follow.rs).
            self.route_changed_windows(topic, source_writer.last_seq(), event);
        }
        if let Some((writer, kept)) = source {
            self.keep(writer, kept);
        }
        self.appended_written(waking, wrote, written);
        let Appended::Stored(seq) = appended? else { return Ok(None) };
        self.changed(topic);
        Ok(Some(Stored { seq, routes_generation: Some(routes_generation), routes, listed }))
    }

    /// Appends `copies` to the journal `topic` under its lock, as
    /// consecutive records written together (`Writer::append_run`); what
    /// [`Store::append_event`] does for one event, for many.
    pub(super) fn append_copies(
        &self,
        topic: &Topic,
        kept: (Option<Topic>, Kept),
        copies: &[Event],
        stored_at: f64,
        create: impl FnOnce() -> Result<()>,
    ) -> Result<Vec<Stored>> {
        let mut create = Some(create);
        let mut prepare = || create.take().map_or(Ok(()), |c| c());
        let (mut writer, kept) = self.writer(topic, kept, &mut prepare)?;
        let waking = self.appending(topic);
        let appended = writer.append_run(copies, stored_at.max(0.0) as u64, &self.gauge);
        let wrote = appended.as_ref().is_ok_and(|seqs| !seqs.is_empty());
        let (routes_generation, routes, written) = self.after_append(writer, kept, waking.is_some(), wrote);
        self.appended_written(waking, wrote, written);
        let seqs = appended?;
        self.changed(topic);
        Ok(seqs.into_iter().map(|seq| Stored { seq, routes_generation: Some(routes_generation), routes: routes.clone(), listed: false }).collect())
    }

    /// The end of an append by `writer` (`wrote`: it stored something):
    /// the compaction it made due (best effort: what was stored stays
    /// whatever happens there), the topic's route generation and its
    /// routes of that generation if kept, and the files kept, unlocked.
    /// Returns those, with what was written when this process's readers
    /// are `waiting` for it ([`Store::appended_written`]).
    pub(super) fn after_append(&self, mut writer: Writer<'_>, kept: (Option<Topic>, Kept), waiting: bool, wrote: bool) -> (u64, Option<RouteList>, Option<log::Written>) {
        if wrote && writer.wants_compaction() {
            let _ = writer.compact_wanted(now());
        }
        let routes_generation = writer.routes_generation();
        let routes = kept.1.routes.as_ref().filter(|(g, _)| *g == routes_generation).map(|(_, r)| Arc::clone(r));
        let written = if waiting { writer.take_written() } else { None };
        self.keep(writer, kept);
        (routes_generation, routes, written)
    }

    /// A locked writer of `topic`: from the files in `kept` when they still
    /// match the log, else (after `prepare`) opened afresh, refused when a
    /// component of the topic's path is a symbolic link. Hands `kept` back
    /// (without its files) for [`Store::keep`].
    pub(super) fn writer(
        &self,
        topic: &Topic,
        mut kept: (Option<Topic>, Kept),
        prepare: &mut impl FnMut() -> Result<()>,
    ) -> Result<(Writer<'_>, (Option<Topic>, Kept))> {
        let ordinary = !topic.is_journal();
        if let Some(files) = kept.1.files.take() {
            // Kept files that still match the log are the topic's own: the
            // directory they are in was checked when they were opened.
            if let Some(writer) = Writer::reopen(&self.config, ordinary, files)? {
                return Ok((writer, kept));
            }
        }
        // By path: a topic the sweep removed meanwhile is handled there.
        let writer = self.open_writer(topic, prepare)?;
        kept.0.get_or_insert_with(|| topic.clone());
        Ok((writer, kept))
    }

    /// Unlocks `writer` and keeps its files with the rest of `kept` for
    /// the next post to the topic.
    pub(super) fn keep(&self, writer: Writer<'_>, mut kept: (Option<Topic>, Kept)) {
        kept.1.files = Some(writer.release());
        self.put_kept(kept);
    }

    /// Creates `topic` and its missing ancestors, storing a `kn_subtopics`
    /// announcement for each new one; returns forwarding jobs for them.
    pub(super) fn ensure_topic(&self, topic: &Topic, report: &mut PostReport) -> Result<Vec<Job>> {
        self.check_topic_size(topic)?;
        let dir = self.checked_dir(topic)?;
        if dir.is_dir() {
            return Ok(Vec::new());
        }
        let mut jobs = Vec::new();
        self.create_topic_dirs(topic, |parent, segment| {
            let subtopics = parent.subtopics();
            let mut announcement = Event::new();
            announcement.set(KN_ID, fresh_id()).set(KN_PAYLOAD, segment).set(KN_TIME_T, format_time(now().floor()));
            if let Some((seq, stored)) = self.store_event(&subtopics, &announcement)? {
                report.writes.push(Write { topic: subtopics.clone(), id: stored.id().unwrap_or(b"").to_vec(), checkpoint: seq });
                let announced = Stored { seq, routes_generation: None, routes: None, listed: false };
                jobs.push(Job::stored(subtopics, stored, None, announced));
            }
            Ok(())
        })?;
        Ok(jobs)
    }

    /// Creates the missing directories of `topic`, top down, and calls
    /// `created(parent, segment)` for each new one other than a
    /// `kn_subtopics` (whose directory, under `parent`, exists by then): the
    /// caller announces it. Another process creating a directory first is
    /// not an error, and then that process announces it.
    pub(crate) fn create_topic_dirs(
        &self,
        topic: &Topic,
        mut created: impl FnMut(&Topic, &str) -> Result<()>,
    ) -> Result<()> {
        // A parent the sweep removed meanwhile: start again from the root.
        let mut attempt = 0;
        loop {
            match self.create_topic_dirs_once(topic, &mut created) {
                Err(e) if e.kind() == ErrorKind::Expired && attempt < 5 => attempt += 1,
                other => return other,
            }
        }
    }

    fn create_topic_dirs_once(&self, topic: &Topic, created: &mut impl FnMut(&Topic, &str) -> Result<()>) -> Result<()> {
        let mut current = Topic::root();
        for segment in topic.segments() {
            let parent = current.clone();
            current = parent.child(segment)?;
            if !self.create_dir_of(&current, &parent)? || segment == crate::topic::SUBTOPICS_SEGMENT {
                continue;
            }
            // The kn_subtopics directory itself is created (unannounced).
            self.create_dir_of(&parent.subtopics(), &parent)?;
            created(&parent, segment)?;
        }
        Ok(())
    }

    /// Creates `topic`'s directory (syncing `parent`'s with `sync=always`);
    /// false when it already existed.
    fn create_dir_of(&self, topic: &Topic, parent: &Topic) -> Result<bool> {
        let path = self.dir(topic);
        if path.is_dir() {
            return Ok(false);
        }
        // Under the parent's lock, which the sweep holds to prune it (not
        // for `kn_routes`, made while a route write may hold that lock:
        // the sweep ignores reserved children, and route writes exclude it).
        let _parent = if topic.is_reserved() { None } else { Some(self.lock_for_child(parent)?) };
        if topic.is_journal() {
            // Queued for the sweep before it exists (sweep.rs).
            self.queue_journal(topic, self.config.heartbeat_stale);
        }
        match create_topic_dir(&path) {
            Ok(()) => {
                if self.config.sync == SyncPolicy::Always {
                    log::sync_dir(&self.dir(parent))?;
                }
                Ok(true)
            }
            Err(e) if e.kind() == IoKind::AlreadyExists => Ok(false),
            // The parent was removed by the sweep since: start again.
            Err(e) if e.kind() == IoKind::NotFound => Err(log::removed(&self.dir(parent))),
            Err(e) => Err(Error::io("cannot create topic directory", &path, e)),
        }
    }

    /// PROTOCOL.md 4.1 step 5: replace the route, under the same id, by an
    /// inactive one that expires in 300 s. It carries the reason as
    /// [`KN_POISONED`] (`kn routes --all` shows it), unless that would make it
    /// larger than `max_event_bytes`: then it is poisoned without.
    /// Counts it under `counter` (the reason's kind).
    pub(super) fn poison(&self, source: &Topic, route_id: &[u8], counter: Counter, reason: &str, report: &mut PostReport) {
        let _ = self.count(counter, 1);
        let mut event = Event::new();
        event.set(KN_ID, route_id).set(KN_PAYLOAD, "").set(KN_EXPIRES, "+300");
        // The record keeps the route's creator: reusing its id needs what
        // deleting the route needed (docs/ACCESS.md).
        if let Ok(Some(route)) = self.route_of(source, route_id) {
            crate::access::Principal::creator_of(&route.event).record_as_creator(&mut event);
        }
        let mut with_reason = event.clone();
        with_reason.set(KN_POISONED, reason);
        if let Ok(event) = self.normalise(with_reason).or_else(|_| self.normalise(event)) {
            let routes = source.routes();
            if let Ok(Some((seq, _))) = self.store_event(&routes, &event) {
                report.writes.push(Write { topic: routes, id: route_id.to_vec(), checkpoint: seq });
            }
        }
        report.poisoned.push(Poisoned { source: source.clone(), route_id: route_id.to_vec(), reason: reason.to_string() });
    }
}
