//! kn import-legacy end to end, on a legacy mod_pubsub kn_events tree
//! written byte by byte as PROTOCOL.md's appendix describes it.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kn_journal::{Config, Event, Store, Topic};
use kn_sensors::admin::event_from_json;

const OLD_URL: &str = "http://old.example.org/cgi-bin/pubsub.cgi";

fn kn(root: &Path, args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_kn")).arg("--root").arg(root).args(args).output().unwrap();
    assert!(out.status.success(), "kn {args:?}: {out:?}");
    out
}

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

/// A legacy tree and, per topic, the events it must come out as.
struct Legacy {
    dir: tempfile::TempDir,
    expected: BTreeMap<String, Vec<Event>>,
    expired: Vec<(String, Event)>,
}

impl Legacy {
    fn file(&mut self, topic: &str, name: &str, bytes: &[u8], mtime: u64) {
        let dir = self.dir.path().join(topic.trim_start_matches('/'));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        fs::write(&path, bytes).unwrap();
        fs::File::options().write(true).open(&path).unwrap().set_modified(at(mtime)).unwrap();
    }

    fn event(&mut self, topic: &str, name: &str, bytes: &[u8], mtime: u64, expected: &[(&str, &[u8])]) {
        self.file(topic, name, bytes, mtime);
        let e = Event::from_pairs(expected.iter().map(|(n, v)| (n.as_bytes().to_vec(), v.to_vec())));
        self.expected.entry(topic.to_string()).or_default().push(e);
    }

    fn index(&mut self, topic: &str, names: &str) {
        self.file(topic, ".index", names.as_bytes(), 979_300_000);
    }
}

