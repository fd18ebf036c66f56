//! The window log of a source topic, `S/.windows/` (FORMAT.md, "Journals:
//! windows over their sources"; issue 39, docs/design/one-copy.md step 1):
//! its records read back as written, a torn record is left out and
//! repaired by the next append, the per-process cache follows the log,
//! and the directory is never taken for a topic.

use std::fs;
use std::path::{Path, PathBuf};

mod common;
use common::{config, ev, scratch, t};

use kn_journal::internal::windows::{self, Closed, Hop, WindowCache, WindowChange, WINDOWS_DIR};
use kn_journal::internal::logs::SpaceGauge;
use kn_journal::{Config, Store};

fn dir_of(root: &Path, topic: &str) -> PathBuf {
    root.join(topic.trim_start_matches('/'))
}

fn open(route: &str, journal: &str, from: u64, base: i64) -> WindowChange {
    WindowChange::Open {
        route: route.as_bytes().to_vec(),
        journal: journal.to_string(),
        from,
        base,
        hop: Hop { location: b"http://test.example/kn/who/kn_journal".to_vec(), routed_from: b"http://test.example/kn/room".to_vec(), route_id: route.as_bytes().to_vec() },
        filter: (route == "r2").then(|| b"^urgent".to_vec()),
    }
}

fn close(route: &str, journal: &str, until: u64, spent: u64, reason: &str) -> WindowChange {
    WindowChange::Close { route: route.as_bytes().to_vec(), journal: journal.to_string(), until, spent, reason: reason.as_bytes().to_vec() }
}

/// A store with one source topic holding an event; its directory.
fn source() -> (tempfile::TempDir, Config, PathBuf) {
    let dir = scratch("kn-journal-windows-");
    let c = config(dir.path());
    let store = Store::open_with(c.clone()).unwrap();
    store.notify(&t("/room"), ev(&[("kn_payload", "hello")])).unwrap();
    let src = dir_of(dir.path(), "/room");
    (dir, c, src)
}

#[test]
fn window_records_read_back_as_written() {
    let (_dir, c, src) = source();
    let gauge = SpaceGauge::default();
    assert_eq!(windows::read(&src).unwrap(), Default::default(), "no log: no windows");
    let seqs = windows::append(&src, &c, &gauge, &[open("r1", "/a/kn_journal", 1, -1), open("r2", "/b/kn_journal", 1, 4)]).unwrap();
    assert_eq!(seqs, [1, 2]);
    windows::append(&src, &c, &gauge, &[close("r1", "/a/kn_journal", 6, 7, "poisoned: gone"), WindowChange::Converted]).unwrap();
    let found = windows::read(&src).unwrap();
    assert!(found.converted);
    assert_eq!(found.unreadable, 0);
    assert_eq!(found.windows.len(), 2);
    let a = &found.windows[0];
    assert_eq!((a.route.as_slice(), a.journal.as_str(), a.from, a.base, a.opened_at), (&b"r1"[..], "/a/kn_journal", 1, -1, 1));
    assert_eq!(a.hop.routed_from, b"http://test.example/kn/room");
    let closed = a.closed.as_ref().expect("r1 closed");
    assert_eq!((closed.until, closed.spent, closed.reason.as_slice()), (6, 7, &b"poisoned: gone"[..]));
    assert!(a.holds(2) && a.holds(6) && !a.holds(1) && !a.holds(7));
    let b = &found.windows[1];
    assert!(b.is_open() && b.holds(1_000_000));
    assert_eq!((a.filter.as_deref(), b.filter.as_deref()), (None, Some(&b"^urgent"[..])), "a route's filter is kept in its window");
    assert_eq!(found.open_window(b"r2", "/b/kn_journal"), Some(b));
    assert_eq!(found.open_window(b"r1", "/a/kn_journal"), None);
    assert_eq!(found.into_journal("/a/kn_journal").count(), 1);
}

