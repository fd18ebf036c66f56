//! `pubsub-cgi serve`'s `/metrics`: the store's counters and size and the
//! server's own figures in the Prometheus text format, following what
//! happens (a real server on a loopback port, raw HTTP/1.1); what a scrape
//! costs (walks counted), who may scrape, and the page read by a parser.

use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

use kn_journal::{Event, Store, Topic};
use kn_journal::internal::Counter;
use kn_test_support::raw::{Conn, Reply, Tunnel};
use kn_test_support::{wait_for, Serve};
use prometheus_parse::{LineInfo, Scrape, Value};

fn start(root: &Path, args: &[&str]) -> Serve {
    start_with(root, args, &[])
}

fn start_with(root: &Path, args: &[&str], env: &[(&str, &str)]) -> Serve {
    let mut command = Serve::command_of(Path::new(env!("CARGO_BIN_EXE_pubsub-cgi")), root, None);
    command.args(args).env_remove("KN_ACCESS_RULES").env_remove("KN_METRICS_REFRESH_MS");
    command.envs(env.iter().copied());
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

/// Whether the page has a sample `name`.
fn has(text: &str, name: &str) -> bool {
    text.lines().any(|l| l.split(' ').next() == Some(name))
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
    // Every scrape may start a walk: the size figures follow closely.
    let serve = start_with(&root, &[], &[("KN_METRICS_REFRESH_MS", "0")]);
    let first = metrics(&serve);
    assert!(first.contains("# TYPE kn_serve_open_tunnels gauge\n"), "{first}");
    assert!(first.contains("# TYPE kn_serve_requests_total counter\n"), "{first}");
    for counter in Counter::ALL {
        match counter.poison_reason() {
            Some(reason) => assert!(first.contains(&format!("\nkn_routes_poisoned_total{{reason=\"{reason}\"}} 0\n")), "{first}"),
            None => assert!(first.contains(&format!("# TYPE kn_{}_total counter\n", counter.name())), "{first}"),
        }
    }
    assert_eq!(sample(&first, "kn_serve_open_tunnels"), 0);
    assert_eq!(sample(&first, "kn_journals_removed_total"), 0);
    assert!(wait_for(Duration::from_secs(10), || has(&metrics(&serve), "kn_store_journals")), "the first walk ends");
    let before = metrics(&serve);
    assert_eq!(sample(&before, "kn_store_journals"), 0);
    let requests = sample(&before, "kn_serve_requests_total");
    assert!(requests >= 2, "these requests count: {before}");

    // A tunnel opens: one open tunnel, one more journal, more connections.
    let open = tunnel(&serve, "/who/anna/s/1/kn_journal");
    let during = metrics(&serve);
    assert_eq!(sample(&during, "kn_serve_open_tunnels"), 1, "{during}");
    assert!(sample(&during, "kn_serve_open_connections") >= 2, "the tunnel's and this one: {during}");
    assert_eq!(sample(&during, "kn_serve_requests_total"), requests + 2, "the tunnel and this request: {during}");
    assert!(
        wait_for(Duration::from_secs(10), || sample(&metrics(&serve), "kn_store_journals") == 1),
        "a later walk counts the journal: {}",
        metrics(&serve)
    );
    assert!(sample(&metrics(&serve), "kn_store_files") > sample(&before, "kn_store_files"));

    // Another process counts (the sweep, the outbox): /metrics shows it.
    let store = Store::open(&root).unwrap();
    store.count(Counter::JournalsRemoved, 3).unwrap();
    store.count(Counter::PoisonedRefused, 1).unwrap();
    let counted = metrics(&serve);
    assert_eq!(sample(&counted, "kn_journals_removed_total"), 3, "{counted}");
    assert_eq!(sample(&counted, "kn_routes_poisoned_total{reason=\"refused\"}"), 1, "{counted}");

    // The tunnel's client goes: the gauge falls back.
    drop(open);
    assert!(
        wait_for(Duration::from_secs(10), || sample(&metrics(&serve), "kn_serve_open_tunnels") == 0),
        "the closed tunnel is no longer counted"
    );
}

/// The reviewer's defect (issue 28.8): every scrape walked the whole
/// store. Now the figures come from a walk made at most once per
/// `KN_METRICS_REFRESH_MS`, counted by `kn_store_usage_walks_total`.
#[test]
fn scrapes_in_a_row_walk_the_store_at_most_once_per_refresh_interval() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("events");
    let serve = start_with(&root, &[], &[("KN_METRICS_REFRESH_MS", "3600000")]);
    assert!(wait_for(Duration::from_secs(10), || has(&metrics(&serve), "kn_store_files")), "the first walk ends");
    let first = metrics(&serve);
    let topics = sample(&first, "kn_store_topics");
    // The store grows meanwhile; the figures wait for the next walk.
    let store = Store::open(&root).unwrap();
    for i in 0..20 {
        store.notify(&Topic::parse(&format!("/what/t{i}")).unwrap(), Event::from_pairs([("kn_payload", "x")])).unwrap();
    }
    let mut conn = Conn::connect(serve.addr(), Duration::from_secs(10));
    for _ in 0..100 {
        conn.send("GET", "/metrics", b"");
        let text = conn.reply().text();
        assert_eq!(sample(&text, "kn_store_usage_walks_total"), 1, "one walk for every scrape of the interval: {text}");
        assert_eq!(sample(&text, "kn_store_topics"), topics, "the cached figure: {text}");
    }
}

