//! The store, generators and oracle of claims_property_wide.rs: a store
//! with routes, a journal, plain, bound and bob's streams, and a Web Push
//! sender whose endpoints may only be on loopback; the requests made
//! through the real handler; and the model of docs/ACCESS.md that judges
//! what changed, written here independently of the access layer.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use kn_cgi::handler::{Handler, Options, Reply};
use kn_cgi::streams::{handle as handle_stream, Outcome, StreamRequest};
use kn_cgi::{Limits, Request};
use kn_journal::access::{token_key_of_store, Principal};
use kn_journal::{Config, Event, HttpRemote, OutboundPolicy, Selection, Store, Topic};
use kn_push::{PushPolicy, PushRemote, PushSettings, Sender};
use kn_streams::Streams;
use proptest::prelude::*;
use serde_json::json;

/// The topics the generated requests name.
pub const TOPICS: [&str; 6] = ["/what/chat", "/what/announce", "/who/anna/notes", "/who/anna/inbox", "/who/bob/notes", "/who/anna/kn_journal"];

/// The topics whose events are compared (the inbox receives what the
/// routes made beforehand forward, which the requests may cause).
const WATCHED: [&str; 5] = ["/what/chat", "/what/announce", "/who/anna/notes", "/who/bob/notes", "/who/anna/kn_journal"];

/// The prefix `KN_OUTBOUND` allows when outbound requests are allowed:
/// loopback, port 9 (discard), where nothing listens.
const ALLOWED_PREFIX: &str = "http://127.0.0.1:9/";

/// Destinations after the topics: index of a remote URL under
/// [`ALLOWED_PREFIX`], of one outside it, and of a push subscription.
pub const REMOTE_ALLOWED: usize = TOPICS.len();
pub const REMOTE_OUTSIDE: usize = TOPICS.len() + 1;
pub const PUSH: usize = TOPICS.len() + 2;
const DESTINATIONS: usize = TOPICS.len() + 3;

/// A push subscription on loopback (the P-256 key and auth secret of
/// kn_push::Subscription's documentation).
pub fn push_destination() -> String {
    let json = json!({"endpoint": "http://127.0.0.1:9/push", "keys": {
        "p256dh": "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4",
        "auth": "BTBZMqHH6r4Tts7J_aSIgg"}});
    format!("webpush:{}", URL_SAFE_NO_PAD.encode(json.to_string()))
}

/// Destination `i`: a topic, a remote URL or a push subscription.
pub fn destination(i: usize) -> String {
    match i {
        REMOTE_ALLOWED => format!("{ALLOWED_PREFIX}kn/what/loot"),
        REMOTE_OUTSIDE => "http://attacker.example/kn/what/loot".to_string(),
        PUSH => push_destination(),
        _ => TOPICS[i].to_string(),
    }
}

/// The claim patterns generated.
pub const PATTERNS: [&str; 11] = [
    "/what/chat",
    "/what/announce",
    "/who/anna/notes",
    "/who/anna/kn_journal",
    "/who/anna/**",
    "/what/**",
    "/v1/stream/anna/**",
    "/v1/stream/**",
    "/who/bob/notes",
    "/v1/stream/bob/**",
    "/**",
];

const OPERATIONS: [&str; 6] = ["post", "read", "route", "delete", "replay", "all"];

/// The stream paths generated: "anna/notes" exists beforehand, and
/// without a rules file "anna/bound", bound to bob's notes.
pub const STREAMS: [&str; 5] = ["anna/notes", "anna/new", "bob/x", "anna/bound", "anna/fork"];

/// The streams a fork is made of: bob's (outside anna's claims) and anna's.
const SOURCES: [&str; 2] = ["bob/secret", "anna/notes"];

/// Every stream compared.
const ALL_STREAMS: [&str; 6] = ["anna/notes", "anna/new", "bob/x", "anna/bound", "anna/fork", "bob/secret"];

/// Rules that allow everyone everything: only claims and channels narrow.
const OPEN_RULES: &str = "allow all /** *\n";

/// A claim: pairs of an index in [`OPERATIONS`] and one in [`PATTERNS`].
pub type Claim = Vec<(usize, usize)>;

/// What allows everything.
fn everything() -> Claim {
    vec![(5, PATTERNS.len() - 1)]
}

/// A claim as a token would carry it.
pub fn show(claim: &Claim) -> String {
    let pairs: Vec<String> = claim.iter().map(|&(o, p)| format!("{} {}", OPERATIONS[o], PATTERNS[p])).collect();
    format!("[{}]", pairs.join(", "))
}

