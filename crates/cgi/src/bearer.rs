//! Bearer tokens (docs/ACCESS.md, "Bearer tokens"): JWTs checked with the
//! keys of `Config::token_keys` and the store's own key, made a
//! [`Principal`] by [`Principal::from_token`].
//!
//! A token is read from `Authorization: Bearer`, else the `kn_token`
//! parameter, else the cookie named by `Config::token_cookie`. Each key is
//! bound to one algorithm (`HS256`, `RS256`, `ES256`, `EdDSA`) and chosen
//! by the token's `kid` (a token without one: the only key configured),
//! so neither `alg: none` nor a token signed with another algorithm than
//! its key's is ever accepted. `exp` is required, `nbf` checked when
//! present, `iss` and `aud` when `Config::token_issuer` and
//! `Config::token_audience` are set. A token presented and refused is
//! answered `401` with `WWW-Authenticate: Bearer error="invalid_token"`
//! and the reason: never anonymous instead. The reason is this program's
//! own words: nothing of a token that was not verified (its `kid`, its
//! `alg`, a parser's quote of either) is ever echoed.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use jsonwebtoken::errors::ErrorKind as JwtKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use kn_journal::access::{Principal, TokenClaims};
use kn_journal::{Config, Store};
use sha2::{Digest as _, Sha256};

/// The query parameter a token may come in (for an `EventSource` of
/// another origin, which can set no header).
pub const TOKEN_PARAM: &str = "kn_token";

/// The kid of the store's own HS256 key (`.token-key`, made by
/// `kn token`).
pub const STORE_KID: &str = "store";

/// Why a token was refused: the `reason` label of
/// `kn_token_refusals_total` in /metrics (a bounded set).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Not a JWT at all, or a header or claims that cannot be read
    /// (`alg: none` included).
    Malformed,
    /// Longer than `Config::token_max_bytes`.
    TooLong,
    /// `exp` passed (or missing).
    Expired,
    /// `nbf` not reached.
    NotYetValid,
    /// `iss` not `Config::token_issuer`.
    WrongIssuer,
    /// `aud` not naming `Config::token_audience`.
    WrongAudience,
    /// The signature does not check out.
    BadSignature,
    /// Signed with another algorithm than its key's.
    WrongAlgorithm,
    /// No key of that `kid`.
    UnknownKid,
    /// A `kn` claim that cannot be understood.
    BadClaims,
}

impl Reason {
    /// Every reason, in the order /metrics lists them.
    pub const ALL: [Reason; 10] = [
        Reason::Malformed,
        Reason::TooLong,
        Reason::Expired,
        Reason::NotYetValid,
        Reason::WrongIssuer,
        Reason::WrongAudience,
        Reason::BadSignature,
        Reason::WrongAlgorithm,
        Reason::UnknownKid,
        Reason::BadClaims,
    ];

    /// The label in /metrics.
    pub fn label(self) -> &'static str {
        match self {
            Reason::Malformed => "malformed",
            Reason::TooLong => "too_long",
            Reason::Expired => "expired",
            Reason::NotYetValid => "not_yet_valid",
            Reason::WrongIssuer => "wrong_issuer",
            Reason::WrongAudience => "wrong_audience",
            Reason::BadSignature => "bad_signature",
            Reason::WrongAlgorithm => "wrong_algorithm",
            Reason::UnknownKid => "unknown_kid",
            Reason::BadClaims => "bad_claims",
        }
    }
}

/// Refusals counted by reason, since this process started.
static REFUSALS: [AtomicU64; Reason::ALL.len()] = [const { AtomicU64::new(0) }; Reason::ALL.len()];

/// How many tokens were refused for each reason (label, count).
pub fn refusals() -> Vec<(&'static str, u64)> {
    Reason::ALL.iter().map(|r| (r.label(), REFUSALS[*r as usize].load(Ordering::Relaxed))).collect()
}

/// A token presented and refused: answered `401`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    /// Why, as a /metrics label.
    pub reason: Reason,
    /// Why, for the answer's body.
    pub message: String,
}

