//! Durable Streams against hostile input (issue 28): fork chains of any
//! depth on a small stack, the fork-depth and `Producer-Id` limits at
//! their boundaries, TTLs past the representable range, the stream
//! cache bounded in bytes, deleted streams releasing their blobs, and the
//! sweep removing orphan blobs and expired streams nobody touches.

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kn_streams::{StreamsConfig, Append, Create, Producer, Start, StreamErrorKind, Streams};
use kn_journal::{Config, Event, Store, Topic};

fn streams_with(config: Config) -> Streams {
    Streams::new(Arc::new(Store::open_with(config).expect("open store")))
}

fn fork_of(source: &str) -> Create {
    Create { fork_from: Some(source.to_owned()), ..Create::new("text/plain") }
}

/// The stream directories under `.streams/` (not the sweep's files).
fn stream_dirs(root: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(root.join(".streams")) else { return Vec::new() };
    entries.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| !n.starts_with('.')).collect()
}

/// The entries of `.blobs/`.
fn blobs(root: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(root.join(".blobs")) else { return Vec::new() };
    entries.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect()
}

#[test]
fn a_chain_of_ten_thousand_forks_is_deleted_on_a_128_kib_stack() {
    const DEPTH: usize = 10_000;
    let dir = tempfile::tempdir().unwrap();
    let config = Config::new(dir.path());
    let mut settings = StreamsConfig::default();
    settings.max_fork_depth = DEPTH;
    let streams = Arc::new(streams_with(config).with_config(settings));
    streams.create("c/0", &Create::new("text/plain")).unwrap();
    for i in 1..=DEPTH {
        streams.create(&format!("c/{i}"), &fork_of(&format!("c/{}", i - 1))).unwrap();
    }
    // Every stream but the last has a fork: each is only marked deleted.
    for i in 0..DEPTH {
        streams.delete(&format!("c/{i}")).unwrap();
    }
    assert_eq!(stream_dirs(dir.path()).len(), DEPTH + 1);
    // Deleting the last releases the whole chain, one ancestor after the
    // other: on a 128 KiB stack, a frame per ancestor would overflow it.
    let last = streams.clone();
    let deleted = std::thread::Builder::new()
        .stack_size(128 << 10)
        .spawn(move || last.delete(&format!("c/{DEPTH}")).map_err(|e| e.to_string()))
        .unwrap()
        .join()
        .expect("the delete thread did not overflow its stack");
    deleted.unwrap();
    assert!(stream_dirs(dir.path()).is_empty(), "the whole chain is gone");
    assert_eq!(streams.head("c/0").unwrap_err().kind(), StreamErrorKind::NotFound);
}

#[test]
fn fork_depth_limit_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::new(dir.path());
    let mut settings = StreamsConfig::default();
    settings.max_fork_depth = 3;
    let streams = streams_with(config).with_config(settings);
    streams.create("d/0", &Create::new("text/plain")).unwrap();
    for i in 1..=3 {
        streams.create(&format!("d/{i}"), &fork_of(&format!("d/{}", i - 1))).unwrap();
    }
    let e = streams.create("d/4", &fork_of("d/3")).unwrap_err();
    assert_eq!(e.kind(), StreamErrorKind::Conflict, "{e}");
    assert!(e.message().contains("KN_STREAM_MAX_FORK_DEPTH"), "{e}");
    assert_eq!(streams.head("d/4").unwrap_err().kind(), StreamErrorKind::NotFound);
    // Another fork at the same depth is fine.
    streams.create("d/3b", &fork_of("d/2")).unwrap();
}

