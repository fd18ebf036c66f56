//! A `serve` tunnel catching up on many large events (issue 28: its reads
//! and their encoding are made on the tunnel pool, not on the async
//! workers, once the tunnel is behind or its topic carries large
//! payloads): every event arrives, whole and in order, while the server
//! answers other requests.

use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

use kn_test_support::raw::{Conn, Reply};
use kn_test_support::{find, Serve};

const EVENTS: usize = 30;
const PAYLOAD: usize = 100 << 10;

fn status(reply: &Reply) -> u16 {
    reply.status_line.split(' ').nth(1).unwrap().parse().unwrap()
}

fn marker(i: usize) -> String {
    format!("event-{i:03}-")
}

#[test]
fn a_tunnel_catching_up_on_large_events_gets_them_all_while_other_requests_are_answered() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = Serve::command_of(Path::new(env!("CARGO_BIN_EXE_pubsub-cgi")), &dir.path().join("events"), None);
    command.current_dir(dir.path()).env("TOKIO_WORKER_THREADS", "1");
    let serve = Serve::spawn(command);
    let addr = serve.addr().to_string();

    let mut tunnel = Conn::connect(&addr, Duration::from_secs(20));
    tunnel.send("GET", "/kn/what/big?kn_response_format=simple", b"");
    let mut tunnel = tunnel.into_tunnel();
    assert!(tunnel.wait_for(b"status: 200 Watching topic", Duration::from_secs(10)), "{}", tunnel.text());

    // The tunnel's client reads nothing while the events are posted: its
    // queue fills and the rest piles up behind it.
    for i in 0..EVENTS {
        let mut body = format!("kn_response_format=simple&kn_to=/what/big&kn_payload={}", marker(i)).into_bytes();
        body.resize(body.len() + PAYLOAD, b'x');
        let mut conn = Conn::connect(&addr, Duration::from_secs(20));
        conn.send("POST", "/kn", &body);
        assert_eq!(status(&conn.reply()), 200);
    }
    let mut page = Conn::connect(&addr, Duration::from_secs(20));
    page.send("GET", "/", b"");
    assert_eq!(status(&page.reply()), 200);

    // Now the client reads: every event, in order, each whole.
    let mut seen = std::mem::take(&mut tunnel.seen);
    let last = marker(EVENTS - 1);
    let end = Instant::now() + Duration::from_secs(60);
    let mut buf = vec![0u8; 1 << 16];
    tunnel.stream.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let mut checked = 0;
    while find(&seen[checked..], last.as_bytes()).is_none() {
        assert!(Instant::now() < end, "the tunnel did not catch up: {} bytes read", seen.len());
        checked = seen.len().saturating_sub(last.len());
        match tunnel.stream.read(&mut buf) {
            Ok(0) => panic!("the tunnel ended after {} bytes", seen.len()),
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) => panic!("tunnel read failed: {e}"),
        }
    }
    // Read the rest of the last event.
    let _ = tunnel.stream.set_read_timeout(Some(Duration::from_millis(300)));
    while let Ok(n) = tunnel.stream.read(&mut buf) {
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&buf[..n]);
    }
    let mut at = 0;
    for i in 0..EVENTS {
        let m = marker(i);
        let found = find(&seen[at..], m.as_bytes()).unwrap_or_else(|| panic!("{m} missing or out of order"));
        at += found + m.len();
        let xs = seen[at..].iter().take_while(|&&b| b == b'x').count();
        assert_eq!(xs, PAYLOAD, "{m} is not whole");
    }
}
