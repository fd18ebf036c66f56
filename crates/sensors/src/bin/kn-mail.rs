//! kn-mail: one mail message on standard input becomes one event.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use kn_sensors::{elements_from_args, exit, mail, usage_error, SensorError, Target};

/// Post one mail message, read from standard input, as an event.
///
/// The message (as procmail or a .forward pipe delivers it; an mbox
/// "From " line is skipped) is parsed as RFC 5322/MIME: every header field
/// becomes an element (From, To, Subject, Date, Message-ID, ...; unfolded,
/// RFC 2047 encoded words decoded to UTF-8; repeated fields joined by
/// newlines; trace fields such as Received left out), the text/plain body
/// (or the HTML body as text) becomes kn_payload, and each other part is
/// described in an attachment.N or alternative.N element
/// ("name; type; size bytes"). The Message-ID gives the kn_id, so a message
/// delivered twice is stored once.
#[derive(Parser, Debug)]
#[command(name = "kn-mail", version, after_long_help = AFTER_HELP)]
// pub(crate): packaging/docgen renders it (man page, completions).
pub(crate) struct Cli {
    /// The event store (default: $KN_EVENTS, else ./kn_events). Ignored for
    /// URL targets.
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,

    /// Print what was posted on standard error.
    #[arg(short, long)]
    verbose: bool,

    /// Where to post: a topic of the local store (/what/mail) or the
    /// absolute http:// URL of a topic on any PubSub server
    /// (http://host/kn/what/mail).
    #[arg(value_name = "TARGET")]
    target: String,

    /// Extra elements added to the event, such as kn_expires=+86400.
    #[arg(value_name = "NAME=VALUE")]
    elements: Vec<String>,
}

const AFTER_HELP: &str = "\
Exit status (sysexits, as mail systems expect):
  0   the event is stored (or was already: a redelivery)
  64  bad command line (bad topic name or URL)
  65  unusable input: empty, or not a mail message
  69  the target refuses for good (stale journal, 403/404)
  73  the event store cannot be written for lack of permission
  75  temporary failure: disk full, I/O error, server unreachable or 5xx;
      procmail and sendmail keep the message and retry later
  78  a malformed KN_* environment variable

Examples:
  # ~/.procmailrc: post every message to /what/mail, keep it in the inbox too
  :0 wc
  | kn-mail --root /var/lib/kn_events /what/mail

  # ~/.forward (sendmail, postfix, exim)
  \"|/usr/local/bin/kn-mail http://pubsub.example/kn/what/mail\"

  # by hand
  kn-mail /what/mail kn_expires=+604800 < message.eml";

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    exit("kn-mail", run(cli))
}

fn run(cli: Cli) -> Result<(), SensorError> {
    let extra = elements_from_args(&cli.elements)?;
    let target = Target::parse(&cli.target, cli.root)?;
    let mut raw = Vec::new();
    std::io::stdin().read_to_end(&mut raw).map_err(|e| SensorError::read("standard input", e))?;
    let mut event = mail::event_from_message(&raw)?;
    for (name, value) in extra.elements() {
        event.set(name, value);
    }
    let subject = event.get_str("Subject").unwrap_or_default();
    let posted = target.post(event)?;
    if cli.verbose {
        let what = if posted.duplicate { "already stored" } else { "posted" };
        eprintln!("kn-mail: {what} '{}' ({}) to {target}", subject, String::from_utf8_lossy(&posted.id));
    }
    Ok(())
}
