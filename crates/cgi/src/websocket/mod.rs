//! WebSocket on `serve` (RFC 6455; docs/PROTOCOL.md, "WebSocket
//! (extension)"): one more transport over the same store, reached as a
//! tunnel is. `GET /kn/<journal>?do_method=route&kn_response_format=websocket`
//! with an `Upgrade: websocket` (or the tunnel's own URL with the
//! `Upgrade` header alone) opens a socket that carries the journal's events
//! and status events to the client, one JSON object per text frame, and the
//! client's notifies, routes and route deletions to the server, each
//! answered on the socket.
//!
//! Nothing here decides a PubSub rule or a right: the socket's tunnel is
//! an `sse` tunnel made by the [`Handler`](crate::Handler) (the same
//! resume at `last_event_id`, `205` gap signal, receipts, per-delivery
//! access check and token expiry), and each request on the socket is a
//! form request made by the same handler, as the user the upgrade was
//! made by (crate::websocket::frames says what travels).
//!
//! How a socket is opened:
//!
//! 1. `serve`'s dispatch sends a request asking for a WebSocket here
//!    ([`asked`]); the handshake is checked (`426` if it is none), then
//!    the `Origin` against `KN_WS_ORIGINS` (`403`), then who asks (the
//!    gate, as for `/kn`), then the tunnel is opened by the handler, whose
//!    refusal (`401`, `403`, `404`...) is the handshake's answer;
//! 2. the open tunnel waits in the connection's [`Slot`] while hyper
//!    writes the `101 Switching Protocols`;
//! 3. hyper's connection then ends (an upgrade), and the connection's
//!    task follows the socket on the bare connection (`socket.rs`),
//!    `tokio-tungstenite` doing the framing.

mod budget;
mod close_code;
mod config;
mod frames;
mod read_ahead;
mod socket;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};

use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONNECTION, HOST, ORIGIN, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, SEC_WEBSOCKET_PROTOCOL, SEC_WEBSOCKET_VERSION, UPGRADE};
use hyper::StatusCode;
use kn_wire::form;
use tokio::sync::OwnedSemaphorePermit;

use super::{one_shot, Server, MOUNT};
use crate::body::{plain, plain_owned, Body};
use crate::handler::{Reply, TunnelReply};
use crate::request::{HttpRequest, Request};
use crate::serve_held::ConnIo;
use crate::Error;

pub(crate) use config::WsConfig;

/// The value of `kn_response_format` that asks for a WebSocket.
pub const FORMAT: &str = "websocket";

/// The subprotocol a client offers (`Sec-WebSocket-Protocol: kn`), which
/// the server then selects.
pub const PROTOCOL: &str = "kn";

/// A subprotocol offered beside [`PROTOCOL`] that carries a bearer token,
/// for a browser, which can set no `Authorization` header on a socket:
/// `kn.bearer.<token>`.
pub const BEARER_PROTOCOL_PREFIX: &str = "kn.bearer.";

/// A socket opened on a connection, waiting for hyper to write its `101`
/// and hand the connection back.
pub(crate) struct Pending {
    tunnel: Box<TunnelReply>,
    permit: OwnedSemaphorePermit,
    who: Who,
}

/// Where a connection's opened socket waits ([`Pending`]): one per
/// connection, put in each request's extensions by `serve`.
#[derive(Clone, Default)]
pub(crate) struct Slot(Arc<Mutex<Option<Pending>>>);

impl Slot {
    fn put(&self, pending: Pending) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(pending);
    }

    fn take(&self) -> Option<Pending> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// Who makes the requests a socket carries: the upgrade's user, its
/// bearer token (from the header, the subprotocol or the query), never
/// its cookies (a cookie proves only reads: a page of another site can
/// make a browser send them).
#[derive(Clone)]
struct Who {
    headers: Vec<(String, Vec<u8>)>,
    remote_user: Option<String>,
    local: SocketAddr,
    /// The client's address, for the gate's back-off when its login is
    /// checked again (crate::websocket::socket).
    peer: std::net::IpAddr,
}

impl Who {
    /// The form request `body` as this user would POST it to `/kn`.
    fn request(&self, body: Vec<u8>) -> HttpRequest {
        HttpRequest {
            method: "POST".to_owned(),
            path_info: Vec::new(),
            query: Vec::new(),
            headers: self.headers.clone(),
            remote_user: self.remote_user.clone(),
            body,
            script_name: MOUNT.to_owned(),
            server_name: self.local.ip().to_string(),
            server_port: self.local.port(),
            ..HttpRequest::default()
        }
    }
}

/// The headers of the upgrade that its socket's requests carry: who
/// makes them and by which URL (`Host`, `Forwarded`, `X-Forwarded-*`,
/// the trusted proxy's user header is already the user), never a cookie
/// (only reads may rest on one) nor what only the handshake needs.
fn kept_for_requests(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    name == AUTHORIZATION.as_str() || name == HOST.as_str() || name == "forwarded" || name.starts_with("x-forwarded-")
}

