//! What a browser page does over HTTP: one-shot form posts (notify, route,
//! route deletion) on pooled keep-alive connections, and a journal tunnel
//! read as raw bytes.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The server under test: `http://HOST:PORT/kn`.
#[derive(Clone)]
pub struct Client {
    agent: ureq::Agent,
    /// `http://HOST:PORT/kn`.
    url: String,
    /// `HOST:PORT`.
    addr: String,
    /// `/kn`.
    mount: String,
    retries: Arc<AtomicU64>,
}

impl Client {
    /// A client of the server at `url` (`http://HOST:PORT/PATH`), keeping
    /// up to `connections` idle connections.
    pub fn new(url: &str, connections: usize) -> Client {
        let rest = url.strip_prefix("http://").expect("an http:// URL");
        let (addr, mount) = rest.split_once('/').map(|(a, m)| (a.to_string(), format!("/{m}"))).unwrap_or((rest.to_string(), "/".into()));
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_idle_connections(connections)
            .max_idle_connections_per_host(connections)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        Client { agent, url: url.to_string(), addr, mount, retries: Arc::new(AtomicU64::new(0)) }
    }

    /// POSTs the form `pairs` (with `kn_response_format=simple`) and
    /// returns its status line's reason when the answer is `200`.
    pub fn post(&self, pairs: &[(&str, &str)]) -> Result<(), String> {
        let mut form: Vec<(&str, &str)> = pairs.to_vec();
        form.push(("kn_response_format", "simple"));
        // A pooled keep-alive connection the server closed meanwhile fails
        // at once: retry on a new one, as a browser does (every request
        // carries a kn_id, so a repeat is a duplicate the server ignores).
        // (Apache's event MPM closes idle keep-alive connections when its
        // workers are busy with tunnels, so the retry takes a fresh agent:
        // the pool may hold more dead ones.)
        let mut reply = match self.agent.post(&self.url).send_form(form.iter().copied()) {
            Ok(reply) => reply,
            Err(ureq::Error::Io(_)) => {
                self.retries.fetch_add(1, Ordering::Relaxed);
                let fresh: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(60))).build().into();
                fresh.post(&self.url).send_form(form.iter().copied()).map_err(|e| format!("{pairs:?}: {e} (retried)"))?
            }
            Err(e) => return Err(format!("{pairs:?}: {e}")),
        };
        let status = reply.status().as_u16();
        let body = reply.body_mut().read_to_string().unwrap_or_default();
        if status != 200 {
            return Err(format!("{pairs:?}: HTTP {status}: {}", body.chars().take(300).collect::<String>()));
        }
        Ok(())
    }

    /// Posts an event with payload `payload` (also its `kn_id`: unique)
    /// to `topic`.
    pub fn notify(&self, topic: &str, payload: &str) -> Result<(), String> {
        self.post(&[("do_method", "notify"), ("kn_to", topic), ("kn_id", payload), ("kn_payload", payload)])
    }

    /// Requests sent again after a transport error.
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// Routes `from` into `to` as route `id`.
    pub fn route(&self, from: &str, to: &str, id: &str) -> Result<(), String> {
        self.post(&[("do_method", "route"), ("kn_from", from), ("kn_to", to), ("kn_id", id)])
    }

    /// Deletes route `id` of `from` (PROTOCOL.md 3.2: an empty `kn_to`).
    pub fn unroute(&self, from: &str, id: &str) -> Result<(), String> {
        self.post(&[("do_method", "route"), ("kn_from", from), ("kn_to", ""), ("kn_id", id)])
    }

    /// Opens a simple-format tunnel on `journal` and waits for its
    /// `200 Watching topic` status.
    pub fn tunnel(&self, journal: &str) -> Result<Tunnel, String> {
        let mut stream = TcpStream::connect(&self.addr).map_err(|e| format!("tunnel {journal}: connect: {e}"))?;
        // HTTP/1.0: the body is the rest of the connection (no chunking
        // to undo), as a proxy in front of the server might send it.
        let request = format!("GET {}{journal}?kn_response_format=simple HTTP/1.0\r\nHost: {}\r\n\r\n", self.mount, self.addr);
        stream.write_all(request.as_bytes()).map_err(|e| format!("tunnel {journal}: send: {e}"))?;
        let mut tunnel = Tunnel::new(stream);
        if !tunnel.wait_for(&[b"200 Watching topic"], Duration::from_secs(30)) {
            return Err(format!("tunnel {journal}: no 200 Watching topic: {}", String::from_utf8_lossy(&tunnel.seen[..tunnel.seen.len().min(500)])));
        }
        Ok(tunnel)
    }
}

/// An open tunnel: everything read from it so far (runs of spaces, the
/// keep-alive padding, kept as one space).
pub struct Tunnel {
    stream: TcpStream,
    seen: Vec<u8>,
    /// Needles found so far (each search only looks at new bytes).
    found: HashSet<Vec<u8>>,
    closed: bool,
}

impl Tunnel {
    fn new(stream: TcpStream) -> Tunnel {
        Tunnel { stream, seen: Vec::new(), found: HashSet::new(), closed: false }
    }

    /// Reads until every one of `needles` has been seen or `limit` passes;
    /// whether all were.
    pub fn wait_for(&mut self, needles: &[&[u8]], limit: Duration) -> bool {
        let end = Instant::now() + limit;
        let longest = needles.iter().map(|n| n.len()).max().unwrap_or(0);
        let mut missing: Vec<&[u8]> = needles.iter().copied().filter(|n| !self.has(n)).collect();
        let mut buf = [0u8; 65536];
        loop {
            if missing.is_empty() {
                return true;
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() || self.closed {
                return false;
            }
            let _ = self.stream.set_read_timeout(Some(left.min(Duration::from_millis(200))));
            match self.stream.read(&mut buf) {
                Ok(0) => self.closed = true,
                Ok(n) => {
                    let from = self.seen.len().saturating_sub(longest);
                    self.append(&buf[..n]);
                    let window = &self.seen[from..];
                    let found = &mut self.found;
                    missing.retain(|needle| {
                        let hit = contains(window, needle);
                        if hit {
                            found.insert(needle.to_vec());
                        }
                        !hit
                    });
                }
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(_) => self.closed = true,
            }
        }
    }

    fn append(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if b == b' ' && self.seen.last() == Some(&b' ') {
                continue;
            }
            self.seen.push(b);
        }
    }

    /// Whether `needle` has been read.
    pub fn has(&self, needle: &[u8]) -> bool {
        self.found.contains(needle) || contains(&self.seen, needle)
    }

    /// Drops what has been read (keeps memory flat on a long-lived tunnel).
    pub fn forget(&mut self) {
        self.seen.clear();
        self.found.clear();
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || hay.windows(needle.len()).any(|w| w == needle)
}
