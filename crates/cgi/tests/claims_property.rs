//! The property of issue 37: nothing gets past a token's claim, nor past a
//! cookie's channel. Every state-changing method (notify, route, route
//! deletion, batch, replay, ack, session, stream `PUT`/`POST`/`DELETE`)
//! is driven through the real handler (`kn_cgi::handler::Handler`,
//! `kn_cgi::streams::handle`, the real `kn-replay` for replays) with
//!
//! * (a) a token of anna narrowed by a generated `kn` claim,
//! * (b) a cookie (anna's token, or an anonymous visitor's session) on a
//!   request from another site (or one that does not say where it is from),
//! * (c) a capability (a token without `sub`) of a generated claim,
//!
//! over generated topics, with and without a rules file (which, when
//! present, allows everyone everything: only the claim and the channel
//! narrow). The store is then compared with what it held: every event,
//! route, deletion, acknowledgement and stream write that appeared must be
//! one the claim allows (for a cookie from elsewhere: none at all), judged
//! by an oracle written here, independently of the access layer.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use kn_cgi::handler::{Handler, Options, Reply};
use kn_cgi::streams::{handle as handle_stream, Outcome, StreamRequest};
use kn_cgi::{Limits, Request};
use kn_journal::access::{token_key_of_store, Principal};
use kn_journal::{Config, Event, Selection, Store, Topic};
use kn_streams::Streams;
use proptest::prelude::*;
use serde_json::json;

/// The topics the generated requests name.
const TOPICS: [&str; 6] = ["/what/chat", "/what/announce", "/who/anna/notes", "/who/anna/inbox", "/who/bob/notes", "/who/anna/kn_journal"];

/// The topics whose events are compared (the inboxes receive what the
/// routes made beforehand forward, which the requests may cause).
const WATCHED: [&str; 5] = ["/what/chat", "/what/announce", "/who/anna/notes", "/who/bob/notes", "/who/anna/kn_journal"];

/// The claim patterns generated.
const PATTERNS: [&str; 9] = [
    "/what/chat",
    "/what/announce",
    "/who/anna/notes",
    "/who/anna/kn_journal",
    "/who/anna/**",
    "/what/**",
    "/v1/stream/anna/**",
    "/v1/stream/**",
    "/**",
];

const OPERATIONS: [&str; 6] = ["post", "read", "route", "delete", "replay", "all"];

/// The stream paths generated ("anna/notes" exists beforehand).
const STREAMS: [&str; 3] = ["anna/notes", "anna/new", "bob/x"];

/// Rules that allow everyone everything: only claims and channels narrow.
const OPEN_RULES: &str = "allow all /** *\n";

type Claim = Vec<(usize, usize)>;

/// Whether `claim` allows `op` on `topic` (a topic's `kn_routes` counts
/// as the topic): the oracle, independent of the access layer.
fn allows(claim: &Claim, op: &str, topic: &str) -> bool {
    let topic = topic.strip_suffix("/kn_routes").unwrap_or(topic);
    claim.iter().any(|&(o, p)| {
        let pattern = PATTERNS[p];
        (OPERATIONS[o] == op || OPERATIONS[o] == "all")
            && match pattern.strip_suffix("/**") {
                Some("") => true,
                Some(prefix) => topic == prefix || topic.starts_with(&format!("{prefix}/")),
                None => topic == pattern,
            }
    })
}

/// Who asks.
#[derive(Clone, Debug)]
enum Channel {
    /// (a) anna's token narrowed by the claim, in the `Authorization` header.
    Narrowed,
    /// (c) a token without `sub`, exactly the claim.
    Capability,
    /// (b) anna's token in the `kn_token` cookie, from elsewhere.
    TokenCookie(Elsewhere),
    /// (b) an anonymous visitor's `kn_session` cookie, from elsewhere.
    SessionCookie(Elsewhere),
}

/// How a request shows it is from another site (or does not say).
#[derive(Clone, Copy, Debug)]
enum Elsewhere {
    CrossSite,
    SameSite,
    OtherOrigin,
    NullOrigin,
    Silent,
}

impl Elsewhere {
    fn headers(self) -> Vec<(&'static str, &'static str)> {
        match self {
            Elsewhere::CrossSite => vec![("sec-fetch-site", "cross-site")],
            Elsewhere::SameSite => vec![("sec-fetch-site", "same-site"), ("origin", "http://other.127.0.0.1:8080")],
            Elsewhere::OtherOrigin => vec![("origin", "http://evil.example")],
            Elsewhere::NullOrigin => vec![("origin", "null")],
            Elsewhere::Silent => vec![],
        }
    }
}

