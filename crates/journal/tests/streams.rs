//! Durable Streams in kn-journal: the bridge to PubSub topics, producer
//! state across restarts, forks, and every stream limit at its boundary.

use std::sync::Arc;

use kn_journal::streams::{Append, Create, Producer, Start, StreamErrorKind, Streams};
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
    let stream_dir = std::fs::read_dir(dir.path().join(kn_journal::streams::STREAMS_DIR)).unwrap().next().unwrap().unwrap().path();
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
    assert!(kn_journal::streams::offset(first) < kn_journal::streams::offset(second));
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
    let mut config = Config::new(dir.path());
    config.stream_max_append_bytes = 10;
    let streams = streams_with(config);
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
    let mut config = Config::new(dir.path());
    config.stream_max_path_bytes = 8;
    let streams = streams_with(config);
    assert!(streams.create("12345678", &Create::new("text/plain")).is_ok());
    assert_eq!(streams.create("123456789", &Create::new("text/plain")).unwrap_err().kind(), StreamErrorKind::BadRequest);
}

#[test]
fn producer_count_limit_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path());
    config.stream_max_producers = 2;
    let streams = streams_with(config);
    streams.create("s", &Create::new("text/plain")).unwrap();
    let by = |id: &str| Append { producer: Some(Producer { id: id.into(), epoch: 0, seq: 0 }), ..Append::data(Some("text/plain"), b"x") };
    streams.append("s", &by("a")).unwrap();
    streams.append("s", &by("b")).unwrap();
    assert_eq!(streams.append("s", &by("c")).unwrap_err().kind(), StreamErrorKind::Limit);
    // Known producers go on.
    let again = Append { producer: Some(Producer { id: "a".into(), epoch: 0, seq: 1 }), ..Append::data(Some("text/plain"), b"x") };
    assert!(streams.append("s", &again).unwrap().stored);
}

#[test]
fn read_size_limit_splits_catch_up_reads() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path());
    config.stream_max_read_bytes = 4;
    let streams = streams_with(config);
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
    assert!(Topic::parse(&format!("/{}", kn_journal::streams::STREAMS_DIR)).is_err());
}

#[test]
fn reads_agree_inside_and_beyond_the_memory_cache() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path());
    // Room for two 2-byte appends in memory: older data comes from the file.
    config.stream_cache_bytes = 4;
    let streams = streams_with(config);
    streams.create("s", &Create::new("text/plain")).unwrap();
    let mut offsets = vec![0];
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
