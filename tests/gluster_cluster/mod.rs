//! A GlusterFS cluster on this machine for tests (shared by tests/gluster.rs
//! and tests/presence_gluster.rs): a private glusterd in a network
//! namespace of its own, replica 3 volumes with bricks in a scratch
//! directory, FUSE mounts (the "hosts"), all torn down by `Drop`. See
//! ../shared/notes/glusterfs-on-one-machine.md for the sequence.

#![allow(dead_code)]

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use crate::e2e::PATIENCE;
use crate::support::{self, Dir};

/// The node's address inside its namespace, and the root namespace's end
/// of the veth pair.
pub const NODE: &str = "198.18.0.1";
pub const CLIENT: &str = "198.18.0.254/24";
/// The mount options shared mode needs (DEPLOY.md).
pub const MOUNT_OPTIONS: &str = "attribute-timeout=0,entry-timeout=0,negative-timeout=0";

/// One cluster at a time: they use the same addresses.
pub static SERIAL: Mutex<()> = Mutex::new(());

// ---------------------------------------------------------------------------
// The cluster, torn down by Drop

/// A glusterd in its own network namespace with its volumes and mounts.
/// Dropping it unmounts, stops and deletes the volumes, stops glusterd and
/// every GlusterFS process of its volumes, and deletes the namespace.
pub struct Cluster {
    /// The hosts' relay files of `.changes` (`/dev/shm/kn-changes-*`)
    /// there before the cluster: the others are its stores', removed.
    pub relays_before: HashSet<PathBuf>,
    pub ns: String,
    pub dir: Dir,
    pub volumes: Vec<String>,
    pub mounts: Vec<PathBuf>,
    pub glusterd_pid: Option<u32>,
    pub tag: String,
}

pub use kn_test_support::cluster::{processes, relays, run, sh};

pub fn tools_missing() -> Option<String> {
    kn_test_support::cluster::tools_missing(&[("ip", "iproute2"), ("glusterd", "glusterfs-server"), ("gluster", "glusterfs-server"), ("mount.glusterfs", "glusterfs-client")])
}

impl Cluster {
    pub fn start(name: &str) -> Cluster {
        let tag = format!("kng{}{}", std::process::id() % 100_000, &name[..1]);
        let mut cluster = Cluster {
            relays_before: relays(),
            ns: tag.clone(),
            dir: Dir::new(name),
            volumes: Vec::new(),
            mounts: Vec::new(),
            glusterd_pid: None,
            tag,
        };
        let ns = cluster.ns.clone();
        let (a, b) = (format!("{ns}a"), format!("{ns}b"));
        sh(&["ip", "netns", "add", &ns]).unwrap();
        sh(&["ip", "link", "add", &a, "type", "veth", "peer", "name", &b]).unwrap();
        sh(&["ip", "link", "set", &b, "netns", &ns]).unwrap();
        sh(&["ip", "addr", "add", CLIENT, "dev", &a]).unwrap();
        sh(&["ip", "link", "set", &a, "up"]).unwrap();
        cluster.in_ns(&["ip", "addr", "add", &format!("{NODE}/24"), "dev", &b]).unwrap();
        cluster.in_ns(&["ip", "link", "set", &b, "up"]).unwrap();
        cluster.in_ns(&["ip", "link", "set", "lo", "up"]).unwrap();
        // A private glusterd: its state lives in the scratch directory.
        let work = cluster.dir.create_dir("glusterd");
        let volfile = std::fs::read_to_string("/etc/glusterfs/glusterd.vol")
            .unwrap_or_else(|_| "volume management\n    type mgmt/glusterd\n    option working-directory /var/lib/glusterd\n    option transport-type socket\nend-volume\n".into())
            .replace("/var/lib/glusterd", &work.to_string_lossy());
        let volfile_path = cluster.dir.create("glusterd.vol", volfile);
        let pidfile = cluster.dir.join("glusterd.pid");
        cluster
            .in_ns(&[
                "glusterd",
                "--volfile",
                &volfile_path.to_string_lossy(),
                "-p",
                &pidfile.to_string_lossy(),
                "--log-file",
                &cluster.dir.join("glusterd.log").to_string_lossy(),
            ])
            .unwrap();
        support::wait_for(PATIENCE, || std::fs::read_to_string(&pidfile).is_ok_and(|p| !p.trim().is_empty()));
        cluster.glusterd_pid = std::fs::read_to_string(&pidfile).ok().and_then(|p| p.trim().parse().ok());
        assert!(
            support::wait_for(Duration::from_secs(30), || cluster.gluster(&["volume", "list"]).is_ok()),
            "glusterd did not answer: {}",
            std::fs::read_to_string(cluster.dir.join("glusterd.log")).unwrap_or_default()
        );
        cluster
    }

