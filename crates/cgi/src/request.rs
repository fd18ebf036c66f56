//! A PubSub request: CGI/1.1 (RFC 3875) environment variables and body, or
//! the pieces of a plain HTTP request, reduced to what the protocol needs.
//!
//! Written by hand, because the protocol has quirks no CGI crate has: POST
//! bodies are form data whatever their `Content-Type` (PROTOCOL.md 3.8),
//! both `&` and `;` separate pairs, and values are raw bytes.

use std::collections::HashMap;
use std::io::Read;

use kn_journal::Config;
use kn_wire::{form, Params};

use crate::{Error, ErrorKind};

/// The HTTP method of a request. Only `GET` and `POST` are served; every
/// other method, `HEAD` included, is answered `501`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    /// `GET`.
    Get,
    /// `POST`: the body is read and parsed as form data.
    Post,
    /// `HEAD`: answered `501` with headers only.
    Head,
    /// Any other method, as sent.
    Other(String),
}

impl Method {
    /// Recognises a method name (case-sensitive, as HTTP is).
    pub fn parse(name: &str) -> Method {
        match name {
            "GET" => Method::Get,
            "POST" => Method::Post,
            "HEAD" => Method::Head,
            other => Method::Other(other.to_owned()),
        }
    }

    /// The method's name.
    pub fn as_str(&self) -> &str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Head => "HEAD",
            Method::Other(name) => name,
        }
    }

    /// True for the methods `pubsub.cgi` answers (`GET`, `POST`); the
    /// others get [`Response::not_implemented`](crate::Response::not_implemented).
    pub fn is_supported(&self) -> bool {
        matches!(self, Method::Get | Method::Post)
    }
}

/// Limits on what a request may bring.
///
/// ```
/// use kn_cgi::Limits;
/// assert_eq!(Limits::default().max_body(), 16 << 20);
/// assert_eq!(Limits::new().with_max_body(10).max_body(), 10);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    max_body: u64,
    max_elements: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { max_body: 16 << 20, max_elements: 10_000 }
    }
}

impl Limits {
    /// The default limits (a 16 MiB body).
    pub fn new() -> Limits {
        Limits::default()
    }

    /// The limits of a server over the store `config` describes: a body
    /// may hold the largest event the store accepts with its encoding
    /// overhead (`max_event_bytes` × 3, at least 1 MiB).
    ///
    /// ```
    /// use kn_cgi::Limits;
    /// use kn_journal::Config;
    ///
    /// let mut config = Config::new("kn_events");
    /// config.max_event_bytes = 1 << 20;
    /// assert_eq!(Limits::for_store(&config).max_body(), 3 << 20);
    /// config.max_event_bytes = 1000;
    /// assert_eq!(Limits::for_store(&config).max_body(), 1 << 20);
    /// ```
    pub fn for_store(config: &Config) -> Limits {
        Limits::new()
            .with_max_body((config.max_event_bytes as u64).saturating_mul(3).max(1 << 20))
            .with_max_elements(config.max_form_elements)
    }

    /// Sets the most form elements (`name=value` pairs, query and body
    /// together) a request may carry; more fail with `413 Too many form
    /// elements` (`kn_wire::ErrorKind::TooManyElements`) as they are parsed.
    pub fn with_max_elements(mut self, elements: usize) -> Limits {
        self.max_elements = elements;
        self
    }

    /// Sets the largest request body accepted, in bytes; a larger
    /// `CONTENT_LENGTH` fails with [`ErrorKind::TooLarge`] before any of
    /// the body is read.
    pub fn with_max_body(mut self, bytes: u64) -> Limits {
        self.max_body = bytes;
        self
    }

    /// The largest request body accepted, in bytes.
    pub fn max_body(&self) -> u64 {
        self.max_body
    }

    /// The most form elements a request may carry
    /// ([`Limits::with_max_elements`]).
    pub fn max_elements(&self) -> usize {
        self.max_elements
    }
}

