//! The disk a protocol test suite like mod_pubsub's leaves in a store: a
//! fixed sequence of posts (small notifies on many topics, repeats,
//! routes between topics and to journals, one 1 MiB payload routed to two
//! journals), then `du -s`-style usage (`st_blocks * 512` of every file and
//! directory, hard links once) and the bytes in files.
//!
//! `cargo run -p kn-journal --example store_footprint [DIR]` (a temporary
//! directory by default; see BENCHMARKS.md for the figures).

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use kn_journal::{Event, Store, Topic};

fn topic(name: &str) -> Topic {
    Topic::parse(name).expect("valid topic")
}

fn event(id: &str, payload: impl Into<Vec<u8>>) -> Event {
    let mut e = Event::new();
    e.set("kn_id", id).set("kn_payload", payload.into());
    e
}

fn journal(store: &Store, t: &Topic) -> Topic {
    let j = t.child("kn_journal").expect("journal topic");
    let dir = j.segments().fold(store.root().to_path_buf(), |d, s| d.join(s));
    std::fs::create_dir_all(dir).expect("journal directory");
    store.heartbeat(&j).expect("heartbeat");
    j
}

fn route(store: &Store, from: &Topic, to: &Topic, id: &str) {
    let mut params = Event::new();
    params.set("kn_id", id);
    store.route(from, to.as_str().as_bytes(), params).expect("route");
}

/// `(du bytes, file bytes, files, directories)` of the tree at `root`.
fn usage(root: &Path) -> (u64, u64, u64, u64) {
    let mut seen = HashSet::new();
    let (mut du, mut bytes, mut files, mut dirs) = (0, 0, 0, 0);
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        du += std::fs::symlink_metadata(&dir).map(|m| m.blocks() * 512).unwrap_or(0);
        dirs += 1;
        for entry in std::fs::read_dir(&dir).expect("list").flatten() {
            let m = entry.metadata().expect("stat");
            if m.is_dir() {
                stack.push(entry.path());
            } else if seen.insert(m.ino()) {
                du += m.blocks() * 512;
                bytes += m.len();
                files += 1;
            }
        }
    }
    (du, bytes, files, dirs)
}

fn main() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = std::env::args().nth(1).map(std::path::PathBuf::from).unwrap_or_else(|| tmp.path().join("kn_events"));
    let store = Store::open(&root).expect("open store");
    // Notifies: 60 topics, 5 small events each, every one posted twice
    // (the repeat is a duplicate), one with an expiry.
    for i in 0..60 {
        let t = topic(&format!("/what/test{i}"));
        for k in 0..5 {
            let e = event(&format!("e{k}"), format!("payload {k} of test {i}: some text as the tests send"));
            store.notify(&t, e.clone()).expect("notify");
            store.notify(&t, e).expect("repeat");
        }
        let mut expiring = event("x", "short-lived");
        expiring.set("kn_expires", "+60");
        store.notify(&t, expiring).expect("expiring");
    }
    // Routes: 20 topics each routed to its journal and to the next topic.
    for i in 0..20 {
        let t = topic(&format!("/what/routed{i}"));
        let j = journal(&store, &t);
        route(&store, &t, &j, "to-journal");
        route(&store, &t, &topic(&format!("/what/routed_to{i}")), "to-topic");
        for k in 0..5 {
            store.notify(&t, event(&format!("r{k}"), format!("routed event {k}"))).expect("routed notify");
        }
    }
    // One 1 MiB payload, on a topic routed to two journals.
    let big = topic("/what/big");
    let j1 = journal(&store, &big);
    let other = topic("/what/big_copy");
    let j2 = journal(&store, &other);
    route(&store, &big, &j1, "j1");
    route(&store, &big, &j2, "j2");
    let payload: Vec<u8> = (0..1usize << 20).map(|i| (i * 13 + i / 1021) as u8).collect();
    store.notify(&big, event("big", payload)).expect("big notify");
    let (du, bytes, files, dirs) = usage(&root);
    println!(
        "store footprint: du -s {:.2} MB, {:.2} MB in {files} files, {dirs} directories ({du} / {bytes} bytes)",
        du as f64 / 1e6,
        bytes as f64 / 1e6
    );
}
