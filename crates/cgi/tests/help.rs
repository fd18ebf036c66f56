//! `do_method=help` lists every method the server answers, from the one
//! table the dispatcher uses (src/handler/methods.rs), as a page for a
//! browser and as plain text for curl; and a name that is not in the
//! table is answered `403 Unknown do_method`. The real `pubsub-cgi serve`.

use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use kn_cgi::handler::methods::METHODS;
use kn_test_support::raw::{Conn, Reply};
use kn_test_support::Serve;

fn start() -> (Serve, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let command = Serve::command_of(Path::new(env!("CARGO_BIN_EXE_pubsub-cgi")), &dir.path().join("events"), None);
    (Serve::spawn(command), dir)
}

/// `GET target` with `headers` (each `Name: value`).
fn get(serve: &Serve, target: &str, headers: &[&str]) -> Reply {
    let mut stream = TcpStream::connect(serve.addr()).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut request = format!("GET {target} HTTP/1.1\r\nHost: {}\r\n", serve.addr());
    for header in headers {
        request.push_str(header);
        request.push_str("\r\n");
    }
    request.push_str("Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    Conn::new(stream, serve.addr()).reply()
}

#[test]
fn help_lists_every_method_the_dispatcher_answers() {
    let (serve, _dir) = start();
    let page = get(&serve, "/kn?do_method=help", &["Accept: text/html,application/xhtml+xml;q=0.9,*/*;q=0.8"]);
    assert_eq!(page.header("content-type"), Some("text/html; charset=utf-8"));
    let page = page.text();
    let text = get(&serve, "/kn?do_method=help", &["Accept: */*"]).text();
    assert!(METHODS.iter().any(|m| m.name == "session"), "do_method=session is in the table");
    for method in METHODS {
        assert!(page.contains(&format!("<dt><code>{}</code></dt>", method.name)), "the page lists {}", method.name);
        assert!(text.lines().any(|l| l == method.name), "the text lists {}:\n{text}", method.name);
        // Answered, not refused as unknown (without side effects: a
        // refused topic, or no event, where the method takes one).
        let target = format!("/kn/what/../nowhere?do_method={}&kn_response_format=simple&kn_to=&kn_from=/what/../nowhere", method.name);
        let reply = get(&serve, &target, &[]);
        assert!(!reply.text().contains("Unknown do_method"), "do_method={} is answered: {}", method.name, reply.text());
    }
    let unknown = get(&serve, "/kn?do_method=nosuch&kn_response_format=simple", &[]);
    assert!(unknown.text().contains("status: 403 Unknown do_method"), "{}", unknown.text());
}

#[test]
fn help_is_plain_text_for_a_client_that_does_not_take_html() {
    let (serve, _dir) = start();
    for accept in ["Accept: */*", "Accept: text/plain", "Accept: text/html;q=0, text/plain"] {
        let reply = get(&serve, "/kn?do_method=help", &[accept]);
        assert_eq!(reply.header("content-type"), Some("text/plain; charset=utf-8"), "{accept}");
        let text = reply.text();
        assert!(text.starts_with("PubSub server: usage\n"), "{text}");
        assert!(!text.contains("</"), "no markup: {text}");
        assert!(text.contains(&format!("curl -d kn_to=/what/chat -d kn_payload=hello -d kn_response_format=simple {}/kn", serve.base)), "{text}");
    }
    // A browser, and a client that sends no Accept at all (as the clients
    // of 2003 did), get the page.
    for headers in [&["Accept: text/html"][..], &[]] {
        let reply = get(&serve, "/kn?do_method=help", headers);
        assert_eq!(reply.header("content-type"), Some("text/html; charset=utf-8"), "{headers:?}");
        assert!(reply.text().starts_with("<!DOCTYPE html>"));
    }
}
