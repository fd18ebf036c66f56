//! The harness of semantics.rs and tunnels.rs: a store in a scratch
//! directory and ways to look at what it holds.
#![allow(dead_code)] // each test file uses its part

use std::fs;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use kn_journal::{Event, Selection, Store, Topic};

use super::{config, ev, scratch, t};
pub fn open() -> (tempfile::TempDir, Store) {
    let dir = scratch("kn-journal-test-");
    let store = Store::open_with(config(&dir.path().join("kn_events"))).unwrap();
    (dir, store)
}

pub fn payloads(events: &[Event]) -> Vec<String> {
    events.iter().map(|e| String::from_utf8_lossy(e.payload()).into_owned()).collect()
}

pub fn all(store: &Store, topic: &Topic) -> Vec<Event> {
    store.events(topic, &Selection::all()).unwrap().events
}

pub fn checkpoint(e: &Event) -> u64 {
    e.get_str("kn_route_checkpoint").expect("a checkpoint").parse().expect("a numeric checkpoint")
}

pub fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

pub fn topic_dir(store: &Store, topic: &Topic) -> PathBuf {
    let mut dir = store.root().to_path_buf();
    for s in topic.segments() {
        dir.push(s);
    }
    dir
}

/// The active (newest) segment file of a topic.
pub fn active_segment(store: &Store, topic: &Topic) -> PathBuf {
    let dir = topic_dir(store, topic);
    let mut segs: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(".seg-"))
        .collect();
    segs.sort();
    segs.pop().expect("a segment")
}

pub fn segment_count(store: &Store, topic: &Topic) -> usize {
    fs::read_dir(topic_dir(store, topic))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with(".seg-"))
        .count()
}

/// Creates a journal with a fresh heartbeat (what an open tunnel does).
pub fn live_journal(store: &Store, name: &str) -> Topic {
    let j = t(name);
    drop(store.tunnel(&j, &Selection::none()).unwrap());
    j
}

pub fn journal_with(store: &Store, name: &str, n: usize) -> Topic {
    let j = live_journal(store, name);
    for i in 0..n {
        store.notify(&j, ev(&[("kn_payload", &format!("e{i}"))])).unwrap();
    }
    j
}
