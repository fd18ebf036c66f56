//! `pubsub.cgi` end to end under a real Apache 2.4 (`mpm_event` +
//! `mod_cgid`, as Debian ships it), mounted at `/kn` with `ScriptAlias`:
//! the protocol as old clients see it through a web server, plus what only
//! a real deployment can show (streaming through Apache, hung-up clients,
//! the search-string rule, outbound routes, limits).
//!
//! Each test starts its own Apache on its own port with its own store, so
//! the tests run in parallel. They skip (with a message) when Apache is
//! not installed, except under `CI`.

mod e2e;
mod support;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use e2e::{notify, post_simple, route, routes_of, KnServer, Tunnel, PATIENCE};
use support::{Apache, Dir};

/// Apache serving `pubsub.cgi` at `/kn` over a fresh store, with `extra`
/// appended to its configuration. Apache stops before the directory goes.
struct Site {
    apache: Apache,
    store: std::path::PathBuf,
    _dir: Dir,
}

impl std::ops::Deref for Site {
    type Target = Apache;
    fn deref(&self) -> &Apache {
        &self.apache
    }
}

fn site(name: &str, extra: &str) -> Option<Site> {
    if !support::available(support::APACHE) {
        return None;
    }
    let dir = Dir::new(name);
    let store = dir.store("kn_events");
    let apache = Apache::start(&support::pubsub_cgi(), &store, extra);
    Some(Site { apache, store, _dir: dir })
}

#[test]
fn apache_notify_answers_200_notified_in_simple_and_js() {
    let Some(s) = site("apache_notify", "") else { return };
    e2e::notify_answers_200_notified(&*s);

    // The status line carries the status event's reason phrase.
    let (line, text) = e2e::raw_post(&s.url(), &e2e::host_and_path(&s.url()).0, "kn_to=/what/chat&kn_payload=x&kn_id=e3");
    assert_eq!(line, "HTTP/1.1 200 Notified", "{text}");
    let (line, text) = e2e::raw_post(
        &s.url(),
        &e2e::host_and_path(&s.url()).0,
        "kn_to=/what/chat&kn_payload=x&kn_id=e4&kn_response_format=simple",
    );
    assert_eq!(line, "HTTP/1.1 200 Notified", "{text}");
    assert!(text.contains("Content-Type: text/plain; charset=utf-8\r\n"), "{text}");
}

#[test]
fn apache_route_answers_200_routed() {
    let Some(s) = site("apache_route", "") else { return };
    e2e::route_answers_200_routed(&*s);
}

/// The functional requirement behind the tunnel design: no polling delay.
/// The store's fallback poll is set to 10 s so that only change
/// notification can deliver within the limit.
#[test]
fn apache_tunnel_receives_the_status_at_once_and_events_within_100ms() {
    let Some(s) = site("apache_tunnel", "SetEnv KN_POLL_MS 10000\n") else { return };
    let latencies = e2e::tunnel_receives_routed_events_at_once(&*s);
    let median = latencies[1];
    eprintln!("apache tunnel latencies (notify sent -> event on the tunnel): {latencies:?}, median {median:?}");
    assert!(median < Duration::from_millis(100), "tunnel latency {latencies:?}: the median is over 100 ms");
}

#[test]
fn apache_routing_loop_terminates_and_the_notify_answers() {
    let Some(s) = site("apache_loop", "") else { return };
    route(&*s, "/loop/a", "/loop/b", "ab", "");
    route(&*s, "/loop/b", "/loop/a", "ba", "");
    let started = Instant::now();
    let status = notify(&*s, "/loop/a", "x1", "round and round");
    let took = started.elapsed();
    eprintln!("notify into an A<->B loop answered in {took:?}");
    assert!(took < PATIENCE, "{took:?}");
    let payload = status.payload_text();
    assert!(payload.contains("Wrote to '/loop/a' (x1)"), "{payload}");
    assert!(payload.contains("Wrote to '/loop/b'"), "{payload}");
    // And again with a new event: the loop did not wedge anything.
    notify(&*s, "/loop/b", "x2", "and back");
}

