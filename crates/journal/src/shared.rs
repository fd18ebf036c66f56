//! Shared mode: is the store on a file system that several hosts mount at
//! once (FUSE, NFS), and what can be checked of that mount's settings
//! (docs/SCALE-OUT.md, docs/DEPLOY.md "Several web servers on one store").

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::config::Shared;

#[path = "shared_ceph.rs"]
mod ceph;

const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;
const NFS_SUPER_MAGIC: i64 = 0x6969;
/// The kernel CephFS client's `statfs` type; `ceph-fuse` shows as FUSE.
const CEPH_SUPER_MAGIC: i64 = 0x00C3_6400;

/// The file system a store lives on, as `statfs(2)` and `/proc/mounts`
/// describe it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileSystem {
    /// `f_type` of `statfs(2)` (0 when it failed).
    pub magic: i64,
    /// A readable name: the `/proc/mounts` type when known (e.g.
    /// `fuse.glusterfs`), else the name of `magic`.
    pub name: String,
    /// The mount point holding the store (from `/proc/mounts`), if found.
    pub mount_point: Option<PathBuf>,
    /// The mounted source (`198.18.0.1:/gt`), if found.
    pub source: Option<String>,
    /// The mount options of `/proc/mounts`, if found.
    pub options: Option<String>,
}

impl FileSystem {
    /// The file system holding `path` (which must exist), whose
    /// `statfs` type is `magic` (see [`magic_of`]).
    pub fn of(path: &Path, magic: i64) -> FileSystem {
        let absolute = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let mount = std::fs::read_to_string("/proc/mounts").ok().and_then(|text| mount_of(&text, &absolute));
        let name = match &mount {
            Some((_, _, kind, _)) => kind.clone(),
            None => magic_name(magic).to_string(),
        };
        let (mount_point, source, options) = match mount {
            Some((point, source, _, options)) => (Some(point), Some(source), Some(options)),
            None => (None, None, None),
        };
        FileSystem { magic, name, mount_point, source, options }
    }

    /// True on a network file system that several hosts may mount (FUSE,
    /// NFS, CephFS): what `Shared::Auto` turns shared mode on for.
    pub fn is_network(&self) -> bool {
        is_network_magic(self.magic)
    }

    /// True when the mount is CephFS: the kernel client (`statfs` type
    /// 0x00C36400, `/proc/mounts` type `ceph`) or `ceph-fuse` (FUSE, type
    /// `fuse.ceph-fuse`, or `fuse.ceph` as some versions name it).
    pub fn is_cephfs(&self) -> bool {
        self.magic == CEPH_SUPER_MAGIC || matches!(self.name.as_str(), "ceph" | "fuse.ceph-fuse" | "fuse.ceph")
    }

    /// True when the mount is a GlusterFS FUSE mount.
    pub fn is_glusterfs(&self) -> bool {
        self.name == "fuse.glusterfs"
    }
}

/// The `statfs(2)` type (`f_type`) of the file system holding `path`; 0
/// when it cannot be had.
pub fn magic_of(path: &Path) -> i64 {
    statfs_type(path).unwrap_or(0)
}

/// Whether shared mode applies to a store on a file system of type
/// `magic` with the setting `shared`.
pub(crate) fn resolve(shared: Shared, magic: i64) -> bool {
    match shared {
        Shared::On => true,
        Shared::Off => false,
        Shared::Auto => is_network_magic(magic),
    }
}

fn is_network_magic(magic: i64) -> bool {
    magic == FUSE_SUPER_MAGIC || magic == NFS_SUPER_MAGIC || magic == CEPH_SUPER_MAGIC
}

fn statfs_type(path: &Path) -> Option<i64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut buf: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `buf` a statfs to fill.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut buf) };
    (rc == 0).then_some(buf.f_type as i64)
}

fn magic_name(magic: i64) -> &'static str {
    match magic {
        0xEF53 => "ext4",
        0x0102_1994 => "tmpfs",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x794C_7630 => "overlay",
        0x2FC1_2FC1 => "zfs",
        FUSE_SUPER_MAGIC => "fuse",
        NFS_SUPER_MAGIC => "nfs",
        CEPH_SUPER_MAGIC => "ceph",
        _ => "unknown",
    }
}