impl Refused {
    fn new(reason: Reason, message: impl Into<String>) -> Refused {
        Refused { reason, message: format!("invalid bearer token ({}): {}", reason.label(), message.into()) }
    }

    /// Counts the refusal in /metrics: once per request answered `401`.
    pub fn count(&self) {
        REFUSALS[self.reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// The `WWW-Authenticate` header's value (RFC 6750 3): the
    /// description holds only what RFC 6750 allows there (printable ASCII
    /// but `"` and `\\`; anything else becomes `'` or a space).
    pub fn challenge(&self) -> String {
        let description: String = self
            .message
            .chars()
            .map(|c| match c {
                '"' | '\\' => '\'',
                ' '..='~' => c,
                _ => ' ',
            })
            .collect();
        format!("Bearer error=\"invalid_token\", error_description=\"{description}\"")
    }
}

/// A key and the one algorithm it checks.
struct Key {
    algorithm: Algorithm,
    key: DecodingKey,
}

/// The keys and settings tokens are checked with.
pub struct Verifier {
    keys: HashMap<String, Key>,
    root: PathBuf,
    /// The store's key, once read.
    store_key: OnceLock<Key>,
    issuer: Option<String>,
    audience: Option<String>,
    leeway: u64,
    max_bytes: usize,
    /// Tokens verified, by their SHA-256: presented again, they cost no
    /// signature check (`Config::token_cache`).
    remembered: Mutex<Remembered>,
}

/// Verified tokens, oldest first in `order`, at most `limit`.
#[derive(Default)]
struct Remembered {
    tokens: HashMap<[u8; 32], (Principal, u64)>,
    order: VecDeque<[u8; 32]>,
    limit: usize,
}

impl Remembered {
    fn recall(&mut self, digest: &[u8; 32]) -> Option<Principal> {
        let (who, exp) = self.tokens.get(digest)?;
        // `exp` has the leeway already (Verifier::check).
        if *exp > now() {
            return Some(who.clone());
        }
        // Expired: checked again, to be refused with its reason.
        self.tokens.remove(digest);
        self.order.retain(|d| d != digest);
        None
    }

    fn remember(&mut self, digest: [u8; 32], who: &Principal) {
        let Some(exp) = who.token_expires() else { return };
        if self.limit == 0 || self.tokens.contains_key(&digest) {
            return;
        }
        while self.tokens.len() >= self.limit {
            let Some(old) = self.order.pop_front() else { break };
            self.tokens.remove(&old);
        }
        self.tokens.insert(digest, (who.clone(), exp));
        self.order.push_back(digest);
    }
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier").field("kids", &self.keys.keys().collect::<Vec<_>>()).finish_non_exhaustive()
    }
}

impl Verifier {
    /// The verifier of `config`: reads every key file of
    /// `Config::token_keys`. Errors name the entry and what is wrong.
    pub fn new(config: &Config) -> Result<Verifier, String> {
        let mut keys = HashMap::new();
        for entry in config.token_keys.as_deref().unwrap_or("").split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (kid, key) = parse_entry(entry)?;
            if kid == STORE_KID || keys.insert(kid.to_string(), key).is_some() {
                return Err(format!("KN_TOKEN_KEYS: kid '{kid}' named twice (or reserved: '{STORE_KID}' is the store's own key)"));
            }
        }
        Ok(Verifier {
            keys,
            root: config.root.clone(),
            store_key: OnceLock::new(),
            issuer: config.token_issuer.clone(),
            audience: config.token_audience.clone(),
            leeway: config.token_leeway.as_secs(),
            max_bytes: config.token_max_bytes,
            remembered: Mutex::new(Remembered { limit: config.token_cache, ..Remembered::default() }),
        })
    }

    /// The principal of `token`, or why it is refused.
    pub fn verify(&self, token: &[u8]) -> Result<Principal, Refused> {
        if token.len() > self.max_bytes {
            return Err(Refused::new(Reason::TooLong, format!("longer than the limit of {} bytes (KN_TOKEN_MAX_BYTES)", self.max_bytes)));
        }
        let token = std::str::from_utf8(token).map_err(|_| Refused::new(Reason::Malformed, "not text"))?.trim();
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(who) = self.remembered().recall(&digest) {
            return Ok(who);
        }
        let who = self.check(token)?;
        self.remembered().remember(digest, &who);
        Ok(who)
    }

