//! The test harness itself, proven against real web servers: CGIs run,
//! bodies arrive, the environment is set, search strings become argv, output
//! streams, and what happens to a CGI whose client hangs up.
//!
//! These facts are what `pubsub.cgi` is built on; if one of these tests
//! fails on a new server version, the CGI's assumptions need revisiting.

mod support;

use std::fs;
use std::time::Duration;

use support::{Apache, Dir, Lighttpd, Stream};

/// The notify body the benchmarks send.
const NOTIFY_BODY: &str = "kn_to=/bench/t&kn_payload=hello&kn_response_format=simple";

/// A shell CGI that prints each argument on its own line, in brackets.
const ARGV_CGI: &str = r#"#!/bin/sh
printf 'Content-Type: text/plain\r\n\r\n'
for a in "$@"; do printf '[%s]\n' "$a"; done
"#;

/// A shell CGI that prints what the server told it about the request.
const ENV_CGI: &str = r#"#!/bin/sh
printf 'Content-Type: text/plain\r\n\r\n'
printf 'KN_EVENTS=%s\n' "$KN_EVENTS"
printf 'PATH_INFO=%s\n' "$PATH_INFO"
printf 'QUERY_STRING=%s\n' "$QUERY_STRING"
printf 'REQUEST_METHOD=%s\n' "$REQUEST_METHOD"
"#;

/// A CGI that streams a line every 100 ms forever, recording its pid in the
/// store, like a tunnel that has a lot to say.
const CHATTY_CGI: &str = r#"#!/bin/sh
echo $$ > "$KN_EVENTS/cgi.pid"
printf 'Content-Type: text/plain\r\n\r\n'
i=0
while :; do
    i=$((i+1))
    echo "line $i"
    sleep 0.1
done
"#;

/// A CGI that writes one line, then stays silent until the file `go`
/// appears in the store, then writes a line every 100 ms: a tunnel with
/// nothing to say for a while.
const SILENT_CGI: &str = r#"#!/bin/sh
echo $$ > "$KN_EVENTS/cgi.pid"
printf 'Content-Type: text/plain\r\n\r\n'
echo first
while [ ! -e "$KN_EVENTS/go" ]; do sleep 0.05; done
while :; do
    echo more
    sleep 0.1
done
"#;

fn pid_in(store: &std::path::Path) -> u32 {
    let path = store.join("cgi.pid");
    let found = support::wait_for(Duration::from_secs(5), || {
        fs::read_to_string(&path).map(|s| s.trim().parse::<u32>().is_ok()).unwrap_or(false)
    });
    assert!(found, "CGI did not write {}", path.display());
    fs::read_to_string(&path).unwrap().trim().parse().unwrap()
}

#[test]
fn apache_runs_hello_cgi_with_the_post_body_read() {
    if !support::available(support::APACHE) {
        return;
    }
    let dir = Dir::new("apache_hello");
    let store = dir.store("events");
    let apache = Apache::start(&support::hello_cgi(), &store, "");
    let resp = support::post(
        &apache.url(),
        "application/x-www-form-urlencoded",
        NOTIFY_BODY.as_bytes(),
    );
    assert_eq!(resp.status, 200, "{}", apache.error_log());
    assert_eq!(resp.text(), format!("hello {}\n", NOTIFY_BODY.len()));
    assert_eq!(resp.header("content-type"), Some("text/plain; charset=utf-8"));

    // A form post through the client helper, and a GET with no body.
    let resp = support::post_form(&apache.url(), &[("kn_payload", "a b")]);
    assert_eq!(resp.text(), "hello 14\n");
    assert_eq!(support::get(&apache.url()).text(), "hello 0\n");
}

#[test]
fn lighttpd_runs_hello_cgi_with_the_post_body_read() {
    if !support::available(support::LIGHTTPD) {
        return;
    }
    let dir = Dir::new("lighttpd_hello");
    let store = dir.store("events");
    let lighttpd = Lighttpd::start(&support::hello_cgi(), &store, "");
    let resp = support::post(&lighttpd.url(), "text/plain", NOTIFY_BODY.as_bytes());
    assert_eq!(resp.status, 200, "{}", lighttpd.error_log());
    assert_eq!(resp.text(), format!("hello {}\n", NOTIFY_BODY.len()));
    assert_eq!(support::get(&lighttpd.url()).text(), "hello 0\n");
}

