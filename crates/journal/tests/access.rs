//! Access control through `Store::as_user` (docs/ACCESS.md): each
//! operation allowed and refused, routes carrying their creator's rights
//! (checked again at every delivery), and no rules file meaning
//! everything is allowed.

mod common;
use common::RulesFixture as Fixture;


use kn_journal::access::{Operation, Principal, KN_ROUTE_CREATOR};
use kn_journal::{Config, ErrorKind, Event, Selection, Store, Topic};
use kn_journal::internal::KN_POISONED;

const RULES: &str = "\
group staff: anna bob
allow all            /who/{user}/**   users
allow read,route     /who/anonymous/** anonymous
allow post,read      /what/staff/**   @staff
allow read           /what/public/**  *
allow post           /what/public/**  users
deny  all            /what/secret/**  *
";

impl Fixture {
    fn open_store(&self) -> Store {
        let mut config = Config::new(&self.root);
        config.server_url = Some("http://example.org/kn".into());
        Store::open_with(config).unwrap()
    }
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

#[test]
fn posting_is_checked_per_user_group_and_anonymous() {
    let f = Fixture::new(RULES);
    let store = f.store();
    let staff = topic("/what/staff/plans");
    store.as_user(&Principal::user("bob")).notify(&staff, event("e1", "by bob")).unwrap();
    let carl = store.as_user(&Principal::user("carl")).notify(&staff, event("e2", "by carl")).unwrap_err();
    assert_eq!(carl.kind(), ErrorKind::Forbidden);
    assert!(carl.message().contains("user 'carl' may not post to '/what/staff/plans'"), "{carl}");
    let anonymous = store.as_user(&Principal::anonymous()).notify(&staff, event("e3", "anon")).unwrap_err();
    assert_eq!(anonymous.kind(), ErrorKind::Unauthorized);
    let secret = store.as_user(&Principal::user("anna")).notify(&topic("/what/secret/x"), event("e4", "x")).unwrap_err();
    assert!(secret.message().contains("refused by rule 7 (deny  all            /what/secret/**  *)"), "{secret}");
    assert_eq!(payloads(&store, &staff), ["by bob"]);
}

#[test]
fn reading_and_tunnels_are_checked() {
    let f = Fixture::new(RULES);
    let store = f.store();
    let staff = topic("/what/staff/plans");
    store.notify(&staff, event("e1", "plan")).unwrap();
    assert_eq!(store.as_user(&Principal::user("anna")).events(&staff, &Selection::all()).unwrap().events.len(), 1);
    let err = store.as_user(&Principal::user("carl")).tunnel(&staff, &Selection::all()).err().unwrap();
    assert_eq!(err.kind(), ErrorKind::Forbidden);
    let err = store.as_user(&Principal::anonymous()).events(&staff, &Selection::all()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unauthorized);
    // The routes of a topic are read as the topic itself.
    let err = store.as_user(&Principal::user("carl")).events(&staff.routes(), &Selection::all()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Forbidden);
}

#[test]
fn a_route_needs_read_on_its_source_and_route_on_its_destination() {
    let f = Fixture::new(RULES);
    let store = f.store();
    let staff = topic("/what/staff/plans");
    store.notify(&staff, event("e1", "plan")).unwrap();
    // Carl may not read the staff topic: no route of his carries it out,
    // not even its existing events.
    let carl = Principal::user("carl");
    let carl = store.as_user(&carl);
    let err = carl.route(&staff, b"/who/carl/inbox", Event::from_pairs([("kn_id", "r1"), ("do_max_n", "10")])).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Forbidden);
    assert!(payloads(&store, &topic("/who/carl/inbox")).is_empty());
    // Anna may read it, but not route into Carl's topics.
    let anna = Principal::user("anna");
    let anna = store.as_user(&anna);
    let err = anna.route(&staff, b"http://example.org/kn/who/carl/inbox", Event::from_pairs([("kn_id", "r2")])).unwrap_err();
    assert!(err.message().contains("may not route to '/who/carl/inbox'"), "{err}");
    // Into her own: yes, and the route names her.
    anna.route(&staff, b"/who/anna/inbox", Event::from_pairs([("kn_id", "r3"), ("do_max_n", "10")])).unwrap();
    assert_eq!(payloads(&store, &topic("/who/anna/inbox")), ["plan"]);
    let route = store.routes(&staff).unwrap().into_iter().find(|r| r.id() == b"r3").unwrap();
    assert_eq!(route.event.get(KN_ROUTE_CREATOR), Some(&b"anna"[..]));
}

#[test]
fn a_creator_claimed_by_the_request_is_dropped() {
    let f = Fixture::new(RULES);
    let store = f.store();
    let public = topic("/what/public/news");
    let forged = Event::from_pairs([("kn_id", "r1"), (KN_ROUTE_CREATOR, "anna")]);
    store.as_user(&Principal::anonymous()).route(&public, b"/who/anonymous/s/1/kn_journal", forged.clone()).unwrap();
    let route = store.routes(&public).unwrap().remove(0);
    assert_eq!(route.event.get(KN_ROUTE_CREATOR), None);
    store.as_user(&Principal::user("bob")).route(&public, b"/who/bob/inbox", Event::from_pairs([("kn_id", "r2"), (KN_ROUTE_CREATOR, "anna")])).unwrap();
    let route = store.routes(&public).unwrap().into_iter().find(|r| r.id() == b"r2").unwrap();
    assert_eq!(route.event.get(KN_ROUTE_CREATOR), Some(&b"bob"[..]));
}

#[test]
fn a_route_whose_creator_lost_the_right_stops_delivering_visibly() {
    let f = Fixture::new(RULES);
    let store = f.store();
    let staff = topic("/what/staff/plans");
    let inbox = topic("/who/bob/inbox");
    store.as_user(&Principal::user("bob")).route(&staff, b"/who/bob/inbox", Event::from_pairs([("kn_id", "r1")])).unwrap();
    store.as_user(&Principal::user("anna")).notify(&staff, event("e1", "before")).unwrap();
    assert_eq!(payloads(&store, &inbox), ["before"]);

    // Bob leaves the staff group: the next process reads the new rules.
    std::fs::write(&f.rules, RULES.replace("group staff: anna bob", "group staff: anna")).unwrap();
    let store = f.store();
    let report = store.as_user(&Principal::user("anna")).notify(&staff, event("e2", "after")).unwrap();
    assert_eq!(payloads(&store, &inbox), ["before"], "nothing more reaches bob");
    assert_eq!(report.poisoned.len(), 1);
    assert!(report.poisoned[0].reason.contains("user 'bob' may not read '/what/staff/plans'"), "{:?}", report.poisoned);
    // `kn routes --all` shows why.
    let route = store.all_routes(&staff).unwrap().into_iter().find(|r| r.id() == b"r1").unwrap();
    assert!(!route.is_active(kn_journal::internal::now()));
    let why = String::from_utf8_lossy(route.event.get(KN_POISONED).unwrap()).into_owned();
    assert!(why.starts_with("access: user 'bob' may not read"), "{why}");
}

#[test]
fn a_route_without_a_creator_is_checked_as_anonymous() {
    let f = Fixture::new(RULES);
    let store = f.store();
    let staff = topic("/what/staff/plans");
    // Made by a local tool (no creator), delivering into a topic anonymous
    // may route to: anonymous may not read the source, so it never delivers.
    store.route(&staff, b"/who/anonymous/s/1/inbox", Event::from_pairs([("kn_id", "r1")])).unwrap();
    let report = store.notify(&staff, event("e1", "plan")).unwrap();
    assert_eq!(report.poisoned.len(), 1, "{report:?}");
    assert!(payloads(&store, &topic("/who/anonymous/s/1/inbox")).is_empty());
}

#[test]
fn deleting_a_route_takes_its_creator_the_topics_deleter_or_the_destinations_owner() {
    let f = Fixture::new(&format!("{RULES}allow delete /what/public/** carl\n"));
    let store = f.store();
    let public = topic("/what/public/news");
    let route = |id: &str, user: &str, to: &str| {
        store.as_user(&Principal::user(user)).route(&public, to.as_bytes(), Event::from_pairs([("kn_id", id)])).unwrap();
    };
    route("r1", "anna", "/who/anna/inbox");
    route("r2", "anna", "/who/anna/inbox");
    route("r3", "anna", "/who/anna/inbox");
    let active = |id: &str| store.routes(&public).unwrap().iter().any(|r| r.id() == id.as_bytes());

    let bob = Principal::user("bob");
    let bob = store.as_user(&bob);
    let err = bob.delete_route(&public, b"r1", None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Forbidden);
    // Replacing it under the same id is deleting it too.
    let err = bob.route(&public, b"/who/bob/inbox", Event::from_pairs([("kn_id", "r1")])).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Forbidden);
    assert!(active("r1"));
    store.as_user(&Principal::user("anna")).delete_route(&public, b"r1", None).unwrap();
    store.as_user(&Principal::user("carl")).delete_route(&public, b"r2", None).unwrap();
    assert!(!active("r1") && !active("r2") && active("r3"));
    // A route Anna did not make, into her topic: she may stop it.
    std::fs::write(&f.rules, format!("{RULES}allow route /who/anna/inbox dora\nallow read /what/public/** dora\n")).unwrap();
    let store = f.store();
    store.as_user(&Principal::user("dora")).route(&public, b"/who/anna/inbox", Event::from_pairs([("kn_id", "r4")])).unwrap();
    store.as_user(&Principal::user("anna")).delete_route(&public, b"r4", None).unwrap();
    assert!(!store.routes(&public).unwrap().iter().any(|r| r.id() == b"r4"));
}

#[test]
fn replay_is_an_operation_of_its_own() {
    let f = Fixture::new("allow all /who/{user}/** users\ndeny replay /who/** *\n");
    let store = f.store();
    let journal = topic("/who/anna/kn_journal");
    assert!(store.as_user(&Principal::user("anna")).check(Operation::Read, &journal).is_ok());
    assert!(store.as_user(&Principal::user("anna")).check(Operation::Replay, &journal).is_ok(), "the first matching rule decides");
    std::fs::write(&f.rules, "deny replay /who/** *\nallow all /who/{user}/** users\n").unwrap();
    let err = f.store().as_user(&Principal::user("anna")).check(Operation::Replay, &journal).unwrap_err();
    assert!(err.message().contains("rule 1 (deny replay /who/** *)"), "{err}");
}

#[test]
fn without_a_rules_file_everything_is_allowed_as_before() {
    let f = Fixture::new("");
    let store = f.open_store();
    let anonymous = Principal::anonymous();
    let anonymous = store.as_user(&anonymous);
    let staff = topic("/what/staff/plans");
    anonymous.notify(&staff, event("e1", "x")).unwrap();
    anonymous.route(&staff, b"/who/x/inbox", Event::from_pairs([("kn_id", "r1")])).unwrap();
    anonymous.delete_route(&staff, b"r1", None).unwrap();
    anonymous.tunnel(&staff, &Selection::all()).unwrap();
    assert!(anonymous.check(Operation::Replay, &staff).is_ok());
    // An empty rules file allows nothing.
    let err = f.store().as_user(&Principal::user("anna")).notify(&staff, event("e2", "y")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Forbidden);
}

#[test]
fn a_broken_rules_file_refuses_everything_and_poisons_nothing() {
    let f = Fixture::new(RULES);
    let store = f.store();
    let staff = topic("/what/staff/plans");
    store.as_user(&Principal::user("bob")).route(&staff, b"/who/bob/inbox", Event::from_pairs([("kn_id", "r1")])).unwrap();
    std::fs::write(&f.rules, "allow everything\n").unwrap();
    let store = f.store();
    let err = store.as_user(&Principal::user("anna")).notify(&staff, event("e1", "x")).unwrap_err();
    assert_eq!(err.kind().status().0, 500);
    assert!(err.message().contains("access.rules:1: expected a topic pattern"), "{err}");
    // A local tool still posts; the route delivers nothing but stays.
    let report = store.notify(&staff, event("e2", "y")).unwrap();
    assert!(report.poisoned.is_empty());
    assert!(payloads(&store, &topic("/who/bob/inbox")).is_empty());
    assert_eq!(store.routes(&staff).unwrap().len(), 1);
}
