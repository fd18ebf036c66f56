//! Routes and forwarding (PROTOCOL.md 3.2, 3.3 and 4): static routes,
//! hop-by-hop elements, filters and transforms, local and remote delivery
//! (against real HTTP listeners on 127.0.0.1), poisoning, initial route
//! population, and termination of routing loops.
//! The remote cases need the HTTP client (feature `http`, on by default).
#![cfg_attr(not(feature = "http"), allow(unused_imports))]

use std::io::Write as _;
use std::net::TcpListener;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod common;
use common::{config, ev, scratch, t};

use kn_journal::{Config, ErrorKind, Event, OutboundPolicy, Selection, Store, Topic};
use kn_journal::internal::Destination;

// ----- harness ------------------------------------------------------------


fn open_with(f: impl FnOnce(&mut Config)) -> (tempfile::TempDir, Store) {
    let dir = scratch("kn-journal-test-");
    let mut c = config(dir.path());
    f(&mut c);
    let store = Store::open_with(c).unwrap();
    (dir, store)
}

fn open() -> (tempfile::TempDir, Store) {
    open_with(|_| {})
}

fn id(route_id: &str) -> Event {
    ev(&[("kn_id", route_id)])
}

fn payloads(events: &[Event]) -> Vec<String> {
    events.iter().map(|e| String::from_utf8_lossy(e.payload()).into_owned()).collect()
}

fn all(store: &Store, topic: &Topic) -> Vec<Event> {
    store.events(topic, &Selection::all()).unwrap().events
}

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

/// Creates a journal with a fresh heartbeat (what an open tunnel does).
fn live_journal(store: &Store, name: &str) -> Topic {
    let j = t(name);
    drop(store.tunnel(&j, &Selection::none()).unwrap());
    j
}

fn route(store: &Store, from: &str, to: &str, route_id: &str) {
    let r = store.route(&t(from), to.as_bytes(), id(route_id)).unwrap();
    assert!(!r.ignored);
}

use kn_test_support::{read_request, Received as Seen};

#[cfg(feature = "http")]
/// An HTTP server on 127.0.0.1 answering every request with `answer`;
/// each request is also sent to the returned receiver.
fn http_listener(answer: fn(&Seen) -> (u16, Vec<u8>)) -> (String, mpsc::Receiver<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let Some(seen) = read_request(&mut stream) else { continue };
            let (status, body) = answer(&seen);
            // Reported before the answer goes out: once the client has its
            // answer, the test finds the request in the channel.
            if tx.send(seen).is_err() {
                return;
            }
            let head = format!("HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(&body);
        }
    });
    (url, rx)
}

#[cfg(feature = "http")]
/// A server that accepts connections and never answers.
fn silent_listener() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            held.push(stream);
        }
    });
    url
}

#[cfg(feature = "http")]
fn remote_store() -> (tempfile::TempDir, Store) {
    open_with(|c| {
        c.outbound = OutboundPolicy::AllowAll;
        c.remote_timeout = Duration::from_secs(1);
    })
}

// ----- static routes ----------------------------------------------------------

#[test]
fn static_route_forwards_posts_to_its_destination() {
    let (_d, store) = open();
    let report = store.route(&t("/a"), b"b", id("r1")).unwrap();
    assert!(!report.ignored);
    assert_eq!(report.id, b"r1");
    let routes = store.routes(&t("/a")).unwrap();
    assert_eq!(routes.len(), 1);
    assert_eq!(routes[0].destination(), b"http://test.example/kn/b", "made absolute against the server URL");
    let post = store.notify(&t("/a"), ev(&[("kn_id", "e1"), ("kn_payload", "hello")])).unwrap();
    assert!(post.writes.iter().any(|w| w.topic == t("/b")));
    assert_eq!(payloads(&all(&store, &t("/b"))), ["hello"]);
    assert_eq!(all(&store, &t("/b"))[0].id(), Some(&b"e1"[..]), "kn_id travels end to end");
}

#[test]
fn identical_route_re_create_is_ignored() {
    let (_d, store) = open();
    let params = ev(&[("kn_id", "r1"), ("kn_uri", "http://x/y")]);
    assert!(!store.route(&t("/a"), b"/b", params.clone()).unwrap().ignored);
    let again = store.route(&t("/a"), b"b", params).unwrap();
    assert!(again.ignored, "{again:?}");
    assert!(again.writes.is_empty());
    assert!(!store.route(&t("/a"), b"/c", ev(&[("kn_id", "r1"), ("kn_uri", "http://x/y")])).unwrap().ignored);
    assert_eq!(store.all_routes(&t("/a")).unwrap().len(), 1, "same id replaces");
}

#[test]
fn deleted_route_is_inactive_visible_and_forwards_nothing() {
    let (_d, store) = open();
    route(&store, "/a", "/b", "r1");
    store.delete_route(&t("/a"), b"r1", None).unwrap();
    assert!(store.routes(&t("/a")).unwrap().is_empty());
    let all_routes = store.all_routes(&t("/a")).unwrap();
    assert_eq!(all_routes.len(), 1);
    assert_eq!(all_routes[0].id(), b"r1");
    assert!(all_routes[0].destination().is_empty());
    assert!(!all_routes[0].is_active(now()));
    // Watchers of kn_routes see the deletion.
    let seen = all(&store, &t("/a/kn_routes"));
    assert_eq!(payloads(&seen), [""]);
    store.notify(&t("/a"), ev(&[("kn_payload", "x")])).unwrap();
    assert!(all(&store, &t("/b")).is_empty());
    // A deletion with kn_expires can be reclaimed.
    route(&store, "/a", "/b", "r2");
    store.delete_route(&t("/a"), b"r2", Some(b"+100")).unwrap();
    let r2 = store.all_routes(&t("/a")).unwrap().into_iter().find(|r| r.id() == b"r2").unwrap();
    let exp: f64 = r2.event.get_str("kn_expires").unwrap().parse().unwrap();
    assert!((exp - (now() + 100.0)).abs() < 5.0);
}

