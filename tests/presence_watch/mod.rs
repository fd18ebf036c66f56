//! A `simple` tunnel read as it streams, for the presence tests
//! (tests/presence.rs, tests/presence_gluster.rs): events as they come,
//! presence events by kind and journal.

#![allow(dead_code)]

use std::path::Path;
use std::time::{Duration, Instant};

use crate::e2e::{parse_frames, KnEvent, KnServer, PATIENCE};
use crate::support::http::Stream;
use crate::support::Serve;

/// `serve` seen as the e2e tests see a web server (its own log: none).
impl KnServer for Serve {
    fn url(&self) -> String {
        Serve::url(self)
    }
    fn log(&self) -> String {
        String::new()
    }
    fn dir_path(&self) -> &Path {
        Path::new("/nonexistent")
    }
}

/// A `simple` tunnel, with optional Basic credentials, read as it streams.
pub struct Watch {
    pub stream: Stream,
    pos: usize,
    events: Vec<(Instant, KnEvent)>,
    next: usize,
}

impl Watch {
    pub fn open(url: &str, query: &str, user: Option<(&str, &str)>) -> Watch {
        use base64::Engine as _;
        let rest = url.strip_prefix("http://").unwrap();
        let (addr, path) = rest.split_once('/').unwrap();
        let auth = user
            .map(|(u, p)| format!("Authorization: Basic {}\r\n", base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))))
            .unwrap_or_default();
        let request = format!("GET /{path}?{query}&kn_response_format=simple HTTP/1.0\r\nHost: {addr}\r\n{auth}\r\n");
        Watch { stream: Stream::send(url, request.as_bytes()), pos: 0, events: Vec::new(), next: 0 }
    }

    /// A tunnel on `topic` (no credentials).
    pub fn tunnel(server: &impl KnServer, topic: &str, extra: &str) -> Watch {
        let mut w = Watch::open(&server.url(), &format!("do_method=route&kn_from={topic}&kn_status_from=w{extra}"), None);
        let status = w.next_event(PATIENCE).unwrap_or_else(|| panic!("no status on the tunnel on {topic}: {}\n{}", w.stream.text(), server.log()));
        assert_eq!(status.status(), "200 Watching topic", "{status:?}");
        w
    }

    pub fn next_event(&mut self, limit: Duration) -> Option<KnEvent> {
        let deadline = Instant::now() + limit;
        loop {
            if self.next < self.events.len() {
                self.next += 1;
                return Some(self.events[self.next - 1].1.clone());
            }
            let body = self.stream.body().to_vec();
            let new = parse_frames(&body, &mut self.pos);
            if !new.is_empty() {
                let now = Instant::now();
                self.events.extend(new.into_iter().map(|e| (now, e)));
                continue;
            }
            let now = Instant::now();
            if now >= deadline || self.stream.eof() {
                return None;
            }
            self.stream.read_once((deadline - now).min(Duration::from_millis(100)));
        }
    }

    /// Waits for the presence event `what` (`join`, `leave`) of `journal`.
    pub fn presence(&mut self, what: &str, journal: &str, limit: Duration) -> Option<KnEvent> {
        let deadline = Instant::now() + limit;
        loop {
            let e = self.next_event(deadline.saturating_duration_since(Instant::now()))?;
            if e.get("kn_presence").as_deref() == Some(what) && e.get("kn_presence_journal").as_deref() == Some(journal) {
                return Some(e);
            }
        }
    }

    /// Every presence event received within `limit`: (kind, journal).
    pub fn presence_for(&mut self, limit: Duration) -> Vec<(String, String)> {
        let deadline = Instant::now() + limit;
        let mut seen = Vec::new();
        while let Some(e) = self.next_event(deadline.saturating_duration_since(Instant::now())) {
            if let (Some(kind), Some(journal)) = (e.get("kn_presence"), e.get("kn_presence_journal")) {
                seen.push((kind, journal));
            }
        }
        seen
    }

    pub fn close(self) {
        self.stream.close();
    }
}
