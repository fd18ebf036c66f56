//! The kn admin tool end to end: each command against a real store, in a
//! temporary directory, through the real binary.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use kn_journal::{Event, Selection, Store, Topic};

fn kn(root: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kn")).arg("--root").arg(root).args(args).stdin(Stdio::null()).output().unwrap()
}

fn ok(out: Output) -> String {
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

fn topic(name: &str) -> Topic {
    Topic::parse(name).unwrap()
}

/// /what/chat with two current events (one replaced) and a route into a
/// journal that holds the forwarded copies.
fn populated(root: &Path) -> Store {
    let store = Store::open(root).unwrap();
    store.tunnel(&topic("/who/anna/kn_journal"), &Selection::none()).unwrap();
    store.route(&topic("/what/chat"), b"/who/anna/kn_journal", Event::from_pairs([("kn_id", "r1")])).unwrap();
    for (id, payload) in [("e1", "first"), ("e2", "second\nline"), ("e1", "first, edited")] {
        store.notify(&topic("/what/chat"), Event::from_pairs([("kn_id", id), ("kn_time_t", "979273892"), ("kn_payload", payload)])).unwrap();
    }
    store
}

fn segment(root: &Path, topic: &str) -> PathBuf {
    let dir = root.join(topic.trim_start_matches('/'));
    std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(".seg-"))
        .unwrap()
}

#[test]
fn topics_lists_the_tree_without_reserved_topics_unless_asked() {
    let dir = tempfile::tempdir().unwrap();
    populated(dir.path());
    assert_eq!(ok(kn(dir.path(), &["topics"])), "/what\n/what/chat\n/who\n/who/anna\n/who/anna/kn_journal\n");
    let all = ok(kn(dir.path(), &["topics", "--all"]));
    assert!(all.contains("/what/chat/kn_routes\n") && all.contains("/kn_subtopics\n"), "{all}");
}

#[test]
fn events_prints_current_events_in_three_formats() {
    let dir = tempfile::tempdir().unwrap();
    populated(dir.path());
    let text = ok(kn(dir.path(), &["events", "/what/chat"]));
    assert_eq!(
        text,
        "kn_id: e2\nkn_route_checkpoint: 2\nkn_time_t: 979273892\n\nsecond\nline\n----\n\
         kn_id: e1\nkn_route_checkpoint: 3\nkn_time_t: 979273892\n\nfirst, edited\n----\n"
    );
    let json = ok(kn(dir.path(), &["events", "/what/chat", "--format", "json", "--max-n", "1"]));
    assert_eq!(json, "{\"kn_id\":\"e1\",\"kn_payload\":\"first, edited\",\"kn_route_checkpoint\":\"3\",\"kn_time_t\":\"979273892\"}\n");
    let simple = kn(dir.path(), &["events", "/what/chat", "--format", "simple"]).stdout;
    let events = kn_wire::simple::decode_frames(&simple).unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(events[0].payload(), b"second\nline");
    // The journal keeps every forwarded copy, with the route's elements.
    let journal = ok(kn(dir.path(), &["events", "/who/anna/kn_journal", "--format", "json"]));
    assert_eq!(journal.lines().count(), 3);
    assert!(journal.contains("\"kn_route_id\":\"r1\""), "{journal}");
}

#[test]
fn routes_lists_id_destination_and_attributes() {
    let dir = tempfile::tempdir().unwrap();
    let store = populated(dir.path());
    store.route(&topic("/what/chat"), b"/what/archive", Event::from_pairs([("kn_id", "r2"), ("kn_uri", "cb:1"), ("kn_time_t", "5")])).unwrap();
    store.delete_route(&topic("/what/chat"), b"r2", None).unwrap();
    assert_eq!(ok(kn(dir.path(), &["routes", "/what/chat"])).lines().count(), 1);
    let all = ok(kn(dir.path(), &["routes", "/what/chat", "--all"]));
    let lines: Vec<&str> = all.lines().collect();
    assert_eq!(lines.len(), 2, "{all}");
    assert!(lines[0].starts_with("r1\thttp://localhost/kn/who/anna/kn_journal\tkn_time_t="), "{all}");
    assert!(lines[1].starts_with("r2\t-\t"), "a deleted route has no destination: {all}");
}

