//! `pubsub-cgi serve`'s `/metrics`: the store's counters and size and the
//! server's own figures in the Prometheus text format, following what
//! happens (a real server on a loopback port, raw HTTP/1.1).

use std::path::Path;
use std::time::Duration;

use kn_journal::{Counter, Store};
use kn_test_support::raw::{Conn, Reply, Tunnel};
use kn_test_support::{wait_for, Serve};

fn start(root: &Path, args: &[&str]) -> Serve {
    let mut command = Serve::command_of(Path::new(env!("CARGO_BIN_EXE_pubsub-cgi")), root, None);
    command.args(args);
    Serve::spawn(command)
}

fn request(serve: &Serve, method: &str, target: &str) -> Reply {
    let mut conn = Conn::connect(serve.addr(), Duration::from_secs(10));
    conn.send(method, target, b"");
    conn.read_reply(method == "HEAD")
}

fn metrics(serve: &Serve) -> String {
    let reply = request(serve, "GET", "/metrics");
    assert!(reply.status_line.starts_with("HTTP/1.1 200"), "{}", reply.status_line);
    assert_eq!(reply.header("content-type"), Some("text/plain; version=0.0.4; charset=utf-8"));
    reply.text()
}

/// The value of the sample `name` (panics when there is none).
fn sample(text: &str, name: &str) -> u64 {
    let line = text.lines().find(|l| l.split(' ').next() == Some(name)).unwrap_or_else(|| panic!("no {name}: {text}"));
    line.split(' ').nth(1).unwrap().parse().unwrap()
}

fn tunnel(serve: &Serve, journal: &str) -> Tunnel {
    let mut conn = Conn::connect(serve.addr(), Duration::from_secs(10));
    conn.send("GET", &format!("/kn{journal}?kn_response_format=simple"), b"");
    let mut tunnel = conn.into_tunnel();
    assert!(tunnel.wait_for(b"status: 200 Watching topic", Duration::from_secs(10)), "{}", tunnel.text());
    tunnel
}

#[test]
fn metrics_follow_tunnels_requests_and_the_store_counters() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("events");
    let serve = start(&root, &[]);
    let first = metrics(&serve);
    assert!(first.contains("# TYPE kn_serve_open_tunnels gauge\n"), "{first}");
    assert!(first.contains("# TYPE kn_serve_requests_total counter\n"), "{first}");
    for counter in Counter::ALL {
        assert!(first.contains(&format!("# TYPE kn_{}_total counter\n", counter.name())), "{first}");
    }
    assert_eq!(sample(&first, "kn_serve_open_tunnels"), 0);
    assert_eq!(sample(&first, "kn_journals_removed_total"), 0);
    assert_eq!(sample(&first, "kn_store_journals"), 0);
    let requests = sample(&first, "kn_serve_requests_total");
    assert!(requests >= 1, "this request counts: {first}");

    // A tunnel opens: one open tunnel, one more journal, more connections.
    let open = tunnel(&serve, "/who/anna/s/1/kn_journal");
    let during = metrics(&serve);
    assert_eq!(sample(&during, "kn_serve_open_tunnels"), 1, "{during}");
    assert_eq!(sample(&during, "kn_store_journals"), 1, "{during}");
    assert!(sample(&during, "kn_serve_open_connections") >= 2, "the tunnel's and this one: {during}");
    assert_eq!(sample(&during, "kn_serve_requests_total"), requests + 2, "the tunnel and this request: {during}");
    assert!(sample(&during, "kn_store_files") > sample(&first, "kn_store_files"), "{during}");

    // Another process counts (the sweep, the outbox): /metrics shows it.
    let store = Store::open(&root).unwrap();
    store.count(Counter::JournalsRemoved, 3).unwrap();
    store.count(Counter::PoisonedRefused, 1).unwrap();
    let counted = metrics(&serve);
    assert_eq!(sample(&counted, "kn_journals_removed_total"), 3, "{counted}");
    assert_eq!(sample(&counted, "kn_poisoned_refused_total"), 1, "{counted}");

    // The tunnel's client goes: the gauge falls back.
    drop(open);
    assert!(
        wait_for(Duration::from_secs(10), || sample(&metrics(&serve), "kn_serve_open_tunnels") == 0),
        "the closed tunnel is no longer counted"
    );
}

#[test]
fn metrics_answers_get_and_head_only_and_can_be_turned_off() {
    let dir = tempfile::tempdir().unwrap();
    let serve = start(&dir.path().join("events"), &[]);
    let head = request(&serve, "HEAD", "/metrics");
    assert!(head.status_line.starts_with("HTTP/1.1 200") && head.body.is_empty(), "{}", head.status_line);
    let post = request(&serve, "POST", "/metrics");
    assert!(post.status_line.starts_with("HTTP/1.1 405"), "{}", post.status_line);
    assert_eq!(post.header("allow"), Some("GET, HEAD"));
    drop(serve);

    let off = start(&dir.path().join("events"), &["--no-metrics"]);
    let reply = request(&off, "GET", "/metrics");
    assert!(reply.status_line.starts_with("HTTP/1.1 404"), "an ordinary static path: {}", reply.status_line);
}
