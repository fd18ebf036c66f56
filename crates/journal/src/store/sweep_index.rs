//! The sweep's files in the store root (FORMAT.md, "Removal"): the due
//! queues that tell a slice which journals and topics to look at, so that
//! it never walks the tree to find them (`.sweep-journals`, appended by
//! whoever creates a journal; `.sweep-topics`, the parents of removed
//! topics), the route deletions a removal still owes (`.sweep-routes`),
//! and the queue of the backstop walk (`.sweep`, also the sweep's lock).

use std::fs::{self, File, OpenOptions};
use std::io::ErrorKind as IoKind;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::Config;
use crate::log;
use crate::topic::Topic;

/// The walk's queue and the sweep's lock, in the store root.
pub(super) const WALK_FILE: &str = ".sweep";
/// The due queue of journals, in the store root.
pub(super) const JOURNALS_FILE: &str = ".sweep-journals";
/// The due queue of topics that may have become empty, in the store root.
pub(super) const TOPICS_FILE: &str = ".sweep-topics";
/// The route deletions owed by removed journals, in the store root.
pub(super) const OWED_FILE: &str = ".sweep-routes";
/// The header of the queue files: the offset of the next entry, in
/// decimal, padded to 20 digits, and a newline.
const HEADER: u64 = 21;
/// A due queue whose consumed part is larger than this (and than its
/// unconsumed part) is rewritten without it.
const ROTATE_BYTES: u64 = 64 << 10;
/// How much of a queue file one read takes.
const CHUNK: usize = 64 << 10;

/// Appends `entries` (a topic and the time, in seconds since the epoch,
/// from which it is due) to the due queue in `path`, creating the file if
/// needed: one write at the file's end under an exclusive `flock` of the
/// file, so a rotation (under one too) never loses it: a writer that
/// finds the file it locked replaced appends to the new one. Not
/// `O_APPEND` under a shared lock: on CephFS two hosts' `O_APPEND`
/// writes overwrite each other (`shared::append`).
pub(super) fn enqueue(config: &Config, name: &str, entries: &[(u64, &Topic)]) -> Result<()> {
    if entries.is_empty() {
        return Ok(());
    }
    let path = &config.root.join(name);
    // A newline first: a line cut by a writer killed mid-write ends there
    // (skipped, or looked at for nothing) instead of swallowing this one.
    let text: String = std::iter::once("\n".to_string()).chain(entries.iter().map(|(due, topic)| format!("{due} {topic}\n"))).collect();
    for _ in 0..16 {
        let file = match OpenOptions::new().read(true).write(true).open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == IoKind::NotFound => {
                create_queue(path)?;
                continue;
            }
            Err(e) => return Err(Error::io("cannot open", path, e)),
        };
        crate::shared::lock(&file, crate::shared::LockKind::Exclusive, config).map_err(|e| Error::io("cannot lock", path, e))?;
        if !is_current(&file, path) {
            continue;
        }
        return crate::shared::append(&file, text.as_bytes()).map_err(|e| Error::io("cannot write", path, e));
    }
    Err(Error::io("cannot append to", path, std::io::Error::other("replaced again and again")))
}

/// Creates an empty queue file at `path` (its header written before it
/// gets the name, so no writer ever appends to a file without one).
fn create_queue(path: &Path) -> Result<()> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let temp = temp_name(path, &format!("{}-{n}", std::process::id()));
    let written = log::open_shared(&temp, false).and_then(|f| {
        f.set_len(0)?;
        f.write_all_at(format!("{HEADER:020}\n").as_bytes(), 0)
    });
    let linked = written.and_then(|_| match fs::hard_link(&temp, path) {
        Err(e) if e.kind() == IoKind::AlreadyExists => Ok(()),
        other => other,
    });
    let _ = fs::remove_file(&temp);
    linked.map_err(|e| Error::io("cannot create", path, e))
}

fn temp_name(path: &Path, tag: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".new-{tag}"));
    path.with_file_name(name)
}

/// True when `file` is the file named `path` now (not one a rotation
/// replaced).
fn is_current(file: &File, path: &Path) -> bool {
    match (file.metadata(), fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
        _ => false,
    }
}

/// One entry of a due queue.
#[derive(Debug)]
pub(super) struct Due {
    /// When it is due, in seconds since the epoch.
    pub(super) due: u64,
    pub(super) topic: Topic,
}