#[test]
fn route_changes_made_by_another_store_apply_to_the_next_post() {
    // Two stores on one root stand for two processes: the poster keeps the
    // topic's files and routes between posts and must still see every
    // route created, deleted or redirected by the other.
    let (dir, poster) = open();
    let other = Store::open_with(config(dir.path())).unwrap();
    poster.notify(&t("/a"), ev(&[("kn_payload", "before")])).unwrap();
    route(&other, "/a", "/b", "r1");
    poster.notify(&t("/a"), ev(&[("kn_payload", "routed")])).unwrap();
    assert_eq!(payloads(&all(&poster, &t("/b"))), ["routed"]);
    let redirected = other.route(&t("/a"), b"/c", id("r1")).unwrap();
    assert!(!redirected.ignored);
    poster.notify(&t("/a"), ev(&[("kn_payload", "redirected")])).unwrap();
    assert_eq!(payloads(&all(&poster, &t("/b"))), ["routed"]);
    assert_eq!(payloads(&all(&poster, &t("/c"))), ["redirected"]);
    other.delete_route(&t("/a"), b"r1", None).unwrap();
    poster.notify(&t("/a"), ev(&[("kn_payload", "deleted")])).unwrap();
    assert_eq!(payloads(&all(&poster, &t("/c"))), ["redirected"]);
}

#[test]
fn route_changes_in_the_same_store_apply_to_the_next_post() {
    let (_d, store) = open();
    store.notify(&t("/a"), ev(&[("kn_payload", "none")])).unwrap();
    route(&store, "/a", "/b", "r1");
    store.notify(&t("/a"), ev(&[("kn_payload", "one")])).unwrap();
    route(&store, "/a", "/c", "r2");
    store.notify(&t("/a"), ev(&[("kn_payload", "two")])).unwrap();
    store.delete_route(&t("/a"), b"r1", None).unwrap();
    store.notify(&t("/a"), ev(&[("kn_payload", "three")])).unwrap();
    assert_eq!(payloads(&all(&store, &t("/b"))), ["one", "two"]);
    assert_eq!(payloads(&all(&store, &t("/c"))), ["two", "three"]);
}

#[test]
fn route_from_a_journal_is_forbidden() {
    let (_d, store) = open();
    let err = store.route(&t("/who/a/kn_journal"), b"/b", id("r")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Forbidden);
    assert_eq!(err.kind().status().0, 403);
}

#[test]
fn bad_route_destinations_are_refused() {
    let (_d, store) = open();
    for bad in ["/a b", "/a<b", "/a>b", "/a\"b", "/a#b", "/a\x01b", "/a\nb", "/a\x7fb", "/x/kn_routes", "/x/kn_subtopics", "http://test.example/kn/x/kn_routes"] {
        let err = store.route(&t("/src"), bad.as_bytes(), id("r")).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BadRequest, "{bad:?}: {err}");
    }
    assert!(store.route(&t("/src"), b"/a/../b", id("r")).is_err());
    assert!(store.all_routes(&t("/src")).unwrap().is_empty());
}

// ----- forwarding -------------------------------------------------------------

#[test]
fn forwarded_copies_carry_fresh_hop_by_hop_elements() {
    let (_d, store) = open();
    route(&store, "/a", "/b", "r1");
    store.route(&t("/a"), b"/c", ev(&[("kn_id", "r2"), ("kn_uri", "http://other.example/route?x=1&y")])).unwrap();
    let e = ev(&[("kn_id", "e1"), ("kn_payload", "p"), ("kn_route_id", "forged"), ("kn_routed_from", "http://forged/"), ("kn_route_location", "forged")]);
    store.notify(&t("/a"), e).unwrap();
    let b = &all(&store, &t("/b"))[0];
    assert_eq!(b.get_str("kn_route_location").unwrap(), "http://test.example/kn/a/kn_routes/r1");
    assert_eq!(b.get_str("kn_route_id").unwrap(), "r1");
    assert_eq!(b.get_str("kn_routed_from").unwrap(), "http://test.example/kn/a");
    let c = &all(&store, &t("/c"))[0];
    assert_eq!(c.get_str("kn_route_location").unwrap(), "http://other.example/route?x=1&y", "kn_uri verbatim");
    assert_eq!(c.get_str("kn_route_id").unwrap(), "r2");
    assert_eq!(c.get_str("kn_routed_from").unwrap(), "http://test.example/kn/a");
    // Next hop: recomputed again.
    route(&store, "/b", "/d", "r3");
    store.notify(&t("/a"), ev(&[("kn_id", "e2"), ("kn_payload", "q")])).unwrap();
    let d = &all(&store, &t("/d"))[0];
    assert_eq!(d.get_str("kn_route_id").unwrap(), "r3");
    assert_eq!(d.get_str("kn_routed_from").unwrap(), "http://test.example/kn/b");
    assert_eq!(d.get_str("kn_route_location").unwrap(), "http://test.example/kn/b/kn_routes/r3");
}

#[test]
fn content_filter_passes_matching_payloads_only() {
    let (_d, store) = open();
    store.route(&t("/a"), b"/b", ev(&[("kn_id", "r"), ("kn_content_filter", r"(?i)\bimportant\b")])).unwrap();
    for p in ["This is IMPORTANT!", "unimportant stuff", "important", "nothing"] {
        store.notify(&t("/a"), ev(&[("kn_payload", p)])).unwrap();
    }
    assert_eq!(payloads(&all(&store, &t("/b"))), ["This is IMPORTANT!", "important"]);
}

#[test]
fn bad_content_filter_is_refused() {
    let (_d, store) = open();
    for bad in ["(unclosed", "a{2,1}", "*x"] {
        let err = store.route(&t("/a"), b"/b", ev(&[("kn_id", "r"), ("kn_content_filter", bad)])).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BadRequest, "{bad}");
    }
    assert!(store.all_routes(&t("/a")).unwrap().is_empty());
}

