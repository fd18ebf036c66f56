//! A tiny HTTP client: one-shot requests and raw incremental streams.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::OnceLock;
use std::time::{Duration, Instant};



/// A complete HTTP response.
#[derive(Clone, Debug)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Header names in lower case, in arrival order.
    pub headers: Vec<(String, String)>,
    /// The whole body.
    pub body: Vec<u8>,
}

impl Response {
    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }

    /// The body as text (lossy UTF-8).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

fn agent() -> &'static ureq::Agent {
    static AGENT: OnceLock<ureq::Agent> = OnceLock::new();
    AGENT.get_or_init(|| {
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_global(Some(Duration::from_secs(30)))
            // A new connection per request: a pooled one that the web
            // server closed meanwhile (Apache ends idle keep-alive
            // connections, sooner under load) failed a test once with
            // "Peer disconnected", and ureq does not send again.
            .max_idle_connections(0)
            .build()
            .into()
    })
}

fn into_response(url: &str, result: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Response {
    let mut resp = result.unwrap_or_else(|e| panic!("request to {url} failed: {e}"));
    let status = resp.status().as_u16();
    let headers = resp
        .headers()
        .iter()
        .map(|(n, v)| (n.as_str().to_ascii_lowercase(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    let body = resp
        .body_mut()
        .with_config()
        .limit(64 * 1024 * 1024)
        .read_to_vec()
        .unwrap_or_else(|e| panic!("reading body from {url}: {e}"));
    Response { status, headers, body }
}

/// `GET url`; panics on a transport error (any HTTP status is returned).
pub fn get(url: &str) -> Response {
    into_response(url, agent().get(url).call())
}

/// `POST url` with `pairs` form-urlencoded as the body.
pub fn post_form(url: &str, pairs: &[(&str, &str)]) -> Response {
    into_response(url, agent().post(url).send_form(pairs.iter().copied()))
}

/// `POST url` with a raw body and content type.
pub fn post(url: &str, content_type: &str, body: &[u8]) -> Response {
    into_response(url, agent().post(url).content_type(content_type).send(body))
}

/// [`post`] on a connection of its own, closed after the response: for a
/// request the server may answer before reading its body (a `413`), after
/// which the web server closes the connection without saying so, and a
/// pooled connection would fail the next request.
pub fn post_alone(url: &str, content_type: &str, body: &[u8]) -> Response {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .max_idle_connections(0)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into();
    into_response(url, agent.post(url).content_type(content_type).send(body))
}

/// A raw HTTP connection whose response is read incrementally, for tunnels
/// and for hanging up mid-response (drop it, or call [`Stream::close`]).
pub struct Stream {
    sock: TcpStream,
    received: Vec<u8>,
    eof: bool,
}

/// Splits `http://host:port/path?query` into (`host:port`, `/path?query`).
fn split_url(url: &str) -> (String, String) {
    let rest = url.strip_prefix("http://").unwrap_or_else(|| panic!("not an http:// URL: {url}"));
    match rest.find('/') {
        Some(i) => (rest[..i].to_string(), rest[i..].to_string()),
        None => (rest.to_string(), "/".to_string()),
    }
}

impl Stream {
    /// Opens `GET url` as HTTP/1.0, so that the body arrives as the raw
    /// bytes the server writes (no chunked framing) until it closes.
    pub fn get(url: &str) -> Stream {
        let (host, path) = split_url(url);
        let req = format!("GET {path} HTTP/1.0\r\nHost: {host}\r\nUser-Agent: kn-tests\r\n\r\n");
        Stream::send(url, req.as_bytes())
    }

    /// Opens a connection to `url`'s host and writes `request` verbatim.
    pub fn send(url: &str, request: &[u8]) -> Stream {
        let (host, _) = split_url(url);
        let mut sock = TcpStream::connect(&host).unwrap_or_else(|e| panic!("connect {host}: {e}"));
        sock.write_all(request).unwrap_or_else(|e| panic!("send to {host}: {e}"));
        Stream { sock, received: Vec::new(), eof: false }
    }

    /// Everything received so far (status line, headers and body).
    pub fn received(&self) -> &[u8] {
        &self.received
    }

    /// Everything received so far, as text (lossy UTF-8).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.received).into_owned()
    }

    /// Whether the server has closed the connection.
    pub fn eof(&self) -> bool {
        self.eof
    }

    /// The status code, once the status line has arrived.
    pub fn status(&self) -> Option<u16> {
        let line = self.received.split(|&b| b == b'\n').next()?;
        let line = std::str::from_utf8(line).ok()?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// The status line and headers received so far (before the blank line
    /// ending them; everything received while that line has not come).
    pub fn head(&self) -> &[u8] {
        match find(&self.received, b"\r\n\r\n") {
            Some(i) => &self.received[..i],
            None => &self.received,
        }
    }

    /// The body received so far (after the blank line ending the headers).
    pub fn body(&self) -> &[u8] {
        match find(&self.received, b"\r\n\r\n") {
            Some(i) => &self.received[i + 4..],
            None => &[],
        }
    }

    /// Reads whatever arrives within `limit` (or until the server closes).
    pub fn read_for(&mut self, limit: Duration) -> &[u8] {
        let deadline = Instant::now() + limit;
        while !self.eof && self.read_some(deadline) {}
        &self.received
    }

    /// Reads until `needle` has been received, the server closes, or `limit`
    /// passes; true if `needle` was seen. Everything read stays in
    /// [`Stream::received`].
    pub fn read_until(&mut self, needle: &[u8], limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            if find(&self.received, needle).is_some() {
                return true;
            }
            if self.eof || !self.read_some(deadline) {
                return find(&self.received, needle).is_some();
            }
        }
    }

    /// Reads once: whatever arrives first within `limit`. False on timeout
    /// or end of stream. For clients that parse as bytes arrive and time
    /// each arrival (tunnel latency).
    pub fn read_once(&mut self, limit: Duration) -> bool {
        !self.eof && self.read_some(Instant::now() + limit)
    }

    /// Reads until the server closes the connection or `limit` passes; true
    /// if it closed.
    pub fn read_to_end(&mut self, limit: Duration) -> bool {
        self.read_for(limit);
        self.eof
    }

    /// Reads once, blocking no later than `deadline`; false on timeout or
    /// end of stream.
    fn read_some(&mut self, deadline: Instant) -> bool {
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        let _ = self.sock.set_read_timeout(Some(deadline - now));
        let mut buf = [0u8; 16 * 1024];
        match self.sock.read(&mut buf) {
            Ok(0) => {
                self.eof = true;
                false
            }
            Ok(n) => {
                self.received.extend_from_slice(&buf[..n]);
                true
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => true,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => false,
            Err(_) => {
                // A reset is the server hanging up too.
                self.eof = true;
                false
            }
        }
    }

    /// Hangs up: the client vanishes mid-response.
    pub fn close(self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}

/// The first position of `needle` in `hay`.
pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    hay.windows(needle.len()).position(|w| w == needle)
}
