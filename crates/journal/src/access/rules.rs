//! The rules file: its lines, parsed once into [`Rules`] (see
//! docs/ACCESS.md for the format).

use std::collections::HashMap;
use std::path::Path;

use crate::error::{Error, ErrorKind, Result};

use super::Operation;

/// Most lines a rules file may have (a bound on the work of one check).
pub const MAX_RULE_LINES: usize = 10_000;

/// One `allow` or `deny` line.
#[derive(Clone, Debug)]
pub(super) struct Rule {
    /// Its line number in the file, from 1.
    pub(super) line: usize,
    /// The line as written (trimmed), shown in a 403.
    pub(super) text: String,
    pub(super) allow: bool,
    /// The operations it applies to (a bit per [`Operation`]).
    pub(super) operations: u8,
    pub(super) pattern: Pattern,
    pub(super) who: Vec<Who>,
}

/// Whom a rule names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Who {
    /// `*`: everyone, anonymous included.
    Everyone,
    /// `anonymous`: a request without a user.
    Anonymous,
    /// `users`: any authenticated user.
    Users,
    /// `@name`: the members of a group.
    Group(String),
    /// A user name.
    User(String),
}

/// A topic pattern: segments, each a literal, `*` (any one segment),
/// `**` (any number of segments, none included), `{user}` (the
/// requesting user's name) or `{session}` (an anonymous visitor's own
/// verified session id).
#[derive(Clone, Debug)]
pub(super) struct Pattern {
    pub(super) segments: Vec<Segment>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Segment {
    Literal(String),
    One,
    Any,
    User,
    Session,
}

/// A parsed rules file: its rules in order and who is in which group.
#[derive(Clone, Debug, Default)]
pub struct Rules {
    pub(super) rules: Vec<Rule>,
    /// Each user's groups.
    pub(super) groups: HashMap<String, Vec<String>>,
    /// The rules (their indexes, in order) whose pattern starts with a
    /// given literal segment, and those that start otherwise: a check
    /// looks only at the rules that can match the topic's first segment.
    pub(super) by_first: HashMap<String, Vec<usize>>,
    pub(super) unanchored: Vec<usize>,
    /// The group files the rules read (`groupfile`): a change to one is a
    /// change of the rules.
    pub(super) group_files: Vec<std::path::PathBuf>,
}

impl Rules {
    /// Parses the text of a rules file; `origin` names it in errors
    /// (which give the line and what is wrong with it). A `groupfile`
    /// line reads that file (relative to `origin`'s directory).
    ///
    /// ```
    /// use kn_journal::access::{Operation, Principal, Rules};
    /// use kn_journal::Topic;
    ///
    /// let rules = Rules::parse("\
    /// group staff: anna bob
    /// allow all /who/{user}/**  users
    /// allow post,read /what/**  @staff
    /// allow read /what/news/**  *
    /// ", "access.rules".as_ref()).unwrap();
    /// let news = Topic::parse("/what/news/today").unwrap();
    /// assert!(rules.check(&Principal::anonymous(), Operation::Read, &news).is_ok());
    /// assert!(rules.check(&Principal::anonymous(), Operation::Post, &news).is_err());
    /// assert!(rules.check(&Principal::user("bob"), Operation::Post, &news).is_ok());
    /// let own = Topic::parse("/who/carl/kn_journal").unwrap();
    /// assert!(rules.check(&Principal::user("carl"), Operation::Route, &own).is_ok());
    /// assert!(rules.check(&Principal::user("anna"), Operation::Read, &own).is_err());
    /// ```
    pub fn parse(text: &str, origin: &Path) -> Result<Rules> {
        let mut rules = Rules::default();
        let bad = |line: usize, why: String| Error::new(ErrorKind::BadRequest, format!("{}:{line}: {why}", origin.display()));
        for (i, raw) in text.lines().enumerate() {
            let number = i + 1;
            if number > MAX_RULE_LINES {
                return Err(bad(number, format!("more than {MAX_RULE_LINES} lines")));
            }
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let (keyword, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
            match keyword {
                "allow" | "deny" => {
                    let rule = parse_rule(number, line, keyword == "allow", rest).map_err(|why| bad(number, why))?;
                    let index = rules.rules.len();
                    match rule.pattern.segments.first() {
                        Some(Segment::Literal(first)) => rules.by_first.entry(first.clone()).or_default().push(index),
                        _ => rules.unanchored.push(index),
                    }
                    rules.rules.push(rule);
                }
                "group" => {
                    let (name, members) = rest.split_once(':').ok_or_else(|| bad(number, "expected 'group NAME: USER...'".into()))?;
                    rules.add_group(name.trim(), members).map_err(|why| bad(number, why))?;
                }
                "groupfile" => {
                    let path = origin.parent().unwrap_or(Path::new(".")).join(rest.trim());
                    let text = std::fs::read_to_string(&path).map_err(|e| bad(number, format!("cannot read group file '{}': {e}", path.display())))?;
                    rules.group_files.push(path.clone());
                    for (j, group) in text.lines().enumerate() {
                        let group = group.split('#').next().unwrap_or("").trim();
                        if group.is_empty() {
                            continue;
                        }
                        let (name, members) = group.split_once(':').ok_or_else(|| {
                            bad(number, format!("{}:{}: expected 'NAME: USER...'", path.display(), j + 1))
                        })?;
                        rules.add_group(name.trim(), members).map_err(|why| bad(number, format!("{}:{}: {why}", path.display(), j + 1)))?;
                    }
                }
                other => return Err(bad(number, format!("unknown keyword '{other}': expected allow, deny, group or groupfile"))),
            }
        }
        Ok(rules)
    }

    /// Reads and parses the rules file at `path`.
    pub fn load(path: &Path) -> Result<Rules> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io("cannot read access rules", path, e))?;
        Rules::parse(&text, path)
    }