#[cfg(feature = "http")] // a real remote over HTTP
#[test]
fn content_transform_replaces_the_payload_through_a_real_http_server() {
    let (_d, store) = remote_store();
    let (url, rx) = http_listener(|seen| {
        let input = seen.field("text").or_else(|| seen.field("kn_payload")).unwrap_or_default();
        if input == b"refuse" {
            return (500, b"no".to_vec());
        }
        let mut out = b"T:".to_vec();
        out.extend_from_slice(&input);
        (200, out)
    });
    store.route(&t("/a"), b"/b", ev(&[("kn_id", "r1"), ("kn_content_transform", &format!("{url}/upper"))])).unwrap();
    store.route(&t("/a"), b"/c", ev(&[("kn_id", "r2"), ("kn_content_transform", &format!("{url}/kw text"))])).unwrap();
    store.notify(&t("/a"), ev(&[("kn_id", "e1"), ("kn_payload", "hello world")])).unwrap();
    assert_eq!(payloads(&all(&store, &t("/b"))), ["T:hello world"]);
    assert_eq!(payloads(&all(&store, &t("/c"))), ["T:hello world"]);
    let seen: Vec<Seen> = rx.try_iter().collect();
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().any(|s| s.request_line.starts_with("POST /upper ") && s.field("kn_payload").as_deref() == Some(&b"hello world"[..])));
    assert!(seen.iter().any(|s| s.request_line.starts_with("POST /kw ") && s.field("text").as_deref() == Some(&b"hello world"[..])));
    // A non-200 answer: the event does not travel that route (not poisoned).
    store.notify(&t("/a"), ev(&[("kn_id", "e2"), ("kn_payload", "refuse")])).unwrap();
    assert_eq!(all(&store, &t("/b")).len(), 1);
    assert_eq!(store.routes(&t("/a")).unwrap().len(), 2, "a failed transform does not poison");
}

#[cfg(feature = "http")] // a real remote over HTTP
#[test]
fn remote_destination_receives_the_elements_urlencoded() {
    let (_d, store) = remote_store();
    let (url, rx) = http_listener(|_| (200, b"ok".to_vec()));
    store.route(&t("/a"), format!("{url}/kn/what/chat").as_bytes(), id("r1")).unwrap();
    let e = ev(&[("kn_id", "e1"), ("kn_payload", "a b&c=d;\u{3ba}"), ("odd name", "x\ny")]);
    let report = store.notify(&t("/a"), e).unwrap();
    assert!(report.poisoned.is_empty(), "{report:?}");
    let seen = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(seen.request_line.starts_with("POST /kn/what/chat "), "{}", seen.request_line);
    assert_eq!(seen.field("kn_payload").unwrap(), "a b&c=d;\u{3ba}".as_bytes());
    assert_eq!(seen.field("odd name").unwrap(), b"x\ny");
    assert_eq!(seen.field("kn_id").unwrap(), b"e1");
    assert_eq!(seen.field("kn_route_id").unwrap(), b"r1");
    assert_eq!(seen.field("kn_routed_from").unwrap(), b"http://test.example/kn/a");
    assert!(seen.field("kn_time_t").is_some());
    assert!(store.routes(&t("/a")).unwrap().len() == 1);
}

fn assert_poisoned(store: &Store, from: &str, route_id: &str) {
    assert!(store.routes(&t(from)).unwrap().is_empty(), "route still active");
    let r = store.all_routes(&t(from)).unwrap().into_iter().find(|r| r.id() == route_id.as_bytes()).unwrap();
    assert!(r.destination().is_empty());
    let exp: f64 = r.event.get_str("kn_expires").expect("poisoned routes expire").parse().unwrap();
    assert!((exp - (now() + 300.0)).abs() < 10.0, "kn_expires {exp} is not about now+300");
}

#[cfg(feature = "http")] // a real remote over HTTP
#[test]
fn remote_4xx_poisons_the_route() {
    let (_d, store) = remote_store();
    let (url, rx) = http_listener(|_| (404, b"no such topic".to_vec()));
    store.route(&t("/a"), format!("{url}/kn/x").as_bytes(), id("r1")).unwrap();
    let report = store.notify(&t("/a"), ev(&[("kn_payload", "x")])).unwrap();
    assert_eq!(report.poisoned.len(), 1, "{report:?}");
    assert_eq!(report.poisoned[0].route_id, b"r1");
    assert!(rx.recv_timeout(Duration::from_secs(5)).is_ok());
    assert_poisoned(&store, "/a", "r1");
    // Poisoned: the next post does not even try.
    store.notify(&t("/a"), ev(&[("kn_payload", "y")])).unwrap();
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
}

/// A silent remote is a transient failure (issue 11): the post returns
/// within the timeout and the route is kept for a retry; with no retries
/// allowed (`forward_retries` 0) it is poisoned at once ("no answer after
/// the retries").
#[cfg(feature = "http")] // a real remote over HTTP
#[test]
fn silent_remote_keeps_the_route_and_the_post_returns_within_the_timeout() {
    for retries in [12, 0] {
        let (_d, store) = open_with(|c| {
            c.outbound = OutboundPolicy::AllowAll;
            c.remote_timeout = Duration::from_secs(1);
            c.forward_retries = retries;
        });
        let url = silent_listener();
        store.route(&t("/a"), format!("{url}/kn/x").as_bytes(), id("r1")).unwrap();
        let begun = Instant::now();
        let report = store.notify(&t("/a"), ev(&[("kn_payload", "x")])).unwrap();
        let took = begun.elapsed();
        println!("silent remote, {retries} retries: post returned after {took:?}");
        assert!(took < Duration::from_secs(3), "{took:?} for a 1 s remote timeout");
        if retries == 0 {
            assert_eq!(report.poisoned.len(), 1);
            assert_poisoned(&store, "/a", "r1");
        } else {
            assert!(report.poisoned.is_empty(), "{report:?}");
            assert_eq!(store.routes(&t("/a")).unwrap().len(), 1, "the route is kept");
            assert_eq!(store.outbox_pending().unwrap(), 1, "the delivery waits in the outbox");
            assert_eq!(store.counters().unwrap().get(kn_journal::internal::Counter::DeliveriesRetried), 1);
        }
    }
}

