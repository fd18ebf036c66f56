//! Remote destinations: the HTTP requests the journal sends on a client's
//! behalf (PROTOCOL.md 4.1 steps 2 and 4), and the policy that decides which
//! URLs it may send them to.
//!
//! Everything goes through the [`Remote`] trait, so the CGI and the sensors
//! share one HTTP implementation ([`HttpRemote`], in `http.rs`, which also
//! holds the client's rules) and tests can substitute their own.
//!
//! ```
//! use kn_journal::OutboundPolicy;
//!
//! let policy: OutboundPolicy = "http://hub.example/kn, http://10.0.0.7:8080/feeds/".parse().unwrap();
//! assert!(policy.check("http://hub.example/kn/what/chat").is_ok());
//! assert!(policy.check("http://hub.example.evil.com/kn").is_err());
//! assert!(policy.check("http://10.0.0.7:8080/other").is_err());
//! ```

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, ErrorKind};
use crate::event::Event;
// store.rs names the client through this module.

/// The answer of a remote server: its status code and body, whatever the
/// status (a `404` is an answer, not an error).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteReply {
    /// The HTTP status code.
    pub status: u16,
    /// The response body.
    pub body: Vec<u8>,
}

/// The one seam through which the journal sends HTTP requests on a
/// client's behalf (content transforms and remote route destinations).
pub trait Remote: Send + Sync {
    /// POSTs `pairs` to `url` as `application/x-www-form-urlencoded` and
    /// returns the reply, whatever its status.
    ///
    /// Fails with [`ErrorKind::Remote`] when no complete HTTP answer arrives
    /// (connection refused or reset, timeout, not HTTP, body too large) and
    /// with [`ErrorKind::BadRequest`] when `url` is not a usable URL; the
    /// message names the URL.
    fn post_form(&self, url: &str, pairs: &[(&[u8], &[u8])]) -> Result<RemoteReply, Error>;

    /// The sender of Web Push messages, when this client has one
    /// (`crate::push`, issue 42): none by default, and push routes are
    /// then refused.
    #[doc(hidden)]
    fn push(&self) -> Option<&dyn crate::push::Push> {
        None
    }
}

/// Which remote URLs the journal may send requests to (route destinations
/// and content transforms): the defence against using the server as a
/// proxy into networks only it can reach.
///
/// Matching rule for [`AllowPrefixes`](OutboundPolicy::AllowPrefixes):
/// scheme and host compare case-insensitively and exactly (a default port
/// `:80`/`:443` is the same as none), so `http://good.example` allows
/// neither `http://good.example.evil.com/` nor `http://good.example:8080/`.
/// A prefix without a path means the whole host (`/`). A prefix path that
/// ends in `/` allows everything beneath it; one that does not allows
/// itself and what lies beneath it after a `/` (plus any query), so
/// `http://h/kn` allows `http://h/kn/what/chat` and `http://h/kn?x=1` but
/// not `http://h/knock`.
///
/// Except under `AllowAll`, URLs are refused if they carry user
/// information (`http://a@b/`), a path with `.`/`..` segments or
/// backslashes (also percent-encoded), or whitespace/control characters:
/// forms that servers and parsers disagree on.
///
/// ```
/// use kn_journal::OutboundPolicy;
///
/// assert_eq!("allow".parse::<OutboundPolicy>().unwrap(), OutboundPolicy::AllowAll);
/// assert_eq!("none".parse::<OutboundPolicy>().unwrap(), OutboundPolicy::DenyAll);
/// let p: OutboundPolicy = "HTTP://Hub.Example:80".parse().unwrap();
/// assert_eq!(p, OutboundPolicy::AllowPrefixes(vec!["http://hub.example/".into()]));
/// assert!(p.check("http://hub.example/kn").is_ok());
/// assert!(p.check("http://user@hub.example/kn").is_err());
/// assert!("ftp://x/".parse::<OutboundPolicy>().is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutboundPolicy {
    /// Any URL may be requested.
    AllowAll,
    /// No remote URL may be requested.
    DenyAll,
    /// Only URLs under one of these prefixes (`http://` or `https://`
    /// URLs; see the type's documentation for the matching rule).
    AllowPrefixes(Vec<String>),
}

