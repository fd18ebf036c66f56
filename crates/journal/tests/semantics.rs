//! The PubSub rules of the journal (PROTOCOL.md sections 1, 2, 3.3, 3.4
//! and 4), each proved by a test named after it, against a store in a
//! temporary directory.

use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod common;
use common::{config, ev, scratch, t};

use kn_journal::{encode_record, Config, ErrorKind, Event, Record, Resume, Selection, Store, Topic};

// ----- harness ------------------------------------------------------------


fn open() -> (tempfile::TempDir, Store) {
    let dir = scratch("kn-journal-test-");
    let store = Store::open_with(config(&dir.path().join("kn_events"))).unwrap();
    (dir, store)
}

fn payloads(events: &[Event]) -> Vec<String> {
    events.iter().map(|e| String::from_utf8_lossy(e.payload()).into_owned()).collect()
}

fn all(store: &Store, topic: &Topic) -> Vec<Event> {
    store.events(topic, &Selection::all()).unwrap().events
}

fn checkpoint(e: &Event) -> u64 {
    e.get_str("kn_route_checkpoint").expect("a checkpoint").parse().expect("a numeric checkpoint")
}

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

fn topic_dir(store: &Store, topic: &Topic) -> PathBuf {
    let mut dir = store.root().to_path_buf();
    for s in topic.segments() {
        dir.push(s);
    }
    dir
}

/// The active (newest) segment file of a topic.
fn active_segment(store: &Store, topic: &Topic) -> PathBuf {
    let dir = topic_dir(store, topic);
    let mut segs: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(".seg-"))
        .collect();
    segs.sort();
    segs.pop().expect("a segment")
}

fn segment_count(store: &Store, topic: &Topic) -> usize {
    fs::read_dir(topic_dir(store, topic))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with(".seg-"))
        .count()
}

/// Creates a journal with a fresh heartbeat (what an open tunnel does).
fn live_journal(store: &Store, name: &str) -> Topic {
    let j = t(name);
    drop(store.tunnel(&j, &Selection::none()).unwrap());
    j
}

// ----- ordinary topics and journals ----------------------------------------

#[test]
fn reposting_an_id_on_an_ordinary_topic_replaces_the_event_without_merging() {
    let (_d, store) = open();
    let chat = t("/what/chat");
    store.notify(&chat, ev(&[("kn_id", "a"), ("kn_payload", "one"), ("colour", "red")])).unwrap();
    store.notify(&chat, ev(&[("kn_id", "b"), ("kn_payload", "other")])).unwrap();
    let report = store.notify(&chat, ev(&[("kn_id", "a"), ("kn_payload", "two")])).unwrap();
    assert!(!report.duplicate);
    let got = all(&store, &chat);
    assert_eq!(payloads(&got), ["other", "two"]);
    assert_eq!(got[1].get("colour"), None, "old elements are gone, not merged");
}

#[test]
fn duplicate_repost_is_not_stored_and_is_reported() {
    let (_d, store) = open();
    let chat = t("/what/chat");
    let first = store.notify(&chat, ev(&[("kn_id", "a"), ("kn_payload", "x"), ("kn_time_t", "100")])).unwrap();
    assert!(!first.duplicate);
    // Same end-to-end elements; different kn_time_t and hop-by-hop elements.
    let again = ev(&[
        ("kn_id", "a"),
        ("kn_payload", "x"),
        ("kn_time_t", "200"),
        ("kn_route_id", "r9"),
        ("kn_routed_from", "http://elsewhere/kn/x"),
        ("kn_route_checkpoint", "77"),
    ]);
    let report = store.notify(&chat, again).unwrap();
    assert!(report.duplicate, "{report:?}");
    assert!(report.writes.is_empty(), "a duplicate is not stored: {report:?}");
    assert_eq!(report.id, b"a");
    let got = all(&store, &chat);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].get_str("kn_time_t").unwrap(), "100", "the stored event is untouched");
    assert_eq!(checkpoint(&got[0]), first.writes.last().unwrap().checkpoint);
    // Any end-to-end difference is a new version.
    let changed = store.notify(&chat, ev(&[("kn_id", "a"), ("kn_payload", "x"), ("extra", "")])).unwrap();
    assert!(!changed.duplicate);
}

#[test]
fn duplicate_detection_sees_expired_events() {
    let (_d, store) = open();
    let chat = t("/what/chat");
    let past = format!("{}", now() as i64 - 60);
    let e = ev(&[("kn_id", "gone"), ("kn_payload", "late"), ("kn_expires", &past)]);
    let first = store.notify(&chat, e.clone()).unwrap();
    assert!(!first.duplicate);
    assert!(all(&store, &chat).is_empty(), "an expired event is never returned");
    assert!(store.notify(&chat, e.clone()).unwrap().duplicate, "the expired event still suppresses its duplicate");
    // Also after a compaction within the grace period.
    store.compact(&chat).unwrap();
    assert!(store.notify(&chat, e).unwrap().duplicate);
}

#[test]
fn journal_keeps_every_post_even_with_a_repeated_id() {
    let (_d, store) = open();
    let j = live_journal(&store, "/who/anna/kn_journal");
    let e = ev(&[("kn_id", "same"), ("kn_payload", "p"), ("kn_time_t", "5")]);
    for _ in 0..3 {
        let r = store.notify(&j, e.clone()).unwrap();
        assert!(!r.duplicate);
        assert_eq!(r.writes.len(), 1);
    }
    let got = all(&store, &j);
    assert_eq!(got.len(), 3);
    assert!(got.iter().all(|e| e.id() == Some(&b"same"[..])));
}

// ----- normalisation on arrival --------------------------------------------

#[test]
fn kn_expires_is_made_absolute_on_arrival() {
    let (_d, store) = open();
    let topic = t("/exp");
    let cases = [("rel", "+100"), ("frac", "+20.000000"), ("abs", "1996018695"), ("inf", "infinity")];
    let before = now();
    for (id, exp) in cases {
        store.notify(&topic, ev(&[("kn_id", id), ("kn_expires", exp)])).unwrap();
    }
    let after = now();
    let got = all(&store, &topic);
    let stored = |id: &str| got.iter().find(|e| e.id() == Some(id.as_bytes())).unwrap().get_str("kn_expires").unwrap();
    let rel: f64 = stored("rel").parse().expect("absolute number");
    assert!(rel >= before + 100.0 - 1e-3 && rel <= after + 100.0 + 1e-3, "{rel}");
    let frac: f64 = stored("frac").parse().expect("absolute number");
    assert!(frac >= before + 20.0 - 1e-3 && frac <= after + 20.0 + 1e-3, "{frac}");
    assert!(!stored("frac").starts_with('+'));
    assert_eq!(stored("abs"), "1996018695");
    assert_eq!(stored("inf"), "infinity");
}

