//! Window writes killed at random points (issue 39, `KN_FOLLOW`;
//! docs/design/one-copy.md, "What a crash leaves, at each step"):
//! processes routing a source into a journal, deleting the route and
//! posting to the source are SIGKILLed again and again. Whatever point a
//! kill hit (between a deletion's closing record and the deletion, between
//! a route record and its opening record, in the middle of either), the
//! window log stays readable, at most one window into the journal is open
//! and it belongs to an active route; and in a run where today's journal
//! lost no event (below), the journal read through its windows is today's.

use std::path::Path;
use std::time::Duration;

mod common;
use common::{config, ev, scratch, t};

use kn_journal::internal::windows;
use kn_journal::{Selection, Store};

const JOURNAL: &str = "/page/kn_journal";

fn open(root: &Path) -> Store {
    let mut c = config(root);
    c.follow = true;
    Store::open_with(c).unwrap()
}

/// Run by `window_writes_killed_at_random_points_keep_the_view_todays_journal`
/// in a child process: routes, deletes and posts until killed.
#[test]
#[ignore = "a child process of the kill test, which runs it with --ignored"]
fn child_routes_deletes_and_posts_until_killed() {
    let root = std::env::var_os("KN_WINDOWS_KILL_CHILD").expect("run by the kill test");
    let store = open(Path::new(&root));
    let room = t("/room");
    let pid = std::process::id();
    for i in 0.. {
        if i % 4 == 0 {
            match store.routes(&room).unwrap().first() {
                Some(route) => {
                    let id = route.id().to_vec();
                    store.delete_route(&room, &id, None).unwrap();
                }
                None => {
                    store.route(&room, JOURNAL.as_bytes(), ev(&[("kn_id", &format!("r{pid}-{i}"))])).unwrap();
                }
            }
        } else {
            store.notify(&room, ev(&[("kn_id", &format!("e{pid}-{i}")), ("kn_payload", "x")])).unwrap();
        }
    }
}

#[test]
fn window_writes_killed_at_random_points_keep_the_view_todays_journal() {
    let dir = scratch("kn-journal-windows-crash-");
    let root = dir.path();
    let store = open(root);
    let j = t(JOURNAL);
    drop(store.tunnel(&j, &Selection::none()).unwrap());
    let mut seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    eprintln!("seed {seed}");
    for _ in 0..40 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_routes_deletes_and_posts_until_killed", "--ignored", "--nocapture"])
            .env("KN_WINDOWS_KILL_CHILD", root)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_micros(5_000 + seed % 40_000));
        child.kill().unwrap();
        child.wait().unwrap();
    }
    // A last post, by a process that was not killed.
    store.notify(&t("/room"), ev(&[("kn_payload", "last")])).unwrap();

    let found = windows::read(&root.join("room")).unwrap();
    assert_eq!(found.unreadable, 0);
    let open: Vec<_> = found.windows.iter().filter(|w| w.is_open()).collect();
    assert!(open.len() <= 1, "one primary at most: {open:?}");
    let active = store.routes(&t("/room")).unwrap();
    for w in &open {
        assert!(active.iter().any(|r| r.id() == w.route.as_slice()), "an open window belongs to an active route: {w:?}");
    }
    let today = store.events(&j, &Selection::all()).unwrap().events;
    assert!(found.windows.len() >= 3 && today.len() > 10, "the children routed and posted: {} windows, {} events", found.windows.len(), today.len());
    // Today's journal loses an event whose copy was pending when its
    // poster was killed and whose route was deleted before a drain carried
    // it; its window shows it (the source's record is the commit point),
    // so the view runs ahead of today's numbers from there, and the copies
    // of a later route without a window (killed before its opening record)
    // are numbered by the journal's writer, which does not yet number
    // above the windows (docs/design/one-copy.md). Until it
    // does, the view is held to today's journal only in runs where no
    // event was lost.
    let view = store.journal_view(&j).unwrap();
    let ids = |events: &[kn_journal::Event]| -> Vec<String> { events.iter().map(|e| String::from_utf8_lossy(e.id().unwrap_or_default()).into_owned()).collect() };
    let (v, mut d) = (ids(&view), ids(&today));
    // A copy made twice (a drain killed after its append, before its
    // cursor: "at least once into a journal", FORMAT.md's known limits)
    // is one event of the source, shown once by the window.
    d.dedup();
    let shown: std::collections::HashSet<&String> = v.iter().collect();
    let lost = v.iter().any(|id| !d.contains(id));
    if lost {
        eprintln!("some events lost by today's journal: the view is not compared ({} in the view, {} today)", shown.len(), d.len());
    } else {
        assert_eq!(v, d, "nothing lost: the view holds today's events, in order");
        if d.len() == today.len() {
            assert_eq!(view, today, "nothing lost or doubled: the view is today's journal, checkpoints included");
        }
    }
    assert!(store.verify().unwrap().problems.is_empty());
    eprintln!("{} windows, {} events in the journal", found.windows.len(), today.len());
}
