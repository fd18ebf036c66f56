//! A group of posts appended together ([`Writer::append_batch`]): the
//! events of one process's posts waiting for the same topic, written as
//! consecutive records with one `pwrite` and counted by one head write
//! (FORMAT.md, "Group commit").

use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::event::Event;
use crate::record;

use super::segment::Written;
use super::space::SpaceGauge;
use super::writer::{Appended, Writer};

impl Writer<'_> {
    /// Whether appending `events` with [`Writer::append_batch`] (or
    /// [`Writer::append_run`]) is a few writes to files open already: no
    /// blob to store, no index to grow for them, no compaction to run
    /// after (what a caller that must not block checks first).
    pub(crate) fn appends_at_once_all(&self, events: &[&Event]) -> bool {
        let blob = events.iter().any(|e| self.config.blob_bytes > 0 && e.payload().len() > self.config.blob_bytes);
        let grows = self.ordinary && super::head::index_full(self.head.used + events.len() as u64, self.head.slots);
        !blob && !grows && !self.may_want_compaction_after_append()
    }

    /// Appends `events` (each carrying a `kn_id`) in order, as
    /// [`Writer::append`] one after another would: on an ordinary topic an
    /// event is a duplicate (not stored) when its `kn_id` and end-to-end
    /// elements equal the current event's, that being the one of the
    /// latest event before it in the group with that id, else the index's.
    /// The stored ones are written as consecutive records with one write
    /// of their frames, then their index slots in order, then the head
    /// once. Returns one answer per event.
    ///
    /// A group holding a payload large enough for a blob, or that would
    /// not fit the active segment, is appended a record at a time (each
    /// answer its own then: a failure leaves those before it stored).
    /// A crash part-way leaves whole records the head does not count, or a
    /// torn last one: the next writer adopts (and indexes) or truncates
    /// them, as after a single append.
    pub(crate) fn append_batch(
        &mut self,
        events: &[&Event],
        stored_secs: u64,
        gauge: &SpaceGauge,
    ) -> Vec<Result<Appended>> {
        if let Err(err) = self.unfenced() {
            return events.iter().map(|_| Err(copy_error(&err))).collect();
        }
        self.written = None;
        let blob =
            |e: &&Event| self.config.blob_bytes > 0 && e.payload().len() > self.config.blob_bytes;
        if events.len() < 2 || events.iter().any(blob) {
            return self.append_one_by_one(events, stored_secs, gauge);
        }
        // Which are duplicates, decided in order against the index and
        // the group's own earlier events (nothing is written yet).
        let mut current: HashMap<&[u8], u64> = HashMap::new();
        let mut digests: Vec<Option<u64>> = Vec::with_capacity(events.len());
        // Each event's index search, kept for its slot's write.
        let mut looked: Vec<Option<Looked>> = Vec::with_capacity(events.len());
        for event in events {
            if !self.ordinary {
                digests.push(Some(0));
                looked.push(None);
                continue;
            }
            let id = event.id().unwrap_or(b"");
            let digest = event.end_to_end_digest_with_payload(None) as u64;
            let before = match current.get(id) {
                Some(d) => {
                    looked.push(None);
                    Some(*d)
                }
                None => match self.lookup(id) {
                    Ok((slot, old)) => {
                        looked.push(Some(Looked { slot, old }));
                        old
                    }
                    Err(err) => return events.iter().map(|_| Err(copy_error(&err))).collect(),
                },
            };
            if before == Some(digest) {
                digests.push(None);
            } else {
                current.insert(id, digest);
                digests.push(Some(digest));
            }
        }
        let first = self.head.next_seq;
        let mut frames = Vec::new();
        let mut answers = Vec::with_capacity(events.len());
        let mut seq = first;
        for (event, digest) in events.iter().zip(&digests) {
            if digest.is_none() {
                answers.push(Appended::Duplicate);
                continue;
            }
            frames.extend_from_slice(&record::encode_event(seq, stored_secs, event, None));
            answers.push(Appended::Stored(seq));
            seq += 1;
        }
        if frames.is_empty() {
            return answers.into_iter().map(Ok).collect();
        }
        let total = frames.len() as u64;
        if self.head.active_len > 0 && self.head.active_len + total > self.config.segment_bytes {
            return self.append_one_by_one(events, stored_secs, gauge);
        }
        let written = self.write_group(events, &digests, &looked, frames, seq, gauge);
        match written {
            Ok(()) => answers.into_iter().map(Ok).collect(),
            Err(err) => events.iter().map(|_| Err(copy_error(&err))).collect(),
        }
    }

    /// The writes of [`Writer::append_batch`]: the `frames` of the events
    /// whose digest is known (the others are duplicates), the index slots
    /// in order, the head with `next_seq`.
    ///
    /// An event's slot is the one its search before the writes found
    /// (`looked`), as long as no slot written for the group since changed
    /// that answer: the slots a search passes over hold other ids, which
    /// the group's writes leave so (each writes an empty slot or its own
    /// id's), so only the slot found itself can have changed, taken by an
    /// earlier event of the group (an id given twice is not searched the
    /// second time at all). Then, and after the index grew, the slot is
    /// searched again.
    fn write_group(
        &mut self,
        events: &[&Event],
        digests: &[Option<u64>],
        looked: &[Option<Looked>],
        frames: Vec<u8>,
        next_seq: u64,
        gauge: &SpaceGauge,
    ) -> Result<()> {
        let total = frames.len() as u64;
        gauge.check(&self.dir, self.config.reserve_bytes, total)?;
        let offset = self.head.active_len;
        self.write_at_end(&frames)?;
        if self.ordinary {
            // The slots written for the group so far.
            let mut taken: Vec<u64> = Vec::with_capacity(events.len());
            let mut grew = false;
            for ((event, digest), looked) in events.iter().zip(digests).zip(looked) {
                let Some(digest) = digest else { continue };
                if super::head::index_full(self.head.used, self.head.slots) {
                    self.grow_index()?;
                    grew = true;
                }
                let (slot, replaced) = match looked {
                    Some(looked) if !grew && !taken.contains(&looked.slot) => (looked.slot, looked.old.is_some()),
                    _ => self.lookup(event.id().unwrap_or(b"")).map(|(slot, old)| (slot, old.is_some()))?,
                };
                self.write_indexed(event, slot, replaced, *digest)?;
                taken.push(slot);
            }
        }
        self.count_appended(next_seq, total)?;
        if self.segment_ino != 0 && self.segment_first == self.head.active {
            self.written = Some(Written {
                segment: self.segment_first,
                ino: self.segment_ino,
                offset,
                frame: frames,
            });
        }
        Ok(())
    }

    /// [`Writer::append_batch`] a record at a time; the records written
    /// are handed over together when they are consecutive.
    fn append_one_by_one(
        &mut self,
        events: &[&Event],
        stored_secs: u64,
        gauge: &SpaceGauge,
    ) -> Vec<Result<Appended>> {
        let mut answers = Vec::with_capacity(events.len());
        let mut run: Option<Written> = None;
        for event in events {
            answers.push(self.append(event, stored_secs, gauge));
            run = match (run, self.written.take()) {
                (Some(mut run), Some(w))
                    if w.ino == run.ino
                        && w.segment == run.segment
                        && w.offset == run.offset + run.frame.len() as u64 =>
                {
                    run.frame.extend_from_slice(&w.frame);
                    Some(run)
                }
                (_, w) => w,
            };
        }
        self.written = run;
        answers
    }
}