#[test]
fn apache_and_lighttpd_set_kn_events_and_path_info() {
    let dir = Dir::new("env");
    let cgi = dir.create_script("env.cgi", ENV_CGI);
    let store = dir.store("events");
    let expect = |body: String, server: &str| {
        assert!(body.contains(&format!("KN_EVENTS={}\n", store.display())), "{server}: {body}");
        assert!(body.contains("PATH_INFO=/what/chat\n"), "{server}: {body}");
        assert!(body.contains("QUERY_STRING=do_method=x;a=b\n"), "{server}: {body}");
        assert!(body.contains("REQUEST_METHOD=GET\n"), "{server}: {body}");
    };
    if support::available(support::APACHE) {
        let apache = Apache::start(&cgi, &store, "");
        let resp = support::get(&format!("{}/what/chat?do_method=x;a=b", apache.url()));
        assert_eq!(resp.status, 200, "{}", apache.error_log());
        expect(resp.text(), "apache");
    }
    if support::available(support::LIGHTTPD) {
        let lighttpd = Lighttpd::start(&cgi, &store, "");
        let resp = support::get(&format!("{}/what/chat?do_method=x;a=b", lighttpd.url()));
        assert_eq!(resp.status, 200, "{}", lighttpd.error_log());
        expect(resp.text(), "lighttpd");
    }
}

/// RFC 3875 4.4: a query string without an unencoded `=` is a "search
/// string" that the server may split on `+` into command-line arguments.
/// Apache does, so `pubsub.cgi` must ignore its argv when run as a CGI (or
/// anyone could make it `serve`).
#[test]
fn apache_passes_a_search_string_as_argv() {
    if !support::available(support::APACHE) {
        return;
    }
    let dir = Dir::new("argv");
    let cgi = dir.create_script("argv.cgi", ARGV_CGI);
    let store = dir.store("events");
    let apache = Apache::start(&cgi, &store, "");

    let resp = support::get(&format!("{}?serve+--listen+0.0.0.0:9", apache.url()));
    assert_eq!(resp.status, 200, "{}", apache.error_log());
    assert_eq!(resp.text(), "[serve]\n[--listen]\n[0.0.0.0:9]\n");

    // With an `=` it is a form, and there are no arguments.
    let resp = support::get(&format!("{}?serve=1+--listen", apache.url()));
    assert_eq!(resp.text(), "");
}

/// lighttpd does not implement the search-string rule: no argv.
#[test]
fn lighttpd_passes_no_argv_for_a_search_string() {
    if !support::available(support::LIGHTTPD) {
        return;
    }
    let dir = Dir::new("argv_lighttpd");
    let cgi = dir.create_script("argv.cgi", ARGV_CGI);
    let store = dir.store("events");
    let lighttpd = Lighttpd::start(&cgi, &store, "");
    let resp = support::get(&format!("{}?serve+--listen+0.0.0.0:9", lighttpd.url()));
    assert_eq!(resp.status, 200, "{}", lighttpd.error_log());
    assert_eq!(resp.text(), "");
}