/// Whether `claim` allows `op` on `topic` (a topic's `kn_routes` counts
/// as the topic): the oracle, independent of the access layer.
pub fn allows(claim: &Claim, op: &str, topic: &str) -> bool {
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
pub enum Channel {
    /// anna's token narrowed by the claim, in the `Authorization` header.
    Narrowed,
    /// A token without `sub`, exactly the claim.
    Capability,
    /// anna's token in the `kn_token` cookie, from elsewhere.
    TokenCookie(Elsewhere),
    /// An anonymous visitor's `kn_session` cookie, from elsewhere.
    SessionCookie(Elsewhere),
}

/// How a request shows it is from another site (or does not say).
#[derive(Clone, Copy, Debug)]
pub enum Elsewhere {
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

/// One request. Topic fields index [`TOPICS`]; destination fields
/// (`to` of a route, `unread_to`, `status_to`) [`destination`].
#[derive(Clone, Debug)]
pub enum Call {
    Notify { to: usize, status_to: Option<usize> },
    Route { from: usize, to: usize, id: usize, unread_to: Option<usize>, status_to: Option<usize> },
    Delete { from: usize, id: usize },
    Batch(Vec<Call>),
    Replay,
    Ack { checkpoint: u8 },
    Session,
    /// `kn_topic` indexes [`TOPICS`], `forked_from` [`SOURCES`]; both
    /// are sent with a `PUT` only.
    Stream { method: &'static str, path: usize, kn_topic: Option<usize>, forked_from: Option<usize> },
}

const ROUTE_IDS: [&str; 3] = ["r1", "r2", "fresh"];

/// A destination, as likely elsewhere as here.
fn dest() -> impl Strategy<Value = usize> + Clone {
    prop_oneof![0..TOPICS.len(), TOPICS.len()..DESTINATIONS]
}

fn single() -> impl Strategy<Value = Call> {
    let t = 0..TOPICS.len();
    let elsewhere = proptest::option::weighted(0.3, dest());
    prop_oneof![
        2 => (t.clone(), elsewhere.clone()).prop_map(|(to, status_to)| Call::Notify { to, status_to }),
        4 => (t.clone(), dest(), 0..ROUTE_IDS.len(), elsewhere.clone(), elsewhere)
            .prop_map(|(from, to, id, unread_to, status_to)| Call::Route { from, to, id, unread_to, status_to }),
        1 => (t, 0..ROUTE_IDS.len()).prop_map(|(from, id)| Call::Delete { from, id }),
        1 => Just(Call::Replay),
    ]
}

fn stream_call() -> impl Strategy<Value = Call> {
    let method = prop_oneof![Just("PUT"), Just("POST"), Just("DELETE"), Just("GET")];
    (method, 0..STREAMS.len(), proptest::option::of(0..TOPICS.len()), proptest::option::weighted(0.3, 0..SOURCES.len()))
        .prop_map(|(method, path, kn_topic, forked_from)| Call::Stream { method, path, kn_topic, forked_from })
}

pub fn call() -> impl Strategy<Value = Call> {
    prop_oneof![
        3 => single(),
        1 => proptest::collection::vec(single(), 1..4).prop_map(Call::Batch),
        1 => (1u8..4).prop_map(|checkpoint| Call::Ack { checkpoint }),
        1 => Just(Call::Session),
        4 => stream_call(),
    ]
}

pub fn channel() -> impl Strategy<Value = Channel> {
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

pub fn claim() -> impl Strategy<Value = Claim> {
    proptest::collection::vec((0..OPERATIONS.len(), 0..PATTERNS.len()), 0..5)
}

/// The environment every test of this file shares, set once before any
/// process is started: the real kn-replay, and the rules file it reads
/// (the open rules, the same verdicts as none).
fn environment() -> &'static Path {
    static ONCE: Once = Once::new();
    static mut DIR: Option<PathBuf> = None;
    ONCE.call_once(|| {
        let dir = std::env::temp_dir().join(format!("kn-claims-wide-{}", std::process::id()));
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

/// A store with routes, a journal to replay, streams, a push sender, and
/// the handler over it.
pub struct Site {
    _dir: tempfile::TempDir,
    root: PathBuf,
    handler: Handler,
    streams: Streams,
    /// A rules file is in force (the bridge is off).
    pub rules: bool,
    /// `KN_OUTBOUND` allows [`ALLOWED_PREFIX`] (else it denies every URL).
    pub outbound: bool,
}

impl Site {
    pub fn new(rules: bool, outbound: bool) -> Site {
        let rules_file = environment().join("open.rules");
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("kn_events");
        let mut config = Config::new(&root);
        config.access_rules = rules.then_some(rules_file);
        config.outbound = if outbound { OutboundPolicy::AllowPrefixes(vec![ALLOWED_PREFIX.to_string()]) } else { OutboundPolicy::DenyAll };
        config.remote_connect_timeout = Duration::from_secs(2);
        config.remote_timeout = Duration::from_secs(2);
        let store = Store::open_with(config.clone()).unwrap();
        // Push endpoints on loopback only (the policy's test setting).
        let settings = PushSettings { contact: "mailto:ops@example.org".into(), policy: PushPolicy::default().allowing_loopback_for_tests(), test_loopback: true };
        let sender = Sender::open(&root, &config, settings).unwrap();
        let store = Arc::new(store.with_remote(Arc::new(PushRemote::new(Arc::new(HttpRemote::from_config(&config)), sender))));
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
        let made = |method: &str, path: &str, extra: Vec<(&'static str, String)>, user: &str| {
            let answer = handle_stream(&streams, &stream_request(method, path, extra, Some(user)));
            assert!(matches!(answer, Outcome::Done(ref r) if (200..300).contains(&r.status)), "{method} {path} was refused");
        };
        made("PUT", "anna/notes", vec![], "anna");
        made("PUT", "bob/secret", vec![], "bob");
        made("POST", "bob/secret", vec![], "bob");
        if !rules {
            // The bridge is on only without a rules file.
            made("PUT", "anna/bound", vec![("kn-topic", "/who/bob/notes".to_string())], "anna");
        }
        let handler = Handler::new(store, Options::default());
        Site { _dir: dir, root, handler, streams, rules, outbound }
    }

    pub fn store(&self) -> &Store {
        self.handler.store()
    }

    /// What the store holds that a request could change.
    pub fn snapshot(&self) -> Snapshot {
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
        let streams = ALL_STREAMS
            .iter()
            .map(|p| (p.to_string(), self.streams.head(p).ok().map(|i| StreamState { offset: i.next_offset(), topic: i.topic })))
            .collect();
        let outbox = store.outbox_pending().unwrap_or(u64::MAX);
        Snapshot { events, routes, receipts: receipts_files(&self.root), streams, outbox }
    }

    /// Waits for the replays the last request started to end (each holds
    /// a slot file locked while it runs).
    pub fn replays_done(&self) {
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
pub struct RouteState {
    to: String,
    active: bool,
    unread_to: Option<String>,
}

#[derive(Debug, PartialEq)]
pub struct StreamState {
    offset: String,
    topic: Option<String>,
}

#[derive(Debug)]
pub struct Snapshot {
    events: BTreeMap<String, BTreeSet<String>>,
    routes: BTreeMap<(String, String), RouteState>,
    receipts: BTreeMap<PathBuf, Vec<u8>>,
    streams: BTreeMap<String, Option<StreamState>>,
    outbox: u64,
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

/// The claims a request is judged by: what it may change, and what it
/// may read (a cookie from elsewhere reads as its credential does, and
/// changes nothing).
#[derive(Clone, Debug, PartialEq)]
pub struct Judged {
    pub change: Claim,
    pub read: Claim,
}

/// Whether `KN_OUTBOUND` lets a route (or an escalation) go to the
/// destination `to` that is no topic of this server: the model of the
/// site's setting.
fn outbound_allows(site: &Site, to: &str) -> bool {
    site.outbound && (to.starts_with(ALLOWED_PREFIX) || to == push_destination())
}

/// Checks that every change from `before` to `after` is one `judged`
/// allows; `Err` names the first that is not.
pub fn changes_allowed(site: &Site, judged: &Judged, before: &Snapshot, after: &Snapshot) -> Result<(), String> {
    let store = site.store();
    let claim = &judged.change;
    for (t, ids) in &after.events {
        let new: Vec<_> = ids.difference(&before.events[t]).collect();
        // A new event: posted there (a notify, a replay, a status event,
        // an append through the bridge) or carried by a route made into
        // it (its population).
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
        // Made: read on its source, route on a local destination (a remote
        // or push one: KN_OUTBOUND), post where it escalates.
        if now.active && (!was.active || now.to != was.to || now.unread_to != was.unread_to) {
            let dest_ok = match local(store, &now.to) {
                Some(d) => allows(claim, "route", &d),
                None => outbound_allows(site, &now.to),
            };
            let unread_ok = match now.unread_to.as_deref() {
                None => true,
                Some(u) => match local(store, u) {
                    Some(u) => allows(claim, "post", &u),
                    None => outbound_allows(site, u),
                },
            };
            if !allows(claim, "read", from) || !dest_ok || !unread_ok {
                return Err(format!("route {id} of {from} to {} (unread to {:?}) was made", now.to, now.unread_to));
            }
        }
    }
    // The outbox holds deliveries along remote routes, of which the store
    // had none: it can only grow by a route this request made.
    if after.outbox > before.outbox && after.routes == before.routes {
        return Err(format!("the outbox grew from {} to {} with no route made", before.outbox, after.outbox));
    }
    for (path, bytes) in &after.receipts {
        if before.receipts.get(path) != Some(bytes) && !allows(claim, "read", "/who/anna/kn_journal") {
            return Err(format!("{} changed", path.display()));
        }
    }
    for (path, now) in &after.streams {
        let was = &before.streams[path];
        let stream = format!("/v1/stream/{path}");
        let Some(now) = now else {
            if was.is_some() && !allows(claim, "delete", &stream) {
                return Err(format!("stream {path} was deleted"));
            }
            continue;
        };
        let was_topic = was.as_ref().and_then(|w| w.topic.clone());
        // A binding made: the stream's post, and the topic's read and
        // post (the stream imports the one and posts to the other); none
        // while a rules file is in force.
        if let Some(t) = now.topic.as_deref().filter(|t| was_topic.as_deref() != Some(*t)) {
            if site.rules || !allows(claim, "post", &stream) || !allows(claim, "read", t) || !allows(claim, "post", t) {
                return Err(format!("stream {path} was bound to {t}"));
            }
        }
        // Written (a bound stream also grows by what it imports when the
        // snapshot reads it; what it posts is judged in its topic).
        let written = was.as_ref().is_none_or(|w| w.offset != now.offset);
        if written && now.topic.is_none() && !allows(claim, "post", &stream) {
            return Err(format!("stream {path} was written ({was:?} -> {now:?})"));
        }
    }
    Ok(())
}

/// What a request was answered: its status, and the `Set-Cookie` of an
/// answer of `/kn`.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    pub status: u16,
    pub cookie: Option<String>,
}

/// Checks that a stream request was answered `2xx` only where the model
/// of docs/ACCESS.md ("Durable Streams") allows it (a read through the
/// bridge leaves nothing to compare but its answer).
pub fn answer_allowed(site: &Site, judged: &Judged, before: &Snapshot, call: &Call, answer: &Answer) -> Result<(), String> {
    let Call::Stream { method, path, kn_topic, forked_from } = call else { return Ok(()) };
    if !(200..300).contains(&answer.status) {
        return Ok(());
    }
    let path = STREAMS[*path];
    let stream = format!("/v1/stream/{path}");
    let bound = match (*method, kn_topic) {
        ("PUT", Some(t)) => Some(TOPICS[*t].to_string()),
        _ => before.streams[path].as_ref().and_then(|s| s.topic.clone()),
    };
    // The bridge is off under rules: a bound stream neither imports nor posts.
    let bridge = bound.filter(|_| !site.rules);
    let (change, read) = (&judged.change, &judged.read);
    let needs: Vec<(&Claim, &str, String)> = match *method {
        "PUT" => {
            let mut n = vec![(change, "post", stream)];
            if let Some(s) = forked_from {
                n.push((change, "read", format!("/v1/stream/{}", SOURCES[*s])));
            }
            if let Some(t) = bridge {
                n.push((change, "read", t.clone()));
                n.push((change, "post", t));
            }
            n
        }
        "POST" => {
            let mut n = vec![(change, "post", stream)];
            n.extend(bridge.map(|t| (change, "post", t)));
            n
        }
        "DELETE" => vec![(change, "delete", stream)],
        _ => {
            let mut n = vec![(read, "read", stream)];
            n.extend(bridge.map(|t| (read, "read", t)));
            n
        }
    };
    match needs.iter().find(|(claim, op, t)| !allows(claim, op, t)) {
        Some((_, op, t)) => Err(format!("answered {} without {op} on {t}", answer.status)),
        None => Ok(()),
    }
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

/// The request headers of `channel`, and the claims the oracle judges
/// `call` by.
pub fn credentials(site: &Site, channel: &Channel, claim: &Claim, call: &Call) -> (Vec<(&'static str, String)>, Judged) {
    let elsewhere = |e: Elsewhere, cookie: String, read: Claim| {
        let mut headers = vec![("cookie", cookie)];
        headers.extend(e.headers().into_iter().map(|(k, v)| (k, v.to_string())));
        // A cookie from elsewhere only reads: it may change nothing.
        (headers, Judged { change: Claim::new(), read })
    };
    let plain = |claim: &Claim| Judged { change: claim.clone(), read: claim.clone() };
    match channel {
        Channel::Narrowed => (vec![("authorization", format!("Bearer {}", token(&site.root, Some("anna"), claim)))], plain(claim)),
        Channel::Capability => (vec![("authorization", format!("Bearer {}", token(&site.root, None, claim)))], plain(claim)),
        Channel::TokenCookie(e) => elsewhere(*e, format!("kn_token={}", token(&site.root, Some("anna"), claim)), claim.clone()),
        Channel::SessionCookie(e) => {
            let (_, session) = site.store().session_key().unwrap().new_session();
            let (headers, judged) = elsewhere(*e, format!("kn_session={session}"), everything());
            // Streams know no sessions: a kn_session cookie is no
            // credential there, the request is plain anonymous, whom the
            // open rules (or none) allow everything.
            match call {
                Call::Stream { .. } => (headers, plain(&everything())),
                _ => (headers, judged),
            }
        }
    }
}

/// The form of `call` (a `kn_batch` entry's, or a request's).
fn form(call: &Call) -> String {
    let enc = |s: &str| percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string();
    let status = |s: &Option<usize>| s.map(|s| format!("&kn_status_to={}", enc(&destination(s)))).unwrap_or_default();
    match call {
        Call::Notify { to, status_to } => format!("do_method=notify&kn_to={}&kn_payload=p{}", enc(TOPICS[*to]), status(status_to)),
        Call::Route { from, to, id, unread_to, status_to } => {
            let mut f = format!("do_method=route&kn_from={}&kn_to={}&kn_id={}{}", enc(TOPICS[*from]), enc(&destination(*to)), ROUTE_IDS[*id], status(status_to));
            if let Some(u) = unread_to {
                f.push_str(&format!("&kn_unread_after=60&kn_unread_to={}", enc(&destination(*u))));
            }
            f
        }
        Call::Delete { from, id } => format!("do_method=route&kn_from={}&kn_to=&kn_id={}", enc(TOPICS[*from]), ROUTE_IDS[*id]),
        Call::Batch(entries) => {
            let mut f = "do_method=batch".to_string();
            for entry in entries {
                f.push_str(&format!("&kn_batch={}", enc(&form(entry))));
            }
            f
        }
        Call::Replay => "do_method=replay&kn_from=%2Fwho%2Fanna%2Fkn_journal&warp=inf".to_string(),
        Call::Ack { checkpoint } => format!("do_method=ack&kn_from=%2Fwho%2Fanna%2Fkn_journal&kn_route_checkpoint={checkpoint}"),
        Call::Session => "do_method=session".to_string(),
        Call::Stream { .. } => String::new(),
    }
}

/// A stream request of JSON (a bound stream must be JSON; a `POST`
/// carries an event's elements, which an append through the bridge posts).
fn stream_request(method: &str, path: &str, headers: Vec<(&'static str, String)>, user: Option<&str>) -> StreamRequest {
    let mut map = hyper::HeaderMap::new();
    map.insert("host", "127.0.0.1:8080".parse().unwrap());
    map.insert("content-type", "application/json".parse().unwrap());
    for (k, v) in headers {
        map.insert(hyper::header::HeaderName::from_static(k), v.parse().unwrap());
    }
    let body = if method == "POST" { br#"{"kn_payload":"forged","kn_id":"appended"}"#.to_vec() } else { Vec::new() };
    let query = if method == "GET" { "offset=-1".to_string() } else { String::new() };
    StreamRequest { method: method.to_string(), path: path.to_string(), query, headers: map, body, url: String::new(), user: user.map(str::to_string) }
}

/// Makes `call` with `headers`.
pub fn make(site: &Site, call: &Call, mut headers: Vec<(&'static str, String)>) -> Answer {
    if let Call::Stream { method, path, kn_topic, forked_from } = call {
        if *method == "PUT" {
            headers.extend(kn_topic.map(|t| ("kn-topic", TOPICS[t].to_string())));
            headers.extend(forked_from.map(|s| ("stream-forked-from", SOURCES[s].to_string())));
        }
        let status = match handle_stream(&site.streams, &stream_request(method, STREAMS[*path], headers, None)) {
            Outcome::Done(r) => r.status,
            // A read that waits or streams was allowed to read.
            Outcome::Wait(_) | Outcome::Sse(_) => 200,
        };
        return Answer { status, cookie: None };
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
    let Reply::Done(response) = site.handler.handle(&request) else { panic!("{call:?} answered with a tunnel") };
    let status = response.head.code();
    let cookie = response.head.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("set-cookie")).map(|(_, v)| v.clone());
    Answer { status, cookie }
}
