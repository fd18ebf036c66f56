//! Hostile input end to end: path traversal in every encoding, a symbolic
//! link planted inside the store, and the modes of the files the store
//! creates, through the real `pubsub.cgi` under Apache and through
//! `pubsub-cgi serve` (its `/kn` and its static files).
//!
//! Each traversal test keeps a sentinel directory `outside/` beside the
//! store (and writable by the server's user, so that only the code stands
//! between an attempt and a write there) and checks, after every attempt,
//! that nothing outside the store was created or modified.

mod support;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use support::{Apache, Dir, Serve, Stream};

/// Topic names (as form values, still urlencoded) that try to leave the
/// store: plain, percent-encoded, double-encoded, overlong UTF-8, NUL,
/// backslashes and mixes of them.
const HOSTILE_TOPICS: &[&str] = &[
    "/../outside/pwned",
    "/../../outside/pwned",
    "../outside/pwned",
    "%2e%2e/outside/pwned",
    "%2E%2E%2Foutside%2Fpwned",
    "/%252e%252e/outside/pwned",
    "/%252e%252e%252foutside%252fpwned",
    "/%c0%ae%c0%ae/outside/pwned",
    "/..%c0%afoutside%c0%afpwned",
    "/%c0%ae%c0%ae%c0%afoutside",
    "/..%00/outside/pwned",
    "/outside%00/pwned",
    "..%5c..%5coutside%5cpwned",
    "/..\\..\\outside\\pwned",
    "%5c..%5coutside",
    "/.%2e/outside/pwned",
    "/%2e./outside/pwned",
    "/what/..%2f..%2foutside",
    "/what/%2e%2e%5c%2e%2e%5coutside",
    "/./outside/pwned",
    "/.kn_lock",
];

/// Request paths after `/kn` (raw, as a client sends them).
const HOSTILE_PATHS: &[&str] = &[
    "/../outside/pwned",
    "/../../outside/pwned",
    "/%2e%2e/outside/pwned",
    "/%2e%2e%2foutside%2fpwned",
    "/%252e%252e/outside/pwned",
    "/%c0%ae%c0%ae/outside/pwned",
    "/..%c0%afoutside",
    "/..%00/outside",
    "/what%00/x",
    "/..%5c..%5coutside",
    "/..\\..\\outside",
    "/%5c..%5coutside",
    "/.%2e/outside",
    "/what/%2e%2e/%2e%2e/outside",
];

// ---------------------------------------------------------------------------
// Snapshots

/// Every path below `root` (not following links) with its kind, size,
/// mode and modification time, except below the `skip` directories.
fn snapshot(root: &Path, skip: &[&Path]) -> BTreeMap<PathBuf, (u32, u64, SystemTime)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if skip.iter().any(|s| path == *s) {
                continue;
            }
            let Ok(meta) = fs::symlink_metadata(&path) else { continue };
            out.insert(path.clone(), (meta.mode(), meta.len(), meta.modified().unwrap_or(SystemTime::UNIX_EPOCH)));
            if meta.is_dir() {
                stack.push(path);
            }
        }
    }
    out
}

/// A test directory with a store `kn_events/` and a sentinel `outside/`
/// beside it holding one file; both writable by the server's user.
struct Sandbox {
    dir: Dir,
    store: PathBuf,
    outside: PathBuf,
    before: BTreeMap<PathBuf, (u32, u64, SystemTime)>,
}

impl Sandbox {
    fn new(name: &str) -> Sandbox {
        let dir = Dir::new(name);
        let store = dir.store("kn_events");
        let outside = dir.create_dir("outside");
        dir.create("outside/secret.txt", "the sentinel's secret\n");
        support::make_writable_by_server(&outside);
        fs::set_permissions(&outside, fs::Permissions::from_mode(0o777)).expect("chmod outside");
        // Static files for `serve` (and a link out of them), made before
        // the snapshot.
        let www = dir.create_dir("www");
        dir.create("www/index.html", "<p>index</p>\n");
        dir.create("www/a/page.txt", "a page\n");
        std::os::unix::fs::symlink(outside.join("secret.txt"), www.join("leak.txt")).expect("plant leak.txt");
        std::os::unix::fs::symlink(&outside, www.join("leakdir")).expect("plant leakdir");
        let before = snapshot(dir.path(), &[&store]);
        Sandbox { dir, store, outside, before }
    }

