//! The sweep: what keeps a store as large as the sessions still live, not
//! as the sessions ever seen. Stale journals are removed with the routes
//! that point into them (at their sources, found through the journal's
//! `.sources`, deleted in one append per source and slice) and their
//! `kn_subtopics` announcement; empty topics are pruned; hidden leftovers
//! of an interrupted removal are deleted.
//!
//! A slice finds its work in due queues (`sweep_index.rs`), not by walking
//! the tree: every journal is queued when it is created (due when it can
//! first be stale past its grace) and queued again while it is live; the
//! parent of every removed topic is queued (due after `topic_grace`). A
//! slow walk of the tree, a small share of each slice, is the backstop for
//! what no queue names (topics emptied by expiry, stores of older
//! versions). [`Store::sweep`] does one bounded slice (pubsub.cgi after a
//! response, `serve` in the background), [`Store::sweep_all`] a whole pass
//! (`kn gc`). FORMAT.md, "Removal", says why a post, route or tunnel
//! racing with a removal never sees half a topic. The routes a removal
//! leaves pointing at nothing are deleted by `sweep_routes.rs`; what
//! keeps a topic from removal while it is read, and its numbers from
//! being handed out again, is `readers.rs`.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::ErrorKind as IoKind;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};
use crate::log;
use crate::stats::Counter;
use crate::topic::{Topic, PRESENCE_SEGMENT, ROUTES_SEGMENT, SUBTOPICS_SEGMENT};

use super::readers::Readers;
use super::sweep_routes::read_sources;
use super::sweep_index::{self as index, Due, DueQueue, Owed, Queue};
use super::sweep_removal::{age, has_child_dirs, last_change, lock_topic, now_secs, quiet, secs_ceil, secs_floor, REMOVING_PREFIX};
use super::Store;



/// What a sweep did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// False when the slice did not run: another process was sweeping.
    pub ran: bool,
    /// Topic directories visited (queued entries looked at, and
    /// directories of the walk).
    pub visited: usize,
    /// Stale journals removed (files, directory, announcement, routes).
    pub journals_removed: u64,
    /// Empty topics removed.
    pub topics_pruned: u64,
    /// Routes into removed journals deleted at their sources.
    pub routes_removed: u64,
    /// Bytes of the files deleted (blobs left without a link included).
    pub bytes_reclaimed: u64,
    /// The slice stopped at its budget with queued work due (and nothing
    /// failed): the sweep is behind, and the next slice is due at once
    /// ([`Store::sweep_due`]), not after `sweep_interval`.
    pub behind: bool,
}

/// The grace periods of one sweep.
#[derive(Clone, Copy, Debug)]
struct Grace {
    journal: Duration,
    topic: Duration,
}

/// What one slice (or a `kn gc` pass) carries while it runs.
struct Run {
    grace: Grace,
    report: SweepReport,
    /// Route deletions owed by the journals removed (and by a slice that
    /// died before settling them), settled at the end.
    owed: Vec<Owed>,
    /// Whether removals queue their parent (slices; `kn gc` visits every
    /// topic children first instead).
    queue_parents: bool,
    /// Topics this run put in the topics queue and did not take out yet:
    /// each is queued once at a time.
    queued: HashSet<Topic>,
    failed: Option<Error>,
}

impl Run {
    fn fail(&mut self, e: Error) {
        self.failed.get_or_insert(e);
    }

    /// A run for one thread of this one, to be merged back.
    fn fork(&self) -> Run {
        Run {
            grace: self.grace,
            report: SweepReport::default(),
            owed: Vec::new(),
            queue_parents: self.queue_parents,
            queued: self.queued.clone(),
            failed: None,
        }
    }

    /// Settles the route deletions owed (`sweep_routes.rs`).
    fn settle_owed(&mut self, store: &Store) {
        let (removed, failed) = store.settle_owed(std::mem::take(&mut self.owed));
        self.report.routes_removed += removed;
        if let Some(e) = failed {
            self.fail(e);
        }
    }

