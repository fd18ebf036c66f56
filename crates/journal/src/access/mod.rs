//! Access control: who may post, read and route where (docs/ACCESS.md).
//!
//! The web server authenticates, knpubsub authorises. A request's user
//! (a [`Principal`]: a name, or anonymous) comes from the web server
//! (`REMOTE_USER`) or from `serve`'s own authentication; the rules file
//! named by [`Config::access_rules`](crate::Config) (`KN_ACCESS_RULES`)
//! says which [`Operation`]s each user, group or anonymous may do on which
//! topics. Without a rules file everything is allowed, as it always was.
//!
//! Requests go through [`Store::as_user`](crate::Store::as_user), which
//! checks before it calls the store. A route remembers its creator
//! ([`KN_ROUTE_CREATOR`]) and every delivery along it checks the creator's
//! rights again, against the rules in force then: a route whose creator
//! lost them is poisoned, with the reason, instead of delivering.
//!
//! Local tools (`kn`, the sensors with `--root`, programs using this
//! crate's [`Store`](crate::Store) directly) act with the file system's
//! permissions and are not checked.
//!
//! ```
//! use kn_journal::access::{Operation, Principal, Rules};
//! use kn_journal::{ErrorKind, Topic};
//!
//! let rules = Rules::parse("allow read /what/** *\nallow post /what/** users\n", "rules".as_ref()).unwrap();
//! let chat = Topic::parse("/what/chat").unwrap();
//! assert!(rules.check(&Principal::anonymous(), Operation::Read, &chat).is_ok());
//! // Logging in would help: 401.
//! let err = rules.check(&Principal::anonymous(), Operation::Post, &chat).unwrap_err();
//! assert_eq!(err.kind(), ErrorKind::Unauthorized);
//! assert!(rules.check(&Principal::user("anna"), Operation::Post, &chat).is_ok());
//! // Nothing allows it: 403.
//! let err = rules.check(&Principal::user("anna"), Operation::Delete, &chat).unwrap_err();
//! assert_eq!(err.kind(), ErrorKind::Forbidden);
//! ```

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::error::{Error, ErrorKind, Result};
use crate::event::Event;
use crate::topic::Topic;

mod as_user;
mod handover;
mod rules;
mod session;
mod site;
mod token;
mod visible;

pub use as_user::AsUser;
pub use handover::HANDOVER_VARIABLE;
pub use rules::{Rules, MAX_RULE_LINES};
pub use session::{token_key_of_store, SessionKey, SESSION_COOKIE, TOKEN_KEY_FILE};
pub use site::Site;
pub use token::{TokenClaims, MAX_TOKEN_PATTERNS};
pub(crate) use visible::Reader;

/// The element of a route event that names the user who created the
/// route through a server (absent: anonymous, or a local tool). Every
/// delivery along the route is checked against this user's rights.
pub const KN_ROUTE_CREATOR: &str = "kn_route_creator";

/// The element of a route event that names the anonymous visitor's
/// session ([`Principal::session`]) that created the route through a
/// server: written by the server only, like [`KN_ROUTE_CREATOR`].
pub const KN_ROUTE_SESSION: &str = "kn_route_session";

/// The element of a route made with a bearer token whose rights the
/// rules alone do not give its user: what the token granted (its groups
/// and `kn` claim, in the format of crates/journal/FORMAT.md). Deliveries are judged
/// with it until the route's `kn_expires` (no later than the token's
/// `exp`). Written by the store only, like [`KN_ROUTE_CREATOR`]: a request
/// sending one has it dropped, and a route without `kn_expires` has it
/// ignored.
pub const KN_ROUTE_GRANT: &str = "kn_route_grant";

/// What a request does to a topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operation {
    /// Post (notify) to the topic, and receive `kn_status_to` statuses.
    Post,
    /// Read the topic: tunnels, and routes from it.
    Read,
    /// Be the destination of a route ("route to").
    Route,
    /// Delete routes from the topic that someone else created.
    Delete,
    /// Start a replay of the journal.
    Replay,
}

