//! Durable Streams in kn-journal: the bridge to PubSub topics, producer
//! state across restarts, forks, and every stream limit at its boundary.

use std::sync::Arc;

use kn_streams::{StreamsConfig, Append, Create, Producer, Start, StreamErrorKind, Streams};
use kn_journal::{Config, Event, Selection, Store, Topic};

fn streams_with(config: Config) -> Streams {
    Streams::new(Arc::new(Store::open_with(config).expect("open store")))
}

fn json(streams: &Streams, path: &str) -> Vec<serde_json::Value> {
    let chunk = streams.read(path, Start::Beginning).expect("read");
    serde_json::from_slice(&chunk.body()).expect("a JSON array")
}

fn bound(streams: &Streams, path: &str, topic: &str) {
    let create = Create { topic: Some(topic.to_owned()), ..Create::new("application/json") };
    assert!(streams.create(path, &create).expect("create").created);
}

#[test]
fn events_notified_to_the_bound_topic_appear_on_the_stream() {
    let dir = tempfile::tempdir().unwrap();
    let streams = streams_with(Config::new(dir.path()));
    let chat = Topic::parse("/what/chat").unwrap();
    let mut before = Event::new();
    before.set("kn_payload", "before the stream");
    streams.store().notify(&chat, before).unwrap();
    bound(&streams, "rooms/chat", "/what/chat");

    let mut e = Event::new();
    e.set("kn_id", "e1");
    e.set("kn_payload", "hello");
    streams.store().notify(&chat, e).unwrap();
    let messages = json(&streams, "rooms/chat");
    // Only what was notified after the binding; elements as strings.
    assert_eq!(messages.len(), 1, "{messages:?}");
    assert_eq!(messages[0]["kn_id"], "e1");
    assert_eq!(messages[0]["kn_payload"], "hello");

    // Imported once: a second stream object (another process) sees the
    // same messages, and reading again imports nothing new.
    let other = Streams::new(streams.store().clone());
    assert_eq!(json(&other, "rooms/chat").len(), 1);
    assert_eq!(json(&streams, "rooms/chat").len(), 1);
}

