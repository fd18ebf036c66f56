//! What the end-to-end tests of `pubsub.cgi` share, whatever the web server
//! (`tests/apache.rs`, `tests/lighttpd.rs`): a reader of the `simple`
//! response format, a tunnel client that times each event's arrival, a
//! one-shot HTTP listener standing in for a remote PubSub server, and the
//! scenarios both servers must pass.
//!
//! The parser here is written from PROTOCOL.md 3.5, independently of
//! `kn-cgi`'s own, so that a bug shared by writer and reader cannot hide.

#![allow(dead_code)]

use std::fs;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{self, Apache, Lighttpd, Response, Stream};

/// How long anything that should be quick may take on a loaded 2-core CI
/// machine before a test calls it broken.
pub const PATIENCE: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------
// The servers, seen the same way

/// A web server running `pubsub.cgi` at `/kn`.
pub trait KnServer {
    /// `http://127.0.0.1:PORT/kn`.
    fn url(&self) -> String;
    /// The server's error log (CGI stderr), for assertion messages.
    fn log(&self) -> String;
    /// The server's private directory, where the CGI copy lives.
    fn dir_path(&self) -> &Path;
}

impl KnServer for Apache {
    fn url(&self) -> String {
        Apache::url(self)
    }
    fn log(&self) -> String {
        self.error_log()
    }
    fn dir_path(&self) -> &Path {
        self.dir().path()
    }
}

impl KnServer for Lighttpd {
    fn url(&self) -> String {
        Lighttpd::url(self)
    }
    fn log(&self) -> String {
        self.error_log()
    }
    fn dir_path(&self) -> &Path {
        self.dir().path()
    }
}

// ---------------------------------------------------------------------------
// The simple format

/// One event of a `simple` response: its elements in order, and the payload.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KnEvent {
    pub elements: Vec<(String, Vec<u8>)>,
    pub payload: Vec<u8>,
}

impl KnEvent {
    /// The value of element `name` as text (lossy), if present.
    pub fn get(&self, name: &str) -> Option<String> {
        if name == "kn_payload" {
            return Some(self.payload_text());
        }
        self.elements.iter().find(|(n, _)| n == name).map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }

    /// The `status` element ("" when absent).
    pub fn status(&self) -> String {
        self.get("status").unwrap_or_default()
    }

    /// The payload as text (lossy).
    pub fn payload_text(&self) -> String {
        String::from_utf8_lossy(&self.payload).into_owned()
    }
}

/// Decodes the `=XX` escapes of a name or value.
fn unescape(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if text[i] == b'=' && i + 2 < text.len() {
            if let Ok(b) = u8::from_str_radix(&String::from_utf8_lossy(&text[i + 1..i + 3]), 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(text[i]);
        i += 1;
    }
    out
}

/// Parses one encoded event (the bytes a frame's count covers).
pub fn parse_event(bytes: &[u8]) -> KnEvent {
    let mut event = KnEvent::default();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\n' {
            event.payload = bytes[i + 1..].to_vec();
            return event;
        }
        let end = bytes[i..].iter().position(|&b| b == b'\n').map(|p| i + p).unwrap_or(bytes.len());
        let line = &bytes[i..end];
        let colon = line.iter().position(|&b| b == b':').unwrap_or_else(|| {
            panic!("event line without ':' in {:?}", String::from_utf8_lossy(bytes))
        });
        let value = &line[colon + 1..];
        let value = value.strip_prefix(b" ").unwrap_or(value);
        event.elements.push((String::from_utf8_lossy(&unescape(&line[..colon])).into_owned(), unescape(value)));
        i = end + 1;
    }
    panic!("event without the blank line before its payload: {:?}", String::from_utf8_lossy(bytes))
}

/// Parses the complete frames of `buf` from `*pos` on (skipping the spaces
/// and newlines of padding and keep-alives), advancing `*pos` past them.
/// An incomplete last frame is left for later; garbage panics.
pub fn parse_frames(buf: &[u8], pos: &mut usize) -> Vec<KnEvent> {
    let mut events = Vec::new();
    loop {
        let mut i = *pos;
        while i < buf.len() && matches!(buf[i], b' ' | b'\n' | b'\r' | b'\t') {
            i += 1;
        }
        let digits = buf[i..].iter().take_while(|b| b.is_ascii_digit()).count();
        if i + digits >= buf.len() {
            return events; // nothing, or a count still arriving
        }
        assert!(
            digits > 0 && buf[i + digits] == b'\n',
            "not a simple-format frame at byte {i}: {:?}",
            String::from_utf8_lossy(&buf[i..buf.len().min(i + 80)])
        );
        let count: usize = std::str::from_utf8(&buf[i..i + digits]).unwrap().parse().unwrap();
        let start = i + digits + 1;
        if start + count + 1 > buf.len() {
            return events;
        }
        assert_eq!(buf[start + count], b'\n', "frame of {count} bytes at {i} does not end with a newline");
        events.push(parse_event(&buf[start..start + count]));
        *pos = start + count + 1;
    }
}

