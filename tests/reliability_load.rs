//! Load through a real Apache 2.4 (`mpm_event` + `mod_cgid`) on loopback:
//! many tunnels, many publishers, every tunnel gets its events once, in
//! order (split from reliability.rs; figures in docs/RELIABILITY.md).
//!
//! The full-size load run (200 tunnels, 20,000 events: 3 minutes in release,
//! 6 in debug on 2 cores, too long for CI) is `#[ignore]`d:
//! `cargo test --release --test reliability_load -- --ignored --nocapture`.

mod e2e;
mod support;
mod reliability_common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use e2e::parse_frames;
use support::{Apache, Dir};

use reliability_common::*;

// ---------------------------------------------------------------------------
// Load

/// The shape of a load run: `sources` topics, each routed into
/// `per_source` journals followed by tunnels, and `publishers` threads
/// posting `events` in all, round-robin over the sources.
#[derive(Clone, Copy, Debug)]
struct Shape {
    sources: usize,
    per_source: usize,
    publishers: usize,
    events: usize,
}

/// What one tunnel received: per publisher, the sequence numbers in
/// arrival order.
type Received = HashMap<usize, Vec<usize>>;

const INOTIFY_INSTANCES: &str = "/proc/sys/fs/inotify/max_user_instances";

/// `fs.inotify.max_user_instances` raised for as long as this lives (root
/// only), then put back. Each CGI tunnel is a process with its own inotify
/// instance; past the limit (128 per user by default) a tunnel polls
/// every `KN_POLL_MS` instead, which is exact but slower. A server that
/// holds hundreds of CGI tunnels raises the limit (docs/DEPLOY.md), and so
/// does the test.
struct InotifyInstances {
    /// The value to put back, when it was raised.
    old: Option<u64>,
}

impl InotifyInstances {
    fn current() -> Option<u64> {
        std::fs::read_to_string(INOTIFY_INSTANCES).ok()?.trim().parse().ok()
    }

    fn at_least(wanted: u64) -> InotifyInstances {
        match InotifyInstances::current() {
            Some(old) if old < wanted && std::fs::write(INOTIFY_INSTANCES, wanted.to_string()).is_ok() => InotifyInstances { old: Some(old) },
            _ => InotifyInstances { old: None },
        }
    }
}

impl Drop for InotifyInstances {
    fn drop(&mut self) {
        if let Some(old) = self.old {
            let _ = std::fs::write(INOTIFY_INSTANCES, old.to_string());
        }
    }
}

/// How many of `pids` hold an inotify instance (a tunnel woken by change
/// notification; the others poll).
fn with_inotify(pids: &[u32]) -> usize {
    pids.iter()
        .filter(|pid| {
            std::fs::read_dir(format!("/proc/{pid}/fd"))
                .map(|fds| fds.flatten().any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == "anon_inode:inotify")))
                .unwrap_or(false)
        })
        .count()
}

