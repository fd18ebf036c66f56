//! kn-replay end to end: spacing with and without --warp, dry runs, and
//! pubsub.cgi's do_method=replay starting it detached.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use kn_journal::{Config, Event, Selection, Store, Topic};

const SERVER_URL: &str = "http://127.0.0.1:8080/kn";
const JOURNAL: &str = "/who/anna/kn_journal";
const CHAT: &str = "/what/chat";

fn open(root: &Path) -> Store {
    let mut config = Config::new(root);
    config.server_url = Some(SERVER_URL.to_string());
    Store::open_with(config).unwrap()
}

/// A store whose journal holds three events routed from /what/chat, one
/// second apart by kn_time_t (posted now, much faster than that).
fn journal_with_spacing(root: &Path) -> Store {
    let store = open(root);
    let journal = Topic::parse(JOURNAL).unwrap();
    let chat = Topic::parse(CHAT).unwrap();
    store.tunnel(&journal, &Selection::default()).unwrap();
    store.route(&chat, JOURNAL.as_bytes(), Event::from_pairs([("kn_id", "r1")])).unwrap();
    let t0 = 1_000_000_000u64;
    for i in 0..3u64 {
        let e = Event::from_pairs([
            ("kn_id".to_string(), format!("e{i}")),
            ("kn_time_t".to_string(), (t0 + i).to_string()),
            ("kn_payload".to_string(), format!("event {i}")),
        ]);
        store.notify(&chat, e).unwrap();
    }
    assert_eq!(store.events(&journal, &Selection::all()).unwrap().events.len(), 3);
    store
}

fn replayed(store: &Store, prefix: &str) -> Vec<Event> {
    let chat = Topic::parse(CHAT).unwrap();
    let events = store.events(&chat, &Selection::all()).unwrap().events;
    events.into_iter().filter(|e| e.id().unwrap_or_default().starts_with(prefix.as_bytes())).collect()
}

fn kn_replay(root: &Path, args: &[&str]) -> (Output, Duration) {
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_kn-replay"))
        .arg("--root")
        .arg(root)
        .args(args)
        .env("KN_SERVER_URL", SERVER_URL)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (out, start.elapsed())
}

#[test]
fn replay_keeps_the_original_spacing_and_reposts_to_the_origin() {
    let dir = tempfile::tempdir().unwrap();
    let store = journal_with_spacing(dir.path());
    let (out, took) = kn_replay(dir.path(), &["--prefix", "p1-", JOURNAL]);
    assert!(out.status.success(), "{out:?}");
    assert!(out.stdout.is_empty() && out.stderr.is_empty(), "quiet when not on a terminal: {out:?}");
    assert!(took >= Duration::from_millis(1900), "3 events 1 s apart take 2 s, took {took:?}");
    assert!(took < Duration::from_secs(6), "took {took:?}");
    let events = replayed(&store, "p1-");
    let ids: Vec<_> = events.iter().map(|e| e.get_str("kn_id").unwrap()).collect();
    assert_eq!(ids, ["p1-e0", "p1-e1", "p1-e2"]);
    assert_eq!(events[2].payload(), b"event 2");
    assert!(!events[0].get_str("kn_time_t").unwrap().starts_with("100000000"), "a fresh kn_time_t");
    // Replayed events travel the route again: the journal has 6 now.
    let journal = Topic::parse(JOURNAL).unwrap();
    assert_eq!(store.events(&journal, &Selection::all()).unwrap().events.len(), 6);
}

#[test]
fn warp_divides_the_spacing() {
    let dir = tempfile::tempdir().unwrap();
    let store = journal_with_spacing(dir.path());
    let (out, took) = kn_replay(dir.path(), &["--warp", "10", "--prefix", "w-", JOURNAL]);
    assert!(out.status.success(), "{out:?}");
    assert!(took >= Duration::from_millis(190), "2 s / 10 = 0.2 s, took {took:?}");
    assert!(took < Duration::from_millis(1500), "2 s / 10 = 0.2 s, took {took:?}");
    assert_eq!(replayed(&store, "w-").len(), 3);
}

