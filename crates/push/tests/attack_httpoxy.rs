//! httpoxy (CVE-2016-5387's class) in the push sender, found by brief A1:
//! under CGI every request header becomes an `HTTP_*` variable, so a
//! client's `Proxy:` header is `HTTP_PROXY` in pubsub.cgi's environment
//! (Apache drops it since 2.4.25; nginx with fcgiwrap, which
//! docs/ACCESS.md configures, passes it on). ureq's default client takes
//! its proxy from that variable: every push message (its VAPID token, the
//! encrypted payload) went to the client's proxy, which could also answer
//! `410` and have the route poisoned. The sender must take its proxy only
//! from the store's settings (`KN_HTTP_PROXY`), as kn-journal's
//! `HttpRemote` does.

use std::net::TcpListener;
use std::time::Duration;

use kn_journal::internal::Push;
use kn_journal::{Config, Event};
use kn_push::{PushPolicy, PushSettings, Sender};

/// A subscription of RFC 8291's Appendix A (public values) at `endpoint`.
fn destination(endpoint: &str) -> String {
    use base64::Engine;
    let json = format!(
        r#"{{"endpoint":"{endpoint}","keys":{{"p256dh":"BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4","auth":"BTBZMqHH6r4Tts7J_aSIgg"}}}}"#
    );
    format!("webpush:{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json))
}

/// True when `listener` was connected to (the kernel completes the
/// handshake before any `accept`).
fn was_reached(listener: &TcpListener) -> bool {
    listener.set_nonblocking(true).unwrap();
    listener.accept().is_ok()
}

#[test]
fn a_proxy_named_by_the_environment_never_sees_a_push_message() {
    let proxy = TcpListener::bind("127.0.0.1:0").unwrap();
    let service = TcpListener::bind("127.0.0.1:0").unwrap();
    // What `Proxy: http://attacker` becomes in a CGI's environment. This
    // test is the only one of its process (a file of its own).
    std::env::set_var("HTTP_PROXY", format!("http://{}", proxy.local_addr().unwrap()));
    std::env::set_var("http_proxy", format!("http://{}", proxy.local_addr().unwrap()));
    let root = tempfile::tempdir().unwrap();
    let mut config = Config::new(root.path());
    config.remote_timeout = Duration::from_secs(1);
    config.remote_connect_timeout = Duration::from_secs(1);
    let settings = PushSettings { contact: "mailto:ops@example.org".to_string(), policy: PushPolicy::default().allowing_loopback_for_tests(), test_loopback: true };
    let sender = Sender::open(root.path(), &config, settings).unwrap();
    let endpoint = format!("http://{}/push/1", service.local_addr().unwrap());
    let mut event = Event::new();
    event.set("kn_payload", "hello");
    // Neither listener answers: the send ends with its timeout, a retry.
    let _ = sender.send(&destination(&endpoint), &Event::new(), &event);
    assert!(!was_reached(&proxy), "the push message went to the proxy the environment named");
    assert!(was_reached(&service), "the push message did not go to its push service");
}
