//! `serve`'s `/metrics`: who may read it, what a scrape costs, and the
//! figures `serve` keeps for it.
//!
//! **Who.** Without access rules anyone who reaches `serve` may scrape, as
//! before. With a rules file (docs/ACCESS.md) a scrape needs `read` on the
//! pseudo-topic [`METRICS_TOPIC`] (`/kn_metrics`), checked like any
//! request of that user: an anonymous client refused is answered `401`
//! with a Basic challenge, a user refused `403`. The user is the one
//! `serve`'s gate (`serve_auth::Gate`) found, as for `/kn`: a
//! scrape never checks a password itself, so wrong passwords sent to
//! `/metrics` count toward the same per-address back-off (`429`), queue
//! (`503`) and thread cap as those sent anywhere else, and bad
//! credentials are `401` whether or not there are rules.
//!
//! **Cost.** A scrape does O(1) store I/O: it reads the shared counters
//! (`.stats`, one file) on the request pool, and takes the store's size
//! from a [`UsageCache`], which walks the tree at most once per
//! `KN_METRICS_REFRESH_MS` on a thread of its own; a scrape never waits
//! for a walk (RELIABILITY.md, "Work a request makes that grows with the
//! store").
//!
//! **What.** The store's page ([`Exposition::of_counters`],
//! [`Exposition::usage`]), then this process's figures: requests by
//! method and status class (bounded labels), open tunnels and
//! connections, Durable Streams (appends, bytes, live readers) and
//! `kn_build_info`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use hyper::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, StatusCode};
use kn_journal::access::Operation;
use kn_streams::Streams;
use kn_journal::{Store, Topic};
use kn_journal::internal::{Counters, Exposition, UsageCache, PROMETHEUS_CONTENT_TYPE};

use crate::handler::AUTH_REALM;
use crate::body::Body;

/// The pseudo-topic whose `read` right the access rules must give for a
/// scrape of `/metrics` (docs/ACCESS.md): `allow read /kn_metrics @ops`.
/// No event is ever read from it; a real topic of that name would be
/// covered by the same rules.
pub const METRICS_TOPIC: &str = "/kn_metrics";

/// The methods counted by name in `kn_serve_http_requests_total`; any
/// other is counted as `other`, so that the labels stay a fixed set
/// whatever clients send.
const METHODS: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "other"];

/// The status classes (`1xx` to `5xx`); a code of 600 or more, which this
/// server never sends, would be counted as `5xx`.
const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// The git commit this binary was built from, when the build knew it
/// (build.rs: `KN_GIT_COMMIT`, else `git rev-parse`).
const GIT_COMMIT: Option<&str> = option_env!("KN_GIT_COMMIT");

/// What `serve` keeps for `/metrics`.
pub(crate) struct Figures {
    usage: UsageCache,
    requests: [[AtomicU64; CLASSES.len()]; METHODS.len()],
}

/// The figures only the server knows, read when a scrape is answered.
pub(crate) struct ServeGauges {
    pub open_tunnels: u64,
    pub open_connections: u64,
    pub requests: u64,
}

/// The index of `method` in [`METHODS`].
pub(crate) fn method_index(method: &Method) -> usize {
    METHODS.iter().position(|m| *m == method.as_str()).unwrap_or(METHODS.len() - 1)
}

fn class_index(status: StatusCode) -> usize {
    usize::from(status.as_u16() / 100).clamp(1, CLASSES.len()) - 1
}

impl Figures {
    /// The figures of `store`; its first walk starts now, in the
    /// background.
    pub(crate) fn new(store: Arc<Store>) -> Figures {
        let usage = UsageCache::new(store);
        usage.refresh();
        Figures { usage, requests: Default::default() }
    }

    /// Counts a response of `status` to a request of method `method` (its
    /// [`method_index`]).
    pub(crate) fn record(&self, method: usize, status: StatusCode) {
        self.requests[method][class_index(status)].fetch_add(1, Ordering::Relaxed);
    }