#[test]
fn json_messages_appended_to_the_stream_are_posted_to_the_topic_and_routed() {
    let dir = tempfile::tempdir().unwrap();
    let streams = streams_with(Config::new(dir.path()));
    let chat = Topic::parse("/what/chat").unwrap();
    let inbox = Topic::parse("/who/anna/inbox").unwrap();
    let mut route = Event::new();
    route.set("kn_id", "r1");
    streams.store().route(&chat, b"/who/anna/inbox", route).unwrap();
    bound(&streams, "rooms/chat", "/what/chat");

    let appended = streams
        .append("rooms/chat", &Append::data(Some("application/json"), br#"[{"kn_payload":"hi","n":1},{"kn_id":"mine","kn_payload":"yo"}]"#))
        .unwrap();
    assert_eq!(appended.bridge_error, None);
    let got = streams.store().events(&inbox, &Selection::all()).unwrap().events;
    assert_eq!(got.len(), 2, "{got:?}");
    let hi = got.iter().find(|e| e.payload() == b"hi").expect("hi routed");
    assert_eq!(hi.get("n"), Some(&b"1"[..]));
    assert_eq!(hi.get("kn_stream"), Some(&b"rooms/chat"[..]));
    // Without a kn_id the event gets one naming stream, offset and index.
    assert!(hi.get("kn_id").unwrap().starts_with(b"ds-"));
    assert!(got.iter().any(|e| e.get("kn_id") == Some(&b"mine"[..])));
    // The stream does not import its own messages back.
    assert_eq!(json(&streams, "rooms/chat").len(), 2);
}

#[test]
fn a_duplicate_producer_append_is_not_posted_twice() {
    let dir = tempfile::tempdir().unwrap();
    let streams = streams_with(Config::new(dir.path()));
    bound(&streams, "rooms/chat", "/what/chat");
    let p = Producer { id: "p".into(), epoch: 0, seq: 0 };
    let append = Append { producer: Some(p), ..Append::data(Some("application/json"), br#"{"kn_payload":"once"}"#) };
    assert!(streams.append("rooms/chat", &append).unwrap().stored);
    assert!(!streams.append("rooms/chat", &append).unwrap().stored);
    let got = streams.store().events(&Topic::parse("/what/chat").unwrap(), &Selection::all()).unwrap().events;
    assert_eq!(got.len(), 1);
}

#[test]
fn producer_state_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let append = |seq| Append { producer: Some(Producer { id: "p".into(), epoch: 3, seq }), ..Append::data(Some("text/plain"), b"x") };
    {
        let streams = streams_with(Config::new(dir.path()));
        streams.create("s", &Create::new("text/plain")).unwrap();
        assert!(streams.append("s", &append(0)).unwrap().stored);
        assert!(streams.append("s", &append(1)).unwrap().stored);
    }
    let streams = streams_with(Config::new(dir.path()));
    assert!(!streams.append("s", &append(1)).unwrap().stored, "a retry after the restart is a duplicate");
    assert_eq!(streams.append("s", &append(5)).unwrap_err().gap, Some((2, 5)));
    let stale = Append { producer: Some(Producer { id: "p".into(), epoch: 2, seq: 0 }), ..Append::data(Some("text/plain"), b"x") };
    assert_eq!(streams.append("s", &stale).unwrap_err().kind(), StreamErrorKind::StaleEpoch);
    assert_eq!(streams.read("s", Start::Beginning).unwrap().body(), b"xx");
}

#[test]
fn a_torn_tail_loses_only_the_unacknowledged_append() {
    let dir = tempfile::tempdir().unwrap();
    let streams = streams_with(Config::new(dir.path()));
    streams.create("s", &Create::new("text/plain")).unwrap();
    streams.append("s", &Append::data(Some("text/plain"), b"kept")).unwrap();
    // Half a record at the end of the segment, as a crash mid-write leaves.
    let stream_dir = std::fs::read_dir(dir.path().join(kn_streams::STREAMS_DIR)).unwrap().next().unwrap().unwrap().path();
    let segment = std::fs::read_dir(&stream_dir).unwrap().map(|e| e.unwrap().path()).find(|p| p.to_string_lossy().contains(".seg-")).unwrap();
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes.extend_from_slice(&[0x20, 0, 0, 0, 1, 2, 3]);
    std::fs::write(&segment, bytes).unwrap();
    let fresh = streams_with(Config::new(dir.path()));
    fresh.append("s", &Append::data(Some("text/plain"), b"+more")).unwrap();
    assert_eq!(fresh.read("s", Start::Beginning).unwrap().body(), b"kept+more");
}

#[test]
fn offsets_are_checkpoints_and_forks_share_them() {
    let dir = tempfile::tempdir().unwrap();
    let streams = streams_with(Config::new(dir.path()));
    let first = streams.create("src", &Create { body: b"ab".to_vec(), ..Create::new("text/plain") }).unwrap().info.tail;
    let second = streams.append("src", &Append::data(Some("text/plain"), b"cd")).unwrap().info.tail;
    assert!(kn_streams::offset(first) < kn_streams::offset(second));
    let fork = Create { fork_from: Some("src".into()), fork_offset: Some(first), ..Create::default() };
    let created = streams.create("fork", &fork).unwrap();
    assert_eq!(created.info.tail, first);
    streams.append("fork", &Append::data(Some("text/plain"), b"XY")).unwrap();
    assert_eq!(streams.read("fork", Start::Beginning).unwrap().body(), b"abXY");
    assert_eq!(streams.read("src", Start::Beginning).unwrap().body(), b"abcd");
    // The source, deleted, is kept for its fork (410), then goes with it.
    streams.delete("src").unwrap();
    assert_eq!(streams.head("src").unwrap_err().kind(), StreamErrorKind::Gone);
    streams.delete("fork").unwrap();
    assert_eq!(streams.head("src").unwrap_err().kind(), StreamErrorKind::NotFound);
}

#[test]
fn append_size_limit_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::new(dir.path());
    let mut settings = StreamsConfig::default();
    settings.max_append_bytes = 10;
    let streams = streams_with(config).with_config(settings);
    streams.create("s", &Create::new("text/plain")).unwrap();
    assert!(streams.append("s", &Append::data(Some("text/plain"), &[b'a'; 10])).is_ok());
    let err = streams.append("s", &Append::data(Some("text/plain"), &[b'a'; 11])).unwrap_err();
    assert_eq!(err.kind(), StreamErrorKind::TooLarge);
    let err = streams.create("t", &Create { body: vec![b'a'; 11], ..Create::new("text/plain") }).unwrap_err();
    assert_eq!(err.kind(), StreamErrorKind::TooLarge);
}

#[test]
fn path_length_limit_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::new(dir.path());
    let mut settings = StreamsConfig::default();
    settings.max_path_bytes = 8;
    let streams = streams_with(config).with_config(settings);
    assert!(streams.create("12345678", &Create::new("text/plain")).is_ok());
    assert_eq!(streams.create("123456789", &Create::new("text/plain")).unwrap_err().kind(), StreamErrorKind::BadRequest);
}

#[test]
fn producer_count_limit_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::new(dir.path());
    let mut settings = StreamsConfig::default();
    settings.max_producers = 2;
    let streams = streams_with(config).with_config(settings);
    streams.create("s", &Create::new("text/plain")).unwrap();
    let by = |id: &str| Append { producer: Some(Producer { id: id.into(), epoch: 0, seq: 0 }), ..Append::data(Some("text/plain"), b"x") };
    streams.append("s", &by("a")).unwrap();
    streams.append("s", &by("b")).unwrap();
    assert_eq!(streams.append("s", &by("c")).unwrap_err().kind(), StreamErrorKind::BadRequest);
    // Known producers go on.
    let again = Append { producer: Some(Producer { id: "a".into(), epoch: 0, seq: 1 }), ..Append::data(Some("text/plain"), b"x") };
    assert!(streams.append("s", &again).unwrap().stored);
}

