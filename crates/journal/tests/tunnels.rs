//! Tunnels of the journal (PROTOCOL.md 3.4): the initial selection
//! then what others post, woken across threads and processes by change
//! notification, with polling as the fallback; split from semantics.rs.

use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod common;
use common::{config, ev, scratch, t};

use kn_journal::{Config, ErrorKind, Event, Selection, Store};
use kn_journal::internal::{encode_record, Record};

use common::journal::*;

// ----- tunnels --------------------------------------------------------------

#[test]
fn tunnel_sends_the_initial_selection_then_events_posted_by_another_thread() {
    let (_d, store) = open();
    let store = Arc::new(store);
    let j = journal_with(&store, "/who/t/kn_journal", 3);
    let mut start = store.tunnel(&j, &Selection { max_n: Some(2), ..Selection::none() }).unwrap();
    assert_eq!(payloads(&start.initial.events), ["e1", "e2"]);
    let poster = {
        let store = store.clone();
        let j = j.clone();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(100));
            for i in 0..3 {
                store.notify(&j, ev(&[("kn_payload", &format!("live{i}"))])).unwrap();
            }
        })
    };
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.len() < 3 && Instant::now() < deadline {
        seen.extend(start.tunnel.wait(&store, Duration::from_secs(2)).unwrap());
    }
    poster.join().unwrap();
    assert_eq!(payloads(&seen), ["live0", "live1", "live2"]);
    let cps: Vec<u64> = seen.iter().map(checkpoint).collect();
    assert!(cps.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(start.tunnel.checkpoint(), cps[2]);
}

/// Re-executes this test binary so that [`child_process_role`] acts as
/// `role` in another process.
fn child(role: &str, envs: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["child_process_role", "--exact", "--nocapture", "--test-threads=1"]);
    cmd.env("KN_SEM_CHILD", role);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd
}

/// Not a test of its own: the body of the child processes that other tests
/// start. Does nothing unless `KN_SEM_CHILD` is set.
#[test]
fn child_process_role() {
    let Ok(role) = std::env::var("KN_SEM_CHILD") else { return };
    match role.as_str() {
        "poster" => {
            let root = std::env::var("KN_SEM_ROOT").unwrap();
            let store = Store::open_with(config(Path::new(&root))).unwrap();
            let topic = t(&std::env::var("KN_SEM_TOPIC").unwrap());
            thread::sleep(Duration::from_millis(300));
            let micros = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros();
            store.notify(&topic, ev(&[("kn_payload", &micros.to_string()), ("from", "child")])).unwrap();
        }
        "relative_root" => {
            // The default root, ./kn_events, is relative: tunnels must still
            // be woken by change notification, not by polling.
            let dir = std::env::var("KN_SEM_ROOT").unwrap();
            std::env::set_current_dir(&dir).unwrap();
            let mut c = config(Path::new("kn_events"));
            c.poll_interval = Duration::from_secs(30);
            let store = Arc::new(Store::open_with(c).unwrap());
            let j = live_journal(&store, "/rel/kn_journal");
            let mut start = store.tunnel(&j, &Selection::none()).unwrap();
            assert!(start.tunnel.is_notified());
            let poster = {
                let (store, j) = (store.clone(), j.clone());
                thread::spawn(move || {
                    thread::sleep(Duration::from_millis(200));
                    store.notify(&j, ev(&[("kn_payload", "woken")])).unwrap();
                })
            };
            let begun = Instant::now();
            let got = start.tunnel.wait(&store, Duration::from_secs(5)).unwrap();
            poster.join().unwrap();
            let waited = begun.elapsed();
            println!("relative root: woken after {waited:?}");
            assert_eq!(payloads(&got), ["woken"]);
            // A wait that runs to its 5 s timeout was never woken: only the
            // final re-read found the event.
            assert!(waited < Duration::from_secs(4), "not woken by the change notifier: waited {waited:?}");
            println!("KN_SEM_CHILD_OK");
        }
        "from_env" => {
            let c = Config::from_env().unwrap();
            assert_eq!(c.root, PathBuf::from("/tmp/kn-sem-env-root"));
            assert_eq!(c.reserve_bytes, 12345);
            assert_eq!(c.sync, kn_journal::SyncPolicy::Always);
            assert_eq!(c.max_event_bytes, 777);
            assert_eq!(c.segment_bytes, 65536);
            assert_eq!(c.journal_max_age, Duration::from_secs(60));
            assert_eq!(c.journal_max_bytes, 1 << 20);
            assert_eq!(c.expired_grace, Duration::from_secs(9));
            assert_eq!(c.poll_interval, Duration::from_millis(40));
            assert_eq!(c.server_url.as_deref(), Some("http://env.example/cgi-bin/pubsub.cgi"));
            assert_eq!(c.outbound, kn_journal::OutboundPolicy::AllowAll);
            assert_eq!(c.remote_timeout, Duration::from_millis(1500));
            assert_eq!(c.max_forwards, 42);
            assert_eq!(c.forward_inline, 7);
            assert_eq!(c.group_commit, 5);
            assert_eq!((c.max_topic_depth, c.max_topic_bytes, c.max_selected, c.max_form_elements), (7, 300, 99, 55));
            println!("KN_SEM_CHILD_OK");
        }
        "from_env_bad" => {
            let err = Config::from_env().unwrap_err();
            assert_eq!(err.kind(), ErrorKind::BadRequest);
            assert!(err.to_string().contains("KN_MAX_EVENT_BYTES"), "{err}");
            println!("KN_SEM_CHILD_OK");
        }
        other => panic!("unknown child role {other}"),
    }
}

