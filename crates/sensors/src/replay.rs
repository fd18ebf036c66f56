//! The replay sensor (PROTOCOL.md 3.7 and 5): re-post a journal's events
//! to the topics they were routed from, keeping their original spacing.
//!
//! The events of the journal are ordered by `kn_time_t`. Each goes back to
//! the topic it came from: `kn_routed_from` when it names a topic of this
//! store, else `kn_route_location` without its `/kn_routes/<route-id>`
//! tail (a local topic or an absolute URL of another PubSub server),
//! else `kn_routed_from` as a remote URL. An event with none of these is
//! skipped; a URL must be allowed by the store's outbound policy
//! (`KN_OUTBOUND`). The re-posted event has the hop-by-hop elements removed, a new
//! `kn_id` (the prefix followed by the old id, so duplicate suppression
//! keeps it), a fresh `kn_time_t`, and its lifetime (`kn_expires` minus
//! `kn_time_t`) kept as a relative `kn_expires=+N`. The first event is
//! posted at once, each later one when its original distance from the
//! first, divided by `warp`, has passed.
//!
//! `kn-replay` runs this from a shell or cron, and `pubsub.cgi` starts
//! `kn-replay` detached for `do_method=replay`.
//!
//! Replays are bounded per store, across processes: a running `kn-replay`
//! holds one of `max_replays` slot files (`.replays/slot-<i>` under the
//! store, see [`take_slot`]) locked for its lifetime, so a killed replay
//! frees its slot at once; and it stops after `replay_max_time`
//! ([`ReplayOptions::max_time`]) whatever its journal and warp ask for.
//!
//! ```
//! use kn_journal::{Event, Selection, Store, Topic};
//! use kn_sensors::replay::{self, ReplayOptions};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let store = Store::open(dir.path()).unwrap();
//! let journal = Topic::parse("/who/anna/kn_journal").unwrap();
//! let chat = Topic::parse("/what/chat").unwrap();
//! store.tunnel(&journal, &Selection::none()).unwrap(); // a fresh heartbeat
//! store.route(&chat, journal.as_str().as_bytes(), Event::from_pairs([("kn_id", "r1")])).unwrap();
//! store.notify(&chat, Event::from_pairs([("kn_id", "e1"), ("kn_payload", "hi")])).unwrap();
//!
//! let options = ReplayOptions { prefix: "again-".into(), ..ReplayOptions::default() };
//! let report = replay::run(&store, &journal, &options).unwrap();
//! assert_eq!(report.posted, 1);
//! let events = store.events(&chat, &Selection::all()).unwrap().events;
//! assert_eq!(events[1].id(), Some(&b"again-e1"[..]));
//! assert_eq!(events[1].payload(), b"hi");
//! ```

use std::fs::{File, TryLockError};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kn_journal::{Event, HttpRemote, Remote, Selection, Store, Topic, KN_EXPIRES, KN_ID, KN_ROUTED_FROM, KN_ROUTE_LOCATION, KN_TIME_T};
use kn_journal::internal::{format_time, now, Destination};

use crate::{SensorError, SensorErrorKind};

/// How to replay. `ReplayOptions::default()` is real time (`warp` 1), a
/// prefix of `replay-<now>-`, no credentials, no progress bar.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    /// Speed-up: original spacing divided by this (2 = twice as fast). Must
    /// be positive; `f64::INFINITY` posts everything at once.
    pub warp: f64,
    /// Plan only: compute where and when each event would go, post nothing.
    pub dry_run: bool,
    /// Put before each old `kn_id` to make the new one.
    pub prefix: String,
    /// User for re-posting through an authenticating server (HTTP basic).
    pub user: Option<String>,
    /// Password for `user`.
    pub password: Option<String>,
    /// Show a progress bar (only drawn when standard error is a terminal).
    pub progress: bool,
    /// Stop once this long has passed: events due later are not posted
    /// (and counted as failures). `None`: no limit.
    pub max_time: Option<Duration>,
    /// Re-post to local topics as this user of the access rules
    /// (docs/ACCESS.md): each post is checked as the user's own would be,
    /// so a replay cannot post where its requester may not. `None`: with
    /// the file system's rights, as a local tool.
    pub as_user: Option<kn_journal::access::Principal>,
}

