//! Cross-host wake-ups in shared mode: the store-wide change log
//! `<root>/.changes`. Every writer in shared mode appends the name of the
//! topic it appended to, under the file's lock; one poller thread per
//! process reads it from where it left off every `Config::changes_poll`
//! and wakes that process's waiting readers of the topics named. The cost
//! is one small read per process and poll, whatever the number of
//! tunnels and topics (FORMAT.md, "Shared mode").
//!
//! The file: a 16-byte header (`KNCHG\0\0\x01`, then the generation as a
//! u64 LE), then entries `\n<writer> <topic>\n`. A writer that finds the
//! file larger than `Config::changes_bytes` empties it (new generation
//! first, then truncation): a poller seeing a new generation, or a file
//! shorter than its offset, wakes every reader of its process once.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use crate::shared::drop_cached_pages;

#[path = "changes_wake.rs"]
mod wake;
use crate::topic::Topic;
use crate::watch::Hub;

/// The change log's file name, in the store's root.
pub const CHANGES_FILE: &str = ".changes";
const MAGIC: &[u8; 8] = b"KNCHG\x00\x00\x01";
const HEADER: u64 = 16;
/// Most bytes a poller reads at once.
const CHUNK: usize = 256 << 10;

/// This process's writer id in entries, so that its own poller skips
/// them (its own appends wake its readers through inotify).
fn writer_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| crate::ids::random_bytes::<8>().iter().map(|b| format!("{b:02x}")).collect())
}

/// The appending side, kept by a store: its open `.changes`, and the
/// entries its threads queued for it.
///
/// Appends are group-committed: a thread queues its entry, then takes the
/// writer's turn; whoever has the turn writes every queued entry with one
/// lock of the file and one `pwrite`, and a thread whose entry someone
/// else wrote meanwhile returns at once. On a volume each lock, size and
/// write of `.changes` is a round trip to the bricks, and the file is
/// store-wide: batching keeps it from serialising every post of a host.
#[derive(Default)]
pub(crate) struct ChangeLog {
    queue: Mutex<Queue>,
    /// The writer's turn, with the open file.
    file: Mutex<Option<Open>>,
    /// The other hosts to nudge after a write (`KN_WAKE_ADDR`).
    nudger: wake::Nudger,
}

#[derive(Default)]
struct Queue {
    entries: Vec<u8>,
    /// The number of entries ever queued, and of those written (or
    /// given up with a failed write: they are only hints).
    queued: u64,
    done: u64,
}

struct Open {
    file: File,
    /// The header was read valid through this descriptor: a valid
    /// header is only ever replaced by a valid one (a new generation),
    /// so while the file is at least a header long it need not be read
    /// again before an append.
    header_seen: bool,
}

impl ChangeLog {
    /// Appends an entry naming `topic` (which was just appended to) under
    /// the file's lock, emptying the file first when it is larger than
    /// `config.changes_bytes`. A failure only delays the wake-up of other
    /// hosts' readers to their poll interval: the post itself is stored.
    pub(crate) fn append(&self, config: &crate::Config, topic: &Topic) -> std::io::Result<()> {
        let ticket = {
            let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            queue.entries.extend_from_slice(format!("\n{} {}\n", writer_id(), topic.as_str()).as_bytes());
            queue.queued += 1;
            queue.queued
        };
        let mut slot = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let (entries, last) = {
            let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            if queue.done >= ticket {
                return Ok(()); // written by the thread that had the turn
            }
            (std::mem::take(&mut queue.entries), queue.queued)
        };
        let written = write_batch(&mut slot, config, &entries);
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).done = last;
        if written.is_err() {
            *slot = None;
        } else if config.wake_addr.is_some() {
            // Written: the hosts that announced themselves read it now.
            self.nudger.nudge(&config.root, config.wake_addr);
        }
        written
    }
}

