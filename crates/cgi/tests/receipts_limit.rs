//! `do_method=receipts` reads at most `KN_RECEIPTS_MAX_JOURNALS` routed
//! journals per request (issue 37, suspected point c: each is a read of
//! the journal back to the event, about 1.7 ms, and a topic may have any
//! number of routes). At the limit every journal is read; one past it,
//! the last route is counted and said, not read. Before the bound every
//! journal was read, whatever their number.

use std::path::Path;
use std::time::Duration;

use kn_journal::{Config, Event, Selection, Store, Topic};
use kn_test_support::raw::Conn;
use kn_test_support::Serve;

/// The server URL of the store and of the servers started on it: the
/// routes' destinations name it.
const SERVER_URL: &str = "http://kn.test/kn";

/// Routes `/what/news` into `n` journals (each made first by a tunnel)
/// and posts the event `e1` there; the store, whose tunnels keep the
/// journals live (the sweep of a server started after leaves them).
fn routed_event(root: &Path, n: usize) -> (Store, Vec<kn_journal::TunnelStart>) {
    let mut config = Config::new(root);
    config.server_url = Some(SERVER_URL.into());
    let store = Store::open_with(config).unwrap();
    let mut tunnels = Vec::new();
    let news = Topic::parse("/what/news").unwrap();
    for i in 0..n {
        let journal = Topic::parse(&format!("/who/u{i}/kn_journal")).unwrap();
        tunnels.push(store.tunnel(&journal, &Selection::none()).unwrap());
        store.route(&news, journal.as_str().as_bytes(), Event::from_pairs([("kn_id", format!("r{i}").as_str())])).unwrap();
    }
    store.notify(&news, Event::from_pairs([("kn_id", "e1"), ("kn_payload", "hi")])).unwrap();
    (store, tunnels)
}

#[test]
fn the_store_reads_at_most_the_configured_journals() {
    let dir = tempfile::tempdir().unwrap();
    let _live = routed_event(dir.path(), 4);
    let news = Topic::parse("/what/news").unwrap();
    let mut config = Config::new(dir.path());
    config.server_url = Some(SERVER_URL.into());
    config.receipts_max_journals = 4;
    let at_limit = Store::open_with(config.clone()).unwrap().receipts(&news, b"e1").unwrap().unwrap();
    assert_eq!((at_limit.journals.len(), at_limit.not_read), (4, 0));
    config.receipts_max_journals = 3;
    let past = Store::open_with(config).unwrap().receipts(&news, b"e1").unwrap().unwrap();
    assert_eq!((past.journals.len(), past.not_read), (3, 1));
    assert!(past.journals.iter().all(|r| r.holds.is_some()), "the journals read are read whole");
}

#[test]
fn do_method_receipts_answers_at_most_the_configured_journals_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("events");
    let _live = routed_event(&root, 4);
    let ask = |limit: &str| {
        let mut command = Serve::command_of(Path::new(env!("CARGO_BIN_EXE_pubsub-cgi")), &root, None);
        command.arg("--public-url").arg(SERVER_URL).env("KN_RECEIPTS_MAX_JOURNALS", limit);
        let serve = Serve::spawn(command);
        let mut conn = Conn::connect(serve.addr(), Duration::from_secs(30));
        conn.send("GET", "/kn?do_method=receipts&kn_from=/what/news&kn_id=e1&kn_response_format=simple", b"");
        conn.reply().text()
    };
    let at_limit = ask("4");
    assert_eq!(at_limit.matches("receipt_holds: true").count(), 4, "{at_limit}");
    assert!(!at_limit.contains("not read"), "{at_limit}");
    let past = ask("3");
    assert_eq!(past.matches("receipt_holds: true").count(), 3, "{past}");
    assert!(past.contains("1 more journals routed from '/what/news' were not read: at most 3 per request (KN_RECEIPTS_MAX_JOURNALS)"), "{past}");
}
