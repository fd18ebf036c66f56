//! Helpers shared by the journal's integration tests.

use std::path::Path;

use kn_journal::{Config, Event, Topic};

/// A scratch directory named `<prefix>…`, on tmpfs when there is one: the
/// tests create thousands of topic directories, and ext4's inode allocator
/// slows to milliseconds per file on a disk that other test suites churn.
/// (kn_test_support::scratch, repeated here: these tests are published
/// with the crate, and kn-test-support is not.)
#[allow(dead_code)] // not every test file scratches
pub fn scratch(prefix: &str) -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = tempfile::Builder::new().prefix(prefix).tempdir_in(shm) {
            return dir;
        }
    }
    tempfile::tempdir().expect("create temporary directory")
}

/// A topic from a name the test knows is valid.
pub fn t(name: &str) -> Topic {
    Topic::parse(name).unwrap()
}

/// An event of `(name, value)` elements.
pub fn ev(pairs: &[(&str, &str)]) -> Event {
    Event::from_pairs(pairs.iter().map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec())))
}

/// This server's URL in the tests that route: routes to it are local.
#[allow(dead_code)] // not every test file routes
pub const SERVER: &str = "http://test.example/kn";

/// The tests' configuration of a store at `root`: no free-space reserve
/// (tmpfs is small), this server named [`SERVER`].
#[allow(dead_code)] // not every test file opens its stores this way
pub fn config(root: &Path) -> Config {
    let mut c = Config::new(root);
    c.reserve_bytes = 0;
    c.server_url = Some(SERVER.to_string());
    c
}
