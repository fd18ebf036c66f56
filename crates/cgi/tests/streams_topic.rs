//! Binding a Durable Stream to a PubSub topic (`Kn-Topic` on its `PUT`,
//! docs/DURABLE-STREAMS.md "The bridge"): only an absolute topic below
//! the root can be bound, anything else is a clear `400`; a `HEAD` of a
//! bound stream says what it is bound to. Through the front door's
//! transport-free entry point, as `serve` and the CGI both call it.

use std::sync::Arc;

use hyper::header::{HeaderMap, HeaderValue};
use kn_cgi::streams::{handle, Outcome, StreamRequest, StreamResponse};
use kn_streams::Streams;
use kn_journal::Store;

fn streams() -> (tempfile::TempDir, Streams) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("events")).unwrap();
    (dir, Streams::new(Arc::new(store)))
}

fn request(streams: &Streams, method: &str, path: &str, headers: &[(&'static str, &str)]) -> StreamResponse {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        map.insert(*name, HeaderValue::from_str(value).unwrap());
    }
    let req = StreamRequest { method: method.into(), path: path.into(), headers: map, ..StreamRequest::default() };
    match handle(streams, &req) {
        Outcome::Done(r) => r,
        _ => panic!("{method} {path} did not answer at once"),
    }
}

fn header<'a>(r: &'a StreamResponse, name: &str) -> Option<&'a str> {
    r.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_ref())
}

fn body(r: &StreamResponse) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

#[test]
fn a_relative_or_root_kn_topic_is_refused_with_400_saying_why() {
    let (_dir, streams) = streams();
    let json = ("content-type", "application/json");
    let relative = request(&streams, "PUT", "rooms/rel", &[json, ("kn-topic", "what/rel1")]);
    assert_eq!(relative.status, 400, "{}", body(&relative));
    assert!(body(&relative).contains("'what/rel1' is not an absolute topic name"), "{}", body(&relative));
    assert!(body(&relative).contains("/what/rel1"), "says what to send instead: {}", body(&relative));

    let root = request(&streams, "PUT", "rooms/root", &[json, ("kn-topic", "/")]);
    assert_eq!(root.status, 400, "{}", body(&root));
    assert!(body(&root).contains("names the root"), "{}", body(&root));

    // Neither stream was made.
    for path in ["rooms/rel", "rooms/root"] {
        assert_eq!(request(&streams, "HEAD", path, &[]).status, 404, "{path}");
    }
    // An absolute topic below the root binds.
    let bound = request(&streams, "PUT", "rooms/chat", &[json, ("kn-topic", "/what/chat")]);
    assert_eq!(bound.status, 201, "{}", body(&bound));
}

#[test]
fn head_of_a_bound_stream_names_its_topic() {
    let (_dir, streams) = streams();
    let json = ("content-type", "application/json");
    assert_eq!(request(&streams, "PUT", "rooms/chat", &[json, ("kn-topic", "/what/chat")]).status, 201);
    assert_eq!(request(&streams, "PUT", "rooms/plain", &[json]).status, 201);

    let head = request(&streams, "HEAD", "rooms/chat", &[]);
    assert_eq!(head.status, 200);
    assert_eq!(header(&head, "Kn-Topic"), Some("/what/chat"), "{:?}", head.headers);
    let plain = request(&streams, "HEAD", "rooms/plain", &[]);
    assert_eq!(header(&plain, "Kn-Topic"), None, "{:?}", plain.headers);
}
