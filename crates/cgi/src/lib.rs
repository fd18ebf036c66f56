//! kn-cgi: the PubSub protocol over CGI (`pubsub.cgi`), byte-compatible with
//! the clients of the 2003 mod_pubsub server.
//!
//! This crate is the *protocol layer*: everything between the bytes a web
//! server hands a CGI program and the [`Event`]s the journal stores, with no
//! pubsub rule of its own (those live in `kn-journal`).
//!
//! The bytes of the protocol, the form codec and the response formats
//! ([`Params`], [`Format`], [`Page`], [`status_event`]), are kn-wire's;
//! this crate reads requests, runs them and writes the answers:
//!
//! * [`request`]: a CGI/1.1 request read from the environment and stdin, or
//!   built from a plain HTTP request ([`Request`]), with the server URL.
//! * [`response`]: one-shot CGI responses written with one `write`
//!   ([`Response`]) and streaming tunnels ([`TunnelWriter`]).
//! * [`handler`]: one request in, one reply out ([`Handler`]): what each
//!   `do_method` does, through kn-journal; `session.rs`: who an anonymous
//!   request is (its verified `kn_session` cookie) and `do_method=session`;
//!   `tunnel_end.rs`: how a tunnel the access rules refuse ends.
//! * [`cgi`]: running as a CGI program; [`serve`]: the built-in HTTP
//!   server (`pubsub-cgi serve`), with the pages of `www/` built in
//!   ([`pages`]), which stops as `shutdown.rs` says, and its `/metrics`
//!   ([`metrics_http`]) and opt-in access log ([`access_log`]); [`cli`]: its command line; [`auth`]: who a
//!   `serve` request is; [`bearer`]: bearer tokens (JWTs) under CGI and
//!   `serve` alike; [`streams`]: Durable Streams, judged by the
//!   access rules through [`stream_access`].
//!
//! Failures of any of these are one [`Error`] type whose [`ErrorKind`]
//! says which protocol status to answer with.
//!
//! # Example
//!
//! A notify answered in the `simple` format:
//!
//! ```
//! use std::collections::HashMap;
//! use kn_cgi::{status_event, Format, Limits, Page, Request, Response};
//!
//! let env = HashMap::from([
//!     ("REQUEST_METHOD", "POST"),
//!     ("CONTENT_LENGTH", "60"),
//!     ("SCRIPT_NAME", "/kn"),
//!     ("SERVER_NAME", "127.0.0.1"),
//!     ("SERVER_PORT", "8080"),
//! ]);
//! let body = &b"kn_to=%2Fwhat%2Fchat&kn_payload=hi&kn_response_format=simple"[..];
//! let request = Request::from_cgi_env(&env, body, &Limits::default()).unwrap();
//! assert_eq!(request.server_url(), "http://127.0.0.1:8080/kn");
//! assert_eq!(request.param("kn_to"), Some(&b"/what/chat"[..]));
//!
//! let format = Format::from_param(request.param("kn_response_format")).unwrap();
//! let status = status_event(200, "Notified", "", request.param("kn_status_from"));
//! let page = Page::new(request.server_url());
//! let response = Response::events(format, &page, &[status]).unwrap();
//! let bytes = response.to_cgi_bytes();
//! assert!(bytes.starts_with(b"Status: 200 Notified\r\nContent-Type: text/plain; charset=utf-8\r\n"));
//! ```
#![deny(missing_docs)]

use std::fmt;

pub mod access_log;
pub mod assets;
pub mod auth;
pub mod bearer;
pub mod body;
pub mod cgi;
pub mod cli;
pub mod handler;
pub mod metrics_http;
pub mod pages;
mod passwords;
mod pool;
pub mod request;
pub mod response;
pub mod selftest;
pub mod serve;
mod session;
mod shutdown;
mod serve_auth;
mod serve_body;
mod serve_gather;
mod serve_held;
mod serve_tunnel;
mod static_files;
pub mod stream_access;
pub mod streams;
mod tunnel_end;
mod tunnel_reply;
mod wake;

pub use kn_wire::{status_event, Format, Page, Params};
pub use kn_journal::fresh_id;
pub use kn_journal::Event;
pub use request::{HttpRequest, Limits, Method, Request};
pub use handler::{AfterReply, Handler, Options, Reply, TunnelReply};
pub use response::{Head, Response, Status, TunnelWriter};

/// What kind of failure an [`Error`] is; [`ErrorKind::status`] is the
/// protocol status a handler answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Bad protocol bytes: malformed form data (400), an unknown
    /// `kn_response_format` (403), with kn-wire's own kind.
    Wire(kn_wire::ErrorKind),
    /// A malformed CGI request, such as a bad `CONTENT_LENGTH` or a body
    /// shorter than announced (400).
    BadRequest,
    /// A body larger than [`Limits::max_body`] (413). The body was not read.
    TooLarge,
    /// A failure of the event store, with its own kind.
    Journal(kn_journal::ErrorKind),
    /// Reading the request or writing the response failed (500).
    Io,
}

impl ErrorKind {
    /// The HTTP status code and the reason of the status event.
    ///
    /// ```
    /// use kn_cgi::ErrorKind;
    /// let unsupported = ErrorKind::Wire(kn_wire::ErrorKind::UnsupportedFormat);
    /// assert_eq!(unsupported.status(), (403, "Unsupported kn_response_format value"));
    /// assert_eq!(ErrorKind::TooLarge.status().0, 413);
    /// ```
    pub fn status(self) -> (u16, &'static str) {
        match self {
            ErrorKind::Wire(kind) => kind.status(),
            ErrorKind::BadRequest => (400, "Bad request"),
            ErrorKind::TooLarge => (413, "Request too large"),
            ErrorKind::Journal(kind) => kind.status(),
            ErrorKind::Io => (500, "Internal Server Error"),
        }
    }
}

/// The one error type of this crate: a kind and a message that says what
/// went wrong and with which input.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Error {
    /// An error of `kind` with a complete, human-readable message.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error { kind, message: message.into(), source: None }
    }

    /// An I/O failure while doing `what`.
    pub fn io(what: &str, err: std::io::Error) -> Error {
        Error { kind: ErrorKind::Io, message: format!("{what}: {err}"), source: Some(Box::new(err)) }
    }

    /// The kind, which decides the protocol status.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The human-readable message (also what `Display` prints): the payload
    /// of the status event a handler answers with.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Shorthand for `self.kind().status()`.
    pub fn status(&self) -> (u16, &'static str) {
        self.kind.status()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_ref().map(|e| e.as_ref() as _)
    }
}

impl From<kn_journal::Error> for Error {
    fn from(err: kn_journal::Error) -> Error {
        Error { kind: ErrorKind::Journal(err.kind()), message: err.message().to_owned(), source: Some(Box::new(err)) }
    }
}

impl From<kn_wire::Error> for Error {
    fn from(err: kn_wire::Error) -> Error {
        Error { kind: ErrorKind::Wire(err.kind()), message: err.message().to_owned(), source: Some(Box::new(err)) }
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
