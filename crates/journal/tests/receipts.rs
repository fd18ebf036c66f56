//! Receipts and the escalation of unread events (docs/PRESENCE.md,
//! "Receipts"): which routed journals hold an event, which sent it to a
//! live client, which clients confirmed it; and a route's
//! `kn_unread_after` posting each unconfirmed copy once to its
//! `kn_unread_to`, across passes, stores (a restarted process) and a
//! crash between the post and the cursor's write.

mod common;

use std::time::Duration;

use common::{config, ev, scratch, t};
use kn_journal::{ErrorKind, Selection, Store, Topic};

const SUBSCRIBERS: usize = 100;

fn journal(i: usize) -> Topic {
    t(&format!("/who/u{i}/kn_journal"))
}

/// `/what/news` routed into 100 live journals, each route escalating
/// to `/what/unread` after `after` seconds.
fn subscribed(store: &Store, after: &str) -> Topic {
    let news = t("/what/news");
    for i in 0..SUBSCRIBERS {
        live(store, &journal(i));
        let params = ev(&[
            ("kn_id", &format!("r{i}")),
            ("kn_unread_after", after),
            ("kn_unread_to", "/what/unread"),
        ]);
        store
            .route(&news, journal(i).as_str().as_bytes(), params)
            .unwrap();
    }
    news
}

/// Makes `journal` live, as a tunnel does.
fn live(store: &Store, journal: &Topic) {
    drop(store.tunnel(journal, &Selection::none()).unwrap());
}

fn escalations(store: &Store) -> Vec<kn_journal::Event> {
    let unread = t("/what/unread");
    if store.events(&unread, &Selection::all()).is_err() {
        return Vec::new();
    }
    store.events(&unread, &Selection::all()).unwrap().events
}

#[test]
fn receipts_of_100_subscribers_and_one_escalation_per_unconfirmed_journal() {
    let dir = scratch("kn-receipts");
    let root = dir.path().join("kn_events");
    let store = Store::open_with(config(&root)).unwrap();
    let news = subscribed(&store, "1");
    // Subscribers 0..30 have a live tunnel while the event arrives.
    let mut tunnels: Vec<_> = (0..30)
        .map(|i| {
            store
                .tunnel(&journal(i), &Selection::none())
                .unwrap()
                .tunnel
        })
        .collect();
    store
        .notify(&news, ev(&[("kn_id", "ev1"), ("kn_payload", "hello")]))
        .unwrap();
    for tunnel in &mut tunnels {
        assert_eq!(tunnel.next(&store).unwrap().len(), 1);
    }
    // The tunnels end: what they sent is written by then.
    drop(tunnels);
    // Subscribers 0..10 and 50..60 confirm it; the rest (70..100) are offline.
    for i in (0..10).chain(50..60) {
        let at = store.events(&journal(i), &Selection::all()).unwrap().events[0]
            .checkpoint()
            .unwrap()
            .to_vec();
        assert_eq!(
            store.confirm(&journal(i), &at).unwrap(),
            Some(String::from_utf8(at).unwrap().parse().unwrap())
        );
    }

    let receipts = store
        .receipts(&news, b"ev1")
        .unwrap()
        .expect("the event is there");
    assert_eq!(receipts.journals.len(), SUBSCRIBERS);
    assert!(
        receipts.journals.iter().all(|r| r.holds.is_some()),
        "every routed journal holds it"
    );
    let sent: Vec<bool> = receipts.journals.iter().map(|r| r.sent).collect();
    let confirmed: Vec<bool> = receipts.journals.iter().map(|r| r.confirmed).collect();
    for (i, r) in receipts.journals.iter().enumerate() {
        let n: usize = r.journal.as_str()[6..]
            .split('/')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(r.journal, journal(n));
        assert_eq!(sent[i], n < 30, "sent to {}", r.journal);
        assert_eq!(
            confirmed[i],
            n < 10 || (50..60).contains(&n),
            "confirmed by {}",
            r.journal
        );
    }
    assert!(store.receipts(&news, b"no-such-event").unwrap().is_none());

    // Nothing is due before the time has passed.
    assert_eq!(store.complete_unread_escalations().unwrap(), 0);
    std::thread::sleep(Duration::from_millis(2100));
    let unconfirmed = SUBSCRIBERS - 20;
    assert_eq!(store.complete_unread_escalations().unwrap(), unconfirmed);
    assert_eq!(store.complete_unread_escalations().unwrap(), 0, "once");
    let posted = escalations(&store);
    assert_eq!(posted.len(), unconfirmed);
    let e = posted
        .iter()
        .find(|e| e.get("kn_unread_journal") == Some(journal(70).as_str().as_bytes()))
        .expect("70 escalated");
    assert_eq!(e.payload(), b"hello");
    assert_eq!(e.get("kn_unread_event"), Some(&b"ev1"[..]));
    assert_eq!(e.get("kn_unread_topic"), Some(&b"/what/news"[..]));
    assert_eq!(e.get("kn_unread_route"), Some(&b"r70"[..]));
    assert_eq!(e.get("kn_unread_after"), Some(&b"1"[..]));
    assert!(
        posted
            .iter()
            .all(|e| e.get("kn_unread_journal") != Some(journal(5).as_str().as_bytes())),
        "5 confirmed"
    );

    // A restarted process finds nothing more to do.
    drop(store);
    let store = Store::open_with(config(&root)).unwrap();
    assert_eq!(store.complete_unread_escalations().unwrap(), 0);
    // A crash between the posts and the cursors' writes: posted again,
    // they are duplicates, stored and forwarded nowhere.
    for entry in std::fs::read_dir(root.join(".unread")).unwrap().flatten() {
        if entry.file_name().to_string_lossy().ends_with(".at") {
            std::fs::write(entry.path(), "0\n").unwrap();
        }
    }
    store.complete_unread_escalations().unwrap();
    assert_eq!(escalations(&store).len(), unconfirmed, "exactly once");
}