    /// Adds what a forked run did (its looks are counted by the caller).
    fn merge(&mut self, other: Run) {
        let r = other.report;
        self.report.journals_removed += r.journals_removed;
        self.report.topics_pruned += r.topics_pruned;
        self.report.routes_removed += r.routes_removed;
        self.report.bytes_reclaimed += r.bytes_reclaimed;
        self.owed.extend(other.owed);
        self.queued.extend(other.queued);
        if let Some(e) = other.failed {
            self.fail(e);
        }
    }
}

/// What a look at a queued journal or topic decided.
enum Look {
    /// Removed, gone, or nothing to do until something queues it again.
    Done,
    /// To look at again from this time (seconds since the epoch).
    Again(u64),
}

impl Store {
    /// True when a sweep slice is due: `sweep_budget` is not 0 and no
    /// process ran one in the last `sweep_interval`, or the last one
    /// stopped at its budget with work due ([`SweepReport::behind`]): one
    /// `stat` of the sweep's queue file.
    pub fn sweep_due(&self) -> bool {
        if self.config.sweep_budget == 0 {
            return false;
        }
        match fs::metadata(self.config.root.join(index::WALK_FILE)).and_then(|m| m.modified()) {
            Ok(t) => age(t) >= self.config.sweep_interval,
            Err(_) => true,
        }
    }

    /// One slice of the sweep: looks at most at `budget` topics. First the
    /// journals whose queue entry is due (each removed if stale longer
    /// than its grace, else queued again for when it may be), for up to
    /// half of the queues' share of the budget, then the queued parents
    /// of removed topics (each pruned if empty and quiet longer than its
    /// grace, which may queue its own parent: a cascade completes in one
    /// slice), then both again, then, with what is left of the budget but
    /// at least an eighth of it, the backstop walk of the tree, continuing
    /// where the last slice of any process stopped (a queue in the root's
    /// `.sweep`; a pass that ends starts again at the root), and the
    /// parents of what the walk removed. Then the
    /// routes into the removed journals are deleted, one append per
    /// source. Does nothing (`ran` false) when another process is
    /// sweeping. Counts what it did in the store's counters. A topic that
    /// fails is passed by and the slice goes on; the first such error is
    /// returned at the end.
    pub fn sweep(&self, budget: usize) -> Result<SweepReport> {
        let path = self.config.root.join(index::WALK_FILE);
        let file = log::open_shared(&path, false).map_err(|e| Error::io("cannot open", &path, e))?;
        match crate::shared::try_lock(&file, crate::shared::LockKind::Exclusive, &self.config) {
            Ok(true) => {}
            Ok(false) => return Ok(SweepReport::default()),
            Err(e) => return Err(Error::io("cannot lock", &path, e)),
        }
        // Best effort: a failed pass is tried again at the next slice.
        let _ = self.pass_routed_presence();
        self.slice(&file, &path, budget)
    }

    /// Called before `journal` is created (a tunnel opens it), with no
    /// lock held: when the journal does not exist yet and the sweep is
    /// behind ([`SweepReport::behind`]), does one slice of
    /// `sweep_budget` first, waiting for a slice running meanwhile (and
    /// doing none if that one caught up). Journals are thus never made
    /// faster than the sweep removes them: whatever share of the machine
    /// the sweep gets, the store stays as large as the sessions still
    /// live, and a new session waits for a slice only while the sweep is
    /// behind. Best effort: an error is the next slice's to report.
    pub(super) fn help_sweep_before_creating(&self, journal: &Topic) {
        if self.config.sweep_budget == 0 || !journal.is_journal() || !self.sweep_behind() || self.dir(journal).is_dir() {
            return;
        }
        let path = self.config.root.join(index::WALK_FILE);
        let Ok(file) = log::open_shared(&path, false) else { return };
        if crate::shared::lock(&file, crate::shared::LockKind::Exclusive, &self.config).is_err() || !self.sweep_behind() {
            return;
        }
        let _ = self.slice(&file, &path, self.config.sweep_budget);
    }

