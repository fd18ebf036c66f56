//! Bearer tokens in a real headless Chromium (docs/ACCESS.md 1b,
//! docs/BROWSER.md "Bearer tokens"), with tokens minted by `kn token`:
//!
//! * a page of one origin (Apache) reads a topic of another (`pubsub-cgi
//!   serve` on another port) with an `EventSource` bringing its token in
//!   the `kn_token` query parameter, and posts there with a `fetch` whose
//!   form carries it, reading both answers (`Access-Control-Allow-Origin:
//!   *`); the JavaScript client does the same across origins by itself;
//! * a page of the same site reads, with its token in the `kn_token`
//!   cookie, a topic anonymous may not read (pubsub.cgi under Apache);
//! * the JavaScript client, given a short-lived token and a callback to
//!   renew it, keeps receiving across the token's expiry (its tunnel ends
//!   `401`, it asks for a new token and resumes from its checkpoint; its
//!   route from a topic only the token's group may read is asked for
//!   again with the new token before the old one runs out): every event
//!   arrives, exactly once.
//!
//! Like `tests/browser.rs`, each skips with a printed reason when Apache,
//! chromium or chromedriver is missing, except under `CI=true`.

mod chromium;
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use chromium::{browser_available, js, runtime, wait_js, Driver, TURN};
use serde_json::{json, Value};
use support::{Apache, Dir, Serve};

/// A token for `args` (`--user anna --ttl 1h`...), signed with the store's
/// key at `root` (made on first use), as `kn token` prints it.
fn mint(root: &Path, args: &[&str]) -> String {
    let out = Command::new(support::cargo_bin("kn")).arg("--root").arg(root).arg("token").args(args).output().expect("run kn token");
    assert!(out.status.success(), "kn token {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(token.split('.').count(), 3, "a JWT: {token:?}");
    token
}

/// A directory of pages for Apache to serve at `/pages/`.
fn pages(dir: &Dir) -> PathBuf {
    let pages = dir.create_dir("pages");
    let _ = std::fs::set_permissions(&pages, std::os::unix::fs::PermissionsExt::from_mode(0o755));
    pages
}

fn page(pages: &Path, name: &str, html: &str) {
    let path = pages.join(name);
    std::fs::write(&path, html).expect("write page");
    let _ = std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644));
}

/// Apache's configuration for `/pages/` and the access rules, tokens read
/// from the store's key with no leeway.
fn apache_conf(rules: &Path, pages: &Path) -> String {
    format!(
        "SetEnv KN_ACCESS_RULES {rules}\nSetEnv KN_TOKEN_LEEWAY 0\n<Location /kn>\nCGIPassAuth On\n</Location>\n\
         Alias /pages/ {pages}/\n<Directory {pages}>\nRequire all granted\n</Directory>\n\
         AddType text/html .html\nAddCharset utf-8 .html\n",
        rules = rules.display(),
        pages = pages.display()
    )
}

/// The script of a page that opens `EventSource`s and keeps what they do
/// in `window.seen[name]`: `{events: [payload...], errors: n, open: bool}`.
const LISTEN: &str = "<script>
window.seen = {};
function listen(name, url) {
  var s = window.seen[name] = {events: [], errors: 0, open: false};
  var es = new EventSource(url);
  es.onopen = function () { s.open = true; };
  es.onerror = function () { s.errors++; if (es.readyState === 2) s.closed = true; };
  es.onmessage = function (m) {
    try { var e = JSON.parse(m.data); if (!e.status) s.events.push(e.kn_payload); } catch (x) {}
  };
  return es;
}
</script>";