#[test]
fn apache_batch_frames_arrive_on_the_tunnel_in_order() {
    let Some(s) = site("apache_batch", "") else { return };
    e2e::batch_frames_arrive_in_order(&*s);
}

#[test]
fn apache_status_to_answers_204() {
    let Some(s) = site("apache_status_to", "") else { return };
    e2e::status_to_answers_204(&*s);
    // Exactly "204 Content forwarded" on the wire, with no body.
    let (line, text) = e2e::raw_post(
        &s.url(),
        &e2e::host_and_path(&s.url()).0,
        "kn_to=/what/chat&kn_payload=x&kn_status_to=/who/a/s/1/kn_journal",
    );
    assert_eq!(line, "HTTP/1.1 204 Content forwarded", "{text}");
    assert!(text.ends_with("\r\n\r\n"), "a 204 has no body: {text:?}");
}

#[test]
fn apache_path_info_names_the_topic() {
    let Some(s) = site("apache_path_info", "") else { return };
    e2e::path_info_names_the_topic(&*s);
}

/// `kn_to`/`kn_from` may be absolute URLs of this server: its names (this
/// machine's URLs that requests came by, the first public name of a fresh
/// store, and those an administrator adds to `.names`); others are
/// refused as proxying, also after a request came by them.
#[test]
fn apache_absolute_urls_are_local_for_the_server_names_only() {
    let Some(s) = site("apache_absolute", "") else { return };
    let chat = format!("{}/what/chat", s.url());
    let status = notify(&*s, &chat, "a1", "absolute");
    assert!(status.payload_text().contains("Wrote to '/what/chat' (a1)"), "{status:?}");
    route(&*s, &chat, &format!("{}/who/a/s/1/kn_journal", s.url()), "ra", "");

    // A fresh store takes the first public name it is reached by, once.
    let port = s.port();
    let (line, text) = e2e::raw(
        &s.url(),
        format!("GET /kn?do_method=whoami HTTP/1.0\r\nHost: kn-public.test:{port}\r\n\r\n").as_bytes(),
    );
    assert!(line.contains(" 200 "), "{text}");
    let public = format!("http://kn-public.test:{port}/kn/what/chat");
    let (resp, status) = post_simple(&s.url(), &[("kn_to", &public), ("kn_payload", "x"), ("kn_id", "a0")]);
    assert_eq!(resp.status, 200, "the first public name: {status:?}");

    // Another name for the same server: foreign, even after a request came by it.
    let alias = format!("http://kn-alias.test:{port}/kn/what/chat");
    let (resp, status) = post_simple(&s.url(), &[("kn_to", &alias), ("kn_payload", "x"), ("kn_id", "a2")]);
    assert_eq!(resp.status, 403, "{status:?}");
    assert_eq!(status.status(), "403 Proxying not supported");
    let (line, text) = e2e::raw(
        &s.url(),
        format!("GET /kn?do_method=whoami HTTP/1.0\r\nHost: kn-alias.test:{port}\r\n\r\n").as_bytes(),
    );
    assert!(line.contains(" 200 "), "{text}");
    let (resp, status) = post_simple(&s.url(), &[("kn_to", &alias), ("kn_payload", "x"), ("kn_id", "a2")]);
    assert_eq!(resp.status, 403, "a Host is no name: {status:?}");
    // Until an administrator adds it (`kn names add`).
    let store = kn_journal::Store::open(&s.store).expect("the store");
    store.add_server_name(&format!("http://kn-alias.test:{port}/kn")).expect("add the name");
    let (resp, status) = post_simple(&s.url(), &[("kn_to", &alias), ("kn_payload", "x"), ("kn_id", "a2")]);
    assert_eq!(resp.status, 200, "{status:?}\n{}", s.error_log());
    assert!(status.payload_text().contains("Wrote to '/what/chat' (a2)"), "{status:?}");

    // `.../knfoo` is not the topic `/foo` of `.../kn`.
    let (resp, status) = post_simple(&s.url(), &[("kn_to", &format!("{}foo", s.url())), ("kn_payload", "x")]);
    assert_eq!(resp.status, 403, "{status:?}");
}

