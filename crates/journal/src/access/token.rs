//! What a verified bearer token grants (docs/ACCESS.md, "Bearer tokens"):
//! its claims made a [`Principal`]. Checking the signature and the times
//! is the server's (`kn-cgi`'s `bearer`); this module knows no HTTP and
//! no key, only what the claims mean:
//!
//! * `sub` is the user, judged by the rules file like any other, with the
//!   token's `groups` added to those the rules file gives it;
//! * an optional `kn` claim (`{"read": ["/who/anna/**"], "post": [...]}`)
//!   narrows the token: it may do nothing its claim does not name, however
//!   much the rules allow its user;
//! * a token without `sub` is a capability: exactly what its `kn` claim
//!   names, whatever the rules say (nothing, without a `kn` claim).
//!
//! ```
//! use kn_journal::access::{Operation, Principal, Rules, TokenClaims};
//! use kn_journal::Topic;
//!
//! let rules = Rules::parse("allow all /who/** users\n", "rules".as_ref()).unwrap();
//! let claims: TokenClaims = serde_json::from_str(r#"{"sub": "anna", "kn": {"read": ["/who/anna/**"]}}"#).unwrap();
//! let anna = Principal::from_token(&claims).unwrap();
//! assert!(rules.check(&anna, Operation::Read, &Topic::parse("/who/anna/notes").unwrap()).is_ok());
//! // The rules allow it; the token does not.
//! assert!(rules.check(&anna, Operation::Read, &Topic::parse("/who/bob/notes").unwrap()).is_err());
//! assert!(rules.check(&anna, Operation::Post, &Topic::parse("/who/anna/notes").unwrap()).is_err());
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;

use crate::error::{Error, ErrorKind, Result};
use crate::topic::Topic;

use super::rules::Pattern;
use super::{Operation, Principal};

/// The claims of a bearer token that say who it is and what it may do
/// (the times and the issuer are checked by whoever verified it).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct TokenClaims {
    /// The user (absent: a capability, see the module documentation).
    #[serde(default)]
    pub sub: Option<String>,
    /// Groups of the user, besides those of the rules file.
    #[serde(default)]
    pub groups: Vec<String>,
    /// Topic patterns per operation (`read`, `post`, `route`, `delete`,
    /// `replay`, `all`) the token is narrowed to.
    #[serde(default)]
    pub kn: Option<BTreeMap<String, Vec<String>>>,
    /// When the token expires, in seconds since the epoch.
    #[serde(default)]
    pub exp: Option<u64>,
}

/// Most patterns one token's `kn` claim may name: each is matched on every
/// check the token makes.
pub const MAX_TOKEN_PATTERNS: usize = 64;

/// What a token adds to, and takes from, its [`Principal`].
#[derive(Debug)]
pub(crate) struct Grant {
    /// The token's `groups`.
    pub(crate) groups: Vec<String>,
    /// Per operation bit, the patterns allowed; `None`: not narrowed.
    narrowed: Option<Vec<(u8, Pattern, String)>>,
    /// No `sub`: the grant is all there is.
    pub(crate) capability: bool,
    /// `exp`, seconds since the epoch.
    pub(crate) expires: Option<u64>,
}

impl Grant {
    /// The `kn` claim this grant was made of (`None`: not narrowed).
    pub(crate) fn claim(&self) -> Option<BTreeMap<String, Vec<String>>> {
        let narrowed = self.narrowed.as_ref()?;
        let mut claim: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (_, _, text) in narrowed {
            // "<operations> <pattern>": operations hold no space.
            let (op, pattern) = text.split_once(' ').unwrap_or((text.as_str(), ""));
            claim.entry(op.to_string()).or_default().push(pattern.to_string());
        }
        Some(claim)
    }
}