#[test]
fn producer_id_length_limit_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::new(dir.path());
    let mut settings = StreamsConfig::default();
    settings.max_producer_id_bytes = 16;
    let streams = streams_with(config).with_config(settings);
    streams.create("p", &Create::new("text/plain")).unwrap();
    let by = |id: String| Append { producer: Some(Producer { id, epoch: 0, seq: 0 }), ..Append::data(Some("text/plain"), b"x") };
    assert!(streams.append("p", &by("a".repeat(16))).unwrap().stored);
    let e = streams.append("p", &by("b".repeat(17))).unwrap_err();
    assert_eq!(e.kind(), StreamErrorKind::BadRequest, "{e}");
    assert_eq!(streams.read("p", Start::Beginning).unwrap().body(), b"x", "nothing stored for the long id");
    // The event loop's path refuses it too (it leaves it to `append`).
    assert!(streams.append_nowait("p", &by("c".repeat(17))).is_none_or(|r| r.is_err()));
}

#[test]
fn a_ttl_past_the_representable_range_is_refused_not_an_instant_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let streams = streams_with(Config::new(dir.path()));
    for ttl in [i64::MAX as u64, u64::MAX, (i64::MAX / 1000) as u64] {
        let create = Create { ttl: Some(ttl), ..Create::new("text/plain") };
        let e = streams.create("t", &create).unwrap_err();
        assert_eq!(e.kind(), StreamErrorKind::BadRequest, "Stream-TTL {ttl}: {e}");
        assert_eq!(streams.head("t").unwrap_err().kind(), StreamErrorKind::NotFound);
    }
    // Long but representable: created, and there afterwards.
    let long = Create { ttl: Some(1_000_000_000_000), ..Create::new("text/plain") };
    assert!(streams.create("t", &long).unwrap().created);
    assert_eq!(streams.head("t").unwrap().ttl, Some(1_000_000_000_000));
    streams.append("t", &Append::data(Some("text/plain"), b"kept")).unwrap();
    assert_eq!(streams.read("t", Start::Beginning).unwrap().body(), b"kept");
    // The latest RFC 3339 instant is fine too.
    let far = Create { expires_at: Some("9999-12-31T23:59:59Z".into()), ..Create::new("text/plain") };
    streams.create("far", &far).unwrap();
    assert!(streams.head("far").is_ok());
}

#[test]
fn a_deleted_stream_releases_its_blobs() {
    let dir = tempfile::tempdir().unwrap();
    let streams = streams_with(Config::new(dir.path()));
    streams.create("big", &Create::new("application/octet-stream")).unwrap();
    let payload = vec![7u8; 3 << 20];
    streams.append("big", &Append::data(Some("application/octet-stream"), &payload)).unwrap();
    assert_eq!(blobs(dir.path()).len(), 1, "the 3 MB payload is a blob");
    assert_eq!(streams.read("big", Start::Beginning).unwrap().body().len(), 3 << 20);
    streams.delete("big").unwrap();
    assert!(blobs(dir.path()).is_empty(), "orphan blobs left: {:?}", blobs(dir.path()));
    let report = streams.store().verify().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

#[test]
fn a_blob_shared_with_a_topic_survives_the_stream_s_delete() {
    let dir = tempfile::tempdir().unwrap();
    let streams = streams_with(Config::new(dir.path()));
    let payload = vec![b'z'; 200_000];
    let mut e = Event::new();
    e.set("kn_payload", payload.clone());
    let topic = Topic::parse("/what/big").unwrap();
    streams.store().notify(&topic, e).unwrap();
    streams.create("s", &Create::new("text/plain")).unwrap();
    streams.append("s", &Append::data(Some("text/plain"), &payload)).unwrap();
    assert_eq!(blobs(dir.path()).len(), 1, "stored once");
    streams.delete("s").unwrap();
    assert_eq!(blobs(dir.path()).len(), 1, "the topic still links it");
    assert!(streams.store().verify().unwrap().problems.is_empty());
}

#[test]
fn the_sweep_removes_orphan_blobs_past_their_grace_only() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path());
    config.blob_grace = Duration::from_secs(2);
    let store = Store::open_with(config).unwrap();
    // In use: a topic links it (and it is old by the time of the sweep).
    let mut e = Event::new();
    e.set("kn_payload", vec![b'u'; 100_000]);
    store.notify(&Topic::parse("/what/used").unwrap(), e).unwrap();
    let used = blobs(dir.path());
    assert_eq!(used.len(), 1);
    let blob_dir = dir.path().join(".blobs");
    fs::write(blob_dir.join(format!("{:032x}", 1)), b"old orphan").unwrap();
    std::thread::sleep(Duration::from_millis(3100));
    fs::write(blob_dir.join(format!("{:032x}", 2)), b"fresh orphan").unwrap();
    let report = store.sweep(16).unwrap();
    assert!(report.ran);
    let mut left = blobs(dir.path());
    left.sort();
    let mut want = vec![format!("{:032x}", 2), used[0].clone()];
    want.sort();
    assert_eq!(left, want, "the old orphan goes, the fresh one and the one in use stay");
    assert!(store.verify().unwrap().problems.iter().all(|p| p.reason.contains("orphan blob")));
}