impl OutboundPolicy {
    /// Succeeds if `url` may be requested; otherwise fails with
    /// [`ErrorKind::Forbidden`] and a message naming the URL and saying
    /// how to allow it.
    pub fn check(&self, url: &str) -> Result<(), Error> {
        let prefixes = match self {
            OutboundPolicy::AllowAll => return Ok(()),
            OutboundPolicy::DenyAll => {
                return Err(forbidden(
                    url,
                    "the outbound policy denies all remote URLs; allow it by listing a prefix such as \
                     'http://host/' in the outbound policy, or set it to 'allow'",
                ))
            }
            OutboundPolicy::AllowPrefixes(prefixes) => prefixes,
        };
        let parts = UrlParts::parse(url).map_err(|why| {
            forbidden(url, &format!("{why}; only plain http(s)://host[:port]/path URLs can be allowed by prefix"))
        })?;
        if parts.userinfo {
            return Err(forbidden(
                url,
                "it carries user information ('...@'), which only the 'allow' outbound policy permits",
            ));
        }
        if !path_is_plain(parts.path) {
            return Err(forbidden(
                url,
                "its path has '.' or '..' segments or backslashes (perhaps percent-encoded), which only the 'allow' outbound policy permits",
            ));
        }
        let allowed = prefixes.iter().filter_map(|p| Prefix::parse(p).ok()).any(|p| p.matches(&parts));
        if allowed {
            return Ok(());
        }
        Err(forbidden(
            url,
            &format!(
                "it is under none of the allowed prefixes ({}); to allow it, add '{}://{}/' (or a narrower prefix) to the outbound policy",
                if prefixes.is_empty() { "none".to_string() } else { prefixes.join(", ") },
                parts.scheme,
                parts.authority,
            ),
        ))
    }
}

fn forbidden(url: &str, why: &str) -> Error {
    Error::new(ErrorKind::Forbidden, format!("remote URL '{url}' refused: {why}"))
}

impl FromStr for OutboundPolicy {
    type Err = Error;

    /// `allow`/`all` → [`AllowAll`](OutboundPolicy::AllowAll),
    /// `deny`/`none` → [`DenyAll`](OutboundPolicy::DenyAll) (any case),
    /// otherwise a whitespace- or comma-separated list of `http://` or
    /// `https://` prefixes, stored normalised. An empty string is an error.
    fn from_str(config: &str) -> Result<OutboundPolicy, Error> {
        let word = config.trim();
        if word.eq_ignore_ascii_case("allow") || word.eq_ignore_ascii_case("all") {
            return Ok(OutboundPolicy::AllowAll);
        }
        if word.eq_ignore_ascii_case("deny") || word.eq_ignore_ascii_case("none") {
            return Ok(OutboundPolicy::DenyAll);
        }
        let mut prefixes = Vec::new();
        for item in word.split(|c: char| c == ',' || c.is_whitespace()).filter(|s| !s.is_empty()) {
            let prefix = Prefix::parse(item).map_err(|why| {
                Error::new(
                    ErrorKind::BadRequest,
                    format!(
                        "bad outbound policy '{config}': prefix '{item}' {why} \
                         (expected 'allow', 'deny' or http:// / https:// URL prefixes)"
                    ),
                )
            })?;
            prefixes.push(prefix.to_string());
        }
        if prefixes.is_empty() {
            return Err(Error::new(
                ErrorKind::BadRequest,
                format!("bad outbound policy '{config}': expected 'allow', 'deny' or a list of http:// / https:// URL prefixes"),
            ));
        }
        Ok(OutboundPolicy::AllowPrefixes(prefixes))
    }
}

/// An absolute http(s) URL split into normalised parts.
#[derive(Debug)]
struct UrlParts<'a> {
    /// `http` or `https`, lowercase.
    scheme: String,
    /// Host (lowercase) and port unless it is the scheme's default.
    authority: String,
    /// True if the authority had a `user@` part.
    userinfo: bool,
    /// The path, `/` when empty; query and fragment excluded.
    path: &'a str,
    /// True if a `?` or `#` follows the path.
    has_tail: bool,
}

impl<'a> UrlParts<'a> {
    fn parse(url: &'a str) -> Result<UrlParts<'a>, &'static str> {
        if url.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return Err("it contains whitespace or control characters");
        }
        let (scheme, rest) = url.split_once("://").ok_or("it is not an absolute URL")?;
        let scheme = scheme.to_ascii_lowercase();
        let default_port = match scheme.as_str() {
            "http" => 80,
            "https" => 443,
            _ => return Err("it does not start with http:// or https://"),
        };
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((_, hostport)) => (true, hostport),
            None => (false, authority),
        };
        let (host, port) = split_host_port(hostport)?;
        let authority = match port {
            Some(p) if p != default_port => format!("{host}:{p}"),
            _ => host,
        };
        let path_end = tail.find(['?', '#']).unwrap_or(tail.len());
        let path = if path_end == 0 { "/" } else { &tail[..path_end] };
        Ok(UrlParts { scheme, authority, userinfo, path, has_tail: path_end < tail.len() })
    }
}

