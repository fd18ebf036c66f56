//! The PubSub rules of the journal (PROTOCOL.md sections 1, 2, 3.3, 3.4
//! and 4), each proved by a test named after it, against a store in a
//! temporary directory.

use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime};

mod common;
use common::{config, ev, scratch, t};

use kn_journal::{ErrorKind, Event, Resume, Selection, Store};

use common::journal::*;

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