#[test]
fn read_size_limit_splits_catch_up_reads() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::new(dir.path());
    let mut settings = StreamsConfig::default();
    settings.max_read_bytes = 4;
    let streams = streams_with(config).with_config(settings);
    streams.create("s", &Create::new("text/plain")).unwrap();
    for piece in [&b"ab"[..], b"cd", b"ef"] {
        streams.append("s", &Append::data(Some("text/plain"), piece)).unwrap();
    }
    let first = streams.read("s", Start::Beginning).unwrap();
    assert_eq!(first.body(), b"abcd");
    assert!(!first.up_to_date);
    let rest = streams.read("s", Start::At(first.next)).unwrap();
    assert_eq!(rest.body(), b"ef");
    assert!(rest.up_to_date);
    // One record larger than the limit still comes whole.
    streams.append("s", &Append::data(Some("text/plain"), b"0123456789")).unwrap();
    assert_eq!(streams.read("s", Start::At(rest.next)).unwrap().body(), b"0123456789");
}

#[test]
fn streams_are_not_topics() {
    let dir = tempfile::tempdir().unwrap();
    let streams = streams_with(Config::new(dir.path()));
    streams.create("what/chat", &Create::new("text/plain")).unwrap();
    assert!(streams.store().topics().unwrap().is_empty());
    assert!(Topic::parse(&format!("/{}", kn_streams::STREAMS_DIR)).is_err());
}

#[test]
fn reads_agree_inside_and_beyond_the_memory_cache() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::new(dir.path());
    // Room for two 2-byte appends in memory: older data comes from the file.
    let mut settings = StreamsConfig::default();
    settings.cache_bytes = 4;
    let streams = streams_with(config).with_config(settings);
    streams.create("s", &Create::new("text/plain")).unwrap();
    let mut offsets = vec![kn_streams::Offset::BEGINNING];
    for piece in [&b"ab"[..], b"cd", b"ef", b"gh"] {
        offsets.push(streams.append("s", &Append::data(Some("text/plain"), piece)).unwrap().info.tail);
    }
    let all = b"abcdefgh";
    for (i, &at) in offsets.iter().enumerate() {
        let chunk = streams.read("s", Start::At(at)).unwrap();
        assert_eq!(chunk.body(), &all[i * 2..], "from offset {i}");
        // A process that reads the log afresh agrees.
        let fresh = Streams::new(streams.store().clone());
        assert_eq!(fresh.read("s", Start::At(at)).unwrap().body(), &all[i * 2..]);
    }
}