/// A due queue, read by the sweep under its lock: a header with the
/// offset of the next entry, then entries `<due> <topic>\n` in the order
/// they were appended (roughly the order they fall due: each kind of
/// entry is due a fixed time after it is appended, see FORMAT.md). A
/// line cut by a crash is skipped.
pub(super) struct DueQueue<'c> {
    config: &'c Config,
    path: PathBuf,
    file: Option<File>,
    offset: u64,
    saved: u64,
}

impl<'c> DueQueue<'c> {
    pub(super) fn open(path: PathBuf, config: &'c Config) -> Result<DueQueue<'c>> {
        let file = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(f) => Some(f),
            Err(e) if e.kind() == IoKind::NotFound => None,
            Err(e) => return Err(Error::io("cannot open", &path, e)),
        };
        let offset = file.as_ref().map_or(HEADER, |f| read_header(f).unwrap_or(HEADER));
        Ok(DueQueue { config, path, file, offset, saved: offset })
    }

    /// Up to `n` entries due at `now` (seconds), from the offset on; stops
    /// at the first entry not due yet. Entries appended since (by anyone)
    /// are seen by the next call.
    pub(super) fn pop(&mut self, now: u64, n: usize) -> Result<Vec<Due>> {
        let mut out = Vec::new();
        if self.file.is_none() {
            match OpenOptions::new().read(true).write(true).open(&self.path) {
                Ok(f) => self.file = Some(f),
                Err(e) if e.kind() == IoKind::NotFound => return Ok(out),
                Err(e) => return Err(Error::io("cannot open", &self.path, e)),
            }
        }
        let Some(file) = &self.file else { return Ok(out) };
        while out.len() < n {
            let mut buf = vec![0u8; CHUNK];
            let read = file.read_at(&mut buf, self.offset).map_err(|e| Error::io("cannot read", &self.path, e))?;
            buf.truncate(read);
            let mut used = 0;
            let mut stop = false;
            for line in buf.split_inclusive(|&b| b == b'\n') {
                if out.len() >= n || !line.ends_with(b"\n") {
                    stop = out.len() >= n;
                    break;
                }
                match parse_line(&line[..line.len() - 1]) {
                    Some(entry) if entry.due > now => {
                        stop = true;
                        break;
                    }
                    Some(entry) => out.push(entry),
                    None => {}
                }
                used += line.len();
            }
            if used == 0 && read == CHUNK && !stop {
                // A line longer than a chunk names no topic: skip it.
                used = read;
            }
            self.offset += used as u64;
            if stop || used == 0 {
                break;
            }
        }
        Ok(out)
    }

    /// True when an entry is due at `now` (seconds): what [`DueQueue::pop`]
    /// would take next, left in the queue.
    pub(super) fn has_due(&mut self, now: u64) -> Result<bool> {
        let offset = self.offset;
        let next = self.pop(now, 1);
        self.offset = offset;
        Ok(!next?.is_empty())
    }

    /// Records what was consumed (the header), and rewrites the file
    /// without its consumed part once that is large.
    pub(super) fn save(&mut self) -> Result<()> {
        let Some(file) = &self.file else { return Ok(()) };
        if self.offset != self.saved {
            file.write_all_at(format!("{:020}\n", self.offset).as_bytes(), 0).map_err(|e| Error::io("cannot write", &self.path, e))?;
            self.saved = self.offset;
        }
        let len = file.metadata().map_err(|e| Error::io("cannot stat", &self.path, e))?.len();
        if self.offset > ROTATE_BYTES && self.offset > len - self.offset.min(len) {
            self.rotate()?;
        }
        Ok(())
    }

