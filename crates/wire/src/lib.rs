//! kn-wire: the bytes of the PubSub wire protocol, byte-compatible with
//! the clients of the 2003 mod_pubsub server: how parameters are encoded
//! and how events are written in each response format, and read back.
//!
//! No I/O of its own and no server: pubsub.cgi and `pubsub-cgi serve`
//! (kn-cgi) write responses with it, and the sensors (kn-sensors) and the
//! fuzz targets read the `simple` format and encode forms with it, without
//! pulling in a web server. Events are kn-journal's [`Event`].
//!
//! * [`form`]: `application/x-www-form-urlencoded` parsing and encoding,
//!   byte-exact ([`Params`]), and which parameters are
//!   [`CONTROL_PARAMETERS`] rather than event elements.
//! * [`Format`]: the response formats `js`, `simple`, `flash` and `sse`,
//!   chosen by `kn_response_format`, with [`status_event`] and the
//!   [`Page`] a `js` response needs.
//! * [`simple`], [`js`], [`sse`]: the encoders of each format, and
//!   [`simple`]'s decoder (whole bodies, or frame by frame from a stream).
//!
//! Failures are one [`Error`] type whose [`ErrorKind`] says which
//! protocol status a server answers with.
//!
//! # Example
//!
//! A request's parameters become an event, which is written as a `simple`
//! frame and read back:
//!
//! ```
//! use kn_wire::{simple, Format, Params};
//!
//! let params = Params::parse(b"kn_to=/what/chat&kn_payload=hi&kn_response_format=simple").unwrap();
//! let format = Format::from_param(params.get("kn_response_format")).unwrap();
//! assert_eq!(format, Format::Simple);
//!
//! let event = params.elements();
//! let bytes = format.event(&event);
//! assert_eq!(bytes, b"3\n\nhi\n");
//! assert_eq!(simple::decode_frames(&bytes).unwrap(), [event]);
//! ```
//!
//! A status event in the `js` format, the page a browser's hidden frame
//! loads:
//!
//! ```
//! use kn_wire::{status_event, Format, Page};
//!
//! let status = status_event(200, "Notified", "", None);
//! let body = Format::Js.one_shot(&Page::new("http://127.0.0.1:8080/kn"), &status, &[]);
//! let text = String::from_utf8(body).unwrap();
//! assert!(text.contains("<title>200 Notified</title>"));
//! assert!(text.contains("parent.kn_sendCallback({elements:["));
//! assert!(text.ends_with("-->\n</body>\n</html>\n"));
//! ```
//!
//! # On the client side
//!
//! A client posts urlencoded forms and reads `simple` frames: the body of
//! a one-shot response, or a tunnel's stream read frame by frame as it
//! arrives (any [`std::io::Read`], e.g. a socket), with whitespace and
//! padding between frames skipped.
//!
//! ```
//! use kn_wire::{form, simple, simple::FrameReader, status_event, Event};
//!
//! let body = form::encode([("kn_to", "/what/chat"), ("kn_payload", "a&b"), ("kn_response_format", "simple")]);
//! assert_eq!(body, "kn_to=%2Fwhat%2Fchat&kn_payload=a%26b&kn_response_format=simple");
//!
//! // What a tunnel sends: its status event, then a frame per event, with
//! // keep-alive spaces between them.
//! let mut stream = simple::frame(&status_event(200, "Watching topic", "", None));
//! stream.extend_from_slice(b"   ");
//! stream.extend(simple::frame(&Event::from_pairs([("kn_payload", "abc")])));
//!
//! let mut tunnel = FrameReader::new(&stream[..]);
//! let status = tunnel.next_event()?.unwrap();
//! assert_eq!(status.get("status"), Some(&b"200 Watching topic"[..]));
//! assert_eq!(tunnel.next_event()?.unwrap().payload(), b"abc");
//! assert!(tunnel.next_event()?.is_none());
//! # Ok::<(), kn_wire::Error>(())
//! ```
//!
//! kn-wire is the protocol's bytes only: the rules (topics, routes,
//! duplicates, expiry) are kn-journal's, and the servers (pubsub.cgi and
//! `pubsub-cgi serve`) are knpubsub's kn-cgi.
#![deny(missing_docs)]

/// The examples of README.md, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

use std::fmt;

pub mod form;
mod format;
pub mod js;
pub mod simple;
pub mod sse;

pub use form::{is_control_parameter, Params, CONTROL_PARAMETERS};
pub use format::{status_event, Format, Page};
pub use kn_journal::Event;

/// What kind of failure an [`Error`] is; [`ErrorKind::status`] is the
/// protocol status a server answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Malformed urlencoded data: a bad `%` escape (400).
    BadForm,
    /// More form elements than a request may carry (413).
    TooManyElements,
    /// An unknown `kn_response_format` (403, always answered in `js`).
    UnsupportedFormat,
    /// A simple-format stream that could not be decoded.
    BadFrame,
    /// Reading a stream of frames failed.
    Io,
}

impl ErrorKind {
    /// The HTTP status code and the reason of the status event.
    ///
    /// ```
    /// use kn_wire::ErrorKind;
    /// assert_eq!(ErrorKind::UnsupportedFormat.status(), (403, "Unsupported kn_response_format value"));
    /// assert_eq!(ErrorKind::BadForm.status(), (400, "Bad form data"));
    /// ```
    pub fn status(self) -> (u16, &'static str) {
        match self {
            ErrorKind::BadForm => (400, "Bad form data"),
            ErrorKind::TooManyElements => (413, "Too many form elements"),
            ErrorKind::UnsupportedFormat => (403, "Unsupported kn_response_format value"),
            ErrorKind::BadFrame => (400, "Bad simple-format frame"),
            ErrorKind::Io => (500, "Internal Server Error"),
        }
    }
}

/// The one error type of this crate: a kind and a message that says what
/// went wrong and with which input.
///
/// ```
/// use kn_wire::{ErrorKind, Params};
///
/// let err = Params::parse(b"kn_payload=%zz").unwrap_err();
/// assert_eq!(err.kind(), ErrorKind::BadForm);
/// assert_eq!(err.to_string(), "bad form parameter 'kn_payload=%zz': malformed percent escape '%zz'");
/// ```
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    source: Option<std::io::Error>,
}

impl Error {
    /// An error of `kind` with a complete, human-readable message.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error { kind, message: message.into(), source: None }
    }

    /// An I/O failure while doing `what`.
    pub fn io(what: &str, err: std::io::Error) -> Error {
        Error { kind: ErrorKind::Io, message: format!("{what}: {err}"), source: Some(err) }
    }

    /// The kind, which decides the protocol status.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The human-readable message (also what `Display` prints).
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
        self.source.as_ref().map(|e| e as _)
    }
}

/// Shows bytes that came from outside in an error message: lossy UTF-8,
/// control characters escaped, at most `max` bytes of input (then `…`).
///
/// ```
/// assert_eq!(kn_wire::show_bytes(b"a\nb\xffcdef", 5), "a\\nb\u{fffd}c…");
/// ```
pub fn show_bytes(bytes: &[u8], max: usize) -> String {
    let cut = &bytes[..bytes.len().min(max)];
    let mut text = String::new();
    for c in String::from_utf8_lossy(cut).chars() {
        if c.is_control() {
            text.extend(c.escape_debug());
        } else {
            text.push(c);
        }
    }
    if cut.len() < bytes.len() {
        text.push('…');
    }
    text
}
