//! The response formats of PROTOCOL.md 3.5 (`js`, `simple`, `flash`, and
//! our `sse`), byte-compatible with what old clients parse, and status
//! events.
//!
//! [`Format`] is what a handler uses; the submodules [`simple`], [`js`] and
//! [`sse`] hold the encoders themselves, with entry points that take
//! elements in a caller-chosen order (the original wrote Perl hash order;
//! no client depends on it, but it lets tests compare against recorded
//! bytes).

use kn_journal::{fresh_id, Event, KN_ID, KN_PAYLOAD, KN_ROUTE_LOCATION, STATUS};

use crate::{Error, ErrorKind};

/// A response format, chosen by `kn_response_format`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Format {
    /// `js` (the default): an HTML page of script blocks, for browsers.
    #[default]
    Js,
    /// `simple`: length-prefixed frames of `name: value` lines.
    Simple,
    /// `flash`: `simple` with a NUL byte after each event.
    Flash,
    /// `sse` (**Extension**): `text/event-stream` for `EventSource`.
    Sse,
}

/// Where a page is served from, and whether it is a tunnel: what the `js`
/// format needs besides the events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page {
    server_url: String,
    tunnel: bool,
}

impl Page {
    /// A one-shot page of the script at `server_url` (see
    /// [`Request::server_url`](crate::Request::server_url)).
    pub fn new(server_url: impl Into<String>) -> Page {
        Page { server_url: server_url.into(), tunnel: false }
    }

    /// The same page as a tunnel: its `<body>` calls
    /// `parent.kn_tunnelLoadCallback`.
    pub fn for_tunnel(mut self) -> Page {
        self.tunnel = true;
        self
    }

    /// The absolute URL of the script.
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// True for a tunnel page.
    pub fn is_tunnel(&self) -> bool {
        self.tunnel
    }
}

impl Format {
    /// Every format, by name.
    pub const ALL: [Format; 4] = [Format::Js, Format::Simple, Format::Flash, Format::Sse];

    /// The format a `kn_response_format` value asks for: absent or empty
    /// is `js`; an unknown name is an [`ErrorKind::UnsupportedFormat`]
    /// error, which a handler answers `403` in the `js` format.
    ///
    /// ```
    /// use kn_cgi::Format;
    /// assert_eq!(Format::from_param(None).unwrap(), Format::Js);
    /// assert_eq!(Format::from_param(Some(b"simple")).unwrap(), Format::Simple);
    /// let err = Format::from_param(Some(b"xml")).unwrap_err();
    /// assert_eq!(err.status(), (403, "Unsupported kn_response_format value"));
    /// ```
    pub fn from_param(value: Option<&[u8]>) -> Result<Format, Error> {
        let value = value.unwrap_or_default();
        if value.is_empty() {
            return Ok(Format::Js);
        }
        Format::ALL.into_iter().find(|f| f.name().as_bytes() == value).ok_or_else(|| {
            Error::new(
                ErrorKind::UnsupportedFormat,
                format!(
                    "This server supports the values \"js\", \"simple\", \"flash\" and \"sse\" for the \
                     kn_response_format parameter, not \"{}\".",
                    crate::show(value, 40)
                ),
            )
        })
    }

