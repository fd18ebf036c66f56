//! A stream deleted (or expired) and created again never repeats an
//! offset of the stream before it, and an offset of that earlier stream
//! is refused (`Gone`, 410) rather than read in the middle of the new one
//! (issue 37, item 5). Before the fix the reviewer resumed at offset 6
//! after a delete and a re-create and got `new5;new6;new7`, `new0`-`new4`
//! silently skipped.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use kn_journal::{Config, Store};
use kn_streams::{Append, Create, Offset, Start, StreamErrorKind, Streams};

fn streams_with(config: Config) -> Streams {
    Streams::new(Arc::new(Store::open_with(config).unwrap()))
}

fn text(body: &str) -> Append<'_> {
    Append::data(Some("text/plain"), body.as_bytes())
}

/// Creates `path` and appends `<prefix>0` to `<prefix>7`; the offsets
/// minted, the create's first.
fn fill(streams: &Streams, path: &str, create: &Create, prefix: &str) -> Vec<Offset> {
    let mut offsets = vec![streams.create(path, create).unwrap().info.tail];
    for i in 0..8 {
        offsets.push(streams.append(path, &text(&format!("{prefix}{i};"))).unwrap().info.tail);
    }
    offsets
}

/// The reader's position after `old4;`, the sixth offset minted
/// (`0000000000000006_…`: the create is checkpoint 1).
fn resume_point(offsets: &[Offset]) -> Offset {
    let at = offsets[5];
    assert_eq!(at.seq(), 6);
    at
}

fn assert_refused(streams: &Streams, path: &str, at: Offset) {
    match streams.read(path, Start::At(at)) {
        Ok(chunk) => panic!("offset {at} of the deleted stream read {:?} from the new one", String::from_utf8_lossy(&chunk.body())),
        Err(e) => {
            assert_eq!(e.kind(), StreamErrorKind::Gone, "{e}");
            assert!(e.message().contains("read again from -1"), "{e}");
        }
    }
}

#[test]
fn resuming_at_6_after_a_delete_and_a_re_create_skips_nothing_silently() {
    let dir = tempfile::tempdir().unwrap();
    let streams = streams_with(Config::new(dir.path()));
    let old = fill(&streams, "chat", &Create::new("text/plain"), "old");
    let at = resume_point(&old);
    assert_eq!(streams.read("chat", Start::At(at)).unwrap().body(), b"old5;old6;old7;");
    streams.delete("chat").unwrap();
    let new = fill(&streams, "chat", &Create::new("text/plain"), "new");
    assert_refused(&streams, "chat", at);
    // Nor in a process that never knew the old stream.
    let fresh = streams_with(Config::new(dir.path()));
    assert_refused(&fresh, "chat", at);
    // No offset of the old stream is minted again (but the beginning,
    // which every stream shares).
    let before: HashSet<String> = old.iter().filter(|o| **o != Offset::BEGINNING).map(|o| o.to_string()).collect();
    for o in &new {
        assert!(!before.contains(&o.to_string()), "{o} minted twice");
    }
    // The new stream reads whole from the beginning, and from its own offsets.
    assert_eq!(streams.read("chat", Start::Beginning).unwrap().body(), b"new0;new1;new2;new3;new4;new5;new6;new7;");
    assert_eq!(fresh.read("chat", Start::At(new[5])).unwrap().body(), b"new5;new6;new7;");
    // A fork point of the old stream is refused the same way.
    let fork = Create { fork_from: Some("chat".into()), fork_offset: Some(at), ..Create::new("text/plain") };
    assert_eq!(streams.create("fork", &fork).unwrap_err().kind(), StreamErrorKind::Gone);
}