    /// True when checking `token` costs no public-key signature check:
    /// remembered, or HS256 (an HMAC), or refused before any signature.
    /// `serve` checks the others off its event loop.
    pub fn is_cheap(&self, token: &[u8]) -> bool {
        let Ok(token) = std::str::from_utf8(token).map(str::trim) else { return true };
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if self.remembered().tokens.contains_key(&digest) {
            return true;
        }
        jsonwebtoken::decode_header(token).map_or(true, |h| h.alg == Algorithm::HS256)
    }

    fn remembered(&self) -> std::sync::MutexGuard<'_, Remembered> {
        self.remembered.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The signature and claims check of [`Verifier::verify`].
    fn check(&self, token: &str) -> Result<Principal, Refused> {
        let header = jsonwebtoken::decode_header(token).map_err(|e| Refused::new(Reason::Malformed, unreadable_header(&e)))?;
        let key = self.key(header.kid.as_deref())?;
        if header.alg != key.algorithm {
            return Err(Refused::new(Reason::WrongAlgorithm, format!("signed with {:?}, but its key is for {:?}", header.alg, key.algorithm)));
        }
        let mut validation = Validation::new(key.algorithm);
        validation.leeway = self.leeway;
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp"]);
        match &self.audience {
            Some(audience) => validation.set_audience(&[audience]),
            None => validation.validate_aud = false,
        }
        if let Some(issuer) = &self.issuer {
            validation.set_issuer(&[issuer]);
            validation.set_required_spec_claims(&["exp", "iss"]);
        }
        let mut claims = jsonwebtoken::decode::<TokenClaims>(token, &key.key, &validation).map_err(refusal)?.claims;
        // Honoured until exp + leeway, everywhere (a tunnel's end, a
        // route's kn_expires, the checks of the journal): the same
        // instant the check here refuses it from.
        let until = claims.exp.map(|exp| exp.saturating_add(self.leeway));
        if until.is_some_and(|until| until <= now()) {
            return Err(Refused::new(Reason::Expired, "the token's exp has passed"));
        }
        claims.exp = until;
        Principal::from_token(&claims).map_err(|e| Refused::new(Reason::BadClaims, e.message()))
    }

    fn key(&self, kid: Option<&str>) -> Result<&Key, Refused> {
        match kid {
            Some(STORE_KID) => self.store_key(),
            // The kid is the token's, unverified: never echoed.
            Some(kid) => self.keys.get(kid).ok_or_else(|| Refused::new(Reason::UnknownKid, "unknown key")),
            None if self.keys.len() == 1 => Ok(self.keys.values().next().expect("one key")),
            None => Err(Refused::new(Reason::UnknownKid, "no kid, and not exactly one key configured")),
        }
    }

    fn store_key(&self) -> Result<&Key, Refused> {
        if let Some(key) = self.store_key.get() {
            return Ok(key);
        }
        match kn_journal::access::token_key_of_store(&self.root, false) {
            Ok(Some(bytes)) => Ok(self.store_key.get_or_init(|| Key { algorithm: Algorithm::HS256, key: DecodingKey::from_secret(&bytes) })),
            Ok(None) => Err(Refused::new(Reason::UnknownKid, "the store has no token key ('kn token' makes it)")),
            Err(e) => Err(Refused::new(Reason::UnknownKid, format!("the store's token key: {e}"))),
        }
    }
}

