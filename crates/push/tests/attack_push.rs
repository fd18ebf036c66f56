//! Brief A4: an outside attacker against Web Push routes (issue 42). Each
//! test is an attack; it passes when the attack fails. A small push sink
//! in this file (plain http on loopback, under the test setting that
//! allows loopback endpoints) answers with a fixed status and counts what
//! reached it, so no test needs the Python stand-in: what is attacked is
//! the route's life (accepted, delivered, poisoned), not the cryptography
//! (tests/interop.rs and tests/route.rs check that against http_ece).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use kn_journal::{Config, ErrorKind, Event, HttpRemote, OutboundPolicy, Store, Topic};
use kn_push::{PushPolicy, PushRemote, PushSettings, Sender};

/// RFC 8291 Appendix A's user agent keys (public values).
const P256DH: &str = "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4";
const AUTH: &str = "BTBZMqHH6r4Tts7J_aSIgg";

/// A push service on loopback answering every POST with `status` (and
/// `extra` header lines); counts the requests it read.
struct Sink {
    port: u16,
    hits: Arc<AtomicUsize>,
}

impl Sink {
    fn start(status: &'static str, extra: String) -> Sink {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = hits.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut length = 0usize;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                }
                let mut body = vec![0; length];
                let _ = reader.read_exact(&mut body);
                counted.fetch_add(1, Ordering::SeqCst);
                let _ = write!(stream, "HTTP/1.1 {status}\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n");
            }
        });
        Sink { port, hits }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/push/1", self.port)
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

fn destination(endpoint: &str) -> String {
    let json = serde_json::json!({"endpoint": endpoint, "keys": {"p256dh": P256DH, "auth": AUTH}});
    format!("webpush:{}", URL_SAFE_NO_PAD.encode(json.to_string()))
}

fn store(dir: &std::path::Path, policy: PushPolicy) -> Store {
    let mut config = Config::new(dir.join("kn_events"));
    config.reserve_bytes = 0;
    config.outbound = OutboundPolicy::AllowAll;
    config.forward_backoff = Duration::ZERO;
    config.remote_timeout = Duration::from_secs(5);
    let store = Store::open_with(config.clone()).unwrap();
    let settings = PushSettings { contact: "mailto:ops@example.org".into(), policy, test_loopback: true };
    let sender = Sender::open(store.root(), &config, settings).unwrap();
    store.with_remote(Arc::new(PushRemote::new(Arc::new(HttpRemote::new()), sender)))
}

fn loopback_store(dir: &std::path::Path) -> Store {
    store(dir, PushPolicy::default().allowing_loopback_for_tests())
}

fn t(name: &str) -> Topic {
    Topic::parse(name).unwrap()
}

fn route(store: &Store, to: &str, id: &str) -> kn_journal::Result<kn_journal::RouteReport> {
    let mut event = Event::new();
    event.set("kn_id", id);
    store.route(&t("/what/chat"), to.as_bytes(), event)
}

fn notify(store: &Store, elements: &[(&str, &str)]) {
    let mut e = Event::new();
    for (n, v) in elements {
        e.set(*n, *v);
    }
    store.notify(&t("/what/chat"), e).unwrap();
}

fn poisoned(store: &Store, id: &str) -> Option<String> {
    store.route_of(&t("/what/chat"), id.as_bytes()).unwrap().unwrap().event.get_str("kn_poisoned")
}

/// Drives the lagging routes until `done` holds (bounded).
fn drive_until(store: &Store, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        let _ = store.complete_lagging_forwarding();
        std::thread::sleep(Duration::from_millis(50));
    }
    done()
}

#[test]
fn endpoints_that_dress_up_as_a_push_service_or_hide_an_address_are_refused() {
    let policy = PushPolicy::default();
    for endpoint in [
        "http://fcm.googleapis.com/fcm/send/x",
        "https://fcm.googleapis.com@evil.example/x",
        "https://user:pw@fcm.googleapis.com/x",
        "https://fcm.googleapis.com.evil.example/x",
        "https://evilfcm.googleapis.com/x",
        "https://fcm.googleapis.com./x",
        "https://evil.example\\@fcm.googleapis.com/x",
        "https://evil.example#@fcm.googleapis.com/x",
        "https://evil.example?@fcm.googleapis.com/x",
        // Look-alikes: a Cyrillic 'о', their punycode, a Greek 'ο'.
        "https://fcm.googleapis.c\u{043e}m/x",
        "https://xn--fcm-googleapis-4kb.com/x",
        "https://fcm.g\u{03bf}\u{03bf}gleapis.com/x",
        // Address literals in every spelling WHATWG URL reads.
        "https://127.0.0.1/x",
        "https://2130706433/x",
        "https://0x7f.1/x",
        "https://0177.0.0.1/x",
        "https://127.1/x",
        "https://[::1]/x",
        "https://[::ffff:127.0.0.1]/x",
        "https://[::ffff:169.254.169.254]/x",
        "https://169.254.169.254/latest/meta-data",
        "https://8.8.8.8/x",
        "https://[2a00:1450::1]/x",
        "https://localhost/x",
        "https://LOCALHOST./x",
        "https://%6c%6fcalhost/x",
        "https://evil%2eexample/x",
        "https://push.apple.com/x",
        "file:///etc/passwd",
        "gopher://fcm.googleapis.com/x",
        "https:fcm.googleapis.com.evil.example/x",
    ] {
        assert!(policy.check(endpoint).is_err(), "{endpoint} passed");
    }
}

