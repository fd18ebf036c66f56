//! Helpers shared by the journal's integration tests.

use kn_journal::{Event, Topic};

/// A scratch directory named `<prefix>…`, on tmpfs when there is one: the
/// tests create thousands of topic directories, and ext4's inode allocator
/// slows to milliseconds per file on a disk that other test suites churn.
#[allow(unused_imports)] // not every test file scratches
pub use kn_test_support::scratch;

/// A topic from a name the test knows is valid.
pub fn t(name: &str) -> Topic {
    Topic::parse(name).unwrap()
}

/// An event of `(name, value)` elements.
pub fn ev(pairs: &[(&str, &str)]) -> Event {
    Event::from_pairs(pairs.iter().map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec())))
}