impl Default for ReplayOptions {
    fn default() -> ReplayOptions {
        ReplayOptions {
            warp: 1.0,
            dry_run: false,
            prefix: format!("replay-{}-", now() as u64),
            user: None,
            password: None,
            progress: false,
            max_time: None,
            as_user: None,
        }
    }
}

/// Where one replayed event goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A topic of this store.
    Local(Topic),
    /// The absolute URL of a topic on another server.
    Remote(String),
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Local(t) => write!(f, "{t}"),
            Origin::Remote(url) => f.write_str(url),
        }
    }
}

/// One planned re-post.
#[derive(Clone, Debug)]
pub struct Step {
    /// When, counted from the start of the replay (already divided by warp).
    pub delay: Duration,
    /// Where the event goes; `None` when the event names no origin (it is
    /// skipped).
    pub origin: Option<Origin>,
    /// The event to post (new `kn_id`, hop-by-hop elements removed).
    pub event: Event,
}

/// What a replay did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Events in the journal (unexpired).
    pub events: usize,
    /// Events posted (or, in a dry run, that would be).
    pub posted: usize,
    /// Posts that were duplicates (already replayed with this prefix).
    pub duplicates: usize,
    /// Events without an origin to go back to.
    pub skipped: usize,
    /// Posts that failed, with why (the replay goes on after a failure).
    pub failures: Vec<String>,
}

/// Plans the replay of `journal`: its unexpired events ordered by
/// `kn_time_t` (events without one keep their place after the previous
/// one), each with its origin, new event and delay.
pub fn plan(store: &Store, journal: &Topic, options: &ReplayOptions) -> Result<Vec<Step>, SensorError> {
    if options.warp.is_nan() || options.warp <= 0.0 {
        return Err(SensorError::usage(format!("bad warp {}: must be a positive number", options.warp)));
    }
    let events = store
        .events(journal, &Selection::all())
        .map_err(|e| SensorError::from_journal(e, &format!("cannot read '{journal}'")))?
        .events;
    let mut timed: Vec<(f64, Event)> = Vec::with_capacity(events.len());
    let mut last = f64::NEG_INFINITY;
    for event in events {
        let t = time_of(&event).unwrap_or(last);
        last = t;
        timed.push((t, event));
    }
    // Stable: equal times keep the order they were stored in.
    timed.sort_by(|a, b| a.0.total_cmp(&b.0));
    let first = timed.iter().map(|(t, _)| *t).find(|t| t.is_finite()).unwrap_or(0.0);
    Ok(timed
        .into_iter()
        .map(|(t, event)| {
            let offset = if t.is_finite() { ((t - first) / options.warp).max(0.0) } else { 0.0 };
            let delay = Duration::try_from_secs_f64(offset).unwrap_or(Duration::ZERO);
            Step { delay, origin: origin_of(store, &event), event: repost_of(&event, &options.prefix) }
        })
        .collect())
}