/// What ends a CGI whose client vanished, under Apache 2.4 + mod_cgid
/// (measured with 2.4.6x/2.4.7x on Debian):
///
/// * Apache does not watch the client socket while it waits for CGI output.
///   It notices the client is gone only when it forwards CGI output and the
///   write fails. After a TCP close the first write still succeeds (the peer
///   answers with a RST), so it is the next output after that which fails.
/// * Then Apache ends the request, and mod_cgid's cleanup sends SIGTERM to
///   the CGI (via the cgid daemon). A CGI that writes often is thus ended
///   within a write or two of the hang-up; one that never writes lives on.
/// * A CGI that writes nothing for `Timeout` seconds (300 in Debian's
///   `apache2.conf`) is cut off by Apache ("Timeout waiting for output from
///   CGI script") even with a live client.
///
/// So `pubsub.cgi` tunnels detect vanished clients by writing: keep-alive
/// spaces (well under `Timeout`; the protocol says at least every 30 s),
/// and exit on SIGTERM or on a failed write (EPIPE).
#[test]
fn apache_ends_a_streaming_cgi_when_its_client_disconnects() {
    if !support::available(support::APACHE) {
        return;
    }
    let dir = Dir::new("disconnect");
    let cgi = dir.create_script("chatty.cgi", CHATTY_CGI);
    let store = dir.store("events");
    let apache = Apache::start(&cgi, &store, "");

    let mut stream = Stream::get(&apache.url());
    assert!(stream.read_until(b"line 3\n", Duration::from_secs(5)), "{}", stream.text());
    let pid = pid_in(&store);
    assert!(support::process_alive(pid));
    stream.close();

    let ended = support::wait_for(Duration::from_secs(5), || !support::process_alive(pid));
    assert!(ended, "CGI {pid} still running 5 s after its client left\n{}", apache.error_log());
}

/// The other half of the finding above: a silent CGI outlives its client
/// until it writes again.
#[test]
fn apache_notices_a_vanished_client_only_when_the_cgi_writes() {
    if !support::available(support::APACHE) {
        return;
    }
    let dir = Dir::new("silent");
    let cgi = dir.create_script("silent.cgi", SILENT_CGI);
    let store = dir.store("events");
    let apache = Apache::start(&cgi, &store, "");

    let mut stream = Stream::get(&apache.url());
    assert!(stream.read_until(b"first\n", Duration::from_secs(5)), "{}", stream.text());
    let pid = pid_in(&store);
    stream.close();

    std::thread::sleep(Duration::from_millis(1500));
    assert!(support::process_alive(pid), "a silent CGI was ended without writing");

    fs::write(store.join("go"), "").unwrap();
    let ended = support::wait_for(Duration::from_secs(5), || !support::process_alive(pid));
    assert!(ended, "CGI {pid} still running 5 s after writing to a vanished client\n{}", apache.error_log());
}

#[test]
fn lighttpd_ends_a_streaming_cgi_when_its_client_disconnects() {
    if !support::available(support::LIGHTTPD) {
        return;
    }
    let dir = Dir::new("disconnect_lighttpd");
    let cgi = dir.create_script("chatty.cgi", CHATTY_CGI);
    let store = dir.store("events");
    let lighttpd = Lighttpd::start(&cgi, &store, "");

    let mut stream = Stream::get(&lighttpd.url());
    assert!(stream.read_until(b"line 3\n", Duration::from_secs(5)), "{}", stream.text());
    let pid = pid_in(&store);
    stream.close();

    let ended = support::wait_for(Duration::from_secs(5), || !support::process_alive(pid));
    assert!(ended, "CGI {pid} still running 5 s after its client left\n{}", lighttpd.error_log());
}

#[test]
fn apache_proxy_forwards_kn_and_streams_with_flushpackets() {
    if !support::available(support::APACHE) {
        return;
    }
    let dir = Dir::new("proxy");
    let store = dir.store("events");
    let chatty = dir.create_script("chatty.cgi", CHATTY_CGI);
    let backend = Apache::start(
        &support::hello_cgi(),
        &store,
        &format!("ScriptAlias /chatty {}\n", chatty.display()),
    );
    let proxy = Apache::start_proxy(&backend.url(), &format!("ProxyPass /chatty {}/chatty flushpackets=on\n", backend.base_url()));

    let resp = support::post(&proxy.url(), "application/x-www-form-urlencoded", NOTIFY_BODY.as_bytes());
    assert_eq!(resp.status, 200, "proxy:\n{}\nbackend:\n{}", proxy.error_log(), backend.error_log());
    assert_eq!(resp.text(), format!("hello {}\n", NOTIFY_BODY.len()));

    // Output reaches the client as the backend writes it, not at the end.
    let mut stream = Stream::get(&format!("{}/chatty", proxy.base_url()));
    assert!(stream.read_until(b"line 2\n", Duration::from_secs(5)), "{}", stream.text());
    assert_eq!(stream.status(), Some(200));
}
