//! The sweep: what keeps a store as large as the sessions still live, not
//! as the sessions ever seen. Stale journals are removed with the routes
//! that point into them (at their sources, found through the journal's
//! `.sources`) and their `kn_subtopics` announcement; empty topics are
//! pruned; hidden leftovers of an interrupted removal are deleted.
//! [`Store::sweep`] does one bounded slice (pubsub.cgi after a response,
//! `serve` in the background), [`Store::sweep_all`] a whole pass (`kn gc`).
//! FORMAT.md, "Removal", says why a post, route or tunnel racing with a
//! removal never sees half a topic.

use std::fs::{self, File, TryLockError};
use std::io::{ErrorKind as IoKind, Write as _};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::error::{Error, ErrorKind, Result};
use crate::event::*;
use crate::ids::now;
use crate::log::{self, Writer};
use crate::stats::Counter;
use crate::topic::{Topic, ROUTES_SEGMENT, SUBTOPICS_SEGMENT};

use super::post::PostReport;
use super::read::Selection;
use super::{Destination, HEARTBEAT_FILE, Store};

/// The sweep's queue of directories still to visit, in the store root.
const SWEEP_FILE: &str = ".sweep";
/// In a journal: the source topics of the routes created into it.
pub(super) const SOURCES_FILE: &str = ".sources";
/// The name prefix of a topic directory set aside for deletion.
pub const REMOVING_PREFIX: &str = ".removing-";
/// How long a directory set aside must have been left unchanged before a
/// sweep takes it for the leftover of an interrupted removal.
const LEFTOVER_AGE: Duration = Duration::from_secs(60);
/// The queue file's header: the offset of the next name to visit, in
/// decimal, padded to 20 digits, and a newline.
const HEADER: u64 = 21;

/// What a sweep did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// False when the slice did not run: another process was sweeping.
    pub ran: bool,
    /// Topic directories visited.
    pub visited: usize,
    /// Stale journals removed (files, directory, announcement, routes).
    pub journals_removed: u64,
    /// Empty topics removed.
    pub topics_pruned: u64,
    /// Routes into removed journals deleted at their sources.
    pub routes_removed: u64,
    /// Bytes of the files deleted (blobs left without a link included).
    pub bytes_reclaimed: u64,
}

/// What `Store::visit` found to visit next.
struct Visited {
    /// The child topics of the topic visited.
    children: Vec<Topic>,
    /// The parent of a topic just removed: visited again in the same pass
    /// (a slice's walk goes parents first), but only for itself, its
    /// other children being in the queue already.
    emptied: Option<Topic>,
}

/// The grace periods of one sweep.
#[derive(Clone, Copy, Debug)]
struct Grace {
    journal: Duration,
    topic: Duration,
}

impl Store {
    /// True when a sweep slice is due: `sweep_budget` is not 0 and no
    /// process ran one in the last `sweep_interval` (one `stat` of the
    /// sweep's queue file).
    pub fn sweep_due(&self) -> bool {
        if self.config.sweep_budget == 0 {
            return false;
        }
        match fs::metadata(self.config.root.join(SWEEP_FILE)).and_then(|m| m.modified()) {
            Ok(t) => age(t) >= self.config.sweep_interval,
            Err(_) => true,
        }
    }

