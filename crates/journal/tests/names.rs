//! The names a store knows itself by (`Config::server_url` and `.names`):
//! every URL of this machine a request reached the server by is one of
//! them (PROTOCOL.md 6: the original "remembered every URL it was
//! reached by"), in a bounded set that what requests claim can move around
//! but never grow, and a fresh store takes its first name from elsewhere
//! once (docs/RELIABILITY.md, "Hostile input"); `serve`'s own names and an
//! administrator's stay.

use kn_journal::{Config, ErrorKind, Store, Topic};
use kn_journal::internal::{Destination, NameKind};

fn names_file(store: &Store) -> String {
    std::fs::read_to_string(store.root().join(".names")).unwrap_or_default()
}

fn local(path: &str) -> Destination {
    Destination::Local(Topic::parse(path).unwrap())
}

#[test]
fn a_port_less_host_first_never_hides_the_real_url() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.server_names(), ["http://localhost/kn"]);
    // An HTTP/1.0-style client first: `Host: 127.0.0.1`, under a web
    // server that reports its default port.
    store.learn_names(&["http://127.0.0.1/kn"]).unwrap();
    // Then clients with the real port.
    store.learn_names(&["http://127.0.0.1:8095/kn"]).unwrap();
    let again = Store::open(dir.path()).unwrap();
    assert_eq!(again.resolve(b"http://127.0.0.1:8095/kn/who/a/kn_journal").unwrap(), local("/who/a/kn_journal"));
    assert_eq!(again.resolve(b"http://127.0.0.1/kn/what/x").unwrap(), local("/what/x"));
    // Another host's URL stays remote.
    assert!(matches!(again.resolve(b"http://192.0.2.7:8095/kn/a").unwrap(), Destination::Remote(_)));
}

#[test]
fn a_host_elsewhere_is_taken_once_by_a_fresh_store_and_never_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    // This machine's names do not count: a fresh install tried locally
    // first still takes its public name.
    store.learn_names(&["http://127.0.0.1:8080/kn"]).unwrap();
    store.learn_names(&["http://pubsub.example.org/kn"]).unwrap();
    store.learn_names(&["http://peer.example.org/kn"]).unwrap();
    assert_eq!(store.resolve(b"http://pubsub.example.org/kn/a").unwrap(), local("/a"));
    assert!(matches!(store.resolve(b"http://peer.example.org/kn/a").unwrap(), Destination::Remote(_)));
    assert_eq!(store.server_url(), "http://pubsub.example.org/kn");
    // Kept for good: a flood of this machine's names cannot push it out.
    for i in 0..100 {
        store.learn_names(&[format!("http://127.0.0.{i}:8080/kn")]).unwrap();
    }
    store.learn_names(&["http://peer.example.org/kn"]).unwrap();
    assert!(matches!(store.resolve(b"http://peer.example.org/kn/a").unwrap(), Destination::Remote(_)));
    assert_eq!(store.resolve(b"http://pubsub.example.org/kn/a").unwrap(), local("/a"));
}

#[test]
fn a_port_less_learned_name_of_this_machine_covers_its_ports() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    // Only port-less requests so far (under Apache, `SERVER_PORT` is then
    // the default port, whatever port they came in on).
    store.learn_names(&["http://127.0.0.1/kn"]).unwrap();
    assert_eq!(store.resolve(b"http://127.0.0.1:8095/kn/what/x").unwrap(), local("/what/x"));
    assert_eq!(store.resolve(b"http://localhost:8095/kn/what/x").unwrap(), local("/what/x"));
    // Not another script of this machine, nor another machine.
    assert!(matches!(store.resolve(b"http://127.0.0.1:8095/other/what/x").unwrap(), Destination::Remote(_)));
    assert!(matches!(store.resolve(b"http://192.0.2.1:8095/kn/what/x").unwrap(), Destination::Remote(_)));
    // A name with its port (serve's own) covers that port only.
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.record_server_names("h", &["http://127.0.0.1:8080/kn"]).unwrap();
    assert!(matches!(store.resolve(b"http://127.0.0.1:8095/kn/what/x").unwrap(), Destination::Remote(_)));
}

#[test]
fn an_alias_of_this_machine_with_a_names_port_is_local() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.record_server_names("host1", &["http://127.0.0.1:8080/kn"]).unwrap();
    assert_eq!(store.resolve(b"http://localhost:8080/kn/what/chat").unwrap(), local("/what/chat"));
    assert_eq!(store.resolve(b"http://[::1]:8080/kn/what/chat?x=1").unwrap(), local("/what/chat"));
    // Another port of this machine is another server.
    assert!(matches!(store.resolve(b"http://localhost:8081/kn/what/chat").unwrap(), Destination::Remote(_)));
}