#[test]
fn tunnel_wakes_for_an_event_posted_by_another_process() {
    let (dir, store) = open();
    let j = live_journal(&store, "/who/proc/kn_journal");
    let mut start = store.tunnel(&j, &Selection::none()).unwrap();
    let root = dir.path().join("kn_events");
    let kid = child("poster", &[("KN_SEM_ROOT", root.to_str().unwrap()), ("KN_SEM_TOPIC", j.as_str())])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.is_empty() && Instant::now() < deadline {
        seen.extend(start.tunnel.wait(&store, Duration::from_secs(1)).unwrap());
    }
    let arrived = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros();
    let out = kid.wait_with_output().unwrap();
    assert!(out.status.success(), "the poster failed: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].get_str("from").as_deref(), Some("child"));
    let posted: u128 = seen[0].get_str("kn_payload").unwrap().parse().unwrap();
    println!(
        "cross-process tunnel wake latency: {} µs (notified: {})",
        arrived.saturating_sub(posted),
        start.tunnel.is_notified()
    );
}

/// A tunnel's own process wakes it directly for its own appends, and its
/// notifier then skips the change events of those writes; the appends of
/// another store (as good as another process: it has its own notifier)
/// interleaved with them must still wake it. Polling is set to a minute,
/// so only a wakeup can bring each round's events before the 10 s wait
/// ends (the re-read at its end would find them too, but late).
#[test]
fn own_appends_woken_directly_never_hide_another_writers_appends() {
    let dir = scratch("kn-journal-test-");
    let root = dir.path().join("kn_events");
    let mut c = config(&root);
    c.poll_interval = Duration::from_secs(60);
    let own = std::sync::Arc::new(Store::open_with(c.clone()).unwrap());
    let other = std::sync::Arc::new(Store::open_with(c).unwrap());
    let j = live_journal(&own, "/who/both/kn_journal");
    let mut start = own.tunnel(&j, &Selection::none()).unwrap();
    assert!(start.tunnel.is_notified(), "no change notification here: this test needs inotify");
    for round in 0..30 {
        // Both orders: the other store's write just before ours (its event
        // may be the one our count takes off) and just after; the last
        // round the other store's alone. Written while the tunnel waits.
        let (first, second) = if round % 2 == 0 { (own.clone(), other.clone()) } else { (other.clone(), own.clone()) };
        let topic = j.clone();
        let writer = thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            first.notify(&topic, ev(&[("kn_payload", &format!("{round}a"))])).unwrap();
            if round < 29 {
                second.notify(&topic, ev(&[("kn_payload", &format!("{round}b"))])).unwrap();
            }
        });
        let want: Vec<String> = if round < 29 { vec![format!("{round}a"), format!("{round}b")] } else { vec![format!("{round}a")] };
        let begun = Instant::now();
        let mut seen = Vec::new();
        while seen.len() < want.len() && begun.elapsed() < Duration::from_secs(10) {
            seen.extend(start.tunnel.wait(&own, Duration::from_secs(10)).unwrap());
        }
        writer.join().unwrap();
        assert_eq!(payloads(&seen), want, "round {round}");
        assert!(begun.elapsed() < Duration::from_secs(5), "round {round}: no wakeup came, only the final re-read");
    }
}

