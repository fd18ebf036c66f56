//! Outbound requests under a real web server never take a proxy from the
//! environment ("httpoxy": under CGI a request's `Proxy:` header becomes
//! `HTTP_PROXY`), only the explicit `KN_HTTP_PROXY`; and they write header
//! names in canonical case. Checked for a remote route delivery, a content
//! transform and `do_method=replay` (which starts `kn-replay`), under Apache
//! (pubsub.cgi) and under `pubsub-cgi serve`.

mod support;

use std::io::Write;
use std::net::TcpStream;
use std::thread;
use std::time::Duration;

use kn_journal::{Event, Selection, Store, Topic};
use support::{read_head_and_body, Apache, Dir, Listener, Serve};

/// A listener the test owns that records the head of every connection
/// made to it and answers `200` only to requests whose header names are
/// in canonical case (`Host:`, `Content-Length:` matched literally), as a
/// hand-written parser of an old receiver would.
fn recorder() -> Listener<String> {
    Listener::start(|mut stream| {
        let (head, _) = read_head_and_body(&mut stream);
        let canonical = head.contains("\r\nHost: ") && head.contains("\r\nContent-Length: ");
        let reply: &[u8] = if canonical {
            b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\nConnection: close\r\n\r\ntransformed"
        } else {
            b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        };
        let _ = stream.write_all(reply);
        head
    })
}