/// The events of a one-shot `simple` response body.
pub fn events_of(resp: &Response) -> Vec<KnEvent> {
    let mut pos = 0;
    let events = parse_frames(&resp.body, &mut pos);
    assert!(
        resp.body[pos..].iter().all(|b| b.is_ascii_whitespace()),
        "trailing bytes after the frames: {:?}",
        resp.text()
    );
    events
}

/// The one status event of a one-shot `simple` response, checked against
/// the HTTP status (they must agree, PROTOCOL.md 3.8).
pub fn status_of(resp: &Response) -> KnEvent {
    let events = events_of(resp);
    assert_eq!(events.len(), 1, "one status event expected, got {events:?}");
    let status = events.into_iter().next().unwrap();
    assert_eq!(
        status.status().split(' ').next().unwrap_or(""),
        resp.status.to_string(),
        "HTTP status and status event disagree: {status:?}"
    );
    status
}

// ---------------------------------------------------------------------------
// Requests

/// `POST url` of `pairs` in the simple format; returns the response and
/// its status event.
pub fn post_simple(url: &str, pairs: &[(&str, &str)]) -> (Response, KnEvent) {
    let mut all = pairs.to_vec();
    all.push(("kn_response_format", "simple"));
    let resp = support::post_form(url, &all);
    let status = status_of(&resp);
    (resp, status)
}

/// Notifies `topic` with `payload` under id `id`; asserts `200 Notified`.
pub fn notify(server: &impl KnServer, topic: &str, id: &str, payload: &str) -> KnEvent {
    let (resp, status) =
        post_simple(&server.url(), &[("kn_to", topic), ("kn_id", id), ("kn_payload", payload)]);
    assert_eq!(resp.status, 200, "notify {topic}: {status:?}\n{}", server.log());
    assert_eq!(status.status(), "200 Notified");
    status
}

/// Adds the static route `from` → `to` with id `id` (and `kn_uri` `uri`);
/// asserts `200 Routed`.
pub fn route(server: &impl KnServer, from: &str, to: &str, id: &str, uri: &str) -> KnEvent {
    let mut pairs = vec![("do_method", "route"), ("kn_from", from), ("kn_to", to), ("kn_id", id)];
    if !uri.is_empty() {
        pairs.push(("kn_uri", uri));
    }
    let (resp, status) = post_simple(&server.url(), &pairs);
    assert_eq!(resp.status, 200, "route {from} -> {to}: {status:?}\n{}", server.log());
    assert_eq!(status.status(), "200 Routed", "{status:?}");
    status
}

/// Sends `request` (a complete raw HTTP request) and reads the whole
/// response: (status line, everything received).
pub fn raw(url: &str, request: &[u8]) -> (String, String) {
    let mut stream = Stream::send(url, request);
    assert!(stream.read_to_end(PATIENCE), "no end of response to {:?}: {}", String::from_utf8_lossy(request), stream.text());
    let text = stream.text();
    let line = text.lines().next().unwrap_or("").to_string();
    (line, text)
}

/// `host:port/path` of an `http://` URL, split.
pub fn host_and_path(url: &str) -> (String, String) {
    let rest = url.strip_prefix("http://").expect("http URL");
    let i = rest.find('/').unwrap_or(rest.len());
    (rest[..i].to_string(), rest[i..].to_string())
}