/// Follows `tunnel` the way `pubsub-cgi serve` follows one (arm, read,
/// wait only when caught up) until it has delivered `n` events. Every
/// wait must end in a wakeup within 10 s (the tests set polling to a
/// minute): an event left behind fails the test.
fn follow(tunnel: &mut kn_journal::Tunnel, store: &Store, n: usize) -> Vec<Event> {
    use event_listener::Listener as _;
    let mut seen = Vec::new();
    while seen.len() < n {
        let listener = tunnel.listen();
        let got = tunnel.next(store).unwrap();
        let read_something = !got.is_empty();
        seen.extend(got);
        if (read_something && !tunnel.caught_up()) || seen.len() == n {
            continue;
        }
        let woken = listener.wait_timeout(Duration::from_secs(10)).is_some();
        assert!(woken, "no wakeup within 10 s after {} of {n} events: an event was left behind", seen.len());
    }
    seen
}

/// A tunnel that has read to the end of its segment waits for the next
/// wakeup without looking for a newer segment by name as long as its
/// notifier saw no segment appear (see `Subscription::segments_created`).
/// Followed the way `pubsub-cgi serve` follows it (arm, read, wait only
/// when caught up) across segment rolls made by its own store and by
/// another one (as good as another process), every event must come with
/// a wakeup: polling is set to a minute and each wait to 10 s.
#[test]
fn a_caught_up_tunnel_follows_segment_rolls_by_wakeups_alone() {
    let dir = scratch("kn-journal-test-");
    let root = dir.path().join("kn_events");
    let mut c = config(&root);
    c.poll_interval = Duration::from_secs(60);
    c.segment_bytes = 4096;
    let own = Arc::new(Store::open_with(c.clone()).unwrap());
    let other = Arc::new(Store::open_with(c).unwrap());
    let j = live_journal(&own, "/who/rolls/kn_journal");
    let mut start = own.tunnel(&j, &Selection::none()).unwrap();
    assert!(start.tunnel.is_notified(), "no change notification here: this test needs inotify");
    const N: usize = 120;
    let (writer_own, writer_other, topic) = (own.clone(), other.clone(), j.clone());
    let writer = thread::spawn(move || {
        let pad = "x".repeat(900);
        for i in 0..N {
            // Several events per segment, each store rolling some of them.
            let store = if (i / 3) % 2 == 0 { &writer_own } else { &writer_other };
            store.notify(&topic, ev(&[("kn_payload", &format!("{i}")), ("pad", &pad)])).unwrap();
            if i % 4 == 0 {
                thread::sleep(Duration::from_millis(2));
            }
        }
    });
    let seen = follow(&mut start.tunnel, &own, N);
    writer.join().unwrap();
    assert_eq!(payloads(&seen), (0..N).map(|i| i.to_string()).collect::<Vec<_>>());
    let segments = fs::read_dir(root.join("who/rolls/kn_journal")).unwrap().filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with(".seg-")).count();
    assert!(segments > 10, "the journal should have rolled many times: {segments} segments");
}

/// A caught-up tunnel takes what its own process appended from memory, as
/// written (`Hub::appended` hands it over), instead of reading it back:
/// what it delivers must be exactly what a reader of the file returns,
/// element for element and checkpoint for checkpoint, whoever wrote (this
/// store, or another one, as good as another process, whose appends come
/// through the notifier), whatever the record (small, too large to hand
/// over, a payload stored as a blob), across segment rolls.
#[test]
fn a_tunnel_delivers_its_own_process_appends_exactly_as_the_file_holds_them() {
    let dir = scratch("kn-journal-test-");
    let root = dir.path().join("kn_events");
    let mut c = config(&root);
    c.poll_interval = Duration::from_secs(60);
    c.segment_bytes = 16 << 10;
    c.blob_bytes = 32 << 10;
    let own = Arc::new(Store::open_with(c.clone()).unwrap());
    let other = Arc::new(Store::open_with(c).unwrap());
    let j = live_journal(&own, "/who/handed/kn_journal");
    let mut start = own.tunnel(&j, &Selection::none()).unwrap();
    assert!(start.tunnel.is_notified(), "no change notification here: this test needs inotify");
    const N: usize = 150;
    let payload = |i: usize| match i % 10 {
        4 => "L".repeat(20_000),  // a frame above what is handed over
        7 => "B".repeat(40_000),  // a blob: never handed over
        _ => format!("{i}: caf\u{e9} \u{0}\n\"quoted\""),
    };
    let (writer_own, writer_other, topic) = (own.clone(), other.clone(), j.clone());
    let writer = thread::spawn(move || {
        for i in 0..N {
            let store = if i % 6 == 5 { &writer_other } else { &writer_own };
            let mut e = ev(&[("n", &i.to_string()), ("kn_expires", "+3600")]);
            e.set("kn_payload", payload(i));
            store.notify(&topic, e).unwrap();
            if i % 8 == 0 {
                thread::sleep(Duration::from_millis(2));
            }
        }
    });
    let seen = follow(&mut start.tunnel, &own, N);
    writer.join().unwrap();
    let file = all(&own, &j);
    assert_eq!(file.len(), N);
    assert_eq!(seen, file, "the tunnel delivers what the file holds");
    let segments = segment_count(&own, &j);
    assert!(segments > 5, "the journal should have rolled: {segments} segments");
}