    /// How many `allow` and `deny` rules there are.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// True when there is no `allow` or `deny` rule (everything is refused).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    fn add_group(&mut self, name: &str, members: &str) -> std::result::Result<(), String> {
        if name.is_empty() || name.contains(char::is_whitespace) {
            return Err(format!("bad group name '{name}'"));
        }
        for member in members.split_whitespace() {
            let groups = self.groups.entry(member.to_string()).or_default();
            if !groups.iter().any(|g| g == name) {
                groups.push(name.to_string());
            }
        }
        Ok(())
    }
}

fn parse_rule(line: usize, text: &str, allow: bool, rest: &str) -> std::result::Result<Rule, String> {
    let mut words = rest.split_whitespace();
    let operations = words.next().ok_or("expected operations, a topic pattern and whom it is for")?;
    let pattern = words.next().ok_or("expected a topic pattern after the operations")?;
    let who: Vec<Who> = words.map(parse_who).collect::<std::result::Result<_, _>>()?;
    if who.is_empty() {
        return Err(format!("expected whom the rule is for after '{pattern}' (a user, @group, users, anonymous or *)"));
    }
    Ok(Rule { line, text: text.to_string(), allow, operations: parse_operations(operations)?, pattern: parse_pattern(pattern)?, who })
}

pub(super) fn parse_operations(list: &str) -> std::result::Result<u8, String> {
    let mut bits = 0;
    for name in list.split(',').filter(|n| !n.is_empty()) {
        bits |= match name {
            "all" => Operation::ALL.iter().fold(0, |b, op| b | op.bit()),
            name => Operation::ALL
                .iter()
                .find(|op| op.name() == name)
                .ok_or_else(|| format!("unknown operation '{name}': expected post, read, route, delete, replay or all"))?
                .bit(),
        };
    }
    if bits == 0 {
        return Err("no operation named".into());
    }
    Ok(bits)
}

pub(super) fn parse_pattern(text: &str) -> std::result::Result<Pattern, String> {
    if !text.starts_with('/') {
        return Err(format!("bad topic pattern '{text}': it must start with '/'"));
    }
    let mut segments = Vec::new();
    for segment in text.split('/').filter(|s| !s.is_empty()) {
        segments.push(match segment {
            "*" => Segment::One,
            "**" => Segment::Any,
            "{user}" => Segment::User,
            "{session}" => Segment::Session,
            s if s.contains(['*', '{', '}']) => {
                return Err(format!("bad topic pattern '{text}': '*', '**', '{{user}}' and '{{session}}' must be whole segments"));
            }
            s => Segment::Literal(s.to_string()),
        });
    }
    if segments.iter().filter(|s| **s == Segment::Any).count() > MAX_ANY {
        return Err(format!("bad topic pattern '{text}': more than {MAX_ANY} '**' segments"));
    }
    Ok(Pattern { segments })
}

/// Most `**` segments one pattern may have: each multiplies the work of
/// matching it by the depth of the topic.
const MAX_ANY: usize = 2;

fn parse_who(word: &str) -> std::result::Result<Who, String> {
    Ok(match word {
        "*" => Who::Everyone,
        "anonymous" => Who::Anonymous,
        "users" => Who::Users,
        w if w.starts_with('@') && w.len() > 1 => Who::Group(w[1..].to_string()),
        w if w.starts_with('@') => return Err("'@' needs a group name".into()),
        w => Who::User(w.to_string()),
    })
}

impl Pattern {
    /// True when `topic`'s segments match, with `user` for `{user}` (an
    /// anonymous request matches no `{user}`) and `session` for
    /// `{session}` (a request without a verified session matches none).
    pub(super) fn matches(&self, topic: &[&str], user: Option<&str>, session: Option<&str>) -> bool {
        matches_from(&self.segments, topic, (user, session))
    }
}

fn matches_from(pattern: &[Segment], topic: &[&str], who: (Option<&str>, Option<&str>)) -> bool {
    let Some((first, rest)) = pattern.split_first() else { return topic.is_empty() };
    if *first == Segment::Any {
        return (0..=topic.len()).any(|skip| matches_from(rest, &topic[skip..], who));
    }
    let Some((segment, topic_rest)) = topic.split_first() else { return false };
    let here = match first {
        Segment::Literal(l) => l == segment,
        Segment::User => who.0 == Some(*segment),
        Segment::Session => who.1 == Some(*segment),
        Segment::One | Segment::Any => true,
    };
    here && matches_from(rest, topic_rest, who)
}