/// `forward_retries` at its boundary: a remote that answers 5xx is tried
/// once and retried that many times (each when its wait has passed), then
/// the route is poisoned as unreachable; before the wait nothing is tried.
#[cfg(feature = "http")] // a real remote over HTTP
#[test]
fn a_remote_5xx_is_retried_forward_retries_times_then_poisoned_as_unreachable() {
    let (_d, store) = open_with(|c| {
        c.outbound = OutboundPolicy::AllowAll;
        c.remote_timeout = Duration::from_secs(1);
        c.forward_retries = 2;
        c.forward_backoff = Duration::from_millis(1);
    });
    let (url, rx) = http_listener(|_| (503, b"busy".to_vec()));
    store.route(&t("/a"), format!("{url}/kn/x").as_bytes(), id("r1")).unwrap();
    assert!(store.notify(&t("/a"), ev(&[("kn_id", "e1"), ("kn_payload", "x")])).unwrap().poisoned.is_empty());
    for retry in 1..=2 {
        thread::sleep(Duration::from_millis(20));
        let report = store.complete_forwarding(&t("/a")).unwrap();
        if retry < 2 {
            assert!(report.poisoned.is_empty(), "retry {retry}: {report:?}");
            assert_eq!(store.routes(&t("/a")).unwrap().len(), 1);
        } else {
            assert_eq!(report.poisoned.len(), 1, "{report:?}");
            assert!(report.poisoned[0].reason.contains("503") && report.poisoned[0].reason.contains("2 retries"), "{report:?}");
            assert_poisoned(&store, "/a", "r1");
        }
    }
    // The listener's thread reports each request it answered; wait for
    // the last report rather than race it.
    let answered = (0..3).take_while(|_| rx.recv_timeout(Duration::from_secs(10)).is_ok()).count();
    assert_eq!(answered, 3, "the first delivery and two retries");
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err(), "no fourth attempt");
    let counters = store.counters().unwrap();
    assert_eq!(counters.get(kn_journal::internal::Counter::DeliveriesRetried), 3);
    assert_eq!(counters.get(kn_journal::internal::Counter::PoisonedUnreachable), 1);
    assert_eq!(store.outbox_pending().unwrap(), 0);

    // A retry waits for its time: with a long backoff nothing is tried.
    let (_d, store) = open_with(|c| {
        c.outbound = OutboundPolicy::AllowAll;
        c.forward_backoff = Duration::from_secs(3600);
    });
    let (url, rx) = http_listener(|_| (503, b"busy".to_vec()));
    store.route(&t("/a"), format!("{url}/kn/x").as_bytes(), id("r1")).unwrap();
    store.notify(&t("/a"), ev(&[("kn_id", "e1"), ("kn_payload", "x")])).unwrap();
    store.notify(&t("/a"), ev(&[("kn_id", "e2"), ("kn_payload", "y")])).unwrap();
    store.complete_forwarding(&t("/a")).unwrap();
    assert_eq!(rx.try_iter().count(), 1, "only the first delivery: the route waits for its retry");
    assert_eq!(store.outbox_pending().unwrap(), 2, "both events wait");
    assert_eq!(store.routes(&t("/a")).unwrap().len(), 1);
}