/// Writes `entries` to `.changes` under its lock, opening it first if
/// need be.
fn write_batch(slot: &mut Option<Open>, config: &crate::Config, entries: &[u8]) -> std::io::Result<()> {
    if slot.is_none() {
        let file = crate::log::open_shared(&config.root.join(CHANGES_FILE), false)?;
        *slot = Some(Open { file, header_seen: false });
    }
    let Some(open) = slot.as_mut() else { return Ok(()) };
    crate::shared::lock(&open.file, crate::shared::LockKind::Exclusive, config)?;
    let written = append_entries(&open.file, entries, config.changes_bytes, false, &mut open.header_seen);
    crate::shared::unlock(&open.file, config);
    written
}

/// Appends `entries` (whole entries) to a change log whose writers are
/// excluded by the caller, first emptying it under a new generation when
/// it is larger than `max_bytes` or when `renew` asks. `header_seen`
/// says the header was read valid through `file` before (then it is not
/// read again unless the file is to be emptied), and is set once it is.
fn append_entries(file: &File, entries: &[u8], max_bytes: u64, renew: bool, header_seen: &mut bool) -> std::io::Result<()> {
    let size = linked_size(file)?;
    let emptying = size > max_bytes || renew;
    let mut header = [0u8; HEADER as usize];
    let valid = if size >= HEADER && *header_seen && !emptying {
        true
    } else {
        drop_cached_pages(file);
        size >= HEADER && file.read_exact_at(&mut header, 0).is_ok() && &header[..8] == MAGIC
    };
    let mut end = size;
    if !valid || emptying {
        // The new generation is written before the entries are cut: a
        // crash in between leaves old entries under a new generation,
        // which only wake readers needlessly.
        let old = if valid { u64::from_le_bytes(header[8..16].try_into().unwrap_or([0; 8])) } else { 0 };
        let generation = if valid { old.wrapping_add(1) } else { u64::from_le_bytes(crate::ids::random_bytes()) };
        header[..8].copy_from_slice(MAGIC);
        header[8..].copy_from_slice(&generation.to_le_bytes());
        file.write_all_at(&header, 0)?;
        file.set_len(HEADER)?;
        end = HEADER;
    }
    *header_seen = true;
    file.write_all_at(entries, end)
}

/// The size of `file`; an error once its name is gone (deleted by hand),
/// so that the caller opens the name again.
fn linked_size(file: &File) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let meta = file.metadata()?;
    if meta.nlink() == 0 {
        return Err(std::io::Error::new(std::io::ErrorKind::NotFound, "change log deleted"));
    }
    Ok(meta.len())
}

/// Where a poller is in the change log.
struct Position {
    generation: Option<u64>,
    offset: u64,
}

/// Reads the header and size of `.changes`: (generation, size).
fn header_of(file: &File) -> std::io::Result<(Option<u64>, u64)> {
    let size = linked_size(file)?;
    header_at(file, size)
}

/// Reads the header of `.changes`, whose size is `size`: (generation,
/// size).
fn header_at(file: &File, size: u64) -> std::io::Result<(Option<u64>, u64)> {
    drop_cached_pages(file);
    let mut header = [0u8; HEADER as usize];
    if size < HEADER || file.read_exact_at(&mut header, 0).is_err() || &header[..8] != MAGIC {
        return Ok((None, size));
    }
    Ok((Some(u64::from_le_bytes(header[8..16].try_into().unwrap_or([0; 8]))), size))
}

/// Where a host's processes share one reader of the volume's change log:
/// `<dir>/kn-changes-<hash of the store's path>.lock`, held by the
/// process that reads `.changes` for the whole host (the leader), and
/// `.relay`, a change log of the same format on a local file system
/// (`/dev/shm`) to which the leader copies the entries it reads; the
/// host's other processes read that instead of the volume.
fn relay_paths(root: &Path) -> (PathBuf, PathBuf) {
    let dir = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    let key = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    let hash = xxhash_rust::xxh3::xxh3_64(key.as_os_str().as_encoded_bytes());
    (dir.join(format!("kn-changes-{hash:016x}.lock")), dir.join(format!("kn-changes-{hash:016x}.relay")))
}