#[test]
fn random_hosts_leave_the_names_bounded_and_keep_serves_and_pinned_ones() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path());
    config.max_names = 8;
    let store = Store::open_with(config).unwrap();
    store.add_server_name("http://pinned.example/kn").unwrap();
    store.record_server_names("host1", &["http://127.0.0.1:8080/kn"]).unwrap();
    for i in 0..2_000 {
        // Loopback addresses are all this machine: learned, the set bounded.
        store.learn_names(&[format!("http://127.0.{}.{}:8080/kn", i / 250, i % 250 + 1)]).unwrap();
        // A name elsewhere, on a store that has one: never learned.
        store.learn_names(&[format!("http://h{i}.example/kn")]).unwrap();
    }
    let entries = store.server_name_entries();
    assert_eq!(entries.iter().filter(|n| n.kind == NameKind::Learned).count(), 8);
    assert_eq!(entries.len(), 10);
    assert!(names_file(&store).lines().count() == 10);
    // The most recent learned names stay; the pinned and serve's too.
    assert_eq!(store.resolve(b"http://127.0.7.250:8080/kn/a").unwrap(), local("/a"));
    assert!(matches!(store.resolve(b"http://h1999.example/kn/a").unwrap(), Destination::Remote(_)));
    assert_eq!(store.resolve(b"http://pinned.example/kn/a").unwrap(), local("/a"));
    assert_eq!(store.resolve(b"http://127.0.0.1:8080/kn/a").unwrap(), local("/a"));
    assert_eq!(store.server_url(), "http://pinned.example/kn");
}

#[test]
fn known_names_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.learn_names(&["http://a.example/kn"]).unwrap();
    let before = std::fs::metadata(store.root().join(".names")).unwrap().modified().unwrap();
    assert!(store.knows_names(&["http://a.example/kn"]));
    std::thread::sleep(std::time::Duration::from_millis(20));
    store.learn_names(&["http://a.example/kn"]).unwrap();
    assert_eq!(std::fs::metadata(store.root().join(".names")).unwrap().modified().unwrap(), before);
    assert!(!store.knows_names(&["http://b.example/kn"]));
}

#[test]
fn a_serve_start_replaces_its_hosts_names_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.record_server_names("host1", &["http://127.0.0.1:8080/kn"]).unwrap();
    store.record_server_names("host2", &["http://10.0.0.2:8080/kn"]).unwrap();
    store.record_server_names("host1", &["http://127.0.0.1:9090/kn"]).unwrap();
    let names = store.server_names();
    assert!(names.contains(&"http://127.0.0.1:9090/kn".to_string()));
    assert!(names.contains(&"http://10.0.0.2:8080/kn".to_string()));
    assert!(!names.contains(&"http://127.0.0.1:8080/kn".to_string()));
}

#[test]
fn an_older_names_file_is_read_as_pinned_names() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(".names"), "http://old.example/kn\nhttp://older.example/kn\n").unwrap();
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.server_names(), ["http://old.example/kn", "http://older.example/kn"]);
    assert!(store.server_name_entries().iter().all(|n| n.kind == NameKind::Pinned));
}

#[test]
fn a_configured_name_comes_first() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path());
    config.server_url = Some("http://configured.example/kn".into());
    let store = Store::open_with(config).unwrap();
    store.learn_names(&["http://configured.example/kn"]).unwrap();
    assert!(!store.root().join(".names").exists(), "the configured name is not written");
    store.learn_names(&["http://peer.example/kn", "http://127.0.0.1:81/kn"]).unwrap();
    assert_eq!(store.server_names(), ["http://configured.example/kn", "http://127.0.0.1:81/kn"]);
}

#[test]
fn an_administrator_adds_and_removes_names() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path());
    config.server_url = Some("http://main.example/kn".into());
    let store = Store::open_with(config).unwrap();
    store.add_server_name("http://alias.example/kn").unwrap();
    store.add_server_name("http://alias.example/kn").unwrap();
    assert_eq!(names_file(&store), "http://alias.example/kn\n", "added once");
    assert_eq!(store.resolve(b"http://alias.example/kn/a").unwrap(), local("/a"));
    assert!(store.remove_server_name("http://alias.example/kn").unwrap());
    assert!(!store.remove_server_name("http://alias.example/kn").unwrap());
    assert_eq!(names_file(&store), "");
    assert!(matches!(store.resolve(b"http://alias.example/kn/a").unwrap(), Destination::Remote(_)));
    assert_eq!(store.server_names(), ["http://main.example/kn"]);
}

#[test]
fn a_name_that_is_no_url_or_spans_lines_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    for bad in ["", "alias.example/kn", "ftp://x/kn", "http://", "http://a/kn\nhttp://b/kn", "http://a b/kn"] {
        let err = store.add_server_name(bad).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BadRequest, "{bad:?}");
        store.learn_names(&[bad]).unwrap();
    }
    assert!(!store.root().join(".names").exists());
}
