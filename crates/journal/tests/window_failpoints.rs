//! A route write whose window record cannot be written (issue 39,
//! `KN_FOLLOW`; docs/design/one-copy.md, "What a crash leaves"): a new
//! route stays a route without a window, read as a version-4 route (its
//! copies), and a deletion whose closing record fails is refused, the
//! route still active, so that no window stays open for a deleted route.
//! (`--features failpoints`.)
#![cfg(feature = "failpoints")]

#[allow(dead_code)]
mod common;

use std::fs;

use common::{config, ev, scratch, t};
use kn_journal::internal::windows;
use kn_journal::{Selection, Store};

#[test]
fn a_route_write_without_its_window_record_leaves_the_journal_as_today() {
    let dir = scratch("kn-window-failpoints");
    let armed = dir.path().join("failpoints");
    fs::write(&armed, "").unwrap();
    // Set once, before any thread of this binary reads it.
    unsafe { std::env::set_var("KN_FAILPOINT", &armed) };
    let mut c = config(&dir.path().join("store"));
    c.follow = true;
    let store = Store::open_with(c).unwrap();
    let room = t("/room");
    let j = t("/page/kn_journal");
    drop(store.tunnel(&j, &Selection::none()).unwrap());
    let source = dir.path().join("store/room");
    let all = |store: &Store| store.events(&j, &Selection::all()).unwrap().events;

    // The opening record fails: the route is made, without a window.
    fs::write(&armed, "window-eio").unwrap();
    store.route(&room, j.as_str().as_bytes(), ev(&[("kn_id", "r1")])).unwrap();
    fs::write(&armed, "").unwrap();
    for i in 0..3 {
        store.notify(&room, ev(&[("kn_payload", &format!("a{i}"))])).unwrap();
    }
    assert!(windows::read(&source).unwrap().windows.is_empty());
    assert_eq!(all(&store).len(), 3, "today's copies");
    assert_eq!(store.journal_view(&j).unwrap(), all(&store), "a route without a window reads as its copies");
    store.delete_route(&room, b"r1", None).unwrap();

    // A route with its window; its deletion's closing record fails.
    store.route(&room, j.as_str().as_bytes(), ev(&[("kn_id", "r2")])).unwrap();
    store.notify(&room, ev(&[("kn_payload", "b0")])).unwrap();
    fs::write(&armed, "window-eio").unwrap();
    assert!(store.delete_route(&room, b"r2", None).is_err(), "the deletion is refused");
    fs::write(&armed, "").unwrap();
    assert!(store.routes(&room).unwrap().iter().any(|r| r.id() == b"r2"), "the route is still active");
    store.notify(&room, ev(&[("kn_payload", "b1")])).unwrap();
    assert_eq!(store.journal_view(&j).unwrap(), all(&store));
    // Retried: closed, then deleted; nothing more reaches the journal.
    store.delete_route(&room, b"r2", None).unwrap();
    store.notify(&room, ev(&[("kn_payload", "after")])).unwrap();
    let found = windows::read(&source).unwrap();
    assert_eq!(found.windows.len(), 1);
    assert!(!found.windows[0].is_open());
    let today = all(&store);
    assert_eq!(today.iter().map(|e| e.payload().to_vec()).collect::<Vec<_>>(), [b"a0".to_vec(), b"a1".to_vec(), b"a2".to_vec(), b"b0".to_vec(), b"b1".to_vec()]);
    assert_eq!(store.journal_view(&j).unwrap(), today);
}