#[test]
fn expired_streams_nobody_touches_are_removed_by_the_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path());
    config.sweep_interval = Duration::ZERO;
    let streams = streams_with(config);
    for i in 0..40 {
        streams.create(&format!("e/{i}"), &Create { ttl: Some(1), ..Create::new("text/plain") }).unwrap();
    }
    streams.create("kept", &Create::new("text/plain")).unwrap();
    streams.create("later", &Create { ttl: Some(3600), ..Create::new("text/plain") }).unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    // A bounded pass: at most 16 streams per unit of budget.
    let first = streams.sweep_expired(Some(1));
    assert_eq!(first.looked, 16);
    assert!(first.removed <= 16);
    // The store's sweep runs the pass too: no stream is read meanwhile.
    for _ in 0..4 {
        streams.store().sweep(1).unwrap();
    }
    assert_eq!(stream_dirs(dir.path()).len(), 2, "only the unexpired streams are left");
    assert!(streams.head("kept").is_ok());
    assert!(streams.head("later").is_ok());
}

#[test]
fn an_expired_fork_is_counted_out_of_its_deleted_source() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path());
    config.sweep_interval = Duration::ZERO;
    let streams = streams_with(config);
    streams.create("src", &Create::new("text/plain")).unwrap();
    let fork = Create { ttl: Some(1), ..fork_of("src") };
    streams.create("fork", &fork).unwrap();
    streams.delete("src").unwrap();
    assert_eq!(streams.head("src").unwrap_err().kind(), StreamErrorKind::Gone);
    std::thread::sleep(Duration::from_millis(1200));
    streams.sweep_expired(None);
    assert!(stream_dirs(dir.path()).is_empty(), "the source went with its last fork");
}

#[test]
fn the_stream_cache_stays_under_its_byte_bound() {
    const BOUND: usize = 256 << 10;
    let dir = tempfile::tempdir().unwrap();
    let config = Config::new(dir.path());
    let mut settings = StreamsConfig::default();
    settings.cache_memory = BOUND;
    settings.max_producer_id_bytes = 1024;
    let streams = streams_with(config).with_config(settings);
    let mut largest = 0;
    for s in 0..100 {
        let path = format!("m/{s}");
        streams.create(&path, &Create::new("text/plain")).unwrap();
        let before = streams.cache_bytes();
        for p in 0..20 {
            let id = format!("{p:04}{}", "x".repeat(1000));
            let append = Append { producer: Some(Producer { id, epoch: 0, seq: 0 }), ..Append::data(Some("text/plain"), b"x") };
            streams.append(&path, &append).unwrap();
        }
        largest = largest.max(streams.cache_bytes().saturating_sub(before));
        assert!(streams.cache_bytes() <= BOUND + 2 * largest, "{} bytes cached after {s} streams", streams.cache_bytes());
    }
    assert!(largest > 20_000, "each stream's producers are counted ({largest})");
    assert!(streams.cache_bytes() <= BOUND + 2 * largest);
    // Forgotten streams are read again from their logs.
    let again = Append { producer: Some(Producer { id: format!("0000{}", "x".repeat(1000)), epoch: 0, seq: 0 }), ..Append::data(Some("text/plain"), b"x") };
    assert!(!streams.append("m/0", &again).unwrap().stored, "a duplicate, as the log says");
}