#[test]
fn tunnel_wait_falls_back_to_polling_when_no_change_notification_comes() {
    let dir = scratch("kn-journal-test-");
    let mut c = config(&dir.path().join("kn_events"));
    c.poll_interval = Duration::from_millis(200);
    let store = Store::open_with(c).unwrap();
    let j = journal_with(&store, "/who/poll/kn_journal", 1);
    let mut start = store.tunnel(&j, &Selection::none()).unwrap();
    // Append a valid record through a hard link whose name is not a
    // segment's: the change notifier reports the write under that name,
    // which it ignores, so only polling can find the record.
    let link = topic_dir(&store, &j).join(".not-a-segment");
    fs::hard_link(active_segment(&store, &j), &link).unwrap();
    let seq = start.tunnel.checkpoint() + 1;
    let event = ev(&[("kn_id", "polled"), ("kn_payload", "found by polling"), ("kn_time_t", "1")]);
    let frame = encode_record(&Record { seq, stored_secs: now() as u64, event, blob: None });
    let appender = thread::spawn(move || {
        thread::sleep(Duration::from_millis(300));
        OpenOptions::new().append(true).open(&link).unwrap().write_all(&frame).unwrap();
        Instant::now()
    });
    let begun = Instant::now();
    let seen = start.tunnel.wait(&store, Duration::from_secs(5)).unwrap();
    let waited = begun.elapsed();
    let appended = appender.join().unwrap();
    println!("found by polling {:?} after the append (waited {waited:?})", Instant::now().saturating_duration_since(appended));
    assert_eq!(payloads(&seen), ["found by polling"]);
    // Returning at the 5 s timeout would mean only the final re-read found it.
    assert!(waited < Duration::from_secs(4), "the waiting tunnel never polled: {waited:?}");
    assert_eq!(checkpoint(&seen[0]), seq);
    // The next writer adopts the record and continues after it.
    let r = store.notify(&j, ev(&[("kn_payload", "after")])).unwrap();
    assert_eq!(r.writes[0].checkpoint, seq + 1);
    assert_eq!(payloads(&all(&store, &j)), ["e0", "found by polling", "after"]);
}