#[test]
fn under_access_rules_the_bridge_carries_nothing_either_way() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("kn_events");
    let chat = Topic::parse("/what/chat").unwrap();
    // Bound while the store had no rules.
    let open = streams_with(Config::new(&root));
    bound(&open, "rooms/chat", "/what/chat");

    // Then rules that let no one read or post /what/chat.
    let rules = dir.path().join("rules");
    std::fs::write(&rules, "allow read,post /who/{user}/** users\n").unwrap();
    let mut config = Config::new(&root);
    config.access_rules = Some(rules);
    let guarded = streams_with(config);

    // A new binding is refused with 403.
    let create = Create { topic: Some("/what/chat".to_owned()), ..Create::new("application/json") };
    let refused = guarded.create("rooms/other", &create).unwrap_err();
    assert_eq!(refused.kind(), StreamErrorKind::Store(kn_journal::ErrorKind::Forbidden), "{refused:?}");

    // The existing binding imports nothing from the topic...
    let mut secret = Event::new();
    secret.set("kn_payload", "secret");
    guarded.store().notify(&chat, secret).unwrap();
    assert!(json(&guarded, "rooms/chat").is_empty(), "nothing read through the stream");
    // ...and posts nothing to it.
    let appended = guarded.append("rooms/chat", &Append::data(Some("application/json"), br#"[{"kn_payload":"forged"}]"#)).unwrap();
    assert!(appended.bridge_error.as_deref().is_some_and(|e| e.contains("access rules")), "{:?}", appended.bridge_error);
    let posted = guarded.store().events(&chat, &Selection::all()).unwrap().events;
    assert!(posted.iter().all(|e| e.payload() != b"forged"), "{posted:?}");
}

fn producer<'a>(id: &str, seq: u64, body: &'a [u8]) -> Append<'a> {
    Append { producer: Some(Producer { id: id.to_owned(), epoch: 1, seq }), ..Append::data(Some("text/plain"), body) }
}

/// What a process new to a stream (every CGI request) replays is the
/// records after the stream's snapshot, however long the stream: its
/// state (tail, producers) comes from the snapshot.
#[test]
fn a_new_process_replays_only_what_follows_the_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let writer = streams_with(Config::new(dir.path()));
    let mut replayed = Vec::new();
    for n in [1_000u64, 6_000] {
        let path = format!("long/{n}");
        writer.create(&path, &Create::new("text/plain")).unwrap();
        for seq in 0..n {
            writer.append(&path, &producer("p", seq, b"0123456789")).unwrap();
        }
        // A process new to the stream: a HEAD, appends, a read at the tail.
        let fresh = streams_with(Config::new(dir.path()));
        let info = fresh.head(&path).unwrap();
        assert_eq!(info, writer.head(&path).unwrap());
        assert!(!fresh.append(&path, &producer("p", n - 1, b"again")).unwrap().stored, "a duplicate: the producer's state came with the snapshot");
        assert!(fresh.append(&path, &producer("p", n, b"new")).unwrap().stored);
        let chunk = fresh.read(&path, Start::At(info.tail)).unwrap();
        assert_eq!(chunk.body(), b"new");
        // A read from an old offset starts in the segment holding it.
        let old = fresh.read(&path, Start::At(info.offset_at(info.tail.seq() - 10))).unwrap();
        assert_eq!(old.body().len(), 10 * 10 + 3);
        replayed.push(fresh.records_replayed());
    }
    // Bounded by the snapshot interval (256 records), whatever the length.
    assert!(replayed.iter().all(|&r| r <= 256), "records replayed: {replayed:?}");
}

/// A snapshot the log does not confirm is not used: garbage, or one taken
/// after records that a crash then lost and that were written anew.
#[test]
fn a_snapshot_the_log_does_not_confirm_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let streams = streams_with(Config::new(dir.path()));
    streams.create("s", &Create::new("text/plain")).unwrap();
    for seq in 0..300 {
        streams.append("s", &producer("p", seq, format!("p{seq};").as_bytes())).unwrap();
    }
    drop(streams);
    let stream_dir = std::fs::read_dir(dir.path().join(kn_streams::STREAMS_DIR)).unwrap().next().unwrap().unwrap().path();
    let snapshot = stream_dir.join(".state");
    assert!(snapshot.exists(), "300 appends take a snapshot");
    let kept = std::fs::read(&snapshot).unwrap();

    // Garbage in place of the snapshot: the log is replayed.
    std::fs::write(&snapshot, b"KNDSST\0\x01 not a snapshot").unwrap();
    let fresh = streams_with(Config::new(dir.path()));
    assert_eq!(fresh.read("s", Start::Beginning).unwrap().body().len(), (0..300).map(|s: u64| format!("p{s};").len()).sum::<usize>());
    assert!(fresh.records_replayed() > 300);

    // The log loses its last records (a power cut with sync=none) but the
    // snapshot survives; then other records are appended in their place.
    std::fs::write(&snapshot, &kept).unwrap();
    let segment = std::fs::read_dir(&stream_dir).unwrap().map(|e| e.unwrap().path()).find(|p| p.to_string_lossy().contains(".seg-")).unwrap();
    let len = std::fs::metadata(&segment).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&segment).unwrap().set_len(len * 2 / 5).unwrap();
    std::fs::write(&snapshot, &kept).unwrap();
    let after_crash = streams_with(Config::new(dir.path()));
    let body = after_crash.read("s", Start::Beginning).unwrap().body();
    let survivors = String::from_utf8(body).unwrap().matches(';').count() as u64;
    assert!(survivors < 256, "{survivors} records survived");
    for seq in survivors..survivors + 300 {
        assert!(after_crash.append("s", &producer("p", seq, b"q;")).unwrap().stored, "seq {seq} is new after the crash");
    }
    std::fs::write(&snapshot, &kept).unwrap();
    let later = streams_with(Config::new(dir.path()));
    assert!(!later.append("s", &producer("p", survivors + 299, b"q;")).unwrap().stored);
    assert!(later.append("s", &producer("p", survivors + 300, b"q;")).unwrap().stored);
    let text = String::from_utf8(later.read("s", Start::Beginning).unwrap().body()).unwrap();
    assert_eq!(text.matches("q;").count(), 301);
    assert_eq!(text.matches(';').count() as u64, survivors + 301);
}

