//! The harness of tests/reliability.rs and tests/reliability_load.rs: a
//! store and its checks, posts through Apache, `pubsub.cgi` processes,
//! and a tunnel follower that keeps only what it has not parsed.
#![allow(dead_code)] // each test file uses its part

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use crate::e2e::{self, parse_frames, KnEvent};
use crate::support::{self, Apache};
use kn_journal::{Config, Selection, Store, Topic};

/// The tests of these files run one at a time: each drives a real Apache
/// hard (hundreds of CGI processes, killers, full disks), and two at once
/// on two cores made Apache drop connections once.
pub static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Room for hundreds of tunnels: each one holds an Apache worker thread
/// and a CGI process for as long as it is open.
pub const MANY_WORKERS: &str = "ServerLimit 16\nStartServers 4\nMinSpareThreads 25\nMaxSpareThreads 400\nMaxRequestWorkers 400\n";

pub fn apache_available() -> bool {
    support::available(support::APACHE)
}

/// Opens the store Apache wrote, directly (Apache stopped first).
pub fn open_store(root: &Path) -> Store {
    let mut c = Config::new(root);
    c.reserve_bytes = 0;
    Store::open_with(c).expect("open the store")
}

pub fn topic(name: &str) -> Topic {
    Topic::parse(name).unwrap()
}

/// The `kn_id`s of `topic`'s current events, oldest first.
pub fn ids_of(store: &Store, name: &str) -> Vec<String> {
    store
        .events(&topic(name), &Selection::all())
        .map(|s| s.events)
        .unwrap_or_default()
        .iter()
        .map(|e| String::from_utf8_lossy(e.id().unwrap_or(b"")).into_owned())
        .collect()
}

/// `verify` after a crash: every problem must be a torn tail (a record
/// cut short by a killed writer, never acknowledged); `repair` truncates
/// them and `verify` is then clean. Returns (records, torn tails).
pub fn verify_allowing_torn_tails(store: &Store) -> (usize, usize) {
    let report = store.verify().expect("verify");
    for p in &report.problems {
        assert!(p.reason.contains("torn tail"), "not a torn tail: {p:?}");
    }
    let torn = report.problems.len();
    if torn > 0 {
        store.repair().expect("repair");
    }
    let again = store.verify().expect("verify after repair");
    assert!(again.problems.is_empty(), "still bad after repair: {:?}", again.problems);
    (again.records, torn)
}

pub fn urlencode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

pub fn form(pairs: &[(&str, &str)]) -> String {
    pairs.iter().map(|(k, v)| format!("{}={}", urlencode(k), urlencode(v))).collect::<Vec<_>>().join("&")
}

/// A POST over a fresh HTTP/1.0 connection that never panics: the status
/// (0 when the connection broke before a status line) and the text.
pub fn try_post(url: &str, body: &str, limit: Duration) -> (u16, String) {
    let (host, path) = e2e::host_and_path(url);
    let Ok(mut sock) = TcpStream::connect(&host) else { return (0, String::new()) };
    let head = format!(
        "POST {path} HTTP/1.0\r\nHost: {host}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let _ = sock.write_all(head.as_bytes()).and_then(|_| sock.write_all(body.as_bytes()));
    let _ = sock.set_read_timeout(Some(limit));
    let mut got = Vec::new();
    let _ = sock.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got).into_owned();
    let status = text.lines().next().and_then(|l| l.split_whitespace().nth(1)).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, text)
}

/// Pids of the CGI processes Apache runs from its private directory, with
/// whether each is a tunnel (a GET with `do_method=route`).
pub fn cgi_processes(apache: &Apache) -> Vec<(u32, bool)> {
    e2e::processes_under(apache.dir().path())
        .into_iter()
        .map(|pid| {
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let tunnel = env.split(|&b| b == 0).any(|v| v.starts_with(b"QUERY_STRING=") && support::find(v, b"do_method=route").is_some());
            (pid, tunnel)
        })
        .collect()
}

/// A tiny xorshift generator: random enough for kill timing, no crate.
pub struct Rng(u64);

impl Rng {
    pub fn new() -> Rng {
        let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1);
        Rng(seed | 1)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// A simple-format tunnel read on its own connection, keeping only what
/// is not parsed yet (a long tunnel's bytes are not all kept in memory).
pub struct Follower {
    pub sock: TcpStream,
    pub buf: Vec<u8>,
    pub in_body: bool,
    pub status: Option<u16>,
    pub eof: bool,
}

impl Follower {
    pub fn open(url: &str) -> Option<Follower> {
        let (host, path) = e2e::host_and_path(url);
        let mut sock = TcpStream::connect(&host).ok()?;
        sock.write_all(format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes()).ok()?;
        Some(Follower { sock, buf: Vec::new(), in_body: false, status: None, eof: false })
    }

    /// Events that arrived within `limit` (none on timeout or end).
    pub fn poll(&mut self, limit: Duration) -> Vec<KnEvent> {
        let _ = self.sock.set_read_timeout(Some(limit));
        let mut chunk = [0u8; 64 * 1024];
        match self.sock.read(&mut chunk) {
            Ok(0) => {
                self.eof = true;
                return Vec::new();
            }
            Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted) => {
                return Vec::new();
            }
            Err(_) => {
                // A reset is the server hanging up too.
                self.eof = true;
                return Vec::new();
            }
        }
        if !self.in_body {
            let Some(i) = support::find(&self.buf, b"\r\n\r\n") else { return Vec::new() };
            let head = String::from_utf8_lossy(&self.buf[..i]).into_owned();
            self.status = head.lines().next().and_then(|l| l.split_whitespace().nth(1)).and_then(|c| c.parse().ok());
            self.buf.drain(..i + 4);
            self.in_body = true;
            if self.status != Some(200) {
                // An error page (the CGI was killed before its headers):
                // nothing to follow.
                self.eof = true;
                return Vec::new();
            }
        }
        let mut pos = 0;
        let events = parse_frames(&self.buf, &mut pos);
        self.buf.drain(..pos);
        events
    }
}

pub fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}