/// A remote that comes back gets the waiting events in order, once, and
/// the route never stopped carrying new ones meanwhile (they queue behind).
#[cfg(feature = "http")] // a real remote over HTTP
#[test]
fn a_remote_that_comes_back_gets_the_waiting_events_in_order() {
    use std::sync::atomic::{AtomicBool, Ordering};
    static UP: AtomicBool = AtomicBool::new(false);
    let (_d, store) = open_with(|c| {
        c.outbound = OutboundPolicy::AllowAll;
        c.forward_backoff = Duration::from_millis(1);
    });
    let (url, rx) = http_listener(|_| if UP.load(Ordering::SeqCst) { (200, Vec::new()) } else { (502, Vec::new()) });
    store.route(&t("/a"), format!("{url}/kn/x").as_bytes(), id("r1")).unwrap();
    store.route(&t("/a"), b"/local", id("r2")).unwrap();
    for i in 0..3 {
        store.notify(&t("/a"), ev(&[("kn_id", &format!("e{i}")), ("kn_payload", "x")])).unwrap();
        thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(store.events(&t("/local"), &Selection::all()).unwrap().events.len(), 3, "the local route is not held up");
    UP.store(true, Ordering::SeqCst);
    thread::sleep(Duration::from_millis(50));
    store.notify(&t("/a"), ev(&[("kn_id", "e3"), ("kn_payload", "x")])).unwrap();
    // Every request, answered 502 (only e0, retried) then 200.
    let taken: Vec<String> = rx.try_iter().map(|s| String::from_utf8(s.field("kn_id").unwrap()).unwrap()).collect();
    assert!(taken.len() >= 5, "{taken:?}");
    assert!(taken[..taken.len() - 4].iter().all(|id| id == "e0"), "only the oldest waiting event is retried: {taken:?}");
    assert_eq!(taken[taken.len() - 4..], ["e0", "e1", "e2", "e3"], "{taken:?}");
    assert_eq!(store.outbox_pending().unwrap(), 0);
}

#[cfg(feature = "http")] // a real remote over HTTP
#[test]
fn initial_population_stops_at_a_failed_delivery() {
    for retries in [12, 0] {
        let (_d, store) = open_with(|c| {
            c.outbound = OutboundPolicy::AllowAll;
            c.remote_timeout = Duration::from_secs(1);
            c.forward_retries = retries;
        });
        for i in 0..5 {
            store.notify(&t("/a"), ev(&[("kn_payload", &i.to_string())])).unwrap();
        }
        let url = silent_listener();
        let begun = Instant::now();
        let report = store.route(&t("/a"), format!("{url}/kn/x").as_bytes(), ev(&[("kn_id", "r1"), ("do_max_n", "5")])).unwrap();
        let took = begun.elapsed();
        assert!(took < Duration::from_secs(3), "kept delivering along a failing route: {took:?}");
        if retries == 0 {
            assert!(!report.poisoned.is_empty());
            assert_poisoned(&store, "/a", "r1");
        } else {
            assert!(report.poisoned.is_empty(), "{report:?}");
            assert_eq!(store.outbox_pending().unwrap(), 5, "the population waits for its retry");
        }
    }
}

#[test]
fn outbound_deny_all_refuses_remote_routes() {
    let (_d, store) = open();
    let err = store.route(&t("/a"), b"http://127.0.0.1:9/kn/x", id("r")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Forbidden);
    assert!(store.all_routes(&t("/a")).unwrap().is_empty());
}

#[test]
fn delivery_into_a_stale_journal_poisons_the_route() {
    let (_d, store) = open();
    let j = live_journal(&store, "/who/x/kn_journal");
    route(&store, "/a", j.as_str(), "r1");
    store.notify(&t("/a"), ev(&[("kn_payload", "1")])).unwrap();
    assert_eq!(payloads(&all(&store, &j)), ["1"]);
    store.expire(&j).unwrap();
    let report = store.notify(&t("/a"), ev(&[("kn_payload", "2")])).unwrap();
    assert!(!report.duplicate);
    assert_eq!(report.poisoned.len(), 1, "{report:?}");
    assert_poisoned(&store, "/a", "r1");
    assert_eq!(payloads(&all(&store, &j)), ["1"]);
    // A journal that never had a heartbeat is stale too.
    route(&store, "/a", "/who/never/kn_journal", "r2");
    assert_eq!(store.notify(&t("/a"), ev(&[("kn_payload", "3")])).unwrap().poisoned.len(), 1);
    assert_poisoned(&store, "/a", "r2");
}

// ----- initial route population -----------------------------------------------

#[test]
fn initial_population_with_do_max_n_sends_the_newest_oldest_first_before_returning() {
    let (_d, store) = open();
    for i in 0..6 {
        store.notify(&t("/src"), ev(&[("kn_id", &format!("e{i}")), ("kn_payload", &format!("p{i}"))])).unwrap();
    }
    let expired = format!("{}", now() as i64 - 10);
    store.notify(&t("/src"), ev(&[("kn_id", "old"), ("kn_payload", "expired"), ("kn_expires", &expired)])).unwrap();
    let j = live_journal(&store, "/dst/kn_journal");
    let report = store.route(&t("/src"), j.as_str().as_bytes(), ev(&[("kn_id", "r1"), ("do_max_n", "3")])).unwrap();
    assert_eq!(payloads(&all(&store, &j)), ["p3", "p4", "p5"], "populated before route() returned, oldest first, no expired event");
    assert_eq!(report.writes.iter().filter(|w| w.topic == j).count(), 3);
    let more = store.route(&t("/src"), b"/dst2", ev(&[("kn_id", "r2"), ("do_max_n", "100")])).unwrap();
    assert!(more.poisoned.is_empty());
    assert_eq!(payloads(&all(&store, &t("/dst2"))), ["p0", "p1", "p2", "p3", "p4", "p5"]);
    // No selection: nothing is sent.
    store.route(&t("/src"), b"/dst3", id("r3")).unwrap();
    assert!(all(&store, &t("/dst3")).is_empty());
}

#[test]
fn initial_population_with_do_max_age_sends_recent_events() {
    let (_d, store) = open();
    store.notify(&t("/src"), ev(&[("kn_payload", "old")])).unwrap();
    // Stored times are whole seconds: two seconds apart is always outside
    // a one-second window.
    thread::sleep(Duration::from_millis(2100));
    store.notify(&t("/src"), ev(&[("kn_payload", "new1")])).unwrap();
    store.notify(&t("/src"), ev(&[("kn_payload", "new2")])).unwrap();
    store.route(&t("/src"), b"/dst", ev(&[("kn_id", "r1"), ("do_max_age", "1")])).unwrap();
    assert_eq!(payloads(&all(&store, &t("/dst"))), ["new1", "new2"]);
    store.route(&t("/src"), b"/dst2", ev(&[("kn_id", "r2"), ("do_max_age", "infinity")])).unwrap();
    assert_eq!(payloads(&all(&store, &t("/dst2"))), ["old", "new1", "new2"]);
    let err = store.route(&t("/src"), b"/dst3", ev(&[("kn_id", "r3"), ("do_max_age", "soon")])).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadRequest);
}

// ----- routing loops ------------------------------------------------------------

#[test]
fn a_journal_expired_by_another_store_is_stale_for_a_store_that_keeps_it_open() {
    let (dir, store) = open();
    let other = Store::open_with(config(dir.path())).unwrap();
    let j = live_journal(&store, "/who/y/kn_journal");
    route(&store, "/a", j.as_str(), "r1");
    for payload in ["1", "2"] {
        // The second delivery checks the heartbeat kept open by the first.
        store.notify(&t("/a"), ev(&[("kn_payload", payload)])).unwrap();
    }
    other.expire(&j).unwrap();
    let report = store.notify(&t("/a"), ev(&[("kn_payload", "3")])).unwrap();
    assert_eq!(report.poisoned.len(), 1, "{report:?}");
    assert_poisoned(&store, "/a", "r1");
    assert_eq!(payloads(&all(&store, &j)), ["1", "2"]);
    assert_eq!(store.notify(&j, ev(&[("kn_payload", "direct")])).unwrap_err().kind(), ErrorKind::Expired);
    // A fresh heartbeat from the other store (a new file) is seen too.
    other.heartbeat(&j).unwrap();
    store.notify(&j, ev(&[("kn_payload", "direct")])).unwrap();
    assert_eq!(payloads(&all(&store, &j)), ["1", "2", "direct"]);
}

#[test]
fn two_topics_routed_to_each_other_terminate() {
    let (_d, store) = open();
    route(&store, "/a", "/b", "ab");
    route(&store, "/b", "/a", "ba");
    let report = store.notify(&t("/a"), ev(&[("kn_id", "e"), ("kn_payload", "ping")])).unwrap();
    let stored: Vec<&str> = report.writes.iter().map(|w| w.topic.as_str()).collect();
    assert_eq!(stored, ["/a", "/b"], "the return to /a is a duplicate");
    assert_eq!(payloads(&all(&store, &t("/a"))), ["ping"]);
    assert_eq!(payloads(&all(&store, &t("/b"))), ["ping"]);
}

