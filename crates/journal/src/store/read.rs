//! Reading: selecting events (PROTOCOL.md 3.3), resuming at a checkpoint,
//! and tunnels that follow a topic as events land.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind, Result};
use crate::event::*;
use crate::ids::now;
use crate::log::{self, LogCursor};
use crate::record::Record;
use crate::topic::Topic;
use crate::watch::Subscription;

use super::Store;
use super::report::PostReport;

/// Which existing events to send first on a new route or tunnel
/// (PROTOCOL.md 3.3): [`Selection::none`] (only what is stored from now
/// on), [`Selection::all`], or any of the fields set (events matching any
/// of them are selected).
///
/// ```
/// use kn_journal::Selection;
///
/// assert!(Selection::none().is_empty());
/// let last_ten = Selection { max_n: Some(10), ..Selection::none() };
/// assert!(!last_ten.is_empty());
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Selection {
    /// Events stored in the last N seconds (`f64::INFINITY` for all).
    pub max_age: Option<f64>,
    /// The N most recent events.
    pub max_n: Option<usize>,
    /// Every event stored after the one with this checkpoint.
    pub since_checkpoint: Option<Vec<u8>>,
}

/// [`Selection::none`]; spell it so, which says what it selects.
impl Default for Selection {
    fn default() -> Selection {
        Selection::none()
    }
}

impl Selection {
    /// None of the existing events: a tunnel or route opened with it sees
    /// only the events stored after it opened (the protocol's default,
    /// when a request names no `do_max_age`, `do_max_n` or
    /// `do_since_checkpoint`).
    pub fn none() -> Selection {
        Selection { max_age: None, max_n: None, since_checkpoint: None }
    }

    /// Every current event.
    pub fn all() -> Selection {
        Selection { max_age: Some(f64::INFINITY), ..Selection::none() }
    }

    /// True when nothing is asked for.
    pub fn is_empty(&self) -> bool {
        self.max_age.is_none() && self.max_n.is_none() && self.since_checkpoint.is_none()
    }

    /// Reads `do_max_age`, `do_max_n` and `do_since_checkpoint` from an
    /// event's elements (route parameters). Malformed values are errors.
    pub fn from_params(params: &Event) -> Result<Selection> {
        let mut s = Selection::none();
        if let Some(v) = params.get("do_max_age") {
            let text = String::from_utf8_lossy(v);
            let t = text.trim();
            s.max_age = Some(if t.eq_ignore_ascii_case("infinity") {
                f64::INFINITY
            } else {
                t.parse::<f64>().ok().filter(|x| *x >= 0.0).ok_or_else(|| {
                    Error::new(ErrorKind::BadRequest, format!("bad do_max_age '{t}': expected seconds or 'infinity'"))
                })?
            });
        }
        if let Some(v) = params.get("do_max_n") {
            let text = String::from_utf8_lossy(v);
            let t = text.trim();
            // A count too large for this machine asks for more events than
            // exist, which is not an error (PROTOCOL.md 3.3): all of them.
            let digits = !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
            s.max_n = Some(match t.parse::<usize>() {
                Ok(n) => n,
                Err(_) if digits => usize::MAX,
                Err(_) => return Err(Error::new(ErrorKind::BadRequest, format!("bad do_max_n '{t}': expected a count"))),
            });
        }
        if let Some(v) = params.get("do_since_checkpoint") {
            s.since_checkpoint = Some(v.to_vec());
        }
        Ok(s)
    }
}

/// How a `since_checkpoint` selection related to what the topic retains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resume {
    /// No checkpoint was asked for.
    NotAsked,
    /// Resumed exactly after the checkpoint.
    Exact,
    /// The checkpoint is unknown here: everything retained was selected.
    Unknown,
    /// Events after the checkpoint were already deleted by retention:
    /// everything retained was selected, with a gap before it.
    Gap,
}

/// Events selected from a topic, oldest first, each with its
/// `kn_route_checkpoint`.
#[derive(Clone, Debug, PartialEq)]
pub struct Selected {
    /// The events.
    pub events: Vec<Event>,
    /// What became of a `since_checkpoint`.
    pub resume: Resume,
}

impl Store {
    /// The selected unexpired events of `topic`, oldest first, each with its
    /// `kn_route_checkpoint`. On an ordinary topic only the current event of
    /// each `kn_id` counts, ordered by when it was last stored.
    pub fn events(&self, topic: &Topic, selection: &Selection) -> Result<Selected> {
        if topic.is_presence() {
            // Read as it is now (presence.rs).
            let _ = self.presence_pass(topic);
        }
        self.select(topic, selection, false)
    }

    pub(super) fn select(&self, topic: &Topic, selection: &Selection, include_expired: bool) -> Result<Selected> {
        self.select_at_most(topic, selection, include_expired, usize::MAX, None)
    }

