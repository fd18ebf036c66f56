//! Responses: one-shot replies built in memory and written with a single
//! `write`, and streaming tunnels flushed after every piece.
//!
//! A one-shot reply carries a `Content-Length`, so the web server can keep
//! the connection alive, and goes out in one write, so no second packet
//! waits on a delayed ACK (the lesson of the Apache 1.1 flush fix: 60 ms →
//! 29 ms per request).
//!
//! Every header of every response, of both front ends, is written
//! through this module's [`write_field`] (a CGI's header block) or
//! [`hyper_field`] (`serve`), and with it through one rule,
//! [`field_value`]: no header value or reason phrase ever carries a
//! control character. Each is replaced by a space (stripped, not refused:
//! the answer stays the one the request gets, a `401` keeps its
//! challenge, and no client can turn a refusal into a server error), so a
//! value with CR LF stays one line of text and can never end its header,
//! add another or start the body. A header whose name is not a token is
//! left out (names are this program's, never a request's).
//!
//! ```
//! use kn_cgi::response::field_value;
//! assert_eq!(field_value("x\r\nSet-Cookie: a=b"), "x  Set-Cookie: a=b");
//! assert_eq!(field_value("text/plain"), "text/plain");
//! ```

use std::borrow::Cow;
use std::io::{self, Write};

use hyper::header::{HeaderName, HeaderValue};

use kn_journal::{Event, STATUS};
use kn_wire::{Format, Page};

use crate::{Error, ErrorKind};

/// An HTTP status: code and reason phrase, as in `Status: 200 Notified`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// The three-digit code.
    pub code: u16,
    /// The reason phrase.
    pub reason: String,
}

impl Status {
    /// A status from its code and reason.
    pub fn new(code: u16, reason: impl Into<String>) -> Status {
        Status { code, reason: reason.into() }
    }

    /// Reads the `status` element of a status event (`NNN Reason`).
    pub fn of_event(event: &Event) -> Option<Status> {
        let text = String::from_utf8_lossy(event.get(STATUS)?).into_owned();
        let (code, reason) = text.split_once(' ').unwrap_or((&text, ""));
        let code: u16 = code.parse().ok().filter(|c| (100..=599).contains(c))?;
        Some(Status { code, reason: reason.to_string() })
    }
}

/// The header block of a response, without `Content-Length`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Head {
    /// The `Status:` line; `None` means 200 without a `Status:` header.
    pub status: Option<Status>,
    /// Other headers, in order, `Content-Type` included.
    pub headers: Vec<(String, String)>,
}

impl Head {
    /// A head with `status` and `Content-Type: content_type`.
    pub fn new(status: Option<Status>, content_type: &str) -> Head {
        Head { status, headers: vec![("Content-Type".to_string(), content_type.to_string())] }
    }

    /// Adds a header.
    pub fn with(mut self, name: &str, value: impl Into<String>) -> Head {
        self.headers.push((name.to_string(), value.into()));
        self
    }

    /// The status code (200 when no `Status:` is set).
    pub fn code(&self) -> u16 {
        self.status.as_ref().map(|s| s.code).unwrap_or(200)
    }

    /// The CGI header block with CRLF line ends and the blank line (every
    /// field through [`write_field`]).
    pub fn to_cgi_bytes(&self, content_length: Option<usize>) -> Vec<u8> {
        let mut out = Vec::with_capacity(128);
        if let Some(s) = &self.status {
            write_status(&mut out, s.code, &s.reason);
        }
        for (name, value) in &self.headers {
            write_field(&mut out, name, value);
        }
        if let Some(n) = content_length {
            write_field(&mut out, "Content-Length", &n.to_string());
        }
        out.extend_from_slice(b"\r\n");
        out
    }
}

/// `value` as it may be written in a header or a reason phrase: each
/// ASCII control character (0x00-0x1F, DEL; TAB too) replaced by a space.
/// Borrowed when there is none, which is every value this program makes
/// itself.
pub fn field_value(value: &str) -> Cow<'_, str> {
    if !value.bytes().any(|b| b.is_ascii_control()) {
        return Cow::Borrowed(value);
    }
    Cow::Owned(value.chars().map(|c| if c.is_ascii_control() { ' ' } else { c }).collect())
}

