//! A store written by the release before issue 39 (format version 4,
//! tests/data/v4-store.tar.gz, made by tests/data/make-v4-store.sh, with
//! its manifest) opens and works unchanged with `Config::follow` on (the
//! setting of issue 39's windows, docs/design/one-copy.md): every journal
//! of the manifest ends at its checkpoint, reads the same as a view
//! (`Store::journal_view`: its routes, made before windows existed, have
//! none, so the view is its own records), and a new post to the fan-out's
//! source reaches each of its 40 journals at the next checkpoint. The
//! conversion of such a store (step 5) is not built yet.

use std::path::{Path, PathBuf};
use std::process::Command;

use kn_journal::{Config, Event, Selection, Store, Topic};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data")
}

/// The manifest's `key value...` lines.
fn manifest() -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(data().join("v4-store.manifest")).unwrap();
    text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).map(|l| l.split_whitespace().map(str::to_string).collect()).collect()
}

fn extracted() -> Option<tempfile::TempDir> {
    let dir = tempfile::tempdir().unwrap();
    let tarball = data().join("v4-store.tar.gz");
    // -m: every mtime now, so that no journal is stale (the script's note).
    match Command::new("tar").arg("-xzmf").arg(&tarball).arg("-C").arg(dir.path()).status() {
        Ok(s) if s.success() => Some(dir),
        Ok(s) => panic!("tar -xzmf {} failed: {s}", tarball.display()),
        Err(e) if std::env::var("CI").as_deref() != Ok("true") => {
            eprintln!("skipped: no tar ({e})");
            None
        }
        Err(e) => panic!("tar is needed under CI: {e}"),
    }
}

fn last_checkpoint(store: &Store, journal: &Topic) -> u64 {
    let events = store.events(journal, &Selection::all()).unwrap().events;
    events.last().and_then(|e| std::str::from_utf8(e.checkpoint()?).ok()?.parse().ok()).unwrap_or(0)
}

#[test]
fn a_version_4_store_opens_and_works_unchanged_with_follow_on() {
    let Some(dir) = extracted() else { return };
    let lines = manifest();
    let url = lines.iter().find(|l| l[0] == "public_url").map(|l| l[1].clone()).expect("public_url");
    let mut config = Config::new(dir.path().join("kn_events"));
    config.reserve_bytes = 0;
    config.server_url = Some(url);
    config.follow = true;
    let store = Store::open_with(config).unwrap();

    let journals: Vec<(Topic, u64)> =
        lines.iter().filter(|l| l[0] == "journal").map(|l| (Topic::parse(&l[1]).unwrap(), l[2].parse().unwrap())).collect();
    assert!(journals.len() >= 6, "{journals:?}");
    for (journal, last) in &journals {
        assert_eq!(last_checkpoint(&store, journal), *last, "{journal} ends where the manifest says");
        let today = store.events(journal, &Selection::all()).unwrap().events;
        assert_eq!(store.journal_view(journal).unwrap(), today, "{journal}: the view of a version-4 journal is its records");
    }

    let fanout = lines.iter().find(|l| l[0] == "fanout").expect("fanout");
    let (source, n): (Topic, usize) = (Topic::parse(&fanout[1]).unwrap(), fanout[2].parse().unwrap());
    let followers: Vec<Topic> = (0..n).map(|i| Topic::parse(&format!("/who/room/{i}/kn_journal")).unwrap()).collect();
    let before: Vec<u64> = followers.iter().map(|j| last_checkpoint(&store, j)).collect();
    let event = Event::from_pairs([(b"kn_payload".to_vec(), b"after the upgrade".to_vec())]);
    store.notify(&source, event).unwrap();
    for (journal, before) in followers.iter().zip(before) {
        let events = store.events(journal, &Selection::all()).unwrap().events;
        let last = events.last().expect("an event");
        assert_eq!(last.payload(), b"after the upgrade", "{journal}");
        assert_eq!(last_checkpoint(&store, journal), before + 1, "{journal} numbers on");
        assert_eq!(store.journal_view(journal).unwrap(), events, "{journal}: the view after the post");
    }
}