/// A route into a URL of this server that names no topic is accepted and
/// poisoned by its first delivery (as the original did); `kn routes` (and
/// `--all`) shows it inactive with the reason.
#[test]
fn routes_show_a_poisoned_route_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let store = populated(dir.path());
    for (id, destination) in [("r3", "http://localhost/kn/what/a/../flurb"), ("r4", "http://localhost/knwhat/a")] {
        store.route(&topic("/what/chat"), destination.as_bytes(), Event::from_pairs([("kn_id", id)])).unwrap();
    }
    assert_eq!(ok(kn(dir.path(), &["routes", "/what/chat"])).lines().count(), 3, "active until the first delivery");
    let post = store.notify(&topic("/what/chat"), Event::from_pairs([("kn_payload", "poisons")])).unwrap();
    assert_eq!(post.poisoned.len(), 2, "{post:?}");
    let all = ok(kn(dir.path(), &["routes", "/what/chat", "--all"]));
    assert_eq!(ok(kn(dir.path(), &["routes", "/what/chat"])), all, "nothing else is inactive: the same lines");
    let line = |id: &str| all.lines().find(|l| l.starts_with(&format!("{id}\t"))).unwrap_or_else(|| panic!("{id} missing: {all}")).to_string();
    // Values are escaped as in the simple format (`:` is `=3A`).
    let field = |line: &str, name: &str| {
        let value = line.split('\t').find_map(|f| f.strip_prefix(&format!("{name}="))).unwrap_or_else(|| panic!("no {name}: {line}"));
        String::from_utf8(kn_wire::simple::unescape(value.as_bytes())).unwrap()
    };
    let r3 = line("r3");
    assert!(r3.starts_with("r3\t-\t"), "poisoned: no destination: {r3}");
    assert_eq!(field(&r3, "kn_poisoned"), "bad topic name '/what/a/../flurb': segment '..' starts or ends with '.'");
    let r4 = line("r4");
    assert!(r4.starts_with("r4\t-\t"), "{r4}");
    assert!(
        field(&r4, "kn_poisoned").starts_with("bad topic name 'http://localhost/knwhat/a': a URL of this server ('http://localhost/kn')"),
        "{r4}"
    );
    assert!(r4.contains("\tkn_expires="), "a poisoned route expires: {r4}");
}

/// Poisoned routes are listed by default, and standard error says of each
/// when and why, where it went and the request that makes it again (with
/// the elements of the route it replaced); deleted routes are not listed.
#[test]
fn routes_lists_poisoned_routes_by_default_with_how_to_recreate_them() {
    let dir = tempfile::tempdir().unwrap();
    // Named before its routes are made (a name makes its URLs local).
    Store::open(dir.path()).unwrap().add_server_name("http://pubsub.example/kn").unwrap();
    let store = populated(dir.path());
    let bad = Event::from_pairs([("kn_id", "r3"), ("kn_uri", "cb 3"), ("kn_content_filter", r"(?i)\bhi\b")]);
    store.route(&topic("/what/chat"), b"http://pubsub.example/kn/what/a/../b", bad).unwrap();
    store.route(&topic("/what/chat"), b"/what/archive", Event::from_pairs([("kn_id", "r5")])).unwrap();
    store.delete_route(&topic("/what/chat"), b"r5", None).unwrap();
    let post = store.notify(&topic("/what/chat"), Event::from_pairs([("kn_payload", "hi there")])).unwrap();
    assert_eq!(post.poisoned.len(), 1, "{post:?}");

    let out = kn(dir.path(), &["routes", "/what/chat"]);
    let (stdout, stderr) = (ok(out.clone()), String::from_utf8(out.stderr).unwrap());
    let ids: Vec<&str> = stdout.lines().map(|l| l.split('\t').next().unwrap()).collect();
    assert_eq!(ids, ["r1", "r3"], "active and poisoned, not deleted: {stdout}");
    assert!(stdout.lines().nth(1).unwrap().contains("\tkn_poisoned=bad topic name"), "{stdout}");
    assert!(stderr.starts_with("kn: route r3 of /what/chat is POISONED (it went to http://pubsub.example/kn/what/a/../b), "), "{stderr}");
    assert!(stderr.contains(" s ago: bad topic name '/what/a/../b'"), "{stderr}");
    let again = "re-create it, once the cause is fixed: curl -d do_method=route -d kn_from=/what/chat \
                 -d kn_to=http://pubsub.example/kn/what/a/../b --data-urlencode 'kn_content_filter=(?i)\\bhi\\b' -d kn_id=r3 \
                 --data-urlencode 'kn_uri=cb 3' -d kn_response_format=simple http://pubsub.example/kn\n";
    assert!(stderr.ends_with(again), "{stderr}");
    assert_eq!(stderr.lines().count(), 2, "one note for the one poisoned route: {stderr}");
}

