//! The store's figures in the Prometheus text exposition format (version
//! 0.0.4): what `kn stat --prometheus` writes for node_exporter's textfile
//! collector and what `pubsub-cgi serve` answers at `/metrics`. One
//! implementation, here beside the counters, so that both print the same
//! names, help and types.
//!
//! Every [`Counter`](crate::Counter) is a Prometheus counter `kn_<name>_total`, except the
//! poisonings, which are one counter `kn_routes_poisoned_total` with a
//! `reason` label ([`Counter::poison_reason`](crate::Counter::poison_reason)); the store's size
//! ([`Usage`], one walk of its directory tree) gives the gauges
//! `kn_store_topics`, `kn_store_journals`, `kn_store_streams`,
//! `kn_store_files`, `kn_store_directories`, `kn_store_bytes` and
//! `kn_outbox_pending`. A server adds its own figures to the same
//! [`Exposition`]. Names follow Prometheus' conventions: `_total` for
//! counters, base units (bytes, seconds).
//!
//! ```
//! use kn_journal::{Store};
//! use kn_journal::internal::{Counter, Exposition};
//! let dir = tempfile::tempdir().unwrap();
//! let store = Store::open(dir.path()).unwrap();
//! store.count(Counter::Sweeps, 2).unwrap();
//! store.count(Counter::PoisonedStale, 1).unwrap();
//! let mut m = Exposition::of_store(&store).unwrap();
//! m.gauge("kn_serve_open_tunnels", "Tunnels open now.", 1);
//! m.counter_with("kn_serve_http_requests_total", "Requests.", &[(&[("method", "GET"), ("status_class", "2xx")], 3)]);
//! let text = m.into_string();
//! assert!(text.contains("# TYPE kn_sweeps_total counter\nkn_sweeps_total 2\n"));
//! assert!(text.contains("kn_routes_poisoned_total{reason=\"stale\"} 1\n"));
//! assert!(text.contains("kn_serve_open_tunnels 1\n"));
//! assert!(text.contains("kn_serve_http_requests_total{method=\"GET\",status_class=\"2xx\"} 3\n"));
//! ```

use std::fmt::Write as _;

use crate::error::Result;
use crate::stats::Counters;
use crate::store::Store;
use crate::usage::Usage;

/// The media type of the text exposition format (for `Content-Type`).
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

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

    /// The store's counters ([`Exposition::of_counters`]) and its
    /// [`Usage`] gauges ([`Exposition::usage`]), from one walk of its tree
    /// (what `kn stat --prometheus` prints; a server keeps a
    /// [`UsageCache`](crate::UsageCache) instead of walking per scrape).
    pub fn of_store(store: &Store) -> Result<Exposition> {
        let mut page = Exposition::of_counters(&store.counters()?);
        page.usage(&store.usage()?);
        Ok(page)
    }

    /// The store's counters: `kn_<name>_total` each, and the poisonings
    /// as one `kn_routes_poisoned_total` with a `reason` label.
    pub fn of_counters(counters: &Counters) -> Exposition {
        let mut page = Exposition::new();
        let mut poisoned = Vec::new();
        for (counter, value) in counters.iter() {
            match counter.poison_reason() {
                Some(reason) => poisoned.push((reason, value)),
                None => {
                    page.counter(&format!("kn_{}_total", counter.name()), counter.help(), value);
                }
            }
        }
        let samples: Vec<([(&str, &str); 1], u64)> = poisoned.iter().map(|&(reason, value)| ([("reason", reason)], value)).collect();
        let samples: Vec<(&[(&str, &str)], u64)> = samples.iter().map(|(labels, value)| (&labels[..], *value)).collect();
        page.counter_with("kn_routes_poisoned_total", POISONED_HELP, &samples);
        page
    }

    /// The [`Usage`] gauges: `kn_store_topics`, `kn_store_journals`,
    /// `kn_store_streams`, `kn_store_files`, `kn_store_directories`,
    /// `kn_store_bytes` and `kn_outbox_pending`.
    pub fn usage(&mut self, usage: &Usage) -> &mut Exposition {
        self.gauge("kn_store_topics", "Topics in the store (reserved topics and journals included).", usage.topics);
        self.gauge("kn_store_journals", "Journals in the store.", usage.journals);
        self.gauge("kn_store_streams", "Durable Streams in the store.", usage.streams);
        self.gauge("kn_store_files", "Files in the store.", usage.files);
        self.gauge("kn_store_directories", "Directories in the store.", usage.directories);
        self.gauge("kn_store_bytes", "Bytes of the files in the store.", usage.bytes);
        self.gauge(
            "kn_outbox_pending",
            "Deliveries waiting in the forwarding outbox (routes behind on a retry or a population).",
            usage.outbox_pending,
        )
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

    /// Adds a counter with labels: one sample per entry of `samples`
    /// (its label names and values, and its value). Label values are
    /// escaped; keep their set bounded (a fixed list, never a value taken
    /// from a request).
    pub fn counter_with(&mut self, name: &str, help: &str, samples: &[(&[(&str, &str)], u64)]) -> &mut Exposition {
        self.family(name, help, "counter", samples)
    }

    /// Adds a gauge with labels (see [`Exposition::counter_with`]); an
    /// `_info` gauge of value 1 carries facts such as a version.
    pub fn gauge_with(&mut self, name: &str, help: &str, samples: &[(&[(&str, &str)], u64)]) -> &mut Exposition {
        self.family(name, help, "gauge", samples)
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
        self.family(name, help, kind, &[(&[], value)])
    }

    fn family(&mut self, name: &str, help: &str, kind: &str, samples: &[(&[(&str, &str)], u64)]) -> &mut Exposition {
        debug_assert!(valid_name(name), "bad metric name {name:?}");
        // In HELP, a backslash and a line feed must be escaped.
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = write!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}\n");
        for (labels, value) in samples {
            self.text.push_str(name);
            for (i, (label, v)) in labels.iter().enumerate() {
                debug_assert!(valid_label(label), "bad label name {label:?}");
                // In a label value, a backslash, a double quote and a line
                // feed must be escaped.
                let v = v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
                let _ = write!(self.text, "{}{label}=\"{v}\"", if i == 0 { '{' } else { ',' });
            }
            if !labels.is_empty() {
                self.text.push('}');
            }
            let _ = writeln!(self.text, " {value}");
        }
        self
    }
}

