//! Processes: whether one lives, waiting for a condition, file owners.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};



/// Whether process `pid` exists (and is not a zombie awaiting its parent).
pub fn process_alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')).unwrap_or(true),
        Err(_) => false,
    }
}

/// Waits up to `limit` for `cond`; true if it became true.
pub fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(25));
    }
}


/// The inode owner of `path` (for tests about file ownership).
pub fn owner(path: &Path) -> Option<u32> {
    fs::metadata(path).ok().map(|m| m.uid())
}

/// Runs `cmd` with `stdin` written to its standard input and collects its
/// output; panics (after killing it) if it is still running after `limit`.
/// A program may exit without reading all of its input (bad usage): a
/// broken pipe then is not the test's failure.
pub fn run_with_stdin(cmd: &mut Command, stdin: &[u8], limit: Duration) -> Output {
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let mut input = child.stdin.take().expect("stdin");
    let data = stdin.to_vec();
    let writer = thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let collect = |mut from: Box<dyn Read + Send>| {
        thread::spawn(move || {
            let mut all = Vec::new();
            let _ = from.read_to_end(&mut all);
            all
        })
    };
    let stdout = collect(Box::new(child.stdout.take().expect("stdout")));
    let stderr = collect(Box::new(child.stderr.take().expect("stderr")));
    let Some(status) = wait_exit(&mut child, limit) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{cmd:?} did not exit within {limit:?}");
    };
    let _ = writer.join();
    Output { status, stdout: stdout.join().unwrap_or_default(), stderr: stderr.join().unwrap_or_default() }
}

/// A scratch directory named `<prefix>…`, on tmpfs when there is one: tests
/// that create thousands of files stay fast even on a disk that other test
/// suites churn.
pub fn scratch(prefix: &str) -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = tempfile::Builder::new().prefix(prefix).tempdir_in(shm) {
            return dir;
        }
    }
    tempfile::tempdir().expect("create temporary directory")
}

/// Waits up to `limit` for `child` to exit; its status, or `None` if it is
/// still running then.
pub fn wait_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("wait for child") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// A small tmpfs mounted for one test (root only), unmounted when dropped.
pub struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs with `options` (e.g. `size=4m,mode=0755`) on `path`
    /// (created if needed). When this machine cannot mount, the test is
    /// skipped ([`crate::skip()`]: a failure under `CI=true`) and this
    /// returns `None`.
    pub fn mount(path: &Path, options: &str) -> Option<Tmpfs> {
        let why = match fs::create_dir_all(path) {
            Err(e) => format!("cannot create {}: {e}", path.display()),
            Ok(()) => match Command::new("mount").args(["-t", "tmpfs", "-o", options, "tmpfs"]).arg(path).output() {
                Ok(o) if o.status.success() => return Some(Tmpfs { path: path.to_path_buf() }),
                Ok(o) => format!("mount failed ({}): {}", o.status, String::from_utf8_lossy(&o.stderr).trim()),
                Err(e) => format!("cannot run mount: {e}"),
            },
        };
        crate::skip(&format!("cannot mount a tmpfs (needs root): {why}"));
        None
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount").arg(&self.path).status().map(|s| s.success()).unwrap_or(false);
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        }
    }
}
