//! Bytes a client chose, reflected or stored, reaching a browser (issue
//! 37; docs/RELIABILITY.md, "Bytes from a request reach a response header
//! (review 1)" and "Stored or reflected bytes rendered by a browser
//! (review 6)"), end to end: `pubsub.cgi` under a real Apache 2.4 mounted at
//! `/kn` and `/v1/stream` (a CGI writes its own header block, which
//! Apache parses), and `pubsub-cgi serve`.
//!
//! The tests skip (with a message) when Apache is not installed, except
//! under `CI`.

mod support;

use std::time::Duration;

use base64::Engine as _;
use support::{Apache, Dir, Serve, Stream};

const PATIENCE: Duration = Duration::from_secs(20);

/// The reviewer's header: a `kid` that ends the `WWW-Authenticate` line,
/// sets a cookie, makes the answer HTML and starts its body with a script.
const SPLITTING_KID: &str = "x\r\nSet-Cookie: kn_xss=1; Path=/\r\nContent-Type: text/html\r\n\r\n<script>alert(1)</script>";

/// A token whose header is `header` (JSON), claims `{}`, and a made-up
/// signature: never verified, since no key has its kid.
fn forged(header: &serde_json::Value) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    format!("{}.e30.c2ln", b64.encode(header.to_string()))
}

/// `text` percent-encoded for a query string.
fn query_escape(text: &str) -> String {
    text.bytes().map(|b| if b.is_ascii_alphanumeric() || b"-._~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") }).collect()
}

/// Apache serving `pubsub.cgi` at `/kn` and `/v1/stream` (as
/// docs/DEPLOY.md mounts it) over a fresh store with no keys and no
/// rules: the default install, where every presented token is checked.
struct Site {
    apache: Apache,
    _dir: Dir,
}

