//! Threads of one process posting to the same topics at once, as the
//! workers of `pubsub-cgi serve` do: every post is stored exactly once, the
//! store verifies clean, and the files the store keeps open stay bounded
//! (at most four sets per topic) instead of growing with the posts.

use std::collections::BTreeSet;
use std::sync::{Arc, Barrier};

use kn_journal::{Config, Event, Selection, Store, Topic};

const THREADS: usize = 6;
const POSTS: usize = 400;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

#[test]
fn threads_posting_to_one_topic_store_every_post_once_and_keep_few_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path().join("kn_events"));
    config.reserve_bytes = 0;
    let store = Arc::new(Store::open_with(config).unwrap());
    let topic = Topic::parse("/what/busy").unwrap();
    let journal = Topic::parse("/what/busy/kn_journal").unwrap();
    // A tunnel creates the journal and its heartbeat, so posts are accepted.
    drop(store.tunnel(&journal, &Selection::none()).unwrap());
    store.heartbeat(&journal).unwrap();
    // One post each first, so that what follows starts from kept files.
    let seed = |t: &Topic, id: &str| store.post(t, Event::from_pairs([(b"kn_id".to_vec(), id.as_bytes().to_vec())])).unwrap();
    seed(&topic, "seed");
    seed(&journal, "seed");
    let fds_before = open_fds();

    let start = Arc::new(Barrier::new(THREADS));
    let workers: Vec<_> = (0..THREADS)
        .map(|w| {
            let (store, topic, journal, start) = (store.clone(), topic.clone(), journal.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                for i in 0..POSTS {
                    let id = format!("w{w}-{i}");
                    let event = || Event::from_pairs([(b"kn_id".to_vec(), id.as_bytes().to_vec()), (b"kn_payload".to_vec(), b"x".to_vec())]);
                    store.post(&topic, event()).unwrap();
                    store.post(&journal, event()).unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }

    let expected: BTreeSet<String> = (0..THREADS).flat_map(|w| (0..POSTS).map(move |i| format!("w{w}-{i}"))).chain(["seed".to_string()]).collect();
    for t in [&topic, &journal] {
        let events = store.events(t, &Selection::all()).unwrap().events;
        assert_eq!(events.len(), expected.len(), "{t}: every post once");
        let ids: BTreeSet<String> = events.iter().map(|e| String::from_utf8_lossy(e.get(b"kn_id").unwrap()).into_owned()).collect();
        assert_eq!(ids, expected, "{t}");
    }
    let report = store.verify().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    // Two topics, at most four kept sets each, four descriptors a set.
    let grown = open_fds().saturating_sub(fds_before);
    assert!(grown <= 2 * 4 * 4, "the store keeps {grown} more descriptors after {} posts from {THREADS} threads", 2 * THREADS * POSTS);
}
