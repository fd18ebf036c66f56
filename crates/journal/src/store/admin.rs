//! Store APIs for administration tools (`kn`): per-topic figures, every
//! retained event including expired ones, every record still in a log
//! (superseded ones too), restoring events from another
//! store (the legacy import), and setting a journal's heartbeat time.
//!
//! These keep the store's rules: restored events go through the same log
//! writer (duplicate suppression on ordinary topics included), and new
//! topics are announced in their parent's `kn_subtopics`. What they skip on
//! purpose is forwarding: a restored event was already delivered by the
//! store it comes from.

use std::fs;
use std::io::ErrorKind as IoKind;
use std::time::SystemTime;

use super::{fresh_id, now, Selection, Store, HEARTBEAT_FILE};
use crate::error::{Error, ErrorKind, Result};
use crate::event::*;
use crate::log;
use crate::topic::Topic;

/// Figures about one topic's log, from [`Store::stat`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopicStat {
    /// Current unexpired events (on an ordinary topic, one per `kn_id`).
    pub events: usize,
    /// Valid records in the segments (superseded and expired ones included).
    pub records: usize,
    /// Bytes of segment files.
    pub bytes: u64,
    /// Segment files.
    pub segments: usize,
}

impl Store {
    /// Counts `topic`'s events, records, segment bytes and segments. A topic
    /// that does not exist has none.
    ///
    /// ```
    /// use kn_journal::{Event, Store, Topic};
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = Store::open(dir.path()).unwrap();
    /// let t = Topic::parse("/a").unwrap();
    /// store.notify(&t, Event::from_pairs([("kn_id", "1")])).unwrap();
    /// store.notify(&t, Event::from_pairs([("kn_id", "1"), ("kn_payload", "new")])).unwrap();
    /// let stat = store.stat(&t).unwrap();
    /// assert_eq!((stat.events, stat.records, stat.segments), (1, 2, 1));
    /// assert!(stat.bytes > 0);
    /// ```
    pub fn stat(&self, topic: &Topic) -> Result<TopicStat> {
        let dir = self.dir(topic);
        let mut stat = TopicStat::default();
        for first in log::list_segments(&dir)? {
            let path = dir.join(log::segment_name(first));
            match fs::metadata(&path) {
                Ok(m) => {
                    stat.bytes += m.len();
                    stat.segments += 1;
                }
                Err(e) if e.kind() == IoKind::NotFound => {} // compacted meanwhile
                Err(e) => return Err(Error::io("cannot stat segment", &path, e)),
            }
        }
        stat.records = log::verify_dir(&dir)?.0;
        stat.events = self.events(topic, &Selection::all())?.events.len();
        Ok(stat)
    }

    /// Every retained event of `topic`, oldest first, with checkpoints, like
    /// [`Store::events`] with [`Selection::all`] but expired events
    /// included (those that compaction has not reclaimed yet).
    pub fn stored_events(&self, topic: &Topic) -> Result<Vec<Event>> {
        Ok(self.select(topic, &Selection::all(), true)?.events)
    }

    /// Every record still in `topic`'s log, oldest first, each with its
    /// checkpoint: on an ordinary topic the superseded versions of an
    /// event too, until compaction reclaims them. For tools that show what
    /// was, such as the route a poisoning replaced (`kn routes`).
    ///
    /// ```
    /// use kn_journal::{Event, Store, Topic};
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = Store::open(dir.path()).unwrap();
    /// let t = Topic::parse("/what/chat").unwrap();
    /// store.notify(&t, Event::from_pairs([("kn_id", "e1"), ("kn_payload", "first")])).unwrap();
    /// store.notify(&t, Event::from_pairs([("kn_id", "e1"), ("kn_payload", "second")])).unwrap();
    /// let payloads: Vec<_> = store.stored_records(&t).unwrap().iter().map(|e| e.payload().to_vec()).collect();
    /// assert_eq!(payloads, [b"first".to_vec(), b"second".to_vec()]);
    /// ```
    pub fn stored_records(&self, topic: &Topic) -> Result<Vec<Event>> {
        let dir = self.checked_dir(topic)?;
        if !dir.is_dir() {
            return Ok(Vec::new());
        }
        let mut records = Vec::new();
        log::read_backwards(&dir, |r| {
            let mut event = r.event;
            event.set(KN_ROUTE_CHECKPOINT, r.seq.to_string());
            records.push(event);
            true
        })?;
        records.reverse();
        Ok(records)
    }

