//! The limits that keep one request from costing without bound
//! (docs/RELIABILITY.md, "Hostile input"): topic depth and name length, content
//! filters compiled once per route list, the initial population of a route
//! counted against `max_forwards`, and selections held to `max_selected`
//! events. Each at its boundary, with its status.

use std::path::Path;

mod common;
use common::{ev, scratch, t};

use kn_journal::{Config, ErrorKind, Event, Resume, Selection, Store};

const SERVER: &str = "http://test.example/kn";

fn open_with(f: impl FnOnce(&mut Config)) -> (tempfile::TempDir, Store) {
    let dir = scratch("kn-journal-limits-");
    let mut c = Config::new(dir.path());
    c.reserve_bytes = 0;
    c.server_url = Some(SERVER.to_string());
    f(&mut c);
    let store = Store::open_with(c).unwrap();
    (dir, store)
}

fn post(store: &Store, topic: &str, payload: &str) {
    store.notify(&t(topic), ev(&[("kn_payload", payload)])).unwrap();
}

fn payloads(events: &[Event]) -> Vec<String> {
    events.iter().map(|e| String::from_utf8_lossy(e.payload()).into_owned()).collect()
}

fn all(store: &Store, topic: &str) -> Vec<String> {
    payloads(&store.events(&t(topic), &Selection::all()).unwrap().events)
}

/// Every directory below `root`, counted.
fn directories(root: &Path) -> usize {
    let mut n = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            if entry.file_type().unwrap().is_dir() {
                n += 1;
                stack.push(entry.path());
            }
        }
    }
    n
}

fn deep(depth: usize) -> String {
    (0..depth).map(|i| format!("/s{i}")).collect()
}

// ----- topic depth and length ----------------------------------------------

#[test]
fn a_topic_at_max_topic_depth_is_accepted_and_one_deeper_is_400() {
    let (dir, store) = open_with(|c| c.max_topic_depth = 4);
    post(&store, "/a/b/c/d", "at the limit");
    assert_eq!(all(&store, "/a/b/c/d"), ["at the limit"]);
    // Its kn_routes is one deeper, and allowed: the server adds it.
    store.route(&t("/a/b/c/d"), b"/x", ev(&[("kn_id", "r1")])).unwrap();
    let before = directories(dir.path());
    let err = store.notify(&t("/a/b/c/d/e"), ev(&[("kn_payload", "x")])).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadTopic);
    assert_eq!(err.kind().status().0, 400);
    assert!(err.to_string().contains("5 segments") && err.to_string().contains("KN_MAX_TOPIC_DEPTH"), "{err}");
    assert_eq!(directories(dir.path()), before, "a refused topic creates nothing");
    // A route into a topic too deep is refused when it is made, not poisoned later.
    let err = store.route(&t("/a"), b"/p/q/r/s/t", ev(&[])).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadTopic, "{err}");
    let err = store.route(&t("/a/b/c/d/e"), b"/x", ev(&[])).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadTopic, "{err}");
    assert!(store.tunnel(&t("/a/b/c/d/e"), &Selection::none()).is_err(), "a tunnel would create it");
    assert_eq!(directories(dir.path()), before);
}

#[test]
fn a_topic_name_of_max_topic_bytes_is_accepted_and_one_byte_more_is_400() {
    let (_dir, store) = open_with(|c| c.max_topic_bytes = 10);
    post(&store, "/abcdefghi", "ten bytes");
    let err = store.notify(&t("/abcdefghij"), ev(&[("kn_payload", "x")])).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadTopic);
    assert!(err.to_string().contains("11 bytes") && err.to_string().contains("KN_MAX_TOPIC_BYTES"), "{err}");
}

/// Hostile input: one `kn_to` a thousand segments deep created a thousand
/// directories and a thousand announcements, with work growing with the
/// square of the depth.
#[test]
fn one_very_deep_kn_to_is_refused_by_default_and_creates_nothing() {
    let (dir, store) = open_with(|_| {});
    assert_eq!(store.config().max_topic_depth, 32);
    assert_eq!(store.config().max_topic_bytes, 1024);
    post(&store, &deep(32), "deep but allowed");
    let before = directories(dir.path());
    // Past the store's limit (KN_MAX_TOPIC_DEPTH) but a valid name.
    let err = store.notify(&t(&deep(33)), ev(&[("kn_payload", "x")])).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadTopic, "{err}");
    assert_eq!(directories(dir.path()), before);
    // Past the protocol-wide maximum: not even a name.
    let name = deep(1000);
    let err = kn_journal::Topic::parse(&name).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadTopic, "{err}");
    assert!(err.to_string().len() < kn_journal::MAX_TOPIC_BYTES + 200, "the message quotes the start of the {}-byte name only: {err}", name.len());
    assert_eq!(directories(dir.path()), before);
}

// ----- content filters -------------------------------------------------------

/// Each post used to compile every route's `kn_content_filter` afresh.
#[test]
fn a_route_filter_is_compiled_once_for_many_posts() {
    let (_dir, store) = open_with(|_| {});
    store.route(&t("/src"), b"/dst", ev(&[("kn_id", "r1"), ("kn_content_filter", "^keep")])).unwrap();
    let created = store.filters_compiled();
    for i in 0..100 {
        post(&store, "/src", &format!("{} {i}", if i % 2 == 0 { "keep" } else { "drop" }));
    }
    assert_eq!(all(&store, "/dst").len(), 50, "the filter still filters");
    assert_eq!(store.filters_compiled() - created, 1, "compiled once per route list, not once per post");
    // A new route makes a new list: its filters compile again, once.
    store.route(&t("/src"), b"/dst2", ev(&[("kn_id", "r2"), ("kn_content_filter", "drop")])).unwrap();
    let created = store.filters_compiled();
    for i in 0..10 {
        post(&store, "/src", &format!("drop {i}"));
    }
    assert_eq!(all(&store, "/dst2").len(), 10);
    assert_eq!(store.filters_compiled() - created, 2, "both routes' filters, once each");
}

