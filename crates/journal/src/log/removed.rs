//! The last sequence numbers of removed topics: `.removed` in the store
//! root, so that a topic created again after the sweep removed it goes on
//! numbering after its predecessor instead of starting again at 1. A
//! checkpoint a client holds from the old topic then never names an event
//! of the new one (FORMAT.md, "Readers and checkpoints").
//!
//! A fixed table of [`SLOTS`] slots, each the highest last seq of the
//! removed topics whose name hashes there and a tag saying whether that
//! was one name or several: bounded whatever the number of topics ever
//! removed, at the price of a topic that was never removed starting above
//! 1 when it shares a slot with removed ones (harmless: a checkpoint is
//! opaque to clients, and a higher start only turns a stale resume into a
//! gap). A store that never removed a topic has no `.removed`, and its
//! topics start at 1 as they always did.

use std::fs::File;
use std::io::ErrorKind as IoKind;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::config::{Config, SyncPolicy};
use crate::error::{Error, Result};
use crate::record::crc32c;

/// In the store root: the table.
pub(crate) const REMOVED_FILE: &str = ".removed";
const MAGIC: &[u8; 8] = b"KNRMV\0\0\x01";
const HEADER: u64 = 32;
const SLOT: u64 = 16;
/// Slots of a table this version creates (a table says its own size in
/// its header, which every process then uses).
pub(crate) const SLOTS: u64 = 65_536;
/// The tag of a slot shared by several removed topics (real tags are odd).
const MIXED: u32 = 2;

/// The header: the table's size and the highest value of any slot (the
/// answer for a slot that does not check out).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Header {
    slots: u64,
    max: u64,
}

impl Header {
    fn encode(&self) -> [u8; HEADER as usize] {
        let mut b = [0u8; HEADER as usize];
        b[..8].copy_from_slice(MAGIC);
        b[8..16].copy_from_slice(&self.slots.to_le_bytes());
        b[16..24].copy_from_slice(&self.max.to_le_bytes());
        let crc = crc32c(&[&b[..24]]);
        b[24..28].copy_from_slice(&crc.to_le_bytes());
        b
    }

    fn decode(b: &[u8; HEADER as usize]) -> Option<Header> {
        let crc = u32::from_le_bytes(b[24..28].try_into().ok()?);
        if &b[..8] != MAGIC || crc != crc32c(&[&b[..24]]) {
            return None;
        }
        let slots = u64::from_le_bytes(b[8..16].try_into().ok()?);
        let max = u64::from_le_bytes(b[16..24].try_into().ok()?);
        (slots > 0).then_some(Header { slots, max })
    }
}

/// One slot as read.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Slot {
    Empty,
    Holds { value: u64, tag: u32 },
    /// Does not check out (a write in progress, or damage).
    Bad,
}

fn slot_crc(index: u64, value: u64, tag: u32) -> u32 {
    crc32c(&[&index.to_le_bytes(), &value.to_le_bytes(), &tag.to_le_bytes()])
}

fn encode_slot(index: u64, value: u64, tag: u32) -> [u8; SLOT as usize] {
    let mut b = [0u8; SLOT as usize];
    b[..8].copy_from_slice(&value.to_le_bytes());
    b[8..12].copy_from_slice(&tag.to_le_bytes());
    b[12..16].copy_from_slice(&slot_crc(index, value, tag).to_le_bytes());
    b
}

fn decode_slot(index: u64, b: &[u8; SLOT as usize]) -> Slot {
    if b.iter().all(|&x| x == 0) {
        return Slot::Empty;
    }
    let value = u64::from_le_bytes(b[..8].try_into().unwrap_or_default());
    let tag = u32::from_le_bytes(b[8..12].try_into().unwrap_or_default());
    let crc = u32::from_le_bytes(b[12..16].try_into().unwrap_or_default());
    if crc == slot_crc(index, value, tag) { Slot::Holds { value, tag } } else { Slot::Bad }
}

/// The hash of the topic in `dir`: of its path below the store root (the
/// whole path if it is not below it), as every process names it.
fn name_hash(config: &Config, dir: &Path) -> u64 {
    let rel = dir.strip_prefix(&config.root).unwrap_or(dir);
    xxhash_rust::xxh3::xxh3_64(rel.as_os_str().as_encoded_bytes())
}