impl Operation {
    /// Every operation, in the order the rules file names them.
    pub const ALL: [Operation; 5] = [Operation::Post, Operation::Read, Operation::Route, Operation::Delete, Operation::Replay];

    /// The operation's name in the rules file.
    pub fn name(self) -> &'static str {
        match self {
            Operation::Post => "post",
            Operation::Read => "read",
            Operation::Route => "route",
            Operation::Delete => "delete",
            Operation::Replay => "replay",
        }
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }

    fn verb(self) -> &'static str {
        match self {
            Operation::Post => "post to",
            Operation::Read => "read",
            Operation::Route => "route to",
            Operation::Delete => "delete routes of",
            Operation::Replay => "replay",
        }
    }
}

/// Who makes a request: an authenticated user's name, or anonymous; and
/// what a bearer token it came with adds and narrows
/// ([`Principal::from_token`]). Two principals are equal when they are
/// the same user or session, whatever their tokens.
#[derive(Clone, Debug, Default)]
pub struct Principal {
    user: Option<String>,
    /// An anonymous visitor's verified session id (see [`SessionKey`]).
    session: Option<String>,
    /// What a bearer token grants (docs/ACCESS.md, "Bearer tokens").
    token: Option<Arc<token::Grant>>,
    /// Reading only: the credential is a cookie on a request not shown to
    /// come from this server's own pages ([`Principal::through_cookie`]).
    reading_only: bool,
}

impl PartialEq for Principal {
    fn eq(&self, other: &Principal) -> bool {
        self.user == other.user && self.session == other.session
    }
}

impl Eq for Principal {}

impl std::hash::Hash for Principal {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.user.hash(state);
        self.session.hash(state);
    }
}

impl Principal {
    /// A request without a user.
    pub fn anonymous() -> Principal {
        Principal { user: None, session: None, token: None, reading_only: false }
    }

    /// An anonymous visitor holding the session `id`, as verified by
    /// [`SessionKey::verify`]: the rules' `{session}` segment matches `id`
    /// for this visitor only (docs/ACCESS.md).
    pub fn anonymous_session(id: &str) -> Principal {
        Principal { user: None, session: Some(id.to_string()).filter(|s| !s.is_empty()), token: None, reading_only: false }
    }

    /// The authenticated user `name`. An empty name, and the name
    /// `anonymous` (the JavaScript client's journals of anonymous
    /// visitors are `/who/anonymous/...`), are anonymous.
    pub fn user(name: &str) -> Principal {
        Principal { user: Some(name.to_string()).filter(|n| !n.is_empty() && n != "anonymous"), session: None, token: None, reading_only: false }
    }