#[test]
fn triangle_of_routes_terminates() {
    let (_d, store) = open();
    route(&store, "/a", "/b", "1");
    route(&store, "/b", "/c", "2");
    route(&store, "/c", "/a", "3");
    let report = store.notify(&t("/b"), ev(&[("kn_payload", "round")])).unwrap();
    assert_eq!(report.writes.len(), 3, "{report:?}");
    for x in ["/a", "/b", "/c"] {
        assert_eq!(payloads(&all(&store, &t(x))), ["round"], "{x}");
    }
}

#[test]
fn diamond_delivers_once_to_an_ordinary_sink_and_once_per_path_to_a_journal() {
    let (_d, store) = open();
    let j = live_journal(&store, "/sinkj/kn_journal");
    for (from, to, rid) in [("/a", "/b", "1"), ("/a", "/c", "2"), ("/b", "/sink", "3"), ("/c", "/sink", "4"), ("/a", "/sink", "5")] {
        route(&store, from, to, rid);
    }
    for (from, rid) in [("/b", "6"), ("/c", "7"), ("/a", "8")] {
        route(&store, from, j.as_str(), rid);
    }
    store.notify(&t("/a"), ev(&[("kn_id", "e"), ("kn_payload", "d")])).unwrap();
    assert_eq!(payloads(&all(&store, &t("/sink"))), ["d"]);
    let got = all(&store, &j);
    assert_eq!(got.len(), 3, "one copy per path: {got:?}");
    let mut routes: Vec<String> = got.iter().map(|e| e.get_str("kn_route_id").unwrap()).collect();
    routes.sort();
    assert_eq!(routes, ["6", "7", "8"]);
}

#[test]
fn topic_routed_to_itself_terminates() {
    let (_d, store) = open();
    route(&store, "/self", "/self", "loop");
    let report = store.notify(&t("/self"), ev(&[("kn_payload", "me"), ("kn_expires", "+10")])).unwrap();
    assert_eq!(report.writes.len(), 1);
    assert_eq!(payloads(&all(&store, &t("/self"))), ["me"]);
}

#[test]
fn loop_with_an_already_expired_event_terminates_and_forwards_nothing() {
    let (_d, store) = open();
    route(&store, "/a", "/b", "ab");
    route(&store, "/b", "/a", "ba");
    let past = format!("{}", now() as i64 - 100);
    let e = ev(&[("kn_id", "x"), ("kn_payload", "late"), ("kn_expires", &past)]);
    let report = store.notify(&t("/a"), e.clone()).unwrap();
    let stored: Vec<&str> = report.writes.iter().map(|w| w.topic.as_str()).collect();
    assert_eq!(stored, ["/a"], "an expired event is stored for duplicate suppression, never forwarded");
    assert!(all(&store, &t("/b")).is_empty());
    assert!(store.notify(&t("/a"), e).unwrap().duplicate);
}

#[test]
fn chain_of_two_thousand_routes_completes() {
    let (_d, store) = open();
    const N: usize = 2000;
    let begun = Instant::now();
    for i in 0..N - 1 {
        store.route(&t(&format!("/chain/t{i}")), format!("/chain/t{}", i + 1).as_bytes(), id("next")).unwrap();
    }
    let routed = begun.elapsed();
    // A thread with a small stack: forwarding must not recurse per hop.
    let handle = thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(move || {
            let report = store.notify(&t("/chain/t0"), ev(&[("kn_id", "e"), ("kn_payload", "far")])).unwrap();
            (report, store)
        })
        .unwrap();
    let (report, store) = handle.join().unwrap();
    println!("chain of {N}: routes took {routed:?}, the post {:?}", begun.elapsed() - routed);
    assert_eq!(report.writes.iter().filter(|w| w.id == b"e").count(), N);
    assert_eq!(payloads(&all(&store, &t(&format!("/chain/t{}", N - 1)))), ["far"]);
}

#[test]
fn fan_out_to_three_hundred_journals() {
    let (_d, store) = open();
    let mut journals = Vec::new();
    for i in 0..300 {
        let j = live_journal(&store, &format!("/fan/u{i}/kn_journal"));
        store.route(&t("/fan"), j.as_str().as_bytes(), id(&format!("r{i}"))).unwrap();
        journals.push(j);
    }
    let report = store.notify(&t("/fan"), ev(&[("kn_payload", "all")])).unwrap();
    assert!(report.poisoned.is_empty());
    assert_eq!(report.writes.len(), 301);
    for j in &journals {
        assert_eq!(payloads(&all(&store, j)), ["all"], "{j}");
    }
}

#[test]
fn forwarded_copies_do_not_forward_expired_events() {
    let (_d, store) = open();
    route(&store, "/a", "/b", "1");
    route(&store, "/b", "/c", "2");
    let past = format!("{}", now() as i64 - 1);
    store.notify(&t("/a"), ev(&[("kn_payload", "dead"), ("kn_expires", &past)])).unwrap();
    store.notify(&t("/a"), ev(&[("kn_payload", "alive"), ("kn_expires", "+100")])).unwrap();
    assert_eq!(payloads(&all(&store, &t("/b"))), ["alive"]);
    assert_eq!(payloads(&all(&store, &t("/c"))), ["alive"]);
    let c = &all(&store, &t("/c"))[0];
    let exp: f64 = c.get_str("kn_expires").unwrap().parse().unwrap();
    let a = &all(&store, &t("/a"))[0];
    assert_eq!(c.get("kn_expires"), a.get("kn_expires"), "absolute kn_expires stays the same on every hop");
    assert!(exp > now());
}

#[test]
fn routes_on_kn_subtopics_fire_for_announcements() {
    let (_d, store) = open();
    route(&store, "/what/kn_subtopics", "/watch", "w");
    store.notify(&t("/what/chat"), ev(&[("kn_payload", "hi")])).unwrap();
    store.notify(&t("/what/news/today"), ev(&[("kn_payload", "hi")])).unwrap();
    let got = all(&store, &t("/watch"));
    assert_eq!(payloads(&got), ["chat", "news"]);
    assert_eq!(got[0].get_str("kn_routed_from").unwrap(), "http://test.example/kn/what/kn_subtopics");
    // A tunnel creating a topic announces it too.
    drop(store.tunnel(&t("/what/tunnelled"), &Selection::none()).unwrap());
    assert_eq!(payloads(&all(&store, &t("/watch"))), ["chat", "news", "tunnelled"]);
}

