//! Group commit (`Config::group_commit`): posts of one process waiting
//! for the same topic are stored together, with one lock, one write and
//! one forwarding pass, each answered for its own event; other stores
//! (processes) on the topic interleave whole records with them.

use std::collections::BTreeSet;
use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

mod common;
use common::{config, ev, scratch, t};

use kn_journal::{Config, Event, PostReport, Selection, Store, Topic};

fn open(root: &std::path::Path, group: usize) -> Arc<Store> {
    let mut c: Config = config(root);
    c.group_commit = group;
    Arc::new(Store::open_with(c).unwrap())
}

/// Routes `room` into a journal (opened first, as its tunnel would) and an
/// ordinary topic; returns them.
fn route(store: &Store, room: &Topic) -> (Topic, Topic) {
    let (journal, archive) = (t("/who/anna/kn_journal"), t("/archive"));
    drop(store.tunnel(&journal, &Selection::none()).unwrap());
    store.heartbeat(&journal).unwrap();
    for (i, d) in [&journal, &archive].iter().enumerate() {
        let mut r = Event::new();
        r.set("kn_id", format!("r{i}"));
        store.route(room, d.to_string().as_bytes(), r).unwrap();
    }
    (journal, archive)
}

fn ids(store: &Store, topic: &Topic) -> Vec<String> {
    store
        .events(topic, &Selection::all())
        .unwrap()
        .events
        .iter()
        .map(|e| String::from_utf8_lossy(e.id().unwrap()).into_owned())
        .collect()
}

/// (kn_id, checkpoint) of every current event of `topic`.
fn stored(store: &Store, topic: &Topic) -> Vec<(String, u64)> {
    store
        .events(topic, &Selection::all())
        .unwrap()
        .events
        .iter()
        .map(|e| {
            (
                String::from_utf8_lossy(e.id().unwrap()).into_owned(),
                e.get_str("kn_route_checkpoint").unwrap().parse().unwrap(),
            )
        })
        .collect()
}

/// Waits (at most a minute) until `topic` has `queued` posts queued and
/// `storing` in the group being stored.
fn wait_for(store: &Store, topic: &Topic, want: (usize, usize)) {
    let until = Instant::now() + Duration::from_secs(60);
    while store.posts_waiting(topic) != want {
        assert!(
            Instant::now() < until,
            "posts waiting: {:?}, expected {want:?}",
            store.posts_waiting(topic)
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Holds `path`'s `flock` (as another process would) while it lives.
fn hold_lock(path: &std::path::Path) -> std::fs::File {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .unwrap();
    assert_eq!(
        unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&file), libc::LOCK_EX) },
        0
    );
    file
}

/// Posts `events` to `room` one thread each, in that order, while the
/// room's lock is held: the first post takes the room's turn and waits
/// for the lock, the others queue behind it (each waited for before the
/// next starts, so that the queue's order is `events`' order); then the
/// lock is let go. Returns each post's answer, in `events`' order.
fn post_behind_the_lock(store: &Arc<Store>, room: &Topic, events: Vec<Event>) -> Vec<PostReport> {
    let lock = hold_lock(
        &store
            .root()
            .join(room.as_str().trim_start_matches('/'))
            .join(".lock"),
    );
    let mut posts = Vec::new();
    for (i, e) in events.into_iter().enumerate() {
        let (poster, to) = (store.clone(), room.clone());
        posts.push(std::thread::spawn(move || poster.notify(&to, e).unwrap()));
        wait_for(store, room, if i == 0 { (0, 1) } else { (i, 1) });
    }
    drop(lock);
    posts.into_iter().map(|p| p.join().unwrap()).collect()
}

fn numbered(n: usize) -> Vec<Event> {
    (0..n)
        .map(|i| {
            ev(&[
                ("kn_id", &format!("e{i}")),
                ("kn_payload", &format!("p{i}")),
            ])
        })
        .collect()
}

