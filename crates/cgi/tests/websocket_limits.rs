//! The WebSocket limits of `pubsub-cgi serve` (docs/PROTOCOL.md,
//! "WebSocket (extension)"), each a setting tested at its boundary with
//! an independent client (Python's `websockets`): `KN_WS_MAX_FRAME` and
//! `KN_WS_MAX_MESSAGE` (a frame of exactly the cap is answered, one byte
//! more closes `1009`), `KN_WS_SEND_QUEUE` (a reader that takes nothing
//! while events keep coming is closed, the server holding no more than the
//! bound for it), `KN_WS_PING_MS` with `KN_WS_PONG_TIMEOUT_MS` (a client
//! that answers pings stays, one that does not is closed `4408`).

#[path = "websocket/common.rs"]
mod common;

use std::time::Duration;

use common::*;
use kn_journal::{Event, Store, Topic};
use kn_test_support::Dir;

const JOURNAL: &str = "/who/limits/kn_journal";

/// A notify request of exactly `size` bytes as a form body.
fn notify_of_size(id: &str, size: usize) -> String {
    let head = format!("kn_id={id}&kn_to=%2Fwhat%2Fsizes&kn_payload=");
    assert!(size > head.len());
    format!("{head}{}", "a".repeat(size - head.len()))
}

fn answered(frames: &[serde_json::Value], id: &str) -> bool {
    answer_to(frames, id).iter().any(|a| a["status"].as_str().is_some_and(|s| s.starts_with("200")))
}

#[test]
fn a_frame_of_exactly_the_cap_is_answered_and_one_byte_more_closes_1009() {
    if !websockets_available() {
        return;
    }
    let dir = Dir::new("websocket_caps");
    for (frame, message) in [("1000", "100000"), ("100000", "1000")] {
        let serve = serve(&dir.join("kn_events"), &[], &[("KN_WS_MAX_FRAME", frame), ("KN_WS_MAX_MESSAGE", message)]);
        let url = socket_url(&serve, JOURNAL, "");
        let at = Client::run(&url, &["--send", &notify_of_size("at", 1000), "--until", "\"kn_in_reply_to\":\"at\""]);
        assert!(answered(&frames(&at), "at"), "frame cap {frame}, message cap {message}: {at:?}");
        let past = Client::run(&url, &["--send", &notify_of_size("past", 1001)]);
        assert_eq!(closed(&past), Some(1009), "frame cap {frame}, message cap {message}: {past:?}");
        assert!(answer_to(&frames(&past), "past").is_empty());
    }
}

#[test]
fn a_reader_that_takes_nothing_is_closed_once_the_send_queue_is_full() {
    if !websockets_available() {
        return;
    }
    let dir = Dir::new("websocket_slow");
    let root = dir.join("kn_events");
    let serve = serve(&root, &[], &[("KN_WS_SEND_QUEUE", "65536")]);
    let mut slow = Client::start(&socket_url(&serve, JOURNAL, ""), &["--silent", "--timeout", "30"]);
    assert!(slow.wait_for(Duration::from_secs(10), |l| l.get("paused").is_some()), "{:?}", slow.seen);
    // Far more than the socket buffers of both ends and the queue hold.
    let store = Store::open(&root).unwrap();
    let journal = Topic::parse(JOURNAL).unwrap();
    let payload = "x".repeat(32 << 10);
    let posted = 800;
    for i in 0..posted {
        store.notify(&journal, Event::from_pairs([("kn_id", format!("s{i}").as_str()), ("kn_payload", payload.as_str())])).unwrap();
    }
    // Give the server time to find the queue full (no timing asserted:
    // the outcome is the same however long it took).
    std::thread::sleep(Duration::from_secs(2));
    slow.go_on();
    assert!(slow.wait_for(Duration::from_secs(30), |l| l.get("count").is_some()), "{:?}", slow.seen);
    let end = slow.seen.last().unwrap().clone();
    let count = end["count"].as_i64().unwrap();
    eprintln!("the slow reader: {end}");
    assert!(count < posted, "the slow reader was cut off before the end: {end}");
    // The close frame itself may not fit in the full queue: 4429 or an
    // abrupt end.
    assert!(matches!(end["closed"].as_i64(), Some(4429) | Some(1006)), "{end}");
    // A reader that keeps up gets everything, an event larger than the
    // queue included (the bound is on what waits, not on one frame).
    let big = "y".repeat(200 << 10);
    let mut fast = Client::start(&socket_url(&serve, "/who/limits2/kn_journal", ""), &["--until", &big[..1000], "--timeout", "20"]);
    assert!(fast.wait_for(Duration::from_secs(10), |l| l.to_string().contains("Watching topic")), "{:?}", fast.seen);
    store.notify(&Topic::parse("/who/limits2/kn_journal").unwrap(), Event::from_pairs([("kn_id", "big"), ("kn_payload", big.as_str())])).unwrap();
    assert!(fast.wait_for(Duration::from_secs(20), |l| l["frame"]["kn_id"] == "big"), "the large event came whole");
    assert_eq!(fast.frames().iter().find(|f| f["kn_id"] == "big").unwrap()["kn_payload"].as_str().map(str::len), Some(200 << 10));
}

#[test]
fn a_client_answering_pings_stays_and_one_that_does_not_is_closed_4408() {
    if !websockets_available() {
        return;
    }
    let dir = Dir::new("websocket_ping");
    let serve = serve(&dir.join("kn_events"), &[], &[("KN_WS_PING_MS", "200"), ("KN_WS_PONG_TIMEOUT_MS", "300")]);
    // Answers pings (the library does): still open after many intervals.
    let lively = Client::run(&socket_url(&serve, JOURNAL, ""), &["--timeout", "3"]);
    assert!(lively.iter().any(|l| l.get("timeout").is_some()), "it outlived the pings: {lively:?}");
    assert_eq!(closed(&lively), None, "{lively:?}");
    // Reads nothing, so answers no ping.
    let mut silent = Client::start(&socket_url(&serve, JOURNAL, ""), &["--silent", "--timeout", "10"]);
    assert!(silent.wait_for(Duration::from_secs(10), |l| l.get("paused").is_some()), "{:?}", silent.seen);
    std::thread::sleep(Duration::from_secs(2));
    silent.go_on();
    assert!(silent.wait_for(Duration::from_secs(15), |l| l.get("count").is_some() || l.get("timeout").is_some()), "{:?}", silent.seen);
    assert_eq!(silent.seen.last().unwrap()["closed"], 4408, "{:?}", silent.seen);
}
