//! Web Push route destinations end to end (issue 42): `pubsub-cgi serve`
//! and `pubsub.cgi` under real Apache give their VAPID key
//! (`do_method=vapid`), take a route to a push subscription
//! (`kn_to=webpush:...`) and deliver each event to the independent
//! stand-in push service of crates/push/tests/push_service.py, which
//! decrypts it with PyPI's http_ece and verifies the VAPID JWT with
//! py_vapid. The stand-in listens on plain http on loopback, which only
//! the product's test setting `KN_PUSH_TEST_LOOPBACK=1` allows (DEPLOY.md,
//! "Web Push").

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use support::{Apache, Dir};

/// The product's settings that turn Web Push on, with the test setting.
const PUSH_ENV: &[(&str, &str)] =
    &[("KN_PUSH_CONTACT", "mailto:ops@example.org"), ("KN_PUSH_TEST_LOOPBACK", "1"), ("KN_OUTBOUND", "allow")];

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
                support::skip(&format!("python3 with http_ece and py_vapid is needed (pip install http_ece py_vapid): {other:?}"));
                return None;
            }
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/crates/push/tests/push_service.py");
        let mut child = Command::new("python3").arg(script).arg("--http").stdout(Stdio::piped()).spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let first: serde_json::Value = serde_json::from_str(&line).unwrap();
        Some(StandIn { child, keys: first["subscription"]["keys"].clone(), base: first["base"].as_str().unwrap().to_string() })
    }

    fn destination(&self, path: &str) -> String {
        let json = serde_json::json!({"endpoint": format!("{}{path}", self.base), "keys": self.keys});
        format!("webpush:{}", URL_SAFE_NO_PAD.encode(json.to_string()))
    }

    fn results_for(&self, path: &str) -> Vec<serde_json::Value> {
        let all: Vec<serde_json::Value> = serde_json::from_str(&support::get(&format!("{}/results", self.base)).text()).unwrap();
        all.into_iter().filter(|r| r["path"] == path).collect()
    }
}

/// Against the server at `url`: the key, a route, a notify, and what the
/// stand-in decrypted; then a route to a gone subscription, poisoned (read
/// from the store at `root`); then a private address refused.
fn push_through(url: &str, root: &std::path::Path, service: &StandIn, log: impl Fn() -> String) {
    let key = support::get(&format!("{url}?do_method=vapid"));
    assert_eq!(key.status, 200, "{}\n{}", key.text(), log());
    let key = key.text();
    assert_eq!(URL_SAFE_NO_PAD.decode(key.trim()).map(|k| k.len()).unwrap_or(0), 65, "{key}");
    let lib = support::get(&format!("{url}?do_method=lib")).text();
    assert!(lib.contains(&format!("window.kn_vapid_key = '{}'", key.trim())), "the JavaScript client has no key");

    let dest = service.destination("/push/201");
    let made = support::post_form(url, &[("do_method", "route"), ("kn_from", "/what/chat"), ("kn_to", &dest), ("kn_id", "r1"), ("kn_response_format", "simple"), ("kn_push_urgency", "low")]);
    assert!(made.text().contains("200"), "{}\n{}", made.text(), log());
    support::post_form(url, &[("kn_to", "/what/chat"), ("kn_id", "e1"), ("kn_payload", "to a closed page"), ("kn_response_format", "simple")]);
    assert!(support::wait_for(Duration::from_secs(20), || !service.results_for("/push/201").is_empty()), "nothing pushed\n{}", log());
    let got = &service.results_for("/push/201")[0];
    assert_eq!(got["ok"], true, "{got}");
    let message: serde_json::Value = serde_json::from_slice(&STANDARD.decode(got["plaintext"].as_str().unwrap()).unwrap()).unwrap();
    assert_eq!(message["kn_payload"], "to a closed page");
    assert_eq!(got["headers"]["urgency"], "low");
    assert!(got["headers"]["authorization"].as_str().unwrap().ends_with(&format!("k={}", key.trim())), "signed by another key");

    let gone = service.destination("/push/410");
    support::post_form(url, &[("do_method", "route"), ("kn_from", "/what/gone"), ("kn_to", &gone), ("kn_id", "r2")]);
    support::post_form(url, &[("kn_to", "/what/gone"), ("kn_id", "e2"), ("kn_payload", "x")]);
    // What `kn routes` shows: the route poisoned, the service's answer why.
    let store = kn_journal::Store::open(root).unwrap();
    let topic = kn_journal::Topic::parse("/what/gone").unwrap();
    let why = || store.route_of(&topic, b"r2").ok().flatten().and_then(|r| r.event.get_str("kn_poisoned")).unwrap_or_default();
    assert!(support::wait_for(Duration::from_secs(20), || why().contains("410")), "not poisoned: {}\n{}", why(), log());
    assert!(why().contains("gone"), "{}", why());

    // A private address is refused when the route is made.
    let private = serde_json::json!({"endpoint": "https://10.1.2.3/push", "keys": service.keys});
    let refused = support::post_form(url, &[("do_method", "route"), ("kn_from", "/what/chat"), ("kn_to", &format!("webpush:{}", URL_SAFE_NO_PAD.encode(private.to_string()))), ("kn_id", "r3"), ("kn_response_format", "simple")]);
    assert!(refused.text().contains("403"), "{}", refused.text());
}

#[test]
fn serve_pushes_to_a_subscription_the_stand_in_decrypts() {
    let Some(service) = StandIn::start() else { return };
    let dir = Dir::new("push_serve");
    let mut command = support::Serve::command(&dir.join("events"), None);
    command.envs(PUSH_ENV.iter().copied());
    let serve = support::Serve::spawn(command);
    push_through(&serve.url(), &dir.join("events"), &service, String::new);
}

#[test]
fn pubsub_cgi_under_apache_pushes_to_a_subscription_the_stand_in_decrypts() {
    let Some(service) = StandIn::start() else { return };
    if !support::available(support::APACHE) {
        return;
    }
    let dir = Dir::new("push_apache");
    let store = dir.store("kn_events");
    let env: String = PUSH_ENV.iter().map(|(k, v)| format!("SetEnv {k} {v}\n")).collect();
    let apache = Apache::start(&support::pubsub_cgi(), &store, &env);
    push_through(&apache.url(), &store, &service, || apache.error_log());
}

#[test]
fn without_kn_push_contact_there_is_no_vapid_key_and_no_push_route() {
    let dir = Dir::new("push_off");
    let mut command = support::Serve::command(&dir.join("events"), None);
    command.env("KN_OUTBOUND", "allow").env_remove("KN_PUSH_CONTACT");
    let serve = support::Serve::spawn(command);
    let key = support::get(&format!("{}?do_method=vapid&kn_response_format=simple", serve.url()));
    assert!(key.text().contains("404"), "{}", key.text());
    let refused = support::post_form(&serve.url(), &[("do_method", "route"), ("kn_from", "/what/chat"), ("kn_to", "webpush:e30"), ("kn_response_format", "simple")]);
    assert!(refused.text().contains("403") && refused.text().contains("no Web Push"), "{}", refused.text());
}
