//! Routes made with a bearer token (docs/ACCESS.md, "Bearer tokens",
//! Lifetime): they carry the token's rights (its groups and `kn` claim,
//! recorded in `kn_route_grant`) and expire with it, unless the rules
//! alone let the token's user make them; what a request or a record
//! claims there by itself gains nothing.

mod common;
use common::RulesFixture as Fixture;

use std::time::Duration;

use kn_journal::access::{Principal, TokenClaims, KN_ROUTE_CREATOR, KN_ROUTE_GRANT};
use kn_journal::{ErrorKind, Event, Selection, Store, Topic};

const RULES: &str = "\
allow all            /who/{user}/**   users
allow read,route     /what/staff/**   @staff
allow read           /what/public/**  *
";


fn now() -> u64 {
    std::time::UNIX_EPOCH.elapsed().unwrap().as_secs()
}

fn topic(name: &str) -> Topic {
    Topic::parse(name).unwrap()
}

fn event(id: &str, payload: &str) -> Event {
    Event::from_pairs([("kn_id", id), ("kn_payload", payload)])
}

fn payloads(store: &Store, t: &Topic) -> Vec<String> {
    store.events(t, &Selection::all()).map(|s| s.events).unwrap_or_default().iter().map(|e| String::from_utf8_lossy(e.payload()).into_owned()).collect()
}

/// The principal of a verified token of `claims` (JSON).
fn token(claims: &str) -> Principal {
    let claims: TokenClaims = serde_json::from_str(claims).unwrap();
    Principal::from_token(&claims).unwrap()
}

fn route_of(store: &Store, from: &Topic, id: &str) -> Event {
    store.all_routes(from).unwrap().into_iter().find(|r| r.id() == id.as_bytes()).unwrap().event
}

#[test]
fn a_route_whose_right_comes_from_the_tokens_group_delivers_until_the_token_expires() {
    let f = Fixture::new(RULES);
    let store = f.store();
    let plans = topic("/what/staff/plans");
    let inbox = topic("/who/carl/inbox");
    // carl is staff by his token only.
    let exp = now() + 3;
    let carl = token(&format!(r#"{{"sub":"carl","groups":["staff"],"exp":{exp}}}"#));
    store.as_user(&carl).route(&plans, b"/who/carl/inbox", Event::from_pairs([("kn_id", "r1")])).unwrap();
    let route = route_of(&store, &plans, "r1");
    assert_eq!(route.get(KN_ROUTE_GRANT), Some(&b"@staff"[..]));
    assert_eq!(route.get(KN_ROUTE_CREATOR), Some(&b"carl"[..]));
    assert_eq!(route.get("kn_expires"), Some(exp.to_string().as_bytes()));
    // A new process (the rules read afresh) delivers with the token's group.
    let store = f.store();
    let report = store.notify(&plans, event("e1", "while the token lives")).unwrap();
    assert!(report.poisoned.is_empty(), "{:?}", report.poisoned);
    assert_eq!(payloads(&store, &inbox), ["while the token lives"]);
    // Past the token's exp, the route is gone, and carl's own rights give
    // nothing.
    while now() <= exp {
        std::thread::sleep(Duration::from_millis(100));
    }
    let store = f.store();
    store.notify(&plans, event("e2", "after the token")).unwrap();
    assert_eq!(payloads(&store, &inbox), ["while the token lives"]);
    assert!(store.routes(&plans).unwrap().iter().all(|r| r.id() != b"r1"));
}

#[test]
fn a_token_claim_narrows_the_route_it_makes() {
    let f = Fixture::new("allow all /who/{user}/** users\nallow read,route /what/** @staff\n");
    let store = f.store();
    let exp = now() + 600;
    let carl = token(&format!(r#"{{"sub":"carl","groups":["staff"],"exp":{exp},"kn":{{"read":["/what/staff/**"],"route":["/who/carl/**"]}}}}"#));
    let carl = store.as_user(&carl);
    // The group would let him read /what/other; the claim does not.
    let err = carl.route(&topic("/what/other"), b"/who/carl/inbox", Event::from_pairs([("kn_id", "r0")])).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Forbidden);
    assert!(err.message().contains("kn claim"), "{err}");
    let plans = topic("/what/staff/plans");
    carl.route(&plans, b"/who/carl/inbox", Event::from_pairs([("kn_id", "r1")])).unwrap();
    let route = route_of(&store, &plans, "r1");
    assert_eq!(route.get(KN_ROUTE_GRANT), Some(&b"@staff kn read:/what/staff/** route:/who/carl/**"[..]));
    // Judged at delivery with both the group and the claim.
    let judged = Principal::creator_of(&route);
    assert_eq!(judged, Principal::user("carl"));
    let rules = store.access_rules().unwrap().unwrap();
    assert!(rules.check(&judged, kn_journal::access::Operation::Read, &plans).is_ok());
    assert!(rules.check(&judged, kn_journal::access::Operation::Read, &topic("/what/other")).is_err());
    store.notify(&plans, event("e1", "plan")).unwrap();
    assert_eq!(payloads(&store, &topic("/who/carl/inbox")), ["plan"]);
}

#[test]
fn rules_that_grant_the_user_the_route_make_it_the_users_with_no_grant_and_no_expiry() {
    let f = Fixture::new(RULES);
    let store = f.store();
    let anna = token(&format!(r#"{{"sub":"anna","groups":["staff"],"exp":{}}}"#, now() + 600));
    let news = topic("/what/public/news");
    store.as_user(&anna).route(&news, b"/who/anna/inbox", Event::from_pairs([("kn_id", "r1")])).unwrap();
    let route = route_of(&store, &news, "r1");
    assert_eq!(route.get(KN_ROUTE_GRANT), None);
    assert_eq!(route.get("kn_expires"), None);
}

#[test]
fn a_grant_the_request_or_a_record_claims_by_itself_gains_nothing() {
    let f = Fixture::new(RULES);
    let store = f.store();
    let news = topic("/what/public/news");
    let plans = topic("/what/staff/plans");
    let later = (now() + 600).to_string();
    // A request naming a grant: dropped (carl needs none here).
    let forged = Event::from_pairs([("kn_id", "r1"), (KN_ROUTE_GRANT, "@staff"), ("kn_expires", later.as_str())]);
    store.as_user(&Principal::user("carl")).route(&news, b"/who/carl/inbox", forged.clone()).unwrap();
    assert_eq!(route_of(&store, &news, "r1").get(KN_ROUTE_GRANT), None);
    // Made with a token: the token's grant, not the request's.
    let carl = token(&format!(r#"{{"sub":"carl","exp":{}}}"#, now() + 600));
    store.as_user(&carl).route(&news, b"/who/carl/inbox", forged.clone()).unwrap();
    assert_eq!(route_of(&store, &news, "r1").get(KN_ROUTE_GRANT), None, "the rules alone let carl: no grant");
    // Route records are written by the store only: a post to kn_routes is
    // refused, even of a topic the user may post to.
    let record = Event::from_pairs([("kn_id", "r2"), ("kn_payload", "/who/carl/inbox"), (KN_ROUTE_CREATOR, "carl"), (KN_ROUTE_GRANT, "@staff")]);
    let err = store.as_user(&Principal::user("carl")).notify(&topic("/who/carl/notes").routes(), record.clone()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ReservedTopic, "{err}");
    // A record written by a local tool (trusted as the file system is)
    // without kn_expires has its grant ignored: carl alone may not read.
    store.post(&plans.routes(), record).unwrap();
    let report = store.notify(&plans, event("e1", "plan")).unwrap();
    assert_eq!(report.poisoned.len(), 1, "{report:?}");
    assert!(report.poisoned[0].reason.contains("user 'carl' may not read"), "{:?}", report.poisoned);
    assert!(payloads(&store, &topic("/who/carl/inbox")).is_empty());
}

#[test]
fn a_capabilitys_route_delivers_exactly_what_its_claim_names_until_it_expires() {
    let f = Fixture::new("allow read /what/public/** *\n");
    let store = f.store();
    let drop = topic("/what/drop");
    let cap = token(&format!(r#"{{"exp":{},"kn":{{"read":["/what/drop"],"route":["/what/inbox"]}}}}"#, now() + 600));
    // The rules give anonymous nothing of these; the claim does.
    store.as_user(&cap).route(&drop, b"/what/inbox", Event::from_pairs([("kn_id", "r1")])).unwrap();
    let route = route_of(&store, &drop, "r1");
    assert_eq!(route.get(KN_ROUTE_CREATOR), None);
    assert_eq!(route.get(KN_ROUTE_GRANT), Some(&b"kn read:/what/drop route:/what/inbox"[..]));
    assert!(route.get("kn_expires").is_some());
    let report = store.notify(&drop, event("e1", "dropped")).unwrap();
    assert!(report.poisoned.is_empty(), "{:?}", report.poisoned);
    assert_eq!(payloads(&store, &topic("/what/inbox")), ["dropped"]);
    // Not a route its claim does not name.
    let err = store.as_user(&cap).route(&drop, b"/what/elsewhere", Event::from_pairs([("kn_id", "r2")])).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Forbidden);
}
