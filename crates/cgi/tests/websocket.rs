//! WebSocket on `pubsub-cgi serve` (docs/PROTOCOL.md, "WebSocket
//! (extension)"), driven by an independent client, Python's `websockets`
//! from PyPI: a socket subscribes and publishes, each request answered by
//! its `kn_id` (a resend is no second event); it resumes exactly across a
//! SIGKILL of serve, with the `205` gap signal where its point is gone;
//! it is refused without rights, closed `4403` when the rules change and
//! `4401` when its token expires; `Origin` is checked; SIGTERM closes it
//! `1001`. Limits: crates/cgi/tests/websocket_limits.rs.

#[path = "websocket/common.rs"]
mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use kn_journal::{Event, Store, Topic};
use kn_test_support::{wait_exit, Dir};
use serde_json::json;

const JOURNAL: &str = "/who/ws/kn_journal";

fn route(id: &str) -> String {
    request(&[("do_method", "route"), ("kn_from", "/what/chat"), ("kn_to", JOURNAL), ("kn_id", id)])
}

fn notify(id: &str, payload: &str) -> String {
    request(&[("do_method", "notify"), ("kn_to", "/what/chat"), ("kn_payload", payload), ("kn_id", id)])
}

#[test]
fn a_socket_subscribes_publishes_and_each_request_is_answered_by_its_kn_id() {
    if !websockets_available() {
        return;
    }
    let dir = Dir::new("websocket_basic");
    let serve = serve(&dir.join("kn_events"), &[], &[]);
    let lines = Client::run(
        &socket_url(&serve, JOURNAL, ""),
        &[
            "--protocol", "kn",
            "--send", &route("r1"),
            "--send", &notify("m1", "hello"),
            // The same kn_id again: answered, but no second event.
            "--send", &notify("m1", "hello"),
            // A form body works as well as JSON.
            "--send", "do_method=notify&kn_to=%2Fwhat%2Fchat&kn_payload=second&kn_id=m2",
            "--until", "\"kn_payload\":\"second\"",
        ],
    );
    assert_eq!(lines[0], json!({"open": true, "subprotocol": "kn"}), "{lines:?}");
    let frames = frames(&lines);
    assert_eq!(frames[0]["status"], "200 Watching topic", "{frames:?}");
    for id in ["r1", "m1", "m2"] {
        let answers = answer_to(&frames, id);
        assert!(!answers.is_empty(), "no answer to {id}: {frames:?}");
        assert!(answers.iter().all(|a| a["status"].as_str().is_some_and(|s| s.starts_with("200"))), "{answers:?}");
    }
    assert_eq!(answer_to(&frames, "m1").len(), 2, "each request is answered: {frames:?}");
    let hello = with_payload(&frames, "hello");
    assert_eq!(hello.len(), 1, "a resend with the same kn_id is no second event: {frames:?}");
    assert!(hello[0]["kn_route_checkpoint"].as_str().is_some_and(|c| !c.is_empty()), "each event has its checkpoint: {hello:?}");
    assert_eq!(with_payload(&frames, "second").len(), 1);
}

#[test]
fn a_tunnel_url_with_the_upgrade_header_alone_is_a_socket_and_without_it_426() {
    if !websockets_available() {
        return;
    }
    let dir = Dir::new("websocket_upgrade");
    let serve = serve(&dir.join("kn_events"), &[], &[]);
    let url = format!("ws://{}/kn{JOURNAL}?do_method=route&kn_response_format=sse", serve.addr());
    let lines = Client::run(&url, &["--until", "Watching topic"]);
    assert_eq!(frames(&lines)[0]["status"], "200 Watching topic", "{lines:?}");
    // kn_response_format=websocket without an upgrade: told to upgrade.
    let plain = format!("http://{}/kn{JOURNAL}?do_method=route&kn_response_format=websocket", serve.addr());
    let mut stream = kn_test_support::http::Stream::get(&plain);
    stream.read_to_end(Duration::from_secs(10));
    assert_eq!(stream.status(), Some(426), "{}", stream.text());
}