/// The `/proc/mounts` line whose mount point is the longest prefix of
/// `path`: (mount point, source, type, options).
fn mount_of(text: &str, path: &Path) -> Option<(PathBuf, String, String, String)> {
    let mut best: Option<(PathBuf, String, String, String)> = None;
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 4 {
            continue;
        }
        let point = PathBuf::from(unescape_mount(f[1]));
        if !path.starts_with(&point) {
            continue;
        }
        if best.as_ref().is_none_or(|(b, ..)| point.as_os_str().len() >= b.as_os_str().len()) {
            best = Some((point, f[0].to_string(), f[2].to_string(), f[3].to_string()));
        }
    }
    best
}

/// `/proc/mounts` writes a space as `\040` (and tab, newline, backslash
/// alike).
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One thing checked about a shared store's mount or volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountCheck {
    /// `Some(true)` when the setting is right, `Some(false)` when it is
    /// wrong, `None` when it could not be verified.
    pub ok: Option<bool>,
    /// The setting (`performance.write-behind`, `attribute-timeout`).
    pub setting: String,
    /// What was found, or why it could not be verified.
    pub found: String,
    /// What is required.
    pub required: String,
}

/// The GlusterFS volume options that shared mode needs: (option,
/// required value, GlusterFS 10's default). docs/DEPLOY.md says what goes
/// wrong without each.
pub const GLUSTER_VOLUME_OPTIONS: &[(&str, &str, &str)] = &[
    ("performance.write-behind", "off", "on"),
    ("performance.read-ahead", "off", "off"),
    ("performance.io-cache", "off", "off"),
    ("performance.quick-read", "off", "on"),
    ("performance.open-behind", "off", "on"),
    ("performance.stat-prefetch", "off", "on"),
    ("performance.readdir-ahead", "off", "off"),
    ("cluster.eager-lock", "off", "on"),
];

/// The GlusterFS FUSE client (mount) options that shared mode needs:
/// (option, required value, the client's default).
pub const GLUSTER_MOUNT_OPTIONS: &[(&str, &str, &str)] = &[
    ("attribute-timeout", "0", "1"),
    ("entry-timeout", "0", "1"),
    ("negative-timeout", "0", "0"),
    ("auto-invalidation", "on", "on"),
    ("fopen-keep-cache", "off", "off"),
];

/// What can be verified of the mount and volume settings of `fs`: on a
/// GlusterFS mount, the FUSE client's options (from its command line in
/// `/proc`) and the volume's options (`gluster volume get`, when the CLI
/// is installed and answers within a few seconds). Empty on other file
/// systems.
pub fn check_mount(fs: &FileSystem) -> Vec<MountCheck> {
    if fs.is_cephfs() {
        return ceph::check_mount(fs);
    }
    if !fs.is_glusterfs() {
        return Vec::new();
    }
    let mut checks = Vec::new();
    let args = fs.mount_point.as_deref().and_then(client_args);
    for &(name, want, default) in GLUSTER_MOUNT_OPTIONS {
        let found = args.as_ref().map(|args| {
            let given = args.iter().find_map(|a| {
                let v = a.strip_prefix(&format!("--{name}"))?;
                // `--fopen-keep-cache` alone means on.
                if v.is_empty() { Some("on".to_string()) } else { v.strip_prefix('=').map(str::to_string) }
            });
            given.unwrap_or_else(|| default.to_string())
        });
        let same = |v: &str| v == want || (want == "on" && matches!(v, "true" | "yes" | "1")) || (want == "off" && matches!(v, "false" | "no" | "0"));
        checks.push(match found {
            Some(v) => MountCheck { ok: Some(same(&v)), setting: name.to_string(), found: v, required: want.to_string() },
            None => MountCheck {
                ok: None,
                setting: name.to_string(),
                found: "the glusterfs client process of this mount was not found".to_string(),
                required: want.to_string(),
            },
        });
    }
    let volume = fs.source.as_deref().and_then(|s| s.split_once(":/"));
    let values = volume.map(|(host, vol)| volume_options(host, vol));
    for &(name, want, default) in GLUSTER_VOLUME_OPTIONS {
        checks.push(match &values {
            Some(Ok(map)) => match map.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str()).or(Some(default)) {
                Some(v) => MountCheck {
                    ok: Some(v == want || (want == "off" && v == "disable")),
                    setting: name.to_string(),
                    found: v.to_string(),
                    required: want.to_string(),
                },
                None => MountCheck { ok: None, setting: name.to_string(), found: "not listed".into(), required: want.into() },
            },
            Some(Err(why)) => MountCheck { ok: None, setting: name.to_string(), found: why.clone(), required: want.into() },
            None => MountCheck { ok: None, setting: name.to_string(), found: "no volume in the mount source".into(), required: want.into() },
        });
    }
    checks
}

