//! A token never does more than its claim, nor a cookie more than its
//! channel allows (issue 37, defects 3, 4 and 7; docs/ACCESS.md, "Bearer
//! tokens" and "Cookies and other sites"), through the real `pubsub-cgi`
//! as a CGI process and under `serve`: a replay started with a narrowed
//! token or a capability re-posts only where the token may post; a
//! narrowed token cannot delete its user's routes; a cookie (`kn_token`
//! or `kn_session`) on a request not shown to come from this server's own
//! pages only reads.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use kn_journal::{Event, Selection, Store, Topic};
use kn_test_support::http::Stream;
use kn_test_support::{run_with_stdin, Dir, Serve};
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_pubsub-cgi");

const SECRET: &[u8] = b"an HS256 secret of key a, 32 bytes or more";

/// Every user may do everything; anonymous visitors own their sessions'
/// journals and may post to the public topics.
const RULES: &str = "\
allow all             /** users
allow post,read,route /who/anonymous/s/{session}/** anonymous
allow post,read       /what/public/** *
";

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// A token of `claims` (valid for an hour unless they say otherwise),
/// signed with the key `a`.
fn token(claims: Value) -> String {
    let mut all = json!({"exp": now() + 3600});
    if let (Some(c), Some(e)) = (all.as_object_mut(), claims.as_object()) {
        c.extend(e.clone());
    }
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("a".to_string());
    jsonwebtoken::encode(&header, &all, &EncodingKey::from_secret(SECRET)).unwrap()
}

struct Site {
    dir: Dir,
    keys: String,
    replay: PathBuf,
}

#[derive(Debug)]
struct Answer {
    code: u16,
    body: String,
}

impl Site {
    fn new(name: &str) -> Site {
        let dir = Dir::new(name);
        dir.create("access.rules", RULES);
        let key = dir.create("a.key", SECRET);
        let keys = format!("a=HS256:{}", key.display());
        Site { dir, keys, replay: PathBuf::from("/bin/true") }
    }

    /// A site whose `do_method=replay` starts the real `kn-replay`.
    fn replaying(name: &str) -> Site {
        Site { replay: kn_test_support::cargo_bin("kn-replay"), ..Site::new(name) }
    }

    fn root(&self) -> PathBuf {
        self.dir.join("kn_events")
    }

    fn store(&self) -> Store {
        Store::open(self.root()).unwrap()
    }

    fn payloads(&self, topic: &str) -> Vec<String> {
        let selected = self.store().events(&Topic::parse(topic).unwrap(), &Selection::all()).map(|s| s.events).unwrap_or_default();
        selected.iter().map(|e| String::from_utf8_lossy(e.payload()).into_owned()).collect()
    }

    fn active_routes(&self, from: &str) -> Vec<String> {
        let routes = self.store().routes(&Topic::parse(from).unwrap()).unwrap_or_default();
        routes.iter().map(|r| String::from_utf8_lossy(r.id()).into_owned()).collect()
    }

    /// One CGI request (`GET`, the `simple` format) with `env` besides the
    /// usual variables.
    fn cgi(&self, query: &str, env: &[(&str, &str)]) -> Answer {
        let mut command = Command::new(BIN);
        command
            .env_clear()
            .env("GATEWAY_INTERFACE", "CGI/1.1")
            .env("REQUEST_METHOD", "GET")
            .env("QUERY_STRING", format!("{query}&kn_response_format=simple"))
            .env("SCRIPT_NAME", "/kn")
            .env("SERVER_NAME", "127.0.0.1")
            .env("SERVER_PORT", "8080")
            .env("HTTP_HOST", "127.0.0.1:8080")
            .env("KN_EVENTS", self.root())
            .env("KN_TOKEN_KEYS", &self.keys)
            .env("KN_REPLAY", &self.replay)
            .stdout(Stdio::piped());
        let rules = self.dir.join("access.rules");
        if rules.exists() {
            command.env("KN_ACCESS_RULES", rules);
        }
        for (k, v) in env {
            command.env(k, v);
        }
        let output = run_with_stdin(&mut command, b"", Duration::from_secs(20));
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let code = head.lines().find_map(|l| l.strip_prefix("Status: ")).and_then(|s| s.get(..3)?.parse().ok()).unwrap_or(200);
        Answer { code, body: body.to_string() }
    }

    /// A CGI request bringing `token` in `Authorization: Bearer`.
    fn with_token(&self, token: &str, query: &str) -> Answer {
        self.cgi(query, &[("HTTP_AUTHORIZATION", &format!("Bearer {token}"))])
    }

    fn serve(&self) -> Serve {
        let mut command = Serve::command_of(Path::new(BIN), &self.root(), None);
        command.env("KN_ACCESS_RULES", self.dir.join("access.rules")).env("KN_TOKEN_KEYS", &self.keys);
        Serve::spawn(command)
    }
}

/// Puts into `journal` an event that claims to have come from `from`
/// (anyone may post such an event to a journal of their own).
fn claims_to_come_from(store: &Store, journal: &str, from: &str, payload: &str) {
    let journal = Topic::parse(journal).unwrap();
    store.tunnel(&journal, &Selection::none()).unwrap();
    let event = Event::from_pairs([("kn_id", payload), ("kn_payload", payload), ("kn_route_location", &format!("{from}/kn_routes/r1"))]);
    store.notify(&journal, event).unwrap();
}

/// Waits until `topic` holds `payload`: the replay ran.
fn replayed(site: &Site, topic: &str, payload: &str) {
    let seen = kn_test_support::wait_for(Duration::from_secs(20), || site.payloads(topic).iter().any(|p| p == payload));
    assert!(seen, "the replay never posted '{payload}' to {topic}: {:?}", site.payloads(topic));
}

#[test]
fn a_replay_started_with_a_narrowed_token_posts_only_where_its_claim_allows() {
    let site = Site::replaying("claims_replay_narrowed");
    let store = site.store();
    // Posted in this order: the allowed one last, so that once it is
    // there the refused one was tried before it.
    claims_to_come_from(&store, "/who/anna/kn_journal", "/what/announce", "announcement");
    claims_to_come_from(&store, "/who/anna/kn_journal", "/who/anna/notes", "note");
    let narrowed = token(json!({"sub": "anna", "kn": {"post": ["/who/anna/**"], "replay": ["/who/anna/**"]}}));
    let direct = site.with_token(&narrowed, "do_method=notify&kn_to=/what/announce&kn_payload=direct");
    assert_eq!(direct.code, 403, "{direct:?}");
    let a = site.with_token(&narrowed, "do_method=replay&kn_from=/who/anna/kn_journal&warp=inf");
    assert_eq!(a.code, 200, "{a:?}");
    replayed(&site, "/who/anna/notes", "note");
    assert_eq!(site.payloads("/what/announce"), Vec::<String>::new(), "a replay did what its token may not");
}

#[test]
fn a_replay_started_with_a_capability_is_judged_as_its_claim_not_as_anonymous() {
    let site = Site::replaying("claims_replay_capability");
    let store = site.store();
    // Anonymous may post to /what/public, the capability may not; the
    // capability may post to /what/drop, anonymous may not.
    claims_to_come_from(&store, "/who/anna/kn_journal", "/what/public/x", "public");
    claims_to_come_from(&store, "/who/anna/kn_journal", "/what/drop", "drop");
    let capability = token(json!({"kn": {"post": ["/what/drop"], "replay": ["/who/anna/kn_journal"]}}));
    let a = site.with_token(&capability, "do_method=replay&kn_from=/who/anna/kn_journal&warp=inf");
    assert_eq!(a.code, 200, "{a:?}");
    replayed(&site, "/what/drop", "drop");
    assert_eq!(site.payloads("/what/public/x"), Vec::<String>::new());
}

#[test]
fn kn_replay_run_by_hand_keeps_its_options_and_refuses_a_principal_it_cannot_read() {
    let site = Site::new("claims_replay_by_hand");
    let store = site.store();
    claims_to_come_from(&store, "/who/anna/kn_journal", "/what/announce", "announcement");
    let replay = || {
        let mut command = Command::new(kn_test_support::cargo_bin("kn-replay"));
        command.arg("--root").arg(site.root()).arg("--warp").arg("inf").arg("--quiet").env_remove("KN_REPLAY_PRINCIPAL");
        command.env("KN_ACCESS_RULES", site.dir.join("access.rules"));
        command
    };
    // A principal that cannot be read is refused: never the tool's own rights.
    let out = replay().env("KN_REPLAY_PRINCIPAL", "{not json").arg("/who/anna/kn_journal").output().unwrap();
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("KN_REPLAY_PRINCIPAL"), "{out:?}");
    assert_eq!(site.payloads("/what/announce"), Vec::<String>::new());
    // --as-user as before: anonymous may not post there (exit 69, refused).
    let out = replay().arg("--as-user").arg("").arg("--prefix").arg("a-").arg("/who/anna/kn_journal").output().unwrap();
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    assert_eq!(site.payloads("/what/announce"), Vec::<String>::new());
    // The operator's own run: the file system's rights.
    let out = replay().arg("--prefix").arg("b-").arg("/who/anna/kn_journal").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(site.payloads("/what/announce"), ["announcement"]);
}

#[test]
fn a_narrowed_token_cannot_delete_its_users_routes() {
    let site = Site::new("claims_route_deletion");
    let anna = [("REMOTE_USER", "anna")];
    for id in ["r1", "r2"] {
        let a = site.cgi(&format!("do_method=route&kn_from=/what/chat&kn_to=/who/anna/inbox&kn_id={id}"), &anna);
        assert_eq!(a.code, 200, "{a:?}");
    }
    let reader = token(json!({"sub": "anna", "kn": {"read": ["/what/chat"]}}));
    let a = site.with_token(&reader, "do_method=route&kn_from=/what/chat&kn_to=&kn_id=r1");
    assert_eq!(a.code, 403, "{a:?}");
    assert!(a.body.contains("kn claim"), "{a:?}");
    // Nor replace it (a route of the same kn_id), which deletes it too.
    let a = site.with_token(&reader, "do_method=route&kn_from=/what/chat&kn_to=http://elsewhere.example/kn/x&kn_id=r1");
    assert_eq!(a.code, 403, "{a:?}");
    assert_eq!(site.active_routes("/what/chat"), ["r1", "r2"]);
    // A token whose claim may route into the destination stops what
    // arrives there, as its user may.
    let inbox = token(json!({"sub": "anna", "kn": {"route": ["/who/anna/**"]}}));
    let a = site.with_token(&inbox, "do_method=route&kn_from=/what/chat&kn_to=&kn_id=r1");
    assert_eq!(a.code, 200, "{a:?}");
    assert_eq!(site.active_routes("/what/chat"), ["r2"]);
}

#[test]
fn without_a_rules_file_a_narrowed_token_still_cannot_replace_or_escalate_past_its_claim() {
    let site = Site::new("claims_no_rules");
    std::fs::remove_file(site.dir.join("access.rules")).unwrap();
    let a = site.cgi("do_method=route&kn_from=/what/chat&kn_to=/who/anna/inbox&kn_id=r1", &[]);
    assert_eq!(a.code, 200, "{a:?}");
    let t = token(json!({"sub": "anna", "kn": {"read": ["/what/chat"], "route": ["/who/mallory/**"]}}));
    // Replacing r1 deletes anna's route: the claim allows neither delete
    // on /what/chat nor route into /who/anna/inbox.
    let a = site.with_token(&t, "do_method=route&kn_from=/what/chat&kn_to=/who/mallory/inbox&kn_id=r1");
    assert_eq!(a.code, 403, "{a:?}");
    // An escalation posts to kn_unread_to: the claim must allow the post.
    let a = site.with_token(&t, "do_method=route&kn_from=/what/chat&kn_to=/who/mallory/inbox&kn_id=r9&kn_unread_after=1&kn_unread_to=/what/announce");
    assert_eq!(a.code, 403, "{a:?}");
    assert_eq!(site.active_routes("/what/chat"), ["r1"]);
}

/// The CGI variables of a request a browser makes with a cookie, from a
/// page of `from` (`None`: no `Sec-Fetch-Site`, no `Origin`).
fn browser(cookie: &str, fetch_site: Option<&str>, origin: Option<&str>) -> Vec<(&'static str, String)> {
    let mut env = vec![("HTTP_COOKIE", cookie.to_string())];
    if let Some(site) = fetch_site {
        env.push(("HTTP_SEC_FETCH_SITE", site.to_string()));
    }
    if let Some(origin) = origin {
        env.push(("HTTP_ORIGIN", origin.to_string()));
    }
    env
}

fn ask(site: &Site, query: &str, env: &[(&'static str, String)]) -> Answer {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    site.cgi(query, &env)
}

#[test]
fn a_token_cookie_on_a_request_from_another_site_only_reads() {
    let site = Site::new("claims_cookie_token");
    let cookie = format!("kn_token={}", token(json!({"sub": "anna"})));
    let notify = |n: &str| format!("do_method=notify&kn_to=/who/anna/notes&kn_payload={n}&kn_id={n}");
    // The attack: a top-level GET from another site.
    for (i, (fetch_site, origin)) in [
        (Some("cross-site"), None),
        (Some("same-site"), Some("http://other.127.0.0.1:8080")),
        (None, Some("http://evil.example")),
        (None, Some("null")),
        // Nothing shows where it comes from (an old browser): only reads.
        (None, None),
    ]
    .into_iter()
    .enumerate()
    {
        let a = ask(&site, &notify(&format!("x{i}")), &browser(&cookie, fetch_site, origin));
        assert_eq!(a.code, 403, "{fetch_site:?} {origin:?}: {a:?}");
        assert!(a.body.contains("cookie"), "{a:?}");
    }
    assert_eq!(site.payloads("/who/anna/notes"), Vec::<String>::new());
    // Every other state change, refused alike.
    let elsewhere = browser(&cookie, Some("cross-site"), None);
    for query in [
        "do_method=route&kn_from=/what/chat&kn_to=/who/anna/inbox&kn_id=r1",
        "do_method=replay&kn_from=/who/anna/kn_journal",
        "do_method=batch&kn_batch=do_method%3Dnotify%26kn_to%3D%2Fwho%2Fanna%2Fnotes%26kn_payload%3Db",
    ] {
        let a = ask(&site, query, &elsewhere);
        assert!(!a.body.contains("status: 200 Routed") && !a.body.contains("status: 200 Replaying"), "{query}: {a:?}");
        assert!(a.body.contains("status: 403"), "{query}: {a:?}");
    }
    assert_eq!(site.active_routes("/what/chat"), Vec::<String>::new());
    // Reads go on: an EventSource of the same site.
    let a = ask(&site, "kn_from=/who/anna/notes&kn_expires=%2B0", &elsewhere);
    assert_eq!(a.code, 200, "{a:?}");
    // From this server's own pages: allowed.
    for (fetch_site, origin) in [(Some("same-origin"), None), (Some("none"), None), (None, Some("http://127.0.0.1:8080"))] {
        let a = ask(&site, &notify("own"), &browser(&cookie, fetch_site, origin));
        assert_eq!(a.code, 200, "{fetch_site:?} {origin:?}: {a:?}");
    }
    // Sec-Fetch-Site, which a page cannot set, wins over Origin.
    let a = ask(&site, &notify("mixed"), &browser(&cookie, Some("cross-site"), Some("http://127.0.0.1:8080")));
    assert_eq!(a.code, 403, "{a:?}");
    // A deletion and an acknowledgement from elsewhere: refused.
    let own = browser(&cookie, Some("same-origin"), None);
    assert_eq!(ask(&site, "do_method=route&kn_from=/what/chat&kn_to=/who/anna/inbox&kn_id=r1", &own).code, 200);
    assert_eq!(ask(&site, "do_method=route&kn_from=/what/chat&kn_to=&kn_id=r1", &elsewhere).code, 403);
    assert_eq!(site.active_routes("/what/chat"), ["r1"]);
    let a = ask(&site, "do_method=ack&kn_from=/who/anna/inbox&kn_route_checkpoint=1", &elsewhere);
    assert_eq!(a.code, 403, "{a:?}");
    // The token in the header or the kn_token parameter is no cookie.
    let t = token(json!({"sub": "anna"}));
    let a = site.cgi(&format!("{}&kn_token={t}", notify("param")), &[("HTTP_SEC_FETCH_SITE", "cross-site")]);
    assert_eq!(a.code, 200, "{a:?}");
}

#[test]
fn a_session_cookie_on_a_request_from_another_site_only_reads_and_basic_login_is_the_2003_protocols() {
    let site = Site::new("claims_cookie_session");
    std::fs::create_dir_all(site.root()).unwrap();
    let key = site.store().session_key().unwrap();
    let (id, session) = key.new_session();
    let cookie = format!("kn_session={session}");
    let journal = format!("/who/anonymous/s/{id}/notes");
    let post = format!("do_method=notify&kn_to={journal}&kn_payload=x");
    let a = ask(&site, &post, &browser(&cookie, Some("cross-site"), None));
    assert_eq!(a.code, 403, "{a:?}");
    assert_eq!(site.payloads(&journal), Vec::<String>::new());
    let a = ask(&site, &format!("kn_from={journal}&kn_expires=%2B0"), &browser(&cookie, Some("cross-site"), None));
    assert_eq!(a.code, 200, "{a:?}");
    let a = ask(&site, &post, &browser(&cookie, Some("same-origin"), None));
    assert_eq!(a.code, 200, "{a:?}");
    // A public topic anonymous may post to without a cookie: the cookie
    // from elsewhere is still refused (it is the credential presented).
    let a = ask(&site, "do_method=notify&kn_to=/what/public/x&kn_payload=y", &browser(&cookie, Some("cross-site"), None));
    assert_eq!(a.code, 403, "{a:?}");
    // do_method=session from another site makes no session.
    let a = site.cgi("do_method=session", &[("HTTP_SEC_FETCH_SITE", "cross-site")]);
    assert_eq!(a.code, 403, "{a:?}");
    let a = site.cgi("do_method=session", &[("HTTP_SEC_FETCH_SITE", "same-origin")]);
    assert_eq!(a.code, 200, "{a:?}");
    // Basic login (REMOTE_USER) is what it was in 2003: ACCESS.md says so.
    let a = site.cgi("do_method=notify&kn_to=/who/anna/notes&kn_payload=basic", &[("REMOTE_USER", "anna"), ("HTTP_SEC_FETCH_SITE", "cross-site")]);
    assert_eq!(a.code, 200, "{a:?}");
}

fn request(serve: &Serve, method: &str, target: &str, headers: &str) -> (u16, String) {
    let request = format!("{method} {target} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: 0\r\n{headers}\r\n", serve.addr());
    let mut stream = Stream::send(&serve.url(), request.as_bytes());
    stream.read_to_end(Duration::from_secs(10));
    (stream.status().unwrap_or(0), String::from_utf8_lossy(stream.body()).into_owned())
}

#[test]
fn a_token_cookie_writes_a_stream_only_from_this_servers_own_pages_under_serve() {
    let site = Site::new("claims_cookie_streams");
    let serve = site.serve();
    let cookie = format!("Cookie: kn_token={}\r\nContent-Type: text/plain\r\n", token(json!({"sub": "anna"})));
    let elsewhere = format!("{cookie}Sec-Fetch-Site: cross-site\r\n");
    let own = format!("{cookie}Origin: http://{}\r\n", serve.addr());
    for method in ["PUT", "POST", "DELETE"] {
        let (code, body) = request(&serve, method, "/v1/stream/anna/notes", &elsewhere);
        assert_eq!(code, 403, "{method}: {body}");
    }
    let (code, body) = request(&serve, "PUT", "/v1/stream/anna/notes", &own);
    assert_eq!(code, 201, "{body}");
    let (code, body) = request(&serve, "GET", "/v1/stream/anna/notes?offset=-1", &elsewhere);
    assert_eq!(code, 200, "{body}");
    let (code, body) = request(&serve, "DELETE", "/v1/stream/anna/notes", &elsewhere);
    assert_eq!(code, 403, "{body}");
    let (code, body) = request(&serve, "DELETE", "/v1/stream/anna/notes", &own);
    assert_eq!(code, 204, "{body}");
    // Under serve, /kn the same.
    let (code, body) = request(&serve, "GET", "/kn?do_method=notify&kn_to=/who/anna/notes&kn_payload=x&kn_response_format=simple", &elsewhere);
    assert_eq!(code, 403, "{body}");
    let (code, body) = request(&serve, "GET", "/kn?do_method=notify&kn_to=/who/anna/notes&kn_payload=x&kn_response_format=simple", &own);
    assert_eq!(code, 200, "{body}");
}