/// True when `name` may name a header: a token of RFC 9110 5.6.2.
pub fn is_field_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Appends the CGI header line `name: value` (CRLF), its value through
/// [`field_value`]; nothing when `name` is not a token.
pub fn write_field(out: &mut Vec<u8>, name: &str, value: &str) {
    if !is_field_name(name) {
        return;
    }
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(field_value(value).as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Appends a CGI's `Status: code reason` line, the reason through
/// [`field_value`].
pub fn write_status(out: &mut Vec<u8>, code: u16, reason: &str) {
    write_field(out, "Status", &format!("{code} {reason}"));
}

/// The header `name: value` as `serve` writes it (hyper), the value
/// through [`field_value`], so that it always converts; `None` when
/// `name` is not a token. An owned `value` without a control character
/// gives its buffer, uncopied.
pub fn hyper_field(name: &str, value: impl Into<Cow<'static, str>>) -> Option<(HeaderName, HeaderValue)> {
    if !is_field_name(name) {
        return None;
    }
    Some((HeaderName::from_bytes(name.as_bytes()).ok()?, hyper_value(value)))
}

/// A header value as `serve` writes it: [`hyper_field`]'s value.
pub fn hyper_value(value: impl Into<Cow<'static, str>>) -> HeaderValue {
    let value = match value.into() {
        // A literal of visible ASCII is taken as it is (`from_static`
        // would panic on anything else).
        Cow::Borrowed(v) if v.bytes().all(|b| (0x20..0x7f).contains(&b)) => Ok(HeaderValue::from_static(v)),
        Cow::Borrowed(v) => HeaderValue::from_bytes(field_value(v).as_bytes()),
        Cow::Owned(v) => match field_value(&v) {
            Cow::Borrowed(_) => HeaderValue::try_from(v),
            Cow::Owned(clean) => HeaderValue::try_from(clean),
        },
    };
    // Without a control character every byte is one hyper accepts.
    value.unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// A complete one-shot response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// Status and headers.
    pub head: Head,
    /// The body (empty for `HEAD` and `204`).
    pub body: Vec<u8>,
    /// Send the headers only (a `HEAD` request).
    pub head_only: bool,
    /// The `kn_status_to` reply: exactly `Status: 204 Content forwarded\n\n`.
    forwarded: bool,
}

impl Response {
    /// A response with `head` and `body`.
    pub fn new(head: Head, body: Vec<u8>) -> Response {
        Response { head, body, head_only: false, forwarded: false }
    }

    /// The events of a one-shot reply in `format`: the HTTP status comes
    /// from the first event's `status` element (PROTOCOL.md 3.5).
    pub fn events(format: Format, page: &Page, events: &[Event]) -> Result<Response, Error> {
        let Some((first, rest)) = events.split_first() else {
            return Err(Error::new(ErrorKind::Io, "a one-shot response needs a status event"));
        };
        let status = Status::of_event(first);
        let body = format.one_shot(page, first, rest);
        Ok(Response::new(Head::new(status, format.content_type()), body))
    }

    /// The reply to a request with `kn_status_to`: `204` with no body; the
    /// status events went to that topic instead.
    pub fn forwarded() -> Response {
        Response {
            head: Head { status: Some(Status::new(204, "Content forwarded")), headers: Vec::new() },
            body: Vec::new(),
            head_only: true,
            forwarded: true,
        }
    }

    /// `501 Not Implemented` for HTTP methods other than GET and POST
    /// (`head_only` for HEAD, which gets no body).
    pub fn not_implemented(head_only: bool) -> Response {
        let body = b"<!DOCTYPE html\n\tPUBLIC \"-//W3C//DTD XHTML 1.0 Transitional//EN\"\n\t \"http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd\">\n<html xmlns=\"http://www.w3.org/1999/xhtml\" lang=\"en-US\" xml:lang=\"en-US\">\n<head>\n<title>501 Not Implemented</title>\n<meta http-equiv=\"Content-Type\" content=\"text/html; charset=iso-8859-1\" />\n</head>\n<body>\n<h1>501 Not Implemented</h1><p>The method you requested is unimplemented for this URI.</p>\n</body>\n</html>".to_vec();
        let head = Head::new(Some(Status::new(501, "Not Implemented")), "text/html; charset=utf-8");
        Response { head, body, head_only, forwarded: false }
    }

    /// The status code.
    pub fn code(&self) -> u16 {
        self.head.code()
    }

    /// The whole CGI output, header block and body, as one buffer for one
    /// `write`.
    pub fn to_cgi_bytes(&self) -> Vec<u8> {
        if self.forwarded {
            // The original printed this with bare LFs; old clients and every
            // web server accept it.
            return b"Status: 204 Content forwarded\n\n".to_vec();
        }
        let length = if self.head_only { None } else { Some(self.body.len()) };
        let mut out = self.head.to_cgi_bytes(length);
        if !self.head_only {
            out.extend_from_slice(&self.body);
        }
        out
    }

    /// Writes the response with a single `write_all` and a flush.
    pub fn write_to(&self, out: &mut impl Write) -> io::Result<()> {
        out.write_all(&self.to_cgi_bytes())?;
        out.flush()
    }
}

/// A streaming response (a tunnel): the header block, then each piece
/// written and flushed at once, so every event reaches the client without
/// waiting for more. A failed write means the client is gone.
#[derive(Debug)]
pub struct TunnelWriter<W: Write> {
    out: W,
}

impl<W: Write> TunnelWriter<W> {
    /// Writes `head` (no `Content-Length`: the length is unknown) and
    /// `first` (the prologue and status event) in one write, and flushes.
    pub fn start(mut out: W, head: &Head, first: &[u8]) -> io::Result<TunnelWriter<W>> {
        let mut bytes = head.to_cgi_bytes(None);
        bytes.extend_from_slice(first);
        out.write_all(&bytes)?;
        out.flush()?;
        Ok(TunnelWriter { out })
    }

    /// Writes one piece (events, padding or a keep-alive) and flushes.
    pub fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        self.out.write_all(bytes)?;
        self.out.flush()
    }

    /// The underlying writer.
    pub fn into_inner(self) -> W {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kn_wire::status_event;

    #[test]
    fn one_shot_is_one_buffer_with_content_length() {
        let status = status_event(200, "Notified", "x", None);
        let r = Response::events(Format::Simple, &Page::new("http://h/kn"), &[status]).unwrap();
        let bytes = r.to_cgi_bytes();
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.starts_with("Status: 200 Notified\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: "));
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.ends_with(&format!("Content-Length: {}", body.len())));
    }

    #[test]
    fn forwarded_is_the_original_bare_lf_204() {
        assert_eq!(Response::forwarded().to_cgi_bytes(), b"Status: 204 Content forwarded\n\n");
    }

    #[test]
    fn head_gets_headers_only() {
        let bytes = Response::not_implemented(true).to_cgi_bytes();
        assert_eq!(bytes, b"Status: 501 Not Implemented\r\nContent-Type: text/html; charset=utf-8\r\n\r\n");
    }

    /// The header lines of a CGI head, checked: it ends at its first
    /// blank line, no line holds a control character, every line is
    /// `Name: value` with a token for a name.
    fn lines_of(head: &[u8]) -> Vec<String> {
        let end = head.windows(4).position(|w| w == b"\r\n\r\n").expect("a blank line ends the head");
        assert_eq!(end + 4, head.len(), "the head ends at its first blank line: {:?}", String::from_utf8_lossy(head));
        let text = std::str::from_utf8(&head[..end]).expect("UTF-8");
        let lines: Vec<String> = text.split("\r\n").map(str::to_owned).collect();
        for line in &lines {
            assert!(!line.chars().any(|c| c.is_ascii_control()), "a control character in {line:?}");
            let (name, _) = line.split_once(": ").unwrap_or_else(|| panic!("not a header line: {line:?}"));
            assert!(!name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)), "{line:?}");
        }
        lines
    }

    const SPLIT: &str = "x\r\nSet-Cookie: a=b\r\nContent-Type: text/html\r\n\r\n<script>alert(1)</script>";

    #[test]
    fn no_header_value_or_reason_phrase_can_carry_a_control_character() {
        let head = Head::new(Some(Status::new(401, format!("Unauthorized{SPLIT}"))), "text/plain")
            .with("WWW-Authenticate", SPLIT)
            .with("X-Odd", "a\0b\x7fc\td\ne\rf")
            .with("Bad\r\nName", "v")
            .with("", "v")
            .with("Set-Cookie: a", "b");
        for bytes in [head.to_cgi_bytes(Some(0)), Response::new(head.clone(), b"body".to_vec()).to_cgi_bytes()] {
            let end = bytes.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
            let lines = lines_of(&bytes[..end]);
            assert_eq!(lines.len(), 5, "Status, Content-Type, WWW-Authenticate, X-Odd, Content-Length: {lines:?}");
            assert!(lines[0].starts_with("Status: 401 Unauthorizedx  Set-Cookie"), "{lines:?}");
            assert!(lines[2].starts_with("WWW-Authenticate: x  Set-Cookie: a=b  Content-Type: text/html    <script>"), "{lines:?}");
            assert_eq!(lines[3], "X-Odd: a b c d e f");
            assert!(!lines.iter().any(|l| l.starts_with("Set-Cookie")), "{lines:?}");
        }
        let mut out = Vec::new();
        TunnelWriter::start(&mut out, &head, b"first").unwrap();
        let end = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        assert_eq!(lines_of(&out[..end]).len(), 4);
        assert_eq!(&out[end..], b"first");
    }

    #[test]
    fn serve_writes_the_same_clean_values_and_drops_what_is_no_header_name() {
        for value in [SPLIT, "plain", "\u{3ba}\r\nx", "\0", "a\tb", ""] {
            for (_, written) in [hyper_field("WWW-Authenticate", value), hyper_field("WWW-Authenticate", value.to_owned())].map(Option::unwrap) {
                assert_eq!(written.as_bytes(), field_value(value).as_bytes(), "{value:?}");
                let mut cgi = Vec::new();
                write_field(&mut cgi, "WWW-Authenticate", value);
                assert_eq!(cgi, [b"WWW-Authenticate: ", written.as_bytes(), b"\r\n"].concat());
            }
        }
        for name in ["", "Bad Name", "A:b", "X\r\nY"] {
            assert!(hyper_field(name, "v").is_none(), "{name:?}");
            let mut cgi = Vec::new();
            write_field(&mut cgi, name, "v");
            assert!(cgi.is_empty(), "{name:?}");
        }
    }

    #[test]
    fn status_line_comes_from_the_first_event() {
        let e = status_event(403, "Unknown do_method", "Unknown do_method 'x'", None);
        assert_eq!(Status::of_event(&e), Some(Status::new(403, "Unknown do_method")));
    }
}