/// The command line of the `glusterfs` client process serving the mount
/// at `point` (its last argument is the mount point).
fn client_args(point: &Path) -> Option<Vec<String>> {
    let want = point.to_string_lossy();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let args: Vec<String> = raw.split(|&b| b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        let is_client = args.first().is_some_and(|a| a.ends_with("glusterfs"));
        if is_client && args.last().is_some_and(|a| *a == want) {
            return Some(args);
        }
    }
    None
}

/// The options of `volume` with their values: `gluster volume get
/// VOLUME all` of the local glusterd (on a server node), else the options
/// set on it (`volume info`, "Options Reconfigured") as `host`'s glusterd
/// tells them (an option not listed there has its default).
fn volume_options(host: &str, volume: &str) -> Result<Vec<(String, String)>, String> {
    if let Ok(text) = gluster(&["volume", "get", volume, "all"]) {
        return Ok(text
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                Some((f.next()?.to_string(), f.next()?.to_string()))
            })
            .collect());
    }
    let text = gluster(&[&format!("--remote-host={host}"), "volume", "info", volume])?;
    Ok(text
        .lines()
        .skip_while(|l| !l.starts_with("Options Reconfigured"))
        .skip(1)
        .filter_map(|l| l.split_once(": ").map(|(k, v)| (k.trim().to_string(), v.trim().to_string())))
        .collect())
}

/// Runs the gluster CLI with `args` (within 10 s): its standard output.
fn gluster(args: &[&str]) -> Result<String, String> {
    let mut all = vec!["--mode=script", "--timeout=5"];
    all.extend(args);
    run_cli("gluster", &all)
}

/// Runs the CLI `program` (gluster, ceph) with `args`, for at most 10 s:
/// its standard output.
fn run_cli(program: &str, args: &[&str]) -> Result<String, String> {
    let mut child = Command::new(program)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run the {program} CLI: {e}"))?;
    let mut out = child.stdout.take();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(out) = out.as_mut() {
            use std::io::Read;
            let _ = out.read_to_string(&mut text);
        }
        text
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("the {program} CLI did not answer within 10 s"));
            }
        }
    };
    let text = reader.join().unwrap_or_default();
    if !status.success() {
        return Err(format!("{program} {} failed ({status})", args.join(" ")));
    }
    Ok(text)
}

/// One line on the store's file system and mode, for `kn doctor` and the
/// self-test: `fuse.glusterfs (198.18.0.1:/gt on /mnt/a): shared mode
/// (KN_SHARED=auto)`.
pub fn describe(fs: &FileSystem, shared: bool, requested: Shared) -> String {
    let setting = match requested {
        Shared::Auto => "auto",
        Shared::On => "on",
        Shared::Off => "off",
    };
    let place = match (&fs.source, &fs.mount_point) {
        (Some(source), Some(point)) => format!(" ({source} on {})", point.display()),
        _ => String::new(),
    };
    let mode = if shared { "shared mode" } else { "local mode" };
    format!("{}{place}: {mode} (KN_SHARED={setting})", fs.name)
}

