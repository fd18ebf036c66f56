//! `pubsub-cgi serve` under pressure: a topic locked for seconds (what a
//! compaction does) delays no one on another topic, and connections and
//! tunnels are capped with `503` and `Retry-After`. The real binary on a
//! loopback port, spoken to over raw HTTP/1.1.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use kn_test_support::raw::{Conn, Reply, Tunnel};
use kn_test_support::{find, wait_for, Serve};

/// A running `pubsub-cgi serve` with its own store.
struct Server {
    _serve: Serve,
    addr: String,
    dir: tempfile::TempDir,
}

impl Server {
    fn start(args: &[&str], env: &[(&str, &str)]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let mut command = Serve::command_of(Path::new(env!("CARGO_BIN_EXE_pubsub-cgi")), &dir.path().join("events"), None);
        command
            .args(args)
            .current_dir(dir.path())
            .env_remove("KN_MAX_CONNECTIONS")
            .env_remove("KN_MAX_TUNNELS")
            .envs(env.iter().copied());
        let serve = Serve::spawn(command);
        let addr = serve.addr().to_string();
        Server { _serve: serve, addr, dir }
    }

    fn connect(&self) -> Conn {
        Conn::connect(&self.addr, Duration::from_secs(20))
    }

    fn post(&self, body: &str) -> Reply {
        let mut conn = self.connect();
        conn.send("POST", "/kn", body.as_bytes());
        conn.reply()
    }

    /// Sends a tunnel request and reads the head and whatever comes first.
    fn open_tunnel(&self, target: &str) -> Tunnel {
        let mut conn = self.connect();
        conn.send("GET", target, b"");
        conn.into_tunnel()
    }