    /// Replaces the file by one holding only its unconsumed entries, under
    /// an exclusive `flock` of the old one (writers append under a shared
    /// one and check, once they hold it, that their file is still the
    /// current one): whatever was appended before is copied, whatever
    /// after goes to the new file. A crash before the rename leaves the
    /// old file whole (and a temporary, replaced by the next rotation).
    fn rotate(&mut self) -> Result<()> {
        let Some(file) = self.file.take() else { return Ok(()) };
        crate::shared::lock(&file, crate::shared::LockKind::Exclusive, self.config).map_err(|e| Error::io("cannot lock", &self.path, e))?;
        let len = file.metadata().map_err(|e| Error::io("cannot stat", &self.path, e))?.len();
        let mut tail = vec![0u8; (len - self.offset.min(len)) as usize];
        file.read_exact_at(&mut tail, self.offset).map_err(|e| Error::io("cannot read", &self.path, e))?;
        let temp = temp_name(&self.path, "rotate");
        let written = log::open_shared(&temp, false).and_then(|f| {
            f.set_len(0)?;
            f.write_all_at(format!("{HEADER:020}\n").as_bytes(), 0)?;
            f.write_all_at(&tail, HEADER)
        });
        written.and_then(|_| fs::rename(&temp, &self.path)).map_err(|e| {
            let _ = fs::remove_file(&temp);
            Error::io("cannot rewrite", &self.path, e)
        })?;
        drop(file);
        self.offset = HEADER;
        self.saved = HEADER;
        Ok(())
    }
}

fn read_header(file: &File) -> Option<u64> {
    let len = file.metadata().ok()?.len();
    let mut header = [0u8; HEADER as usize];
    file.read_exact_at(&mut header, 0).ok()?;
    std::str::from_utf8(&header[..20]).ok()?.trim().parse::<u64>().ok().filter(|&o| (HEADER..=len).contains(&o))
}

fn parse_line(line: &[u8]) -> Option<Due> {
    let text = std::str::from_utf8(line).ok()?;
    let (due, topic) = text.split_once(' ')?;
    Some(Due { due: due.parse().ok()?, topic: Topic::parse(topic).ok()? })
}

/// One route deletion owed: the routes of `source` into `journal`,
/// removed at `removed_at` (seconds since the epoch).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Owed {
    pub(super) removed_at: u64,
    pub(super) source: Topic,
    pub(super) journal: Topic,
}

/// The route deletions owed in `.sweep-routes` (a crashed slice's; lines
/// that do not parse are skipped, and so is a tail with no newline, a
/// line cut by a crash, which may parse as a route into another topic).
pub(super) fn read_owed(root: &Path) -> Vec<Owed> {
    let text = fs::read_to_string(root.join(OWED_FILE)).unwrap_or_default();
    let whole = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
    whole
        .lines()
        .filter_map(|line| {
            let mut words = line.split(' ');
            let removed_at = words.next()?.parse().ok()?;
            let source = Topic::parse(words.next()?).ok()?;
            let journal = Topic::parse(words.next()?).ok()?;
            Some(Owed { removed_at, source, journal })
        })
        .collect()
}

/// Appends to `.sweep-routes` (under the sweep's lock and the file's).
pub(super) fn append_owed(config: &Config, owed: &[Owed]) -> Result<()> {
    if owed.is_empty() {
        return Ok(());
    }
    let path = config.root.join(OWED_FILE);
    let text: String = owed.iter().map(|o| format!("{} {} {}\n", o.removed_at, o.source, o.journal)).collect();
    // At the end as the size tells it, not O_APPEND (`shared::append`),
    // under the file's lock: the sweep's threads remove journals at once
    // (`sweep_threads`), and the sweep's own lock keeps out only other
    // processes.
    let file = log::open_shared(&path, false).map_err(|e| Error::io("cannot open", &path, e))?;
    crate::shared::lock(&file, crate::shared::LockKind::Exclusive, config).map_err(|e| Error::io("cannot lock", &path, e))?;
    crate::shared::append(&file, text.as_bytes()).map_err(|e| Error::io("cannot write", &path, e))
}

/// Replaces `.sweep-routes` by `owed` (under the sweep's lock): what is
/// still owed once a slice settled the rest.
pub(super) fn write_owed(root: &Path, owed: &[Owed]) -> Result<()> {
    let path = root.join(OWED_FILE);
    if owed.is_empty() {
        return match fs::metadata(&path) {
            Ok(m) if m.len() > 0 => {
                let f = log::open_shared(&path, false).map_err(|e| Error::io("cannot open", &path, e))?;
                f.set_len(0).map_err(|e| Error::io("cannot truncate", &path, e))
            }
            _ => Ok(()),
        };
    }
    let temp = temp_name(&path, "settle");
    let text: String = owed.iter().map(|o| format!("{} {} {}\n", o.removed_at, o.source, o.journal)).collect();
    log::write_replacing(&temp, &path, text.as_bytes()).map_err(|e| Error::io("cannot write", &path, e))
}