/// Appends `bytes`, whole lines each ended by a newline, at the end of
/// `file` as `fstat` gives it now, with `pwrite`: the caller holds an
/// exclusive lock that every writer of the file takes, threads of one
/// process included (an `flock` of a file opened for the call: between
/// the size read and the write, another append would land at the same
/// end and one of the two would be lost). Never `O_APPEND` (`file` must
/// not be opened with it, or Linux writes at its own idea of the end):
/// on CephFS an `O_APPEND` write from one mount lands at that client's
/// cached end, and two mounts appending in turn overwrite each other's
/// records even under a lock with `fsync` (docs/SCALE-OUT.md, "What each
/// engine must give"); the size read under the lock is the one the MDS
/// hands with the lock's capabilities.
///
/// A tail after the last newline is a line cut short (a writer killed
/// mid-write, a full disk): it is cut off and `bytes` written in its
/// place, so that it is never glued to the first new line and read as
/// one (a record lost, another made up). `file` must be open for
/// reading too.
pub fn append(file: &std::fs::File, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let size = file.metadata()?.len();
    #[cfg(test)]
    between_size_and_write();
    let end = end_of_lines(file, size)?;
    if end < size {
        file.set_len(end)?;
    }
    file.write_all_at(bytes, end)
}

#[cfg(test)]
thread_local! {
    /// Run by [`append`] on this thread between its size read and its
    /// write (tests: what another writer could do there).
    pub(crate) static BETWEEN_SIZE_AND_WRITE: std::cell::RefCell<Option<Box<dyn FnMut()>>> = const { std::cell::RefCell::new(None) };
}

#[cfg(test)]
fn between_size_and_write() {
    BETWEEN_SIZE_AND_WRITE.with(|hook| {
        if let Some(f) = hook.borrow_mut().as_mut() {
            f()
        }
    });
}

/// The offset just after the last newline in the first `size` bytes of
/// `file` (0 when there is none).
fn end_of_lines(file: &std::fs::File, size: u64) -> std::io::Result<u64> {
    use std::os::unix::fs::FileExt;
    // Most often the last byte is the newline: one byte read.
    let mut chunk = 1;
    let mut end = size;
    let mut buf = [0u8; 4096];
    while end > 0 {
        let start = end.saturating_sub(chunk);
        let part = &mut buf[..(end - start) as usize];
        file.read_exact_at(part, start)?;
        if let Some(i) = part.iter().rposition(|&b| b == b'\n') {
            return Ok(start + i as u64 + 1);
        }
        end = start;
        chunk = buf.len() as u64;
    }
    Ok(0)
}

/// Which `flock` [`lock`] takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LockKind {
    /// `LOCK_EX`: writers.
    Exclusive,
    /// `LOCK_SH`: readers that exclude writers (`.stats`).
    Shared,
}

/// The first pause between two tries of a lock in shared mode; it
/// doubles up to [`LOCK_PAUSE_MAX`].
const LOCK_PAUSE_MIN: Duration = Duration::from_micros(200);
const LOCK_PAUSE_MAX: Duration = Duration::from_millis(4);