#[test]
fn an_expired_stream_created_again_refuses_the_old_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path());
    config.sweep_interval = Duration::ZERO;
    let streams = streams_with(config);
    let old = fill(&streams, "chat", &Create { ttl: Some(1), ..Create::new("text/plain") }, "old");
    let at = resume_point(&old);
    std::thread::sleep(Duration::from_millis(1200));
    // The sweep removes it: no request touched it.
    assert_eq!(streams.sweep_expired(None).removed, 1);
    fill(&streams, "chat", &Create::new("text/plain"), "new");
    assert_refused(&streams, "chat", at);
    // Expired and removed by a request instead (the `PUT` finds it expired).
    let old = fill(&streams, "again", &Create { ttl: Some(1), ..Create::new("text/plain") }, "old");
    let at = resume_point(&old);
    std::thread::sleep(Duration::from_millis(1200));
    fill(&streams, "again", &Create::new("text/plain"), "new");
    assert_refused(&streams, "again", at);
}

#[test]
fn a_fork_shares_its_source_s_offsets_up_to_the_fork_point_only() {
    let dir = tempfile::tempdir().unwrap();
    let streams = streams_with(Config::new(dir.path()));
    let source = fill(&streams, "src", &Create::new("text/plain"), "s");
    let fork = Create { fork_from: Some("src".into()), fork_offset: Some(source[3]), ..Create::new("text/plain") };
    assert_eq!(streams.create("fork", &fork).unwrap().info.tail, source[3]);
    streams.append("fork", &text("f0;")).unwrap();
    // The source's offsets up to the fork point read the fork's data after them.
    assert_eq!(streams.read("fork", Start::At(source[1])).unwrap().body(), b"s1;s2;f0;");
    // Past it the source's data is not the fork's.
    assert_eq!(streams.read("fork", Start::At(source[4])).unwrap_err().kind(), StreamErrorKind::Gone);
    // The fork deleted and made again at the same point: its own offsets
    // are new, the inherited ones the same.
    let own = streams.head("fork").unwrap().tail;
    streams.delete("fork").unwrap();
    streams.create("fork", &fork).unwrap();
    streams.append("fork", &text("g0;")).unwrap();
    assert_ne!(streams.head("fork").unwrap().tail, own);
    assert_eq!(streams.read("fork", Start::At(own)).unwrap_err().kind(), StreamErrorKind::Gone);
    assert_eq!(streams.read("fork", Start::At(source[2])).unwrap().body(), b"s2;g0;");
}

/// Stream directories are named by a hash of the path (`xxh3_128`), which
/// a client could make collide: a path whose directory holds another
/// stream (simulated here by moving a stream's directory to the
/// directory of another path) neither reads, writes, forks nor re-creates
/// that stream. Before the fix the colliding path read it as its own.
#[test]
fn a_path_whose_directory_holds_another_stream_finds_no_stream() {
    let dir = tempfile::tempdir().unwrap();
    let streams = streams_with(Config::new(dir.path()));
    streams.create("victim", &Create { body: b"secret".to_vec(), ..Create::new("text/plain") }).unwrap();
    let hashed = |path: &str| dir.path().join(kn_streams::STREAMS_DIR).join(format!("{:032x}", xxhash_rust::xxh3::xxh3_128(path.as_bytes())));
    std::fs::rename(hashed("victim"), hashed("attacker")).unwrap();
    let fresh = streams_with(Config::new(dir.path()));
    assert_eq!(fresh.read("attacker", Start::Beginning).unwrap_err().kind(), StreamErrorKind::NotFound);
    assert_eq!(fresh.head("attacker").unwrap_err().kind(), StreamErrorKind::NotFound);
    assert_eq!(fresh.append("attacker", &text("x")).unwrap_err().kind(), StreamErrorKind::NotFound);
    assert_eq!(fresh.delete("attacker").unwrap_err().kind(), StreamErrorKind::NotFound);
    assert_eq!(fresh.create("attacker", &Create::new("text/plain")).unwrap_err().kind(), StreamErrorKind::Conflict);
    let fork = Create { fork_from: Some("attacker".into()), ..Create::new("text/plain") };
    assert_eq!(fresh.create("fork", &fork).unwrap_err().kind(), StreamErrorKind::NotFound);
    // Put back, the victim's stream is whole.
    std::fs::rename(hashed("attacker"), hashed("victim")).unwrap();
    assert_eq!(streams_with(Config::new(dir.path())).read("victim", Start::Beginning).unwrap().body(), b"secret");
}