impl Principal {
    /// The principal of a verified token's `claims`. Errors
    /// ([`ErrorKind::BadRequest`]) name what is wrong with the `kn` claim:
    /// an unknown operation, a bad pattern, more than
    /// [`MAX_TOKEN_PATTERNS`] patterns.
    pub fn from_token(claims: &TokenClaims) -> Result<Principal> {
        let bad = |why: String| Error::new(ErrorKind::BadRequest, format!("the token's kn claim: {why}"));
        let narrowed = match &claims.kn {
            None => None,
            Some(map) => {
                let mut list = Vec::new();
                for (op, patterns) in map {
                    let bits = super::rules::parse_operations(op).map_err(&bad)?;
                    for text in patterns {
                        if list.len() == MAX_TOKEN_PATTERNS {
                            return Err(bad(format!("more than {MAX_TOKEN_PATTERNS} patterns")));
                        }
                        list.push((bits, super::rules::parse_pattern(text).map_err(&bad)?, format!("{op} {text}")));
                    }
                }
                Some(list)
            }
        };
        let user = claims.sub.as_deref().filter(|s| !s.is_empty());
        let grant = Grant {
            groups: if user.is_some() { claims.groups.clone() } else { Vec::new() },
            capability: user.is_none(),
            narrowed: if user.is_none() { Some(narrowed.unwrap_or_default()) } else { narrowed },
            expires: claims.exp,
        };
        let mut who = match user {
            Some(name) => Principal::user(name),
            None => Principal::anonymous(),
        };
        who.token = Some(Arc::new(grant));
        Ok(who)
    }

    /// A principal that may do nothing at all (a token capability naming
    /// nothing): what a request whose token was refused is, should it get
    /// past the refusal.
    pub fn nobody() -> Principal {
        Principal::from_token(&TokenClaims::default()).unwrap_or_default()
    }

    /// True when this principal came from a bearer token.
    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// When this principal's token expires (seconds since the epoch).
    pub fn token_expires(&self) -> Option<u64> {
        self.token.as_ref().and_then(|t| t.expires)
    }

    /// True when the token is a capability (no `sub`): the rules file is
    /// not consulted, only its `kn` claim.
    pub fn is_capability(&self) -> bool {
        self.token.as_ref().is_some_and(|t| t.capability)
    }

    /// What this principal's token grants, as a route made with it
    /// records it ([`KN_ROUTE_GRANT`](super::KN_ROUTE_GRANT)): its groups
    /// (`@name`), `kn` when a claim narrows it, and the claim's patterns
    /// (`operation:pattern`), separated by spaces, `%` and spaces escaped.
    /// `None` without a token. At most as long as the token itself.
    pub(crate) fn grant_record(&self) -> Option<String> {
        let grant = self.token.as_ref()?;
        let escape = |s: &str| s.replace('%', "%25").replace(' ', "%20");
        let mut items: Vec<String> = grant.groups.iter().map(|g| format!("@{}", escape(g))).collect();
        if let Some(narrowed) = &grant.narrowed {
            items.push("kn".to_string());
            for (_, _, text) in narrowed {
                let (op, pattern) = text.split_once(' ').unwrap_or((text.as_str(), ""));
                items.push(format!("{}:{}", escape(op), escape(pattern)));
            }
        }
        Some(items.join(" "))
    }

    /// The principal a route's deliveries are judged as when the route was
    /// made with a token ([`Principal::grant_record`]): its creator
    /// (`None`: a capability) with the recorded groups and claim, until
    /// `expires` (the route's `kn_expires`, no later than the token's).
    /// A record that cannot be read grants nothing at all.
    pub(crate) fn from_grant_record(creator: Option<&str>, record: &[u8], expires: u64) -> Principal {
        let unescape = |s: &str| s.replace("%20", " ").replace("%25", "%");
        let mut claims = TokenClaims { sub: creator.map(str::to_string), exp: Some(expires), ..TokenClaims::default() };
        let Ok(text) = std::str::from_utf8(record) else { return Principal::nobody() };
        for item in text.split(' ').filter(|i| !i.is_empty()) {
            if let Some(group) = item.strip_prefix('@') {
                claims.groups.push(unescape(group));
            } else if item == "kn" {
                claims.kn.get_or_insert_with(BTreeMap::new);
            } else if let Some((op, pattern)) = item.split_once(':') {
                claims.kn.get_or_insert_with(BTreeMap::new).entry(unescape(op)).or_default().push(unescape(pattern));
            } else {
                return Principal::nobody();
            }
        }
        Principal::from_token(&claims).unwrap_or_else(|_| Principal::nobody())
    }

    /// The groups the token adds.
    pub(crate) fn token_groups(&self) -> &[String] {
        self.token.as_ref().map_or(&[][..], |t| t.groups.as_slice())
    }

    /// True when something besides the rules narrows this principal: a
    /// bearer token (its claim, its expiry) or a cookie's channel
    /// ([`Principal::through_cookie`]). Without a rules file, such a
    /// principal is still checked ([`Principal::check_claim`]).
    pub fn is_narrowed(&self) -> bool {
        self.token.is_some() || self.reading_only
    }

