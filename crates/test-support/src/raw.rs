//! A hand-written HTTP/1.1 client for `pubsub-cgi serve`: a connection that
//! carries several requests (keep-alive), its replies read line by line, and
//! tunnels read as raw bytes, so a test sees every byte on the wire.
//!
//! Not re-exported at the crate root (the root tests have a `Tunnel` of
//! their own): `use kn_test_support::raw::{Conn, Reply, Tunnel};`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::find;

/// A client connection that may carry several requests (keep-alive).
pub struct Conn {
    /// The connection, buffered for reading replies.
    pub reader: BufReader<TcpStream>,
    /// The `Host` header sent with each request.
    pub host: String,
}

impl Conn {
    /// Connects to `addr` (`127.0.0.1:PORT`); each read waits at most
    /// `read_timeout`.
    pub fn connect(addr: &str, read_timeout: Duration) -> Conn {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(read_timeout)).unwrap();
        Conn::new(stream, addr)
    }

    /// A connection already open (and perhaps written to) to `host`.
    pub fn new(stream: TcpStream, host: &str) -> Conn {
        Conn { reader: BufReader::new(stream), host: host.to_string() }
    }

    /// Writes one request; a `POST`, or any request with a body, carries a
    /// form content type and its `Content-Length`.
    pub fn send(&mut self, method: &str, target: &str, body: &[u8]) {
        let mut request = format!("{method} {target} HTTP/1.1\r\nHost: {}\r\n", self.host).into_bytes();
        if !body.is_empty() || method == "POST" {
            request.extend_from_slice(
                format!("Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n", body.len()).as_bytes(),
            );
        }
        request.extend_from_slice(b"\r\n");
        request.extend_from_slice(body);
        self.reader.get_mut().write_all(&request).unwrap();
    }

    /// Reads one response with a `Content-Length` (or none, for 204).
    pub fn reply(&mut self) -> Reply {
        self.read_reply(false)
    }

    /// Reads one response; its body too unless `head_only` (the answer to
    /// a `HEAD`).
    pub fn read_reply(&mut self, head_only: bool) -> Reply {
        let mut status_line = String::new();
        self.reader.read_line(&mut status_line).unwrap();
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            self.reader.read_line(&mut line).unwrap();
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            let (name, value) = line.split_once(':').unwrap();
            headers.push((name.to_ascii_lowercase(), value.trim().to_string()));
        }
        let mut reply = Reply { status_line: status_line.trim_end().to_string(), headers, body: Vec::new() };
        if !head_only {
            if let Some(n) = reply.header("content-length") {
                let mut body = vec![0; n.parse().unwrap()];
                self.reader.read_exact(&mut body).unwrap();
                reply.body = body;
            }
        }
        reply
    }

    /// The connection as a tunnel: its response read as raw bytes.
    pub fn into_tunnel(self) -> Tunnel {
        Tunnel { stream: self.reader.into_inner(), seen: Vec::new() }
    }
}

/// A response read by [`Conn::reply`].
pub struct Reply {
    /// `HTTP/1.1 200 Notified`, without its line end.
    pub status_line: String,
    /// Header names in lower case, values trimmed, in arrival order.
    pub headers: Vec<(String, String)>,
    /// The `Content-Length` body (empty without that header).
    pub body: Vec<u8>,
}

impl Reply {
    /// The first header named `name` (give it in lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// The body as text (lossy UTF-8).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// The raw bytes of a streaming response, read as they come.
pub struct Tunnel {
    /// The connection.
    pub stream: TcpStream,
    /// Everything read so far (status line, headers and body).
    pub seen: Vec<u8>,
}

impl Tunnel {
    /// Reads until `needle` has been seen (anywhere since the start) or
    /// `limit` passes; panics on a read error other than a timeout.
    pub fn wait_for(&mut self, needle: &[u8], limit: Duration) -> bool {
        let end = Instant::now() + limit;
        let mut buf = [0u8; 16384];
        loop {
            if find(&self.seen, needle).is_some() {
                return true;
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            self.stream.set_read_timeout(Some(left.min(Duration::from_millis(200)))).unwrap();
            match self.stream.read(&mut buf) {
                Ok(0) => return find(&self.seen, needle).is_some(),
                Ok(n) => self.seen.extend_from_slice(&buf[..n]),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => panic!("tunnel read failed: {e}"),
            }
        }
    }

    /// The first 2000 bytes read, as text (for failure messages).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.seen[..self.seen.len().min(2000)]).into_owned()
    }
}
