//! kn-sensors: the programs that bring the outside world into the journal
//! (PROTOCOL.md section 5).
//!
//! Each sensor is one short command for a procmail recipe, a crontab line
//! or a shell, and posts to a [`Target`]: a topic of the local event store
//! (written through kn-journal, so routes fire exactly as for a web
//! client's notify, with the web server down) or the absolute `http://` URL
//! of a topic on any PubSub server (posted as a notify).
//!
//! * `kn-mail` ([`mail`]): one RFC 5322 message on stdin becomes one event.
//! * `kn-post`: stdin is the payload, `name=value` arguments are elements.
//! * `kn-feed` ([`feed`]): each item of an RSS or Atom feed becomes one
//!   event, keyed by the item's id so that reruns post only what changed.
//!
//! The status events a server answers a URL target with are read with
//! kn-wire's `simple` decoder, and forms are encoded with kn-wire's codec:
//! the sensors share the wire format with pubsub.cgi but not its web
//! server (no kn-cgi, hyper or tokio among their dependencies).
//!
//! Failures carry sysexits(3) codes ([`SensorError::exit_code`]): `75`
//! (temporary: disk full, server unreachable) makes a mail system retry.
//!
//! ```
//! use kn_sensors::{mail, Target};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let target = Target::parse("/what/mail", Some(dir.path().into())).unwrap();
//! let raw = b"From: ann@example.com\nSubject: =?UTF-8?B?SGVsbG8gd8O2cmxk?=\nMessage-ID: <1@example.com>\n\nHi!\n";
//! let event = mail::event_from_message(raw).unwrap();
//! assert_eq!(event.get_str("Subject").unwrap(), "Hello wörld");
//! assert_eq!(event.id(), Some(&b"1@example.com"[..]));
//! assert!(!target.post(event.clone()).unwrap().duplicate);
//! assert!(target.post(event).unwrap().duplicate, "a redelivered message is stored once");
//! ```
#![deny(missing_docs)]

pub mod admin;
pub mod feed;
pub mod legacy;
pub mod mail;
pub mod replay;
mod target;

pub use target::{elements_from_args, exit, usage_error, Posted, SensorError, SensorErrorKind, Target};

/// Renders HTML (a mail's HTML body, a feed item's content) as plain text:
/// paragraphs and line breaks kept, entities decoded, links listed as
/// numbered footnotes, long lines not wrapped.
///
/// ```
/// let text = kn_sensors::html_to_text("<p>Hello <b>w&ouml;rld</b></p><p>Bye</p>");
/// assert!(text.contains("Hello w\u{f6}rld"));
/// assert!(text.contains("Bye"));
/// assert!(!text.contains('<'));
/// ```
pub fn html_to_text(html: &str) -> String {
    let rendered = html2text::config::plain_no_decorate()
        .link_footnotes(true)
        .allow_width_overflow()
        .string_from_read(html.as_bytes(), 10_000);
    match rendered {
        Ok(text) => text.lines().map(str::trim_end).collect::<Vec<_>>().join("\n").trim_matches('\n').to_string() + "\n",
        // Not renderable (html2text refuses only pathological input): the
        // markup as it is beats losing the body.
        Err(_) => html.to_string(),
    }
}
