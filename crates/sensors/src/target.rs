//! Where a sensor posts: a topic of the local store or a topic URL on any
//! PubSub server (PROTOCOL.md section 5), and the sensor error type with
//! its sysexits(3) exit codes.

use std::fmt;
use std::path::PathBuf;
use std::process::ExitCode;

use kn_journal::{Config, Error as JournalError, ErrorKind as JournalKind, Event, HttpRemote, Remote, Store, Topic};

/// Where a sensor's events go.
///
/// ```
/// use kn_sensors::Target;
///
/// let dir = tempfile::tempdir().unwrap();
/// let target = Target::parse("/what/mail", Some(dir.path().into())).unwrap();
/// assert_eq!(target.to_string(), "/what/mail");
/// let event = kn_journal::Event::from_pairs([("kn_id", "m1"), ("kn_payload", "hi")]);
/// assert!(!target.post(event.clone()).unwrap().duplicate);
/// assert!(target.post(event).unwrap().duplicate, "the same event again is a duplicate");
///
/// let remote = Target::parse("http://pubsub.example/kn/what/mail", None).unwrap();
/// assert!(matches!(remote, Target::Remote { .. }));
/// ```
// One Target per process: boxing the store would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum Target {
    /// A topic of the local event store, written through kn-journal.
    Local {
        /// The opened store.
        store: Store,
        /// The topic posted to.
        topic: Topic,
    },
    /// An absolute `http://` URL of a topic on a PubSub server, posted to
    /// as a notify.
    Remote {
        /// The topic URL.
        url: String,
        /// The project's one HTTP client, made once from the `KN_*`
        /// settings and used for every event this target posts.
        client: HttpRemote,
    },
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Local { store, topic } => f.debug_struct("Local").field("store", store).field("topic", topic).finish(),
            Target::Remote { url, .. } => f.debug_struct("Remote").field("url", url).finish_non_exhaustive(),
        }
    }
}

/// What a successful post did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Posted {
    /// The event repeated the one stored under its `kn_id` (same
    /// end-to-end elements): nothing was stored or forwarded.
    pub duplicate: bool,
    /// The event's `kn_id` (empty if a remote server did not say).
    pub id: Vec<u8>,
}

impl Target {
    /// Reads a target given on a command line: an absolute `http://` or
    /// `https://` URL is a remote topic; anything else is a topic name of
    /// the local store at `root`, else `$KN_EVENTS`, else `./kn_events`
    /// (the other `KN_*` settings apply too, see `kn_journal::Config`).
    ///
    /// Errors: a bad topic name or an unusable URL (`EX_USAGE`), a
    /// malformed `KN_*` variable (`EX_CONFIG`), a store that cannot be
    /// opened or created (`EX_TEMPFAIL`, `EX_CANTCREAT` for permissions).
    pub fn parse(spec: &str, root: Option<PathBuf>) -> Result<Target, SensorError> {
        let lower = spec.to_ascii_lowercase();
        if lower.starts_with("http://") || lower.starts_with("https://") {
            let rest = &spec[spec.find("://").map_or(0, |i| i + 3)..];
            if rest.is_empty() || rest.starts_with('/') || spec.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(SensorError::usage(format!("bad target URL '{spec}': expected http://host/path-of-topic")));
            }
            let config = Config::from_env().map_err(|e| SensorError::new(SensorErrorKind::Config, e.to_string()))?;
            return Ok(Target::Remote { url: spec.to_string(), client: HttpRemote::from_config(&config) });
        }
        if spec.contains("://") {
            return Err(SensorError::usage(format!(
                "bad target '{spec}': only http:// and https:// URLs or topic names of the local store are targets"
            )));
        }
        let topic = Topic::parse(spec).map_err(|e| SensorError::usage(format!("bad target topic: {e}")))?;
        let config = match root {
            Some(root) => Config::new(root).with_env(),
            None => Config::from_env(),
        }
        .map_err(|e| SensorError::new(SensorErrorKind::Config, e.to_string()))?;
        let store = Store::open_with(config).map_err(|e| SensorError::from_journal(e, "cannot open the event store"))?;
        Ok(Target::Local { store, topic })
    }

    /// Posts `event` as a notify: locally through [`Store::notify`]
    /// (routes fire as for a web client's post), remotely as an HTTP POST of
    /// every element with `do_method=notify` and
    /// `kn_response_format=simple`, whose status event is checked.
    ///
    /// A duplicate (same `kn_id`, same elements, on an ordinary topic) is a
    /// success with [`Posted::duplicate`] set.
    pub fn post(&self, event: Event) -> Result<Posted, SensorError> {
        match self {
            Target::Local { store, topic } => {
                let report = store.notify(topic, event).map_err(|e| SensorError::from_journal(e, &format!("cannot post to '{topic}'")))?;
                Ok(Posted { duplicate: report.duplicate, id: report.id })
            }
            Target::Remote { url, client } => post_remote(client, url, &event),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Local { topic, .. } => write!(f, "{topic}"),
            Target::Remote { url, .. } => f.write_str(url),
        }
    }
}

