//! Scale-out (issue 13): several web servers sharing one `kn_events` on a
//! GlusterFS volume, with real parts. The test makes a network namespace
//! with an address of the benchmarking range (198.18.0.0/24; glusterd
//! refuses loopback bricks, and nothing is exposed on the machine's own
//! interfaces), starts a private glusterd there (its state in a scratch
//! directory), creates a **replica 3** volume with the options
//! docs/DEPLOY.md requires, mounts it twice (two FUSE clients, each with
//! its own cache: the two "hosts"), and runs one `pubsub-cgi serve` per
//! mount. Then:
//!
//! 1. notify on host A, tunnel on host B: p50/p99 latency (printed); the
//!    same with wake-ups pushed (`KN_WAKE_ADDR`): with B polling every 10
//!    minutes a notify still arrives (the push), and an A/B against the
//!    poll (printed);
//! 2. both hosts post at once to one ordinary topic, one journal and 100
//!    topics: every acknowledged post stored exactly once, nothing torn,
//!    duplicates suppressed across hosts, checkpoints strictly increasing;
//!    posts/s per host against two servers on one local store;
//! 3. SIGKILL of a writing server on host A while host B reads: no torn
//!    record returned, every acknowledged post there, `kn verify` clean
//!    (`a_writer_killed_on_one_host_tears_nothing_the_other_reads`: it
//!    hung GlusterFS's FUSE client while a killed server could leave two
//!    lock requests in flight on the mount, docs/SCALE-OUT.md);
//! 4. a brick killed and restarted under load: posts go on, nothing
//!    acknowledged is lost, the volume heals;
//! 5. routes changed on one host, posted through on the other.
//!
//! `default_volume_options_break_and_the_doctor_says_so` makes a volume
//! with GlusterFS's defaults, shows what breaks (printed) and asserts
//! only that `kn doctor` names the wrong settings.
//!
//! Everything is torn down by a guard, also when an assertion fails:
//! mounts, volumes, glusterd and its bricks, the namespace.
//! Needs root, `ip` (iproute2), `glusterd`/`gluster` (glusterfs-server)
//! and `mount.glusterfs` (glusterfs-client) with /dev/fuse; without them
//! it skips (and fails under CI=true). Sizes: `KN_GLUSTER_POSTS` (posts
//! per host in item 2): 200 by default, which keeps the three tests near
//! three minutes on a 2-core machine shared with builds (3.7-4.4 minutes
//! at load average 18-38); the issue's full size is
//! `bench/gluster-bench.sh` (`KN_GLUSTER_POSTS=5000`). Figures:
//! docs/SCALE-OUT.md.

mod e2e;
mod gluster_cluster;
mod scale_out;
mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use e2e::Tunnel;
use gluster_cluster::*;
use scale_out::*;

// ---------------------------------------------------------------------------
// The tests

#[test]
fn several_hosts_share_one_store_on_a_replica_3_volume() {
    if !gate() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let started = Instant::now();
    let mut cluster = Cluster::start("scale");
    let required: Vec<(&str, &str)> = kn_journal::internal::GLUSTER_VOLUME_OPTIONS.iter().map(|&(o, v, _)| (o, v)).collect();
    let volume = cluster.volume("r", &required);
    let mount_a = cluster.mount(&volume, "a", MOUNT_OPTIONS);
    let mount_b = cluster.mount(&volume, "b", MOUNT_OPTIONS);
    let (root_a, root_b) = (mount_a.join("kn_events"), mount_b.join("kn_events"));
    // Created by `kn doctor` below (Store::open), with the store's modes.
    eprintln!("cluster up in {:.1} s", started.elapsed().as_secs_f64());

    // The doctor sees the volume as DEPLOY.md wants it.
    let (ok, doctor) = kn(&root_b, &["doctor"]);
    eprintln!("kn doctor on host B:\n{doctor}");
    assert!(ok, "kn doctor finds a required setting wrong:\n{doctor}");
    assert!(doctor.contains("fuse.glusterfs") && doctor.contains("shared mode"), "{doctor}");
    assert!(!doctor.contains("WRONG"), "{doctor}");

    let a = Host::start("A", &root_a);
    let b = Host::start("B", &root_b);
    let selftest = support::get(&format!("{}?do_method=test", b.url())).text();
    assert!(selftest.contains("File system: fuse.glusterfs") && selftest.contains("shared mode"), "{selftest}");
    assert!(!selftest.contains("FAIL"), "{selftest}");

    // 1. Notify on A, tunnel on B (and on a second server of B).
    notify_crosses_hosts(&a, &b, &root_b);
    // The same, pushed (KN_WAKE_ADDR) against polled, alternating.
    pushed_wakeups(&root_a, &root_b);

    // 2. Both hosts at once: one ordinary topic, one journal, 100 topics;
    // the same load on a local ext4 store for comparison.
    let store = open_store(&root_b);
    two_hosts_post_at_once(&a, &b, &store, posts_per_host());

    // 4. A brick killed and restarted under load.
    let stop = Arc::new(AtomicBool::new(false));
    let plan = vec![
        (0..100_000).map(|i| Post { topic: format!("/brick/t{}", i % 10), id: format!("ba-{i}") }).collect::<Vec<_>>(),
        (0..100_000).map(|i| Post { topic: "/who/brick/kn_journal".into(), id: format!("bb-{i}") }).collect(),
    ];
    let mut brick_reader = Tunnel::open(&format!("{}/who/brick/kn_journal?do_method=route&kn_response_format=simple&kn_status_from=br", a.url()));
    brick_reader.expect_watching("br", String::new);
    let addrs = [a.addr(), b.addr()];
    let s = stop.clone();
    let posting = thread::spawn(move || load(&addrs, &plan, 2, &s));
    thread::sleep(Duration::from_secs(1));
    let brick = cluster.brick_pid(&volume, "r-brick2").expect("the brick process of r-brick2");
    unsafe { libc::kill(brick as i32, libc::SIGKILL) };
    let down = Instant::now();
    thread::sleep(Duration::from_secs(3));
    cluster.gluster(&["volume", "start", &volume, "force"]).unwrap();
    thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let r = posting.join().unwrap();
    let acked: Vec<Post> = r.acked.into_iter().flatten().collect();
    let failed_ids = r.failed_ids;
    let _ = cluster.gluster(&["volume", "heal", &volume]);
    let mut pending = None;
    let healed = support::wait_for(Duration::from_secs(120), || {
        pending = cluster.heal_pending(&volume);
        if pending != Some(0) {
            let _ = cluster.gluster(&["volume", "heal", &volume]);
            thread::sleep(Duration::from_millis(500));
        }
        pending == Some(0)
    });
    let problems = audit_with(&store, &acked, |id| failed_ids.contains(id));
    eprintln!(
        "brick killed for {:.1} s under load: {} posts acknowledged meanwhile ({} failed); healed: {healed} (pending {pending:?})",
        down.elapsed().as_secs_f64(),
        acked.len(),
        r.failed
    );
    assert!(problems.is_empty(), "after a brick restart: {:?}", &problems[..problems.len().min(10)]);
    assert!(!acked.is_empty(), "no post went through while a brick was down");
    assert!(healed, "the volume did not heal: {pending:?} entries pending");
    brick_reader.stream.close();

    // 5. Routes changed on one host, posted through on the other.
    routes_cross_hosts(&a, &b, &store);

    drop(a);
    drop(b);
    eprintln!("total {:.0} s", started.elapsed().as_secs_f64());
}