    /// The user's name; `None` for anonymous.
    pub fn name(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// An anonymous visitor's session id; `None` for a user, and for
    /// anonymous without a session.
    pub fn session(&self) -> Option<&str> {
        self.session.as_deref()
    }

    /// True when this principal is someone in particular (a user, or an
    /// anonymous visitor's session), who can be recognised as a route's
    /// creator.
    pub fn is_identified(&self) -> bool {
        self.user.is_some() || self.session.is_some()
    }

    /// The creator a route event names ([`KN_ROUTE_CREATOR`], else
    /// [`KN_ROUTE_SESSION`]).
    /// A route made with a token records what the token granted
    /// ([`KN_ROUTE_GRANT`]): its deliveries are judged with that, until
    /// the route's `kn_expires`.
    pub fn creator_of(route: &Event) -> Principal {
        if let Some(record) = route.get(KN_ROUTE_GRANT) {
            let now = std::time::UNIX_EPOCH.elapsed().map_or(0.0, |d| d.as_secs_f64());
            // Without a kn_expires (never so when the store wrote it), the
            // grant is ignored: the route is its plain creator's.
            if let Some(expires) = route.expires_at(now).ok().flatten().map(|at| at as u64) {
                let name = route.get(KN_ROUTE_CREATOR).map(|n| String::from_utf8_lossy(n).into_owned());
                return Principal::from_grant_record(name.as_deref(), record, expires);
            }
        }
        match (route.get(KN_ROUTE_CREATOR), route.get(KN_ROUTE_SESSION)) {
            (Some(name), _) => Principal::user(&String::from_utf8_lossy(name)),
            (None, Some(id)) => Principal::anonymous_session(&String::from_utf8_lossy(id)),
            (None, None) => Principal::anonymous(),
        }
    }

    /// Records this principal as the creator of `route` (whatever it said
    /// before is dropped).
    pub(crate) fn record_as_creator(&self, route: &mut Event) {
        route.remove(KN_ROUTE_CREATOR);
        route.remove(KN_ROUTE_SESSION);
        route.remove(KN_ROUTE_GRANT);
        if let Some(name) = self.name() {
            route.set(KN_ROUTE_CREATOR, name);
        } else if let Some(id) = self.session() {
            route.set(KN_ROUTE_SESSION, id);
        }
    }

    fn describe(&self) -> String {
        match (&self.user, &self.session) {
            (Some(name), _) => format!("user '{name}'"),
            (None, Some(id)) => format!("anonymous (session '{id}')"),
            (None, None) => "anonymous".to_string(),
        }
    }
}

impl Rules {
    /// Whether `who` may do `op` on `topic`: the first rule whose
    /// operations, pattern and people match decides; when none does, the
    /// answer is no. A topic's `kn_routes` and `kn_subtopics` are checked
    /// as the topic itself. Refusals are [`ErrorKind::Unauthorized`] (401)
    /// for anonymous, where logging in may help, else
    /// [`ErrorKind::Forbidden`] (403); the message names the rule.
    ///
    /// What narrows a principal is checked first ([`Principal::check_claim`]:
    /// a token's claim, a cookie's channel); a capability is judged by its
    /// claim alone.
    pub fn check(&self, who: &Principal, op: Operation, topic: &Topic) -> Result<()> {
        let topic = &*judged_as(topic);
        who.check_claim(op, topic)?;
        if who.is_capability() {
            return Ok(());
        }
        let mut buffer = [""; crate::topic::MAX_TOPIC_DEPTH];
        let mut depth = 0;
        for (slot, segment) in buffer.iter_mut().zip(topic.segments()) {
            *slot = segment;
            depth += 1;
        }
        let segments = &buffer[..depth];
        let groups = who.user.as_ref().and_then(|u| self.groups.get(u)).map_or(&[][..], Vec::as_slice);
        let user = who.name();
        let anchored = segments.first().and_then(|first| self.by_first.get(*first)).map_or(&[][..], Vec::as_slice);
        let decided = merged(anchored, &self.unanchored).map(|i| &self.rules[i]).find(|rule| {
            rule.operations & op.bit() != 0
                && rule.who.iter().any(|w| applies(w, user, groups) || applies(w, user, who.token_groups()))
                && rule.pattern.matches(segments, user, who.session())
        });
        let why = match decided {
            Some(rule) if rule.allow => return Ok(()),
            Some(rule) => format!("refused by rule {} ({})", rule.line, rule.text),
            None => "no rule allows it (what the access rules do not allow is refused)".to_string(),
        };
        let kind = if user.is_none() { ErrorKind::Unauthorized } else { ErrorKind::Forbidden };
        let login = if user.is_none() { "; log in first" } else { "" };
        Err(Error::new(kind, format!("{} may not {} '{topic}': {why}{login}", who.describe(), op.verb())))
    }

