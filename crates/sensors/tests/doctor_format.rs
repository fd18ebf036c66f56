//! `kn doctor` says which format a store is in (issue 39,
//! docs/design/one-copy.md): format 4, journals holding their copies, and
//! how many topics keep window logs once `KN_FOLLOW` wrote some.

use std::path::Path;
use std::process::{Command, Stdio};

use kn_journal::{Config, Event, Selection, Store, Topic};

fn doctor(root: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kn")).arg("--root").arg(root).arg("doctor").stdin(Stdio::null()).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

fn routed(root: &Path, follow: bool) {
    let mut config = Config::new(root);
    config.reserve_bytes = 0;
    config.follow = follow;
    let store = Store::open_with(config).unwrap();
    let journal = Topic::parse("/who/kn_journal").unwrap();
    drop(store.tunnel(&journal, &Selection::none()).unwrap());
    let params = Event::from_pairs([(b"kn_id".to_vec(), b"r1".to_vec())]);
    store.route(&Topic::parse("/room").unwrap(), journal.as_str().as_bytes(), params).unwrap();
}

#[test]
fn doctor_says_the_store_format_and_the_window_logs_it_keeps() {
    let plain = tempfile::tempdir().unwrap();
    routed(plain.path(), false);
    let out = doctor(plain.path());
    assert!(out.contains("store format 4: journals hold one copy of each event they show\n"), "{out}");

    let followed = tempfile::tempdir().unwrap();
    routed(followed.path(), true);
    let out = doctor(followed.path());
    assert!(out.contains("store format 4: journals hold one copy of each event they show; 1 topics keep window logs"), "{out}");
    assert!(out.contains("0 converted"), "{out}");
}
