//! Posting: a notify or post runs through the job queue (store the event,
//! announce new topics in `kn_subtopics`, forward along routes), and a
//! route that fails is poisoned.

use std::collections::VecDeque;
use std::io::ErrorKind as IoKind;
use std::sync::Arc;

use crate::config::SyncPolicy;
use crate::error::{Error, ErrorKind, Result};
use crate::event::*;
use crate::ids::{fresh_id, now};
use crate::log::{self, Appended, SharedPayload, Writer};
use crate::remote;
use crate::topic::Topic;

use super::{Destination, Kept, Store, create_topic_dir};
use super::routes::{ListedRoute, RouteList};

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
    /// Deliveries along routes so far, counted against `max_forwards`
    /// across every `run` sharing this report (a route's initial
    /// population runs once per event).
    pub(super) deliveries: usize,
}

/// An event just stored by [`Store::append_event`].
pub(super) struct Stored {
    pub(super) seq: u64,
    /// The topic's route generation when it was stored.
    pub(super) routes_generation: u64,
    /// The topic's routes as of that generation, when the store kept them.
    pub(super) routes: Option<RouteList>,
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

/// One unit of work of the forwarding engine.
pub(super) struct Job {
    pub(super) topic: Topic,
    pub(super) event: Event,
    /// The event's `kn_payload` when it is large enough for a blob: kept
    /// apart (not in `event`) and shared by every copy a route makes, so
    /// that it is stored once and linked into each topic.
    pub(super) payload: Option<Arc<SharedPayload>>,
    /// Set when the job is a delivery along a route: failure poisons it.
    via: Option<(Topic, Vec<u8>)>,
    /// Store first (false for announcements already stored).
    pub(super) store: bool,
}

impl Store {
    /// Posts `event` to `topic` as a client's notify (PROTOCOL.md 3.1 and
    /// 4): refused on `kn_routes`/`kn_subtopics` (400) and on a stale
    /// journal (404); otherwise stored and forwarded along every active
    /// route. A duplicate on an ordinary topic is neither stored nor
    /// forwarded (`report.duplicate`).
    pub fn notify(&self, topic: &Topic, event: Event) -> Result<PostReport> {
        if topic.is_reserved() {
            return Err(Error::new(
                ErrorKind::ReservedTopic,
                format!("can't post to '{topic}': kn_routes and kn_subtopics topics are written by the server only"),
            ));
        }
        self.post(topic, event)
    }

    /// Posts with forwarding like [`Store::notify`], but also to reserved
    /// topics (for tools that restore routes, and the server itself).
    pub fn post(&self, topic: &Topic, event: Event) -> Result<PostReport> {
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
        let stored = self.run(vec![Job { topic: topic.clone(), event, payload, via: None, store: true }], &mut report)?;
        report.duplicate = !stored;
        Ok(report)
    }

    fn stale_error(&self, topic: &Topic) -> Error {
        Error::new(ErrorKind::Expired, format!("journal '{topic}' has expired: no tunnel has read it in the last {} s", self.config.heartbeat_stale.as_secs()))
    }

