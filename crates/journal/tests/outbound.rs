//! The outbound policy at the store level, against real listeners on
//! 127.0.0.1: each setting (`deny`, the default; `allow`; a prefix list)
//! decides which remote route destinations and content transforms the
//! store sends requests to, and a refused one is never contacted.
//! Deliveries need the HTTP client (feature `http`, on by default); without
//! it: tests/no_client.rs.
#![cfg(feature = "http")]

use std::io::Write;
use std::net::TcpStream;

use kn_journal::{Config, ErrorKind, Event, OutboundPolicy, Selection, Store, Topic};
use kn_test_support::{read_head_and_body, Listener};

/// A listener that answers every request with `200` and `reply`, and
/// reports each request's first line and body.
fn answering(reply: &'static [u8]) -> Listener<(String, Vec<u8>)> {
    Listener::start(move |mut stream| {
        let request = read_request(&mut stream);
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", reply.len());
        let _ = stream.write_all(head.as_bytes());
        let _ = stream.write_all(reply);
        request
    })
}

fn read_request(stream: &mut TcpStream) -> (String, Vec<u8>) {
    let (head, body) = read_head_and_body(stream);
    (head.lines().next().unwrap_or("").to_string(), body)
}

fn store(outbound: Option<OutboundPolicy>) -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = Config::new(dir.path().join("kn_events"));
    if let Some(policy) = outbound {
        config.outbound = policy;
    }
    let store = Store::open_with(config).expect("open store");
    (dir, store)
}

fn topic(name: &str) -> Topic {
    Topic::parse(name).expect("topic")
}

fn event(payload: &str) -> Event {
    let mut e = Event::new();
    e.set("kn_payload", payload);
    e
}

fn payloads(store: &Store, name: &str) -> Vec<Vec<u8>> {
    let Ok(selected) = store.events(&topic(name), &Selection::all()) else { return Vec::new() };
    selected.events.iter().map(|e| e.payload().to_vec()).collect()
}

fn transform_route(store: &Store, url: &str) -> kn_journal::Result<kn_journal::RouteReport> {
    let mut params = Event::new();
    params.set("kn_content_transform", url);
    store.route(&topic("/what/in"), b"/what/out", params)
}

#[test]
fn the_default_policy_denies_every_remote_url() {
    assert_eq!(Config::new("/nonexistent").outbound, OutboundPolicy::DenyAll, "deny is the default");
    let listener = answering(b"");
    let (_dir, store) = store(None);
    let err = store.route(&topic("/what/chat"), listener.url("/kn/what/chat").as_bytes(), Event::new()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Forbidden, "{err}");
    assert_eq!(err.kind().status().0, 403);
    let message = err.to_string();
    assert!(message.contains(&listener.url("/kn/what/chat")), "names the URL: {message}");
    assert!(message.contains("'allow'") && message.contains("prefix"), "says how to allow it: {message}");
    store.notify(&topic("/what/chat"), event("hello")).expect("notify");
    listener.assert_silent("a remote route under deny");
}

#[test]
fn the_default_policy_never_calls_a_content_transform() {
    let listener = answering(b"TRANSFORMED");
    let (_dir, store) = store(None);
    // The route itself is local; only its transform is remote.
    let _ = transform_route(&store, &listener.url("/t"));
    store.notify(&topic("/what/in"), event("original")).expect("notify");
    listener.assert_silent("a content transform under deny");
    assert!(
        !payloads(&store, "/what/out").iter().any(|p| p == b"TRANSFORMED"),
        "nothing transformed arrived"
    );
}

#[test]
fn allow_delivers_to_a_remote_listener_and_runs_transforms() {
    let listener = answering(b"");
    let (_dir, store) = store(Some(OutboundPolicy::AllowAll));
    store.route(&topic("/what/chat"), listener.url("/kn/what/chat").as_bytes(), Event::new()).expect("route");
    store.notify(&topic("/what/chat"), event("hello remote")).expect("notify");
    let (line, body) = listener.next().expect("the remote route delivered");
    assert!(line.starts_with("POST /kn/what/chat "), "{line}");
    assert!(String::from_utf8_lossy(&body).contains("kn_payload=hello+remote"), "{}", String::from_utf8_lossy(&body));

    let transformer = answering(b"TRANSFORMED");
    transform_route(&store, &transformer.url("/t")).expect("transform route");
    store.notify(&topic("/what/in"), event("original")).expect("notify");
    let (line, body) = transformer.next().expect("the transform was called");
    assert!(line.starts_with("POST /t "), "{line}");
    assert!(String::from_utf8_lossy(&body).contains("original"));
    assert_eq!(payloads(&store, "/what/out"), vec![b"TRANSFORMED".to_vec()]);
}

