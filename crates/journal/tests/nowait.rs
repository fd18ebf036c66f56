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

/// Holds `path`'s `flock` (another process's would be the same) while
/// it lives.
fn hold_lock(path: &std::path::Path) -> std::fs::File {
    let file = OpenOptions::new().read(true).write(true).custom_flags(libc::O_CLOEXEC).open(path).unwrap();
    assert_eq!(unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&file), libc::LOCK_EX) }, 0);
    file
}

/// The bytes of every file of the topic directory `dir` (not below it).
fn files_of(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect();
    files.sort();
    files
}

/// A topic routed to a journal and to an ordinary topic, each posted to
/// once (so that their files and routes are kept).
fn routed(store: &Store) -> (Topic, Topic, Topic) {
    let (topic, journal, copies) = (t("/src"), t("/inbox/kn_journal"), t("/copies"));
    // The journal opened first, as its tunnel would.
    drop(store.tunnel(&journal, &Selection::none()).unwrap());
    store.heartbeat(&journal).unwrap();
    store.route(&topic, journal.to_string().as_bytes(), Event::new()).unwrap();
    store.route(&topic, copies.to_string().as_bytes(), Event::new()).unwrap();
    store.notify(&topic, ev(&[("kn_payload", "one")])).unwrap();
    (topic, journal, copies)
}

#[test]
fn a_routed_post_made_at_once_is_forwarded_as_notify_forwards_it() {
    let (dir, store) = open();
    let (topic, journal, copies) = routed(&store);
    let report = store.notify_nowait(&topic, ev(&[("kn_payload", "two"), ("kn_id", "i2")])).expect("made at once").unwrap();
    let wrote: Vec<(String, u64)> = report.writes.iter().map(|w| (w.topic.to_string(), w.checkpoint)).collect();
    // As notify answers: the event's own write first, then each copy.
    let mut expected = [("/src".to_string(), 2), ("/inbox/kn_journal".to_string(), 2), ("/copies".to_string(), 2)];
    assert_eq!(wrote[0], expected[0]);
    let mut copies_wrote = wrote[1..].to_vec();
    copies_wrote.sort();
    expected[1..].sort();
    assert_eq!(copies_wrote, expected[1..]);
    assert!(report.writes.iter().all(|w| w.id == b"i2"));
    assert!(report.poisoned.is_empty() && !report.duplicate);
    for topic in [&topic, &journal, &copies] {
        assert_eq!(payloads(&store, topic), ["one", "two"], "{topic}");
    }
    let copy = &store.events(&journal, &Selection::all()).unwrap().events[1];
    assert_eq!(copy.get_str("kn_routed_from"), Some(format!("{SERVER}/src")));
    // Nothing is left pending: the forwarding state's cursor is past it.
    assert_eq!(store.outbox_pending().unwrap(), 0);
    assert!(store.complete_forwarding(&topic).unwrap().writes.is_empty());
    // The next posts, made either way, follow in order, once each.
    store.notify(&topic, ev(&[("kn_payload", "three")])).unwrap();
    store.notify_nowait(&topic, ev(&[("kn_payload", "four")])).expect("made at once").unwrap();
    drop(store);
    let reopened = Store::open_with(config(&dir.path().join("kn_events"))).unwrap();
    for topic in [&topic, &journal, &copies] {
        assert_eq!(payloads(&reopened, topic), ["one", "two", "three", "four"], "{topic}");
    }
    assert!(reopened.complete_forwarding(&topic).unwrap().writes.is_empty());
    assert_eq!(checkpoints(&reopened, &journal), ["1", "2", "3", "4"]);
    // No drain found an event of these posts still to forward.
    assert_eq!(reopened.counters().unwrap().get(kn_journal::internal::Counter::DeliveriesRecovered), 0);
}

