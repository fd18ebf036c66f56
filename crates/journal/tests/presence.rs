//! `<topic>/kn_presence` through the store's API (docs/PRESENCE.md): a
//! read gives the journals routed from the topic with a live tunnel; a
//! tunnel on it gets a `join` and, a debounce after the journal's last
//! tunnel closed, a `leave`; clients may not post to it. Across processes,
//! web servers and hosts: tests/presence.rs.

use std::path::Path;
use std::time::{Duration, Instant};

mod common;
use common::{config, ev, scratch, t};

use kn_journal::{Config, Event, Selection, Store, Tunnel};
use kn_journal::internal::{KN_PRESENCE, KN_PRESENCE_JOURNAL, KN_PRESENCE_SINCE};

fn fast(root: &Path, debounce: Duration) -> Config {
    let mut c = config(root);
    c.presence_debounce = debounce;
    c.presence_pass = Duration::from_millis(20);
    c
}

fn text(e: &Event, name: &[u8]) -> String {
    String::from_utf8_lossy(e.get(name).unwrap_or(b"")).into_owned()
}

/// Reads `tunnel` until an event with `kn_presence` = `what` comes (or
/// `limit` passes).
fn next_presence(store: &Store, tunnel: &mut Tunnel, what: &str, limit: Duration) -> Option<Event> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        for e in tunnel.wait(store, Duration::from_millis(50)).unwrap() {
            if text(&e, KN_PRESENCE) == what {
                return Some(e);
            }
        }
    }
    None
}

#[test]
fn a_read_gives_the_connected_journals_and_a_tunnel_gets_joins_and_leaves() {
    let dir = scratch("presence");
    let store = Store::open_with(fast(dir.path(), Duration::from_millis(200))).unwrap();
    let chat = t("/chat");
    for who in ["anna", "bob", "carl"] {
        store
            .route(
                &chat,
                format!("/who/{who}/kn_journal").as_bytes(),
                ev(&[("kn_id", who)]),
            )
            .unwrap();
    }
    let anna = store
        .tunnel(&t("/who/anna/kn_journal"), &Selection::default())
        .unwrap()
        .tunnel;
    let _bob = store
        .tunnel(&t("/who/bob/kn_journal"), &Selection::default())
        .unwrap()
        .tunnel;

    // A read: anna and bob (carl has no tunnel), one event each.
    let read = store
        .events(&chat.presence(), &Selection::all())
        .unwrap()
        .events;
    let journals: Vec<String> = read.iter().map(|e| text(e, KN_PRESENCE_JOURNAL)).collect();
    assert_eq!(journals.len(), 2, "{read:?}");
    assert!(
        journals.contains(&"/who/anna/kn_journal".to_string())
            && journals.contains(&"/who/bob/kn_journal".to_string()),
        "{journals:?}"
    );
    assert!(
        read.iter().all(|e| text(e, KN_PRESENCE) == "join"
            && !text(e, b"kn_presence_route").is_empty()
            && !text(e, KN_PRESENCE_SINCE).is_empty()),
        "{read:?}"
    );

    let start = store.tunnel(&chat.presence(), &Selection::all()).unwrap();
    assert_eq!(start.initial.events.len(), 2);
    let mut watcher = start.tunnel;

    // carl connects: a join; anna leaves: a leave after the debounce.
    let _carl = store
        .tunnel(&t("/who/carl/kn_journal"), &Selection::default())
        .unwrap()
        .tunnel;
    let join =
        next_presence(&store, &mut watcher, "join", Duration::from_secs(10)).expect("carl's join");
    assert_eq!(text(&join, KN_PRESENCE_JOURNAL), "/who/carl/kn_journal");
    let closed = Instant::now();
    drop(anna);
    let leave = next_presence(&store, &mut watcher, "leave", Duration::from_secs(10))
        .expect("anna's leave");
    assert!(
        closed.elapsed() >= Duration::from_millis(200),
        "left before the debounce: {:?}",
        closed.elapsed()
    );
    assert_eq!(text(&leave, KN_PRESENCE_JOURNAL), "/who/anna/kn_journal");
    assert_eq!(
        leave.id(),
        Some(kn_journal::internal::presence_id(&t("/who/anna/kn_journal")).as_bytes()),
        "one id per journal"
    );

    // A read now: bob and carl; a leave is not "connected".
    let read = store
        .events(&chat.presence(), &Selection::all())
        .unwrap()
        .events;
    let mut journals: Vec<String> = read.iter().map(|e| text(e, KN_PRESENCE_JOURNAL)).collect();
    journals.sort();
    assert_eq!(
        journals,
        ["/who/bob/kn_journal", "/who/carl/kn_journal"],
        "{read:?}"
    );
}

#[test]
fn a_reconnect_within_the_debounce_is_no_leave() {
    let dir = scratch("presence-debounce");
    let store = Store::open_with(fast(dir.path(), Duration::from_secs(2))).unwrap();
    let chat = t("/chat");
    store
        .route(&chat, b"/who/anna/kn_journal", ev(&[("kn_id", "a")]))
        .unwrap();
    let anna = store
        .tunnel(&t("/who/anna/kn_journal"), &Selection::default())
        .unwrap()
        .tunnel;
    let mut watcher = store
        .tunnel(&chat.presence(), &Selection::all())
        .unwrap()
        .tunnel;
    drop(anna);
    std::thread::sleep(Duration::from_millis(300));
    let _again = store
        .tunnel(&t("/who/anna/kn_journal"), &Selection::default())
        .unwrap()
        .tunnel;
    assert!(
        next_presence(&store, &mut watcher, "leave", Duration::from_secs(3)).is_none(),
        "a reconnect within the debounce left"
    );
}

