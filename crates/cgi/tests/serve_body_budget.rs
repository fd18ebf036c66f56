//! `serve`'s budget across all request bodies held at once
//! (`KN_BODY_BUDGET_BYTES`, issue 28): a body announced by its
//! `Content-Length` takes its share before any of it is read (its
//! `100 Continue` says so), one that fits in what is left is served, one
//! byte more is `503` with `Retry-After`, and a body larger than the
//! whole budget `413`. At `/kn` and at `/v1/stream/`.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use kn_test_support::raw::{Conn, Reply};
use kn_test_support::Serve;

const BUDGET: usize = 100_000;
const HELD: usize = 60_000;

fn status(reply: &Reply) -> u16 {
    reply.status_line.split(' ').nth(1).unwrap().parse().unwrap()
}

/// A notify form of exactly `length` bytes.
fn form(length: usize) -> Vec<u8> {
    let mut body = b"kn_response_format=simple&kn_to=/what/chat&kn_payload=".to_vec();
    body.resize(length, b'x');
    body
}

/// Sends the head of `method path` announcing `length` bytes with
/// `Expect: 100-continue`, and waits for the `100 Continue`.
fn announce(addr: &str, method: &str, path: &str, length: usize) -> Conn {
    let mut conn = Conn::connect(addr, Duration::from_secs(20));
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {length}\r\nExpect: 100-continue\r\n\r\n"
    );
    conn.reader.get_mut().write_all(head.as_bytes()).unwrap();
    conn
}

fn expect_continue(conn: &mut Conn) {
    let reply = conn.read_reply(true);
    assert_eq!(reply.status_line, "HTTP/1.1 100 Continue");
}

/// Sends `body` after a `100 Continue`, or reads the refusal that came
/// instead.
fn send_announced(addr: &str, method: &str, path: &str, body: &[u8]) -> Reply {
    let mut conn = announce(addr, method, path, body.len());
    let first = conn.read_reply(false);
    if first.status_line != "HTTP/1.1 100 Continue" {
        return first;
    }
    conn.reader.get_mut().write_all(body).unwrap();
    conn.reply()
}

#[test]
fn request_bodies_share_one_budget_503_one_byte_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = Serve::command_of(Path::new(env!("CARGO_BIN_EXE_pubsub-cgi")), &dir.path().join("events"), None);
    command.current_dir(dir.path()).env("KN_BODY_BUDGET_BYTES", BUDGET.to_string());
    let serve = Serve::spawn(command);
    let addr = serve.addr().to_string();

    // One request holds HELD bytes of the budget, its body not yet sent.
    let mut holder = announce(&addr, "POST", "/kn", HELD);
    expect_continue(&mut holder);

    // What is left fits exactly; one byte more does not.
    let fits = send_announced(&addr, "POST", "/kn", &form(BUDGET - HELD));
    assert_eq!(status(&fits), 200, "{}", fits.text());
    let over = send_announced(&addr, "POST", "/kn", &form(BUDGET - HELD + 1));
    assert_eq!(status(&over), 503, "{}", over.text());
    assert!(over.header("retry-after").is_some(), "503 without Retry-After");
    assert!(over.text().contains("KN_BODY_BUDGET_BYTES"), "{}", over.text());
    // The same at the Durable Streams door.
    let stream = send_announced(&addr, "PUT", "/v1/stream/big", &vec![b'x'; BUDGET - HELD + 1]);
    assert_eq!(status(&stream), 503, "{}", stream.text());
    assert!(stream.header("retry-after").is_some());
    // A body larger than the whole budget could never fit: 413.
    let never = send_announced(&addr, "POST", "/kn", &form(BUDGET + 1));
    assert_eq!(status(&never), 413, "{}", never.text());

    // The holder's body arrives and is served; its share is given back.
    holder.reader.get_mut().write_all(&form(HELD)).unwrap();
    assert_eq!(status(&holder.reply()), 200);
    let whole = send_announced(&addr, "POST", "/kn", &form(BUDGET));
    assert_eq!(status(&whole), 200, "{}", whole.text());
}