/// `KID=ALG:PATH`.
fn parse_entry(entry: &str) -> Result<(&str, Key), String> {
    let bad = |why: &str| format!("KN_TOKEN_KEYS: bad entry '{entry}': {why} (expected KID=ALG:PATH, ALG one of HS256, RS256, ES256, EdDSA)");
    let (kid, rest) = entry.split_once('=').ok_or_else(|| bad("no '='"))?;
    let (alg, path) = rest.split_once(':').ok_or_else(|| bad("no ':'"))?;
    let (kid, path) = (kid.trim(), Path::new(path.trim()));
    if kid.is_empty() {
        return Err(bad("empty kid"));
    }
    let bytes = std::fs::read(path).map_err(|e| bad(&format!("cannot read '{}': {e}", path.display())))?;
    let not_pem = |e: jsonwebtoken::errors::Error| bad(&format!("'{}' is not a PEM public key for {alg}: {e}", path.display()));
    let (algorithm, key) = match alg.trim() {
        "HS256" => {
            if bytes.len() < 32 {
                return Err(bad(&format!("'{}' has {} bytes: an HS256 key needs at least 32", path.display(), bytes.len())));
            }
            (Algorithm::HS256, DecodingKey::from_secret(&bytes))
        }
        "RS256" => (Algorithm::RS256, DecodingKey::from_rsa_pem(&bytes).map_err(not_pem)?),
        "ES256" => (Algorithm::ES256, DecodingKey::from_ec_pem(&bytes).map_err(not_pem)?),
        "EdDSA" => (Algorithm::EdDSA, DecodingKey::from_ed_pem(&bytes).map_err(not_pem)?),
        other => return Err(bad(&format!("unknown algorithm '{other}'"))),
    };
    Ok((kid, Key { algorithm, key }))
}

/// Why a token's header cannot be read, in words of ours: the error's own
/// text may quote the token (serde names an unknown `alg` as given).
fn unreadable_header(e: &jsonwebtoken::errors::Error) -> &'static str {
    match e.kind() {
        JwtKind::InvalidToken => "not a JWT (three base64url parts)",
        JwtKind::Base64(_) => "its header is not base64url",
        JwtKind::Utf8(_) => "its header is not UTF-8",
        JwtKind::Json(_) => "its header is not a JWT header (JSON naming a known alg)",
        _ => "cannot read its header",
    }
}

/// The refusal of a token `jsonwebtoken::decode` refused, in words of
/// ours (the error's text may quote the token's claims).
fn refusal(e: jsonwebtoken::errors::Error) -> Refused {
    let (reason, message): (Reason, Cow<'static, str>) = match e.kind() {
        JwtKind::ExpiredSignature => (Reason::Expired, "the token's exp has passed".into()),
        // The claim names are ours (the validation's required claims).
        JwtKind::MissingRequiredClaim(claim) if claim == "exp" => (Reason::Expired, "it has no exp".into()),
        JwtKind::MissingRequiredClaim(claim) if claim == "iss" => (Reason::WrongIssuer, "it has no iss".into()),
        JwtKind::ImmatureSignature => (Reason::NotYetValid, "its nbf is not reached".into()),
        JwtKind::InvalidIssuer => (Reason::WrongIssuer, "its iss is not KN_TOKEN_ISSUER".into()),
        JwtKind::InvalidAudience => (Reason::WrongAudience, "its aud does not name KN_TOKEN_AUDIENCE".into()),
        JwtKind::InvalidSignature => (Reason::BadSignature, "its signature does not check out".into()),
        JwtKind::InvalidAlgorithm => (Reason::WrongAlgorithm, "signed with another algorithm than its key's".into()),
        JwtKind::InvalidToken => (Reason::Malformed, "not a JWT (three base64url parts)".into()),
        JwtKind::Base64(_) => (Reason::Malformed, "a part is not base64url".into()),
        JwtKind::Json(_) | JwtKind::Utf8(_) => (Reason::Malformed, "its claims are not the JSON a token needs".into()),
        JwtKind::InvalidClaimFormat(claim) if ["exp", "nbf", "iat", "iss", "aud", "sub"].contains(&claim.as_str()) => {
            (Reason::Malformed, format!("its {claim} claim is not of the right type").into())
        }
        _ => (Reason::Malformed, "cannot be read".into()),
    };
    Refused::new(reason, message)
}

/// The verifiers of this process, one per store root (read when first
/// needed).
fn verifier(store: &Store) -> Result<Arc<Verifier>, Refused> {
    type Verifiers = HashMap<PathBuf, Result<Arc<Verifier>, String>>;
    static VERIFIERS: OnceLock<Mutex<Verifiers>> = OnceLock::new();
    let mut all = VERIFIERS.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    let made = all.entry(store.config().root.clone()).or_insert_with(|| Verifier::new(store.config()).map(Arc::new));
    made.clone().map_err(|why| Refused::new(Reason::UnknownKid, why))
}