/// A raw HTTP/1.0 POST of `body` to `url` (with `Host` as given).
pub fn raw_post(url: &str, host: &str, body: &str) -> (String, String) {
    let (_, path) = host_and_path(url);
    let req = format!(
        "POST {path} HTTP/1.0\r\nHost: {host}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    raw(url, req.as_bytes())
}

/// Decodes `application/x-www-form-urlencoded` (`+` is a space) as text.
pub fn form_decode(body: &[u8]) -> Vec<(String, String)> {
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    support::form_decode(body).into_iter().map(|(n, v)| (text(n), text(v))).collect()
}

// ---------------------------------------------------------------------------
// Tunnels

/// A `simple` tunnel read as it streams; each event is stamped with the
/// moment its frame was complete.
pub struct Tunnel {
    pub stream: Stream,
    pos: usize,
    /// Every event received, with its arrival time.
    pub events: Vec<(Instant, KnEvent)>,
    next: usize,
    pub opened: Instant,
}

impl Tunnel {
    /// Opens `GET url` (which must ask for `kn_response_format=simple`).
    pub fn open(url: &str) -> Tunnel {
        let opened = Instant::now();
        Tunnel { stream: Stream::get(url), pos: 0, events: Vec::new(), next: 0, opened }
    }

    fn take_new_frames(&mut self) -> bool {
        let body = self.stream.body().to_vec();
        let now = Instant::now();
        let new = parse_frames(&body, &mut self.pos);
        let got = !new.is_empty();
        self.events.extend(new.into_iter().map(|e| (now, e)));
        got
    }

    /// The next event not yet returned, waiting up to `limit`.
    pub fn next_timed(&mut self, limit: Duration) -> Option<(Instant, KnEvent)> {
        let deadline = Instant::now() + limit;
        loop {
            if self.next < self.events.len() {
                self.next += 1;
                return Some(self.events[self.next - 1].clone());
            }
            if self.take_new_frames() {
                continue;
            }
            let now = Instant::now();
            if now >= deadline || self.stream.eof() {
                return None;
            }
            self.stream.read_once((deadline - now).min(Duration::from_millis(200)));
        }
    }

    /// The next event, waiting up to `limit`.
    pub fn next(&mut self, limit: Duration) -> Option<KnEvent> {
        self.next_timed(limit).map(|(_, e)| e)
    }

    /// Skips events until one has `name` = `value`; returns it with its
    /// arrival time.
    pub fn until(&mut self, name: &str, value: &str, limit: Duration) -> Option<(Instant, KnEvent)> {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (at, event) = self.next_timed(left)?;
            if event.get(name).as_deref() == Some(value) {
                return Some((at, event));
            }
        }
    }

    /// Waits for the tunnel's own status event and checks it: HTTP 200,
    /// `200 Watching topic`, `kn_route_location` = `status_from`. Returns
    /// how long it took from opening.
    pub fn expect_watching(&mut self, status_from: &str, log: impl Fn() -> String) -> Duration {
        let first = self.next_timed(PATIENCE);
        let Some((at, status)) = first else {
            panic!("no status event on the tunnel; received {:?}\n{}", self.stream.text(), log());
        };
        assert_eq!(self.stream.status(), Some(200), "{}", self.stream.text());
        assert_eq!(status.status(), "200 Watching topic", "{status:?}");
        assert_eq!(status.get("kn_route_location").as_deref(), Some(status_from));
        at - self.opened
    }

    /// Events received so far that `pred` accepts (in order).
    pub fn received(&self, pred: impl Fn(&KnEvent) -> bool) -> Vec<KnEvent> {
        self.events.iter().map(|(_, e)| e).filter(|e| pred(e)).cloned().collect()
    }
}

/// The URL of a simple tunnel on `topic` (`/who/a/s/1/kn_journal`) with
/// `kn_status_from` = `status_from` and `extra` query parameters.
pub fn tunnel_url(server: &impl KnServer, topic: &str, status_from: &str, extra: &str) -> String {
    format!(
        "{}{topic}?do_method=route&kn_response_format=simple&kn_status_from={status_from}{extra}",
        server.url()
    )
}

/// The routes of `source` as stored (`<source>/kn_routes`), read through a
/// tunnel with `do_max_age=infinity`: (id, destination, event).
pub fn routes_of(server: &impl KnServer, source: &str) -> Vec<(String, String, KnEvent)> {
    let url = format!(
        "{}?do_method=route&kn_from={source}/kn_routes&do_max_age=infinity&kn_response_format=simple&kn_status_from=routes",
        server.url()
    );
    let mut tunnel = Tunnel::open(&url);
    tunnel.expect_watching("routes", || server.log());
    // The initial population comes as one burst right after the status.
    let mut routes = Vec::new();
    while let Some(event) = tunnel.next(Duration::from_millis(1500)) {
        routes.push((event.get("kn_id").unwrap_or_default(), event.payload_text(), event));
    }
    routes
}