/// The pieces of a plain HTTP request, for serving the protocol from an
/// in-process HTTP server mounted at `script_name`
/// ([`Request::from_http`]).
#[derive(Clone, Debug, Default)]
pub struct HttpRequest {
    /// The method, e.g. `GET`.
    pub method: String,
    /// The path after the mount point, still percent-encoded as on the
    /// request line, e.g. `/what/chat` (empty when none).
    pub path_info: Vec<u8>,
    /// The query string without its `?`.
    pub query: Vec<u8>,
    /// The request headers as `(name, value)`, names in any case.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The complete body.
    pub body: Vec<u8>,
    /// The mount point, e.g. `/kn`: the path of the "script".
    pub script_name: String,
    /// The server's own name, for requests without `Host`.
    pub server_name: String,
    /// The port the server listens on.
    pub server_port: u16,
    /// True when the connection is TLS.
    pub https: bool,
    /// The authenticated user, if the server authenticates.
    pub remote_user: Option<String>,
}

/// A parsed PubSub request.
///
/// Parameters come from the query string, then (for `POST`) from the body,
/// in that order, so the first value of a name sent in both places is the
/// query string's.
#[derive(Clone, Debug)]
pub struct Request {
    method: Method,
    params: Params,
    path_info: Vec<u8>,
    script_name: String,
    server_url: String,
    /// The URLs the request reached the server by (see [`Request::names`]).
    names: Vec<String>,
    remote_user: Option<String>,
    last_event_id: Option<Vec<u8>>,
    /// The value of the `kn_session` cookie (an anonymous visitor's
    /// session token, docs/ACCESS.md), unverified.
    session_cookie: Option<Vec<u8>>,
    user_agent: Option<Vec<u8>>,
    /// The `Authorization` header (`HTTP_AUTHORIZATION`, which Apache
    /// passes with `CGIPassAuth On`) and the `Cookie` header, where a
    /// bearer token may be (crate::bearer).
    authorization: Option<Vec<u8>>,
    cookies: Option<Vec<u8>>,
    /// `Sec-Fetch-Site` and `Origin`: whether the request comes from this
    /// server's own pages ([`Request::site`]).
    fetch_site: Option<Vec<u8>>,
    origin: Option<Vec<u8>>,
    /// The `Accept` header: whether `do_method=help` answers HTML.
    accept: Option<Vec<u8>>,
}

impl Request {
    /// Reads a CGI/1.1 request from environment variables `vars` and the
    /// request body on `body`.
    ///
    /// For `POST`, exactly `CONTENT_LENGTH` bytes are read from `body` and
    /// parsed as form data, whatever `CONTENT_TYPE` says. Methods other
    /// than `GET` and `POST` get no parameters at all (neither query nor
    /// body is looked at), so that they are always answered `501`.
    ///
    /// Errors: [`ErrorKind::TooLarge`] when `CONTENT_LENGTH` exceeds
    /// `limits` (nothing read), [`ErrorKind::Wire`] (`BadForm`) for a malformed
    /// `%` escape, [`ErrorKind::BadRequest`] for a bad `CONTENT_LENGTH` or a
    /// short body, [`ErrorKind::Io`] when reading fails.
    pub fn from_cgi_env<I, K, V, R>(vars: I, body: R, limits: &Limits) -> Result<Request, Error>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<[u8]>,
        V: AsRef<[u8]>,
        R: Read,
    {
        let env = Env(vars.into_iter().map(|(k, v)| (k.as_ref().to_vec(), v.as_ref().to_vec())).collect());
        Request::from_env(env, body, limits)
    }

