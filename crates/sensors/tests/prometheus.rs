//! `kn stat --prometheus`: the store's counters and size in the Prometheus
//! text format, on standard output or written atomically to a file for
//! node_exporter's textfile collector.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use kn_journal::{Event, Selection, Store, Topic};
use kn_journal::internal::Counter;

fn kn(root: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kn")).arg("--root").arg(root).args(args).stdin(Stdio::null()).output().unwrap()
}

fn ok(out: Output) -> String {
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The value of the sample `name` (panics when there is none).
fn sample(text: &str, name: &str) -> u64 {
    let line = text.lines().find(|l| l.split(' ').next() == Some(name)).unwrap_or_else(|| panic!("no {name}: {text}"));
    line.split(' ').nth(1).unwrap().parse().unwrap()
}

#[test]
fn prometheus_prints_every_counter_and_the_store_size() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.tunnel(&Topic::parse("/who/anna/s/1/kn_journal").unwrap(), &Selection::none()).unwrap();
    store.notify(&Topic::parse("/what/chat").unwrap(), Event::from_pairs([("kn_payload", "hi")])).unwrap();
    store.count(Counter::JournalsRemoved, 2).unwrap();
    let text = ok(kn(dir.path(), &["stat", "--prometheus"]));
    for counter in Counter::ALL {
        match counter.poison_reason() {
            Some(reason) => assert!(text.contains(&format!("\nkn_routes_poisoned_total{{reason=\"{reason}\"}} ")), "{text}"),
            None => {
                let name = format!("kn_{}_total", counter.name());
                assert!(text.contains(&format!("# TYPE {name} counter\n{name} ")), "{text}");
            }
        }
    }
    assert!(text.contains("# TYPE kn_routes_poisoned_total counter\n"), "{text}");
    assert_eq!(sample(&text, "kn_journals_removed_total"), 2);
    assert_eq!(sample(&text, "kn_routes_poisoned_total{reason=\"stale\"}"), 0);
    assert_eq!(sample(&text, "kn_store_journals"), 1);
    assert!(text.contains("# TYPE kn_store_files gauge\n"), "{text}");
    let files = sample(&text, "kn_store_files");
    assert!(files > 0 && sample(&text, "kn_store_bytes") > 0 && sample(&text, "kn_store_topics") >= 2, "{text}");

    // Things happen: the figures follow.
    store.count(Counter::JournalsRemoved, 1).unwrap();
    store.count(Counter::PoisonedStale, 4).unwrap();
    store.tunnel(&Topic::parse("/who/bob/s/2/kn_journal").unwrap(), &Selection::none()).unwrap();
    let text = ok(kn(dir.path(), &["stat", "--prometheus"]));
    assert_eq!(sample(&text, "kn_journals_removed_total"), 3);
    assert_eq!(sample(&text, "kn_routes_poisoned_total{reason=\"stale\"}"), 4);
    assert_eq!(sample(&text, "kn_store_journals"), 2);
    assert!(sample(&text, "kn_store_files") > files, "{text}");
    assert_eq!(sample(&text, "kn_outbox_pending"), 0);
}

#[test]
fn prometheus_counts_the_deliveries_waiting_in_the_outbox() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = kn_journal::Config::new(dir.path());
    config.outbound = kn_journal::OutboundPolicy::AllowAll;
    let store = Store::open_with(config).unwrap();
    // A port nothing listens on: the connection is refused, a transient
    // failure, so the route is kept and the delivery waits for a retry.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let chat = Topic::parse("/what/chat").unwrap();
    store.route(&chat, format!("http://{closed}/kn/what/far").as_bytes(), Event::from_pairs([("kn_id", "r1")])).unwrap();
    store.notify(&chat, Event::from_pairs([("kn_payload", "hi")])).unwrap();
    assert_eq!(store.outbox_pending().unwrap(), 1);
    let text = ok(kn(dir.path(), &["stat", "--prometheus"]));
    assert!(text.contains("# TYPE kn_outbox_pending gauge\n"), "{text}");
    assert_eq!(sample(&text, "kn_outbox_pending"), 1);
    assert_eq!(sample(&text, "kn_deliveries_retried_total"), 1);
}

#[test]
fn prometheus_output_replaces_the_file_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let textfiles = dir.path().join("textfile");
    std::fs::create_dir(&textfiles).unwrap();
    let prom = textfiles.join("kn.prom");
    std::fs::write(&prom, "old\n").unwrap();
    store.count(Counter::Sweeps, 5).unwrap();
    let out = kn(&dir.path().join("store"), &["stat", "--prometheus", "--output", prom.to_str().unwrap()]);
    assert!(out.status.success() && out.stdout.is_empty(), "{out:?}");
    let text = std::fs::read_to_string(&prom).unwrap();
    assert_eq!(sample(&text, "kn_sweeps_total"), 5);
    let names: Vec<_> = std::fs::read_dir(&textfiles).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["kn.prom"], "no temporary file is left behind");

    // A directory that does not exist: 73 (cannot create), nothing written.
    let missing = dir.path().join("nowhere/kn.prom");
    let out = kn(&dir.path().join("store"), &["stat", "--prometheus", "--output", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(73), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("nowhere/kn.prom"), "{out:?}");
    assert!(!missing.exists());
}

#[test]
fn prometheus_options_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let without = kn(dir.path(), &["stat", "--output", "x.prom"]);
    assert!(!without.status.success(), "--output needs --prometheus: {without:?}");
    assert!(String::from_utf8_lossy(&without.stderr).contains("--prometheus"), "{without:?}");
    let both = kn(dir.path(), &["stat", "--prometheus", "--json"]);
    assert!(!both.status.success(), "{both:?}");
    let help = ok(kn(dir.path(), &["--help"]));
    assert!(help.contains("stat --prometheus --output"), "an example in kn --help: {help}");
}
