//! The soak driver at its smoke-test size (`--quick`: 300 page loads)
//! against a real server: every event posted to a room while a page was
//! subscribed reaches that page's journal tunnel, no request fails, and the
//! report ends with the line BENCHMARKS.md documents. No timing is checked.

use std::process::{Command, Output};

fn soak(extra: &[&str]) -> (Output, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kn-soak"))
        .arg("--quick")
        .arg("--serve-bin")
        .arg(kn_test_support::pubsub_cgi())
        .args(extra)
        .output()
        .expect("run kn-soak");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out, text)
}

fn assert_nothing_missed(out: &Output, text: &str, pages: u64) {
    assert!(out.status.success(), "{out:?}\n{text}");
    let summary = text.lines().find(|l| l.starts_with("deliveries checked ")).unwrap_or_else(|| panic!("{text}"));
    assert!(summary.contains(", missed 0; failed page loads 0;"), "{text}");
    let checked: u64 = summary["deliveries checked ".len()..].split(',').next().unwrap().parse().unwrap();
    assert!(checked >= 2 * pages + 200, "each page's own 2 events and the 2 x 100 probes at least: {text}");
    assert!(!text.contains("MISSED") && !text.contains("ERROR"), "{text}");
    let last = text.lines().last().unwrap();
    assert!(last.starts_with(&format!("soak: {pages} page loads; files ")) && last.contains("; dirs ") && last.ends_with(" us"), "{last}");
    assert_eq!(text.lines().filter(|l| l.starts_with("after ")).count(), 2, "figures after 100 and after {pages}: {text}");
}

#[test]
fn quick_soak_against_serve_misses_no_event() {
    let (out, text) = soak(&[]);
    assert_nothing_missed(&out, &text, 300);
    assert!(text.contains("pubsub-cgi serve at http://127.0.0.1:"), "{text}");
    // 50 route/unroute cycles leave only the probe's route active (how
    // many records remain is the sweep's business, not asserted here).
    assert_eq!(text.matches(" records (1 active); notify p50 ").count(), 2, "{text}");
}

#[test]
fn quick_soak_through_pubsub_cgi_under_apache_misses_no_event() {
    if !kn_test_support::available(kn_test_support::APACHE) {
        return;
    }
    let (out, text) = soak(&["--apache", "--concurrency", "8", "--page-loads", "150"]);
    assert_nothing_missed(&out, &text, 150);
    assert!(text.contains("pubsub.cgi under Apache at http://127.0.0.1:"), "{text}");
}