/// An HTTP `CONNECT` proxy the test runs: records each request line and
/// relays the tunnel to the target.
fn connect_proxy() -> Listener<String> {
    Listener::start(|mut client| {
        let (head, _) = read_head_and_body(&mut client);
        let line = head.lines().next().unwrap_or("").to_string();
        let Some(target) = line.strip_prefix("CONNECT ").and_then(|r| r.split_whitespace().next()) else {
            let _ = client.write_all(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n");
            return line;
        };
        let Ok(upstream) = TcpStream::connect(target) else {
            let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n");
            return line;
        };
        let _ = client.set_read_timeout(None);
        let _ = client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n");
        relay(client, upstream);
        line
    })
}

fn relay(client: TcpStream, upstream: TcpStream) {
    let (mut c_in, mut u_out) = (client.try_clone().expect("clone"), upstream.try_clone().expect("clone"));
    let (mut u_in, mut c_out) = (upstream, client);
    thread::spawn(move || {
        let _ = std::io::copy(&mut c_in, &mut u_out);
        let _ = u_out.shutdown(std::net::Shutdown::Write);
    });
    thread::spawn(move || {
        let _ = std::io::copy(&mut u_in, &mut c_out);
        let _ = c_out.shutdown(std::net::Shutdown::Write);
    });
}

/// A store whose journal `/who/anna/kn_journal` holds one event routed from
/// the remote topic `origin`, so that replaying it re-posts over HTTP.
fn store_with_remote_journal(root: &std::path::Path, origin: &str) {
    let store = Store::open(root).expect("open store");
    let journal = Topic::parse("/who/anna/kn_journal").expect("topic");
    store.tunnel(&journal, &Selection::none()).expect("heartbeat");
    let event = Event::from_pairs([("kn_id", "e1"), ("kn_payload", "hi"), ("kn_routed_from", origin)]);
    store.notify(&journal, event).expect("journal event");
}

/// `POST url` with `pairs` and a `Proxy:` header naming `proxy`.
fn post_with_proxy_header(url: &str, proxy: &str, pairs: &[(&str, &str)]) -> u16 {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .proxy(None)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into();
    let resp = agent.post(url).header("Proxy", proxy).send_form(pairs.iter().copied());
    resp.unwrap_or_else(|e| panic!("POST {url}: {e}")).status().as_u16()
}

/// Runs the three outbound requests against the server at `kn` (its `/kn`
/// URL), each with a `Proxy:` header naming `trap`, and checks that each
/// reached `target` with canonical header names.
fn outbound_requests_reach_the_target(kn: &str, target: &Listener<String>, trap: &Listener<String>, log: &dyn Fn() -> String) {
    let proxy = trap.url("");
    let route = [("do_method", "route"), ("kn_from", "/what/a"), ("kn_to", &*target.url("/remote/topic")), ("kn_id", "r1")];
    assert_eq!(post_with_proxy_header(kn, &proxy, &route), 200, "{}", log());
    assert_eq!(post_with_proxy_header(kn, &proxy, &[("kn_to", "/what/a"), ("kn_payload", "x")]), 200, "{}", log());
    let head = target.next().unwrap_or_else(|| panic!("the remote route was not delivered: {}", log()));
    assert!(head.starts_with("POST /remote/topic "), "{head}");
    assert!(head.contains("\r\nContent-Type: application/x-www-form-urlencoded\r\n"), "canonical case: {head}");
    assert!(head.contains("\r\nUser-Agent: "), "canonical case: {head}");

    let transform = target.url("/transform");
    let route = [("do_method", "route"), ("kn_from", "/what/b"), ("kn_to", "/what/c"), ("kn_content_transform", &*transform)];
    assert_eq!(post_with_proxy_header(kn, &proxy, &route), 200, "{}", log());
    assert_eq!(post_with_proxy_header(kn, &proxy, &[("kn_to", "/what/b"), ("kn_payload", "y")]), 200, "{}", log());
    let head = target.next().unwrap_or_else(|| panic!("the content transform was not called: {}", log()));
    assert!(head.starts_with("POST /transform "), "{head}");

    let replay = [("do_method", "replay"), ("kn_from", "/who/anna/kn_journal"), ("warp", "1000")];
    assert_eq!(post_with_proxy_header(kn, &proxy, &replay), 200, "{}", log());
    let head = target.next().unwrap_or_else(|| panic!("kn-replay did not re-post: {}", log()));
    assert!(head.starts_with("POST /origin/topic "), "{head}");
    assert!(head.contains("\r\nContent-Length: "), "canonical case: {head}");

    // Give any stray request time to arrive before checking the trap.
    thread::sleep(Duration::from_millis(500));
    assert_eq!(trap.drain(), Vec::<String>::new(), "a request went to the Proxy: header's address");
}

/// The copy of `kn-replay` a server starts (in a directory its user can
/// read).
fn install_replay(dir: &Dir) -> std::path::PathBuf {
    let bytes = std::fs::read(support::cargo_bin("kn-replay")).expect("read kn-replay");
    let path = dir.create("kn-replay", bytes);
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    path
}

#[test]
fn apache_cgi_ignores_the_proxy_header_for_routes_transforms_and_replay() {
    if !support::available(support::APACHE) {
        return;
    }
    let (target, trap) = (recorder(), recorder());
    let dir = Dir::new("apache_cgi_ignores_the_proxy_header");
    let store = dir.store("events");
    store_with_remote_journal(&store, &target.url("/origin/topic"));
    let replay = install_replay(&dir);
    let conf = format!("SetEnv KN_OUTBOUND {}\nSetEnv KN_REPLAY {}\n", target.url("/"), replay.display());
    let apache = Apache::start(&support::pubsub_cgi(), &store, &conf);
    outbound_requests_reach_the_target(&apache.url(), &target, &trap, &|| apache.error_log());
}

#[test]
fn serve_ignores_the_proxy_header_and_proxy_variables() {
    let (target, trap) = (recorder(), recorder());
    let dir = Dir::new("serve_ignores_the_proxy_header");
    let store = dir.store("events");
    store_with_remote_journal(&store, &target.url("/origin/topic"));
    let replay = install_replay(&dir);
    let mut command = Serve::command(&store, None);
    command.env("KN_OUTBOUND", target.url("/")).env("KN_REPLAY", &replay);
    for var in ["HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"] {
        command.env(var, trap.url(""));
    }
    let serve = Serve::spawn(command);
    outbound_requests_reach_the_target(&serve.url(), &target, &trap, &String::new);
}

/// Delivers one event over a remote route through the server at `kn` and
/// checks it went through `proxy` to `target`.
fn delivery_goes_through(kn: &str, target: &Listener<String>, proxy: &Listener<String>, log: &dyn Fn() -> String) {
    let route = [("do_method", "route"), ("kn_from", "/what/a"), ("kn_to", &*target.url("/remote/topic")), ("kn_id", "r1")];
    assert_eq!(support::post_form(kn, &route).status, 200, "{}", log());
    assert_eq!(support::post_form(kn, &[("kn_to", "/what/a"), ("kn_payload", "x")]).status, 200, "{}", log());
    let line = proxy.next().unwrap_or_else(|| panic!("the proxy was not used: {}", log()));
    assert_eq!(line, format!("CONNECT 127.0.0.1:{} HTTP/1.1", target.port));
    let head = target.next().unwrap_or_else(|| panic!("nothing reached the target through the proxy: {}", log()));
    assert!(head.starts_with("POST /remote/topic "), "{head}");
}

#[test]
fn apache_cgi_uses_the_explicit_kn_http_proxy() {
    if !support::available(support::APACHE) {
        return;
    }
    let (target, proxy) = (recorder(), connect_proxy());
    let dir = Dir::new("apache_cgi_uses_the_explicit_kn_http_proxy");
    let store = dir.store("events");
    let conf = format!("SetEnv KN_OUTBOUND {}\nSetEnv KN_HTTP_PROXY http://127.0.0.1:{}\n", target.url("/"), proxy.port);
    let apache = Apache::start(&support::pubsub_cgi(), &store, &conf);
    delivery_goes_through(&apache.url(), &target, &proxy, &|| apache.error_log());
}

#[test]
fn serve_uses_the_explicit_kn_http_proxy() {
    let (target, proxy) = (recorder(), connect_proxy());
    let dir = Dir::new("serve_uses_the_explicit_kn_http_proxy");
    let store = dir.store("events");
    let mut command = Serve::command(&store, None);
    command.env("KN_OUTBOUND", target.url("/")).env("KN_HTTP_PROXY", format!("http://127.0.0.1:{}", proxy.port));
    let serve = Serve::spawn(command);
    delivery_goes_through(&serve.url(), &target, &proxy, &String::new);
}

