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
#[path = "scale_out/presence.rs"]
mod presence_scenario;
mod scale_out;
mod support;

use std::time::Instant;

use gluster_cluster::*;

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
    presence_scenario::presence_across_two_hosts(&mount_a.join("kn_events"), &mount_b.join("kn_events"));
}