#[test]
fn stat_counts_events_records_bytes_and_segments() {
    let dir = tempfile::tempdir().unwrap();
    populated(dir.path());
    let table = ok(kn(dir.path(), &["stat"]));
    let row = table.lines().find(|l| l.ends_with("  /what/chat")).unwrap();
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!((cells[0], cells[1], cells[3]), ("2", "3", "1"), "{table}");
    assert!(cells[2].parse::<u64>().unwrap() > 0);
    assert!(table.lines().next().unwrap().contains("events") && table.lines().any(|l| l.contains("(total of")), "{table}");
    // Then the store's counters (issue 11): what the sweep did.
    assert!(table.lines().any(|l| l == "journals_removed 0"), "{table}");
    assert!(table.lines().any(|l| l == "sweeps 0"), "{table}");
    let json = ok(kn(dir.path(), &["stat", "/who", "--json"]));
    let journal: serde_json::Value =
        json.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()).find(|v| v["topic"] == "/who/anna/kn_journal").unwrap();
    assert_eq!(journal["events"], 3);
    assert!(!json.contains("/what"), "only /who and below: {json}");
}

#[test]
fn verify_finds_a_flipped_byte() {
    let dir = tempfile::tempdir().unwrap();
    populated(dir.path());
    let clean = kn(dir.path(), &["verify"]);
    assert!(clean.status.success() && clean.stdout.is_empty(), "quiet when clean and not on a terminal: {clean:?}");
    let path = segment(dir.path(), "/what/chat");
    let mut bytes = std::fs::read(&path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x20;
    std::fs::write(&path, &bytes).unwrap();
    let out = kn(dir.path(), &["verify"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let report = String::from_utf8(out.stdout).unwrap();
    assert!(report.starts_with(&format!("BAD {} at offset ", path.display())), "{report}");
}

#[test]
fn verify_lists_a_damaged_first_record_and_counts_the_records_after_it() {
    let dir = tempfile::tempdir().unwrap();
    populated(dir.path());
    let clean = ok(kn(dir.path(), &["--verbose", "verify"]));
    let total: usize = clean.trim_start_matches("ok: ").split(' ').next().unwrap().parse().unwrap();
    let path = segment(dir.path(), "/what/chat");
    let mut bytes = std::fs::read(&path).unwrap();
    // A byte of the first record's body: the records after it stay good.
    bytes[12] ^= 0x20;
    std::fs::write(&path, &bytes).unwrap();
    let out = kn(dir.path(), &["--verbose", "verify"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let report = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = report.lines().collect();
    assert_eq!(lines.len(), 2, "{report}");
    assert!(lines[0].starts_with(&format!("BAD {} at offset 0: damaged record", path.display())), "{report}");
    assert_eq!(lines[1], format!("1 bad records; {} good records verified", total - 1), "{report}");
}

#[test]
fn verify_repair_truncates_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    populated(dir.path());
    let path = segment(dir.path(), "/who/anna/kn_journal");
    let len = std::fs::metadata(&path).unwrap().len();
    // Half a frame header, as a crash in the middle of an append leaves.
    std::fs::OpenOptions::new().append(true).open(&path).and_then(|mut f| std::io::Write::write_all(&mut f, b"\x10\x00\x00")).unwrap();
    let torn = kn(dir.path(), &["verify"]);
    assert_eq!(torn.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&torn.stdout).contains("torn tail"), "{torn:?}");
    let repaired = ok(kn(dir.path(), &["--verbose", "verify", "--repair"]));
    assert!(repaired.starts_with("repaired 1 topics; 1 bad records before, 0 after"), "{repaired}");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), len);
    let clean = ok(kn(dir.path(), &["--verbose", "verify"]));
    assert!(clean.starts_with("ok: ") && clean.ends_with(" records verified\n"), "{clean}");
}

#[test]
fn tail_follow_prints_events_posted_by_another_process() {
    let dir = tempfile::tempdir().unwrap();
    let store = populated(dir.path());
    let mut child = Command::new(env!("CARGO_BIN_EXE_kn"))
        .arg("--root")
        .arg(dir.path())
        .args(["tail", "-f", "-n", "1", "--format", "json", "/what/chat"])
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let first = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(first.contains("\"first, edited\""), "the last event first: {first}");
    store.notify(&topic("/what/chat"), Event::from_pairs([("kn_id", "live"), ("kn_payload", "just now")])).unwrap();
    let live = rx.recv_timeout(Duration::from_secs(10));
    child.kill().unwrap();
    child.wait().unwrap();
    let live = live.expect("tail -f prints the new event");
    assert!(live.contains("\"kn_payload\":\"just now\""), "{live}");
}

#[test]
fn compact_is_quiet_in_cron_and_export_names_each_topic() {
    let dir = tempfile::tempdir().unwrap();
    populated(dir.path());
    assert_eq!(ok(kn(dir.path(), &["compact"])), "");
    assert!(ok(kn(dir.path(), &["--verbose", "compact", "/what/chat"])).starts_with("compacted 1 topics"));
    let export = ok(kn(dir.path(), &["export", "/what"]));
    let lines: Vec<serde_json::Value> = export.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(lines.iter().all(|l| l["topic"].as_str().unwrap().starts_with("/what")), "{export}");
    let chat: Vec<_> = lines.iter().filter(|l| l["topic"] == "/what/chat").collect();
    assert_eq!(chat.len(), 2);
    assert_eq!(chat[1]["event"]["kn_payload"], "first, edited");
    assert!(lines.iter().any(|l| l["topic"] == "/what/chat/kn_routes"), "routes are exported too");
}

#[test]
fn kn_documents_every_command() {
    let out = Command::new(env!("CARGO_BIN_EXE_kn")).arg("--help").output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for command in ["topics", "events", "routes", "tail", "stat", "compact", "gc", "verify", "import-legacy", "export", "Examples"] {
        assert!(help.contains(command), "kn --help mentions {command}: {help}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_kn")).args(["verify", "--help"]).output().unwrap();
    assert!(String::from_utf8(out.stdout).unwrap().contains("--repair"));
}

#[test]
fn names_lists_adds_and_removes_the_server_names() {
    let dir = tempfile::tempdir().unwrap();
    let kn = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_kn")).arg("--root").arg(dir.path()).args(args).env_remove("KN_SERVER_URL").output().unwrap()
    };
    // Each name with where it came from, tab-separated (`cut -f1` for the URLs).
    assert_eq!(ok(kn(&["names"])), "http://localhost/kn\tdefault\n", "an unnamed store");
    ok(kn(&["names", "add", "http://main.example/kn"]));
    ok(kn(&["names", "add", "http://alias.example/kn"]));
    assert_eq!(ok(kn(&["names", "list"])), "http://main.example/kn\tpinned\nhttp://alias.example/kn\tpinned\n");
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.resolve(b"http://alias.example/kn/a").unwrap(), kn_journal::internal::Destination::Local(topic("/a")));
    ok(kn(&["names", "remove", "http://alias.example/kn"]));
    assert_eq!(ok(kn(&["names"])), "http://main.example/kn\tpinned\n");
    let bad = kn(&["names", "add", "alias.example"]);
    assert_eq!(bad.status.code(), Some(64), "a usage error: {bad:?}");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("absolute http://"), "{bad:?}");
    let missing = kn(&["names", "remove", "http://nobody.example/kn"]);
    assert_eq!(missing.status.code(), Some(64), "{missing:?}");
}

