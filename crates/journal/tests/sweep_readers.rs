//! The sweep and the readers of a topic (issue 28, item 5): a topic with a
//! live tunnel, in this or another process, is not removed, and one killed
//! with SIGKILL keeps it no more; a topic created again after its removal
//! goes on numbering, so a client resuming after a checkpoint of the old
//! one gets every new event (or, on a journal that lost events, the gap
//! answer); a stream bound to it: crates/streams/tests/topic_removed.rs.

use std::io::BufRead as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod common;
use common::{config, ev, scratch, t};

use kn_journal::{Config, Event, Resume, Selection, Store, Topic};

/// The reviewer's settings, faster: topics pruned as soon as they are
/// empty, journals as soon as they are stale (200 ms after their tunnel).
fn fast(root: &Path) -> Config {
    let mut c = config(root);
    c.topic_grace = Duration::ZERO;
    c.journal_grace = Duration::ZERO;
    c.heartbeat_stale = Duration::from_millis(200);
    c
}

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

/// Posts `old1`..`old3`, expiring a second from now: the topic is empty
/// once they have expired.
fn post_expiring(store: &Store, topic: &Topic) {
    let expires = format!("{:.3}", now() + 1.0);
    for n in 1..=3 {
        store.notify(topic, ev(&[("kn_id", &format!("old{n}")), ("kn_payload", &format!("old{n}")), ("kn_expires", &expires)])).unwrap();
    }
}

fn post_new(store: &Store, topic: &Topic) {
    for n in 1..=5 {
        store.notify(topic, ev(&[("kn_id", &format!("new{n}")), ("kn_payload", &format!("new{n}"))])).unwrap();
    }
}

fn payloads(events: &[Event]) -> Vec<String> {
    events.iter().map(|e| String::from_utf8_lossy(e.payload()).into_owned()).collect()
}

fn checkpoint(e: &Event) -> u64 {
    std::str::from_utf8(e.checkpoint().unwrap()).unwrap().parse().unwrap()
}

fn exists(root: &Path, topic: &Topic) -> bool {
    root.join(&topic.as_str()[1..]).is_dir()
}

const NEW: [&str; 5] = ["new1", "new2", "new3", "new4", "new5"];

#[test]
fn a_topic_with_a_live_tunnel_is_not_pruned_and_the_tunnel_gets_every_new_event() {
    let dir = scratch("kn-journal-readers-");
    let store = Store::open_with(fast(dir.path())).unwrap();
    let chat = t("/what/chat");
    let mut tunnel = store.tunnel(&chat, &Selection::none()).unwrap().tunnel;
    post_expiring(&store, &chat);
    assert_eq!(payloads(&tunnel.wait(&store, Duration::from_secs(5)).unwrap()), ["old1", "old2", "old3"]);
    std::thread::sleep(Duration::from_millis(1100));
    // A whole pass, slices, and another process's pass: none removes it.
    assert_eq!(store.sweep_all(Some(Duration::ZERO)).unwrap().topics_pruned, 0);
    store.sweep(64).unwrap();
    let other = Store::open_with(fast(dir.path())).unwrap();
    assert_eq!(other.sweep_all(Some(Duration::ZERO)).unwrap().topics_pruned, 0);
    assert!(exists(dir.path(), &chat));
    post_new(&store, &chat);
    let mut got = Vec::new();
    while got.len() < 5 {
        let events = tunnel.wait(&store, Duration::from_secs(5)).unwrap();
        assert!(!events.is_empty(), "the tunnel got {got:?}");
        got.extend(payloads(&events));
    }
    assert_eq!(got, NEW);
    assert!(got.len() == 5 && tunnel.checkpoint() == 8);
}

#[test]
fn a_tunnel_on_kn_subtopics_keeps_its_topic_too() {
    let dir = scratch("kn-journal-readers-");
    let store = Store::open_with(fast(dir.path())).unwrap();
    let room = t("/what/room");
    store.tunnel(&room, &Selection::none()).unwrap();
    let watching = store.tunnel(&room.subtopics(), &Selection::none()).unwrap();
    assert_eq!(store.sweep_all(Some(Duration::ZERO)).unwrap().topics_pruned, 0);
    assert!(exists(dir.path(), &room));
    drop(watching);
    assert!(store.sweep_all(Some(Duration::ZERO)).unwrap().topics_pruned >= 1);
    assert!(!exists(dir.path(), &room));
}

#[test]
fn a_resume_after_a_checkpoint_of_a_removed_topic_gets_every_event_of_the_new_one() {
    let dir = scratch("kn-journal-readers-");
    let store = Store::open_with(fast(dir.path())).unwrap();
    let chat = t("/what/chat");
    post_expiring(&store, &chat);
    let seen = store.events(&chat, &Selection::all()).unwrap().events;
    assert_eq!(seen.iter().map(checkpoint).collect::<Vec<_>>(), [1, 2, 3], "a topic never removed numbers from 1");
    std::thread::sleep(Duration::from_millis(1100));
    assert!(store.sweep_all(Some(Duration::ZERO)).unwrap().topics_pruned >= 1);
    assert!(!exists(dir.path(), &chat));
    post_new(&store, &chat);
    // The SSE reconnect with `Last-Event-ID: 3`.
    let since = Selection { since_checkpoint: Some(b"3".to_vec()), ..Selection::none() };
    let resumed = store.events(&chat, &since).unwrap();
    assert_eq!(payloads(&resumed.events), NEW);
    assert_eq!(resumed.resume, Resume::Exact);
    assert!(resumed.events.iter().all(|e| checkpoint(e) > 3), "{:?}", resumed.events);
    // And through a tunnel, as `serve` and pubsub.cgi resume.
    let start = store.tunnel(&chat, &since).unwrap();
    assert_eq!(payloads(&start.initial.events), NEW);
}

