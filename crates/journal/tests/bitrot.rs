//! Bit rot: bytes flipped inside single records, in the middle and at the
//! ends of a sealed segment and of the active one. Every reader (one-shot
//! reads, tunnels), `verify`, compaction and a rebuilt head lose exactly
//! the damaged records, report each of them, and return every other one.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

mod common;

use common::{ev, scratch, t};
use kn_journal::{Config, Event, Selection, Store, Topic};
use kn_journal::internal::{decode_record, Decoded};

fn config(root: &Path) -> Config {
    let mut c = Config::new(root);
    c.reserve_bytes = 0;
    c.segment_bytes = 2048;
    c
}

fn topic_dir(store: &Store, topic: &Topic) -> PathBuf {
    let mut dir = store.root().to_path_buf();
    for s in topic.segments() {
        dir.push(s);
    }
    dir
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut segs: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(".seg-"))
        .collect();
    segs.sort();
    segs
}

/// The frames of a segment: (offset, length, payload).
fn frames(path: &Path) -> Vec<(u64, usize, String)> {
    let bytes = fs::read(path).unwrap();
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        match decode_record(&bytes[pos..]) {
            Decoded::Record(r, len) => {
                out.push((pos as u64, len, String::from_utf8_lossy(r.event.payload()).into_owned()));
                pos += len;
            }
            other => panic!("{}: bad frame at {pos} before the test damaged it: {other:?}", path.display()),
        }
    }
    out
}

/// Flips every bit of one body byte in the middle of the frame.
fn rot(path: &Path, offset: u64, len: usize) {
    let mut bytes = fs::read(path).unwrap();
    bytes[offset as usize + 8 + (len - 8) / 2] ^= 0xff;
    fs::write(path, bytes).unwrap();
}

fn payloads(events: &[Event]) -> Vec<String> {
    events.iter().map(|e| String::from_utf8_lossy(e.payload()).into_owned()).collect()
}