    /// True when the last slice stopped at its budget with work due: it
    /// marked the sweep's queue file with the time 0 (one `stat`).
    fn sweep_behind(&self) -> bool {
        let path = self.config.root.join(index::WALK_FILE);
        fs::metadata(path).and_then(|m| m.modified()).is_ok_and(|t| t == UNIX_EPOCH)
    }

    /// One slice of [`Store::sweep`], with `file` (the walk's queue in
    /// `path`) locked.
    fn slice(&self, file: &File, path: &Path, budget: usize) -> Result<SweepReport> {
        let mut run = self.start_run(None, true);
        // While the sweep is behind, the queues take the whole budget:
        // the walk, a backstop, waits until they are drained.
        let walk_share = if self.sweep_behind() { 0 } else { (budget / 8).max(1).min(budget) };
        let queue_share = budget.saturating_sub(walk_share).max(budget.min(1));
        let t = now_secs();
        let root = &self.config.root;
        let mut journals = DueQueue::open(root.join(index::JOURNALS_FILE), &self.config)?;
        let mut topics = DueQueue::open(root.join(index::TOPICS_FILE), &self.config)?;
        // The journals queue first, but for half of the queues' share
        // while the topics queue has work (a session leaves two topic
        // looks after its journal's), then the topics queue, then the
        // journals queue again with what is left.
        let mut drained = Ok(());
        for (journals_up_to, topics_up_to) in [((queue_share / 2).max(1), queue_share), (queue_share, queue_share)] {
            drained = drained
                .and_then(|_| self.drain_journals(&mut journals, t, journals_up_to, &mut run))
                .and_then(|_| self.drain_topics(&mut topics, t, topics_up_to, &mut run));
        }
        if let Err(e) = drained {
            run.fail(e);
        }
        let mut walk = Queue::open(file, path)?;
        let left = if walk_share == 0 { 0 } else { budget - run.report.visited.min(budget) };
        if let Err(e) = self.walk(&mut walk, left, &mut run) {
            run.fail(e);
        }
        // The parents of what the walk removed.
        if let Err(e) = self.drain_topics(&mut topics, t, budget, &mut run) {
            run.fail(e);
        }
        run.settle_owed(self);
        if let Err(e) = self.sweep_extra(Some(budget), None, &mut run.report) {
            run.fail(e);
        }
        // A slice that failed keeps the interval's pace (a full disk, a
        // queue it cannot write): slices back to back would only fail
        // again.
        let now = now_secs();
        run.report.behind = run.failed.is_none() && (journals.has_due(now).unwrap_or(false) || topics.has_due(now).unwrap_or(false));
        for saved in [journals.save(), topics.save(), walk.save()] {
            if let Err(e) = saved {
                run.fail(e);
            }
        }
        if run.report.behind {
            // Marked (time 0) for every process: the next slice is due at
            // once (`sweep_due`), and whoever creates a journal helps
            // first (`help_sweep_before_creating`). The queues fill as
            // fast as journals are made: a sweep that waited
            // `sweep_interval` between slices of `budget` would fall
            // further behind for as long as that rate lasts. Best effort:
            // only the file's owner may set its time; for another user,
            // the next slice comes after the interval.
            let _ = file.set_modified(UNIX_EPOCH);
        } else {
            // Not on every slice of a catch-up: two `fstat`s per kept set.
            self.drop_dead_kept();
        }
        self.finish(run)
    }