#[test]
fn an_anonymous_scrape_is_refused_under_rules_that_deny_it() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("access.rules");
    std::fs::write(&rules, "allow read /kn_metrics ops\ndeny all /kn_metrics *\nallow all /** *\n").unwrap();
    let serve = start_with(
        &dir.path().join("events"),
        &["--trusted-proxy", "127.0.0.1"],
        &[("KN_ACCESS_RULES", rules.to_str().unwrap())],
    );
    let scrape = |user: Option<&str>| {
        let mut conn = Conn::connect(serve.addr(), Duration::from_secs(10));
        let user = user.map(|u| format!("X-Remote-User: {u}\r\n")).unwrap_or_default();
        let request = format!("GET /metrics HTTP/1.1\r\nHost: {}\r\n{user}\r\n", serve.addr());
        conn.reader.get_mut().write_all(request.as_bytes()).unwrap();
        conn.reply()
    };
    let anonymous = scrape(None);
    assert!(anonymous.status_line.starts_with("HTTP/1.1 401"), "{}", anonymous.status_line);
    assert_eq!(anonymous.header("www-authenticate"), Some("Basic realm=\"knpubsub\""));
    assert!(anonymous.text().contains("anonymous may not read '/kn_metrics'"), "{}", anonymous.text());
    assert!(!anonymous.text().contains("kn_store"), "no figure leaks: {}", anonymous.text());
    let bob = scrape(Some("bob"));
    assert!(bob.status_line.starts_with("HTTP/1.1 403"), "{}", bob.status_line);
    let ops = scrape(Some("ops"));
    assert!(ops.status_line.starts_with("HTTP/1.1 200"), "{}", ops.status_line);
    assert!(has(&ops.text(), "kn_serve_requests_total"), "{}", ops.text());
    // The protocol itself is open to anonymous under these rules.
    let notify = request(&serve, "GET", "/kn?do_method=notify&kn_to=/what/chat&kn_payload=hi&kn_response_format=simple");
    assert!(notify.status_line.starts_with("HTTP/1.1 200"), "{}", notify.status_line);
}