/// Takes `file`'s `flock` (`kind`). On a local store it waits in the
/// kernel, as it always has. In shared mode it never does: it tries
/// (`LOCK_NB`), sleeping between tries (0.2 ms doubling to 4 ms), and
/// fails with `TimedOut` after `config.lock_wait` (`KN_LOCK_WAIT_MS`).
/// Each try is one of the process's lock calls on the volume, taken one
/// at a time ([`one_lock_call_at_a_time`]).
///
/// Why never a blocking lock on the volume, and why one lock call at a
/// time: GlusterFS 10's FUSE client registers an interrupt handler for
/// every lock request (`SETLK` as well as `SETLKW`, fuse-bridge.c
/// `fuse_setlk_resume`). When a process is killed while a lock request
/// of one of its threads is in flight, the kernel sends the client an
/// interrupt; the client's handler asks every brick to clear the lock (an
/// `fgetxattr`), while the request's own answer, arriving meanwhile,
/// waits in the client's network thread for that handler to finish
/// (`fuse_interrupt_finish_fop`, `sync`). With two such answers both of
/// the client's network threads (`client.event-threads` 2) are asleep,
/// nobody reads the bricks' answers, and the mount hangs for good: the
/// killed process stays in `D` state, and 42 s later
/// (`network.ping-timeout`) the client drops all its bricks ("Transport
/// endpoint is not connected"). Seen in statedumps and `gdb` backtraces
/// of the client (docs/SCALE-OUT.md). A blocking lock stays in flight
/// for as long as it waits, so it makes that window wide; a try is in
/// flight for one round trip; one try at a time per process means a
/// killed process leaves at most one interrupted lock request, which one
/// network thread is enough to finish.
pub(crate) fn lock(file: &std::fs::File, kind: LockKind, config: &crate::Config) -> std::io::Result<()> {
    if config.shared != Shared::On {
        return match kind {
            LockKind::Exclusive => file.lock(),
            LockKind::Shared => file.lock_shared(),
        };
    }
    try_until_lock_wait(config, || try_lock(file, kind, config))
}

/// Shared mode's wait for a lock: `try_once` until it succeeds, pausing
/// between tries (doubling from `LOCK_PAUSE_MIN` to `LOCK_PAUSE_MAX`), and
/// `TimedOut` once `config.lock_wait` has passed.
fn try_until_lock_wait(config: &crate::Config, mut try_once: impl FnMut() -> std::io::Result<bool>) -> std::io::Result<()> {
    let started = std::time::Instant::now();
    let mut pause = LOCK_PAUSE_MIN;
    loop {
        if try_once()? {
            return Ok(());
        }
        let waited = started.elapsed();
        if waited >= config.lock_wait {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("still locked by another process after {} ms (KN_LOCK_WAIT_MS)", waited.as_millis()),
            ));
        }
        std::thread::sleep(pause.min(config.lock_wait - waited));
        pause = (pause * 2).min(LOCK_PAUSE_MAX);
    }
}

/// Tries `file`'s `flock` (`kind`) once, without waiting: false when
/// another open file holds it. In shared mode the call is one of the
/// process's lock calls on the volume, taken one at a time ([`lock`]).
pub(crate) fn try_lock(file: &std::fs::File, kind: LockKind, config: &crate::Config) -> std::io::Result<bool> {
    let tried = one_lock_call_at_a_time(config, Turn::Try, || match kind {
        LockKind::Exclusive => file.try_lock(),
        LockKind::Shared => file.try_lock_shared(),
    });
    match tried {
        Ok(()) => Ok(true),
        Err(std::fs::TryLockError::WouldBlock) => Ok(false),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

/// Drops `file`'s `flock`; in shared mode one of the process's lock calls
/// on the volume, taken one at a time ([`lock`]), ahead of the tries
/// waiting for their turn: a sibling thread that tries a topic this one
/// holds must not delay the unlock it waits for. An error is left to the
/// close of the file, which drops the lock as well.
pub(crate) fn unlock(file: &std::fs::File, config: &crate::Config) {
    let _ = one_lock_call_at_a_time(config, Turn::Unlock, || file.unlock());
}

/// One byte of a file locked with an open file description lock
/// (`F_OFD_SETLK`, `fcntl(2)`): owned by the open file description, so
/// that two descriptions in one process exclude each other as two
/// processes do, and dropped when the description is closed, however its
/// process ends. The readers' marks (`store/readers.rs`) hold such bytes
/// of one file, one byte per topic read.
///
/// Like [`lock`]: on a local store `wait` waits in the kernel
/// (`F_OFD_SETLKW`); in shared mode it only ever tries, one lock call at
/// a time, until `config.lock_wait`. Without `wait`, one try: false when
/// another open file description holds a conflicting lock.
pub(crate) fn lock_byte(file: &std::fs::File, at: u64, kind: LockKind, wait: bool, config: &crate::Config) -> std::io::Result<bool> {
    let try_once = || one_lock_call_at_a_time(config, Turn::Try, || byte_call(file, at, Some(kind), libc::F_OFD_SETLK));
    if !wait {
        return try_once();
    }
    if config.shared != Shared::On {
        return byte_call(file, at, Some(kind), libc::F_OFD_SETLKW);
    }
    try_until_lock_wait(config, try_once).map(|()| true)
}

/// Releases this open file description's lock on the byte `at` of
/// `file` (see [`lock_byte`]); an error is left to the close of the file.
pub(crate) fn unlock_byte(file: &std::fs::File, at: u64, config: &crate::Config) {
    let _ = one_lock_call_at_a_time(config, Turn::Unlock, || byte_call(file, at, None, libc::F_OFD_SETLK));
}

/// Whether another open file description holds a lock on the byte `at`
/// of `file` that an exclusive one would conflict with (`F_OFD_GETLK`):
/// a test, taking nothing.
pub(crate) fn byte_locked(file: &std::fs::File, at: u64, config: &crate::Config) -> std::io::Result<bool> {
    one_lock_call_at_a_time(config, Turn::Try, || {
        let mut lock = byte_range(at, libc::F_WRLCK);
        // SAFETY: a valid open descriptor and a flock struct the call fills.
        let rc = unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(file), libc::F_OFD_GETLK, &mut lock) };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(lock.l_type != libc::F_UNLCK as libc::c_short)
    })
}

