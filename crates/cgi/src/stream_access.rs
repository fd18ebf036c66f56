//! Who may do what to a Durable Stream: the access rules of PubSub topics
//! (docs/ACCESS.md), applied to the stream's path judged as the topic
//! `/v1/stream/<path>` (the path of its URL), so that no new rule syntax
//! is needed.
//!
//! | request | needs, on `/v1/stream/<path>` |
//! |---|---|
//! | `GET`, `HEAD` (catch-up, long-poll, SSE) | `read` |
//! | `PUT` (create), `POST` (append, close) | `post` |
//! | `PUT` with `Stream-Forked-From: S` | `post`, and `read` on `/v1/stream/S` |
//! | `DELETE` | `delete` |
//! | `OPTIONS` (CORS preflight, which carries no credentials) | nothing |
//!
//! Without a rules file everything is allowed, as for topics. Under rules,
//! a stream path that is not a valid topic name once prefixed (a byte
//! other than letters, digits, `-`, `_`, `.` and non-ASCII; a segment
//! starting or ending with `.`; longer than 1024 bytes in all) is refused
//! `400`: the rules could not say who may use it.

use kn_journal::access::{Operation, Principal};
use kn_journal::{ErrorKind, Store, Topic};

/// The topic the rules judge a stream path as: `/v1/stream/<path>`.
pub const STREAM_TOPIC_PREFIX: &str = "/v1/stream";

/// The pseudo-topic of stream `path` (what follows `/v1/stream/`).
///
/// ```
/// use kn_cgi::stream_access::stream_topic;
///
/// assert_eq!(stream_topic("chat/room-1").unwrap().as_str(), "/v1/stream/chat/room-1");
/// assert!(stream_topic("a b").is_err());
/// ```
pub fn stream_topic(path: &str) -> Result<Topic, kn_journal::Error> {
    Topic::parse(&format!("{STREAM_TOPIC_PREFIX}/{path}"))
}

/// What a request with `method` does to its stream; `None` for what is
/// not checked (`OPTIONS`, and methods answered `405`).
pub fn operation(method: &str) -> Option<Operation> {
    match method {
        "GET" | "HEAD" => Some(Operation::Read),
        "PUT" | "POST" => Some(Operation::Post),
        "DELETE" => Some(Operation::Delete),
        _ => None,
    }
}

/// Whether `who` (a user, anonymous, or a bearer token's principal) may make a `method` request of
/// stream `path` (with `forked_from`, the raw `Stream-Forked-From` of a
/// `PUT`). The refusal's kind is the answer's: `Unauthorized` (`401`)
/// for anonymous, `Forbidden` (`403`) for a user, `BadRequest` (`400`) for
/// a path the rules cannot judge, `Io` (`500`) while the rules file is
/// broken.
pub fn check(store: &Store, method: &str, path: &str, forked_from: Option<&str>, who: &Principal) -> Result<(), kn_journal::Error> {
    let Some(op) = operation(method) else { return Ok(()) };
    let rules = store.access_rules()?;
    if rules.is_none() && !who.is_narrowed() {
        return Ok(());
    }
    let mut checks = vec![(op, path.to_string())];
    if let (Some(from), "PUT") = (forked_from, method) {
        let from = percent_encoding::percent_decode_str(from.trim()).decode_utf8_lossy().into_owned();
        let from = from.trim_start_matches('/');
        checks.push((Operation::Read, from.strip_prefix("v1/stream/").unwrap_or(from).to_string()));
    }
    for (op, path) in checks {
        let topic = stream_topic(&path).map_err(|e| {
            let why = format!("under access rules a stream path must make a valid topic name below {STREAM_TOPIC_PREFIX}: {}", e.message());
            kn_journal::Error::new(ErrorKind::BadRequest, why)
        })?;
        match &rules {
            Some(rules) => rules.check(who, op, &topic)?,
            // No rules allow everything; a token or a cookie still narrows.
            None => who.check_claim(op, &topic)?,
        }
    }
    Ok(())
}