#[test]
fn expired_events_are_never_returned_by_reads_or_tunnels() {
    let (_d, store) = open();
    let topic = t("/exp/live");
    let past = format!("{}", now() as i64 - 5);
    store.notify(&topic, ev(&[("kn_id", "dead"), ("kn_payload", "dead"), ("kn_expires", &past)])).unwrap();
    store.notify(&topic, ev(&[("kn_id", "soon"), ("kn_payload", "soon"), ("kn_expires", "+0.4")])).unwrap();
    store.notify(&topic, ev(&[("kn_id", "ok"), ("kn_payload", "ok")])).unwrap();
    assert_eq!(payloads(&all(&store, &topic)), ["soon", "ok"]);
    let mut start = store.tunnel(&topic, &Selection::all()).unwrap();
    assert_eq!(payloads(&start.initial.events), ["soon", "ok"]);
    thread::sleep(Duration::from_millis(500));
    assert_eq!(payloads(&all(&store, &topic)), ["ok"]);
    let selection = Selection { max_n: Some(10), ..Selection::none() };
    assert_eq!(payloads(&store.events(&topic, &selection).unwrap().events), ["ok"]);
    let since = Selection { since_checkpoint: Some(b"0".to_vec()), ..Selection::none() };
    assert_eq!(payloads(&store.events(&topic, &since).unwrap().events), ["ok"]);
    assert_eq!(payloads(&store.tunnel(&topic, &Selection::all()).unwrap().initial.events), ["ok"]);
    // A tunnel never passes on an expired event either.
    store.notify(&topic, ev(&[("kn_id", "dead2"), ("kn_payload", "dead2"), ("kn_expires", &past)])).unwrap();
    store.notify(&topic, ev(&[("kn_id", "new"), ("kn_payload", "new")])).unwrap();
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while seen.is_empty() && Instant::now() < deadline {
        seen.extend(start.tunnel.wait(&store, Duration::from_secs(1)).unwrap());
    }
    assert_eq!(payloads(&seen), ["new"]);
}

#[test]
fn kn_time_t_is_kept_if_given_and_set_if_absent() {
    let (_d, store) = open();
    let topic = t("/time");
    store.notify(&topic, ev(&[("kn_id", "given"), ("kn_time_t", "1234567890")])).unwrap();
    let before = now().floor();
    store.notify(&topic, ev(&[("kn_id", "absent")])).unwrap();
    let after = now();
    let got = all(&store, &topic);
    assert_eq!(got[0].get_str("kn_time_t").unwrap(), "1234567890");
    let set: f64 = got[1].get_str("kn_time_t").expect("kn_time_t set on arrival").parse().unwrap();
    assert!(set >= before && set <= after, "{set} not in [{before}, {after}]");
}

#[test]
fn every_stored_event_gets_a_fresh_increasing_checkpoint_replacing_the_clients() {
    let (_d, store) = open();
    let topic = t("/cp");
    let mut last = 0;
    for i in 0..5 {
        let id = format!("e{}", i % 3);
        let r = store
            .notify(&topic, ev(&[("kn_id", &id), ("kn_payload", &i.to_string()), ("kn_route_checkpoint", "999999")]))
            .unwrap();
        let cp = r.writes.last().unwrap().checkpoint;
        assert!(cp > last, "checkpoint {cp} after {last}");
        last = cp;
    }
    let got = all(&store, &topic);
    let cps: Vec<u64> = got.iter().map(checkpoint).collect();
    assert!(cps.windows(2).all(|w| w[0] < w[1]), "{cps:?}");
    assert!(!cps.contains(&999999), "the client's kn_route_checkpoint is replaced");
    assert_eq!(*cps.last().unwrap(), last);
    let j = live_journal(&store, "/cp/kn_journal");
    let a = store.notify(&j, ev(&[("kn_route_checkpoint", "5")])).unwrap().writes[0].checkpoint;
    let b = store.notify(&j, ev(&[("kn_route_checkpoint", "5")])).unwrap().writes[0].checkpoint;
    assert!(b > a);
}

// ----- kn_subtopics ---------------------------------------------------------

#[test]
fn creating_a_topic_announces_each_new_segment_on_its_parents_kn_subtopics() {
    let (_d, store) = open();
    let report = store.notify(&t("/a/b/c"), ev(&[("kn_id", "e1"), ("kn_payload", "hi")])).unwrap();
    let topics: Vec<&str> = report.writes.iter().map(|w| w.topic.as_str()).collect();
    assert_eq!(topics, ["/kn_subtopics", "/a/kn_subtopics", "/a/b/kn_subtopics", "/a/b/c"], "announcements first, then the event");
    assert_eq!(report.writes[3].id, b"e1");
    assert_eq!(payloads(&all(&store, &t("/kn_subtopics"))), ["a"]);
    assert_eq!(payloads(&all(&store, &t("/a/kn_subtopics"))), ["b"], "kn_subtopics itself is never announced");
    assert_eq!(payloads(&all(&store, &t("/a/b/kn_subtopics"))), ["c"]);
    let ids: Vec<Vec<u8>> = report.writes[..3].iter().map(|w| w.id.clone()).collect();
    assert!(ids[0] != ids[1] && ids[1] != ids[2] && ids.iter().all(|i| !i.is_empty()), "fresh ids");
    // A sibling announces only itself; an existing topic nothing.
    let sibling = store.notify(&t("/a/b/d"), ev(&[("kn_payload", "x")])).unwrap();
    assert_eq!(sibling.writes.len(), 2);
    assert_eq!(sibling.writes[0].topic.as_str(), "/a/b/kn_subtopics");
    assert_eq!(payloads(&all(&store, &t("/a/b/kn_subtopics"))), ["c", "d"]);
    let again = store.notify(&t("/a/b/c"), ev(&[("kn_payload", "more")])).unwrap();
    assert_eq!(again.writes.len(), 1);
    assert_eq!(again.writes[0].topic.as_str(), "/a/b/c");
}

#[test]
fn a_topic_directory_deleted_by_hand_is_created_and_announced_again_by_the_next_post() {
    let (_d, store) = open();
    store.notify(&t("/a/b"), ev(&[("kn_payload", "first")])).unwrap();
    // The store keeps the topic's files open; they are unlinked now.
    fs::remove_dir_all(topic_dir(&store, &t("/a/b"))).unwrap();
    let r = store.notify(&t("/a/b"), ev(&[("kn_payload", "second")])).unwrap();
    assert_eq!(r.writes[0].topic.as_str(), "/a/kn_subtopics", "{:?}", r.writes);
    assert_eq!(r.writes[1].checkpoint, 1, "checkpoints restart at 1");
    assert_eq!(payloads(&all(&store, &t("/a/kn_subtopics"))), ["b", "b"]);
    assert_eq!(payloads(&all(&store, &t("/a/b"))), ["second"]);
}

