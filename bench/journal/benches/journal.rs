//! Benchmarks of the journal (see BENCHMARKS.md for figures and goals).
//!
//! * `post/topic/{0,10k,1M}` and `post/journal/{0,10k,1M}`: one post
//!   (`sync=none`, new `kn_id` each time, duplicate check included) on a
//!   topic already holding that many events.
//! * `read/since/{,tunnel_}{1,100}_behind_in_4000`: a resume (`do_since_checkpoint`)
//!   1 or 100 events before the end of a topic whose newest segment holds
//!   4,000 events.
//! * `fanout/1000_journal_routes`: one post forwarded along 1,000 routes to
//!   local journals.
//! * `access/notify/{no_rules,100_rules}`: one notify through
//!   `Store::as_user` without a rules file, and with a 100-rule file whose
//!   granting rule is the last one (every rule is looked at).
//!   `access/fanout10/...`: the same with 10 routes created by the user,
//!   each delivery checking its creator's rights again.
//! * `access_ratio` (printed): the same two measured as the ratio of
//!   alternating rounds in one run, which a busy machine skews less.
//! * `bigfan` (printed, not criterion: each round writes the payload to
//!   1,000 journals): one post of a 1 MiB payload forwarded along 1,000
//!   routes to local journals (after a small warm-up post), its time and
//!   the disk it took (`du`-style: `st_blocks * 512` summed over the
//!   store, before and after).
//! * wake-up latency (printed, not criterion): a post in this process to a
//!   reader blocked in `Tunnel::wait` in another process, p50/p99.
//! * bytes on disk per 100-byte event (printed), journal and topic.
//!
//! `cargo bench -p kn-journal-bench` runs everything; a filter argument selects
//! criterion benches by name and the printed measurements by `wake` or
//! `bytes`. The waiting reader is this binary run again with
//! `KN_BENCH_ROLE=waiter`.

