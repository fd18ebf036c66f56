//! kn-journal built without its HTTP client (`--no-default-features`, no
//! feature `http`): a remote delivery is refused with an error that says
//! why, as under `KN_OUTBOUND=deny`, and nothing is sent. (With the
//! client: tests/outbound.rs.)
#![cfg(not(feature = "http"))]

use kn_journal::{Config, Event, OutboundPolicy, Store, Topic};
use kn_test_support::Listener;

#[test]
fn without_the_client_a_remote_delivery_is_refused_and_nothing_is_sent() {
    let listener: Listener<()> = Listener::start(|_stream| ());
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = Config::new(dir.path().join("kn_events"));
    config.outbound = OutboundPolicy::AllowAll;
    let store = Store::open_with(config).expect("open store");
    let chat = Topic::parse("/what/chat").unwrap();
    store.route(&chat, listener.url("/kn/what/chat").as_bytes(), Event::new()).expect("route");
    let report = store.notify(&chat, Event::from_pairs([("kn_payload", "hello")])).expect("notify");
    assert_eq!(report.poisoned.len(), 1, "{report:?}");
    let reason = &report.poisoned[0].reason;
    assert!(reason.contains("no HTTP client") && reason.contains("http"), "says why: {reason}");
    listener.assert_silent("a remote route without the client");
}