fn byte_range(at: u64, kind: libc::c_int) -> libc::flock {
    // SAFETY: flock is plain data; zero is a valid value of every field
    // (l_pid must be 0 for the OFD commands).
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = libc::off_t::try_from(at).unwrap_or(libc::off_t::MAX - 1);
    lock.l_len = 1;
    lock
}

/// One `fcntl` lock call on the byte `at`: `kind` to lock, `None` to
/// unlock. True when done, false when another description holds it.
fn byte_call(file: &std::fs::File, at: u64, kind: Option<LockKind>, command: libc::c_int) -> std::io::Result<bool> {
    let kind = match kind {
        Some(LockKind::Exclusive) => libc::F_WRLCK,
        Some(LockKind::Shared) => libc::F_RDLCK,
        None => libc::F_UNLCK,
    };
    let lock = byte_range(at, kind);
    loop {
        // SAFETY: a valid open descriptor and a flock struct the call reads.
        let rc = unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(file), command, &lock) };
        if rc == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EACCES) => return Ok(false),
            Some(libc::EINTR) => continue,
            _ => return Err(e),
        }
    }
}

/// Which queue a lock call waits in for its turn: unlocks go first.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Turn {
    Try,
    Unlock,
}

/// The process's turn of lock calls on a shared store: whether one is in
/// flight, and how many calls wait (unlocks go before the tries).
struct Turns {
    busy: bool,
    tries_waiting: usize,
    unlocks_waiting: usize,
}

impl Turns {
    fn waiting(&mut self, turn: Turn) -> &mut usize {
        match turn {
            Turn::Try => &mut self.tries_waiting,
            Turn::Unlock => &mut self.unlocks_waiting,
        }
    }
}

static TURNS: std::sync::Mutex<Turns> = std::sync::Mutex::new(Turns { busy: false, tries_waiting: 0, unlocks_waiting: 0 });
static TURN_FREED: std::sync::Condvar = std::sync::Condvar::new();

fn turns() -> std::sync::MutexGuard<'static, Turns> {
    TURNS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `call`, a lock system call on `config`'s store, alone among the
/// process's lock calls on that store when it is shared ([`lock`] says
/// why), waiting for its `turn`; on a local store it just runs it.
fn one_lock_call_at_a_time<T>(config: &crate::Config, turn: Turn, call: impl FnOnce() -> T) -> T {
    /// Gives the turn back, also if `call` unwinds.
    struct Done;
    impl Drop for Done {
        fn drop(&mut self) {
            turns().busy = false;
            TURN_FREED.notify_all();
        }
    }
    if config.shared != Shared::On {
        return call();
    }
    let mut turns = turns();
    *turns.waiting(turn) += 1;
    while turns.busy || (turn == Turn::Try && turns.unlocks_waiting > 0) {
        turns = TURN_FREED.wait(turns).unwrap_or_else(|p| p.into_inner());
    }
    *turns.waiting(turn) -= 1;
    turns.busy = true;
    drop(turns);
    let _done = Done;
    call()
}