const CROSS_RULES: &str = "\
allow all             /who/{user}/**     users
allow read,post       /what/private/**   users
";

#[test]
fn a_page_of_another_origin_reads_and_posts_with_a_query_string_token() {
    if !browser_available() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let dir = Dir::new("browser_tokens_cross");
    let rules = dir.create("access.rules", CROSS_RULES);
    let _ = std::fs::set_permissions(&rules, std::os::unix::fs::PermissionsExt::from_mode(0o644));
    // The topics' origin: serve, on a port of its own.
    let root = dir.join("serve_events");
    std::fs::create_dir_all(&root).expect("mkdir store");
    let token = mint(&root, &["--user", "anna", "--ttl", "1h"]);
    let mut command = Serve::command(&root, None);
    command.env("KN_ACCESS_RULES", &rules);
    let serve = Serve::spawn(command);
    // The page's origin: Apache, another port.
    let pages = pages(&dir);
    let apache = Apache::start(&support::pubsub_cgi(), &dir.store("apache_events"), &apache_conf(&rules, &pages));
    let topic = format!("{}/what/private/feed", serve.url());
    page(
        &pages,
        "cross.html",
        &format!(
            "<!doctype html><title>cross</title>{LISTEN}<script>
window.TOPIC = {topic:?}; window.SERVER = {server:?}; window.TOKEN = {token:?};
window.post = function (payload, token) {{
  var body = 'kn_to=/what/private/feed&kn_payload=' + payload + '&kn_response_format=simple' + (token ? '&kn_token=' + token : '');
  return fetch(SERVER, {{method: 'POST', headers: {{'Content-Type': 'application/x-www-form-urlencoded'}}, body: body}})
    .then(function (r) {{ return r.text().then(function (t) {{ return r.status + ' ' + t; }}); }}, function (e) {{ return 'failed: ' + e; }});
}};
</script>",
            server = serve.url()
        ),
    );
    let driver = Driver::start();
    runtime().block_on(async {
        let browser = driver.browser("cross").await;
        browser.goto(&format!("{}/pages/cross.html", apache.base_url())).await.expect("open the page");
        // Without a token: anonymous may not read; the EventSource fails.
        js(&browser, "listen('anonymous', TOPIC + '?kn_response_format=sse&do_max_age=infinity'); return true;").await;
        js(&browser, "listen('token', TOPIC + '?kn_response_format=sse&do_max_age=infinity&kn_token=' + TOKEN); return true;").await;
        let open = wait_js(&browser, Duration::from_secs(15), "return seen.token.open;").await;
        assert_eq!(open, json!(true), "the EventSource with a query-string token opened: {}", js(&browser, "return JSON.stringify(seen);").await);
        // A cross-origin POST carrying the token in its form: a simple
        // request (no preflight), its answer readable.
        let posted = wait_js(&browser, Duration::from_secs(15), "return window.posted || (post('from-the-page', TOKEN).then(function (r) { window.posted = r; }), null);").await;
        let posted = posted.as_str().unwrap_or_default().to_string();
        assert!(posted.starts_with("200 ") && posted.contains("200 Notified"), "{posted}");
        let got = wait_js(&browser, Duration::from_secs(15), "return seen.token.events.indexOf('from-the-page') >= 0 && seen.token.events;").await;
        assert_eq!(got, json!(["from-the-page"]), "the event reached the page of the other origin");
        // A refused token: the page reads why.
        let refused = js(&browser, "return post('bad-token', 'not-a-jwt');").await;
        let refused = refused.as_str().unwrap_or_default().to_string();
        assert!(refused.starts_with("401 ") && refused.contains("invalid bearer token (malformed)"), "{refused}");
        // Without a token the answer is not for pages of other origins.
        let anonymous = js(&browser, "return post('anonymous-post', '');").await;
        assert!(anonymous.as_str().unwrap_or_default().starts_with("failed"), "{anonymous}");
        let anonymous = js(&browser, "return seen.anonymous;").await;
        assert_eq!((anonymous["open"].clone(), anonymous["events"].clone()), (json!(false), json!([])), "{anonymous}");
        assert!(anonymous["errors"].as_u64().unwrap_or(0) >= 1, "{anonymous}");
        browser.close().await.ok();
    });
    // What the browser relied on, on the wire: the answers to requests
    // bringing kn_token allow any origin; others are unchanged.
    let head = |query: &str| {
        let request = format!("GET /kn/what/private/feed?{query} HTTP/1.0\r\nHost: {}\r\nOrigin: http://elsewhere.example\r\n\r\n", serve.addr());
        let mut stream = support::http::Stream::send(&serve.url(), request.as_bytes());
        stream.read_to_end(Duration::from_secs(10));
        String::from_utf8_lossy(stream.head()).to_ascii_lowercase()
    };
    assert!(head(&format!("kn_response_format=simple&kn_expires=%2B0&kn_token={token}")).contains("access-control-allow-origin: *"));
    assert!(!head("kn_response_format=simple&kn_expires=%2B0").contains("access-control-allow-origin"));
    drop(apache);
}

#[test]
fn the_javascript_client_of_another_origin_subscribes_and_publishes_with_its_token() {
    if !browser_available() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let dir = Dir::new("browser_tokens_client_cross");
    let rules = dir.create("access.rules", CROSS_RULES);
    let _ = std::fs::set_permissions(&rules, std::os::unix::fs::PermissionsExt::from_mode(0o644));
    let root = dir.join("serve_events");
    std::fs::create_dir_all(&root).expect("mkdir store");
    let token = mint(&root, &["--user", "anna", "--ttl", "1h"]);
    let mut command = Serve::command(&root, None);
    command.env("KN_ACCESS_RULES", &rules);
    let serve = Serve::spawn(command);
    let pages = pages(&dir);
    let apache = Apache::start(&support::pubsub_cgi(), &dir.store("apache_events"), &apache_conf(&rules, &pages));
    page(
        &pages,
        "client.html",
        &format!(
            "<!doctype html><title>client</title>
<script>window.kn_server = {server:?}; window.kn_token = {token:?};</script>
<script src=\"{server}?do_method=lib\"></script>
<script>
window.got = [];
kn.subscribe('/what/private/feed', function (e) {{ got.push(e.kn_payload); }}, {{}}, {{
  onSuccess: function (s) {{ window.routed = s.status; }},
  onError: function (s) {{ window.routed = s.status; }}
}});
</script>",
            server = serve.url()
        ),
    );
    let driver = Driver::start();
    runtime().block_on(async {
        let browser = driver.browser("client-cross").await;
        browser.goto(&format!("{}/pages/client.html", apache.base_url())).await.expect("open the page");
        chromium::wait_connected(&browser, "the client of another origin").await;
        assert_eq!(js(&browser, "return kn.journal.indexOf('/who/anna/s/') === 0;").await, json!(true), "named after the token's sub");
        // The client asks for the route once the tunnel is open; an event
        // posted before the route is made is not forwarded (as in the
        // original), so publish once the route's own answer is in.
        let routed = wait_js(&browser, Duration::from_secs(15), "return window.routed;").await;
        assert!(routed.as_str().is_some_and(|s| s.starts_with("200")), "the route: {routed}");
        let published = wait_js(&browser, Duration::from_secs(15), "return window.published || (kn.publish('/what/private/feed', {kn_payload: 'across origins'}).then(function (s) { window.published = s.status; }), null);").await;
        assert_eq!(published, json!("200 Notified"));
        let got = wait_js(&browser, Duration::from_secs(15), "return got.length && got;").await;
        assert_eq!(got, json!(["across origins"]));
        browser.close().await.ok();
    });
    drop(apache);
}

const SITE_RULES: &str = "\
allow all             /who/{user}/**     users
allow read            /what/private/**   users
allow read            /what/staff/**     @staff
allow post            /what/private/**   *
allow post            /what/staff/**     *
";

#[test]
fn a_page_of_the_same_site_reads_a_topic_anonymous_may_not_with_its_token_in_a_cookie() {
    if !browser_available() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let dir = Dir::new("browser_tokens_cookie");
    let rules = dir.create("access.rules", SITE_RULES);
    let _ = std::fs::set_permissions(&rules, std::os::unix::fs::PermissionsExt::from_mode(0o644));
    let store = dir.store("kn_events");
    let token = mint(&store, &["--user", "anna", "--read", "/what/private/**", "--ttl", "1h"]);
    // The key kn token made is the CGI's to read.
    support::make_writable_by_server(&store);
    let pages = pages(&dir);
    let apache = Apache::start(&support::pubsub_cgi(), &store, &apache_conf(&rules, &pages));
    page(&pages, "same.html", &format!("<!doctype html><title>same site</title>{LISTEN}<script>window.TOKEN = {token:?};</script>"));
    let feed = "/kn/what/private/feed?kn_response_format=sse&do_max_age=infinity";
    // Anonymous may not read it (a browser would ask for a login).
    let r = support::get(&format!("{}/what/private/feed?kn_response_format=simple&kn_expires=%2B0", apache.url()));
    assert_eq!(r.status, 401, "{}", r.text());
    let driver = Driver::start();
    runtime().block_on(async {
        let browser = driver.browser("cookie").await;
        browser.goto(&format!("{}/pages/same.html", apache.base_url())).await.expect("open the page");
        // The token in the cookie (KN_TOKEN_COOKIE's default name), as a
        // page of the site sets it for the EventSource, which sends no header.
        js(&browser, &format!("document.cookie = 'kn_token=' + TOKEN + '; Path=/kn; SameSite=Strict'; listen('cookie', {feed:?}); return true;")).await;
        let open = wait_js(&browser, Duration::from_secs(15), "return seen.cookie.open;").await;
        assert_eq!(open, json!(true), "{}\n{}", js(&browser, "return JSON.stringify(seen);").await, apache.error_log());
        let r = support::post_form(&apache.url(), &[("kn_to", "/what/private/feed"), ("kn_payload", "for token holders"), ("kn_response_format", "simple")]);
        assert_eq!(r.status, 200, "{}", r.text());
        let got = wait_js(&browser, Duration::from_secs(15), "return seen.cookie.events.length && seen.cookie.events;").await;
        assert_eq!(got, json!(["for token holders"]));
        browser.close().await.ok();
    });
}

#[test]
fn the_javascript_client_renews_an_expiring_token_and_loses_no_event_across_the_expiry() {
    if !browser_available() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let dir = Dir::new("browser_tokens_refresh");
    let rules = dir.create("access.rules", SITE_RULES);
    let _ = std::fs::set_permissions(&rules, std::os::unix::fs::PermissionsExt::from_mode(0o644));
    let store = dir.store("kn_events");
    const TTL: u64 = 5;
    // anna is staff by her tokens only: her route from /what/staff/live
    // expires with each token (docs/ACCESS.md, "Lifetime") and the client
    // asks for it again with the new one.
    let short = mint(&store, &["--user", "anna", "--groups", "staff", "--ttl", &TTL.to_string()]);
    let minted = Instant::now();
    let fresh: Vec<String> = (0..2).map(|_| mint(&store, &["--user", "anna", "--groups", "staff", "--ttl", "1h"])).collect();
    support::make_writable_by_server(&store);
    let pages = pages(&dir);
    let apache = Apache::start(&support::pubsub_cgi(), &store, &apache_conf(&rules, &pages));
    // The renewal callback hands out the next token (a real page would
    // ask its backend), counting the calls.
    page(
        &pages,
        "renew.html",
        &format!(
            "<!doctype html><title>renew</title>
<script>
window.kn_token = {short:?};
window.fresh = {fresh};
window.renewals = 0;
window.kn_refreshToken = function () {{
  window.renewals++;
  return new Promise(function (resolve) {{ setTimeout(function () {{ resolve(fresh.length > 1 ? fresh.shift() : fresh[0]); }}, 50); }});
}};
</script>
<script src=\"/kn?do_method=lib\"></script>
<script>
window.got = []; window.states = [];
kn.onConnection = function (state, detail) {{ states.push(state + ' ' + (detail || '')); }};
kn.subscribe('/what/private/live', function (e) {{ got.push(e.kn_id); }});
kn.subscribe('/what/staff/live', function (e) {{ got.push('staff-' + e.kn_id); }});
</script>",
            fresh = serde_json::to_string(&fresh).expect("json")
        ),
    );
    let driver = Driver::start();
    runtime().block_on(async {
        let browser = driver.browser("renew").await;
        browser.goto(&format!("{}/pages/renew.html", apache.base_url())).await.expect("open the page");
        chromium::wait_connected(&browser, "the client with a short token").await;
        // The route is in place once an event posted now arrives.
        let mut sent = Vec::new();
        let post = |id: &str| {
            for topic in ["/what/private/live", "/what/staff/live"] {
                let r = support::post_form(&apache.url(), &[("kn_to", topic), ("kn_id", id), ("kn_payload", id), ("kn_response_format", "simple")]);
                assert_eq!(r.status, 200, "{}", r.text());
            }
        };
        // Until both routes are in place (the client asks for them once
        // the page has loaded; on a busy machine that may be after the
        // first token's expiry, which the client then renews), probes:
        // left out of the count below.
        let mut ready = false;
        for n in 0..60 {
            let probe = format!("p{n}");
            post(&probe);
            let check = format!("return got.indexOf('{probe}') >= 0 && got.indexOf('staff-{probe}') >= 0;");
            if wait_js(&browser, Duration::from_millis(500), &check).await == json!(true) {
                ready = true;
                break;
            }
        }
        assert!(ready, "{}", js(&browser, "return JSON.stringify({got: got, states: states});").await);
        // Events every 200 ms until well past the first token's expiry.
        let until = (minted + Duration::from_secs(TTL + 3)).max(Instant::now() + Duration::from_secs(3));
        let mut i = 0;
        while Instant::now() < until {
            let id = format!("e{i}");
            post(&id);
            sent.push(format!("staff-{id}"));
            sent.push(id);
            i += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let want = json!(sent);
        let deadline = Instant::now() + Duration::from_secs(30);
        let got = loop {
            let got = js(&browser, "return got.filter(function (id) { return !/^(staff-)?p[0-9]+$/.test(id); });").await;
            if got.as_array().map(|a| a.len()) >= Some(sent.len()) || Instant::now() > deadline {
                break got;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let report = js(&browser, "return {states: states, renewals: renewals, token: kn.token === fresh[0] || fresh.indexOf(kn.token) >= 0};").await;
        let mut sorted: Vec<Value> = got.as_array().cloned().unwrap_or_default();
        sorted.sort_by_key(|v| v.as_str().map(|s| s.to_string()));
        let mut expected: Vec<Value> = want.as_array().cloned().unwrap_or_default();
        expected.sort_by_key(|v| v.as_str().map(|s| s.to_string()));
        assert_eq!(sorted, expected, "every event once, across the expiry: {report}\n{}", apache.error_log());
        assert!(report["renewals"].as_u64().unwrap_or(0) >= 1, "the callback was asked: {report}");
        let states = report["states"].to_string();
        assert!(states.contains("401"), "the tunnel ended with its token: {states}");
        assert_eq!(js(&browser, "return kn.connected;").await, json!(true), "{report}");
        browser.close().await.ok();
    });
}