    /// Whether route `event` from `source`, delivering to the local topic
    /// `to` (`None`: another server), may still deliver: its creator may
    /// read `source` and route to `to`.
    pub fn check_route(&self, source: &Topic, event: &Event, to: Option<&Topic>) -> Result<()> {
        let creator = Principal::creator_of(event);
        self.check(&creator, Operation::Read, source)?;
        match to {
            Some(to) => self.check(&creator, Operation::Route, to),
            None => Ok(()),
        }
    }
}

/// The indexes of two ascending lists, merged in ascending order (the
/// rules' order, in which the first match decides).
fn merged<'a>(a: &'a [usize], b: &'a [usize]) -> impl Iterator<Item = usize> + 'a {
    let (mut a, mut b) = (a.iter().peekable(), b.iter().peekable());
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (Some(&&x), Some(&&y)) if x < y => a.next().copied(),
        (Some(_), Some(_)) | (None, Some(_)) => b.next().copied(),
        (Some(_), None) => a.next().copied(),
        (None, None) => None,
    })
}

fn applies(who: &rules::Who, user: Option<&str>, groups: &[String]) -> bool {
    use rules::Who;
    match who {
        Who::Everyone => true,
        Who::Anonymous => user.is_none(),
        Who::Users => user.is_some(),
        Who::User(name) => user == Some(name.as_str()),
        Who::Group(name) => groups.iter().any(|g| g == name),
    }
}

/// How long the rules read from a file are used before the file's
/// modification time is looked at again.
const RECHECK_EVERY: Duration = Duration::from_secs(1);

/// The rules of a store: read from the configured file when first needed,
/// and again when the file changes (looked at no more than once a second).
#[derive(Debug, Default)]
pub(crate) struct Source {
    path: Option<PathBuf>,
    cached: Mutex<Option<Cached>>,
    /// The store's session key, once read.
    session_key: std::sync::OnceLock<SessionKey>,
}

#[derive(Debug)]
struct Cached {
    checked: Instant,
    /// The modification time and size of the rules file, then of each
    /// group file it read.
    stamp: Vec<Option<(SystemTime, u64)>>,
    rules: std::result::Result<Arc<Rules>, String>,
}

impl Source {
    pub(crate) fn new(path: Option<PathBuf>) -> Source {
        Source { path, cached: Mutex::new(None), session_key: std::sync::OnceLock::new() }
    }

    /// The session key of the store at `root`, read (or made) once.
    pub(crate) fn session_key(&self, root: &Path) -> Result<SessionKey> {
        if let Some(key) = self.session_key.get() {
            return Ok(key.clone());
        }
        let key = SessionKey::of_store(root)?;
        Ok(self.session_key.get_or_init(|| key).clone())
    }

    /// The rules in force: `None` without a rules file (everything is
    /// allowed). A rules file that cannot be read or parsed is an error
    /// (500): nothing is allowed until it is fixed.
    pub(crate) fn rules(&self) -> Result<Option<Arc<Rules>>> {
        let Some(path) = &self.path else { return Ok(None) };
        let mut cached = self.cached.lock().map_err(|_| Error::new(ErrorKind::Io, "access rules lock poisoned"))?;
        let fresh = cached.as_ref().is_some_and(|c| c.checked.elapsed() < RECHECK_EVERY);
        if !fresh {
            // Unchanged when the rules file and every group file it read
            // are (a broken file is read again each time: what broke it
            // may have been a group file).
            let unchanged = |c: &Cached| match &c.rules {
                Ok(rules) => c.stamp.first().is_some_and(Option::is_some) && c.stamp == stamps(path, rules),
                Err(_) => false,
            };
            match cached.as_mut() {
                Some(c) if unchanged(c) => c.checked = Instant::now(),
                _ => {
                    let before = stamp(path);
                    let rules = Rules::load(path).map(Arc::new).map_err(|e| e.to_string());
                    let mut stamp = vec![before];
                    if let Ok(rules) = &rules {
                        stamp.extend(rules.group_files.iter().map(|g| self::stamp(g)));
                    }
                    *cached = Some(Cached { checked: Instant::now(), stamp, rules });
                }
            }
        }
        match cached.as_ref().map(|c| &c.rules) {
            Some(Ok(rules)) => Ok(Some(Arc::clone(rules))),
            Some(Err(why)) => Err(Error::new(ErrorKind::Io, format!("access rules refuse everything until fixed: {why}"))),
            None => Err(Error::new(ErrorKind::Io, "access rules not loaded")),
        }
    }
}