    /// [`Store::select`], keeping at most `cap` events: the most recent
    /// ones, as if `max_n` were `cap` (a `since_checkpoint` that would
    /// select more resumes with a [`Resume::Gap`]). Reads backwards from
    /// the newest record and stops at the checkpoint, the age cutoff or
    /// the count, so it holds at most `cap` events whatever the topic's
    /// size (and, on an ordinary topic, the ids of the records it passed).
    /// `end`: the topic's last seq when the caller has just found it (a
    /// tunnel's cursor, a drain's end), so that a resume does not read
    /// the newest segment again to find it.
    pub(super) fn select_at_most(&self, topic: &Topic, selection: &Selection, include_expired: bool, cap: usize, end: Option<u64>) -> Result<Selected> {
        let dir = self.checked_dir(topic)?;
        let ordinary = !topic.is_journal();
        let t = now();
        // A read of `kn_presence` gives who is connected now: its `leave`s
        // go only to a reader resuming after a checkpoint (presence.rs).
        let left = |r: &Record| topic.is_presence() && selection.since_checkpoint.is_none() && r.event.get(crate::event::KN_PRESENCE) == Some(b"leave");
        let live = |r: &Record| (include_expired || !r.event.is_expired(t)) && !left(r);
        let (after, mut resume) = match &selection.since_checkpoint {
            Some(cp) => self.resume_point(&dir, cp, end)?,
            None if selection.is_empty() => return Ok(Selected { events: Vec::new(), resume: Resume::NotAsked }),
            None => (0, Resume::NotAsked),
        };
        let since = selection.since_checkpoint.is_some();
        let max_n = if since { usize::MAX } else { selection.max_n.unwrap_or(usize::MAX) }.min(cap);
        // Stored times are whole seconds, as the original's file times were:
        // the window is compared at that resolution, inclusively.
        let cutoff = match selection.max_age {
            Some(a) if !since && a.is_finite() => (t - a).floor(),
            _ => f64::MIN,
        };
        let mut seen: HashSet<Vec<u8>> = HashSet::new();
        let mut picked = Vec::new();
        let mut left_out = false;
        if max_n > 0 {
            log::read_backwards_after(&dir, after, |r| {
                if r.seq <= after || (r.stored_secs as f64) < cutoff {
                    return false;
                }
                if ordinary && !seen.insert(r.event.id().unwrap_or(b"").to_vec()) {
                    return true; // superseded by a newer record
                }
                if !live(&r) {
                    return true;
                }
                if picked.len() == max_n {
                    left_out = true; // only a resume reads this far
                    return false;
                }
                picked.push(r);
                since || picked.len() < max_n
            })?;
        }
        if left_out && resume == Resume::Exact {
            resume = Resume::Gap;
        }
        picked.reverse();
        Ok(Selected { events: picked.into_iter().map(with_checkpoint).collect(), resume })
    }

    /// Where a resume after `checkpoint` starts, and whether it is exact:
    /// a checkpoint past the end (`end`, else read) is not one this topic
    /// gave.
    fn resume_point(&self, dir: &Path, checkpoint: &[u8], end: Option<u64>) -> Result<(u64, Resume)> {
        let parsed = std::str::from_utf8(checkpoint).ok().and_then(|s| s.trim().parse::<u64>().ok());
        let end = match end {
            Some(end) => end,
            None => log::cursor_at_end(dir)?.last_seq(),
        };
        match parsed {
            Some(c) if c <= end && c > 0 => {
                // Only journal retention deletes events a client has not
                // seen; compaction of an ordinary topic removes superseded
                // and expired ones, which are no gap.
                let first = log::list_segments(dir)?.first().copied().unwrap_or(1);
                let journal = dir.file_name().map(|n| n == crate::topic::JOURNAL_SEGMENT).unwrap_or(false);
                Ok((c, if journal && first > c + 1 { Resume::Gap } else { Resume::Exact }))
            }
            _ => Ok((0, Resume::Unknown)),
        }
    }