#[test]
fn a_routed_post_with_any_lock_busy_is_left_to_notify_with_nothing_written() {
    let (_dir, store) = open();
    let (topic, journal, copies) = routed(&store);
    let root = store.root().to_path_buf();
    // The topic's own lock, its forwarding state's, each destination's.
    for busy in [root.join("src/.lock"), root.join("src/.forwarded"), root.join("inbox/kn_journal/.lock"), root.join("copies/.lock")] {
        let before: Vec<_> = ["src", "inbox/kn_journal", "copies"].iter().map(|d| files_of(&root.join(d))).collect();
        let lock = hold_lock(&busy);
        assert!(store.notify_nowait(&topic, ev(&[("kn_payload", "two")])).is_none(), "{}", busy.display());
        let after: Vec<_> = ["src", "inbox/kn_journal", "copies"].iter().map(|d| files_of(&root.join(d))).collect();
        assert!(before == after, "nothing may be written while {} is held", busy.display());
        drop(lock);
    }
    // Every lock free again, the post is made at once.
    assert!(store.notify_nowait(&topic, ev(&[("kn_payload", "two")])).is_some());
    for topic in [&topic, &journal, &copies] {
        assert_eq!(payloads(&store, topic), ["one", "two"], "{topic}");
    }
}

#[test]
fn a_routed_post_is_left_to_notify_when_its_forwarding_is_not_the_simple_kind() {
    let (_dir, store) = open();
    let (topic, journal, _copies) = routed(&store);
    // An event pending in the outbox (stored, not yet forwarded: a
    // deferred notify's) is forwarded by a drain that reads it back.
    let mut deferring = config(store.root());
    deferring.forward_inline = 1;
    let other = Store::open_with(deferring).unwrap();
    assert!(other.notify_deferring(&topic, ev(&[("kn_payload", "pending")])).unwrap().forwarding_deferred);
    assert!(store.notify_nowait(&topic, ev(&[("kn_payload", "two")])).is_none());
    store.notify(&topic, ev(&[("kn_payload", "two")])).unwrap();
    assert_eq!(payloads(&store, &journal), ["one", "pending", "two"]);
    assert!(store.notify_nowait(&topic, ev(&[("kn_payload", "three")])).is_some());
    // An event expired already: stored, never forwarded.
    assert!(store.notify_nowait(&topic, ev(&[("kn_payload", "gone"), ("kn_expires", "1")])).is_none());
    // More routes than a post made at once forwards along.
    for i in 0..4 {
        store.route(&topic, format!("/more/{i}").as_bytes(), Event::new()).unwrap();
    }
    store.notify(&topic, ev(&[("kn_payload", "four")])).unwrap();
    assert!(store.notify_nowait(&topic, ev(&[("kn_payload", "five")])).is_none());
    assert_eq!(payloads(&store, &journal), ["one", "pending", "two", "three", "four"]);
}

#[test]
fn a_routed_post_from_many_threads_reaches_every_destination_once_in_order() {
    let (_dir, store) = open();
    let (topic, journal, copies) = routed(&store);
    let store = std::sync::Arc::new(store);
    let made_at_once = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for thread in 0..4 {
            let (store, topic, made_at_once) = (&store, &topic, &made_at_once);
            s.spawn(move || {
                for i in 0..100 {
                    let event = ev(&[("kn_payload", &format!("{thread}-{i}"))]);
                    match store.notify_nowait(topic, event.clone()) {
                        Some(answer) => {
                            answer.unwrap();
                            made_at_once.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        None => {
                            store.notify(topic, event).unwrap();
                        }
                    }
                }
            });
        }
    });
    let source = payloads(&store, &topic);
    assert_eq!(source.len(), 401);
    assert_eq!(payloads(&store, &journal), source, "the journal has every event once, in the topic's order");
    assert_eq!(payloads(&store, &copies), source);
    assert!(made_at_once.load(std::sync::atomic::Ordering::Relaxed) > 0, "some posts were made at once");
    assert_eq!(store.outbox_pending().unwrap(), 0);
}

#[test]
fn a_topic_whose_lock_another_holds_is_left_to_notify() {
    let (_dir, store) = open();
    let topic = t("/busy");
    store.notify(&topic, ev(&[("kn_payload", "one")])).unwrap();
    let lock = hold_lock(&store.root().join("busy/.lock"));
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