#[test]
fn notify_to_kn_routes_or_kn_subtopics_is_refused() {
    let (_d, store) = open();
    for name in ["/x/kn_routes", "/x/kn_subtopics", "/kn_routes", "/kn_subtopics", "/a/kn_journal/kn_routes"] {
        let err = store.notify(&t(name), ev(&[("kn_payload", "x")])).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ReservedTopic, "{name}");
        assert_eq!(err.kind().status().0, 400);
    }
}

// ----- journals: heartbeat and staleness ------------------------------------

#[test]
fn stale_journals_refuse_notify_and_heartbeat_makes_them_fresh() {
    let (_d, store) = open();
    let j = t("/who/bob/kn_journal");
    assert!(store.is_stale(&j));
    let err = store.notify(&j, ev(&[("kn_payload", "x")])).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Expired, "no heartbeat at all: {err}");
    assert_eq!(err.kind().status(), (404, "Expired"));

    let _start = store.tunnel(&j, &Selection::none()).unwrap();
    assert!(!store.is_stale(&j));
    store.notify(&j, ev(&[("kn_payload", "x")])).unwrap();

    // A heartbeat older than heartbeat_stale (100 s).
    let beat = topic_dir(&store, &j).join(".heartbeat");
    let old = SystemTime::now() - Duration::from_secs(150);
    OpenOptions::new().write(true).open(&beat).unwrap().set_modified(old).unwrap();
    assert!(store.is_stale(&j));
    assert_eq!(store.notify(&j, ev(&[("kn_payload", "y")])).unwrap_err().kind(), ErrorKind::Expired);
    // A heartbeat younger than it is fresh.
    let recent = SystemTime::now() - Duration::from_secs(50);
    OpenOptions::new().write(true).open(&beat).unwrap().set_modified(recent).unwrap();
    assert!(!store.is_stale(&j));

    store.heartbeat(&j).unwrap();
    store.notify(&j, ev(&[("kn_payload", "z")])).unwrap();
    store.expire(&j).unwrap();
    assert!(store.is_stale(&j));
    assert_eq!(store.notify(&j, ev(&[("kn_payload", "w")])).unwrap_err().kind(), ErrorKind::Expired);
    assert_eq!(payloads(&all(&store, &j)), ["x", "z"], "refused posts stored nothing");
    // Ordinary topics are never stale.
    assert!(!store.is_stale(&t("/who/bob")));
}

#[test]
fn too_large_events_are_refused() {
    let dir = scratch("kn-journal-test-");
    let mut c = config(dir.path());
    c.max_event_bytes = 1000;
    let store = Store::open_with(c).unwrap();
    let big = "x".repeat(1001);
    let err = store.notify(&t("/big"), ev(&[("kn_payload", &big)])).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooLarge);
    assert_eq!(err.kind().status().0, 413);
    assert!(store.notify(&t("/big"), ev(&[("kn_payload", "small")])).is_ok());
}

// ----- selections -------------------------------------------------------------

fn journal_with(store: &Store, name: &str, n: usize) -> Topic {
    let j = live_journal(store, name);
    for i in 0..n {
        store.notify(&j, ev(&[("kn_payload", &format!("e{i}"))])).unwrap();
    }
    j
}

#[test]
fn do_max_n_selects_the_most_recent_oldest_first() {
    let (_d, store) = open();
    let j = journal_with(&store, "/s/kn_journal", 5);
    let n = |n| store.events(&j, &Selection { max_n: Some(n), ..Selection::none() }).unwrap().events;
    assert_eq!(payloads(&n(3)), ["e2", "e3", "e4"]);
    assert_eq!(payloads(&n(5)), ["e0", "e1", "e2", "e3", "e4"]);
    assert_eq!(payloads(&n(50)), ["e0", "e1", "e2", "e3", "e4"], "more than exist is not an error");
    assert!(n(0).is_empty());
    assert!(store.events(&j, &Selection::none()).unwrap().events.is_empty(), "nothing asked, nothing sent");
}

#[test]
fn do_max_age_selects_events_stored_in_the_last_n_seconds() {
    let (_d, store) = open();
    let j = journal_with(&store, "/s/kn_journal", 2);
    // Stored times are whole seconds: two seconds apart is always outside
    // a one-second window.
    thread::sleep(Duration::from_millis(2100));
    store.notify(&j, ev(&[("kn_payload", "new1")])).unwrap();
    store.notify(&j, ev(&[("kn_payload", "new2")])).unwrap();
    let age = |a| store.events(&j, &Selection { max_age: Some(a), ..Selection::none() }).unwrap().events;
    assert_eq!(payloads(&age(1.0)), ["new1", "new2"]);
    assert_eq!(payloads(&age(f64::INFINITY)), ["e0", "e1", "new1", "new2"]);
    let both = Selection { max_age: Some(1.0), max_n: Some(1), ..Selection::none() };
    assert_eq!(payloads(&store.events(&j, &both).unwrap().events), ["new2"]);
}

#[test]
fn since_checkpoint_resumes_after_the_matching_event_or_sends_all_when_unknown() {
    let (_d, store) = open();
    let j = journal_with(&store, "/s/kn_journal", 5);
    let got = all(&store, &j);
    let cp2 = got[2].get("kn_route_checkpoint").unwrap().to_vec();
    let since = |c: &[u8]| store.events(&j, &Selection { since_checkpoint: Some(c.to_vec()), ..Selection::none() }).unwrap();
    let exact = since(&cp2);
    assert_eq!(exact.resume, Resume::Exact);
    assert_eq!(payloads(&exact.events), ["e3", "e4"], "the matching event itself is excluded");
    let last = got[4].get("kn_route_checkpoint").unwrap().to_vec();
    assert!(since(&last).events.is_empty());
    for unknown in [&b"999999"[..], b"not-a-checkpoint", b""] {
        let s = since(unknown);
        assert_eq!(s.resume, Resume::Unknown, "{:?}", String::from_utf8_lossy(unknown));
        assert_eq!(payloads(&s.events), ["e0", "e1", "e2", "e3", "e4"]);
    }
    assert_eq!(store.events(&j, &Selection::all()).unwrap().resume, Resume::NotAsked);
}

