//! The WebSocket transport's settings (docs/PROTOCOL.md, "WebSocket
//! (extension)"; DEPLOY.md's table): each a `KN_WS_*` environment
//! variable read once when `serve` starts, each with a test at its
//! boundary (crates/cgi/tests/websocket_limits.rs).

use std::time::Duration;

use crate::{Error, ErrorKind};

/// How `serve` holds WebSockets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WsConfig {
    /// The `Origin`s a browser's socket may come from
    /// (`KN_WS_ORIGINS`, comma-separated, `*` for any). Empty (the
    /// default): only the origin whose host is the request's `Host`. A
    /// request without `Origin` (not a browser) is never refused for it.
    pub(crate) origins: Vec<String>,
    /// The largest frame a client may send (`KN_WS_MAX_FRAME`, bytes of
    /// payload; default 4 MiB): a larger one closes the socket `1009`.
    pub(crate) max_frame: usize,
    /// The largest message a client may send, its fragments together
    /// (`KN_WS_MAX_MESSAGE`; default 4 MiB, above the request body
    /// limit of the default largest event): a larger one closes the
    /// socket `1009`.
    pub(crate) max_message: usize,
    /// The most bytes waiting for a slow reader (`KN_WS_SEND_QUEUE`;
    /// default 8 MiB): an event that finds more than this still waiting
    /// closes the socket (`4429`),
    /// whose client resumes from its checkpoint on reconnecting.
    pub(crate) send_queue: usize,
    /// How long a socket may be silent before the server pings it
    /// (`KN_WS_PING_MS`; default 30 s).
    pub(crate) ping_every: Duration,
    /// How long a ping may wait for its pong (`KN_WS_PONG_TIMEOUT_MS`;
    /// default 10 s): past it the socket is closed `4408`.
    pub(crate) pong_timeout: Duration,
}

impl Default for WsConfig {
    fn default() -> WsConfig {
        WsConfig {
            origins: Vec::new(),
            max_frame: 4 << 20,
            max_message: 4 << 20,
            send_queue: 8 << 20,
            ping_every: Duration::from_secs(30),
            pong_timeout: Duration::from_secs(10),
        }
    }
}

impl WsConfig {
    /// The defaults with the `KN_WS_*` variables of the environment.
    ///
    /// Errors: a variable that is not a number (or a list), naming it.
    pub(crate) fn from_env() -> Result<WsConfig, Error> {
        WsConfig::from_vars(|name| std::env::var(name).ok())
    }

    /// [`WsConfig::from_env`] with the variables looked up by `var`.
    pub(crate) fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<WsConfig, Error> {
        let mut c = WsConfig::default();
        if let Some(list) = var("KN_WS_ORIGINS") {
            c.origins = list.split(',').map(|o| o.trim().trim_end_matches('/').to_ascii_lowercase()).filter(|o| !o.is_empty()).collect();
        }
        let number = |name: &str| -> Result<Option<u64>, Error> {
            match var(name) {
                None => Ok(None),
                Some(v) => v.trim().parse::<u64>().map(Some).map_err(|_| {
                    Error::new(ErrorKind::BadRequest, format!("bad value '{v}' for environment variable {name}: expected a whole number"))
                }),
            }
        };
        let size = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        if let Some(v) = number("KN_WS_MAX_FRAME")? {
            c.max_frame = size(v);
        }
        if let Some(v) = number("KN_WS_MAX_MESSAGE")? {
            c.max_message = size(v);
        }
        if let Some(v) = number("KN_WS_SEND_QUEUE")? {
            c.send_queue = size(v);
        }
        if let Some(v) = number("KN_WS_PING_MS")? {
            c.ping_every = Duration::from_millis(v.max(1));
        }
        if let Some(v) = number("KN_WS_PONG_TIMEOUT_MS")? {
            c.pong_timeout = Duration::from_millis(v.max(1));
        }
        Ok(c)
    }

