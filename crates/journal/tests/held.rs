//! Status events held until a route's population is carried
//! (`Store::hold_statuses`, FORMAT.md `.held/`): posted after the
//! populated events, by the request or, when it died first, by the next
//! background pass.

use kn_journal::{Event, Selection, Store, Topic};

fn event(id: &str, payload: &str) -> Event {
    let mut e = Event::new();
    e.set("kn_id", id).set("kn_payload", payload);
    e
}

fn status() -> Event {
    let mut s = Event::new();
    s.set("status", "200 Routed").set("kn_payload", "routed");
    s
}

fn payloads(store: &Store, topic: &Topic) -> Vec<String> {
    store.events(topic, &Selection::all()).unwrap().events.iter().map(|e| String::from_utf8_lossy(e.payload()).into_owned()).collect()
}

fn routed_with_population(store: &Store) -> (Topic, Topic) {
    let from = Topic::parse("/what/held").unwrap();
    // An ordinary topic: a journal without a reader is stale and drops posts.
    let journal = Topic::parse("/what/dest").unwrap();
    for i in 1..=3 {
        store.notify(&from, event(&format!("e{i}"), &format!("p{i}"))).unwrap();
    }
    let mut params = Event::new();
    params.set("do_max_n", "10");
    let report = store.route_deferred(&from, journal.as_str().as_bytes(), params).unwrap();
    assert!(report.population_pending);
    (from, journal)
}

#[test]
fn held_statuses_follow_the_population() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let (from, journal) = routed_with_population(&store);
    let held = store.hold_statuses(&journal, vec![from], vec![status()]).unwrap();
    assert!(payloads(&store, &journal).is_empty(), "nothing before the request completes it");
    held.complete(&store);
    assert_eq!(payloads(&store, &journal), ["p1", "p2", "p3", "routed"]);
    assert_eq!(store.complete_held_statuses().unwrap(), 0, "its file is gone");
}

#[test]
fn a_dead_requests_held_statuses_are_posted_by_the_next_pass_after_the_population() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let (from, journal) = routed_with_population(&store);
    let held = store.hold_statuses(&journal, vec![from], vec![status()]).unwrap();
    // Another process sees it locked: its request still runs.
    let other = Store::open(dir.path()).unwrap();
    assert_eq!(other.complete_held_statuses().unwrap(), 0);
    // The request dies (its lock goes with its file descriptor).
    drop(held);
    assert_eq!(other.complete_held_statuses().unwrap(), 1);
    assert_eq!(payloads(&other, &journal), ["p1", "p2", "p3", "routed"]);
}

