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

use std::collections::VecDeque;
use std::fs::{self, File};
use std::io::ErrorKind as IoKind;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, ErrorKind, Result};
use crate::event::*;
use crate::ids::now;
use crate::log::{self, SharedPayload};
use crate::remote::{self, RemoteFailure};
use crate::stats::Counter;
use crate::topic::Topic;

use super::job::{Job, SourceUrls};
use super::report::{PostReport, Write};
use super::read::Selection;
use super::routes::{ListedRoute, RouteList};
use super::{Destination, Store};

/// The name of a topic's forwarding state (cursor and lagging routes).
pub(crate) const FORWARDED_FILE: &str = ".forwarded";

/// The store's list of topics with lagging routes (one empty file per
/// topic, named by the hex of the topic name), so that a background pass
/// finds them without walking the tree.
pub(crate) const OUTBOX_DIR: &str = ".outbox";

/// `.forwarded` holds two slots of this size; a state is written whole
/// into the slot its generation's parity names, so a write torn by a crash
/// leaves the other slot (the previous state) readable.
const SLOT_BYTES: u64 = 64 << 10;

const MAGIC: &[u8; 4] = b"KNf1";

/// How many events of one topic a drain reads back from the log at once;
/// more pending than this (after a long outage) is completed over several
/// drains, the oldest first.
const BATCH: usize = 1000;

/// How many copies' own forwarding jobs and reported writes a drain
/// without a post of its own holds before it stops and leaves the rest
/// pending for its caller's next pass.
const HELD: usize = 20_000;

/// How many of a journal's newest events are searched for a copy before a
/// redelivery appends it (see [`Store::drain`]).
const JOURNAL_DEDUP_WINDOW: usize = 1000;

/// The longest wait between two retries, whatever `forward_backoff` and
/// the attempts say.
const MAX_BACKOFF_SECS: f64 = 3600.0;

/// A route that has not yet received every event up to the cursor.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Lag {
    pub(super) route_id: Vec<u8>,
    /// The first event (seq) the route still needs.
    pub(super) from: u64,
    /// Failed attempts so far (0 for a population not yet tried).
    pub(super) attempts: u32,
    /// Not before this time (seconds since the epoch).
    pub(super) next_at: f64,
}

/// A topic's forwarding state.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct State {
    generation: u64,
    /// Every event up to this seq has been forwarded (except along the
    /// lagging routes).
    pub(super) cursor: u64,
    pub(super) lagging: Vec<Lag>,
    /// The last event a drain may have started to deliver: every drain
    /// raises it to the end of what it is about to deliver, and writes
    /// it, before it delivers anything. So the events after it have never
    /// been delivered anywhere (a deferred notify's, or one whose post was
    /// killed before its drain), need no search for an earlier copy, and
    /// are delivered a route at a time, many to a journal in one append;
    /// those up to it may have been delivered in part by a drain that was
    /// killed. `None`: not known (a state written before it existed, or
    /// a new one), taken as the end of the log at the next drain. Written
    /// after the lagging routes, where a reader that does not know it
    /// stops reading.
    pub(super) tried: Option<u64>,
}

