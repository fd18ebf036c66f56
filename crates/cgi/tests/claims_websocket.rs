//! The claims property of issue 37 on the WebSocket door (brief A3): a
//! socket's requests are made by the same handler as a form request, as
//! the principal the upgrade was made by (crates/cgi/src/websocket/mod.rs),
//! but that entry is crate-private, so each message kind (notify, route,
//! route deletion, batch in a frame) is driven here over a real socket of
//! `pubsub-cgi serve` by the independent client (Python's `websockets`,
//! tests/websocket/ws_client.py), with anna's token narrowed to her own
//! topics in the upgrade's `Authorization` header. Every request that
//! leaves the claim (bob's topics as source, destination, escalation or
//! `kn_status_to`; a remote or push destination from a source the claim
//! does not read) is refused and the store holds none of it, while the
//! same kind of request inside the claim is done (so each test can fail).
//! Without a rules file, so that only the claim narrows.

#[path = "websocket/common.rs"]
mod common;

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use common::*;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use kn_journal::access::{token_key_of_store, Principal};
use kn_journal::{Event, Selection, Store, Topic};
use kn_test_support::Dir;
use serde_json::{json, Value};

const JOURNAL: &str = "/who/anna/kn_journal";

/// Where `KN_OUTBOUND` lets routes go: loopback, port 9, where nothing
/// listens (nothing is sent beyond loopback).
const REMOTE: &str = "http://127.0.0.1:9/kn/what/loot";

/// A push subscription whose endpoint is outside `KN_OUTBOUND`'s prefix
/// (and no push sender is configured): refused whoever asks.
fn push_destination() -> String {
    let json = json!({"endpoint": "https://push.example/x", "keys": {
        "p256dh": "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4",
        "auth": "BTBZMqHH6r4Tts7J_aSIgg"}});
    format!("webpush:{}", URL_SAFE_NO_PAD.encode(json.to_string()))
}

/// anna's token whose claim is her own topics only, signed with the
/// store's key.
fn narrowed_token(root: &Path) -> String {
    let key = token_key_of_store(root, true).unwrap().unwrap();
    let exp = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() + 600;
    let own = ["/who/anna/**"];
    let claims = json!({"sub": "anna", "exp": exp, "kn": {"post": own, "read": own, "route": own, "delete": own}});
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("store".to_string());
    jsonwebtoken::encode(&header, &claims, &EncodingKey::from_secret(&key)).unwrap()
}

/// A store where bob routes his notes to his inbox (route `bob-r`), and
/// `serve` over it allowing [`REMOTE`]'s prefix outbound.
struct Site {
    _dir: Dir,
    root: std::path::PathBuf,
    serve: kn_test_support::Serve,
}

impl Site {
    fn new(name: &str) -> Site {
        let dir = Dir::new(name);
        let root = dir.join("kn_events");
        {
            let store = Store::open(&root).unwrap();
            let bob = Principal::user("bob");
            store.as_user(&bob).route(&topic("/who/bob/notes"), b"/who/bob/inbox", Event::from_pairs([("kn_id", "bob-r")])).unwrap();
        }
        let serve = serve(&root, &[], &[("KN_OUTBOUND", "http://127.0.0.1:9/")]);
        Site { _dir: dir, root, serve }
    }

    /// Sends `frames` on a socket opened with the narrowed token; the
    /// answers, by `kn_in_reply_to`.
    fn send(&self, frames: &[String]) -> Vec<Value> {
        let auth = format!("Authorization: Bearer {}", narrowed_token(&self.root));
        let mut args = vec!["--protocol", "kn", "--header", auth.as_str()];
        for f in frames {
            args.extend(["--send", f.as_str()]);
        }
        args.extend(["--until", "\"kn_in_reply_to\":\"last\""]);
        let lines = Client::run(&socket_url(&self.serve, JOURNAL, ""), &args);
        assert_eq!(lines[0]["open"], true, "the socket was not opened: {lines:?}");
        common::frames(&lines)
    }

    fn store(&self) -> Store {
        Store::open(&self.root).unwrap()
    }

    fn payloads(&self, name: &str) -> Vec<String> {
        let events = self.store().events(&topic(name), &Selection::all()).map(|s| s.events).unwrap_or_default();
        events.iter().filter_map(|e| e.get_str("kn_payload").map(|p| p.to_string())).collect()
    }

    /// `(id, destination)` of the active routes of `from`.
    fn routes(&self, from: &str) -> Vec<(String, String)> {
        let routes = self.store().routes(&topic(from)).unwrap_or_default();
        routes.iter().map(|r| (String::from_utf8_lossy(r.id()).into_owned(), String::from_utf8_lossy(r.destination()).into_owned())).collect()
    }
}

fn topic(name: &str) -> Topic {
    Topic::parse(name).unwrap()
}

/// The status of the answer to `kn_id`.
fn status(frames: &[Value], kn_id: &str) -> String {
    let answers = answer_to(frames, kn_id);
    let first = answers.first().unwrap_or_else(|| panic!("no answer to {kn_id}: {frames:?}"));
    first["status"].as_str().unwrap_or_default().to_string()
}

/// The last frame sent, whose answer ends the client.
fn last() -> String {
    request(&[("do_method", "notify"), ("kn_to", "/who/anna/notes"), ("kn_payload", "last"), ("kn_id", "last")])
}