#[test]
fn a_route_made_again_opens_a_second_window_and_a_stray_close_changes_nothing() {
    let (_dir, c, src) = source();
    let gauge = SpaceGauge::default();
    let j = "/a/kn_journal";
    windows::append(&src, &c, &gauge, &[close("r1", j, 3, 3, ""), open("r1", j, 1, 0), close("r1", j, 3, 3, ""), close("r1", j, 9, 9, ""), open("r1", j, 5, 2)])
        .unwrap();
    let found = windows::read(&src).unwrap();
    assert_eq!(found.windows.len(), 2);
    assert_eq!(found.windows[0].closed, Some(Closed { until: 3, spent: 3, reason: Vec::new(), secs: found.windows[0].closed.as_ref().unwrap().secs }));
    assert!(found.windows[1].is_open());
    assert_eq!(found.windows[1].opened_at, 5);
}

#[test]
fn a_torn_window_record_is_left_out_and_repaired_by_the_next_append() {
    let (_dir, c, src) = source();
    let gauge = SpaceGauge::default();
    windows::append(&src, &c, &gauge, &[open("r1", "/a/kn_journal", 1, 0), open("r2", "/b/kn_journal", 1, 0)]).unwrap();
    let log = src.join(WINDOWS_DIR);
    let segment = fs::read_dir(&log)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(".seg-"))
        .expect("a segment");
    let len = fs::metadata(&segment).unwrap().len();
    fs::OpenOptions::new().write(true).open(&segment).unwrap().set_len(len - 5).unwrap();
    let found = windows::read(&src).unwrap();
    assert_eq!(found.windows.iter().map(|w| w.route.clone()).collect::<Vec<_>>(), [b"r1".to_vec()], "the torn second record is not read");
    windows::append(&src, &c, &gauge, &[open("r3", "/c/kn_journal", 2, 0)]).unwrap();
    let found = windows::read(&src).unwrap();
    assert_eq!(found.windows.iter().map(|w| w.route.clone()).collect::<Vec<_>>(), [b"r1".to_vec(), b"r3".to_vec()]);
    assert_eq!(found.windows[1].opened_at, 2, "the repaired log numbers on from its last whole record");
}

#[test]
fn the_cache_follows_the_window_log_and_a_log_made_again() {
    let (_dir, c, src) = source();
    let gauge = SpaceGauge::default();
    let cache = WindowCache::default();
    assert!(cache.get(&src).unwrap().windows.is_empty());
    windows::append(&src, &c, &gauge, &[open("r1", "/a/kn_journal", 1, 0)]).unwrap();
    assert!(cache.get(&src).unwrap().windows[0].is_open());
    windows::append(&src, &c, &gauge, &[close("r1", "/a/kn_journal", 4, 4, "")]).unwrap();
    let got = cache.get(&src).unwrap();
    assert_eq!(got.windows.len(), 1);
    assert!(!got.windows[0].is_open(), "the closing record is read");
    assert_eq!(got, windows::read(&src).unwrap());
    fs::remove_dir_all(src.join(WINDOWS_DIR)).unwrap();
    assert!(cache.get(&src).unwrap().windows.is_empty(), "a removed log has no windows");
    windows::append(&src, &c, &gauge, &[open("r9", "/z/kn_journal", 2, 0)]).unwrap();
    let got = cache.get(&src).unwrap();
    assert_eq!(got.windows.len(), 1);
    assert_eq!(got.windows[0].route, b"r9");
}

#[test]
fn a_window_log_is_never_taken_for_a_topic() {
    let (dir, c, src) = source();
    let gauge = SpaceGauge::default();
    windows::append(&src, &c, &gauge, &[open("r1", "/a/kn_journal", 1, 0)]).unwrap();
    let store = Store::open_with(c).unwrap();
    let topics: Vec<String> = store.topics().unwrap().iter().map(|t| t.as_str().to_string()).collect();
    assert!(topics.contains(&"/room".to_string()), "{topics:?}");
    assert!(!topics.iter().any(|t| t.contains(WINDOWS_DIR)), "{topics:?}");
    for _ in 0..3 {
        store.sweep(10_000).unwrap();
    }
    assert!(dir.path().join("room").join(WINDOWS_DIR).is_dir(), "the sweep left the window log alone");
    assert_eq!(windows::read(&src).unwrap().windows.len(), 1);
    let verify = store.verify().unwrap();
    assert!(verify.problems.is_empty(), "{:?}", verify.problems);
}