    /// One slice of the sweep: visits at most `budget` topic directories,
    /// continuing where the last slice of any process stopped (a queue in
    /// the root's `.sweep`; a pass that ends starts again at the root), and
    /// removes what is stale or empty longer than its grace period. Does
    /// nothing (`ran` false) when another process is sweeping. Counts what
    /// it did in the store's counters. A topic that fails is passed by and
    /// the slice goes on; the first such error is returned at the end.
    pub fn sweep(&self, budget: usize) -> Result<SweepReport> {
        let path = self.config.root.join(SWEEP_FILE);
        let file = log::open_shared(&path, false).map_err(|e| Error::io("cannot open", &path, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Ok(SweepReport::default()),
            Err(TryLockError::Error(e)) => return Err(Error::io("cannot lock", &path, e)),
        }
        let mut queue = Queue::open(&file, &path)?;
        let grace = self.grace(None);
        let mut report = SweepReport { ran: true, ..SweepReport::default() };
        let mut restarted = false;
        let mut failed = None;
        let mut revisits = std::collections::HashSet::new();
        while report.visited < budget {
            let batch = queue.pop(budget - report.visited)?;
            if batch.is_empty() {
                if restarted {
                    break;
                }
                restarted = true;
                queue.restart()?;
                continue;
            }
            for (topic, alone) in batch {
                report.visited += 1;
                // A topic that fails (permissions, a damaged log) is passed
                // by, not retried by every slice: the walk goes on.
                match self.visit(&topic, grace, &mut report) {
                    Ok(next) => {
                        if !alone {
                            queue.push(&next.children, false)?;
                        }
                        // Once per slice: the siblings removed after it are
                        // queued before it already.
                        if let Some(parent) = next.emptied.filter(|p| revisits.insert(p.clone())) {
                            queue.push(&[parent], true)?;
                        }
                    }
                    Err(e) => failed = failed.or(Some(e)),
                }
            }
        }
        queue.save()?;
        self.count_sweep(&report);
        self.drop_dead_kept();
        failed.map_or(Ok(report), Err)
    }

    /// A whole pass of the sweep over every topic, deepest first (so a
    /// topic emptied by the removal of its journal goes in the same pass),
    /// for `kn gc`. `grace` overrides both grace periods (0: whatever is
    /// stale or empty now). A topic that fails is passed by; the first
    /// such error is returned once every topic was visited.
    pub fn sweep_all(&self, grace: Option<Duration>) -> Result<SweepReport> {
        let grace = self.grace(grace);
        let mut report = SweepReport { ran: true, ..SweepReport::default() };
        let mut topics = self.topics()?;
        topics.retain(|t| !t.is_reserved());
        topics.reverse();
        topics.push(Topic::root());
        let mut failed = None;
        for topic in topics {
            report.visited += 1;
            if let Err(e) = self.visit(&topic, grace, &mut report).map(|_| ()) {
                failed = failed.or(Some(e));
            }
        }
        self.count_sweep(&report);
        failed.map_or(Ok(report), Err)
    }

    fn grace(&self, over: Option<Duration>) -> Grace {
        Grace { journal: over.unwrap_or(self.config.journal_grace), topic: over.unwrap_or(self.config.topic_grace) }
    }

    /// Adds what a sweep did to the store's counters (best effort: the
    /// counters are figures for operators only).
    fn count_sweep(&self, report: &SweepReport) {
        let counts = [
            (Counter::Sweeps, 1),
            (Counter::JournalsRemoved, report.journals_removed),
            (Counter::TopicsPruned, report.topics_pruned),
            (Counter::RoutesRemoved, report.routes_removed),
            (Counter::BytesReclaimed, report.bytes_reclaimed),
        ];
        for (counter, n) in counts {
            if n > 0 {
                let _ = self.count(counter, n);
            }
        }
    }

    /// Visits one topic directory: deletes the leftovers of interrupted
    /// removals in it, removes it if it is a journal stale longer than
    /// its grace or an empty topic untouched longer than its grace, and
    /// returns its children and, when it was removed, its parent (which
    /// may be empty now).
    fn visit(&self, topic: &Topic, grace: Grace, report: &mut SweepReport) -> Result<Visited> {
        let dir = self.dir(topic);
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if matches!(e.kind(), IoKind::NotFound | IoKind::NotADirectory) => return Ok(Visited { children: Vec::new(), emptied: None }),
            Err(e) => return Err(Error::io("cannot list", &dir, e)),
        };
        let mut children = Vec::new();
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else { continue };
            if !kind.is_dir() {
                continue;
            }
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with(REMOVING_PREFIX) {
                report.bytes_reclaimed += self.delete_leftover(&entry.path());
                continue;
            }
            if name.starts_with('.') || name == ROUTES_SEGMENT || name == SUBTOPICS_SEGMENT {
                continue;
            }
            if let Ok(child) = topic.child(name) {
                children.push(child);
            }
        }
        children.sort();
        if !topic.is_journal() {
            report.routes_removed += self.drop_routes_into_nothing(topic, grace.journal)?;
        }
        if !children.is_empty() || topic.is_root() || topic.is_reserved() {
            return Ok(Visited { children, emptied: None });
        }
        let removed = if topic.is_journal() {
            self.remove_journal(topic, grace.journal, report)?
        } else {
            self.prune_topic(topic, grace.topic, report)?
        };
        Ok(Visited { children, emptied: if removed { topic.parent() } else { None } })
    }

    /// Removes `journal` if it is stale longer than `grace` (FORMAT.md,
    /// "Removal"): under its lock, so that no tunnel revives it meanwhile,
    /// the routes listed in its `.sources` are deleted at their sources,
    /// its announcement is withdrawn, and its directory is set aside and
    /// deleted. True when it was removed.
    fn remove_journal(&self, journal: &Topic, grace: Duration, report: &mut SweepReport) -> Result<bool> {
        let dir = self.dir(journal);
        if !self.removable_journal(&dir, grace) {
            return Ok(false);
        }
        let Some(lock) = lock_topic(&dir, &self.config)? else { return Ok(false) };
        // Again under the lock: a tunnel refreshes the heartbeat under it.
        if !self.removable_journal(&dir, grace) || has_child_dirs(&dir) {
            return Ok(false);
        }
        for source in read_sources(&dir) {
            report.routes_removed += self.drop_routes_into(&source, journal)?;
        }
        self.drop_announcement(journal)?;
        report.bytes_reclaimed += self.set_aside(&dir, lock, &[])?;
        report.journals_removed += 1;
        self.forget_kept(journal);
        Ok(true)
    }

    /// True when the journal in `dir` went stale (heartbeat older than
    /// `heartbeat_stale`; a missing one since the directory last changed,
    /// which is when it was deleted) more than `grace` ago.
    fn removable_journal(&self, dir: &Path, grace: Duration) -> bool {
        match fs::metadata(dir.join(HEARTBEAT_FILE)).and_then(|m| m.modified()) {
            Ok(beat) => age(beat) > self.config.heartbeat_stale + grace,
            Err(_) => fs::metadata(dir).and_then(|m| m.modified()).is_ok_and(|t| age(t) > grace),
        }
    }

    /// Removes `topic` if it is empty (no current event, no active route,
    /// no subtopic, no child directory) and nothing in it changed for
    /// `grace`: under its lock and those of its `kn_routes` and
    /// `kn_subtopics`, its announcement is withdrawn and its directory set
    /// aside and deleted. True when it was removed.
    fn prune_topic(&self, topic: &Topic, grace: Duration, report: &mut SweepReport) -> Result<bool> {
        let dir = self.dir(topic);
        if !quiet(&dir, grace) || !self.is_empty_topic(topic)? {
            return Ok(false);
        }
        let Some(lock) = lock_topic(&dir, &self.config)? else { return Ok(false) };
        let mut inner = Vec::new();
        for reserved in [ROUTES_SEGMENT, SUBTOPICS_SEGMENT] {
            if let Some(l) = lock_topic(&dir.join(reserved), &self.config)? {
                inner.push((reserved, l));
            }
        }
        // Again under the locks: posts, route changes and new child
        // directories all take one of them.
        if has_child_dirs(&dir) || !quiet(&dir, grace) || !self.is_empty_topic(topic)? {
            return Ok(false);
        }
        self.drop_announcement(topic)?;
        report.bytes_reclaimed += self.set_aside(&dir, lock, &inner)?;
        report.topics_pruned += 1;
        for t in [topic.clone(), topic.routes(), topic.subtopics()] {
            self.forget_kept(&t);
        }
        Ok(true)
    }

    fn is_empty_topic(&self, topic: &Topic) -> Result<bool> {
        let one = |t: &Topic| -> Result<bool> {
            if !self.dir(t).is_dir() {
                return Ok(false);
            }
            Ok(!self.select_at_most(t, &Selection::all(), false, 1)?.events.is_empty())
        };
        Ok(!one(topic)? && self.routes(topic)?.is_empty() && !one(&topic.subtopics())?)
    }

    /// Deletes the active routes of `source` that deliver into `journal`
    /// (each replaced by an inactive route expiring after `tombstone_ttl`,
    /// as [`Store::delete_route`]); returns how many.
    fn drop_routes_into(&self, source: &Topic, journal: &Topic) -> Result<u64> {
        if !self.dir(&source.routes()).is_dir() {
            return Ok(0);
        }
        let mut removed = 0;
        for route in self.routes(source)? {
            if matches!(self.route_target(route.destination()), Ok(Destination::Local(t)) if t == *journal) {
                self.delete_route(source, route.id(), None)?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Deletes the active routes of `source` into local journals that do
    /// not exist, made longer than `grace` ago: routes no `.sources` lists
    /// (made into a journal not opened yet that never was, made by an
    /// older version, or racing with the removal), which a source without
    /// posts would otherwise keep for ever. Its first delivery would have
    /// poisoned such a route; this ends it the same way, earlier.
    fn drop_routes_into_nothing(&self, source: &Topic, grace: Duration) -> Result<u64> {
        if !self.dir(&source.routes()).is_dir() {
            return Ok(0);
        }
        let horizon = now() - grace.as_secs_f64();
        let mut removed = 0;
        for route in self.routes(source)? {
            let Ok(Destination::Local(to)) = self.route_target(route.destination()) else { continue };
            let made = route.event.get_str(KN_TIME_T).and_then(|t| t.parse::<f64>().ok()).unwrap_or(0.0);
            if to.is_journal() && made < horizon && !self.dir(&to).is_dir() {
                self.delete_route(source, route.id(), None)?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Withdraws the announcement(s) of `topic` in its parent's
    /// `kn_subtopics`: each is replaced, under its id, by a copy that has
    /// already expired (so it is neither returned nor forwarded, and
    /// compaction reclaims it after `expired_grace`).
    fn drop_announcement(&self, topic: &Topic) -> Result<()> {
        let (Some(parent), Some(segment)) = (topic.parent(), topic.last_segment()) else { return Ok(()) };
        let subtopics = parent.subtopics();
        if !self.dir(&subtopics).is_dir() {
            return Ok(());
        }
        let t = format_time(now().floor());
        for event in self.select(&subtopics, &Selection::all(), false)?.events {
            if event.payload() != segment.as_bytes() {
                continue;
            }
            let mut tombstone = Event::new();
            tombstone.set(KN_ID, event.id().unwrap_or(b"")).set(KN_PAYLOAD, segment).set(KN_TIME_T, t.as_str()).set(KN_EXPIRES, t.as_str());
            self.store_event(&subtopics, &tombstone)?;
        }
        Ok(())
    }

    /// Renames the locked topic directory `dir` out of the tree (one atomic
    /// step: from then on no path leads to it), unlinks its `.lock` and the
    /// `.lock`s of its locked `inner` children (so that every writer that
    /// waited for them finds them removed), deletes it, and only then
    /// releases the locks. Returns the bytes reclaimed.
    fn set_aside(&self, dir: &Path, lock: File, inner: &[(&str, File)]) -> Result<u64> {
        let aside = aside_name(dir);
        fs::rename(dir, &aside).map_err(|e| Error::io("cannot set aside", dir, e))?;
        let _ = fs::remove_file(aside.join(log::LOCK_FILE));
        for (name, _) in inner {
            let _ = fs::remove_file(aside.join(name).join(log::LOCK_FILE));
        }
        let bytes = log::remove_topic_dir(&aside, &self.config.root)?;
        drop(lock);
        Ok(bytes)
    }

    /// Deletes a directory set aside by a removal that did not finish:
    /// one unchanged for `LEFTOVER_AGE` (a removal in progress keeps
    /// changing it; nothing else can reach it by path). Best effort: what
    /// is left waits for the next sweep. Returns the bytes reclaimed.
    fn delete_leftover(&self, path: &Path) -> u64 {
        let old = fs::symlink_metadata(path).and_then(|m| m.modified()).is_ok_and(|t| age(t) > LEFTOVER_AGE);
        if !old {
            return 0;
        }
        log::remove_topic_dir(path, &self.config.root).unwrap_or(0)
    }

    /// Drops the kept files of topics removed (or rewritten) by any
    /// process: a long-lived process (`serve`) would otherwise keep the
    /// descriptors of deleted files, and their space, and fill its cache
    /// with them. Two `fstat`s per kept set.
    fn drop_dead_kept(&self) {
        let Ok(mut cache) = self.kept.lock() else { return };
        let mut dropped = 0;
        cache.topics.retain(|_, sets| {
            let before = sets.len();
            sets.retain(|k| !k.files.as_ref().is_some_and(|f| f.is_dead()));
            dropped += before - sets.len();
            !sets.is_empty()
        });
        cache.count -= dropped;
    }

    /// Drops what this process keeps of a removed topic (open files of
    /// deleted files would keep their space).
    fn forget_kept(&self, topic: &Topic) {
        if let Ok(mut cache) = self.kept.lock() {
            if let Some(sets) = cache.topics.remove(topic) {
                cache.count -= sets.len();
            }
        }
    }

    /// Notes `source` in `journal`'s `.sources` (the reverse index of the
    /// routes into it), under the journal's lock, after the route was
    /// stored: a removal that takes the lock first has either found the
    /// route (listed before) or removed the journal, and then the route
    /// points into a journal that no longer exists (its first delivery
    /// poisons it). Nothing is noted when the journal does not exist.
    /// Called with no other lock held: the lock is released on return.
    pub(super) fn index_route_source(&self, journal: &Topic, source: &Topic) -> Result<()> {
        let dir = self.dir(journal);
        let Some(_lock) = lock_topic(&dir, &self.config)? else { return Ok(()) };
        if read_sources(&dir).contains(source) {
            return Ok(());
        }
        let path = dir.join(SOURCES_FILE);
        let mut file = log::open_shared(&path, true).map_err(|e| Error::io("cannot open", &path, e))?;
        file.write_all(format!("{source}\n").as_bytes()).map_err(|e| Error::io("cannot write", &path, e))
    }

    /// Locks `parent` to create a child directory in it: the sweep prunes
    /// a topic only under its lock and only without child directories, so
    /// a child is never created in a topic being removed. `Expired` when
    /// `parent` was removed (the caller starts again from the root).
    pub(super) fn lock_for_child(&self, parent: &Topic) -> Result<File> {
        let dir = self.dir(parent);
        lock_topic(&dir, &self.config)?.ok_or_else(|| log::removed(&dir))
    }

    /// Refreshes the heartbeat of the journal a tunnel opens, under the
    /// journal's lock, creating the journal again (with `create`, which
    /// announces it) if a removal took it meanwhile: the tunnel then reads
    /// a whole journal, never one being deleted.
    pub(super) fn revive(&self, journal: &Topic, report: &mut PostReport) -> Result<()> {
        for _ in 0..5 {
            let dir = self.checked_dir(journal)?;
            if let Some(_lock) = lock_topic(&dir, &self.config)? {
                return self.heartbeat(journal);
            }
            let jobs = self.ensure_topic(journal, report)?;
            self.run_forwarding(jobs.into(), report)?;
        }
        Err(self.stale_error(journal))
    }

    /// Opens a writer on `topic` by its path (the files it kept were no
    /// good), after `prepare` (which creates the topic when the post may).
    /// A journal removed meanwhile gets the stale answer; an ordinary
    /// topic pruned meanwhile is created again (with its announcements).
    pub(super) fn open_writer(&self, topic: &Topic, prepare: &mut impl FnMut() -> Result<()>) -> Result<Writer<'_>> {
        let ordinary = !topic.is_journal();
        if !ordinary && !self.dir(topic).is_dir() {
            return Err(self.stale_error(topic));
        }
        prepare()?;
        let mut attempt = 0;
        loop {
            let dir = self.checked_dir(topic)?;
            let err = match Writer::open(&dir, &self.config, ordinary) {
                Ok(writer) => return Ok(writer),
                Err(err) => err,
            };
            let removed = err.kind() == ErrorKind::Expired || !dir.is_dir();
            if !removed {
                return Err(err);
            }
            if !ordinary {
                return Err(self.stale_error(topic));
            }
            attempt += 1;
            if attempt > 3 {
                return Err(err);
            }
            let mut report = PostReport::default();
            let jobs = self.ensure_topic(topic, &mut report)?;
            self.run_forwarding(jobs.into(), &mut report)?;
        }
    }
}

/// Opens and locks the `.lock` of the topic directory `dir`; `None` when
/// the directory does not exist or was removed while waiting (its `.lock`
/// unlinked).
fn lock_topic(dir: &Path, config: &crate::Config) -> Result<Option<File>> {
    let path = dir.join(log::LOCK_FILE);
    let file = match log::open_shared(&path, false) {
        Ok(f) => f,
        Err(e) if matches!(e.kind(), IoKind::NotFound | IoKind::NotADirectory) => return Ok(None),
        Err(e) => return Err(Error::io("cannot open lock file", &path, e)),
    };
    crate::shared::lock(&file, crate::shared::LockKind::Exclusive, config).map_err(|e| Error::io("cannot lock topic", &path, e))?;
    if log::unlinked(&file) {
        return Ok(None);
    }
    Ok(Some(file))
}

/// The source topics listed in a journal's `.sources` (lines that do not
/// name a topic, e.g. one cut by a crash, are skipped).
fn read_sources(dir: &Path) -> Vec<Topic> {
    let text = fs::read_to_string(dir.join(SOURCES_FILE)).unwrap_or_default();
    let mut out: Vec<Topic> = text.lines().filter_map(|l| Topic::parse(l).ok()).collect();
    out.sort();
    out.dedup();
    out
}

/// True when `dir` has a child topic directory (reserved ones aside).
fn has_child_dirs(dir: &Path) -> bool {
    let Ok(entries) = fs::read_dir(dir) else { return false };
    entries.flatten().any(|e| {
        let name = e.file_name();
        let name = name.to_string_lossy();
        e.file_type().is_ok_and(|k| k.is_dir()) && !name.starts_with('.') && name != ROUTES_SEGMENT && name != SUBTOPICS_SEGMENT
    })
}

/// True when nothing was written to the topic in `dir` (its directory,
/// its head, those of its `kn_routes` and `kn_subtopics`) for `grace`.
fn quiet(dir: &Path, grace: Duration) -> bool {
    let paths = [
        dir.to_path_buf(),
        dir.join(log::HEAD_FILE),
        dir.join(ROUTES_SEGMENT),
        dir.join(ROUTES_SEGMENT).join(log::HEAD_FILE),
        dir.join(SUBTOPICS_SEGMENT),
        dir.join(SUBTOPICS_SEGMENT).join(log::HEAD_FILE),
    ];
    paths.iter().filter_map(|p| fs::metadata(p).and_then(|m| m.modified()).ok()).all(|t| age(t) > grace)
}

fn age(t: SystemTime) -> Duration {
    SystemTime::now().duration_since(t).unwrap_or(Duration::ZERO)
}

/// A fresh hidden name next to `dir` for setting it aside (never a topic:
/// it starts with `.`; short enough whatever the topic's name).
fn aside_name(dir: &Path) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let parent = dir.parent().unwrap_or(dir);
    parent.join(format!("{REMOVING_PREFIX}{}-{n}-{nanos}", std::process::id()))
}

/// The sweep's queue in `.sweep` (held under its lock): a header with the
/// offset of the next name, then topic names, one per line (`!` before a
/// name: visit that topic alone, not its children). Names are
/// read from the offset and appended at the end; when the offset reaches
/// the end, the file restarts with the root. A damaged file only costs a
/// restart (lines that are not topic names are skipped).
struct Queue<'f> {
    file: &'f File,
    path: &'f Path,
    offset: u64,
    len: u64,
}

impl<'f> Queue<'f> {
    fn open(file: &'f File, path: &'f Path) -> Result<Queue<'f>> {
        let len = file.metadata().map_err(|e| Error::io("cannot stat", path, e))?.len();
        let mut header = [0u8; HEADER as usize];
        let offset = file
            .read_exact_at(&mut header, 0)
            .ok()
            .and_then(|_| std::str::from_utf8(&header[..20]).ok()?.trim().parse::<u64>().ok())
            .filter(|&o| (HEADER..=len).contains(&o));
        let mut queue = Queue { file, path, offset: offset.unwrap_or(len), len };
        if offset.is_none() {
            queue.restart()?;
        }
        Ok(queue)
    }

    /// Up to `n` names from the offset (fewer at the end of the queue),
    /// each with whether it is to be visited alone.
    fn pop(&mut self, n: usize) -> Result<Vec<(Topic, bool)>> {
        let want = (self.len - self.offset).min(64 << 10) as usize;
        let mut buf = vec![0u8; want];
        let read = self.file.read_at(&mut buf, self.offset).map_err(|e| Error::io("cannot read", self.path, e))?;
        buf.truncate(read);
        let mut out = Vec::new();
        let mut used = 0;
        for line in buf.split_inclusive(|&b| b == b'\n') {
            if out.len() >= n || !line.ends_with(b"\n") {
                break;
            }
            used += line.len();
            let name = &line[..line.len() - 1];
            let (name, alone) = match name.strip_prefix(b"!") {
                Some(rest) => (rest, true),
                None => (name, false),
            };
            if let Ok(t) = Topic::parse_bytes(name) {
                out.push((t, alone));
            }
        }
        if used == 0 && read > 0 && read == want && !buf.contains(&b'\n') {
            // A line longer than the buffer is no topic name: skip it all.
            used = read;
        }
        self.offset += used as u64;
        if out.is_empty() && used > 0 {
            return self.pop(n);
        }
        Ok(out)
    }

    fn push(&mut self, topics: &[Topic], alone: bool) -> Result<()> {
        if topics.is_empty() {
            return Ok(());
        }
        let mark = if alone { "!" } else { "" };
        let text: String = topics.iter().map(|t| format!("{mark}{t}\n")).collect();
        self.file.write_all_at(text.as_bytes(), self.len).map_err(|e| Error::io("cannot write", self.path, e))?;
        self.len += text.len() as u64;
        Ok(())
    }

    /// Empties the queue and puts the root in it.
    fn restart(&mut self) -> Result<()> {
        self.file.set_len(HEADER).map_err(|e| Error::io("cannot truncate", self.path, e))?;
        self.len = HEADER;
        self.offset = HEADER;
        self.push(&[Topic::root()], false)
    }

    /// Writes the offset (which also marks the time of this slice).
    fn save(&self) -> Result<()> {
        let header = format!("{:020}\n", self.offset);
        self.file.write_all_at(header.as_bytes(), 0).map_err(|e| Error::io("cannot write", self.path, e))
    }
}