    /// [`Request::from_cgi_env`] with the variables collected.
    fn from_env(env: Env, body: impl Read, limits: &Limits) -> Result<Request, Error> {
        let method = Method::parse(&env.text("REQUEST_METHOD").unwrap_or_else(|| "GET".to_owned()));
        let params = match method {
            Method::Get => query_params(&env, limits)?,
            Method::Post => {
                let mut params = query_params(&env, limits)?;
                params.extend(body_params(&env, body, limits, params.len())?);
                params
            }
            Method::Head | Method::Other(_) => Params::new(),
        };
        let script_name = env.text("SCRIPT_NAME").unwrap_or_default();
        let url = server_url(&env, &script_name);
        let mut names = vec![arrival_url(&env, &script_name), own_url(&env, &script_name)];
        names.dedup();
        Ok(Request {
            names,
            server_url: url,
            method,
            params,
            path_info: env.get("PATH_INFO").unwrap_or_default().to_vec(),
            script_name,
            remote_user: env.text("REMOTE_USER").filter(|u| !u.is_empty()),
            last_event_id: env.get("HTTP_LAST_EVENT_ID").map(<[u8]>::to_vec),
            session_cookie: env.get("HTTP_COOKIE").and_then(|c| cookie(c, kn_journal::access::SESSION_COOKIE.as_bytes())),
            user_agent: env.get("HTTP_USER_AGENT").map(<[u8]>::to_vec),
            authorization: env.get("HTTP_AUTHORIZATION").filter(|v| crate::bearer::is_bearer(v)).map(<[u8]>::to_vec),
            cookies: env.get("HTTP_COOKIE").map(<[u8]>::to_vec),
            fetch_site: env.get("HTTP_SEC_FETCH_SITE").map(<[u8]>::to_vec),
            origin: env.get("HTTP_ORIGIN").map(<[u8]>::to_vec),
            accept: env.get("HTTP_ACCEPT").map(<[u8]>::to_vec),
        })
    }

    /// Reads the request of this CGI process: its environment and stdin.
    pub fn from_process(limits: &Limits) -> Result<Request, Error> {
        Request::from_cgi_env(std::env::vars_os().map(|(k, v)| (os_bytes(k), os_bytes(v))), std::io::stdin().lock(), limits)
    }

    /// Builds the request from a plain HTTP request, with exactly the
    /// semantics of the same request passed through a web server to
    /// [`Request::from_cgi_env`]: headers become `HTTP_*` variables, the
    /// path is percent-decoded into `PATH_INFO`.
    ///
    /// ```
    /// use kn_cgi::{HttpRequest, Limits, Request};
    ///
    /// let http = HttpRequest {
    ///     method: "GET".into(),
    ///     path_info: b"/who/%CE%BA/kn_journal".to_vec(),
    ///     query: b"kn_response_format=simple".to_vec(),
    ///     headers: vec![("Host".into(), b"example.org:8080".to_vec())],
    ///     script_name: "/kn".into(),
    ///     server_name: "0.0.0.0".into(),
    ///     server_port: 8080,
    ///     ..HttpRequest::default()
    /// };
    /// let request = Request::from_http(http, &Limits::default()).unwrap();
    /// assert_eq!(request.path_info(), "/who/κ/kn_journal".as_bytes());
    /// assert_eq!(request.server_url(), "http://example.org:8080/kn");
    /// ```
    pub fn from_http(http: HttpRequest, limits: &Limits) -> Result<Request, Error> {
        // Moved into the variables, not copied (a later one of the same
        // name wins, as in `from_cgi_env`).
        let mut vars: HashMap<Vec<u8>, Vec<u8>> = HashMap::with_capacity(10 + http.headers.len());
        vars.insert(b"REQUEST_METHOD".to_vec(), http.method.into_bytes());
        vars.insert(b"QUERY_STRING".to_vec(), http.query);
        vars.insert(b"SCRIPT_NAME".to_vec(), http.script_name.into_bytes());
        vars.insert(b"SERVER_NAME".to_vec(), http.server_name.into_bytes());
        vars.insert(b"SERVER_PORT".to_vec(), http.server_port.to_string().into_bytes());
        vars.insert(b"CONTENT_LENGTH".to_vec(), http.body.len().to_string().into_bytes());
        if !http.path_info.is_empty() {
            vars.insert(b"PATH_INFO".to_vec(), form::decode_path(&http.path_info)?);
        }
        if http.https {
            vars.insert(b"HTTPS".to_vec(), b"on".to_vec());
        }
        if let Some(user) = http.remote_user {
            vars.insert(b"REMOTE_USER".to_vec(), user.into_bytes());
        }
        // Only the headers `from_env` reads: the others would be turned
        // into variables no one looks at, a few allocations each.
        for (name, value) in http.headers {
            if let Some(variable) = read_header(&name) {
                vars.insert(variable.as_bytes().to_vec(), value);
            }
        }
        Request::from_env(Env(vars), http.body.as_slice(), limits)
    }

    /// The HTTP method.
    pub fn method(&self) -> &Method {
        &self.method
    }