// ----- initial route population ----------------------------------------------

fn filled(n: usize, f: impl FnOnce(&mut Config)) -> (tempfile::TempDir, Store) {
    let (dir, store) = open_with(f);
    for i in 0..n {
        post(&store, "/src", &format!("e{i}"));
    }
    (dir, store)
}

/// A new route's population was not counted against `max_forwards`: one
/// route request could make any number of deliveries.
#[test]
fn a_route_population_within_max_forwards_is_carried_and_beyond_it_is_508() {
    let (_dir, store) = filled(10, |c| c.max_forwards = 10);
    store.route(&t("/src"), b"/dst", ev(&[("kn_id", "r1"), ("do_max_age", "infinity")])).unwrap();
    assert_eq!(all(&store, "/dst").len(), 10, "exactly max_forwards deliveries are allowed");

    let (_dir, store) = filled(11, |c| c.max_forwards = 10);
    let err = store.route(&t("/src"), b"/dst", ev(&[("kn_id", "r1"), ("do_max_age", "infinity")])).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooManyDeliveries);
    assert_eq!(err.kind().status(), (508, "Too many deliveries"));
    assert!(err.to_string().contains("KN_MAX_FORWARDS") && err.to_string().contains("was created"), "{err}");
    assert_eq!(all(&store, "/dst").len(), 10, "stopped at the limit");
    assert_eq!(store.routes(&t("/src")).unwrap().len(), 1, "the route itself stands");
}

/// The deliveries a populated event causes further on count too.
#[test]
fn a_route_population_counts_the_deliveries_it_causes_downstream() {
    // Five events, each delivered to /dst and on to /further: ten.
    let (_dir, store) = filled(5, |c| c.max_forwards = 10);
    store.route(&t("/dst"), b"/further", ev(&[("kn_id", "on")])).unwrap();
    store.route(&t("/src"), b"/dst", ev(&[("kn_id", "r1"), ("do_max_n", "5")])).unwrap();
    assert_eq!(all(&store, "/further").len(), 5);
    // Six: twelve.
    let (_dir, store) = filled(6, |c| c.max_forwards = 10);
    store.route(&t("/dst"), b"/further", ev(&[("kn_id", "on")])).unwrap();
    let err = store.route(&t("/src"), b"/dst", ev(&[("kn_id", "r1"), ("do_max_n", "6")])).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooManyDeliveries, "{err}");
    assert_eq!(all(&store, "/dst").len() + all(&store, "/further").len(), 10);
}

// ----- selections ------------------------------------------------------------

#[test]
fn a_tunnel_starts_with_at_most_max_selected_events_the_newest() {
    let (_dir, store) = filled(50, |c| c.max_selected = 20);
    let newest: Vec<String> = (30..50).map(|i| format!("e{i}")).collect();
    for selection in [
        Selection::all(),
        Selection { max_n: Some(usize::MAX), ..Selection::none() },
        Selection { max_n: Some(21), ..Selection::none() },
    ] {
        let start = store.tunnel(&t("/src"), &selection).unwrap();
        assert_eq!(payloads(&start.initial.events), newest, "{selection:?}");
    }
    let start = store.tunnel(&t("/src"), &Selection { max_n: Some(20), ..Selection::none() }).unwrap();
    assert_eq!(payloads(&start.initial.events), newest, "at the limit");
    let start = store.tunnel(&t("/src"), &Selection { max_n: Some(3), ..Selection::none() }).unwrap();
    assert_eq!(payloads(&start.initial.events), ["e47", "e48", "e49"], "below it, do_max_n as ever");
    // The administrator's view is not capped.
    assert_eq!(all(&store, "/src").len(), 50);
}

#[test]
fn a_resume_beyond_max_selected_keeps_the_newest_and_reports_a_gap() {
    let (_dir, store) = filled(50, |c| c.max_selected = 20);
    let checkpoint = |n: u64| Selection { since_checkpoint: Some(n.to_string().into_bytes()), ..Selection::none() };
    let exact = store.tunnel(&t("/src"), &checkpoint(30)).unwrap().initial;
    assert_eq!(exact.resume, Resume::Exact, "20 events after checkpoint 30: at the limit");
    assert_eq!(exact.events.len(), 20);
    let gap = store.tunnel(&t("/src"), &checkpoint(29)).unwrap().initial;
    assert_eq!(gap.resume, Resume::Gap, "21 events after checkpoint 29");
    assert_eq!(payloads(&gap.events).first().map(String::as_str), Some("e30"));
    assert_eq!(gap.events.len(), 20);
    // Without the cap, a resume still selects everything after its checkpoint.
    let full = store.events(&t("/src"), &checkpoint(10)).unwrap();
    assert_eq!((full.events.len(), full.resume), (40, Resume::Exact));
}

#[test]
fn a_new_route_carries_at_most_max_selected_events() {
    let (_dir, store) = filled(50, |c| c.max_selected = 20);
    store.route(&t("/src"), b"/dst", ev(&[("kn_id", "r1"), ("do_max_age", "infinity")])).unwrap();
    let got = all(&store, "/dst");
    assert_eq!(got.len(), 20);
    assert_eq!(got.first().map(String::as_str), Some("e30"));
}
