//! [`Format`]: the response formats of PROTOCOL.md 3.5 (`js`, `simple`,
//! `flash`, and our `sse`) as a handler chooses and writes them, the
//! [`Page`] a `js` response needs, and status events ([`status_event`]).
//!
//! The encoders themselves live in [`simple`](crate::simple),
//! [`js`](crate::js) and [`sse`](crate::sse).

use kn_journal::{fresh_id, Event, KN_ID, KN_PAYLOAD, KN_ROUTE_LOCATION, STATUS};

use crate::{js, simple, sse, Error, ErrorKind};

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
    /// A one-shot page of the script at `server_url`, its absolute URL
    /// (e.g. `http://127.0.0.1:8080/kn`).
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
    /// use kn_wire::Format;
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
                    crate::show_bytes(value, 40)
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
    ///
    /// Why at all: the browsers of mod_pubsub's day held back the start of
    /// an incremental response (Internet Explorer its first kilobytes,
    /// Safari its first kilobyte, with some content types more) before
    /// rendering any of it, so a tunnel's first events, and on some of them
    /// each later burst, showed only once enough bytes had followed.
    /// [`Format::tunnel_padding`] decides which clients get it.
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

    /// The padding a tunnel writes after each burst for a client whose
    /// `User-Agent` header is `user_agent` (`None` when it sent none):
    /// [`Format::padding`] for every client that may be a browser; nothing
    /// for a `simple` tunnel to a client that says it is not one, so that
    /// its frames read as they are (in a terminal, `curl -N`).
    ///
    /// `js` pages are only ever loaded by browsers and `flash` frames by
    /// the Flash player (whose requests may carry `Shockwave Flash`), so
    /// both always get it. A `simple` tunnel gets it when the request
    /// carries no `User-Agent` (the original Perl client's tunnels send
    /// none, nor do the golden transcripts) or one that starts with `Mozilla/`
    /// or `Opera` (every browser's, old and new); any other (`curl/8.5.0`,
    /// `Wget/1.21`, `python-requests/2.31`) gets none. Padding is only ever
    /// spaces that every simple reader skips between frames, so a client
    /// misjudged either way still reads the same events.
    ///
    /// ```
    /// use kn_wire::Format;
    /// assert_eq!(Format::Simple.tunnel_padding(None).len(), 4096);
    /// assert_eq!(Format::Simple.tunnel_padding(Some(b"Mozilla/5.0 (X11; Linux x86_64)")).len(), 4096);
    /// assert_eq!(Format::Simple.tunnel_padding(Some(b"curl/8.5.0")), b"");
    /// assert_eq!(Format::Js.tunnel_padding(Some(b"curl/8.5.0")).len(), 4097);
    /// assert_eq!(Format::Flash.tunnel_padding(Some(b"Shockwave Flash")).len(), 4096);
    /// ```
    pub fn tunnel_padding(self, user_agent: Option<&[u8]>) -> &'static [u8] {
        let browser = |agent: &[u8]| agent.starts_with(b"Mozilla/") || agent.starts_with(b"Opera");
        match (self, user_agent) {
            (Format::Simple, Some(agent)) if !browser(agent) => b"",
            _ => self.padding(),
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
/// use kn_wire::status_event;
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
