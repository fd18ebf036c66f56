//! kn: look after a knpubsub event store (topics, events, routes, live
//! tail, figures, compaction, verification, legacy import, export).

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use kn_journal::{Config, Selection, Store, Topic};
use kn_journal::internal::Exposition;
use kn_sensors::admin::{self, EventFormat};
use kn_sensors::{legacy, usage_error, SensorError, SensorErrorKind};

/// Look after a knpubsub event store: list topics, print events and
/// routes, follow a topic live, show figures, compact, verify and repair,
/// import a legacy mod_pubsub kn_events tree, export everything.
///
/// Long operations (compact, verify, import-legacy) draw a progress bar
/// when standard error is a terminal and print their summary when standard
/// output is one (or with --verbose); from cron they print nothing unless
/// something is wrong.
#[derive(Parser, Debug)]
#[command(name = "kn", version, after_long_help = AFTER_HELP)]
// pub(crate): packaging/docgen renders it (man page, completions).
pub(crate) struct Cli {
    /// The event store (default: $KN_EVENTS, else ./kn_events).
    #[arg(long, value_name = "DIR", global = true)]
    root: Option<PathBuf>,

    /// Print summaries even when standard output is not a terminal.
    #[arg(short, long, global = true)]
    verbose: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print a bearer token (a JWT, docs/ACCESS.md "Bearer tokens")
    /// signed with the store's own HS256 key (.token-key in the store
    /// root, made on first use; kid "store"), with KN_TOKEN_ISSUER and
    /// KN_TOKEN_AUDIENCE as its iss and aud when set.
    Token(TokenArgs),
    /// List the topics of the store (the tree), one full name per line,
    /// sorted so that children follow their parent.
    Topics {
        /// Also list the reserved kn_routes and kn_subtopics topics.
        #[arg(long)]
        all: bool,
    },
    /// Print the current events of a topic, oldest first (on an ordinary
    /// topic the current event of each kn_id), with kn_route_checkpoint.
    Events {
        /// The topic, e.g. /what/chat.
        topic: String,
        /// Output format: text (for people), simple (PubSub simple format,
        /// byte-exact) or json (one object per line).
        #[arg(long, value_enum, default_value = "text")]
        format: EventFormat,
        /// Only the N most recent events.
        #[arg(long, value_name = "N")]
        max_n: Option<usize>,
        /// Include expired events not yet reclaimed by compaction.
        #[arg(long)]
        expired: bool,
    },
    /// List the routes of a topic: id, destination ("-" when deleted or
    /// poisoned), then the route's other elements as name=value, tab
    /// separated. The active routes and the poisoned ones: a failed
    /// delivery made those inactive, and each line says why in
    /// kn_poisoned=; for each, standard error says when, where it went,
    /// and the curl command that makes it again (once the cause is fixed).
    Routes {
        /// The source topic.
        topic: String,
        /// Also list the other inactive routes (deleted, expired).
        #[arg(long)]
        all: bool,
    },
    /// For an event of a topic (by its kn_id), one line per journal routed
    /// from the topic, tab separated: the journal, holds=CHECKPOINT (or
    /// no), sent=yes|no (a live tunnel sent it to its client),
    /// confirmed=yes|no (its client acknowledged it or resumed past it),
    /// route=ID and creator=NAME (docs/PRESENCE.md, "Receipts"). Exits
    /// 69 when the topic has no current event with that kn_id.
    Receipts {
        /// The topic.
        topic: String,
        /// The event's kn_id.
        kn_id: String,
    },
    /// Print the last events of a topic; with -f keep printing new events
    /// as they land (like tail -f) until interrupted. Following a journal
    /// keeps its heartbeat fresh, as any tunnel does.
    Tail {
        /// Follow: wait for new events.
        #[arg(short, long)]
        follow: bool,
        /// How many existing events to print first.
        #[arg(short = 'n', long, value_name = "N", default_value_t = 10)]
        lines: usize,
        /// Output format (as for events).
        #[arg(long, value_enum, default_value = "text")]
        format: EventFormat,
        /// The topic.
        topic: String,
    },
    /// Show events, records, bytes and segments per topic (the reserved
    /// topics included), with a total; for the whole store, then what the
    /// sweep and the forwarding did in the store's life, one "name value"
    /// line per counter (journals_removed, topics_pruned, bytes_reclaimed,
    /// ...).
    ///
    /// With --prometheus, print instead the store's counters (what the
    /// sweep and the outbox did) and its size (topics, journals, files,
    /// directories, bytes) in the Prometheus text format, for
    /// node_exporter's textfile collector.
    Stat {
        /// Only this topic and those below it.
        #[arg(conflicts_with = "prometheus")]
        topic: Option<String>,
        /// Print one JSON object per topic instead of the table.
        #[arg(long, conflicts_with = "prometheus")]
        json: bool,
        /// Print the store's counters and size in the Prometheus text
        /// format instead of the table.
        #[arg(long)]
        prometheus: bool,
        /// Write to FILE instead of standard output, atomically (a
        /// temporary file in the same directory, then a rename), so that a
        /// reader never sees half of it.
        #[arg(long, value_name = "FILE", requires = "prometheus")]
        output: Option<PathBuf>,
    },
    /// Check the installation's file system: print the file system the
    /// store is on, the mode chosen (shared on FUSE and NFS mounts, see
    /// KN_SHARED) and, on a GlusterFS mount, each mount and volume setting
    /// shared mode needs (ok, WRONG or unverified). Exits 1 when a setting
    /// is wrong.
    ///
    /// With --url, check a running server instead: its self-test
    /// (URL?do_method=test), one line per check; exits 0 only when every
    /// check passed, 1 when one failed, 75 when the server cannot be
    /// reached or answers an error, 69 when the page is no self-test (a
    /// health check: `kn doctor --url http://localhost/kn`).
    Doctor {
        /// The server's /kn URL (http:// only).
        #[arg(long, value_name = "URL")]
        url: Option<String>,
    },
    /// Compact topics: rewrite sealed segments without superseded records
    /// and events expired longer than KN_EXPIRED_GRACE; journals also apply
    /// retention. Safe while the server runs.
    Compact {
        /// Only this topic (default: every topic).
        topic: Option<String>,
    },
    /// Sweep the whole store once (for cron): remove journals stale
    /// longer than KN_JOURNAL_GRACE with the routes into them and their
    /// announcement, and topics empty (no event, route or subtopic) and
    /// untouched longer than KN_TOPIC_GRACE. Safe while the server runs.
    Gc {
        /// Use this grace period (seconds) for both instead; 0 removes
        /// whatever is stale or empty now.
        #[arg(long, value_name = "SECONDS")]
        grace: Option<u64>,
    },
    /// Check the CRC of every record of every topic. Exits 1 when a bad
    /// record is found, listing each (segment file, offset, why); the
    /// records after a bad one are read and counted all the same.
    Verify {
        /// Then truncate torn tails (what the next writer would do) and
        /// verify again. A corrupt record in the middle of a log is
        /// reported, never silently cut.
        #[arg(long)]
        repair: bool,
    },
    /// Import a legacy mod_pubsub kn_events tree: every event (expired ones
    /// too, for duplicate suppression), route, subtopic announcement,
    /// journal heartbeat and server name. Safe to rerun: nothing is
    /// imported twice.
    ImportLegacy {
        /// The legacy kn_events directory.
        dir: PathBuf,
    },
    /// List, add or remove the URLs this server is known by: an absolute
    /// URL starting with one of them names a local topic, so a route to
    /// it is delivered here. KN_SERVER_URL (or serve's --public-url) is
    /// always one; the others live in the store's .names: pinned (added
    /// here), serve's own, and this machine's URLs that requests came by
    /// (at most KN_MAX_NAMES). The list prints each name, a tab, and where
    /// it came from.
    Names {
        #[command(subcommand)]
        action: Option<NamesAction>,
    },
    /// Print every event of every topic (or of TOPIC and below), reserved
    /// topics included. json: {"topic": T, "event": {...}} per line;
    /// simple and text: each event with an extra kn_export_topic element.
    Export {
        /// Only this topic and those below it.
        topic: Option<String>,
        /// Output format.
        #[arg(long, value_enum, default_value = "json")]
        format: EventFormat,
        /// Include expired events not yet reclaimed by compaction.
        #[arg(long)]
        expired: bool,
    },
}