#[test]
fn a_prefix_list_allows_its_prefixes_and_nothing_that_merely_looks_alike() {
    let good = answering(b"TRANSFORMED");
    let other = answering(b"");
    let prefixes = format!("{} http://good.example/", good.url("/kn/"));
    let policy: OutboundPolicy = prefixes.parse().expect("prefix list");
    let (_dir, store) = store(Some(policy));

    // Allowed: under the prefix, for a route and for a transform.
    store.route(&topic("/what/chat"), good.url("/kn/what/chat").as_bytes(), Event::new()).expect("allowed route");
    store.notify(&topic("/what/chat"), event("hello")).expect("notify");
    let (line, _) = good.next().expect("delivered under the prefix");
    assert!(line.starts_with("POST /kn/what/chat "), "{line}");
    transform_route(&store, &good.url("/kn/t")).expect("allowed transform");
    store.notify(&topic("/what/in"), event("original")).expect("notify");
    assert!(good.next().expect("transform under the prefix").0.starts_with("POST /kn/t "));
    assert_eq!(payloads(&store, "/what/out"), vec![b"TRANSFORMED".to_vec()]);

    // Refused: look-alike host, other port, user information, escapes
    // from the prefix path in every spelling, a path merely starting
    // with the prefix's letters, another scheme.
    let refused = [
        "http://good.example.evil/kn/x".to_string(),
        "http://good.example:8080/x".to_string(),
        "http://evil@good.example/x".to_string(),
        other.url("/kn/what/chat"),
        format!("http://127.0.0.1:{}@127.0.0.1:{}/kn/x", good.port, other.port),
        format!("http://x@127.0.0.1:{}/kn/x", good.port),
        good.url("/kn/../admin"),
        good.url("/kn/%2e%2e/admin"),
        good.url("/kn/%2E%2E%2Fadmin"),
        good.url("/kn/..%2fadmin"),
        good.url("/kn/.%2e/admin"),
        good.url("/kn/..\\admin"),
        good.url("/kn/%5c..%5cadmin"),
        good.url("/knock"),
        good.url("/"),
        format!("https://127.0.0.1:{}/kn/x", good.port),
        format!("ftp://127.0.0.1:{}/kn/x", good.port),
    ];
    for (i, url) in refused.iter().enumerate() {
        let source = topic(&format!("/what/refused{i}"));
        match store.route(&source, url.as_bytes(), Event::new()) {
            Err(err) => assert!(
                matches!(err.kind(), ErrorKind::Forbidden | ErrorKind::BadRequest | ErrorKind::BadTopic),
                "{url}: {err}"
            ),
            Ok(_) => panic!("route to {url} was accepted"),
        }
        store.notify(&source, event("nothing leaves")).expect("notify");
        let mut params = Event::new();
        params.set("kn_content_transform", url.as_str());
        let _ = store.route(&topic(&format!("/what/tin{i}")), b"/what/tout", params);
        store.notify(&topic(&format!("/what/tin{i}")), event("nothing leaves")).expect("notify");
    }
    good.assert_silent("a refused URL");
    other.assert_silent("a refused URL");
    assert!(payloads(&store, "/what/tout").iter().all(|p| p == b"nothing leaves"), "no refused transform ran");
}

#[test]
fn a_refusal_says_how_to_allow_the_url() {
    let policy: OutboundPolicy = "http://peer.example/kn/".parse().expect("prefix");
    let err = policy.check("http://other.example/kn/x").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Forbidden);
    assert!(err.to_string().contains("add 'http://other.example/'"), "{err}");
}

/// The store sends its deliveries and transforms through the client its
/// `Config` describes: here through `http_proxy`, a proxy the test runs,
/// which records the `CONNECT` and refuses it (so nothing reaches the
/// destination, and the delivery fails as the proxy's answer says).
#[test]
fn the_store_sends_through_the_configured_proxy_only() {
    let listener = answering(b"");
    let proxy = Listener::start(|mut stream| {
        let (line, _) = read_request(&mut stream);
        let _ = stream.write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n");
        line
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = Config::new(dir.path().join("kn_events"));
    config.outbound = OutboundPolicy::AllowAll;
    config.http_proxy = Some(proxy.url("").parse().expect("proxy URL"));
    let store = Store::open_with(config).expect("open store");
    store.route(&topic("/what/chat"), listener.url("/kn/what/chat").as_bytes(), Event::new()).expect("route");
    store.notify(&topic("/what/chat"), event("hello")).expect("notify");
    let line = proxy.next().expect("the proxy was asked");
    assert_eq!(line, format!("CONNECT 127.0.0.1:{} HTTP/1.1", listener.port));
    listener.assert_silent("a delivery the proxy refused");
}

/// A remote route made while the policy allowed it, delivering after the
/// policy changed: poisoned, and counted as a refusal (`refused`, like a
/// remote 4xx), not as `other`.
#[test]
fn a_route_the_policy_no_longer_allows_is_poisoned_as_refused() {
    let listener = answering(b"");
    let (dir, store) = store(Some(OutboundPolicy::AllowAll));
    store.route(&topic("/what/chat"), listener.url("/kn/what/chat").as_bytes(), Event::new()).expect("route");
    drop(store);
    let store = Store::open_with(Config::new(dir.path().join("kn_events"))).expect("reopen under deny");
    let report = store.notify(&topic("/what/chat"), event("hello")).expect("notify");
    assert_eq!(report.poisoned.len(), 1, "{report:?}");
    listener.assert_silent("a URL the policy forbids");
    let counters = store.counters().expect("counters");
    assert_eq!(counters.get(kn_journal::internal::Counter::PoisonedRefused), 1);
    assert_eq!(counters.get(kn_journal::internal::Counter::PoisonedOther), 0);
}