#[test]
fn clients_may_not_post_to_kn_presence() {
    let dir = scratch("presence-post");
    let store = Store::open_with(config(dir.path())).unwrap();
    let err = store
        .notify(&t("/chat/kn_presence"), ev(&[("kn_payload", "x")]))
        .unwrap_err();
    assert_eq!(err.kind(), kn_journal::ErrorKind::ReservedTopic);
    assert!(
        err.message()
            .contains("kn_presence topics are written by the server only"),
        "{err}"
    );
}

#[test]
fn a_static_route_from_kn_presence_gets_joins_and_leaves_through_the_sweep() {
    let dir = scratch("presence-routed");
    let store = Store::open_with(fast(dir.path(), Duration::ZERO)).unwrap();
    let chat = t("/chat");
    store.route(&chat, b"/who/anna/kn_journal", ev(&[("kn_id", "a")])).unwrap();
    // A watcher subscribes as the JavaScript client does: a route from
    // kn_presence into its own journal, read by its tunnel.
    let mut watcher = store.tunnel(&t("/who/w/kn_journal"), &Selection::default()).unwrap().tunnel;
    store.route(&chat.presence(), b"/who/w/kn_journal", ev(&[("kn_id", "p")])).unwrap();
    let anna = store.tunnel(&t("/who/anna/kn_journal"), &Selection::default()).unwrap().tunnel;
    // No tunnel on kn_presence: the sweep's slice passes (serve runs one
    // every sweep_interval), a little after the route's own pass.
    std::thread::sleep(Duration::from_millis(30));
    store.sweep(16).unwrap();
    let join = next_presence(&store, &mut watcher, "join", Duration::from_secs(5)).expect("a join through the route");
    assert_eq!(text(&join, KN_PRESENCE_JOURNAL), "/who/anna/kn_journal");
    drop(anna);
    // The next slice, a sweep interval later (passes closer than half a
    // `presence_pass` to the last one are skipped).
    std::thread::sleep(Duration::from_millis(30));
    store.sweep(16).unwrap();
    let leave = next_presence(&store, &mut watcher, "leave", Duration::from_secs(5)).expect("a leave through the route");
    assert_eq!(text(&leave, KN_PRESENCE_JOURNAL), "/who/anna/kn_journal");
}

/// The settings' boundaries, read from the environment in a child
/// process (the environment is the process's): a debounce of 0 is a leave
/// at the first pass that misses the journal; a pass interval below
/// 10 ms is 10 ms; a malformed value is an error naming the variable.
#[test]
fn presence_settings_are_read_from_the_environment_with_their_bounds() {
    if let Ok(expect) = std::env::var("KN_PRESENCE_CHILD") {
        let c = Config::from_env().unwrap();
        let got = format!("{} {}", c.presence_debounce.as_millis(), c.presence_pass.as_millis());
        assert_eq!(got, expect);
        println!("KN_PRESENCE_CHILD_OK");
        return;
    }
    let run = |debounce: &str, pass: &str, expect: &str| {
        let mut command = std::process::Command::new(std::env::current_exe().unwrap());
        command.args(["--exact", "presence_settings_are_read_from_the_environment_with_their_bounds", "--nocapture"]);
        command.env("KN_PRESENCE_CHILD", expect).env("KN_PRESENCE_DEBOUNCE_MS", debounce).env("KN_PRESENCE_PASS_MS", pass);
        let out = command.output().unwrap();
        (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    };
    for (debounce, pass, expect) in [("0", "9", "0 10"), ("1", "10", "1 10"), ("5000", "11", "5000 11")] {
        let (ok, out) = run(debounce, pass, expect);
        assert!(ok && out.contains("KN_PRESENCE_CHILD_OK"), "{debounce} {pass}: {out}");
    }
    let (ok, out) = run("five seconds", "10", "");
    assert!(!ok && out.contains("KN_PRESENCE_DEBOUNCE_MS"), "{out}");
}

#[test]
fn a_debounce_of_zero_leaves_at_the_first_pass_without_the_tunnel() {
    let dir = scratch("presence-zero");
    let store = Store::open_with(fast(dir.path(), Duration::ZERO)).unwrap();
    let chat = t("/chat");
    store.route(&chat, b"/who/anna/kn_journal", ev(&[("kn_id", "a")])).unwrap();
    let anna = store.tunnel(&t("/who/anna/kn_journal"), &Selection::default()).unwrap().tunnel;
    assert_eq!(store.presence_pass(&chat.presence()).unwrap().joined.len(), 1);
    drop(anna);
    let changes = store.presence_pass(&chat.presence()).unwrap();
    assert!(changes.ran);
    assert_eq!(changes.left, [t("/who/anna/kn_journal")], "{changes:?}");
}