    fn tunnel(&self, target: &str) -> Tunnel {
        let mut tunnel = self.open_tunnel(target);
        assert!(tunnel.wait_for(b"status: 200 Watching topic", Duration::from_secs(10)), "no status: {}", tunnel.text());
        tunnel
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    find(haystack, needle).is_some()
}

// ----- the event loop never blocks --------------------------------------------

/// A compaction holds a topic's `.lock` for seconds; here the test process
/// holds it (the same `flock`). Notifies to that topic wait, more of them
/// than the server has async workers; meanwhile a notify to another topic
/// is answered and reaches that topic's tunnel, while the first topic is
/// still locked. Before the fix the waiting notifies sat on the async
/// workers, and everything else waited for the lock.
#[test]
fn a_locked_topic_delays_no_request_and_no_tunnel_on_another_topic() {
    const WAITING: usize = 8;
    let server = Server::start(&[], &[]);
    assert_eq!(server.post("kn_to=/what/locked&kn_payload=first&kn_response_format=simple").status_line, "HTTP/1.1 200 Notified");
    let mut tunnel = server.tunnel("/kn/what/free?kn_response_format=simple");

    let lock = File::options().read(true).write(true).open(server.dir.path().join("events/what/locked/.lock")).unwrap();
    lock.lock().unwrap();
    let answered = Arc::new(AtomicUsize::new(0));
    let waiting: Vec<_> = (0..WAITING)
        .map(|i| {
            let mut conn = server.connect();
            let answered = answered.clone();
            std::thread::spawn(move || {
                conn.send("POST", "/kn", format!("kn_to=/what/locked&kn_payload=waited{i}&kn_response_format=simple").as_bytes());
                let reply = conn.reply();
                answered.fetch_add(1, Ordering::SeqCst);
                reply.status_line
            })
        })
        .collect();
    // Let the server take them all up (they wait for the lock).
    std::thread::sleep(Duration::from_millis(500));

    let (tx, rx) = mpsc::channel();
    let mut conn = server.connect();
    std::thread::spawn(move || {
        conn.send("POST", "/kn", b"kn_to=/what/free&kn_payload=not-held-up&kn_response_format=simple");
        let _ = tx.send(conn.reply().status_line);
    });
    let status = rx.recv_timeout(Duration::from_secs(5));
    assert_eq!(status.as_deref(), Ok("HTTP/1.1 200 Notified"), "a notify to another topic waited for the lock");
    assert!(tunnel.wait_for(b"not-held-up", Duration::from_secs(5)), "the event never reached the tunnel: {}", tunnel.text());
    // All of this happened while /what/locked was still locked.
    assert_eq!(answered.load(Ordering::SeqCst), 0, "a notify to the locked topic was answered while it was locked");

    lock.unlock().unwrap();
    for thread in waiting {
        assert_eq!(thread.join().unwrap(), "HTTP/1.1 200 Notified");
    }
}

// ----- caps -------------------------------------------------------------------

/// With `--max-tunnels 2`, the third tunnel gets a `503` status event in
/// its format with `Retry-After`; one-shot requests still go through; once
/// a tunnel closes a new one is accepted.
#[test]
fn the_tunnel_past_the_cap_gets_503_and_a_closed_one_frees_its_place() {
    let server = Server::start(&["--max-tunnels", "2"], &[]);
    let first = server.tunnel("/kn/what/t1?kn_response_format=simple");
    let _second = server.tunnel("/kn/what/t2?kn_response_format=simple");

    let mut conn = server.connect();
    conn.send("GET", "/kn/what/t3?kn_response_format=simple&kn_status_from=capped", b"");
    let refused = conn.reply();
    assert_eq!(refused.status_line, "HTTP/1.1 503 Service Unavailable", "{}", refused.text());
    assert_eq!(refused.header("retry-after"), Some("5"));
    assert_eq!(refused.header("content-type"), Some("text/plain; charset=utf-8"));
    assert!(refused.text().contains("status: 503 Service Unavailable"), "{}", refused.text());
    assert!(refused.text().contains("too many tunnels: this server holds at most 2 at once"), "{}", refused.text());
    assert!(refused.text().contains("kn_route_location: capped"), "{}", refused.text());
    // The same as a page of JavaScript.
    let mut conn = server.connect();
    conn.send("GET", "/kn/what/t3?kn_response_format=js", b"");
    let refused = conn.reply();
    assert_eq!(refused.status_line, "HTTP/1.1 503 Service Unavailable");
    assert!(refused.text().contains("503 Service Unavailable") && refused.text().contains("<script"), "{}", refused.text());

    assert_eq!(server.post("kn_to=/what/t1&kn_payload=one-shot&kn_response_format=simple").status_line, "HTTP/1.1 200 Notified");

    drop(first);
    // The server notices at the next keep-alive write (every second).
    let mut reopened = None;
    let accepted = wait_for(Duration::from_secs(15), || {
        let mut tunnel = server.open_tunnel("/kn/what/t3?kn_response_format=simple");
        tunnel.wait_for(b"status: ", Duration::from_secs(5));
        let ok = contains(&tunnel.seen, b"status: 200 Watching topic");
        if ok {
            reopened = Some(tunnel);
        }
        ok
    });
    assert!(accepted, "no tunnel was accepted after one closed");
}

/// With `--max-connections 2` (here from `KN_MAX_CONNECTIONS`), a third
/// connection is answered `503` with `Retry-After` and closed; once one
/// closes a new one is served.
#[test]
fn the_connection_past_the_cap_gets_503_and_a_closed_one_frees_its_place() {
    let server = Server::start(&[], &[("KN_MAX_CONNECTIONS", "2")]);
    let mut first = server.connect();
    let mut second = server.connect();
    for conn in [&mut first, &mut second] {
        conn.send("POST", "/kn", b"kn_to=/what/c&kn_payload=x&kn_response_format=simple");
        assert_eq!(conn.reply().status_line, "HTTP/1.1 200 Notified");
    }

    let mut third = server.connect();
    third.send("POST", "/kn", b"kn_to=/what/c&kn_payload=y&kn_response_format=simple");
    let refused = third.reply();
    assert_eq!(refused.status_line, "HTTP/1.1 503 Service Unavailable", "{}", refused.text());
    assert_eq!(refused.header("retry-after"), Some("5"));
    assert_eq!(refused.header("connection"), Some("close"));
    assert!(refused.text().contains("too many connections: this server holds at most 2 at once"), "{}", refused.text());
    let mut rest = Vec::new();
    assert_eq!(third.reader.read_to_end(&mut rest).unwrap(), 0, "the refused connection stays open");

    drop(first);
    let served = wait_for(Duration::from_secs(10), || {
        server.post("kn_to=/what/c&kn_payload=z&kn_response_format=simple").status_line == "HTTP/1.1 200 Notified"
    });
    assert!(served, "no connection was served after one closed");
    // The one kept open is still served.
    second.send("POST", "/kn", b"kn_to=/what/c&kn_payload=w&kn_response_format=simple");
    assert_eq!(second.reply().status_line, "HTTP/1.1 200 Notified");
}

#[test]
fn a_cap_of_zero_or_garbage_is_refused_on_the_command_line() {
    for (args, env) in [(vec!["--max-tunnels", "0"], vec![]), (vec![], vec![("KN_MAX_CONNECTIONS", "lots")])] {
        let output = Command::new(env!("CARGO_BIN_EXE_pubsub-cgi"))
            .args(["serve", "--listen", "127.0.0.1:0", "--root", "/nonexistent/kn"])
            .args(&args)
            .env_remove("GATEWAY_INTERFACE")
            .env_remove("KN_MAX_CONNECTIONS")
            .env_remove("KN_MAX_TUNNELS")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?} {env:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("max-tunnels") || stderr.contains("KN_MAX_CONNECTIONS"), "{stderr}");
    }
}