/// The backstop walk's queue in `.sweep` (held under its lock): a header
/// with the offset of the next name, then topic names, one per line (`!`
/// before a name, written by older versions: visit that topic alone, not
/// its children). Names are read from the offset and appended at the end;
/// when the offset reaches the end, the file restarts with the root. A
/// damaged file only costs a restart (lines that are not topic names are
/// skipped).
pub(super) struct Queue<'f> {
    file: &'f File,
    path: &'f Path,
    offset: u64,
    len: u64,
}

impl<'f> Queue<'f> {
    pub(super) fn open(file: &'f File, path: &'f Path) -> Result<Queue<'f>> {
        let len = file.metadata().map_err(|e| Error::io("cannot stat", path, e))?.len();
        let offset = read_header(file);
        let mut queue = Queue { file, path, offset: offset.unwrap_or(len), len };
        if offset.is_none() {
            queue.restart()?;
        }
        Ok(queue)
    }

    /// Up to `n` names from the offset (fewer at the end of the queue),
    /// each with whether it is to be visited alone.
    pub(super) fn pop(&mut self, n: usize) -> Result<Vec<(Topic, bool)>> {
        let want = (self.len - self.offset).min(CHUNK as u64) as usize;
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

    pub(super) fn push(&mut self, topics: &[Topic]) -> Result<()> {
        if topics.is_empty() {
            return Ok(());
        }
        let text: String = topics.iter().map(|t| format!("{t}\n")).collect();
        self.file.write_all_at(text.as_bytes(), self.len).map_err(|e| Error::io("cannot write", self.path, e))?;
        self.len += text.len() as u64;
        Ok(())
    }

    /// Empties the queue and puts the root in it.
    pub(super) fn restart(&mut self) -> Result<()> {
        self.file.set_len(HEADER).map_err(|e| Error::io("cannot truncate", self.path, e))?;
        self.len = HEADER;
        self.offset = HEADER;
        self.push(&[Topic::root()])
    }

    /// Writes the offset (which also marks the time of this slice).
    pub(super) fn save(&self) -> Result<()> {
        let header = format!("{:020}\n", self.offset);
        self.file.write_all_at(header.as_bytes(), 0).map_err(|e| Error::io("cannot write", self.path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    fn topic(n: usize) -> Topic {
        Topic::parse(&format!("/who/w{}/s/{n}/kn_journal", n % 4)).unwrap()
    }

    /// The sweep's threads note the routes owed of the journals they
    /// remove at once (`sweep_threads`): every line each appends is kept.
    /// At the size read without a lock, two appends land at the same end
    /// and one overwrites the other (a route lost for good once its
    /// journal is gone).
    #[test]
    fn owed_routes_appended_by_threads_at_once_are_all_kept() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::new(dir.path());
        let (threads, each) = (4, 500);
        let start = std::sync::Barrier::new(threads);
        std::thread::scope(|scope| {
            for t in 0..threads {
                let (config, start) = (&config, &start);
                scope.spawn(move || {
                    start.wait();
                    for n in 0..each {
                        let owed = Owed { removed_at: 7, source: Topic::parse(&format!("/what/t{t}")).unwrap(), journal: topic(n) };
                        append_owed(config, &[owed]).unwrap();
                    }
                });
            }
        });
        assert_eq!(read_owed(dir.path()).len(), threads * each);
    }

    /// Between the size an append of owed routes read and its write, no
    /// other writer (another sweep thread, which opens the file itself)
    /// can take the file's lock: the window where two appends land at the
    /// same end is closed.
    #[test]
    fn no_other_writer_can_lock_owed_routes_between_the_size_and_the_write() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::new(dir.path());
        let owed = |n| Owed { removed_at: 7, source: Topic::parse("/what/chat").unwrap(), journal: topic(n) };
        append_owed(&config, &[owed(1)]).unwrap();
        let path = dir.path().join(OWED_FILE);
        let tried = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let seen = tried.clone();
        crate::shared::BETWEEN_SIZE_AND_WRITE.with(|hook| {
            *hook.borrow_mut() = Some(Box::new(move || {
                let other = OpenOptions::new().read(true).write(true).open(&path).unwrap();
                seen.borrow_mut().push(other.try_lock().is_ok());
            }))
        });
        let appended = append_owed(&config, &[owed(2)]);
        crate::shared::BETWEEN_SIZE_AND_WRITE.with(|hook| hook.borrow_mut().take());
        appended.unwrap();
        assert_eq!(*tried.borrow(), [false], "another writer took the lock");
        assert_eq!(read_owed(dir.path()).len(), 2);
    }

    /// A line cut by a crash at the end of `.sweep-routes` is written
    /// over by the next append, not glued to its first line.
    #[test]
    fn an_owed_line_cut_short_is_written_over() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::new(dir.path());
        let owed = |n| Owed { removed_at: 7, source: Topic::parse("/what/chat").unwrap(), journal: topic(n) };
        append_owed(&config, &[owed(1)]).unwrap();
        let path = dir.path().join(OWED_FILE);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        // Cut inside the journal's name, it still reads as a route owed
        // into another topic (whose routes would be deleted): not read.
        f.write_all(b"7 /what/chat /who/w2").unwrap();
        assert_eq!(read_owed(dir.path()).len(), 1);
        append_owed(&config, &[owed(2)]).unwrap();
        let journals: Vec<Topic> = read_owed(dir.path()).into_iter().map(|o| o.journal).collect();
        assert_eq!(journals, [topic(1), topic(2)]);
    }

    /// Writers appending while the sweep takes entries and rotates the
    /// file lose nothing: every entry appended is taken exactly once (no
    /// entry is copied twice by a rotation, none is left in a replaced
    /// file).
    #[test]
    fn appends_racing_with_rotations_are_each_taken_once() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::new(dir.path());
        let path = dir.path().join(JOURNALS_FILE);
        let per_writer = 3000;
        let writers: Vec<_> = (0..4)
            .map(|w| {
                let config = config.clone();
                std::thread::spawn(move || {
                    for i in 0..per_writer {
                        let n = w * per_writer + i;
                        enqueue(&config, JOURNALS_FILE, &[(0, &topic(n))]).unwrap();
                    }
                })
            })
            .collect();
        let mut taken = std::collections::HashMap::new();
        let mut rotations = 0;
        loop {
            let done = writers.iter().all(|w| w.is_finished());
            let mut queue = DueQueue::open(path.clone(), &config).unwrap();
            for due in queue.pop(1, 500).unwrap() {
                *taken.entry(due.topic).or_insert(0) += 1;
            }
            let before = fs::metadata(&path).map(|m| m.ino()).ok();
            queue.save().unwrap();
            rotations += usize::from(before != fs::metadata(&path).map(|m| m.ino()).ok());
            if done && queue.pop(1, 1).unwrap().is_empty() {
                break;
            }
        }
        assert!(rotations > 0, "the file was never rotated");
        assert_eq!(taken.len(), 4 * per_writer);
        assert!(taken.values().all(|&n| n == 1), "an entry taken twice");
    }

    /// A rotation that died before its rename leaves the file whole (its
    /// temporary is replaced by the next one), and a header written by a
    /// taker that died is all that decides where the next one starts.
    #[test]
    fn a_rotation_or_a_take_cut_short_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::new(dir.path());
        let path = dir.path().join(JOURNALS_FILE);
        for n in 0..10 {
            enqueue(&config, JOURNALS_FILE, &[(5, &topic(n))]).unwrap();
        }
        std::fs::write(temp_name(&path, "rotate"), b"half a rotation").unwrap();
        // Entries not due yet are left; a take not saved is taken again.
        let mut queue = DueQueue::open(path.clone(), &config).unwrap();
        assert!(queue.pop(4, 100).unwrap().is_empty());
        assert_eq!(queue.pop(5, 3).unwrap().len(), 3);
        drop(queue);
        let mut queue = DueQueue::open(path.clone(), &config).unwrap();
        assert_eq!(queue.pop(5, 3).unwrap().len(), 3);
        queue.save().unwrap();
        // A line cut short (a writer killed mid-write) is skipped, and
        // the next writer's entry is whole after it.
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"12").unwrap();
        enqueue(&config, JOURNALS_FILE, &[(9, &topic(99))]).unwrap();
        let mut queue = DueQueue::open(path.clone(), &config).unwrap();
        let rest: Vec<Topic> = queue.pop(9, 100).unwrap().into_iter().map(|d| d.topic).collect();
        assert_eq!(rest.len(), 8, "{rest:?}");
        assert_eq!(rest[7], topic(99));
    }
}