/// False for a directory of the store's own (a name starting with `.`
/// anywhere below the root: `.streams/`, `.probe-*`), never a topic.
fn is_topic_dir(config: &Config, dir: &Path) -> bool {
    let rel = dir.strip_prefix(&config.root).unwrap_or(dir);
    !rel.components().any(|c| matches!(c, std::path::Component::Normal(n) if n.as_encoded_bytes().starts_with(b".")))
}

/// A name's tag: 31 bits of its hash other than those choosing the slot,
/// odd (so never 0, empty, nor [`MIXED`]).
fn tag_of(hash: u64) -> u32 {
    ((hash >> 32) as u32) | 1
}

fn read_header(file: &File) -> std::io::Result<Option<Header>> {
    let mut b = [0u8; HEADER as usize];
    if super::read_at_most(file, &mut b, 0)? < b.len() {
        return Ok(None);
    }
    Ok(Header::decode(&b))
}

fn read_slot(file: &File, index: u64) -> std::io::Result<Slot> {
    let mut b = [0u8; SLOT as usize];
    let got = super::read_at_most(file, &mut b, HEADER + SLOT * index)?;
    if got < b.len() {
        // Past the end of a sparse table: never written.
        return Ok(if got == 0 { Slot::Empty } else { Slot::Bad });
    }
    Ok(decode_slot(index, &b))
}

/// The highest value of every slot that checks out (a header that does
/// not: rebuilt from them), and the size the table's length says.
fn scan_max(file: &File) -> std::io::Result<u64> {
    let len = file.metadata()?.len();
    let slots = len.saturating_sub(HEADER) / SLOT;
    let mut max = 0;
    let mut buf = vec![0u8; (SLOT * 4096) as usize];
    let mut index = 0;
    while index < slots {
        let got = super::read_at_most(file, &mut buf, HEADER + SLOT * index)?;
        for chunk in buf[..got].chunks_exact(SLOT as usize) {
            let b: &[u8; SLOT as usize] = chunk.try_into().unwrap_or(&[0; SLOT as usize]);
            if let Slot::Holds { value, .. } = decode_slot(index, b) {
                max = max.max(value);
            }
            index += 1;
        }
        if got < buf.len() {
            break;
        }
    }
    Ok(max)
}

/// The sequence number a topic created in `dir` starts at: 1, unless a
/// topic of that name was removed, then one past the highest seq it (or
/// any removed topic sharing its slot) had. One `open` (failing, in a
/// store that never removed a topic) and two `pread`s; no lock: the
/// table only ever grows, and a slot caught being written does not check
/// out and is answered by the header's maximum, written before it.
pub(crate) fn first_seq(config: &Config, dir: &Path) -> Result<u64> {
    if !is_topic_dir(config, dir) {
        // The store's own logs (streams, probes) are never removed by
        // the sweep, and a stream's fork must number as its source does.
        return Ok(1);
    }
    let path = config.root.join(REMOVED_FILE);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == IoKind::NotFound => return Ok(1),
        Err(e) => return Err(Error::io("cannot open", &path, e)),
    };
    if config.shared == crate::config::Shared::On {
        // Another host may have recorded since this host cached a page.
        crate::shared::drop_cached_pages(&file);
    }
    let read = || -> std::io::Result<u64> {
        let Some(header) = read_header(&file)? else {
            // No header yet: created this instant, nothing recorded (a
            // removal records before it sets its topic aside). A damaged
            // one: every slot decides.
            return Ok(if file.metadata()?.len() <= HEADER { 0 } else { scan_max(&file)? });
        };
        let hash = name_hash(config, dir);
        Ok(match read_slot(&file, hash % header.slots)? {
            Slot::Empty => 0,
            Slot::Holds { value, tag } if tag == MIXED || tag == tag_of(hash) => value,
            Slot::Holds { .. } => 0,
            Slot::Bad => header.max,
        })
    };
    let last = read().map_err(|e| Error::io("cannot read", &path, e))?;
    Ok(last.saturating_add(1))
}

