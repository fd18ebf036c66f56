//! The removal protocol's parts (FORMAT.md, "Removal"), below the sweep
//! that decides what to remove (`sweep.rs`): when a journal is stale and a
//! topic empty, setting a directory aside under its lock and deleting it,
//! forgetting what this process kept of it, and the writer's side (a
//! writer that finds its topic removed opens it afresh, a journal is
//! revived, a route's source indexed for the sweep).

use std::fs::{self, File};
use std::io::ErrorKind as IoKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Error, ErrorKind, Result};
use crate::event::*;
use crate::ids::now;
use crate::log::{self, Writer};
use crate::topic::{Topic, PRESENCE_SEGMENT, ROUTES_SEGMENT, SUBTOPICS_SEGMENT};

use super::read::Selection;
use super::report::PostReport;
use super::sweep_routes::{read_sources, SOURCES_FILE};
use super::{HEARTBEAT_FILE, Store};

/// The name prefix of a topic directory set aside for deletion.
pub const REMOVING_PREFIX: &str = ".removing-";

/// How long a directory set aside must have been left unchanged before a
/// sweep takes it for the leftover of an interrupted removal.
pub(super) const LEFTOVER_AGE: Duration = Duration::from_secs(60);

/// How many kept topics one sweep slice of this process checks for files
/// removed by another process (see `Store::drop_dead_kept`): all of 1,024
/// in four slices.
pub(super) const DEAD_CHECKS_PER_SLICE: usize = 256;

impl Store {
    /// When the journal in `dir` went stale: `heartbeat_stale` after its
    /// heartbeat; without one, when its directory last changed, which is
    /// when the heartbeat was deleted. `None` when there is no journal.
    pub(super) fn stale_since(&self, dir: &Path) -> Option<SystemTime> {
        match fs::metadata(dir.join(HEARTBEAT_FILE)).and_then(|m| m.modified()) {
            Ok(beat) => Some(beat + self.config.heartbeat_stale),
            Err(_) => fs::metadata(dir).and_then(|m| m.modified()).ok(),
        }
    }

    /// True when the journal in `dir` went stale more than `grace` ago.
    pub(super) fn removable_journal(&self, dir: &Path, grace: Duration) -> bool {
        self.stale_since(dir).is_some_and(|stale| SystemTime::now() >= stale + grace)
    }

    pub(super) fn is_empty_topic(&self, topic: &Topic) -> Result<bool> {
        let one = |t: &Topic| -> Result<bool> {
            if !self.dir(t).is_dir() {
                return Ok(false);
            }
            Ok(!self.select_at_most(t, &Selection::all(), false, 1, None)?.events.is_empty())
        };
        Ok(!one(topic)? && self.routes(topic)?.is_empty() && !one(&topic.subtopics())?)
    }