impl State {
    fn encode(&self) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&self.generation.to_le_bytes());
        body.extend_from_slice(&self.cursor.to_le_bytes());
        body.extend_from_slice(&(self.lagging.len() as u32).to_le_bytes());
        for lag in &self.lagging {
            body.extend_from_slice(&(lag.route_id.len() as u32).to_le_bytes());
            body.extend_from_slice(&lag.route_id);
            body.extend_from_slice(&lag.from.to_le_bytes());
            body.extend_from_slice(&lag.attempts.to_le_bytes());
            body.extend_from_slice(&lag.next_at.to_bits().to_le_bytes());
        }
        if let Some(tried) = self.tried {
            body.extend_from_slice(&tried.to_le_bytes());
        }
        let mut out = Vec::with_capacity(body.len() + 12);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&crate::record::crc32c(&[&body]).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// A new state: every event up to `cursor` forwarded, none after it
    /// tried.
    fn at(cursor: u64) -> State {
        State { cursor, tried: Some(cursor), ..State::default() }
    }

    fn decode(slot: &[u8]) -> Option<State> {
        let (head, rest) = slot.split_at_checked(12)?;
        if &head[..4] != MAGIC {
            return None;
        }
        let len = u32::from_le_bytes(head[4..8].try_into().ok()?) as usize;
        let crc = u32::from_le_bytes(head[8..12].try_into().ok()?);
        let body = rest.get(..len)?;
        if crate::record::crc32c(&[body]) != crc {
            return None;
        }
        let mut r = Reader(body);
        let mut state = State { generation: r.u64()?, cursor: r.u64()?, lagging: Vec::new(), tried: None };
        for _ in 0..r.u32()? {
            let n = r.u32()? as usize;
            let route_id = r.take(n)?.to_vec();
            state.lagging.push(Lag { route_id, from: r.u64()?, attempts: r.u32()?, next_at: f64::from_bits(r.u64()?) });
        }
        // Absent in a state written before it existed: none known.
        if !r.0.is_empty() {
            state.tried = Some(r.u64()?);
        }
        Some(state)
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (a, b) = self.0.split_at_checked(n)?;
        self.0 = b;
        Some(a)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

/// A topic's `.forwarded`, open and locked (`flock`, released on drop):
/// one forwarder per topic at a time. Only the append locks of other
/// topics are ever taken under it, never another topic's `.forwarded`
/// (their forwarding is queued until this one is released), so it cannot
/// deadlock.
pub(super) struct Outbox {
    file: File,
    path: PathBuf,
    /// The state read; `None` when the file was new or unreadable.
    pub(super) state: Option<State>,
}

impl Outbox {
    pub(super) fn lock(dir: &Path, config: &crate::Config) -> Result<Outbox> {
        Outbox::lock_kept(dir, None, config)
    }

    /// [`Outbox::lock`] through `kept`, the topic's `.forwarded` kept open
    /// by an earlier drain of this process ([`Outbox::release`]): no
    /// `open` and no path lookup per post. Used only while the file is
    /// still the topic's (it has a link: not removed with its topic);
    /// else opened afresh.
    pub(super) fn lock_kept(dir: &Path, kept: Option<File>, config: &crate::Config) -> Result<Outbox> {
        let path = dir.join(FORWARDED_FILE);
        let lock = |file: &File| crate::shared::lock(file, crate::shared::LockKind::Exclusive, config).map_err(|e| Error::io("cannot lock forwarding state", &path, e));
        let kept = match kept {
            Some(file) => {
                lock(&file)?;
                // Else closed: its lock goes with it.
                log::stat_fd(&file).is_ok_and(|meta| meta.links > 0).then_some(file)
            }
            None => None,
        };
        let file = match kept {
            Some(file) => file,
            None => {
                let file = log::open_shared(&path, false).map_err(|e| Error::io("cannot open forwarding state", &path, e))?;
                lock(&file)?;
                file
            }
        };
        let state = read_state(&file).map_err(|e| Error::io("cannot read forwarding state", &path, e))?;
        Ok(Outbox { file, path, state })
    }

    /// [`Outbox::lock_kept`] for a post that must not wait
    /// ([`Store::notify_nowait`]): `Err` when another holds the lock (the
    /// file handed back, to be kept again), or when the file is no longer
    /// the topic's or its state cannot be read (closed: its lock goes with
    /// it).
    pub(super) fn try_lock_kept(dir: &Path, file: File, config: &crate::Config) -> std::result::Result<Outbox, Option<File>> {
        if !crate::shared::try_lock(&file, crate::shared::LockKind::Exclusive, config).unwrap_or(false) {
            return Err(Some(file));
        }
        if !log::stat_fd(&file).is_ok_and(|meta| meta.links > 0) {
            return Err(None);
        }
        let state = read_state(&file).map_err(|_| None)?;
        Ok(Outbox { file, path: dir.join(FORWARDED_FILE), state })
    }

    /// Releases the lock and gives the file back open, for the topic's
    /// next drain ([`Outbox::lock_kept`]).
    pub(super) fn release(self, config: &crate::Config) -> File {
        crate::shared::unlock(&self.file, config);
        self.file
    }

    /// Writes `state` before a drain delivers what it marks as tried:
    /// with `sync=always` flushed too, so that no power cut can leave a
    /// delivery made and its mark lost.
    pub(super) fn save_before_delivering(&mut self, state: &mut State, config: &crate::Config) -> Result<()> {
        self.save(state)?;
        if config.sync == crate::config::SyncPolicy::Always {
            self.file.sync_data().map_err(|e| Error::io("cannot sync forwarding state", &self.path, e))?;
        }
        Ok(())
    }

    pub(super) fn save(&mut self, state: &mut State) -> Result<()> {
        state.generation = state.generation.wrapping_add(1);
        let bytes = state.encode();
        if bytes.len() as u64 > SLOT_BYTES {
            return Err(Error::new(ErrorKind::TooLarge, format!("forwarding state of {} bytes does not fit {}", bytes.len(), self.path.display())));
        }
        let at = (state.generation % 2) * SLOT_BYTES;
        self.file.write_all_at(&bytes, at).map_err(|e| Error::io("cannot write forwarding state", &self.path, e))?;
        self.state = Some(state.clone());
        Ok(())
    }
}

/// Bytes of a slot read at once: a state with no lagging route (32
/// bytes) or a few is read whole in one `pread`; a longer one takes a
/// second for the rest.
const SLOT_FIRST_READ: usize = 512;

/// The newer of the two slots' states that is whole and intact, if any.
fn read_state(file: &File) -> std::io::Result<Option<State>> {
    let mut best: Option<State> = None;
    for slot in 0..2u64 {
        let at = slot * SLOT_BYTES;
        let mut buf = vec![0u8; SLOT_FIRST_READ];
        // One `pread`: a state is shorter than this read, and a short
        // read (the end of the file) is completed below if need be.
        let Ok(got) = log::read_once(file, &mut buf, at) else { continue };
        if got < 12 {
            continue;
        }
        let len = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]) as u64;
        if len > SLOT_BYTES - 12 {
            continue;
        }
        let whole = 12 + len as usize;
        if whole > got {
            buf.resize(whole, 0);
            if file.read_exact_at(&mut buf[got..], at + got as u64).is_err() {
                continue;
            }
        }
        buf.truncate(whole);
        if let Some(state) = State::decode(&buf) {
            if best.as_ref().is_none_or(|b| state.generation > b.generation) {
                best = Some(state);
            }
        }
    }
    Ok(best)
}

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

