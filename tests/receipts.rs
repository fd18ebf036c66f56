//! Receipts end to end (docs/PRESENCE.md, "Receipts"): `pubsub.cgi`
//! under a real Apache answering `do_method=receipts` for 100
//! subscribers (30 with a live tunnel, 20 confirming by `do_method=ack`
//! or an SSE reconnection's `Last-Event-ID`, the rest offline), the
//! routes' escalations fired by the CGI's sweep slices, once per
//! unconfirmed journal; `serve` firing them once across a SIGKILL, a
//! crash between the posts and the cursors' writes, a restart and a
//! `kn gc`; and the bad requests' precise `4xx`.

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use kn_journal::{Selection, Store, Topic};
use support::{Apache, Dir, Stream};

const SUBSCRIBERS: usize = 100;

fn journal(i: usize) -> String {
    format!("/who/u{i}/kn_journal")
}

/// Opens a `simple` tunnel on `topic` (extra `query` appended) and waits
/// for its status event.
fn tunnel(url: &str, topic: &str, query: &str) -> Stream {
    let mut s = Stream::get(&format!("{url}{topic}?do_method=route&kn_response_format=simple{query}"));
    assert!(s.read_until(b"Watching topic", Duration::from_secs(20)), "no status event:\n{}", s.text());
    s
}

/// Routes `/what/news` into the `n` journals (made live by a tunnel each
/// first), each escalating to `/what/unread` after `after` seconds, in
/// batch requests.
fn subscribe(url: &str, n: usize, after: &str) {
    for i in 0..n {
        tunnel(url, &journal(i), "").close();
    }
    let entries: Vec<String> = (0..n)
        .map(|i| {
            format!("do_method=route&kn_from=/what/news&kn_to={}&kn_id=r{i}&kn_unread_after={after}&kn_unread_to=/what/unread", journal(i))
        })
        .collect();
    // Batches of 20: each a request of a reasonable time on a loaded machine.
    for chunk in entries.chunks(20) {
        let mut form: Vec<(&str, &str)> = vec![("do_method", "batch"), ("kn_response_format", "simple")];
        form.extend(chunk.iter().map(|e| ("kn_batch", e.as_str())));
        let r = support::post_form(url, &form);
        let text = r.text();
        assert_eq!(r.status, 200, "{text}");
        assert_eq!(text.matches("status: 200 Routed").count(), chunk.len(), "{text}");
    }
}

fn notify(url: &str, topic: &str, id: &str) {
    let r = support::post_form(url, &[("kn_to", topic), ("kn_id", id), ("kn_payload", "hello"), ("kn_response_format", "simple")]);
    assert_eq!(r.status, 200, "{}", r.text());
}

/// The events of a `simple` one-shot answer.
fn events(body: &[u8]) -> Vec<kn_journal::Event> {
    kn_wire::simple::decode_frames(body).unwrap_or_else(|e| panic!("{e:?}: {}", String::from_utf8_lossy(body)))
}

fn receipts(url: &str, id: &str) -> (u16, Vec<kn_journal::Event>) {
    let r = support::get(&format!("{url}?do_method=receipts&kn_from=/what/news&kn_id={id}&kn_response_format=simple"));
    (r.status, events(&r.body))
}

fn get_status(url: &str, query: &str) -> (u16, String) {
    let r = support::get(&format!("{url}?{query}&kn_response_format=simple"));
    (r.status, r.text())
}

/// How many escalations `/what/unread` holds, read through a tunnel.
fn escalations_over_http(url: &str) -> usize {
    let mut s = tunnel(url, "/what/unread", "&do_max_n=100000");
    s.read_for(Duration::from_millis(1500));
    let n = s.text().matches("kn_unread_journal:").count();
    s.close();
    n
}

fn value<'a>(e: &'a kn_journal::Event, name: &str) -> &'a str {
    std::str::from_utf8(e.get(name).unwrap_or(b"")).unwrap()
}