#[test]
fn doctor_reports_the_file_system_and_the_mode_chosen() {
    let dir = tempfile::tempdir().unwrap();
    populated(dir.path());
    let out = ok(kn(dir.path(), &["doctor"]));
    assert!(out.contains("file system: ") && out.contains("local mode (KN_SHARED=auto)"), "{out}");
    // Forced on, a local store runs in shared mode, with nothing to check.
    let forced = Command::new(env!("CARGO_BIN_EXE_kn")).arg("--root").arg(dir.path()).arg("doctor").env("KN_SHARED", "on").output().unwrap();
    let text = ok(forced);
    assert!(text.contains("shared mode (KN_SHARED=on)") && !text.contains("WRONG"), "{text}");
    let bad = Command::new(env!("CARGO_BIN_EXE_kn")).arg("--root").arg(dir.path()).arg("doctor").env("KN_SHARED", "maybe").output().unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("bad shared mode 'maybe'"), "{bad:?}");
}

#[test]
fn gc_removes_a_stale_journal_with_its_route_and_stat_counts_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = populated(dir.path());
    // Stale, but within the default grace: kn gc keeps it.
    store.expire(&topic("/who/anna/kn_journal")).unwrap();
    ok(kn(dir.path(), &["gc"]));
    assert!(dir.path().join("who/anna/kn_journal").is_dir());
    let summary = ok(kn(dir.path(), &["gc", "--grace", "0", "--verbose"]));
    assert!(summary.contains("removed 1 stale journals, 1 routes into them and 2 empty topics"), "{summary}");
    assert!(!dir.path().join("who").exists());
    assert!(store.routes(&topic("/what/chat")).unwrap().is_empty());
    let table = ok(kn(dir.path(), &["stat"]));
    assert!(table.lines().any(|l| l == "journals_removed 1"), "{table}");
    assert!(table.lines().any(|l| l == "routes_removed 1"), "{table}");
    assert!(table.lines().any(|l| l == "topics_pruned 2"), "{table}");
    assert!(table.lines().any(|l| l == "sweeps 2"), "{table}");
    ok(kn(dir.path(), &["verify"]));
    let bad = kn(dir.path(), &["gc", "--grace", "soon"]);
    assert_eq!(bad.status.code(), Some(64), "a bad command line, as --help says: {bad:?}");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("soon"), "{bad:?}");
    // --help is not an error.
    assert_eq!(kn(dir.path(), &["--help"]).status.code(), Some(0));
}