    /// Withdraws the announcement(s) of `topic` in its parent's
    /// `kn_subtopics`: each is replaced, under its id, by a copy that has
    /// already expired (so it is neither returned nor forwarded, and
    /// compaction reclaims it after `expired_grace`).
    pub(super) fn drop_announcement(&self, topic: &Topic) -> Result<()> {
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
    pub(super) fn set_aside(&self, dir: &Path, lock: File, inner: &[(&str, File)]) -> Result<u64> {
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
    pub(super) fn delete_leftover(&self, path: &Path) -> u64 {
        let old = fs::symlink_metadata(path).and_then(|m| m.modified()).is_ok_and(|t| age(t) > LEFTOVER_AGE);
        if !old {
            return 0;
        }
        log::remove_topic_dir(path, &self.config.root).unwrap_or(0)
    }

    /// Drops the kept files of topics removed (or rewritten) by any
    /// process: a long-lived process (`serve`) would otherwise keep the
    /// descriptors of deleted files, and their space, and fill its cache
    /// with them. Two `fstat`s per kept set, for at most
    /// [`DEAD_CHECKS_PER_SLICE`] topics per slice, taking up where the last
    /// slice left off: a server keeping thousands of journals open does not
    /// stat them all every second (holding the cache, which every post
    /// takes, meanwhile). A kept set that is used is checked by its use
    /// anyway (`Writer::reuse` finds a removed segment unlinked).
    pub(super) fn drop_dead_kept(&self) {
        let Ok(mut cache) = self.kept.lock() else { return };
        let cache = &mut *cache;
        if cache.dead_check_at >= cache.topics.len() {
            cache.dead_check_at = 0;
        }
        let mut dead = Vec::new();
        for (topic, sets) in cache.topics.iter().skip(cache.dead_check_at).take(DEAD_CHECKS_PER_SLICE) {
            if sets.iter().any(|k| k.files.as_ref().is_some_and(|f| f.is_dead())) {
                dead.push(topic.clone());
            }
        }
        cache.dead_check_at += DEAD_CHECKS_PER_SLICE;
        for topic in dead {
            let Some(sets) = cache.topics.get_mut(&topic) else { continue };
            let before = sets.len();
            sets.retain(|k| !k.files.as_ref().is_some_and(|f| f.is_dead()));
            cache.count -= before - sets.len();
            if sets.is_empty() {
                cache.topics.remove(&topic);
            }
        }
    }

    /// Drops what this process keeps of a removed topic (open files of
    /// deleted files would keep their space).
    pub(super) fn forget_kept(&self, topic: &Topic) {
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
        // At the end as the size tells it, not O_APPEND (`shared::append`).
        let file = log::open_shared(&path, false).map_err(|e| Error::io("cannot open", &path, e))?;
        crate::shared::append(&file, format!("{source}\n").as_bytes()).map_err(|e| Error::io("cannot write", &path, e))
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
    ///
    /// The lock is taken by opening the journal's writer (creating its log,
    /// `.head` and first segment, if it has none yet), and the writer's
    /// files and the heartbeat are kept for the next append, as a post
    /// keeps them: the first event a route forwards to a just-opened
    /// tunnel (or to one reconnected after a restart) then opens and
    /// creates nothing, instead of every journal's first copy paying for
    /// it while the source's post waits (issue 31, "cold subscribers").
    pub(super) fn revive(&self, journal: &Topic, report: &mut PostReport) -> Result<()> {
        for _ in 0..5 {
            let kept = self.take_kept(journal);
            match self.writer(journal, kept, &mut || Ok(())) {
                Ok((writer, mut kept)) => {
                    let beat = self.beat(journal);
                    // Within `Config::open_topics`, pushing nothing out:
                    // a journal only read yet does not take the place of
                    // one posted to. Past it a server holding many
                    // tunnels keeps their journals' files once they are
                    // posted to, as before.
                    if let (Ok(file), true) = (&beat, self.kept_has_room()) {
                        // The file itself: one kept before may be unlinked.
                        kept.1.heartbeat = file.try_clone().ok();
                        self.keep(writer, kept);
                    } else {
                        // Closed (and unlocked): the tunnels come first.
                        drop(writer);
                    }
                    return beat.map(drop);
                }
                // Removed while waiting for its lock, or before.
                Err(err) if err.kind() == ErrorKind::Expired => {}
                Err(err) => return Err(err),
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
pub(super) fn lock_topic(dir: &Path, config: &crate::Config) -> Result<Option<File>> {
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

/// True when `dir` has a child topic directory (reserved ones aside).
pub(super) fn has_child_dirs(dir: &Path) -> bool {
    let Ok(entries) = fs::read_dir(dir) else { return false };
    entries.flatten().any(|e| {
        let name = e.file_name();
        let name = name.to_string_lossy();
        e.file_type().is_ok_and(|k| k.is_dir()) && !name.starts_with('.') && name != ROUTES_SEGMENT && name != SUBTOPICS_SEGMENT && name != PRESENCE_SEGMENT
    })
}

/// True when nothing was written to the topic in `dir` (its directory,
/// its head, those of its `kn_routes` and `kn_subtopics`) for `grace`.
pub(super) fn quiet(dir: &Path, grace: Duration) -> bool {
    last_change(dir).is_none_or(|t| age(t) >= grace)
}

/// When the topic in `dir` was last written to: the newest modification
/// time of its directory, its head, and those of its `kn_routes` and
/// `kn_subtopics`.
pub(super) fn last_change(dir: &Path) -> Option<SystemTime> {
    let paths = [
        dir.to_path_buf(),
        dir.join(log::HEAD_FILE),
        dir.join(ROUTES_SEGMENT),
        dir.join(ROUTES_SEGMENT).join(log::HEAD_FILE),
        dir.join(SUBTOPICS_SEGMENT),
        dir.join(SUBTOPICS_SEGMENT).join(log::HEAD_FILE),
    ];
    paths.iter().filter_map(|p| fs::metadata(p).and_then(|m| m.modified()).ok()).max()
}

pub(super) fn age(t: SystemTime) -> Duration {
    SystemTime::now().duration_since(t).unwrap_or(Duration::ZERO)
}

/// A fresh hidden name next to `dir` for setting it aside (never a topic:
/// it starts with `.`; short enough whatever the topic's name).
pub(super) fn aside_name(dir: &Path) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let parent = dir.parent().unwrap_or(dir);
    parent.join(format!("{REMOVING_PREFIX}{}-{n}-{nanos}", std::process::id()))
}

/// Now, in whole seconds since the epoch.
pub(super) fn now_secs() -> u64 {
    secs_floor(SystemTime::now())
}

/// `t` in whole seconds since the epoch, rounded down (a queue entry due
/// then is looked at up to a second early: the look decides).
pub(super) fn secs_floor(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_secs()
}

/// `t` in whole seconds since the epoch, rounded up.
pub(super) fn secs_ceil(t: SystemTime) -> u64 {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use crate::{Config, Event, Selection, Store, Topic};

    fn store(dir: &std::path::Path, open_topics: usize) -> Store {
        let mut config = Config::new(dir);
        config.open_topics = open_topics;
        Store::open_with(config).unwrap()
    }

    fn kept(store: &Store) -> (usize, Vec<Topic>) {
        let cache = store.kept.lock().unwrap();
        let mut topics: Vec<Topic> = cache.topics.keys().cloned().collect();
        topics.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        (cache.count, topics)
    }

    /// `Config::open_topics` bounds what a tunnel's open keeps: with room
    /// its journal's files are kept; with the cache full (the boundary)
    /// nothing is, and no other topic's set is pushed out; with 0 none.
    #[test]
    fn a_tunnel_keeps_its_journals_files_only_within_open_topics_and_pushes_nothing_out() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Topic::parse("/x/kn_journal").unwrap();
        // Made by another process: opening it creates nothing here.
        drop(Store::open(dir.path()).unwrap().tunnel(&journal, &Selection::none()).unwrap());

        let roomy = store(dir.path(), 100);
        let tunnel = roomy.tunnel(&journal, &Selection::none()).unwrap();
        assert!(kept(&roomy).1.contains(&journal), "kept with room: {:?}", kept(&roomy));
        drop(tunnel);

        let full = store(dir.path(), 2);
        for name in ["/what/a", "/what/b", "/what/c"] {
            full.notify(&Topic::parse(name).unwrap(), Event::from_pairs([("kn_payload", "p")])).unwrap();
        }
        let before = kept(&full);
        assert_eq!(before.0, 2, "the cache is full: {before:?}");
        let _tunnel = full.tunnel(&journal, &Selection::none()).unwrap();
        assert_eq!(kept(&full), before, "a tunnel's open pushed a kept set out");

        let none = store(dir.path(), 0);
        let _tunnel = none.tunnel(&journal, &Selection::none()).unwrap();
        assert_eq!(kept(&none).0, 0);
    }
}