/// The `kn token` options.
#[derive(clap::Args, Debug)]
struct TokenArgs {
    /// The user (`sub`); without it the token is a capability for
    /// exactly its --read, --post, ... patterns.
    #[arg(long)]
    user: Option<String>,
    /// Groups of the user, besides those of the rules file (comma-separated or repeated).
    #[arg(long, value_delimiter = ',')]
    groups: Vec<String>,
    /// Topic patterns the token may read (repeat for several); any of
    /// --read, --post, --route, --delete, --replay narrows the token to them.
    #[arg(long, value_name = "PATTERN")]
    read: Vec<String>,
    /// Topic patterns the token may post to.
    #[arg(long, value_name = "PATTERN")]
    post: Vec<String>,
    /// Topic patterns the token may route to.
    #[arg(long, value_name = "PATTERN")]
    route: Vec<String>,
    /// Topic patterns whose routes the token may delete.
    #[arg(long, value_name = "PATTERN")]
    delete: Vec<String>,
    /// Journals the token may replay.
    #[arg(long, value_name = "PATTERN")]
    replay: Vec<String>,
    /// How long the token is valid: 90s, 15m, 1h, 7d.
    #[arg(long, default_value = "1h")]
    ttl: String,
}

#[derive(Subcommand, Debug)]
enum NamesAction {
    /// Print every name, this server's URL first (the default action).
    List,
    /// Add a name, e.g. http://alias.example.org/kn.
    Add {
        /// The absolute http:// or https:// URL.
        url: String,
    },
    /// Remove a name from .names.
    Remove {
        /// The URL, exactly as listed.
        url: String,
    },
}