    /// Panics if anything outside the store was created, removed or
    /// modified since [`Sandbox::new`] (apart from the `skip` paths,
    /// e.g. a static directory or a planted link).
    fn assert_untouched(&self, after_what: &str, skip: &[&Path]) {
        let mut skipped = vec![self.store.as_path()];
        skipped.extend_from_slice(skip);
        let now = snapshot(self.dir.path(), &skipped);
        let before: BTreeMap<_, _> = self.before.iter().filter(|(p, _)| !skip.iter().any(|s| p.starts_with(s))).collect();
        let now_ref: BTreeMap<_, _> = now.iter().collect();
        assert_eq!(before, now_ref, "something outside the store changed after {after_what}");
        let outside = fs::read_dir(&self.outside).expect("read outside").count();
        assert_eq!(outside, 1, "a file appeared in {} after {after_what}", self.outside.display());
    }

    /// Fails if the store holds a directory or file whose name could only
    /// come from a hostile topic.
    fn assert_store_names_plain(&self) {
        for path in snapshot(&self.store, &[]).keys() {
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            assert!(!name.contains("..") && !name.contains('\\') && !name.contains('%'), "stray store entry {}", path.display());
            assert!(!name.contains("pwned"), "a hostile topic was stored: {}", path.display());
        }
    }
}

