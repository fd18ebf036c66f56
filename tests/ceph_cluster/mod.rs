//! A CephFS on this machine for tests (tests/ceph.rs): one monitor, one
//! memstore OSD, one MDS and one mgr in a network namespace of their own on a
//! bridge, and each "host" a namespace of its own linked to that bridge
//! whose `ceph-fuse` mounts the file system in a scratch directory; this
//! process's namespace is on the bridge too (`HOST_NET.254`). The
//! mgr is needed for its space figures (without it a mount's statfs says
//! 0 bytes free); no authentication, nothing
//! on the machine's own interfaces; all torn down by `Drop`.
//! ../shared/notes/cephfs-on-one-machine.md has the sequence and what
//! holds across mounts. The parts every cluster shares (namespaces,
//! veths, bounded commands, unmounting) are in `kn_test_support::cluster`.

#![allow(dead_code)]

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kn_test_support::cluster::{self as common, run};

use crate::support::{self, Dir};

/// The cluster's address (on its namespace's bridge) and the hosts'
/// (`HOST_NET.1N`): the benchmarking range, as the GlusterFS tests use,
/// in a subnet of its own.
pub const SERVER: &str = "198.18.1.1";
pub const HOST_NET: &str = "198.18.1";

/// One cluster at a time: they use the same addresses.
pub static SERIAL: Mutex<()> = Mutex::new(());

pub fn tools_missing() -> Option<String> {
    common::tools_missing(&[
        ("ip", "iproute2"),
        ("nsenter", "util-linux"),
        ("ceph-mon", "ceph-mon"),
        ("ceph-mgr", "ceph-mgr"),
        ("ceph-osd", "ceph-osd"),
        ("ceph-mds", "ceph-mds"),
        ("ceph-fuse", "ceph-fuse"),
        ("ceph", "ceph-common"),
        ("monmaptool", "ceph-common"),
    ])
}

pub fn gate() -> bool {
    if let Some(why) = tools_missing() {
        support::skip(&why);
        return false;
    }
    true
}

/// A daemon of the cluster or a host's client, killed by the guard.
struct Daemon {
    name: String,
    child: Child,
}

/// The cluster with its hosts' mounts. Dropping it unmounts, kills every
/// daemon it started (by its `Child`), and deletes the namespaces.
pub struct Cluster {
    pub dir: Dir,
    pub tag: String,
    pub conf: PathBuf,
    /// The hosts' mount points, in order.
    pub mounts: Vec<PathBuf>,
    daemons: Vec<Daemon>,
    namespaces: Vec<String>,
    pub started: Instant,
    /// The hosts' relay files of `.changes` there before the cluster.
    relays_before: HashSet<PathBuf>,
}

impl Cluster {
    /// The server namespace's name.
    pub fn server_ns(&self) -> String {
        format!("{}s", self.tag)
    }

    /// Host `i`'s (1-based) namespace's name.
    pub fn host_ns(&self, i: usize) -> String {
        format!("{}h{i}", self.tag)
    }

    /// Brings up the cluster and `hosts` mounts (1 to 9).
    pub fn start(name: &str, hosts: usize) -> Cluster {
        let tag = format!("knc{}", std::process::id() % 100_000);
        let dir = Dir::new(name);
        let conf = dir.join("ceph.conf");
        let mut cluster = Cluster {
            dir,
            tag,
            conf,
            mounts: Vec::new(),
            daemons: Vec::new(),
            namespaces: Vec::new(),
            started: Instant::now(),
            relays_before: common::relays(),
        };
        cluster.network(hosts).unwrap();
        cluster.write_conf();
        cluster.bring_up();
        for i in 1..=hosts {
            cluster.mount(i);
        }
        cluster
    }

    fn network(&mut self, hosts: usize) -> Result<(), String> {
        let srv = self.server_ns();
        common::add_namespace(&srv)?;
        self.namespaces.push(srv.clone());
        common::sh(&["ip", "-n", &srv, "link", "add", "br0", "type", "bridge"])?;
        common::sh(&["ip", "-n", &srv, "addr", "add", &format!("{SERVER}/24"), "dev", "br0"])?;
        common::sh(&["ip", "-n", &srv, "link", "set", "br0", "up"])?;
        // This namespace's link to the bridge: `kn doctor`, the self-test
        // and the tests' `ceph` commands reach the cluster from here.
        common::veth(None, &format!("{}r", self.tag), Some(&format!("{HOST_NET}.254/24")), &srv, "vr", None)?;
        common::sh(&["ip", "-n", &srv, "link", "set", "vr", "master", "br0"])?;
        for i in 1..=hosts {
            let ns = self.host_ns(i);
            common::add_namespace(&ns)?;
            self.namespaces.push(ns.clone());
            let end = format!("v{i}");
            common::veth(Some(&srv), &end, None, &ns, "eth0", Some(&format!("{HOST_NET}.{}/24", 10 + i)))?;
            common::sh(&["ip", "-n", &srv, "link", "set", &end, "master", "br0"])?;
        }
        Ok(())
    }

