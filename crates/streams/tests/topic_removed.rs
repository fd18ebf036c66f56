//! A stream bound to a topic that the sweep removes (issue 28, item 5):
//! the topic created again goes on numbering, so the stream imports every
//! event of the new one. (The topic side: kn-journal's tests/sweep_readers.rs.)

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kn_journal::{Config, Event, Store, Topic};
use kn_streams::{Create, Start, Streams};
use kn_test_support::scratch;

fn t(name: &str) -> Topic {
    Topic::parse(name).unwrap()
}

fn ev(pairs: &[(&str, &str)]) -> Event {
    Event::from_pairs(pairs.iter().map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec())))
}

/// Topics pruned as soon as they are empty, no free-space reserve.
fn fast(root: &Path) -> Config {
    let mut c = Config::new(root);
    c.reserve_bytes = 0;
    c.server_url = Some("http://test.example/kn".to_string());
    c.topic_grace = Duration::ZERO;
    c.journal_grace = Duration::ZERO;
    c.heartbeat_stale = Duration::from_millis(200);
    c
}

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

/// Posts `old1`..`old3`, expiring a second from now.
fn post_expiring(store: &Store, topic: &Topic) {
    let expires = format!("{:.3}", now() + 1.0);
    for n in 1..=3 {
        store.notify(topic, ev(&[("kn_id", &format!("old{n}")), ("kn_payload", &format!("old{n}")), ("kn_expires", &expires)])).unwrap();
    }
}

fn post_new(store: &Store, topic: &Topic) {
    for n in 1..=5 {
        store.notify(topic, ev(&[("kn_id", &format!("new{n}")), ("kn_payload", &format!("new{n}"))])).unwrap();
    }
}

fn exists(root: &Path, topic: &Topic) -> bool {
    root.join(&topic.as_str()[1..]).is_dir()
}

#[test]
fn a_stream_bound_to_a_removed_topic_imports_every_event_of_the_new_one() {
    let dir = scratch("kn-journal-readers-");
    let streams = Streams::new(Arc::new(Store::open_with(fast(dir.path())).unwrap()));
    let store = streams.store().clone();
    let chat = t("/what/chat");
    let create = Create { topic: Some(chat.as_str().to_owned()), ..Create::new("application/json") };
    assert!(streams.create("rooms/chat", &create).unwrap().created);
    let messages = || -> Vec<String> {
        let body = streams.read("rooms/chat", Start::Beginning).unwrap().body();
        let values: Vec<serde_json::Value> = serde_json::from_slice(&body).unwrap();
        values.iter().map(|v| v["kn_payload"].as_str().unwrap_or("").to_owned()).collect()
    };
    post_expiring(&store, &chat);
    assert_eq!(messages(), ["old1", "old2", "old3"]);
    std::thread::sleep(Duration::from_millis(1100));
    assert!(store.sweep_all(Some(Duration::ZERO)).unwrap().topics_pruned >= 1);
    assert!(!exists(dir.path(), &chat));
    post_new(&store, &chat);
    assert_eq!(messages(), ["old1", "old2", "old3", "new1", "new2", "new3", "new4", "new5"]);
}