/// Splits `host[:port]` (host possibly a bracketed IPv6 address), with the
/// host lowercased and checked to hold only host-name characters.
fn split_host_port(hostport: &str) -> Result<(String, Option<u16>), &'static str> {
    let (host, port) = if hostport.starts_with('[') {
        let close = hostport.find(']').ok_or("its IPv6 host has no closing ']'")?;
        let (host, rest) = hostport.split_at(close + 1);
        let ok = host[1..close].bytes().all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.');
        if !ok || close == 1 {
            return Err("its IPv6 host is malformed");
        }
        let port = match rest.strip_prefix(':') {
            Some(port) => Some(port),
            None if rest.is_empty() => None,
            None => return Err("its IPv6 host is malformed"),
        };
        (host, port)
    } else {
        match hostport.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (hostport, None),
        }
    };
    if host.is_empty() {
        return Err("it has no host");
    }
    let plain =
        host.starts_with('[') || host.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_');
    if !plain {
        return Err("its host has characters a host name cannot have");
    }
    let port = match port {
        None | Some("") => None,
        Some(p) if p.bytes().all(|b| b.is_ascii_digit()) => {
            Some(p.parse::<u16>().map_err(|_| "its port is out of range")?)
        }
        Some(_) => return Err("its port is not a number"),
    };
    Ok((host.to_ascii_lowercase(), port))
}

/// True if `path`, percent-decoded, has no `.`/`..` segment and no
/// backslash: forms a server may normalise into a path outside a prefix.
fn path_is_plain(path: &str) -> bool {
    let decoded = percent_decode(path.as_bytes());
    !decoded.contains(&b'\\') && decoded.split(|&b| b == b'/').all(|seg| seg != b"." && seg != b"..")
}

/// Decodes `%XX` escapes (repeatedly, so `%252e` cannot hide a `.`).
fn percent_decode(bytes: &[u8]) -> Vec<u8> {
    let mut current = bytes.to_vec();
    for _ in 0..4 {
        let out = crate::event::decode_escapes(&current, b'%');
        if out == current {
            break;
        }
        current = out;
    }
    current
}

/// A normalised allow-list prefix.
struct Prefix {
    scheme: String,
    authority: String,
    path: String,
}

impl Prefix {
    fn parse(text: &str) -> Result<Prefix, &'static str> {
        let parts = UrlParts::parse(text)?;
        if parts.userinfo {
            return Err("has user information ('...@')");
        }
        if parts.has_tail {
            return Err("has a query or fragment ('?' or '#')");
        }
        if !path_is_plain(parts.path) {
            return Err("has '.' or '..' segments or backslashes");
        }
        Ok(Prefix { scheme: parts.scheme, authority: parts.authority, path: parts.path.to_string() })
    }

    fn matches(&self, url: &UrlParts<'_>) -> bool {
        if url.scheme != self.scheme || url.authority != self.authority {
            return false;
        }
        if self.path.ends_with('/') {
            return url.path.starts_with(&self.path);
        }
        match url.path.strip_prefix(self.path.as_str()) {
            Some(rest) => rest.is_empty() || rest.starts_with('/'),
            None => false,
        }
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}{}", self.scheme, self.authority, self.path)
    }
}

/// Splits a `kn_content_transform` spec, `URI [keyword]` (separated by
/// any ASCII whitespace), into the URI and the keyword (default
/// `kn_payload`). This is the parse [`content_transform`] uses, so check
/// the [`OutboundPolicy`] against the URI it returns.
///
/// ```
/// use kn_journal::internal::parse_content_transform;
///
/// assert_eq!(parse_content_transform(b"http://t/x").unwrap(), ("http://t/x", &b"kn_payload"[..]));
/// assert_eq!(parse_content_transform(b" http://t/x\ttext ").unwrap(), ("http://t/x", &b"text"[..]));
/// assert!(parse_content_transform(b"http://t/x a b").is_err());
/// ```
pub fn parse_content_transform(spec: &[u8]) -> Result<(&str, &[u8]), Error> {
    let text = std::str::from_utf8(spec).map_err(|_| {
        Error::new(
            ErrorKind::BadRequest,
            format!("bad kn_content_transform '{}': not UTF-8", String::from_utf8_lossy(spec)),
        )
    })?;
    let mut words = text.split_ascii_whitespace();
    let (Some(uri), keyword, None) = (words.next(), words.next(), words.next()) else {
        return Err(Error::new(
            ErrorKind::BadRequest,
            format!("bad kn_content_transform '{text}': expected 'URI [keyword]'"),
        ));
    };
    Ok((uri, keyword.map(str::as_bytes).unwrap_or(crate::event::KN_PAYLOAD)))
}

