//! Journals that follow their sources, as far as issue 39 has come
//! (docs/design/one-copy.md, step 3 in part): with `Config::follow`
//! (`KN_FOLLOW=on`) a route into a local journal writes its window over
//! the source beside today's copies, and the journal read as a view of
//! its windows (`Store::journal_view`) is today's journal, element for
//! element and checkpoint for checkpoint. Off (the default), nothing of
//! it is written.

mod common;
use common::{config, ev, scratch, t};

use kn_journal::internal::windows::{self, WINDOWS_DIR};
use kn_journal::{Event, Selection, Store, Topic};

/// A small deterministic generator (xorshift), seeded per case, so that a
/// failing case is named by its seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn open(follow: bool) -> (tempfile::TempDir, Store) {
    let dir = scratch("kn-journal-follow-");
    let mut c = config(dir.path());
    c.follow = follow;
    let store = Store::open_with(c).unwrap();
    (dir, store)
}

fn live(store: &Store, name: &str) -> Topic {
    let j = t(name);
    drop(store.tunnel(&j, &Selection::none()).unwrap());
    j
}

fn journal(store: &Store, j: &Topic) -> Vec<Event> {
    store.events(j, &Selection::all()).unwrap().events
}

fn checkpoints(events: &[Event]) -> Vec<String> {
    events.iter().map(|e| String::from_utf8_lossy(e.checkpoint().unwrap_or_default()).into_owned()).collect()
}

/// Posts, routes made and deleted (one route into the journal at a time:
/// a second one would be secondary, whose records this stage cannot
/// place yet), and direct posts while no route is active.
fn run(seed: u64, steps: usize) {
    let (dir, store) = open(true);
    let j = live(&store, "/page/kn_journal");
    let sources = [t("/room0"), t("/room1")];
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut active: Option<(usize, String)> = None;
    for n in 0..steps {
        let id = format!("e{n}");
        match rng.below(10) {
            0..=5 => {
                let i = rng.below(2) as usize;
                store.notify(&sources[i], ev(&[("kn_id", &id), ("kn_payload", &id)])).unwrap();
            }
            6 if active.is_none() => {
                store.notify(&j, ev(&[("kn_id", &id), ("kn_payload", &id)])).unwrap();
            }
            7 | 8 if active.is_none() => {
                let i = rng.below(2) as usize;
                let route = format!("r{n}");
                store.route(&sources[i], j.as_str().as_bytes(), ev(&[("kn_id", &route)])).unwrap();
                active = Some((i, route));
            }
            9 => {
                if let Some((i, route)) = active.take() {
                    store.delete_route(&sources[i], route.as_bytes(), None).unwrap();
                }
            }
            _ => {}
        }
    }
    let today = journal(&store, &j);
    let view = store.journal_view(&j).unwrap();
    assert_eq!(checkpoints(&view), checkpoints(&today), "seed {seed}: checkpoints");
    assert_eq!(view, today, "seed {seed}: the view is today's journal, element for element");
    let last: u64 = today.last().map_or(0, |e| String::from_utf8_lossy(e.checkpoint().unwrap()).parse().unwrap());
    let mut selections: Vec<Selection> = (0..=last + 1)
        .map(|c| Selection { since_checkpoint: Some(c.to_string().into_bytes()), ..Selection::none() })
        .chain((0..4).map(|n| Selection { max_n: Some(n), ..Selection::none() }))
        .collect();
    selections.push(Selection::none());
    selections.push(Selection { since_checkpoint: Some(b"x".to_vec()), ..Selection::none() });
    selections.push(Selection { max_age: Some(3600.0), max_n: Some(2), ..Selection::none() });
    for selection in &selections {
        let today = store.events(&j, selection).unwrap();
        let view = store.journal_view_selected(&j, selection).unwrap();
        assert_eq!(view.resume, today.resume, "seed {seed}: {selection:?}");
        assert_eq!(view.events, today.events, "seed {seed}: {selection:?}");
    }
    drop(dir);
}

#[test]
fn a_journal_read_through_its_windows_is_todays_journal() {
    for seed in 1..=40 {
        run(seed, 60);
    }
}

#[test]
fn a_route_opens_a_window_at_the_sources_end_and_its_deletion_closes_it() {
    let (dir, store) = open(true);
    let j = live(&store, "/page/kn_journal");
    let room = t("/room");
    for i in 0..3 {
        store.notify(&room, ev(&[("kn_payload", &format!("before {i}"))])).unwrap();
    }
    store.route(&room, j.as_str().as_bytes(), ev(&[("kn_id", "r1")])).unwrap();
    store.notify(&room, ev(&[("kn_payload", "after")])).unwrap();
    let found = windows::read(&dir.path().join("room")).unwrap();
    assert_eq!(found.windows.len(), 1);
    let w = &found.windows[0];
    assert_eq!((w.journal.as_str(), w.route.as_slice()), (j.as_str(), &b"r1"[..]));
    assert_eq!(w.from, 3, "opened after the three events stored before the route");
    assert_eq!(w.base, -3, "the journal's first event is numbered 1");
    assert!(w.is_open());
    store.delete_route(&room, b"r1", None).unwrap();
    store.notify(&room, ev(&[("kn_payload", "deleted")])).unwrap();
    let found = windows::read(&dir.path().join("room")).unwrap();
    let closed = found.windows[0].closed.as_ref().expect("closed by the deletion");
    assert_eq!((closed.until, closed.spent), (4, 4));
    let view = store.journal_view(&j).unwrap();
    assert_eq!(view.iter().map(|e| e.payload().to_vec()).collect::<Vec<_>>(), [b"after".to_vec()]);
    assert_eq!(view, journal(&store, &j));
}

