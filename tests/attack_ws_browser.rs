//! An outsider's look at the JavaScript client's WebSocket (brief A2 of
//! the WebSocket review, issue 41), in a real headless Chromium: a page
//! with a bearer token and `kn.transport = "websocket"` put its token in
//! the socket's URL (`kn_token=` in the query) as well as in the
//! `kn.bearer` subprotocol, where `serve` reads it already. A URL is what
//! proxies and web servers log (Apache in front of `serve` writes the
//! query in its access log with its stock formats): the socket's URL now
//! carries no token.
//!
//! Like `tests/browser.rs`, it skips with a printed reason when chromium
//! or chromedriver is missing, except under `CI=true`.

mod chromium;
mod support;

use std::process::Command;

use chromium::{browser_available, js, runtime, wait_connected, Driver, TURN};
use serde_json::json;
use support::{Dir, Serve};

#[test]
fn a_page_with_a_token_opens_its_websocket_without_the_token_in_the_url() {
    if !browser_available() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let dir = Dir::new("attack_ws_browser_token");
    let root = dir.join("events");
    std::fs::create_dir_all(&root).expect("mkdir store");
    let out = Command::new(support::cargo_bin("kn")).arg("--root").arg(&root).args(["token", "--user", "anna", "--ttl", "1h"]).output().expect("kn token");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    // The page is of another origin (a second serve, its pages only), as
    // a page is whose token cannot go in the server's cookie.
    let www = dir.create_dir("www");
    std::fs::create_dir_all(dir.join("pages_events")).expect("mkdir store");
    let pages = Serve::spawn(Serve::command(&dir.join("pages_events"), Some(&www)));
    let log = dir.join("access.log");
    let mut command = Serve::command(&root, None);
    command.arg("--access-log").arg(&log).env("KN_WS_ORIGINS", &pages.base);
    let serve = Serve::spawn(command);
    std::fs::write(
        www.join("page.html"),
        format!(
            "<!doctype html><title>token</title>
<script>window.kn_server = {server:?}; window.kn_token = {token:?};</script>
<script src=\"{server}?do_method=lib\"></script>
<script>kn.transport = 'websocket'; kn.subscribe('/what/chat/token', function () {{}});</script>",
            server = serve.url()
        ),
    )
    .expect("write the page");
    let driver = Driver::start();
    runtime().block_on(async {
        let page = driver.browser("ws-token").await;
        page.goto(&format!("{}/page.html", pages.base)).await.expect("open the page");
        wait_connected(&page, "a page with a token over a WebSocket").await;
        assert_eq!(js(&page, "return kn.via;").await, json!("websocket"));
        let _ = page.close().await;
    });
    drop(serve);
    let log = std::fs::read_to_string(&log).expect("the access log");
    let sockets: Vec<&str> = log.lines().filter(|l| l.contains("kn_response_format=websocket")).collect();
    assert!(!sockets.is_empty(), "the socket's request is logged: {log}");
    for line in sockets {
        assert!(!line.contains("kn_token"), "the socket's URL carries the token: {line}");
    }
}
