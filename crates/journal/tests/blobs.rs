//! Payloads stored once: a payload longer than `Config::blob_bytes` lives
//! in one `.blobs/` file hard-linked into every topic that holds it
//! (FORMAT.md, "Blobs").

#[allow(dead_code)]
mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use common::{scratch, t};
use kn_journal::{Config, Event, Selection, Store, Topic};

fn payload(n: usize, salt: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt) ^ (i >> 9) as u8).collect()
}

fn big(id: &str, payload: &[u8]) -> Event {
    let mut e = Event::new();
    e.set("kn_id", id).set("kn_payload", payload.to_vec());
    e
}

fn dir_of(store: &Store, topic: &Topic) -> PathBuf {
    topic.segments().fold(store.root().to_path_buf(), |d, s| d.join(s))
}

fn blobs(root: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = match fs::read_dir(root.join(".blobs")) {
        Ok(entries) => entries.map(|e| e.unwrap().path()).collect(),
        Err(_) => Vec::new(),
    };
    out.sort();
    out
}

fn links(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".blob-"))
        .collect();
    out.sort();
    out
}

fn open_journal(store: &Store, journal: &Topic) {
    fs::create_dir_all(dir_of(store, journal)).unwrap();
    store.heartbeat(journal).unwrap();
}

fn store_with(dir: &Path, blob_bytes: usize) -> Store {
    let mut c = Config::new(dir);
    c.blob_bytes = blob_bytes;
    Store::open_with(c).unwrap()
}