// ---------------------------------------------------------------------------
// Processes

/// Pids of running processes whose executable lies under `dir` (the CGI
/// copies a server runs from its private directory).
pub fn processes_under(dir: &Path) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter(|pid| {
            fs::read_link(format!("/proc/{pid}/exe")).map(|exe| exe.starts_with(dir)).unwrap_or(false)
                && support::process_alive(*pid)
        })
        .collect()
}

// ---------------------------------------------------------------------------
// A remote PubSub server stand-in

pub use support::Received;

/// Listens on a free loopback port, answers every request `200` (a PubSub
/// server's `200 Notified`, simple format) and hands each request over the
/// channel. Returns the port. The thread ends with the test process.
pub fn recording_listener() -> (u16, mpsc::Receiver<Received>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind listener");
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            match read_request(conn) {
                Some(req) => {
                    if tx.send(req).is_err() {
                        return;
                    }
                }
                None => continue,
            }
        }
    });
    (port, rx)
}

fn read_request(mut conn: TcpStream) -> Option<Received> {
    let _ = conn.set_read_timeout(Some(PATIENCE));
    let received = support::read_request(&mut conn)?;
    let status = "52\nkn_route_location: \nstatus: 200 Notified\nkn_id: remote\n\n\n";
    let reply = format!(
        "HTTP/1.1 200 Notified\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{status}",
        status.len()
    );
    let _ = conn.write_all(reply.as_bytes());
    Some(received)
}

// ---------------------------------------------------------------------------
// Scenarios both servers must pass

/// notify in the simple and js formats: 200, the right status, and the
/// status event's code as the HTTP status.
pub fn notify_answers_200_notified(server: &impl KnServer) {
    let status = notify(server, "/what/chat", "e1", "hello");
    assert!(status.payload_text().contains("Wrote to '/what/chat' (e1)"), "{status:?}");

    let resp = support::post_form(&server.url(), &[("kn_to", "/what/chat"), ("kn_payload", "hello"), ("kn_id", "e2")]);
    assert_eq!(resp.status, 200, "{}", server.log());
    assert_eq!(resp.header("content-type"), Some("text/html; charset=utf-8"));
    let body = resp.text();
    assert!(body.contains("<title>200 Notified</title>"), "{body}");
    assert!(body.contains("{name:\"status\",value:\"200 Notified\"}"), "{body}");

    // A duplicate is still 200 Notified (and stores nothing).
    let status = notify(server, "/what/chat", "e1", "hello");
    assert!(!status.payload_text().contains("Wrote to '/what/chat'"), "{status:?}");

    // An error's code is the HTTP status too.
    let (resp, status) = post_simple(&server.url(), &[("kn_to", "/what/../x"), ("kn_payload", "x")]);
    assert_eq!(resp.status, 400, "{status:?}");
}

/// A static route answers `200 Routed`, then `200 Ignored route` when
/// repeated, and is stored with an absolute destination.
pub fn route_answers_200_routed(server: &impl KnServer) {
    let status = route(server, "/what/chat", "/who/a/s/1/kn_journal", "r1", "http://example/uri1");
    assert!(status.payload_text().contains("Wrote to '/what/chat/kn_routes' (r1)"), "{status:?}");
    let (resp, status) = post_simple(
        &server.url(),
        &[
            ("do_method", "route"),
            ("kn_from", "/what/chat"),
            ("kn_to", "/who/a/s/1/kn_journal"),
            ("kn_id", "r1"),
            ("kn_uri", "http://example/uri1"),
        ],
    );
    assert_eq!(resp.status, 200);
    assert_eq!(status.status(), "200 Ignored route", "{status:?}");
    let routes = routes_of(server, "/what/chat");
    let r1: Vec<_> = routes.iter().filter(|(id, _, _)| id == "r1").collect();
    assert_eq!(r1.len(), 1, "{routes:?}");
    assert_eq!(r1[0].1, format!("{}/who/a/s/1/kn_journal", server.url()));
    assert_eq!(r1[0].2.get("kn_uri").as_deref(), Some("http://example/uri1"));
}