/// One process's view of the change logs.
struct Poller {
    root: PathBuf,
    /// `.changes` on the volume (read by the leader, or by a process that
    /// cannot use the relay).
    changes: Option<File>,
    at_changes: Position,
    /// The host's lock and relay files.
    lock: Option<File>,
    relay: Option<File>,
    at_relay: Position,
    leader: bool,
    max_bytes: u64,
    /// Where the leader listens for pushed wake-ups (`KN_WAKE_ADDR`),
    /// and its socket while it leads.
    wake_addr: Option<std::net::SocketAddr>,
    wake: Option<Arc<std::net::UdpSocket>>,
}

impl Poller {
    fn new(root: PathBuf, max_bytes: u64, wake_addr: Option<std::net::SocketAddr>) -> Poller {
        let mut poller = Poller {
            root,
            changes: None,
            at_changes: Position { generation: None, offset: HEADER },
            lock: None,
            relay: None,
            at_relay: Position { generation: None, offset: HEADER },
            leader: false,
            max_bytes,
            wake_addr,
            wake: None,
        };
        let (lock, relay) = relay_paths(&poller.root);
        poller.lock = crate::log::open_shared(&lock, false).ok();
        poller.relay = crate::log::open_shared(&relay, false).ok();
        // Start at the current ends: readers subscribed now re-read anyway.
        if let Some((generation, size)) = poller.relay.as_ref().and_then(|f| header_of(f).ok()) {
            poller.at_relay = Position { generation, offset: size.max(HEADER) };
        }
        poller.start_on_changes();
        poller
    }

    fn start_on_changes(&mut self) {
        if self.changes.is_none() {
            self.changes = crate::log::open_shared(&self.root.join(CHANGES_FILE), false).ok();
        }
        if let Some((generation, size)) = self.changes.as_ref().and_then(|f| header_of(f).ok()) {
            self.at_changes = Position { generation, offset: size.max(HEADER) };
        }
    }

    /// One tick: wakes `hub`'s readers of the topics named since the last.
    fn tick(&mut self, hub: &Hub) {
        if !self.leader && self.relay.is_some() {
            if let Some(lock) = &self.lock {
                if lock.try_lock().is_ok() {
                    // Entries between the last leader's last read and now
                    // are read by no one: a new relay generation makes
                    // every process of the host re-read once.
                    self.leader = true;
                    self.wake = self.wake_addr.and_then(|addr| wake::listen(&self.root, addr)).map(Arc::new);
                    self.start_on_changes();
                    let renewed = self.relay.as_ref().map(|r| append_entries(r, b"", self.max_bytes, true, &mut false));
                    if !matches!(renewed, Some(Ok(()))) {
                        self.relay = None;
                    }
                    hub.wake_all();
                }
            }
        }
        if self.leader || self.relay.is_none() || self.lock.is_none() {
            // Read the volume for the host (or for this process alone).
            if self.changes.is_none() {
                self.start_on_changes();
                hub.wake_all();
            }
            let Some(changes) = self.changes.as_ref() else { return };
            let mut entries = Vec::new();
            if poll(changes, &self.root, hub, &mut self.at_changes, &mut entries).is_err() {
                // Reopen next time (the volume may have been unreachable).
                self.changes = None;
                return;
            }
            if self.leader && !entries.is_empty() {
                let relayed = self.relay.as_ref().map(|r| append_entries(r, &entries, self.max_bytes, false, &mut false));
                if !matches!(relayed, Some(Ok(()))) {
                    // Without its relay the host's other processes would
                    // hear nothing: hand the lead over.
                    self.relay = None;
                    self.leader = false;
                    self.wake = None;
                    if let Some(lock) = &self.lock {
                        let _ = lock.unlock();
                    }
                }
            }
            return;
        }
        if let Some(relay) = self.relay.as_ref() {
            if poll(relay, &self.root, hub, &mut self.at_relay, &mut Vec::new()).is_err() {
                // Deleted or unreadable: open the name again, and re-read.
                self.relay = crate::log::open_shared(&relay_paths(&self.root).1, false).ok();
                self.at_relay = Position { generation: None, offset: HEADER };
                hub.wake_all();
            }
        }
    }
}

/// How much longer than `changes_poll` a process that reads the host's
/// relay sleeps between reads when nothing rings it: inotify on the relay
/// (a local file) wakes it at once; the timer only takes over the host's
/// lead when its leader has exited, and covers a missed notification.
const RELAY_FALLBACK: u32 = 10;

