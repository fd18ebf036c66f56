//! A tunnel's journal is ready for its first copy (issue 31, "cold
//! subscribers"): opening the tunnel creates the journal's log, so the
//! first event forwarded to it creates no file.

use kn_journal::{Event, Selection, Store, Topic};

#[test]
fn a_tunnel_creates_its_journals_log_and_the_first_post_lands_in_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let journal = Topic::parse("/a/kn_journal").unwrap();
    let _tunnel = store.tunnel(&journal, &Selection::none()).unwrap();
    let files = dir.path().join("a/kn_journal");
    assert!(files.join(".head").is_file(), "no .head after the tunnel opened");
    assert!(files.join(".seg-0000000000000001").is_file(), "no first segment after the tunnel opened");
    store.notify(&journal, Event::from_pairs([("kn_payload", "first")])).unwrap();
    let events = store.events(&journal, &Selection::all()).unwrap().events;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].payload(), b"first");
    // Another store (another process) sees the same log.
    let other = Store::open(dir.path()).unwrap();
    assert_eq!(other.events(&journal, &Selection::all()).unwrap().events.len(), 1);
}

#[test]
fn a_reopened_tunnel_keeps_the_events_of_its_journal() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let journal = Topic::parse("/b/kn_journal").unwrap();
    drop(store.tunnel(&journal, &Selection::none()).unwrap());
    store.notify(&journal, Event::from_pairs([("kn_payload", "one")])).unwrap();
    // A restart: a new store, the client reconnects, then a post.
    let store = Store::open(dir.path()).unwrap();
    let _tunnel = store.tunnel(&journal, &Selection::none()).unwrap();
    store.notify(&journal, Event::from_pairs([("kn_payload", "two")])).unwrap();
    let events = store.events(&journal, &Selection::all()).unwrap().events;
    assert_eq!(events.iter().map(|e| e.payload()).collect::<Vec<_>>(), [&b"one"[..], b"two"]);
}