/// A tunnel started at a checkpoint (a client reconnecting with
/// `Last-Event-ID`) selects what a read from it selects, exact or not,
/// its end found once for both.
#[test]
fn a_tunnel_resumes_where_a_read_resumes() {
    let (_d, store) = open();
    let j = journal_with(&store, "/r/kn_journal", 5);
    let last = checkpoint(all(&store, &j).last().unwrap());
    let mut asked: Vec<Vec<u8>> = (0..=last + 1).map(|c| c.to_string().into_bytes()).collect();
    asked.extend([b"999999".to_vec(), b"not-a-checkpoint".to_vec(), Vec::new()]);
    for c in asked {
        let since = Selection { since_checkpoint: Some(c.clone()), ..Selection::none() };
        let read = store.events(&j, &since).unwrap();
        let started = store.tunnel(&j, &since).unwrap().initial;
        assert_eq!(started.resume, read.resume, "{:?}", String::from_utf8_lossy(&c));
        assert_eq!(started.events, read.events, "{:?}", String::from_utf8_lossy(&c));
    }
}

/// A resume from any checkpoint of a topic of many segments, ids posted
/// again among them: exactly the current events after it, as a full
/// selection has them (the records up to the checkpoint are skipped
/// undecoded, and older segments not read).
#[test]
fn since_checkpoint_across_segments_is_the_full_selection_after_it() {
    let dir = scratch("kn-journal-test-");
    let mut c = config(&dir.path().join("kn_events"));
    c.segment_bytes = 700;
    let store = Store::open_with(c).unwrap();
    for (name, ids) in [("/many/kn_journal", 0), ("/many/state", 7)] {
        let topic = if ids == 0 { live_journal(&store, name) } else { t(name) };
        for i in 0..60 {
            let id = if ids > 0 { format!("id{}", i % ids) } else { format!("e{i}") };
            store.notify(&topic, ev(&[("kn_id", &id), ("kn_payload", &format!("p{i}"))])).unwrap();
        }
        assert!(segment_count(&store, &topic) > 5, "{name}: {} segments", segment_count(&store, &topic));
        let full = all(&store, &topic);
        let last = checkpoint(full.last().unwrap());
        for after in 0..=last {
            let got = store.events(&topic, &Selection { since_checkpoint: Some(after.to_string().into_bytes()), ..Selection::none() }).unwrap();
            let expected: Vec<&Event> = full.iter().filter(|e| checkpoint(e) > after).collect();
            assert_eq!(got.events.iter().collect::<Vec<_>>(), expected, "{name}: since {after}");
        }
    }
}

#[test]
fn ordinary_topic_selection_is_the_current_event_per_id_ordered_by_last_store() {
    let (_d, store) = open();
    let topic = t("/state");
    for (id, p) in [("a", "a1"), ("b", "b1"), ("c", "c1"), ("a", "a2"), ("b", "b1")] {
        store.notify(&topic, ev(&[("kn_id", id), ("kn_payload", p)])).unwrap();
    }
    // The repeat of b is a duplicate and does not move it.
    assert_eq!(payloads(&all(&store, &topic)), ["b1", "c1", "a2"]);
    let n2 = Selection { max_n: Some(2), ..Selection::none() };
    assert_eq!(payloads(&store.events(&topic, &n2).unwrap().events), ["c1", "a2"]);
    let first = all(&store, &topic);
    let cp_b = first[0].get("kn_route_checkpoint").unwrap().to_vec();
    let since = Selection { since_checkpoint: Some(cp_b), ..Selection::none() };
    assert_eq!(payloads(&store.events(&topic, &since).unwrap().events), ["c1", "a2"]);
    store.notify(&topic, ev(&[("kn_id", "c"), ("kn_payload", "c2")])).unwrap();
    assert_eq!(payloads(&all(&store, &topic)), ["b1", "a2", "c2"]);
}

// ----- tunnels --------------------------------------------------------------

#[test]
fn tunnel_sends_the_initial_selection_then_events_posted_by_another_thread() {
    let (_d, store) = open();
    let store = Arc::new(store);
    let j = journal_with(&store, "/who/t/kn_journal", 3);
    let mut start = store.tunnel(&j, &Selection { max_n: Some(2), ..Selection::none() }).unwrap();
    assert_eq!(payloads(&start.initial.events), ["e1", "e2"]);
    let poster = {
        let store = store.clone();
        let j = j.clone();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(100));
            for i in 0..3 {
                store.notify(&j, ev(&[("kn_payload", &format!("live{i}"))])).unwrap();
            }
        })
    };
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.len() < 3 && Instant::now() < deadline {
        seen.extend(start.tunnel.wait(&store, Duration::from_secs(2)).unwrap());
    }
    poster.join().unwrap();
    assert_eq!(payloads(&seen), ["live0", "live1", "live2"]);
    let cps: Vec<u64> = seen.iter().map(checkpoint).collect();
    assert!(cps.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(start.tunnel.checkpoint(), cps[2]);
}

/// Re-executes this test binary so that [`child_process_role`] acts as
/// `role` in another process.
fn child(role: &str, envs: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["child_process_role", "--exact", "--nocapture", "--test-threads=1"]);
    cmd.env("KN_SEM_CHILD", role);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd
}

/// Not a test of its own: the body of the child processes that other tests
/// start. Does nothing unless `KN_SEM_CHILD` is set.
#[test]
fn child_process_role() {
    let Ok(role) = std::env::var("KN_SEM_CHILD") else { return };
    match role.as_str() {
        "poster" => {
            let root = std::env::var("KN_SEM_ROOT").unwrap();
            let store = Store::open_with(config(Path::new(&root))).unwrap();
            let topic = t(&std::env::var("KN_SEM_TOPIC").unwrap());
            thread::sleep(Duration::from_millis(300));
            let micros = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros();
            store.notify(&topic, ev(&[("kn_payload", &micros.to_string()), ("from", "child")])).unwrap();
        }
        "relative_root" => {
            // The default root, ./kn_events, is relative: tunnels must still
            // be woken by change notification, not by polling.
            let dir = std::env::var("KN_SEM_ROOT").unwrap();
            std::env::set_current_dir(&dir).unwrap();
            let mut c = config(Path::new("kn_events"));
            c.poll_interval = Duration::from_secs(30);
            let store = Arc::new(Store::open_with(c).unwrap());
            let j = live_journal(&store, "/rel/kn_journal");
            let mut start = store.tunnel(&j, &Selection::none()).unwrap();
            assert!(start.tunnel.is_notified());
            let poster = {
                let (store, j) = (store.clone(), j.clone());
                thread::spawn(move || {
                    thread::sleep(Duration::from_millis(200));
                    store.notify(&j, ev(&[("kn_payload", "woken")])).unwrap();
                })
            };
            let begun = Instant::now();
            let got = start.tunnel.wait(&store, Duration::from_secs(5)).unwrap();
            poster.join().unwrap();
            let waited = begun.elapsed();
            println!("relative root: woken after {waited:?}");
            assert_eq!(payloads(&got), ["woken"]);
            // A wait that runs to its 5 s timeout was never woken: only the
            // final re-read found the event.
            assert!(waited < Duration::from_secs(4), "not woken by the change notifier: waited {waited:?}");
            println!("KN_SEM_CHILD_OK");
        }
        "from_env" => {
            let c = Config::from_env().unwrap();
            assert_eq!(c.root, PathBuf::from("/tmp/kn-sem-env-root"));
            assert_eq!(c.reserve_bytes, 12345);
            assert_eq!(c.sync, kn_journal::SyncPolicy::Always);
            assert_eq!(c.max_event_bytes, 777);
            assert_eq!(c.segment_bytes, 65536);
            assert_eq!(c.journal_max_age, Duration::from_secs(60));
            assert_eq!(c.journal_max_bytes, 1 << 20);
            assert_eq!(c.expired_grace, Duration::from_secs(9));
            assert_eq!(c.poll_interval, Duration::from_millis(40));
            assert_eq!(c.server_url.as_deref(), Some("http://env.example/cgi-bin/pubsub.cgi"));
            assert_eq!(c.outbound, kn_journal::OutboundPolicy::AllowAll);
            assert_eq!(c.remote_timeout, Duration::from_millis(1500));
            assert_eq!(c.max_forwards, 42);
            assert_eq!(c.forward_inline, 7);
            assert_eq!(c.group_commit, 5);
            assert_eq!((c.max_topic_depth, c.max_topic_bytes, c.max_selected, c.max_form_elements), (7, 300, 99, 55));
            println!("KN_SEM_CHILD_OK");
        }
        "from_env_bad" => {
            let err = Config::from_env().unwrap_err();
            assert_eq!(err.kind(), ErrorKind::BadRequest);
            assert!(err.to_string().contains("KN_MAX_EVENT_BYTES"), "{err}");
            println!("KN_SEM_CHILD_OK");
        }
        other => panic!("unknown child role {other}"),
    }
}

