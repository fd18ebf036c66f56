//! Hostile parameter values reach the handler (`kn_cgi::Handler` on a
//! temporary store, in process): none may panic; each is a clear `400`
//! status event, or takes the meaning PROTOCOL.md gives it. Findings and
//! their tests are listed in docs/RELIABILITY.md ("Hostile input").

use std::sync::Arc;
use std::time::{Duration, Instant};

use kn_cgi::{Handler, HttpRequest, Limits, Options, Reply, Request};
use kn_journal::Store;

struct Fixture {
    _dir: tempfile::TempDir,
    handler: Handler,
}

impl Fixture {
    fn new() -> Fixture {
        Fixture::with(|_| {})
    }

    /// A fixture whose store's settings `change` adjusts.
    fn with(change: impl FnOnce(&mut kn_journal::Config)) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let mut config = kn_journal::Config::new(dir.path().join("events"));
        change(&mut config);
        let store = Store::open_with(config).unwrap();
        Fixture { handler: Handler::new(Arc::new(store), Options::default()), _dir: dir }
    }

    fn get(&self, path: &str, query: &str) -> Reply {
        let http = HttpRequest {
            method: "GET".into(),
            path_info: path.as_bytes().to_vec(),
            query: query.as_bytes().to_vec(),
            script_name: "/kn".into(),
            server_name: "127.0.0.1".into(),
            server_port: 8080,
            ..HttpRequest::default()
        };
        let request = Request::from_http(http, &Limits::default()).unwrap();
        self.handler.handle(&request)
    }

    fn tunnel(&self, path: &str, query: &str) -> Box<kn_cgi::TunnelReply> {
        match self.get(path, query) {
            Reply::Tunnel(t) => t,
            Reply::Done(r) => panic!("{query}: not a tunnel: {} {}", r.code(), String::from_utf8_lossy(&r.body)),
        }
    }

    /// The status line of a one-shot answer (`simple` format).
    fn status(&self, path: &str, query: &str) -> String {
        match self.get(path, &format!("{query}&kn_response_format=simple")) {
            Reply::Done(r) => {
                let body = String::from_utf8_lossy(&r.body).into_owned();
                let status = body.lines().find_map(|l| l.strip_prefix("status: ")).unwrap_or_default().to_string();
                format!("{status} | {body}")
            }
            Reply::Tunnel(_) => "tunnel".to_string(),
        }
    }
}

const JOURNAL: &str = "/who/a/s/1/kn_journal";

#[test]
fn a_tunnel_kn_expires_beyond_any_instant_never_closes_and_does_not_panic() {
    let f = Fixture::new();
    // Once `Duration::from_secs_f64` of 1e20 s: a panic that aborted the
    // CGI and dropped the connection under `serve`.
    for value in ["99999999999999999999", "%2B99999999999999999999", &"9".repeat(400), "18446744073709551616.5"] {
        let tunnel = f.tunnel(JOURNAL, &format!("kn_expires={value}&kn_response_format=simple"));
        assert_eq!(tunnel.deadline(), None, "kn_expires={value}");
    }
}

#[test]
fn a_tunnel_kn_expires_in_the_past_closes_at_once() {
    let f = Fixture::new();
    for value in ["1", "0", "0.5", "%2B0"] {
        let tunnel = f.tunnel(JOURNAL, &format!("kn_expires={value}"));
        let deadline = tunnel.deadline().unwrap_or_else(|| panic!("kn_expires={value} has a deadline"));
        assert!(deadline <= Instant::now() + Duration::from_secs(1), "kn_expires={value}");
    }
}

#[test]
fn a_malformed_tunnel_kn_expires_is_400() {
    let f = Fixture::new();
    // `%FF` (not UTF-8) was once taken for an empty value: `infinity`.
    for value in ["-1", "NaN", "inf", "1e9", ".", "%2B", "%FF", "9%FF", "%2B-5"] {
        let status = f.status(JOURNAL, &format!("kn_expires={value}"));
        assert!(status.starts_with("400 "), "kn_expires={value}: {status}");
        assert!(status.contains("bad kn_expires"), "kn_expires={value}: {status}");
    }
}

