//! The names a store knows itself by (`Config::server_url` and `.names`):
//! set by configuration and administrators, never grown by what requests
//! claim (docs/RELIABILITY.md, "Hostile input").

use kn_journal::{Config, Destination, ErrorKind, Store, Topic};

fn names_file(store: &Store) -> String {
    std::fs::read_to_string(store.root().join(".names")).unwrap_or_default()
}

#[test]
fn an_unnamed_store_adopts_its_first_url_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.server_names(), ["http://localhost/kn"]);
    assert!(store.adopt_name("http://first.example/kn").unwrap());
    for i in 0..100 {
        assert!(!store.adopt_name(&format!("http://h{i}.example/kn")).unwrap());
    }
    assert_eq!(names_file(&store), "http://first.example/kn\n");
    // Another process (a later CGI request) sees the same one name.
    let again = Store::open(dir.path()).unwrap();
    assert!(!again.adopt_name("http://other.example/kn").unwrap());
    assert_eq!(again.server_names(), ["http://first.example/kn"]);
    assert!(matches!(again.resolve(b"http://other.example/kn/a").unwrap(), Destination::Remote(_)));
}

#[test]
fn a_configured_store_adopts_no_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path());
    config.server_url = Some("http://configured.example/kn".into());
    let store = Store::open_with(config).unwrap();
    assert!(!store.adopt_name("http://peer.example/kn").unwrap());
    assert!(!store.root().join(".names").exists());
    assert_eq!(store.server_names(), ["http://configured.example/kn"]);
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
    assert_eq!(store.resolve(b"http://alias.example/kn/a").unwrap(), Destination::Local(Topic::parse("/a").unwrap()));
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
        assert!(!store.adopt_name(bad).unwrap(), "{bad:?}");
    }
    assert!(!store.root().join(".names").exists());
}
