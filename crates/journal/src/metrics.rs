//! The store's figures in the Prometheus text exposition format (version
//! 0.0.4): what `kn stat --prometheus` writes for node_exporter's textfile
//! collector and what `pubsub-cgi serve` answers at `/metrics`. One
//! implementation, here beside the counters, so that both print the same
//! names, help and types.
//!
//! Every [`Counter`] is a Prometheus counter `kn_<name>_total`; the store's
//! size ([`Usage`], one walk of its directory tree) gives the gauges
//! `kn_store_topics`, `kn_store_journals`, `kn_store_files`,
//! `kn_store_directories` and `kn_store_bytes`. A server adds its own
//! figures to the same [`Exposition`].
//!
//! ```
//! use kn_journal::{Counter, Exposition, Store};
//! let dir = tempfile::tempdir().unwrap();
//! let store = Store::open(dir.path()).unwrap();
//! store.count(Counter::Sweeps, 2).unwrap();
//! let mut m = Exposition::of_store(&store).unwrap();
//! m.gauge("kn_serve_open_tunnels", "Tunnels open now.", 1);
//! let text = m.into_string();
//! assert!(text.contains("# TYPE kn_sweeps_total counter\nkn_sweeps_total 2\n"));
//! assert!(text.contains("kn_serve_open_tunnels 1\n"));
//! ```

use std::fmt::Write as _;
use std::fs;
use std::io::ErrorKind as IoKind;
use std::path::Path;

use crate::error::{Error, ErrorKind, Result};
use crate::store::Store;
use crate::topic::Topic;

/// The media type of the text exposition format (for `Content-Type`).
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// How big the store is on disk, from one walk of its directory tree
/// (metadata only: no file is read).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Topic directories, the reserved `kn_routes` and `kn_subtopics`
    /// topics and journals included.
    pub topics: u64,
    /// Journals (`.../kn_journal` topics).
    pub journals: u64,
    /// Regular files anywhere under the root (segments, indexes, blobs,
    /// `.stats`, ...).
    pub files: u64,
    /// Directories under the root (the root itself not counted).
    pub directories: u64,
    /// Bytes of those files (their lengths).
    pub bytes: u64,
}

impl Store {
    /// Counts the store's topics, journals, files, directories and bytes
    /// with one walk of its tree. Entries removed during the walk are
    /// skipped; its cost grows with the number of files (a few hundred
    /// thousand take well under a second when their metadata is cached).
    pub fn usage(&self) -> Result<Usage> {
        usage(self.root())
    }
}

fn usage(root: &Path) -> Result<Usage> {
    let mut usage = Usage::default();
    for entry in walkdir::WalkDir::new(root).min_depth(1).follow_links(false) {
        let entry = match entry {
            Ok(e) => e,
            // Removed while we walked (a compaction, a sweep).
            Err(e) if e.io_error().is_some_and(|io| io.kind() == IoKind::NotFound) => continue,
            Err(e) => return Err(Error::new(ErrorKind::Io, format!("cannot walk '{}': {e}", root.display()))),
        };
        let kind = entry.file_type();
        if kind.is_dir() {
            usage.directories += 1;
            let rel = entry.path().strip_prefix(root).unwrap_or(entry.path()).to_string_lossy();
            if rel.starts_with('.') {
                continue;
            }
            if let Ok(topic) = Topic::parse(&rel) {
                usage.topics += 1;
                usage.journals += u64::from(topic.is_journal());
            }
        } else if kind.is_file() {
            usage.files += 1;
            match fs::symlink_metadata(entry.path()) {
                Ok(m) => usage.bytes += m.len(),
                Err(e) if e.kind() == IoKind::NotFound => usage.files -= 1,
                Err(e) => return Err(Error::io("cannot stat", entry.path(), e)),
            }
        }
    }
    Ok(usage)
}