#[test]
fn a_notify_on_a_socket_stays_inside_the_claim() {
    if !websockets_available() {
        return;
    }
    let site = Site::new("claims-ws-notify");
    let frames = site.send(&[
        request(&[("do_method", "notify"), ("kn_to", "/who/bob/notes"), ("kn_payload", "forged"), ("kn_id", "n1")]),
        request(&[("do_method", "notify"), ("kn_to", "/who/anna/notes"), ("kn_payload", "status-elsewhere"), ("kn_status_to", "/who/bob/notes"), ("kn_id", "n2")]),
        request(&[("do_method", "notify"), ("kn_to", "/who/anna/notes"), ("kn_payload", "own"), ("kn_id", "n3")]),
        last(),
    ]);
    assert!(status(&frames, "n1").starts_with("403"), "{frames:?}");
    assert!(status(&frames, "n2").starts_with("403"), "{frames:?}");
    assert!(status(&frames, "n3").starts_with("200"), "{frames:?}");
    assert!(site.payloads("/who/bob/notes").is_empty(), "{:?}", site.payloads("/who/bob/notes"));
    assert_eq!(site.payloads("/who/anna/notes"), ["own", "last"]);
}

#[test]
fn a_route_on_a_socket_stays_inside_the_claim_whatever_its_destination() {
    if !websockets_available() {
        return;
    }
    let site = Site::new("claims-ws-route");
    let route = |id: &str, from: &str, to: &str, extra: &[(&str, &str)]| {
        let mut pairs = vec![("do_method", "route"), ("kn_from", from), ("kn_to", to), ("kn_id", id)];
        pairs.extend(extra.iter().copied());
        request(&pairs)
    };
    let push = push_destination();
    let frames = site.send(&[
        route("r-local", "/who/bob/notes", JOURNAL, &[]),
        route("r-remote", "/who/bob/notes", REMOTE, &[]),
        route("r-push", "/who/bob/notes", &push, &[]),
        route("r-into", "/who/anna/notes", "/who/bob/inbox", &[]),
        route("r-unread", "/who/anna/notes", JOURNAL, &[("kn_unread_after", "60"), ("kn_unread_to", "/who/bob/notes")]),
        route("r-status", "/who/anna/notes", JOURNAL, &[("kn_status_to", "/who/bob/notes")]),
        // Inside the claim: a remote destination needs only read on its source.
        route("r-own", "/who/anna/notes", REMOTE, &[]),
        last(),
    ]);
    for id in ["r-local", "r-remote", "r-push", "r-into", "r-unread", "r-status"] {
        assert!(status(&frames, id).starts_with("403"), "{id}: {frames:?}");
    }
    assert!(status(&frames, "r-own").starts_with("200"), "{frames:?}");
    assert_eq!(site.routes("/who/bob/notes"), [("bob-r".to_string(), "http://localhost/kn/who/bob/inbox".to_string())]);
    assert_eq!(site.routes("/who/anna/notes"), [("r-own".to_string(), REMOTE.to_string())]);
    assert!(site.payloads("/who/bob/notes").is_empty(), "{:?}", site.payloads("/who/bob/notes"));
}

#[test]
fn a_route_deletion_on_a_socket_stays_inside_the_claim() {
    if !websockets_available() {
        return;
    }
    let site = Site::new("claims-ws-delete");
    let frames = site.send(&[
        request(&[("do_method", "route"), ("kn_from", "/who/bob/notes"), ("kn_to", ""), ("kn_id", "bob-r")]),
        request(&[("do_method", "route"), ("kn_from", "/who/anna/notes"), ("kn_to", JOURNAL), ("kn_id", "mine")]),
        request(&[("do_method", "route"), ("kn_from", "/who/anna/notes"), ("kn_to", ""), ("kn_id", "mine")]),
        last(),
    ]);
    assert!(status(&frames, "bob-r").starts_with("403"), "{frames:?}");
    assert!(status(&frames, "mine").starts_with("200"), "{frames:?}");
    assert_eq!(site.routes("/who/bob/notes"), [("bob-r".to_string(), "http://localhost/kn/who/bob/inbox".to_string())]);
    assert!(site.routes("/who/anna/notes").is_empty(), "{:?}", site.routes("/who/anna/notes"));
}

#[test]
fn a_batch_in_a_frame_stays_inside_the_claim() {
    if !websockets_available() {
        return;
    }
    let site = Site::new("claims-ws-batch");
    let entry = |pairs: &[(&str, &str)]| form_urlencoded(pairs);
    // A form frame: a JSON object cannot repeat kn_batch.
    let batch = form_urlencoded(&[
        ("do_method", "batch"),
        ("kn_id", "b1"),
        ("kn_batch", &entry(&[("do_method", "notify"), ("kn_to", "/who/bob/notes"), ("kn_payload", "forged")])),
        ("kn_batch", &entry(&[("do_method", "route"), ("kn_from", "/who/bob/notes"), ("kn_to", REMOTE), ("kn_id", "exfil")])),
        ("kn_batch", &entry(&[("do_method", "route"), ("kn_from", "/who/bob/notes"), ("kn_to", ""), ("kn_id", "bob-r")])),
        ("kn_batch", &entry(&[("do_method", "notify"), ("kn_to", "/who/anna/notes"), ("kn_payload", "own")])),
    ]);
    let frames = site.send(&[batch, last()]);
    assert!(!answer_to(&frames, "b1").is_empty(), "the batch was not answered: {frames:?}");
    assert!(site.payloads("/who/bob/notes").is_empty(), "{:?}", site.payloads("/who/bob/notes"));
    assert_eq!(site.routes("/who/bob/notes"), [("bob-r".to_string(), "http://localhost/kn/who/bob/inbox".to_string())]);
    assert_eq!(site.payloads("/who/anna/notes"), ["own", "last"], "the entry inside the claim was done");
}

/// A form of `pairs`, percent-encoded.
fn form_urlencoded(pairs: &[(&str, &str)]) -> String {
    let enc = |s: &str| percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string();
    pairs.iter().map(|(k, v)| format!("{}={}", enc(k), enc(v))).collect::<Vec<_>>().join("&")
}