    /// The name clients send.
    pub fn name(self) -> &'static str {
        match self {
            Format::Js => "js",
            Format::Simple => "simple",
            Format::Flash => "flash",
            Format::Sse => "sse",
        }
    }

    /// The `Content-Type` of a response in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Js => "text/html; charset=utf-8",
            Format::Simple | Format::Flash => "text/plain; charset=utf-8",
            Format::Sse => "text/event-stream",
        }
    }

    /// What comes before the first event: for `js`, the HTML page head
    /// built from the response's first status event (see
    /// [`js::prologue`]); nothing for the other formats.
    pub fn prologue(self, page: &Page, status: &Event) -> Vec<u8> {
        match self {
            Format::Js => js::prologue(page, status.get(STATUS).unwrap_or_default(), status.payload()),
            Format::Simple | Format::Flash | Format::Sse => Vec::new(),
        }
    }

    /// Appends one event to `out`.
    pub fn write_event(self, out: &mut Vec<u8>, event: &Event) {
        match self {
            Format::Js => js::write_block(out, event_js_order(event)),
            Format::Simple => simple::write_frame(out, event),
            Format::Flash => {
                simple::write_frame(out, event);
                out.push(0);
            }
            Format::Sse => sse::write_event(out, event),
        }
    }

    /// One event, encoded.
    pub fn event(self, event: &Event) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_event(&mut out, event);
        out
    }

    /// What a tunnel writes after each burst of events so that browsers
    /// render at once: for `js`, 4096 spaces and a LF (inside an HTML
    /// comment); for `simple` and `flash`, 4096 spaces only, because a C
    /// client aborts on a newline between frames (PROTOCOL.md 3.8); nothing
    /// for `sse`, which `EventSource` dispatches on each blank line.
    pub fn padding(self) -> &'static [u8] {
        const SPACES: &[u8; 4097] = &{
            let mut s = [b' '; 4097];
            s[4096] = b'\n';
            s
        };
        match self {
            Format::Js => SPACES,
            Format::Simple | Format::Flash => &SPACES[..4096],
            Format::Sse => b"",
        }
    }

    /// What a tunnel writes when idle (at least every 30 s): one space, or
    /// for `sse` the comment line `: keep-alive`.
    pub fn keep_alive(self) -> &'static [u8] {
        match self {
            Format::Js | Format::Simple | Format::Flash => b" ",
            Format::Sse => sse::KEEP_ALIVE,
        }
    }

    /// What closes a response: `-->\n</body>\n</html>\n` for `js`, nothing
    /// otherwise.
    pub fn trailer(self) -> &'static [u8] {
        match self {
            Format::Js => js::TRAILER,
            Format::Simple | Format::Flash | Format::Sse => b"",
        }
    }

    /// The complete body of a one-shot response: the prologue from the
    /// first status event `first`, `first` and each of `rest`, the trailer.
    /// No padding.
    pub fn one_shot(self, page: &Page, first: &Event, rest: &[Event]) -> Vec<u8> {
        let mut out = self.prologue(page, first);
        for event in std::iter::once(first).chain(rest) {
            self.write_event(&mut out, event);
        }
        out.extend_from_slice(self.trailer());
        out
    }
}

/// The elements in the order the `js` format writes them: name order.
fn event_js_order(event: &Event) -> impl Iterator<Item = (&[u8], &[u8])> {
    event.elements()
}

/// A status event (PROTOCOL.md 3.5): `status` = `NNN Reason`, `kn_payload`
/// = `payload`, a fresh `kn_id`, and `kn_route_location` = the request's
/// `kn_status_from`, or empty.
///
/// ```
/// use kn_cgi::status_event;
///
/// let e = status_event(200, "Watching topic", "Watching for events in topic '/a'.", Some(b"tun1"));
/// assert_eq!(e.get("status"), Some(&b"200 Watching topic"[..]));
/// assert_eq!(e.get("kn_route_location"), Some(&b"tun1"[..]));
/// assert_eq!(e.len(), 4);
/// let other = status_event(200, "Watching topic", "", None);
/// assert_ne!(e.id(), other.id(), "every status event has its own kn_id");
/// assert_eq!(other.get("kn_route_location"), Some(&b""[..]));
/// ```
pub fn status_event(code: u16, reason: &str, payload: impl Into<Vec<u8>>, status_from: Option<&[u8]>) -> Event {
    let mut event = Event::new();
    event
        .set(STATUS, format!("{code} {reason}"))
        .set(KN_PAYLOAD, payload)
        .set(KN_ID, fresh_id())
        .set(KN_ROUTE_LOCATION, status_from.unwrap_or_default());
    event
}

/// The `simple` format: `<count>\n<encoded event>\n` frames, and a
/// tolerant decoder of them.
///
/// An encoded event is one `name: value\n` line per element except
/// `kn_payload`, a blank line, then the raw payload. In names and values
/// the bytes 0x00-0x1F, 0x7F-0x9F, `:` and `=`, and a space at the very
/// start or end, are written `=XX` (uppercase hex); everything else,
/// including bytes 0xA0-0xFF, is raw.
///
/// ```
/// use kn_cgi::format::simple;
/// use kn_cgi::Event;
///
/// let event = Event::from_pairs([("kn_payload", "hi\n"), ("a:b", " x=1 ")]);
/// let frame = simple::frame(&event);
/// assert_eq!(frame, b"23\na=3Ab: =20x=3D1=20\n\nhi\n\n");
/// assert_eq!(simple::decode_frames(&frame).unwrap(), [event]);
/// ```
pub mod simple {
    use std::io::{BufRead, Read};

    use kn_journal::{Event, KN_PAYLOAD};

    use crate::{Error, ErrorKind};