/// The tunnel of PROTOCOL.md 3.4 through the web server: the status at
/// once, then each routed event as soon as it is posted. Returns the
/// latencies (notify sent → event received) of three events, sorted.
pub fn tunnel_receives_routed_events_at_once(server: &impl KnServer) -> Vec<Duration> {
    let url = tunnel_url(server, "/who/a/s/1/kn_journal", "t", "");
    let mut tunnel = Tunnel::open(&url);
    let first = tunnel.expect_watching("t", || server.log());
    eprintln!("tunnel status event after {first:?}");
    assert!(first < Duration::from_secs(5), "the tunnel's status took {first:?}");
    route(server, "/what/chat", "/who/a/s/1/kn_journal", "r1", "http://example/uri1");

    let mut latencies = Vec::new();
    for i in 0..3 {
        let id = format!("e{i}");
        let cgi = server.url();
        let (id2, sent) = (id.clone(), Instant::now());
        let notifier = thread::spawn(move || {
            let started = Instant::now();
            let (resp, status) =
                post_simple(&cgi, &[("kn_to", "/what/chat"), ("kn_id", &id2), ("kn_payload", &format!("hello {id2}"))]);
            (resp.status, status, started.elapsed())
        });
        let got = tunnel.until("kn_id", &id, PATIENCE);
        let (code, status, notify_took) = notifier.join().expect("notifier thread");
        assert_eq!(code, 200, "{status:?}\n{}", server.log());
        let Some((at, event)) = got else {
            panic!("event {id} never reached the tunnel: {:?}\n{}", tunnel.stream.text(), server.log());
        };
        assert_eq!(event.payload_text(), format!("hello {id}"));
        assert_eq!(event.get("kn_route_location").as_deref(), Some("http://example/uri1"));
        assert_eq!(event.get("kn_route_id").as_deref(), Some("r1"));
        assert_eq!(event.get("kn_routed_from"), Some(format!("{}/what/chat", server.url())));
        assert!(event.get("kn_route_checkpoint").is_some(), "{event:?}");
        let latency = at.saturating_duration_since(sent);
        eprintln!("event {id}: on the tunnel {latency:?} after the notify was sent (the notify took {notify_took:?})");
        latencies.push(latency);
        thread::sleep(Duration::from_millis(200));
    }
    latencies.sort();
    latencies
}

/// Golden case 10: a batch with `kn_status_to` = the journal's absolute
/// URL answers `204`, and the tunnel receives the five frames in order.
pub fn batch_frames_arrive_in_order(server: &impl KnServer) {
    let journal = "/who/a/s/1/kn_journal";
    let mut tunnel = Tunnel::open(&tunnel_url(server, journal, "tun", ""));
    tunnel.expect_watching("tun", || server.log());
    route(server, "/what/chat", journal, "r1", "http://example/uri1");
    let status_to = format!("{}{journal}", server.url());
    let resp = support::post_form(
        &server.url(),
        &[
            ("do_method", "batch"),
            ("kn_status_from", "b0"),
            ("kn_status_to", &status_to),
            ("kn_batch", "do_method=notify;kn_to=%2Fwhat%2Fchat;kn_payload=batch%20one;kn_id=e10a;kn_status_from=b1"),
            (
                "kn_batch",
                "do_method=notify;kn_to=%2Fwho%2Fa%2Fs%2F1%2Fkn_journal;kn_payload=batch%20two;kn_id=e10b;kn_status_from=b2",
            ),
        ],
    );
    assert_eq!(resp.status, 204, "{}\n{}", resp.text(), server.log());
    assert!(resp.body.is_empty(), "{:?}", resp.text());

    let mut frames = Vec::new();
    while frames.len() < 5 {
        match tunnel.next(PATIENCE) {
            Some(e) => frames.push(e),
            None => panic!("only {} of 5 batch frames arrived: {frames:?}\n{}", frames.len(), server.log()),
        }
    }
    let loc = |e: &KnEvent| e.get("kn_route_location").unwrap_or_default();
    assert_eq!((frames[0].status(), loc(&frames[0])), ("200 Processing batch".into(), "b0".into()), "{frames:?}");
    assert_eq!(frames[0].payload_text(), "");
    assert_eq!(frames[1].get("kn_id").as_deref(), Some("e10a"), "{frames:?}");
    assert_eq!(frames[1].payload_text(), "batch one");
    assert_eq!(loc(&frames[1]), "http://example/uri1");
    assert_eq!((frames[2].status(), loc(&frames[2])), ("200 Notified".into(), "b1".into()), "{frames:?}");
    assert_eq!(frames[3].get("kn_id").as_deref(), Some("e10b"), "{frames:?}");
    assert_eq!(frames[3].payload_text(), "batch two");
    assert_eq!((frames[4].status(), loc(&frames[4])), ("200 Notified".into(), "b2".into()), "{frames:?}");
}

