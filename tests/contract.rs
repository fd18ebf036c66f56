//! The original's contract (issue 27), as old clients meet it with default
//! settings, under Apache (pubsub.cgi) and `pubsub-cgi serve`:
//!
//! * a route's initial population reaches the destination before the
//!   route's `200 Routed` status event (`kn_status_to`), both after the
//!   route request's reply: a client that reads its journal up to its
//!   route's status takes what came before it for the topic's events;
//! * every URL a request reached the server by names it: a first request
//!   with a port-less `Host` does not make the real URL a remote one, a
//!   tool on `serve`'s store delivers along routes made through `serve`,
//!   and random `Host` headers leave `.names` bounded.

mod e2e;
mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use e2e::{KnServer, Tunnel, PATIENCE};
use support::{Apache, Dir};

/// `pubsub-cgi serve` on a fresh store, seen as a [`KnServer`].
struct Serve {
    server: support::Serve,
    store: std::path::PathBuf,
    dir: Dir,
}

impl Serve {
    fn start(name: &str) -> Serve {
        let dir = Dir::new(name);
        let store = dir.join("events");
        let command = support::Serve::command(&store, None);
        Serve { server: support::Serve::spawn(command), store, dir }
    }
}

impl KnServer for Serve {
    fn url(&self) -> String {
        self.server.url()
    }
    fn log(&self) -> String {
        String::new()
    }
    fn dir_path(&self) -> &std::path::Path {
        self.dir.path()
    }
}

fn apache(name: &str) -> Option<(Apache, std::path::PathBuf, Dir)> {
    if !support::available(support::APACHE) {
        return None;
    }
    let dir = Dir::new(name);
    let store = dir.store("kn_events");
    let apache = Apache::start(&support::pubsub_cgi(), &store, "");
    Some((apache, store, dir))
}

/// One request on its own connection, written as given (`Host` and all);
/// returns the status line and the whole response.
fn raw(addr: &str, request: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    (text.lines().next().unwrap_or_default().to_string(), text)
}