    /// Whether what narrows this principal, besides the rules, allows `op`
    /// on `topic` (a topic's `kn_routes`, `kn_subtopics` and `kn_presence`
    /// checked as the topic itself): a cookie from elsewhere only reads
    /// ([`Principal::check_change`]); a token's `kn` claim must name a
    /// matching pattern for `op` (or the token has none), and the token
    /// must not have expired. The refusal is `403` (a credential was
    /// presented: logging in will not help), `401` for an expired token.
    pub fn check_claim(&self, op: Operation, topic: &Topic) -> Result<()> {
        if op != Operation::Read {
            self.check_change(&format!("{} '{topic}'", op.verb()))?;
        }
        let Some(grant) = &self.token else { return Ok(()) };
        if let Some(exp) = grant.expires {
            if exp <= now() {
                return Err(Error::new(ErrorKind::Unauthorized, "the bearer token expired: get a new one"));
            }
        }
        let Some(narrowed) = &grant.narrowed else { return Ok(()) };
        let topic = &*super::judged_as(topic);
        let segments: Vec<&str> = topic.segments().collect();
        if narrowed.iter().any(|(bits, pattern, _)| bits & op.bit() != 0 && pattern.matches(&segments, self.name(), None)) {
            return Ok(());
        }
        let whose = match self.name() {
            Some(name) => format!("the token of user '{name}'"),
            None => "the token".to_string(),
        };
        Err(Error::new(ErrorKind::Forbidden, format!("{whose} may not {} '{topic}': its kn claim does not allow it", op.verb())))
    }
}