/// Sends a raw HTTP/1.0 request to `base` (`http://host:port`) and returns
/// the status code and the whole response.
fn raw(base: &str, method: &str, target: &str, body: &str) -> (u16, String) {
    let host = base.trim_start_matches("http://");
    let request = if body.is_empty() {
        format!("{method} {target} HTTP/1.0\r\nHost: {host}\r\n\r\n")
    } else {
        format!(
            "{method} {target} HTTP/1.0\r\nHost: {host}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let mut stream = Stream::send(base, request.as_bytes());
    stream.read_to_end(Duration::from_secs(15));
    let status = stream.status().unwrap_or(0);
    (status, stream.text())
}

fn form_post(url: &str, body: &str) -> support::Response {
    support::post(url, "application/x-www-form-urlencoded", body.as_bytes())
}

/// Every hostile topic as `kn_to` of a notify and as `kn_from` of a
/// route, and every hostile path after `/kn`, against the server at
/// `base` whose protocol is at `base/kn`.
fn attack_kn(base: &str, sandbox: &Sandbox) {
    let url = format!("{base}/kn");
    // The control: an ordinary post is stored.
    let ok = form_post(&url, "kn_to=/what/ok&kn_payload=fine&kn_response_format=simple");
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert!(sandbox.store.join("what/ok").is_dir(), "the control post was not stored");

    for topic in HOSTILE_TOPICS {
        let notify = form_post(&url, &format!("kn_to={topic}&kn_payload=pwned&kn_response_format=simple"));
        assert!(!(200..300).contains(&notify.status), "notify to {topic:?} answered {}: {}", notify.status, notify.text());
        let route = form_post(
            &url,
            &format!("do_method=route&kn_from={topic}&kn_to=/what/ok/kn_journal&kn_response_format=simple"),
        );
        assert!(!(200..300).contains(&route.status), "route from {topic:?} answered {}: {}", route.status, route.text());
        let reverse = form_post(&url, &format!("do_method=route&kn_from=/what/ok&kn_to={topic}&kn_response_format=simple"));
        // A route *to* a hostile name is refused, or stored as a remote
        // URL that the outbound policy (deny) never requests; either way
        // no file may appear outside the store.
        let _ = reverse;
        sandbox.assert_untouched(&format!("kn_to/kn_from {topic:?}"), &[]);
    }
    for path in HOSTILE_PATHS {
        for (method, body) in [("GET", ""), ("POST", "kn_payload=pwned&kn_response_format=simple")] {
            let (status, text) = raw(base, method, &format!("/kn{path}?kn_response_format=simple"), body);
            assert!(!(200..300).contains(&status), "{method} /kn{path} answered {status}: {text}");
            sandbox.assert_untouched(&format!("{method} /kn{path}"), &[]);
        }
    }
    sandbox.assert_store_names_plain();
}

/// A link `kn_events/evil -> outside` and `kn_events/what/evil2 ->
/// outside`: posting through them, reading through them and routing from
/// them is refused with a message naming the link.
fn attack_symlinks(base: &str, sandbox: &Sandbox) {
    let url = format!("{base}/kn");
    let ok = form_post(&url, "kn_to=/what/ok&kn_payload=fine&kn_response_format=simple");
    assert_eq!(ok.status, 200, "{}", ok.text());
    std::os::unix::fs::symlink(&sandbox.outside, sandbox.store.join("evil")).expect("plant evil");
    std::os::unix::fs::symlink(&sandbox.outside, sandbox.store.join("what/evil2")).expect("plant evil2");
    for topic in ["/evil/x", "/evil", "/what/evil2/x", "/evil/x/kn_journal"] {
        let r = form_post(&url, &format!("kn_to={topic}&kn_payload=pwned&kn_response_format=simple"));
        if topic.ends_with("/kn_journal") {
            // A journal nobody reads is refused first as stale (404).
            assert!(!(200..300).contains(&r.status), "notify to {topic} through a link: {}", r.text());
        } else {
            assert_eq!(r.status, 403, "notify to {topic} through a link: {}", r.text());
            assert!(r.text().contains("symbolic link"), "the refusal says why: {}", r.text());
        }
        // A GET on a topic opens a tunnel reading it: refused at once.
        let (status, text) = raw(base, "GET", &format!("/kn{topic}?kn_response_format=simple&do_max_n=10"), "");
        assert_eq!(status, 403, "reading {topic} through a link: {text}");
        let r = form_post(&url, &format!("do_method=route&kn_from={topic}&kn_to=/who/me/kn_journal&kn_response_format=simple"));
        assert!(!(200..300).contains(&r.status), "routing from {topic} through a link answered {}: {}", r.status, r.text());
    }
    sandbox.assert_untouched("posting through planted links", &[]);
    let r = form_post(&url, "kn_to=/what/ok&kn_payload=still+fine&kn_response_format=simple");
    assert_eq!(r.status, 200, "other topics still work: {}", r.text());
}

fn apache_site(name: &str) -> Option<(Apache, Sandbox)> {
    if !support::available(support::APACHE) {
        return None;
    }
    let sandbox = Sandbox::new(name);
    let apache = Apache::start(&support::pubsub_cgi(), &sandbox.store, "");
    Some((apache, sandbox))
}

#[test]
fn apache_traversal_in_every_encoding_stays_in_the_store() {
    let Some((apache, sandbox)) = apache_site("hostile_apache") else { return };
    attack_kn(&apache.base_url(), &sandbox);
    drop(apache);
}

#[test]
fn apache_symlink_planted_in_the_store_is_refused() {
    let Some((apache, sandbox)) = apache_site("hostile_apache_link") else { return };
    attack_symlinks(&apache.base_url(), &sandbox);
    drop(apache);
}

// ---------------------------------------------------------------------------
// pubsub-cgi serve

fn serve_site(name: &str) -> (Serve, Sandbox, PathBuf) {
    let sandbox = Sandbox::new(name);
    let www = sandbox.dir.join("www");
    let mut command = Serve::command(&sandbox.store, Some(&www));
    command.env_remove("KN_OUTBOUND");
    let serve = Serve::spawn(command);
    (serve, sandbox, www)
}

#[test]
fn serve_traversal_in_every_encoding_stays_in_the_store() {
    let (serve, sandbox, www) = serve_site("hostile_serve");
    attack_kn(&serve.base, &sandbox);
    sandbox.assert_untouched("the /kn attacks", &[]);
    drop(www);
}

#[test]
fn serve_symlink_planted_in_the_store_is_refused() {
    let (serve, sandbox, www) = serve_site("hostile_serve_link");
    attack_symlinks(&serve.base, &sandbox);
    sandbox.assert_untouched("the link attacks", &[]);
    drop(www);
}

#[test]
fn serve_static_files_never_leave_the_static_directory() {
    let (serve, sandbox, www) = serve_site("hostile_static");
    let (status, text) = raw(&serve.base, "GET", "/a/page.txt", "");
    assert_eq!(status, 200, "the control file is served: {text}");
    assert!(text.contains("a page"));
    let attempts = [
        "/../outside/secret.txt",
        "/../../outside/secret.txt",
        "/a/../../outside/secret.txt",
        "/%2e%2e/outside/secret.txt",
        "/%2E%2E%2Foutside%2Fsecret.txt",
        "/a/%2e%2e/%2e%2e/outside/secret.txt",
        "/%252e%252e/outside/secret.txt",
        "/%252e%252e%252foutside%252fsecret.txt",
        "/%c0%ae%c0%ae/outside/secret.txt",
        "/%c0%ae%c0%ae%c0%afoutside%c0%afsecret.txt",
        "/..%c0%afoutside%c0%afsecret.txt",
        "/..%00/outside/secret.txt",
        "/a/page.txt%00.html",
        "/..%5c..%5coutside%5csecret.txt",
        "/..\\..\\outside\\secret.txt",
        "/%5c..%5coutside%5csecret.txt",
        "/.%2e/outside/secret.txt",
        "/%2e./outside/secret.txt",
        "/leak.txt",
        "/leakdir/secret.txt",
        "/leakdir/",
        "//outside/secret.txt",
        "/%2foutside%2fsecret.txt",
    ];
    for path in attempts {
        for method in ["GET", "HEAD"] {
            let (status, text) = raw(&serve.base, method, path, "");
            assert!(!(200..300).contains(&status), "{method} {path} answered {status}: {text}");
            assert!(!text.contains("sentinel's secret"), "{method} {path} leaked the sentinel: {text}");
        }
    }
    // POST and PUT to a static path write nothing.
    for method in ["POST", "PUT"] {
        let (status, text) = raw(&serve.base, method, "/../outside/pwned", "x=1");
        assert!(!(200..300).contains(&status), "{method} answered {status}: {text}");
    }
    sandbox.assert_untouched("the static attacks", &[]);
    drop(www);
}

// ---------------------------------------------------------------------------
// File modes

/// Checks every file and directory the store created under `store`:
/// files `0664`, directories `2775` (group-writable, never
/// world-writable), whatever the umask was.
fn assert_store_modes(store: &Path, umask: u32) -> usize {
    let mut checked = 0;
    for (path, (mode, _, _)) in snapshot(store, &[]) {
        let meta = fs::symlink_metadata(&path).expect("stat");
        let perms = mode & 0o7777;
        assert_eq!(perms & 0o002, 0, "{} is world-writable ({perms:o}, umask {umask:03o})", path.display());
        if meta.is_dir() {
            assert_eq!(perms, 0o2775, "directory {} (umask {umask:03o})", path.display());
        } else {
            assert_eq!(perms, 0o664, "file {} (umask {umask:03o})", path.display());
            assert_ne!(perms & 0o020, 0, "{} is not group-writable", path.display());
        }
        checked += 1;
    }
    checked
}

/// Makes `pubsub.cgi` a shell wrapper that sets `umask` and runs a copy of
/// the real program, so Apache's CGI runs with that umask.
fn umask_wrapper(dir: &Dir, umask: u32) -> PathBuf {
    let real = dir.join("pubsub-cgi.real");
    fs::copy(support::pubsub_cgi(), &real).expect("copy pubsub-cgi");
    fs::set_permissions(&real, fs::Permissions::from_mode(0o755)).expect("chmod");
    dir.create_script("wrapper/pubsub.cgi", &format!("#!/bin/sh\numask {umask:03o}\nexec {}\n", real.display()))
}

/// Topics, routes, journals, heartbeats, announcements and `.names`.
fn exercise(url: &str) {
    // A tunnel on the journal creates it and its heartbeat (a journal no
    // tunnel reads refuses posts as stale); hang up at the end.
    let mut tunnel = Stream::get(&format!("{url}/who/me/kn_journal?do_method=route&kn_response_format=simple&do_max_n=5"));
    assert!(tunnel.read_until(b"\r\n\r\n", Duration::from_secs(20)), "the journal tunnel: {}", tunnel.text());
    assert_eq!(tunnel.status(), Some(200), "the journal tunnel: {}", tunnel.text());
    let posts = [
        "kn_to=/what/chat&kn_payload=hello&kn_response_format=simple",
        "kn_to=/what/chat&kn_payload=again&kn_id=x1&kn_response_format=simple",
        "do_method=route&kn_from=/what/chat&kn_to=/who/me/kn_journal&kn_response_format=simple",
        "kn_to=/what/chat&kn_payload=routed&kn_response_format=simple",
        "kn_to=/who/me/kn_journal&kn_payload=direct&kn_response_format=simple",
    ];
    for body in posts {
        let r = form_post(url, body);
        assert_eq!(r.status, 200, "{body}: {}", r.text());
    }
    assert!(tunnel.read_until(b"direct", Duration::from_secs(20)), "the journal tunnel: {}", tunnel.text());
    drop(tunnel);
}

#[test]
fn apache_cgi_files_are_group_writable_never_world_writable() {
    if !support::available(support::APACHE) {
        return;
    }
    for umask in [0o000, 0o077] {
        let dir = Dir::new(&format!("hostile_modes_{umask:03o}"));
        let store = dir.store("kn_events");
        let cgi = umask_wrapper(&dir, umask);
        let apache = Apache::start(&cgi, &store, "");
        exercise(&apache.url());
        drop(apache);
        let checked = assert_store_modes(&store, umask);
        assert!(checked >= 8, "only {checked} store entries under umask {umask:03o}");
        assert!(store.join("who/me/kn_journal/.heartbeat").exists(), "the journal's heartbeat was checked too");
    }
}

#[test]
fn serve_files_are_group_writable_never_world_writable() {
    for umask in [0o000, 0o077] {
        let dir = Dir::new(&format!("hostile_serve_modes_{umask:03o}"));
        let store = dir.join("kn_events");
        let www = dir.create_dir("www");
        // `exec` keeps serve's arguments: $0 is the program, $@ the rest.
        let serve_args = Serve::command(&store, Some(&www));
        let mut command = Command::new("/bin/sh");
        command
            .arg("-c")
            .arg(format!("umask {umask:03o}; exec \"$0\" \"$@\""))
            .arg(serve_args.get_program())
            .args(serve_args.get_args())
            .env_remove("KN_EVENTS")
            .env_remove("GATEWAY_INTERFACE");
        let serve = Serve::spawn(command);
        exercise(&format!("{}/kn", serve.base));
        drop(serve);
        let root = fs::metadata(&store).expect("store created").mode() & 0o7777;
        assert_eq!(root, 0o2775, "the store root serve created (umask {umask:03o})");
        let checked = assert_store_modes(&store, umask);
        assert!(checked >= 8, "only {checked} store entries under umask {umask:03o}");
        assert!(store.join("who/me/kn_journal/.heartbeat").exists(), "the journal's heartbeat was checked too");
    }
}