    /// The frame of `event`: elements in name order, `kn_payload` last as
    /// the body.
    pub fn frame(event: &Event) -> Vec<u8> {
        let mut out = Vec::new();
        write_frame(&mut out, event);
        out
    }

    /// Appends the frame of `event` to `out`.
    pub fn write_frame(out: &mut Vec<u8>, event: &Event) {
        let elements = event.elements().filter(|(name, _)| *name != KN_PAYLOAD);
        write_frame_from(out, elements, event.payload());
    }

    /// Appends the frame of an event given as `elements` (written in the
    /// order given; any `kn_payload` among them is skipped) and `payload`.
    pub fn write_frame_from<'a>(out: &mut Vec<u8>, elements: impl IntoIterator<Item = (&'a [u8], &'a [u8])>, payload: &[u8]) {
        let encoded = encode_from(elements, payload);
        out.extend_from_slice(encoded.len().to_string().as_bytes());
        out.push(b'\n');
        out.extend_from_slice(&encoded);
        out.push(b'\n');
    }

    /// The encoded event without count (also the legacy event file
    /// format): `elements` in the order given, then the blank line and the
    /// raw `payload`.
    pub fn encode_from<'a>(elements: impl IntoIterator<Item = (&'a [u8], &'a [u8])>, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(payload.len() + 64);
        for (name, value) in elements.into_iter().filter(|(name, _)| *name != KN_PAYLOAD) {
            escape(name, &mut out);
            out.extend_from_slice(b": ");
            escape(value, &mut out);
            out.push(b'\n');
        }
        out.push(b'\n');
        out.extend_from_slice(payload);
        out
    }

    /// Appends `bytes` escaped for a name or value.
    pub fn escape(bytes: &[u8], out: &mut Vec<u8>) {
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        let last = bytes.len().saturating_sub(1);
        for (i, &b) in bytes.iter().enumerate() {
            let edge_space = b == b' ' && (i == 0 || i == last);
            if edge_space || matches!(b, 0x00..=0x1f | 0x7f..=0x9f | b':' | b'=') {
                out.extend_from_slice(&[b'=', HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]]);
            } else {
                out.push(b);
            }
        }
    }

    /// Decodes `=XX` (either case) anywhere; a `=` not followed by two hex
    /// digits stays as it is.
    pub fn unescape(bytes: &[u8]) -> Vec<u8> {
        kn_journal::decode_escapes(bytes, b'=')
    }

    /// Decodes one encoded event (no count): header lines up to the first
    /// blank line, split at their first `:`, one space stripped after the
    /// colon, `=XX` decoded; the rest is the payload, always present as
    /// `kn_payload`. CR LF line ends are accepted in the header.
    pub fn decode_event(encoded: &[u8]) -> Result<Event, Error> {
        let mut event = Event::new();
        let mut rest = encoded;
        loop {
            let Some(end) = rest.iter().position(|&b| b == b'\n') else {
                // No blank line: all header, empty payload.
                if !rest.is_empty() {
                    decode_line(rest, &mut event)?;
                }
                rest = b"";
                break;
            };
            let line = &rest[..end];
            rest = &rest[end + 1..];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() {
                break;
            }
            decode_line(line, &mut event)?;
        }
        event.set(KN_PAYLOAD, rest);
        Ok(event)
    }

    fn decode_line(line: &[u8], event: &mut Event) -> Result<(), Error> {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return Err(Error::new(
                ErrorKind::BadFrame,
                format!("bad simple-format line '{}': no ':' after the element name", crate::show(line, 60)),
            ));
        };
        let value = &line[colon + 1..];
        let value = value.strip_prefix(b" ").unwrap_or(value);
        event.set(unescape(&line[..colon]), unescape(value));
        Ok(())
    }

    /// Decodes a whole stream of frames (a simple or flash response body):
    /// whitespace and NUL bytes between frames are skipped.
    pub fn decode_frames(input: &[u8]) -> Result<Vec<Event>, Error> {
        let mut reader = FrameReader::new(input);
        let mut events = Vec::new();
        while let Some(event) = reader.next_event()? {
            events.push(event);
        }
        Ok(events)
    }

    /// Reads frames one by one from a stream, e.g. an open tunnel.
    ///
    /// ```
    /// use kn_cgi::format::simple::FrameReader;
    ///
    /// let mut reader = FrameReader::new(&b"  4\n\nabc\n \x00 5\n\nxyz\n"[..]);
    /// assert_eq!(reader.next_event().unwrap().unwrap().payload(), b"abc");
    /// assert_eq!(reader.next_event().unwrap().unwrap().payload(), b"xyz\n");
    /// assert!(reader.next_event().unwrap().is_none());
    /// ```
    #[derive(Debug)]
    pub struct FrameReader<R> {
        input: R,
    }

    impl<R: BufRead> FrameReader<R> {
        /// Reads frames from `input`.
        pub fn new(input: R) -> FrameReader<R> {
            FrameReader { input }
        }

        /// The next event, or `None` at the end of the stream. Errors: a
        /// count that is not a number ([`ErrorKind::BadFrame`]), a stream
        /// that ends inside a frame (`BadFrame`), or a read error (`Io`).
        pub fn next_event(&mut self) -> Result<Option<Event>, Error> {
            if !self.skip_separators()? {
                return Ok(None);
            }
            let count = self.read_count()?;
            let mut encoded = Vec::new();
            Read::by_ref(&mut self.input).take(count).read_to_end(&mut encoded).map_err(|e| Error::io("reading a frame", e))?;
            if (encoded.len() as u64) < count {
                return Err(Error::new(
                    ErrorKind::BadFrame,
                    format!("truncated frame: the stream ended after {} of its {count} bytes", encoded.len()),
                ));
            }
            decode_event(&encoded).map(Some)
        }

        /// Skips whitespace and NULs; false at the end of the stream.
        fn skip_separators(&mut self) -> Result<bool, Error> {
            loop {
                let buf = self.input.fill_buf().map_err(|e| Error::io("reading frames", e))?;
                if buf.is_empty() {
                    return Ok(false);
                }
                let skip = buf.iter().take_while(|&&b| b.is_ascii_whitespace() || b == 0).count();
                let found = skip < buf.len();
                self.input.consume(skip);
                if found {
                    return Ok(true);
                }
            }
        }

        fn read_count(&mut self) -> Result<u64, Error> {
            let mut line = Vec::new();
            Read::by_ref(&mut self.input).take(24).read_until(b'\n', &mut line).map_err(|e| Error::io("reading a frame count", e))?;
            let digits = line.strip_suffix(b"\n").unwrap_or(&line);
            let digits = digits.strip_suffix(b"\r").unwrap_or(digits);
            let count = std::str::from_utf8(digits).ok().filter(|d| d.bytes().all(|b| b.is_ascii_digit()));
            count.and_then(|d| d.parse().ok()).ok_or_else(|| {
                Error::new(ErrorKind::BadFrame, format!("bad frame count '{}': expected a decimal byte count", crate::show(&line, 24)))
            })
        }
    }
}