/// The token a request brings: the `Authorization: Bearer` header's, else
/// the `kn_token` parameter's, else the cookie's (`cookie`: its value,
/// when `Config::token_cookie` names one).
pub fn presented<'a>(authorization: Option<&'a [u8]>, param: Option<&'a [u8]>, cookie: Option<&'a [u8]>) -> Option<&'a [u8]> {
    let bearer = authorization.and_then(|value| {
        let value = value.trim_ascii();
        if value.eq_ignore_ascii_case(b"bearer") {
            // Presented, but empty: refused, never anonymous.
            return Some(&value[value.len()..]);
        }
        let (scheme, rest) = value.split_at(value.iter().position(|&b| b == b' ')?);
        scheme.eq_ignore_ascii_case(b"bearer").then(|| rest.trim_ascii())
    });
    bearer.or(param).or(cookie)
}

/// True when `authorization` (a header's value) is of the Bearer scheme:
/// `serve`'s password checks leave it alone.
pub fn is_bearer(authorization: &[u8]) -> bool {
    presented(Some(authorization), None, None).is_some()
}

/// The principal of `token` under `store`'s settings.
pub fn principal(store: &Store, token: &[u8]) -> Result<Principal, Refused> {
    verifier(store)?.verify(token)
}

/// The answer to a request whose token was refused: `401` with
/// `WWW-Authenticate: Bearer error="invalid_token"` and the reason as a
/// status event in the request's format; counted in /metrics.
pub(crate) fn refused_response(format: kn_wire::Format, page: &kn_wire::Page, status_from: Option<&[u8]>, refused: &Refused) -> crate::response::Response {
    use crate::response::{Head, Response, Status};
    refused.count();
    let status = kn_wire::status_event(401, "Unauthorized", refused.message.as_str(), status_from);
    match Response::events(format, page, &[status]) {
        Ok(mut r) => {
            r.head.headers.push(("WWW-Authenticate".to_string(), refused.challenge()));
            r
        }
        Err(_) => Response::new(Head::new(Some(Status::new(500, "Internal Server Error")), "text/plain"), Vec::new()),
    }
}