/// A journal no tunnel reads is stale: a notify to it is `404 Expired`, and
/// a route into it is poisoned by the first event that travels it.
#[test]
fn apache_stale_journal_expires_and_poisons_its_routes() {
    let Some(s) = site("apache_stale", "") else { return };
    let (resp, status) =
        post_simple(&s.url(), &[("kn_to", "/who/z/s/1/kn_journal"), ("kn_payload", "x"), ("kn_id", "s1")]);
    assert_eq!(resp.status, 404, "{status:?}\n{}", s.error_log());
    assert_eq!(status.status(), "404 Expired");

    route(&*s, "/what/p", "/who/z/s/1/kn_journal", "rp", "http://example/p");
    let before = routes_of(&*s, "/what/p");
    let rp = before.iter().find(|(id, _, _)| id == "rp").unwrap_or_else(|| panic!("{before:?}"));
    assert_eq!(rp.1, format!("{}/who/z/s/1/kn_journal", s.url()));

    notify(&*s, "/what/p", "n1", "into a stale journal");
    let after = routes_of(&*s, "/what/p");
    let rp = after.iter().find(|(id, _, _)| id == "rp").unwrap_or_else(|| panic!("{after:?}"));
    assert_eq!(rp.1, "", "route not poisoned: {after:?}");
    assert!(rp.2.get("kn_expires").is_some(), "a poisoned route expires: {:?}", rp.2);
}

/// A route to a remote URL (allowed by `KN_OUTBOUND`) delivers each event
/// as a form POST to that URL.
#[test]
fn apache_remote_route_posts_the_event_urlencoded() {
    let (port, received) = e2e::recording_listener();
    let extra = format!("SetEnv KN_OUTBOUND http://127.0.0.1:{port}/\n");
    let Some(s) = site("apache_remote", &extra) else { return };
    let remote = format!("http://127.0.0.1:{port}/kn/what/in");
    route(&*s, "/what/out", &remote, "rr", "");
    let status = notify(&*s, "/what/out", "ev1", "hello world & more");
    assert!(!status.payload_text().is_empty(), "{status:?}");

    let req = received.recv_timeout(PATIENCE).unwrap_or_else(|_| panic!("nothing reached the remote\n{}", s.error_log()));
    assert_eq!(req.request_line, "POST /kn/what/in HTTP/1.1");
    assert_eq!(req.header("content-type"), Some("application/x-www-form-urlencoded"));
    let form = e2e::form_decode(&req.body);
    let get = |n: &str| form.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
    assert_eq!(get("kn_payload"), Some("hello world & more"), "{form:?}");
    assert_eq!(get("kn_id"), Some("ev1"), "{form:?}");
    assert_eq!(get("do_method"), Some("notify"), "{form:?}");
    assert_eq!(get("kn_routed_from"), Some(format!("{}/what/out", s.url()).as_str()), "{form:?}");
    assert_eq!(get("kn_route_id"), Some("rr"), "{form:?}");
    // The route still stands (the remote said 200).
    let routes = routes_of(&*s, "/what/out");
    assert!(routes.iter().any(|(id, to, _)| id == "rr" && *to == remote), "{routes:?}");
}

