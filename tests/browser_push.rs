//! `kn.pushSubscribe` in a real headless Chromium (issue 42,
//! docs/BROWSER.md "Push to a closed page"): the page registers the
//! shipped service worker (www/kn-sw.js), asks for a subscription with the
//! server's VAPID key and makes the route; an event posted afterwards
//! reaches the independent stand-in push service (PyPI http_ece and
//! py_vapid, crates/push/tests/push_service.py), which decrypts it.
//!
//! Chromium's own push service cannot be reached from the test machine,
//! so `PushManager.subscribe` is replaced in the page by one that checks
//! the key it is given and answers the stand-in's subscription: the page's
//! side is tested up to the subscription, the server's from there on.
//!
//! Like `tests/browser.rs`, it skips with a printed reason when chromium,
//! chromedriver or the Python modules are missing, except under `CI=true`.

mod chromium;
mod support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use chromium::{browser_available, js, runtime, wait_js, Driver, TURN};
use serde_json::json;
use support::{Dir, Serve};

#[test]
fn a_page_subscribes_through_the_service_worker_and_its_route_delivers() {
    if !browser_available() {
        return;
    }
    match Command::new("python3").args(["-c", "import http_ece, py_vapid"]).output() {
        Ok(out) if out.status.success() => {}
        other => {
            support::skip(&format!("python3 with http_ece and py_vapid is needed (pip install http_ece py_vapid): {other:?}"));
            return;
        }
    }
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/crates/push/tests/push_service.py");
    let mut service = Killed(Command::new("python3").arg(script).arg("--http").stdout(Stdio::piped()).spawn().unwrap());
    let mut line = String::new();
    BufReader::new(service.0.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let first: serde_json::Value = serde_json::from_str(&line).unwrap();
    let subscription = first["subscription"].clone();
    let base = first["base"].as_str().unwrap().to_string();

    let dir = Dir::new("browser_push");
    let www = Path::new(env!("CARGO_MANIFEST_DIR")).join("www");
    let mut command = Serve::command(&dir.join("events"), Some(&www));
    command.envs([("KN_PUSH_CONTACT", "mailto:ops@example.org"), ("KN_PUSH_TEST_LOOPBACK", "1"), ("KN_OUTBOUND", "allow")]);
    let serve = Serve::spawn(command);
    let key = support::get(&format!("{}?do_method=vapid", serve.url())).text();

    let driver = Driver::start();
    runtime().block_on(async {
        let page = driver.browser("push").await;
        page.goto(&format!("{}/index.html", serve.base)).await.expect("open index.html");
        // The stand-in's subscription in place of Chromium's push service,
        // which this machine cannot reach; it keeps the key it was given.
        let stub = format!(
            "PushManager.prototype.getSubscription = function () {{ return Promise.resolve(null); }};\
             PushManager.prototype.subscribe = function (options) {{\
               window.kn_test_key = Array.from(new Uint8Array(options.applicationServerKey));\
               var json = {subscription};\
               return Promise.resolve({{endpoint: json.endpoint, toJSON: function () {{ return json; }}}});\
             }};\
             var s = document.createElement('script'); s.src = '/kn?do_method=lib'; document.head.appendChild(s);\
             return true;"
        );
        js(&page, &stub).await;
        assert_eq!(wait_js(&page, Duration::from_secs(15), "return !!(window.kn && kn.pushSubscribe);").await, json!(true));
        js(
            &page,
            "window.kn_test_push = null; kn.pushSubscribe('/what/chat', {kn_push_urgency: 'high'}).then(\
               function (p) { window.kn_test_push = {id: p.id, status: p.status.status}; },\
               function (e) { window.kn_test_push = {error: String(e)}; }); return true;",
        )
        .await;
        let push = wait_js(&page, Duration::from_secs(20), "return window.kn_test_push;").await;
        assert!(push["status"].as_str().is_some_and(|s| s.starts_with("200")), "{push}");
        let worker = wait_js(
            &page,
            Duration::from_secs(15),
            "return navigator.serviceWorker.getRegistration().then(function (r) { return r && r.active && r.active.scriptURL; });",
        )
        .await;
        assert!(worker.as_str().is_some_and(|u| u.ends_with("/kn-sw.js")), "no active service worker: {worker}");
        let given: Vec<u8> = serde_json::from_value(js(&page, "return window.kn_test_key;").await).unwrap();
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        assert_eq!(URL_SAFE_NO_PAD.encode(given), key.trim(), "the page subscribed with another key");

        // The topic browser lists the push route like any route, naming
        // its push service.
        page.goto(&format!("{}/browser.html", serve.base)).await.expect("open browser.html");
        for (topic, part) in [("/what", "toggle"), ("/what/chat", "node")] {
            let node = format!("#tree li[data-topic=\"{topic}\"] > .{part}");
            let shown = wait_js(&page, Duration::from_secs(15), &format!("return !!document.querySelector('{node}');")).await;
            assert_eq!(shown, json!(true), "{topic} is in the tree");
            page.find(fantoccini::Locator::Css(&node)).await.expect("the topic's node").click().await.expect("click");
        }
        let host = base.trim_start_matches("http://");
        let listed = wait_js(
            &page,
            Duration::from_secs(15),
            &format!("var t = document.getElementById('routes').textContent; return t.indexOf('web push via {host}') >= 0 && t;"),
        )
        .await;
        assert!(listed.is_string(), "the push route is not listed: {listed}");
        page.close().await.ok();
    });

    // The route the page made carries the next event to the push service.
    support::post_form(&serve.url(), &[("kn_to", "/what/chat"), ("kn_id", "e1"), ("kn_payload", "while closed")]);
    let results = || -> Vec<serde_json::Value> { serde_json::from_str(&support::get(&format!("{base}/results")).text()).unwrap() };
    assert!(support::wait_for(Duration::from_secs(20), || !results().is_empty()), "nothing pushed");
    let got = &results()[0];
    assert_eq!(got["ok"], true, "{got}");
    let message: serde_json::Value = serde_json::from_slice(&STANDARD.decode(got["plaintext"].as_str().unwrap()).unwrap()).unwrap();
    assert_eq!(message["kn_payload"], "while closed");
    assert_eq!(got["headers"]["urgency"], "high");
}

/// A child process killed when the test ends, however it ends.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