#[test]
fn tunnel_on_a_store_with_a_relative_root_is_woken_by_change_notification() {
    let dir = scratch("kn-journal-test-");
    let out = child("relative_root", &[("KN_SEM_ROOT", dir.path().to_str().unwrap())]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("KN_SEM_CHILD_OK"), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
}

/// CPU time (user + system) of the calling thread.
fn thread_cpu() -> Duration {
    let stat = fs::read_to_string("/proc/thread-self/stat").unwrap();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap().split_whitespace().collect();
    // Fields 14 and 15 of stat(5), counted after the command name.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

#[test]
fn an_idle_waiting_tunnel_sleeps_instead_of_spinning() {
    let dir = scratch("kn-journal-test-");
    let mut c = config(&dir.path().join("kn_events"));
    c.poll_interval = Duration::from_secs(30);
    let store = Store::open_with(c).unwrap();
    let j = journal_with(&store, "/who/idle/kn_journal", 3);
    let mut start = store.tunnel(&j, &Selection::none()).unwrap();
    assert!(start.tunnel.is_notified());
    let cpu = thread_cpu();
    let begun = Instant::now();
    let got = start.tunnel.wait(&store, Duration::from_millis(1500)).unwrap();
    let (wall, used) = (begun.elapsed(), thread_cpu() - cpu);
    println!("idle wait: {used:?} CPU in {wall:?}");
    assert!(got.is_empty());
    // Reading the log must not count as an append: otherwise every read
    // wakes the reader, which reads again, forever.
    assert!(used < wall / 4, "an idle tunnel burnt {used:?} of CPU in {wall:?}");
}

/// written after each record keeps two records' events apart). Each round
/// makes the notifier pause after an own write (it does, to read a
/// fan-out's events in bulk), appends here, lets the reader (on its own
/// thread, as a tunnel of `serve`) take it, and appends in another store;
/// the reader must be woken for that one: it waits longer than the round.
// ----- configuration ----------------------------------------------------------

#[test]
fn config_from_env_reads_the_kn_variables() {
    let out = child(
        "from_env",
        &[
            ("KN_EVENTS", "/tmp/kn-sem-env-root"),
            ("KN_RESERVE_BYTES", "12345"),
            ("KN_SYNC", "always"),
            ("KN_MAX_EVENT_BYTES", "777"),
            ("KN_SEGMENT_BYTES", "65536"),
            ("KN_JOURNAL_MAX_AGE", "60"),
            ("KN_JOURNAL_MAX_BYTES", "1048576"),
            ("KN_EXPIRED_GRACE", "9"),
            ("KN_POLL_MS", "40"),
            ("KN_SERVER_URL", "http://env.example/cgi-bin/pubsub.cgi"),
            ("KN_OUTBOUND", "allow"),
            ("KN_REMOTE_TIMEOUT_MS", "1500"),
            ("KN_MAX_FORWARDS", "42"),
            ("KN_FORWARD_INLINE", "7"),
            ("KN_GROUP_COMMIT", "5"),
            ("KN_MAX_TOPIC_DEPTH", "7"),
            ("KN_MAX_TOPIC_BYTES", "300"),
            ("KN_MAX_SELECTED", "99"),
            ("KN_MAX_FORM_ELEMENTS", "55"),
        ],
    )
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("KN_SEM_CHILD_OK"), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let bad = child("from_env_bad", &[("KN_MAX_EVENT_BYTES", "lots")]).output().unwrap();
    let stdout = String::from_utf8_lossy(&bad.stdout);
    assert!(bad.status.success() && stdout.contains("KN_SEM_CHILD_OK"), "{stdout}\n{}", String::from_utf8_lossy(&bad.stderr));
}

/// Another process's append landing right after one of this process's
/// own, while the notifier has not read the own one's change event, is
/// not taken for it (FORMAT.md, "Appends of the reader's own process":
/// the kernel merges only adjacent identical events, and the `.head`
#[test]
fn another_process_append_right_after_an_own_one_is_never_swallowed() {
    use event_listener::Listener as _;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let dir = scratch("kn-journal-test-");
    let mut c = config(&dir.path().join("kn_events"));
    c.poll_interval = Duration::from_secs(60);
    let own = Arc::new(Store::open_with(c.clone()).unwrap());
    let other = Store::open_with(c).unwrap();
    let j = live_journal(&own, "/who/merged/kn_journal");
    let mut start = own.tunnel(&j, &Selection::none()).unwrap();
    assert!(start.tunnel.is_notified(), "no change notification here: this test needs inotify");
    const ROUNDS: usize = 300;
    let seen = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (own, seen, done) = (own.clone(), seen.clone(), done.clone());
        thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                let listener = start.tunnel.listen();
                let got = start.tunnel.next(&own).unwrap();
                let read_something = !got.is_empty();
                seen.fetch_add(got.len(), Ordering::SeqCst);
                if read_something && !start.tunnel.caught_up() {
                    continue;
                }
                listener.wait_timeout(Duration::from_secs(10));
            }
        })
    };
    let event = |who: &str| ev(&[("kn_payload", who), ("kn_expires", "+3600")]);
    for round in 0..ROUNDS {
        own.notify(&j, event("own, read by the notifier")).unwrap();
        thread::sleep(Duration::from_micros(300));
        own.notify(&j, event("own")).unwrap();
        thread::sleep(Duration::from_micros(150));
        other.notify(&j, event("other")).unwrap();
        let want = (round + 1) * 3;
        let deadline = Instant::now() + Duration::from_secs(5);
        while seen.load(Ordering::SeqCst) < want {
            if Instant::now() > deadline {
                done.store(true, Ordering::SeqCst);
                panic!("round {round}: {} of {want} events read after 5 s: another process's append was taken for this one's", seen.load(Ordering::SeqCst));
            }
            thread::sleep(Duration::from_millis(1));
        }
    }
    done.store(true, Ordering::SeqCst);
    own.notify(&j, event("the last, to end the reader")).unwrap();
    reader.join().unwrap();
    assert!(seen.load(Ordering::SeqCst) >= ROUNDS * 3);
}