    /// A whole pass of the sweep over every topic, deepest first (so a
    /// topic emptied by the removal of its journal goes in the same pass),
    /// for `kn gc`; waits for a slice running meanwhile to end. `grace`
    /// overrides both grace periods (0: whatever is stale or empty now).
    /// A topic that fails is passed by; the first such error is returned
    /// once every topic was visited.
    pub fn sweep_all(&self, grace: Option<Duration>) -> Result<SweepReport> {
        let path = self.config.root.join(index::WALK_FILE);
        let file = log::open_shared(&path, false).map_err(|e| Error::io("cannot open", &path, e))?;
        crate::shared::lock(&file, crate::shared::LockKind::Exclusive, &self.config).map_err(|e| Error::io("cannot lock", &path, e))?;
        // A whole pass removes what the queues name: the sweep is not
        // behind (the header rewritten, the mark of a slice that was is
        // gone), and a new journal need not wait for this pass.
        let _ = Queue::open(&file, &path).and_then(|walk| walk.save());
        let mut run = self.start_run(grace, false);
        let mut topics = self.topics()?;
        topics.retain(|t| !t.is_reserved());
        topics.reverse();
        topics.push(Topic::root());
        for topic in topics {
            run.report.visited += 1;
            if let Err(e) = self.visit(&topic, &mut run) {
                run.fail(e);
            }
        }
        run.settle_owed(self);
        if let Err(e) = self.sweep_extra(None, grace, &mut run.report) {
            run.fail(e);
        }
        self.finish(run)
    }

    fn start_run(&self, over: Option<Duration>, queue_parents: bool) -> Run {
        let grace = Grace { journal: over.unwrap_or(self.config.journal_grace), topic: over.unwrap_or(self.config.topic_grace) };
        let owed = index::read_owed(&self.config.root);
        Run { grace, report: SweepReport { ran: true, ..SweepReport::default() }, owed, queue_parents, queued: HashSet::new(), failed: None }
    }

    /// Counts what a run did in the store's counters (best effort: the
    /// counters are figures for operators only) and returns its report or
    /// its first error.
    fn finish(&self, run: Run) -> Result<SweepReport> {
        let report = run.report;
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
        run.failed.map_or(Ok(report), Err)
    }

    /// Queues `journal` in `.sweep-journals`, due `stale_in` plus
    /// `journal_grace` from now (the earliest it could be removed):
    /// called just before a journal's directory is created, with
    /// `heartbeat_stale` (the tunnel creating it refreshes its heartbeat;
    /// a crash in between leaves an entry naming nothing, passed by), and
    /// when a journal is expired, with 0. Every creation entry is due a
    /// fixed time after it is appended, so the queue is in the order they
    /// fall due, but for the entries of expired journals and of live ones
    /// queued again (due `heartbeat_stale` after their heartbeat), which
    /// hold back, or are held back, by at most `heartbeat_stale`. Best
    /// effort: a journal missing from the queue is found by the backstop
    /// walk. Nothing is queued when no slices run (`sweep_budget` 0:
    /// `kn gc` walks the tree).
    pub(super) fn queue_journal(&self, journal: &Topic, stale_in: Duration) {
        if self.config.sweep_budget == 0 {
            return;
        }
        let due = secs_floor(SystemTime::now() + stale_in + self.config.journal_grace);
        let _ = index::enqueue(&self.config, index::JOURNALS_FILE, &[(due, journal)]);
    }

    /// Looks at the due entries of the journals queue, up to `budget`.
    fn drain_journals(&self, queue: &mut DueQueue, t: u64, budget: usize, run: &mut Run) -> Result<()> {
        let mut seen = HashSet::new();
        let mut journals = Vec::new();
        for Due { topic, .. } in queue.pop(t, budget.saturating_sub(run.report.visited))? {
            run.report.visited += 1;
            if topic.is_journal() && seen.insert(topic.clone()) {
                journals.push(topic);
            }
        }
        let again = self.look_at_all(journals, run, Store::look_at_journal);
        let again: Vec<(u64, &Topic)> = again.iter().map(|(due, topic)| (*due, topic)).collect();
        index::enqueue(&self.config, index::JOURNALS_FILE, &again)
    }

