//! What readers are shown under the access rules (docs/ACCESS.md): open
//! tunnels checked again at each delivery, introspection topics
//! (`kn_subtopics`, `kn_routes`) showing only what the reader may know of,
//! anonymous visitors' sessions, and replacing a route under an existing
//! `kn_id`.

mod common;
use common::RulesFixture as Fixture;

use std::time::Duration;

use kn_journal::access::{Principal, KN_ROUTE_SESSION};
use kn_journal::{ErrorKind, Event, Selection, Topic};
use kn_journal::internal::{KN_POISONED, KN_POISONED_BEFORE};

const RULES: &str = "\
group staff: anna bob
allow all             /who/{user}/**                  users
allow post,read,route /who/anonymous/s/{session}/**   anonymous
allow read            /who/anonymous/s                anonymous
allow post,read       /what/staff/**                  @staff
allow read            /what/public/**                 *
allow post            /what/public/**                 users
allow delete          /what/public/**                 carl
";

impl Fixture {
    /// Rewrites the rules and waits until a long-lived store looks at the
    /// file again (at most once a second).
    fn change_rules(&self, rules: &str) {
        std::fs::write(&self.rules, rules).unwrap();
        std::thread::sleep(Duration::from_millis(1100));
    }
}

fn topic(name: &str) -> Topic {
    Topic::parse(name).unwrap()
}

fn event(id: &str, payload: &str) -> Event {
    Event::from_pairs([("kn_id", id), ("kn_payload", payload)])
}

fn payloads(events: &[Event]) -> Vec<String> {
    events.iter().map(|e| String::from_utf8_lossy(e.payload()).into_owned()).collect()
}

fn ids(events: &[Event]) -> Vec<String> {
    let mut ids: Vec<String> = events.iter().map(|e| String::from_utf8_lossy(e.id().unwrap_or(b"")).into_owned()).collect();
    ids.sort();
    ids
}

#[test]
fn an_open_tunnel_ends_at_its_next_delivery_once_its_reader_lost_the_right() {
    let f = Fixture::new(RULES);
    let store = f.store();
    let staff = topic("/what/staff/plans");
    let public = topic("/what/public/news");
    let bob = Principal::user("bob");
    let anonymous = Principal::anonymous();
    let mut bobs = store.as_user(&bob).tunnel(&staff, &Selection::none()).unwrap().tunnel;
    let mut anonymous_tunnel = store.as_user(&anonymous).tunnel(&public, &Selection::none()).unwrap().tunnel;
    let mut local = store.tunnel(&staff, &Selection::none()).unwrap().tunnel;
    store.notify(&staff, event("e1", "before")).unwrap();
    store.notify(&public, event("p1", "before")).unwrap();
    assert_eq!(payloads(&bobs.next(&store).unwrap()), ["before"]);
    assert_eq!(payloads(&anonymous_tunnel.next(&store).unwrap()), ["before"]);

    // Bob leaves the staff; public news become for users only. The same
    // store (a long-lived server) reads the rules again.
    f.change_rules(&RULES.replace("group staff: anna bob", "group staff: anna").replace("allow read            /what/public/**                 *", "allow read /what/public/** users"));
    store.notify(&staff, event("e2", "after")).unwrap();
    store.notify(&public, event("p2", "after")).unwrap();
    let err = bobs.next(&store).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Forbidden);
    assert!(err.message().contains("user 'bob' may not read '/what/staff/plans'"), "{err}");
    let err = anonymous_tunnel.next(&store).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    // A local tool's tunnel is not checked.
    assert_eq!(payloads(&local.next(&store).unwrap()), ["before", "after"]);
}

#[test]
fn a_tunnel_with_nothing_to_deliver_is_not_refused_before_its_next_delivery() {
    let f = Fixture::new(RULES);
    let store = f.store();
    let staff = topic("/what/staff/plans");
    let bob = Principal::user("bob");
    let mut tunnel = store.as_user(&bob).tunnel(&staff, &Selection::none()).unwrap().tunnel;
    f.change_rules(&RULES.replace("group staff: anna bob", "group staff: anna"));
    assert!(tunnel.next(&store).unwrap().is_empty());
    // The rules given back before anything was delivered: it goes on.
    f.change_rules(RULES);
    store.notify(&staff, event("e1", "still")).unwrap();
    assert_eq!(payloads(&tunnel.next(&store).unwrap()), ["still"]);
}

#[test]
fn subtopics_are_listed_only_to_those_who_may_read_them() {
    let f = Fixture::new(RULES);
    let store = f.store();
    let key = store.session_key().unwrap();
    let (a, token_a) = key.new_session();
    let (b, token_b) = key.new_session();
    let visitor_a = store.anonymous_with(Some(token_a.as_bytes()));
    let visitor_b = store.anonymous_with(Some(token_b.as_bytes()));
    assert_eq!(visitor_a.session(), Some(a.as_str()));
    for (who, id) in [(&visitor_a, &a), (&visitor_b, &b)] {
        store.as_user(who).tunnel(&topic(&format!("/who/anonymous/s/{id}/page/kn_journal")), &Selection::none()).unwrap();
    }
    let listing = topic("/who/anonymous/s/kn_subtopics");
    // Everything is there...
    let all = store.events(&listing, &Selection::all()).unwrap().events;
    assert_eq!(payloads(&all).len(), 2);
    // ...but each visitor is shown only its own session.
    let shown = store.as_user(&visitor_a).events(&listing, &Selection::all()).unwrap().events;
    assert_eq!(payloads(&shown), [a.as_str()]);
    let shown = store.as_user(&Principal::anonymous()).events(&listing, &Selection::all()).unwrap().events;
    assert!(shown.is_empty(), "{shown:?}");
    // A tunnel on the listing: the same, initially and as topics appear.
    let start = store.as_user(&visitor_b).tunnel(&listing, &Selection::all()).unwrap();
    assert_eq!(payloads(&start.initial.events), [b.as_str()]);
    let mut tunnel = start.tunnel;
    let (c, token_c) = key.new_session();
    let visitor_c = store.anonymous_with(Some(token_c.as_bytes()));
    store.as_user(&visitor_c).tunnel(&topic(&format!("/who/anonymous/s/{c}/page/kn_journal")), &Selection::none()).unwrap();
    assert!(tunnel.next(&store).unwrap().is_empty(), "visitor b is not shown c's session");
}

#[test]
fn routes_are_listed_to_their_creator_and_to_those_who_may_route_to_or_delete_from_the_source() {
    let f = Fixture::new(RULES);
    let store = f.store();
    let public = topic("/what/public/news");
    let key = store.session_key().unwrap();
    let (a, token_a) = key.new_session();
    let visitor = store.anonymous_with(Some(token_a.as_bytes()));
    let journal = format!("/who/anonymous/s/{a}/page/kn_journal");
    store.as_user(&visitor).tunnel(&topic(&journal), &Selection::none()).unwrap();
    store.as_user(&visitor).route(&public, journal.as_bytes(), Event::from_pairs([("kn_id", "ra")])).unwrap();
    store.as_user(&Principal::user("anna")).route(&public, b"/who/anna/inbox", Event::from_pairs([("kn_id", "rn")])).unwrap();
    let listing = public.routes();
    let shown = |who: &Principal| ids(&store.as_user(who).events(&listing, &Selection::all()).unwrap().events);
    assert_eq!(shown(&visitor), ["ra"]);
    assert_eq!(shown(&Principal::user("anna")), ["rn"]);
    assert!(shown(&Principal::anonymous()).is_empty());
    assert!(shown(&Principal::user("bob")).is_empty());
    assert_eq!(shown(&Principal::user("carl")), ["ra", "rn"], "carl may delete routes of the source");
    // The visitor's route names its session, so that only it is its creator.
    let route = store.routes(&public).unwrap().into_iter().find(|r| r.id() == b"ra").unwrap();
    assert_eq!(route.event.get(KN_ROUTE_SESSION), Some(a.as_bytes()));

    // A tunnel on the listing shows a new route only to whom it may.
    let bob = Principal::user("bob");
    let carl = Principal::user("carl");
    let mut bobs = store.as_user(&bob).tunnel(&listing, &Selection::all()).unwrap();
    assert!(bobs.initial.events.is_empty());
    let mut carls = store.as_user(&carl).tunnel(&listing, &Selection::none()).unwrap().tunnel;
    store.as_user(&Principal::user("anna")).route(&public, b"/who/anna/other", Event::from_pairs([("kn_id", "rn2")])).unwrap();
    assert!(bobs.tunnel.next(&store).unwrap().is_empty());
    assert_eq!(ids(&carls.next(&store).unwrap()), ["rn2"]);

    // A route from the listing carries only what its creator may see.
    store.as_user(&bob).route(&listing, b"/who/bob/seen", Event::from_pairs([("kn_id", "watch"), ("do_max_age", "infinity")])).unwrap();
    store.as_user(&Principal::user("anna")).route(&public, b"/who/anna/third", Event::from_pairs([("kn_id", "rn3")])).unwrap();
    assert!(store.events(&topic("/who/bob/seen"), &Selection::all()).unwrap().events.is_empty());
    store.as_user(&carl).route(&listing, b"/who/carl/seen", Event::from_pairs([("kn_id", "watch2"), ("do_max_age", "infinity")])).unwrap();
    assert_eq!(ids(&store.events(&topic("/who/carl/seen"), &Selection::all()).unwrap().events), ["ra", "rn", "rn2", "rn3"]);
}

#[test]
fn a_session_journal_is_its_visitors_alone() {
    let f = Fixture::new(RULES);
    let store = f.store();
    let key = store.session_key().unwrap();
    let (a, token_a) = key.new_session();
    let (_, token_b) = key.new_session();
    let journal = topic(&format!("/who/anonymous/s/{a}/page/kn_journal"));
    let visitor_a = store.anonymous_with(Some(token_a.as_bytes()));
    store.as_user(&visitor_a).tunnel(&journal, &Selection::none()).unwrap();
    // Knowing the journal's name is not enough: another visitor, a visitor
    // without a session, a forged token all get 401.
    let forged = format!("{a}.{}", "0".repeat(64));
    for token in [Some(token_b.as_bytes()), None, Some(forged.as_bytes()), Some(a.as_bytes())] {
        let who = store.anonymous_with(token);
        let err = store.as_user(&who).tunnel(&journal, &Selection::none()).err().expect("refused");
        assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
        assert!(store.as_user(&who).notify(&journal, event("x", "x")).is_err());
    }
    // The visitor's own route into it delivers, checked at each delivery
    // against its session.
    let public = topic("/what/public/news");
    store.as_user(&visitor_a).route(&public, journal.as_str().as_bytes(), Event::from_pairs([("kn_id", "ra")])).unwrap();
    let report = store.as_user(&Principal::user("anna")).notify(&public, event("n1", "news")).unwrap();
    assert!(report.poisoned.is_empty(), "{report:?}");
    assert_eq!(payloads(&store.events(&journal, &Selection::all()).unwrap().events), ["news"]);
}

#[test]
fn replacing_a_poisoned_route_needs_the_rights_to_delete_it_and_keeps_its_poison_record() {
    let f = Fixture::new(RULES);
    let store = f.store();
    let staff = topic("/what/staff/plans");
    let bob = Principal::user("bob");
    let anna = Principal::user("anna");
    store.as_user(&bob).route(&staff, b"/who/bob/inbox", Event::from_pairs([("kn_id", "r1")])).unwrap();
    f.change_rules(&RULES.replace("group staff: anna bob", "group staff: anna"));
    let report = store.as_user(&anna).notify(&staff, event("e1", "x")).unwrap();
    assert_eq!(report.poisoned.len(), 1);
    let poisoned = store.all_routes(&staff).unwrap().into_iter().find(|r| r.id() == b"r1").unwrap();
    let reason = poisoned.event.get(KN_POISONED).unwrap().to_vec();

    // Anna may read the source, but the route is not hers to take over.
    let err = store.as_user(&anna).route(&staff, b"/who/anna/inbox", Event::from_pairs([("kn_id", "r1")])).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Forbidden, "{err}");
    let record = store.all_routes(&staff).unwrap().into_iter().find(|r| r.id() == b"r1").unwrap();
    assert_eq!(record.event.get(KN_POISONED), Some(&reason[..]), "the poison record stays");

    // Its creator, given the right back, may: the record comes along.
    f.change_rules(RULES);
    let report = store.as_user(&bob).route(&staff, b"/who/bob/inbox", Event::from_pairs([("kn_id", "r1")])).unwrap();
    assert!(!report.ignored);
    let route = store.routes(&staff).unwrap().into_iter().find(|r| r.id() == b"r1").unwrap();
    assert_eq!(route.event.get(KN_POISONED_BEFORE), Some(&reason[..]));
    assert_eq!(route.event.get(KN_POISONED), None);
    // Sent again (a client reconnecting), it is the same route: ignored,
    // the record kept.
    let report = store.as_user(&bob).route(&staff, b"/who/bob/inbox", Event::from_pairs([("kn_id", "r1")])).unwrap();
    assert!(report.ignored, "{report:?}");
    // A request cannot forge or wipe the record.
    let forged = Event::from_pairs([("kn_id", "r9"), (KN_POISONED_BEFORE, "made up"), ("kn_poisoned", "made up")]);
    store.as_user(&bob).route(&staff, b"/who/bob/inbox", forged).unwrap();
    let route = store.routes(&staff).unwrap().into_iter().find(|r| r.id() == b"r9").unwrap();
    assert_eq!((route.event.get(KN_POISONED_BEFORE), route.event.get(KN_POISONED)), (None, None));
}

#[test]
fn reusing_a_deleted_routes_id_needs_the_rights_to_delete_it() {
    let f = Fixture::new(RULES);
    let store = f.store();
    let public = topic("/what/public/news");
    let anna = Principal::user("anna");
    store.as_user(&anna).route(&public, b"/who/anna/inbox", Event::from_pairs([("kn_id", "r2")])).unwrap();
    store.as_user(&anna).delete_route(&public, b"r2", None).unwrap();
    let err = store.as_user(&Principal::user("bob")).route(&public, b"/who/bob/inbox", Event::from_pairs([("kn_id", "r2")])).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Forbidden, "{err}");
    let err = store.as_user(&Principal::anonymous()).route(&public, b"/what/public/x", Event::from_pairs([("kn_id", "r2")])).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    // Its creator may, and so may one who may delete the source's routes.
    store.as_user(&anna).route(&public, b"/who/anna/inbox", Event::from_pairs([("kn_id", "r2")])).unwrap();
    store.as_user(&anna).delete_route(&public, b"r2", None).unwrap();
    store.as_user(&Principal::user("carl")).route(&public, b"/who/carl/inbox", Event::from_pairs([("kn_id", "r2")])).unwrap();
}