fn site(name: &str) -> Option<Site> {
    if !support::available(support::APACHE) {
        return None;
    }
    let dir = Dir::new(name);
    let store = dir.store("kn_events");
    support::make_writable_by_server(&store);
    let cgi = support::pubsub_cgi();
    let apache = Apache::start_with(|site| {
        let bin = site.create_dir("cgi-bin");
        let dest = bin.join("pubsub.cgi");
        std::fs::copy(&cgi, &dest).expect("copy pubsub-cgi");
        std::fs::set_permissions(&dest, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
        format!("ScriptAlias /kn {cgi}\nScriptAlias /v1/stream {cgi}\nSetEnv KN_EVENTS {store}\n", cgi = dest.display(), store = store.display())
    });
    Some(Site { apache, _dir: dir })
}

/// `request` sent verbatim to `url`'s host; the whole answer.
fn exchange(url: &str, request: &str) -> Stream {
    let mut stream = Stream::send(url, request.as_bytes());
    assert!(stream.read_to_end(PATIENCE), "no end of the answer to {request:?}: {}", stream.text());
    stream
}

/// `GET path` (HTTP/1.0) on `base`.
fn get(base: &str, path: &str) -> Stream {
    let host = base.trim_start_matches("http://");
    exchange(base, &format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n"))
}

/// The header lines of an answer (after the status line), names lower-cased.
fn headers(answer: &Stream) -> Vec<(String, String)> {
    let head = String::from_utf8_lossy(answer.head()).into_owned();
    head.split("\r\n")
        .skip(1)
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect()
}

fn header_values(answer: &Stream, name: &str) -> Vec<String> {
    headers(answer).into_iter().filter(|(n, _)| n == name).map(|(_, v)| v).collect()
}

/// What must hold of the answer to a forged token: `401`, one
/// `Content-Type` (`expected`), no cookie set, no script in the body, and
/// neither the kid nor any of its text anywhere in the answer.
fn assert_refused_without_injection(answer: &Stream, expected_type: &str) {
    let text = answer.text();
    assert_eq!(answer.status(), Some(401), "{text}");
    assert!(header_values(answer, "set-cookie").is_empty(), "a cookie was injected:\n{text}");
    assert_eq!(header_values(answer, "content-type"), vec![expected_type.to_owned()], "{text}");
    assert!(!text.contains("kn_xss") && !text.contains("alert(1)"), "the token's text is echoed:\n{text}");
    let challenge = header_values(answer, "www-authenticate");
    assert_eq!(challenge.len(), 1, "{text}");
    assert!(challenge[0].starts_with("Bearer error=\"invalid_token\""), "{text}");
}

#[test]
fn a_forged_token_link_injects_no_header_or_body_through_pubsub_cgi_under_apache() {
    let Some(site) = site("reflected_token_link") else { return };
    let base = site.apache.base_url();
    let by_kid = forged(&serde_json::json!({"alg": "HS256", "kid": SPLITTING_KID}));
    let by_alg = forged(&serde_json::json!({"alg": SPLITTING_KID, "kid": "k"}));
    for token in [&by_kid, &by_alg] {
        let token = query_escape(token);
        // The reviewer's link: the default format (js) is an HTML page by
        // protocol, its text escaped; the injection would have added a
        // cookie and put a script of the token's before it.
        let answer = get(&base, &format!("/kn?kn_token={token}"));
        assert_refused_without_injection(&answer, "text/html; charset=utf-8");
        assert!(answer.body().starts_with(b"<!DOCTYPE html"), "{}", answer.text());
        // In `simple`, nothing may turn the answer into HTML.
        let answer = get(&base, &format!("/kn?kn_token={token}&kn_response_format=simple"));
        assert_refused_without_injection(&answer, "text/plain; charset=utf-8");
        // The same through the Durable Streams door.
        let answer = get(&base, &format!("/v1/stream/s?offset=-1&kn_token={token}"));
        assert_refused_without_injection(&answer, "text/plain; charset=utf-8");
    }
    let unknown = get(&base, &format!("/kn?kn_token={}&kn_response_format=simple", forged(&serde_json::json!({"alg": "HS256", "kid": "my-kid"}))));
    assert!(unknown.text().contains("unknown key") && !unknown.text().contains("my-kid"), "{}", unknown.text());
}

/// `PUT` a stream at `path` of `content_type` holding `body` on `base`
/// (`/v1/stream/...`), then read it from the start: the read's answer.
fn put_and_read(base: &str, path: &str, content_type: &str, body: &str) -> Stream {
    let host = base.trim_start_matches("http://");
    let put = exchange(
        base,
        &format!("PUT {path} HTTP/1.0\r\nHost: {host}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n{body}", body.len()),
    );
    assert_eq!(put.status(), Some(201), "{}", put.text());
    get(base, &format!("{path}?offset=-1"))
}

/// A stream of an active type is a sandboxed attachment; one of an
/// inert type is shown, sandboxed; the creator's type and bytes are kept.
fn assert_streams_served_inert(base: &str) {
    let script = "<script>alert(document.cookie)</script>";
    for (path, content_type, inert) in [
        ("/v1/stream/xss/html", "text/html", false),
        ("/v1/stream/xss/svg", "image/svg+xml", false),
        ("/v1/stream/xss/xhtml", "application/xhtml+xml; charset=utf-8", false),
        ("/v1/stream/xss/js", "text/javascript", false),
        ("/v1/stream/xss/plain", "text/plain", true),
    ] {
        let read = put_and_read(base, path, content_type, script);
        let text = read.text();
        assert_eq!(read.status(), Some(200), "{text}");
        assert_eq!(read.body(), script.as_bytes(), "{text}");
        assert_eq!(header_values(&read, "content-type"), vec![content_type.to_owned()], "{text}");
        assert_eq!(header_values(&read, "x-content-type-options"), vec!["nosniff".to_owned()], "{text}");
        assert_eq!(header_values(&read, "content-security-policy"), vec!["sandbox".to_owned()], "{text}");
        let disposition = if inert { vec![] } else { vec!["attachment".to_owned()] };
        assert_eq!(header_values(&read, "content-disposition"), disposition, "{content_type}:\n{text}");
    }
}

#[test]
fn a_stream_of_an_active_type_is_served_as_a_sandboxed_attachment_by_pubsub_cgi_under_apache() {
    let Some(site) = site("reflected_stream_type") else { return };
    assert_streams_served_inert(&site.apache.base_url());
}

#[test]
fn a_stream_of_an_active_type_is_served_as_a_sandboxed_attachment_by_serve() {
    let dir = Dir::new("reflected_stream_type_serve");
    let serve = Serve::spawn(Serve::command(&dir.store("kn_events"), None));
    assert_streams_served_inert(&serve.base);
}

/// Event payloads and element names a client chose come back inert in
/// both formats a browser may be shown: `js` (an HTML page by protocol)
/// escapes every `<` inside its script strings, `simple` is `text/plain`.
#[test]
fn hostile_event_text_comes_back_escaped_in_js_and_plain_in_simple_under_apache() {
    let Some(site) = site("reflected_event_text") else { return };
    let kn = site.apache.url();
    let script = "</script><script>alert(1)</script><!--<script>";
    let body = format!(
        "kn_to=/what/xss&kn_id=e1&kn_response_format=simple&kn_payload={}&{}=v",
        query_escape(script),
        query_escape("<img src=x onerror=alert(2)>")
    );
    let host = kn.trim_start_matches("http://").split('/').next().unwrap_or_default().to_owned();
    let notified = exchange(
        &kn,
        &format!("POST /kn HTTP/1.0\r\nHost: {host}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}", body.len()),
    );
    assert_eq!(notified.status(), Some(200), "{}", notified.text());
    for (format, content_type) in [("js", "text/html; charset=utf-8"), ("simple", "text/plain; charset=utf-8")] {
        let url = format!("{kn}?do_method=route&kn_from=/what/xss&do_max_age=infinity&kn_response_format={format}&kn_status_from=r");
        let mut tunnel = Stream::get(&url);
        assert!(tunnel.read_until(b"alert(2)", PATIENCE), "{format}: the event never came: {}", tunnel.text());
        let text = tunnel.text();
        assert_eq!(header_values(&tunnel, "content-type"), vec![content_type.to_owned()], "{text}");
        if format == "js" {
            assert!(!text.contains("<script>alert") && !text.contains("<img"), "a tag of the event's in the page:\n{text}");
            assert!(text.contains(r"\x3c/script>\x3cscript>alert(1)"), "{text}");
        } else {
            assert!(text.contains(script), "{text}");
        }
        tunnel.close();
    }
}

/// The topic browser and the other pages of `www/`, and the JavaScript
/// client (`do_method=lib`, crates/cgi/assets), show events as text: no
/// script of theirs hands anything but a literal to an HTML sink
/// (`innerHTML`, `outerHTML`, `insertAdjacentHTML`, `document.write`,
/// `eval`); event text goes through `textContent` and `setAttribute`
/// (`knPage.el`, www/js/page.js).
#[test]
fn the_pages_hand_no_event_text_to_an_html_sink() {
    const SINKS: [&str; 5] = ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("];
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut scripts = 0;
    let entries = ["www/js", "crates/cgi/assets"].into_iter().flat_map(|dir| std::fs::read_dir(root.join(dir)).expect("a directory of scripts"));
    for entry in entries {
        let path = entry.expect("an entry").path();
        if path.extension().is_none_or(|e| e != "js") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a script");
        scripts += 1;
        for (n, line) in text.lines().enumerate() {
            // Each use of a sink in a statement of its own: `sink = <literal>;`.
            for piece in line.split(';') {
                let Some(sink) = SINKS.iter().find(|s| piece.contains(*s)) else { continue };
                let value = piece.split_once(sink).map(|(_, rest)| rest.trim()).unwrap_or_default();
                let literal = value.strip_prefix('=').map(str::trim).is_some_and(|v| {
                    let quoted = |q: char| v.len() >= 2 && v.starts_with(q) && v.ends_with(q) && !v[1..v.len() - 1].contains(q);
                    quoted('"') || quoted('\'')
                });
                assert!(literal, "{}:{}: {sink} given something other than a literal: {line}", path.display(), n + 1);
            }
        }
    }
    assert!(scripts >= 6, "the pages' scripts are in www/js, the client's in crates/cgi/assets");
}