/// The `js` format: an HTML page whose events are script blocks calling
/// `parent.kn_sendCallback`, inside HTML comments.
pub mod js {
    use kn_journal::Event;

    use super::Page;

    /// What closes a `js` page: the open comment, `</body>` and `</html>`.
    pub const TRAILER: &[u8] = b"-->\n</body>\n</html>\n";

    const DOCTYPE: &str = "<!DOCTYPE html\n\tPUBLIC \"-//W3C//DTD XHTML 1.0 Transitional//EN\"\n\t \
                           \"http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd\">\n\
                           <html xmlns=\"http://www.w3.org/1999/xhtml\" lang=\"en-US\" xml:lang=\"en-US\">\n";

    const TUNNEL_BODY: &str = "<body onload=\"if(parent.kn_tunnelLoadCallback) parent.kn_tunnelLoadCallback(window)\">\n";

    /// The start of an HTML page as the original's CGI.pm wrote it, up to
    /// and including the `<body>` line: `title` (entity-escaped here, line
    /// breaks kept), then
    /// `head` (raw HTML) in the `<head>`, then `body_tag`.
    ///
    /// Unlike CGI.pm, the `<meta>` says `charset=utf-8`, agreeing with the
    /// HTTP header (every page we write is ASCII anyway).
    pub fn start_html(title: &[u8], head: &str, body_tag: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(600);
        out.extend_from_slice(DOCTYPE.as_bytes());
        out.extend_from_slice(b"<head>\n<title>");
        // CGI.pm left line breaks in a title as they are (the blank page's
        // title ends with one).
        for (i, line) in title.split(|&b| b == b'\n').enumerate() {
            if i > 0 {
                out.push(b'\n');
            }
            html_escape(line, &mut out);
        }
        out.extend_from_slice(b"</title>\n");
        out.extend_from_slice(head.as_bytes());
        out.extend_from_slice(b"<meta http-equiv=\"Content-Type\" content=\"text/html; charset=utf-8\" />\n</head>\n");
        out.extend_from_slice(body_tag.as_bytes());
        out
    }