/// The settings, read from the environment once (a bad one refuses every
/// socket with `500`, naming it).
fn settings() -> &'static Result<WsConfig, String> {
    static SETTINGS: OnceLock<Result<WsConfig, String>> = OnceLock::new();
    SETTINGS.get_or_init(|| WsConfig::from_env().map_err(|e| e.message().to_owned()))
}

/// Whether `request` (to `/kn`) asks for a WebSocket: an `Upgrade:
/// websocket` header, or `kn_response_format=websocket`.
pub(crate) fn asked<B>(request: &hyper::Request<B>) -> bool {
    let upgrade = header_has(request.headers(), UPGRADE, "websocket");
    upgrade || query_format(request.uri().query().unwrap_or("").as_bytes()).is_some_and(|f| f == FORMAT.as_bytes())
}

/// The connection's socket, if its last request opened one: follows it
/// until it closes (crate::websocket::socket). `io` is the connection
/// hyper gave back after the `101`.
pub(crate) async fn follow(server: Arc<Server>, slot: &Slot, io: ConnIo) -> Result<(), ConnIo> {
    let Some(pending) = slot.take() else { return Err(io) };
    let config = match settings() {
        Ok(config) => config,
        Err(_) => return Ok(()),
    };
    // Boxed: every connection's task holds room for the largest thing it
    // may become, and a socket's state (1,952 bytes of it in a release
    // build, the library's inline) is larger than a tunnel's: inline, it
    // made every held SSE tunnel 3-3.5 KB dearer.
    Box::pin(socket::follow(server, pending, io, config)).await;
    Ok(())
}

fn query_format(query: &[u8]) -> Option<Vec<u8>> {
    let pairs = form::parse(query).ok()?;
    pairs.into_iter().find(|(n, _)| n == b"kn_response_format").map(|(_, v)| v)
}

/// Whether header `name` lists `token` (comma-separated, any case).
fn header_has(headers: &HeaderMap, name: hyper::header::HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// The subprotocols the client offers.
fn offered(headers: &HeaderMap) -> Vec<String> {
    headers.get_all(SEC_WEBSOCKET_PROTOCOL).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).map(|p| p.trim().to_owned()).collect()
}

/// The tunnel's query: the socket's URL with `kn_response_format=sse`
/// first (the first value of a name is the one read), so that the handler
/// opens the tunnel `sse` opens, `last_event_id` and all.
fn tunnel_query(query: &[u8]) -> Result<Vec<u8>, Error> {
    let pairs = form::parse(query)?;
    let mut out = b"kn_response_format=sse".to_vec();
    let rest = pairs.iter().filter(|(n, _)| n != b"kn_response_format");
    let rest = form::encode(rest.map(|(n, v)| (n.as_slice(), v.as_slice())));
    if !rest.is_empty() {
        out.push(b'&');
        out.extend_from_slice(rest.as_bytes());
    }
    Ok(out)
}