#[test]
fn a_later_confirmation_covers_earlier_events_and_never_goes_back() {
    let dir = scratch("kn-receipts");
    let store = Store::open_with(config(&dir.path().join("kn_events"))).unwrap();
    let j = journal(1);
    live(&store, &j);
    for i in 0..3 {
        store
            .notify(&j, ev(&[("kn_payload", &i.to_string())]))
            .unwrap();
    }
    assert_eq!(store.confirm(&j, b"3").unwrap(), Some(3));
    assert_eq!(store.confirm(&j, b"1").unwrap(), Some(1));
    let err = store.confirm(&j, b"4").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadRequest, "{err}");
    assert!(err.message().contains("past the end"), "{err}");
    assert_eq!(
        store.confirm(&j, b"x1").unwrap_err().kind(),
        ErrorKind::BadRequest
    );
    assert_eq!(
        store.confirm(&t("/what/plain"), b"1").unwrap_err().kind(),
        ErrorKind::BadRequest
    );
    assert_eq!(
        store.confirm(&journal(2), b"1").unwrap(),
        None,
        "no such journal"
    );
    let text =
        std::fs::read_to_string(dir.path().join("kn_events/who/u1/kn_journal/.receipts")).unwrap();
    assert!(text.contains("confirmed 3"), "{text}");
}

#[test]
fn bad_escalation_settings_are_refused_precisely() {
    let dir = scratch("kn-receipts");
    let mut c = config(&dir.path().join("kn_events"));
    c.max_unread_after = Duration::from_secs(3600);
    let store = Store::open_with(c).unwrap();
    let news = t("/what/news");
    let j = journal(1);
    live(&store, &j);
    let refused = |pairs: &[(&str, &str)], to: &Topic, says: &str| {
        let err = store
            .route(&news, to.as_str().as_bytes(), ev(pairs))
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BadRequest, "{pairs:?}: {err}");
        assert!(err.message().contains(says), "{pairs:?}: {err}");
    };
    refused(
        &[("kn_unread_to", "/what/unread")],
        &j,
        "needs kn_unread_after",
    );
    refused(&[("kn_unread_after", "5")], &j, "needs kn_unread_to");
    refused(
        &[("kn_unread_after", "5s"), ("kn_unread_to", "/what/unread")],
        &j,
        "expected whole seconds",
    );
    refused(
        &[("kn_unread_after", "-5"), ("kn_unread_to", "/what/unread")],
        &j,
        "expected whole seconds",
    );
    refused(
        &[("kn_unread_after", "0"), ("kn_unread_to", "/what/unread")],
        &j,
        "at least 1",
    );
    refused(
        &[
            ("kn_unread_after", "3601"),
            ("kn_unread_to", "/what/unread"),
        ],
        &j,
        "larger than the maximum of 3600",
    );
    refused(
        &[
            ("kn_unread_after", "99999999999999999999999"),
            ("kn_unread_to", "/what/unread"),
        ],
        &j,
        "larger than the maximum",
    );
    refused(
        &[
            ("kn_unread_after", "5"),
            ("kn_unread_to", "/who/x/kn_journal"),
        ],
        &j,
        "ordinary topic",
    );
    refused(
        &[("kn_unread_after", "5"), ("kn_unread_to", "/what/news")],
        &j,
        "own source",
    );
    refused(
        &[("kn_unread_after", "5"), ("kn_unread_to", "/what/a/../b")],
        &j,
        "bad kn_unread_to",
    );
    refused(
        &[("kn_unread_after", "5"), ("kn_unread_to", "/what/unread")],
        &t("/what/plain"),
        "into a journal",
    );
    // At the boundary: accepted.
    store
        .route(
            &news,
            j.as_str().as_bytes(),
            ev(&[
                ("kn_unread_after", "3600"),
                ("kn_unread_to", "/what/unread"),
            ]),
        )
        .unwrap();
    assert!(!store
        .config()
        .root
        .join(".unread")
        .read_dir()
        .unwrap()
        .collect::<Vec<_>>()
        .is_empty());
}

