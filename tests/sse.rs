//! The `sse` response format (PROTOCOL.md 3.5, **Extension**) on the wire,
//! without a browser: raw HTTP against `pubsub-cgi serve`, as an
//! `EventSource` would see it. Only real journal events carry an `id:`
//! (their checkpoint); heartbeats are comment lines; `Last-Event-ID` (or the
//! `last_event_id` parameter) resumes exactly after that event; a resume
//! point that is no longer retained is announced by a `205` status event.

mod support;

use std::time::Duration;

use support::{Dir, Stream};

/// `pubsub-cgi serve` on a free port over a fresh store.
struct Serve {
    server: support::Serve,
    _dir: Dir,
}

impl Serve {
    fn start(name: &str, env: &[(&str, &str)]) -> Serve {
        let dir = Dir::new(name);
        let www = dir.create_dir("www");
        let mut command = support::Serve::command(&dir.join("events"), Some(&www));
        command.envs(env.iter().copied());
        Serve { server: support::Serve::spawn(command), _dir: dir }
    }

    fn url(&self) -> String {
        self.server.url()
    }

    /// Opens the SSE tunnel on `journal` with `query` and extra request
    /// header lines, and waits for its `200 Watching topic` status event.
    fn tunnel(&self, journal: &str, query: &str, headers: &str) -> Stream {
        let host = self.server.base.trim_start_matches("http://");
        let req = format!(
            "GET /kn{journal}?do_method=route&kn_response_format=sse{query} HTTP/1.0\r\nHost: {host}\r\n{headers}\r\n"
        );
        let mut s = Stream::send(&self.url(), req.as_bytes());
        assert!(s.read_until(b"Watching topic", Duration::from_secs(10)), "no status event:\n{}", s.text());
        s
    }

    /// Posts one event to `topic` and returns its kn_id.
    fn notify(&self, topic: &str, id: &str, payload: &str) {
        let r = support::post_form(
            &self.url(),
            &[("kn_to", topic), ("kn_id", id), ("kn_payload", payload), ("kn_response_format", "simple")],
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
}

/// One parsed SSE message: its `id:` (if any) and its `data:`.
#[derive(Debug, Clone)]
struct Message {
    id: Option<String>,
    data: serde_json::Value,
}

impl Message {
    fn get(&self, name: &str) -> Option<&str> {
        self.data.get(name).and_then(|v| v.as_str())
    }
}

/// The messages of an SSE body (after the HTTP head), and its comment lines.
fn parse(body: &[u8]) -> (Vec<Message>, Vec<String>) {
    let text = String::from_utf8_lossy(body);
    let mut messages = Vec::new();
    let mut comments = Vec::new();
    for block in text.split("\n\n") {
        let mut id = None;
        let mut data = None;
        for line in block.lines() {
            if let Some(c) = line.strip_prefix(':') {
                comments.push(c.trim().to_string());
            } else if let Some(v) = line.strip_prefix("id: ") {
                id = Some(v.to_string());
            } else if let Some(v) = line.strip_prefix("data: ") {
                data = Some(serde_json::from_str(v).unwrap_or_else(|e| panic!("data is not JSON ({e}): {v}")));
            }
        }
        if let Some(data) = data {
            messages.push(Message { id, data });
        }
    }
    (messages, comments)
}

/// The non-status messages' payloads.
fn payloads(messages: &[Message]) -> Vec<String> {
    messages.iter().filter(|m| m.get("status").is_none()).map(|m| m.get("kn_payload").unwrap_or("").to_string()).collect()
}

/// Reads until `n` real events (with an id) arrived.
fn read_events(s: &mut Stream, n: usize) -> Vec<Message> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (messages, _) = parse(s.body());
        let events = messages.iter().filter(|m| m.id.is_some()).count();
        if events >= n || std::time::Instant::now() > deadline {
            return messages;
        }
        s.read_once(Duration::from_millis(200));
    }
}

#[test]
fn sse_tunnel_sends_no_cache_headers_and_an_id_less_status_event() {
    let serve = Serve::start("sse_headers", &[]);
    let s = serve.tunnel("/who/t/s/1/kn_journal", "&kn_status_from=me", "");
    let head = String::from_utf8_lossy(s.received()).to_ascii_lowercase();
    assert_eq!(s.status(), Some(200), "{head}");
    assert!(head.contains("content-type: text/event-stream"), "{head}");
    assert!(head.contains("cache-control: no-cache"), "{head}");
    assert!(head.contains("x-accel-buffering: no"), "{head}");
    let (messages, _) = parse(s.body());
    let status = &messages[0];
    assert_eq!(status.get("status"), Some("200 Watching topic"));
    assert_eq!(status.get("kn_route_location"), Some("me"));
    assert_eq!(status.id, None, "a status event is not a journal event: no id:\n{}", s.text());
    assert!(!s.text().contains("\nid:"), "{}", s.text());
}

#[test]
fn sse_events_carry_their_checkpoint_as_id_and_heartbeats_are_comments() {
    let serve = Serve::start("sse_ids", &[]);
    let journal = "/who/t/s/2/kn_journal";
    let mut s = serve.tunnel(journal, "", "");
    for i in 1..=3 {
        serve.notify(journal, &format!("e{i}"), &format!("event {i}"));
    }
    let messages = read_events(&mut s, 3);
    let events: Vec<&Message> = messages.iter().filter(|m| m.id.is_some()).collect();
    assert_eq!(payloads(&messages), ["event 1", "event 2", "event 3"]);
    let mut last = 0u64;
    for e in &events {
        let id = e.id.as_deref().unwrap();
        assert_eq!(Some(id), e.get("kn_route_checkpoint"), "id: is the event's checkpoint");
        let n: u64 = id.parse().expect("checkpoints are decimal sequence numbers");
        assert!(n > last, "checkpoints increase: {id} after {last}");
        last = n;
    }
    // Idle: keep-alives are comment lines, never events (the handler
    // writes one every second by default).
    s.read_for(Duration::from_millis(2500));
    let (after, comments) = parse(s.body());
    assert_eq!(after.len(), messages.len(), "a heartbeat is not an event:\n{}", s.text());
    assert!(comments.iter().any(|c| c == "keep-alive"), "no comment heartbeat in:\n{}", s.text());
}