    /// The page, given the store's counters, this server's gauges and the
    /// posts its store wrote in a group of more than one.
    fn page(&self, counters: &Counters, streams: Option<&Streams>, serve: &ServeGauges, grouped: u64) -> Exposition {
        let mut page = Exposition::of_counters(counters);
        if let Some(cached) = self.usage.get() {
            page.usage(&cached.usage);
            page.gauge("kn_store_usage_age_seconds", "Seconds since the walk that measured the kn_store_* figures and kn_outbox_pending ended.", cached.age.as_secs());
        }
        page.counter("kn_store_usage_walks_total", "Walks of the store's tree started for the kn_store_* figures (at most one per KN_METRICS_REFRESH_MS).", self.usage.walks());
        let streamed = streams.map(Streams::figures).unwrap_or_default();
        page.counter("kn_stream_appends_total", "Durable Streams appends stored since the server started.", streamed.appends);
        page.counter("kn_stream_appended_bytes_total", "Bytes of data appended to Durable Streams since the server started.", streamed.appended_bytes);
        page.gauge("kn_stream_live_readers", "Durable Streams live reads (long-poll, SSE) waiting now.", streamed.live_readers);
        page.gauge("kn_serve_open_tunnels", "Tunnels open now.", serve.open_tunnels);
        page.gauge("kn_serve_open_connections", "Connections open now.", serve.open_connections);
        page.counter("kn_serve_requests_total", "Requests answered since the server started.", serve.requests);
        page.counter("kn_serve_posts_grouped_total", "Posts stored in a group of more than one waiting for the same topic (group commit, KN_GROUP_COMMIT) since the server started.", grouped);
        let labels: Vec<[(&str, &str); 2]> =
            METHODS.iter().flat_map(|m| CLASSES.iter().map(move |c| [("method", *m), ("status_class", *c)])).collect();
        let samples: Vec<(&[(&str, &str)], u64)> = labels
            .iter()
            .enumerate()
            .map(|(i, labels)| (&labels[..], self.requests[i / CLASSES.len()][i % CLASSES.len()].load(Ordering::Relaxed)))
            .collect();
        page.counter_with("kn_serve_http_requests_total", "Responses since the server started, by request method (other: any method not listed) and status class.", &samples);
        let refused = crate::bearer::refusals();
        let labels: Vec<[(&str, &str); 1]> = refused.iter().map(|(reason, _)| [("reason", *reason)]).collect();
        let samples: Vec<(&[(&str, &str)], u64)> = labels.iter().zip(&refused).map(|(labels, (_, n))| (&labels[..], *n)).collect();
        page.counter_with("kn_token_refusals_total", "Bearer tokens presented and refused (401) since the server started, by reason.", &samples);
        let version = env!("CARGO_PKG_VERSION");
        let info: &[(&str, &str)] = match GIT_COMMIT {
            Some(commit) => &[("version", version), ("commit", commit)],
            None => &[("version", version)],
        };
        page.gauge_with("kn_build_info", "The version of knpubsub serving, and the git commit it was built from when known; always 1.", &[(info, 1)]);
        page
    }
}

/// What the server hands a scrape.
pub(crate) struct Scrape {
    pub store: Arc<Store>,
    pub streams: Option<Arc<Streams>>,
    pub pool: tokio::runtime::Handle,
    pub serve: ServeGauges,
}

/// `405` unless the request for `/metrics` is a `GET` or a `HEAD` (asked
/// before the gate: nothing else is ever answered there).
pub(crate) fn not_allowed(request: &hyper::Request<hyper::body::Incoming>) -> Option<hyper::Response<Body>> {
    if request.method() == Method::GET || request.method() == Method::HEAD {
        return None;
    }
    let mut reply = plain(StatusCode::METHOD_NOT_ALLOWED, "405 Method Not Allowed\n".into());
    reply.headers_mut().insert(hyper::header::ALLOW, HeaderValue::from_static("GET, HEAD"));
    Some(reply)
}

/// Answers a `GET` or `HEAD` of `/metrics` made by `user` (`None`:
/// anonymous), whom `serve`'s gate identified: the access check, then
/// the page.
pub(crate) async fn answer(figures: &Figures, scrape: Scrape, request: &hyper::Request<hyper::body::Incoming>, user: Option<String>) -> hyper::Response<Body> {
    if let Some(refused) = not_allowed(request) {
        return refused;
    }
    let head_request = request.method() == Method::HEAD;
    let headers: Vec<(String, Vec<u8>)> = request.headers().iter().map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec())).collect();
    let param = request.uri().query().and_then(|q| {
        q.split('&').filter_map(|kv| kv.split_once('=')).find(|(k, _)| *k == crate::bearer::TOKEN_PARAM).map(|(_, v)| crate::streams::percent_decode(v))
    });
    let Scrape { store, streams, pool, serve } = scrape;
    // The rules (a `stat` of their file at most once a second), a token's
    // signature and the counters' file lock: blocking work, on the
    // request pool, of a cost that does not grow with the store.
    let checked = pool.spawn_blocking(move || {
        allowed(&store, user.as_deref(), &headers, param)?;
        store.counters().map(|counters| (counters, store.grouped_posts())).map_err(|e| Refusal::Failed(e.to_string()))
    });
    let (counters, grouped) = match checked.await {
        Ok(Ok(figures)) => figures,
        Ok(Err(Refusal::Unauthorized(why))) => return challenge(format!("401 Unauthorized: {why}\n")),
        Ok(Err(Refusal::Token(refused))) => {
            let mut reply = plain(StatusCode::UNAUTHORIZED, format!("401 Unauthorized: {}\n", refused.message));
            if let Ok(value) = HeaderValue::from_str(&refused.challenge()) {
                reply.headers_mut().insert(hyper::header::WWW_AUTHENTICATE, value);
            }
            return reply;
        }
        Ok(Err(Refusal::Forbidden(why))) => return plain(StatusCode::FORBIDDEN, format!("403 Forbidden: {why}\n")),
        Ok(Err(Refusal::Failed(why))) => return plain(StatusCode::INTERNAL_SERVER_ERROR, format!("500 Internal Server Error: {why}\n")),
        Err(_) => return plain(StatusCode::INTERNAL_SERVER_ERROR, "500 Internal Server Error\n".into()),
    };
    let body = figures.page(&counters, streams.as_deref(), &serve, grouped).into_string().into_bytes();
    let length = body.len();
    let mut reply = hyper::Response::new(Body::Full(if head_request { None } else { Some(Bytes::from(body)) }));
    reply.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(PROMETHEUS_CONTENT_TYPE));
    reply.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from(length));
    reply
}