/// Records that the topic in `dir`, being removed, had sequence numbers up
/// to `last`: called by the sweep under the topic's lock, before the
/// directory is set aside, so that whoever creates the topic again (which
/// needs the name free) finds it. Under the table's own lock: the header's
/// maximum first, then the slot; with `sync=always` flushed before
/// returning.
pub(crate) fn record(config: &Config, dir: &Path, last: u64) -> Result<()> {
    if last == 0 {
        return Ok(());
    }
    let path = config.root.join(REMOVED_FILE);
    let io = |e| Error::io("cannot record the last checkpoint of a removed topic in", &path, e);
    let file = super::open_shared(&path, false).map_err(io)?;
    crate::shared::lock(&file, crate::shared::LockKind::Exclusive, config).map_err(io)?;
    if config.shared == crate::config::Shared::On {
        crate::shared::drop_cached_pages(&file);
    }
    let write = || -> std::io::Result<()> {
        let header = match read_header(&file)? {
            Some(h) => h,
            None => Header { slots: SLOTS, max: scan_max(&file)? },
        };
        let hash = name_hash(config, dir);
        let index = hash % header.slots;
        let (value, tag) = match read_slot(&file, index)? {
            Slot::Empty => (last, tag_of(hash)),
            Slot::Holds { value, tag } if tag == tag_of(hash) => (value.max(last), tag),
            Slot::Holds { value, .. } => (value.max(last), MIXED),
            Slot::Bad => (header.max.max(last), MIXED),
        };
        let header = Header { slots: header.slots, max: header.max.max(value) };
        file.write_all_at(&header.encode(), 0)?;
        file.write_all_at(&encode_slot(index, value, tag), HEADER + SLOT * index)?;
        if config.sync == SyncPolicy::Always {
            file.sync_data()?;
        }
        Ok(())
    };
    let result = write().map_err(io);
    crate::shared::unlock(&file, config);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(root: &Path) -> Config {
        Config::new(root)
    }

    #[test]
    fn a_name_never_removed_starts_at_one_and_a_removed_one_after_its_last() {
        let root = tempfile::tempdir().unwrap();
        let c = config(root.path());
        let a = root.path().join("what/a");
        let b = root.path().join("what/b");
        assert_eq!(first_seq(&c, &a).unwrap(), 1, "no table");
        record(&c, &a, 7).unwrap();
        assert_eq!(first_seq(&c, &a).unwrap(), 8);
        assert_eq!(first_seq(&c, &b).unwrap(), 1, "another name, another slot");
        record(&c, &a, 3).unwrap();
        assert_eq!(first_seq(&c, &a).unwrap(), 8, "never lowered");
        record(&c, &a, 0).unwrap();
        assert_eq!(first_seq(&c, &a).unwrap(), 8);
        // The store's own logs always start at 1 (a fork numbers as its
        // source), whatever their slot holds.
        let stream = root.path().join(".streams/0123");
        record(&c, &stream, 9).unwrap();
        assert_eq!(first_seq(&c, &stream).unwrap(), 1);
    }

    #[test]
    fn names_sharing_a_slot_both_start_after_the_higher_and_a_bad_slot_after_every() {
        let root = tempfile::tempdir().unwrap();
        let c = config(root.path());
        // Two names in one slot, found by trying.
        let first = root.path().join("s/0");
        let slot = name_hash(&c, &first) % SLOTS;
        let other = (1..).map(|n| root.path().join(format!("s/{n}"))).find(|d| name_hash(&c, d) % SLOTS == slot).unwrap();
        record(&c, &first, 5).unwrap();
        record(&c, &other, 9).unwrap();
        assert_eq!(first_seq(&c, &first).unwrap(), 10);
        assert_eq!(first_seq(&c, &other).unwrap(), 10);
        // A damaged slot answers the highest value of the table.
        let third = root.path().join("t");
        record(&c, &third, 40).unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(root.path().join(REMOVED_FILE)).unwrap();
        file.write_all_at(&[0xff], HEADER + SLOT * slot).unwrap();
        assert_eq!(first_seq(&c, &first).unwrap(), 41);
        // A damaged header: every slot that checks out decides.
        file.write_all_at(&[0xff], 0).unwrap();
        assert_eq!(first_seq(&c, &root.path().join("never")).unwrap(), 41);
        record(&c, &first, 50).unwrap();
        assert_eq!(first_seq(&c, &first).unwrap(), 51);
    }
}