/// The help of `kn_routes_poisoned_total`.
const POISONED_HELP: &str = "Routes poisoned, by reason: bad_name (the destination is not a valid topic), stale (the destination journal is stale), refused (the remote server answered 4xx, or the outbound policy forbids the URL), unreachable (no answer after every retry), other (access rules, a content transform, another permanent failure).";

/// `[a-zA-Z_][a-zA-Z0-9_]*`, the label names Prometheus accepts (those
/// starting with `__` are reserved).
fn valid_label(name: &str) -> bool {
    valid_name(name) && !name.contains(':') && !name.starts_with("__")
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
    use crate::Counter;

    #[test]
    fn every_counter_has_help_type_and_sample() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.count(Counter::PoisonedStale, 3).unwrap();
        let text = Exposition::of_store(&store).unwrap().into_string();
        for c in Counter::ALL {
            match c.poison_reason() {
                Some(reason) => assert!(text.contains(&format!("\nkn_routes_poisoned_total{{reason=\"{reason}\"}} ")), "{text}"),
                None => {
                    let name = format!("kn_{}_total", c.name());
                    assert!(valid_name(&name));
                    assert!(text.contains(&format!("# HELP {name} {}\n# TYPE {name} counter\n", c.help())), "{text}");
                }
            }
        }
        assert_eq!(text.matches("# TYPE kn_routes_poisoned_total counter\n").count(), 1, "one family: {text}");
        assert!(!text.contains("kn_poisoned_"), "no counter per reason: {text}");
        assert!(text.contains("\nkn_routes_poisoned_total{reason=\"stale\"} 3\n"), "{text}");
        assert!(text.contains("\nkn_routes_poisoned_total{reason=\"refused\"} 0\n"), "{text}");
        assert!(text.contains("\nkn_sweeps_total 0\n"), "{text}");
        assert!(text.contains("# TYPE kn_store_streams gauge\nkn_store_streams 0\n"), "{text}");
        assert!(text.lines().all(|l| l.starts_with('#') || l.split(' ').count() == 2), "{text}");
    }

    #[test]
    fn help_text_is_escaped() {
        let mut page = Exposition::new();
        page.gauge("a", "two\nlines \\ here", 7);
        assert_eq!(page.as_str(), "# HELP a two\\nlines \\\\ here\n# TYPE a gauge\na 7\n");
    }

    #[test]
    fn label_values_are_escaped() {
        let mut page = Exposition::new();
        page.gauge_with("kn_build_info", "h", &[(&[("version", "1.0"), ("commit", "a\"b\\c\nd")], 1)]);
        page.counter_with("x_total", "h", &[]);
        assert_eq!(
            page.as_str(),
            "# HELP kn_build_info h\n# TYPE kn_build_info gauge\nkn_build_info{version=\"1.0\",commit=\"a\\\"b\\\\c\\nd\"} 1\n# HELP x_total h\n# TYPE x_total counter\n"
        );
        assert!(valid_label("reason") && !valid_label("__name") && !valid_label("a:b") && !valid_label("1a"));
    }
}
