//! An append that fails after its records reached the segment (an index
//! slot that cannot be written) leaves them to the next writer, which
//! adopts them: no later append of the same writer writes a record of the
//! same checkpoint over them (issue 37, suspected point a). A reader may
//! have delivered such a record already, with its checkpoint; before the
//! writer was fenced, the next event of a group made a record at a time
//! (one crossing a segment's end) took that checkpoint, over it.
//! (`--features failpoints`.)
#![cfg(feature = "failpoints")]

#[allow(dead_code)]
mod common;

use std::fs;

use common::{scratch, t};
use kn_journal::{Config, Event, Selection, Store};

fn event(id: &str, bytes: usize) -> Event {
    let mut e = Event::new();
    e.set("kn_id", id).set("kn_payload", "x".repeat(bytes));
    e
}

#[test]
fn a_group_failing_after_its_first_record_never_writes_another_over_it() {
    let dir = scratch("kn-append-fenced");
    let armed = dir.path().join("failpoints");
    fs::write(&armed, "").unwrap();
    // Set once, before any thread of this binary reads it.
    unsafe { std::env::set_var("KN_FAILPOINT", &armed) };
    let mut config = Config::new(dir.path().join("store"));
    config.segment_bytes = 4096;
    let store = Store::open_with(config).unwrap();
    let topic = t("/what/fenced");
    // Nearly a segment: the group below crosses its end and is made a
    // record at a time.
    store.notify(&topic, event("big", 3600)).unwrap();
    fs::write(&armed, "index-eio").unwrap();
    let answers = store.notify_nowait_group(&topic, vec![event("a", 300), event("b", 300)]).expect("made at once");
    fs::write(&armed, "").unwrap();
    assert!(answers.iter().all(Result::is_err), "{answers:?}");
    // The first record was written before its slot failed: the next
    // writer adopts it, at the checkpoint it was written with. The second
    // was never written.
    store.notify(&topic, event("c", 10)).unwrap();
    let events = store.events(&topic, &Selection::all()).unwrap().events;
    let ids: Vec<String> = events.iter().map(|e| String::from_utf8_lossy(e.id().unwrap_or(b"")).into_owned()).collect();
    assert_eq!(ids, ["big", "a", "c"]);
    let checkpoints: Vec<&[u8]> = events.iter().map(|e| e.get("kn_route_checkpoint").unwrap_or(b"")).collect();
    assert!(checkpoints.windows(2).all(|w| w[0] != w[1]), "{checkpoints:?}");
    assert!(store.verify().unwrap().problems.is_empty(), "{:?}", store.verify().unwrap().problems);
}
