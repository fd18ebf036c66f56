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
use std::sync::{Mutex, Weak};
use std::time::Duration;

use crate::shared::drop_cached_pages;
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

/// The appending side, kept by a store: its open `.changes`.
#[derive(Default)]
pub(crate) struct ChangeLog {
    file: Mutex<Option<File>>,
}

impl ChangeLog {
    /// Appends an entry naming `topic` (which was just appended to) under
    /// the file's lock, emptying the file first when it is larger than
    /// `max_bytes`. A failure only delays the wake-up of other hosts'
    /// readers to their poll interval: the post itself is stored.
    pub(crate) fn append(&self, root: &Path, topic: &Topic, max_bytes: u64) -> std::io::Result<()> {
        let mut slot = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(crate::log::open_shared(&root.join(CHANGES_FILE), false)?);
        }
        let Some(file) = slot.as_ref() else { return Ok(()) };
        file.lock()?;
        let written = append_locked(file, topic, max_bytes);
        let _ = file.unlock();
        if written.is_err() {
            *slot = None;
        }
        written
    }
}

fn append_locked(file: &File, topic: &Topic, max_bytes: u64) -> std::io::Result<()> {
    drop_cached_pages(file);
    let size = file.metadata()?.len();
    let mut header = [0u8; HEADER as usize];
    let valid = size >= HEADER && file.read_exact_at(&mut header, 0).is_ok() && &header[..8] == MAGIC;
    let mut end = size;
    if !valid || size > max_bytes {
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
    let entry = format!("\n{} {}\n", writer_id(), topic.as_str());
    file.write_all_at(entry.as_bytes(), end)
}

/// Where a poller is in the change log.
struct Position {
    generation: Option<u64>,
    offset: u64,
}

/// Reads the header and size of `.changes`: (generation, size).
fn header_of(file: &File) -> std::io::Result<(Option<u64>, u64)> {
    drop_cached_pages(file);
    let size = file.metadata()?.len();
    let mut header = [0u8; HEADER as usize];
    if size < HEADER || file.read_exact_at(&mut header, 0).is_err() || &header[..8] != MAGIC {
        return Ok((None, size));
    }
    Ok((Some(u64::from_le_bytes(header[8..16].try_into().unwrap_or([0; 8]))), size))
}

/// Starts this process's poller of `root`'s change log, which wakes the
/// readers `hub` knows for every topic named by another process, until
/// the hub is dropped. It starts at the log's current end: the readers
/// subscribed now re-read once anyway.
pub(crate) fn spawn_poller(root: &Path, hub: Weak<Hub>, every: Duration) {
    let root = std::path::absolute(root).unwrap_or_else(|_| root.to_path_buf());
    let path = root.join(CHANGES_FILE);
    let open = move || crate::log::open_shared(&path, false).ok();
    let mut file = open();
    let mut at = Position { generation: None, offset: HEADER };
    if let Some((generation, size)) = file.as_ref().and_then(|f| header_of(f).ok()) {
        at = Position { generation, offset: size.max(HEADER) };
    }
    let poller_root = root.clone();
    let spawned = std::thread::Builder::new().name("kn-changes".into()).spawn(move || loop {
        std::thread::sleep(every);
        let Some(hub) = hub.upgrade() else { return };
        if file.is_none() {
            file = open();
        }
        let Some(f) = file.as_ref() else { continue };
        if poll(f, &poller_root, &hub, &mut at).is_err() {
            // Reopen next time (the volume may have been unreachable).
            file = None;
        }
    });
    if let Err(e) = spawned {
        eprintln!("kn-journal: cannot start the cross-host change poller of {}: {e}", root.join(CHANGES_FILE).display());
    }
}

/// One poll: wakes the readers of the topics named since `at`.
fn poll(file: &File, root: &PathBuf, hub: &Hub, at: &mut Position) -> std::io::Result<()> {
    let (generation, size) = header_of(file)?;
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
            wake_entry(line, root, hub);
        }
        at.offset += last as u64 + 1;
        if n < want {
            break;
        }
    }
    Ok(())
}

fn wake_entry(line: &[u8], root: &Path, hub: &Hub) {
    let Ok(text) = std::str::from_utf8(line) else { return };
    let Some((writer, name)) = text.split_once(' ') else { return };
    if writer == writer_id() {
        return;
    }
    // A torn entry (its writer died) reads as a name that is not a topic,
    // or as another topic's name: a wake-up is only a hint to re-read.
    if let Ok(topic) = Topic::parse(name) {
        hub.wake(&topic.dir(root));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

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
        log.append(root.path(), &topic, 1 << 20).unwrap();
        spawn_poller(root.path(), Arc::downgrade(&hub), Duration::from_millis(5));
        // Written as another process would.
        let f = std::fs::OpenOptions::new().write(true).open(root.path().join(CHANGES_FILE)).unwrap();
        let listener = sub.listen();
        let end = f.metadata().unwrap().len();
        f.write_all_at(b"\nother /what/chat\n", end).unwrap();
        let t = Instant::now();
        assert!(crate::watch::Subscription::wait(listener, Duration::from_secs(5)), "no wake-up");
        assert!(t.elapsed() < Duration::from_secs(1));
        // An entry of this process is skipped (inotify wakes for those).
        let listener = sub.listen();
        log.append(root.path(), &topic, 1 << 20).unwrap();
        assert!(!crate::watch::Subscription::wait(listener, Duration::from_millis(200)));
        // Emptied by a writer finding it too large: everyone re-reads.
        let listener = sub.listen();
        log.append(root.path(), &Topic::parse("/x").unwrap(), 16).unwrap();
        assert!(crate::watch::Subscription::wait(listener, Duration::from_secs(5)), "no wake-up on rotation");
        let len = std::fs::metadata(root.path().join(CHANGES_FILE)).unwrap().len();
        assert_eq!(len, HEADER + format!("\n{} /x\n", writer_id()).len() as u64);
    }
}
