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

#[test]
fn a_store_whose_own_path_has_a_link_works_and_a_file_in_a_topics_path_is_no_link() {
    // The check covers the components below the root only: a root
    // reached through a link (/var/lib -> /srv) is the operator's choice.
    let dir = tempfile::tempdir().expect("tempdir");
    fs::create_dir(dir.path().join("real")).expect("real");
    symlink(dir.path().join("real"), dir.path().join("via")).expect("link to the root's parent");
    let store = Store::open(dir.path().join("via/kn_events")).expect("store");
    let chat = Topic::parse("/what/chat").unwrap();
    store.notify(&chat, event("fine")).expect("a post below a linked root");
    assert_eq!(store.events(&chat, &Selection::all()).expect("read").events.len(), 1);
    // A plain file where a topic's directory would be: not a link, and
    // not a topic either (the answer says what it is, not "symbolic link").
    fs::write(dir.path().join("real/kn_events/what/file"), b"x").expect("a file");
    let err = store.notify(&Topic::parse("/what/file/x").unwrap(), event("no")).unwrap_err();
    assert!(!err.to_string().contains("symbolic link"), "{err}");
}