#[test]
fn a_socket_resumes_exactly_across_a_sigkill_of_serve_and_signals_a_gap() {
    if !websockets_available() {
        return;
    }
    let dir = Dir::new("websocket_resume");
    let root = dir.join("kn_events");
    let mut first = serve(&root, &[], &[]);
    let lines = Client::run(
        &socket_url(&first, JOURNAL, ""),
        &["--send", &route("r1"), "--send", &notify("e1", "one"), "--send", &notify("e2", "two"), "--until", "\"kn_payload\":\"two\""],
    );
    let two = with_payload(&frames(&lines), "two");
    let checkpoint = two[0]["kn_route_checkpoint"].as_str().expect("a checkpoint").to_owned();

    first.child.kill().unwrap();
    first.child.wait().unwrap();
    // While serve is dead, another process posts (routes apply as ever).
    let store = Store::open(&root).unwrap();
    store.notify(&Topic::parse("/what/chat").unwrap(), Event::from_pairs([("kn_id", "e3"), ("kn_payload", "three")])).unwrap();
    drop(store);

    let second = serve(&root, &[], &[]);
    let resumed = Client::run(&socket_url(&second, JOURNAL, &format!("&last_event_id={checkpoint}")), &["--until", "\"kn_payload\":\"three\"", "--timeout", "5"]);
    let frames_after = frames(&resumed);
    assert_eq!(with_payload(&frames_after, "three").len(), 1, "{resumed:?}");
    assert!(with_payload(&frames_after, "one").is_empty() && with_payload(&frames_after, "two").is_empty(), "exactly after the checkpoint: {resumed:?}");
    assert!(!frames_after.iter().any(|f| f["status"].as_str().is_some_and(|s| s.starts_with("205"))), "{resumed:?}");

    // A point the journal never held: the gap signal, then what it holds.
    let gap = Client::run(&socket_url(&second, JOURNAL, "&last_event_id=nowhere"), &["--until", "\"kn_payload\":\"three\""]);
    let gap = frames(&gap);
    assert!(gap.iter().any(|f| f["status"] == "205 Reset Content"), "{gap:?}");
}