/// Replays `journal` (see the module documentation): posts each event at
/// its time and returns what happened. Failures of single posts are
/// collected in the report; only an unreadable journal or bad options are
/// errors.
pub fn run(store: &Store, journal: &Topic, options: &ReplayOptions) -> Result<ReplayReport, SensorError> {
    let steps = plan(store, journal, options)?;
    let mut report = ReplayReport { events: steps.len(), ..ReplayReport::default() };
    let bar = progress_bar(options.progress, steps.len() as u64);
    let start = Instant::now();
    let total = steps.len();
    for (done, step) in steps.into_iter().enumerate() {
        if options.max_time.is_some_and(|limit| !options.dry_run && step.delay > limit) {
            let limit = options.max_time.unwrap_or_default();
            report.failures.push(format!(
                "stopped at the time limit of {} s (KN_REPLAY_MAX_TIME): {} of {total} events not replayed",
                limit.as_secs(),
                total - done
            ));
            break;
        }
        let Some(origin) = &step.origin else {
            report.skipped += 1;
            bar.inc(1);
            continue;
        };
        if options.dry_run {
            report.posted += 1;
            bar.inc(1);
            continue;
        }
        let due = start + step.delay;
        let wait = due.saturating_duration_since(Instant::now());
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
        match post(store, origin, step.event, options) {
            Ok(true) => report.duplicates += 1,
            Ok(false) => report.posted += 1,
            Err(err) => report.failures.push(format!("{origin}: {err}")),
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(report)
}

/// The directory of a store's replay slots.
pub const SLOTS_DIR: &str = ".replays";

/// One of a store's replay slots, held for as long as this value lives
/// (a `flock` on its file, which the kernel releases when the process
/// ends, however it ends).
#[derive(Debug)]
pub struct Slot {
    _file: File,
    /// The slot's file, `.replays/slot-<i>` under the store.
    pub path: PathBuf,
}

/// Takes a free replay slot of `store`: the first of `slot-0` ..
/// `slot-<max_replays - 1>` that no process holds locked. The holder's pid
/// is written into the file (for an operator). Errors: every slot is held
/// (temporary failure, saying how many may run), or the slot files cannot
/// be created.
pub fn take_slot(store: &Store) -> Result<Slot, SensorError> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};

    let config = store.config();
    let dir = config.root.join(SLOTS_DIR);
    let cant = |path: &std::path::Path, e: std::io::Error| {
        SensorError::new(SensorErrorKind::CantCreate, format!("cannot take a replay slot in '{}': {e}", path.display()))
    };
    std::fs::DirBuilder::new().recursive(true).mode(0o775).create(&dir).map_err(|e| cant(&dir, e))?;
    // Group-writable like the store's own files whatever the umask (the web
    // server and a cron job are different users of one group); only the
    // owner may change modes, and the owner's first run did.
    let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o2775));
    for i in 0..config.max_replays {
        let path = dir.join(format!("slot-{i}"));
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o664)
            .open(&path)
            .map_err(|e| cant(&path, e))?;
        let _ = file.set_permissions(std::fs::Permissions::from_mode(0o664));
        match file.try_lock() {
            Ok(()) => {
                let _ = file.set_len(0).and_then(|()| writeln!(file, "{}", std::process::id()));
                return Ok(Slot { _file: file, path });
            }
            Err(TryLockError::WouldBlock) => continue,
            Err(TryLockError::Error(e)) => return Err(cant(&path, e)),
        }
    }
    Err(SensorError::new(
        SensorErrorKind::TempFail,
        format!(
            "too many replays: {} already running on the store '{}' (KN_MAX_REPLAYS); try again later",
            config.max_replays,
            config.root.display()
        ),
    ))
}

/// A progress bar on standard error when asked for and it is a terminal;
/// a hidden one (drawing nothing) otherwise.
pub(crate) fn progress_bar(wanted: bool, len: u64) -> indicatif::ProgressBar {
    if !wanted || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}") {
        bar.set_style(style);
    }
    bar
}

fn time_of(event: &Event) -> Option<f64> {
    let text = std::str::from_utf8(event.get(KN_TIME_T)?).ok()?;
    text.trim().parse::<f64>().ok().filter(|t| t.is_finite())
}

/// Where `event` came from (see the module documentation).
pub fn origin_of(store: &Store, event: &Event) -> Option<Origin> {
    let routed_from = event.get(KN_ROUTED_FROM).filter(|v| !v.is_empty());
    if let Some(Ok(Destination::Local(topic))) = routed_from.map(|v| store.resolve(v)) {
        return Some(Origin::Local(topic));
    }
    if let Some(location) = event.get(KN_ROUTE_LOCATION).and_then(strip_route) {
        match store.resolve(location) {
            Ok(Destination::Local(topic)) => return Some(Origin::Local(topic)),
            Ok(Destination::Remote(url)) => return Some(Origin::Remote(url)),
            Ok(Destination::Push(_)) | Err(_) => {}
        }
    }
    match routed_from.map(|v| store.resolve(v)) {
        Some(Ok(Destination::Remote(url))) => Some(Origin::Remote(url)),
        _ => None,
    }
}

/// `<topic>/kn_routes/<route-id>` → `<topic>`; anything else (a client's
/// own `kn_uri`) is no topic.
fn strip_route(location: &[u8]) -> Option<&[u8]> {
    const MARK: &[u8] = b"/kn_routes/";
    let at = location.windows(MARK.len()).rposition(|w| w == MARK)?;
    let id = &location[at + MARK.len()..];
    if id.is_empty() || id.contains(&b'/') {
        return None;
    }
    Some(if at == 0 { b"/" } else { &location[..at] })
}