/// Snapshots are written into the previous one's file and exchanged with
/// `.state`: after the first two, no file is made or removed (the two
/// inodes stay the same pair), and each `.state` is whole and used.
#[test]
fn snapshots_take_turns_in_two_files() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let streams = streams_with(Config::new(dir.path()));
    streams.create("s", &Create::new("text/plain")).unwrap();
    let stream_dir = std::fs::read_dir(dir.path().join(kn_streams::STREAMS_DIR)).unwrap().next().unwrap().unwrap().path();
    let ino = |name: &str| std::fs::metadata(stream_dir.join(name)).map(|m| m.ino()).unwrap_or(0);
    let pair = || {
        let mut pair = [ino(".state"), ino(".state.tmp")];
        pair.sort();
        pair
    };
    let mut seq = 0;
    let mut append = |n: u64| {
        for _ in 0..n {
            streams.append("s", &producer("p", seq, b"0123456789")).unwrap();
            seq += 1;
        }
    };
    append(2 * 256 + 10);
    let two = pair();
    assert!(two[0] != 0 && two[0] != two[1], "two files after two snapshots: {two:?}");
    for _ in 0..5 {
        let before = ino(".state");
        append(256);
        assert_eq!(pair(), two, "the same two files");
        assert_ne!(ino(".state"), before, "exchanged");
        let fresh = streams_with(Config::new(dir.path()));
        assert_eq!(fresh.head("s").unwrap().tail, streams.head("s").unwrap().tail);
        assert!(fresh.records_replayed() <= 256, "replayed {}", fresh.records_replayed());
    }
}

/// A stream keeps everything it was given, however long: the journal
/// retention (`journal_max_bytes`) does not apply to streams.
#[test]
fn a_stream_longer_than_the_journal_retention_keeps_everything() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path());
    config.segment_bytes = 4096;
    config.journal_max_bytes = 8192;
    let streams = streams_with(config.clone());
    streams.create("s", &Create::new("text/plain")).unwrap();
    for _ in 0..500 {
        streams.append("s", &Append::data(Some("text/plain"), &[b'x'; 100])).unwrap();
    }
    let fresh = streams_with(config);
    assert_eq!(fresh.read("s", Start::Beginning).unwrap().body().len(), 50_000);
}