/// Runs a content transform (PROTOCOL.md 4.1 step 2): `spec` is
/// `URI [keyword]`; `keyword` (default `kn_payload`) = `payload` is POSTed
/// to the URI, and on `200` the response body is the new payload.
///
/// Any other status, or no answer, fails with [`ErrorKind::Remote`] (the
/// event does not travel that route); a malformed `spec` fails with
/// [`ErrorKind::BadRequest`]. The caller checks the [`OutboundPolicy`]
/// first.
pub fn content_transform(remote: &dyn Remote, spec: &[u8], payload: &[u8]) -> Result<Vec<u8>, Error> {
    let (uri, keyword) = parse_content_transform(spec)?;
    let reply = remote.post_form(uri, &[(keyword, payload)])?;
    if reply.status != 200 {
        return Err(Error::new(
            ErrorKind::Remote,
            format!("content transform '{uri}' answered {}{}, not 200", reply.status, excerpt(&reply.body)),
        ));
    }
    Ok(reply.body)
}

/// Delivers `event` to a remote destination (PROTOCOL.md 4.1 step 4): an
/// HTTP POST of all its elements, urlencoded, to `url`. Fails with
/// [`ErrorKind::Remote`] on a status of 400 or more, or no answer. The
/// caller checks the [`OutboundPolicy`] first.
pub fn deliver(remote: &dyn Remote, url: &str, event: &Event) -> Result<(), Error> {
    deliver_to(remote, url, event).map_err(RemoteFailure::into_error)
}

/// Why a remote delivery failed, as forwarding needs to know it
/// (PROTOCOL.md 4.1: a refusal poisons the route, a failure to answer is
/// retried).
#[derive(Debug)]
pub enum RemoteFailure {
    /// The server answered 4xx: it will not take the event.
    Refused(Error),
    /// The server answered 5xx, or no complete answer came (refused or
    /// reset connection, timeout): it may take the event later.
    Unavailable(Error),
    /// The URL cannot be requested at all.
    Unusable(Error),
}

impl RemoteFailure {
    /// The error, whatever the kind of failure.
    pub fn into_error(self) -> Error {
        match self {
            RemoteFailure::Refused(e) | RemoteFailure::Unavailable(e) | RemoteFailure::Unusable(e) => e,
        }
    }
}

/// [`deliver`], telling a refusal (4xx) from a server that did not take
/// the event now (5xx, no answer) and from a URL that cannot be used.
pub fn deliver_to(remote: &dyn Remote, url: &str, event: &Event) -> Result<(), RemoteFailure> {
    // The destination is a topic URL of a PubSub server, where a POST
    // without do_method is already a notify (PROTOCOL.md 3). Saying so
    // explicitly keeps the meaning if the URL carries a query that would
    // make the server guess otherwise, and costs nothing elsewhere. Events
    // never hold control parameters, but should one hold a do_method we
    // send it alone rather than two conflicting values.
    let mut pairs: Vec<(&[u8], &[u8])> = Vec::with_capacity(event.len() + 1);
    if !event.contains("do_method") {
        pairs.push((b"do_method", b"notify"));
    }
    pairs.extend(event.elements());
    let reply = match remote.post_form(url, &pairs) {
        Ok(reply) => reply,
        Err(err) if err.kind() == ErrorKind::Remote => return Err(RemoteFailure::Unavailable(err)),
        Err(err) => return Err(RemoteFailure::Unusable(err)),
    };
    if reply.status >= 400 {
        let err = Error::new(
            ErrorKind::Remote,
            format!("remote destination '{url}' refused the event: {}{}", reply.status, excerpt(&reply.body)),
        );
        return Err(if reply.status < 500 { RemoteFailure::Refused(err) } else { RemoteFailure::Unavailable(err) });
    }
    Ok(())
}

