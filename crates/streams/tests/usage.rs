//! The store counts the streams kn-streams creates (`Usage::streams`, the
//! `kn_store_streams` gauge), though it knows only their directory.

use std::sync::Arc;

use kn_journal::{Event, Selection, Store, Topic};
use kn_streams::{Create, Streams};

#[test]
fn usage_counts_the_streams_created() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path()).unwrap());
    let before = store.usage().unwrap();
    store.tunnel(&Topic::parse("/who/anna/kn_journal").unwrap(), &Selection::none()).unwrap();
    store.notify(&Topic::parse("/what/chat").unwrap(), Event::from_pairs([("kn_payload", "hi")])).unwrap();
    let streams = Streams::new(store.clone());
    streams.create("/s/one", &Create::new("text/plain")).unwrap();
    streams.create("/s/two", &Create::new("text/plain")).unwrap();
    let after = store.usage().unwrap();
    assert_eq!((before.streams, after.streams), (0, 2), "{after:?}");
    assert!(after.files > before.files && after.directories > before.directories, "{before:?} {after:?}");
}
