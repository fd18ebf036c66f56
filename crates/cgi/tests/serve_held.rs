//! Tunnels `serve` holds without hyper (crates/cgi/src/serve_held.rs):
//! the bytes on the wire are hyper's framing (chunked for HTTP/1.1,
//! close-delimited for HTTP/1.0, the head alone for `HEAD`), the
//! connection serves the next request after a tunnel ends, bytes the
//! client sent meanwhile are that request, and a client that goes away
//! frees its tunnel (the `/metrics` gauge).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use kn_test_support::raw::Conn;
use kn_test_support::Serve;

fn start(env: &[(&str, &str)]) -> (Serve, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut command = Serve::command_of(Path::new(env!("CARGO_BIN_EXE_pubsub-cgi")), &dir.path().join("events"), None);
    command.envs(env.iter().copied());
    (Serve::spawn(command), dir)
}

fn connect(serve: &Serve) -> TcpStream {
    let stream = TcpStream::connect(serve.addr()).unwrap();
    stream.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    stream
}

/// Reads until `done` says the bytes so far are complete, or `limit`.
fn read_until(stream: &mut TcpStream, seen: &mut Vec<u8>, limit: Duration, done: impl Fn(&[u8]) -> bool) -> bool {
    let until = Instant::now() + limit;
    let mut buf = [0u8; 4096];
    while Instant::now() < until {
        if done(seen) {
            return true;
        }
        match stream.read(&mut buf) {
            Ok(0) => return done(seen),
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
    }
    done(seen)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The chunks of a chunked body, and the bytes after its last chunk;
/// panics on a framing error.
fn dechunk(mut body: &[u8]) -> (Vec<Vec<u8>>, &[u8]) {
    let mut chunks = Vec::new();
    loop {
        let line = find(body, b"\r\n").expect("a chunk size line");
        let size = usize::from_str_radix(std::str::from_utf8(&body[..line]).unwrap(), 16).expect("a hex chunk size");
        body = &body[line + 2..];
        if size == 0 {
            assert_eq!(&body[..2], b"\r\n", "the last chunk ends the body");
            return (chunks, &body[2..]);
        }
        chunks.push(body[..size].to_vec());
        assert_eq!(&body[size..size + 2], b"\r\n");
        body = &body[size + 2..];
    }
}

/// HTTP/1.1: the head says chunked, every piece is a chunk of its own
/// (status, padding, keep-alive, trailer), the last chunk ends the
/// tunnel at `KN_TUNNEL_MAX_TIME`, and the connection then serves a
/// notify pipelined while the tunnel was open.
#[test]
fn http_1_1_tunnels_are_chunked_and_the_connection_serves_the_next_request() {
    let (serve, _dir) = start(&[("KN_TUNNEL_MAX_TIME", "1")]);
    let mut stream = connect(&serve);
    let tunnel = "GET /kn/who/h/s/1/kn_journal?kn_response_format=simple HTTP/1.1\r\nHost: t\r\n\r\n";
    stream.write_all(tunnel.as_bytes()).unwrap();
    let mut seen = Vec::new();
    assert!(read_until(&mut stream, &mut seen, Duration::from_secs(5), |s| find(s, b"Watching topic").is_some()), "{}", String::from_utf8_lossy(&seen));
    // A request sent while the tunnel is open waits for its end.
    let body = "kn_to=/who/h/s/1/kn_journal&kn_payload=after&kn_response_format=simple";
    write!(stream, "POST /kn HTTP/1.1\r\nHost: t\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    assert!(read_until(&mut stream, &mut seen, Duration::from_secs(5), |s| find(s, b"HTTP/1.1 200 Notified").is_some() && s.ends_with(b"\n")));
    let head_end = find(&seen, b"\r\n\r\n").unwrap() + 4;
    let head = String::from_utf8_lossy(&seen[..head_end]).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("\r\ntransfer-encoding: chunked\r\n"), "{head}");
    assert!(head.contains("\r\nx-accel-buffering: no\r\n"), "{head}");
    assert!(!head.contains("connection: close"), "{head}");
    let (chunks, rest) = dechunk(&seen[head_end..]);
    assert!(!chunks.is_empty(), "the status and padding");
    assert!(find(&chunks[0], b"Watching topic").is_some());
    assert!(chunks.iter().all(|c| !c.is_empty()));
    assert!(String::from_utf8_lossy(rest).starts_with("HTTP/1.1 200 Notified"), "{}", String::from_utf8_lossy(rest));
}

/// A notify sent in the same write as the tunnel's request (pipelined)
/// is answered after the tunnel's end, in order; a second tunnel
/// pipelined behind a first is refused (`503`), the first kept.
#[test]
fn requests_pipelined_behind_a_tunnel_are_answered_after_it() {
    let (serve, _dir) = start(&[("KN_TUNNEL_MAX_TIME", "1")]);
    let mut stream = connect(&serve);
    let body = "kn_to=/who/p/s/1/kn_journal&kn_payload=behind&kn_response_format=simple";
    let mut both = b"GET /kn/who/p/s/1/kn_journal?kn_response_format=simple HTTP/1.1\r\nHost: t\r\n\r\n".to_vec();
    write!(both, "POST /kn HTTP/1.1\r\nHost: t\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    both.extend_from_slice(b"GET /kn/who/p/s/2/kn_journal?kn_response_format=simple HTTP/1.1\r\nHost: t\r\n\r\n");
    stream.write_all(&both).unwrap();
    let mut seen = Vec::new();
    assert!(read_until(&mut stream, &mut seen, Duration::from_secs(5), |s| find(s, b"HTTP/1.1 503").is_some_and(|at| find(&s[at..], b"\r\n\r\n").is_some())), "{}", String::from_utf8_lossy(&seen));
    let head_end = find(&seen, b"\r\n\r\n").unwrap() + 4;
    assert!(seen.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&seen));
    let (chunks, rest) = dechunk(&seen[head_end..]);
    assert!(find(&chunks[0], b"Watching topic").is_some());
    let rest = String::from_utf8_lossy(rest);
    let notified = rest.find("HTTP/1.1 200 Notified").unwrap_or_else(|| panic!("{rest}"));
    assert!(rest[notified..].contains("HTTP/1.1 503"), "{rest}");
}

/// HTTP/1.0: no chunk framing, the pieces as they are, the connection
/// closed at the tunnel's end.
#[test]
fn http_1_0_tunnels_are_close_delimited() {
    let (serve, _dir) = start(&[("KN_TUNNEL_MAX_TIME", "1")]);
    let mut stream = connect(&serve);
    stream.write_all(b"GET /kn/who/o/s/1/kn_journal?kn_response_format=simple HTTP/1.0\r\nHost: t\r\n\r\n").unwrap();
    let mut seen = Vec::new();
    let mut closed = false;
    let until = Instant::now() + Duration::from_secs(5);
    let mut buf = [0u8; 4096];
    while Instant::now() < until {
        match stream.read(&mut buf) {
            Ok(0) => {
                closed = true;
                break;
            }
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
    }
    assert!(closed, "closed at the end: {}", String::from_utf8_lossy(&seen));
    let head_end = find(&seen, b"\r\n\r\n").unwrap() + 4;
    let head = String::from_utf8_lossy(&seen[..head_end]).to_ascii_lowercase();
    assert!(head.starts_with("http/1.0 200"), "{head}");
    assert!(!head.contains("transfer-encoding"), "{head}");
    let body = &seen[head_end..];
    assert!(body.starts_with(b"<") || find(body, b"Watching topic").is_some(), "{}", String::from_utf8_lossy(body));
    assert!(find(body, b"\r\n0\r\n\r\n").is_none(), "no chunk framing");
}

/// `HEAD` at `/kn` is answered as before (`501`, no tunnel), on a
/// connection that goes on.
#[test]
fn head_of_a_tunnel_is_answered_as_before() {
    let (serve, _dir) = start(&[]);
    let mut conn = Conn::connect(serve.addr(), Duration::from_secs(10));
    conn.send("HEAD", "/kn/who/e/s/1/kn_journal?kn_response_format=simple", b"");
    let reply = conn.read_reply(true);
    assert!(reply.status_line.starts_with("HTTP/1.1 501"), "{}", reply.status_line);
    conn.send("GET", "/kn/who/e/s/1/kn_journal?kn_response_format=simple", b"");
    let mut tunnel = conn.into_tunnel();
    assert!(tunnel.wait_for(b"Watching topic", Duration::from_secs(5)), "{}", tunnel.text());
}

fn open_tunnels(serve: &Serve) -> u64 {
    let mut conn = Conn::connect(serve.addr(), Duration::from_secs(10));
    conn.send("GET", "/metrics", b"");
    let text = conn.read_reply(false).text();
    let line = text.lines().find(|l| l.starts_with("kn_serve_open_tunnels ")).unwrap_or_else(|| panic!("{text}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Many held tunnels, then their clients go: each is freed.
#[test]
fn held_tunnels_are_freed_when_their_clients_go() {
    let (serve, _dir) = start(&[]);
    let base = open_tunnels(&serve);
    let mut tunnels = Vec::new();
    for i in 0..100 {
        let mut stream = connect(&serve);
        write!(stream, "GET /kn/who/g{i}/s/1/kn_journal?kn_response_format=sse HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
        let mut seen = Vec::new();
        assert!(read_until(&mut stream, &mut seen, Duration::from_secs(5), |s| find(s, b"Watching topic").is_some()));
        tunnels.push(stream);
    }
    assert_eq!(open_tunnels(&serve), base + 100);
    drop(tunnels);
    let until = Instant::now() + Duration::from_secs(10);
    while open_tunnels(&serve) > base && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(open_tunnels(&serve), base);
}