#[test]
fn a_resume_into_a_journal_removed_with_unread_events_gets_the_gap() {
    let dir = scratch("kn-journal-readers-");
    let store = Store::open_with(fast(dir.path())).unwrap();
    let journal = t("/who/anna/s/1/kn_journal");
    drop(store.tunnel(&journal, &Selection::none()).unwrap());
    for n in 1..=3 {
        store.notify(&journal, ev(&[("kn_payload", &format!("old{n}"))])).unwrap();
    }
    // The client saw 1 and 2; 3 is lost with the journal.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(store.sweep_all(None).unwrap().journals_removed, 1);
    let since = |c: &str| Selection { since_checkpoint: Some(c.as_bytes().to_vec()), ..Selection::none() };
    let start = store.tunnel(&journal, &since("2")).unwrap();
    // Nothing in the new journal yet: not a checkpoint it gave (both
    // answers are the 205 of an SSE resume).
    assert!(matches!(start.initial.resume, Resume::Gap | Resume::Unknown), "{:?}", start.initial);
    post_new(&store, &journal);
    let resumed = store.events(&journal, &since("2")).unwrap();
    assert!(resumed.events.iter().all(|e| checkpoint(e) > 3), "{:?}", resumed.events);
    assert_eq!((payloads(&resumed.events), resumed.resume), (NEW.map(String::from).to_vec(), Resume::Gap));
    // A client that had seen everything resumes exactly.
    let resumed = store.events(&journal, &since("3")).unwrap();
    assert_eq!((payloads(&resumed.events), resumed.resume), (NEW.map(String::from).to_vec(), Resume::Exact));
}

/// Run by `a_reader_killed_with_sigkill_keeps_its_topic_no_more` in a
/// child process: opens a tunnel, says so, and waits to be killed.
#[test]
fn child_reads_until_killed() {
    let Some(root) = std::env::var_os("KN_READER_KILL_CHILD") else { return };
    let store = Store::open_with(fast(Path::new(&root))).unwrap();
    let _tunnel = store.tunnel(&t("/what/quiet"), &Selection::none()).unwrap();
    println!("reading");
    std::thread::sleep(Duration::from_secs(600));
}

#[test]
fn a_reader_killed_with_sigkill_keeps_its_topic_no_more() {
    let dir = scratch("kn-journal-readers-");
    let store = Store::open_with(fast(dir.path())).unwrap();
    let quiet = t("/what/quiet");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_reads_until_killed", "--nocapture"])
        .env("KN_READER_KILL_CHILD", dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("reading") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the child ended before its tunnel opened");
    }
    // Another process's tunnel keeps it, from slices and whole passes.
    store.sweep(64).unwrap();
    assert_eq!(store.sweep_all(Some(Duration::ZERO)).unwrap().topics_pruned, 0);
    assert!(exists(dir.path(), &quiet));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(store.sweep_all(Some(Duration::ZERO)).unwrap().topics_pruned >= 1);
    assert!(!exists(dir.path(), &quiet));
}

/// The race of FORMAT.md, "Readers and checkpoints": tunnels opening on
/// empty topics while other threads sweep with no grace, over and over.
/// Every tunnel, once open, has its topic for as long as it lives: a pass
/// completed after the tunnel opened never leaves it without its topic,
/// and a post made then reaches it.
#[test]
fn tunnels_opening_while_the_sweep_removes_their_topic_always_keep_it() {
    let dir = scratch("kn-journal-readers-");
    let store = Arc::new(Store::open_with(fast(dir.path())).unwrap());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sweepers: Vec<_> = (0..2)
        .map(|_| {
            let (stop, root) = (stop.clone(), dir.path().to_path_buf());
            std::thread::spawn(move || {
                let other = Store::open_with(fast(&root)).unwrap();
                let mut passes = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    other.sweep_all(Some(Duration::ZERO)).unwrap();
                    passes += 1;
                }
                passes
            })
        })
        .collect();
    for round in 0..100 {
        let topic = t(&format!("/what/r{round}/x"));
        let mut tunnel = store.tunnel(&topic, &Selection::none()).unwrap().tunnel;
        // Whatever the sweepers did meanwhile, one more whole pass.
        store.sweep_all(Some(Duration::ZERO)).unwrap();
        assert!(exists(dir.path(), &topic), "round {round}: {topic} removed under its tunnel");
        store.notify(&topic, ev(&[("kn_payload", &format!("p{round}"))])).unwrap();
        assert_eq!(payloads(&tunnel.wait(&store, Duration::from_secs(5)).unwrap()), [format!("p{round}")], "round {round}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let passes: Vec<usize> = sweepers.into_iter().map(|s| s.join().unwrap()).collect();
    eprintln!("passes of the other sweepers: {passes:?}");
}
