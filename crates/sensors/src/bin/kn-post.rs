//! kn-post: standard input becomes the payload of one event.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use kn_sensors::{elements_from_args, exit, usage_error, SensorError, Target};

/// Post one event: standard input is its payload, NAME=VALUE arguments are
/// its other elements.
///
/// Standard input is read to its end and becomes kn_payload, byte for
/// byte; it is not read when a kn_payload=... argument or --payload gives
/// the payload. Without kn_id the event gets a fresh one; posting again
/// with the same kn_id replaces the event on an ordinary topic, and an
/// identical repost is a duplicate (stored once). The event's kn_id is
/// printed on standard output.
#[derive(Parser, Debug)]
#[command(name = "kn-post", version, after_long_help = AFTER_HELP)]
// pub(crate): packaging/docgen renders it (man page, completions).
pub(crate) struct Cli {
    /// The event store (default: $KN_EVENTS, else ./kn_events). Ignored for
    /// URL targets.
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,

    /// The payload, instead of reading standard input.
    #[arg(short = 'm', long, value_name = "TEXT")]
    payload: Option<String>,

    /// Print nothing on success.
    #[arg(short, long)]
    quiet: bool,

    /// Where to post: a topic of the local store (/what/chat) or the
    /// absolute http:// URL of a topic on any PubSub server
    /// (http://host/kn/what/chat).
    #[arg(value_name = "TARGET")]
    target: String,

    /// Elements of the event (kn_id=42, kn_expires=+60, subject=hello).
    #[arg(value_name = "NAME=VALUE")]
    elements: Vec<String>,
}

const AFTER_HELP: &str = "\
Exit status: 0 when the event is stored (or was already), 64 for a bad
command line, 65 when the target refuses the event as malformed or too
large, 69 when it refuses for good, 75 for a temporary failure (disk full,
server unreachable or 5xx), 78 for a malformed KN_* variable.

Examples:
  echo hello | kn-post /what/chat
  df -h | kn-post --root /var/lib/kn_events /who/ops/disk kn_id=df-$(hostname)
  kn-post -m 'backup done' http://pubsub.example/kn/what/ops host=$(hostname)

  # crontab: the load average every 5 minutes, one event per host (replaced)
  */5 * * * * uptime | kn-post -q --root /var/lib/kn_events /what/load kn_id=$(hostname)";

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    exit("kn-post", run(cli))
}

fn run(cli: Cli) -> Result<(), SensorError> {
    let mut event = elements_from_args(&cli.elements)?;
    let target = Target::parse(&cli.target, cli.root)?;
    if let Some(payload) = cli.payload {
        event.set("kn_payload", payload);
    } else if !event.contains("kn_payload") {
        let mut payload = Vec::new();
        std::io::stdin().read_to_end(&mut payload).map_err(|e| SensorError::read("standard input", e))?;
        event.set("kn_payload", payload);
    }
    if !event.contains("kn_id") {
        // Chosen here rather than by the store so that a remote post can
        // print it too.
        event.set("kn_id", kn_journal::fresh_id());
    }
    let posted = target.post(event)?;
    if !cli.quiet {
        println!("{}", String::from_utf8_lossy(&posted.id));
    }
    Ok(())
}