fn load_run(name: &str, shape: Shape) {
    if !apache_available() {
        return;
    }
    let started = Instant::now();
    let tunnels = shape.sources * shape.per_source;
    // Room for one inotify instance per tunnel, with the default's 128 to
    // spare for everything else the web server's user runs.
    let _inotify = InotifyInstances::at_least(tunnels as u64 + 128);
    let dir = Dir::new(name);
    let store = dir.store("kn_events");
    let apache = Apache::start(&support::pubsub_cgi(), &store, MANY_WORKERS);
    let url = apache.url();

    // Tunnels first: a route into a journal no tunnel reads is poisoned.
    let stop = Arc::new(AtomicBool::new(false));
    let expected_per_source: Vec<usize> =
        (0..shape.sources).map(|s| (0..shape.events).filter(|i| i % shape.sources == s).count()).collect();
    let (ready_tx, ready_rx) = mpsc::channel();
    let mut readers = Vec::new();
    for j in 0..tunnels {
        let source = j % shape.sources;
        let expected = expected_per_source[source];
        let turl = format!("{url}/who/load/s/{j}/kn_journal?do_method=route&kn_response_format=simple&kn_status_from=t{j}");
        let stop = stop.clone();
        let ready = ready_tx.clone();
        readers.push(thread::spawn(move || -> Result<(usize, Received), String> {
            let mut f = Follower::open(&turl).ok_or(format!("tunnel {j}: cannot connect"))?;
            let mut got: Received = HashMap::new();
            let mut count = 0;
            let mut watching = false;
            while count < expected && !stop.load(Ordering::Relaxed) && !f.eof {
                for e in f.poll(Duration::from_millis(500)) {
                    if e.get("status").is_some() {
                        if e.status() != "200 Watching topic" {
                            return Err(format!("tunnel {j}: {e:?}"));
                        }
                        watching = true;
                        let _ = ready.send(j);
                        continue;
                    }
                    let payload = e.payload_text();
                    let mut parts = payload.split(' ');
                    let p: usize = parts.next().and_then(|x| x.strip_prefix('p')).and_then(|x| x.parse().ok()).ok_or(format!("bad payload {payload:?}"))?;
                    let _s = parts.next();
                    let n: usize = parts.next().and_then(|x| x.strip_prefix('n')).and_then(|x| x.parse().ok()).ok_or(format!("bad payload {payload:?}"))?;
                    got.entry(p).or_default().push(n);
                    count += 1;
                }
            }
            if !watching {
                return Err(format!("tunnel {j}: no status (HTTP {:?}, eof {})", f.status, f.eof));
            }
            Ok((j, got))
            // `f` drops here: the client goes away.
        }));
    }
    drop(ready_tx);
    for _ in 0..tunnels {
        if ready_rx.recv_timeout(Duration::from_secs(120)).is_err() {
            stop.store(true, Ordering::Relaxed);
            panic!("not every tunnel opened within 120 s\n{}", tail(&apache.error_log()));
        }
    }
    let opened = started.elapsed();
    let open_cgis = cgi_processes(&apache);
    let peak_cgis = open_cgis.len();
    let tunnel_pids: Vec<u32> = open_cgis.iter().filter(|(_, t)| *t).map(|(p, _)| *p).collect();
    let notified = with_inotify(&tunnel_pids);
    for j in 0..tunnels {
        // On a fresh connection too (see the publishers below).
        let body = form(&[
            ("do_method", "route"),
            ("kn_from", &format!("/what/load/{}", j % shape.sources)),
            ("kn_to", &format!("/who/load/s/{j}/kn_journal")),
            ("kn_id", &format!("r{j}")),
            ("kn_response_format", "simple"),
        ]);
        let (status, text) = try_post(&url, &body, Duration::from_secs(60));
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        let routed = parse_frames(body.as_bytes(), &mut 0).first().is_some_and(|e| e.status() == "200 Routed");
        assert!(status == 200 && routed, "route {j}: HTTP {status}\n{text}\n--- Apache error log:\n{}", tail(&apache.error_log()));
    }
    eprintln!(
        "load {name}: {tunnels} tunnels open in {opened:?} ({peak_cgis} CGI processes, {notified} of {} tunnels woken by inotify, \
         the others poll; max_user_instances {:?}), routes made",
        tunnel_pids.len(),
        InotifyInstances::current()
    );

    // Publishers: publisher p's i-th post goes to source i % sources and
    // carries p's running count for that source. Each post is a fresh
    // HTTP/1.0 connection: a keep-alive connection stays with the Apache
    // child that accepted it, and once tunnels hold every worker of that
    // child its next request waits for one to end (over 70 s when tried),
    // while a fresh connection is accepted by a child with a free worker.
    let publish_started = Instant::now();
    let per_publisher = shape.events / shape.publishers;
    let publishers: Vec<_> = (0..shape.publishers)
        .map(|p| {
            let url = url.clone();
            let sources = shape.sources;
            thread::spawn(move || -> Result<Vec<usize>, String> {
                let mut next = vec![0usize; sources];
                for k in 0..per_publisher {
                    let i = p * per_publisher + k;
                    let s = i % sources;
                    let payload = format!("p{p} s{s} n{}", next[s]);
                    next[s] += 1;
                    let id = format!("p{p}-{k}");
                    let body = form(&[("kn_to", &format!("/what/load/{s}")), ("kn_id", &id), ("kn_payload", &payload), ("kn_response_format", "simple")]);
                    let (status, text) = try_post(&url, &body, Duration::from_secs(60));
                    if status != 200 {
                        return Err(format!("publisher {p} post {k}: HTTP {status} (0: no status line)\n{}", &text[..text.len().min(2000)]));
                    }
                }
                Ok(next)
            })
        })
        .collect();
    let mut posted: Vec<Vec<usize>> = Vec::new();
    let mut publish_errors = Vec::new();
    for p in publishers {
        match p.join().expect("publisher panicked") {
            Ok(next) => posted.push(next),
            Err(e) => publish_errors.push(e),
        }
    }
    if !publish_errors.is_empty() {
        stop.store(true, Ordering::Relaxed);
        panic!("{} publishers failed: {publish_errors:#?}\n--- Apache error log:\n{}", publish_errors.len(), tail(&apache.error_log()));
    }
    let published = publish_started.elapsed();
    let peak_cgis = peak_cgis.max(cgi_processes(&apache).len());

    // Every tunnel must see every event of its source within a bound.
    let watchdog = {
        let stop = stop.clone();
        thread::spawn(move || {
            let until = Instant::now() + Duration::from_secs(300);
            while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                thread::sleep(Duration::from_millis(200));
            }
            stop.store(true, Ordering::Relaxed);
        })
    };
    let mut results = Vec::new();
    for r in readers {
        results.push(r.join().expect("reader panicked"));
    }
    let delivered = publish_started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let _ = watchdog.join();

    // All clients are gone: no CGI may stay behind.
    let closed = Instant::now();
    let gone = support::wait_for(Duration::from_secs(30), || cgi_processes(&apache).is_empty());
    let exit_time = closed.elapsed();
    let left = cgi_processes(&apache);

    let mut failures = Vec::new();
    let (mut received, mut missing, mut repeated) = (0usize, 0usize, 0usize);
    for r in results {
        let (j, got) = match r {
            Ok(x) => x,
            Err(e) => {
                failures.push(e);
                continue;
            }
        };
        let s = j % shape.sources;
        for (p, sent) in posted.iter().enumerate() {
            let want: Vec<usize> = (0..sent[s]).collect();
            let have = got.get(&p).cloned().unwrap_or_default();
            let distinct: std::collections::HashSet<usize> = have.iter().copied().collect();
            received += have.len();
            repeated += have.len() - distinct.len();
            missing += want.iter().filter(|n| !distinct.contains(n)).count();
            if have != want {
                failures.push(format!(
                    "tunnel {j} (source {s}), publisher {p}: {} events, want {} in order once; first difference at {:?}",
                    have.len(),
                    want.len(),
                    have.iter().zip(&want).position(|(a, b)| a != b)
                ));
            }
        }
    }
    let events_delivered: usize = expected_per_source.iter().map(|n| n * shape.per_source).sum();
    eprintln!(
        "load {name}: {shape:?}: published in {published:?} ({:.0} notifies/s); {received} of {events_delivered} tunnel deliveries received \
         ({missing} missing, {repeated} twice), checked {delivered:?} after the first post; peak {peak_cgis} CGI processes; \
         after the clients left, CGIs gone in {exit_time:?} ({} left); total {:?}",
        shape.events as f64 / published.as_secs_f64(),
        left.len(),
        started.elapsed()
    );
    assert!(failures.is_empty(), "{} failures, first: {:?}", failures.len(), &failures[..failures.len().min(5)]);
    assert!(gone, "{} pubsub.cgi processes left behind after the clients went away: {left:?}", left.len());

    drop(apache);
    let store = open_store(&store);
    let (records, torn) = verify_allowing_torn_tails(&store);
    assert_eq!(torn, 0);
    eprintln!("load {name}: store verifies clean, {records} records");
}

/// The default suite's load run: the 200 tunnels open at once and
/// 8 publishers, with a tenth of its events (about 35 s in a debug build).
#[test]
fn load_200_tunnels_8_publishers_2000_events_each_tunnel_gets_its_events_once_in_order() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    load_run("load_ci", Shape { sources: 8, per_source: 25, publishers: 8, events: 2_000 });
}

/// The full size: 200 tunnels open at once, 8 publishers posting
/// 20,000 events to 8 sources each routed into 25 journals.
#[test]
#[ignore = "full-size load run (minutes): cargo test --release --test reliability -- --ignored"]
fn load_200_tunnels_8_publishers_20000_events_each_tunnel_gets_its_events_once_in_order() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    load_run("load_full", Shape { sources: 8, per_source: 25, publishers: 8, events: 20_000 });
}