fn legacy_tree() -> Legacy {
    let mut l = Legacy { dir: tempfile::tempdir().unwrap(), expected: BTreeMap::new(), expired: Vec::new() };
    fs::write(l.dir.path().join(".names"), format!("{OLD_URL}\r\n")).unwrap();

    // Announcements, as the original stored them.
    l.event("/kn_subtopics", "s1", b"kn_id: s1\nkn_time_t: 979273000\n\nwhat", 979273000, &[("kn_id", b"s1"), ("kn_time_t", b"979273000"), ("kn_payload", b"what")]);
    l.event("/kn_subtopics", "s2", b"kn_id: s2\nkn_time_t: 979273001\n\nwho", 979273001, &[("kn_id", b"s2"), ("kn_time_t", b"979273001"), ("kn_payload", b"who")]);
    l.index("/kn_subtopics", "s1\ns2\n");
    l.event("/what/kn_subtopics", "s3", b"kn_id: s3\r\nkn_time_t: 979273002\r\n\r\nchat", 979273002, &[("kn_id", b"s3"), ("kn_time_t", b"979273002"), ("kn_payload", b"chat")]);
    l.event("/who/kn_subtopics", "s4", b"kn_id: s4\nkn_time_t: 979273003\n\nanna", 979273003, &[("kn_id", b"s4"), ("kn_time_t", b"979273003"), ("kn_payload", b"anna")]);
    l.event("/who/anna/kn_subtopics", "s5", b"kn_id: s5\nkn_time_t: 979273004\n\nkn_journal", 979273004, &[("kn_id", b"s5"), ("kn_time_t", b"979273004"), ("kn_payload", b"kn_journal")]);
    l.event("/what/chat/kn_subtopics", "s6", b"kn_id: s6\nkn_time_t: 979273005\n\nkn_routes", 979273005, &[("kn_id", b"s6"), ("kn_time_t", b"979273005"), ("kn_payload", b"kn_routes")]);

    // An ordinary topic: CRLF, every kind of escape, a replaced event, a
    // deleted one, an expired one, one without kn_time_t, one too large.
    l.event(
        "/what/chat",
        "b",
        b"kn_id: b\nkn_time_t: 979273100\nkn_expires: 1000000000\n\nold news",
        979273100,
        &[("kn_id", b"b"), ("kn_time_t", b"979273100"), ("kn_expires", b"1000000000"), ("kn_payload", b"old news")],
    );
    let b = l.expected.get_mut("/what/chat").unwrap().pop().unwrap();
    l.expired.push(("/what/chat".to_string(), b));
    l.event(
        "/what/chat",
        "a",
        b"kn_id: a\r\nkn_time_t:   979273200\r\nsub=3Aject: a=3Ab=0Ac=3Dd\r\nedges: =20x=20\r\ntab:\tvalue\r\nnul: x=00y=09z=7F\r\nutf8: caf\xc3\xa9\r\n\r\nline 1\r\nline 2: =3A stays raw\n",
        979273200,
        &[
            ("kn_id", b"a"),
            ("kn_time_t", b"979273200"),
            ("sub:ject", b"a:b\nc=d"),
            ("edges", b" x "),
            ("tab", b"value"),
            ("nul", b"x\0y\tz\x7f"),
            ("utf8", "café".as_bytes()),
            ("kn_payload", b"line 1\r\nline 2: =3A stays raw\n"),
        ],
    );
    l.event("/what/chat", "c", b"kn_id: c\n\nno time", 979273300, &[("kn_id", b"c"), ("kn_time_t", b"979273300"), ("kn_payload", b"no time")]);
    l.index("/what/chat", "a\nb\na\ngone1\nc\n");
    let mut huge = b"kn_id: huge\n\n".to_vec();
    huge.resize((2 << 20) + 1, b'x');
    l.file("/what/chat", "huge", &huge, 979273400);
    l.file("/what/chat", ".tmp-d", b"kn_id: d\n\nhalf", 979273401);

    // A route whose destination is a URL of the old server.
    let route = format!("kn_id: r1\nkn_uri: javascript=3Acb\nkn_time_t: 979273050\n\n{OLD_URL}/who/anna/kn_journal");
    l.event(
        "/what/chat/kn_routes",
        "r1",
        route.as_bytes(),
        979273050,
        &[("kn_id", b"r1"), ("kn_uri", b"javascript:cb"), ("kn_time_t", b"979273050"), ("kn_payload", format!("{OLD_URL}/who/anna/kn_journal").as_bytes())],
    );
    l.index("/what/chat/kn_routes", "r1\n");

    // A journal: file names are fresh ids, two copies of one kn_id.
    let routed = |n: &str| {
        format!(
            "kn_id: a\nkn_time_t: 97927320{n}\nkn_routed_from: {OLD_URL}/what/chat\nkn_route_location: {OLD_URL}/what/chat/kn_routes/r1\nkn_route_id: r1\n\ncopy {n}"
        )
    };
    for (n, name) in [("0", "979273892_861_2249"), ("1", "979273893_861_2250")] {
        let text = routed(n);
        let time = format!("97927320{n}");
        let location = format!("{OLD_URL}/what/chat/kn_routes/r1");
        let from = format!("{OLD_URL}/what/chat");
        let payload = format!("copy {n}");
        l.event(
            "/who/anna/kn_journal",
            name,
            text.as_bytes(),
            979273201,
            &[
                ("kn_id", b"a"),
                ("kn_time_t", time.as_bytes()),
                ("kn_routed_from", from.as_bytes()),
                ("kn_route_location", location.as_bytes()),
                ("kn_route_id", b"r1"),
                ("kn_payload", payload.as_bytes()),
            ],
        );
    }
    l.index("/who/anna/kn_journal", "979273892_861_2249\n979273893_861_2250\n");
    let beat = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() - 10;
    l.file("/who/anna/kn_journal", ".heartbeat", b"", beat);
    l
}

fn json_events(root: &Path, topic: &str, extra: &[&str]) -> Vec<Event> {
    let mut args = vec!["events", topic, "--format", "json"];
    args.extend_from_slice(extra);
    let out = kn(root, &args);
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let mut e = event_from_json(&serde_json::from_str(l).unwrap()).unwrap();
            assert!(e.remove("kn_route_checkpoint").is_some());
            e
        })
        .collect()
}

