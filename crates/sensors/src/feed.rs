//! The feed sensor: each item of an RSS (0.9x, 1.0, 2.0), Atom or JSON
//! feed becomes one event, parsed with the `feed-rs` crate.
//!
//! | element | value |
//! |---|---|
//! | `kn_id` | the item's id (RSS `guid`, Atom `id`), else its first link, else `feed-` and a digest of its title |
//! | `title` | the title, as text |
//! | `link` | the first link |
//! | `published`, `updated` | RFC 3339 times, when the feed gives them |
//! | `author` | the authors' names, `, `-separated |
//! | `category` | the categories, `, `-separated |
//! | `summary` | the summary (RSS `description`), as text |
//! | `kn_payload` | the content (HTML converted to text), else the summary, else the title |
//!
//! Every element comes from the feed itself (no fetch time), so a rerun
//! posts an unchanged item as a duplicate, which the store suppresses, and
//! a changed item (same id, new elements) replaces the stored one: a cron
//! job every few minutes posts only new or changed items.

use std::io::Read;

use feed_rs::model::{Entry, Text};
use kn_journal::{Config, ErrorKind as JournalKind, Event, HttpRemote, OutboundPolicy};

use crate::{SensorError, SensorErrorKind, Target};

/// Largest feed document read from a file or standard input, in bytes (a
/// fetched one is bounded by `KN_REMOTE_MAX_BYTES`, like every response).
pub const MAX_FEED_BYTES: u64 = 32 << 20;

/// Where a feed comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// An `http://` URL, fetched with a GET.
    Url(String),
    /// A file.
    File(std::path::PathBuf),
    /// Standard input (`-`).
    Stdin,
}

impl Source {
    /// `-` is standard input, an `http(s)://` URL is fetched, anything else
    /// is a file path.
    pub fn parse(spec: &str) -> Source {
        let lower = spec.to_ascii_lowercase();
        if spec == "-" {
            Source::Stdin
        } else if lower.starts_with("http://") || lower.starts_with("https://") {
            Source::Url(spec.to_string())
        } else {
            Source::File(spec.into())
        }
    }

    /// Reads the whole document. Errors name the file or URL: a missing
    /// file is `EX_NOINPUT` (66), an unreachable or failing server
    /// `EX_TEMPFAIL` (75), an `https://` URL `EX_USAGE` (64: this build has
    /// no TLS; fetch with curl and pipe into `-`), a redirect to a URL that
    /// is neither on the feed's own origin nor allowed by `KN_OUTBOUND`
    /// `EX_UNAVAILABLE` (69). `timeout` bounds a fetch (default
    /// `KN_REMOTE_TIMEOUT_MS`).
    pub fn read(&self, timeout: Option<std::time::Duration>) -> Result<Vec<u8>, SensorError> {
        let mut bytes = Vec::new();
        match self {
            Source::Stdin => {
                std::io::stdin().take(MAX_FEED_BYTES).read_to_end(&mut bytes).map_err(|e| SensorError::read("standard input", e))?;
            }
            Source::File(path) => {
                let what = format!("feed file '{}'", path.display());
                let file = std::fs::File::open(path).map_err(|e| SensorError::read(&what, e))?;
                file.take(MAX_FEED_BYTES).read_to_end(&mut bytes).map_err(|e| SensorError::read(&what, e))?;
            }
            Source::Url(url) => bytes = fetch(url, timeout)?,
        }
        Ok(bytes)
    }

    /// The URL, for resolving relative links.
    fn base_uri(&self) -> Option<&str> {
        match self {
            Source::Url(url) => Some(url),
            _ => None,
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Url(url) => f.write_str(url),
            Source::File(path) => write!(f, "{}", path.display()),
            Source::Stdin => f.write_str("standard input"),
        }
    }
}