    /// Every parameter, in order (query string first, then body).
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// The first value of parameter `name`.
    pub fn param(&self, name: impl AsRef<[u8]>) -> Option<&[u8]> {
        self.params.get(name)
    }

    /// Every value of parameter `name`, in order.
    pub fn params_all<'a>(&'a self, name: impl AsRef<[u8]> + 'a) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.params.get_all(name)
    }

    /// True when the request carries no parameter at all (then, without
    /// `do_method`, it is a request for `help`).
    pub fn has_params(&self) -> bool {
        !self.params.is_empty()
    }

    /// The path after the script, decoded (`PATH_INFO`): the default topic.
    /// Empty when there is none.
    pub fn path_info(&self) -> &[u8] {
        &self.path_info
    }

    /// The script's own path (`SCRIPT_NAME`), e.g. `/kn`.
    pub fn script_name(&self) -> &str {
        &self.script_name
    }

    /// The absolute URL of the script, e.g. `http://127.0.0.1:8080/kn`.
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// Every URL this request reached the server by: the host of its
    /// `Host` with the port it arrived on (`SERVER_PORT`), and the web
    /// server's own name and port (`SERVER_NAME`). The store takes them
    /// for its names ([`kn_journal::Store::learn_names`]); the port of a
    /// `Host` is the client's to write, the port it arrived on is not.
    ///
    /// ```
    /// use kn_cgi::{Limits, Request};
    /// let vars = [("HTTP_HOST", "127.0.0.1"), ("SERVER_NAME", "pubsub.example"), ("SERVER_PORT", "8095"), ("SCRIPT_NAME", "/kn")];
    /// let request = Request::from_cgi_env(vars, &b""[..], &Limits::default()).unwrap();
    /// assert_eq!(request.names(), ["http://127.0.0.1:8095/kn", "http://pubsub.example:8095/kn"]);
    /// assert_eq!(request.server_url(), "http://127.0.0.1/kn");
    /// ```
    pub fn names(&self) -> Vec<&str> {
        self.names.iter().map(String::as_str).collect()
    }

    /// The user the web server authenticated (`REMOTE_USER`), if any.
    pub fn remote_user(&self) -> Option<&str> {
        self.remote_user.as_deref()
    }

    /// Who makes the request, for the access rules: [`Request::remote_user`],
    /// else anonymous.
    pub fn principal(&self) -> kn_journal::access::Principal {
        match &self.remote_user {
            Some(name) => kn_journal::access::Principal::user(name),
            None => kn_journal::access::Principal::anonymous(),
        }
    }

    /// The `Last-Event-ID` header of an `EventSource` reconnect.
    pub fn last_event_id(&self) -> Option<&[u8]> {
        self.last_event_id.as_deref()
    }

    /// The `kn_session` cookie's value, as sent (not yet verified).
    pub fn session_cookie(&self) -> Option<&[u8]> {
        self.session_cookie.as_deref()
    }

    /// The bearer token the request brings (crate::bearer::presented):
    /// `Authorization: Bearer`, else the `kn_token` parameter, else the
    /// cookie `cookie_name` (empty: none). Not yet verified.
    pub fn bearer_token(&self, cookie_name: &str) -> Option<Vec<u8>> {
        let cookie = match (&self.cookies, cookie_name.is_empty()) {
            (Some(header), false) => cookie(header, cookie_name.as_bytes()),
            _ => None,
        };
        crate::bearer::presented(self.authorization.as_deref(), self.param(crate::bearer::TOKEN_PARAM), cookie.as_deref()).map(<[u8]>::to_vec)
    }

    /// True when the request's bearer token ([`Request::bearer_token`]) is
    /// the cookie's: neither the header nor the parameter brings one.
    pub fn bearer_in_cookie(&self, cookie_name: &str) -> bool {
        self.authorization.is_none() && self.param(crate::bearer::TOKEN_PARAM).is_none() && self.bearer_token(cookie_name).is_some()
    }

    /// Where the request comes from, as its browser says (`Sec-Fetch-Site`,
    /// else `Origin` against the server's own host and port): a cookie
    /// credential changes nothing unless it is [`Site::Own`]
    /// (docs/ACCESS.md, "Cookies and other sites").
    ///
    /// [`Site::Own`]: kn_journal::access::Site::Own
    pub fn site(&self) -> kn_journal::access::Site {
        let url = self.server_url.strip_suffix(self.script_name.as_str()).unwrap_or(&self.server_url);
        let authority = url.split_once("://").map_or(url, |(_, authority)| authority);
        kn_journal::access::Site::of(self.fetch_site.as_deref(), self.origin.as_deref(), authority)
    }

    /// The `User-Agent` header (`HTTP_USER_AGENT`), if sent: whether a
    /// tunnel is padded for a browser ([`kn_wire::Format::tunnel_padding`]).
    pub fn user_agent(&self) -> Option<&[u8]> {
        self.user_agent.as_deref()
    }

    /// Whether the client takes an HTML page: it sent no `Accept` header
    /// (as the clients of 2003 did, and as RFC 9110 reads it: anything),
    /// or one that names `text/html` or `application/xhtml+xml`, as a
    /// browser's does. `curl` (`Accept: */*`) and other programs get
    /// plain text where a page has a plain form (`do_method=help`).
    pub fn accepts_html(&self) -> bool {
        let Some(accept) = &self.accept else { return true };
        let accept = String::from_utf8_lossy(accept).to_ascii_lowercase();
        accept.split(',').any(|range| {
            let mut parts = range.split(';');
            let html = matches!(parts.next().unwrap_or("").trim(), "text/html" | "application/xhtml+xml");
            // `text/html;q=0`: anything but HTML.
            html && !parts.any(|p| p.trim().strip_prefix("q=").and_then(|q| q.trim().parse::<f32>().ok()) == Some(0.0))
        })
    }
}

