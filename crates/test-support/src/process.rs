//! Processes: whether one lives, waiting for a condition, file owners.

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};
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

/// Runs `cmd` with `stdin` written to its standard input, and collects its
/// output. A program may exit without reading all of its input (bad usage):
/// a broken pipe then is not the test's failure.
pub fn run_with_stdin(cmd: &mut Command, stdin: &[u8]) -> std::process::Output {
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let mut input = child.stdin.take().expect("stdin");
    let data = stdin.to_vec();
    let writer = thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let out = child.wait_with_output().expect("wait");
    let _ = writer.join();
    out
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