use std::io::{BufRead, BufReader, Write as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use criterion::{BenchmarkId, Criterion};
use kn_journal::access::Principal;
use kn_journal::{Config, Event, Selection, Store, Topic};

fn topic(name: &str) -> Topic {
    Topic::parse(name).expect("valid topic name")
}

/// A benchmark event: `kn_id`, a 100-byte payload (`kn_time_t` is added by
/// the store).
fn event(id: &str) -> Event {
    let mut e = Event::new();
    e.set("kn_id", id).set("kn_payload", [b'x'; 100].to_vec());
    e
}

fn config(root: &Path) -> Config {
    let mut c = Config::new(root);
    // The 1M-event journals must keep everything they are given.
    c.journal_max_bytes = u64::MAX;
    c
}

/// Creates `journal` with a fresh heartbeat. (Not through a tunnel: only
/// the log is measured here.)
fn open_journal(store: &Store, journal: &Topic) {
    let dir = journal.segments().fold(store.root().to_path_buf(), |d, s| d.join(s));
    std::fs::create_dir_all(&dir).expect("create journal directory");
    store.heartbeat(journal).expect("heartbeat");
}

/// Fills `t` with `n` events of distinct 8-digit ids.
fn fill(store: &Store, t: &Topic, n: usize) {
    let started = Instant::now();
    for i in 0..n {
        if t.is_journal() && i % 50_000 == 0 {
            store.heartbeat(t).expect("heartbeat");
        }
        store.notify(t, event(&format!("{i:08}"))).expect("fill post");
    }
    if n >= 100_000 {
        eprintln!("built {t} with {n} events in {:.1} s", started.elapsed().as_secs_f64());
    }
}

fn post_latency(c: &mut Criterion, full: bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open_with(config(dir.path())).expect("open store");
    let sizes: &[(usize, &str)] = if full { &[(0, "0"), (10_000, "10k"), (1_000_000, "1M")] } else { &[(0, "0"), (100, "100")] };
    for kind in ["topic", "journal"] {
        let mut group = c.benchmark_group(format!("post/{kind}"));
        for &(n, label) in sizes {
            let t = if kind == "journal" { topic(&format!("/bench/j{label}/kn_journal")) } else { topic(&format!("/bench/t{label}")) };
            if t.is_journal() {
                open_journal(&store, &t);
            }
            fill(&store, &t, n);
            if t.is_journal() {
                store.heartbeat(&t).expect("heartbeat");
            }
            let mut next = 0u64;
            group.bench_function(BenchmarkId::from_parameter(label), |b| {
                b.iter(|| {
                    next += 1;
                    store.notify(&t, event(&format!("m{next:08}"))).expect("post")
                })
            });
        }
        group.finish();
    }
}

/// A resume from a checkpoint near the end of a topic whose newest segment
/// is full (about 4,000 events of 100 bytes in 1 MiB): the cost of a
/// reconnecting tunnel's `do_since_checkpoint`, and of a drain reading back
/// the events another process stored and did not forward yet.
fn read_since(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open_with(config(dir.path())).expect("open store");
    let t = topic("/bench/since");
    fill(&store, &t, 4_000);
    let last = 4_000;
    let mut group = c.benchmark_group("read/since");
    for behind in [1, 100] {
        let since = Selection { since_checkpoint: Some((last - behind).to_string().into_bytes()), ..Selection::none() };
        group.bench_function(format!("{behind}_behind_in_4000"), |b| {
            b.iter(|| {
                let got = store.events(&t, &since).expect("read");
                assert_eq!(got.events.len(), behind as usize);
                got
            })
        });
        // The same resume as a tunnel's start (its cursor at the end, then
        // the events after the checkpoint).
        group.bench_function(format!("tunnel_{behind}_behind_in_4000"), |b| {
            b.iter(|| {
                let start = store.tunnel(&t, &since).expect("tunnel");
                assert_eq!(start.initial.events.len(), behind as usize);
                start
            })
        });
    }
    group.finish();
}

/// A post to a topic with one route to an ordinary topic: the forwarding
/// outbox's cost (its `.forwarded` locked, read and written once per post)
/// on top of the delivery itself.
fn post_routed(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open_with(config(dir.path())).expect("open store");
    let source = topic("/bench/routed");
    let mut params = Event::new();
    params.set("kn_id", "r1");
    store.route(&source, b"/bench/routed_copy", params).expect("create route");
    let plain = topic("/bench/unrouted");
    let mut group = c.benchmark_group("post/routed");
    let mut next = 0u64;
    group.bench_function("0_routes", |b| {
        b.iter(|| {
            next += 1;
            store.notify(&plain, event(&format!("m{next:08}"))).expect("post")
        })
    });
    group.bench_function("1_route", |b| {
        b.iter(|| {
            next += 1;
            store.notify(&source, event(&format!("m{next:08}"))).expect("post")
        })
    });
    group.finish();
}

fn fanout(c: &mut Criterion, full: bool) {
    let routes = if full { 1000 } else { 10 };
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open_with(config(dir.path())).expect("open store");
    let source = topic("/bench/fan");
    let mut journals = Vec::new();
    for i in 0..routes {
        let j = topic(&format!("/bench/fan_to/j{i}/kn_journal"));
        open_journal(&store, &j);
        let mut params = Event::new();
        params.set("kn_id", format!("r{i}"));
        store.route(&source, j.as_str().as_bytes(), params).expect("create route");
        journals.push(j);
    }
    for j in &journals {
        store.heartbeat(j).expect("heartbeat");
    }
    let mut group = c.benchmark_group("fanout");
    group.sample_size(10);
    let mut next = 0u64;
    group.bench_function(format!("{routes}_journal_routes"), |b| {
        b.iter(|| {
            next += 1;
            let report = store.notify(&source, event(&format!("f{next:08}"))).expect("post");
            assert_eq!(report.writes.len(), routes + 1, "every route delivered");
            report
        })
    });
    group.finish();
}

/// A rules file of `n` rules: `n - 1` that do not apply to a post to
/// `/bench/...` by anna (other topics, other operations, other people),
/// then the one that allows it.
fn rules_file(dir: &Path, n: usize) -> std::path::PathBuf {
    let mut text = String::from("group staff: anna bob carl
group ops: dora anna
");
    for i in 0..n - 1 {
        text.push_str(&match i % 4 {
            0 => format!("allow post,read /what/team{i}/** @staff\n"),
            1 => format!("deny  all       /what/secret{i}/** *\n"),
            2 => format!("allow read      /bench/**/kn_journal{i} anonymous\n"),
            _ => format!("allow all       /who/{{user}}/projects{i}/** @ops\n"),
        });
    }
    text.push_str("allow post,read,route /bench/** users\n");
    let path = dir.join("access.rules");
    std::fs::write(&path, text).expect("write rules");
    path
}

fn access(c: &mut Criterion) {
    let anna = Principal::user("anna");
    let mut notify = c.benchmark_group("access/notify");
    let mut fan = Vec::new();
    for (label, rules) in [("no_rules", 0), ("100_rules", 100)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = config(&dir.path().join("kn_events"));
        if rules > 0 {
            config.access_rules = Some(rules_file(dir.path(), rules));
        }
        let store = Store::open_with(config).expect("open store");
        let t = topic("/bench/access");
        let mut next = 0u64;
        notify.bench_function(label, |b| {
            b.iter(|| {
                next += 1;
                store.as_user(&anna).notify(&t, event(&format!("a{next:08}"))).expect("post")
            })
        });
        fan.push((label, dir, store));
    }
    notify.finish();
    let mut group = c.benchmark_group("access/fanout10");
    for (label, _dir, store) in &fan {
        let source = topic("/bench/access_fan");
        for i in 0..10 {
            let mut params = Event::new();
            params.set("kn_id", format!("r{i}"));
            store.as_user(&anna).route(&source, format!("/bench/access_to/t{i}").as_bytes(), params).expect("create route");
        }
        // Creates the destinations (their announcements are not measured).
        store.as_user(&anna).notify(&source, event("warm")).expect("post");
        let mut next = 0u64;
        group.bench_function(*label, |b| {
            b.iter(|| {
                next += 1;
                let report = store.as_user(&anna).notify(&source, event(&format!("f{next:08}"))).expect("post");
                assert_eq!(report.writes.len(), 11, "every route delivered");
                report
            })
        });
    }
    group.finish();
}

/// The cost of the rules measured as a ratio within one run, robust to a
/// busy machine: rounds of `n` notifies alternate between a store without
/// rules and one with a 100-rule file (and the same with 10 routes per
/// post); prints the median time per notify of each and their ratio.
fn access_ratio(full: bool) {
    let anna = Principal::user("anna");
    let (rounds, n) = if full { (300, 50) } else { (3, 20) };
    let mut stores = Vec::new();
    for rules in [0, 100] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = config(&dir.path().join("kn_events"));
        if rules > 0 {
            config.access_rules = Some(rules_file(dir.path(), rules));
        }
        let store = Store::open_with(config).expect("open store");
        let fan = topic("/bench/ratio_fan");
        for i in 0..10 {
            let mut params = Event::new();
            params.set("kn_id", format!("r{i}"));
            store.as_user(&anna).route(&fan, format!("/bench/ratio_to/t{i}").as_bytes(), params).expect("create route");
        }
        store.as_user(&anna).notify(&fan, event("warm")).expect("post");
        stores.push((dir, store));
    }
    // One check alone, in a loop (CPU only: what the rules add).
    let rules = stores[1].1.access_rules().expect("rules").expect("a rules file");
    let checks = if full { 1_000_000 } else { 1000 };
    let t = topic("/bench/ratio");
    let started = Instant::now();
    for _ in 0..checks {
        rules.check(&anna, kn_journal::access::Operation::Post, std::hint::black_box(&t)).expect("allowed");
    }
    println!("access: one check against the 100 rules takes {:.0} ns", started.elapsed().as_secs_f64() * 1e9 / checks as f64);
    for (label, t) in [("notify", topic("/bench/ratio")), ("notify, 10 routes", topic("/bench/ratio_fan"))] {
        let mut times = [Vec::new(), Vec::new()];
        let mut next = 0u64;
        for _ in 0..rounds {
            for (i, (_, store)) in stores.iter().enumerate() {
                let started = Instant::now();
                for _ in 0..n {
                    next += 1;
                    store.as_user(&anna).notify(&t, event(&format!("q{next:08}"))).expect("post");
                }
                times[i].push(started.elapsed().as_secs_f64() * 1e6 / n as f64);
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (none, hundred) = (median(&mut times[0]), median(&mut times[1]));
        println!(
            "access ({label}): no rules {none:.1} µs, 100 rules {hundred:.1} µs per notify (median of {rounds} alternating rounds of {n}): ratio {:.3}",
            hundred / none
        );
    }
}

/// `du`-style disk usage of a tree: `st_blocks * 512` of every file and
/// directory (hard links counted once), and the sum of the files' sizes.
fn disk_usage(root: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashSet::new();
    let (mut blocks, mut bytes) = (0u64, 0u64);
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        if let Ok(m) = std::fs::symlink_metadata(&dir) {
            blocks += m.blocks() * 512;
        }
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let Ok(m) = entry.metadata() else { continue };
            if m.is_dir() {
                stack.push(entry.path());
            } else if seen.insert((m.dev(), m.ino())) {
                blocks += m.blocks() * 512;
                bytes += m.len();
            }
        }
    }
    (blocks, bytes)
}

/// One 1 MiB event fanned out to 1,000 local journals: time and disk per
/// post. Not a criterion bench: each round writes to every journal.
fn big_fanout(full: bool) {
    let (routes, rounds) = if full { (1000, 3) } else { (10, 2) };
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open_with(config(dir.path())).expect("open store");
    let source = topic("/bench/bigfan");
    for i in 0..routes {
        let j = topic(&format!("/bench/bigfan_to/j{i}/kn_journal"));
        open_journal(&store, &j);
        let mut params = Event::new();
        params.set("kn_id", format!("r{i}"));
        store.route(&source, j.as_str().as_bytes(), params).expect("create route");
    }
    // Warm up: the first post opens every journal's files.
    store.notify(&source, event("warm-up")).expect("post");
    let mut times = Vec::new();
    let mut disk = Vec::new();
    for round in 0..rounds {
        // A different payload each round (the same one would be stored once).
        let payload: Vec<u8> = (0..1usize << 20).map(|i| (i * 7 + i / 4093 + round) as u8).collect();
        let (blocks_before, bytes_before) = disk_usage(dir.path());
        let mut e = Event::new();
        e.set("kn_id", format!("big{round}")).set("kn_payload", payload);
        let started = Instant::now();
        let report = store.notify(&source, e).expect("post");
        times.push(started.elapsed());
        assert_eq!(report.writes.len(), routes + 1, "every route delivered");
        let (blocks_after, bytes_after) = disk_usage(dir.path());
        disk.push((blocks_after - blocks_before, bytes_after - bytes_before));
    }
    let mut sorted = times.clone();
    sorted.sort_unstable();
    println!(
        "1 MiB event fanned out to {routes} journals ({rounds} posts): median {:.1} ms (each {:?} ms); disk per post (du) {:.2} MiB, file bytes {:.2} MiB (each {:?} KiB du)",
        sorted[sorted.len() / 2].as_secs_f64() * 1e3,
        times.iter().map(|t| (t.as_secs_f64() * 1e4).round() / 10.0).collect::<Vec<_>>(),
        disk[disk.len() / 2].0 as f64 / (1 << 20) as f64,
        disk[disk.len() / 2].1 as f64 / (1 << 20) as f64,
        disk.iter().map(|d| d.0 >> 10).collect::<Vec<_>>(),
    );
}

fn micros_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

/// The waiting reader (another process): prints `READY`, then for each
/// event the microseconds between the post's start (its payload) and its
/// arrival here.
fn waiter() {
    let root = std::env::var("KN_BENCH_ROOT").expect("KN_BENCH_ROOT");
    let store = Store::open(root).expect("open store");
    let t = topic("/bench/wake");
    let mut tunnel = store.tunnel(&t, &Selection::none()).expect("tunnel").tunnel;
    let mut out = std::io::stdout().lock();
    let notified = if tunnel.is_notified() { "notified" } else { "polling" };
    writeln!(out, "READY {notified}").and_then(|_| out.flush()).expect("stdout");
    loop {
        let events = tunnel.wait(&store, Duration::from_secs(10)).expect("wait");
        let now = micros_now();
        if events.is_empty() {
            // Idle for 10 s: the bench is over or gone. Exit without
            // dropping the tunnel.
            std::process::exit(0);
        }
        for e in events {
            let sent: u64 = String::from_utf8_lossy(e.payload()).parse().unwrap_or(now);
            writeln!(out, "{}", now.saturating_sub(sent)).and_then(|_| out.flush()).expect("stdout");
        }
    }
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn wake_latency(full: bool) {
    let rounds = if full { 200 } else { 10 };
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open store");
    let t = topic("/bench/wake");
    let exe = std::env::current_exe().expect("bench binary");
    let mut child = Command::new(exe)
        .env("KN_BENCH_ROLE", "waiter")
        .env("KN_BENCH_ROOT", dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn waiter");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let ready = lines.next().and_then(|l| l.ok()).unwrap_or_default();
    assert!(ready.starts_with("READY"), "waiter said {ready:?}");
    let mut latencies = Vec::with_capacity(rounds);
    for i in 0..rounds {
        // Let the reader go back to sleep in wait() first.
        std::thread::sleep(Duration::from_millis(5));
        let mut e = Event::new();
        e.set("kn_id", format!("w{i}")).set("kn_payload", micros_now().to_string());
        store.notify(&t, e).expect("post");
        let line = lines.next().and_then(|l| l.ok()).expect("the waiter reports");
        latencies.push(line.trim().parse::<u64>().expect("micros"));
    }
    let _ = child.kill();
    let _ = child.wait();
    latencies.sort_unstable();
    println!(
        "wake-up latency, post -> Tunnel::wait in another process ({}; {rounds} round trips): p50 {} us, p99 {} us, max {} us",
        ready.trim_start_matches("READY "),
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        latencies[latencies.len() - 1]
    );
}

fn bytes_on_disk(full: bool) {
    let n = if full { 10_000 } else { 100 };
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open_with(config(dir.path())).expect("open store");
    for t in [topic("/bench/bytes/kn_journal"), topic("/bench/bytes_topic")] {
        if t.is_journal() {
            open_journal(&store, &t);
        }
        fill(&store, &t, n);
        let tdir = t.segments().fold(store.root().to_path_buf(), |d, s| d.join(s));
        let (mut segments, mut head, mut files) = (0u64, 0u64, 0);
        for entry in std::fs::read_dir(&tdir).expect("list topic") {
            let entry = entry.expect("entry");
            let name = entry.file_name().to_string_lossy().into_owned();
            let len = entry.metadata().expect("stat").len();
            if name.starts_with(".seg-") {
                segments += len;
                files += 1;
            } else if name == ".head" {
                head += len;
            }
        }
        println!(
            "bytes on disk per 100-byte event on {}: {:.1} ({} events; {files} segment files {segments} B = {:.1}/event, .head {head} B = {:.1}/event)",
            if t.is_journal() { "a journal" } else { "an ordinary topic" },
            (segments + head) as f64 / n as f64,
            n,
            segments as f64 / n as f64,
            head as f64 / n as f64,
        );
    }
}

fn main() {
    if std::env::var("KN_BENCH_ROLE").as_deref() == Ok("waiter") {
        waiter();
        return;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `cargo bench` passes --bench; without it (cargo test --benches) run a
    // quick smoke version of everything.
    let full = args.iter().any(|a| a == "--bench");
    let filter = args.iter().find(|a| !a.starts_with('-')).cloned();
    let wanted = |name: &str| filter.as_deref().map(|f| name.contains(f)).unwrap_or(true);
    let mut c = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    if wanted("post/topic") || wanted("post/journal") {
        post_latency(&mut c, full);
    }
    if wanted("post/routed") {
        post_routed(&mut c);
    }
    if wanted("read/since") {
        read_since(&mut c);
    }
    if wanted("fanout/1000_journal_routes") {
        fanout(&mut c, full);
    }
    if wanted("access/notify") || wanted("access/fanout10") {
        access(&mut c);
    }
    c.final_summary();
    if wanted("access_ratio") {
        access_ratio(full);
    }
    if wanted("bigfan") {
        big_fanout(full);
    }
    if wanted("wake") {
        wake_latency(full);
    }
    if wanted("bytes") {
        bytes_on_disk(full);
    }
}
