//! A topic's forwarding state, `.forwarded` (FORMAT.md "Forwarding"): how
//! far its events have been forwarded along its routes and which routes
//! lag behind, encoded in two slots so that a torn write leaves the
//! previous state; the `Outbox` lock that guards it; and the store's
//! `.outbox/` list of topics with lagging routes. The lowest floor of the
//! outbox: it knows nothing of deliveries or drains.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, ErrorKind, Result};
use crate::log;

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
    pub(super) fn at(cursor: u64) -> State {
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
pub(super) fn read_state(file: &File) -> std::io::Result<Option<State>> {
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

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(super) fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

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