/// The event to re-post: hop-by-hop elements removed, `kn_id` prefixed,
/// `kn_time_t` left to the arrival, the lifetime kept as `+N`.
fn repost_of(event: &Event, prefix: &str) -> Event {
    let mut out = event.clone();
    out.strip_hop_by_hop();
    let mut id = prefix.as_bytes().to_vec();
    id.extend_from_slice(event.id().unwrap_or(b""));
    out.set(KN_ID, id);
    let born = time_of(event);
    if let Some(t) = out.remove(KN_TIME_T).and(born) {
        if let Ok(Some(expires)) = event.expires_at(t) {
            out.set(KN_EXPIRES, format!("+{}", format_time((expires - t).max(0.0))));
        }
    }
    out
}

/// Posts one event; `Ok(true)` for a duplicate.
fn post(store: &Store, origin: &Origin, event: Event, options: &ReplayOptions) -> Result<bool, SensorError> {
    match origin {
        Origin::Local(topic) => match &options.as_user {
            Some(who) => store.as_user(who).notify(topic, event),
            None => store.notify(topic, event),
        }
        .map(|r| r.duplicate)
            .map_err(|e| SensorError::from_journal(e, &format!("cannot post to '{topic}'"))),
        Origin::Remote(url) => {
            // The URL comes from the journal's events, which clients wrote:
            // the store's outbound policy (KN_OUTBOUND) decides, as for routes.
            store.config().outbound.check(url).map_err(|e| SensorError::from_journal(e, "not re-posted"))?;
            post_remote(store, url, &event, options)
        }
    }
}

/// A notify over HTTP, with basic authentication when a user is given,
/// through the project's one client ([`HttpRemote::from_config`]'s rules:
/// the store's timeouts, size limit and proxy setting, never a proxy from
/// the environment, which in a CGI the client controls).
fn post_remote(store: &Store, url: &str, event: &Event, options: &ReplayOptions) -> Result<bool, SensorError> {
    let mut pairs: Vec<(&[u8], &[u8])> = vec![(b"do_method", b"notify"), (b"kn_response_format", b"simple")];
    pairs.extend(event.elements());
    let mut client = HttpRemote::builder_from(store.config());
    if let Some(user) = &options.user {
        client = client.basic_auth(user, options.password.as_deref().unwrap_or(""));
    }
    let reply = client
        .build()
        .post_form(url, &pairs)
        .map_err(|e| SensorError::new(SensorErrorKind::TempFail, format!("cannot post to '{url}': {}", e.message())))?;
    let (status, bytes) = (reply.status, reply.body);
    let line = kn_wire::simple::decode_frames(&bytes)
        .ok()
        .and_then(|events| events.into_iter().find_map(|e| e.get_str(kn_journal::STATUS)));
    match line {
        Some(line) if line.starts_with("200") => Ok(String::from_utf8_lossy(&bytes).contains("was a duplicate")),
        Some(line) => Err(SensorError::new(SensorErrorKind::Unavailable, format!("'{url}' refused the event with '{line}'"))),
        None => Err(SensorError::new(
            SensorErrorKind::Unavailable,
            format!("'{url}' answered HTTP {status} without a PubSub status event"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_locations_lose_their_route_tail() {
        assert_eq!(strip_route(b"http://h/kn/what/chat/kn_routes/r1"), Some(&b"http://h/kn/what/chat"[..]));
        assert_eq!(strip_route(b"/kn_routes/r1"), Some(&b"/"[..]));
        assert_eq!(strip_route(b"javascript:cb"), None);
        assert_eq!(strip_route(b"/a/kn_routes/"), None);
    }

    #[test]
    fn reposts_get_a_prefixed_id_and_keep_their_lifetime() {
        let e = Event::from_pairs([
            ("kn_id", "e1"),
            ("kn_time_t", "100"),
            ("kn_expires", "160"),
            ("kn_route_location", "x"),
            ("kn_routed_from", "y"),
            ("kn_payload", "p"),
        ]);
        let r = repost_of(&e, "p-");
        assert_eq!(r.id(), Some(&b"p-e1"[..]));
        assert_eq!(r.get("kn_expires"), Some(&b"+60"[..]));
        assert!(!r.contains("kn_time_t") && !r.contains("kn_routed_from") && !r.contains("kn_route_location"));
        assert_eq!(r.payload(), b"p");
    }
}