/// Why a scrape is not answered with the page.
enum Refusal {
    /// `401`: anonymous, or bad credentials; logging in may help.
    Unauthorized(String),
    /// `403`: the user (or the token) may not.
    Forbidden(String),
    /// `401` with a Bearer challenge: a token presented and refused.
    Token(crate::bearer::Refused),
    /// `500`: the rules or the counters cannot be read.
    Failed(String),
}

/// Whether the request may scrape: always without access rules; else the
/// user (identified as for `/kn`: a bearer token, in the `Authorization`
/// header as Prometheus' `authorization` sends it, the cookie or
/// `kn_token`; else `login`, the gate's) needs `read` on [`METRICS_TOPIC`].
fn allowed(store: &Store, login: Option<&str>, headers: &[(String, Vec<u8>)], param: Option<String>) -> Result<(), Refusal> {
    let rules = match store.access_rules() {
        Ok(None) => return Ok(()),
        Ok(Some(rules)) => rules,
        Err(e) => return Err(Refusal::Failed(e.to_string())),
    };
    let header = |name: &str| headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_slice());
    let bearer = crate::stream_access::Bearer { authorization: header("authorization"), cookies: header("cookie"), param };
    let who = crate::stream_access::principal(store, &bearer, login).map_err(Refusal::Token)?;
    let topic = Topic::parse(METRICS_TOPIC).map_err(|e| Refusal::Failed(e.to_string()))?;
    match rules.check(&who, Operation::Read, &topic) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == kn_journal::ErrorKind::Unauthorized => Err(Refusal::Unauthorized(e.message().to_string())),
        Err(e) => Err(Refusal::Forbidden(e.message().to_string())),
    }
}

/// `401` with a Basic challenge (Prometheus' `basic_auth` answers it).
fn challenge(text: String) -> hyper::Response<Body> {
    let mut reply = plain(StatusCode::UNAUTHORIZED, text);
    if let Ok(value) = HeaderValue::from_str(&format!("Basic realm=\"{AUTH_REALM}\"")) {
        reply.headers_mut().insert(hyper::header::WWW_AUTHENTICATE, value);
    }
    reply
}

fn plain(code: StatusCode, text: String) -> hyper::Response<Body> {
    let length = text.len();
    let mut reply = hyper::Response::new(Body::Full(Some(Bytes::from(text))));
    *reply.status_mut() = code;
    reply.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    reply.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from(length));
    reply
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_and_status_classes_are_a_fixed_set() {
        assert_eq!(METHODS[method_index(&Method::GET)], "GET");
        assert_eq!(METHODS[method_index(&Method::OPTIONS)], "OPTIONS");
        assert_eq!(METHODS[method_index(&Method::PATCH)], "other");
        assert_eq!(METHODS[method_index(&Method::from_bytes(b"BREW").unwrap())], "other");
        assert_eq!(CLASSES[class_index(StatusCode::CONTINUE)], "1xx");
        assert_eq!(CLASSES[class_index(StatusCode::NO_CONTENT)], "2xx");
        assert_eq!(CLASSES[class_index(StatusCode::NOT_MODIFIED)], "3xx");
        assert_eq!(CLASSES[class_index(StatusCode::GONE)], "4xx");
        assert_eq!(CLASSES[class_index(StatusCode::SERVICE_UNAVAILABLE)], "5xx");
        assert_eq!(CLASSES[class_index(StatusCode::from_u16(999).unwrap())], "5xx");
    }

    #[test]
    fn the_metrics_topic_is_a_topic() {
        assert_eq!(Topic::parse(METRICS_TOPIC).unwrap().as_str(), METRICS_TOPIC);
    }
}
