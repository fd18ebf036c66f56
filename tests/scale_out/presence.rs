//! Presence across two hosts of one shared store, the same on every
//! engine (tests/presence_gluster.rs on GlusterFS, tests/ceph.rs on
//! CephFS): a tunnel held on either host shows on both hosts'
//! `kn_presence` watchers, and leaves on both when it closes; a host's
//! server SIGKILLed leaves within the bound, seen from the other host.
//! Needs `mod presence_watch;` and `mod scale_out;` beside it.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::e2e::{self, PATIENCE};
use crate::presence_watch::Watch;
use crate::scale_out::PUBLIC_URL;
use crate::support::Serve;

const DEBOUNCE_MS: u64 = 1000;
const PASS_MS: u64 = 100;

fn host(root: &Path) -> Serve {
    let mut command = Serve::command(root, None);
    command.args(["--public-url", PUBLIC_URL]).env("KN_RESERVE_BYTES", "0").env_remove("KN_SHARED");
    command.env("KN_PRESENCE_DEBOUNCE_MS", DEBOUNCE_MS.to_string()).env("KN_PRESENCE_PASS_MS", PASS_MS.to_string());
    Serve::spawn(command)
}

/// The scenario, with host A's server on `root_a` and host B's on
/// `root_b` (one store seen through two mounts).
pub fn presence_across_two_hosts(root_a: &Path, root_b: &Path) {
    let a = host(root_a);
    let mut b = host(root_b);
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