/// The value of cookie `name` (empty: none) in a `Cookie` header.
pub(crate) fn cookie_value(header: &[u8], name: &str) -> Option<Vec<u8>> {
    if name.is_empty() {
        return None;
    }
    cookie(header, name.as_bytes())
}

/// The value of cookie `name` in a `Cookie` header (`a=1; b=2`; RFC 6265
/// 5.4), the first if it is there more than once.
fn cookie(header: &[u8], name: &[u8]) -> Option<Vec<u8>> {
    header.split(|&b| b == b';').find_map(|pair| {
        let pair = pair.trim_ascii();
        let (key, value) = pair.split_at(pair.iter().position(|&b| b == b'=')?);
        (key.trim_ascii() == name).then(|| value[1..].trim_ascii().to_vec())
    })
}

/// The absolute URL of the script of this CGI process, from its
/// environment alone (as [`Request::server_url`]): for answering a request
/// whose parameters or body could not be read.
pub fn process_server_url() -> String {
    let env = Env(std::env::vars_os().map(|(k, v)| (os_bytes(k), os_bytes(v))).collect());
    server_url(&env, &env.text("SCRIPT_NAME").unwrap_or_default())
}

/// The environment of one CGI request.
struct Env(HashMap<Vec<u8>, Vec<u8>>);

impl Env {
    fn get(&self, name: &str) -> Option<&[u8]> {
        self.0.get(name.as_bytes()).map(Vec::as_slice)
    }

    fn text(&self, name: &str) -> Option<String> {
        self.get(name).map(|v| String::from_utf8_lossy(v).into_owned())
    }
}

fn query_params(env: &Env, limits: &Limits) -> Result<Params, Error> {
    Params::parse_at_most(env.get("QUERY_STRING").unwrap_or_default(), limits.max_elements)
        .map_err(|e| form_error(e, limits, "in the query string"))
}

/// The body's parameters, with `already` parameters in the query string.
fn body_params(env: &Env, body: impl Read, limits: &Limits, already: usize) -> Result<Params, Error> {
    let length = content_length(env, limits)?;
    let mut bytes = Vec::with_capacity(usize::try_from(length).unwrap_or(0));
    body.take(length).read_to_end(&mut bytes).map_err(|e| Error::io("reading the request body", e))?;
    if (bytes.len() as u64) < length {
        return Err(Error::new(
            ErrorKind::BadRequest,
            format!("the request body ended after {} of its {length} bytes (CONTENT_LENGTH)", bytes.len()),
        ));
    }
    Params::parse_at_most(&bytes, limits.max_elements.saturating_sub(already)).map_err(|e| form_error(e, limits, "in the request body"))
}