/// GETs `url` through the project's one client ([`HttpRemote::from_config`]:
/// the `KN_REMOTE_*` limits (timeouts, response size; `timeout`, kn-feed's
/// `--timeout`, replaces the whole-request one), `KN_HTTP_PROXY`, never a
/// proxy from the environment). Redirects are followed up to
/// `KN_REMOTE_MAX_REDIRECTS` times, each hop only to the feed's own origin
/// (scheme, host and port of `url`, which the operator named) or to a URL
/// the outbound policy (`KN_OUTBOUND`) allows.
fn fetch(url: &str, timeout: Option<std::time::Duration>) -> Result<Vec<u8>, SensorError> {
    if url.to_ascii_lowercase().starts_with("https://") {
        return Err(SensorError::usage(format!(
            "cannot fetch '{url}': https is not supported by this build (no TLS); use 'curl -sf {url} | kn-feed - TARGET'"
        )));
    }
    let config = Config::from_env().map_err(|e| SensorError::new(SensorErrorKind::Config, e.to_string()))?;
    let policy = allow_origin(&config.outbound, url)?;
    let mut client = HttpRemote::builder_from(&config);
    if let Some(timeout) = timeout {
        client = client.timeout(timeout);
    }
    let reply = client.build().get(url, &policy).map_err(|e| match e.kind() {
        JournalKind::BadRequest => SensorError::usage(format!("bad feed URL '{url}': {}", e.message())),
        JournalKind::Forbidden => SensorError::new(SensorErrorKind::Unavailable, format!("cannot fetch feed '{url}': {}", e.message())),
        _ => SensorError::new(SensorErrorKind::TempFail, format!("cannot fetch feed '{url}': {}", e.message())),
    })?;
    if reply.status != 200 {
        let kind = if reply.status >= 500 || reply.status == 429 { SensorErrorKind::TempFail } else { SensorErrorKind::Unavailable };
        return Err(SensorError::new(kind, format!("cannot fetch feed '{url}': HTTP {}", reply.status)));
    }
    Ok(reply.body)
}

/// `policy` plus the origin (`scheme://host:port/`) of the operator's
/// feed URL.
fn allow_origin(policy: &OutboundPolicy, url: &str) -> Result<OutboundPolicy, SensorError> {
    let bad = || SensorError::usage(format!("bad feed URL '{url}': expected http://host[:port]/path"));
    let (scheme, rest) = url.split_once("://").ok_or_else(bad)?;
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let origin = format!("{scheme}://{authority}/");
    let prefixes = match policy {
        OutboundPolicy::AllowAll => return Ok(OutboundPolicy::AllowAll),
        OutboundPolicy::DenyAll => origin,
        OutboundPolicy::AllowPrefixes(prefixes) => format!("{origin} {}", prefixes.join(" ")),
    };
    prefixes.parse().map_err(|_| bad())
}

/// Parses a feed document into one event per item, in feed order. Fails
/// with `EX_DATAERR` (65) when the document is not a feed; `source` names
/// it in the message.
///
/// ```
/// let rss = br#"<?xml version="1.0"?><rss version="2.0"><channel><title>News</title>
///   <item><guid>urn:n:1</guid><title>First</title><link>http://example.org/1</link>
///   <description>&lt;p&gt;Hello &lt;b&gt;there&lt;/b&gt;&lt;/p&gt;</description></item>
/// </channel></rss>"#;
/// let events = kn_sensors::feed::events_from_feed(rss, "news.xml", None).unwrap();
/// assert_eq!(events.len(), 1);
/// assert_eq!(events[0].id(), Some(&b"urn:n:1"[..]));
/// assert_eq!(events[0].get_str("title").unwrap(), "First");
/// assert_eq!(events[0].payload(), b"Hello there");
/// ```
pub fn events_from_feed(document: &[u8], source: &str, base_uri: Option<&str>) -> Result<Vec<Event>, SensorError> {
    let parser = feed_rs::parser::Builder::new()
        .base_uri(base_uri)
        // An item without id gets its first link; without link, an empty id
        // that `event_from_entry` replaces with a digest of the title.
        .id_generator(|links, _title, _uri| links.first().map(|l| l.href.clone()).unwrap_or_default())
        .build();
    let feed = parser.parse(document).map_err(|e| SensorError::data(format!("'{source}' is not an RSS or Atom feed: {e}")))?;
    Ok(feed.entries.iter().map(event_from_entry).collect())
}