/// POSTs `event` to the topic URL and reads the simple-format status,
/// through `remote`, the project's one client ([`HttpRemote::from_config`]: the
/// `KN_REMOTE_*` limits and `KN_HTTP_PROXY`, never a proxy from the
/// environment). The URL is the operator's own command-line argument, so
/// the outbound policy (`KN_OUTBOUND`, which guards URLs that clients
/// supply) is not asked; a POST follows no redirect.
fn post_remote(remote: &HttpRemote, url: &str, event: &Event) -> Result<Posted, SensorError> {
    let mut pairs: Vec<(&[u8], &[u8])> = vec![(b"do_method", b"notify"), (b"kn_response_format", b"simple")];
    pairs.extend(event.elements());
    let reply = remote.post_form(url, &pairs).map_err(|e| SensorError::from_journal(e, "cannot post"))?;
    let status = kn_wire::simple::decode_frames(&reply.body)
        .ok()
        .and_then(|events| events.into_iter().find(|e| e.contains(kn_journal::STATUS)));
    let Some(status) = status else {
        let kind = if reply.status >= 500 { SensorErrorKind::TempFail } else { SensorErrorKind::Unavailable };
        return Err(SensorError::new(
            kind,
            format!("'{url}' answered HTTP {} without a PubSub status event (is it a PubSub topic URL?)", reply.status),
        ));
    };
    let line = status.get_str(kn_journal::STATUS).unwrap_or_default();
    let code: u16 = line.split_whitespace().next().and_then(|c| c.parse().ok()).unwrap_or(reply.status);
    let detail = String::from_utf8_lossy(status.payload()).trim().to_string();
    if code != 200 {
        let detail = if detail.is_empty() { String::new() } else { format!(": {detail}") };
        return Err(SensorError::new(kind_of_status(code), format!("'{url}' refused the event with '{line}'{detail}")));
    }
    // The server lists what it wrote ("Wrote to '<topic>' (<id>)"); a
    // duplicate writes nothing.
    Ok(Posted { duplicate: detail.is_empty(), id: event.id().unwrap_or_default().to_vec() })
}

/// The sensor error kind for a PubSub status code.
fn kind_of_status(code: u16) -> SensorErrorKind {
    match code {
        400 | 413 => SensorErrorKind::Data,
        401..=499 => SensorErrorKind::Unavailable,
        _ => SensorErrorKind::TempFail,
    }
}

/// What kind of failure a [`SensorError`] is; each maps to a sysexits(3)
/// exit code, which mail systems read: `75` makes them retry later, any
/// other failure bounces the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SensorErrorKind {
    /// A bad command line: unknown option, bad topic name or URL (64).
    Usage,
    /// The input is unusable: an empty or headerless message, a file that
    /// is not a feed, an event the target rejects as malformed or too
    /// large (65).
    Data,
    /// An input file does not exist or cannot be read (66).
    NoInput,
    /// The target refuses for good: a stale journal, a forbidden topic, a
    /// server saying 403/404 (69).
    Unavailable,
    /// The store cannot be created or written for lack of permission (73).
    CantCreate,
    /// Try again later: disk full, I/O error, server unreachable or failing
    /// with 5xx (75).
    TempFail,
    /// A malformed `KN_*` environment variable (78).
    Config,
}

