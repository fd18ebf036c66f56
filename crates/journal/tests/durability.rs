//! Durability of the store against what really happens to a server: many
//! processes posting at once, writers SIGKILLed at random moments, a file
//! system that fills up, and segments cut off at any byte.
//!
//! Child processes are this test binary run again with `KN_DUR_ROLE` set
//! (see [`child_process_entry`]), so the tests need no other program.
//! Figures (kills, acknowledged events) go to stderr for the record:
//! `cargo test -p kn-journal --test durability -- --nocapture`.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kn_journal::{Config, ErrorKind, Event, Selection, Store, Topic};
use kn_journal::internal::{decode_record, Decoded};

// ----- harness -------------------------------------------------------------

/// A small deterministic generator (splitmix64): no dependency, and the
/// seed is printed so a failure can be replayed with `KN_DUR_SEED`.
struct Rng(u64);

impl Rng {
    fn from_env(test: &str) -> Rng {
        let seed = std::env::var("KN_DUR_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1));
        eprintln!("{test}: seed {seed} (replay with KN_DUR_SEED={seed})");
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..=max`.
    fn upto(&mut self, max: u64) -> u64 {
        self.next() % (max + 1)
    }
}

fn topic(name: &str) -> Topic {
    Topic::parse(name).expect("valid topic name")
}

fn event(id: &str, payload: impl Into<Vec<u8>>) -> Event {
    let mut e = Event::new();
    e.set("kn_id", id).set("kn_payload", payload);
    e
}

/// The directory of topic `t` in the store at `root`.
fn topic_dir(root: &Path, t: &Topic) -> PathBuf {
    t.segments().fold(root.to_path_buf(), |dir, s| dir.join(s))
}

/// Creates a journal and gives it a fresh heartbeat, so posts are accepted.
/// The tunnel is dropped at once, while the notifier may still be busy
/// (this once deadlocked; fixed in c59f8e8).
fn open_journal(store: &Store, journal: &Topic) {
    store.tunnel(journal, &Selection::none()).expect("open a tunnel on the journal");
    store.heartbeat(journal).expect("heartbeat");
}

fn all_events(store: &Store, t: &Topic) -> Vec<Event> {
    store.events(t, &Selection::all()).unwrap_or_else(|e| panic!("reading {t}: {e}")).events
}

fn id_of(e: &Event) -> String {
    String::from_utf8_lossy(e.id().unwrap_or(b"")).into_owned()
}

fn checkpoint(e: &Event) -> u64 {
    e.checkpoint().and_then(|c| std::str::from_utf8(c).ok()).and_then(|c| c.parse().ok()).expect("a numeric checkpoint")
}

fn assert_verify_clean(store: &Store, when: &str) {
    let report = store.verify().expect("verify runs");
    assert!(report.problems.is_empty(), "verify {when}: {:?}", report.problems);
}

/// The segment files of a topic directory, oldest first.
fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = fs::read_dir(dir)
        .expect("list topic directory")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(".seg-")))
        .collect();
    out.sort();
    out
}

/// Runs this test binary again as a child in `role` (see
/// [`child_process_entry`]), its stdout piped.
fn spawn_child(role: &str, vars: &[(&str, String)]) -> Child {
    let exe = std::env::current_exe().expect("path of the test binary");
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", "child_process_entry", "--nocapture", "--test-threads=1", "--quiet"])
        .env("KN_DUR_ROLE", role)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn child process")
}

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("child needs {name}"))
}

/// Not a test: the body of the child processes. Without `KN_DUR_ROLE` it
/// does nothing.
///
/// * `post`: posts `KN_DUR_COUNT` events `<KN_DUR_PREFIX>-<i>` to
///   `KN_DUR_TOPIC`, payload = id, then exits.
/// * `loop`: prints `READY`, then posts forever (30 s at most) and prints
///   `ACK <id> <n>` once each post has returned Ok; `n` counts up from
///   `KN_DUR_BASE` and is the payload. With `KN_DUR_CYCLE=m` ids repeat
///   modulo m, so superseded records pile up and compaction runs while we
///   may be killed.
#[test]
fn child_process_entry() {
    let Ok(role) = std::env::var("KN_DUR_ROLE") else { return };
    let store = Store::open(var("KN_DUR_ROOT")).expect("child opens the store");
    let t = topic(&var("KN_DUR_TOPIC"));
    let prefix = var("KN_DUR_PREFIX");
    match role.as_str() {
        "post" => {
            let count: usize = var("KN_DUR_COUNT").parse().expect("count");
            for i in 0..count {
                let id = format!("{prefix}-{i}");
                let report = store.notify(&t, event(&id, id.clone())).unwrap_or_else(|e| panic!("post {id}: {e}"));
                assert!(!report.duplicate, "{id} taken for a duplicate");
            }
        }
        "loop" => {
            let cycle: Option<u64> = std::env::var("KN_DUR_CYCLE").ok().and_then(|c| c.parse().ok());
            let mut out = std::io::stdout().lock();
            writeln!(out, "READY").and_then(|_| out.flush()).expect("stdout");
            let start = Instant::now();
            let mut n: u64 = std::env::var("KN_DUR_BASE").ok().and_then(|b| b.parse().ok()).unwrap_or(0);
            while start.elapsed() < Duration::from_secs(30) {
                let id = match cycle {
                    Some(m) => format!("{prefix}-{}", n % m),
                    None => format!("{prefix}-{n}"),
                };
                store.notify(&t, event(&id, n.to_string())).unwrap_or_else(|e| panic!("post {id}: {e}"));
                writeln!(out, "ACK {id} {n}").and_then(|_| out.flush()).expect("stdout");
                n += 1;
            }
        }
        other => panic!("unknown KN_DUR_ROLE {other}"),
    }
}

// ----- 1. concurrency ------------------------------------------------------

fn concurrent_posts(t: &Topic, journal: bool) {
    const PROCESSES: usize = 8;
    const EACH: usize = 2_000;
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open store");
    if journal {
        open_journal(&store, t);
    }
    let children: Vec<Child> = (0..PROCESSES)
        .map(|p| {
            spawn_child(
                "post",
                &[
                    ("KN_DUR_ROOT", dir.path().display().to_string()),
                    ("KN_DUR_TOPIC", t.as_str().to_string()),
                    ("KN_DUR_PREFIX", format!("p{p}")),
                    ("KN_DUR_COUNT", EACH.to_string()),
                ],
            )
        })
        .collect();
    for (p, mut child) in children.into_iter().enumerate() {
        let status = child.wait().expect("wait for child");
        assert!(status.success(), "poster {p} failed: {status}");
    }

    let got = all_events(&store, t);
    assert_eq!(got.len(), PROCESSES * EACH, "events on {t}");
    let mut ids = HashSet::new();
    let mut checkpoints = HashSet::new();
    for e in &got {
        let id = id_of(e);
        assert_eq!(e.payload(), id.as_bytes(), "event {id} arrived intact");
        assert!(ids.insert(id.clone()), "{id} stored twice");
        assert!(checkpoints.insert(checkpoint(e)), "checkpoint of {id} given twice");
    }
    for p in 0..PROCESSES {
        for i in 0..EACH {
            assert!(ids.contains(&format!("p{p}-{i}")), "p{p}-{i} missing");
        }
    }
    // Each process posted its events in order, and the log keeps that order.
    let mut last: HashMap<String, usize> = HashMap::new();
    for e in &got {
        let id = id_of(e);
        let (p, i) = id.split_once('-').expect("id shape");
        let i: usize = i.parse().expect("counter");
        if let Some(&prev) = last.get(p) {
            assert!(i > prev, "{id} stored before {p}-{prev}");
        }
        last.insert(p.to_string(), i);
    }
    assert_verify_clean(&store, &format!("after concurrent posts to {t}"));
    eprintln!("concurrency: {PROCESSES} processes x {EACH} posts to {t}: {} intact events", got.len());
}

#[test]
fn eight_processes_posting_to_one_topic_lose_nothing() {
    concurrent_posts(&topic("/load/topic"), false);
}

#[test]
fn eight_processes_posting_to_one_journal_lose_nothing() {
    concurrent_posts(&topic("/load/kn_journal"), true);
}

// ----- 2. crashes ----------------------------------------------------------

/// One killed child: the ids it acknowledged, with their counters.
struct Killed {
    acked: Vec<(String, u64)>,
}

/// Starts a looping poster, waits until it is ready, lets it post for
/// `delay`, SIGKILLs it and collects what it acknowledged.
fn post_until_killed(root: &Path, t: &Topic, prefix: &str, base: u64, cycle: Option<u64>, delay: Duration) -> Killed {
    let mut vars = vec![
        ("KN_DUR_BASE", base.to_string()),
        ("KN_DUR_ROOT", root.display().to_string()),
        ("KN_DUR_TOPIC", t.as_str().to_string()),
        ("KN_DUR_PREFIX", prefix.to_string()),
    ];
    if let Some(m) = cycle {
        vars.push(("KN_DUR_CYCLE", m.to_string()));
    }
    let mut child = spawn_child("loop", &vars);
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    let reader = thread::spawn(move || {
        let mut acked = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if line == "READY" {
                let _ = tx.send(());
            } else if let Some(rest) = line.strip_prefix("ACK ") {
                let (id, n) = rest.split_once(' ').expect("ACK <id> <n>");
                acked.push((id.to_string(), n.parse::<u64>().expect("counter")));
            }
        }
        acked
    });
    if rx.recv_timeout(Duration::from_secs(60)).is_err() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("child {prefix} never became ready");
    }
    thread::sleep(delay);
    child.kill().expect("SIGKILL the child");
    let status = child.wait().expect("reap the child");
    assert!(status.code().is_none(), "child {prefix} ended on its own ({status}) instead of being killed");
    let acked = reader.join().expect("reader thread");
    Killed { acked }
}

#[test]
fn sigkilled_writers_lose_no_acknowledged_event() {
    const KILLS: usize = 120;
    const CYCLE: u64 = 300;
    let started = Instant::now();
    let mut rng = Rng::from_env("crash");
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("kn_events");
    let store = Store::open(&root).expect("open store");
    let plain = topic("/crash/plain");
    let cycled = topic("/crash/cycled");
    let journal = topic("/crash/kn_journal");
    open_journal(&store, &journal);

    // Everything ever acknowledged on the topics with distinct ids.
    let mut acked_ever: HashMap<Topic, Vec<String>> = HashMap::new();
    // On the cycled topic: the newest acknowledged counter of each id.
    let mut newest: HashMap<String, u64> = HashMap::new();
    let (mut acked_total, mut torn_tails, mut lost_races) = (0usize, 0usize, 0usize);
    for kill in 0..KILLS {
        let (t, cycle) = match kill % 3 {
            0 => (&plain, None),
            1 => (&journal, None),
            _ => (&cycled, Some(CYCLE)),
        };
        // The cycled topic reuses its ids across children so that compaction
        // keeps finding superseded records.
        let prefix = if cycle.is_some() { "c".to_string() } else { format!("k{kill}") };
        let delay = Duration::from_micros(rng.upto(20_000));
        // A loaded machine can stretch the run past heartbeat_stale (100 s):
        // keep the journal fresh, as its reading tunnel would.
        store.heartbeat(&journal).expect("heartbeat");
        // Counters grow across children: a newer post always has a larger one.
        let killed = post_until_killed(&root, t, &prefix, kill as u64 * 1_000_000_000, cycle, delay);
        acked_total += killed.acked.len();
        if killed.acked.is_empty() {
            lost_races += 1;
        }

        // Readers see a consistent store at once, before any repair.
        let report = store.verify().expect("verify after a kill");
        assert!(report.problems.len() <= 1, "kill {kill}: more than a torn tail: {:?}", report.problems);
        for p in &report.problems {
            assert!(p.reason.contains("torn tail"), "kill {kill}: not a torn tail: {p:?}");
            torn_tails += 1;
        }
        let got = all_events(&store, t);
        let present: HashMap<String, u64> =
            got.iter().map(|e| (id_of(e), String::from_utf8_lossy(e.payload()).parse::<u64>().unwrap_or(0))).collect();
        for (id, n) in &killed.acked {
            let stored = present.get(id).unwrap_or_else(|| panic!("kill {kill}: acknowledged {id} missing from {t}"));
            if cycle.is_some() {
                let e = newest.entry(id.clone()).or_insert(0);
                *e = (*e).max(*n);
            } else {
                assert_eq!(stored, n, "kill {kill}: {id} changed");
                acked_ever.entry(t.clone()).or_default().push(id.clone());
            }
        }
        if cycle.is_some() {
            // A later post may have overwritten an id, never an older one.
            for (id, n) in &newest {
                let stored = present.get(id).unwrap_or_else(|| panic!("kill {kill}: {id} missing from {t}"));
                assert!(stored >= n, "kill {kill}: {id} went back from {n} to {stored}");
            }
        }

        // The next post repairs a torn tail; then everything is clean.
        store.notify(t, event(&format!("after-{kill}"), "0")).expect("post after a kill");
        assert_verify_clean(&store, &format!("after kill {kill} and one post"));
    }

    // Nothing acknowledged earlier went missing later (compaction, rolls).
    for (t, ids) in &acked_ever {
        let present: HashSet<String> = all_events(&store, t).iter().map(id_of).collect();
        for id in ids {
            assert!(present.contains(id), "acknowledged {id} missing from {t} at the end");
        }
    }
    eprintln!(
        "crash: {KILLS} SIGKILLs (delay 0-20 ms after ready; {lost_races} before the first ack), \
         {acked_total} acknowledged events all present, {torn_tails} torn tails seen and repaired, {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

// ----- 3. full disk ----------------------------------------------------------

/// A small tmpfs on a temporary directory, unmounted on drop (before the
/// directory is removed: fields drop in order).
struct Tmpfs {
    fs: kn_test_support::Tmpfs,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (e.g. `8m`). `None` (a recorded skip) when
    /// this machine cannot mount; under `CI=true` that fails the test
    /// instead.
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().expect("tempdir");
        let fs = kn_test_support::Tmpfs::mount(dir.path(), &format!("size={size}"))?;
        Some(Tmpfs { fs, _dir: dir })
    }

    fn path(&self) -> &Path {
        self.fs.path()
    }

    fn available(&self) -> u64 {
        fs4::available_space(self.path()).expect("free space of the tmpfs")
    }
}

#[test]
fn posts_fail_with_disk_full_before_the_file_system_is_full() {
    const RESERVE: u64 = 2 << 20;
    let Some(fs) = Tmpfs::mount("8m") else { return };
    let filler = fs.path().join("filler");
    fs::write(&filler, vec![0x5a; 3 << 20]).expect("write filler");
    let mut config = Config::new(fs.path().join("kn_events"));
    config.reserve_bytes = RESERVE;
    let store = Store::open_with(config).expect("open store");
    let plain = topic("/full/plain");
    let journal = topic("/full/kn_journal");
    open_journal(&store, &journal);

    let payload = vec![b'x'; 1000];
    let mut acked: Vec<(Topic, String)> = Vec::new();
    let err = loop {
        let t = if acked.len().is_multiple_of(2) { &plain } else { &journal };
        let id = format!("f{}", acked.len());
        match store.notify(t, event(&id, payload.clone())) {
            Ok(_) => acked.push((t.clone(), id)),
            Err(e) => break e,
        }
        assert!(acked.len() < 100_000, "never hit the reserve");
    };
    let free = fs.available();
    assert_eq!(err.kind(), ErrorKind::DiskFull, "first failure: {err}");
    assert!(free > RESERVE / 2, "refused only when the file system was nearly full: {free} bytes free");
    for t in [&plain, &journal] {
        let again = store.notify(t, event("refused", payload.clone())).expect_err("still below the reserve");
        assert_eq!(again.kind(), ErrorKind::DiskFull, "{again}");
    }

    assert_verify_clean(&store, "at the reserve");
    let mut present: HashSet<(Topic, String)> = HashSet::new();
    for t in [&plain, &journal] {
        for e in all_events(&store, t) {
            assert_eq!(e.payload(), &payload[..], "{} intact", id_of(&e));
            present.insert((t.clone(), id_of(&e)));
        }
    }
    for a in &acked {
        assert!(present.contains(a), "acknowledged {} on {} missing", a.1, a.0);
    }
    assert_eq!(present.len(), acked.len(), "only acknowledged events stored");

    fs::remove_file(&filler).expect("delete filler");
    for t in [&plain, &journal] {
        store.notify(t, event("after-cleanup", "ok")).unwrap_or_else(|e| panic!("posting to {t} once space is back: {e}"));
    }
    assert_verify_clean(&store, "after space came back");
    eprintln!(
        "disk full (reserve {RESERVE}): {} events acknowledged, then DiskFull with {free} bytes still free: \"{err}\"",
        acked.len()
    );
}

/// Total size of the segment files of a topic directory.
fn segment_bytes(dir: &Path) -> u64 {
    segments(dir).iter().map(|p| fs::metadata(p).map(|m| m.len()).unwrap_or(0)).sum()
}

/// Writes 4 KiB pages to `file` until the file system has less than
/// `target` bytes free (or is full).
fn fill_until(file: &mut fs::File, fs: &Tmpfs, target: u64) {
    let page = [0xa5u8; 4096];
    while fs.available() >= target {
        if file.write_all(&page).is_err() {
            return;
        }
    }
}

/// Waits (spinning) until someone else starts taking space, then takes
/// pages as fast as possible until the file system is full.
fn steal_space(file: &mut fs::File, fs: &Tmpfs, stop: &AtomicBool) {
    let start = fs.available();
    while fs.available() >= start {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        std::hint::spin_loop();
    }
    let page = [0x5au8; 4096];
    while file.write_all(&page).is_ok() {}
}

#[test]
fn a_write_hitting_enospc_leaves_no_partial_record() {
    // With reserve 0 the store still refuses a post that cannot fit (the
    // free-space check counts the record), so a real ENOSPC in the middle
    // of a write needs someone else to take the space meanwhile: leave
    // just room for one more big record, and let a thread steal pages as
    // soon as the store starts writing it. Whether the thread wins is a
    // race; rounds repeat until a few ENOSPCs happened inside the write.
    // A big record keeps the store inside its write long enough for the
    // thread to notice, even on a loaded machine.
    const ROUNDS: usize = 100;
    const BIG: usize = 1_500_000;
    let big = |i: usize| vec![b'a' + (i % 26) as u8; BIG];
    let (mut mid_write, mut store_won, mut rounds) = (0, 0, 0);
    let mut example = String::new();
    for round in 0..ROUNDS {
        let Some(fs) = Tmpfs::mount("8m") else { return };
        rounds += 1;
        let mut config = Config::new(fs.path().join("kn_events"));
        config.reserve_bytes = 0;
        let store = Store::open_with(config).expect("open store");
        let t = if round % 2 == 0 { topic("/enospc/plain") } else { topic("/enospc/kn_journal") };
        if t.is_journal() {
            open_journal(&store, &t);
        }
        let dir = topic_dir(store.root(), &t);
        store.notify(&t, event("big0", big(0))).expect("first big post");
        let frame = segment_bytes(&dir);
        let mut filler = fs::File::create(fs.path().join("filler")).expect("create filler");
        // Room for the next record and one or two pages more.
        fill_until(&mut filler, &fs, frame + 8192);
        assert!(fs.available() >= frame + 4096, "filled too far: {} free", fs.available());

        let stop = AtomicBool::new(false);
        let raced = thread::scope(|scope| {
            scope.spawn(|| steal_space(&mut filler, &fs, &stop));
            let r = store.notify(&t, event("big1", big(1)));
            stop.store(true, Ordering::Relaxed);
            r
        });
        let mut acked = vec![("big0".to_string(), 0)];
        match raced {
            Ok(_) => {
                store_won += 1;
                acked.push(("big1".to_string(), 1));
            }
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::DiskFull, "round {round} on {t}: {e}");
                if !e.message().starts_with("disk full:") {
                    mid_write += 1;
                    example = e.to_string();
                }
            }
        }
        // The file system is full now: the next big post is refused.
        let refused = store.notify(&t, event("big2", big(2))).expect_err("no room left");
        assert_eq!(refused.kind(), ErrorKind::DiskFull, "{refused}");

        assert_verify_clean(&store, &format!("round {round}: after ENOSPC on {t}"));
        let got = all_events(&store, &t);
        assert_eq!(got.len(), acked.len(), "round {round}: only acknowledged events on {t}");
        for (id, n) in &acked {
            let e = got.iter().find(|e| id_of(e) == *id).unwrap_or_else(|| panic!("acknowledged {id} on {t} missing"));
            assert!(e.payload() == big(*n), "{id} intact");
        }
        // Once space is back, posting works again.
        drop(filler);
        fs::remove_file(fs.path().join("filler")).expect("delete filler");
        store.notify(&t, event("big3", big(3))).unwrap_or_else(|e| panic!("round {round}: post once space is back: {e}"));
        assert_verify_clean(&store, &format!("round {round}: after space came back"));
        if mid_write >= 3 {
            break;
        }
    }
    eprintln!(
        "disk full (ENOSPC): {rounds} rounds, {mid_write} ENOSPC inside the write (nothing torn, earlier events intact), \
         {store_won} won by the store; e.g. \"{example}\""
    );
    assert!(mid_write > 0, "no round hit ENOSPC inside a write: the test proved nothing");
}

// ----- 4. torn tails -------------------------------------------------------

fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).expect("create copy");
    for entry in fs::read_dir(from).expect("list") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), &target).expect("copy file");
        }
    }
}

/// The byte offset just past each record of a segment.
fn record_ends(segment: &Path) -> Vec<u64> {
    let bytes = fs::read(segment).expect("read segment");
    let mut ends = Vec::new();
    let mut pos = 0;
    while let Decoded::Record(_, len) = decode_record(&bytes[pos..]) {
        pos += len;
        ends.push(pos as u64);
    }
    assert_eq!(pos, bytes.len(), "template segment is whole");
    ends
}

#[test]
fn any_truncated_tail_reads_as_a_prefix_and_is_repaired_by_the_next_post() {
    const CUTS: usize = 400;
    let mut rng = Rng::from_env("torn tail");
    let template = tempfile::tempdir().expect("tempdir");
    let mut config = Config::new(template.path());
    config.segment_bytes = 4096;
    let store = Store::open_with(config.clone()).expect("open template");
    let plain = topic("/torn/plain");
    let journal = topic("/torn/kn_journal");
    open_journal(&store, &journal);
    for i in 0..70 {
        // Payloads of varied sizes, binary included.
        let payload: Vec<u8> = (0..rng.upto(300)).map(|k| (k as u8).wrapping_mul(31).wrapping_add(i as u8)).collect();
        for t in [&plain, &journal] {
            store.notify(t, event(&format!("e{i}"), payload.clone())).expect("template post");
        }
    }
    drop(store);

    let full_of: HashMap<Topic, Vec<String>> = {
        let s = Store::open_with(config.clone()).expect("open template");
        [&plain, &journal].into_iter().map(|t| (t.clone(), all_events(&s, t).iter().map(id_of).collect())).collect()
    };

    let mut shortest = usize::MAX;
    for cut_no in 0..CUTS {
        let t = if cut_no % 2 == 0 { &plain } else { &journal };
        let full = &full_of[t];
        let work = tempfile::tempdir().expect("tempdir");
        copy_tree(template.path(), work.path());
        let mut c = config.clone();
        c.root = work.path().to_path_buf();
        let dir = topic_dir(work.path(), t);
        let segs = segments(&dir);
        let active = segs.last().expect("an active segment");
        let ends = record_ends(active);
        let len = *ends.last().unwrap_or(&0);
        let cut = rng.upto(len);
        fs::OpenOptions::new().write(true).open(active).and_then(|f| f.set_len(cut)).expect("truncate");
        let whole_in_active = ends.iter().filter(|&&e| e <= cut).count();
        let expect = full.len() - ends.len() + whole_in_active;

        let s = Store::open_with(c).expect("open cut store");
        let got: Vec<String> = all_events(&s, t).iter().map(id_of).collect();
        assert_eq!(got, full[..expect], "cut {cut} of {len} in {} gives the prefix", active.display());
        shortest = shortest.min(got.len());

        let report = s.notify(t, event("next", "after the cut")).unwrap_or_else(|e| panic!("post after cut {cut}: {e}"));
        assert!(!report.duplicate);
        assert_verify_clean(&s, &format!("after cut {cut} of {len} and one post"));
        let after: Vec<String> = all_events(&s, t).iter().map(id_of).collect();
        assert_eq!(after[..expect], full[..expect], "cut {cut}: the prefix survives the repair");
        assert_eq!(after[expect..], ["next".to_string()], "cut {cut}: the new event follows the prefix");
    }
    eprintln!("torn tail: {CUTS} random cuts of the active segment, each read as a prefix (shortest {shortest}) and repaired by one post");
}