/// The event for one item (see the module documentation).
pub fn event_from_entry(entry: &Entry) -> Event {
    let mut event = Event::new();
    let title = entry.title.as_ref().map(text_of).map(|t| t.trim().to_string());
    if let Some(title) = &title {
        event.set("title", title.as_str());
    }
    if let Some(link) = entry.links.first() {
        event.set("link", link.href.as_str());
    }
    if let Some(t) = entry.published {
        event.set("published", t.to_rfc3339());
    }
    if let Some(t) = entry.updated {
        event.set("updated", t.to_rfc3339());
    }
    let authors: Vec<&str> = entry.authors.iter().filter_map(|p| p.name.as_deref().or(p.email.as_deref())).map(str::trim).filter(|n| !n.is_empty()).collect();
    if !authors.is_empty() {
        event.set("author", authors.join(", "));
    }
    let categories: Vec<&str> =
        entry.categories.iter().map(|c| c.label.as_deref().unwrap_or(&c.term).trim()).filter(|c| !c.is_empty()).collect();
    if !categories.is_empty() {
        event.set("category", categories.join(", "));
    }
    let summary = entry.summary.as_ref().map(text_of);
    if let Some(summary) = &summary {
        event.set("summary", summary.trim());
    }
    let content = entry.content.as_ref().and_then(|c| {
        let body = c.body.as_deref()?;
        Some(if c.content_type.essence().to_string().contains("html") { crate::html_to_text(body) } else { body.to_string() })
    });
    // Trimmed, whatever the kind of text: HTML rendering adds a final line
    // end that plain text lacks.
    let payload = content.or(summary).or(title.clone()).unwrap_or_default();
    event.set("kn_payload", payload.trim());
    let id = entry.id.trim();
    if id.is_empty() {
        let digest = xxhash_rust::xxh3::xxh3_128(title.unwrap_or_default().as_bytes());
        event.set("kn_id", format!("feed-{digest:032x}"));
    } else {
        event.set("kn_id", id);
    }
    event
}

/// A feed text as plain text: HTML rendered, plain text as it is.
fn text_of(text: &Text) -> String {
    if text.content_type.essence().to_string().contains("html") {
        crate::html_to_text(&text.content)
    } else {
        text.content.clone()
    }
}

/// What one run of the feed sensor did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Items stored: new, or changed since the last run.
    pub stored: usize,
    /// Items that repeated the stored event (suppressed as duplicates).
    pub unchanged: usize,
    /// Items the target refused as malformed (each reported on stderr).
    pub rejected: usize,
}

/// Reads `source` and posts every item to `target`, each with `extra`
/// elements added. A temporary failure (disk full, server down) stops the
/// run at once with its error, and the next run picks up from there; an
/// item refused as malformed is reported on stderr and counted, and the
/// run goes on.
pub fn run(source: &Source, target: &Target, extra: &Event, timeout: Option<std::time::Duration>) -> Result<Summary, SensorError> {
    let document = source.read(timeout)?;
    let events = events_from_feed(&document, &source.to_string(), source.base_uri())?;
    let mut summary = Summary::default();
    for mut event in events {
        for (name, value) in extra.elements() {
            event.set(name, value);
        }
        let id = event.get_str("kn_id").unwrap_or_default();
        match target.post(event) {
            Ok(posted) if posted.duplicate => summary.unchanged += 1,
            Ok(_) => summary.stored += 1,
            Err(e) if e.kind() == SensorErrorKind::Data => {
                eprintln!("kn-feed: item '{id}' of '{source}': {e}");
                summary.rejected += 1;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(summary)
}