const RULES: &str = "\
group staff: anna bob
allow all             /who/{user}/**                 users
allow post,read       /what/staff/**                 @staff
";

const BOB_LEFT: &str = "\
group staff: anna
allow all             /who/{user}/**                 users
allow post,read       /what/staff/**                 @staff
";

#[test]
fn a_socket_is_refused_without_rights_and_closed_4403_when_the_rules_change() {
    if !websockets_available() {
        return;
    }
    let dir = Dir::new("websocket_rights");
    dir.create("access.rules", RULES);
    let rules = dir.join("access.rules");
    let rules_env = rules.to_string_lossy().into_owned();
    let serve = serve(&dir.join("kn_events"), &["--trusted-proxy", "127.0.0.1"], &[("KN_ACCESS_RULES", &rules_env)]);
    let url = format!("ws://{}/kn/what/staff/plans?do_method=route&kn_response_format=websocket", serve.addr());
    assert_eq!(refused(&Client::run(&url, &["--header", "X-Remote-User: carol"])), Some(403));
    assert_eq!(refused(&Client::run(&url, &[])), Some(401), "anonymous");

    let mut bob = Client::start(&url, &["--header", "X-Remote-User: bob", "--timeout", "30"]);
    assert!(bob.wait_for(Duration::from_secs(10), |l| l.to_string().contains("Watching topic")), "{:?}", bob.seen);
    let store = Store::open(dir.join("kn_events")).unwrap();
    let plans = Topic::parse("/what/staff/plans").unwrap();
    store.notify(&plans, Event::from_pairs([("kn_id", "e1"), ("kn_payload", "before")])).unwrap();
    assert!(bob.wait_for(Duration::from_secs(10), |l| l.to_string().contains("before")), "{:?}", bob.seen);

    std::fs::write(&rules, BOB_LEFT).unwrap();
    // The rules are read again once a second.
    std::thread::sleep(Duration::from_millis(1100));
    store.notify(&plans, Event::from_pairs([("kn_id", "e2"), ("kn_payload", "after")])).unwrap();
    assert!(bob.wait_for(Duration::from_secs(10), |l| l.get("closed").is_some()), "{:?}", bob.seen);
    assert_eq!(closed(&bob.seen), Some(4403), "{:?}", bob.seen);
    assert!(with_payload(&bob.frames(), "after").is_empty(), "{:?}", bob.seen);
    assert!(bob.frames().iter().any(|f| f["status"] == "403 Forbidden"), "the refusal comes first: {:?}", bob.seen);
}

#[test]
fn a_socket_opened_with_a_token_in_its_subprotocol_closes_4401_when_it_expires() {
    if !websockets_available() {
        return;
    }
    let dir = Dir::new("websocket_token");
    dir.create("access.rules", "allow all /** users\n");
    let secret = b"an HS256 secret of the test key, 32 bytes or more";
    let key = dir.create("a.key", secret);
    let rules = dir.join("access.rules").to_string_lossy().into_owned();
    let keys = format!("a=HS256:{}", key.display());
    let env = [("KN_ACCESS_RULES", rules.as_str()), ("KN_TOKEN_KEYS", keys.as_str()), ("KN_TOKEN_LEEWAY", "0")];
    let serve = serve(&dir.join("kn_events"), &[], &env);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    let token = |exp: u64| {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        header.kid = Some("a".into());
        jsonwebtoken::encode(&header, &json!({"sub": "anna", "exp": exp}), &jsonwebtoken::EncodingKey::from_secret(secret)).unwrap()
    };
    let url = socket_url(&serve, "/who/anna/kn_journal", "");
    assert_eq!(refused(&Client::run(&url, &["--protocol", "kn"])), Some(401), "no token");
    let bearer = format!("kn.bearer.{}", token(now + 3));
    let lines = Client::run(
        &url,
        &["--protocol", "kn", "--protocol", &bearer, "--send", &request(&[("kn_to", "/who/anna/notes"), ("kn_payload", "x"), ("kn_id", "n1")]), "--timeout", "20"],
    );
    let frames = frames(&lines);
    assert_eq!(lines[0], json!({"open": true, "subprotocol": "kn"}), "{lines:?}");
    assert!(answer_to(&frames, "n1")[0]["status"].as_str().is_some_and(|s| s.starts_with("200")), "a request made with the token: {frames:?}");
    assert_eq!(closed(&lines), Some(4401), "{lines:?}");
    assert!(frames.iter().any(|f| f["status"].as_str().is_some_and(|s| s.starts_with("401"))), "{frames:?}");
    // The same token in the query, as a browser may send it.
    let in_query = Client::run(&socket_url(&serve, "/who/anna/kn_journal", &format!("&kn_token={}", token(now + 3600))), &["--until", "Watching topic"]);
    assert!(in_query[0].get("open").is_some(), "{in_query:?}");
}

#[test]
fn origin_is_the_same_host_by_default_and_the_configured_list_otherwise() {
    if !websockets_available() {
        return;
    }
    let dir = Dir::new("websocket_origin");
    let same = serve(&dir.join("kn_events"), &[], &[]);
    let url = socket_url(&same, JOURNAL, "");
    assert_eq!(refused(&Client::run(&url, &["--origin", "http://evil.example"])), Some(403));
    let own = format!("http://{}", same.addr());
    assert!(Client::run(&url, &["--origin", &own, "--until", "Watching"])[0].get("open").is_some());
    drop(same);
    let listed = serve(&dir.join("kn_events"), &[], &[("KN_WS_ORIGINS", "http://app.example")]);
    let url = socket_url(&listed, JOURNAL, "");
    assert!(Client::run(&url, &["--origin", "http://app.example", "--until", "Watching"])[0].get("open").is_some());
    let own = format!("http://{}", listed.addr());
    assert_eq!(refused(&Client::run(&url, &["--origin", &own])), Some(403), "the list replaces the default");
}

#[test]
fn sigterm_closes_every_socket_1001_after_a_503_status() {
    if !websockets_available() {
        return;
    }
    let dir = Dir::new("websocket_sigterm");
    let mut serve = serve(&dir.join("kn_events"), &[], &[]);
    let mut client = Client::start(&socket_url(&serve, JOURNAL, ""), &["--timeout", "30"]);
    assert!(client.wait_for(Duration::from_secs(10), |l| l.to_string().contains("Watching topic")), "{:?}", client.seen);
    // SAFETY: a plain system call on our own child's pid.
    assert_eq!(unsafe { libc::kill(serve.child.id() as libc::pid_t, libc::SIGTERM) }, 0);
    assert!(client.wait_for(Duration::from_secs(10), |l| l.get("closed").is_some()), "{:?}", client.seen);
    assert_eq!(closed(&client.seen), Some(1001), "{:?}", client.seen);
    assert!(client.frames().iter().any(|f| f["status"] == "503 Service Unavailable"), "{:?}", client.seen);
    assert!(wait_exit(&mut serve.child, Duration::from_secs(10)).is_some_and(|s| s.success()));
}