// ----- local and remote names -----------------------------------------------------

#[test]
fn absolute_urls_of_this_server_are_local_and_lookalikes_are_not() {
    let (_d, store) = open();
    assert_eq!(store.resolve(b"http://test.example/kn/x/y").unwrap(), Destination::Local(t("/x/y")));
    assert_eq!(store.resolve(b"/x/y").unwrap(), Destination::Local(t("/x/y")));
    assert_eq!(store.resolve(b"x/y").unwrap(), Destination::Local(t("/x/y")));
    assert!(matches!(store.resolve(b"http://test.example/knfoo").unwrap(), Destination::Remote(_)));
    route(&store, "/a", "http://test.example/kn/b", "1");
    store.notify(&t("/a"), ev(&[("kn_payload", "local")])).unwrap();
    assert_eq!(payloads(&all(&store, &t("/b"))), ["local"]);
    // server_url + "foo" is a URL of this server that names no topic: as
    // the original, the route is accepted (whatever the outbound policy,
    // here `deny`) and its first delivery poisons it (a bad name).
    let report = store.route(&t("/a"), b"http://test.example/knfoo", id("2")).unwrap();
    assert!(report.poisoned.is_empty(), "{report:?}");
    let post = store.notify(&t("/a"), ev(&[("kn_payload", "again")])).unwrap();
    assert_eq!(post.poisoned.len(), 1, "{post:?}");
    assert_eq!(post.poisoned[0].route_id, b"2");
    assert_eq!(store.routes(&t("/a")).unwrap().iter().map(|r| r.id().to_vec()).collect::<Vec<_>>(), [b"1".to_vec()]);
}

#[test]
fn add_server_name_makes_an_alias_local() {
    let (dir, store) = open();
    let alias = "http://alias.example:8080/cgi-bin/pubsub.cgi";
    assert!(matches!(store.resolve(format!("{alias}/x").as_bytes()).unwrap(), Destination::Remote(_)));
    store.add_server_name(alias).unwrap();
    assert_eq!(store.resolve(format!("{alias}/x").as_bytes()).unwrap(), Destination::Local(t("/x")));
    route(&store, "/a", &format!("{alias}/b"), "1");
    store.notify(&t("/a"), ev(&[("kn_payload", "via alias")])).unwrap();
    assert_eq!(payloads(&all(&store, &t("/b"))), ["via alias"]);
    // Remembered across opens.
    let again = Store::open_with(config(dir.path())).unwrap();
    assert_eq!(again.resolve(format!("{alias}/x").as_bytes()).unwrap(), Destination::Local(t("/x")));
}

#[cfg(feature = "http")] // a real remote over HTTP
#[test]
fn a_route_delivered_remotely_turns_local_once_its_url_is_a_server_name() {
    let (_d, store) = remote_store();
    let (url, seen) = http_listener(|_| (200, b"ok".to_vec()));
    route(&store, "/a", &format!("{url}/b"), "1");
    store.notify(&t("/a"), ev(&[("kn_payload", "remote")])).unwrap();
    assert_eq!(seen.recv_timeout(Duration::from_secs(5)).unwrap().field("kn_payload").unwrap(), b"remote");
    // The store kept /a's routes between the posts; a new name of this
    // server changes where they lead.
    store.add_server_name(&url).unwrap();
    store.notify(&t("/a"), ev(&[("kn_payload", "local")])).unwrap();
    assert_eq!(payloads(&all(&store, &t("/b"))), ["local"]);
    assert!(seen.recv_timeout(Duration::from_millis(200)).is_err(), "delivered remotely again");
}

#[test]
fn route_to_the_root_topic_is_local() {
    let (_d, store) = open();
    let report = store.route(&t("/a"), b"/", id("r")).unwrap();
    assert!(report.poisoned.is_empty());
    let post = store.notify(&t("/a"), ev(&[("kn_payload", "to root")])).unwrap();
    assert!(post.poisoned.is_empty(), "{post:?}");
    assert_eq!(payloads(&all(&store, &Topic::root())), ["to root"]);
    // And from the root: <server-url><T> with T = "/".
    route(&store, "/", "/from-root", "r0");
    store.notify(&Topic::root(), ev(&[("kn_payload", "down")])).unwrap();
    let got = &all(&store, &t("/from-root"))[0];
    assert_eq!(got.get_str("kn_routed_from").unwrap(), "http://test.example/kn/");
    assert_eq!(got.get_str("kn_route_location").unwrap(), "http://test.example/kn/kn_routes/r0");
}

// ----- URLs of this server that name no topic ---------------------------------------