#[test]
fn an_escalation_waits_its_time_and_a_deleted_route_forgets_it() {
    let dir = scratch("kn-receipts");
    let store = Store::open_with(config(&dir.path().join("kn_events"))).unwrap();
    let news = t("/what/news");
    let j = journal(1);
    live(&store, &j);
    store
        .route(
            &news,
            j.as_str().as_bytes(),
            ev(&[
                ("kn_id", "r"),
                ("kn_unread_after", "3600"),
                ("kn_unread_to", "/what/unread"),
            ]),
        )
        .unwrap();
    store.notify(&news, ev(&[("kn_id", "a")])).unwrap();
    assert_eq!(
        store.complete_unread_escalations().unwrap(),
        0,
        "not due for an hour"
    );
    store.delete_route(&news, b"r", None).unwrap();
    store.complete_unread_escalations().unwrap();
    let left: Vec<_> = std::fs::read_dir(store.config().root.join(".unread"))
        .unwrap()
        .flatten()
        .collect();
    assert!(
        left.is_empty(),
        "a deleted route's registration is gone: {left:?}"
    );
}

#[test]
fn receipts_need_read_and_show_a_subscriber_only_to_who_may_see_the_route() {
    use kn_journal::access::Principal;
    let dir = scratch("kn-receipts");
    let rules = dir.path().join("access.rules");
    std::fs::write(&rules, "allow all /who/{user}/** users\nallow post,read /what/public/** users\nallow route,delete /what/public/** carol\n").unwrap();
    let mut c = config(&dir.path().join("kn_events"));
    c.access_rules = Some(rules);
    let store = Store::open_with(c).unwrap();
    let (anna, bob, carol, eve) = (Principal::user("anna"), Principal::user("bob"), Principal::user("carol"), Principal::anonymous());
    let news = t("/what/public/news");
    let aj = t("/who/anna/kn_journal");
    drop(store.as_user(&anna).tunnel(&aj, &Selection::none()).unwrap());
    store.as_user(&anna).route(&news, aj.as_str().as_bytes(), ev(&[("kn_id", "ra")])).unwrap();
    store.as_user(&bob).notify(&news, ev(&[("kn_id", "e1")])).unwrap();

    let seen = |who: &Principal| store.as_user(who).receipts(&news, b"e1").unwrap().unwrap().journals;
    assert!(seen(&anna)[0].visible, "the route's creator sees it");
    assert!(seen(&carol)[0].visible, "who may route to or delete routes of the topic sees it");
    let hidden = &seen(&bob)[0];
    assert!(!hidden.visible && hidden.holds.is_some(), "bob reads the topic: the state, not the subscriber");
    assert_eq!(store.as_user(&eve).receipts(&news, b"e1").unwrap_err().kind(), ErrorKind::Unauthorized);
    // An acknowledgement needs read on the journal.
    assert_eq!(store.as_user(&bob).confirm(&aj, b"1").unwrap_err().kind(), ErrorKind::Forbidden);
    assert_eq!(store.as_user(&anna).confirm(&aj, b"1").unwrap(), Some(1));
    assert!(seen(&bob)[0].confirmed);
    // Escalations are posted as the creator's: bob may not post to anna's topics.
    let err = store.as_user(&bob).route(&news, t("/who/bob/kn_journal").as_str().as_bytes(), ev(&[("kn_unread_after", "5"), ("kn_unread_to", "/who/anna/alerts")]));
    assert_eq!(err.unwrap_err().kind(), ErrorKind::Forbidden);
}