/// Issue 29's figures, and the page as a Prometheus server reads it:
/// every line parses, every sample is typed, counters end in `_total`.
#[test]
fn the_page_parses_and_has_the_streams_requests_poisonings_and_build_families() {
    let dir = tempfile::tempdir().unwrap();
    let serve = start_with(&dir.path().join("events"), &[], &[("KN_METRICS_REFRESH_MS", "0")]);
    let stream = |method: &str, path: &str, headers: &str, body: &str| {
        let mut conn = Conn::connect(serve.addr(), Duration::from_secs(10));
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\n{headers}Content-Length: {}\r\n\r\n{body}",
            serve.addr(),
            body.len()
        );
        conn.reader.get_mut().write_all(request.as_bytes()).unwrap();
        conn
    };
    let created = stream("PUT", "/v1/stream/rooms/1", "Content-Type: text/plain\r\n", "").reply();
    assert!(created.status_line.starts_with("HTTP/1.1 201"), "{}", created.status_line);
    let appended = stream("POST", "/v1/stream/rooms/1", "Content-Type: text/plain\r\n", "hello").reply();
    assert!(appended.status_line.starts_with("HTTP/1.1 2"), "{}", appended.status_line);
    // A live reader waits at the tail.
    let _waiting = stream("GET", "/v1/stream/rooms/1?offset=now&live=long-poll", "", "");
    // Methods outside the fixed set count as `other`.
    let brew = request(&serve, "BREW", "/pot");
    assert!(brew.status_line.starts_with("HTTP/1.1 405"), "{}", brew.status_line);
    assert!(
        wait_for(Duration::from_secs(10), || {
            let text = metrics(&serve);
            has(&text, "kn_store_streams") && sample(&text, "kn_store_streams") == 1 && sample(&text, "kn_stream_live_readers") == 1
        }),
        "{}",
        metrics(&serve)
    );
    let text = metrics(&serve);
    assert_eq!(sample(&text, "kn_stream_appends_total"), 1, "{text}");
    assert_eq!(sample(&text, "kn_stream_appended_bytes_total"), 5, "{text}");
    assert_eq!(sample(&text, "kn_serve_http_requests_total{method=\"PUT\",status_class=\"2xx\"}"), 1, "{text}");
    assert_eq!(sample(&text, "kn_serve_http_requests_total{method=\"other\",status_class=\"4xx\"}"), 1, "{text}");
    assert!(sample(&text, "kn_serve_http_requests_total{method=\"GET\",status_class=\"2xx\"}") >= 1, "{text}");

    let lines: Vec<std::io::Result<String>> = text.lines().map(|l| Ok(l.to_string())).collect();
    for line in text.lines() {
        assert!(!matches!(LineInfo::parse(line), LineInfo::Ignored | LineInfo::Empty), "a line Prometheus would not read: {line:?}");
    }
    let scrape = Scrape::parse(lines.into_iter()).expect("the page parses");
    assert_eq!(scrape.samples.len(), text.lines().filter(|l| !l.starts_with('#')).count(), "every sample read");
    let mut families = std::collections::BTreeSet::new();
    for s in &scrape.samples {
        assert!(scrape.docs.contains_key(&s.metric), "{} has a HELP", s.metric);
        match s.value {
            Value::Counter(_) => assert!(s.metric.ends_with("_total"), "a counter's name ends in _total: {}", s.metric),
            Value::Gauge(_) => assert!(!s.metric.ends_with("_total"), "a gauge's does not: {}", s.metric),
            ref other => panic!("{} is neither a counter nor a gauge: {other:?}", s.metric),
        }
        families.insert(s.metric.clone());
    }
    for family in [
        "kn_build_info",
        "kn_serve_http_requests_total",
        "kn_routes_poisoned_total",
        "kn_stream_appends_total",
        "kn_stream_appended_bytes_total",
        "kn_stream_live_readers",
        "kn_store_streams",
        "kn_store_usage_walks_total",
        "kn_store_usage_age_seconds",
    ] {
        assert!(families.contains(family), "no {family}: {families:?}");
    }
    let build = scrape.samples.iter().find(|s| s.metric == "kn_build_info").unwrap();
    assert_eq!(build.labels.get("version"), Some(env!("CARGO_PKG_VERSION")));
    assert_eq!(build.value, Value::Gauge(1.0));
    let reasons: std::collections::BTreeSet<_> =
        scrape.samples.iter().filter(|s| s.metric == "kn_routes_poisoned_total").filter_map(|s| s.labels.get("reason")).collect();
    assert_eq!(reasons, ["bad_name", "other", "refused", "stale", "unreachable"].into_iter().collect());
    let requests = scrape.samples.iter().filter(|s| s.metric == "kn_serve_http_requests_total").count();
    assert_eq!(requests, 7 * 5, "a fixed set of methods and status classes");
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