fn form_error(err: kn_wire::Error, limits: &Limits, context: &str) -> Error {
    if err.kind() == kn_wire::ErrorKind::TooManyElements {
        let max = limits.max_elements;
        return Error::new(ErrorKind::Wire(err.kind()), format!("more than {max} form elements in the query string and body together (KN_MAX_FORM_ELEMENTS)"));
    }
    in_context(err.into(), context)
}

/// `CONTENT_LENGTH`, checked against the limit before anything is read.
fn content_length(env: &Env, limits: &Limits) -> Result<u64, Error> {
    let raw = env.get("CONTENT_LENGTH").unwrap_or_default();
    let text = std::str::from_utf8(raw).unwrap_or("").trim();
    if raw.is_empty() {
        return Ok(0);
    }
    let length: u64 = match text.parse() {
        Ok(n) if text.bytes().all(|b| b.is_ascii_digit()) => n,
        _ => {
            return Err(Error::new(
                ErrorKind::BadRequest,
                format!("bad CONTENT_LENGTH '{}': expected a byte count", kn_wire::show_bytes(raw, 40)),
            ))
        }
    };
    if length > limits.max_body {
        return Err(Error::new(
            ErrorKind::TooLarge,
            format!("the request body of {length} bytes is larger than the limit of {} bytes", limits.max_body),
        ));
    }
    Ok(length)
}

fn in_context(err: Error, context: &str) -> Error {
    Error::new(err.kind(), format!("{} ({context})", err.message()))
}

/// The absolute URL of the script: `http[s]://host[:port]<SCRIPT_NAME>`,
/// from `HTTP_HOST` when it is a plausible host, else from `SERVER_NAME`
/// and `SERVER_PORT` (an HTTP/1.0 request without `Host`). The default port
/// of the scheme is never written.
fn server_url(env: &Env, script_name: &str) -> String {
    let https = is_https(env);
    let (scheme, default_port) = if https { ("https", "443") } else { ("http", "80") };
    let authority = match env.get("HTTP_HOST").filter(|h| is_plausible_host(h)) {
        Some(host) => String::from_utf8_lossy(host).into_owned(),
        None => server_authority(env),
    };
    let authority = match authority.strip_suffix(default_port).and_then(|a| a.strip_suffix(':')) {
        Some(bare) if !bare.is_empty() => bare.to_owned(),
        _ => authority,
    };
    format!("{scheme}://{authority}{script_name}")
}

/// The absolute URL of the script by the host of the request's `Host` (else
/// `SERVER_NAME`) and the port it arrived on (`SERVER_PORT`).
fn arrival_url(env: &Env, script_name: &str) -> String {
    let (scheme, default_port) = if is_https(env) { ("https", "443") } else { ("http", "80") };
    let host = match env.get("HTTP_HOST").filter(|h| is_plausible_host(h)) {
        Some(host) => {
            let host = String::from_utf8_lossy(host).into_owned();
            // `[::1]:8080`, `[::1]`, `h:8080`, `h`.
            match host.rfind(':') {
                Some(i) if !host[i..].contains(']') && (host.starts_with('[') || host[..i].find(':').is_none()) => host[..i].to_owned(),
                _ => host,
            }
        }
        None => return own_url(env, script_name),
    };
    let port = env.text("SERVER_PORT").filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    match port {
        Some(port) if port != default_port => format!("{scheme}://{host}:{port}{script_name}"),
        _ => format!("{scheme}://{host}{script_name}"),
    }
}

/// The absolute URL of the script by the web server's own name and port
/// (`SERVER_NAME`, `SERVER_PORT`), whatever the `Host`.
fn own_url(env: &Env, script_name: &str) -> String {
    let (scheme, default_port) = if is_https(env) { ("https", "443") } else { ("http", "80") };
    let authority = server_authority(env);
    let authority = match authority.strip_suffix(default_port).and_then(|a| a.strip_suffix(':')) {
        Some(bare) if !bare.is_empty() => bare.to_owned(),
        _ => authority,
    };
    format!("{scheme}://{authority}{script_name}")
}