fn post_raw(addr: &str, host: &str, body: &str) -> (String, String) {
    raw(
        addr,
        &format!(
            "POST /kn HTTP/1.0\r\nHost: {host}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
}

fn addr_of(server: &impl KnServer) -> String {
    server.url().trim_start_matches("http://").trim_end_matches("/kn").to_string()
}

/// Posts three events to `topic`, opens a journal tunnel, then routes the
/// topic into the journal with `do_max_n=10` and `kn_status_to` the
/// journal's absolute URL (as the original suite reads a topic); reads
/// the route's reply, waits `delay`, then reads the tunnel up to the
/// route's status event: all three events come before it, oldest first.
fn population_comes_before_the_status(server: &impl KnServer, name: &str, delay: Duration) {
    let topic = format!("/what/{name}");
    let journal = format!("/who/{name}/kn_journal");
    for i in 1..=3 {
        e2e::notify(server, &topic, &format!("e{i}"), &format!("p{i}"));
    }
    let mut tunnel = Tunnel::open(&e2e::tunnel_url(server, &journal, "watch", ""));
    tunnel.expect_watching("watch", || server.log());
    let body = format!(
        "do_method=route&kn_from={topic}&kn_to={journal}&do_max_n=10&kn_status_to={}{journal}&kn_status_from=my-route&kn_response_format=simple",
        server.url()
    );
    let (line, text) = post_raw(&addr_of(server), &addr_of(server), &body);
    assert!(line.contains(" 204 ") || line.contains(" 200 "), "route reply: {text}");
    std::thread::sleep(delay);
    let Some(_) = tunnel.until("kn_route_location", "my-route", PATIENCE) else {
        panic!("no status event for the route; got {:?}\n{}", tunnel.received(|_| true), server.log());
    };
    let before: Vec<String> = tunnel.received(|e| e.get("kn_route_location").as_deref() != Some("watch")).iter().map(|e| e.payload_text()).collect();
    assert_eq!(before.len(), 4, "three events then the status: {before:?}");
    assert_eq!(&before[..3], ["p1", "p2", "p3"], "the population, oldest first, before the status: {before:?}");
    let status = tunnel.received(|e| e.get("kn_route_location").as_deref() == Some("my-route"));
    assert_eq!(status[0].status(), "200 Routed", "{status:?}");
}

#[test]
fn apache_route_population_comes_before_its_status_event() {
    let Some((apache, _store, _dir)) = apache("contract_population") else { return };
    population_comes_before_the_status(&apache, "at_once", Duration::ZERO);
    population_comes_before_the_status(&apache, "after_50ms", Duration::from_millis(50));
}

#[test]
fn serve_route_population_comes_before_its_status_event() {
    let serve = Serve::start("contract_population_serve");
    population_comes_before_the_status(&serve, "at_once", Duration::ZERO);
    population_comes_before_the_status(&serve, "after_50ms", Duration::from_millis(50));
}

/// The first request of a fresh store has a port-less `Host`; absolute
/// URLs with the real port are local afterwards, from clients with or
/// without the port in their `Host`.
fn port_less_host_first_then_urls_with_the_port(server: &impl KnServer) {
    let addr = addr_of(server);
    let (line, text) = raw(&addr, "GET /kn?do_method=whoami HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    assert!(line.contains(" 200 "), "{text}");
    // An ordinary topic: a journal nobody reads is stale (and poisons routes to it).
    let journal = format!("{}/what/portless-copy", server.url());
    for host in ["127.0.0.1", addr.as_str()] {
        let body = format!("do_method=route&kn_from=/what/portless&kn_to={journal}&kn_id=r-{host}&kn_response_format=simple");
        let (line, text) = post_raw(&addr, host, &body);
        assert!(line.contains(" 200 "), "route to {journal} with Host {host}: {text}");
        let body = format!("kn_to={}/what/portless&kn_payload=hi&kn_response_format=simple", server.url());
        let (line, text) = post_raw(&addr, host, &body);
        assert!(line.contains(" 200 "), "notify to an absolute URL with Host {host}: {text}");
    }
    let routes = e2e::routes_of(server, "/what/portless");
    assert_eq!(routes.len(), 2, "{routes:?}");
    assert!(routes.iter().all(|(_, _, e)| e.get("kn_poisoned").is_none()), "{routes:?}");
}

#[test]
fn apache_port_less_host_first_never_hides_the_real_url() {
    let Some((apache, _store, _dir)) = apache("contract_portless") else { return };
    port_less_host_first_then_urls_with_the_port(&apache);
}

#[test]
fn serve_port_less_host_first_never_hides_the_real_url() {
    let serve = Serve::start("contract_portless_serve");
    port_less_host_first_then_urls_with_the_port(&serve);
}

/// README's "Try it" then a sensor: a route made through `serve` to the
/// journal's absolute URL, and `kn-post` (a tool on the same store, under
/// the default outbound policy) posting to the topic: delivered locally,
/// never poisoned.
#[test]
fn a_tool_on_serves_store_delivers_along_routes_made_through_serve() {
    let serve = Serve::start("contract_tool");
    let journal = format!("{}/who/me/kn_journal", serve.url());
    let r = support::post_form(
        &serve.url(),
        &[("do_method", "route"), ("kn_from", "/what/chat"), ("kn_to", &journal), ("kn_response_format", "simple")],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let mut tunnel = Tunnel::open(&e2e::tunnel_url(&serve, "/who/me/kn_journal", "watch", ""));
    tunnel.expect_watching("watch", String::new);
    let mut child = Command::new(support::cargo_bin("kn-post"))
        .arg("--root")
        .arg(&serve.store)
        .args(["-q", "-m", "from a sensor", "/what/chat"])
        .env_remove("KN_OUTBOUND")
        .env_remove("KN_SERVER_URL")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    assert!(child.wait().unwrap().success());
    let got = tunnel.until("kn_payload", "from a sensor", PATIENCE);
    assert!(got.is_some(), "the sensor's event never reached the journal: {:?}", tunnel.received(|_| true));
    let routes = e2e::routes_of(&serve, "/what/chat");
    assert!(routes.iter().all(|(_, _, e)| e.get("kn_poisoned").is_none()), "poisoned: {routes:?}");
    // And `kn` lists the route's destination as local.
    let out = Command::new(support::cargo_bin("kn")).arg("--root").arg(&serve.store).args(["names"]).output().unwrap();
    let names = String::from_utf8_lossy(&out.stdout);
    assert!(names.contains(&serve.url()), "{names}");
}

/// 10,000 requests with random `Host` headers (over keep-alive
/// connections) leave `.names` bounded: the learned names at most
/// `KN_MAX_NAMES` (32), plus `serve`'s own.
#[test]
fn random_host_headers_leave_the_names_bounded() {
    let serve = Serve::start("contract_random_hosts");
    let addr = addr_of(&serve);
    let mut conn = support::raw::Conn::connect(&addr, PATIENCE);
    for i in 0..10_000u32 {
        if i % 500 == 0 && i > 0 {
            conn = support::raw::Conn::connect(&addr, PATIENCE);
        }
        conn.host = format!("h{:08x}.example", i.wrapping_mul(2_654_435_761));
        conn.send("GET", "/kn?do_method=whoami", b"");
        let reply = conn.reply();
        assert!(reply.status_line.contains(" 200 "), "request {i}: {}", reply.status_line);
    }
    let names = std::fs::read_to_string(serve.store.join(".names")).unwrap();
    let learned = names.lines().filter(|l| l.contains("\tlearned\t")).count();
    assert!(learned <= 32, "{learned} learned names:\n{names}");
    assert!(names.lines().count() <= 32 + 4, "{names}");
    assert!(names.contains(&serve.url()), "serve's own name stays:\n{names}");
}