    /// Whether a socket from `origin` (the `Origin` header) may open on a
    /// request to `host` (its `Host` header): no `Origin` (not a
    /// browser), a listed one, `*`, or by default the same host.
    pub(crate) fn origin_allowed(&self, origin: Option<&[u8]>, host: Option<&[u8]>) -> bool {
        let Some(origin) = origin else { return true };
        let origin = String::from_utf8_lossy(origin).trim().trim_end_matches('/').to_ascii_lowercase();
        if !self.origins.is_empty() {
            return self.origins.iter().any(|o| o == "*" || *o == origin);
        }
        // Same origin: its host[:port] is the request's Host.
        let Some(host) = host else { return false };
        let host = String::from_utf8_lossy(host).trim().to_ascii_lowercase();
        let authority = origin.split_once("://").map_or("", |(_, rest)| rest);
        !host.is_empty() && authority == host
    }

    /// The library's settings for a socket: no read buffer of its own
    /// (the library's would be allocated for every socket, idle or not:
    /// it reads instead in steps of a frame header's size from
    /// crate::websocket's `read_ahead.rs`, which holds what it read from
    /// the connection only until the library has taken it; the library
    /// still keeps the room of the largest message it gathered), eager
    /// writes of its own few frames
    /// (pongs, the close: the server's events are written by
    /// crate::serve::websocket::socket, which bounds them), the caps.
    pub(crate) fn socket(&self) -> tokio_tungstenite::tungstenite::protocol::WebSocketConfig {
        tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
            .read_buffer_size(0)
            .write_buffer_size(0)
            .max_write_buffer_size(self.send_queue)
            .max_frame_size(Some(self.max_frame))
            .max_message_size(Some(self.max_message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Result<WsConfig, Error> {
        let vars: Vec<(String, String)> = vars.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
        WsConfig::from_vars(move |name| vars.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone()))
    }

    #[test]
    fn every_setting_is_read_and_a_bad_one_is_named() {
        let c = with(&[
            ("KN_WS_MAX_FRAME", "10"),
            ("KN_WS_MAX_MESSAGE", "20"),
            ("KN_WS_SEND_QUEUE", "30"),
            ("KN_WS_PING_MS", "40"),
            ("KN_WS_PONG_TIMEOUT_MS", "50"),
            ("KN_WS_ORIGINS", "https://a.example, http://B.example:8080/"),
        ])
        .unwrap();
        assert_eq!((c.max_frame, c.max_message, c.send_queue), (10, 20, 30));
        assert_eq!((c.ping_every, c.pong_timeout), (Duration::from_millis(40), Duration::from_millis(50)));
        assert_eq!(c.origins, ["https://a.example", "http://b.example:8080"]);
        let err = with(&[("KN_WS_SEND_QUEUE", "lots")]).unwrap_err();
        assert!(err.message().contains("KN_WS_SEND_QUEUE"), "{}", err.message());
        assert_eq!(with(&[]).unwrap(), WsConfig::default());
    }

    #[test]
    fn origins_default_to_the_same_host_and_a_list_replaces_that() {
        let same = WsConfig::default();
        assert!(same.origin_allowed(None, Some(b"h:1")), "not a browser");
        assert!(same.origin_allowed(Some(b"http://h:1"), Some(b"h:1")));
        assert!(!same.origin_allowed(Some(b"http://evil.example"), Some(b"h:1")));
        assert!(!same.origin_allowed(Some(b"http://h:1"), None));
        assert!(!same.origin_allowed(Some(b"null"), Some(b"h:1")));
        let listed = with(&[("KN_WS_ORIGINS", "http://app.example")]).unwrap();
        assert!(listed.origin_allowed(Some(b"http://app.example"), Some(b"h:1")));
        assert!(!listed.origin_allowed(Some(b"http://h:1"), Some(b"h:1")), "the list replaces the same-host default");
        let any = with(&[("KN_WS_ORIGINS", "*")]).unwrap();
        assert!(any.origin_allowed(Some(b"http://evil.example"), Some(b"h:1")));
    }
}