fn is_https(env: &Env) -> bool {
    let on = |v: &[u8]| !v.is_empty() && !v.eq_ignore_ascii_case(b"off") && v != b"0";
    env.get("HTTPS").is_some_and(on) || env.get("REQUEST_SCHEME").is_some_and(|s| s.eq_ignore_ascii_case(b"https"))
}

/// `SERVER_NAME[:SERVER_PORT]`, bracketing a bare IPv6 address.
fn server_authority(env: &Env) -> String {
    let name = env.text("SERVER_NAME").filter(|n| is_plausible_host(n.as_bytes())).unwrap_or_else(|| "localhost".to_owned());
    let name = if name.contains(':') && !name.starts_with('[') { format!("[{name}]") } else { name };
    match env.text("SERVER_PORT") {
        Some(port) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => format!("{name}:{port}"),
        _ => name,
    }
}

/// A `Host` is client-supplied: accept only what a host name, an IP
/// literal and a port are made of, so it cannot smuggle a path or a quote
/// into the server URL.
fn is_plausible_host(host: &[u8]) -> bool {
    !host.is_empty()
        && host.len() <= 255
        && host.iter().all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b':' | b'[' | b']'))
}

/// The variables of request headers [`Request::from_env`] reads.
const READ_HEADERS: [&str; 8] = [
    "HTTP_HOST",
    "HTTP_LAST_EVENT_ID",
    "HTTP_COOKIE",
    "HTTP_USER_AGENT",
    "HTTP_AUTHORIZATION",
    "HTTP_SEC_FETCH_SITE",
    "HTTP_ORIGIN",
    "HTTP_ACCEPT",
];

/// The CGI variable of header `name` (`HTTP_` and the name in upper case,
/// `-` as `_`) when [`Request::from_env`] reads it ([`READ_HEADERS`]),
/// without allocating.
fn read_header(name: &str) -> Option<&'static str> {
    let same = |variable: &str| {
        let tail = &variable.as_bytes()["HTTP_".len()..];
        tail.len() == name.len() && tail.iter().zip(name.bytes()).all(|(&v, n)| v == if n == b'-' { b'_' } else { n.to_ascii_uppercase() })
    };
    READ_HEADERS.into_iter().find(|variable| same(variable))
}

/// The CGI variable of header `name`, as a web server makes it:
/// `Content-Type` → `CONTENT_TYPE`, `X-Foo` → `HTTP_X_FOO` (RFC 3875
/// 4.1.18). The oracle of [`read_header`].
#[cfg(test)]
fn header_variable(name: &str) -> String {
    let upper = name.to_ascii_uppercase().replace('-', "_");
    match upper.as_str() {
        "CONTENT_TYPE" => upper,
        _ => format!("HTTP_{upper}"),
    }
}

#[cfg(unix)]
fn os_bytes(s: std::ffi::OsString) -> Vec<u8> {
    std::os::unix::ffi::OsStringExt::into_vec(s)
}

#[cfg(not(unix))]
fn os_bytes(s: std::ffi::OsString) -> Vec<u8> {
    s.to_string_lossy().into_owned().into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_headers_read_become_variables_whatever_their_case() {
        let names = [
            "Host", "HOST", "host", "Last-Event-ID", "last-event-id", "Last_Event_Id", "LAST-EVENT-ID", "Content-Type", "X-Host", "Hos", "Hostx", "Last-Event-IDs",
            "Last-Event-I", "", "Authorization", "Höst",
        ];
        for name in names {
            let variable = header_variable(name);
            let expected = READ_HEADERS.into_iter().find(|v| *v == variable);
            assert_eq!(read_header(name), expected, "{name:?} is {variable}");
        }
        let http = HttpRequest {
            method: "GET".into(),
            query: b"kn_response_format=simple".to_vec(),
            headers: vec![("HOST".into(), b"example.org:81".to_vec()), ("last-event-id".into(), b"7".to_vec()), ("X-Other".into(), b"x".to_vec())],
            script_name: "/kn".into(),
            server_name: "127.0.0.1".into(),
            server_port: 8080,
            ..HttpRequest::default()
        };
        let request = Request::from_http(http, &Limits::default()).unwrap();
        assert_eq!(request.server_url(), "http://example.org:81/kn");
        assert_eq!(request.last_event_id(), Some(&b"7"[..]));
    }
}
