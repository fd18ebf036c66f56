//! What `kn doctor` and the self-test check of a CephFS mount (the kernel
//! client or `ceph-fuse`): the MDS settings shared mode needs, read with
//! the `ceph` CLI against the cluster the mount's client names
//! (docs/SCALE-OUT.md, "CephFS settings").

use std::path::Path;

use super::{run_cli, FileSystem, MountCheck};

/// The largest `mds_tick_interval` (seconds) shared mode works well
/// with: the MDS flushes its journal once a tick, and a create or rename
/// in a directory another host watches waits for that flush (about 5 s
/// per journal creation at Ceph's default of 5 s; ~19 ms at 0.02).
pub const MDS_TICK_MAX: f64 = 0.1;

/// The checks of a CephFS mount: the MDS tick (`ceph tell mds.*
/// config get mds_tick_interval`, with the configuration file the
/// mount's `ceph-fuse` was started with, else Ceph's default), and the
/// file system's `session_autoclose` (how long a dead host's locks stay
/// held when nobody evicts it), reported.
pub(super) fn check_mount(fs: &FileSystem) -> Vec<MountCheck> {
    let conf = fs.mount_point.as_deref().and_then(client_conf);
    let mut base: Vec<String> = Vec::new();
    if let Some(conf) = &conf {
        base.extend(["-c".to_string(), conf.clone()]);
    }
    base.extend(["--connect-timeout".to_string(), "5".to_string()]);
    let ceph = |args: &[&str]| {
        let mut all: Vec<&str> = base.iter().map(String::as_str).collect();
        all.extend(args);
        run_cli("ceph", &all)
    };
    let required = format!("at most {MDS_TICK_MAX} s (0.02 recommended)");
    let tick = match ceph(&["tell", "mds.*", "config", "get", "mds_tick_interval"]) {
        Ok(text) => match tick_of(&text) {
            Some(t) => MountCheck { ok: Some(t <= MDS_TICK_MAX), setting: "mds_tick_interval".into(), found: format!("{t} s"), required },
            None => MountCheck { ok: None, setting: "mds_tick_interval".into(), found: "not in the MDS's answer".into(), required },
        },
        Err(why) => MountCheck { ok: None, setting: "mds_tick_interval".into(), found: why, required },
    };
    let mut checks = vec![tick];
    if let Ok(text) = ceph(&["fs", "dump"]) {
        if let Some(secs) = text.lines().find_map(|l| l.strip_prefix("session_autoclose")).and_then(|v| v.trim().parse::<u64>().ok()) {
            checks.push(MountCheck {
                ok: Some(true),
                setting: "session_autoclose".into(),
                found: format!("{secs} s"),
                required: "any: a host that dies keeps its locks until the MDS evicts it (this long, or `ceph tell mds.N client evict`)".into(),
            });
        }
    }
    checks
}

/// The largest `mds_tick_interval` in the answer of `ceph tell mds.*
/// config get` (one JSON object per MDS, `"mds_tick_interval": "0.020000"`).
fn tick_of(text: &str) -> Option<f64> {
    text.split("\"mds_tick_interval\"")
        .skip(1)
        .filter_map(|rest| rest.trim_start().strip_prefix(':')?.trim_start().strip_prefix('"')?.split('"').next()?.parse::<f64>().ok())
        .filter(|t| t.is_finite())
        .reduce(f64::max)
}

/// The configuration file (`-c`/`--conf`) of the `ceph-fuse` process
/// serving the mount at `point` (its last argument); None for the kernel
/// client or a client started with the default (`/etc/ceph/ceph.conf`).
fn client_conf(point: &Path) -> Option<String> {
    let want = point.to_string_lossy();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        if !entry.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let args: Vec<String> = raw.split(|&b| b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        if !args.first().is_some_and(|a| a.ends_with("ceph-fuse")) || args.last().is_none_or(|a| *a != want) {
            continue;
        }
        return args.windows(2).find(|w| w[0] == "-c" || w[0] == "--conf").map(|w| w[1].clone());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_tick_of_every_mds_is_taken() {
        assert_eq!(tick_of("{\n    \"mds_tick_interval\": \"0.020000\"\n}\n"), Some(0.02));
        assert_eq!(tick_of("mds.a: {\"mds_tick_interval\": \"0.02\"}\nmds.b: {\"mds_tick_interval\": \"5.000000\"}"), Some(5.0));
        assert_eq!(tick_of("{\"mds_tick_interval\": \"nan\"}"), None);
        assert_eq!(tick_of("Error ENOENT"), None);
    }

    #[test]
    fn a_ceph_mount_is_recognised_by_its_type_or_its_magic() {
        let fuse = FileSystem { magic: 0x6573_5546, name: "fuse.ceph-fuse".into(), mount_point: None, source: None, options: None };
        assert!(fuse.is_cephfs() && fuse.is_network() && !fuse.is_glusterfs());
        let kernel = FileSystem { magic: 0x00C3_6400, name: "ceph".into(), mount_point: None, source: None, options: None };
        assert!(kernel.is_cephfs() && kernel.is_network());
        assert!(super::super::resolve(crate::config::Shared::Auto, 0x00C3_6400), "the kernel client is shared by default");
        let gluster = FileSystem { magic: 0x6573_5546, name: "fuse.glusterfs".into(), mount_point: None, source: None, options: None };
        assert!(!gluster.is_cephfs());
    }
}