/// `kn_status_to`: `204` with no body; the status event lands on the
/// journal's tunnel (golden 05b), or is dropped when no tunnel reads the
/// journal (05a).
pub fn status_to_answers_204(server: &impl KnServer) {
    // No tunnel has ever read this journal: still 204, the status dropped.
    let resp = support::post_form(
        &server.url(),
        &[("kn_to", "/what/chat"), ("kn_payload", "x"), ("kn_status_to", "/who/a/s/1/kn_journal"), ("kn_status_from", "abc")],
    );
    assert_eq!(resp.status, 204, "{}\n{}", resp.text(), server.log());
    assert!(resp.body.is_empty());

    let mut tunnel = Tunnel::open(&tunnel_url(server, "/who/a/s/1/kn_journal", "tun", ""));
    tunnel.expect_watching("tun", || server.log());
    let resp = support::post_form(
        &server.url(),
        &[
            ("kn_to", "/what/chat"),
            ("kn_payload", "x"),
            ("kn_id", "e5b"),
            ("kn_status_to", "/who/a/s/1/kn_journal"),
            ("kn_status_from", "abc"),
        ],
    );
    assert_eq!(resp.status, 204, "{}", resp.text());
    assert!(resp.body.is_empty(), "{:?}", resp.text());
    assert!(resp.header("content-type").is_none() || resp.body.is_empty());
    let Some((_, status)) = tunnel.until("kn_route_location", "abc", PATIENCE) else {
        panic!("the forwarded status never reached the tunnel: {}\n{}", tunnel.stream.text(), server.log());
    };
    assert_eq!(status.status(), "200 Notified");
    assert!(status.payload_text().contains("Wrote to '/what/chat' (e5b)"), "{status:?}");
    assert!(status.get("kn_route_checkpoint").is_some());
}

/// The path after the script names the topic (`POST /kn/what/chat`), and a
/// tunnel on `/kn/what/chat` reads it back.
pub fn path_info_names_the_topic(server: &impl KnServer) {
    let (resp, status) = post_simple(&format!("{}/what/chat", server.url()), &[("kn_payload", "via path"), ("kn_id", "p1")]);
    assert_eq!(resp.status, 200, "{status:?}\n{}", server.log());
    assert_eq!(status.status(), "200 Notified");
    assert!(status.payload_text().contains("Wrote to '/what/chat' (p1)"), "{status:?}");

    let mut tunnel = Tunnel::open(&format!(
        "{}/what/chat?do_method=route&kn_response_format=simple&kn_status_from=pi&do_max_age=infinity",
        server.url()
    ));
    tunnel.expect_watching("pi", || server.log());
    let Some((_, event)) = tunnel.until("kn_id", "p1", PATIENCE) else {
        panic!("p1 not replayed: {}", tunnel.stream.text());
    };
    assert_eq!(event.payload_text(), "via path");
}

/// A client that vanishes mid-tunnel ends the CGI within seconds: the next
/// keep-alive write fails (or the server sends SIGTERM).
pub fn tunnel_cgi_exits_when_the_client_disconnects(server: &impl KnServer) {
    let mut tunnel = Tunnel::open(&tunnel_url(server, "/who/d/s/1/kn_journal", "gone", ""));
    tunnel.expect_watching("gone", || server.log());
    let mut pids = Vec::new();
    support::wait_for(Duration::from_secs(5), || {
        pids = processes_under(server.dir_path());
        !pids.is_empty()
    });
    assert_eq!(pids.len(), 1, "expected one pubsub.cgi process under {}, found {pids:?}", server.dir_path().display());
    let pid = pids[0];
    // Still there while the client listens (keep-alives flow).
    thread::sleep(Duration::from_millis(1500));
    assert!(support::process_alive(pid), "the tunnel CGI {pid} ended with its client still there");
    let left = Instant::now();
    tunnel.stream.close();
    let ended = support::wait_for(PATIENCE, || !support::process_alive(pid));
    assert!(ended, "tunnel CGI {pid} still running {PATIENCE:?} after its client left\n{}", server.log());
    eprintln!("tunnel CGI {pid} ended {:?} after its client left", left.elapsed());
}
