//! The reviewer's case of issue 37, item 5, at the stream front door (the
//! same `handle` under `serve` and as a CGI): `PUT`, eight appends, a
//! reader at offset 6, `DELETE`, `PUT` and eight appends again; the reader
//! resuming at 6 is answered `410 Gone`, never `200` with `new5;new6;new7`
//! (`new0`-`new4` silently skipped, as before the fix).

use std::sync::Arc;

use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use kn_cgi::streams::{handle, Outcome, StreamRequest};
use kn_journal::{Config, Store};
use kn_streams::Streams;

fn request(method: &str, query: &str, body: &[u8]) -> StreamRequest {
    let mut headers = HeaderMap::new();
    headers.insert(HeaderName::from_static("content-type"), HeaderValue::from_static("text/plain"));
    StreamRequest { method: method.into(), path: "chat".into(), query: query.into(), headers, body: body.to_vec(), ..StreamRequest::default() }
}

/// Status, `Stream-Next-Offset` and body of the answer.
fn answer(streams: &Streams, req: &StreamRequest) -> (u16, Option<String>, String) {
    match handle(streams, req) {
        Outcome::Done(r) => {
            let next = r.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case("Stream-Next-Offset")).map(|(_, v)| v.to_string());
            (r.status, next, String::from_utf8_lossy(&r.body).into_owned())
        }
        _ => panic!("a plain answer expected"),
    }
}

fn fill(streams: &Streams, prefix: &str) {
    assert_eq!(answer(streams, &request("PUT", "", b"")).0, 201);
    for i in 0..8 {
        assert!(matches!(answer(streams, &request("POST", "", format!("{prefix}{i};").as_bytes())).0, 200 | 204));
    }
}

#[test]
fn an_offset_of_a_deleted_stream_is_gone_in_the_stream_created_again() {
    let dir = tempfile::tempdir().unwrap();
    let streams = Streams::new(Arc::new(Store::open_with(Config::new(dir.path())).unwrap()));
    fill(&streams, "old");
    // The reader has read up to old4 (a chunk ending at checkpoint 6).
    let (_, _, all) = answer(&streams, &request("GET", "offset=-1", b""));
    assert_eq!(all, "old0;old1;old2;old3;old4;old5;old6;old7;");
    let head = answer(&streams, &request("HEAD", "", b"")).1.unwrap();
    let at = format!("0000000000000006{}", &head[16..]);
    let (status, _, rest) = answer(&streams, &request("GET", &format!("offset={at}"), b""));
    assert_eq!((status, rest.as_str()), (200, "old5;old6;old7;"), "offset {at}");

    assert_eq!(answer(&streams, &request("DELETE", "", b"")).0, 204);
    fill(&streams, "new");
    let (status, _, body) = answer(&streams, &request("GET", &format!("offset={at}"), b""));
    assert_eq!(status, 410, "resuming at {at} read {body:?}");
    assert!(body.contains("read again from -1"), "{body}");
    // The same offset as a long-poll and as SSE: refused alike.
    assert_eq!(answer(&streams, &request("GET", &format!("offset={at}&live=long-poll"), b"")).0, 410);
    assert_eq!(answer(&streams, &request("GET", &format!("offset={at}&live=sse"), b"")).0, 410);
    // From the beginning the new stream is whole.
    assert_eq!(answer(&streams, &request("GET", "offset=-1", b"")).2, "new0;new1;new2;new3;new4;new5;new6;new7;");
}