    /// Looks at each of `topics` with `look`, on up to `sweep_threads`
    /// threads (each with a fork of `run`, merged back); returns the
    /// topics to look at again, with when.
    fn look_at_all(&self, topics: Vec<Topic>, run: &mut Run, look: fn(&Store, &Topic, &mut Run) -> Result<Look>) -> Vec<(u64, Topic)> {
        let threads = self.config.sweep_threads.clamp(1, topics.len().max(1));
        let mut parts: Vec<Vec<Topic>> = vec![Vec::new(); threads];
        for (i, topic) in topics.into_iter().enumerate() {
            parts[i % threads].push(topic);
        }
        let one = |part: Vec<Topic>, run: &mut Run| {
            let mut again = Vec::new();
            for topic in part {
                match look(self, &topic, run) {
                    Ok(Look::Again(due)) => again.push((due, topic)),
                    Ok(Look::Done) => {}
                    Err(e) => run.fail(e),
                }
            }
            again
        };
        if threads == 1 {
            return one(parts.pop().unwrap_or_default(), run);
        }
        let forks: Vec<(Run, Vec<(u64, Topic)>)> = std::thread::scope(|scope| {
            let handles: Vec<_> = parts
                .into_iter()
                .map(|part| {
                    let mut fork = run.fork();
                    scope.spawn(move || {
                        let again = one(part, &mut fork);
                        (fork, again)
                    })
                })
                .collect();
            handles.into_iter().filter_map(|h| h.join().ok()).collect()
        });
        let mut again = Vec::new();
        for (fork, more) in forks {
            run.merge(fork);
            again.extend(more);
        }
        again
    }

    /// A queued journal: removed when stale longer than its grace, else
    /// queued again for when it may be (a live one is thus looked at about
    /// once per `heartbeat_stale`, whatever the store's size).
    fn look_at_journal(&self, journal: &Topic, run: &mut Run) -> Result<Look> {
        let dir = self.dir(journal);
        let Some(stale) = self.stale_since(&dir) else { return Ok(Look::Done) };
        let removable_at = stale + run.grace.journal;
        if SystemTime::now() < removable_at {
            return Ok(Look::Again(secs_ceil(removable_at)));
        }
        if self.remove_journal(journal, run.grace.journal, run)? {
            return Ok(Look::Done);
        }
        match self.stale_since(&dir) {
            None => Ok(Look::Done),
            // Refreshed meanwhile.
            Some(stale) if SystemTime::now() < stale + run.grace.journal => Ok(Look::Again(secs_ceil(stale + run.grace.journal))),
            // With a child topic: look again later.
            Some(_) => Ok(Look::Again(secs_ceil(SystemTime::now() + self.config.heartbeat_stale + run.grace.journal))),
        }
    }

    /// Looks at the due entries of the topics queue, including those that
    /// the prunes of this slice queue, up to `budget` in all.
    fn drain_topics(&self, queue: &mut DueQueue, t: u64, budget: usize, run: &mut Run) -> Result<()> {
        let mut again = Vec::new();
        while run.report.visited < budget {
            // Now, not the slice's start: what this slice queued is due
            // by now even if a second began meanwhile.
            let entries = queue.pop(t.max(now_secs()), budget - run.report.visited)?;
            if entries.is_empty() {
                break;
            }
            let mut topics = Vec::new();
            for Due { topic, .. } in entries {
                run.report.visited += 1;
                run.queued.remove(&topic);
                if !topics.contains(&topic) {
                    topics.push(topic);
                }
            }
            again.extend(self.look_at_all(topics, run, Store::look_at_topic));
        }
        let again: Vec<(u64, &Topic)> = again.iter().map(|(due, topic)| (*due, topic)).collect();
        index::enqueue(&self.config, index::TOPICS_FILE, &again)
    }