/// Starts this process's poller of `root`'s change log, which wakes the
/// readers `hub` knows for every topic named by another process, until
/// the hub is dropped. One process per host (the holder of the host's
/// lock) reads the volume's `.changes` every `every` and copies what it
/// reads to the host's relay; the others read the relay, a local file,
/// as soon as inotify says it changed (in the notifier's thread: one
/// thread wake-up less on the way to a tunnel).
pub(crate) fn spawn_poller(config: &crate::Config, hub: Weak<Hub>) {
    let (root, every) = (&config.root, config.changes_poll);
    let root = std::path::absolute(root).unwrap_or_else(|_| root.to_path_buf());
    let poller = Arc::new(Mutex::new(Poller::new(root.clone(), config.changes_bytes, config.wake_addr)));
    let rung = (hub.clone(), poller.clone());
    let watcher = watch_relay(&relay_paths(&root).1, move || {
        let Some(hub) = rung.0.upgrade() else { return };
        let mut poller = rung.1.lock().unwrap_or_else(|p| p.into_inner());
        if !poller.leader {
            poller.tick(&hub);
        }
    });
    let spawned = std::thread::Builder::new().name("kn-changes".into()).spawn(move || {
        let watcher = watcher;
        loop {
            // The first tick at once: it may take the host's lead.
            let (follows, wake) = {
                let Some(hub) = hub.upgrade() else { break };
                let mut poller = poller.lock().unwrap_or_else(|p| p.into_inner());
                poller.tick(&hub);
                let follows = !poller.leader && poller.relay.is_some() && poller.lock.is_some() && watcher.is_some();
                (follows, poller.wake.clone())
            };
            match wake {
                // The leader: a nudge from another host's write, or the poll.
                Some(socket) => {
                    wake::wait(&socket, every);
                }
                None => std::thread::sleep(if follows { every * RELAY_FALLBACK } else { every }),
            }
        }
        // Stops the notifier (which may be waiting for the poller) after
        // every lock is released.
        drop(watcher);
    });
    if let Err(e) = spawned {
        eprintln!("kn-journal: cannot start the cross-host change poller of {}: {e}", root.join(CHANGES_FILE).display());
    }
}

/// An inotify watch of the relay file that calls `changed` at every
/// change, from a thread of its own; `None` when it cannot be had (then
/// the poller reads on its timer). Dropping it ends the watch and the
/// thread.
fn watch_relay(relay: &Path, changed: impl Fn() + Send + 'static) -> Option<RelayWatch> {
    use inotify::{EventMask, Inotify, WatchMask};
    let mut inotify = Inotify::init().ok()?;
    let mut watches = inotify.watches();
    let wd = watches.add(relay, WatchMask::MODIFY).ok()?;
    std::thread::Builder::new()
        .name("kn-relay-watch".into())
        .spawn(move || {
            let mut buffer = [0u8; 1024];
            loop {
                let Ok(events) = inotify.read_events_blocking(&mut buffer) else { return };
                let mut modified = false;
                for event in events {
                    // The watch removed (by the drop below) or the file gone.
                    if event.mask.contains(EventMask::IGNORED) {
                        return;
                    }
                    modified |= event.mask.contains(EventMask::MODIFY);
                }
                if modified {
                    changed();
                }
            }
        })
        .ok()?;
    Some(RelayWatch { watches, wd })
}

/// The watch [`watch_relay`] made; dropped, it removes the watch, whose
/// `IN_IGNORED` event ends the watching thread.
struct RelayWatch {
    watches: inotify::Watches,
    wd: inotify::WatchDescriptor,
}

impl Drop for RelayWatch {
    fn drop(&mut self) {
        let _ = self.watches.remove(self.wd.clone());
    }
}