#[test]
fn tunnel_wakes_for_an_event_posted_by_another_process() {
    let (dir, store) = open();
    let j = live_journal(&store, "/who/proc/kn_journal");
    let mut start = store.tunnel(&j, &Selection::none()).unwrap();
    let root = dir.path().join("kn_events");
    let kid = child("poster", &[("KN_SEM_ROOT", root.to_str().unwrap()), ("KN_SEM_TOPIC", j.as_str())])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.is_empty() && Instant::now() < deadline {
        seen.extend(start.tunnel.wait(&store, Duration::from_secs(1)).unwrap());
    }
    let arrived = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros();
    let out = kid.wait_with_output().unwrap();
    assert!(out.status.success(), "the poster failed: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].get_str("from").as_deref(), Some("child"));
    let posted: u128 = seen[0].get_str("kn_payload").unwrap().parse().unwrap();
    println!(
        "cross-process tunnel wake latency: {} µs (notified: {})",
        arrived.saturating_sub(posted),
        start.tunnel.is_notified()
    );
}

/// A tunnel's own process wakes it directly for its own appends, and its
/// notifier then skips the change events of those writes; the appends of
/// another store (as good as another process: it has its own notifier)
/// interleaved with them must still wake it. Polling is set to a minute,
/// so only a wakeup can bring each round's events before the 10 s wait
/// ends (the re-read at its end would find them too, but late).
#[test]
fn own_appends_woken_directly_never_hide_another_writers_appends() {
    let dir = scratch("kn-journal-test-");
    let root = dir.path().join("kn_events");
    let mut c = config(&root);
    c.poll_interval = Duration::from_secs(60);
    let own = std::sync::Arc::new(Store::open_with(c.clone()).unwrap());
    let other = std::sync::Arc::new(Store::open_with(c).unwrap());
    let j = live_journal(&own, "/who/both/kn_journal");
    let mut start = own.tunnel(&j, &Selection::none()).unwrap();
    assert!(start.tunnel.is_notified(), "no change notification here: this test needs inotify");
    for round in 0..30 {
        // Both orders: the other store's write just before ours (its event
        // may be the one our count takes off) and just after; the last
        // round the other store's alone. Written while the tunnel waits.
        let (first, second) = if round % 2 == 0 { (own.clone(), other.clone()) } else { (other.clone(), own.clone()) };
        let topic = j.clone();
        let writer = thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            first.notify(&topic, ev(&[("kn_payload", &format!("{round}a"))])).unwrap();
            if round < 29 {
                second.notify(&topic, ev(&[("kn_payload", &format!("{round}b"))])).unwrap();
            }
        });
        let want: Vec<String> = if round < 29 { vec![format!("{round}a"), format!("{round}b")] } else { vec![format!("{round}a")] };
        let begun = Instant::now();
        let mut seen = Vec::new();
        while seen.len() < want.len() && begun.elapsed() < Duration::from_secs(10) {
            seen.extend(start.tunnel.wait(&own, Duration::from_secs(10)).unwrap());
        }
        writer.join().unwrap();
        assert_eq!(payloads(&seen), want, "round {round}");
        assert!(begun.elapsed() < Duration::from_secs(5), "round {round}: no wakeup came, only the final re-read");
    }
}

/// Follows `tunnel` the way `pubsub-cgi serve` follows one (arm, read,
/// wait only when caught up) until it has delivered `n` events. Every
/// wait must end in a wakeup within 10 s (the tests set polling to a
/// minute): an event left behind fails the test.
fn follow(tunnel: &mut kn_journal::Tunnel, store: &Store, n: usize) -> Vec<Event> {
    use event_listener::Listener as _;
    let mut seen = Vec::new();
    while seen.len() < n {
        let listener = tunnel.listen();
        let got = tunnel.next(store).unwrap();
        let read_something = !got.is_empty();
        seen.extend(got);
        if (read_something && !tunnel.caught_up()) || seen.len() == n {
            continue;
        }
        let woken = listener.wait_timeout(Duration::from_secs(10)).is_some();
        assert!(woken, "no wakeup within 10 s after {} of {n} events: an event was left behind", seen.len());
    }
    seen
}

