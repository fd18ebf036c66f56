//! Status events held back until new routes' initial populations have
//! been delivered (PROTOCOL.md 3.3: on a static route "the populated
//! events travel the route first and the route's status event comes after
//! them").
//!
//! A server answers a route request first and carries the route's
//! population after (so that a client that reads its tunnel only once it
//! has the reply still gets it). When the request's status events go to
//! a topic (`kn_status_to`, usually the client's own journal), they must
//! arrive there after the population: old clients read their journal up
//! to the status event and take what came before it for the topic's
//! events. So they are written, before the reply, to a file of their own
//! under `.held/`, locked by the request for as long as it lives; once
//! the populations are carried, they are posted and the file removed.
//! Should the process die in between, the next background pass
//! ([`Store::complete_held_statuses`]: `serve` every second, pubsub.cgi
//! with its sweep slices, `kn gc`) finds the file unlocked, carries the
//! populations and posts the statuses (FORMAT.md, "`.heartbeat`, `.names`, temporaries": `.held/`).
//! A crash after the posts and before the removal posts them twice: at
//! least once, never before the population.

use std::fs::{self, File};
use std::io::{ErrorKind as IoKind, Read, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::event::Event;
use crate::ids::fresh_id;
use crate::log;
use crate::record::{self, Decoded};
use crate::topic::Topic;

use super::Store;

/// The directory of held status events, in the store root.
pub(crate) const HELD_DIR: &str = ".held";

const MAGIC: &str = "KNh1";

/// Status events held until the populations of the routes a request made
/// have been carried: [`HeldStatuses::complete`] carries them, then posts
/// the events. Dropped without it, the file stays for the next background
/// pass.
pub struct HeldStatuses {
    path: PathBuf,
    /// Holds the file's lock while this request may still complete it.
    _lock: File,
    to: Topic,
    populations: Vec<Topic>,
    events: Vec<Event>,
}

impl Store {
    /// Holds `events`, status events for topic `to`, until the initial
    /// populations of the routes of `populations` (their source topics)
    /// have been carried: durable once this returns (see the module
    /// documentation). Complete it with [`HeldStatuses::complete`].
    pub fn hold_statuses(&self, to: &Topic, populations: Vec<Topic>, events: Vec<Event>) -> Result<HeldStatuses> {
        let dir = self.config.root.join(HELD_DIR);
        if let Err(e) = fs::create_dir(&dir) {
            if e.kind() != IoKind::AlreadyExists {
                return Err(Error::io("cannot create", &dir, e));
            }
        }
        let id = fresh_id();
        let path = dir.join(format!("{}-{id}", std::process::id()));
        let mut text = format!("{MAGIC}\n{}\n", to.as_str()).into_bytes();
        for topic in &populations {
            text.extend_from_slice(topic.as_str().as_bytes());
            text.push(b'\n');
        }
        text.push(b'\n');
        for (i, event) in events.iter().enumerate() {
            text.extend_from_slice(&record::encode_event(i as u64 + 1, 0, event, None));
        }
        let mut file = log::open_shared(&path, true).map_err(|e| Error::io("cannot create", &path, e))?;
        crate::shared::lock(&file, crate::shared::LockKind::Exclusive, &self.config).map_err(|e| Error::io("cannot lock", &path, e))?;
        file.write_all(&text).map_err(|e| {
            let _ = fs::remove_file(&path);
            Error::io("cannot write", &path, e)
        })?;
        Ok(HeldStatuses { path, _lock: file, to: to.clone(), populations, events })
    }

    /// Completes the held status events that a process left behind (it
    /// died before it could): carries the populations they wait for, then
    /// posts them. Returns how many files it completed. Cheap when there
    /// are none (one directory read).
    pub fn complete_held_statuses(&self) -> Result<usize> {
        let dir = self.config.root.join(HELD_DIR);
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == IoKind::NotFound => return Ok(0),
            Err(e) => return Err(Error::io("cannot read", &dir, e)),
        };
        let mut done = 0;
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(mut file) = File::open(&path) else { continue };
            // Locked: its request is still carrying it.
            if !matches!(crate::shared::try_lock(&file, crate::shared::LockKind::Exclusive, &self.config), Ok(true)) {
                continue;
            }
            let mut bytes = Vec::new();
            if file.read_to_end(&mut bytes).is_err() {
                continue;
            }
            match parse(&bytes) {
                // Torn by a crash while it was written: the request never
                // replied, so nobody waits for these statuses.
                None => {}
                Some((to, populations, events)) => {
                    self.carry(&to, &populations, &events);
                }
            }
            let _ = fs::remove_file(&path);
            done += 1;
        }
        Ok(done)
    }

    fn carry(&self, to: &Topic, populations: &[Topic], events: &[Event]) {
        for topic in populations {
            let _ = self.complete_forwarding(topic);
        }
        for event in events {
            // A stale journal drops it, as the original did.
            let _ = self.notify(to, event.clone());
        }
    }
}

impl HeldStatuses {
    /// Carries the populations, posts the held status events in order,
    /// and removes their file.
    pub fn complete(self, store: &Store) {
        store.carry(&self.to, &self.populations, &self.events);
        let _ = fs::remove_file(&self.path);
    }

    /// Where the events are held (for tests).
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The status topic, the populations' topics and the events of a held
/// file; `None` when it is not whole.
fn parse(bytes: &[u8]) -> Option<(Topic, Vec<Topic>, Vec<Event>)> {
    let header_end = bytes.windows(2).position(|w| w == b"\n\n")? + 2;
    let header = std::str::from_utf8(&bytes[..header_end]).ok()?;
    let mut lines = header.lines();
    if lines.next()? != MAGIC {
        return None;
    }
    let to = Topic::parse(lines.next()?).ok()?;
    let populations = lines.filter(|l| !l.is_empty()).map(Topic::parse).collect::<std::result::Result<Vec<_>, _>>().ok()?;
    let mut rest = &bytes[header_end..];
    let mut events = Vec::new();
    while !rest.is_empty() {
        match record::decode(rest) {
            Decoded::Record(record, len) => {
                events.push(record.event);
                rest = &rest[len..];
            }
            _ => return None,
        }
    }
    Some((to, populations, events))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_file_reads_back_and_a_torn_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let to = Topic::parse("/who/a/kn_journal").unwrap();
        let mut status = Event::new();
        status.set("status", "200 Routed");
        let held = store.hold_statuses(&to, vec![Topic::parse("/what/x").unwrap()], vec![status.clone(), status]).unwrap();
        let bytes = fs::read(held.path()).unwrap();
        let (t, pops, events) = parse(&bytes).unwrap();
        assert_eq!((t, pops.len(), events.len()), (to, 1, 2));
        assert!(parse(&bytes[..bytes.len() - 1]).is_none());
    }
}