    /// Opens a tunnel on `topic` (PROTOCOL.md 3.4): creates the topic (the
    /// report lists the announcements), refreshes a journal's heartbeat,
    /// and returns the initially selected events. Then call
    /// [`Tunnel::next`] / [`Tunnel::wait`] for events as they land.
    pub fn tunnel(&self, topic: &Topic, selection: &Selection) -> Result<TunnelStart> {
        self.help_sweep_before_creating(topic);
        let mut report = PostReport::default();
        let jobs = self.ensure_topic(topic, &mut report)?;
        // Routes on kn_subtopics fire for the announcements.
        let mut forwarded = PostReport::default();
        self.run_forwarding(jobs.into(), &mut forwarded)?;
        report.writes.extend(forwarded.writes);
        report.poisoned.extend(forwarded.poisoned);
        if topic.is_journal() {
            // Under the journal's lock: never one the sweep is removing.
            self.revive(topic, &mut report)?;
        }
        // Held while the tunnel lives: the sweep leaves the topic alone.
        let reading = self.mark_reader(topic, &mut report)?;
        // A presence topic is brought up to date before it is read, then
        // by the tunnel every `presence_pass` (presence.rs).
        let presence = topic.is_presence().then(|| {
            let _ = self.presence_pass(topic);
            Instant::now()
        });
        let dir = self.dir(topic);
        let subscription = self.hub().subscribe(&dir);
        let cursor = log::cursor_at_end(&dir)?;
        // A checkpoint a client has seen was stored before this request:
        // at or before the cursor, which is the end to resume against.
        let mut initial = self.select_at_most(topic, selection, false, self.config.max_selected, Some(cursor.last_seq()))?;
        initial.events.retain(|e| checkpoint_of(e) <= cursor.last_seq());
        let sent = self.sent_tracker(topic, &dir, initial.events.first().map(checkpoint_of), cursor.last_seq());
        let tunnel = Tunnel {
            topic: topic.clone(),
            dir,
            cursor,
            subscription,
            no_segment_after: None,
            kept: None,
            last_beat: Instant::now(),
            poll: match presence {
                Some(_) => self.config.poll_interval.min(self.config.presence_pass),
                None => self.config.poll_interval,
            },
            presence,
            _reading: reading,
            reader: None,
            sent,
        };
        Ok(TunnelStart { tunnel, created: report, initial })
    }
}

/// What [`Store::tunnel`] returns.
pub struct TunnelStart {
    /// The open tunnel.
    pub tunnel: Tunnel,
    /// The topics the tunnel created, with their announcements.
    pub created: PostReport,
    /// The initially selected events, oldest first.
    pub initial: Selected,
}

/// A reader following a topic as events land. Wakeups come from the
/// process-wide change notifier; without one, [`Tunnel::wait`] polls.
pub struct Tunnel {
    pub(super) topic: Topic,
    pub(super) dir: PathBuf,
    cursor: LogCursor,
    subscription: Subscription,
    /// The notifier's count of segments created when a read last found
    /// no segment after the cursor's (see `Subscription::segments_created`).
    no_segment_after: Option<u64>,
    /// The segment being read, kept open between reads when the process
    /// has room for it (see `log::KeptSegment`).
    kept: Option<log::KeptSegment>,
    last_beat: Instant,
    poll: Duration,
    /// On a `kn_presence` topic: when this tunnel last ran a presence
    /// pass (presence.rs).
    presence: Option<Instant>,
    /// Keeps the topic from the sweep while the tunnel lives.
    _reading: super::readers::ReaderMark,
    /// Who reads, when the tunnel was opened through `Store::as_user`:
    /// each delivery checks the access rules again (access/visible.rs).
    pub(crate) reader: Option<crate::access::Reader>,
    /// On a journal: what this tunnel sent, for receipts (receipts.rs).
    sent: Option<super::receipts_file::SentTracker>,
}

/// Tunnels refresh their journal's heartbeat at least this often (and every
/// fifth of `Config::heartbeat_stale` when that is shorter).
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(20);

impl Tunnel {
    /// The topic followed.
    pub fn topic(&self) -> &Topic {
        &self.topic
    }

    /// Writes what this tunnel sent and has not written yet (receipts,
    /// docs/PRESENCE.md; tried once, never waited for). A tunnel does it at
    /// the latest when dropped: call it before a process exits without
    /// dropping it.
    pub fn flush_receipts(&mut self) {
        if let Some(sent) = &mut self.sent {
            sent.flush();
        }
    }

    /// The checkpoint of the last event returned.
    pub fn checkpoint(&self) -> u64 {
        self.cursor.last_seq()
    }

    /// The events stored since the last call (never blocks), oldest first,
    /// unexpired, with checkpoints. Refreshes a journal's heartbeat when due.
    /// A tunnel opened through [`Store::as_user`] delivers only while its
    /// reader may read the topic: once the access rules refuse it, this
    /// is the refusal (`Forbidden`, or `Unauthorized` for anonymous), and
    /// the tunnel is over.
    pub fn next(&mut self, store: &Store) -> Result<Vec<Event>> {
        let mut events = self.read_next(store)?;
        if let Some(reader) = &mut self.reader {
            reader.admit(store, &self.topic, &mut events)?;
        }
        // Returned to be written to the client at once: sent (receipts).
        if let Some(sent) = &mut self.sent {
            sent.sent_up_to(self.cursor.last_seq());
        }
        Ok(events)
    }