#[test]
fn a_tunnel_writes_what_it_sent_at_most_once_per_interval_and_when_it_ends() {
    let dir = scratch("kn-receipts");
    let mut c = config(&dir.path().join("kn_events"));
    c.receipts_flush = Duration::from_secs(3600);
    let store = Store::open_with(c).unwrap();
    let news = t("/what/news");
    let j = journal(1);
    live(&store, &j);
    store.route(&news, j.as_str().as_bytes(), ev(&[("kn_id", "r")])).unwrap();
    let mut tunnel = store.tunnel(&j, &Selection::none()).unwrap().tunnel;
    store.notify(&news, ev(&[("kn_id", "a")])).unwrap();
    assert_eq!(tunnel.next(&store).unwrap().len(), 1);
    store.notify(&news, ev(&[("kn_id", "b")])).unwrap();
    assert_eq!(tunnel.next(&store).unwrap().len(), 1);
    let sent = |id: &[u8]| store.receipts(&news, id).unwrap().unwrap().journals[0].sent;
    assert!(!sent(b"a") && !sent(b"b"), "nothing is written before an interval has passed since the tunnel started");
    drop(tunnel);
    assert!(sent(b"a") && sent(b"b"), "written when the tunnel ends");
}

#[test]
fn a_route_moved_to_another_journal_escalates_from_that_journal_s_end() {
    let dir = scratch("kn-receipts");
    let store = Store::open_with(config(&dir.path().join("kn_events"))).unwrap();
    let news = t("/what/news");
    let (a, b) = (journal(1), journal(2));
    live(&store, &a);
    live(&store, &b);
    for i in 0..3 {
        store.notify(&b, ev(&[("kn_payload", &i.to_string())])).unwrap();
    }
    let params = ev(&[("kn_id", "r"), ("kn_unread_after", "1"), ("kn_unread_to", "/what/unread")]);
    store.route(&news, a.as_str().as_bytes(), params.clone()).unwrap();
    store.route(&news, b.as_str().as_bytes(), params).unwrap();
    store.notify(&news, ev(&[("kn_id", "x")])).unwrap();
    std::thread::sleep(Duration::from_millis(2100));
    assert_eq!(store.complete_unread_escalations().unwrap(), 1);
    let e = &escalations(&store)[0];
    assert_eq!(e.get("kn_unread_journal"), Some(b.as_str().as_bytes()));
    assert_eq!(e.get("kn_unread_checkpoint"), Some(&b"4"[..]), "b's own events before the route are not its copies");
}

/// What receipts cost a tunnel: 200 tunnels each reading 50 events one
/// at a time, with the sent position written at every delivery
/// (`receipts_flush` 0) against the default (at most once a second),
/// and the publisher's notify time alongside (it never writes
/// `.receipts`). Prints figures; run with `--ignored --nocapture`.
#[test]
#[ignore]
fn receipts_cost_per_delivery() {
    fn run(flush: Duration) -> (Duration, Duration) {
        let dir = scratch("kn-receipts-bench");
        let mut c = config(&dir.path().join("kn_events"));
        c.receipts_flush = flush;
        let store = Store::open_with(c).unwrap();
        let news = t("/what/news");
        let mut tunnels = Vec::new();
        for i in 0..200 {
            let j = journal(i);
            tunnels.push(store.tunnel(&j, &Selection::none()).unwrap().tunnel);
            store.route(&news, j.as_str().as_bytes(), ev(&[("kn_id", &format!("r{i}"))])).unwrap();
        }
        let (mut notifying, mut reading) = (Duration::ZERO, Duration::ZERO);
        for n in 0..50 {
            let started = std::time::Instant::now();
            store.notify(&news, ev(&[("kn_id", &format!("e{n}"))])).unwrap();
            notifying += started.elapsed();
            let started = std::time::Instant::now();
            for tunnel in &mut tunnels {
                assert_eq!(tunnel.next(&store).unwrap().len(), 1);
            }
            reading += started.elapsed();
        }
        (notifying, reading)
    }
    let (n_default, r_default) = run(Duration::from_secs(1));
    let (n_every, r_every) = run(Duration::ZERO);
    println!("10,000 deliveries: tunnels' reads {r_default:?} (default, at most once a second) vs {r_every:?} (every delivery): ratio {:.2}", r_every.as_secs_f64() / r_default.as_secs_f64());
    println!("publisher's 50 notifies (200 routes each): {n_default:?} vs {n_every:?}: ratio {:.2}", n_every.as_secs_f64() / n_default.as_secs_f64());
}