/// Seconds since the epoch.
pub(crate) fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::Rules;

    fn claims(json: &str) -> TokenClaims {
        serde_json::from_str(json).unwrap()
    }

    fn topic(name: &str) -> Topic {
        Topic::parse(name).unwrap()
    }

    #[test]
    fn a_token_narrows_a_broad_rule() {
        let rules = Rules::parse("allow all /** users\n", "r".as_ref()).unwrap();
        let anna = Principal::from_token(&claims(r#"{"sub":"anna","kn":{"read":["/who/anna/**"],"post":["/what/chat"]}}"#)).unwrap();
        assert!(rules.check(&anna, Operation::Read, &topic("/who/anna/x")).is_ok());
        assert!(rules.check(&anna, Operation::Read, &topic("/who/anna/x/kn_routes")).is_ok());
        assert!(rules.check(&anna, Operation::Post, &topic("/what/chat")).is_ok());
        let err = rules.check(&anna, Operation::Read, &topic("/what/chat")).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Forbidden);
        assert!(err.message().contains("kn claim"), "{err}");
        assert!(rules.check(&anna, Operation::Route, &topic("/who/anna/x")).is_err());
        // Without a kn claim, the rules alone decide.
        let plain = Principal::from_token(&claims(r#"{"sub":"anna"}"#)).unwrap();
        assert!(rules.check(&plain, Operation::Route, &topic("/who/anna/x")).is_ok());
    }

    #[test]
    fn a_token_never_does_more_than_the_rules_allow() {
        let rules = Rules::parse("allow read /what/** users\n", "r".as_ref()).unwrap();
        let anna = Principal::from_token(&claims(r#"{"sub":"anna","kn":{"all":["/**"]}}"#)).unwrap();
        assert!(rules.check(&anna, Operation::Read, &topic("/what/x")).is_ok());
        assert_eq!(rules.check(&anna, Operation::Post, &topic("/what/x")).unwrap_err().kind(), ErrorKind::Forbidden);
    }

    #[test]
    fn token_groups_count_as_the_users_groups() {
        let rules = Rules::parse("group ops: carl\nallow post /what/staff/** @staff\n", "r".as_ref()).unwrap();
        let anna = Principal::from_token(&claims(r#"{"sub":"anna","groups":["staff"]}"#)).unwrap();
        assert!(rules.check(&anna, Operation::Post, &topic("/what/staff/x")).is_ok());
        assert!(rules.check(&Principal::user("anna"), Operation::Post, &topic("/what/staff/x")).is_err());
    }

    #[test]
    fn a_token_without_sub_is_a_capability_for_exactly_its_claim() {
        let rules = Rules::parse("deny all /** *\n", "r".as_ref()).unwrap();
        let cap = Principal::from_token(&claims(r#"{"groups":["staff"],"kn":{"read":["/what/chat"]}}"#)).unwrap();
        assert!(cap.is_capability());
        assert!(rules.check(&cap, Operation::Read, &topic("/what/chat")).is_ok());
        assert!(rules.check(&cap, Operation::Post, &topic("/what/chat")).is_err());
        assert!(rules.check(&cap, Operation::Read, &topic("/what/other")).is_err());
        // Without a kn claim: nothing.
        assert!(rules.check(&Principal::nobody(), Operation::Read, &topic("/what/chat")).is_err());
        assert!(Principal::nobody().check_claim(Operation::Read, &topic("/what/chat")).is_err());
    }

    #[test]
    fn an_expired_token_is_refused_401() {
        let anna = Principal::from_token(&claims(r#"{"sub":"anna","exp":1}"#)).unwrap();
        assert_eq!(anna.check_claim(Operation::Read, &topic("/x")).unwrap_err().kind(), ErrorKind::Unauthorized);
    }

    #[test]
    fn a_bad_kn_claim_is_refused() {
        assert!(Principal::from_token(&claims(r#"{"sub":"a","kn":{"write":["/x"]}}"#)).is_err());
        assert!(Principal::from_token(&claims(r#"{"sub":"a","kn":{"read":["x"]}}"#)).is_err());
        let many: Vec<String> = (0..=MAX_TOKEN_PATTERNS).map(|i| format!("\"/t{i}\"")).collect();
        let json = format!(r#"{{"sub":"a","kn":{{"read":[{}]}}}}"#, many.join(","));
        assert!(Principal::from_token(&claims(&json)).is_err());
        let json = format!(r#"{{"sub":"a","kn":{{"read":[{}]}}}}"#, many[..MAX_TOKEN_PATTERNS].join(","));
        assert!(Principal::from_token(&claims(&json)).is_ok());
    }

    #[test]
    fn a_grant_record_gives_back_the_tokens_groups_and_claim_until_it_expires() {
        let rules = Rules::parse("allow read,route /what/staff/** @staff\n", "r".as_ref()).unwrap();
        let later = now() + 600;
        let bob = Principal::from_token(&claims(r#"{"sub":"bob","groups":["staff","night shift"],"kn":{"read":["/what/staff/a/**"],"route":["/what/staff/**"]}}"#)).unwrap();
        let record = bob.grant_record().unwrap();
        assert_eq!(record, "@staff @night%20shift kn read:/what/staff/a/** route:/what/staff/**");
        let judged = Principal::from_grant_record(Some("bob"), record.as_bytes(), later);
        assert_eq!(judged, Principal::user("bob"));
        assert!(rules.check(&judged, Operation::Read, &topic("/what/staff/a/x")).is_ok());
        // The claim still narrows what the groups give.
        assert!(rules.check(&judged, Operation::Read, &topic("/what/staff/b")).is_err());
        assert!(rules.check(&Principal::user("bob"), Operation::Read, &topic("/what/staff/a/x")).is_err());
        // Past the route's expiry, nothing.
        let gone = Principal::from_grant_record(Some("bob"), record.as_bytes(), now() - 1);
        assert_eq!(rules.check(&gone, Operation::Read, &topic("/what/staff/a/x")).unwrap_err().kind(), ErrorKind::Unauthorized);
        // A capability's record: exactly its claim; a token without a claim: its groups.
        let cap = Principal::from_token(&claims(r#"{"kn":{"read":["/what/drop"]}}"#)).unwrap();
        let cap = Principal::from_grant_record(None, cap.grant_record().unwrap().as_bytes(), later);
        assert!(cap.is_capability() && rules.check(&cap, Operation::Read, &topic("/what/drop")).is_ok());
        let plain = Principal::from_token(&claims(r#"{"sub":"bob","groups":["staff"]}"#)).unwrap();
        assert_eq!(plain.grant_record().unwrap(), "@staff");
        let plain = Principal::from_grant_record(Some("bob"), b"@staff", later);
        assert!(rules.check(&plain, Operation::Read, &topic("/what/staff/b")).is_ok());
        // A record that cannot be read grants nothing.
        for bad in [&b"nonsense"[..], b"write:/x", b"read:x", b"\xff"] {
            let who = Principal::from_grant_record(Some("bob"), bad, later);
            assert!(rules.check(&who, Operation::Read, &topic("/what/staff/a/x")).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_token_user_is_the_same_creator_as_the_user() {
        let anna = Principal::from_token(&claims(r#"{"sub":"anna","kn":{"read":["/x"]}}"#)).unwrap();
        assert_eq!(anna, Principal::user("anna"));
    }
}