/// A remote route to a port where nothing listens: the notify still
/// answers promptly, and the route is kept for a retry (a refused
/// connection is transient, issue 11); with no retries allowed
/// (`KN_FORWARD_RETRIES 0`) it is poisoned at once.
#[test]
fn apache_remote_route_to_a_dead_port_is_kept_for_a_retry_and_the_notify_answers() {
    for retries in ["12", "0"] {
        let dead = support::free_port();
        let extra = format!("SetEnv KN_OUTBOUND http://127.0.0.1:{dead}/\nSetEnv KN_FORWARD_RETRIES {retries}\n");
        let Some(s) = site("apache_dead_remote", &extra) else { return };
        route(&*s, "/what/out", &format!("http://127.0.0.1:{dead}/kn/what/in"), "rd", "");
        let started = Instant::now();
        notify(&*s, "/what/out", "ev1", "nobody home");
        let took = started.elapsed();
        eprintln!("notify with a route to a dead port ({retries} retries) answered in {took:?}");
        assert!(took < Duration::from_secs(5), "{took:?}");
        let routes = routes_of(&*s, "/what/out");
        let rd = routes.iter().find(|(id, _, _)| id == "rd").unwrap_or_else(|| panic!("{routes:?}"));
        if retries == "0" {
            assert_eq!(rd.1, "", "route not poisoned: {routes:?}");
        } else {
            assert_eq!(rd.1, format!("http://127.0.0.1:{dead}/kn/what/in"), "route not kept: {routes:?}");
        }
    }
}

/// Every CGI tunnel is a process with an inotify instance of its own,
/// counted against its user's `fs.inotify.max_user_instances` (128 by
/// default: DEPLOY.md, "Many open tunnels"). With none left a tunnel must
/// neither fail nor hang: it delivers by re-reading every `KN_POLL_MS`
/// and says why, once, in Apache's error log. The CGIs run as `nobody`
/// here, whose instances the test takes for a moment, so that no other
/// test's server is touched.
#[test]
fn apache_tunnel_without_inotify_says_why_in_the_error_log_and_still_delivers() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        support::skip("needs root: Apache's CGIs must run as a user whose inotify instances the test can take");
        return;
    }
    if !support::available(support::APACHE) {
        return;
    }
    let (uid, gid) = nobody();
    let dir = Dir::new("apache_no_inotify");
    let store = dir.store("kn_events");
    let apache = Apache::start(&support::pubsub_cgi(), &store, &format!("User #{uid}\nGroup #{gid}\nSetEnv KN_POLL_MS 200\n"));
    chown_recursive(&store, uid, gid);
    let said = "re-reads every 200 ms (KN_POLL_MS): no change notification, inotify_init: Too many open files (os error 24): \
                the user's inotify instances (fs.inotify.max_user_instances)";

    let taken = take_inotify_instances(uid);
    let mut polling = e2e::Tunnel::open(&e2e::tunnel_url(&apache, "/who/poll/kn_journal", "p", ""));
    polling.expect_watching("p", || apache.error_log());
    notify(&apache, "/who/poll/kn_journal", "p1", "polled");
    let event = polling.next(PATIENCE).unwrap_or_else(|| panic!("no event on the polling tunnel\n{}", apache.error_log()));
    assert_eq!(event.payload_text(), "polled");
    let log = apache.error_log();
    assert!(log.contains(&format!("the tunnel on /who/poll/kn_journal {said}")), "{log}");
    drop(taken);

    // With an instance to be had, a tunnel is woken and says nothing.
    let mut woken = e2e::Tunnel::open(&e2e::tunnel_url(&apache, "/who/woken/kn_journal", "w", ""));
    woken.expect_watching("w", || apache.error_log());
    notify(&apache, "/who/woken/kn_journal", "w1", "woken");
    assert_eq!(woken.next(PATIENCE).map(|e| e.payload_text()).as_deref(), Some("woken"));
    assert_eq!(apache.error_log().matches("no change notification").count(), 1, "{}", apache.error_log());
}

/// The uid and gid of `nobody`.
fn nobody() -> (u32, u32) {
    // SAFETY: getpwnam gets a valid C string; the record is read at once.
    let pw = unsafe { libc::getpwnam(c"nobody".as_ptr()) };
    assert!(!pw.is_null(), "no user nobody");
    // SAFETY: pw is non-null and points to a passwd record.
    unsafe { ((*pw).pw_uid, (*pw).pw_gid) }
}