/// What became of one delivery along one route.
pub(super) enum Delivery {
    /// Delivered, filtered out, or a duplicate: nothing more to do.
    Done,
    /// Failed for now (a local I/O error, a full disk, a remote 5xx or no
    /// answer): the route is kept and the event retried later.
    Transient(Error),
    /// Failed for good (PROTOCOL.md 4.1): the route is poisoned.
    Permanent(Counter, Error),
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
            // New (or unreadable): nothing before this post is pending.
            None => State::at(upto),
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
    fn events_between(&self, topic: &Topic, after: u64, upto: u64) -> Result<Vec<(u64, Event)>> {
        if after >= upto {
            return Ok(Vec::new());
        }
        if let Some(events) = self.in_flight_between(topic, after, upto) {
            return Ok(events);
        }
        let selection = Selection { since_checkpoint: Some(after.to_string().into_bytes()), ..Selection::default() };
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

    /// Delivers one event of `source` along every active route that does
    /// not lag; a transient failure makes the route lag from this event.
    /// Fails with [`ErrorKind::TooManyDeliveries`] past `max_forwards`.
    #[allow(clippy::too_many_arguments)]
    fn deliver_all(
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
            Delivery::Transient(err) => {
                let _ = self.count(Counter::DeliveriesRetried, 1);
                if self.config.forward_retries == 0 {
                    self.poison(source, route.route.id(), unreachable_counter(&err), &err.to_string(), report);
                    return;
                }
                let next_at = now() + self.config.forward_backoff.as_secs_f64();
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
    fn catch_up(
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
                Some(Delivery::Transient(err)) => {
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
    fn deliver_run(
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
        // carry these copies: they were stored before it).
        let t = now();
        let routed = match stored.first().and_then(|s| s.routes.as_ref()) {
            Some(routes) => routes.iter().any(|r| r.route.is_active(t)),
            None => self.dir(&dest.routes()).exists(),
        };
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
        let selection = Selection { max_n: Some(JOURNAL_DEDUP_WINDOW), ..Selection::default() };
        let recent = self.select_at_most(dest, &selection, true, JOURNAL_DEDUP_WINDOW, None)?;
        Ok(recent.events.into_iter().any(|mut e| {
            e.remove(KN_ROUTE_CHECKPOINT);
            e == *copy
        }))
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

/// The counter of a route poisoned after its retries: remote (no answer)
/// or local (the fault never cleared).
fn unreachable_counter(err: &Error) -> Counter {
    if err.kind() == ErrorKind::Remote { Counter::PoisonedUnreachable } else { Counter::PoisonedOther }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_survives_encoding_and_a_damaged_slot_is_refused() {
        let state = State {
            generation: 7,
            cursor: 42,
            lagging: vec![Lag { route_id: b"r1".to_vec(), from: 40, attempts: 2, next_at: 1.5 }],
            tried: Some(43),
        };
        let bytes = state.encode();
        assert_eq!(State::decode(&bytes), Some(state.clone()));
        // As written before `tried` existed (and as a binary of then
        // reads it, ignoring it): not known.
        let body = &bytes[12..bytes.len() - 8];
        let mut old = MAGIC.to_vec();
        old.extend_from_slice(&(body.len() as u32).to_le_bytes());
        old.extend_from_slice(&crate::record::crc32c(&[body]).to_le_bytes());
        old.extend_from_slice(body);
        assert_eq!(State::decode(&old), Some(State { tried: None, ..state }));
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 1;
            assert_eq!(State::decode(&bad), None, "byte {i} flipped");
        }
        assert_eq!(State::decode(&bytes[..bytes.len() - 1]), None);
    }

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

    #[test]
    fn the_newer_slot_wins_and_a_torn_one_leaves_the_older() {
        let dir = tempfile::tempdir().unwrap();
        let mut outbox = Outbox::lock(dir.path(), &crate::Config::new(dir.path())).unwrap();
        assert_eq!(outbox.state, None);
        let mut state = State { cursor: 1, ..State::default() };
        outbox.save(&mut state).unwrap();
        state.cursor = 2;
        outbox.save(&mut state).unwrap();
        drop(outbox);
        assert_eq!(Outbox::lock(dir.path(), &crate::Config::new(dir.path())).unwrap().state.unwrap().cursor, 2);
        // Tear the newer slot: the older state is read.
        let f = fs::OpenOptions::new().write(true).open(dir.path().join(FORWARDED_FILE)).unwrap();
        f.write_all_at(b"\xff\xff", (state.generation % 2) * SLOT_BYTES + 14).unwrap();
        assert_eq!(Outbox::lock(dir.path(), &crate::Config::new(dir.path())).unwrap().state.unwrap().cursor, 1);
    }

    #[test]
    fn a_state_longer_than_the_first_read_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let config = crate::Config::new(dir.path());
        let lag = |i: u64| Lag { route_id: format!("route-{i:020}").into_bytes(), from: i, attempts: 1, next_at: 2.5 };
        let mut state = State { cursor: 9, lagging: (0..60).map(lag).collect(), ..State::default() };
        assert!(state.encode().len() > SLOT_FIRST_READ);
        let mut outbox = Outbox::lock(dir.path(), &config).unwrap();
        outbox.save(&mut state).unwrap();
        drop(outbox);
        assert_eq!(Outbox::lock(dir.path(), &config).unwrap().state.as_ref(), Some(&state));
        // The other slot, short this time: the newer (short) one wins.
        let mut outbox = Outbox::lock(dir.path(), &config).unwrap();
        let mut short = State { lagging: Vec::new(), ..state.clone() };
        outbox.save(&mut short).unwrap();
        drop(outbox);
        assert_eq!(Outbox::lock(dir.path(), &config).unwrap().state.as_ref(), Some(&short));
    }

    #[test]
    fn hex_names_round_trip() {
        assert_eq!(unhex(&hex(b"/what/chat")).unwrap(), b"/what/chat");
        assert_eq!(unhex("zz"), None);
        assert_eq!(unhex("abc"), None);
    }
}
