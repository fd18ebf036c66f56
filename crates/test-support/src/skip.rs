//! Skipping a test that cannot run here, visibly.
//!
//! libtest hides what a passing test prints, so a skip reason on stderr alone
//! is never seen. [`skip`] also appends a line to `kn-skips.txt` in the
//! target directory, which `.ci/run` prints and counts after `cargo test`;
//! under `CI=true` it panics instead, since CI installs every tool the
//! tests need and a skip there would be a test that cannot fail.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::bins::target_layout;

/// True when running under CI (`CI` set to anything but `false`/`0`/empty).
pub fn on_ci() -> bool {
    match std::env::var("CI") {
        Ok(v) => !(v.is_empty() || v == "false" || v == "0"),
        Err(_) => false,
    }
}

/// Where skips are recorded: `$KN_SKIPS_FILE` if set, else
/// `<target>/kn-skips.txt` (the target directory this test was built in).
pub fn skips_file() -> PathBuf {
    match std::env::var_os("KN_SKIPS_FILE") {
        Some(path) => PathBuf::from(path),
        None => target_layout().target_dir.join("kn-skips.txt"),
    }
}

/// Skips the calling test for `reason`: under `CI=true` this panics with the
/// reason; otherwise it prints `skipping: <test>: <reason>` to stderr and
/// appends that line to [`skips_file`]. The caller then returns.
pub fn skip(reason: &str) {
    skip_with(on_ci(), &skips_file(), reason);
}

/// [`skip`] with the CI flag and the record file given (what the unit tests
/// exercise without touching the process environment).
fn skip_with(ci: bool, record: &Path, reason: &str) {
    if ci {
        panic!("cannot skip under CI=true: {reason}");
    }
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("?");
    // One line per skip, whatever the reason holds (a tool's stderr may
    // span lines): .ci/run counts the lines of the record.
    let reason = reason.split_whitespace().collect::<Vec<_>>().join(" ");
    let line = format!("skipping: {test}: {reason}");
    eprintln!("{line}");
    if let Some(parent) = record.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    let written = OpenOptions::new().create(true).append(true).open(record).and_then(|mut f| writeln!(f, "{line}"));
    if let Err(e) = written {
        eprintln!("(could not record the skip in {}: {e})", record.display());
    }
}

/// Whether `program` (e.g. [`crate::APACHE`], a tool such as `strace`
/// given by path) exists; when it does not, the test is skipped ([`skip`])
/// and this returns false.
pub fn available(program: &str) -> bool {
    if Path::new(program).exists() {
        return true;
    }
    skip(&format!("{program} is not installed (.ci/run installs it)"));
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn under_ci_a_skip_is_a_failure_and_records_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let record = dir.path().join("skips.txt");
        let caught = std::panic::catch_unwind(|| skip_with(true, &record, "no strace"));
        let message = caught.expect_err("skip under CI must panic");
        let text = message.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(text.contains("no strace"), "{text}");
        assert!(!record.exists());
    }

    #[test]
    fn outside_ci_a_skip_is_recorded_with_the_test_name() {
        let dir = tempfile::tempdir().unwrap();
        let record = dir.path().join("sub/skips.txt");
        skip_with(false, &record, "no tmpfs");
        skip_with(false, &record, "no strace");
        let text = std::fs::read_to_string(&record).unwrap();
        let name = "skip::tests::outside_ci_a_skip_is_recorded_with_the_test_name";
        assert_eq!(text, format!("skipping: {name}: no tmpfs\nskipping: {name}: no strace\n"));
    }
}