impl SensorErrorKind {
    /// The sysexits(3) code.
    ///
    /// ```
    /// use kn_sensors::SensorErrorKind;
    /// assert_eq!(SensorErrorKind::TempFail.exit_code(), 75);
    /// assert_eq!(SensorErrorKind::Data.exit_code(), 65);
    /// ```
    pub fn exit_code(self) -> u8 {
        match self {
            SensorErrorKind::Usage => 64,
            SensorErrorKind::Data => 65,
            SensorErrorKind::NoInput => 66,
            SensorErrorKind::Unavailable => 69,
            SensorErrorKind::CantCreate => 73,
            SensorErrorKind::TempFail => 75,
            SensorErrorKind::Config => 78,
        }
    }
}

/// The one error type of the sensors: a kind (and so an exit code) and a
/// message naming the input, topic or URL involved.
#[derive(Debug)]
pub struct SensorError {
    kind: SensorErrorKind,
    message: String,
}

impl SensorError {
    /// An error of `kind` with a complete message.
    pub fn new(kind: SensorErrorKind, message: impl Into<String>) -> SensorError {
        SensorError { kind, message: message.into() }
    }

    /// A bad command line (64).
    pub fn usage(message: impl Into<String>) -> SensorError {
        SensorError::new(SensorErrorKind::Usage, message)
    }

    /// Unusable input (65).
    pub fn data(message: impl Into<String>) -> SensorError {
        SensorError::new(SensorErrorKind::Data, message)
    }

    /// A journal error, its message prefixed with `context`: disk full,
    /// I/O and remote failures are temporary (75); bad names are usage
    /// errors; malformed or oversized events are data errors.
    pub fn from_journal(err: JournalError, context: &str) -> SensorError {
        let kind = match err.kind() {
            JournalKind::BadTopic | JournalKind::ReservedTopic => SensorErrorKind::Usage,
            JournalKind::BadRequest | JournalKind::TooLarge => SensorErrorKind::Data,
            JournalKind::Forbidden | JournalKind::Expired => SensorErrorKind::Unavailable,
            JournalKind::Io if err.message().contains("ermission denied") => SensorErrorKind::CantCreate,
            _ => SensorErrorKind::TempFail,
        };
        SensorError::new(kind, format!("{context}: {err}"))
    }

    /// An I/O error reading `what` (a file name or "standard input").
    pub fn read(what: &str, err: std::io::Error) -> SensorError {
        let kind = match err.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => SensorErrorKind::NoInput,
            _ => SensorErrorKind::TempFail,
        };
        SensorError::new(kind, format!("cannot read {what}: {err}"))
    }

    /// The kind.
    pub fn kind(&self) -> SensorErrorKind {
        self.kind
    }

    /// The sysexits(3) exit code: 75 means "try again later".
    pub fn exit_code(&self) -> u8 {
        self.kind.exit_code()
    }

    /// The message (also what `Display` prints).
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for SensorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SensorError {}

/// Ends a sensor's `main`: prints `program: message` on stderr for an
/// error and returns its exit code.
pub fn exit(program: &str, result: Result<(), SensorError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("{program}: {err}");
            ExitCode::from(err.exit_code())
        }
    }
}

/// Ends a sensor's `main` when its command line did not parse: clap's own
/// output for `--help`/`--version` (exit 0), else its message with
/// EX_USAGE (64).
pub fn usage_error(e: clap::Error) -> ExitCode {
    let code = if e.use_stderr() { 64 } else { 0 };
    let _ = e.print();
    ExitCode::from(code)
}

/// Parses `name=value` command-line arguments into elements (the value
/// may be empty and may contain `=`; the name may not be empty).
///
/// ```
/// let e = kn_sensors::elements_from_args(["kn_id=42", "note=a=b", "empty="]).unwrap();
/// assert_eq!(e.get("note"), Some(&b"a=b"[..]));
/// assert_eq!(e.get("empty"), Some(&b""[..]));
/// assert!(kn_sensors::elements_from_args(["novalue"]).is_err());
/// ```
pub fn elements_from_args<I, S>(args: I) -> Result<Event, SensorError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut event = Event::new();
    for arg in args {
        let arg = arg.as_ref();
        match arg.split_once('=') {
            Some((name, value)) if !name.is_empty() => {
                event.set(name, value);
            }
            _ => return Err(SensorError::usage(format!("bad element '{arg}': expected name=value"))),
        }
    }
    Ok(event)
}