/// One state-changing request.
#[derive(Clone, Debug)]
enum Call {
    Notify { to: usize },
    Route { from: usize, to: usize, id: usize, unread_to: Option<usize> },
    Delete { from: usize, id: usize },
    Batch(Vec<Call>),
    Replay,
    Ack { checkpoint: u8 },
    Session,
    Stream { method: &'static str, path: usize },
}

const ROUTE_IDS: [&str; 3] = ["r1", "r2", "fresh"];

fn single() -> impl Strategy<Value = Call> {
    let t = 0..TOPICS.len();
    prop_oneof![
        t.clone().prop_map(|to| Call::Notify { to }),
        (t.clone(), t.clone(), 0..ROUTE_IDS.len(), proptest::option::of(t.clone()))
            .prop_map(|(from, to, id, unread_to)| Call::Route { from, to, id, unread_to }),
        (t.clone(), 0..ROUTE_IDS.len()).prop_map(|(from, id)| Call::Delete { from, id }),
        Just(Call::Replay),
    ]
}

fn call() -> impl Strategy<Value = Call> {
    prop_oneof![
        3 => single(),
        1 => proptest::collection::vec(single(), 1..4).prop_map(Call::Batch),
        1 => (1u8..4).prop_map(|checkpoint| Call::Ack { checkpoint }),
        1 => Just(Call::Session),
        2 => (prop_oneof![Just("PUT"), Just("POST"), Just("DELETE")], 0..STREAMS.len()).prop_map(|(method, path)| Call::Stream { method, path }),
    ]
}

fn channel() -> impl Strategy<Value = Channel> {
    let elsewhere = prop_oneof![
        Just(Elsewhere::CrossSite),
        Just(Elsewhere::SameSite),
        Just(Elsewhere::OtherOrigin),
        Just(Elsewhere::NullOrigin),
        Just(Elsewhere::Silent)
    ];
    prop_oneof![
        Just(Channel::Narrowed),
        Just(Channel::Capability),
        elsewhere.clone().prop_map(Channel::TokenCookie),
        elsewhere.prop_map(Channel::SessionCookie),
    ]
}

fn claim() -> impl Strategy<Value = Claim> {
    proptest::collection::vec((0..OPERATIONS.len(), 0..PATTERNS.len()), 0..5)
}

/// The environment every test of this file shares, set once before any
/// process is started: the real kn-replay, and the rules file it reads
/// (the open rules, the same verdicts as none).
fn environment() -> &'static Path {
    static ONCE: Once = Once::new();
    static mut DIR: Option<PathBuf> = None;
    ONCE.call_once(|| {
        let dir = std::env::temp_dir().join(format!("kn-claims-property-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("open.rules"), OPEN_RULES).unwrap();
        std::env::set_var("KN_REPLAY", kn_test_support::cargo_bin("kn-replay"));
        std::env::set_var("KN_ACCESS_RULES", dir.join("open.rules"));
        // SAFETY: written once, inside call_once, before any read.
        unsafe { DIR = Some(dir) };
    });
    // SAFETY: only read after call_once has completed.
    #[allow(static_mut_refs)]
    unsafe {
        DIR.as_deref().unwrap()
    }
}

/// A store with routes, a journal to replay and a stream, and the
/// handler over it.
struct Site {
    _dir: tempfile::TempDir,
    root: PathBuf,
    handler: Handler,
    streams: Streams,
}

impl Site {
    fn new(rules: bool) -> Site {
        let rules_file = environment().join("open.rules");
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("kn_events");
        let mut config = Config::new(&root);
        config.access_rules = rules.then_some(rules_file);
        let store = Arc::new(Store::open_with(config).unwrap());
        let anna = Principal::user("anna");
        let bob = Principal::user("bob");
        let route = |who: &Principal, from: &str, to: &str, id: &str| {
            store.as_user(who).route(&topic(from), to.as_bytes(), Event::from_pairs([("kn_id", id)])).unwrap();
        };
        route(&anna, "/what/chat", "/who/anna/inbox", "r1");
        route(&bob, "/what/announce", "/who/bob/inbox", "r2");
        let journal = topic("/who/anna/kn_journal");
        store.tunnel(&journal, &Selection::none()).unwrap();
        for (i, from) in ["/what/chat", "/what/announce", "/who/anna/notes", "/who/bob/notes"].iter().enumerate() {
            let event = Event::from_pairs([("kn_id", format!("j{i}")), ("kn_payload", format!("from {from}")), ("kn_route_location", format!("{from}/kn_routes/x"))]);
            store.notify(&journal, event).unwrap();
        }
        let streams = Streams::new(Arc::clone(&store));
        let created = handle_stream(&streams, &stream_request("PUT", "anna/notes", vec![], Some("anna")));
        assert!(matches!(created, Outcome::Done(ref r) if r.status == 201), "the stream was not made");
        let handler = Handler::new(store, Options::default());
        Site { _dir: dir, root, handler, streams }
    }

    fn store(&self) -> &Store {
        self.handler.store()
    }

    /// What the store holds that a request could change.
    fn snapshot(&self) -> Snapshot {
        let store = self.store();
        let events = WATCHED
            .iter()
            .map(|t| {
                let ids = store.events(&topic(t), &Selection::all()).map(|s| s.events).unwrap_or_default();
                (t.to_string(), ids.iter().map(|e| String::from_utf8_lossy(e.id().unwrap_or(b"")).into_owned()).collect())
            })
            .collect();
        let mut routes = BTreeMap::new();
        for from in TOPICS {
            for route in store.all_routes(&topic(from)).unwrap_or_default() {
                let active = route.is_active(kn_journal::internal::now());
                let unread_to = route.event.get("kn_unread_to").map(|u| String::from_utf8_lossy(u).into_owned());
                let state = RouteState { to: String::from_utf8_lossy(route.destination()).into_owned(), active, unread_to };
                routes.insert((from.to_string(), String::from_utf8_lossy(route.id()).into_owned()), state);
            }
        }
        let streams = STREAMS.iter().map(|p| (p.to_string(), self.streams.head(p).ok().map(|i| i.next_offset()))).collect();
        Snapshot { events, routes, receipts: receipts_files(&self.root), streams }
    }

    /// Waits for the replays the last request started to end (each holds
    /// a slot file locked while it runs).
    fn replays_done(&self) {
        let slots = self.root.join(".replays");
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let busy = std::fs::read_dir(&slots).into_iter().flatten().flatten().any(|slot| {
                let file = std::fs::File::open(slot.path());
                file.is_ok_and(|f| f.try_lock().is_err())
            });
            if !busy {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("a replay is still running after 30 s");
    }
}

#[derive(Debug, PartialEq)]
struct RouteState {
    to: String,
    active: bool,
    unread_to: Option<String>,
}

#[derive(Debug)]
struct Snapshot {
    events: BTreeMap<String, BTreeSet<String>>,
    routes: BTreeMap<(String, String), RouteState>,
    receipts: BTreeMap<PathBuf, Vec<u8>>,
    streams: BTreeMap<String, Option<String>>,
}

/// Every `.receipts` file under `dir` with its bytes.
fn receipts_files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut found = BTreeMap::new();
    let mut queue = vec![dir.to_path_buf()];
    while let Some(d) = queue.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                queue.push(path);
            } else if path.file_name().is_some_and(|n| n == ".receipts") {
                found.insert(path.clone(), std::fs::read(&path).unwrap_or_default());
            }
        }
    }
    found
}

