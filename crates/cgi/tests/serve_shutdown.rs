//! `pubsub-cgi serve` stopping on SIGTERM (docs/DEPLOY.md, "Rolling
//! restarts"): every tunnel ends at once with a `503` status event and the
//! terminating chunk, so that its client reconnects at once; the server
//! exits as soon as its connections are done, and never later than
//! `KN_SHUTDOWN_GRACE`. Real clients (curl) against the real binary.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kn_test_support::raw::{Conn, Tunnel};
use kn_test_support::{available, wait_exit, Serve};

const CURL: &str = "/usr/bin/curl";

fn start(dir: &Path, env: &[(&str, &str)]) -> Serve {
    let mut command = Serve::command_of(Path::new(env!("CARGO_BIN_EXE_pubsub-cgi")), &dir.join("events"), None);
    command.current_dir(dir).env_remove("KN_SHUTDOWN_GRACE").envs(env.iter().copied());
    Serve::spawn(command)
}

/// `curl -sN URL` writing the body to `out`.
fn curl(url: &str, out: &Path) -> Child {
    Command::new(CURL)
        .args(["-sN", "--max-time", "30", "-o"])
        .arg(out)
        .arg(url)
        .stdin(Stdio::null())
        .spawn()
        .expect("start curl")
}

/// Waits until `path` holds `needle`.
fn wait_for_file(path: &Path, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(needle) || Instant::now() > deadline {
            return text;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn sigterm(serve: &Serve) {
    // SAFETY: a plain system call on our own child's pid.
    assert_eq!(unsafe { libc::kill(serve.child.id() as libc::pid_t, libc::SIGTERM) }, 0);
}

#[test]
fn sigterm_ends_every_tunnel_with_a_status_and_the_last_chunk_and_serve_exits_at_once() {
    if !available(CURL) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut serve = start(dir.path(), &[]);
    let url = serve.url();
    let (simple, sse) = (dir.path().join("simple.out"), dir.path().join("sse.out"));
    let mut simple_client = curl(&format!("{url}/who/a/kn_journal?do_method=route&kn_response_format=simple&kn_status_from=t1"), &simple);
    let mut sse_client = curl(&format!("{url}/who/b/kn_journal?do_method=route&kn_response_format=sse&kn_status_from=t2"), &sse);
    // A js tunnel read raw, to see the terminating chunk itself.
    let mut conn = Conn::connect(serve.addr(), Duration::from_secs(10));
    conn.send("GET", "/kn/who/c/kn_journal?do_method=route&kn_status_from=t3", b"");
    let mut js: Tunnel = conn.into_tunnel();
    assert!(js.wait_for(b"200 Watching topic", Duration::from_secs(10)), "{}", js.text());
    assert!(wait_for_file(&simple, "200 Watching topic").contains("200 Watching topic"));
    assert!(wait_for_file(&sse, "200 Watching topic").contains("200 Watching topic"));

    let signalled = Instant::now();
    sigterm(&serve);
    let exit = wait_exit(&mut serve.child, Duration::from_secs(10)).expect("serve still running 10 s after SIGTERM");
    let took = signalled.elapsed();
    assert!(exit.success(), "serve exited with {exit}");
    // Well before the default 5 s grace: nothing was left to wait for.
    assert!(took < Duration::from_secs(2), "serve took {took:?} to stop");

    // curl exits 0 only when the chunked body ended with its last chunk
    // (a cut one is exit 18).
    for (client, out, from) in [(&mut simple_client, &simple, "t1"), (&mut sse_client, &sse, "t2")] {
        let status = wait_exit(client, Duration::from_secs(5)).expect("curl still running after serve stopped");
        let body = std::fs::read_to_string(out).unwrap();
        assert_eq!(status.code(), Some(0), "curl: {status}; body:\n{body}");
        assert!(body.contains("503 Service Unavailable") && body.contains("the server is shutting down"), "no final status event:\n{body}");
        assert!(body.contains(from), "the status event answers kn_status_from {from}:\n{body}");
    }
    assert!(js.wait_for(b"0\r\n\r\n", Duration::from_secs(5)), "no terminating chunk:\n{}", js.text());
    let seen = String::from_utf8_lossy(&js.seen).into_owned();
    let status = seen.rfind("503 Service Unavailable").unwrap_or_else(|| panic!("no final status event:\n{seen}"));
    assert!(seen[status..].contains("</html>"), "the js page is closed after the status event");
}

/// The boundary of KN_SHUTDOWN_GRACE: a response that does not end by
/// itself (a Durable Streams long-poll) holds the server no longer than
/// the grace; then the server exits anyway.
#[test]
fn a_response_still_open_at_the_shutdown_grace_is_cut_and_serve_exits_then() {
    let dir = tempfile::tempdir().unwrap();
    let mut serve = start(dir.path(), &[("KN_SHUTDOWN_GRACE", "1"), ("KN_STREAM_LONG_POLL_MS", "60000")]);
    let mut put = std::net::TcpStream::connect(serve.addr()).unwrap();
    put.write_all(b"PUT /v1/stream/held HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").unwrap();
    let mut created = String::new();
    put.read_to_string(&mut created).unwrap();
    assert!(created.starts_with("HTTP/1.1 201"), "{created}");
    let mut poll = Conn::connect(serve.addr(), Duration::from_secs(10));
    poll.send("GET", "/v1/stream/held?offset=-1&live=long-poll", b"");
    let mut held = poll.into_tunnel();
    // The long-poll is waiting (no answer yet) when the signal comes.
    assert!(!held.wait_for(b"HTTP/1.1", Duration::from_millis(300)), "{}", held.text());

    let signalled = Instant::now();
    sigterm(&serve);
    let exit = wait_exit(&mut serve.child, Duration::from_secs(10)).expect("serve still running 10 s after SIGTERM");
    let took = signalled.elapsed();
    assert!(exit.success(), "serve exited with {exit}");
    assert!(took >= Duration::from_millis(950), "the long-poll was cut before the grace: {took:?}");
    assert!(took < Duration::from_millis(1900), "serve outlived its 1 s grace: {took:?}");
}