/// One poll of a change log: wakes the readers of the topics named since
/// `at`, and adds the whole entries read to `relay`.
fn poll(file: &File, root: &Path, hub: &Hub, at: &mut Position, relay: &mut Vec<u8>) -> std::io::Result<()> {
    let size = linked_size(file)?;
    if at.generation.is_some() && size == at.offset {
        // Nothing new: one `fstat`, the whole cost of an idle poll. (A
        // file emptied and grown back to the very same size since is
        // seen at its next append, by its new generation.)
        return Ok(());
    }
    let (generation, size) = header_at(file, size)?;
    if generation.is_none() {
        return Ok(()); // nothing written yet, or being created
    }
    if generation != at.generation || size < at.offset {
        // Emptied since: entries may have been lost with it.
        hub.wake_all();
        *at = Position { generation, offset: HEADER };
    }
    while at.offset < size {
        let want = ((size - at.offset) as usize).min(CHUNK);
        let mut buf = vec![0u8; want];
        let n = file.read_at(&mut buf, at.offset)?;
        buf.truncate(n);
        // Only whole entries: up to the last newline read.
        let Some(last) = buf.iter().rposition(|&b| b == b'\n') else {
            if n == CHUNK {
                at.offset += n as u64; // one absurd line: skip it
                continue;
            }
            break;
        };
        for line in buf[..last].split(|&b| b == b'\n') {
            if wake_entry(line, root, hub) {
                relay.push(b'\n');
                relay.extend_from_slice(line);
                relay.push(b'\n');
            }
        }
        at.offset += last as u64 + 1;
        if n < want {
            break;
        }
    }
    Ok(())
}