/// [`Verifier::is_cheap`] under `store`'s settings.
pub fn is_cheap(store: &Store, token: &[u8]) -> bool {
    verifier(store).map_or(true, |v| v.is_cheap(token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_header_wins_then_the_parameter_then_the_cookie() {
        assert_eq!(presented(Some(b"Bearer abc"), Some(b"p"), Some(b"c")), Some(&b"abc"[..]));
        assert_eq!(presented(Some(b"bearer  abc "), None, None), Some(&b"abc"[..]));
        assert_eq!(presented(Some(b"Basic xyz"), Some(b"p"), Some(b"c")), Some(&b"p"[..]));
        assert_eq!(presented(None, None, Some(b"c")), Some(&b"c"[..]));
        assert_eq!(presented(None, None, None), None);
        assert!(is_bearer(b"Bearer x") && !is_bearer(b"Basic x"));
        assert_eq!(presented(Some(b"Bearer"), None, None), Some(&b""[..]));
    }

    fn hs256(secret: &[u8], sub: &str, exp: u64) -> String {
        let mut header = jsonwebtoken::Header::new(Algorithm::HS256);
        header.kid = Some("k".into());
        let claims = serde_json::json!({"sub": sub, "exp": exp});
        jsonwebtoken::encode(&header, &claims, &jsonwebtoken::EncodingKey::from_secret(secret)).unwrap()
    }

    #[test]
    fn verified_tokens_are_remembered_bounded_oldest_first_and_never_past_expiry() {
        let dir = tempfile::tempdir().unwrap();
        let secret = [9u8; 32];
        let key = dir.path().join("k");
        std::fs::write(&key, secret).unwrap();
        let mut config = Config::new(dir.path().join("kn_events"));
        config.token_keys = Some(format!("k=HS256:{}", key.display()));
        config.token_cache = 2;
        config.token_leeway = std::time::Duration::ZERO;
        let verifier = Verifier::new(&config).unwrap();
        let tokens: Vec<String> = ["a", "b", "c"].iter().map(|u| hs256(&secret, u, now() + 60)).collect();
        for t in &tokens {
            assert!(verifier.verify(t.as_bytes()).is_ok());
        }
        let remembered = verifier.remembered();
        assert_eq!(remembered.tokens.len(), 2, "at most the limit");
        let digest = |t: &str| -> [u8; 32] { Sha256::digest(t.as_bytes()).into() };
        assert!(!remembered.tokens.contains_key(&digest(&tokens[0])), "the oldest was forgotten");
        assert!(remembered.tokens.contains_key(&digest(&tokens[2])));
        drop(remembered);
        // A remembered token past its expiry is checked again, and refused.
        let soon = hs256(&secret, "d", now() + 1);
        assert!(verifier.verify(soon.as_bytes()).is_ok());
        std::thread::sleep(std::time::Duration::from_millis(2100));
        assert_eq!(verifier.verify(soon.as_bytes()).unwrap_err().reason, Reason::Expired);
        // None remembered at 0.
        config.token_cache = 0;
        let none = Verifier::new(&config).unwrap();
        assert!(none.verify(tokens[0].as_bytes()).is_ok());
        assert!(none.remembered().tokens.is_empty());
    }

    /// A token with `header` (JSON text), claims `{}` and a made-up
    /// signature, as the reviewer's link carries it.
    fn forged(header: &str) -> String {
        use base64::Engine as _;
        format!("{}.e30.c2ln", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(header))
    }

    #[test]
    fn unverified_token_text_is_never_echoed() {
        let dir = tempfile::tempdir().unwrap();
        let verifier = Verifier::new(&Config::new(dir.path().join("kn_events"))).unwrap();
        let evil = "x\r\nSet-Cookie: kn=1\r\n\r\n<script>alert(1)</script>";
        let json = |s: &str| serde_json::to_string(s).unwrap();
        for (header, reason) in [
            (format!(r#"{{"alg":"HS256","kid":{}}}"#, json(evil)), Reason::UnknownKid),
            (format!(r#"{{"alg":{},"kid":"k"}}"#, json(evil)), Reason::Malformed),
            (format!(r#"{{"alg":"HS256","kid":"k","typ":{}}}"#, json(&format!("{evil}\u{1}"))), Reason::UnknownKid),
            (format!(r#"{{"alg":"HS256","kid":{},"kid":"y"}}"#, json(evil)), Reason::Malformed),
        ] {
            let refused = verifier.verify(forged(&header).as_bytes()).unwrap_err();
            assert_eq!(refused.reason, reason, "{header}: {refused:?}");
            for text in [&refused.message, &refused.challenge()] {
                assert!(!text.contains("kn=1") && !text.contains("alert") && !text.contains("Set-Cookie"), "token text echoed: {text}");
                assert!(!text.chars().any(|c| c.is_ascii_control()), "{text:?}");
            }
        }
        let unknown = verifier.verify(forged(r#"{"alg":"HS256","kid":"secret-kid-name"}"#).as_bytes()).unwrap_err();
        assert!(!unknown.message.contains("secret-kid-name"), "{}", unknown.message);
        assert_eq!(unknown.message, "invalid bearer token (unknown_kid): unknown key");
    }

    #[test]
    fn bad_key_entries_name_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let short = dir.path().join("short");
        std::fs::write(&short, b"too short").unwrap();
        let mut config = Config::new(dir.path().join("kn_events"));
        for (keys, says) in [
            ("a", "no '='"),
            ("a=HS256", "no ':'"),
            ("=HS256:/x", "empty kid"),
            ("a=HS512:/x", "cannot read"),
            (&format!("a=HS256:{}", short.display()), "at least 32"),
            (&format!("a=RS256:{}", short.display()), "not a PEM"),
            (&format!("a=XX:{}", short.display()), "unknown algorithm"),
        ] {
            config.token_keys = Some(keys.to_string());
            let err = Verifier::new(&config).unwrap_err();
            assert!(err.contains(says), "{keys}: {err}");
        }
    }
}