fn read_all(store: &Store, topic: &Topic) -> Vec<String> {
    payloads(&store.events(topic, &Selection::all()).unwrap().events)
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// Posts 90 events with distinct ids to `topic`; every fourth expired two
/// hours ago (so that compaction wants to rewrite every segment). Returns
/// the payloads a reader sees, in order.
fn populate(store: &Store, topic: &Topic) -> Vec<String> {
    let mut live = Vec::new();
    for i in 0..90 {
        let payload = format!("p{i:03}-{}", "x".repeat(20));
        if i % 4 == 3 {
            let expired = (now() - 7200).to_string();
            store.notify(topic, ev(&[("kn_id", &format!("id{i}")), ("kn_payload", &payload), ("kn_expires", &expired)])).unwrap();
        } else {
            store.notify(topic, ev(&[("kn_id", &format!("id{i}")), ("kn_payload", &payload)])).unwrap();
            live.push(payload);
        }
    }
    live
}

struct Damaged {
    /// (segment, offset) of each damaged frame.
    at: BTreeSet<(PathBuf, u64)>,
    /// Their payloads (live ones: those a reader would have returned).
    lost: BTreeSet<String>,
    /// The damaged sealed segment.
    sealed: PathBuf,
}

/// Damages the first, a middle and the last record of a sealed segment in
/// the middle of the log and of the active segment.
fn damage(dir: &Path) -> Damaged {
    let segs = segments(dir);
    assert!(segs.len() >= 4, "want several segments, got {}", segs.len());
    let sealed = segs[segs.len() / 2].clone();
    let active = segs.last().unwrap().clone();
    let mut at = BTreeSet::new();
    let mut lost = BTreeSet::new();
    for seg in [&sealed, &active] {
        let f = frames(seg);
        assert!(f.len() >= 5, "{}: {} records", seg.display(), f.len());
        for k in [0, f.len() / 2, f.len() - 1] {
            let (offset, len, payload) = &f[k];
            rot(seg, *offset, *len);
            at.insert((seg.clone(), *offset));
            lost.insert(payload.clone());
        }
    }
    Damaged { at, lost, sealed }
}

fn assert_reported(store: &Store, damaged: &Damaged, good: usize, when: &str) {
    let report = store.verify().unwrap();
    let found: BTreeSet<(PathBuf, u64)> = report.problems.iter().map(|p| (p.path.clone(), p.offset)).collect();
    assert_eq!(found, damaged.at, "{when}: verify reports exactly the damaged records: {:?}", report.problems);
    assert_eq!(report.problems.len(), damaged.at.len(), "{when}: {:?}", report.problems);
    assert_eq!(report.records, good, "{when}: every other record is counted");
}

#[test]
fn bit_rot_costs_the_damaged_records_alone() {
    let d = scratch("kn-bitrot-");
    let root = d.path().join("kn_events");
    let store = Store::open_with(config(&root)).unwrap();
    let topic = t("/rot/state");
    // A tunnel opened before anything is posted reads it all afterwards.
    let mut tunnel = store.tunnel(&topic, &Selection::none()).unwrap().tunnel;
    let live = populate(&store, &topic);
    let dir = topic_dir(&store, &topic);
    let records_before = store.verify().unwrap().records;
    let damaged = damage(&dir);
    let expected: Vec<String> = live.iter().filter(|p| !damaged.lost.contains(*p)).cloned().collect();
    assert!(expected.len() < live.len(), "some live records were damaged");

    // Readers: a one-shot read, the N newest, and a tunnel.
    assert_eq!(read_all(&store, &topic), expected, "one-shot read");
    let newest = Selection { max_n: Some(expected.len()), ..Selection::none() };
    assert_eq!(payloads(&store.events(&topic, &newest).unwrap().events), expected, "the N newest");
    let mut tunnelled = Vec::new();
    loop {
        let got = tunnel.next(&store).unwrap();
        if got.is_empty() {
            break;
        }
        tunnelled.extend(payloads(&got));
    }
    assert_eq!(tunnelled, expected, "tunnel");

    // verify: each damaged record, by segment and offset; all others counted.
    let good = records_before - damaged.at.len();
    assert_reported(&store, &damaged, good, "after the damage");

    // Compaction drops the expired records, but leaves a damaged segment
    // as it is (nothing after a bad frame is dropped, nothing repaired).
    let sealed_bytes = fs::read(&damaged.sealed).unwrap();
    let report = store.compact(&topic).unwrap();
    assert!(report.records_after < report.records_before, "compaction dropped the expired records: {report:?}");
    assert_eq!(fs::read(&damaged.sealed).unwrap(), sealed_bytes, "the damaged sealed segment is untouched");
    assert_eq!(read_all(&store, &topic), expected, "read after compaction");
    let report = store.verify().unwrap();
    let found: BTreeSet<(PathBuf, u64)> = report.problems.iter().map(|p| (p.path.clone(), p.offset)).collect();
    assert_eq!(found, damaged.at, "after compaction: {:?}", report.problems);

    // A rebuilt head keeps every segment, seals the damaged active one and
    // goes on in a new segment, with checkpoints above every record.
    drop(store);
    fs::remove_file(dir.join(".head")).unwrap();
    let store = Store::open_with(config(&root)).unwrap();
    let before = store.verify().unwrap().records;
    let r = store.notify(&topic, ev(&[("kn_id", "after"), ("kn_payload", "after-rebuild")])).unwrap();
    assert!(r.writes[0].checkpoint > 90, "checkpoints continue above the damaged records: {}", r.writes[0].checkpoint);
    let mut with_new = expected.clone();
    with_new.push("after-rebuild".to_string());
    assert_eq!(read_all(&store, &topic), with_new, "read after the head was rebuilt");
    let report = store.verify().unwrap();
    let found: BTreeSet<(PathBuf, u64)> = report.problems.iter().map(|p| (p.path.clone(), p.offset)).collect();
    assert_eq!(found, damaged.at, "after the rebuild: {:?}", report.problems);
    assert_eq!(report.records, before + 1);
    // Repair cuts torn tails only: the damaged records stay reported.
    store.repair().unwrap();
    assert_eq!(store.verify().unwrap().problems.len(), damaged.at.len(), "repair does not cut damaged records");
    assert_eq!(read_all(&store, &topic), with_new);
}

/// A rebuilt head used to delete a sealed segment whose first record was
/// bad, with every good record after it.
#[test]
fn a_rebuild_keeps_a_sealed_segment_whose_first_record_is_bad() {
    let d = scratch("kn-bitrot-");
    let root = d.path().join("kn_events");
    let store = Store::open_with(config(&root)).unwrap();
    let topic = t("/rot/first");
    let live = populate(&store, &topic);
    let dir = topic_dir(&store, &topic);
    let sealed = segments(&dir)[1].clone();
    let f = frames(&sealed);
    rot(&sealed, f[0].0, f[0].1);
    drop(store);
    fs::remove_file(dir.join(".head")).unwrap();
    let store = Store::open_with(config(&root)).unwrap();
    store.notify(&topic, ev(&[("kn_id", "after"), ("kn_payload", "after-rebuild")])).unwrap();
    assert!(sealed.exists(), "the segment with a bad first record is kept");
    let mut expected: Vec<String> = live.into_iter().filter(|p| *p != f[0].2).collect();
    expected.push("after-rebuild".to_string());
    assert_eq!(read_all(&store, &topic), expected);
    let report = store.verify().unwrap();
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    assert_eq!((report.problems[0].path.clone(), report.problems[0].offset), (sealed, 0));
}

/// A writer whose head lags behind its active segment (a power cut) used to
/// truncate the segment at a bad frame, with the valid records after it:
/// now it adopts them, keeps the bad frame and seals the segment.
#[test]
fn recovery_adopts_the_records_after_a_bad_frame_and_cuts_nothing() {
    let d = scratch("kn-bitrot-");
    let root = d.path().join("kn_events");
    let mut c = config(&root);
    c.segment_bytes = 1 << 20;
    let topic = t("/rot/recover");
    let dir;
    let old_head;
    {
        let store = Store::open_with(c.clone()).unwrap();
        store.notify(&topic, ev(&[("kn_id", "a0"), ("kn_payload", "a0")])).unwrap();
        dir = topic_dir(&store, &topic);
        old_head = fs::read(dir.join(".head")).unwrap();
        for i in 1..6 {
            store.notify(&topic, ev(&[("kn_id", &format!("a{i}")), ("kn_payload", &format!("a{i}"))])).unwrap();
        }
    }
    let seg = segments(&dir)[0].clone();
    let f = frames(&seg);
    let size = fs::metadata(&seg).unwrap().len();
    rot(&seg, f[2].0, f[2].1);
    // The head as it was after the first post: the next writer scans the
    // rest of the segment as records it does not know yet.
    fs::write(dir.join(".head"), &old_head).unwrap();
    let store = Store::open_with(c).unwrap();
    let r = store.notify(&topic, ev(&[("kn_id", "new"), ("kn_payload", "new")])).unwrap();
    assert_eq!(fs::metadata(&seg).unwrap().len(), size, "nothing was cut");
    assert_eq!(r.writes[0].checkpoint, 7, "the records after the bad frame were adopted");
    assert_eq!(read_all(&store, &topic), ["a0", "a1", "a3", "a4", "a5", "new"]);
    let report = store.verify().unwrap();
    assert_eq!(report.problems.iter().map(|p| (p.path.clone(), p.offset)).collect::<Vec<_>>(), [(seg, f[2].0)]);
    assert_eq!(segments(&dir).len(), 2, "the damaged segment was sealed");
}

/// A torn tail (a frame cut short) is still cut by the next writer, in
/// the same segment; and a valid frame found after a bad one is taken only
/// if its seq is above every seq before it (no record twice or out of
/// order).
#[test]
fn a_torn_tail_is_still_truncated_and_no_record_comes_twice() {
    let d = scratch("kn-bitrot-");
    let root = d.path().join("kn_events");
    let store = Store::open_with(config(&root)).unwrap();
    let topic = t("/rot/torn");
    store.notify(&topic, ev(&[("kn_id", "a"), ("kn_payload", "a")])).unwrap();
    let seg = segments(&topic_dir(&store, &topic)).pop().unwrap();
    let frame_a = fs::read(&seg).unwrap();
    let mut torn = frame_a.clone();
    torn.extend_from_slice(&frame_a[..frame_a.len() / 2]);
    fs::write(&seg, &torn).unwrap();
    assert_eq!(read_all(&store, &topic), ["a"]);
    store.notify(&topic, ev(&[("kn_id", "b"), ("kn_payload", "b")])).unwrap();
    assert_eq!(read_all(&store, &topic), ["a", "b"]);
    assert!(store.verify().unwrap().problems.is_empty(), "{:?}", store.verify().unwrap().problems);
    assert_eq!(segments(&topic_dir(&store, &topic)).len(), 1, "a torn tail does not seal the segment");

    // a, b, a damaged c, then a copy of a: the copy's seq is not above b's.
    let mut bytes = fs::read(&seg).unwrap();
    let ab = bytes.len();
    store.notify(&topic, ev(&[("kn_id", "c"), ("kn_payload", "c")])).unwrap();
    bytes = fs::read(&seg).unwrap();
    bytes[ab + 12] ^= 0x55;
    bytes.extend_from_slice(&frame_a);
    fs::write(&seg, &bytes).unwrap();
    assert_eq!(read_all(&store, &topic), ["a", "b"]);
    let report = store.verify().unwrap();
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    assert_eq!(report.problems[0].offset, ab as u64);
}