/// Wakes the readers of the topic an entry names, unless this process
/// wrote it; true when the entry is a valid one (to relay).
fn wake_entry(line: &[u8], root: &Path, hub: &Hub) -> bool {
    let Ok(text) = std::str::from_utf8(line) else { return false };
    let Some((writer, name)) = text.split_once(' ') else { return false };
    // A torn entry (its writer died) reads as a name that is not a topic,
    // or as another topic's name: a wake-up is only a hint to re-read.
    let Ok(topic) = Topic::parse(name) else { return false };
    if writer != writer_id() {
        hub.wake(&topic.dir(root));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::thread;
    use std::time::{Duration, Instant};

    fn poll_config(root: &Path, every: Duration) -> crate::Config {
        let mut config = crate::Config::new(root);
        config.changes_poll = every;
        config.changes_bytes = 1 << 20;
        config
    }

    /// Waits until `sub` has had no wake-up for 100 ms (at most 5 s), so
    /// that a wait after it answers only to what follows.
    fn settle(sub: &crate::watch::Subscription) {
        let quiet = Instant::now() + Duration::from_secs(5);
        while Instant::now() < quiet && crate::watch::Subscription::wait(sub.listen(), Duration::from_millis(100)) {}
    }

    /// An append by another writer id reaches a subscription through the
    /// poller alone (no inotify: the hub's subscription is on a topic the
    /// test never writes to).
    #[test]
    fn an_entry_wakes_the_readers_of_its_topic_and_rotation_wakes_all() {
        let root = tempfile::tempdir().unwrap();
        let topic = Topic::parse("/what/chat").unwrap();
        let dir = topic.dir(root.path());
        std::fs::create_dir_all(&dir).unwrap();
        let hub = Arc::new(Hub::new());
        let sub = hub.subscribe(&dir);
        let log = ChangeLog::default();
        let mut config = crate::Config::new(root.path());
        log.append(&config, &topic).unwrap();
        spawn_poller(&poll_config(root.path(), Duration::from_millis(5)), Arc::downgrade(&hub));
        // The poller wakes everyone when it starts (it may have missed
        // entries): let that pass, or it would answer the wait below.
        settle(&sub);
        // Written as another process would.
        let f = std::fs::OpenOptions::new().write(true).open(root.path().join(CHANGES_FILE)).unwrap();
        let listener = sub.listen();
        let end = f.metadata().unwrap().len();
        f.write_all_at(b"\nother /what/chat\n", end).unwrap();
        let t = Instant::now();
        assert!(crate::watch::Subscription::wait(listener, Duration::from_secs(5)), "no wake-up");
        assert!(t.elapsed() < Duration::from_secs(1));
        // An entry of this process is skipped (inotify wakes for those).
        settle(&sub);
        let listener = sub.listen();
        log.append(&config, &topic).unwrap();
        assert!(!crate::watch::Subscription::wait(listener, Duration::from_millis(200)));
        // Emptied by a writer finding it too large: everyone re-reads.
        let listener = sub.listen();
        config.changes_bytes = 16;
        log.append(&config, &Topic::parse("/x").unwrap()).unwrap();
        assert!(crate::watch::Subscription::wait(listener, Duration::from_secs(5)), "no wake-up on rotation");
        let len = std::fs::metadata(root.path().join(CHANGES_FILE)).unwrap().len();
        assert_eq!(len, HEADER + format!("\n{} /x\n", writer_id()).len() as u64);
        drop(hub);
        remove_relay(root.path());
    }

    /// Threads appending at once share writes (group commit), and every
    /// entry lands exactly once, whole.
    #[test]
    fn concurrent_appends_land_once_each_and_whole() {
        let root = tempfile::tempdir().unwrap();
        let config = crate::Config::new(root.path());
        let log = ChangeLog::default();
        thread::scope(|s| {
            for t in 0..8 {
                let (log, config) = (&log, &config);
                s.spawn(move || {
                    for i in 0..50 {
                        log.append(config, &Topic::parse(&format!("/t{t}/n{i}")).unwrap()).unwrap();
                    }
                });
            }
        });
        let bytes = std::fs::read(root.path().join(CHANGES_FILE)).unwrap();
        assert_eq!(&bytes[..8], MAGIC);
        let text = String::from_utf8(bytes[HEADER as usize..].to_vec()).unwrap();
        let mut topics: Vec<&str> = text.split('\n').filter(|l| !l.is_empty()).map(|l| l.split_once(' ').unwrap().1).collect();
        topics.sort();
        let mut want: Vec<String> = (0..8).flat_map(|t| (0..50).map(move |i| format!("/t{t}/n{i}"))).collect();
        want.sort();
        assert_eq!(topics, want);
    }

    fn remove_relay(root: &Path) {
        let (lock, relay) = relay_paths(root);
        let _ = std::fs::remove_file(lock);
        let _ = std::fs::remove_file(relay);
    }

    /// Two pollers of one host (two hubs stand for two processes: each
    /// opens the host's lock on its own, and `flock` excludes them as it
    /// would two processes): one reads the volume, the other the relay,
    /// and both wake their readers.
    #[test]
    fn one_poller_per_host_reads_the_volume_and_relays_to_the_others() {
        let root = tempfile::tempdir().unwrap();
        let topic = Topic::parse("/what/chat").unwrap();
        let dir = topic.dir(root.path());
        std::fs::create_dir_all(&dir).unwrap();
        ChangeLog::default().append(&crate::Config::new(root.path()), &Topic::parse("/x").unwrap()).unwrap();
        let hubs: Vec<Arc<Hub>> = (0..2).map(|_| Arc::new(Hub::new())).collect();
        let subs: Vec<_> = hubs.iter().map(|h| h.subscribe(&dir)).collect();
        // The relay's reader is rung by inotify: it wakes long before its
        // own timer (ten polls, 2 s here) would.
        let every = Duration::from_millis(200);
        for hub in &hubs {
            spawn_poller(&poll_config(root.path(), every), Arc::downgrade(hub));
        }
        thread::sleep(every * 3); // a leader is chosen
        let listeners: Vec<_> = subs.iter().map(|s| s.listen()).collect();
        let f = std::fs::OpenOptions::new().write(true).open(root.path().join(CHANGES_FILE)).unwrap();
        let end = f.metadata().unwrap().len();
        let t = Instant::now();
        f.write_all_at(b"\nother /what/chat\n", end).unwrap();
        for listener in listeners {
            assert!(crate::watch::Subscription::wait(listener, Duration::from_secs(5)), "a poller missed the entry");
        }
        assert!(t.elapsed() < every * 5, "the relay's reader waited for its timer: {:?}", t.elapsed());
        let relayed = std::fs::read(relay_paths(root.path()).1).unwrap();
        assert!(relayed.ends_with(b"\nother /what/chat\n"), "{:?}", String::from_utf8_lossy(&relayed));
        drop(subs);
        drop(hubs);
        thread::sleep(Duration::from_millis(50));
        remove_relay(root.path());
    }
}
