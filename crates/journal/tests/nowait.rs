//! `Store::notify_nowait`, the notify a server's event loop makes when it
//! can be made at once: the same post as `Store::notify` when it is made,
//! and nothing at all (`None`) when it would have to wait or do more than
//! one append.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;

mod common;
use common::{config, ev, scratch, t, SERVER};

use kn_journal::{ErrorKind, Event, Selection, Store, SyncPolicy, Topic};

fn open() -> (tempfile::TempDir, Store) {
    let dir = scratch("kn-nowait-test-");
    let store = Store::open_with(config(&dir.path().join("kn_events"))).unwrap();
    (dir, store)
}

fn payloads(store: &Store, topic: &Topic) -> Vec<String> {
    store.events(topic, &Selection::all()).unwrap().events.iter().map(|e| String::from_utf8_lossy(e.payload()).into_owned()).collect()
}

fn checkpoints(store: &Store, topic: &Topic) -> Vec<String> {
    store.events(topic, &Selection::all()).unwrap().events.iter().map(|e| e.get_str("kn_route_checkpoint").unwrap().to_string()).collect()
}

#[test]
fn a_topic_this_store_never_wrote_is_left_to_notify() {
    let (_dir, store) = open();
    let topic = t("/fresh");
    assert!(store.notify_nowait(&topic, ev(&[("kn_payload", "a")])).is_none());
    assert!(!store.root().join("fresh").exists(), "nothing may be created");
}

#[test]
fn a_notify_made_at_once_is_stored_as_notify_stores_it_and_survives_a_reopen() {
    let (dir, store) = open();
    let topic = t("/chat");
    store.notify(&topic, ev(&[("kn_payload", "one")])).unwrap();
    let report = store.notify_nowait(&topic, ev(&[("kn_payload", "two"), ("kn_id", "i2")])).expect("made at once").unwrap();
    assert!(!report.duplicate);
    assert_eq!(report.id, b"i2");
    assert_eq!(report.writes.len(), 1);
    assert_eq!((report.writes[0].topic.to_string(), report.writes[0].checkpoint), ("/chat".to_string(), 2));
    // An ordinary topic's duplicate is not stored, as with notify.
    let again = store.notify_nowait(&topic, ev(&[("kn_payload", "two"), ("kn_id", "i2")])).expect("made at once").unwrap();
    assert!(again.duplicate && again.writes.is_empty());
    assert_eq!(payloads(&store, &topic), ["one", "two"]);
    assert_eq!(checkpoints(&store, &topic), ["1", "2"]);
    let stored = &store.events(&topic, &Selection::all()).unwrap().events[1];
    assert!(stored.get_str("kn_time_t").is_some(), "normalised as notify does");
    drop(store);
    let reopened = Store::open_with(config(&dir.path().join("kn_events"))).unwrap();
    assert_eq!(payloads(&reopened, &topic), ["one", "two"]);
    reopened.notify(&topic, ev(&[("kn_payload", "three")])).unwrap();
    assert_eq!(checkpoints(&reopened, &topic), ["1", "2", "3"]);
}

#[test]
fn a_topic_with_an_active_route_is_left_to_notify() {
    let (_dir, store) = open();
    let (topic, journal) = (t("/src"), t("/dst"));
    store.route(&topic, journal.to_string().as_bytes(), Event::new()).unwrap();
    store.notify(&topic, ev(&[("kn_payload", "one")])).unwrap();
    assert!(store.notify_nowait(&topic, ev(&[("kn_payload", "two")])).is_none());
    assert_eq!(payloads(&store, &topic), ["one"]);
    assert_eq!(payloads(&store, &journal), ["one"]);
    // The route deleted, the next posts may be made at once.
    let id = store.routes(&topic).unwrap()[0].id().to_vec();
    store.delete_route(&topic, &id, None).unwrap();
    store.notify(&topic, ev(&[("kn_payload", "three")])).unwrap();
    assert!(store.notify_nowait(&topic, ev(&[("kn_payload", "four")])).is_some());
    assert_eq!(payloads(&store, &journal), ["one"]);
    let _ = SERVER;
}

#[test]
fn a_topic_whose_lock_another_holds_is_left_to_notify() {
    let (_dir, store) = open();
    let topic = t("/busy");
    store.notify(&topic, ev(&[("kn_payload", "one")])).unwrap();
    let lock = OpenOptions::new().read(true).write(true).custom_flags(libc::O_CLOEXEC).open(store.root().join("busy/.lock")).unwrap();
    assert_eq!(unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) }, 0);
    assert!(store.notify_nowait(&topic, ev(&[("kn_payload", "two")])).is_none());
    drop(lock);
    assert!(store.notify_nowait(&topic, ev(&[("kn_payload", "two")])).is_some());
    assert_eq!(payloads(&store, &topic), ["one", "two"]);
}

#[test]
fn errors_are_those_of_notify() {
    let (_dir, store) = open();
    let topic = t("/errs");
    store.notify(&topic, ev(&[("kn_payload", "one")])).unwrap();
    let big = "x".repeat(store.config().max_event_bytes + 1);
    let err = store.notify_nowait(&topic, ev(&[("kn_payload", &big)])).expect("answered at once").unwrap_err();
    assert_eq!(err.kind(), store.notify(&topic, ev(&[("kn_payload", &big)])).unwrap_err().kind());
    assert_eq!(err.kind(), ErrorKind::TooLarge);
    // Reserved topics: notify's refusal, not made here.
    assert!(store.notify_nowait(&topic.routes(), ev(&[("kn_payload", "x")])).is_none());
    assert_eq!(payloads(&store, &topic), ["one"]);
}

#[test]
fn a_store_that_syncs_every_post_leaves_every_post_to_notify() {
    let dir = scratch("kn-nowait-test-");
    let mut c = config(&dir.path().join("kn_events"));
    c.sync = SyncPolicy::Always;
    let store = Store::open_with(c).unwrap();
    let topic = t("/synced");
    store.notify(&topic, ev(&[("kn_payload", "one")])).unwrap();
    assert!(store.notify_nowait(&topic, ev(&[("kn_payload", "two")])).is_none());
}

#[test]
fn a_large_payload_is_left_to_notify() {
    let (_dir, store) = open();
    let topic = t("/blobby");
    store.notify(&topic, ev(&[("kn_payload", "one")])).unwrap();
    let large = "y".repeat(store.config().blob_bytes + 1);
    assert!(store.notify_nowait(&topic, ev(&[("kn_payload", &large)])).is_none());
    assert_eq!(payloads(&store, &topic), ["one"]);
}
