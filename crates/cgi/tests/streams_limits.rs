//! The statuses of the Durable Streams limits of issue 28 at the front
//! door (the same `handle` under `serve` and as a CGI): a `Stream-TTL`
//! past the representable range, a `Producer-Id` or a producer past its
//! limit, a fork past the fork-depth limit.

use std::sync::Arc;

use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use kn_cgi::streams::{handle, Outcome, StreamRequest};
use kn_streams::{Streams, StreamsConfig};
use kn_journal::{Config, Store};

fn request(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> StreamRequest {
    let mut map = HeaderMap::new();
    for (n, v) in headers {
        map.insert(HeaderName::from_bytes(n.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
    }
    StreamRequest { method: method.into(), path: path.into(), headers: map, body: body.to_vec(), ..StreamRequest::default() }
}

fn status(streams: &Streams, req: &StreamRequest) -> u16 {
    match handle(streams, req) {
        Outcome::Done(r) => r.status,
        _ => panic!("a plain answer expected"),
    }
}

#[test]
fn limits_answer_their_statuses() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::new(dir.path());
    let mut settings = StreamsConfig::default();
    settings.max_fork_depth = 1;
    settings.max_producer_id_bytes = 8;
    settings.max_producers = 1;
    let streams = Streams::new(Arc::new(Store::open_with(config).unwrap())).with_config(settings);
    let plain = ("Content-Type", "text/plain");

    let huge = request("PUT", "t", &[plain, ("Stream-TTL", "9223372036854775807")], b"");
    assert_eq!(status(&streams, &huge), 400, "a TTL past the representable range");
    assert_eq!(status(&streams, &request("HEAD", "t", &[], b"")), 404, "and no stream");

    assert_eq!(status(&streams, &request("PUT", "s", &[plain], b"")), 201);
    let producer = |id: &'static str| request("POST", "s", &[plain, ("Producer-Id", id), ("Producer-Epoch", "0"), ("Producer-Seq", "0")], b"x");
    assert!(matches!(status(&streams, &producer("12345678")), 200 | 204));
    assert_eq!(status(&streams, &producer("123456789")), 400, "a Producer-Id past its limit");
    assert_eq!(status(&streams, &producer("87654321")), 400, "a producer past the limit of producers");

    assert_eq!(status(&streams, &request("PUT", "f1", &[plain, ("Stream-Forked-From", "/v1/stream/s")], b"")), 201);
    assert_eq!(status(&streams, &request("PUT", "f2", &[plain, ("Stream-Forked-From", "/v1/stream/f1")], b"")), 409, "a fork past the depth limit");
}
