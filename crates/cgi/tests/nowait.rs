//! `Handler::handle_nowait`, what `serve` answers on its event loop: a
//! single notify the store can make at once, answered exactly as
//! `Handler::handle` answers it (twin stores, the same requests, the same
//! bytes but the status event's fresh `kn_id`), and every other request
//! left to `handle` with nothing done.

use std::sync::Arc;

use kn_cgi::{Handler, HttpRequest, Limits, Options, Reply, Request};
use kn_journal::{Selection, Store, Topic};

struct Twin {
    _dir: tempfile::TempDir,
    handler: Handler,
    store: Arc<Store>,
}

impl Twin {
    fn new(rules: Option<&str>) -> Twin {
        let dir = tempfile::tempdir().unwrap();
        let mut config = kn_journal::Config::new(dir.path().join("events"));
        config.server_url = Some("http://127.0.0.1:8080/kn".into());
        config.reserve_bytes = 0;
        if let Some(rules) = rules {
            let path = dir.path().join("access.rules");
            std::fs::write(&path, rules).unwrap();
            config.access_rules = Some(path);
        }
        let store = Arc::new(Store::open_with(config).unwrap());
        Twin { handler: Handler::new(store.clone(), Options::default()), store, _dir: dir }
    }

    fn payloads(&self, topic: &str) -> Vec<String> {
        let topic = Topic::parse(topic).unwrap();
        self.store.events(&topic, &Selection::all()).unwrap().events.iter().map(|e| String::from_utf8_lossy(e.payload()).into_owned()).collect()
    }
}

fn request(method: &str, path: &str, query: &str, body: &str) -> Request {
    let http = HttpRequest {
        method: method.into(),
        path_info: path.as_bytes().to_vec(),
        query: query.as_bytes().to_vec(),
        body: body.as_bytes().to_vec(),
        script_name: "/kn".into(),
        server_name: "127.0.0.1".into(),
        server_port: 8080,
        ..HttpRequest::default()
    };
    Request::from_http(http, &Limits::default()).unwrap()
}

/// Status, headers and body, with the status event's fresh `kn_id`
/// (different on every answer) masked: the first run of 16 id characters
/// shortly after each `kn_id`.
fn bytes(reply: Reply) -> String {
    let Reply::Done(response) = reply else { panic!("a tunnel") };
    let mut body = response.body.clone();
    let is_id = |b: &u8| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'-';
    let mut from = 0;
    while let Some(at) = body[from..].windows(5).position(|w| w == b"kn_id").map(|p| p + from + 5) {
        let mut i = at;
        while i < body.len() && i < at + 20 {
            let run = body[i..].iter().take_while(|b| is_id(b)).count();
            if run == 16 {
                body[i..i + 16].fill(b'*');
                break;
            }
            i += run.max(1);
        }
        from = at;
    }
    format!("{} {:?}\n{}", response.code(), response.head.headers, String::from_utf8_lossy(&body))
}

/// Primes both twins with a blocking notify of `topic` (so that the store
/// keeps its files), then answers `(method, path, query, body)` on one
/// with `handle_nowait` (which must answer) and on the other with
/// `handle`, and compares.
fn same_answer(rules: Option<&str>, topic: &str, method: &str, path: &str, query: &str, body: &str) -> String {
    let (fast, slow) = (Twin::new(rules), Twin::new(rules));
    for twin in [&fast, &slow] {
        let prime = request("POST", topic, "", "kn_payload=first&kn_id=p1");
        twin.handler.handle(&prime);
    }
    let quick = fast.handler.handle_nowait(&request(method, path, query, body)).expect("answered at once");
    let quick = bytes(quick);
    let usual = bytes(slow.handler.handle(&request(method, path, query, body)));
    assert_eq!(quick, usual, "{method} {path}?{query} {body}");
    assert_eq!(fast.payloads(topic), slow.payloads(topic));
    quick
}

#[test]
fn a_notify_made_at_once_is_answered_as_handle_answers_it() {
    for format in ["simple", "js", "sse", "flash"] {
        let query = format!("kn_response_format={format}");
        let answer = same_answer(None, "/chat", "POST", "/chat", &query, "do_method=notify&kn_payload=hi&kn_id=n2");
        assert!(answer.starts_with("200 "), "{answer}");
        assert!(answer.contains("Wrote to '/chat' (n2)"), "{answer}");
    }
    // kn_to, path info, a POST without do_method, kn_status_from.
    same_answer(None, "/chat", "GET", "", "do_method=notify&kn_to=/chat&kn_payload=x&kn_id=n3&kn_response_format=simple", "");
    same_answer(None, "/chat", "POST", "/chat", "", "kn_payload=x&kn_id=n4&kn_status_from=me");
    // A duplicate: nothing stored, answered the same.
    let dup = same_answer(None, "/chat", "POST", "/chat", "kn_response_format=simple", "kn_payload=first&kn_id=p1");
    assert!(!dup.contains("Wrote to"), "{dup}");
}