/// Whether `who` may do through the bridge what a `method` request of
/// stream `path` does there (docs/DURABLE-STREAMS.md, "The bridge"): a
/// bound stream reads its topic (`GET`, `HEAD`), posts to it (`POST`),
/// or both (a `PUT` binding it with `Kn-Topic` `binding`). Only a
/// principal that something besides the rules narrows (a token's claim,
/// a cookie's channel) is checked here, against its claim on the topic:
/// without a rules file everyone else may do anything to any topic, and
/// with one the bridge is off. An existing stream's binding is read with
/// [`kn_streams::Streams::head`]; a stream that cannot be read is left to
/// the request itself to refuse.
pub fn check_bridge(streams: &kn_streams::Streams, method: &str, path: &str, binding: Option<&str>, who: &Principal) -> Result<(), kn_journal::Error> {
    if !who.is_narrowed() {
        return Ok(());
    }
    let ops: &[Operation] = match method {
        "GET" | "HEAD" => &[Operation::Read],
        "POST" => &[Operation::Post],
        "PUT" => &[Operation::Read, Operation::Post],
        _ => return Ok(()),
    };
    let topic = match (method, binding) {
        ("PUT", Some(topic)) => Some(topic.to_owned()),
        _ => streams.head(path).ok().and_then(|info| info.topic),
    };
    // A binding that names no topic imports and posts nothing.
    let Some(topic) = topic.and_then(|t| Topic::parse(&t).ok()) else { return Ok(()) };
    ops.iter().try_for_each(|op| who.check_claim(*op, &topic))
}

/// Where a stream request's bearer token may be (crate::bearer).
pub struct Bearer<'a> {
    /// The `Authorization` header.
    pub authorization: Option<&'a [u8]>,
    /// The `Cookie` header.
    pub cookies: Option<&'a [u8]>,
    /// The `kn_token` query parameter, decoded.
    pub param: Option<String>,
}

impl Bearer<'_> {
    fn token(&self, store: &Store) -> Option<Vec<u8>> {
        let cookie = self.cookies.and_then(|c| crate::request::cookie_value(c, &store.config().token_cookie));
        crate::bearer::presented(self.authorization, self.param.as_deref().map(str::as_bytes), cookie.as_deref()).map(<[u8]>::to_vec)
    }
}

/// Who makes a stream request: its bearer token's principal (or the
/// token's refusal, answered `401` and counted), else `user` (`None`:
/// anonymous).
pub fn principal(store: &Store, bearer: &Bearer<'_>, user: Option<&str>) -> Result<Principal, crate::bearer::Refused> {
    match bearer.token(store) {
        Some(token) => crate::bearer::principal(store, &token).inspect_err(crate::bearer::Refused::count),
        None => Ok(user.map_or_else(Principal::anonymous, Principal::user)),
    }
}

/// Who makes the stream request with `headers` ([`principal`], the token
/// taken from the `Authorization` header, the `kn_token` parameter `param`
/// or the token cookie): a token from the cookie only reads unless the
/// request shows it comes from this server's own pages
/// ([`Principal::through_cookie`]; docs/ACCESS.md, "Cookies and other
/// sites"), so that a page of another site cannot write a stream with
/// a visitor's cookie.
pub fn request_principal(store: &Store, headers: &hyper::HeaderMap, param: Option<String>, user: Option<&str>) -> Result<Principal, crate::bearer::Refused> {
    let header = |name: &str| headers.get(name).map(|v| v.as_bytes());
    let in_param = param.is_some();
    let bearer = Bearer { authorization: header("authorization").filter(|v| crate::bearer::is_bearer(v)), cookies: header("cookie"), param };
    let who = principal(store, &bearer, user)?;
    let from_cookie = who.has_token() && bearer.authorization.is_none() && !in_param;
    if !from_cookie {
        return Ok(who);
    }
    let authority = header("host").and_then(|h| std::str::from_utf8(h).ok()).unwrap_or("");
    Ok(who.through_cookie(kn_journal::access::Site::of(header("sec-fetch-site"), header("origin"), authority)))
}

/// False when the request's token needs a public-key signature check
/// (see crate::bearer::is_cheap): made off `serve`'s event loop.
pub fn token_is_cheap(store: &Store, bearer: &Bearer<'_>) -> bool {
    bearer.token(store).is_none_or(|token| crate::bearer::is_cheap(store, &token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_map_to_operations() {
        assert_eq!(operation("GET"), Some(Operation::Read));
        assert_eq!(operation("HEAD"), Some(Operation::Read));
        assert_eq!(operation("PUT"), Some(Operation::Post));
        assert_eq!(operation("POST"), Some(Operation::Post));
        assert_eq!(operation("DELETE"), Some(Operation::Delete));
        assert_eq!(operation("OPTIONS"), None);
    }

    #[test]
    fn paths_that_are_no_topic_are_refused() {
        assert!(stream_topic("a/.hidden").is_err());
        assert!(stream_topic(&"x".repeat(1020)).is_err());
        assert_eq!(stream_topic("anna/notes").unwrap().as_str(), "/v1/stream/anna/notes");
    }
}