/// Posts e1..e5 to a journal (kept alive by a tunnel) and returns their
/// checkpoints.
fn five_events(serve: &Serve, journal: &str) -> Vec<String> {
    let mut s = serve.tunnel(journal, "", "");
    for i in 1..=5 {
        serve.notify(journal, &format!("e{i}"), &format!("event {i}"));
    }
    let messages = read_events(&mut s, 5);
    messages.iter().filter_map(|m| m.id.clone()).collect()
}

#[test]
fn sse_last_event_id_header_resumes_exactly_after_that_event() {
    let serve = Serve::start("sse_resume_header", &[]);
    let journal = "/who/t/s/3/kn_journal";
    let ids = five_events(&serve, journal);
    assert_eq!(ids.len(), 5);
    let mut s = serve.tunnel(journal, "", &format!("Last-Event-ID: {}\r\n", ids[1]));
    let messages = read_events(&mut s, 3);
    assert_eq!(payloads(&messages), ["event 3", "event 4", "event 5"], "{}", s.text());
    assert!(!s.text().contains("205 Reset Content"), "{}", s.text());
    // The header wins over the query parameter (a reconnect of a page that
    // opened with last_event_id).
    let mut s = serve.tunnel(journal, &format!("&last_event_id={}", ids[0]), &format!("Last-Event-ID: {}\r\n", ids[3]));
    let messages = read_events(&mut s, 1);
    s.read_for(Duration::from_millis(300));
    assert_eq!(payloads(&parse(s.body()).0), ["event 5"], "{}", s.text());
    drop(messages);
}

#[test]
fn sse_last_event_id_parameter_resumes_exactly_after_that_event() {
    let serve = Serve::start("sse_resume_param", &[]);
    let journal = "/who/t/s/4/kn_journal";
    let ids = five_events(&serve, journal);
    let mut s = serve.tunnel(journal, &format!("&last_event_id={}", ids[2]), "");
    let messages = read_events(&mut s, 2);
    s.read_for(Duration::from_millis(300));
    assert_eq!(payloads(&parse(s.body()).0), ["event 4", "event 5"], "{}", s.text());
    assert_eq!(messages.iter().filter(|m| m.id.is_some()).count(), 2);
    // Resuming after the last event gives nothing, and no gap either.
    let mut s = serve.tunnel(journal, &format!("&last_event_id={}", ids[4]), "");
    s.read_for(Duration::from_millis(500));
    let (messages, _) = parse(s.body());
    assert_eq!(messages.len(), 1, "only the status event:\n{}", s.text());
}

#[test]
fn sse_unknown_resume_point_is_announced_before_what_is_retained() {
    let serve = Serve::start("sse_unknown", &[]);
    let journal = "/who/t/s/5/kn_journal";
    five_events(&serve, journal);
    let mut s = serve.tunnel(journal, "", "Last-Event-ID: 987654321\r\n");
    let messages = read_events(&mut s, 5);
    let statuses: Vec<&str> = messages.iter().filter_map(|m| m.get("status")).collect();
    assert_eq!(statuses, ["200 Watching topic", "205 Reset Content"], "{}", s.text());
    assert!(messages[1].id.is_none(), "the 205 status event has no id");
    assert_eq!(payloads(&messages).len(), 5, "then everything retained:\n{}", s.text());
}

#[test]
fn sse_resume_point_beyond_retention_is_announced_never_a_silent_gap() {
    // Retention deletes whole sealed segments older than 1 s when a
    // segment fills (4 KiB, the smallest): 3 KB events take one each.
    let serve = Serve::start("sse_retention", &[("KN_JOURNAL_MAX_AGE", "1"), ("KN_SEGMENT_BYTES", "4096")]);
    let journal = "/who/t/s/6/kn_journal";
    let mut s = serve.tunnel(journal, "", "");
    let big = "x".repeat(3000);
    serve.notify(journal, "old1", &format!("old 1 {big}"));
    serve.notify(journal, "old2", &format!("old 2 {big}"));
    let first: Vec<String> = read_events(&mut s, 2).iter().filter_map(|m| m.id.clone()).collect();
    std::thread::sleep(Duration::from_millis(2500));
    serve.notify(journal, "new1", &format!("new 1 {big}"));
    read_events(&mut s, 3);
    let mut r = serve.tunnel(journal, &format!("&last_event_id={}", first[0]), "");
    r.read_for(Duration::from_millis(500));
    let (messages, _) = parse(r.body());
    let statuses: Vec<&str> = messages.iter().filter_map(|m| m.get("status")).collect();
    assert_eq!(statuses, ["200 Watching topic", "205 Reset Content"], "{}", r.text());
    assert!(messages[1].get("kn_payload").unwrap_or("").contains("no longer retained"), "{}", r.text());
    let shown: Vec<String> = payloads(&messages).iter().map(|p| p[..5].to_string()).collect();
    assert_eq!(shown, ["new 1"], "what is retained follows the announcement");
}