#[test]
fn a_routed_notify_made_at_once_is_answered_as_handle_answers_it() {
    let (fast, slow) = (Twin::new(None), Twin::new(None));
    for twin in [&fast, &slow] {
        twin.handler.handle(&request("POST", "/room", "", "do_method=route&kn_to=/room-copies&kn_id=r1"));
        twin.handler.handle(&request("POST", "/room", "", "kn_payload=first&kn_id=p1"));
    }
    let ask = || request("POST", "/room", "kn_response_format=simple", "do_method=notify&kn_payload=hi&kn_id=n2");
    let quick = bytes(fast.handler.handle_nowait(&ask()).expect("answered at once"));
    let usual = bytes(slow.handler.handle(&ask()));
    assert_eq!(quick, usual);
    assert!(quick.contains("Wrote to '/room' (n2)\nWrote to '/room-copies' (n2)"), "{quick}");
    for twin in [&fast, &slow] {
        assert_eq!(twin.payloads("/room-copies"), ["first", "hi"]);
    }
}

#[test]
fn refusals_and_bad_input_are_answered_as_handle_answers_them() {
    let rules = "allow all /open/** all\n";
    let refused = same_answer(Some(rules), "/open/t", "POST", "/closed", "kn_response_format=simple", "kn_payload=x");
    assert!(refused.starts_with("401 "), "{refused}");
    let bad = same_answer(None, "/chat", "POST", "", "kn_response_format=simple", "do_method=notify&kn_to=/a%01b&kn_payload=x");
    assert!(bad.contains("400 bad posting destination topic name"), "{bad}");
    let remote = same_answer(None, "/chat", "POST", "", "kn_response_format=simple", "do_method=notify&kn_to=http://elsewhere.example/kn/t");
    assert!(remote.contains("403"), "{remote}");
}

#[test]
fn every_other_request_is_left_to_handle_with_nothing_done() {
    let twin = Twin::new(None);
    twin.handler.handle(&request("POST", "/chat", "", "kn_payload=first"));
    for (method, path, query, body) in [
        ("POST", "/never", "", "kn_payload=x"),
        ("POST", "/chat", "", "kn_payload=x&kn_status_to=/status"),
        ("POST", "/chat", "", "do_method=route&kn_to=/elsewhere"),
        ("POST", "", "", "do_method=batch&kn_batch=do_method%3Dnotify%26kn_to%3D%2Fchat"),
        ("GET", "/chat", "do_method=route", ""),
        ("GET", "/chat", "", ""),
        ("POST", "/chat", "kn_response_format=nonsense", "kn_payload=x"),
    ] {
        assert!(twin.handler.handle_nowait(&request(method, path, query, body)).is_none(), "{method} {path}?{query} {body}");
    }
    assert_eq!(twin.payloads("/chat"), ["first"]);
    assert!(!twin.store.root().join("never").exists());
}

/// Notifies to one routed topic in hand together
/// (`Handler::handle_nowait_group`, what `serve` gathers on its event
/// loop): each answered byte for byte as `handle` answers the same
/// notifies one after another, stored and forwarded in the order given;
/// one naming a bad topic answered alone, as `handle` answers it.
#[test]
fn notifies_in_hand_together_are_answered_as_handle_answers_each() {
    let (fast, slow) = (Twin::new(None), Twin::new(None));
    for twin in [&fast, &slow] {
        twin.handler.handle(&request("POST", "/room", "", "do_method=route&kn_to=/room-copies&kn_id=r1"));
        twin.handler.handle(&request("POST", "/room", "", "kn_payload=first&kn_id=p1"));
    }
    let asks = || {
        vec![
            request("POST", "/room", "kn_response_format=simple", "do_method=notify&kn_payload=a&kn_id=n1"),
            request("POST", "/room", "kn_response_format=js", "do_method=notify&kn_payload=b&kn_id=n2"),
            request("POST", "", "kn_response_format=simple", "do_method=notify&kn_to=/a%01b&kn_payload=x"),
            request("POST", "/room", "kn_response_format=simple", "do_method=notify&kn_payload=a&kn_id=n1"),
            request("GET", "", "do_method=notify&kn_to=/room&kn_payload=c&kn_id=n3&kn_response_format=simple", ""),
        ]
    };
    let asked = asks();
    let group: Vec<&Request> = asked.iter().collect();
    assert!(group.iter().all(|r| fast.handler.nowait_topic(r).is_some()));
    let quick: Vec<String> = fast.handler.handle_nowait_group(&group).into_iter().map(|r| bytes(r.expect("answered at once"))).collect();
    let usual: Vec<String> = asks().iter().map(|r| bytes(slow.handler.handle(r))).collect();
    assert_eq!(quick, usual);
    assert!(quick[0].contains("Wrote to '/room' (n1)\nWrote to '/room-copies' (n1)"), "{}", quick[0]);
    assert!(quick[2].contains("400 bad posting destination topic name"), "{}", quick[2]);
    assert!(!quick[3].contains("Wrote to"), "a duplicate: {}", quick[3]);
    for twin in [&fast, &slow] {
        assert_eq!(twin.payloads("/room"), ["first", "a", "b", "c"]);
        assert_eq!(twin.payloads("/room-copies"), ["first", "a", "b", "c"]);
    }
    assert!(fast.store.grouped_posts() >= 3);
}