/// A tunnel that has read to the end of its segment waits for the next
/// wakeup without looking for a newer segment by name as long as its
/// notifier saw no segment appear (see `Subscription::segments_created`).
/// Followed the way `pubsub-cgi serve` follows it (arm, read, wait only
/// when caught up) across segment rolls made by its own store and by
/// another one (as good as another process), every event must come with
/// a wakeup: polling is set to a minute and each wait to 10 s.
#[test]
fn a_caught_up_tunnel_follows_segment_rolls_by_wakeups_alone() {
    let dir = scratch("kn-journal-test-");
    let root = dir.path().join("kn_events");
    let mut c = config(&root);
    c.poll_interval = Duration::from_secs(60);
    c.segment_bytes = 4096;
    let own = Arc::new(Store::open_with(c.clone()).unwrap());
    let other = Arc::new(Store::open_with(c).unwrap());
    let j = live_journal(&own, "/who/rolls/kn_journal");
    let mut start = own.tunnel(&j, &Selection::none()).unwrap();
    assert!(start.tunnel.is_notified(), "no change notification here: this test needs inotify");
    const N: usize = 120;
    let (writer_own, writer_other, topic) = (own.clone(), other.clone(), j.clone());
    let writer = thread::spawn(move || {
        let pad = "x".repeat(900);
        for i in 0..N {
            // Several events per segment, each store rolling some of them.
            let store = if (i / 3) % 2 == 0 { &writer_own } else { &writer_other };
            store.notify(&topic, ev(&[("kn_payload", &format!("{i}")), ("pad", &pad)])).unwrap();
            if i % 4 == 0 {
                thread::sleep(Duration::from_millis(2));
            }
        }
    });
    let seen = follow(&mut start.tunnel, &own, N);
    writer.join().unwrap();
    assert_eq!(payloads(&seen), (0..N).map(|i| i.to_string()).collect::<Vec<_>>());
    let segments = fs::read_dir(root.join("who/rolls/kn_journal")).unwrap().filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with(".seg-")).count();
    assert!(segments > 10, "the journal should have rolled many times: {segments} segments");
}

/// A caught-up tunnel takes what its own process appended from memory, as
/// written (`Hub::appended` hands it over), instead of reading it back:
/// what it delivers must be exactly what a reader of the file returns,
/// element for element and checkpoint for checkpoint, whoever wrote (this
/// store, or another one, as good as another process, whose appends come
/// through the notifier), whatever the record (small, too large to hand
/// over, a payload stored as a blob), across segment rolls.
#[test]
fn a_tunnel_delivers_its_own_process_appends_exactly_as_the_file_holds_them() {
    let dir = scratch("kn-journal-test-");
    let root = dir.path().join("kn_events");
    let mut c = config(&root);
    c.poll_interval = Duration::from_secs(60);
    c.segment_bytes = 16 << 10;
    c.blob_bytes = 32 << 10;
    let own = Arc::new(Store::open_with(c.clone()).unwrap());
    let other = Arc::new(Store::open_with(c).unwrap());
    let j = live_journal(&own, "/who/handed/kn_journal");
    let mut start = own.tunnel(&j, &Selection::none()).unwrap();
    assert!(start.tunnel.is_notified(), "no change notification here: this test needs inotify");
    const N: usize = 150;
    let payload = |i: usize| match i % 10 {
        4 => "L".repeat(20_000),  // a frame above what is handed over
        7 => "B".repeat(40_000),  // a blob: never handed over
        _ => format!("{i}: caf\u{e9} \u{0}\n\"quoted\""),
    };
    let (writer_own, writer_other, topic) = (own.clone(), other.clone(), j.clone());
    let writer = thread::spawn(move || {
        for i in 0..N {
            let store = if i % 6 == 5 { &writer_other } else { &writer_own };
            let mut e = ev(&[("n", &i.to_string()), ("kn_expires", "+3600")]);
            e.set("kn_payload", payload(i));
            store.notify(&topic, e).unwrap();
            if i % 8 == 0 {
                thread::sleep(Duration::from_millis(2));
            }
        }
    });
    let seen = follow(&mut start.tunnel, &own, N);
    writer.join().unwrap();
    let file = all(&own, &j);
    assert_eq!(file.len(), N);
    assert_eq!(seen, file, "the tunnel delivers what the file holds");
    let segments = segment_count(&own, &j);
    assert!(segments > 5, "the journal should have rolled: {segments} segments");
}

#[test]
fn tunnel_wait_falls_back_to_polling_when_no_change_notification_comes() {
    let dir = scratch("kn-journal-test-");
    let mut c = config(&dir.path().join("kn_events"));
    c.poll_interval = Duration::from_millis(200);
    let store = Store::open_with(c).unwrap();
    let j = journal_with(&store, "/who/poll/kn_journal", 1);
    let mut start = store.tunnel(&j, &Selection::none()).unwrap();
    // Append a valid record through a hard link whose name is not a
    // segment's: the change notifier reports the write under that name,
    // which it ignores, so only polling can find the record.
    let link = topic_dir(&store, &j).join(".not-a-segment");
    fs::hard_link(active_segment(&store, &j), &link).unwrap();
    let seq = start.tunnel.checkpoint() + 1;
    let event = ev(&[("kn_id", "polled"), ("kn_payload", "found by polling"), ("kn_time_t", "1")]);
    let frame = encode_record(&Record { seq, stored_secs: now() as u64, event, blob: None });
    let appender = thread::spawn(move || {
        thread::sleep(Duration::from_millis(300));
        OpenOptions::new().append(true).open(&link).unwrap().write_all(&frame).unwrap();
        Instant::now()
    });
    let begun = Instant::now();
    let seen = start.tunnel.wait(&store, Duration::from_secs(5)).unwrap();
    let waited = begun.elapsed();
    let appended = appender.join().unwrap();
    println!("found by polling {:?} after the append (waited {waited:?})", Instant::now().saturating_duration_since(appended));
    assert_eq!(payloads(&seen), ["found by polling"]);
    // Returning at the 5 s timeout would mean only the final re-read found it.
    assert!(waited < Duration::from_secs(4), "the waiting tunnel never polled: {waited:?}");
    assert_eq!(checkpoint(&seen[0]), seq);
    // The next writer adopts the record and continues after it.
    let r = store.notify(&j, ev(&[("kn_payload", "after")])).unwrap();
    assert_eq!(r.writes[0].checkpoint, seq + 1);
    assert_eq!(payloads(&all(&store, &j)), ["e0", "found by polling", "after"]);
}