#[test]
fn an_identical_route_repeated_changes_no_window() {
    let (dir, store) = open(true);
    let j = live(&store, "/page/kn_journal");
    let room = t("/room");
    store.route(&room, j.as_str().as_bytes(), ev(&[("kn_id", "r1")])).unwrap();
    let again = store.route(&room, j.as_str().as_bytes(), ev(&[("kn_id", "r1")])).unwrap();
    assert!(again.ignored);
    assert_eq!(windows::read(&dir.path().join("room")).unwrap().windows.len(), 1);
}

#[test]
fn a_second_route_into_a_followed_journal_opens_no_window() {
    let (dir, store) = open(true);
    let j = live(&store, "/page/kn_journal");
    store.route(&t("/room"), j.as_str().as_bytes(), ev(&[("kn_id", "r1")])).unwrap();
    store.route(&t("/status"), j.as_str().as_bytes(), ev(&[("kn_id", "r2")])).unwrap();
    assert_eq!(windows::read(&dir.path().join("room")).unwrap().windows.len(), 1);
    assert!(windows::read(&dir.path().join("status")).unwrap().windows.is_empty(), "secondary: recorded, not followed");
}

#[test]
fn without_follow_no_window_is_written() {
    let (dir, store) = open(false);
    let j = live(&store, "/page/kn_journal");
    let room = t("/room");
    store.route(&room, j.as_str().as_bytes(), ev(&[("kn_id", "r1")])).unwrap();
    store.notify(&room, ev(&[("kn_payload", "x")])).unwrap();
    store.delete_route(&room, b"r1", None).unwrap();
    assert!(!dir.path().join("room").join(WINDOWS_DIR).exists());
    assert_eq!(journal(&store, &j).len(), 1, "today's copy");
}

#[test]
fn the_sweep_closes_a_removed_journals_window_and_the_journal_made_again_numbers_on() {
    let (dir, store) = open(true);
    let j = live(&store, "/page/kn_journal");
    let room = t("/room");
    store.route(&room, j.as_str().as_bytes(), ev(&[("kn_id", "r1")])).unwrap();
    for i in 0..3 {
        store.notify(&room, ev(&[("kn_payload", &format!("first life {i}"))])).unwrap();
    }
    store.expire(&j).unwrap();
    let report = store.sweep_all(Some(std::time::Duration::ZERO)).unwrap();
    assert_eq!((report.journals_removed, report.routes_removed), (1, 1), "{report:?}");
    let found = windows::read(&dir.path().join("room")).unwrap();
    assert!(!found.windows[0].is_open(), "the sweep's deletion of the route closed its window");

    let j = live(&store, "/page/kn_journal");
    store.route(&room, j.as_str().as_bytes(), ev(&[("kn_id", "r2")])).unwrap();
    for i in 0..2 {
        store.notify(&room, ev(&[("kn_payload", &format!("second life {i}"))])).unwrap();
    }
    let found = windows::read(&dir.path().join("room")).unwrap();
    assert_eq!(found.windows.len(), 2);
    assert!(found.windows[1].is_open());
    let today = journal(&store, &j);
    assert_eq!(checkpoints(&today), ["4", "5"], "today's journal made again numbers on");
    assert_eq!(store.journal_view(&j).unwrap(), today);
}

#[test]
fn a_filtered_window_keeps_its_filter_once_its_route_is_deleted() {
    let (dir, store) = open(true);
    let j = live(&store, "/page/kn_journal");
    let room = t("/room");
    store.route(&room, j.as_str().as_bytes(), ev(&[("kn_id", "r1"), ("kn_content_filter", "^urgent")])).unwrap();
    for p in ["urgent 1", "chatter", "urgent 2"] {
        store.notify(&room, ev(&[("kn_payload", p)])).unwrap();
    }
    store.delete_route(&room, b"r1", None).unwrap();
    store.notify(&room, ev(&[("kn_payload", "urgent after")])).unwrap();
    let found = windows::read(&dir.path().join("room")).unwrap();
    assert_eq!(found.windows[0].filter.as_deref(), Some(&b"^urgent"[..]));
    let payloads = |events: Vec<Event>| events.iter().map(|e| String::from_utf8_lossy(e.payload()).into_owned()).collect::<Vec<_>>();
    assert_eq!(payloads(store.journal_view(&j).unwrap()), ["urgent 1", "urgent 2"]);
    assert_eq!(payloads(journal(&store, &j)), ["urgent 1", "urgent 2"], "today's copies");
    // The filtered event leaves its number unused in the view (strictly
    // increasing, not consecutive: FORMAT.md, "Checkpoints").
    assert_eq!(checkpoints(&store.journal_view(&j).unwrap()), ["1", "3"]);
}