/// A watched process (`serve`) answers reads of a stream it knows from
/// memory and appends to it without waiting; what another store instance
/// (another process) appends is in its very next read.
#[test]
fn a_watched_process_reads_from_memory_and_sees_other_appends_and_deletes_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let watched = Streams::watched(Arc::new(Store::open(dir.path()).unwrap()));
    watched.create("s", &Create::new("text/plain")).unwrap();
    let mut expected = Vec::new();
    // Alone, it keeps knowing the stream through its own appends.
    for i in 0..20 {
        let body = format!("w{i}.");
        let done = match watched.append_nowait("s", &Append::data(Some("text/plain"), body.as_bytes())) {
            Some(done) => done,
            None if i == 0 => watched.append("s", &Append::data(Some("text/plain"), body.as_bytes())),
            None => panic!("append {i} had to wait"),
        };
        assert!(done.unwrap().stored);
        expected.extend_from_slice(body.as_bytes());
        let cached = watched.read_cached("s", Start::Beginning).expect("its own append keeps it known");
        assert_eq!(cached.body(), expected);
    }
    // Another process appends: never a stale answer, from memory or not.
    let other = streams_with(Config::new(dir.path()));
    for i in 0..50 {
        let body = format!("o{i}.");
        other.append("s", &Append::data(Some("text/plain"), body.as_bytes())).unwrap();
        expected.extend_from_slice(body.as_bytes());
        if let Some(cached) = watched.read_cached("s", Start::Beginning) {
            assert_eq!(cached.body(), expected, "a stale answer from memory after append {i}");
        }
        assert_eq!(watched.read("s", Start::Beginning).unwrap().body(), expected);
        let body = format!("w{i}.");
        watched.append("s", &Append::data(Some("text/plain"), body.as_bytes())).unwrap();
        expected.extend_from_slice(body.as_bytes());
        assert_eq!(watched.read("s", Start::Beginning).unwrap().body(), expected);
    }
    // Caught up, its own appends run without waiting again.
    let done = watched.append_nowait("s", &Append::data(Some("text/plain"), b"x")).expect("an append that need not wait");
    assert!(done.unwrap().stored);
    expected.push(b'x');
    assert_eq!(watched.read_cached("s", Start::Beginning).expect("known").body(), expected);

    // Another process deletes it: gone at once, for reads and appends.
    other.delete("s").unwrap();
    assert!(watched.read_cached("s", Start::Beginning).is_none(), "a deleted stream answered from memory");
    let late = watched.append_nowait("s", &Append::data(Some("text/plain"), b"y"));
    assert!(!matches!(late, Some(Ok(_))), "an append stored in a deleted stream");
    assert_eq!(watched.append("s", &Append::data(Some("text/plain"), b"y")).unwrap_err().kind(), StreamErrorKind::NotFound);
    assert_eq!(watched.read("s", Start::Beginning).unwrap_err().kind(), StreamErrorKind::NotFound);

    // Created again, otherwise: the new stream, at once.
    other.create("s", &Create::new("application/octet-stream")).unwrap();
    other.append("s", &Append::data(Some("application/octet-stream"), b"new")).unwrap();
    if let Some(cached) = watched.read_cached("s", Start::Beginning) {
        assert_eq!(cached.body(), b"new", "the deleted stream answered from memory");
    }
    let chunk = watched.read("s", Start::Beginning).unwrap();
    assert_eq!((chunk.body(), chunk.info.content_type.as_str()), (b"new".to_vec(), "application/octet-stream"));
}

#[test]
fn reads_of_the_same_range_share_one_body_until_the_stream_changes() {
    let dir = tempfile::tempdir().unwrap();
    let watched = Streams::watched(Arc::new(Store::open(dir.path()).unwrap()));
    let text = |body: &'static [u8]| Append::data(Some("text/plain"), body);
    watched.create("s", &Create::new("text/plain")).unwrap();
    watched.append("s", &text(b"ab")).unwrap();
    watched.append("s", &text(b"c")).unwrap();
    let first = watched.read("s", Start::Beginning).unwrap().into_body();
    let again = watched.read_cached("s", Start::Beginning).expect("known").into_body();
    assert_eq!(&again[..], b"abc");
    assert_eq!(again.as_ptr(), first.as_ptr(), "the same range joined again");
    // Another range, then an append: each answered with its own data.
    let two = watched.head("s").unwrap().offset_at(2);
    let rest = watched.read("s", Start::At(two)).unwrap();
    assert_eq!(rest.body(), b"c");
    watched.append("s", &text(b"d")).unwrap();
    assert_eq!(watched.read("s", Start::Beginning).unwrap().body(), b"abcd");
    // Deleted and created again by another process with as many records:
    // the same checkpoints, other data (and other offsets: a new epoch).
    let other = streams_with(Config::new(dir.path()));
    other.delete("s").unwrap();
    other.create("s", &Create::new("text/plain")).unwrap();
    for part in [b"w", b"x", b"y"] {
        other.append("s", &text(part)).unwrap();
    }
    assert_eq!(watched.read("s", Start::Beginning).unwrap().body(), b"wxy");
    // And by this process.
    watched.delete("s").unwrap();
    watched.create("s", &Create::new("text/plain")).unwrap();
    for part in [b"1", b"2", b"3"] {
        watched.append("s", &text(part)).unwrap();
    }
    assert_eq!(watched.read("s", Start::Beginning).unwrap().body(), b"123");
    assert_eq!(watched.read_cached("s", Start::Beginning).expect("known").body(), b"123");
}