    fn read_next(&mut self, store: &Store) -> Result<Vec<Event>> {
        if let Some(last) = self.presence.filter(|last| last.elapsed() >= store.config().presence_pass) {
            // A failed pass (an unreadable route list, a full disk) is
            // tried again at the next: the tunnel goes on meanwhile.
            let _ = store.presence_pass_if_due(&self.topic);
            self.presence = Some(last.max(Instant::now()));
        }
        if self.topic.is_journal() && self.last_beat.elapsed() >= HEARTBEAT_EVERY.min(store.config().heartbeat_stale / 5) {
            store.heartbeat(&self.topic)?;
            self.last_beat = Instant::now();
        }
        let t = now();
        // No segment appeared since the last read found none after the
        // cursor's, or its wakeup is still to come: no need to look.
        let created = self.subscription.segments_created();
        let known = created.is_some() && created == self.no_segment_after;
        // Tunnels keep their segment open, up to half as many as the
        // topic file sets kept for posts (`Config::open_topics`); not in
        // shared mode, where only a fresh open is sure to see another
        // host's compaction (FORMAT.md, "Shared mode").
        let keep_at_most = if store.is_shared() { 0 } else { store.config().open_topics / 2 };
        // What this process appended where the cursor stands, for a tunnel
        // that had read everything before it (one following the topic as
        // it is written, woken by that append): taken from memory, as
        // written, instead of read back from the file. A tunnel behind
        // reads the file. Not in shared mode, where the file server is the
        // authority.
        if !store.is_shared() && self.cursor.caught_up() {
            let cursor = &mut self.cursor;
            let records = self.subscription.with_written(|written| log::read_written(cursor, written));
            if !records.is_empty() {
                // Caught up only if the file ends there too (another
                // process may have appended after): one `statx`.
                self.cursor.caught_up = known && log::KeptSegment::ends_at(&self.kept, &self.cursor);
                return Ok(records.into_iter().filter(|r| !r.event.is_expired(t)).map(with_checkpoint).collect());
            }
        }
        let hints = log::ReadHints { no_new_segment: known, kept: &mut self.kept, keep_at_most };
        let records = log::read_new_hinted(&self.dir, &mut self.cursor, hints)?;
        if self.cursor.caught_up() {
            self.no_segment_after = created;
        }
        Ok(records.into_iter().filter(|r| !r.event.is_expired(t)).map(with_checkpoint).collect())
    }

    /// Waits until new events are available or `timeout` passes, then
    /// returns them (possibly none). Wakes within a millisecond of an
    /// append by any process on a local disk; polls every
    /// `poll_interval` otherwise.
    pub fn wait(&mut self, store: &Store, timeout: Duration) -> Result<Vec<Event>> {
        let deadline = Instant::now() + timeout;
        loop {
            let listener = self.subscription.listen();
            let events = self.next(store)?;
            let left = deadline.saturating_duration_since(Instant::now());
            if !events.is_empty() || left.is_zero() {
                return Ok(events);
            }
            Subscription::wait(listener, left.min(self.poll));
        }
    }

    /// An armed wakeup for async servers: `.await` it (it is a `Future`),
    /// then call [`Tunnel::next`]. Arm it *before* calling `next` so that
    /// no append slips in between.
    pub fn listen(&self) -> event_listener::EventListener {
        self.subscription.listen()
    }

    /// The longest an async server should wait on [`Tunnel::listen`] before
    /// re-reading anyway (the polling fallback).
    pub fn poll_interval(&self) -> Duration {
        self.poll
    }

    /// True when this tunnel must be read every
    /// [`Tunnel::poll_interval`] even with change notification: a
    /// `kn_presence` tunnel looks at who is connected then.
    pub fn must_poll(&self) -> bool {
        self.presence.is_some()
    }

    /// False when this tunnel relies on polling alone.
    pub fn is_notified(&self) -> bool {
        self.subscription.is_notified()
    }

    /// When this tunnel polls, why it has no change notification: the
    /// failed inotify call and its error (e.g. `inotify_init: Too many
    /// open files (os error 24)` once the user's
    /// `fs.inotify.max_user_instances` are taken).
    pub fn why_not_notified(&self) -> Option<&str> {
        self.subscription.why_not_notified()
    }

    /// True when the last [`Tunnel::next`] returned events and read all
    /// that the topic held: a reader that armed [`Tunnel::listen`] before
    /// that call may wait for it rather than call `next` again to find
    /// nothing (which costs a listing of the topic's directory).
    pub fn caught_up(&self) -> bool {
        self.cursor.caught_up()
    }
}

fn with_checkpoint(r: Record) -> Event {
    let mut e = r.event;
    e.set(KN_ROUTE_CHECKPOINT, r.seq.to_string());
    e
}

fn checkpoint_of(e: &Event) -> u64 {
    e.checkpoint().and_then(|c| std::str::from_utf8(c).ok()).and_then(|c| c.parse().ok()).unwrap_or(0)
}