    fn write_conf(&self) {
        let base = self.dir.path().display().to_string();
        let fsid = std::fs::read_to_string("/proc/sys/kernel/random/uuid").unwrap().trim().to_string();
        let text = format!(
            "[global]\nfsid = {fsid}\nmon_host = [v2:{SERVER}:3300,v1:{SERVER}:6789]\npublic_network = {HOST_NET}.0/24\n\
             ms_bind_ipv4 = true\nms_bind_ipv6 = false\n\
             auth_cluster_required = none\nauth_service_required = none\nauth_client_required = none\n\
             run_dir = {base}/run\nadmin_socket = {base}/run/$name.$pid.asok\nlog_file = {base}/log/$name.log\n\
             crash_dir = {base}/crash\nmon_data = {base}/mon/$id\nosd_data = {base}/osd/$id\nmds_data = {base}/mds/$id\nmgr_data = {base}/mgr/$id\n\
             osd_objectstore = memstore\nmemstore_device_bytes = 1073741824\n\
             osd_pool_default_size = 1\nosd_pool_default_min_size = 1\nosd_pool_default_pg_num = 8\nosd_pool_default_pgp_num = 8\n\
             osd_pool_default_pg_autoscale_mode = off\nosd_crush_chooseleaf_type = 0\nmon_allow_pool_size_one = true\n\
             mon_warn_on_pool_no_redundancy = false\nmon_data_avail_warn = 2\nmon_data_avail_crit = 1\nmgr_initial_modules =\n\
             [mds]\n# The MDS flushes its journal once a tick: at the default 5 s a create stalls\n\
             # ~5 s while another mount watches the directory (the notes, docs/SCALE-OUT.md).\n\
             mds_tick_interval = 0.02\n[client]\nclient_mount_timeout = 30\n"
        );
        for d in ["run", "log", "crash", "mon/a", "osd/0", "mds/a", "mgr/x"] {
            std::fs::create_dir_all(self.dir.join(d)).unwrap();
        }
        std::fs::write(&self.conf, text).unwrap();
    }

    /// `cmd` in namespace `ns` (its network only: the mounts stay
    /// visible to every process).
    pub fn in_ns(ns: &str, program: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{ns}")).arg(program);
        c
    }

    /// The `ceph` CLI against this cluster, from the server namespace.
    pub fn ceph(&self, args: &[&str]) -> Result<String, String> {
        run(Cluster::in_ns(&self.server_ns(), "ceph").arg("-c").arg(&self.conf).args(["--connect-timeout", "10"]).args(args))
    }

