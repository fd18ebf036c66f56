//! Brief A4: `kn.pushSubscribe` after the operator rotates the VAPID key
//! (docs/DEPLOY.md, "Web Push"). A browser binds a subscription to the
//! key it was made with; the push services refuse a push signed with
//! another (403), which poisons the route. The page keeps its old
//! subscription, so `pushSubscribe` must notice that it was made with
//! another key, drop it and subscribe again with the server's key:
//! otherwise every route the page makes after a rotation is poisoned at
//! its first event and the page never recovers.
//!
//! Chromium's push service cannot be reached from the test machine:
//! `PushManager` is replaced in the page (as in tests/browser_push.rs) by
//! one holding a subscription made with another key, which records
//! whether it was unsubscribed and the key the page subscribes with.

mod chromium;
mod support;

use std::path::Path;
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chromium::{browser_available, js, runtime, wait_js, Driver, TURN};
use serde_json::json;
use support::{Dir, Serve};

#[test]
fn a_subscription_made_with_a_rotated_key_is_replaced_by_one_with_the_servers_key() {
    if !browser_available() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let dir = Dir::new("attack_push_browser");
    let www = Path::new(env!("CARGO_MANIFEST_DIR")).join("www");
    let mut command = Serve::command(&dir.join("events"), Some(&www));
    command.envs([("KN_PUSH_CONTACT", "mailto:ops@example.org"), ("KN_PUSH_TEST_LOOPBACK", "1"), ("KN_OUTBOUND", "allow")]);
    let serve = Serve::spawn(command);
    let key = support::get(&format!("{}?do_method=vapid", serve.url())).text();

    let driver = Driver::start();
    runtime().block_on(async {
        let page = driver.browser("push-rotated").await;
        page.goto(&format!("{}/index.html", serve.base)).await.expect("open index.html");
        // A subscription of RFC 8291's Appendix A (public values) on a
        // loopback endpoint nobody listens on: the route is made, no push
        // is needed.
        let stub = "var json = {endpoint: 'http://127.0.0.1:9/push/old', keys: {\
               p256dh: 'BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4',\
               auth: 'BTBZMqHH6r4Tts7J_aSIgg'}};\
             var oldKey = new Uint8Array(65); oldKey[0] = 4; oldKey[1] = 7;\
             window.kn_test = {unsubscribed: false, subscribedWith: null};\
             window.old = {endpoint: json.endpoint, options: {userVisibleOnly: true, applicationServerKey: oldKey.buffer},\
               toJSON: function () { return json; },\
               unsubscribe: function () { window.kn_test.unsubscribed = true; return Promise.resolve(true); }};\
             PushManager.prototype.getSubscription = function () {\
               return Promise.resolve(window.kn_test.unsubscribed ? null : window.old); };\
             PushManager.prototype.subscribe = function (options) {\
               window.kn_test.subscribedWith = Array.from(new Uint8Array(options.applicationServerKey));\
               var fresh = JSON.parse(JSON.stringify(json)); fresh.endpoint = 'http://127.0.0.1:9/push/new';\
               return Promise.resolve({endpoint: fresh.endpoint, options: options, toJSON: function () { return fresh; }});\
             };\
             var s = document.createElement('script'); s.src = '/kn?do_method=lib'; document.head.appendChild(s);\
             return true;";
        js(&page, stub).await;
        assert_eq!(wait_js(&page, Duration::from_secs(15), "return !!(window.kn && kn.pushSubscribe);").await, json!(true));
        js(
            &page,
            "window.kn_test_push = null; kn.pushSubscribe('/what/chat').then(\
               function (p) { window.kn_test_push = {status: p.status.status, endpoint: p.subscription.endpoint}; },\
               function (e) { window.kn_test_push = {error: String(e)}; }); return true;",
        )
        .await;
        let push = wait_js(&page, Duration::from_secs(20), "return window.kn_test_push;").await;
        assert!(push["status"].as_str().is_some_and(|s| s.starts_with("200")), "{push}");
        let test = js(&page, "return window.kn_test;").await;
        assert_eq!(test["unsubscribed"], json!(true), "the subscription made with the old key was kept: {test}");
        let given: Vec<u8> = serde_json::from_value(test["subscribedWith"].clone()).unwrap_or_default();
        assert_eq!(URL_SAFE_NO_PAD.encode(given), key.trim(), "the page did not subscribe again with the server's key");
        assert_eq!(push["endpoint"], json!("http://127.0.0.1:9/push/new"), "{push}");

        // A subscription already made with the server's key is kept.
        let current: Vec<u8> = URL_SAFE_NO_PAD.decode(key.trim()).unwrap();
        js(
            &page,
            &format!(
                "old.options.applicationServerKey = new Uint8Array({current:?}).buffer;\
                 window.kn_test = {{unsubscribed: false, subscribedWith: null}}; window.kn_test_push = null;\
                 kn.pushSubscribe('/what/chat').then(\
                   function (p) {{ window.kn_test_push = {{status: p.status.status, endpoint: p.subscription.endpoint}}; }},\
                   function (e) {{ window.kn_test_push = {{error: String(e)}}; }}); return true;"
            ),
        )
        .await;
        let push = wait_js(&page, Duration::from_secs(20), "return window.kn_test_push;").await;
        assert_eq!(push["endpoint"], json!("http://127.0.0.1:9/push/old"), "{push}");
        let test = js(&page, "return window.kn_test;").await;
        assert_eq!(test, json!({"unsubscribed": false, "subscribedWith": null}), "a subscription with the server's key was replaced");
        page.close().await.ok();
    });
}
