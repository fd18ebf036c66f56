//! What the clusters of the scale-out tests share (tests/gluster_cluster/
//! and tests/ceph_cluster/): running their command-line tools with a
//! bound, finding their processes by command line, network namespaces
//! with veth links, and unmounting a FUSE mount whose client may hang.
//! Each engine's bring-up stays in its own module.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::process::{wait_exit, wait_for};

/// Runs `cmd` to its end: its standard output, or an error naming the
/// command, its status and what it printed.
pub fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `cmd` for at most `limit`: true when it exited successfully in
/// time; else it is killed (and reaped) and the answer is false.
pub fn run_within(cmd: &mut Command, limit: Duration) -> bool {
    let Ok(mut child) = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn() else { return false };
    match wait_exit(&mut child, limit) {
        Some(status) => status.success(),
        None => {
            let _ = child.kill();
            // A child stuck on a hung FUSE mount dies once the mount's
            // client is gone: reaped then, or left to init.
            let _ = wait_exit(&mut child, Duration::from_secs(1));
            false
        }
    }
}

/// [`run`] of `args[0]` with the rest as its arguments.
pub fn sh(args: &[&str]) -> Result<String, String> {
    run(Command::new(args[0]).args(&args[1..]))
}

/// Every process: (pid, command line with spaces).
pub fn processes() -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else { continue };
        out.push((pid, String::from_utf8_lossy(&raw).replace('\0', " ")));
    }
    out
}

/// The tools a cluster test needs, as (program, Debian package): the
/// first one missing (with root and /dev/fuse, which every such test
/// needs), as a reason to skip.
pub fn tools_missing(tools: &[(&str, &str)]) -> Option<String> {
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (network namespaces, cluster daemons, FUSE mounts)".into());
    }
    for (tool, package) in tools {
        let found = ["/usr/sbin", "/usr/bin", "/sbin", "/bin"].iter().any(|d| Path::new(d).join(tool).exists());
        if !found {
            return Some(format!("{tool} not installed (apt-get install {package})"));
        }
    }
    if !Path::new("/dev/fuse").exists() {
        return Some("no /dev/fuse".into());
    }
    None
}

/// Makes the network namespace `ns` with its loopback up.
pub fn add_namespace(ns: &str) -> Result<(), String> {
    sh(&["ip", "netns", "add", ns])?;
    sh(&["ip", "-n", ns, "link", "set", "lo", "up"]).map(drop)
}

/// Deletes the network namespace `ns` (and with it its end of every veth
/// pair); nothing when it does not exist.
pub fn delete_namespace(ns: &str) {
    let _ = sh(&["ip", "netns", "del", ns]);
}

/// Links namespace `a` (None: this process's) to namespace `b` by a veth
/// pair `a_end`/`b_end`, each end given `a_addr`/`b_addr` (CIDR; None:
/// none, e.g. an end enslaved to a bridge later) and set up.
pub fn veth(a: Option<&str>, a_end: &str, a_addr: Option<&str>, b: &str, b_end: &str, b_addr: Option<&str>) -> Result<(), String> {
    let in_a = |args: &[&str]| -> Result<String, String> {
        let mut all = vec!["ip"];
        if let Some(ns) = a {
            all.extend(["-n", ns]);
        }
        all.extend(args);
        sh(&all)
    };
    in_a(&["link", "add", a_end, "type", "veth", "peer", "name", b_end, "netns", b])?;
    if let Some(addr) = a_addr {
        in_a(&["addr", "add", addr, "dev", a_end])?;
    }
    in_a(&["link", "set", a_end, "up"])?;
    if let Some(addr) = b_addr {
        sh(&["ip", "-n", b, "addr", "add", addr, "dev", b_end])?;
    }
    sh(&["ip", "-n", b, "link", "set", b_end, "up"]).map(drop)
}

/// Unmounts the FUSE mount at `point`: `umount` gets a few seconds (it
/// stats the mount point, which waits for ever on a hung client); if it
/// fails, every process whose command line contains `client` and ends
/// with the mount point (the mount's client) is SIGKILLed, which aborts
/// the FUSE connection so that a process stuck on the mount can exit, and
/// the mount is detached lazily.
pub fn unmount(point: &Path, client: &str) {
    let p = point.to_string_lossy().into_owned();
    let unmounted = wait_for(Duration::from_secs(5), || run_within(Command::new("umount").arg(&p), Duration::from_secs(3)));
    if !unmounted {
        for (pid, cmd) in processes() {
            if cmd.contains(client) && cmd.trim_end().ends_with(&p) {
                eprintln!("the client of {p} (pid {pid}) is hung: killed");
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
        run_within(Command::new("umount").args(["-l", &p]), Duration::from_secs(10));
    }
}

/// The relay and lock files of shared mode in `/dev/shm` (one pair per
/// mount path a store was opened on): a cluster notes them before it
/// starts and removes the ones its hosts made.
pub fn relays() -> HashSet<PathBuf> {
    std::fs::read_dir("/dev/shm")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("kn-changes-"))
        .map(|e| e.path())
        .collect()
}
