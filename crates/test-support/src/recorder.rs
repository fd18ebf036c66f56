//! The server side of a test: HTTP requests as a listener received them
//! (a remote PubSub server stand-in, an outbound transform, …).

use std::fmt::Debug;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

/// A listener on a free loopback port that hands each connection in turn,
/// on one background thread, to a handler and records what it returns: a
/// remote server, transform or proxy the test owns.
pub struct Listener<T> {
    /// Its port on 127.0.0.1.
    pub port: u16,
    seen: mpsc::Receiver<T>,
}

impl<T: Send + 'static> Listener<T> {
    /// Starts listening; `handle` answers one connection and returns what
    /// to record of it.
    pub fn start(mut handle: impl FnMut(TcpStream) -> T + Send + 'static) -> Listener<T> {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (tx, seen) = mpsc::channel();
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                if tx.send(handle(stream)).is_err() {
                    return;
                }
            }
        });
        Listener { port, seen }
    }

    /// `http://127.0.0.1:PORT` followed by `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// The record of the next connection, if one arrives within 15 s.
    pub fn next(&self) -> Option<T> {
        self.seen.recv_timeout(Duration::from_secs(15)).ok()
    }

    /// The records of every connection handled so far, not yet taken.
    pub fn drain(&self) -> Vec<T> {
        self.seen.try_iter().collect()
    }

    /// Panics if a connection was handled (waiting 300 ms for stragglers).
    pub fn assert_silent(&self, what: &str)
    where
        T: Debug,
    {
        if let Ok(record) = self.seen.recv_timeout(Duration::from_millis(300)) {
            panic!("{what}: the listener was contacted: {record:?}");
        }
    }
}

/// An HTTP request as a listener received it.
#[derive(Clone, Debug)]
pub struct Received {
    /// `METHOD TARGET HTTP/1.1`.
    pub request_line: String,
    /// Header names and values as sent (values trimmed), in order.
    pub headers: Vec<(String, String)>,
    /// The body (`Content-Length` bytes; none without that header).
    pub body: Vec<u8>,
}

impl Received {
    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The body's form pairs, decoded ([`form_decode`]).
    pub fn form(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        form_decode(&self.body)
    }

    /// The value of form field `name`, if the body has it.
    pub fn field(&self, name: &str) -> Option<Vec<u8>> {
        self.form().into_iter().find(|(n, _)| n == name.as_bytes()).map(|(_, v)| v)
    }
}

/// Reads one request (its head, then a `Content-Length` body) from `conn`;
/// `None` when the client closes or the read fails first (set a read
/// timeout on `conn` to bound the wait).
pub fn read_request(conn: &mut TcpStream) -> Option<Received> {
    let head = read_head(conn);
    if !head.ends_with(b"\r\n\r\n") {
        return None;
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or("").to_string();
    let headers: Vec<(String, String)> =
        lines.filter_map(|l| l.split_once(':').map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))).collect();
    let len: usize = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    conn.read_exact(&mut body).ok()?;
    Some(Received { request_line, headers, body })
}

/// Reads a request head byte by byte, up to and including its blank line;
/// what arrived when the client closes or the read fails first (a partial
/// head, maybe empty). The body, if any, is left unread.
pub fn read_head(conn: &mut TcpStream) -> Vec<u8> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match conn.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    head
}

/// Reads a request's head (as text) and its `Content-Length` body, waiting
/// at most 5 s for each read. Lenient, for listeners that record whatever
/// comes: a short head is returned as it is, a short body zero-filled.
pub fn read_head_and_body(conn: &mut TcpStream) -> (String, Vec<u8>) {
    let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(5)));
    let head = String::from_utf8_lossy(&read_head(conn)).into_owned();
    let len = head
        .lines()
        .find_map(|l| l.split_once(':').filter(|(n, _)| n.eq_ignore_ascii_case("content-length")))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0usize);
    let mut body = vec![0; len];
    let _ = conn.read_exact(&mut body);
    (head, body)
}

/// Decodes an `application/x-www-form-urlencoded` body: `&`-separated
/// pairs, `+` a space, `%XX` a byte; empty pairs are skipped.
pub fn form_decode(body: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    body.split(|&b| b == b'&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let eq = pair.iter().position(|&b| b == b'=').unwrap_or(pair.len());
            (url_decode(&pair[..eq]), url_decode(pair.get(eq + 1..).unwrap_or(b"")))
        })
        .collect()
}

/// Decodes one form component; panics on a malformed `%` escape (the
/// sender under test wrote a bad body).
pub fn url_decode(v: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < v.len() {
        match v[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = v.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok()).expect("a %XX escape");
                out.push(u8::from_str_radix(hex, 16).expect("hex escape"));
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_decode_reads_plus_and_escapes() {
        assert_eq!(
            form_decode(b"a=b+c&&d%26=%3D"),
            vec![(b"a".to_vec(), b"b c".to_vec()), (b"d&".to_vec(), b"=".to_vec())]
        );
    }
}