    /// Stores `event` on `topic` as it was in another store, for imports:
    /// `kn_time_t` and `kn_expires` are kept (a relative `+N` expiry and a
    /// missing `kn_time_t` are read against `stored_at`, seconds since the
    /// epoch), a missing `kn_id` gets a fresh one. Unlike [`Store::post`]
    /// it also writes reserved topics and stale journals, stores expired
    /// events (duplicate suppression must see them), and forwards nothing
    /// along routes. A topic it creates is announced in its parent's
    /// `kn_subtopics` unless an event there already names it (imported
    /// announcements are not repeated). Returns the checkpoint, or `None`
    /// for a duplicate on an ordinary topic (so a rerun stores nothing).
    ///
    /// ```
    /// use kn_journal::{Event, Selection, Store, Topic};
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = Store::open(dir.path()).unwrap();
    /// let t = Topic::parse("/old/news").unwrap();
    /// let e = Event::from_pairs([("kn_id", "n1"), ("kn_time_t", "979273892"), ("kn_payload", "hi")]);
    /// assert!(store.restore(&t, e.clone(), 979273892.0).unwrap().is_some());
    /// assert!(store.restore(&t, e, 979273892.0).unwrap().is_none(), "a rerun is a duplicate");
    /// let got = &store.events(&t, &Selection::all()).unwrap().events[0];
    /// assert_eq!(got.get("kn_time_t"), Some(&b"979273892"[..]));
    /// ```
    pub fn restore(&self, topic: &Topic, mut event: Event, stored_at: f64) -> Result<Option<u64>> {
        let size = event.byte_size();
        if size > self.config.max_event_bytes {
            return Err(Error::new(
                ErrorKind::TooLarge,
                format!("event of {size} bytes for '{topic}' is larger than the maximum of {} bytes", self.config.max_event_bytes),
            ));
        }
        // An unparsable kn_expires is kept as it is (it never expires).
        if let Ok(Some(at)) = event.expires_at(stored_at) {
            if event.get(KN_EXPIRES).is_some_and(|v| v.trim_ascii_start().starts_with(b"+")) {
                event.set(KN_EXPIRES, format_time(at));
            }
        }
        if !event.contains(KN_TIME_T) {
            event.set(KN_TIME_T, format_time(stored_at.floor()));
        }
        if event.id().map(|id| id.is_empty()).unwrap_or(true) {
            event.set(KN_ID, fresh_id());
        }
        event.remove(KN_ROUTE_CHECKPOINT);
        self.restore_topic(topic)?;
        Ok(self.store_event_at(topic, &event, stored_at)?.map(|(seq, _)| seq))
    }

    /// Creates `topic` and its missing ancestors for [`Store::restore`]:
    /// each new one is announced (not forwarded) unless its parent's
    /// `kn_subtopics` already names it.
    fn restore_topic(&self, topic: &Topic) -> Result<()> {
        if self.dir(topic).is_dir() {
            return Ok(());
        }
        self.create_topic_dirs(topic, |parent, segment| {
            let subtopics = parent.subtopics();
            let announced = self.stored_events(&subtopics)?.iter().any(|e| e.payload() == segment.as_bytes());
            if !announced {
                let mut announcement = Event::new();
                announcement.set(KN_ID, fresh_id()).set(KN_PAYLOAD, segment).set(KN_TIME_T, format_time(now().floor()));
                self.store_event(&subtopics, &announcement)?;
            }
            Ok(())
        })?;
        Ok(())
    }

    /// Sets `journal`'s heartbeat to time `at` (for imports: the legacy
    /// store's `.heartbeat` mtime). Creates the journal's directory if
    /// needed. Setting a time is allowed only to the file's owner, so this
    /// is for the store's owner; tunnels use [`Store::heartbeat`].
    pub fn set_heartbeat(&self, journal: &Topic, at: SystemTime) -> Result<()> {
        self.restore_topic(journal)?;
        self.heartbeat(journal)?;
        let path = self.dir(journal).join(HEARTBEAT_FILE);
        fs::File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_modified(at))
            .map_err(|e| Error::io("cannot set heartbeat time of", &path, e))
    }
}