#[test]
fn dry_run_plans_and_posts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = journal_with_spacing(dir.path());
    let (out, took) = kn_replay(dir.path(), &["--dry-run", "--warp", "2", "--prefix", "d-", JOURNAL]);
    assert!(out.status.success(), "{out:?}");
    assert!(took < Duration::from_millis(900), "a dry run does not wait: {took:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        [
            "+0.000s\t/what/chat\td-e0",
            "+0.500s\t/what/chat\td-e1",
            "+1.000s\t/what/chat\td-e2"
        ]
    );
    assert!(replayed(&store, "d-").is_empty());
}

#[test]
fn bad_warp_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    journal_with_spacing(dir.path());
    let (out, _) = kn_replay(dir.path(), &["--warp", "0", JOURNAL]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("warp"), "{out:?}");
}

#[test]
fn replay_documents_itself() {
    let out = Command::new(env!("CARGO_BIN_EXE_kn-replay")).arg("--help").output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for word in ["--warp", "--dry-run", "--root", "JOURNAL", "kn_routed_from", "Examples"] {
        assert!(help.contains(word), "--help mentions {word}: {help}");
    }
}

/// pubsub-cgi beside kn-replay (as `cargo test --workspace` and an
/// install leave them); built here when this crate's tests run alone.
fn pubsub_cgi() -> PathBuf {
    let dir = Path::new(env!("CARGO_BIN_EXE_kn-replay")).parent().unwrap().to_path_buf();
    let cgi = dir.join("pubsub-cgi");
    if !cgi.is_file() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
        let status = Command::new(cargo).args(["build", "-p", "kn-cgi", "--bin", "pubsub-cgi"]).status().unwrap();
        assert!(status.success(), "building pubsub-cgi");
    }
    assert!(cgi.is_file(), "pubsub-cgi beside kn-replay in {}", dir.display());
    cgi
}

#[test]
fn cgi_replay_starts_kn_replay_detached_and_answers_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = journal_with_spacing(dir.path());
    let query = format!("do_method=replay&kn_from={JOURNAL}&kn_response_format=simple");
    let start = Instant::now();
    let out = Command::new(pubsub_cgi())
        .env("GATEWAY_INTERFACE", "CGI/1.1")
        .env("REQUEST_METHOD", "GET")
        .env("QUERY_STRING", &query)
        .env("SCRIPT_NAME", "/kn")
        .env("SERVER_NAME", "127.0.0.1")
        .env("SERVER_PORT", "8080")
        .env("SERVER_PROTOCOL", "HTTP/1.1")
        .env("KN_EVENTS", dir.path())
        .env("KN_SERVER_URL", SERVER_URL)
        .env_remove("KN_REPLAY")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let answered = start.elapsed();
    let reply = String::from_utf8_lossy(&out.stdout);
    assert!(reply.starts_with("Status: 200 Replaying"), "{reply}");
    assert!(answered < Duration::from_millis(1500), "the reply does not wait for the replay (2 s): {answered:?}");
    // The detached replay goes on after the CGI process has exited.
    let deadline = Instant::now() + Duration::from_secs(15);
    let chat = Topic::parse(CHAT).unwrap();
    loop {
        let n = store.events(&chat, &Selection::all()).unwrap().events.len();
        if n == 6 {
            break;
        }
        assert!(Instant::now() < deadline, "replayed events appear ({n} of 6 events on {CHAT})");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(start.elapsed() >= Duration::from_millis(1900), "the replay kept the spacing");
    let ids: Vec<String> = store.events(&chat, &Selection::all()).unwrap().events.iter().map(|e| e.get_str("kn_id").unwrap()).collect();
    assert!(ids[3].starts_with("replay-") && ids[3].ends_with("-e0"), "{ids:?}");
}
