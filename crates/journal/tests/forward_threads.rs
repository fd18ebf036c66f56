//! Threads of one process posting at once to a topic with routes (the
//! workers of `pubsub-cgi serve`): every event is forwarded to every route
//! exactly once, whichever thread's drain of the outbox carries it.

use std::collections::BTreeSet;
use std::sync::{Arc, Barrier};

use kn_journal::{Config, Event, Selection, Store, Topic};

const THREADS: usize = 6;

/// A store in a fresh directory (no free-space reserve).
fn open_store(dir: &tempfile::TempDir) -> Arc<Store> {
    let mut config = Config::new(dir.path().join("kn_events"));
    config.reserve_bytes = 0;
    Arc::new(Store::open_with(config).unwrap())
}

/// Routes `room` into each of `destinations` (a journal opened first, as
/// its tunnel would).
fn route_to(store: &Store, room: &Topic, destinations: &[Topic]) {
    for (i, d) in destinations.iter().enumerate() {
        if d.is_journal() {
            drop(store.tunnel(d, &Selection::none()).unwrap());
            store.heartbeat(d).unwrap();
        }
        let mut route = Event::new();
        route.set("kn_id", format!("r{i}"));
        store.route(room, d.to_string().as_bytes(), route).unwrap();
    }
}

/// [`THREADS`] threads, started together, each notifying `room` of `each`
/// events `w<thread>-<i>` (id and payload).
fn post_from_threads(store: &Arc<Store>, room: &Topic, each: usize) -> Vec<std::thread::JoinHandle<()>> {
    let start = Arc::new(Barrier::new(THREADS));
    (0..THREADS)
        .map(|w| {
            let (store, room, start) = (store.clone(), room.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                for i in 0..each {
                    let mut e = Event::new();
                    e.set("kn_id", format!("w{w}-{i}")).set("kn_payload", format!("w{w}-{i}"));
                    store.notify(&room, e).unwrap();
                }
            })
        })
        .collect()
}

/// Threads posting at once to a topic with routes into journals: every
/// event reaches every journal exactly once, whichever thread's drain of
/// the outbox forwards it (the next writer may forward an event whose own
/// post has not drained yet).
#[test]
fn threads_posting_to_a_routed_topic_forward_every_event_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(&dir);
    let room = Topic::parse("/soak/room").unwrap();
    let journals: Vec<Topic> = (0..3).map(|i| Topic::parse(&format!("/who/u{i}/kn_journal")).unwrap()).collect();
    route_to(&store, &room, &journals);
    let workers = post_from_threads(&store, &room, 100);
    // Meanwhile routes come and go on the room (each change settles the
    // room's outbox first), as pages subscribe and leave.
    let churn = {
        let (store, room) = (store.clone(), room.clone());
        std::thread::spawn(move || {
            for i in 0..100 {
                let mut route = Event::new();
                route.set("kn_id", format!("c{i}"));
                store.route(&room, b"/who/churn/inbox", route).unwrap();
                store.delete_route(&room, format!("c{i}").as_bytes(), None).unwrap();
            }
        })
    };
    for w in workers {
        w.join().unwrap();
    }
    churn.join().unwrap();
    for j in &journals {
        let got: Vec<String> = store.events(j, &Selection::all()).unwrap().events.iter().map(|e| String::from_utf8_lossy(e.payload()).into_owned()).collect();
        let unique: BTreeSet<&String> = got.iter().collect();
        assert_eq!(unique.len(), THREADS * 100, "{j}: {} events, {} distinct", got.len(), unique.len());
        assert_eq!(got.len(), THREADS * 100, "{j}: duplicates");
    }
}

/// Threads posting at once to a topic routed to journals and to an
/// ordinary topic: each destination gets the events in the order the
/// topic stored them, whichever drain carries them (a drain forwards the
/// events of the posts still waiting for the lock first, taken from
/// memory: `outbox::InFlight`).
#[test]
fn threads_posting_to_a_routed_topic_forward_in_the_topics_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(&dir);
    let room = Topic::parse("/order/room").unwrap();
    let mut destinations: Vec<Topic> = (0..2).map(|i| Topic::parse(&format!("/order/u{i}/kn_journal")).unwrap()).collect();
    destinations.push(Topic::parse("/order/archive").unwrap());
    route_to(&store, &room, &destinations);
    for w in post_from_threads(&store, &room, 200) {
        w.join().unwrap();
    }
    let ids = |t: &Topic| -> Vec<String> { store.events(t, &Selection::all()).unwrap().events.iter().map(|e| String::from_utf8_lossy(e.id().unwrap()).into_owned()).collect() };
    let stored = ids(&room);
    assert_eq!(stored.len(), THREADS * 200);
    for d in &destinations {
        assert_eq!(ids(d), stored, "{d}: not the room's events in the room's order");
    }
}

/// A routed topic's `.forwarded`, kept open between posts, removed (as
/// with its topic) and made again: the next drain writes the new file,
/// not the removed one it held open.
#[test]
fn a_kept_forwarding_state_removed_meanwhile_is_opened_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(&dir);
    let root = dir.path().join("kn_events");
    let room = Topic::parse("/kept/room").unwrap();
    route_to(&store, &room, &[Topic::parse("/kept/archive").unwrap()]);
    let post = |id: &str| {
        let mut e = Event::new();
        e.set("kn_id", id).set("kn_payload", id);
        store.notify(&room, e).unwrap()
    };
    post("a");
    let state = root.join("kept/room/.forwarded");
    assert!(state.exists());
    std::fs::remove_file(&state).unwrap();
    let report = post("b");
    assert!(report.writes.iter().any(|w| w.topic.as_str() == "/kept/archive"), "{report:?}");
    assert!(state.exists(), "the drain wrote the .forwarded it held open, removed");
    post("c");
    let archived: Vec<Vec<u8>> = store.events(&Topic::parse("/kept/archive").unwrap(), &Selection::all()).unwrap().events.iter().map(|e| e.id().unwrap().to_vec()).collect();
    assert_eq!(archived, [b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
}