/// The original answered `200 Routed` to a route into a URL of this server
/// that names no valid topic (old clients stop at a refused route), and the
/// route poisoned at its first delivery (PROTOCOL.md 4.1 step 4: bad name).
/// No request leaves the server for it, so the outbound policy has no say.
#[test]
fn a_url_of_this_server_naming_no_topic_is_routed_then_poisoned_as_a_bad_name() {
    let cases = [
        ("http://test.example/kn/what/a/../flurb", "segment '..' starts or ends with '.'"),
        ("http://test.example/knwhat/a", "only with a '/' after the server URL"),
        ("http://test.example/kn", "only with a '/' after the server URL"),
        ("http://test.example/kn?kn_to=/what/b", "only with a '/' after the server URL"),
        ("http://test.example/kn/what/%00", "byte 0x00 is not allowed"),
    ];
    for policy in [OutboundPolicy::DenyAll, OutboundPolicy::AllowAll] {
        for (destination, why) in cases {
            let (_d, store) = open_with(|c| c.outbound = policy.clone());
            let what = format!("{destination} under {policy:?}");
            let report = store.route(&t("/what/a"), destination.as_bytes(), id("r1")).unwrap();
            assert!(!report.ignored && report.poisoned.is_empty(), "{what}: {report:?}");
            let routes = store.routes(&t("/what/a")).unwrap();
            assert_eq!(routes.len(), 1, "{what}: active until its first delivery");
            assert_eq!(routes[0].destination(), destination.as_bytes(), "{what}: kept as given");

            let post = store.notify(&t("/what/a"), ev(&[("kn_id", "e1"), ("kn_payload", "x")])).unwrap();
            assert_eq!(post.poisoned.len(), 1, "{what}: {post:?}");
            let reason = &post.poisoned[0].reason;
            assert!(reason.starts_with("bad topic name '") && reason.contains(why), "{what}: {reason}");
            assert_poisoned(&store, "/what/a", "r1");
            let poisoned = store.all_routes(&t("/what/a")).unwrap().remove(0);
            assert_eq!(poisoned.event.get_str("kn_poisoned").as_deref(), Some(reason.as_str()), "{what}: the reason is kept");
            // The notify itself stored its event, and nothing else but the poisoning.
            let topics: Vec<String> = post.writes.iter().map(|w| w.topic.to_string()).collect();
            assert_eq!(topics, ["/what/a", "/what/a/kn_routes"], "{what}");
            assert_eq!(payloads(&all(&store, &t("/what/a"))), ["x"]);
            for elsewhere in ["/flurb", "/what/flurb", "/what/a/flurb", "/what/b", "/knwhat/a", "/what"] {
                assert!(all(&store, &t(elsewhere)).is_empty(), "{what}: delivered into {elsewhere}");
            }
            // Poisoned: the next post delivers nothing and poisons nothing.
            let next = store.notify(&t("/what/a"), ev(&[("kn_id", "e2"), ("kn_payload", "y")])).unwrap();
            assert!(next.poisoned.is_empty(), "{what}: {next:?}");
        }
    }
}

/// A new route with initial population poisons at once, and the route
/// request still succeeds (as any route whose first delivery fails).
#[test]
fn a_url_of_this_server_naming_no_topic_poisons_during_initial_population() {
    let (_d, store) = open();
    store.notify(&t("/what/a"), ev(&[("kn_id", "e1"), ("kn_payload", "old")])).unwrap();
    store.notify(&t("/what/a"), ev(&[("kn_id", "e2"), ("kn_payload", "older")])).unwrap();
    let report = store.route(&t("/what/a"), b"http://test.example/knwhat/a", ev(&[("kn_id", "r1"), ("do_max_n", "2")])).unwrap();
    assert_eq!(report.poisoned.len(), 1, "poisoned once, then carries nothing more: {report:?}");
    assert!(report.poisoned[0].reason.starts_with("bad topic name 'http://test.example/knwhat/a'"), "{report:?}");
    assert_poisoned(&store, "/what/a", "r1");
}

/// What stays refused at route time: a name that is neither a topic nor a
/// URL, a URL of this server naming a reserved topic (delivering into it
/// would write routes), and a URL of another server the outbound policy
/// refuses.
#[test]
fn unusable_names_that_are_not_urls_of_this_server_are_still_refused() {
    let (_d, store) = open();
    for (bad, kind) in [
        ("/what/a/../flurb", ErrorKind::BadTopic),
        ("what/%00", ErrorKind::BadTopic),
        ("http://test.example/kn/x/kn_routes", ErrorKind::BadRequest),
        ("http://test.example/kn what", ErrorKind::BadRequest),
        ("http://other.example/kn/what/a", ErrorKind::Forbidden),
        ("http://test.example.other/kn/a", ErrorKind::Forbidden),
        ("http://test.example:81/kn/a", ErrorKind::Forbidden),
    ] {
        let err = store.route(&t("/src"), bad.as_bytes(), id("r")).unwrap_err();
        assert_eq!(err.kind(), kind, "{bad:?}: {err}");
    }
    assert!(store.all_routes(&t("/src")).unwrap().is_empty());
}

/// A server name without a path ends at its port: `http://h:4000` + `1/x`
/// is another port, not a URL of this server naming no topic.
#[test]
fn a_server_name_without_a_path_covers_only_its_own_host_and_port() {
    let (_d, store) = open();
    store.add_server_name("http://127.0.0.1:4000").unwrap();
    for other in ["http://127.0.0.1:40001/x", "http://127.0.0.1:4000.evil.example/x"] {
        let err = store.route(&t("/src"), other.as_bytes(), id("r")).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Forbidden, "{other}: remote, so denied: {err}");
    }
    for own in ["http://127.0.0.1:4000", "http://127.0.0.1:4000?x=1"] {
        store.route(&t("/src"), own.as_bytes(), id("r")).unwrap();
        let post = store.notify(&t("/src"), ev(&[("kn_payload", own)])).unwrap();
        assert_eq!(post.poisoned.len(), 1, "{own}: {post:?}");
    }
    route(&store, "/src", "http://127.0.0.1:4000/dst", "r");
    store.notify(&t("/src"), ev(&[("kn_payload", "local")])).unwrap();
    assert_eq!(payloads(&all(&store, &t("/dst"))), ["local"]);
}

/// A reason that would make the poisoned route larger than
/// `max_event_bytes` is left out; the route is poisoned all the same.
#[test]
fn a_reason_too_large_to_keep_still_poisons_the_route() {
    for (max, kept) in [(2000, true), (300, false)] {
        let (_d, store) = open_with(|c| c.max_event_bytes = max);
        let destination = format!("http://test.example/kn/{}/../x", "a".repeat(200));
        store.route(&t("/a"), destination.as_bytes(), id("r1")).unwrap();
        let post = store.notify(&t("/a"), ev(&[("kn_payload", "p")])).unwrap();
        assert_eq!(post.poisoned.len(), 1, "{post:?}");
        assert!(post.poisoned[0].reason.len() + destination.len() > 300, "the reason alone would not fit");
        assert_poisoned(&store, "/a", "r1");
        let poisoned = store.all_routes(&t("/a")).unwrap().remove(0);
        assert_eq!(poisoned.event.contains("kn_poisoned"), kept, "max_event_bytes {max}: {:?}", poisoned.event);
    }
}