/// The start of a reply body for an error message (` (body: ...)`), or
/// nothing when empty.
fn excerpt(body: &[u8]) -> String {
    const MAX: usize = 200;
    if body.is_empty() {
        return String::new();
    }
    let text = String::from_utf8_lossy(&body[..body.len().min(MAX)]);
    let text: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    let more = if body.len() > MAX { "..." } else { "" };
    format!(" (body: {}{more})", text.trim())
}

/// An explicitly configured HTTP proxy (`http://host:port`), checked when
/// it is parsed so that a [`Config`](crate::Config) holding one always builds a client.
///
/// ```
/// use kn_journal::HttpProxy;
///
/// let p: HttpProxy = "http://proxy.example:3128".parse().unwrap();
/// assert_eq!(p.as_str(), "http://proxy.example:3128");
/// assert!("https://proxy.example".parse::<HttpProxy>().is_err());
/// assert!("".parse::<HttpProxy>().is_err());
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct HttpProxy {
    url: String,
}

impl HttpProxy {
    /// The proxy URL as configured.
    pub fn as_str(&self) -> &str {
        &self.url
    }
}

impl FromStr for HttpProxy {
    type Err = Error;

    /// Accepts `http://host[:port]` (user and password allowed, as
    /// `http://user:pass@host:port`). Fails with
    /// [`ErrorKind::BadRequest`] naming the URL otherwise.
    fn from_str(url: &str) -> Result<HttpProxy, Error> {
        let url = url.trim();
        let bad = |why: &str| Error::new(ErrorKind::BadRequest, format!("bad proxy URL '{url}': {why}"));
        if !url.to_ascii_lowercase().starts_with("http://") {
            return Err(bad("expected http://host:port (this build speaks plain http only)"));
        }
        // Checked as the client will read it, so that a `Config` holding
        // one always builds a client. (Without the client, feature `http`,
        // nothing is sent through it.)
        #[cfg(feature = "http")]
        {
            let proxy = ureq::Proxy::new(url).map_err(|e| bad(&e.to_string()))?;
            if proxy.protocol() != ureq::ProxyProtocol::Http {
                return Err(bad("expected an http:// proxy"));
            }
        }
        Ok(HttpProxy { url: url.to_string() })
    }
}

impl fmt::Debug for HttpProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URL may carry a password: show the host only.
        let host = self.url.rsplit_once('@').map_or(&self.url[7..], |(_, h)| h);
        write!(f, "HttpProxy(http://{host})")
    }
}

impl fmt::Display for HttpProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// The [`Remote`] of a store built without an HTTP client (kn-journal
/// without its `http` feature): every remote delivery and content
/// transform is refused, as under `KN_OUTBOUND=deny`, with an error that
/// says why. An embedder that wants them gives its own client
/// ([`Store::with_remote`](crate::Store::with_remote)).
#[cfg(not(feature = "http"))]
pub(crate) struct NoClient;

#[cfg(not(feature = "http"))]
impl Remote for NoClient {
    fn post_form(&self, url: &str, _pairs: &[(&[u8], &[u8])]) -> Result<RemoteReply, Error> {
        Err(forbidden(url, "this build of kn-journal has no HTTP client (its feature `http`); give the store one with Store::with_remote"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decode_sees_through_double_encoding() {
        assert_eq!(percent_decode(b"/a/%2e%2E/b"), b"/a/../b");
        assert_eq!(percent_decode(b"%252e"), b".");
        assert_eq!(percent_decode(b"100%"), b"100%");
        assert_eq!(percent_decode(b"%zz%4"), b"%zz%4");
    }

    #[test]
    fn url_parts_normalise_case_and_default_port() {
        let p = UrlParts::parse("HTTP://Host.Example:80").unwrap();
        assert_eq!((p.scheme.as_str(), p.authority.as_str(), p.path), ("http", "host.example", "/"));
        let p = UrlParts::parse("https://h:443/x?y").unwrap();
        assert_eq!((p.authority.as_str(), p.path, p.has_tail), ("h", "/x", true));
        let p = UrlParts::parse("http://[::1]:8080/x").unwrap();
        assert_eq!(p.authority, "[::1]:8080");
        assert!(UrlParts::parse("http://h:99999/").is_err());
        assert!(UrlParts::parse("http://h:8x/").is_err());
        assert!(UrlParts::parse("http:///x").is_err());
        assert!(UrlParts::parse("http://h%2e/").is_err());
    }
}