    /// A queued topic (the parent of a removed one): pruned when empty and
    /// quiet longer than its grace; queued again for when it may be quiet;
    /// left when it has a child (the child's removal queues it again).
    fn look_at_topic(&self, topic: &Topic, run: &mut Run) -> Result<Look> {
        if topic.is_root() || topic.is_reserved() || topic.is_journal() {
            return Ok(Look::Done);
        }
        let dir = self.dir(topic);
        if !dir.is_dir() || has_child_dirs(&dir) {
            return Ok(Look::Done);
        }
        if let Some(changed) = last_change(&dir) {
            if age(changed) < run.grace.topic {
                return Ok(Look::Again(secs_ceil(changed + run.grace.topic)));
            }
        }
        if self.has_live_readers(&dir) {
            // Read: looked at again, as a live journal is.
            return Ok(Look::Again(secs_ceil(SystemTime::now() + self.config.heartbeat_stale)));
        }
        self.prune_topic(topic, run.grace.topic, run)?;
        Ok(Look::Done)
    }

    /// Queues the parent of `topic` (about to be removed) in
    /// `.sweep-topics`, due after `topic_grace`: it may be empty then.
    /// Written before the removal, so a crash cannot lose it.
    fn queue_parent(&self, topic: &Topic, run: &mut Run) -> Result<()> {
        let Some(parent) = topic.parent() else { return Ok(()) };
        if !run.queue_parents || parent.is_root() || !run.queued.insert(parent.clone()) {
            return Ok(());
        }
        let due = secs_floor(SystemTime::now() + self.config.topic_grace);
        index::enqueue(&self.config, index::TOPICS_FILE, &[(due, &parent)])
    }

    /// The backstop walk: visits up to `budget` directories from the
    /// walk's queue, appending their children.
    fn walk(&self, queue: &mut Queue<'_>, budget: usize, run: &mut Run) -> Result<()> {
        let mut visited = 0;
        let mut restarted = false;
        while visited < budget {
            let batch = queue.pop(budget - visited)?;
            if batch.is_empty() {
                // A pass that ends starts again at the next slice (or
                // at once, if it ended with the last one).
                if restarted || visited > 0 {
                    break;
                }
                restarted = true;
                queue.restart()?;
                continue;
            }
            for (topic, alone) in batch {
                visited += 1;
                run.report.visited += 1;
                // A topic that fails (permissions, a damaged log) is passed
                // by, not retried by every slice: the walk goes on.
                match self.visit(&topic, run) {
                    Ok(children) if !alone => queue.push(&children)?,
                    Ok(_) => {}
                    Err(e) => run.fail(e),
                }
            }
        }
        Ok(())
    }

