//! The browser side in a real headless Chromium (Debian's `chromium`,
//! driven through `chromedriver` with WebDriver): the pages of `www/`
//! served by Apache beside `pubsub.cgi` (`Alias /kn_apps/`), the JavaScript
//! client from `/kn?do_method=lib`, one Server-Sent Events connection per
//! page.
//!
//! * two chat pages talk through `pubsub.cgi`; Apache is stopped and
//!   started again mid-conversation and every message still arrives
//!   exactly once on both pages;
//! * the topic browser shows a topic another client creates, live;
//! * the ping page's figures are read back and printed (no timing
//!   assertion; docs/BROWSER.md records them).
//!
//! The tests take turns (one Chromium at a time: the machine has two cores
//! and the ping figures must not measure a neighbour). They skip with a
//! printed reason when Apache, chromium or chromedriver is missing, except
//! under `CI=true`, where that is a failure. Set `KN_SCREENSHOTS=DIR` to
//! save a screenshot of each page.

mod chromium;
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use chromium::{browser_available, copy_dir, js, runtime, screenshot, wait_connected, wait_js, Driver, TURN};
use fantoccini::{Client, Locator};
use serde_json::{json, Value};
use support::{Apache, Dir, Serve};

/// Apache with `pubsub.cgi` at `/kn` and a copy of `www/` at `/kn_apps/`,
/// as docs/DEPLOY.md describes.
struct Site {
    apache: Apache,
    dir: Dir,
}

impl Site {
    fn start(name: &str) -> Site {
        let dir = Dir::new(name);
        let store = dir.store("kn_events");
        let www = dir.create_dir("www");
        copy_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("www"), &www);
        let conf = format!(
            "Alias /kn_apps/ {www}/\n\
             AddType text/html .html\nAddType text/css .css\nAddType application/javascript .js\n\
             AddCharset utf-8 .html .css .js\n",
            www = www.display()
        );
        let apache = Apache::start(&support::pubsub_cgi(), &store, &conf);
        Site { apache, dir }
    }

    fn page(&self, name: &str) -> String {
        format!("{}/kn_apps/{name}", self.apache.base_url())
    }
}

// ----- chat -----------------------------------------------------------------

async fn say(page: &Client, nick: &str, text: &str) {
    let nick_input = page.find(Locator::Css("#nick")).await.expect("#nick");
    nick_input.clear().await.expect("clear nick");
    nick_input.send_keys(nick).await.expect("type nick");
    let input = page.find(Locator::Css("#text")).await.expect("#text");
    input.send_keys(text).await.expect("type message");
    page.find(Locator::Css("#send")).await.expect("#send").click().await.expect("click send");
}

/// The texts shown, and how many times each kn_id was delivered.
async fn chat_state(page: &Client) -> (Vec<String>, Value) {
    let v = js(
        page,
        "var texts = Array.from(document.querySelectorAll('#log li.msg .text')).map(function (e) { return e.textContent; });\
         var counts = {}; (window.kn_chat_deliveries || []).forEach(function (id) { counts[id] = (counts[id] || 0) + 1; });\
         return {texts: texts, counts: counts};",
    )
    .await;
    let texts = v["texts"].as_array().map(|a| a.iter().filter_map(|t| t.as_str().map(String::from)).collect()).unwrap_or_default();
    (texts, v["counts"].clone())
}