/// The stamps of the rules file at `path` and of the group files `rules`
/// read, as [`Cached::stamp`] keeps them.
fn stamps(path: &Path, rules: &Rules) -> Vec<Option<(SystemTime, u64)>> {
    std::iter::once(stamp(path)).chain(rules.group_files.iter().map(|g| stamp(g))).collect()
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// The topic a right on `topic` is judged on: a reserved topic
/// (`kn_routes`, `kn_subtopics`, `kn_presence`) as the topic it belongs to.
pub(crate) fn judged_as(topic: &Topic) -> std::borrow::Cow<'_, Topic> {
    match topic.is_reserved().then(|| topic.parent()).flatten() {
        Some(parent) => std::borrow::Cow::Owned(parent),
        None => std::borrow::Cow::Borrowed(topic),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(text: &str) -> Rules {
        Rules::parse(text, Path::new("test.rules")).unwrap()
    }

    fn topic(name: &str) -> Topic {
        Topic::parse(name).unwrap()
    }

    #[test]
    fn the_first_matching_rule_decides() {
        let r = rules("deny post /what/announce/** users\nallow post /what/** users\n");
        let anna = Principal::user("anna");
        assert!(r.check(&anna, Operation::Post, &topic("/what/chat")).is_ok());
        let err = r.check(&anna, Operation::Post, &topic("/what/announce/x")).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Forbidden);
        assert!(err.message().contains("rule 1 (deny post /what/announce/** users)"), "{err}");
        // Rules starting with a wildcard and with a literal keep their order.
        let chat = topic("/what/chat");
        let r = rules("deny post /*/chat users\nallow post /what/** users\n");
        assert!(r.check(&anna, Operation::Post, &chat).is_err());
        let r = rules("allow post /what/** users\ndeny post /**/chat users\n");
        assert!(r.check(&anna, Operation::Post, &chat).is_ok());
        let r = rules("allow read /x *\ndeny post /** users\nallow post /what/chat users\n");
        assert!(r.check(&anna, Operation::Post, &chat).is_err());
    }

    #[test]
    fn nothing_matching_is_refused_and_anonymous_gets_401() {
        let r = rules("allow read /what/** *\n");
        let err = r.check(&Principal::anonymous(), Operation::Post, &topic("/what/chat")).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unauthorized);
        assert!(err.message().contains("no rule allows it"), "{err}");
        let err = r.check(&Principal::user("anna"), Operation::Post, &topic("/what/chat")).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Forbidden);
    }

    #[test]
    fn user_patterns_match_the_users_own_name_only() {
        let r = rules("allow all /who/{user}/** users\n");
        let own = topic("/who/anna/s/1/kn_journal");
        assert!(r.check(&Principal::user("anna"), Operation::Post, &own).is_ok());
        assert!(r.check(&Principal::user("bob"), Operation::Post, &own).is_err());
        assert!(r.check(&Principal::anonymous(), Operation::Read, &own).is_err());
        // A user who logged in as "anonymous" is anonymous.
        assert!(r.check(&Principal::user("anonymous"), Operation::Read, &topic("/who/anonymous/s/1/kn_journal")).is_err());
        // A name with a slash is never one segment.
        assert!(r.check(&Principal::user("anna/x"), Operation::Read, &topic("/who/anna/x")).is_err());
    }

    #[test]
    fn groups_come_from_group_lines_and_group_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("groups"), "# Apache's format\nops: carl\n").unwrap();
        let path = dir.path().join("rules");
        std::fs::write(&path, "group staff: anna bob\ngroupfile groups\nallow post /what/** @staff @ops\n").unwrap();
        let r = Rules::load(&path).unwrap();
        let chat = topic("/what/chat");
        for name in ["anna", "bob", "carl"] {
            assert!(r.check(&Principal::user(name), Operation::Post, &chat).is_ok(), "{name}");
        }
        assert!(r.check(&Principal::user("dora"), Operation::Post, &chat).is_err());
    }

    #[test]
    fn patterns_match_segments() {
        let r = rules("allow read /a/*/c *\nallow read /b/** *\nallow read /d/**/z *\n");
        let anyone = Principal::anonymous();
        let ok = |t: &str| r.check(&anyone, Operation::Read, &topic(t)).is_ok();
        assert!(ok("/a/x/c") && !ok("/a/c") && !ok("/a/x/y/c") && !ok("/a/x/cc"));
        assert!(ok("/b") && ok("/b/x") && ok("/b/x/y") && !ok("/bb"));
        assert!(ok("/d/z") && ok("/d/1/2/z") && !ok("/d/1/2"));
        // kn_routes and kn_subtopics are the topic's own.
        assert!(ok("/b/kn_routes") && ok("/a/x/c/kn_subtopics") && !ok("/a/x/kn_subtopics"));
    }

    #[test]
    fn bad_lines_are_errors_naming_file_and_line() {
        for (text, needle) in [
            ("allow post\n", "test.rules:1: expected a topic pattern"),
            ("\nallow post /a\n", "test.rules:2: expected whom"),
            ("allow write /a *\n", "unknown operation 'write'"),
            ("allow post a *\n", "must start with '/'"),
            ("allow post /a/b* *\n", "must be whole segments"),
            ("allow post /**/**/** *\n", "more than 2 '**'"),
            ("permit post /a *\n", "unknown keyword 'permit'"),
            ("group staff anna\n", "expected 'group NAME: USER...'"),
            ("allow post /a @\n", "'@' needs a group name"),
        ] {
            let err = Rules::parse(text, Path::new("test.rules")).unwrap_err();
            assert!(err.message().contains(needle), "{text:?}: {err}");
        }
    }

    #[test]
    fn a_rules_file_longer_than_the_limit_is_refused() {
        let at_limit = "# comment\n".repeat(MAX_RULE_LINES);
        assert!(Rules::parse(&at_limit, Path::new("r")).is_ok());
        let over = format!("{at_limit}allow read / *\n");
        let err = Rules::parse(&over, Path::new("r")).unwrap_err();
        assert!(err.message().contains(&format!("r:{}: more than {MAX_RULE_LINES} lines", MAX_RULE_LINES + 1)), "{err}");
    }

    #[test]
    fn a_changed_file_is_read_again_and_a_broken_one_refuses_everything() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules");
        std::fs::write(&path, "allow read / *\n").unwrap();
        let source = Source::new(Some(path.clone()));
        assert_eq!(source.rules().unwrap().unwrap().len(), 1);
        std::fs::write(&path, "allow read / *\nallow post / *\n").unwrap();
        std::thread::sleep(RECHECK_EVERY + Duration::from_millis(50));
        assert_eq!(source.rules().unwrap().unwrap().len(), 2);
        std::fs::write(&path, "allow nonsense\n").unwrap();
        std::thread::sleep(RECHECK_EVERY + Duration::from_millis(50));
        let err = source.rules().unwrap_err();
        assert!(err.message().contains("refuse everything until fixed"), "{err}");
        assert!(Source::new(None).rules().unwrap().is_none());
    }

    #[test]
    fn a_changed_group_file_is_a_change_of_the_rules() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules");
        std::fs::write(dir.path().join("groups"), "staff: anna bob\n").unwrap();
        std::fs::write(&path, "groupfile groups\nallow read /what/** @staff\n").unwrap();
        let source = Source::new(Some(path));
        let chat = topic("/what/chat");
        assert!(source.rules().unwrap().unwrap().check(&Principal::user("bob"), Operation::Read, &chat).is_ok());
        std::fs::write(dir.path().join("groups"), "staff: anna\n").unwrap();
        std::thread::sleep(RECHECK_EVERY + Duration::from_millis(50));
        assert!(source.rules().unwrap().unwrap().check(&Principal::user("bob"), Operation::Read, &chat).is_err());
    }
}