fn chown_recursive(path: &std::path::Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).unwrap();
    if path.is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            chown_recursive(&entry.unwrap().path(), uid, gid);
        }
    }
}

/// Takes every inotify instance `uid` may have, until dropped.
fn take_inotify_instances(uid: u32) -> Vec<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    std::thread::spawn(move || {
        // The raw system call changes this thread's effective user only
        // (glibc's seteuid would change every thread's); instances are
        // counted against the effective user, and the thread then ends.
        // SAFETY: setresuid with "unchanged" for the real and saved ids.
        let rc = unsafe { libc::syscall(libc::SYS_setresuid, -1 as libc::c_long, uid as libc::c_long, -1 as libc::c_long) };
        assert_eq!(rc, 0, "setresuid: {}", std::io::Error::last_os_error());
        let mut taken = Vec::new();
        loop {
            // SAFETY: inotify_init1 takes flags only; a new descriptor is ours.
            let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
            if fd < 0 {
                let error = std::io::Error::last_os_error();
                assert_eq!(error.raw_os_error(), Some(libc::EMFILE), "inotify_init1 after {}: {error}", taken.len());
                break;
            }
            // SAFETY: fd was just created and nothing else owns it.
            taken.push(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
            assert!(taken.len() < 16_384, "fs.inotify.max_user_instances is too high to use up");
        }
        taken
    })
    .join()
    .unwrap()
}

#[test]
fn apache_tunnel_cgi_exits_when_the_client_disconnects() {
    let Some(s) = site("apache_disconnect", "") else { return };
    e2e::tunnel_cgi_exits_when_the_client_disconnects(&*s);
}

/// RFC 3875 4.4: Apache turns `?serve+--listen+ADDR` into argv. The CGI
/// must answer as a CGI and never start a server.
#[test]
fn apache_search_string_is_not_a_command_line() {
    let Some(s) = site("apache_search_string", "") else { return };
    let port = support::free_port();
    let resp = support::get(&format!("{}?serve+--listen+127.0.0.1:{port}", s.url()));
    assert!((200..500).contains(&resp.status), "{} {}\n{}", resp.status, resp.text(), s.error_log());
    assert!(resp.header("content-type").is_some_and(|t| t.starts_with("text/html")), "{:?}", resp.headers);
    std::thread::sleep(Duration::from_millis(500));
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err(), "something listens on {port}: the CGI obeyed its argv");
    assert!(e2e::processes_under(s.dir().path()).is_empty(), "a pubsub.cgi process outlived the request");
}

