//! `<topic>/kn_presence` across two hosts of a real GlusterFS volume
//! (docs/PRESENCE.md, docs/SCALE-OUT.md): a replica 3 volume with the
//! settings DEPLOY.md requires, mounted twice (two FUSE clients: the two
//! "hosts"), one `pubsub-cgi serve` on each. A tunnel held on either host
//! shows on both hosts' `kn_presence` watchers, and leaves on both when it
//! closes; a host's server SIGKILLed leaves within the bound, seen from
//! the other host. The lock that says "connected" (the journal's byte of
//! `.kn_readers`, an open file description lock) crosses the hosts
//! through GlusterFS's `features/locks`, and is dropped with its killed
//! holder.
//!
//! Needs what tests/gluster.rs needs (root, iproute2, glusterfs-server,
//! glusterfs-client, /dev/fuse); skips without them (fails under CI=true).

mod e2e;
mod gluster_cluster;
mod presence_watch;
mod support;

use std::time::{Duration, Instant};

use e2e::PATIENCE;
use gluster_cluster::*;
use presence_watch::Watch;
use support::Serve;

const DEBOUNCE_MS: u64 = 1000;
const PASS_MS: u64 = 100;

fn host(root: &std::path::Path) -> Serve {
    let mut command = Serve::command(root, None);
    command.args(["--public-url", PUBLIC_URL]).env("KN_RESERVE_BYTES", "0").env_remove("KN_SHARED");
    command.env("KN_PRESENCE_DEBOUNCE_MS", DEBOUNCE_MS.to_string()).env("KN_PRESENCE_PASS_MS", PASS_MS.to_string());
    Serve::spawn(command)
}

#[test]
fn presence_across_two_hosts_of_a_glusterfs_volume() {
    if !gate() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let started = Instant::now();
    let mut cluster = Cluster::start("presence");
    let required: Vec<(&str, &str)> = kn_journal::internal::GLUSTER_VOLUME_OPTIONS.iter().map(|&(o, v, _)| (o, v)).collect();
    let volume = cluster.volume("p", &required);
    let mount_a = cluster.mount(&volume, "a", MOUNT_OPTIONS);
    let mount_b = cluster.mount(&volume, "b", MOUNT_OPTIONS);
    eprintln!("cluster up in {:.1} s", started.elapsed().as_secs_f64());
    let a = host(&mount_a.join("kn_events"));
    let mut b = host(&mount_b.join("kn_events"));
    e2e::route(&a, "/chat", "/who/x/kn_journal", "rx", "");
    e2e::route(&b, "/chat", "/who/y/kn_journal", "ry", "");

    let mut on_a = Watch::tunnel(&a, "/chat/kn_presence", "");
    let mut on_b = Watch::tunnel(&b, "/chat/kn_presence", "");
    let x = Watch::tunnel(&a, "/who/x/kn_journal", "");
    let _y = Watch::tunnel(&b, "/who/y/kn_journal", "");
    let joined = Instant::now();
    for w in [&mut on_a, &mut on_b] {
        w.presence("join", "/who/x/kn_journal", PATIENCE).expect("x (on host a) joined");
        w.presence("join", "/who/y/kn_journal", PATIENCE).expect("y (on host b) joined");
    }
    eprintln!("both joins on both hosts {:?} after the tunnels opened", joined.elapsed());

    // x's tunnel closes on host a: both hosts see it leave.
    x.close();
    let closed = Instant::now();
    for w in [&mut on_a, &mut on_b] {
        w.presence("leave", "/who/x/kn_journal", PATIENCE).expect("x left");
    }
    eprintln!("x's leave on both hosts {:?} after its tunnel closed", closed.elapsed());

    // Host b's server dies (SIGKILL, with y's tunnel): y leaves, on a.
    b.child.kill().unwrap();
    let _ = b.child.wait();
    let killed = Instant::now();
    on_a.presence("leave", "/who/y/kn_journal", PATIENCE).expect("y left with its host's server");
    let took = killed.elapsed();
    eprintln!("y's leave on host a {took:?} after host b's server was SIGKILLed (debounce {DEBOUNCE_MS} ms, pass {PASS_MS} ms)");
    assert!(took >= Duration::from_millis(DEBOUNCE_MS), "left before the debounce: {took:?}");
}
