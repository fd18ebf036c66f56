//! kn-journal's failpoint tests that arm faults inside the library itself
//! (`crates/journal/tests/blob_failpoints.rs`: a post failing between
//! storing a blob, linking it and writing its record leaves no record
//! without its blob; `crates/journal/tests/append_failpoints.rs`: an
//! append failing after writing its records never has them overwritten;
//! `crates/journal/tests/window_failpoints.rs`: a route write whose window
//! record fails, with `KN_FOLLOW`, leaves no window open for a deleted
//! route).
//! They need kn-journal built with the `failpoints` feature, which a plain
//! `cargo test --workspace` does not turn on (it would compile the fault
//! hooks into every test's store): this test builds and runs them in
//! `<target>/failpoints`, so that the README's one test command runs them
//! too.

mod support;

#[test]
fn kn_journals_blob_failpoint_tests_pass() {
    passes(&support::failpoint_tests("kn-journal", "blob_failpoints"));
}

/// `crates/journal/tests/append_failpoints.rs`: an append failing after
/// its records reached the segment leaves them to the next writer, whose
/// checkpoints no later append takes (issue 37, suspected point a).
#[test]
fn kn_journals_append_failpoint_tests_pass() {
    passes(&support::failpoint_tests("kn-journal", "append_failpoints"));
}

/// `crates/journal/tests/window_failpoints.rs`: a route without its
/// window reads as its copies; a deletion whose closing record fails is
/// refused (issue 39).
#[test]
fn kn_journals_window_failpoint_tests_pass() {
    passes(&support::failpoint_tests("kn-journal", "window_failpoints"));
}

fn passes(out: &str) {
    let passed: usize = out
        .lines()
        .filter_map(|l| l.strip_prefix("test result: ok. "))
        .filter_map(|l| l.split(' ').next()?.parse::<usize>().ok())
        .sum();
    assert!(passed >= 1, "no failpoint test ran:\n{out}");
    println!("{}", out.lines().filter(|l| l.starts_with("test result")).collect::<Vec<_>>().join("\n"));
}
