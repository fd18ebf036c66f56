//! Threads of one process posting at once to a topic with routes (the
//! workers of `pubsub-cgi serve`): every event is forwarded to every route
//! exactly once, whichever thread's drain of the outbox carries it.

use std::collections::BTreeSet;
use std::sync::{Arc, Barrier};

use kn_journal::{Config, Event, Selection, Store, Topic};

const THREADS: usize = 6;

/// Threads posting at once to a topic with routes into journals: every
/// event reaches every journal exactly once, whichever thread's drain of
/// the outbox forwards it (the next writer may forward an event whose own
/// post has not drained yet).
#[test]
fn threads_posting_to_a_routed_topic_forward_every_event_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path().join("kn_events"));
    config.reserve_bytes = 0;
    let store = Arc::new(Store::open_with(config).unwrap());
    let room = Topic::parse("/soak/room").unwrap();
    let journals: Vec<Topic> = (0..3).map(|i| Topic::parse(&format!("/who/u{i}/kn_journal")).unwrap()).collect();
    for (i, j) in journals.iter().enumerate() {
        drop(store.tunnel(j, &Selection::default()).unwrap());
        store.heartbeat(j).unwrap();
        let mut route = Event::new();
        route.set("kn_id", format!("r{i}"));
        store.route(&room, j.to_string().as_bytes(), route).unwrap();
    }
    let start = Arc::new(Barrier::new(THREADS));
    let workers: Vec<_> = (0..THREADS)
        .map(|w| {
            let (store, room, start) = (store.clone(), room.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                for i in 0..100 {
                    let mut e = Event::new();
                    e.set("kn_id", format!("w{w}-{i}")).set("kn_payload", format!("w{w}-{i}"));
                    store.notify(&room, e).unwrap();
                }
            })
        })
        .collect();
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
