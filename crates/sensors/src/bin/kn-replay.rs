//! kn-replay: re-post a journal's events to the topics they came from,
//! keeping their spacing (PROTOCOL.md 3.7; pubsub.cgi starts it for
//! do_method=replay).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use kn_journal::access::{Principal, HANDOVER_VARIABLE};
use kn_journal::{Config, Store, Topic};
use kn_sensors::replay::{self, ReplayOptions};
use kn_sensors::{exit, usage_error, SensorError, SensorErrorKind};

/// Replay a journal: its events, ordered by kn_time_t, are re-posted to
/// the topic each was routed from (kn_routed_from when it names a topic of
/// this store, else kn_route_location without its /kn_routes/<id> tail,
/// which may be a topic URL on another server), each with a new kn_id
/// (PREFIX followed by the old id) so that duplicate suppression keeps
/// them. The first goes at once, each later one when its original
/// distance from the first, divided by --warp, has passed. Re-posted
/// events get a fresh kn_time_t; an expiry keeps the event's original
/// lifetime (kn_expires=+N).
#[derive(Parser, Debug)]
#[command(name = "kn-replay", version, after_long_help = AFTER_HELP)]
// pub(crate): packaging/docgen renders it (man page, completions).
pub(crate) struct Cli {
    /// The event store (default: $KN_EVENTS, else ./kn_events).
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,

    /// Speed-up: the original spacing is divided by F (10 = ten times as
    /// fast, "inf" = all at once).
    #[arg(long, value_name = "F", default_value_t = 1.0)]
    warp: f64,

    /// Print where and when each event would go; post nothing.
    #[arg(short = 'n', long)]
    dry_run: bool,

    /// Put before each old kn_id to make the new one (default:
    /// replay-<epoch seconds>-, different for every run).
    #[arg(long, value_name = "PREFIX")]
    prefix: Option<String>,

    /// User for re-posting to an authenticating server (HTTP basic).
    #[arg(long, value_name = "USER")]
    user: Option<String>,

    /// Password for --user (default: $KN_REPLAY_PASSWORD, which keeps it
    /// out of the process list).
    #[arg(long, value_name = "PASSWORD")]
    password: Option<String>,

    /// Re-post to local topics as USER of the access rules
    /// ($KN_ACCESS_RULES; an empty USER is anonymous): a post USER may not
    /// make fails. pubsub.cgi hands over the whole principal of the
    /// request instead (its user and what narrows it: a token's claim),
    /// in $KN_REPLAY_PRINCIPAL; the two cannot be given together.
    #[arg(long, value_name = "USER")]
    as_user: Option<String>,

    /// Print nothing on success, not even on a terminal.
    #[arg(short, long)]
    quiet: bool,

    /// Print "ready" on standard output once the replay holds its slot, or
    /// "busy" when KN_MAX_REPLAYS replays already run on the store (for a
    /// program that starts kn-replay in the background, as pubsub.cgi
    /// does).
    #[arg(long)]
    ready: bool,

    /// The journal (or any topic) to replay, e.g. /who/anna/kn_journal.
    #[arg(value_name = "JOURNAL")]
    journal: String,
}

const AFTER_HELP: &str = "\
A progress bar is drawn when standard error is a terminal; from cron the
command prints nothing unless something failed.

At most KN_MAX_REPLAYS (default 8) replays run at once on a store: each
holds a slot file under <store>/.replays locked while it runs; when all are
held, kn-replay exits with status 75. A replay stops after
KN_REPLAY_MAX_TIME seconds (default 3600): events due later are not
posted, and the exit status is 69.

Exit status: 0 when every event was re-posted (or skipped for lack of an
origin), 64 for a bad command line, 69 when some posts were refused, 75 for
a temporary failure, 78 for a malformed KN_* variable.

Examples:
  kn-replay --root /var/lib/kn_events /who/anna/kn_journal
  kn-replay --warp 60 --dry-run /who/anna/kn_journal   # an hour in a minute, planned only
  KN_REPLAY_PASSWORD=secret kn-replay --user anna --warp inf /who/anna/kn_journal";

