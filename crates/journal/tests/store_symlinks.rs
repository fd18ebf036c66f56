//! A symbolic link planted inside the store (`kn_events/evil ->
//! /elsewhere`) never lets a topic leave it: posting, routing and reading
//! through the link are refused (403) with a message naming the link, and
//! nothing is written where it points.

use std::fs;
use std::os::unix::fs::symlink;

use kn_journal::{ErrorKind, Event, Selection, Store, Topic};

fn event(payload: &str) -> Event {
    let mut e = Event::new();
    e.set("kn_payload", payload);
    e
}

#[test]
fn topics_through_a_planted_symlink_are_refused_and_nothing_is_written_outside() {
    let dir = tempfile::tempdir().expect("tempdir");
    let outside = dir.path().join("outside");
    fs::create_dir(&outside).expect("outside");
    let store = Store::open(dir.path().join("kn_events")).expect("store");
    store.notify(&Topic::parse("/what/chat").unwrap(), event("fine")).expect("an ordinary post");

    symlink(&outside, dir.path().join("kn_events/evil")).expect("plant evil");
    symlink(&outside, dir.path().join("kn_events/what/evil2")).expect("plant evil2");
    for name in ["/evil", "/evil/x", "/what/evil2", "/what/evil2/x"] {
        let topic = Topic::parse(name).unwrap();
        let err = store.notify(&topic, event("pwned")).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Forbidden, "notify {name}: {err}");
        assert!(err.to_string().contains("symbolic link"), "{err}");
        let err = store.events(&topic, &Selection::all()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Forbidden, "read {name}: {err}");
        let err = store.route(&topic, b"/who/me/kn_journal", Event::new()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Forbidden, "route from {name}: {err}");
    }
    // A journal behind the link: its heartbeat is neither written nor
    // removed there, even where the directory it names exists.
    fs::create_dir_all(outside.join("j/kn_journal")).expect("outside journal dir");
    let journal = Topic::parse("/evil/j/kn_journal").unwrap();
    assert_eq!(store.heartbeat(&journal).unwrap_err().kind(), ErrorKind::Forbidden);
    assert_eq!(store.expire(&journal).unwrap_err().kind(), ErrorKind::Forbidden);
    assert!(store.notify(&journal, event("pwned")).is_err());
    assert_eq!(fs::read_dir(outside.join("j/kn_journal")).unwrap().count(), 0, "no heartbeat outside");
    fs::remove_dir_all(outside.join("j")).expect("clean up");
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 0, "nothing was written through a link");
    store.notify(&Topic::parse("/what/chat").unwrap(), event("still fine")).expect("other topics still work");
}

#[test]
fn a_route_into_a_symlinked_topic_delivers_nothing_there() {
    let dir = tempfile::tempdir().expect("tempdir");
    let outside = dir.path().join("outside");
    fs::create_dir(&outside).expect("outside");
    let store = Store::open(dir.path().join("kn_events")).expect("store");
    let chat = Topic::parse("/what/chat").unwrap();
    store.notify(&chat, event("first")).expect("post");
    symlink(&outside, dir.path().join("kn_events/evil")).expect("plant evil");
    let _ = store.route(&chat, b"/evil/sink", Event::new());
    let _ = store.notify(&chat, event("second"));
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 0, "nothing was written through a link");
}