#[test]
fn apache_head_and_put_answer_501() {
    let Some(s) = site("apache_501", "") else { return };
    let (host, _) = e2e::host_and_path(&s.url());
    let (line, text) = e2e::raw(&s.url(), format!("HEAD /kn?do_method=whoami HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes());
    assert!(line.starts_with("HTTP/1.1 501"), "{text}");
    assert!(text.ends_with("\r\n\r\n"), "HEAD got a body: {text:?}");
    // (A PUT with a body is apache_a_reply_that_leaves_the_body_unread_still_arrives.)
    let (line, text) = e2e::raw(
        &s.url(),
        format!("PUT /kn/what/chat HTTP/1.0\r\nHost: {host}\r\nContent-Length: 0\r\n\r\n").as_bytes(),
    );
    assert!(line.starts_with("HTTP/1.1 501"), "{text}");
}

/// An event over `KN_MAX_EVENT_BYTES` is refused with `413`.
#[test]
fn apache_oversized_event_answers_413() {
    let Some(s) = site("apache_413_event", "SetEnv KN_MAX_EVENT_BYTES 1000\n") else { return };
    let big = "x".repeat(5000);
    let (resp, status) = post_simple(&s.url(), &[("kn_to", "/what/chat"), ("kn_payload", &big)]);
    assert_eq!(resp.status, 413, "{status:?}\n{}", s.error_log());
    assert!(status.payload_text().contains("larger than the maximum"), "{status:?}");
    notify(&*s, "/what/chat", "ok", "small");
}

/// Replies the CGI gives without reading the request body must still reach
/// the client: a body over the request limit (3 x `KN_MAX_EVENT_BYTES`, at
/// least 1 MiB) refused with `413`, and a `PUT` with a body answered `501`.
///
/// Under mod_cgid the CGI's stdin and stdout are one Unix socket; a CGI
/// that exits with request bytes unread resets it, and Apache loses the
/// reply (error log: `AH02651: Error writing request body to script`,
/// then `ap_content_length_filter: apr_bucket_read() failed`): the client
/// gets an empty, reset connection. Always for the 413 (the body is
/// larger than the socket buffers), about 1 in 150 times for a small PUT.
#[test]
fn apache_a_reply_that_leaves_the_body_unread_still_arrives() {
    let Some(s) = site("apache_unread_body", "SetEnv KN_MAX_EVENT_BYTES 1000\n") else { return };
    let body = format!("kn_to=/what/chat&kn_payload={}", "y".repeat(3 << 20));
    let (line, text) = post_tolerant(&s.url(), "POST", body.as_bytes());
    assert!(line.starts_with("HTTP/1.1 413"), "status line {line:?}, response {:?}\n{}", text, s.error_log());
    assert!(text.contains("Request too large"), "{text}");
    for i in 0..300 {
        let (line, text) = post_tolerant(&s.url(), "PUT", b"kn_to=/what/chat&kn_payload=hello");
        assert!(line.starts_with("HTTP/1.1 501"), "PUT #{i}: status line {line:?}, response {text:?}\n{}", s.error_log());
    }
    notify(&*s, "/what/chat", "ok", "small");
    // Neither the refused POST nor the PUTs posted anything.
    let (_, status) = post_simple(&s.url(), &[("kn_to", "/what/chat"), ("kn_id", "ok"), ("kn_payload", "small")]);
    assert!(!status.payload_text().contains("Wrote"), "{status:?}");
}

/// The deployment guide's workaround: Apache's own `LimitRequestBody`
/// refuses an oversized body with `413` before the CGI runs.
#[test]
fn apache_limit_request_body_refuses_oversized_bodies_before_the_cgi() {
    let conf = "<Location /kn>\n    LimitRequestBody 2097152\n</Location>\n";
    let Some(s) = site("apache_limit_request_body", conf) else { return };
    let body = format!("kn_to=/what/chat&kn_payload={}", "y".repeat(3 << 20));
    let (line, text) = post_tolerant(&s.url(), "POST", body.as_bytes());
    assert!(line.starts_with("HTTP/1.1 413"), "status line {line:?}, response {:?}\n{}", text, s.error_log());
    notify(&*s, "/what/chat", "ok", "under the limit");
}

/// Sends `body` raw with `method`, carrying on if the server stops reading it; returns
/// the status line ("" when the connection was reset first) and the text.
fn post_tolerant(url: &str, method: &str, body: &[u8]) -> (String, String) {
    use std::io::{Read, Write};
    let (host, path) = e2e::host_and_path(url);
    let mut sock = TcpStream::connect(&host).expect("connect");
    let head = format!(
        "{method} {path} HTTP/1.0\r\nHost: {host}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let _ = sock.write_all(head.as_bytes()).and_then(|_| sock.write_all(body));
    let _ = sock.set_read_timeout(Some(PATIENCE));
    let mut got = Vec::new();
    let _ = sock.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got).into_owned();
    (text.lines().next().unwrap_or("").to_string(), text)
}

/// Less free space than `KN_RESERVE_BYTES`: posts fail with `507`.
#[test]
fn apache_disk_full_answers_507() {
    let Some(s) = site("apache_507", "SetEnv KN_RESERVE_BYTES 1000000000000000000\n") else { return };
    let (resp, status) = post_simple(&s.url(), &[("kn_to", "/what/chat"), ("kn_payload", "x")]);
    assert_eq!(resp.status, 507, "{status:?}\n{}", s.error_log());
    assert!(status.status().starts_with("507 "), "{status:?}");
}

/// `pubsub-cgi serve` behind Apache `mod_proxy`, configured as
/// docs/DEPLOY.md says (`ProxyPass /kn ... flushpackets=on`,
/// `ProxyPreserveHost On`, `--public-url`): notify, a tunnel that streams
/// through the proxy, and the public URL accepted as local.
#[test]
fn apache_proxy_to_pubsub_cgi_serve_notifies_and_streams_a_tunnel() {
    if !support::available(support::APACHE) {
        return;
    }
    let dir = Dir::new("apache_proxy_serve");
    let store = dir.store("kn_events");
    let port = support::free_port();
    let proxy = Apache::start_proxy(&format!("http://127.0.0.1:{port}/kn"), "ProxyPreserveHost On\n");
    let Some(_backend) = serve(&store, port, &proxy.url()) else {
        panic!("pubsub-cgi serve did not start on port {port}");
    };
    let s = Proxied(&proxy);

    let status = notify(&s, "/what/chat", "p1", "through the proxy");
    assert!(status.payload_text().contains("Wrote to '/what/chat' (p1)"), "{status:?}");
    let mut tunnel = Tunnel::open(&e2e::tunnel_url(&s, "/who/a/s/1/kn_journal", "t", ""));
    let first = tunnel.expect_watching("t", || proxy.error_log());
    eprintln!("through mod_proxy: tunnel status after {first:?}");
    route(&s, "/what/chat", "/who/a/s/1/kn_journal", "r1", "http://example/uri1");
    let sent = Instant::now();
    notify(&s, "/what/chat", "p2", "streamed");
    let Some((at, event)) = tunnel.until("kn_id", "p2", PATIENCE) else {
        panic!("p2 never came through the proxy: {:?}\n{}", tunnel.stream.text(), proxy.error_log());
    };
    eprintln!("through mod_proxy: event on the tunnel {:?} after the notify was sent", at - sent);
    assert_eq!(event.payload_text(), "streamed");
    assert_eq!(event.get("kn_routed_from"), Some(format!("{}/what/chat", proxy.url())), "{event:?}");

    // The JavaScript library names its journal by the public URL.
    let journal = format!("{}/who/a/s/1/kn_journal", proxy.url());
    let resp = support::post_form(
        &proxy.url(),
        &[("kn_to", "/what/chat"), ("kn_payload", "x"), ("kn_id", "p3"), ("kn_status_to", &journal), ("kn_status_from", "s3")],
    );
    assert_eq!(resp.status, 204, "{}", resp.text());
    assert!(tunnel.until("kn_route_location", "s3", PATIENCE).is_some(), "{}", tunnel.stream.text());
}

/// `pubsub-cgi serve --listen 127.0.0.1:PORT --root STORE --public-url
/// URL`, once it listens.
fn serve(store: &std::path::Path, port: u16, public_url: &str) -> Option<Backend> {
    let mut child = std::process::Command::new(support::pubsub_cgi())
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--public-url", public_url, "--root"])
        .arg(store)
        .env_remove("GATEWAY_INTERFACE")
        .stdin(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let up = support::wait_for(Duration::from_secs(10), || {
        TcpStream::connect(("127.0.0.1", port)).is_ok() || matches!(child.try_wait(), Ok(Some(_)))
    });
    if !up || matches!(child.try_wait(), Ok(Some(_))) {
        let _ = child.kill();
        let _ = child.wait();
        return None;
    }
    Some(Backend(child))
}

/// A `serve` process, killed when dropped (also when the test fails).
struct Backend(std::process::Child);

impl Drop for Backend {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The proxy, seen as a PubSub server at `/kn`.
struct Proxied<'a>(&'a Apache);

impl KnServer for Proxied<'_> {
    fn url(&self) -> String {
        self.0.url()
    }
    fn log(&self) -> String {
        self.0.error_log()
    }
    fn dir_path(&self) -> &std::path::Path {
        self.0.dir().path()
    }
}