/// Many threads posting to one routed topic at once: every event stored
/// once, each answer's checkpoint the one a fresh store reads back for its
/// id, and every destination given each event once, in the topic's order.
#[test]
fn posts_at_once_to_a_routed_topic_are_stored_once_and_forwarded_in_order() {
    let dir = scratch("kn-group-");
    let root = dir.path().join("kn_events");
    let store = open(&root, 64);
    let room = t("/chat/room");
    let (journal, archive) = route(&store, &room);
    let start = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|w| {
            let (store, room, start) = (store.clone(), room.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                (0..150)
                    .map(|i| {
                        let id = format!("w{w}-{i}");
                        let report = store
                            .notify(&room, ev(&[("kn_id", &id), ("kn_payload", &id)]))
                            .unwrap();
                        assert_eq!(report.id, id.as_bytes());
                        assert!(!report.duplicate);
                        let own = &report.writes[0];
                        assert_eq!(
                            (own.topic.to_string().as_str(), own.id.as_slice()),
                            ("/chat/room", id.as_bytes())
                        );
                        (id, own.checkpoint)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut answered: Vec<(String, u64)> = threads
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    answered.sort_by_key(|(_, seq)| *seq);
    drop(store);
    let fresh = Store::open_with(config(&root)).unwrap();
    assert_eq!(
        stored(&fresh, &room),
        answered,
        "answers and the log disagree"
    );
    let order: Vec<String> = answered.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(order.iter().collect::<BTreeSet<_>>().len(), 8 * 150);
    for d in [&journal, &archive] {
        assert_eq!(
            ids(&fresh, d),
            order,
            "{d}: not each event once in the room's order"
        );
    }
    assert!(
        fresh.complete_forwarding(&room).unwrap().writes.is_empty(),
        "nothing left pending"
    );
    assert_eq!(fresh.outbox_pending().unwrap(), 0);
}

/// Posts held behind the topic's lock go as one group when it is let go
/// (the first alone: it was waiting for the lock), stored as they queued;
/// without group commit each goes alone. Not timed: the test waits until
/// every post is queued.
#[test]
fn posts_waiting_for_a_topic_are_stored_as_one_group_in_queue_order() {
    for group in [64, 1] {
        let dir = scratch("kn-group-");
        let store = open(&dir.path().join("kn_events"), group);
        let room = t("/chat/room");
        let (journal, _) = route(&store, &room);
        store
            .notify(&room, ev(&[("kn_id", "first"), ("kn_payload", "0")]))
            .unwrap();
        if group == 1 {
            let threads: Vec<_> = numbered(8)
                .into_iter()
                .map(|e| {
                    let (store, room) = (store.clone(), room.clone());
                    std::thread::spawn(move || store.notify(&room, e).unwrap())
                })
                .collect();
            threads.into_iter().for_each(|h| drop(h.join().unwrap()));
            assert_eq!(store.grouped_posts(), 0);
            assert_eq!(
                store.events(&room, &Selection::all()).unwrap().events.len(),
                9
            );
            continue;
        }
        let reports = post_behind_the_lock(&store, &room, numbered(8));
        assert_eq!(
            store.grouped_posts(),
            7,
            "the seven queued behind the first, together"
        );
        let seqs: Vec<u64> = reports.iter().map(|r| r.writes[0].checkpoint).collect();
        assert_eq!(
            seqs,
            (2..10).collect::<Vec<u64>>(),
            "stored in the order they queued"
        );
        let want: Vec<String> = std::iter::once("first".to_string())
            .chain((0..8).map(|i| format!("e{i}")))
            .collect();
        assert_eq!(ids(&store, &room), want);
        assert_eq!(ids(&store, &journal), want);
        assert_eq!(store.posts_waiting(&room), (0, 0));
    }
}

/// `Config::group_commit` bounds a group: at the bound, every queued post
/// in one; one more than the bound, the last left for the next group.
#[test]
fn a_group_holds_at_most_group_commit_posts() {
    for (bound, grouped) in [(7, 7), (6, 6), (3, 6), (2, 6)] {
        let dir = scratch("kn-group-");
        let store = open(&dir.path().join("kn_events"), bound);
        let room = t("/chat/room");
        route(&store, &room);
        store.notify(&room, ev(&[("kn_payload", "0")])).unwrap();
        let reports = post_behind_the_lock(&store, &room, numbered(8));
        // Seven queued: groups of `bound` (a last group of one is no group).
        assert_eq!(store.grouped_posts(), grouped, "group_commit = {bound}");
        let seqs: Vec<u64> = reports.iter().map(|r| r.writes[0].checkpoint).collect();
        assert_eq!(
            seqs,
            (2..10).collect::<Vec<u64>>(),
            "group_commit = {bound}"
        );
    }
}

/// A group mixing a superseding event, a duplicate and an expired event is
/// stored as the same posts one after another are: the same answers, the
/// same current events, and an ordinary destination shows the same. A
/// journal (which keeps every post) is given each event of the group
/// that is current when the group is forwarded, in order: an event
/// superseded within its group is passed by, as a drain reading the log
/// passes it by (FORMAT.md, "Group commit"); the expired one never.
#[test]
fn a_group_with_superseded_duplicate_and_expired_events_is_stored_as_separate_posts() {
    let events = || {
        vec![
            ev(&[("kn_id", "lead"), ("kn_payload", "alone")]),
            ev(&[("kn_id", "x"), ("kn_payload", "first")]),
            ev(&[("kn_id", "y"), ("kn_payload", "other")]),
            ev(&[("kn_id", "x"), ("kn_payload", "second")]),
            ev(&[("kn_id", "x"), ("kn_payload", "second")]),
            ev(&[
                ("kn_id", "gone"),
                ("kn_payload", "old"),
                ("kn_expires", "1"),
            ]),
            ev(&[("kn_id", "y"), ("kn_payload", "other")]),
            ev(&[("kn_id", "z"), ("kn_payload", "last")]),
        ]
    };
    let answers = |reports: &[PostReport]| -> Vec<(bool, Option<u64>)> {
        reports
            .iter()
            .map(|r| (r.duplicate, r.writes.first().map(|w| w.checkpoint)))
            .collect()
    };
    let current = |store: &Store, topic: &Topic| -> Vec<(String, String)> {
        store
            .events(topic, &Selection::all())
            .unwrap()
            .events
            .iter()
            .map(|e| {
                (
                    String::from_utf8_lossy(e.id().unwrap()).into_owned(),
                    String::from_utf8_lossy(e.payload()).into_owned(),
                )
            })
            .collect()
    };
    let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    let one_dir = scratch("kn-group-");
    let one = open(&one_dir.path().join("kn_events"), 1);
    let room = t("/chat/room");
    let (_, one_archive) = route(&one, &room);
    one.notify(&room, ev(&[("kn_payload", "0"), ("kn_id", "start")]))
        .unwrap();
    let separate: Vec<PostReport> = events()
        .into_iter()
        .map(|e| one.notify(&room, e).unwrap())
        .collect();

    let dir = scratch("kn-group-");
    let store = open(&dir.path().join("kn_events"), 64);
    let (journal, archive) = route(&store, &room);
    store
        .notify(&room, ev(&[("kn_payload", "0"), ("kn_id", "start")]))
        .unwrap();
    let grouped = post_behind_the_lock(&store, &room, events());
    assert_eq!(store.grouped_posts(), 7);
    assert_eq!(answers(&grouped), answers(&separate));
    let expected = [
        (false, Some(2)),
        (false, Some(3)),
        (false, Some(4)),
        (false, Some(5)),
        (true, None),
        (false, Some(6)),
        (true, None),
        (false, Some(7)),
    ];
    assert_eq!(answers(&grouped), expected);
    assert_eq!(current(&store, &room), current(&one, &room));
    assert_eq!(
        current(&store, &room),
        pairs(&[
            ("start", "0"),
            ("lead", "alone"),
            ("y", "other"),
            ("x", "second"),
            ("z", "last")
        ])
    );
    assert_eq!(current(&store, &archive), current(&one, &one_archive));
    assert_eq!(
        current(&store, &journal),
        pairs(&[
            ("start", "0"),
            ("lead", "alone"),
            ("y", "other"),
            ("x", "second"),
            ("z", "last")
        ])
    );
    assert!(
        store.complete_forwarding(&room).unwrap().writes.is_empty(),
        "nothing left pending"
    );
}

/// Two stores (as two processes) posting to one topic at once, each with
/// threads whose posts group: every record whole and stored once, the
/// checkpoints 1 to N without a gap, each answer what the log holds.
#[test]
fn two_stores_posting_to_one_topic_interleave_whole_records() {
    let dir = scratch("kn-group-");
    let root = dir.path().join("kn_events");
    let stores = [open(&root, 64), open(&root, 64)];
    let room = t("/chat/room");
    route(&stores[0], &room);
    let start = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|w| {
            let (store, room, start) = (stores[w % 2].clone(), room.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                (0..100)
                    .map(|i| {
                        let id = format!("s{}-w{w}-{i}", w % 2);
                        (
                            id.clone(),
                            store
                                .notify(&room, ev(&[("kn_id", &id), ("kn_payload", &id)]))
                                .unwrap()
                                .writes[0]
                                .checkpoint,
                        )
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut answered: Vec<(String, u64)> = threads
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    answered.sort_by_key(|(_, seq)| *seq);
    let fresh = Store::open_with(config(&root)).unwrap();
    let verified = fresh.verify().unwrap();
    assert!(verified.problems.is_empty(), "{:?}", verified.problems);
    let got = stored(&fresh, &room);
    assert_eq!(got, answered);
    assert_eq!(
        got.iter().map(|(_, seq)| *seq).collect::<Vec<u64>>(),
        (1..=800).collect::<Vec<u64>>()
    );
    let journal = t("/who/anna/kn_journal");
    assert_eq!(
        ids(&fresh, &journal),
        got.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>()
    );
}

/// Notifies a server's event loop has in hand together
/// (`Store::notify_nowait_group`): made at once as one group, each
/// answered as a post alone is (its write, then its copies), the copies
/// in the topic's order; with a lock busy, nothing is done.
#[test]
fn notifies_in_hand_together_are_made_at_once_as_one_group() {
    let dir = scratch("kn-group-");
    let root = dir.path().join("kn_events");
    let store = open(&root, 64);
    let room = t("/chat/room");
    let (journal, archive) = route(&store, &room);
    store.notify(&room, ev(&[("kn_id", "start"), ("kn_payload", "0")])).unwrap();
    let events = vec![
        ev(&[("kn_id", "a"), ("kn_payload", "1")]),
        ev(&[("kn_id", "b"), ("kn_payload", "2")]),
        ev(&[("kn_id", "a"), ("kn_payload", "1")]),
        ev(&[("kn_id", "c"), ("kn_payload", "3")]),
    ];
    // A lock busy: nothing at all.
    let lock = hold_lock(&root.join("chat/room/.lock"));
    assert!(store.notify_nowait_group(&room, events.clone()).is_none());
    drop(lock);
    assert_eq!(ids(&store, &room), ["start"]);
    let answers: Vec<PostReport> = store.notify_nowait_group(&room, events).expect("made at once").into_iter().map(Result::unwrap).collect();
    let wrote = |r: &PostReport| -> Vec<(String, u64)> { r.writes.iter().map(|w| (w.topic.to_string(), w.checkpoint)).collect() };
    let mut first = wrote(&answers[0]);
    first[1..].sort();
    assert_eq!(first, [("/chat/room".to_string(), 2), ("/archive".to_string(), 2), ("/who/anna/kn_journal".to_string(), 2)]);
    assert!(answers[2].duplicate && answers[2].writes.is_empty(), "a duplicate, as alone");
    assert_eq!(answers.iter().map(|r| r.id.clone()).collect::<Vec<_>>(), [b"a".to_vec(), b"b".to_vec(), b"a".to_vec(), b"c".to_vec()]);
    assert_eq!(wrote(&answers[3])[0], ("/chat/room".to_string(), 4));
    drop(store);
    let fresh = Store::open_with(config(&root)).unwrap();
    for d in [&room, &journal, &archive] {
        assert_eq!(ids(&fresh, d), ["start", "a", "b", "c"], "{d}");
    }
    assert!(fresh.complete_forwarding(&room).unwrap().writes.is_empty(), "nothing left pending");
}