#[test]
fn fan_out_stores_one_blob_linked_into_every_topic() {
    let dir = scratch("kn-blobs-fan");
    let store = store_with(dir.path(), 64 << 10);
    let source = t("/fan");
    let n = 20;
    let journals: Vec<Topic> = (0..n).map(|i| t(&format!("/to/j{i}/kn_journal"))).collect();
    for (i, j) in journals.iter().enumerate() {
        open_journal(&store, j);
        let mut params = Event::new();
        params.set("kn_id", format!("r{i}"));
        store.route(&source, j.as_str().as_bytes(), params).unwrap();
    }
    let p = payload(1 << 20, 7);
    let report = store.notify(&source, big("e1", &p)).unwrap();
    assert_eq!(report.writes.len(), n + 1);
    let stored = blobs(dir.path());
    assert_eq!(stored.len(), 1, "one blob: {stored:?}");
    let meta = fs::metadata(&stored[0]).unwrap();
    assert_eq!(meta.len(), p.len() as u64);
    assert_eq!(meta.nlink(), n as u64 + 2, "the .blobs entry, the source and each journal");
    for topic in std::iter::once(&source).chain(&journals) {
        let events = store.events(topic, &Selection::all()).unwrap().events;
        assert_eq!(events.len(), 1, "{topic}");
        assert!(events[0].payload() == &p[..], "{topic}: payload byte-exact");
        assert_eq!(links(&dir_of(&store, topic)).len(), 1, "{topic}");
    }
    // The segments hold references, not the payload.
    let segment_bytes: u64 = fs::read_dir(dir_of(&store, &journals[0]))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().starts_with(".seg-"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert!(segment_bytes < 4096, "journal segments hold {segment_bytes} bytes");
    assert!(store.verify().unwrap().problems.is_empty(), "{:?}", store.verify().unwrap().problems);
    // A tunnel and a later reader see the payload too.
    let start = store.tunnel(&journals[3], &Selection::all()).unwrap();
    assert_eq!(start.initial.events.len(), 1);
    assert!(start.initial.events[0].payload() == &p[..]);
    let q = payload(200 << 10, 9);
    store.notify(&source, big("e2", &q)).unwrap();
    let mut tunnel = start.tunnel;
    let events = tunnel.wait(&store, std::time::Duration::from_secs(5)).unwrap();
    assert_eq!(events.len(), 1);
    assert!(events[0].payload() == &q[..]);
    assert_eq!(blobs(dir.path()).len(), 2);
}

#[test]
fn threshold_boundary() {
    let dir = scratch("kn-blobs-threshold");
    let limit = 1000;
    let store = store_with(dir.path(), limit);
    let topic = t("/edge");
    for (id, len) in [("below", limit - 1), ("at", limit), ("above", limit + 1)] {
        store.notify(&topic, big(id, &payload(len, len as u8))).unwrap();
    }
    let dir_t = dir_of(&store, &topic);
    assert_eq!(links(&dir_t), vec![".blob-0000000000000003".to_string()], "only the payload above the limit");
    assert_eq!(blobs(dir.path()).len(), 1);
    let events = store.events(&topic, &Selection::all()).unwrap().events;
    let lens: Vec<usize> = events.iter().map(|e| e.payload().len()).collect();
    assert_eq!(lens, vec![limit - 1, limit, limit + 1]);
    for e in &events {
        let len = e.payload().len();
        assert!(e.payload() == &payload(len, len as u8)[..]);
    }
    // 0 disables blobs.
    let off = scratch("kn-blobs-off");
    let store = store_with(off.path(), 0);
    store.notify(&topic, big("x", &payload(1 << 20, 1))).unwrap();
    assert!(blobs(off.path()).is_empty());
    assert!(links(&dir_of(&store, &topic)).is_empty());
}

#[test]
fn duplicates_are_still_suppressed() {
    let dir = scratch("kn-blobs-dup");
    let store = store_with(dir.path(), 1024);
    let topic = t("/dup");
    let p = payload(100_000, 3);
    assert!(!store.notify(&topic, big("same", &p)).unwrap().duplicate);
    assert!(store.notify(&topic, big("same", &p)).unwrap().duplicate, "same id, same payload");
    let mut other = p.clone();
    other[50_000] ^= 1;
    assert!(!store.notify(&topic, big("same", &other)).unwrap().duplicate, "one byte differs");
    assert!(store.notify(&topic, big("same", &other)).unwrap().duplicate);
    // Reopened: the head is rebuilt from the log, digests read from the blobs.
    fs::remove_file(dir_of(&store, &topic).join(".head")).unwrap();
    let store = store_with(dir.path(), 1024);
    assert!(store.notify(&topic, big("same", &other)).unwrap().duplicate, "after a rebuild of the head");
    let events = store.events(&topic, &Selection::all()).unwrap().events;
    assert_eq!(events.len(), 1);
    assert!(events[0].payload() == &other[..]);
}

#[test]
fn compaction_unlinks_superseded_blobs_and_sweeps_them() {
    let dir = scratch("kn-blobs-compact");
    let mut c = Config::new(dir.path());
    c.blob_bytes = 1024;
    c.segment_bytes = 4096;
    let store = Store::open_with(c).unwrap();
    let topic = t("/compact");
    let old = payload(10_000, 1);
    let new = payload(10_000, 2);
    store.notify(&topic, big("a", &old)).unwrap();
    for i in 0..100 {
        store.notify(&topic, big(&format!("filler{i}"), b"x")).unwrap();
    }
    store.notify(&topic, big("a", &new)).unwrap();
    for i in 0..100 {
        store.notify(&topic, big(&format!("more{i}"), b"x")).unwrap();
    }
    assert_eq!(blobs(dir.path()).len(), 2);
    let report = store.compact(&topic).unwrap();
    assert_eq!(report.blobs_unlinked, 1, "{report:?}");
    let left = blobs(dir.path());
    assert_eq!(left.len(), 1, "the superseded payload's blob is swept");
    assert_eq!(fs::read(&left[0]).unwrap(), new);
    assert_eq!(links(&dir_of(&store, &topic)).len(), 1);
    let events = store.events(&topic, &Selection::all()).unwrap().events;
    let a = events.iter().find(|e| e.id() == Some(b"a")).unwrap();
    assert!(a.payload() == &new[..]);
    assert!(store.verify().unwrap().problems.is_empty());
}

#[test]
fn journal_retention_unlinks_blobs_of_deleted_segments() {
    let dir = scratch("kn-blobs-retention");
    let mut c = Config::new(dir.path());
    c.blob_bytes = 1024;
    c.segment_bytes = 4096;
    c.journal_max_bytes = 8192;
    let store = Store::open_with(c).unwrap();
    let journal = t("/r/kn_journal");
    open_journal(&store, &journal);
    for i in 0..200 {
        store.notify(&journal, big(&format!("e{i}"), &payload(5000, i as u8))).unwrap();
    }
    let jdir = dir_of(&store, &journal);
    let linked = links(&jdir).len();
    let stored = blobs(dir.path()).len();
    let events = store.events(&journal, &Selection::all()).unwrap().events;
    assert!(events.len() < 200, "retention deleted segments");
    assert_eq!(linked, events.len(), "one link per retained record");
    assert_eq!(stored, events.len(), "blobs of deleted records are swept");
    for e in &events {
        let i: usize = std::str::from_utf8(&e.id().unwrap()[1..]).unwrap().parse().unwrap();
        assert!(e.payload() == &payload(5000, i as u8)[..]);
    }
    assert!(store.verify().unwrap().problems.is_empty());
}

#[test]
fn verify_reports_missing_corrupt_and_orphan_blobs() {
    let dir = scratch("kn-blobs-verify");
    let store = store_with(dir.path(), 1024);
    let topic = t("/v");
    store.notify(&topic, big("a", &payload(5000, 1))).unwrap();
    store.notify(&topic, big("b", &payload(5000, 2))).unwrap();
    store.notify(&topic, big("c", &payload(5000, 3))).unwrap();
    assert!(store.verify().unwrap().problems.is_empty());
    let tdir = dir_of(&store, &topic);
    // Missing: the link of record 1 deleted (and with it the .blobs entry's last other link).
    fs::remove_file(tdir.join(".blob-0000000000000001")).unwrap();
    // Corrupt: one byte of record 2's blob changed (through its link).
    let path2 = tdir.join(".blob-0000000000000002");
    let mut bytes = fs::read(&path2).unwrap();
    bytes[100] ^= 0xff;
    fs::write(&path2, &bytes).unwrap();
    // Orphan link: a link no record refers to.
    fs::hard_link(tdir.join(".blob-0000000000000003"), tdir.join(".blob-0000000000000009")).unwrap();
    let problems = store.verify().unwrap().problems;
    let reasons: Vec<String> = problems.iter().map(|p| format!("{} {}", p.path.display(), p.reason)).collect();
    assert!(reasons.iter().any(|r| r.contains("of record 1 missing")), "{reasons:#?}");
    assert!(reasons.iter().any(|r| r.contains("record 2: content does not match")), "{reasons:#?}");
    assert!(reasons.iter().any(|r| r.contains(".blob-0000000000000009") && r.contains("orphan blob link")), "{reasons:#?}");
    assert!(reasons.iter().any(|r| r.contains(".blobs/") && r.contains("orphan blob")), "the .blobs entry of record 1: {reasons:#?}");
    // Readers skip the records whose payload is lost or damaged.
    let ids: Vec<Vec<u8>> = store.events(&topic, &Selection::all()).unwrap().events.iter().map(|e| e.id().unwrap().to_vec()).collect();
    assert_eq!(ids, vec![b"c".to_vec()]);
    // Repair removes the orphans; the damaged records stay reported.
    store.repair().unwrap();
    let after: Vec<String> = store.verify().unwrap().problems.iter().map(|p| p.reason.clone()).collect();
    assert!(!after.iter().any(|r| r.contains("orphan")), "{after:#?}");
    assert_eq!(after.len(), 2, "{after:#?}");
}

#[test]
fn sync_always_and_modes() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("kn-blobs-sync");
    let mut c = Config::new(dir.path());
    c.blob_bytes = 1024;
    c.sync = kn_journal::SyncPolicy::Always;
    let store = Store::open_with(c).unwrap();
    let source = t("/s");
    let to = t("/s_to");
    store.route(&source, to.as_str().as_bytes(), Event::from_pairs([("kn_id", "r")])).unwrap();
    let p = payload(300_000, 5);
    store.notify(&source, big("a", &p)).unwrap();
    for topic in [&source, &to] {
        let events = store.events(topic, &Selection::all()).unwrap().events;
        assert!(events[0].payload() == &p[..], "{topic}");
    }
    let stored = blobs(dir.path());
    assert_eq!(stored.len(), 1);
    assert_eq!(fs::metadata(&stored[0]).unwrap().nlink(), 3);
    assert_eq!(fs::metadata(&stored[0]).unwrap().permissions().mode() & 0o7777, 0o664);
    assert_eq!(fs::metadata(dir.path().join(".blobs")).unwrap().permissions().mode() & 0o7777, 0o2775);
    assert!(store.verify().unwrap().problems.is_empty());
    // The blob directory is no topic.
    assert!(store.topics().unwrap().iter().all(|t| !t.as_str().contains("blob")));
}