/// Drops this host's cached pages of `file`, so that the next read asks
/// the file server: a FUSE or NFS client may keep pages that another host
/// has since rewritten (the `.head` is rewritten in place), and a lock
/// taken does not invalidate them. A local call; a no-op on a mount
/// without page cache (`direct-io-mode=enable`).
pub(crate) fn drop_cached_pages(file: &std::fs::File) {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid open descriptor; the call reads no memory of ours.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tests of the process's turn of lock calls, one at a time.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// A line cut short at the end (a writer killed mid-write) is
    /// written over by the next append, shorter or longer than it; a
    /// whole file is appended to; a file of one cut line is replaced.
    #[test]
    fn an_append_writes_over_a_line_cut_short() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lines");
        let open = || std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).unwrap();
        for (before, after) in [
            ("", "new\n"),
            ("a\n", "a\nnew\n"),
            ("a\nb\nlong cut line", "a\nb\nnew\n"),
            ("a\nxy", "a\nnew\n"),
            ("cut", "new\n"),
        ] {
            std::fs::write(&path, before).unwrap();
            append(&open(), b"new\n").unwrap();
            assert_eq!(std::fs::read_to_string(&path).unwrap(), after, "after {before:?}");
        }
        let long = format!("a\n{}", "x".repeat(10_000));
        std::fs::write(&path, &long).unwrap();
        append(&open(), b"new\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a\nnew\n");
    }

    #[test]
    fn the_longest_mount_point_holding_the_path_is_chosen() {
        let text = "/dev/sda1 / ext4 rw 0 0\n198.18.0.1:/gt /mnt/g\\040a fuse.glusterfs rw,user_id=0 0 0\n";
        let (point, source, kind, _) = mount_of(text, Path::new("/mnt/g a/kn_events")).unwrap();
        assert_eq!(point, PathBuf::from("/mnt/g a"));
        assert_eq!(source, "198.18.0.1:/gt");
        assert_eq!(kind, "fuse.glusterfs");
        assert_eq!(mount_of(text, Path::new("/srv/x")).unwrap().2, "ext4");
    }

    #[test]
    fn the_shared_setting_takes_auto_on_or_off_and_names_a_bad_value() {
        assert_eq!("auto".parse::<Shared>().unwrap(), Shared::Auto);
        assert_eq!(" on ".parse::<Shared>().unwrap(), Shared::On);
        assert_eq!("off".parse::<Shared>().unwrap(), Shared::Off);
        let e = "yes".parse::<Shared>().unwrap_err();
        assert!(e.to_string().contains("bad shared mode 'yes'"), "{e}");
    }

    #[test]
    fn a_local_store_is_not_shared_by_default() {
        let dir = tempfile::tempdir().unwrap();
        let fs = FileSystem::of(dir.path(), magic_of(dir.path()));
        assert!(!fs.is_network(), "{fs:?}");
        assert!(check_mount(&fs).is_empty());
        let store = crate::Store::open(dir.path()).unwrap();
        assert!(!store.is_shared());
        assert!(store.describe_mode().contains("local mode (KN_SHARED=auto)"), "{}", store.describe_mode());
        let mut config = crate::Config::new(dir.path());
        config.shared = Shared::On;
        assert!(crate::Store::open_with(config).unwrap().is_shared());
    }

    #[test]
    fn auto_is_shared_on_fuse_and_nfs_only() {
        assert!(resolve(Shared::Auto, FUSE_SUPER_MAGIC));
        assert!(resolve(Shared::Auto, NFS_SUPER_MAGIC));
        assert!(!resolve(Shared::Auto, 0xEF53));
        assert!(resolve(Shared::On, 0xEF53));
        assert!(!resolve(Shared::Off, FUSE_SUPER_MAGIC));
    }

    /// In shared mode a lock is tried, never waited for in the kernel:
    /// it is had once its holder lets go within `lock_wait`, and after
    /// `lock_wait` the caller gets an error naming the setting.
    #[test]
    fn a_shared_lock_waits_at_most_lock_wait_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".lock");
        let holder = std::fs::File::create(&path).unwrap();
        let waiter = std::fs::File::open(&path).unwrap();
        let mut config = crate::Config::new(dir.path());
        config.shared = Shared::On;
        config.lock_wait = Duration::from_millis(150);
        holder.lock().unwrap();
        let t = std::time::Instant::now();
        let e = lock(&waiter, LockKind::Shared, &config).unwrap_err();
        assert!(t.elapsed() >= config.lock_wait, "gave up after {:?}", t.elapsed());
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert!(e.to_string().contains("KN_LOCK_WAIT_MS"), "{e}");
        // At the boundary: no wait at all fails at once while it is held.
        config.lock_wait = Duration::ZERO;
        assert_eq!(lock(&waiter, LockKind::Exclusive, &config).unwrap_err().kind(), std::io::ErrorKind::TimedOut);
        // Released within the wait: had.
        config.lock_wait = Duration::from_secs(5);
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(50));
                holder.unlock().unwrap();
            });
            lock(&waiter, LockKind::Exclusive, &config).unwrap();
        });
        assert!(holder.try_lock().is_err(), "the waiter holds it now");
        waiter.unlock().unwrap();
        config.lock_wait = Duration::ZERO;
        lock(&waiter, LockKind::Exclusive, &config).unwrap();
    }

    /// In shared mode a process's lock calls on the volume never overlap
    /// (a killed process then leaves at most one interrupted lock request
    /// to GlusterFS's client); on a local store they run as they come.
    #[test]
    fn shared_mode_makes_one_lock_call_at_a_time() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        use std::sync::atomic::{AtomicUsize, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let most_at_once = |shared: Shared| {
            let mut config = crate::Config::new(dir.path());
            config.shared = shared;
            let (now, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
            std::thread::scope(|s| {
                for _ in 0..8 {
                    s.spawn(|| {
                        for _ in 0..5 {
                            one_lock_call_at_a_time(&config, Turn::Try, || {
                                most.fetch_max(now.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                                std::thread::sleep(Duration::from_millis(2));
                                now.fetch_sub(1, Ordering::SeqCst);
                            });
                        }
                    });
                }
            });
            most.load(Ordering::SeqCst)
        };
        assert_eq!(most_at_once(Shared::On), 1);
        assert!(most_at_once(Shared::Off) > 1, "local lock calls were serialised too");
    }

    /// An unlock waiting for its turn goes before the tries that waited
    /// longer: a thread trying a lock its sibling holds must not delay
    /// the sibling's unlock.
    #[test]
    fn a_waiting_unlock_goes_before_waiting_tries() {
        use std::sync::mpsc;
        let dir = tempfile::tempdir().unwrap();
        let mut config = crate::Config::new(dir.path());
        config.shared = Shared::On;
        let order = std::sync::Mutex::new(Vec::new());
        let wait_until = |done: &dyn Fn(&Turns) -> bool| {
            while !done(&turns()) {
                std::thread::yield_now();
            }
        };
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let (release, held) = mpsc::channel::<()>();
        let config = &config;
        std::thread::scope(|s| {
            s.spawn(move || one_lock_call_at_a_time(config, Turn::Try, || held.recv().unwrap()));
            wait_until(&|t| t.busy);
            for _ in 0..3 {
                s.spawn(|| one_lock_call_at_a_time(config, Turn::Try, || order.lock().unwrap().push("try")));
            }
            wait_until(&|t| t.tries_waiting >= 3);
            s.spawn(|| one_lock_call_at_a_time(config, Turn::Unlock, || order.lock().unwrap().push("unlock")));
            wait_until(&|t| t.unlocks_waiting >= 1);
            release.send(()).unwrap();
        });
        assert_eq!(*order.lock().unwrap(), ["unlock", "try", "try", "try"]);
    }
}
