//! kn-feed: each item of an RSS or Atom feed becomes one event.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use kn_sensors::feed::{self, Source};
use kn_sensors::{elements_from_args, exit, usage_error, SensorError, SensorErrorKind, Target};

/// Post each item of an RSS or Atom feed as an event, keyed by the item's
/// id, so that a rerun posts only new or changed items.
///
/// FEED is an http:// URL, a file, or - for standard input. Each item
/// becomes one event: kn_id is the item's id (RSS guid, Atom id), else its
/// link; elements title, link, published, updated, author, category and
/// summary; kn_payload is the content (HTML as text), else the summary.
/// An unchanged item is a duplicate and is not stored again; a changed one
/// replaces the stored event. Prints "N new or changed, M unchanged".
#[derive(Parser, Debug)]
#[command(name = "kn-feed", version, after_long_help = AFTER_HELP)]
// pub(crate): packaging/docgen renders it (man page, completions).
pub(crate) struct Cli {
    /// The event store (default: $KN_EVENTS, else ./kn_events). Ignored for
    /// URL targets.
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,

    /// Print nothing unless something fails (for cron).
    #[arg(short, long)]
    quiet: bool,

    /// Seconds allowed to fetch a feed URL (default: KN_REMOTE_TIMEOUT_MS,
    /// 5 s, like every outbound request).
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<u64>,

    /// The feed: an http:// URL, a file, or - for standard input.
    #[arg(value_name = "FEED")]
    feed: String,

    /// Where to post: a topic of the local store (/what/news) or the
    /// absolute http:// URL of a topic on any PubSub server.
    #[arg(value_name = "TARGET")]
    target: String,

    /// Extra elements added to every item's event (feed=planet).
    #[arg(value_name = "NAME=VALUE")]
    elements: Vec<String>,
}

const AFTER_HELP: &str = "\
Exit status: 0 when every item is stored or unchanged, 64 for a bad
command line, 65 when FEED is not a feed or an item was refused as
malformed, 66 when the feed file is missing, 69 when the target or the
feed server refuses for good, 75 for a temporary failure (disk full,
server unreachable or 5xx: the next run catches up).

https:// feeds: this build has no TLS; fetch with curl and read stdin:
  curl -sf https://example.org/feed.xml | kn-feed - /what/news

Examples:
  kn-feed http://planet.example/rss20.xml /what/news
  kn-feed --root /var/lib/kn_events ./atom.xml http://pubsub.example/kn/what/news

  # crontab: every 10 minutes, quiet unless something fails
  */10 * * * * kn-feed -q --root /var/lib/kn_events http://planet.example/rss20.xml /what/news";

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    exit("kn-feed", run(cli))
}

fn run(cli: Cli) -> Result<(), SensorError> {
    let extra = elements_from_args(&cli.elements)?;
    let source = Source::parse(&cli.feed);
    let target = Target::parse(&cli.target, cli.root)?;
    let summary = feed::run(&source, &target, &extra, cli.timeout.map(|s| Duration::from_secs(s.max(1))))?;
    if !cli.quiet {
        println!("{} new or changed, {} unchanged", summary.stored, summary.unchanged);
    }
    if summary.rejected > 0 {
        return Err(SensorError::new(
            SensorErrorKind::Data,
            format!("{} item(s) of '{source}' refused by {target}", summary.rejected),
        ));
    }
    Ok(())
}
