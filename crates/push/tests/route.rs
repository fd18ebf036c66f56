//! Push routes through the store's outbox (issue 42), against the
//! independent stand-in push service of push_service.py (PyPI http_ece
//! and py_vapid) on loopback under the test setting: delivery, retry on
//! 429 (after its Retry-After) and 503, poisoning on 410 with the reason
//! kept for `kn routes`, and the refusals at route creation.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use kn_journal::{Config, ErrorKind, Event, HttpRemote, OutboundPolicy, Store, Topic};
use kn_push::{PushPolicy, PushRemote, PushSettings, Sender};

struct StandIn {
    child: Child,
    keys: serde_json::Value,
    base: String,
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl StandIn {
    fn start() -> Option<StandIn> {
        match Command::new("python3").args(["-c", "import http_ece, py_vapid"]).output() {
            Ok(out) if out.status.success() => {}
            other => {
                kn_test_support::skip(&format!("python3 with http_ece and py_vapid is needed (pip install http_ece py_vapid): {other:?}"));
                return None;
            }
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/push_service.py");
        let mut child = Command::new("python3").arg(script).arg("--http").stdout(Stdio::piped()).spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let first: serde_json::Value = serde_json::from_str(&line).unwrap();
        Some(StandIn { child, keys: first["subscription"]["keys"].clone(), base: first["base"].as_str().unwrap().to_string() })
    }

    /// The route destination of a subscription whose endpoint is `endpoint`.
    fn destination(&self, endpoint: &str) -> String {
        let json = serde_json::json!({"endpoint": endpoint, "keys": self.keys});
        format!("webpush:{}", URL_SAFE_NO_PAD.encode(json.to_string()))
    }

    fn results(&self) -> Vec<serde_json::Value> {
        let mut body = String::new();
        ureq::get(&format!("{}/results", self.base)).call().unwrap().body_mut().as_reader().read_to_string(&mut body).unwrap();
        serde_json::from_str(&body).unwrap()
    }

    fn results_for(&self, path: &str) -> Vec<serde_json::Value> {
        self.results().into_iter().filter(|r| r["path"] == path).collect()
    }
}

fn settings(test_loopback: bool) -> PushSettings {
    let policy = if test_loopback { PushPolicy::default().allowing_loopback_for_tests() } else { PushPolicy::default() };
    PushSettings { contact: "mailto:ops@example.org".into(), policy, test_loopback }
}

fn store(dir: &std::path::Path, outbound: OutboundPolicy, test_loopback: bool) -> Store {
    let mut config = Config::new(dir.join("kn_events"));
    config.reserve_bytes = 0;
    config.outbound = outbound;
    config.forward_backoff = Duration::ZERO;
    let store = Store::open_with(config.clone()).unwrap();
    let sender = Sender::open(store.root(), &config, settings(test_loopback)).unwrap();
    let remote = PushRemote::new(Arc::new(HttpRemote::new()), sender);
    store.with_remote(Arc::new(remote))
}

fn t(name: &str) -> Topic {
    Topic::parse(name).unwrap()
}

fn notify(store: &Store, topic: &str, id: &str, payload: &str) {
    let mut e = Event::new();
    e.set("kn_id", id).set("kn_payload", payload);
    store.notify(&t(topic), e).unwrap();
}

fn route(store: &Store, to: &str, params: &[(&str, &str)]) -> kn_journal::Result<kn_journal::RouteReport> {
    let mut event = Event::new();
    for (n, v) in params {
        event.set(*n, *v);
    }
    store.route(&t("/what/chat"), to.as_bytes(), event)
}

/// Waits (bounded) until `done` holds, driving the lagging routes.
fn drive_until(store: &Store, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        let _ = store.complete_lagging_forwarding();
        std::thread::sleep(Duration::from_millis(100));
    }
    done()
}

#[test]
fn an_event_routed_to_a_push_subscription_is_decrypted_by_http_ece_with_a_vapid_jwt_py_vapid_verifies() {
    let Some(service) = StandIn::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let policy: OutboundPolicy = service.base.parse().unwrap();
    let store = store(dir.path(), policy, true);
    let dest = service.destination(&format!("{}/push/201", service.base));
    route(&store, &dest, &[("kn_id", "r1"), ("kn_push_urgency", "high"), ("kn_push_topic", "chat")]).unwrap();
    notify(&store, "/what/chat", "e1", "hello, closed page");
    let got = service.results_for("/push/201");
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["ok"], true, "{}", got[0]);
    let plaintext = STANDARD.decode(got[0]["plaintext"].as_str().unwrap()).unwrap();
    let message: serde_json::Value = serde_json::from_slice(&plaintext).unwrap();
    assert_eq!(message["kn_payload"], "hello, closed page");
    assert_eq!(message["kn_id"], "e1");
    assert_eq!(got[0]["headers"]["urgency"], "high");
    assert_eq!(got[0]["headers"]["topic"], "chat");
    assert_eq!(got[0]["headers"]["ttl"], "2419200");
}