#[test]
fn a_do_max_n_too_large_for_a_count_means_all_events() {
    let f = Fixture::new();
    for n in ["1", "2"] {
        assert!(f.status("", &format!("do_method=notify&kn_to=/what/chat&kn_payload=p{n}&kn_id={n}")).starts_with("200 "));
    }
    // PROTOCOL.md 3.3: asking for more than exist is not an error.
    for value in ["18446744073709551616", "99999999999999999999999999999"] {
        let mut tunnel = f.tunnel("/what/chat", &format!("do_max_n={value}&kn_response_format=simple"));
        let initial = String::from_utf8_lossy(&tunnel.take_initial()).into_owned();
        assert!(initial.contains("p1") && initial.contains("p2"), "do_max_n={value}: {initial}");
        let routed = f.status("/what/chat", &format!("kn_to=/what/copy&kn_id=r{}&do_max_n={value}", value.len()));
        assert!(routed.starts_with("200 Routed"), "do_max_n={value}: {routed}");
    }
}

#[test]
fn a_malformed_selection_is_400() {
    let f = Fixture::new();
    for query in ["do_max_n=-1", "do_max_n=", "do_max_n=1e3", "do_max_n=%FF", "do_max_age=-1", "do_max_age=NaN", "do_max_age=", "do_max_age=%FF"] {
        let status = f.status("/what/chat", query);
        assert!(status.starts_with("400 "), "{query}: {status}");
        let routed = f.status("/what/chat", &format!("{query}&kn_to=/what/copy&kn_id=r"));
        assert!(routed.starts_with("400 "), "route with {query}: {routed}");
    }
}

#[test]
fn huge_and_infinite_selections_and_expiries_are_served() {
    let f = Fixture::new();
    for query in ["do_max_age=1e400", "do_max_age=infinity", "do_max_age=1e308", "do_since_checkpoint=99999999999999999999999", "do_since_checkpoint=%FF"] {
        let _ = f.tunnel("/what/chat", &format!("{query}&kn_response_format=simple"));
    }
    let sse = f.tunnel("/what/chat", "kn_response_format=sse&last_event_id=18446744073709551616");
    drop(sse);
    for expires in ["99999999999999999999", "%2B99999999999999999999", &"9".repeat(400), "infinity", ""] {
        let status = f.status("", &format!("do_method=notify&kn_to=/what/chat&kn_payload=x&kn_expires={expires}"));
        assert!(status.starts_with("200 "), "kn_expires={expires}: {status}");
    }
}

#[test]
fn invalid_utf8_and_empty_values_are_clear_errors_or_served() {
    let f = Fixture::new();
    for query in [
        "do_method=%FF",
        "do_method=",
        "do_method=notify&kn_to=",
        "do_method=notify&kn_to=%FF%FE&kn_payload=%C0%AE",
        "do_method=notify&kn_to=http://%FF/x",
        "do_method=route&kn_from=/a&kn_to=&kn_id=",
        "do_method=batch&kn_batch=%25zz",
        "do_method=batch&kn_batch=",
    ] {
        let status = f.status("", query);
        let code: u16 = status.get(..3).and_then(|c| c.parse().ok()).unwrap_or(0);
        assert!((200..500).contains(&code), "{query}: {status}");
    }
    // An unknown format is answered in the default one (js).
    let Reply::Done(page) = f.get("", "kn_response_format=%FF") else { panic!("kn_response_format=%FF: a tunnel") };
    assert!(String::from_utf8_lossy(&page.body).contains("Unsupported kn_response_format value"));
}

#[test]
fn a_topic_deeper_or_longer_than_the_limits_is_400_at_once() {
    use kn_journal::{MAX_SEGMENT_BYTES, MAX_TOPIC_BYTES, MAX_TOPIC_DEPTH};
    // The store's own limit (KN_MAX_TOPIC_DEPTH, 32 by default) raised to
    // the protocol-wide maximum, which no setting can pass.
    let f = Fixture::with(|c| c.max_topic_depth = 1000);
    // 2,000 segments once cost minutes: one kn_subtopics post per level,
    // each walking the whole path.
    let deepest = "/a".repeat(MAX_TOPIC_DEPTH);
    assert!(f.status("", &format!("do_method=notify&kn_to={deepest}&kn_payload=x")).starts_with("200 "));
    for name in ["/a".repeat(MAX_TOPIC_DEPTH + 1), "/a".repeat(2000), format!("/{}", "x".repeat(MAX_SEGMENT_BYTES + 1)), "/abcdefgh".repeat(MAX_TOPIC_BYTES / 9 + 1)] {
        let status = f.status("", &format!("do_method=notify&kn_to={name}&kn_payload=x"));
        assert!(status.starts_with("400 "), "{}: {status}", name.len());
        assert!(status.len() < 4 * MAX_TOPIC_BYTES, "the error shows the start of the name only");
        assert!(f.status(&name, "kn_payload=x&do_method=notify").starts_with("400 "), "as path info");
    }
}