impl Server {
    /// A request asking for a WebSocket (module documentation): refused
    /// with an HTTP answer, or `101` with its tunnel waiting in the
    /// connection's [`Slot`].
    pub(super) async fn websocket(self: Arc<Self>, request: hyper::Request<Incoming>, peer: SocketAddr) -> hyper::Response<Body> {
        let config = match settings() {
            Ok(config) => config,
            Err(message) => return plain_owned(StatusCode::INTERNAL_SERVER_ERROR, format!("500 WebSocket settings: {message}\n")),
        };
        let (parts, _body) = request.into_parts();
        let query = parts.uri.query().unwrap_or("").as_bytes().to_vec();
        let h = &parts.headers;
        let key = h.get(SEC_WEBSOCKET_KEY).filter(|_| {
            parts.method == hyper::Method::GET
                && header_has(h, UPGRADE, "websocket")
                && header_has(h, CONNECTION, "upgrade")
                && h.get(SEC_WEBSOCKET_VERSION).is_some_and(|v| v.as_bytes() == b"13")
        });
        let Some(key) = key else {
            let mut reply = plain(StatusCode::UPGRADE_REQUIRED, "426 Upgrade Required: kn_response_format=websocket is a WebSocket (RFC 6455, version 13)\n");
            reply.headers_mut().insert(UPGRADE, HeaderValue::from_static("websocket"));
            reply.headers_mut().insert(hyper::header::SEC_WEBSOCKET_VERSION, HeaderValue::from_static("13"));
            return reply;
        };
        if !config.origin_allowed(h.get(ORIGIN).map(HeaderValue::as_bytes), h.get(HOST).map(HeaderValue::as_bytes)) {
            return plain(StatusCode::FORBIDDEN, "403 Forbidden: this Origin may not open a WebSocket here (KN_WS_ORIGINS)\n");
        }
        let Some(slot) = parts.extensions.get::<Slot>().cloned() else {
            return plain(StatusCode::INTERNAL_SERVER_ERROR, "500 no WebSocket on this connection (a bug: please report it)\n");
        };
        let offered = offered(h);
        let mut headers: Vec<(String, Vec<u8>)> = h.iter().map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec())).collect();
        let token = if h.contains_key(AUTHORIZATION) {
            None
        } else {
            offered.iter().find_map(|p| p.strip_prefix(BEARER_PROTOCOL_PREFIX)).map(str::to_owned).or_else(|| {
                form::parse(&query).ok()?.into_iter().find(|(n, _)| n == crate::bearer::TOKEN_PARAM.as_bytes()).map(|(_, v)| String::from_utf8_lossy(&v).into_owned())
            })
        };
        if let Some(token) = &token {
            headers.push((AUTHORIZATION.as_str().to_owned(), format!("Bearer {token}").into_bytes()));
        }
        let remote_user = match self.gate.identify(&headers, peer.ip()).await {
            Ok(user) => user,
            Err(refusal) => return self.refused(&query, &refusal),
        };
        let tunnel_query = match tunnel_query(&query) {
            Ok(q) => q,
            Err(err) => return self.failure(&query, &err),
        };
        let who = Who {
            headers: headers.iter().filter(|(n, _)| kept_for_requests(n)).cloned().collect(),
            remote_user: remote_user.clone(),
            local: self.local,
            peer: peer.ip(),
        };
        let http = HttpRequest {
            method: "GET".to_owned(),
            path_info: parts.uri.path().as_bytes()[MOUNT.len()..].to_vec(),
            query: tunnel_query,
            headers,
            remote_user,
            script_name: MOUNT.to_owned(),
            server_name: self.local.ip().to_string(),
            server_port: self.local.port(),
            ..HttpRequest::default()
        };
        let server = self.clone();
        let handled = self
            .pool
            .spawn_blocking(move || {
                let request = Request::from_http(http, &server.limits)?;
                Ok::<_, Error>(server.handler.handle_deferring(&request))
            })
            .await;
        let tunnel = match handled {
            Ok(Ok((Reply::Tunnel(tunnel), after))) => {
                if !after.is_empty() {
                    tokio::task::spawn_blocking(move || after.run());
                }
                tunnel
            }
            // Refused (the rules, a token, a bad topic): the handshake's answer.
            Ok(Ok((Reply::Done(response), after))) => {
                if !after.is_empty() {
                    tokio::task::spawn_blocking(move || after.run());
                }
                return one_shot(response, false);
            }
            Ok(Err(err)) => return self.failure(&query, &err),
            Err(_) => return plain(StatusCode::INTERNAL_SERVER_ERROR, "500 the WebSocket's tunnel could not be opened (a bug: please report it)\n"),
        };
        let permit = match self.tunnels.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                self.readers.handle().spawn_blocking(move || drop(tunnel));
                let limit = self.caps.1;
                return self.busy(&query, &format!("too many tunnels: this server holds at most {limit} at once"));
            }
        };
        slot.put(Pending { tunnel, permit, who });
        let mut reply = hyper::Response::new(Body::empty());
        *reply.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
        let headers = reply.headers_mut();
        headers.insert(UPGRADE, HeaderValue::from_static("websocket"));
        headers.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
        if let Ok(accept) = HeaderValue::try_from(accept) {
            headers.insert(SEC_WEBSOCKET_ACCEPT, accept);
        }
        if offered.iter().any(|p| p == PROTOCOL) {
            headers.insert(SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(PROTOCOL));
        }
        reply
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tunnel_query_is_the_sockets_with_the_sse_format_first() {
        let q = tunnel_query(b"do_method=route&kn_response_format=websocket&last_event_id=c9").unwrap();
        let params = kn_wire::Params::parse(&q).unwrap();
        assert_eq!(params.get("kn_response_format"), Some(&b"sse"[..]));
        assert_eq!(params.get_all("kn_response_format").count(), 1);
        assert_eq!(params.get("last_event_id"), Some(&b"c9"[..]));
        assert_eq!(tunnel_query(b"").unwrap(), b"kn_response_format=sse");
    }

    #[test]
    fn a_request_asks_for_a_socket_by_its_upgrade_or_its_format() {
        let with = |uri: &str, upgrade: Option<&str>| {
            let mut b = hyper::Request::get(uri);
            if let Some(u) = upgrade {
                b = b.header(UPGRADE, u);
            }
            b.body(()).unwrap()
        };
        let asks = |r: &hyper::Request<()>| {
            header_has(r.headers(), UPGRADE, "websocket") || query_format(r.uri().query().unwrap_or("").as_bytes()).is_some_and(|f| f == b"websocket")
        };
        assert!(asks(&with("/kn/who/a/kn_journal?do_method=route&kn_response_format=websocket", None)));
        assert!(asks(&with("/kn/who/a/kn_journal?do_method=route", Some("WebSocket"))));
        assert!(!asks(&with("/kn/who/a/kn_journal?do_method=route&kn_response_format=sse", None)));
        assert!(!asks(&with("/kn/who/a/kn_journal", Some("h2c"))));
    }
}