/// A page of the Prometheus text format being written: `# HELP` and
/// `# TYPE` lines, then the sample, for each metric added.
#[derive(Clone, Debug, Default)]
pub struct Exposition {
    text: String,
}

impl Exposition {
    /// An empty page.
    pub fn new() -> Exposition {
        Exposition::default()
    }

    /// The store's counters (`kn_<name>_total`) and its [`Usage`] gauges
    /// (`kn_store_*`).
    pub fn of_store(store: &Store) -> Result<Exposition> {
        let mut page = Exposition::new();
        let counters = store.counters()?;
        for (counter, value) in counters.iter() {
            page.counter(&format!("kn_{}_total", counter.name()), counter.help(), value);
        }
        let usage = store.usage()?;
        page.gauge("kn_store_topics", "Topics in the store (reserved topics and journals included).", usage.topics);
        page.gauge("kn_store_journals", "Journals in the store.", usage.journals);
        page.gauge("kn_store_files", "Files in the store.", usage.files);
        page.gauge("kn_store_directories", "Directories in the store.", usage.directories);
        page.gauge("kn_store_bytes", "Bytes of the files in the store.", usage.bytes);
        page.gauge(
            "kn_outbox_pending",
            "Deliveries waiting in the forwarding outbox (routes behind on a retry or a population).",
            store.outbox_pending()?,
        );
        Ok(page)
    }

    /// Adds a counter (a figure that only grows; by convention its name
    /// ends in `_total`).
    pub fn counter(&mut self, name: &str, help: &str, value: u64) -> &mut Exposition {
        self.metric(name, help, "counter", value)
    }

    /// Adds a gauge (a figure that goes up and down).
    pub fn gauge(&mut self, name: &str, help: &str, value: u64) -> &mut Exposition {
        self.metric(name, help, "gauge", value)
    }

    /// The page's text.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The page's text.
    pub fn into_string(self) -> String {
        self.text
    }

    fn metric(&mut self, name: &str, help: &str, kind: &str, value: u64) -> &mut Exposition {
        debug_assert!(valid_name(name), "bad metric name {name:?}");
        // In HELP, a backslash and a line feed must be escaped.
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = write!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n");
        self
    }
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`, the metric names Prometheus accepts.
fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Counter, Event, Selection};

    #[test]
    fn every_counter_has_help_type_and_sample() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.count(Counter::PoisonedStale, 3).unwrap();
        let text = Exposition::of_store(&store).unwrap().into_string();
        for c in Counter::ALL {
            let name = format!("kn_{}_total", c.name());
            assert!(valid_name(&name));
            assert!(text.contains(&format!("# HELP {name} {}\n# TYPE {name} counter\n", c.help())), "{text}");
        }
        assert!(text.contains("\nkn_poisoned_stale_total 3\n"), "{text}");
        assert!(text.contains("\nkn_sweeps_total 0\n"), "{text}");
        assert!(text.lines().all(|l| l.starts_with('#') || l.split(' ').count() == 2), "{text}");
    }

    #[test]
    fn usage_counts_topics_journals_files_and_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let before = store.usage().unwrap();
        store.tunnel(&Topic::parse("/who/anna/kn_journal").unwrap(), &Selection::default()).unwrap();
        store.notify(&Topic::parse("/what/chat").unwrap(), Event::from_pairs([("kn_payload", "hi")])).unwrap();
        let after = store.usage().unwrap();
        assert_eq!(after.journals, before.journals + 1, "{after:?}");
        assert!(after.topics >= before.topics + 2, "{before:?} {after:?}");
        assert!(after.files > before.files && after.bytes > before.bytes && after.directories > before.directories, "{before:?} {after:?}");
    }

    #[test]
    fn help_text_is_escaped() {
        let mut page = Exposition::new();
        page.gauge("a", "two\nlines \\ here", 7);
        assert_eq!(page.as_str(), "# HELP a two\\nlines \\\\ here\n# TYPE a gauge\na 7\n");
    }
}
