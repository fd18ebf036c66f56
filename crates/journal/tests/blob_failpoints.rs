//! A post that fails between storing a blob, linking it and writing its
//! record leaves no record without its blob (`--features failpoints`).
#![cfg(feature = "failpoints")]

#[allow(dead_code)]
mod common;

use std::fs;

use common::{scratch, t};
use kn_journal::{Config, Event, Selection, Store};

#[test]
fn failures_between_blob_and_record_leave_no_dangling_reference() {
    let dir = scratch("kn-blobs-fail");
    let armed = dir.path().join("failpoints");
    // Set once, before any thread of this binary reads it.
    unsafe { std::env::set_var("KN_FAILPOINT", &armed) };
    let root = dir.path().join("store");
    let mut c = Config::new(&root);
    c.blob_bytes = 1024;
    let store = Store::open_with(c).unwrap();
    let topic = t("/f");
    let tdir = root.join("f");
    let payload: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
    for (round, point) in ["blob-stored", "blob-linked"].iter().enumerate() {
        fs::write(&armed, point).unwrap();
        let mut e = Event::new();
        e.set("kn_id", format!("lost{round}")).set("kn_payload", payload.clone());
        assert!(store.notify(&topic, e).is_err(), "{point}");
        fs::write(&armed, "").unwrap();
        assert!(store.events(&topic, &Selection::all()).unwrap().events.iter().all(|e| e.payload() == &payload[..]));
        let problems = store.verify().unwrap().problems;
        // Only leftovers: an orphan blob (stored, never linked) or an
        // unreferenced link; never a record without its blob.
        assert!(problems.iter().all(|p| p.reason.contains("orphan")), "{point}: {problems:#?}");
    }
    // The next post reuses the seq whose link was left behind: it replaces it.
    let mut e = Event::new();
    e.set("kn_id", "kept").set("kn_payload", payload.iter().map(|b| b ^ 1).collect::<Vec<u8>>());
    store.notify(&topic, e).unwrap();
    let events = store.events(&topic, &Selection::all()).unwrap().events;
    assert_eq!(events.len(), 1);
    assert!(events[0].payload().iter().zip(&payload).all(|(a, b)| *a == b ^ 1));
    store.repair().unwrap();
    assert!(store.verify().unwrap().problems.is_empty(), "{:?}", store.verify().unwrap().problems);
    let blobs = fs::read_dir(root.join(".blobs")).unwrap().count();
    assert_eq!(blobs, 1, "only the kept event's blob");
    assert!(tdir.join(".blob-0000000000000001").exists());
}