fn main() -> ExitCode {
    match Cli::try_parse() {
        Ok(cli) => exit("kn-replay", run(cli)),
        Err(e) => usage_error(e),
    }
}

fn run(cli: Cli) -> Result<(), SensorError> {
    let journal = Topic::parse(&cli.journal).map_err(|e| SensorError::usage(e.to_string()))?;
    let as_user = principal(cli.as_user.as_deref())?;
    let config = match cli.root {
        Some(root) => Config::new(root).with_env(),
        None => Config::from_env(),
    }
    .map_err(|e| SensorError::new(SensorErrorKind::Config, e.to_string()))?;
    let store = Store::open_with(config).map_err(|e| SensorError::from_journal(e, "cannot open the event store"))?;
    let ready = |line: &str| {
        if cli.ready {
            use std::io::Write;
            // Whoever started us may have gone: nothing to tell then.
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}").and_then(|()| out.flush());
        }
    };
    let _slot = if cli.dry_run {
        None
    } else {
        match replay::take_slot(&store) {
            Ok(slot) => Some(slot),
            Err(err) => {
                if err.kind() == SensorErrorKind::TempFail {
                    ready("busy");
                }
                return Err(err);
            }
        }
    };
    ready("ready");
    let mut options = ReplayOptions {
        warp: cli.warp,
        dry_run: cli.dry_run,
        user: cli.user,
        password: cli.password.or_else(|| std::env::var("KN_REPLAY_PASSWORD").ok()),
        progress: !cli.quiet && !cli.dry_run,
        max_time: Some(store.config().replay_max_time),
        as_user,
        ..ReplayOptions::default()
    };
    if let Some(prefix) = cli.prefix {
        options.prefix = prefix;
    }
    if cli.dry_run {
        for step in replay::plan(&store, &journal, &options)? {
            let id = String::from_utf8_lossy(step.event.id().unwrap_or(b""));
            match &step.origin {
                Some(origin) => println!("+{:.3}s\t{origin}\t{id}", step.delay.as_secs_f64()),
                None => println!("+{:.3}s\t-\t{id}\t(no origin: skipped)", step.delay.as_secs_f64()),
            }
        }
        return Ok(());
    }
    let report = replay::run(&store, &journal, &options)?;
    if !cli.quiet && std::io::stderr().is_terminal() {
        eprintln!(
            "kn-replay: {} events: {} posted, {} duplicates, {} without origin, {} failed",
            report.events,
            report.posted,
            report.duplicates,
            report.skipped,
            report.failures.len()
        );
    }
    for failure in &report.failures {
        eprintln!("kn-replay: {failure}");
    }
    if !report.failures.is_empty() {
        return Err(SensorError::new(SensorErrorKind::Unavailable, format!("{} of {} posts failed", report.failures.len(), report.events)));
    }
    Ok(())
}

/// Whom the re-posts are judged as: the principal pubsub.cgi handed over
/// in $KN_REPLAY_PRINCIPAL, else `--as-user`, else no one (the file
/// system's rights, as every local tool). A handover that cannot be read
/// stops the replay (exit 78): never the tool's own rights instead.
fn principal(as_user: Option<&str>) -> Result<Option<Principal>, SensorError> {
    let Some(text) = std::env::var_os(HANDOVER_VARIABLE) else { return Ok(as_user.map(Principal::user)) };
    if as_user.is_some() {
        return Err(SensorError::usage(format!("--as-user and ${HANDOVER_VARIABLE} cannot be given together")));
    }
    let text = text.to_str().ok_or_else(|| SensorError::new(SensorErrorKind::Config, format!("${HANDOVER_VARIABLE} is not UTF-8")))?;
    let who = Principal::from_handover(text).map_err(|e| SensorError::new(SensorErrorKind::Config, e.to_string()))?;
    Ok(Some(who))
}