    /// Visits one topic directory (the walk, `kn gc`): deletes the
    /// leftovers of interrupted removals in it, deletes its routes into
    /// nothing, removes it if it is a journal stale longer than its grace
    /// or an empty topic untouched longer than its grace, and returns its
    /// children.
    fn visit(&self, topic: &Topic, run: &mut Run) -> Result<Vec<Topic>> {
        let dir = self.dir(topic);
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if matches!(e.kind(), IoKind::NotFound | IoKind::NotADirectory) => return Ok(Vec::new()),
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
                run.report.bytes_reclaimed += self.delete_leftover(&entry.path());
                continue;
            }
            if name.starts_with('.') || name == ROUTES_SEGMENT || name == SUBTOPICS_SEGMENT || name == PRESENCE_SEGMENT {
                continue;
            }
            if let Ok(child) = topic.child(name) {
                children.push(child);
            }
        }
        children.sort();
        if !topic.is_journal() {
            run.report.routes_removed += self.drop_routes_into_nothing(topic, run.grace.journal)?;
        }
        if !children.is_empty() || topic.is_root() || topic.is_reserved() {
            return Ok(children);
        }
        if topic.is_journal() {
            self.remove_journal(topic, run.grace.journal, run)?;
        } else if quiet(&self.dir(topic), run.grace.topic) && self.is_empty_topic(topic)? {
            // Looked at before taking its locks: the walk visits every
            // topic, most of them in use. Whether one is quiet is a few
            // `stat`s; whether it is empty reads its newest segment, which
            // on a busy topic is megabytes, every time the walk comes by.
            self.prune_topic(topic, run.grace.topic, run)?;
        }
        Ok(children)
    }

    /// Removes `journal` if it is stale longer than `grace` (FORMAT.md,
    /// "Removal"): under its lock, so that no tunnel revives it meanwhile,
    /// the routes listed in its `.sources` are noted as owed (deleted at
    /// their sources at the end of the run, one append per source), its
    /// parent is queued, its announcement is withdrawn, and its directory
    /// is set aside and deleted. True when it was removed.
    fn remove_journal(&self, journal: &Topic, grace: Duration, run: &mut Run) -> Result<bool> {
        let dir = self.dir(journal);
        if !self.removable_journal(&dir, grace) {
            return Ok(false);
        }
        let Some(lock) = lock_topic(&dir, &self.config)? else { return Ok(false) };
        // Again under the lock: a tunnel refreshes the heartbeat under it.
        if !self.removable_journal(&dir, grace) || has_child_dirs(&dir) {
            return Ok(false);
        }
        // Held to the end: a tunnel that comes meanwhile waits, then
        // finds the journal removed (readers.rs).
        let Readers::None(_readers) = self.readers_of(&dir)? else { return Ok(false) };
        let removed_at = now_secs();
        let owed: Vec<Owed> = read_sources(&dir).into_iter().map(|source| Owed { removed_at, source, journal: journal.clone() }).collect();
        // Noted before the removal: a slice that dies after it leaves
        // them to the next one.
        index::append_owed(&self.config, &owed)?;
        run.owed.extend(owed);
        self.queue_parent(journal, run)?;
        self.drop_announcement(journal)?;
        self.record_last_seq(&dir)?;
        run.report.bytes_reclaimed += self.set_aside(&dir, lock, &[])?;
        run.report.journals_removed += 1;
        self.forget_kept(journal);
        Ok(true)
    }

    /// Removes `topic` if it is empty (no current event, no active route,
    /// no subtopic, no child directory) and nothing in it changed for
    /// `grace`: under its lock and those of its `kn_routes` and
    /// `kn_subtopics`, its parent is queued, its announcement is withdrawn
    /// and its directory set aside and deleted. True when it was removed.
    fn prune_topic(&self, topic: &Topic, grace: Duration, run: &mut Run) -> Result<bool> {
        let dir = self.dir(topic);
        // Whether it is empty is read once, under the locks: a topic
        // quiet that long is rarely posted to, and the look at its events
        // and announcements is most of what a prune costs.
        if !quiet(&dir, grace) {
            return Ok(false);
        }
        let Some(lock) = lock_topic(&dir, &self.config)? else { return Ok(false) };
        let mut inner = Vec::new();
        for reserved in [ROUTES_SEGMENT, SUBTOPICS_SEGMENT, PRESENCE_SEGMENT] {
            if let Some(l) = lock_topic(&dir.join(reserved), &self.config)? {
                inner.push((reserved, l));
            }
        }
        // Again under the locks: posts, route changes and new child
        // directories all take one of them.
        if has_child_dirs(&dir) || !quiet(&dir, grace) || !self.is_empty_topic(topic)? {
            return Ok(false);
        }
        // A tunnel on the topic, its `kn_routes`, `kn_subtopics` or
        // `kn_presence` keeps it; none: held to the end (readers.rs).
        let mut unread = Vec::new();
        for d in std::iter::once(dir.clone()).chain(inner.iter().map(|(name, _)| dir.join(name))) {
            match self.readers_of(&d)? {
                Readers::None(held) => unread.push(held),
                Readers::Live => return Ok(false),
            }
        }
        self.queue_parent(topic, run)?;
        self.drop_announcement(topic)?;
        self.record_last_seq(&dir)?;
        run.report.bytes_reclaimed += self.set_aside(&dir, lock, &inner)?;
        run.report.topics_pruned += 1;
        for t in [topic.clone(), topic.routes(), topic.subtopics(), topic.presence()] {
            self.forget_kept(&t);
        }
        Ok(true)
    }

}
