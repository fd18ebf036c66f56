//! `do_method=test` checks the installation: each broken piece of a store
//! (permissions a sensor needs, the free-space reserve, the server names)
//! is reported as a `FAIL` with its reason, and the check's probe leaves
//! nothing behind.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use kn_cgi::{Handler, HttpRequest, Limits, Options, Reply, Request};
use kn_journal::{Config, Store, Topic};

fn self_test(config: Config) -> String {
    let handler = Handler::new(Arc::new(Store::open_with(config).unwrap()), Options::default());
    let http = HttpRequest {
        method: "GET".into(),
        query: b"do_method=test".to_vec(),
        script_name: "/kn".into(),
        server_name: "127.0.0.1".into(),
        server_port: 8080,
        ..HttpRequest::default()
    };
    match handler.handle(&Request::from_http(http, &Limits::default()).unwrap()) {
        Reply::Done(r) => String::from_utf8(r.body).unwrap(),
        Reply::Tunnel(_) => panic!("do_method=test answered a tunnel"),
    }
}

/// The result line of the check whose title starts with `title`.
fn check<'a>(page: &'a str, title: &str) -> &'a str {
    let at = page.find(&format!("<h1>{title}")).unwrap_or_else(|| panic!("no check '{title}' in {page}"));
    let line = &page[at..];
    &line[..line.find('\n').unwrap_or(line.len())]
}

fn fails(page: &str, title: &str, reason: &str) {
    let line = check(page, title);
    assert!(line.contains("</h1><p> FAIL: "), "'{title}' should fail: {line}");
    assert!(line.contains(reason), "'{title}' should say {reason:?}: {line}");
}

fn passes(page: &str, title: &str) {
    let line = check(page, title);
    assert!(line.ends_with("</h1><p> Success."), "'{title}' should pass: {line}");
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A store with one topic holding one event.
fn store_with_a_topic(dir: &Path) -> Config {
    let config = Config::new(dir.join("events"));
    let store = Store::open_with(config.clone()).unwrap();
    let mut event = kn_journal::Event::new();
    event.set("kn_payload", "x");
    store.notify(&Topic::parse("/what/chat").unwrap(), event).unwrap();
    config
}

const WRITE: &str = "Event store stores and reads back a post";
const SPACE: &str = "Free space above the reserve";
const NAMES: &str = "Server names";
const DIRS: &str = "Store directories";
const FILES: &str = "Store files";
const FS: &str = "File system: ";

#[test]
fn a_sound_store_passes_every_check_and_the_probe_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = store_with_a_topic(dir.path());
    let topics = Store::open_with(config.clone()).unwrap().topics().unwrap();
    let page = self_test(config.clone());
    assert!(!page.contains("FAIL"), "{page}");
    for title in [WRITE, SPACE, NAMES, DIRS, FILES, FS] {
        passes(&page, title);
    }
    // A local disk: the mode chosen is said, and nothing more is checked.
    assert!(check(&page, FS).contains("local mode (KN_SHARED=auto)"), "{page}");
    let left: Vec<_> = std::fs::read_dir(&config.root).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(!left.iter().any(|n| n.to_string_lossy().starts_with(".probe")), "{left:?}");
    assert_eq!(Store::open_with(config).unwrap().topics().unwrap(), topics, "the self-test adds no topic");
}

#[test]
fn a_read_only_store_fails_the_directory_check_and_for_a_user_the_write_probe() {
    let dir = tempfile::tempdir().unwrap();
    let config = store_with_a_topic(dir.path());
    chmod(&config.root, 0o555);
    let page = self_test(config.clone());
    chmod(&config.root, 0o2775);
    fails(&page, DIRS, &format!("'{}' (mode 0555)", config.root.display()));
    // root writes whatever the mode says: only another user sees the
    // store refuse the post.
    if unsafe { libc::geteuid() } != 0 {
        fails(&page, WRITE, "cannot create a directory in the store");
    } else {
        eprintln!("running as root: the write probe succeeds in a 0555 directory; not checked here");
    }
}

#[test]
fn a_topic_directory_a_sensor_cannot_write_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let config = store_with_a_topic(dir.path());
    let topic = config.root.join("what/chat");
    chmod(&topic, 0o755);
    let page = self_test(config);
    fails(&page, DIRS, &format!("'{}' (mode 0755)", topic.display()));
    passes(&page, FILES);
    passes(&page, WRITE);
}

#[test]
fn a_world_writable_directory_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let config = store_with_a_topic(dir.path());
    chmod(&config.root.join("what"), 0o2777);
    fails(&self_test(config), DIRS, "world-writable");
}

#[test]
fn a_data_file_a_sensor_cannot_write_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let config = store_with_a_topic(dir.path());
    let topic = config.root.join("what/chat");
    let file = std::fs::read_dir(&topic).unwrap().flatten().find(|e| e.path().is_file()).expect("a file in the topic").path();
    chmod(&file, 0o644);
    let page = self_test(config);
    fails(&page, FILES, &format!("'{}' (mode 0644)", file.display()));
    passes(&page, DIRS);
}

#[test]
fn a_reserve_above_the_free_space_fails_the_space_check_and_the_write_probe() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = store_with_a_topic(dir.path());
    config.reserve_bytes = u64::MAX;
    let page = self_test(config);
    fails(&page, SPACE, "below the reserve");
    fails(&page, WRITE, "");
}

#[test]
fn a_server_name_that_is_no_url_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = store_with_a_topic(dir.path());
    config.server_url = Some("example.org/kn".into());
    fails(&self_test(config.clone()), NAMES, "the configured server URL (KN_SERVER_URL) 'example.org/kn' is not an absolute");
    config.server_url = Some("http://example.org/kn/".into());
    fails(&self_test(config.clone()), NAMES, "without a final '/'");
    config.server_url = None;
    std::fs::write(config.root.join(".names"), "http://127.0.0.1:8080/kn\nhttp:///kn\n").unwrap();
    fails(&self_test(config), NAMES, "'http:///kn'");
}