    /// The `<script>` element that loads `do_method=whoami` from the server.
    pub fn whoami_script(server_url: &str) -> String {
        let mut src = Vec::new();
        html_escape(format!("{server_url}?do_method=whoami").as_bytes(), &mut src);
        format!("<script type=\"text/javascript\" src=\"{}\"></script>\n", String::from_utf8_lossy(&src))
    }

    /// The page up to the first event: title and `<h1>` = `status`, the
    /// `payload` in a `<pre>`, for a 4xx status a paragraph linking to
    /// `?do_method=help`, and the `<!--` that the first event block closes.
    pub fn prologue(page: &Page, status: &[u8], payload: &[u8]) -> Vec<u8> {
        let body_tag = if page.is_tunnel() { TUNNEL_BODY } else { "<body>\n" };
        let mut out = start_html(status, &whoami_script(page.server_url()), body_tag);
        out.extend_from_slice(b"<h1>");
        html_escape(status, &mut out);
        out.extend_from_slice(b"</h1><pre>");
        html_escape(payload, &mut out);
        out.extend_from_slice(b"</pre>");
        if status.first() == Some(&b'4') {
            out.extend_from_slice(b"<p>Some aspect of your request was not understood. Please see the <a href=\"");
            html_escape(format!("{}?do_method=help", page.server_url()).as_bytes(), &mut out);
            out.extend_from_slice(b"\">mod_pubsub documentation</a> for more information.</p>");
        }
        out.extend_from_slice(b"<!--");
        out
    }

    /// The script block of `event`, elements in name order.
    pub fn block(event: &Event) -> Vec<u8> {
        let mut out = Vec::new();
        write_block(&mut out, event.elements());
        out
    }

    /// Appends the script block of an event given as `elements`, written
    /// in the order given:
    ///
    /// ```text
    /// --><script type="text/javascript"><!--
    /// if (parent.kn_sendCallback) parent.kn_sendCallback({elements:[
    /// {name:"K1",value:"V1"}
    /// ,{name:"K2",value:"V2"}
    /// ]}, window);
    /// // -->
    /// </script><!--
    /// ```
    pub fn write_block<'a>(out: &mut Vec<u8>, elements: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) {
        out.extend_from_slice(b"--><script type=\"text/javascript\"><!--\nif (parent.kn_sendCallback) parent.kn_sendCallback({elements:[\n");
        for (i, (name, value)) in elements.into_iter().enumerate() {
            out.extend_from_slice(if i == 0 { b"{" } else { b",{" });
            write_member(out, b"name", name);
            out.push(b',');
            write_member(out, b"value", value);
            out.extend_from_slice(b"}\n");
        }
        out.extend_from_slice(b"]}, window);\n// -->\n</script><!--\n");
    }

    /// `key:"..."`, with `key` + `U` when the string holds a byte >= 0x80
    /// (the client then decodes the bytes as UTF-8).
    fn write_member(out: &mut Vec<u8>, key: &[u8], string: &[u8]) {
        out.extend_from_slice(key);
        if string.iter().any(|&b| b >= 0x80) {
            out.push(b'U');
        }
        out.extend_from_slice(b":\"");
        escape_string(string, out);
        out.push(b'"');
    }

    /// Appends the body of a JavaScript string literal: `\` and `"`
    /// backslashed, FF LF CR TAB as `\f \n \r \t`, and `<` and every other
    /// byte outside 0x20-0x7E as `\xNN` (lowercase hex).
    ///
    /// ```
    /// let mut out = Vec::new();
    /// kn_cgi::format::js::escape_string("<b>\"κ\"\n".as_bytes(), &mut out);
    /// assert_eq!(out, br#"\x3cb>\"\xce\xba\"\n"#);
    /// ```
    pub fn escape_string(string: &[u8], out: &mut Vec<u8>) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        for &b in string {
            match b {
                b'\\' => out.extend_from_slice(b"\\\\"),
                b'"' => out.extend_from_slice(b"\\\""),
                0x0c => out.extend_from_slice(b"\\f"),
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                b'\t' => out.extend_from_slice(b"\\t"),
                b'<' | 0x00..=0x1f | 0x7f..=0xff => {
                    out.extend_from_slice(&[b'\\', b'x', HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]])
                }
                _ => out.push(b),
            }
        }
    }

    /// Appends `text` escaped for HTML text or a quoted attribute, in
    /// ASCII: `&`, `<`, `>`, `"` as named entities; LF and the other
    /// control bytes (not TAB) and DEL as decimal references (`&#10;`); each
    /// UTF-8 character >= U+0080 as its decimal reference (`κ` → `&#954;`);
    /// a byte that is not part of valid UTF-8 as the reference of its
    /// Latin-1 character. `'` stays as it is.
    ///
    /// ```
    /// let mut out = Vec::new();
    /// kn_cgi::format::js::html_escape("a&\"b\"\nκ'\u{ff}".as_bytes(), &mut out);
    /// assert_eq!(out, b"a&amp;&quot;b&quot;&#10;&#954;'&#255;");
    /// ```
    pub fn html_escape(text: &[u8], out: &mut Vec<u8>) {
        for chunk in text.utf8_chunks() {
            for c in chunk.valid().chars() {
                match c {
                    '&' => out.extend_from_slice(b"&amp;"),
                    '<' => out.extend_from_slice(b"&lt;"),
                    '>' => out.extend_from_slice(b"&gt;"),
                    '"' => out.extend_from_slice(b"&quot;"),
                    '\t' => out.push(b'\t'),
                    c if c.is_ascii_control() || !c.is_ascii() => out.extend_from_slice(format!("&#{};", u32::from(c)).as_bytes()),
                    c => out.push(c as u8),
                }
            }
            for &b in chunk.invalid() {
                out.extend_from_slice(format!("&#{b};").as_bytes());
            }
        }
    }
}