#[test]
fn every_legacy_event_comes_out_identical_and_a_rerun_imports_nothing() {
    let legacy = legacy_tree();
    let store_dir = tempfile::tempdir().unwrap();
    let root = store_dir.path();
    let out = Command::new(env!("CARGO_BIN_EXE_kn"))
        .arg("--root")
        .arg(root)
        .args(["--verbose", "import-legacy"])
        .arg(legacy.dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(summary.starts_with("imported 12 events (1 of them expired)"), "{summary}");
    assert!(summary.contains("1 named in .index but gone, 1 heartbeats, 1 server names, 1 warnings"), "{summary}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("huge"), "the oversized file is named: {out:?}");

    for (topic, expected) in &legacy.expected {
        assert_eq!(&json_events(root, topic, &[]), expected, "events of {topic}");
    }
    // Nothing but the legacy events: no extra announcements anywhere.
    let topics = String::from_utf8(kn(root, &["topics", "--all"]).stdout).unwrap();
    for topic in topics.lines() {
        if !legacy.expected.contains_key(topic) {
            assert!(json_events(root, topic, &[]).is_empty(), "{topic} should be empty");
        }
    }
    // The expired event is there for duplicate suppression only.
    let (topic, expired) = &legacy.expired[0];
    assert!(json_events(root, topic, &["--expired"]).contains(expired));
    let store = {
        let store = Store::open_with(Config::new(root)).unwrap();
        assert!(store.notify(&Topic::parse(topic).unwrap(), expired.clone()).unwrap().duplicate);
        store
    };
    // Byte-exact in the simple format.
    let simple = kn(root, &["events", "/what/chat", "--format", "simple", "--max-n", "2"]).stdout;
    let decoded = kn_wire::simple::decode_frames(&simple).unwrap();
    assert_eq!(decoded[0].get("nul"), Some(&b"x\0y\tz\x7f"[..]));

    // The heartbeat time, the server names, the route.
    let journal = Topic::parse("/who/anna/kn_journal").unwrap();
    let beat = fs::metadata(root.join("who/anna/kn_journal/.heartbeat")).unwrap().modified().unwrap();
    let legacy_beat = fs::metadata(legacy.dir.path().join("who/anna/kn_journal/.heartbeat")).unwrap().modified().unwrap();
    assert_eq!(beat, legacy_beat);
    assert!(!store.is_stale(&journal));
    assert!(fs::read_to_string(root.join(".names")).unwrap().contains(OLD_URL));
    let routes = String::from_utf8(kn(root, &["routes", "/what/chat"]).stdout).unwrap();
    assert_eq!(routes, format!("r1\t{OLD_URL}/who/anna/kn_journal\tkn_time_t=979273050\tkn_uri=javascript=3Acb\n"));
    let before = String::from_utf8(kn(root, &["stat"]).stdout).unwrap();

    // Rerun: nothing new.
    let out = kn(root, &["--verbose", "import-legacy", legacy.dir.path().to_str().unwrap()]);
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(summary.starts_with("imported 0 events"), "{summary}");
    assert!(summary.contains("12 already there"), "{summary}");
    assert_eq!(String::from_utf8(kn(root, &["stat"]).stdout).unwrap(), before, "a rerun stores nothing");

    // The imported route is live: a new post reaches the journal.
    store.notify(&Topic::parse("/what/chat").unwrap(), Event::from_pairs([("kn_id", "new"), ("kn_payload", "after")])).unwrap();
    let journal_events = json_events(root, "/who/anna/kn_journal", &[]);
    assert_eq!(journal_events.len(), 3);
    assert_eq!(journal_events[2].payload(), b"after");
}

#[test]
fn a_missing_legacy_directory_is_an_input_error() {
    let store_dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kn"))
        .arg("--root")
        .arg(store_dir.path())
        .args(["import-legacy", "/nonexistent/kn_events"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(66), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/kn_events"));
}