/// Where an event's index search before a group's writes ended
/// ([`Writer::lookup`]): the slot, and the digest found there (`None`: an
/// empty slot, the id not indexed).
struct Looked {
    slot: u64,
    old: Option<u64>,
}

/// The same error again, for each of the posts of a group that failed
/// together.
pub(crate) fn copy_error(err: &Error) -> Error {
    Error::new(err.kind(), err.message())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// Events with many ids sharing index slots (64 slots at first), ids
    /// repeated within a group with and without a change (a replacement,
    /// a duplicate) and ids of earlier groups: appended in groups and one
    /// at a time, the two logs' files are the same byte for byte (the
    /// group's slots are those the searches one after another find).
    #[test]
    fn a_group_indexes_each_event_where_appends_one_by_one_would() {
        let event = |id: usize, v: usize| {
            let mut e = Event::new();
            e.set("kn_id", format!("id{id}")).set("kn_payload", format!("v{v}"));
            e
        };
        let mut groups: Vec<Vec<Event>> = Vec::new();
        for g in 0..12 {
            let mut group: Vec<Event> = (0..8).map(|k| event(g * 5 + k, g)).collect();
            group.push(event(g * 5, g)); // a duplicate of the group's first
            group.push(event(g * 5 + 1, g + 100)); // its second, changed
            group.push(event(g.saturating_sub(1) * 5 + 2, g + 200)); // an earlier group's, changed
            groups.push(group);
        }
        let root = tempfile::tempdir().unwrap();
        let config = Config::new(root.path());
        let gauge = SpaceGauge::default();
        let (batched, single) = (root.path().join("batched"), root.path().join("single"));
        std::fs::create_dir_all(&batched).unwrap();
        std::fs::create_dir_all(&single).unwrap();
        let (mut in_groups, mut one_by_one) = (Vec::new(), Vec::new());
        for group in &groups {
            let mut w = Writer::open(&batched, &config, true).unwrap();
            let refs: Vec<&Event> = group.iter().collect();
            in_groups.extend(w.append_batch(&refs, 7, &gauge).into_iter().map(|a| format!("{:?}", a.unwrap())));
            drop(w.release());
            let mut w = Writer::open(&single, &config, true).unwrap();
            one_by_one.extend(group.iter().map(|e| format!("{:?}", w.append(e, 7, &gauge).unwrap())));
            drop(w.release());
        }
        assert_eq!(in_groups, one_by_one);
        assert!(in_groups.iter().any(|a| a.contains("Duplicate")));
        let mut names: Vec<_> = std::fs::read_dir(&single).unwrap().map(|e| e.unwrap().file_name()).collect();
        names.sort();
        assert!(names.iter().any(|n| n.to_string_lossy().starts_with(".seg-")));
        for name in names {
            let (mut a, mut b) = (std::fs::read(batched.join(&name)).unwrap(), std::fs::read(single.join(&name)).unwrap());
            if name == ".head" {
                // Each log's route generation starts where it will (and
                // the head's CRC covers it): the rest must be the same.
                a[64..76].fill(0);
                b[64..76].fill(0);
            }
            let diff: Vec<usize> = (0..a.len().max(b.len())).filter(|&i| a.get(i) != b.get(i)).collect();
            assert!(diff.is_empty(), "{} differs at {:?} ({} / {} bytes)", name.to_string_lossy(), &diff[..diff.len().min(20)], a.len(), b.len());
        }
    }
}