    fn spawn(&mut self, name: &str, ns: &str, program: &str, args: &[&str]) {
        let log = std::fs::File::create(self.dir.join(&format!("log/{name}.out"))).unwrap();
        let child = Cluster::in_ns(ns, program)
            .arg("-c")
            .arg(&self.conf)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program}: {e}"));
        self.daemons.push(Daemon { name: name.to_string(), child });
    }

    fn wait(&self, what: &str, limit: Duration, mut ready: impl FnMut() -> bool) {
        assert!(support::wait_for(limit, &mut ready), "CephFS bring-up: no {what} within {limit:?}; logs in {}", self.dir.path().display());
    }

    fn bring_up(&mut self) {
        let srv = self.server_ns();
        let fsid = std::fs::read_to_string(&self.conf).unwrap().lines().find_map(|l| l.strip_prefix("fsid = ").map(str::to_string)).unwrap();
        let monmap = self.dir.join("monmap");
        let keyring = self.dir.join("mon.keyring");
        common::sh(&["monmaptool", "--create", "--clobber", "--fsid", &fsid, "--addv", "a", &format!("[v2:{SERVER}:3300,v1:{SERVER}:6789]"), &monmap.to_string_lossy()]).unwrap();
        common::sh(&["ceph-authtool", "--create-keyring", &keyring.to_string_lossy(), "--gen-key", "-n", "mon.", "--cap", "mon", "allow *"]).unwrap();
        // mkfs inside the namespace: it looks for an address of public_network.
        run(Cluster::in_ns(&srv, "ceph-mon").arg("-c").arg(&self.conf).args(["--mkfs", "-i", "a", "--monmap"]).arg(&monmap).arg("--keyring").arg(&keyring)).unwrap();
        self.spawn("mon.a", &srv, "ceph-mon", &["-i", "a", "-f"]);
        self.wait("monitor", Duration::from_secs(60), || self.ceph(&["mon", "stat"]).is_ok());
        let uuid = std::fs::read_to_string("/proc/sys/kernel/random/uuid").unwrap().trim().to_string();
        let id = self.ceph(&["osd", "new", &uuid]).unwrap();
        assert_eq!(id.trim(), "0", "osd new");
        run(Cluster::in_ns(&srv, "ceph-osd").arg("-c").arg(&self.conf).args(["-i", "0", "--mkfs", "--osd-uuid", &uuid])).unwrap();
        self.spawn("osd.0", &srv, "ceph-osd", &["-i", "0", "-f"]);
        self.spawn("mds.a", &srv, "ceph-mds", &["-i", "a", "-f"]);
        // The mgr (no modules): without it the cluster reports no space,
        // a mount's statfs says 0 bytes free, and every post is refused
        // as "disk full" below the reserve.
        self.spawn("mgr.x", &srv, "ceph-mgr", &["-i", "x", "-f"]);
        self.wait("OSD up", Duration::from_secs(60), || self.ceph(&["osd", "dump"]).is_ok_and(|t| t.lines().any(|l| l.starts_with("osd.0 up"))));
        let _ = self.ceph(&["osd", "pool", "create", "cephfs_metadata", "8"]);
        let _ = self.ceph(&["osd", "pool", "create", "cephfs_data", "8"]);
        self.ceph(&["fs", "new", "cephfs", "cephfs_metadata", "cephfs_data"]).unwrap();
        self.wait("active MDS", Duration::from_secs(90), || self.ceph(&["mds", "stat"]).is_ok_and(|t| t.contains("up:active")));
        self.wait("space reported by the mgr", Duration::from_secs(90), || {
            self.ceph(&["df", "-f", "json"]).is_ok_and(|t| !t.contains("\"total_bytes\":0,") && t.contains("\"total_bytes\":"))
        });
    }

    /// Mounts the file system for host `i` (1-based) with `ceph-fuse` in
    /// the host's namespace.
    pub fn mount(&mut self, i: usize) -> PathBuf {
        let point = self.dir.create_dir(&format!("mnt-h{i}"));
        let ns = self.host_ns(i);
        let p = point.to_string_lossy().into_owned();
        self.spawn(&format!("fuse.h{i}"), &ns, "ceph-fuse", &["-f", "--id", "admin", &p]);
        self.wait(&format!("mount of host {i}"), Duration::from_secs(60), || is_mount_point(&point));
        if self.mounts.len() < i {
            self.mounts.resize(i, PathBuf::new());
        }
        self.mounts[i - 1] = point.clone();
        point
    }

    /// SIGKILLs the MDS, starts it again and waits until it is active:
    /// how long the file system had no MDS.
    pub fn restart_mds(&mut self, down_for: Duration) -> Duration {
        let at = self.daemons.iter().position(|d| d.name == "mds.a").expect("the MDS");
        let mut old = self.daemons.remove(at);
        let _ = old.child.kill();
        let _ = old.child.wait();
        let killed = Instant::now();
        std::thread::sleep(down_for);
        let srv = self.server_ns();
        self.spawn("mds.a", &srv, "ceph-mds", &["-i", "a", "-f"]);
        self.wait("active MDS after its restart", Duration::from_secs(120), || self.ceph(&["mds", "stat"]).is_ok_and(|t| t.contains("up:active")));
        killed.elapsed()
    }

    /// Sets `mds_tick_interval` on the running MDS (the doctor checks it).
    pub fn set_mds_tick(&self, seconds: &str) {
        self.ceph(&["tell", "mds.a", "config", "set", "mds_tick_interval", seconds]).unwrap();
    }

    /// The pid of a daemon the cluster started (`mds.a`, `fuse.h2`).
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.daemons.iter().find(|d| d.name == name).map(|d| d.child.id())
    }
}

/// True when `point` is a mount point now (its device differs from its
/// parent's).
pub fn is_mount_point(point: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = point.to_string_lossy();
    mounts.lines().any(|l| l.split(' ').nth(4) == Some(&*want))
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for point in self.mounts.iter().rev() {
            if !point.as_os_str().is_empty() {
                common::unmount(point, "ceph-fuse");
            }
        }
        // Clients first (they end with their mounts), then the daemons:
        // the state is thrown away, so no orderly shutdown.
        for daemon in self.daemons.iter_mut().rev() {
            let _ = daemon.child.kill();
            if support::wait_exit(&mut daemon.child, Duration::from_secs(10)).is_none() {
                eprintln!("{} (pid {}) did not die", daemon.name, daemon.child.id());
            }
        }
        for ns in self.namespaces.iter().rev() {
            common::delete_namespace(ns);
        }
        for relay in common::relays().difference(&self.relays_before) {
            let _ = std::fs::remove_file(relay);
        }
    }
}