#[test]
fn an_event_over_the_4096_byte_cap_travels_as_its_id() {
    let Some(service) = StandIn::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path(), OutboundPolicy::AllowAll, true);
    route(&store, &service.destination(&format!("{}/push/201", service.base)), &[("kn_id", "r1")]).unwrap();
    notify(&store, "/what/chat", "big", &"x".repeat(5000));
    let got = service.results_for("/push/201");
    assert_eq!(got[0]["ok"], true, "{}", got[0]);
    let message: serde_json::Value = serde_json::from_slice(&STANDARD.decode(got[0]["plaintext"].as_str().unwrap()).unwrap()).unwrap();
    assert_eq!(message["kn_id"], "big");
    assert_eq!(message["kn_push_truncated"], "1");
    assert!(message.get("kn_payload").is_none());
}

#[test]
fn a_push_service_answering_429_then_503_is_retried_not_before_its_retry_after() {
    let Some(service) = StandIn::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path(), OutboundPolicy::AllowAll, true);
    route(&store, &service.destination(&format!("{}/push/429-503-201", service.base)), &[("kn_id", "r1")]).unwrap();
    notify(&store, "/what/chat", "e1", "later");
    assert_eq!(service.results_for("/push/429-503-201").len(), 1);
    // The 429 said Retry-After: 2; forward_backoff is 0, so only the
    // Retry-After holds this drain back.
    store.complete_lagging_forwarding().unwrap();
    assert_eq!(service.results_for("/push/429-503-201").len(), 1, "retried before Retry-After");
    assert!(drive_until(&store, || service.results_for("/push/429-503-201").len() >= 3));
    let got = service.results_for("/push/429-503-201");
    let statuses: Vec<_> = got.iter().map(|r| r["status"].as_u64().unwrap()).collect();
    assert_eq!(statuses, [429, 503, 201]);
    assert!(got.iter().all(|r| r["ok"] == true));
    assert!(store.route_of(&t("/what/chat"), b"r1").unwrap().unwrap().event.get("kn_poisoned").is_none());
}

#[test]
fn a_subscription_the_push_service_calls_gone_poisons_its_route_saying_why() {
    let Some(service) = StandIn::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path(), OutboundPolicy::AllowAll, true);
    route(&store, &service.destination(&format!("{}/push/410", service.base)), &[("kn_id", "r1")]).unwrap();
    notify(&store, "/what/chat", "e1", "gone");
    let route = store.route_of(&t("/what/chat"), b"r1").unwrap().unwrap();
    let why = route.event.get_str("kn_poisoned").expect("poisoned");
    assert!(why.contains("410") && why.contains("gone"), "{why}");
    notify(&store, "/what/chat", "e2", "not sent");
    assert_eq!(service.results_for("/push/410").len(), 1);
}

#[test]
fn push_routes_to_http_loopback_private_or_unlisted_endpoints_are_refused() {
    let Some(service) = StandIn::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path(), OutboundPolicy::AllowAll, false);
    for (endpoint, why) in [
        ("http://fcm.googleapis.com/fcm/send/x", "only https"),
        ("https://127.0.0.1/push", "non-global"),
        ("https://10.0.0.7/push", "non-global"),
        ("https://localhost/push", "loopback"),
        ("https://push.example.net/push", "allowlist"),
        (&format!("{}/push/201", service.base), "only https"),
    ] {
        let err = route(&store, &service.destination(endpoint), &[("kn_id", "r1")]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Forbidden, "{endpoint}: {err}");
        assert!(err.to_string().contains(why), "{endpoint}: {err}");
    }
    assert!(route(&store, "webpush:bm90IGpzb24", &[("kn_id", "r1")]).is_err());
    // KN_OUTBOUND has its say too: the stand-in is allowed by the test
    // setting but not by a policy that denies all.
    let denying = store_denying(dir.path());
    let err = route(&denying, &service.destination(&format!("{}/push/201", service.base)), &[("kn_id", "r1")]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Forbidden, "{err}");
}