    /// Step 1 of PROTOCOL.md 4: absolute `kn_expires`, `kn_time_t`, a
    /// `kn_id`; the store assigns the checkpoint.
    fn normalise(&self, mut event: Event) -> Result<Event> {
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

    /// The forwarding engine: a queue, not recursion, so chains of any
    /// length run in constant stack. Returns whether the first job stored.
    pub(super) fn run(&self, jobs: Vec<Job>, report: &mut PostReport) -> Result<bool> {
        let _wakes = crate::watch::WakeBatch::open();
        let mut queue: VecDeque<Job> = jobs.into();
        let mut first = true;
        let mut first_stored = false;
        while let Some(job) = queue.pop_front() {
            let is_first = std::mem::take(&mut first);
            let outcome = self.run_job(&job, report, &mut queue);
            let stored = match outcome {
                Ok(Some(stored)) => stored,
                Ok(None) => continue,
                Err(err) => {
                    if is_first {
                        return Err(err);
                    }
                    if let Some((source, route_id)) = &job.via {
                        self.poison(source, route_id, &err.to_string(), report);
                    }
                    continue;
                }
            };
            if is_first {
                first_stored = true;
            }
            let t = now();
            if job.event.is_expired(t) {
                continue; // stored for duplicate suppression, never delivered
            }
            let routes = match stored {
                Some(Stored { routes: Some(routes), .. }) => routes,
                Some(Stored { routes_generation, .. }) => self.read_routes(&job.topic, Some(routes_generation))?,
                None => self.read_routes(&job.topic, None)?,
            };
            let mut urls = None;
            for route in routes.iter().filter(|r| r.route.is_active(t)) {
                if report.deliveries >= self.config.max_forwards {
                    return Err(Error::new(
                        ErrorKind::TooManyDeliveries,
                        format!(
                            "post to '{}' caused more than {} deliveries (KN_MAX_FORWARDS); stopped there, the event itself was stored",
                            job.topic, self.config.max_forwards
                        ),
                    ));
                }
                report.deliveries += 1;
                let urls = urls.get_or_insert_with(|| SourceUrls::of(self, &job.topic));
                self.forward(&job.topic, urls, route, (&job.event, job.payload.as_ref()), &mut queue, report);
            }
        }
        Ok(first_stored)
    }

    /// Stores one job's event (and announces new topics). `Ok(None)`: a
    /// duplicate, nothing more to do; `Ok(Some(None))`: nothing was stored
    /// (the job carries an announcement stored already).
    fn run_job(&self, job: &Job, report: &mut PostReport, queue: &mut VecDeque<Job>) -> Result<Option<Option<Stored>>> {
        if !job.store {
            return Ok(Some(None));
        }
        let mut kept = self.take_kept(&job.topic);
        if job.via.is_some() && job.topic.is_journal() && self.journal_stale(&job.topic, &mut kept.1) {
            self.put_kept(kept);
            return Err(self.stale_error(&job.topic));
        }
        let create = || -> Result<()> {
            queue.extend(self.ensure_topic(&job.topic, report)?);
            Ok(())
        };
        let Some(stored) = self.append_event(&job.topic, kept, &job.event, job.payload.as_deref(), now(), create)? else { return Ok(None) };
        report.writes.push(Write { topic: job.topic.clone(), id: job.event.id().unwrap_or(b"").to_vec(), checkpoint: stored.seq });
        Ok(Some(Some(stored)))
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
        let Some(stored) = self.append_event(topic, kept, event, None, stored_at, || Ok(()))? else { return Ok(None) };
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
    fn append_event(
        &self,
        topic: &Topic,
        kept: (Option<Topic>, Kept),
        event: &Event,
        payload: Option<&SharedPayload>,
        stored_at: f64,
        create: impl FnOnce() -> Result<()>,
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
                source = Some((writer, parent_kept));
            }
        }
        let (mut writer, kept) = self.writer(topic, kept, &mut prepare)?;
        let stored_secs = stored_at.max(0.0) as u64;
        let waking = self.appending(topic);
        let appended = match payload {
            Some(payload) => writer.append_shared(event, Some(payload), stored_secs, &self.gauge),
            None => writer.append(event, stored_secs, &self.gauge),
        };
        if matches!(appended, Ok(Appended::Stored(_))) && writer.wants_compaction() {
            // Best effort: the post is stored whatever happens here.
            let _ = writer.compact(now());
        }
        let routes_generation = writer.routes_generation();
        let routes = kept.1.routes.as_ref().filter(|(g, _)| *g == routes_generation).map(|(_, r)| Arc::clone(r));
        self.keep(writer, kept);
        if let Some((writer, kept)) = source {
            self.keep(writer, kept);
        }
        self.appended(waking, matches!(appended, Ok(Appended::Stored(_))));
        let Appended::Stored(seq) = appended? else { return Ok(None) };
        Ok(Some(Stored { seq, routes_generation, routes }))
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
        prepare()?;
        let dir = self.checked_dir(topic)?;
        let writer = Writer::open(&dir, &self.config, ordinary)?;
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
                jobs.push(Job { topic: subtopics, event: stored, payload: None, via: None, store: false });
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
        match create_topic_dir(&path) {
            Ok(()) => {
                if self.config.sync == SyncPolicy::Always {
                    log::sync_dir(&self.dir(parent))?;
                }
                Ok(true)
            }
            Err(e) if e.kind() == IoKind::AlreadyExists => Ok(false),
            Err(e) => Err(Error::io("cannot create topic directory", &path, e)),
        }
    }