/// Waits until both pages show exactly `expected` (any order), and checks
/// that every message was delivered once.
async fn both_show(pages: &[&Client], expected: &[&str], site: &Site) {
    let mut want: Vec<String> = expected.iter().map(|s| s.to_string()).collect();
    want.sort();
    for (i, page) in pages.iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (mut texts, counts) = chat_state(page).await;
            texts.sort();
            if texts == want {
                let repeated: Vec<(&String, &Value)> =
                    counts.as_object().map(|o| o.iter().filter(|(_, n)| **n != json!(1)).collect()).unwrap_or_default();
                assert!(repeated.is_empty(), "page {i}: messages delivered more than once: {repeated:?}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "page {i} shows {texts:?}, expected {want:?} (deliveries {counts})\n--- apache error log:\n{}",
                site.apache.error_log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[test]
fn two_chat_pages_talk_through_apache_and_survive_its_restart() {
    if !browser_available() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let mut site = Site::start("browser_chat");
    let driver = Driver::start();
    runtime().block_on(async {
        let anna = driver.browser("anna").await;
        let bert = driver.browser("bert").await;
        let url = site.page("chat.html?topic=/what/chat/browser_test");
        anna.goto(&url).await.expect("open chat (anna)");
        bert.goto(&url).await.expect("open chat (bert)");
        wait_connected(&anna, "anna").await;
        wait_connected(&bert, "bert").await;

        say(&anna, "anna", "hello from anna").await;
        say(&bert, "bert", "hello from bert").await;
        both_show(&[&anna, &bert], &["hello from anna", "hello from bert"], &site).await;
        screenshot(&anna, "chat").await;

        // Apache goes away mid-conversation: both pages lose their
        // connection; messages typed now are retried until it is back.
        site.apache.stop();
        say(&anna, "anna", "anna while the server is down").await;
        say(&bert, "bert", "bert while the server is down").await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let state = js(&anna, "return document.querySelector('header .conn').dataset.state;").await;
        assert_eq!(state, json!("reconnecting"), "anna's page noticed the outage");
        site.apache.restart();
        say(&anna, "anna", "anna after the restart").await;
        say(&bert, "bert", "bert after the restart").await;
        let all = [
            "hello from anna",
            "hello from bert",
            "anna while the server is down",
            "bert while the server is down",
            "anna after the restart",
            "bert after the restart",
        ];
        both_show(&[&anna, &bert], &all, &site).await;
        wait_connected(&anna, "anna after the restart").await;
        wait_connected(&bert, "bert after the restart").await;

        // The pages stay live after the reconnect, still exactly once.
        say(&bert, "bert", "still here").await;
        let mut more = all.to_vec();
        more.push("still here");
        both_show(&[&anna, &bert], &more, &site).await;
        let gaps = js(&anna, "return document.querySelectorAll('#log li.note').length;").await;
        assert_eq!(gaps, json!(0), "no gap and no error was reported");
        screenshot(&bert, "chat-after-restart").await;
        anna.close().await.ok();
        bert.close().await.ok();
    });
    drop(site.dir);
}

/// docs/ACCESS.md's rules for anonymous visitors: each page's journal lies
/// under the visitor's own session (`do_method=session`, its cookie).
const ANONYMOUS_RULES: &str = "\
allow post,read,route /who/anonymous/s/{session}/**  anonymous
allow post,read       /what/chat/**                  *
";

#[test]
fn two_anonymous_chat_pages_talk_under_the_access_rules_each_in_its_own_session() {
    if !browser_available() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let dir = Dir::new("browser_sessions");
    let rules = dir.create("access.rules", ANONYMOUS_RULES);
    let store = dir.store("kn_events");
    let www = dir.create_dir("www");
    copy_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("www"), &www);
    let conf = format!(
        "SetEnv KN_ACCESS_RULES {rules}\nAlias /kn_apps/ {www}/\nAddType text/html .html\nAddType application/javascript .js\nAddCharset utf-8 .html .js\n",
        rules = rules.display(),
        www = www.display()
    );
    let apache = Apache::start(&support::pubsub_cgi(), &store, &conf);
    let site = Site { apache, dir };
    let driver = Driver::start();
    runtime().block_on(async {
        let anna = driver.browser("anonymous-1").await;
        let bert = driver.browser("anonymous-2").await;
        let url = site.page("chat.html?topic=/what/chat/sessions");
        anna.goto(&url).await.expect("open chat (1)");
        bert.goto(&url).await.expect("open chat (2)");
        wait_connected(&anna, "visitor 1").await;
        wait_connected(&bert, "visitor 2").await;
        let journals = (js(&anna, "return kn.journal;").await, js(&bert, "return kn.journal;").await);
        let session = |j: &Value| j.as_str().and_then(|j| j.strip_prefix("/who/anonymous/s/")).and_then(|r| r.split('/').next()).map(String::from);
        let (one, two) = (session(&journals.0), session(&journals.1));
        assert!(one.is_some() && two.is_some() && one != two, "each visitor has a session of its own: {journals:?}");
        say(&anna, "one", "hello from visitor one").await;
        say(&bert, "two", "hello from visitor two").await;
        both_show(&[&anna, &bert], &["hello from visitor one", "hello from visitor two"], &site).await;
        // The other visitor's journal, by name, with this visitor's
        // session cookie (HttpOnly: taken through WebDriver): refused; with
        // its own visitor's, allowed.
        let cookie = |c: fantoccini::cookies::Cookie<'static>| format!("{}={}", c.name(), c.value());
        // The cookie's path is the script's (/kn): look from there.
        let help = format!("{}?do_method=help", site.apache.url());
        anna.goto(&help).await.expect("open /kn (1)");
        bert.goto(&help).await.expect("open /kn (2)");
        let one_cookie = cookie(anna.get_named_cookie("kn_session").await.expect("visitor one's kn_session cookie"));
        let two_cookie = cookie(bert.get_named_cookie("kn_session").await.expect("visitor two's kn_session cookie"));
        let other = journals.1.as_str().unwrap_or_default().to_string();
        let open = |cookie: &str| {
            let url = site.apache.url();
            let addr = url.strip_prefix("http://").and_then(|r| r.split('/').next()).unwrap_or_default().to_string();
            let request = format!("GET /kn{other}?kn_response_format=simple&kn_expires=%2B0 HTTP/1.0\r\nHost: {addr}\r\nCookie: {cookie}\r\n\r\n");
            let mut stream = support::http::Stream::send(&url, request.as_bytes());
            stream.read_to_end(Duration::from_secs(10));
            stream.status()
        };
        assert_eq!(open(&one_cookie), Some(401), "visitor one may not open visitor two's journal");
        assert_eq!(open(&two_cookie), Some(200), "visitor two may");
        anna.close().await.ok();
        bert.close().await.ok();
    });
    drop(site.dir);
}

// ----- topic browser --------------------------------------------------------

#[test]
fn topic_browser_shows_a_topic_created_by_another_client() {
    if !browser_available() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let site = Site::start("browser_topics");
    // Something to show before the page opens.
    let r = support::post_form(&site.apache.url(), &[("kn_to", "/what/chat"), ("kn_payload", "hi"), ("kn_response_format", "simple")]);
    assert_eq!(r.status, 200, "{}", r.text());
    let driver = Driver::start();
    runtime().block_on(async {
        let page = driver.browser("browser").await;
        page.goto(&site.page("browser.html")).await.expect("open the topic browser");
        wait_connected(&page, "topic browser").await;
        let what = wait_js(&page, Duration::from_secs(10), "return !!document.querySelector('#tree li[data-topic=\"/what\"]');").await;
        assert_eq!(what, json!(true), "the tree shows /what");

        // Another client creates a topic: it appears in the tree, live.
        let r = support::post_form(
            &site.apache.url(),
            &[("kn_to", "/created_elsewhere"), ("kn_payload", "made by another client"), ("kn_response_format", "simple")],
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let node = "#tree li[data-topic=\"/created_elsewhere\"] > .node";
        let shown = wait_js(&page, Duration::from_secs(10), &format!("return !!document.querySelector('{node}');")).await;
        assert_eq!(shown, json!(true), "the new topic appears in the tree");

        // Choosing it shows its events and its routes (this page's own).
        page.find(Locator::Css(node)).await.expect("the topic's node").click().await.expect("click");
        let events = wait_js(
            &page,
            Duration::from_secs(10),
            "var t = document.getElementById('events').textContent; return t.indexOf('made by another client') >= 0 && t;",
        )
        .await;
        assert!(events.is_string(), "the topic's event is shown");
        let routes = wait_js(&page, Duration::from_secs(10), "return document.querySelectorAll('#routes li').length;").await;
        assert!(routes.as_u64().unwrap_or(0) >= 1, "its routes are listed: {routes}");
        let r = support::post_form(
            &site.apache.url(),
            &[("kn_to", "/created_elsewhere"), ("kn_payload", "a live one"), ("kn_response_format", "simple")],
        );
        assert_eq!(r.status, 200);
        let live = wait_js(
            &page,
            Duration::from_secs(10),
            "return document.getElementById('events').textContent.indexOf('a live one') >= 0;",
        )
        .await;
        assert_eq!(live, json!(true), "new events of the chosen topic appear live");
        let selected = js(&page, "return document.getElementById('selected').textContent;").await;
        assert_eq!(selected, json!("/created_elsewhere"));

        // Who is connected (docs/PRESENCE.md): the page itself (its route
        // into its journal, its EventSource), then another client's
        // journal routed from the topic while its tunnel is open.
        let me = wait_js(&page, Duration::from_secs(10), "return document.querySelectorAll('#presence li').length;").await;
        assert!(me.as_u64().unwrap_or(0) >= 1, "the page's own journal is listed as connected: {me}");
        let url = site.apache.url();
        let r = support::post_form(
            &url,
            &[("do_method", "route"), ("kn_from", "/created_elsewhere"), ("kn_to", "/who/elsewhere/kn_journal"), ("kn_response_format", "simple")],
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let tunnel = support::http::Stream::get(&format!("{url}/who/elsewhere/kn_journal?kn_response_format=simple"));
        let listed = "return !!document.querySelector('#presence li[data-journal=\"/who/elsewhere/kn_journal\"]');";
        assert_eq!(wait_js(&page, Duration::from_secs(10), listed).await, json!(true), "another client's journal is listed while its tunnel is open");
        tunnel.close();
        let gone = "return !document.querySelector('#presence li[data-journal=\"/who/elsewhere/kn_journal\"]');";
        assert_eq!(wait_js(&page, Duration::from_secs(20), gone).await, json!(true), "and goes once its tunnel closed (after the debounce)");

        // The two-way kn: form handler (lib2form) posts a form as an event
        // and tells the form how it went.
        js(
            &page,
            "var s = document.createElement('script'); s.src = '/kn?do_method=lib2form'; document.head.appendChild(s);\
             var f = document.createElement('form'); f.id = 'knform'; f.setAttribute('action', 'kn:/created_elsewhere');\
             f.innerHTML = '<input name=\"kn_payload\" value=\"from a kn: form\"><span data-kn-status></span>';\
             document.body.appendChild(f); return true;",
        )
        .await;
        let loaded = wait_js(&page, Duration::from_secs(10), "return typeof kn__formInit === 'function';").await;
        assert_eq!(loaded, json!(true), "lib2form loads");
        js(&page, "document.getElementById('knform').requestSubmit(); return true;").await;
        let told = wait_js(&page, Duration::from_secs(10), "return document.querySelector('#knform [data-kn-status]').textContent;").await;
        assert_eq!(told, json!("200 Notified"), "the two-way form shows its status");
        let posted = wait_js(
            &page,
            Duration::from_secs(10),
            "return document.getElementById('events').textContent.indexOf('from a kn: form') >= 0;",
        )
        .await;
        assert_eq!(posted, json!(true), "the form's event arrives on the topic");
        screenshot(&page, "browser").await;
        page.close().await.ok();
    });
}

// ----- ping -----------------------------------------------------------------

#[test]
fn ping_page_measures_round_trips_and_throughput_through_apache() {
    if !browser_available() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let site = Site::start("browser_ping");
    let log = || site.apache.error_log();
    ping(&site.page("ping.html?auto=1&n=200&m=1000"), "Apache (pubsub.cgi)", "ping", &log);
}

#[test]
fn ping_page_runs_under_pubsub_cgi_serve() {
    if !browser_available() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let dir = Dir::new("browser_serve");
    let www = Path::new(env!("CARGO_MANIFEST_DIR")).join("www");
    let serve = Serve::spawn(Serve::command(&dir.join("events"), Some(&www)));
    let log = String::new;
    ping(&format!("{}/ping.html?auto=1&n=200&m=1000", serve.base), "pubsub-cgi serve", "ping-serve", &log);
    drop(serve);
}

/// The fast deployment: Apache serves the pages and proxies `/kn` to
/// `pubsub-cgi serve` (docs/DEPLOY.md), so the ping goes through Apache.
#[test]
fn ping_page_through_apache_mod_proxy_to_serve() {
    if !browser_available() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let dir = Dir::new("browser_proxy");
    let www = dir.join("www");
    std::fs::create_dir_all(&www).expect("mkdir www");
    let _ = std::fs::set_permissions(&www, std::os::unix::fs::PermissionsExt::from_mode(0o755));
    copy_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("www"), &www);
    let serve = Serve::spawn(Serve::command(&dir.join("events"), None));
    let backend = serve.url();
    let conf = format!(
        "ProxyPreserveHost On\nAlias /kn_apps/ {www}/\n<Directory {www}>\n    Require all granted\n</Directory>\n",
        www = www.display()
    );
    let apache = Apache::start_proxy(&backend, &conf);
    let log = || apache.error_log();
    ping(
        &format!("{}/kn_apps/ping.html?auto=1&n=200&m=1000", apache.base_url()),
        "Apache mod_proxy to pubsub-cgi serve",
        "ping-proxy",
        &log,
    );
    drop(apache);
    drop(serve);
}

/// Runs the ping page at `url` and prints its figures.
fn ping(url: &str, through: &str, shot: &str, log: &dyn Fn() -> String) {
    let driver = Driver::start();
    runtime().block_on(async {
        let page = driver.browser(shot).await;
        page.goto(url).await.expect("open the ping page");
        let done = wait_js(&page, Duration::from_secs(90), "return document.getElementById('state').dataset.done === 'true';").await;
        let state = js(&page, "return document.getElementById('state').textContent;").await;
        assert_eq!(done, json!(true), "the ping run did not finish: {state}\n{}", log());
        let figures = js(
            &page,
            "return {p50: document.getElementById('p50').textContent, p99: document.getElementById('p99').textContent,\
             avg: document.getElementById('avg').textContent, rate: document.getElementById('rate').textContent,\
             detail: document.getElementById('detail').textContent, results: window.kn_ping_results};",
        )
        .await;
        screenshot(&page, shot).await;
        page.close().await.ok();
        let p50: f64 = figures["p50"].as_str().and_then(|s| s.parse().ok()).expect("p50 is a number");
        let p99: f64 = figures["p99"].as_str().and_then(|s| s.parse().ok()).expect("p99 is a number");
        let rate: f64 = figures["rate"].as_str().and_then(|s| s.parse().ok()).expect("events/s is a number");
        assert!(p50 > 0.0 && p99 >= p50 && rate > 0.0, "{figures}");
        assert_eq!(figures["results"]["lost"], json!(0), "no ping was lost: {figures}");
        eprintln!(
            "ping through {through} in headless Chromium: p50 {} ms, p99 {} ms, mean {} ms, {} events/s\n  {}",
            figures["p50"].as_str().unwrap_or(""),
            figures["p99"].as_str().unwrap_or(""),
            figures["avg"].as_str().unwrap_or(""),
            figures["rate"].as_str().unwrap_or(""),
            figures["detail"].as_str().unwrap_or(""),
        );
    });
}
