//! Helpers shared by the journal's integration tests.

use std::path::{Path, PathBuf};

pub mod journal;

use kn_journal::{Config, Event, Store, Topic};

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
#[allow(dead_code)] // not every test file uses it
pub fn t(name: &str) -> Topic {
    Topic::parse(name).unwrap()
}

/// An event of `(name, value)` elements.
#[allow(dead_code)] // not every test file uses it
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

/// A store under an access rules file, both in a temporary directory (the
/// access tests' fixture; each file adds what else it needs).
#[allow(dead_code)] // only the access tests use it
pub struct RulesFixture {
    pub _dir: tempfile::TempDir,
    pub root: PathBuf,
    pub rules: PathBuf,
}

#[allow(dead_code)]
impl RulesFixture {
    pub fn new(rules: &str) -> RulesFixture {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.rules");
        std::fs::write(&path, rules).unwrap();
        let root = dir.path().join("kn_events");
        RulesFixture { _dir: dir, root, rules: path }
    }

    /// A store as a new process opens it (reading the rules afresh).
    pub fn store(&self) -> Store {
        let mut config = Config::new(&self.root);
        config.access_rules = Some(self.rules.clone());
        config.server_url = Some("http://example.org/kn".into());
        Store::open_with(config).unwrap()
    }
}