fn topic(name: &str) -> Topic {
    Topic::parse(name).unwrap()
}

/// The topic of this server a route destination names, if any.
fn local(store: &Store, destination: &str) -> Option<String> {
    match store.resolve(destination.as_bytes()) {
        Ok(kn_journal::internal::Destination::Local(t)) => Some(t.as_str().to_string()),
        _ => None,
    }
}

/// Checks that every change from `before` to `after` is one `claim`
/// allows; `Err` names the first that is not.
fn changes_allowed(store: &Store, claim: &Claim, before: &Snapshot, after: &Snapshot) -> Result<(), String> {
    for (t, ids) in &after.events {
        let new: Vec<_> = ids.difference(&before.events[t]).collect();
        // A new event: posted there (a notify, a replay) or carried by a
        // route made into it (its population).
        if !new.is_empty() && !allows(claim, "post", t) && !allows(claim, "route", t) {
            return Err(format!("events {new:?} appeared in {t}"));
        }
    }
    let absent = RouteState { to: String::new(), active: false, unread_to: None };
    for (key, now) in &after.routes {
        let was = before.routes.get(key).unwrap_or(&absent);
        if now == was {
            continue;
        }
        let (from, id) = key;
        // Removed or replaced: deleting it needs delete on its source or
        // route on its destination.
        if was.active && (!now.active || now.to != was.to) {
            let dest = local(store, &was.to);
            if !allows(claim, "delete", from) && !dest.as_deref().is_some_and(|d| allows(claim, "route", d)) {
                return Err(format!("route {id} of {from} (to {}) was removed", was.to));
            }
        }
        // Made: read on its source, route on its destination, post where it escalates.
        if now.active && (!was.active || now.to != was.to || now.unread_to != was.unread_to) {
            let dest_ok = local(store, &now.to).is_none_or(|d| allows(claim, "route", &d));
            let unread_ok = now.unread_to.as_deref().and_then(|u| local(store, u)).is_none_or(|u| allows(claim, "post", &u));
            if !allows(claim, "read", from) || !dest_ok || !unread_ok {
                return Err(format!("route {id} of {from} to {} (unread to {:?}) was made", now.to, now.unread_to));
            }
        }
    }
    for (path, bytes) in &after.receipts {
        if before.receipts.get(path) != Some(bytes) && !allows(claim, "read", "/who/anna/kn_journal") {
            return Err(format!("{} changed", path.display()));
        }
    }
    for (path, now) in &after.streams {
        let was = &before.streams[path];
        let stream = format!("/v1/stream/{path}");
        if now != was && now.is_some() && !allows(claim, "post", &stream) {
            return Err(format!("stream {path} was written ({was:?} -> {now:?})"));
        }
        if now.is_none() && was.is_some() && !allows(claim, "delete", &stream) {
            return Err(format!("stream {path} was deleted"));
        }
    }
    Ok(())
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// A token of `sub` (`None`: a capability) with `claim`, signed with the
/// store's own key.
fn token(root: &Path, sub: Option<&str>, claim: &Claim) -> String {
    let key = token_key_of_store(root, true).unwrap().unwrap();
    let mut kn: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for &(o, p) in claim {
        kn.entry(OPERATIONS[o]).or_default().push(PATTERNS[p]);
    }
    let mut claims = json!({"exp": now() + 600, "kn": kn});
    if let Some(sub) = sub {
        claims["sub"] = json!(sub);
    }
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("store".to_string());
    jsonwebtoken::encode(&header, &claims, &EncodingKey::from_secret(&key)).unwrap()
}

/// The request headers of `channel`, and the claim the oracle judges it by.
fn credentials(site: &Site, channel: &Channel, claim: &Claim) -> (Vec<(&'static str, String)>, Claim) {
    let elsewhere = |e: Elsewhere, cookie: String| {
        let mut headers = vec![("cookie", cookie)];
        headers.extend(e.headers().into_iter().map(|(k, v)| (k, v.to_string())));
        // A cookie from elsewhere only reads: it may change nothing.
        (headers, Claim::new())
    };
    match channel {
        Channel::Narrowed => (vec![("authorization", format!("Bearer {}", token(&site.root, Some("anna"), claim)))], claim.clone()),
        Channel::Capability => (vec![("authorization", format!("Bearer {}", token(&site.root, None, claim)))], claim.clone()),
        Channel::TokenCookie(e) => elsewhere(*e, format!("kn_token={}", token(&site.root, Some("anna"), claim))),
        Channel::SessionCookie(e) => {
            let (_, session) = site.store().session_key().unwrap().new_session();
            elsewhere(*e, format!("kn_session={session}"))
        }
    }
}

/// The form of `call` (a `kn_batch` entry's, or a request's).
fn form(call: &Call) -> String {
    let enc = |s: &str| s.replace('/', "%2F");
    match call {
        Call::Notify { to } => format!("do_method=notify&kn_to={}&kn_payload=p", enc(TOPICS[*to])),
        Call::Route { from, to, id, unread_to } => {
            let mut f = format!("do_method=route&kn_from={}&kn_to={}&kn_id={}", enc(TOPICS[*from]), enc(TOPICS[*to]), ROUTE_IDS[*id]);
            if let Some(u) = unread_to {
                f.push_str(&format!("&kn_unread_after=60&kn_unread_to={}", enc(TOPICS[*u])));
            }
            f
        }
        Call::Delete { from, id } => format!("do_method=route&kn_from={}&kn_to=&kn_id={}", enc(TOPICS[*from]), ROUTE_IDS[*id]),
        Call::Batch(entries) => {
            let mut f = "do_method=batch".to_string();
            for entry in entries {
                let inner = form(entry).replace('%', "%25").replace('&', "%26").replace('=', "%3D");
                f.push_str(&format!("&kn_batch={inner}"));
            }
            f
        }
        Call::Replay => "do_method=replay&kn_from=%2Fwho%2Fanna%2Fkn_journal&warp=inf".to_string(),
        Call::Ack { checkpoint } => format!("do_method=ack&kn_from=%2Fwho%2Fanna%2Fkn_journal&kn_route_checkpoint={checkpoint}"),
        Call::Session => "do_method=session".to_string(),
        Call::Stream { .. } => String::new(),
    }
}

fn stream_request(method: &str, path: &str, headers: Vec<(&'static str, String)>, user: Option<&str>) -> StreamRequest {
    let mut map = hyper::HeaderMap::new();
    map.insert("host", "127.0.0.1:8080".parse().unwrap());
    map.insert("content-type", "text/plain".parse().unwrap());
    for (k, v) in headers {
        map.insert(hyper::header::HeaderName::from_static(k), v.parse().unwrap());
    }
    let body = if method == "DELETE" { Vec::new() } else { b"bytes".to_vec() };
    StreamRequest { method: method.to_string(), path: path.to_string(), query: String::new(), headers: map, body, url: String::new(), user: user.map(str::to_string) }
}

/// Makes `call` with `headers`; the `Set-Cookie` of its answer, if any.
fn make(site: &Site, call: &Call, headers: Vec<(&'static str, String)>) -> Option<String> {
    if let Call::Stream { method, path } = call {
        let _ = handle_stream(&site.streams, &stream_request(method, STREAMS[*path], headers, None));
        return None;
    }
    let mut vars: Vec<(String, String)> = vec![
        ("REQUEST_METHOD".into(), "GET".into()),
        ("QUERY_STRING".into(), format!("{}&kn_response_format=simple", form(call))),
        ("SCRIPT_NAME".into(), "/kn".into()),
        ("SERVER_NAME".into(), "127.0.0.1".into()),
        ("SERVER_PORT".into(), "8080".into()),
        ("HTTP_HOST".into(), "127.0.0.1:8080".into()),
    ];
    for (k, v) in headers {
        vars.push((format!("HTTP_{}", k.to_ascii_uppercase().replace('-', "_")), v));
    }
    let request = Request::from_cgi_env(vars, &b""[..], &Limits::default()).unwrap();
    let reply = site.handler.handle(&request);
    let Reply::Done(response) = reply else { panic!("{call:?} answered with a tunnel") };
    response.head.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("set-cookie")).map(|(_, v)| v.clone())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn nothing_gets_past_a_tokens_claim_or_a_cookies_channel(rules in any::<bool>(), channel in channel(), claim in claim(), call in call()) {
        let site = Site::new(rules);
        let (headers, mut judged_by) = credentials(&site, &channel, &claim);
        // Streams know no sessions: a kn_session cookie is no credential
        // there, the request is plain anonymous, whom the open rules (or
        // none) allow everything.
        if matches!((&channel, &call), (Channel::SessionCookie(_), Call::Stream { .. })) {
            judged_by = vec![(5, 8)];
        }
        let before = site.snapshot();
        let cookie = make(&site, &call, headers);
        site.replays_done();
        let after = site.snapshot();
        if let Err(why) = changes_allowed(site.store(), &judged_by, &before, &after) {
            return Err(TestCaseError::fail(format!("{channel:?} with claim {claim:?} ({}rules): {call:?}: {why}", if rules { "" } else { "no " })));
        }
        // A page of another site never makes a visitor's session.
        if matches!(channel, Channel::TokenCookie(Elsewhere::CrossSite | Elsewhere::SameSite | Elsewhere::OtherOrigin | Elsewhere::NullOrigin)) {
            prop_assert!(cookie.is_none(), "{call:?} set a cookie: {cookie:?}");
        }
    }
}

/// The property can fail: a claim that allows a change lets the change
/// through, and the oracle sees it (were the handler to ignore the claim,
/// the same comparison would report it).
#[test]
fn the_oracle_sees_what_a_request_changes() {
    let site = Site::new(true);
    let everything: Claim = vec![(5, 8)];
    let (headers, _) = credentials(&site, &Channel::Narrowed, &everything);
    for call in [
        Call::Notify { to: 1 },
        Call::Delete { from: 0, id: 0 },
        Call::Route { from: 2, to: 5, id: 2, unread_to: Some(1) },
        Call::Ack { checkpoint: 2 },
        Call::Replay,
        Call::Stream { method: "POST", path: 0 },
        Call::Stream { method: "DELETE", path: 0 },
    ] {
        let before = site.snapshot();
        make(&site, &call, headers.clone());
        site.replays_done();
        let after = site.snapshot();
        assert!(changes_allowed(site.store(), &everything, &before, &after).is_ok());
        let err = changes_allowed(site.store(), &Claim::new(), &before, &after);
        assert!(err.is_err(), "{call:?} changed nothing the oracle could see");
    }
}