#[test]
fn tunnel_on_a_store_with_a_relative_root_is_woken_by_change_notification() {
    let dir = scratch("kn-journal-test-");
    let out = child("relative_root", &[("KN_SEM_ROOT", dir.path().to_str().unwrap())]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("KN_SEM_CHILD_OK"), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
}

/// CPU time (user + system) of the calling thread.
fn thread_cpu() -> Duration {
    let stat = fs::read_to_string("/proc/thread-self/stat").unwrap();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap().split_whitespace().collect();
    // Fields 14 and 15 of stat(5), counted after the command name.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

#[test]
fn an_idle_waiting_tunnel_sleeps_instead_of_spinning() {
    let dir = scratch("kn-journal-test-");
    let mut c = config(&dir.path().join("kn_events"));
    c.poll_interval = Duration::from_secs(30);
    let store = Store::open_with(c).unwrap();
    let j = journal_with(&store, "/who/idle/kn_journal", 3);
    let mut start = store.tunnel(&j, &Selection::none()).unwrap();
    assert!(start.tunnel.is_notified());
    let cpu = thread_cpu();
    let begun = Instant::now();
    let got = start.tunnel.wait(&store, Duration::from_millis(1500)).unwrap();
    let (wall, used) = (begun.elapsed(), thread_cpu() - cpu);
    println!("idle wait: {used:?} CPU in {wall:?}");
    assert!(got.is_empty());
    // Reading the log must not count as an append: otherwise every read
    // wakes the reader, which reads again, forever.
    assert!(used < wall / 4, "an idle tunnel burnt {used:?} of CPU in {wall:?}");
}

// ----- crash safety -----------------------------------------------------------

#[test]
fn torn_tail_is_ignored_by_readers_and_truncated_by_the_next_post() {
    let (_d, store) = open();
    let j = journal_with(&store, "/torn/kn_journal", 3);
    let topic = t("/torn/state");
    store.notify(&topic, ev(&[("kn_id", "a"), ("kn_payload", "a1")])).unwrap();
    let mut start = store.tunnel(&j, &Selection::none()).unwrap();
    assert!(store.verify().unwrap().problems.is_empty());
    for target in [&j, &topic] {
        let seg = active_segment(&store, target);
        // A header promising 200 bytes, then a partial body: a torn write.
        let mut garbage = 200u32.to_le_bytes().to_vec();
        garbage.extend_from_slice(b"\xde\xad\xbe\xefhalf a rec");
        OpenOptions::new().append(true).open(&seg).unwrap().write_all(&garbage).unwrap();
    }
    let report = store.verify().unwrap();
    assert_eq!(report.problems.len(), 2, "{:?}", report.problems);
    assert_eq!(payloads(&all(&store, &j)), ["e0", "e1", "e2"]);
    assert_eq!(payloads(&all(&store, &topic)), ["a1"]);
    assert!(start.tunnel.next(&store).unwrap().is_empty());

    store.notify(&j, ev(&[("kn_payload", "e3")])).unwrap();
    store.notify(&topic, ev(&[("kn_id", "a"), ("kn_payload", "a2")])).unwrap();
    assert!(store.verify().unwrap().problems.is_empty());
    assert_eq!(payloads(&all(&store, &j)), ["e0", "e1", "e2", "e3"]);
    assert_eq!(payloads(&all(&store, &topic)), ["a2"]);
    assert_eq!(payloads(&start.tunnel.next(&store).unwrap()), ["e3"]);

    // repair() does the same without a post.
    let seg = active_segment(&store, &topic);
    OpenOptions::new().append(true).open(&seg).unwrap().write_all(b"\x05\x00\x00\x00junk").unwrap();
    assert_eq!(store.verify().unwrap().problems.len(), 1);
    assert_eq!(store.repair().unwrap(), 1);
    assert!(store.verify().unwrap().problems.is_empty());
    assert_eq!(payloads(&all(&store, &topic)), ["a2"]);
}

// ----- compaction and retention ---------------------------------------------

fn small_segments(root: &Path) -> Store {
    let mut c = config(root);
    c.segment_bytes = 8 * 1024;
    Store::open_with(c).unwrap()
}

#[test]
fn compaction_keeps_the_events_and_drops_superseded_records() {
    let dir = scratch("kn-journal-test-");
    let store = small_segments(dir.path());
    let topic = t("/compact/me");
    for i in 0..5000 {
        store.notify(&topic, ev(&[("kn_id", &format!("id{}", i % 10)), ("kn_payload", &format!("v{i}"))])).unwrap();
    }
    let before = all(&store, &topic);
    assert_eq!(before.len(), 10);
    assert_eq!(payloads(&before), (4990..5000).map(|i| format!("v{i}")).collect::<Vec<_>>());
    let report = store.compact(&topic).unwrap();
    println!("{report:?}");
    assert!(report.records_after < report.records_before, "{report:?}");
    assert!(report.records_after < 1000, "{report:?}");
    assert_eq!(all(&store, &topic), before, "events identical before and after");
    let n3 = Selection { max_n: Some(3), ..Selection::none() };
    assert_eq!(store.events(&topic, &n3).unwrap().events, before[7..].to_vec());
    // The duplicate index survives: the current event is still a duplicate,
    // and checkpoints keep increasing.
    let current = before[4].clone();
    assert!(store.notify(&topic, current).unwrap().duplicate);
    let r = store.notify(&topic, ev(&[("kn_id", "id0"), ("kn_payload", "fresh")])).unwrap();
    assert!(r.writes[0].checkpoint > checkpoint(&before[9]));
    assert!(store.verify().unwrap().problems.is_empty());
}

#[test]
fn readers_are_unaffected_by_a_concurrent_compaction() {
    let dir = scratch("kn-journal-test-");
    let store = Arc::new(small_segments(dir.path()));
    let topic = t("/compact/busy");
    for i in 0..1500 {
        store.notify(&topic, ev(&[("kn_id", &format!("id{}", i % 10)), ("kn_payload", &format!("v{i}"))])).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for kind in 0..3 {
        let (store, topic, stop) = (store.clone(), topic.clone(), stop.clone());
        readers.push(thread::spawn(move || {
            let mut reads = 0;
            let mut tunnel = store.tunnel(&topic, &Selection::none()).unwrap().tunnel;
            let mut last_cp = tunnel.checkpoint();
            while !stop.load(Ordering::Relaxed) || reads < 20 {
                let selection = match kind {
                    0 => Selection::all(),
                    1 => Selection { since_checkpoint: Some(b"1".to_vec()), ..Selection::none() },
                    _ => Selection { max_n: Some(10), ..Selection::none() },
                };
                let got = store.events(&topic, &selection).unwrap().events;
                let mut ids: Vec<_> = got.iter().map(|e| e.id().unwrap().to_vec()).collect();
                let cps: Vec<u64> = got.iter().map(checkpoint).collect();
                assert!(cps.windows(2).all(|w| w[0] < w[1]), "{cps:?}");
                ids.sort();
                ids.dedup();
                assert_eq!(ids.len(), 10, "reader {kind} saw {} ids: {:?}", ids.len(), payloads(&got));
                for e in tunnel.next(&store).unwrap() {
                    let cp = checkpoint(&e);
                    assert!(cp > last_cp, "tunnel went back from {last_cp} to {cp}");
                    last_cp = cp;
                }
                reads += 1;
            }
            reads
        }));
    }
    let writer = {
        let (store, topic, stop) = (store.clone(), topic.clone(), stop.clone());
        thread::spawn(move || {
            let mut i = 1500;
            while !stop.load(Ordering::Relaxed) {
                store.notify(&topic, ev(&[("kn_id", &format!("id{}", i % 10)), ("kn_payload", &format!("v{i}"))])).unwrap();
                i += 1;
            }
        })
    };
    for _ in 0..15 {
        store.compact(&topic).unwrap();
        thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    for r in readers {
        let reads = r.join().unwrap();
        assert!(reads >= 20);
    }
    let settled = all(&store, &topic);
    store.compact(&topic).unwrap();
    assert_eq!(all(&store, &topic), settled);
}

#[test]
fn journal_retention_deletes_old_segments_and_reports_a_gap() {
    let dir = scratch("kn-journal-test-");
    let mut c = config(dir.path());
    c.segment_bytes = 4096;
    c.journal_max_bytes = 16 * 1024;
    let store = Store::open_with(c).unwrap();
    let j = live_journal(&store, "/ret/kn_journal");
    let body = "b".repeat(200);
    let mut first_cp = None;
    for i in 0..400 {
        let r = store.notify(&j, ev(&[("kn_payload", &format!("{i}:{body}"))])).unwrap();
        first_cp.get_or_insert(r.writes[0].checkpoint);
    }
    let segs = segment_count(&store, &j);
    let bytes: u64 = fs::read_dir(topic_dir(&store, &j))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().starts_with(".seg-"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert!(bytes <= 16 * 1024 + 4096, "{bytes} bytes in {segs} segments");
    let got = all(&store, &j);
    assert!(!got.is_empty() && got.len() < 400, "{}", got.len());
    assert!(payloads(&got).last().unwrap().starts_with("399:"));
    let cps: Vec<u64> = got.iter().map(checkpoint).collect();
    assert!(cps.windows(2).all(|w| w[1] == w[0] + 1), "retained events are contiguous");
    let old = first_cp.unwrap().to_string().into_bytes();
    let gap = store.events(&j, &Selection { since_checkpoint: Some(old), ..Selection::none() }).unwrap();
    assert_eq!(gap.resume, Resume::Gap);
    assert_eq!(gap.events, got);
    let recent = cps[cps.len() - 3].to_string().into_bytes();
    let exact = store.events(&j, &Selection { since_checkpoint: Some(recent), ..Selection::none() }).unwrap();
    assert_eq!(exact.resume, Resume::Exact);
    assert_eq!(exact.events.len(), 2);
    let n = store.events(&j, &Selection { max_n: Some(5), ..Selection::none() }).unwrap().events;
    assert_eq!(n, got[got.len() - 5..].to_vec());
}

// ----- configuration ----------------------------------------------------------

#[test]
fn config_from_env_reads_the_kn_variables() {
    let out = child(
        "from_env",
        &[
            ("KN_EVENTS", "/tmp/kn-sem-env-root"),
            ("KN_RESERVE_BYTES", "12345"),
            ("KN_SYNC", "always"),
            ("KN_MAX_EVENT_BYTES", "777"),
            ("KN_SEGMENT_BYTES", "65536"),
            ("KN_JOURNAL_MAX_AGE", "60"),
            ("KN_JOURNAL_MAX_BYTES", "1048576"),
            ("KN_EXPIRED_GRACE", "9"),
            ("KN_POLL_MS", "40"),
            ("KN_SERVER_URL", "http://env.example/cgi-bin/pubsub.cgi"),
            ("KN_OUTBOUND", "allow"),
            ("KN_REMOTE_TIMEOUT_MS", "1500"),
            ("KN_MAX_FORWARDS", "42"),
            ("KN_FORWARD_INLINE", "7"),
            ("KN_GROUP_COMMIT", "5"),
            ("KN_MAX_TOPIC_DEPTH", "7"),
            ("KN_MAX_TOPIC_BYTES", "300"),
            ("KN_MAX_SELECTED", "99"),
            ("KN_MAX_FORM_ELEMENTS", "55"),
        ],
    )
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("KN_SEM_CHILD_OK"), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let bad = child("from_env_bad", &[("KN_MAX_EVENT_BYTES", "lots")]).output().unwrap();
    let stdout = String::from_utf8_lossy(&bad.stdout);
    assert!(bad.status.success() && stdout.contains("KN_SEM_CHILD_OK"), "{stdout}\n{}", String::from_utf8_lossy(&bad.stderr));
}

/// Another process's append landing right after one of this process's
/// own, while the notifier has not read the own one's change event, is
/// not taken for it (FORMAT.md, "Appends of the reader's own process":
/// the kernel merges only adjacent identical events, and the `.head`
/// written after each record keeps two records' events apart). Each round
/// makes the notifier pause after an own write (it does, to read a
/// fan-out's events in bulk), appends here, lets the reader (on its own
/// thread, as a tunnel of `serve`) take it, and appends in another store;
/// the reader must be woken for that one: it waits longer than the round.
#[test]
fn another_process_append_right_after_an_own_one_is_never_swallowed() {
    use event_listener::Listener as _;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let dir = scratch("kn-journal-test-");
    let mut c = config(&dir.path().join("kn_events"));
    c.poll_interval = Duration::from_secs(60);
    let own = Arc::new(Store::open_with(c.clone()).unwrap());
    let other = Store::open_with(c).unwrap();
    let j = live_journal(&own, "/who/merged/kn_journal");
    let mut start = own.tunnel(&j, &Selection::none()).unwrap();
    assert!(start.tunnel.is_notified(), "no change notification here: this test needs inotify");
    const ROUNDS: usize = 300;
    let seen = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (own, seen, done) = (own.clone(), seen.clone(), done.clone());
        thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                let listener = start.tunnel.listen();
                let got = start.tunnel.next(&own).unwrap();
                let read_something = !got.is_empty();
                seen.fetch_add(got.len(), Ordering::SeqCst);
                if read_something && !start.tunnel.caught_up() {
                    continue;
                }
                listener.wait_timeout(Duration::from_secs(10));
            }
        })
    };
    let event = |who: &str| ev(&[("kn_payload", who), ("kn_expires", "+3600")]);
    for round in 0..ROUNDS {
        own.notify(&j, event("own, read by the notifier")).unwrap();
        thread::sleep(Duration::from_micros(300));
        own.notify(&j, event("own")).unwrap();
        thread::sleep(Duration::from_micros(150));
        other.notify(&j, event("other")).unwrap();
        let want = (round + 1) * 3;
        let deadline = Instant::now() + Duration::from_secs(5);
        while seen.load(Ordering::SeqCst) < want {
            if Instant::now() > deadline {
                done.store(true, Ordering::SeqCst);
                panic!("round {round}: {} of {want} events read after 5 s: another process's append was taken for this one's", seen.load(Ordering::SeqCst));
            }
            thread::sleep(Duration::from_millis(1));
        }
    }
    done.store(true, Ordering::SeqCst);
    own.notify(&j, event("the last, to end the reader")).unwrap();
    reader.join().unwrap();
    assert!(seen.load(Ordering::SeqCst) >= ROUNDS * 3);
}
