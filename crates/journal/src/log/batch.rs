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
        for event in events {
            if !self.ordinary {
                digests.push(Some(0));
                continue;
            }
            let id = event.id().unwrap_or(b"");
            let digest = event.end_to_end_digest_with_payload(None) as u64;
            let before = match current.get(id) {
                Some(d) => Some(*d),
                None => match self.lookup(id) {
                    Ok((_, old)) => old,
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
        let written = self.write_group(events, &digests, frames, seq, gauge);
        match written {
            Ok(()) => answers.into_iter().map(Ok).collect(),
            Err(err) => events.iter().map(|_| Err(copy_error(&err))).collect(),
        }
    }

    /// The writes of [`Writer::append_batch`]: the `frames` of the events
    /// whose digest is known (the others are duplicates), the index slots
    /// in order, the head with `next_seq`.
    fn write_group(
        &mut self,
        events: &[&Event],
        digests: &[Option<u64>],
        frames: Vec<u8>,
        next_seq: u64,
        gauge: &SpaceGauge,
    ) -> Result<()> {
        let total = frames.len() as u64;
        gauge.check(&self.dir, self.config.reserve_bytes, total)?;
        let offset = self.head.active_len;
        self.write_at_end(&frames)?;
        if self.ordinary {
            for (event, digest) in events.iter().zip(digests) {
                let Some(digest) = digest else { continue };
                if super::head::index_full(self.head.used, self.head.slots) {
                    self.grow_index()?;
                }
                let (slot, old) = self.lookup(event.id().unwrap_or(b""))?;
                self.write_indexed(event, slot, old.is_some(), *digest)?;
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

/// The same error again, for each of the posts of a group that failed
/// together.
pub(crate) fn copy_error(err: &Error) -> Error {
    Error::new(err.kind(), err.message())
}