    pub fn in_ns(&self, args: &[&str]) -> Result<String, String> {
        run(Command::new("ip").args(["netns", "exec", &self.ns]).args(args))
    }

    pub fn gluster(&self, args: &[&str]) -> Result<String, String> {
        run(Command::new("ip").args(["netns", "exec", &self.ns, "gluster", "--mode=script"]).args(args))
    }

    /// Creates and starts a replica 3 volume; `options` set before start.
    pub fn volume(&mut self, name: &str, options: &[(&str, &str)]) -> String {
        let volume = format!("{}{name}", self.tag);
        let bricks: Vec<String> = (1..=3).map(|i| format!("{NODE}:{}", self.dir.join(&format!("{name}-brick{i}")).display())).collect();
        let mut args = vec!["volume", "create", &volume, "replica", "3"];
        args.extend(bricks.iter().map(String::as_str));
        args.push("force");
        self.gluster(&args).unwrap();
        self.volumes.push(volume.clone());
        for (option, value) in options {
            self.gluster(&["volume", "set", &volume, option, value]).unwrap();
        }
        self.gluster(&["volume", "start", &volume]).unwrap();
        volume
    }

    /// Mounts `volume` at a new mount point (a "host") with `options`.
    pub fn mount(&mut self, volume: &str, host: &str, options: &str) -> PathBuf {
        let point = self.dir.create_dir(&format!("mnt-{host}"));
        let source = format!("{NODE}:/{volume}");
        let mut args = vec!["mount", "-t", "glusterfs"];
        if !options.is_empty() {
            args.extend(["-o", options]);
        }
        let point_text = point.to_string_lossy().into_owned();
        args.extend([source.as_str(), point_text.as_str()]);
        let mut last = Ok(String::new());
        let mounted = support::wait_for(Duration::from_secs(30), || {
            last = sh(&args);
            last.is_ok()
        });
        assert!(mounted, "cannot mount {source}: {last:?}");
        self.mounts.push(point.clone());
        point
    }

    /// The pid of the brick process serving `brick` (a path suffix).
    pub fn brick_pid(&self, volume: &str, brick: &str) -> Option<u32> {
        processes().into_iter().find(|(_, cmd)| cmd.contains("glusterfsd") && cmd.contains(volume) && cmd.contains(brick)).map(|(p, _)| p)
    }

    /// Heal entries left on every brick of `volume` (None if unknown).
    pub fn heal_pending(&self, volume: &str) -> Option<u64> {
        let text = self.gluster(&["volume", "heal", volume, "info"]).ok()?;
        let counts: Vec<u64> = text.lines().filter_map(|l| l.strip_prefix("Number of entries:")).filter_map(|n| n.trim().parse().ok()).collect();
        (counts.len() == 3).then(|| counts.iter().sum())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for point in self.mounts.drain(..).rev() {
            kn_test_support::cluster::unmount(&point, "glusterfs");
        }
        for volume in self.volumes.clone() {
            let _ = self.gluster(&["volume", "stop", &volume, "force"]);
            let _ = self.gluster(&["volume", "delete", &volume]);
        }
        if let Some(pid) = self.glusterd_pid {
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            support::wait_for(Duration::from_secs(5), || !support::process_alive(pid));
        }
        // Whatever GlusterFS process of ours is left (bricks, self-heal
        // daemon, clients), by pid: its command line names our scratch
        // directory, our namespace's address with one of our volumes, or
        // our volume's self-heal daemon.
        let dir = self.dir.path().to_string_lossy().into_owned();
        for (pid, cmd) in processes() {
            let ours = cmd.contains(&dir) || self.volumes.iter().any(|v| cmd.contains(&format!("shd/{v}")) || cmd.contains(&format!("/{v} ")) || cmd.contains(&format!("id {v}.")));
            if ours && cmd.contains("gluster") {
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
        for relay in relays().difference(&self.relays_before) {
            let _ = std::fs::remove_file(relay);
        }
        let _ = sh(&["ip", "netns", "del", &self.ns]);
        let _ = sh(&["ip", "link", "del", &format!("{}a", self.ns)]);
    }
}


pub fn gate() -> bool {
    if let Some(why) = tools_missing() {
        support::skip(&why);
        return false;
    }
    true
}