#[test]
fn default_volume_options_break_and_the_doctor_says_so() {
    if !gate() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut cluster = Cluster::start("defaults");
    let volume = cluster.volume("d", &[]);
    let mount_a = cluster.mount(&volume, "a", "");
    let mount_b = cluster.mount(&volume, "b", "");
    let (root_a, root_b) = (mount_a.join("kn_events"), mount_b.join("kn_events"));
    // Created by `kn doctor` below (Store::open), with the store's modes.

    let (ok, doctor) = kn(&root_b, &["doctor"]);
    eprintln!("kn doctor on a volume with GlusterFS's defaults:\n{doctor}");
    assert!(!ok, "kn doctor passed a volume with the default options:\n{doctor}");
    for setting in ["attribute-timeout", "entry-timeout", "performance.write-behind", "performance.quick-read", "performance.open-behind", "performance.stat-prefetch", "cluster.eager-lock"] {
        assert!(doctor.lines().any(|l| l.contains("WRONG") && l.contains(setting)), "kn doctor does not name {setting}:\n{doctor}");
    }

    // What breaks (printed, not asserted: it depends on timing).
    let a = Host::start("A", &root_a);
    let b = Host::start("B", &root_b);
    let selftest = support::get(&format!("{}?do_method=test", b.url())).text();
    assert!(selftest.contains("FAIL: ") && selftest.contains("performance.write-behind is on (needs off)"), "{selftest}");
    let cross = latencies(&a, &b, "/lat/cross", 5);
    eprintln!("defaults: latency notify A -> tunnel B: p50 {:?} p99 {:?}", percentile(&cross, 0.5), percentile(&cross, 0.99));
    let n = posts_per_host().min(100);
    let (report, _) = load_both_hosts(&a, &b, n);
    let all: Vec<Post> = report.acked.iter().flatten().cloned().collect();
    let store = open_store(&root_b);
    let problems = audit(&store, &all);
    let (clean, verify) = kn(&root_b, &["verify"]);
    eprintln!(
        "defaults: {} posts acknowledged, {} failed {:?}, {} problems (first: {:?}); kn verify clean: {clean} {}",
        all.len(),
        report.failed,
        report.failures,
        problems.len(),
        &problems[..problems.len().min(5)],
        verify.lines().take(3).collect::<Vec<_>>().join(" | ")
    );
}

/// Item 3. A server SIGKILLed with several threads waiting for topic
/// locks is what hung GlusterFS's FUSE client when those waits were
/// blocking `flock`s (docs/SCALE-OUT.md, `shared::lock`): the killed
/// server then never dies, and the test says so.
///
/// Since shared mode makes one lock call on the volume at a time per
/// process (`shared::lock`), a killed server leaves at most one
/// interrupted lock request, and it passed 40 runs of 40 in a row; a
/// server that does not die says where its threads wait in the kernel.
#[test]
fn a_writer_killed_on_one_host_tears_nothing_the_other_reads() {
    if !gate() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut cluster = Cluster::start("kill");
    let required: Vec<(&str, &str)> = kn_journal::internal::GLUSTER_VOLUME_OPTIONS.iter().map(|&(o, v, _)| (o, v)).collect();
    let volume = cluster.volume("k", &required);
    let mount_a = cluster.mount(&volume, "a", MOUNT_OPTIONS);
    let mount_b = cluster.mount(&volume, "b", MOUNT_OPTIONS);
    let (root_a, root_b) = (mount_a.join("kn_events"), mount_b.join("kn_events"));
    let (ok, doctor) = kn(&root_b, &["doctor"]);
    assert!(ok, "{doctor}");
    a_writer_killed_on_one_host_tears_nothing(&root_a, &root_b);
}