    pub(super) fn run_queue(&self, queue: VecDeque<Job>, report: &mut PostReport) {
        if queue.is_empty() {
            return;
        }
        // Deliveries: failures poison their routes inside `run`, so the
        // only error left is the first job's, which is a delivery too.
        let mut jobs: Vec<Job> = queue.into();
        let first = jobs.remove(0);
        let via = first.via.clone();
        if let Err(err) = self.run(vec![first], report) {
            if let Some((source, id)) = via {
                self.poison(&source, &id, &err.to_string(), report);
            }
        }
        if !jobs.is_empty() {
            self.run_queue(jobs.into(), report);
        }
    }

    /// PROTOCOL.md 4.1: filter, transform, hop-by-hop elements, then queue
    /// a local delivery or make a remote one.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn forward(
        &self,
        source: &Topic,
        urls: &SourceUrls,
        listed: &ListedRoute,
        (event, shared): (&Event, Option<&Arc<SharedPayload>>),
        queue: &mut VecDeque<Job>,
        report: &mut PostReport,
    ) {
        let route = &listed.route;
        let route_id = route.id().to_vec();
        let payload = shared.map_or(event.payload(), |p| &p.bytes[..]);
        if !listed.passes(self, payload) {
            return;
        }
        let mut out = event.clone();
        let mut shared = shared.cloned();
        if let Some(spec) = route.event.get("kn_content_transform") {
            let allowed = remote::parse_content_transform(spec).and_then(|(url, _)| self.config.outbound.check(url));
            if allowed.is_err() {
                return;
            }
            match remote::content_transform(self.remote.as_ref(), spec, payload) {
                Ok(payload) => {
                    out.set(KN_PAYLOAD, payload);
                    shared = None;
                }
                Err(_) => return, // the event does not travel this route
            }
        }
        out.strip_hop_by_hop();
        let location = match route.event.get("kn_uri") {
            Some(uri) => uri.to_vec(),
            None => format!("{}/{}", urls.routes, String::from_utf8_lossy(&route_id)).into_bytes(),
        };
        out.set(KN_ROUTE_LOCATION, location).set(KN_ROUTE_ID, route_id.clone()).set(KN_ROUTED_FROM, urls.topic.as_bytes());
        let via = Some((source.clone(), route_id.clone()));
        match listed.destination(self) {
            Ok(Destination::Local(topic)) => queue.push_back(Job { topic, event: out, payload: shared, via, store: true }),
            Ok(Destination::Remote(url)) => {
                if let Some(shared) = &shared {
                    out.set(KN_PAYLOAD, shared.bytes.clone());
                }
                let result = self.config.outbound.check(&url).and_then(|_| remote::deliver(self.remote.as_ref(), &url, &out));
                if let Err(err) = result {
                    self.poison(source, &route_id, &err.to_string(), report);
                }
            }
            Err(err) => self.poison(source, &route_id, &err, report),
        }
    }

    /// PROTOCOL.md 4.1 step 5: replace the route, under the same id, by an
    /// inactive one that expires in 300 s. It carries the reason as
    /// [`KN_POISONED`] (`kn routes --all` shows it), unless that would make it
    /// larger than `max_event_bytes`: then it is poisoned without.
    fn poison(&self, source: &Topic, route_id: &[u8], reason: &str, report: &mut PostReport) {
        let mut event = Event::new();
        event.set(KN_ID, route_id).set(KN_PAYLOAD, "").set(KN_EXPIRES, "+300");
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
