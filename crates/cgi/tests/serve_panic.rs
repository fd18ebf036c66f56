//! `pubsub-cgi serve` survives a request that panics: that request alone is
//! answered `500`, and a tunnel open on the same server keeps receiving
//! events. No input may panic, so the panic is injected: the `failpoints`
//! build of `pubsub-cgi` ([`kn_test_support::failpoint_cgi`], in its own
//! target directory) panics on a request carrying
//! `kn_failpoint_panic` when `KN_FAILPOINT` lists `handler-panic`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kn_test_support::failpoint_cgi;

struct Server {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start(env: &[(&str, &str)]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let armed = dir.path().join("failpoints");
        std::fs::write(&armed, "handler-panic\n").unwrap();
        let mut child = Command::new(failpoint_cgi())
            .args(["serve", "--listen", "127.0.0.1:0", "--root"])
            .arg(dir.path().join("events"))
            .current_dir(dir.path())
            .env_remove("KN_EVENTS")
            .env_remove("GATEWAY_INTERFACE")
            .env("KN_FAILPOINT", &armed)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pubsub-cgi serve");
        let mut stdout = child.stdout.take().unwrap();
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while stdout.read(&mut byte).unwrap() == 1 && byte[0] != b'\n' {
            line.push(byte[0]);
        }
        let line = String::from_utf8_lossy(&line).into_owned();
        // knpubsub serving http://127.0.0.1:PORT/kn (store DIR)
        let addr = line
            .strip_prefix("knpubsub serving http://")
            .and_then(|rest| rest.split_once("/kn (store "))
            .map(|(addr, _)| addr.to_string())
            .unwrap_or_else(|| panic!("unexpected first line: {line:?}"));
        std::mem::forget(stdout);
        Server { child, addr, _dir: dir }
    }

    fn send(&self, target: &str) -> TcpStream {
        let mut stream = TcpStream::connect(&self.addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(stream, "GET {target} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", self.addr).unwrap();
        stream
    }

    /// One request; the whole response.
    fn get(&self, target: &str) -> String {
        let mut stream = self.send(target);
        let mut out = Vec::new();
        let _ = stream.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads from `stream` until `needle` has been seen (true) or 10 s passed.
fn wait_for(stream: &mut TcpStream, seen: &mut Vec<u8>, needle: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buf = [0u8; 8192];
    while !seen.windows(needle.len()).any(|w| w == needle.as_bytes()) {
        if Instant::now() > deadline {
            return false;
        }
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return false,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    }
    true
}

fn a_panicking_request_is_500_and_a_parallel_tunnel_keeps_receiving(env: &[(&str, &str)]) {
    let server = Server::start(env);
    let journal = "/who/a/s/1/kn_journal";
    let mut tunnel = server.send(&format!("/kn{journal}?kn_response_format=simple"));
    let mut seen = Vec::new();
    assert!(wait_for(&mut tunnel, &mut seen, "200 Watching topic"), "{}", String::from_utf8_lossy(&seen));

    let notify = |payload: &str| server.get(&format!("/kn?do_method=notify&kn_to={journal}&kn_payload={payload}"));
    assert!(notify("before-the-panic").starts_with("HTTP/1.1 200"));
    assert!(wait_for(&mut tunnel, &mut seen, "before-the-panic"), "{}", String::from_utf8_lossy(&seen));

    let panicked = server.get(&format!("/kn?do_method=notify&kn_to={journal}&kn_payload=x&kn_failpoint_panic=1&kn_response_format=simple"));
    assert!(panicked.starts_with("HTTP/1.1 500"), "{panicked}");
    assert!(panicked.contains("panicked"), "{panicked}");

    assert!(notify("after-the-panic").starts_with("HTTP/1.1 200"), "the server still answers");
    assert!(wait_for(&mut tunnel, &mut seen, "after-the-panic"), "the tunnel still streams: {}", String::from_utf8_lossy(&seen));
}

#[test]
fn a_panicking_request_is_500_and_a_parallel_tunnel_keeps_receiving_inline() {
    // The default store (no outbound URLs, no fsync) handles requests on
    // the async worker itself.
    a_panicking_request_is_500_and_a_parallel_tunnel_keeps_receiving(&[]);
}

#[test]
fn a_panicking_request_is_500_and_a_parallel_tunnel_keeps_receiving_on_the_blocking_pool() {
    a_panicking_request_is_500_and_a_parallel_tunnel_keeps_receiving(&[("KN_SYNC", "always")]);
}