/// **Extension** `sse`: `text/event-stream` for `EventSource`.
///
/// Each event is an `id:` line with its `kn_route_checkpoint` (only when it
/// has one, and only if that holds no CR, LF or NUL), a `data:` line with
/// the event as one JSON object of its elements (names in byte order), and
/// a blank line.
///
/// **JSON encoding of byte strings.** A name or value that is valid UTF-8
/// becomes that JSON string exactly. One that is not is decoded lossily:
/// each invalid sequence becomes U+FFFD (as `String::from_utf8_lossy`), so
/// such bytes do not survive this format; clients that need them use
/// `simple`. Control characters, `"` and `\` are escaped as JSON requires
/// (`\n`, `\u0000`, ...), and so are DEL, U+2028 and U+2029; other
/// characters are written as raw UTF-8.
///
/// ```
/// use kn_cgi::{format::sse, Event};
///
/// let event = Event::from_pairs([("kn_payload", "a\nb"), ("kn_route_checkpoint", "c7")]);
/// assert_eq!(sse::event(&event), b"id: c7\ndata: {\"kn_payload\":\"a\\nb\",\"kn_route_checkpoint\":\"c7\"}\n\n");
/// ```
pub mod sse {
    use kn_journal::Event;

    /// The keep-alive comment line.
    pub const KEEP_ALIVE: &[u8] = b": keep-alive\n";

    /// One event, encoded.
    pub fn event(event: &Event) -> Vec<u8> {
        let mut out = Vec::new();
        write_event(&mut out, event);
        out
    }

    /// Appends one event to `out`.
    pub fn write_event(out: &mut Vec<u8>, event: &Event) {
        if let Some(id) = event.checkpoint().filter(|id| !id.iter().any(|b| matches!(b, b'\r' | b'\n' | 0))) {
            out.extend_from_slice(b"id: ");
            out.extend_from_slice(id);
            out.push(b'\n');
        }
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(json_object(event).as_bytes());
        out.extend_from_slice(b"\n\n");
    }

    /// The event's elements as one JSON object, on one line.
    pub fn json_object(event: &Event) -> String {
        let mut out = String::from("{");
        for (i, (name, value)) in event.elements().enumerate() {
            if i > 0 {
                out.push(',');
            }
            write_json_string(&mut out, name);
            out.push(':');
            write_json_string(&mut out, value);
        }
        out.push('}');
        out
    }

    fn write_json_string(out: &mut String, bytes: &[u8]) {
        out.push('"');
        for c in String::from_utf8_lossy(bytes).chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                c if c.is_control() && (c as u32) < 0x80 || c == '\u{2028}' || c == '\u{2029}' => {
                    out.push_str(&format!("\\u{:04x}", c as u32))
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescape_leaves_stray_equals() {
        assert_eq!(simple::unescape(b"a=3Db=zz=4"), b"a=b=zz=4");
    }
}
