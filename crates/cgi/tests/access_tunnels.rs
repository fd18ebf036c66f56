//! Access rules and the readers of the real `pubsub-cgi` (docs/ACCESS.md):
//! an open tunnel whose reader lost the right ends with the refusal at its
//! next delivery, as a CGI process and under `serve`; anonymous visitors'
//! sessions (`do_method=session`, the `kn_session` cookie, the rules'
//! `{session}`), and introspection topics showing only what the reader may
//! see.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kn_journal::{Event, Store, Topic};
use kn_test_support::http::Stream;
use kn_test_support::{wait_for, Dir, Serve};

const BIN: &str = env!("CARGO_BIN_EXE_pubsub-cgi");

const RULES: &str = "\
group staff: anna bob
allow all             /who/{user}/**                 users
allow post,read,route /who/anonymous/s/{session}/**  anonymous
allow read            /who/anonymous/s               anonymous
allow post,read       /what/staff/**                 @staff
allow read            /what/public/**                *
";

const BOB_LEFT: &str = "\
group staff: anna
allow all             /who/{user}/**                 users
allow post,read,route /who/anonymous/s/{session}/**  anonymous
allow read            /who/anonymous/s               anonymous
allow post,read       /what/staff/**                 @staff
allow read            /what/public/**                *
";

struct Site {
    dir: Dir,
}

impl Site {
    fn new(name: &str) -> Site {
        let dir = Dir::new(name);
        dir.create("access.rules", RULES);
        Site { dir }
    }

    fn rules(&self) -> PathBuf {
        self.dir.join("access.rules")
    }

    fn root(&self) -> PathBuf {
        self.dir.join("kn_events")
    }

    /// Posts as a local tool (not checked), as another process would.
    fn post(&self, topic: &str, id: &str, payload: &str) {
        let store = Store::open(self.root()).unwrap();
        store.notify(&Topic::parse(topic).unwrap(), Event::from_pairs([("kn_id", id), ("kn_payload", payload)])).unwrap();
    }

    /// Takes bob out of the staff group, and waits until a long-lived
    /// reader of the rules looks at the file again (once a second).
    fn bob_leaves_the_staff(&self) {
        std::fs::write(self.rules(), BOB_LEFT).unwrap();
        std::thread::sleep(Duration::from_millis(1100));
    }
}

fn serve(site: &Site) -> Serve {
    let mut command = Serve::command_of(Path::new(BIN), &site.root(), None);
    command.args(["--trusted-proxy", "127.0.0.1"]).env("KN_ACCESS_RULES", site.rules());
    Serve::spawn(command)
}

fn open(serve: &Serve, path_and_query: &str, headers: &str) -> Stream {
    let request = format!("GET /kn{path_and_query} HTTP/1.0\r\nHost: {}\r\n{headers}\r\n", serve.addr());
    Stream::send(&format!("http://{}/kn", serve.addr()), request.as_bytes())
}

#[test]
fn serve_ends_an_open_tunnel_with_403_once_its_reader_lost_read() {
    let site = Site::new("access_tunnel_serve");
    let serve = serve(&site);
    let mut tunnel = open(&serve, "/what/staff/plans?kn_response_format=simple", "X-Remote-User: bob\r\n");
    assert!(tunnel.read_until(b"Watching topic", Duration::from_secs(10)), "{}", tunnel.text());
    site.post("/what/staff/plans", "e1", "before-the-change");
    assert!(tunnel.read_until(b"before-the-change", Duration::from_secs(10)), "{}", tunnel.text());

    site.bob_leaves_the_staff();
    site.post("/what/staff/plans", "e2", "after-the-change");
    assert!(tunnel.read_until(b"403 Forbidden", Duration::from_secs(10)), "{}", tunnel.text());
    assert!(tunnel.read_to_end(Duration::from_secs(10)), "the tunnel ends: {}", tunnel.text());
    let text = tunnel.text();
    assert!(!text.contains("after-the-change"), "{text}");
    assert!(text.contains("user 'bob' may not read '/what/staff/plans'"), "{text}");
    // A new tunnel is refused at once.
    let mut again = open(&serve, "/what/staff/plans?kn_response_format=simple", "X-Remote-User: bob\r\n");
    again.read_to_end(Duration::from_secs(10));
    assert_eq!(again.status(), Some(403), "{}", again.text());
}

#[test]
fn a_cgi_tunnel_ends_with_403_once_its_reader_lost_read() {
    let site = Site::new("access_tunnel_cgi");
    let mut child = Command::new(BIN)
        .env_clear()
        .env("GATEWAY_INTERFACE", "CGI/1.1")
        .env("REQUEST_METHOD", "GET")
        .env("QUERY_STRING", "kn_response_format=simple")
        .env("PATH_INFO", "/what/staff/plans")
        .env("SCRIPT_NAME", "/kn")
        .env("SERVER_NAME", "127.0.0.1")
        .env("SERVER_PORT", "8080")
        .env("REMOTE_USER", "bob")
        .env("KN_EVENTS", site.root())
        .env("KN_ACCESS_RULES", site.rules())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let output = Arc::new(Mutex::new(Vec::new()));
    let mut stdout = child.stdout.take().unwrap();
    let collected = Arc::clone(&output);
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 {
                break;
            }
            collected.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    let has = |needle: &str| String::from_utf8_lossy(&output.lock().unwrap()).contains(needle);
    assert!(wait_for(Duration::from_secs(10), || has("Watching topic")));
    site.post("/what/staff/plans", "e1", "before-the-change");
    assert!(wait_for(Duration::from_secs(10), || has("before-the-change")));

    site.bob_leaves_the_staff();
    site.post("/what/staff/plans", "e2", "after-the-change");
    let ended = kn_test_support::wait_exit(&mut child, Duration::from_secs(10));
    if ended.is_none() {
        let _ = child.kill();
    }
    reader.join().unwrap();
    let text = String::from_utf8_lossy(&output.lock().unwrap()).into_owned();
    assert!(ended.is_some(), "the CGI process ends: {text}");
    assert!(text.contains("403 Forbidden") && text.contains("user 'bob' may not read '/what/staff/plans'"), "{text}");
    assert!(!text.contains("after-the-change"), "{text}");
}

/// The `kn_session=...` pair of a `Set-Cookie` header, if any.
fn session_cookie(stream: &Stream) -> Option<String> {
    let head = String::from_utf8_lossy(stream.head()).into_owned();
    let line = head.lines().find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))?;
    Some(line.split_once(':')?.1.trim().split(';').next()?.to_string())
}

fn ask(serve: &Serve, path_and_query: &str, headers: &str) -> Stream {
    let mut stream = open(serve, path_and_query, headers);
    stream.read_to_end(Duration::from_secs(10));
    stream
}

/// The session id in a `do_method=session` answer (its status event's
/// payload).
fn session_id(stream: &Stream) -> String {
    let body = String::from_utf8_lossy(stream.body()).into_owned();
    body.rsplit("\n\n").next().unwrap_or("").trim().to_string()
}

#[test]
fn a_session_cookie_is_the_only_key_to_an_anonymous_visitors_journal() {
    let site = Site::new("access_sessions");
    let serve = serve(&site);
    let first = ask(&serve, "?do_method=session&kn_response_format=simple", "");
    assert_eq!(first.status(), Some(200), "{}", first.text());
    let cookie = session_cookie(&first).expect("a Set-Cookie");
    let head = String::from_utf8_lossy(first.head()).to_ascii_lowercase();
    assert!(head.contains("httponly") && head.contains("samesite=lax") && head.contains("path=/kn"), "{head}");
    let id = session_id(&first);
    assert!(cookie.starts_with(&format!("kn_session={id}.")), "{cookie} / {id}");
    // Asked again with the cookie: the same session, no new cookie.
    let again = ask(&serve, "?do_method=session&kn_response_format=simple", &format!("Cookie: other=1; {cookie}\r\n"));
    assert_eq!(session_id(&again), id);
    assert!(session_cookie(&again).is_none());

    let journal = format!("/who/anonymous/s/{id}/page/kn_journal");
    let with_cookie = format!("Cookie: {cookie}\r\n");
    let own = ask(&serve, &format!("{journal}?kn_response_format=simple&kn_expires=%2B0"), &with_cookie);
    assert_eq!(own.status(), Some(200), "{}", own.text());
    // Another visitor (a cookie of its own), no cookie, a forged one: 401.
    let other = session_cookie(&ask(&serve, "?do_method=session&kn_response_format=simple", "")).unwrap();
    let forged = format!("kn_session={id}.{}", "0".repeat(64));
    for headers in [format!("Cookie: {other}\r\n"), String::new(), format!("Cookie: {forged}\r\n")] {
        let refused = ask(&serve, &format!("{journal}?kn_response_format=simple&kn_expires=%2B0"), &headers);
        assert_eq!(refused.status(), Some(401), "{headers}: {}", refused.text());
    }
    // The listing of sessions shows each visitor its own only.
    let listing = |headers: &str| {
        let s = ask(&serve, "/who/anonymous/s/kn_subtopics?kn_response_format=simple&kn_expires=%2B0&do_max_age=infinity", headers);
        String::from_utf8_lossy(s.body()).into_owned()
    };
    let other_id = other.trim_start_matches("kn_session=").split('.').next().unwrap().to_string();
    ask(&serve, &format!("/who/anonymous/s/{other_id}/p/kn_journal?kn_response_format=simple&kn_expires=%2B0"), &format!("Cookie: {other}\r\n"));
    let mine = listing(&with_cookie);
    assert!(mine.contains(&id) && !mine.contains(&other_id), "{mine}");
    let nobodys = listing("");
    assert!(!nobodys.contains(&id) && !nobodys.contains(&other_id), "{nobodys}");
}