fn store_denying(dir: &std::path::Path) -> Store {
    store(&dir.join("other"), OutboundPolicy::DenyAll, true)
}

#[test]
fn a_store_without_a_push_sender_refuses_push_routes() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path().join("kn_events"));
    config.reserve_bytes = 0;
    config.outbound = OutboundPolicy::AllowAll;
    let store = Store::open_with(config).unwrap();
    let err = route(&store, "webpush:e30", &[]).unwrap_err();
    assert!(err.to_string().contains("sends no Web Push"), "{err}");
}

#[test]
fn a_creator_may_make_max_push_routes_and_one_more_only_after_deleting_one() {
    let Some(service) = StandIn::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path().join("kn_events"));
    config.reserve_bytes = 0;
    config.outbound = OutboundPolicy::AllowAll;
    config.max_push_routes = 2;
    let store = Store::open_with(config.clone()).unwrap();
    let sender = Sender::open(store.root(), &config, settings(true)).unwrap();
    let store = store.with_remote(Arc::new(PushRemote::new(Arc::new(HttpRemote::new()), sender)));
    let anna = kn_journal::access::Principal::user("anna");
    let bob = kn_journal::access::Principal::user("bob");
    let dest = service.destination(&format!("{}/push/201", service.base));
    let make = |who: &kn_journal::access::Principal, topic: &str, id: &str| {
        let mut params = Event::new();
        params.set("kn_id", id);
        store.as_user(who).route(&t(topic), dest.as_bytes(), params)
    };
    make(&anna, "/what/a", "p1").unwrap();
    make(&anna, "/what/b", "p2").unwrap();
    // The same route again is no new route.
    make(&anna, "/what/b", "p2").unwrap();
    let err = make(&anna, "/what/c", "p3").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Forbidden, "{err}");
    assert!(err.to_string().contains("KN_MAX_PUSH_ROUTES"), "{err}");
    // Another user has a bound of their own.
    make(&bob, "/what/c", "p3").unwrap();
    // Deleting one makes room.
    store.as_user(&anna).delete_route(&t("/what/a"), b"p1", None).unwrap();
    make(&anna, "/what/c", "p4").unwrap();
}

#[test]
fn requests_racing_at_the_push_route_bound_never_pass_it() {
    // Deliberately racing: sixteen threads, each its own route for the
    // same creator, five rounds (five creators). Without the creator's
    // lock around the count and the note, several pass the bound of 3.
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path().join("kn_events"));
    config.reserve_bytes = 0;
    config.outbound = OutboundPolicy::AllowAll;
    config.max_push_routes = 3;
    let store = Store::open_with(config.clone()).unwrap();
    let sender = Sender::open(store.root(), &config, settings(true)).unwrap();
    let store = store.with_remote(Arc::new(PushRemote::new(Arc::new(HttpRemote::new()), sender)));
    // RFC 8291 Appendix A's public keys; nothing is sent (no event).
    let json = r#"{"endpoint":"http://127.0.0.1:9/push/201","keys":{"p256dh":"BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4","auth":"BTBZMqHH6r4Tts7J_aSIgg"}}"#;
    let dest = format!("webpush:{}", URL_SAFE_NO_PAD.encode(json));
    for round in 0..5 {
        let who = kn_journal::access::Principal::user(&format!("anna{round}"));
        let made = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for i in 0..16 {
                let (store, who, dest, made) = (&store, &who, &dest, &made);
                s.spawn(move || {
                    let mut params = Event::new();
                    params.set("kn_id", format!("p{i}"));
                    match store.as_user(who).route(&t(&format!("/what/r{i}")), dest.as_bytes(), params) {
                        Ok(_) => {
                            made.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                        Err(e) => assert_eq!(e.kind(), ErrorKind::Forbidden, "{e}"),
                    }
                });
            }
        });
        assert_eq!(made.into_inner(), 3, "round {round}: routes made past KN_MAX_PUSH_ROUTES=3");
    }
}