#[test]
fn an_allowlisted_push_service_is_reached_only_on_the_https_port() {
    // The sender reports the first 200 bytes of an answer in the route's
    // kn_poisoned: a subscription naming another port of an allowlisted
    // host would read that port's answers through `kn routes`.
    let policy = PushPolicy::default();
    assert!(policy.check("https://fcm.googleapis.com/fcm/send/x").is_ok());
    assert!(policy.check("https://fcm.googleapis.com:443/fcm/send/x").is_ok());
    for endpoint in ["https://fcm.googleapis.com:22/x", "https://web.push.apple.com:8443/x", "https://fcm.googleapis.com:80/x"] {
        let err = policy.check(endpoint).unwrap_err();
        assert!(err.to_string().contains("port"), "{endpoint}: {err}");
    }
}

#[test]
fn the_endpoint_a_push_goes_to_is_the_one_the_policy_checked() {
    // WHATWG URL (the policy) maps a fullwidth '．' and '。' to '.' and
    // decodes %2e in a host; an HTTP client given the text as the client
    // wrote it does not. A subscription is parsed to the URL the policy
    // read, so that what was checked is what is sent.
    let sink = Sink::start("201 Created", String::new());
    let dir = tempfile::tempdir().unwrap();
    let store = loopback_store(dir.path());
    let endpoint = format!("http://127\u{3002}0\u{ff0e}0.%31:{}/push/1", sink.port);
    route(&store, &destination(&endpoint), "r1").unwrap();
    notify(&store, &[("kn_id", "e1"), ("kn_payload", "hi")]);
    assert!(drive_until(&store, || sink.hits() == 1), "the push never reached the endpoint checked: {:?}", poisoned(&store, "r1"));
    let sub = kn_push::Subscription::parse(&format!(r#"{{"endpoint":"{endpoint}","keys":{{"p256dh":"{P256DH}","auth":"{AUTH}"}}}}"#)).unwrap();
    assert_eq!(sub.endpoint(), format!("http://127.0.0.1:{}/push/1", sink.port));
}

#[test]
fn a_push_service_redirect_is_not_followed() {
    let elsewhere = TcpListener::bind("127.0.0.1:0").unwrap();
    let location = format!("Location: http://{}/steal\r\n", elsewhere.local_addr().unwrap());
    let sink = Sink::start("307 Temporary Redirect", location);
    let dir = tempfile::tempdir().unwrap();
    let store = loopback_store(dir.path());
    route(&store, &destination(&sink.endpoint()), "r1").unwrap();
    notify(&store, &[("kn_id", "e1"), ("kn_payload", "secret")]);
    assert!(drive_until(&store, || poisoned(&store, "r1").is_some()));
    assert_eq!(sink.hits(), 1);
    elsewhere.set_nonblocking(true).unwrap();
    assert!(elsewhere.accept().is_err(), "the sender followed the push service's redirect");
    assert!(poisoned(&store, "r1").unwrap().contains("307"));
}

#[test]
fn a_retry_after_huge_or_negative_neither_overflows_nor_loops() {
    for retry_after in ["18446744073709551615", "99999999999999999999999", "-5", "1e9", "Wed, 21 Oct 2099 07:28:00 GMT"] {
        let sink = Sink::start("429 Too Many Requests", format!("Retry-After: {retry_after}\r\n"));
        let dir = tempfile::tempdir().unwrap();
        let store = loopback_store(dir.path());
        route(&store, &destination(&sink.endpoint()), "r1").unwrap();
        notify(&store, &[("kn_id", "e1"), ("kn_payload", "hi")]);
        assert_eq!(sink.hits(), 1, "{retry_after}");
        // A few passes of the catch-up: a huge wait keeps the route
        // waiting, a bad one falls back to the back-off; neither panics.
        for _ in 0..5 {
            let _ = store.complete_lagging_forwarding();
        }
        assert!(sink.hits() <= 1 + Config::new(dir.path()).forward_retries as usize, "{retry_after}: {}", sink.hits());
    }
}

#[test]
fn a_subscription_with_a_bad_key_is_refused_when_its_route_is_made_without_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let store = loopback_store(dir.path());
    let endpoint = "http://127.0.0.1:9/push/1";
    let mut off_curve = URL_SAFE_NO_PAD.decode(P256DH).unwrap();
    off_curve[64] ^= 1;
    let mut compressed = vec![2u8];
    compressed.extend_from_slice(&URL_SAFE_NO_PAD.decode(P256DH).unwrap()[1..33]);
    let bads = [
        serde_json::json!({"endpoint": endpoint}),
        serde_json::json!({"endpoint": endpoint, "keys": {"p256dh": P256DH}}),
        serde_json::json!({"endpoint": endpoint, "keys": {"p256dh": URL_SAFE_NO_PAD.encode(&off_curve), "auth": AUTH}}),
        serde_json::json!({"endpoint": endpoint, "keys": {"p256dh": URL_SAFE_NO_PAD.encode(&compressed), "auth": AUTH}}),
        serde_json::json!({"endpoint": endpoint, "keys": {"p256dh": URL_SAFE_NO_PAD.encode([4u8; 65]), "auth": AUTH}}),
        serde_json::json!({"endpoint": endpoint, "keys": {"p256dh": URL_SAFE_NO_PAD.encode([0u8; 65]), "auth": AUTH}}),
        serde_json::json!({"endpoint": endpoint, "keys": {"p256dh": "", "auth": AUTH}}),
        serde_json::json!({"endpoint": endpoint, "keys": {"p256dh": P256DH, "auth": "short"}}),
        serde_json::json!({"endpoint": endpoint, "keys": {"p256dh": P256DH, "auth": "!!!!!!!!!!!!!!!!!!!!!!"}}),
        serde_json::json!({"endpoint": endpoint, "keys": {"p256dh": P256DH, "auth": AUTH.repeat(300)}}),
        serde_json::json!({"endpoint": format!("{endpoint}\r\nX-Evil: 1"), "keys": {"p256dh": P256DH, "auth": AUTH}}),
        serde_json::json!({"endpoint": format!("{endpoint}\u{1b}[2J"), "keys": {"p256dh": P256DH, "auth": AUTH}}),
        serde_json::json!({"endpoint": 7, "keys": {"p256dh": P256DH, "auth": AUTH}}),
        serde_json::json!([]),
    ];
    for bad in bads {
        let err = route(&store, &format!("webpush:{}", URL_SAFE_NO_PAD.encode(bad.to_string())), "r1").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Forbidden, "{bad}: {err}");
    }
    let duplicate = format!(r#"{{"endpoint":"https://evil.example/","endpoint":"{endpoint}","keys":{{"p256dh":"{P256DH}","auth":"{AUTH}"}}}}"#);
    let huge = format!(r#"{{"endpoint":"{endpoint}","keys":{{"p256dh":"{P256DH}","auth":"{AUTH}"}},"x":"{}"}}"#, "a".repeat(1 << 20));
    let nested = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    for text in [duplicate, huge, nested] {
        assert!(route(&store, &format!("webpush:{}", URL_SAFE_NO_PAD.encode(&text)), "r1").is_err());
    }
    for raw in ["webpush:", "webpush:%%%", "webpush:\u{1}\u{2}", "WEBPUSH:e30", "webpush:/w==="] {
        assert!(route(&store, raw, "r1").is_err(), "{raw:?}");
    }
}

#[test]
fn an_event_with_an_id_too_long_for_a_push_does_not_poison_its_route() {
    // Anyone who may post to the topic chooses the event's kn_id. When
    // even the short message (the id and where the event came from) is
    // over the 4096 bytes, the page gets the shortest message there is,
    // and the route lives on for the next event.
    let sink = Sink::start("201 Created", String::new());
    let dir = tempfile::tempdir().unwrap();
    let store = loopback_store(dir.path());
    route(&store, &destination(&sink.endpoint()), "r1").unwrap();
    notify(&store, &[("kn_id", &"i".repeat(5000)), ("kn_payload", "poison")]);
    notify(&store, &[("kn_id", "e2"), ("kn_payload", "next")]);
    assert!(drive_until(&store, || sink.hits() == 2 || poisoned(&store, "r1").is_some()));
    assert_eq!(poisoned(&store, "r1"), None, "one event with a long kn_id poisoned the route");
    assert_eq!(sink.hits(), 2);
}
