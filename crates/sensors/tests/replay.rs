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
    store.tunnel(&journal, &Selection::none()).unwrap();
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
    kn_replay_with(root, &[], args)
}

/// `kn-replay --root root ARGS` with `env` added; its output and how long
/// it ran.
fn kn_replay_with(root: &Path, env: &[(&str, &str)], args: &[&str]) -> (Output, Duration) {
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_kn-replay"))
        .arg("--root")
        .arg(root)
        .args(args)
        .env("KN_SERVER_URL", SERVER_URL)
        .envs(env.iter().copied())
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

/// A store whose journal holds events routed from /what/chat at the given
/// offsets (seconds) of kn_time_t.
fn journal_at(root: &Path, offsets: &[u64]) -> Store {
    let store = open(root);
    let journal = Topic::parse(JOURNAL).unwrap();
    let chat = Topic::parse(CHAT).unwrap();
    store.tunnel(&journal, &Selection::none()).unwrap();
    store.route(&chat, JOURNAL.as_bytes(), Event::from_pairs([("kn_id", "r1")])).unwrap();
    for (i, offset) in offsets.iter().enumerate() {
        let e = Event::from_pairs([
            ("kn_id".to_string(), format!("e{i}")),
            ("kn_time_t".to_string(), (1_000_000_000 + offset).to_string()),
            ("kn_payload".to_string(), format!("event {i}")),
        ]);
        store.notify(&chat, e).unwrap();
    }
    store
}

/// `do_method=replay` through pubsub.cgi as a CGI; its whole output.
fn cgi_replay(root: &Path, env: &[(&str, &str)]) -> String {
    let out = Command::new(pubsub_cgi())
        .env("GATEWAY_INTERFACE", "CGI/1.1")
        .env("REQUEST_METHOD", "GET")
        .env("QUERY_STRING", format!("do_method=replay&kn_from={JOURNAL}&kn_response_format=simple"))
        .env("SCRIPT_NAME", "/kn")
        .env("SERVER_NAME", "127.0.0.1")
        .env("SERVER_PORT", "8080")
        .env("SERVER_PROTOCOL", "HTTP/1.1")
        .env("KN_EVENTS", root)
        .env("KN_SERVER_URL", SERVER_URL)
        .env_remove("KN_REPLAY")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Kills the replay holding `slot` (its pid is in the slot file) and waits
/// until the slot is free, which its lock makes it the moment the process
/// is gone. Returns the pid.
fn kill_replay_in(root: &Path, slot: usize) -> u32 {
    let path = root.join(".replays").join(format!("slot-{slot}"));
    let pid: u32 = std::fs::read_to_string(&path).unwrap().trim().parse().unwrap();
    assert!(pid > 1);
    let status = Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap();
    assert!(status.success(), "kill {pid}");
    let file = std::fs::File::open(&path).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while file.try_lock().is_err() {
        assert!(Instant::now() < deadline, "slot {slot} still held after kill");
        std::thread::sleep(Duration::from_millis(20));
    }
    pid
}

/// Kills the replays still holding a slot of a store when a test ends,
/// however it ends.
struct StopReplays<'a>(&'a Path);

impl Drop for StopReplays<'_> {
    fn drop(&mut self) {
        for slot in 0..8 {
            let path = self.0.join(".replays").join(format!("slot-{slot}"));
            let held = std::fs::File::open(&path).map(|f| f.try_lock().is_err()).unwrap_or(false);
            if held {
                kill_replay_in(self.0, slot);
            }
        }
    }
}

/// KN_MAX_REPLAYS=1: while one replay runs (its next event is 1000 s
/// away), a second do_method=replay is answered 503 with Retry-After, and
/// kn-replay from a shell exits 75; once the running one is killed its
/// slot is free and a new replay starts.
#[test]
fn replays_past_kn_max_replays_get_503_until_a_slot_is_freed() {
    let dir = tempfile::tempdir().unwrap();
    let _stop = StopReplays(dir.path());
    let store = journal_at(dir.path(), &[0, 1000]);
    let limit = [("KN_MAX_REPLAYS", "1")];

    let first = cgi_replay(dir.path(), &limit);
    assert!(first.starts_with("Status: 200 Replaying"), "{first}");
    let refused = cgi_replay(dir.path(), &limit);
    assert!(refused.starts_with("Status: 503 Service Unavailable\r\n"), "{refused}");
    assert!(refused.contains("\r\nRetry-After: 60\r\n"), "{refused}");
    assert!(refused.contains("too many replays running on this server"), "{refused}");
    let (out, _) = kn_replay_with(dir.path(), &limit, &[JOURNAL]);
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("too many replays: 1 already running"), "{out:?}");
    // Only the first replay posted (its first event, at once).
    let deadline = Instant::now() + Duration::from_secs(10);
    while replayed(&store, "replay-").is_empty() {
        assert!(Instant::now() < deadline, "the first replay posted nothing");
        std::thread::sleep(Duration::from_millis(50));
    }

    let killed = kill_replay_in(dir.path(), 0);
    let again = cgi_replay(dir.path(), &limit);
    assert!(again.starts_with("Status: 200 Replaying"), "{again}");
    // A new kn-replay holds the slot now.
    let holder = std::fs::read_to_string(dir.path().join(".replays/slot-0")).unwrap();
    assert_ne!(holder.trim(), killed.to_string());
    assert!(std::fs::File::open(dir.path().join(".replays/slot-0")).unwrap().try_lock().is_err(), "slot-0 is held");
    // The default is 8 at once.
    assert_eq!(Config::new(dir.path()).max_replays, 8);
}

/// KN_REPLAY_MAX_TIME=2: a replay whose last event is due after 1000 s
/// posts what falls within the limit, then stops (exit 69, saying why)
/// instead of running on.
#[test]
fn a_replay_stops_at_kn_replay_max_time() {
    let dir = tempfile::tempdir().unwrap();
    let store = journal_at(dir.path(), &[0, 1, 1000]);
    let (out, took) = kn_replay_with(dir.path(), &[("KN_REPLAY_MAX_TIME", "2")], &["--prefix", "t-", JOURNAL]);
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("stopped at the time limit of 2 s (KN_REPLAY_MAX_TIME): 1 of 3 events not replayed"), "{stderr}");
    let ids: Vec<String> = replayed(&store, "t-").iter().map(|e| e.get_str("kn_id").unwrap()).collect();
    assert_eq!(ids, ["t-e0", "t-e1"]);
    assert!(took < Duration::from_secs(60), "took {took:?}");
    // Its slot is free again.
    let slot = std::fs::File::open(dir.path().join(".replays/slot-0")).unwrap();
    slot.try_lock().unwrap();
    assert_eq!(Config::new(dir.path()).replay_max_time, Duration::from_secs(3600));
}

