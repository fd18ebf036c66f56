//! WebSocket through a real Apache in front of `pubsub-cgi serve`, with
//! the packaged proxy snippet (packaging/deb/knpubsub-proxy.conf: its
//! `ProxyPass ... upgrade=websocket`, DEPLOY.md "WebSocket behind
//! Apache"), driven by an independent client (Python's `websockets`): a
//! socket opens through the proxy, publishes, receives its event and is
//! answered by its `kn_id`.

#[path = "websocket/common.rs"]
mod common;

use std::path::Path;

use common::*;
use kn_test_support::{available, Apache, Dir, APACHE};

/// The packaged snippet's proxy lines, pointed at `port`.
fn packaged_proxy_lines(port: u16) -> String {
    let snippet = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/deb/knpubsub-proxy.conf");
    let text = std::fs::read_to_string(&snippet).expect("read the packaged proxy snippet");
    text.lines()
        .filter(|l| l.starts_with("ProxyPass") || l.starts_with("ProxyPreserveHost"))
        .map(|l| l.replace("127.0.0.1:8080", &format!("127.0.0.1:{port}")) + "\n")
        .collect()
}

#[test]
fn a_socket_passes_through_apache_with_the_packaged_proxy_snippet() {
    if !available(APACHE) || !websockets_available() {
        return;
    }
    let dir = Dir::new("websocket_apache");
    let serve = serve(&dir.join("kn_events"), &[], &[]);
    let port: u16 = serve.addr().rsplit(':').next().unwrap().parse().unwrap();
    let lines = packaged_proxy_lines(port);
    assert!(lines.contains("upgrade=websocket"), "the snippet passes WebSockets on: {lines}");
    let apache = Apache::start_with(|_| lines.clone());
    let url = format!("ws://127.0.0.1:{}/kn/who/apache/kn_journal?do_method=route&kn_response_format=websocket", apache.port());
    let route = request(&[("do_method", "route"), ("kn_from", "/what/chat"), ("kn_to", "/who/apache/kn_journal"), ("kn_id", "r1")]);
    let notify = request(&[("kn_to", "/what/chat"), ("kn_payload", "through apache"), ("kn_id", "m1")]);
    let seen = Client::run(&url, &["--protocol", "kn", "--send", &route, "--send", &notify, "--until", "\"kn_payload\":\"through apache\""]);
    let frames = frames(&seen);
    assert_eq!(seen[0]["subprotocol"], "kn", "{seen:?}\n{}", apache.error_log());
    assert!(!answer_to(&frames, "m1").is_empty(), "{seen:?}");
    assert_eq!(with_payload(&frames, "through apache").len(), 1, "{seen:?}\n{}", apache.error_log());
}