const AFTER_HELP: &str = "\
Exit status: 0 on success, 1 when verify found bad records, 64 for a bad
command line, 66 for a missing input directory, 75 for a temporary failure
(I/O, disk full), 78 for a malformed KN_* variable.

Examples:
  kn --root /var/lib/kn_events topics
  kn events /what/chat --format json --max-n 5
  kn tail -f /who/anna/kn_journal
  kn stat /what
  kn stat --prometheus --output /var/lib/node_exporter/textfile/kn.prom
  kn verify --repair
  kn doctor --url http://localhost/kn      # health check: 0 when every self-test passed
  kn gc --grace 0                          # remove whatever is stale now
  kn import-legacy /var/www/kn_events      # rerun at will
  kn names add http://alias.example.org/kn
  kn export > backup.jsonl
  kn token --user anna --groups staff --read '/who/anna/**' --ttl 1h

  # crontab: compact every night, quiet unless something fails
  15 3 * * * kn --root /var/lib/kn_events compact
  # crontab: figures for node_exporter's textfile collector, every minute
  * * * * * kn --root /var/lib/kn_events stat --prometheus --output /var/lib/node_exporter/textfile/kn.prom
  # crontab: sweep stale journals and empty topics every 10 minutes
  */10 * * * * kn --root /var/lib/kn_events gc";

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    match run(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("kn: {err}");
            ExitCode::from(err.exit_code())
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode, SensorError> {
    if let Command::Doctor { url: Some(url) } = &cli.command {
        // A server's self-test: no store of ours is opened.
        let config = Config::new(".").with_env().map_err(|e| SensorError::new(SensorErrorKind::Config, e.to_string()))?;
        let passed = admin::selftest::check_server(&mut std::io::stdout().lock(), url, &config)?;
        return Ok(if passed { ExitCode::SUCCESS } else { ExitCode::from(1) });
    }
    let config = match &cli.root {
        Some(root) => Config::new(root).with_env(),
        None => Config::from_env(),
    }
    .map_err(|e| SensorError::new(SensorErrorKind::Config, e.to_string()))?;
    let store = Store::open_with(config).map_err(|e| SensorError::from_journal(e, "cannot open the event store"))?;
    let summaries = cli.verbose || std::io::stdout().is_terminal();
    let mut out = std::io::stdout().lock();
    let result = match cli.command {
        Command::Topics { all } => {
            for t in admin::topics(&store, all)? {
                writeln!(out, "{t}").map_err(write_error)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Events { topic, format, max_n, expired } => {
            let topic = parse_topic(&topic)?;
            let mut events = if expired {
                store.stored_events(&topic)
            } else {
                store.events(&topic, &Selection { max_n, ..Selection::all() }).map(|s| s.events)
            }
            .map_err(|e| SensorError::from_journal(e, &format!("cannot read '{topic}'")))?;
            if let Some(n) = max_n {
                events.drain(..events.len().saturating_sub(n));
            }
            for e in &events {
                admin::write_event(&mut out, e, format, None).map_err(write_error)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Routes { topic, all } => {
            let topic = parse_topic(&topic)?;
            let routes = admin::routes::list(&store, &topic, all)?;
            for r in &routes {
                writeln!(out, "{}", admin::route_line(r)).map_err(write_error)?;
            }
            out.flush().map_err(write_error)?;
            for poisoned in routes.iter().filter_map(|r| admin::routes::poisoned(&store, r)) {
                eprintln!("kn: {}", poisoned.note(&store));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Receipts { topic, kn_id } => {
            for line in admin::receipts::lines(&store, &parse_topic(&topic)?, kn_id.as_bytes())? {
                writeln!(out, "{line}").map_err(write_error)?;
            }
            out.flush().map_err(write_error)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Tail { follow, lines, format, topic } => tail(&store, &mut out, &parse_topic(&topic)?, follow, lines, format),
        Command::Stat { prometheus: true, output, .. } => {
            let page = Exposition::of_store(&store).map_err(|e| SensorError::from_journal(e, "cannot read the store's figures"))?;
            match output {
                Some(path) => admin::write_atomically(&path, page.as_str().as_bytes())?,
                None => out.write_all(page.as_str().as_bytes()).map_err(write_error)?,
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Stat { topic, json, .. } => {
            let topics = all_topics(&store, topic.as_deref())?;
            let rows = admin::stats(&store, &topics)?;
            let rows: Vec<_> = rows.into_iter().filter(|(t, s)| !t.is_root() || s.segments > 0).collect();
            if json {
                for (t, s) in &rows {
                    let line = serde_json::json!({"topic": t.as_str(), "events": s.events, "records": s.records, "bytes": s.bytes, "segments": s.segments});
                    writeln!(out, "{line}").map_err(write_error)?;
                }
            } else {
                admin::write_stats(&mut out, &rows).map_err(write_error)?;
                if topic.is_none() {
                    let counters = store.counters().map_err(|e| SensorError::from_journal(e, "cannot read the counters"))?;
                    admin::write_counters(&mut out, &counters).map_err(write_error)?;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Gc { grace } => {
            // Status events a killed route request held for a population.
            let _ = store.complete_held_statuses();
            // Escalations of unread events that are due (docs/PRESENCE.md).
            let _ = store.complete_unread_escalations();
            let report = store
                .sweep_all(grace.map(Duration::from_secs))
                .map_err(|e| SensorError::from_journal(e, "cannot sweep the store"))?;
            if summaries {
                writeln!(
                    out,
                    "swept {} topics: removed {} stale journals, {} routes into them and {} empty topics; reclaimed {} bytes",
                    report.visited, report.journals_removed, report.routes_removed, report.topics_pruned, report.bytes_reclaimed
                )
                .map_err(write_error)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Compact { topic } => {
            let listed = topic.is_none();
            let topics = match topic {
                Some(t) => vec![parse_topic(&t)?],
                None => all_topics(&store, None)?,
            };
            let bar = progress(topics.len() as u64);
            let (mut before, mut after) = (0, 0);
            for t in &topics {
                bar.set_message(t.to_string());
                let report = match store.compact(t) {
                    Ok(report) => report,
                    // Listed, then removed by the sweep: nothing to compact.
                    Err(e) if listed && e.kind() == kn_journal::ErrorKind::BadTopic => Default::default(),
                    Err(e) => return Err(SensorError::from_journal(e, &format!("cannot compact '{t}'"))),
                };
                before += report.records_before;
                after += report.records_after;
                bar.inc(1);
            }
            bar.finish_and_clear();
            if summaries {
                writeln!(out, "compacted {} topics: {before} records before, {after} after", topics.len()).map_err(write_error)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Verify { repair } => verify(&store, &mut out, repair, summaries),
        Command::Doctor { .. } => {
            let wrong = admin::write_doctor(&mut out, &store).map_err(write_error)?;
            Ok(if wrong { ExitCode::from(1) } else { ExitCode::SUCCESS })
        }
        Command::ImportLegacy { dir } => {
            let mut bar = progress(0);
            let report = legacy::import(&store, &dir, &mut bar)?;
            bar.finish_and_clear();
            for w in &report.warnings {
                eprintln!("kn: warning: {w}");
            }
            if summaries {
                writeln!(
                    out,
                    "imported {} events ({} of them expired) from {} topic directories; {} already there, {} named in .index but gone, {} heartbeats, {} server names, {} warnings",
                    report.imported,
                    report.expired,
                    report.topics,
                    report.already,
                    report.gone,
                    report.heartbeats,
                    report.names,
                    report.warnings.len()
                )
                .map_err(write_error)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Token(args) => {
            let ttl = admin::token::parse_ttl(&args.ttl).map_err(|e| SensorError::new(SensorErrorKind::Usage, e))?;
            let mut grants = std::collections::BTreeMap::new();
            for (op, patterns) in [("read", args.read), ("post", args.post), ("route", args.route), ("delete", args.delete), ("replay", args.replay)] {
                if !patterns.is_empty() {
                    grants.insert(op.to_string(), patterns);
                }
            }
            let spec = admin::token::TokenSpec {
                user: args.user,
                groups: args.groups,
                grants,
                ttl,
                issuer: store.config().token_issuer.clone(),
                audience: store.config().token_audience.clone(),
            };
            let token = admin::token::mint(&store.config().root, &spec)?;
            writeln!(out, "{token}").map_err(write_error)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Names { action } => names(&store, &mut out, action.unwrap_or(NamesAction::List)),
        Command::Export { topic, format, expired } => {
            for t in all_topics(&store, topic.as_deref())? {
                let events = if expired { store.stored_events(&t) } else { store.events(&t, &Selection::all()).map(|s| s.events) }
                    .map_err(|e| SensorError::from_journal(e, &format!("cannot read '{t}'")))?;
                for e in &events {
                    admin::write_event(&mut out, e, format, Some(&t)).map_err(write_error)?;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    };
    match result {
        // A closed pipe (`kn export | head`) is the reader's choice.
        Err(e) if e.message() == BROKEN_PIPE => Ok(ExitCode::SUCCESS),
        other => other,
    }
}

const BROKEN_PIPE: &str = "standard output closed";

fn write_error(e: std::io::Error) -> SensorError {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        return SensorError::new(SensorErrorKind::TempFail, BROKEN_PIPE);
    }
    SensorError::new(SensorErrorKind::TempFail, format!("cannot write standard output: {e}"))
}

fn parse_topic(name: &str) -> Result<Topic, SensorError> {
    Topic::parse(name).map_err(|e| SensorError::usage(e.to_string()))
}

/// The root topic and every topic of the store (reserved ones included),
/// or `within` and the topics below it.
fn all_topics(store: &Store, within: Option<&str>) -> Result<Vec<Topic>, SensorError> {
    let within = within.map(parse_topic).transpose()?;
    let mut topics = vec![Topic::root()];
    topics.extend(admin::topics(store, true)?);
    Ok(match within {
        Some(w) => topics.into_iter().filter(|t| t.is_within(&w) && (!t.is_root() || w.is_root())).collect(),
        None => topics,
    })
}

fn progress(len: u64) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}") {
        bar.set_style(style);
    }
    bar
}

fn tail(store: &Store, out: &mut dyn Write, topic: &Topic, follow: bool, lines: usize, format: EventFormat) -> Result<ExitCode, SensorError> {
    let selection = Selection { max_n: Some(lines), ..Selection::none() };
    let read_error = |e| SensorError::from_journal(e, &format!("cannot read '{topic}'"));
    if !follow {
        for e in &store.events(topic, &selection).map_err(read_error)?.events {
            admin::write_event(out, e, format, None).map_err(write_error)?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let start = store.tunnel(topic, &selection).map_err(read_error)?;
    let mut tunnel = start.tunnel;
    for e in &start.initial.events {
        admin::write_event(out, e, format, None).map_err(write_error)?;
    }
    out.flush().map_err(write_error)?;
    loop {
        for e in tunnel.wait(store, Duration::from_secs(10)).map_err(read_error)? {
            admin::write_event(out, &e, format, None).map_err(write_error)?;
        }
        out.flush().map_err(write_error)?;
    }
}

fn names(store: &Store, out: &mut dyn Write, action: NamesAction) -> Result<ExitCode, SensorError> {
    match action {
        NamesAction::List => {
            // The first is the server's URL; each with where it came from.
            let entries = store.server_name_entries();
            for name in store.server_names() {
                let from = match entries.iter().find(|e| e.url == name).map(|e| &e.kind) {
                    None if store.config().server_url.as_deref() == Some(name.as_str()) => "KN_SERVER_URL".to_string(),
                    None => "default".to_string(),
                    Some(kn_journal::internal::NameKind::Pinned) => "pinned".to_string(),
                    Some(kn_journal::internal::NameKind::Server(host)) => format!("serve on {host}"),
                    Some(kn_journal::internal::NameKind::Learned) => "learned from a request".to_string(),
                };
                writeln!(out, "{name}\t{from}").map_err(write_error)?;
            }
        }
        NamesAction::Add { url } => store.add_server_name(&url).map_err(|e| match e.kind() {
            kn_journal::ErrorKind::BadRequest => SensorError::usage(e.to_string()),
            _ => SensorError::from_journal(e, "cannot add the name"),
        })?,
        NamesAction::Remove { url } => {
            if !store.remove_server_name(&url).map_err(|e| SensorError::from_journal(e, "cannot remove the name"))? {
                return Err(SensorError::usage(format!("'{url}' is not in .names (see kn names list)")));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn verify(store: &Store, out: &mut dyn Write, repair: bool, summaries: bool) -> Result<ExitCode, SensorError> {
    let check = || store.verify().map_err(|e| SensorError::from_journal(e, "cannot verify the store"));
    // No count known in advance: a spinner.
    let bar = if std::io::stderr().is_terminal() { indicatif::ProgressBar::new_spinner() } else { indicatif::ProgressBar::hidden() };
    bar.set_message("verifying");
    bar.enable_steady_tick(Duration::from_millis(200));
    let mut report = check()?;
    if repair && !report.problems.is_empty() {
        let touched = store.repair().map_err(|e| SensorError::from_journal(e, "cannot repair the store"))?;
        bar.set_message("verifying again");
        let again = check()?;
        bar.finish_and_clear();
        if summaries {
            writeln!(out, "repaired {touched} topics; {} bad records before, {} after", report.problems.len(), again.problems.len())
                .map_err(write_error)?;
        }
        report = again;
    }
    bar.finish_and_clear();
    for p in &report.problems {
        writeln!(out, "BAD {} at offset {}: {}", p.path.display(), p.offset, p.reason).map_err(write_error)?;
    }
    if !report.problems.is_empty() {
        if summaries {
            writeln!(out, "{} bad records; {} good records verified", report.problems.len(), report.records).map_err(write_error)?;
        }
        return Ok(ExitCode::from(1));
    }
    if summaries {
        writeln!(out, "ok: {} records verified", report.records).map_err(write_error)?;
    }
    for warning in name_warnings(store) {
        writeln!(out, "WARN {warning}").map_err(write_error)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The names `serve` on this host recorded where no server answers now
/// (a `serve` that moved or stopped: routes to them stay local for the
/// tools, though no client reaches them any more).
fn name_warnings(store: &Store) -> Vec<String> {
    let host = kn_journal::internal::own_host_name();
    let mut warnings = Vec::new();
    for name in store.server_name_entries() {
        let kn_journal::internal::NameKind::Server(by) = &name.kind else { continue };
        if by != host {
            continue;
        }
        let Some(authority) = name.url.split_once("://").map(|(_, rest)| rest.split('/').next().unwrap_or("")) else { continue };
        let addr = if authority.contains(':') { authority.to_string() } else { format!("{authority}:80") };
        let Some(socket) = std::net::ToSocketAddrs::to_socket_addrs(&addr).ok().and_then(|mut a| a.next()) else { continue };
        if std::net::TcpStream::connect_timeout(&socket, Duration::from_millis(300)).is_err() {
            warnings.push(format!(
                "server name {} was recorded by serve on this host, but no server answers there now (kn names remove {} if it moved for good)",
                name.url, name.url
            ));
        }
    }
    warnings
}