#[test]
fn apache_receipts_of_100_subscribers_ack_sse_and_one_escalation_per_unconfirmed_journal() {
    if !support::available(support::APACHE) {
        return;
    }
    let dir = Dir::new("receipts_apache");
    let store = dir.store("kn_events");
    let apache = Apache::start(&support::pubsub_cgi(), &store, "SetEnv KN_SWEEP_INTERVAL_MS 0\n");
    let url = apache.url();
    subscribe(&url, SUBSCRIBERS, "8");
    // The tunnels that made the journals live end once their CGI finds
    // the client gone (its next keep-alive): they must not be online.
    std::thread::sleep(Duration::from_secs(3));

    // 30 subscribers are online when the event comes.
    let mut online: Vec<Stream> = (0..30).map(|i| tunnel(&url, &journal(i), "")).collect();
    notify(&url, "/what/news", "ev1");
    let posted = Instant::now();
    let mut checkpoint = String::new();
    for s in &mut online {
        assert!(s.read_until(b"hello", Duration::from_secs(10)), "{}", s.text());
        let text = s.text();
        let at = text.split("kn_route_checkpoint: ").nth(1).and_then(|r| r.lines().next()).expect("a checkpoint");
        checkpoint = at.to_string();
    }
    drop(online);
    // 0..10 acknowledge; 50..60 reconnect with SSE, Last-Event-ID at it.
    for i in 0..10 {
        let (status, text) = get_status(&url, &format!("do_method=ack&kn_from={}&kn_route_checkpoint={checkpoint}", journal(i)));
        assert_eq!(status, 200, "{text}");
        assert!(text.contains("status: 200 Confirmed"), "{text}");
    }
    for i in 50..60 {
        let host = url.trim_start_matches("http://").split('/').next().unwrap();
        let req = format!(
            "GET /kn{}?do_method=route&kn_response_format=sse HTTP/1.0\r\nHost: {host}\r\nLast-Event-ID: {checkpoint}\r\n\r\n",
            journal(i)
        );
        let mut s = Stream::send(&url, req.as_bytes());
        assert!(s.read_until(b"Watching topic", Duration::from_secs(10)), "{}", s.text());
        s.close();
    }

    let (status, answer) = receipts(&url, "ev1");
    assert_eq!(status, 200);
    assert_eq!(value(&answer[0], "status"), "200 Receipts");
    let rows = &answer[1..];
    assert_eq!(rows.len(), SUBSCRIBERS);
    for row in rows {
        let j = value(row, "receipt_journal");
        let n: usize = j.trim_start_matches("/who/u").split('/').next().unwrap().parse().unwrap();
        assert_eq!(value(row, "receipt_holds"), "true", "{j}");
        assert_eq!(value(row, "receipt_sent"), if n < 30 { "true" } else { "false" }, "{j}");
        let confirmed = n < 10 || (50..60).contains(&n);
        assert_eq!(value(row, "receipt_confirmed"), if confirmed { "true" } else { "false" }, "{j}");
        assert_eq!(value(row, "receipt_route"), format!("r{n}"));
        assert_eq!(value(row, "kn_unread_after"), "8");
    }
    assert!(value(&answer[0], "kn_payload").contains("100 hold the event, 30 sent it to a live client, 20 confirmed it"));

    // Once due, the sweep slices of the next requests post one
    // escalation per unconfirmed journal, and never again.
    let unconfirmed = SUBSCRIBERS - 20;
    // The confirmations all came within the 8 seconds.
    assert!(posted.elapsed() < Duration::from_secs(8), "too slow to test: {:?}", posted.elapsed());
    std::thread::sleep(Duration::from_secs(10).saturating_sub(posted.elapsed()));
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = 0;
    while Instant::now() < deadline {
        let _ = receipts(&url, "ev1");
        seen = escalations_over_http(&url);
        if seen >= unconfirmed {
            break;
        }
    }
    assert_eq!(seen, unconfirmed);
    for _ in 0..3 {
        let _ = receipts(&url, "ev1");
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(escalations_over_http(&url), unconfirmed, "exactly once");
}

#[test]
fn apache_bad_receipt_ack_and_escalation_requests_get_a_precise_4xx() {
    if !support::available(support::APACHE) {
        return;
    }
    let dir = Dir::new("receipts_bad");
    let store = dir.store("kn_events");
    let apache = Apache::start(&support::pubsub_cgi(), &store, "");
    let url = apache.url();
    subscribe(&url, 1, "60");
    notify(&url, "/what/news", "ev1");
    let route = |extra: &str| get_status(&url, &format!("do_method=route&kn_from=/what/news&kn_to={}{extra}", journal(0)));
    let cases: Vec<(String, u16, &str)> = vec![
        ("do_method=receipts&kn_from=/what/news&kn_id=nope".into(), 404, "has no current event with kn_id 'nope'"),
        ("do_method=receipts&kn_from=/what/news".into(), 400, "needs the kn_id"),
        ("do_method=receipts&kn_from=/what/../x&kn_id=ev1".into(), 400, "bad receipts topic name"),
        (format!("do_method=ack&kn_from={}", journal(0)), 400, "needs kn_route_checkpoint"),
        (format!("do_method=ack&kn_from={}&kn_route_checkpoint=x", journal(0)), 400, "bad checkpoint 'x'"),
        (format!("do_method=ack&kn_from={}&kn_route_checkpoint=99999", journal(0)), 400, "past the end"),
        ("do_method=ack&kn_from=/what/news&kn_route_checkpoint=1".into(), 400, "not a journal"),
        ("do_method=ack&kn_from=/who/nobody/kn_journal&kn_route_checkpoint=1".into(), 404, "no journal"),
    ];
    for (query, code, says) in cases {
        let (status, text) = get_status(&url, &query);
        assert_eq!(status, code, "{query}: {text}");
        assert!(text.contains(says), "{query}: {text}");
    }
    for (extra, says) in [
        ("&kn_unread_to=/what/unread", "needs kn_unread_after"),
        ("&kn_unread_after=10", "needs kn_unread_to"),
        ("&kn_unread_after=ten&kn_unread_to=/what/unread", "expected whole seconds"),
        ("&kn_unread_after=1.5&kn_unread_to=/what/unread", "expected whole seconds"),
        ("&kn_unread_after=99999999999999999999999999&kn_unread_to=/what/unread", "larger than the maximum of 2592000 seconds"),
        ("&kn_unread_after=10&kn_unread_to=/who/x/kn_journal", "ordinary topic"),
        ("&kn_unread_after=10&kn_unread_to=http://elsewhere.example/kn/x", "not a topic of this server"),
    ] {
        let (status, text) = route(extra);
        assert_eq!(status, 400, "{extra}: {text}");
        assert!(text.contains(says), "{extra}: {text}");
    }
    let (status, text) = get_status(&url, "do_method=receipts&kn_from=/what/news&kn_id=ev1");
    assert_eq!(status, 200, "{text}");
}

/// The escalations `store` holds in `/what/unread`.
fn escalations_in(store: &std::path::Path) -> usize {
    let store = Store::open(store).unwrap();
    let unread = Topic::parse("/what/unread").unwrap();
    store.events(&unread, &Selection::all()).map(|s| s.events.len()).unwrap_or(0)
}

/// The routes' escalation cursors (`.unread/*.at`).
fn cursors(root: &std::path::Path) -> Vec<u64> {
    let entries = std::fs::read_dir(root.join(".unread")).unwrap().flatten();
    let at = entries.filter(|e| e.file_name().to_string_lossy().ends_with(".at"));
    at.map(|e| std::fs::read_to_string(e.path()).unwrap().trim().parse().unwrap()).collect()
}

#[test]
fn serve_escalates_once_across_a_sigkill_a_crash_after_posting_a_restart_and_kn_gc() {
    let dir = Dir::new("receipts_serve");
    let root = dir.join("events");
    let serve = support::Serve::spawn(support::Serve::command(&root, None));
    let url = serve.url();
    subscribe(&url, 5, "1");
    notify(&url, "/what/news", "ev1");
    // serve's background pass, every second, posts them once due.
    let deadline = Instant::now() + Duration::from_secs(20);
    while escalations_in(&root) < 5 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(escalations_in(&root), 5);
    let addr = serve.addr().to_string();
    let mut serve = serve;
    serve.child.kill().unwrap(); // SIGKILL
    serve.child.wait().unwrap();
    // A crash between the posts and the cursors' writes.
    for entry in std::fs::read_dir(root.join(".unread")).unwrap().flatten() {
        if entry.file_name().to_string_lossy().ends_with(".at") {
            std::fs::write(entry.path(), "0\n").unwrap();
        }
    }
    // Restarted on its address (the routes name its URLs), it checks
    // them all again: each cursor moves past the copy once more.
    let mut command = Command::new(support::pubsub_cgi());
    command.args(["serve", "--listen", &addr, "--root"]).arg(&root).env_remove("KN_EVENTS").env_remove("GATEWAY_INTERFACE");
    let again = support::Serve::spawn(command);
    let deadline = Instant::now() + Duration::from_secs(20);
    while cursors(&root).contains(&0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(cursors(&root).iter().all(|c| *c > 0), "checked again: {:?}", cursors(&root));
    assert_eq!(escalations_in(&root), 5, "posted again, they are duplicates");
    let out = Command::new(support::cargo_bin("kn")).arg("--root").arg(&root).arg("gc").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(escalations_in(&root), 5);
    // kn receipts (beside the running server, which names its URLs)
    // prints one line per journal.
    let out = Command::new(support::cargo_bin("kn")).arg("--root").arg(&root).args(["receipts", "/what/news", "ev1"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(text.lines().count(), 5, "{text}");
    assert!(text.lines().all(|l| l.contains("\tholds=") && l.contains("\tconfirmed=no\troute=r")), "{text}");
    let out = Command::new(support::cargo_bin("kn")).arg("--root").arg(&root).args(["receipts", "/what/news", "nope"]).output().unwrap();
    assert_eq!(out.status.code(), Some(69), "{}", String::from_utf8_lossy(&out.stderr));
    drop(again);
    // A tool beside the stopped server keeps the routes' registrations.
    let out = Command::new(support::cargo_bin("kn")).arg("--root").arg(&root).arg("gc").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_dir(root.join(".unread")).unwrap().count(), 10, "5 routes, each with its cursor");
}

#[test]
fn apache_a_cgi_tunnel_writes_what_it_sent_at_most_once_per_interval() {
    if !support::available(support::APACHE) {
        return;
    }
    let dir = Dir::new("receipts_cgi_flush");
    let store = dir.store("kn_events");
    let apache = Apache::start(&support::pubsub_cgi(), &store, "SetEnv KN_RECEIPTS_FLUSH_MS 10000\n");
    let url = apache.url();
    subscribe(&url, 1, "3600");
    // The tunnel that made the journal live must be gone (its CGI ends at
    // its next keep-alive): it would be sent the events too.
    std::thread::sleep(Duration::from_secs(3));
    let mut online = tunnel(&url, &journal(0), "");
    notify(&url, "/what/news", "a");
    assert!(online.read_until(b"kn_id: a", Duration::from_secs(10)), "{}", online.text());
    notify(&url, "/what/news", "b");
    assert!(online.read_until(b"kn_id: b", Duration::from_secs(10)), "{}", online.text());
    let sent = |id: &str| value(&receipts(&url, id).1[1], "receipt_sent").to_string();
    assert_eq!(sent("a"), "true", "the first delivery is written at once");
    assert_eq!(sent("b"), "false", "the next waits for the interval");
    // The tunnel's keep-alive after the interval writes it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while sent("b") != "true" && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(sent("b"), "true");
    online.close();
}
