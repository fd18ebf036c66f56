//! The JavaScript client over a WebSocket in a real headless Chromium
//! (docs/BROWSER.md, "WebSocket"): two chat pages of `pubsub-cgi serve`
//! with `?transport=websocket` talk over sockets, each message delivered
//! once; where no socket may open (an `Origin` not in `KN_WS_ORIGINS`) the
//! client falls back to its `EventSource` and the chat works the same.
//!
//! Like `tests/browser.rs`, it skips with a printed reason when chromium
//! or chromedriver is missing, except under `CI=true`.

mod chromium;
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use chromium::{browser_available, js, runtime, wait_connected, Driver, TURN};
use fantoccini::{Client, Locator};
use serde_json::{json, Value};
use support::{Dir, Serve};

fn serve_with(dir: &Dir, env: &[(&str, &str)]) -> Serve {
    let www = Path::new(env!("CARGO_MANIFEST_DIR")).join("www");
    let mut command = Serve::command(&dir.join("events"), Some(&www));
    command.envs(env.iter().copied());
    Serve::spawn(command)
}

async fn say(page: &Client, text: &str) {
    let input = page.find(Locator::Css("#text")).await.expect("#text");
    input.send_keys(text).await.expect("type message");
    page.find(Locator::Css("#send")).await.expect("#send").click().await.expect("click send");
}

/// Waits until `page` shows `text`, then checks every message came once.
async fn shows(page: &Client, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = js(
            page,
            "var texts = Array.from(document.querySelectorAll('#log li.msg .text')).map(function (e) { return e.textContent; });\
             var counts = {}; (window.kn_chat_deliveries || []).forEach(function (id) { counts[id] = (counts[id] || 0) + 1; });\
             return {texts: texts, counts: counts};",
        )
        .await;
        if v["texts"].as_array().is_some_and(|t| t.iter().any(|x| x == text)) {
            let twice: Vec<(&String, &Value)> = v["counts"].as_object().map(|o| o.iter().filter(|(_, n)| **n != json!(1)).collect()).unwrap_or_default();
            assert!(twice.is_empty(), "delivered more than once: {twice:?}");
            return;
        }
        assert!(Instant::now() < deadline, "the page never showed {text:?}: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Two chat pages of `serve` asking for a WebSocket: what each says, the
/// other shows; both connections are `via` what `expected` says.
fn two_chat_pages(serve: &Serve, topic: &str, expected: &str) {
    let driver = Driver::start();
    runtime().block_on(async {
        let url = format!("{}/chat.html?topic={topic}&transport=websocket", serve.base);
        let a = driver.browser("ws-a").await;
        let b = driver.browser("ws-b").await;
        for page in [&a, &b] {
            page.goto(&url).await.expect("open the chat page");
            wait_connected(page, "chat over a WebSocket").await;
            assert_eq!(js(page, "return kn.via;").await, json!(expected));
        }
        say(&a, "hello from a").await;
        shows(&b, "hello from a").await;
        say(&b, "and back from b").await;
        shows(&a, "and back from b").await;
        shows(&a, "hello from a").await;
        let _ = a.close().await;
        let _ = b.close().await;
    });
}

#[test]
fn two_chat_pages_talk_over_websockets_under_serve() {
    if !browser_available() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let dir = Dir::new("browser_websocket");
    let serve = serve_with(&dir, &[]);
    two_chat_pages(&serve, "/what/chat/ws", "websocket");
}

#[test]
fn a_page_asking_for_a_websocket_falls_back_to_sse_where_none_opens() {
    if !browser_available() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let dir = Dir::new("browser_websocket_fallback");
    // The pages' own origin is not listed: every handshake is refused 403.
    let serve = serve_with(&dir, &[("KN_WS_ORIGINS", "https://elsewhere.example")]);
    two_chat_pages(&serve, "/what/chat/fallback", "sse");
}
