//! Who makes a request to `pubsub-cgi serve` (docs/ACCESS.md): the user a
//! trusted front proxy names in a header, or the user of Basic
//! credentials checked against an htpasswd file. Under CGI the web server
//! does this and sets `REMOTE_USER`.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use base64::Engine as _;
use sha2::{Digest as _, Sha256};

/// Successful checks remembered unless set otherwise
/// ([`Htpasswd::set_cache_limit`], `Config::auth_cache`), so that a
/// bcrypt hash is not computed again for every request of a logged-in
/// user.
const DEFAULT_REMEMBERED: usize = 256;

/// The longest `user:password` [`Authentication::identify`] checks (the
/// default of `Config::auth_max_credentials_bytes`).
const DEFAULT_MAX_CREDENTIALS: usize = 1024;

/// How `serve` learns the user of a request. The default trusts nothing:
/// every request is anonymous.
#[derive(Debug, Default)]
pub struct Authentication {
    /// Take the user from a header, but only on connections from these
    /// addresses (`--trusted-proxy`, `--user-header`).
    pub proxy: Option<TrustedProxy>,
    /// Check Basic credentials against this file (`--htpasswd`).
    pub htpasswd: Option<Htpasswd>,
}

/// A front proxy whose header names the user.
#[derive(Clone, Debug)]
pub struct TrustedProxy {
    /// The proxy's addresses: a header from anyone else is ignored.
    pub addresses: Vec<IpAddr>,
    /// The header it sets, e.g. `X-Remote-User` (any case).
    pub header: String,
}

/// Who a request is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Identity {
    /// No user.
    Anonymous,
    /// An authenticated user.
    User(String),
    /// Basic credentials that do not check out: answered `401`.
    BadCredentials,
}

impl Authentication {
    /// True when some way of authenticating is configured.
    pub fn is_configured(&self) -> bool {
        self.proxy.is_some() || self.htpasswd.is_some()
    }

    /// Who makes a request with `headers` (names in any case) on a
    /// connection from `peer`, checking a password where it is (slow:
    /// call it where blocking is fine; `serve` uses
    /// [`Authentication::begin`] and [`Authentication::verify`]).
    /// Credentials longer than `Config::auth_max_credentials_bytes`'s
    /// default (1024 bytes) are bad credentials.
    ///
    /// ```
    /// use kn_cgi::auth::{Authentication, Identity, TrustedProxy};
    ///
    /// let auth = Authentication {
    ///     proxy: Some(TrustedProxy { addresses: vec!["127.0.0.1".parse().unwrap()], header: "X-Remote-User".into() }),
    ///     htpasswd: None,
    /// };
    /// let headers = [("x-remote-user".to_string(), b"anna".to_vec())];
    /// assert_eq!(auth.identify(&headers, "127.0.0.1".parse().unwrap()), Identity::User("anna".into()));
    /// // From anyone else the header means nothing.
    /// assert_eq!(auth.identify(&headers, "10.0.0.7".parse().unwrap()), Identity::Anonymous);
    /// ```
    pub fn identify(&self, headers: &[(String, Vec<u8>)], peer: IpAddr) -> Identity {
        match self.begin(headers, peer, DEFAULT_MAX_CREDENTIALS) {
            Begun::Done(identity) => identity,
            Begun::TooLong(_) => Identity::BadCredentials,
            Begun::Verify(pending) => self.verify(pending),
        }
    }

    /// What [`Authentication::identify`] can tell without computing a
    /// password's hash (see [`Htpasswd::begin`]); `max_bytes` caps the
    /// `user:password` of Basic credentials. `serve` makes the rest, a
    /// [`Begun::Verify`], on a bounded pool of blocking threads
    /// ([`Authentication::verify`]).
    pub fn begin(&self, headers: &[(String, Vec<u8>)], peer: IpAddr, max_bytes: usize) -> Begun {
        let peer = peer.to_canonical();
        if let Some(proxy) = &self.proxy {
            if proxy.addresses.iter().any(|a| a.to_canonical() == peer) {
                let named = header(headers, &proxy.header).and_then(|v| std::str::from_utf8(v).ok()).map(str::trim);
                return Begun::Done(match named {
                    Some(user) if !user.is_empty() => Identity::User(user.to_string()),
                    _ => Identity::Anonymous,
                });
            }
        }
        match (&self.htpasswd, header(headers, "authorization")) {
            // A bearer token is judged with the request (crate::bearer).
            (Some(_), Some(credentials)) if crate::bearer::is_bearer(credentials) => Begun::Done(Identity::Anonymous),
            (Some(file), Some(credentials)) => file.begin(credentials, max_bytes),
            _ => Begun::Done(Identity::Anonymous),
        }
    }

    /// Checks the password of a [`Begun::Verify`]: slow (a bcrypt or
    /// MD5-crypt hash), call it where blocking is fine.
    pub fn verify(&self, pending: Pending) -> Identity {
        match self.htpasswd.as_ref().and_then(|file| file.verify(pending)) {
            Some(user) => Identity::User(user),
            None => Identity::BadCredentials,
        }
    }
}

fn header<'a>(headers: &'a [(String, Vec<u8>)], name: &str) -> Option<&'a [u8]> {
    headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_slice())
}

/// An htpasswd file (`user:hash` lines, as Apache's `htpasswd` writes
/// them) with any hash Apache on Linux accepts: Apache's MD5 (`$apr1$`,
/// `htpasswd`'s default, `-m`), bcrypt (`-B`), SHA-256 (`-2`), SHA-512
/// (`-5`), crypt (`-d`) or SHA-1 (`{SHA}`, `-s`). Read again when it
/// changes.
///
/// Checking a password is slow on purpose (bcrypt, 1,000 rounds of MD5):
/// [`Htpasswd::begin`] decides what needs no hash (a credential too long,
/// an unknown user, a check remembered), and [`Htpasswd::verify`] the rest,
/// on a thread that may block. Successful checks are remembered, at most
/// [`Htpasswd::set_cache_limit`] of them, by a keyed hash of the user,
/// the password and the user's line (never the password itself), and
/// forgotten when the file changes.
#[derive(Debug)]
pub struct Htpasswd {
    path: PathBuf,
    /// The key of the remembered checks' hashes: random, this process's.
    secret: [u8; 32],
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    stamp: Option<(SystemTime, u64)>,
    hashes: HashMap<String, String>,
    /// Bumped whenever the file is read again: a check begun before is
    /// not remembered.
    generation: u64,
    /// Successful checks: keyed hash to user, oldest first in `order`.
    verified: HashMap<[u8; 32], String>,
    order: VecDeque<[u8; 32]>,
    limit: usize,
}

impl State {
    fn remember(&mut self, key: [u8; 32], user: &str) {
        if self.limit == 0 || self.verified.contains_key(&key) {
            return;
        }
        while self.verified.len() >= self.limit {
            match self.order.pop_front() {
                Some(old) => {
                    self.verified.remove(&old);
                }
                None => break,
            }
        }
        self.verified.insert(key, user.to_string());
        self.order.push_back(key);
    }
}

/// What [`Htpasswd::begin`] found.
#[derive(Debug)]
pub enum Begun {
    /// Decided without computing a hash.
    Done(Identity),
    /// The credentials are longer than the limit: refused unchecked.
    TooLong(String),
    /// A password to check with [`Htpasswd::verify`], off the event loop.
    Verify(Pending),
}

/// A password check still to make ([`Htpasswd::verify`]).
pub struct Pending {
    user: String,
    password: String,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("Pending").field("user", &self.user).finish_non_exhaustive()
    }
}

impl Htpasswd {
    /// Reads the file at `path`. Errors name the file, line and user: a
    /// line without `:`, or a hash no one can check (plain text, which
    /// `htpasswd -p` writes and Apache on Linux refuses too; a malformed
    /// or unknown hash).
    pub fn load(path: &Path) -> Result<Htpasswd, String> {
        let (stamp, hashes) = read(path)?;
        let mut secret = [0u8; 32];
        getrandom::getrandom(&mut secret).map_err(|e| format!("cannot draw a random key: {e}"))?;
        let state = State { stamp, hashes, limit: DEFAULT_REMEMBERED, ..State::default() };
        Ok(Htpasswd { path: path.to_path_buf(), secret, state: Mutex::new(state) })
    }

    /// Sets how many successful checks are remembered (0: none).
    pub fn set_cache_limit(&self, limit: usize) {
        if let Ok(mut state) = self.state.lock() {
            state.limit = limit;
            while state.verified.len() > limit {
                let Some(old) = state.order.pop_front() else { break };
                state.verified.remove(&old);
            }
        }
    }

    /// The user whose Basic credentials `authorization` (the header's
    /// value) are; `None` when they are not valid. Blocks for as long as
    /// the hash takes: servers call [`Htpasswd::begin`] instead.
    pub fn check(&self, authorization: &[u8]) -> Option<String> {
        match self.begin(authorization, DEFAULT_MAX_CREDENTIALS) {
            Begun::Done(Identity::User(user)) => Some(user),
            Begun::Done(_) | Begun::TooLong(_) => None,
            Begun::Verify(pending) => self.verify(pending),
        }
    }

    /// What can be decided of `authorization` (the header's value) without
    /// computing a hash: credentials whose `user:password` is longer than
    /// `max_bytes`, that are not Basic, of a user the file does not name
    /// (all without reading a changed file, which [`Htpasswd::verify`]
    /// does), or a check remembered.
    pub fn begin(&self, authorization: &[u8], max_bytes: usize) -> Begun {
        let Some(text) = std::str::from_utf8(authorization).ok().map(str::trim) else {
            return Begun::Done(Identity::BadCredentials);
        };
        let Some((scheme, encoded)) = text.split_once(' ') else { return Begun::Done(Identity::BadCredentials) };
        if !scheme.eq_ignore_ascii_case("basic") {
            return Begun::Done(Identity::BadCredentials);
        }
        let encoded = encoded.trim();
        // Base64 takes 4 bytes for 3: refused before decoding anything.
        if encoded.len() / 4 * 3 > max_bytes.saturating_add(2) {
            return Begun::TooLong(too_long(max_bytes));
        }
        let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded) else {
            return Begun::Done(Identity::BadCredentials);
        };
        if decoded.len() > max_bytes {
            return Begun::TooLong(too_long(max_bytes));
        }
        let Ok(decoded) = String::from_utf8(decoded) else { return Begun::Done(Identity::BadCredentials) };
        let Some((user, password)) = decoded.split_once(':') else { return Begun::Done(Identity::BadCredentials) };
        let pending = Pending { user: user.to_string(), password: password.to_string() };
        let Ok(state) = self.state.lock() else { return Begun::Done(Identity::BadCredentials) };
        if stamp(&self.path) != state.stamp {
            // Changed: read again (a file read) with the check.
            return Begun::Verify(pending);
        }
        let Some(hash) = state.hashes.get(user) else { return Begun::Done(Identity::BadCredentials) };
        if state.verified.contains_key(&self.key(user, password, hash)) {
            return Begun::Done(Identity::User(pending.user));
        }
        Begun::Verify(pending)
    }

    /// Checks `pending`'s password (slow: call it where blocking is
    /// fine), reading the file again first if it changed; remembers a
    /// success.
    pub fn verify(&self, pending: Pending) -> Option<String> {
        let (hash, generation) = {
            let mut state = self.state.lock().ok()?;
            let stamp = stamp(&self.path);
            if stamp != state.stamp {
                // A changed file: read it again; a broken one admits no one.
                let (stamp, hashes) = read(&self.path).unwrap_or((stamp, HashMap::new()));
                let limit = state.limit;
                let generation = state.generation + 1;
                *state = State { stamp, hashes, generation, limit, ..State::default() };
            }
            (state.hashes.get(&pending.user)?.clone(), state.generation)
        };
        // Not under the lock: a slow hash must not hold up everyone
        // else's requests.
        if !crate::passwords::verify(&pending.password, &hash) {
            return None;
        }
        let key = self.key(&pending.user, &pending.password, &hash);
        let mut state = self.state.lock().ok()?;
        if state.generation == generation {
            state.remember(key, &pending.user);
        }
        Some(pending.user)
    }

    /// The remembered check's key: a hash of this process's secret, the
    /// user, the password and the user's hash line.
    fn key(&self, user: &str, password: &str, hash: &str) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(self.secret);
        for part in [user, password, hash] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        h.finalize().into()
    }
}

impl Pending {
    /// The user the credentials name.
    pub fn user(&self) -> &str {
        &self.user
    }
}

fn too_long(max: usize) -> String {
    format!("the Basic credentials (user:password) are longer than the limit of {max} bytes")
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

type Read = (Option<(SystemTime, u64)>, HashMap<String, String>);

fn read(path: &Path) -> Result<Read, String> {
    let stamp = stamp(path);
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read htpasswd file '{}': {e}", path.display()))?;
    let mut hashes = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = format!("{}:{}", path.display(), i + 1);
        let (user, hash) = line.split_once(':').ok_or_else(|| format!("{at}: expected 'user:hash'"))?;
        if let Err(why) = crate::passwords::kind(hash) {
            return Err(format!("{at}: user '{user}' has {why}: set the password again with 'htpasswd -B' (bcrypt)"));
        }
        hashes.insert(user.to_string(), hash.to_string());
    }
    Ok((stamp, hashes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `{SHA}` lines (quick to check), as `htpasswd -s` writes them.
    fn sha_line(user: &str, password: &str) -> String {
        use sha1::Digest as _;
        format!("{user}:{{SHA}}{}\n", base64::engine::general_purpose::STANDARD.encode(sha1::Sha1::digest(password.as_bytes())))
    }

    fn basic(credentials: &str) -> Vec<u8> {
        format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(credentials)).into_bytes()
    }

    fn file(lines: &str) -> (tempfile::TempDir, Htpasswd) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("users");
        std::fs::write(&path, lines).unwrap();
        let file = Htpasswd::load(&path).unwrap();
        (dir, file)
    }

    #[test]
    fn a_successful_check_is_remembered_by_a_keyed_hash_never_the_password() {
        let (_dir, users) = file(&sha_line("anna", "anna-secret"));
        assert!(matches!(users.begin(&basic("anna:anna-secret"), 1024), Begun::Verify(_)));
        assert_eq!(users.check(&basic("anna:anna-secret")), Some("anna".to_string()));
        assert!(matches!(users.begin(&basic("anna:anna-secret"), 1024), Begun::Done(Identity::User(_))), "remembered");
        assert!(matches!(users.begin(&basic("anna:wrong"), 1024), Begun::Verify(_)), "a wrong password is checked");
        let state = users.state.lock().unwrap();
        assert_eq!(state.verified.len(), 1);
        for key in state.verified.keys() {
            assert!(!key.windows(b"anna-secret".len()).any(|w| w == b"anna-secret"));
            assert!(!key.windows(4).any(|w| w == b"YW5u"), "not the header's base64 either");
        }
    }

    #[test]
    fn remembered_checks_are_bounded_oldest_first() {
        let lines: String = (0..4).map(|i| sha_line(&format!("u{i}"), "pw")).collect();
        let (_dir, users) = file(&lines);
        users.set_cache_limit(2);
        for i in 0..4 {
            assert!(users.check(&basic(&format!("u{i}:pw"))).is_some());
        }
        assert_eq!(users.state.lock().unwrap().verified.len(), 2);
        assert!(matches!(users.begin(&basic("u0:pw"), 1024), Begun::Verify(_)), "the oldest was forgotten");
        assert!(matches!(users.begin(&basic("u3:pw"), 1024), Begun::Done(Identity::User(_))));
        users.set_cache_limit(0);
        assert!(users.state.lock().unwrap().verified.is_empty());
    }

    #[test]
    fn a_changed_file_forgets_what_was_remembered() {
        let (dir, users) = file(&sha_line("anna", "old-password"));
        assert!(users.check(&basic("anna:old-password")).is_some());
        std::fs::write(dir.path().join("users"), sha_line("anna", "new-password!")).unwrap();
        assert!(matches!(users.begin(&basic("anna:old-password"), 1024), Begun::Verify(_)), "not taken from memory");
        assert_eq!(users.check(&basic("anna:old-password")), None);
        assert_eq!(users.check(&basic("anna:new-password!")), Some("anna".to_string()));
    }

    #[test]
    fn credentials_over_the_limit_are_refused_before_any_hash() {
        let (_dir, users) = file(&sha_line("anna", "abc"));
        // "anna:abc" is 8 bytes.
        assert!(matches!(users.begin(&basic("anna:abc"), 8), Begun::Verify(_)));
        assert!(matches!(users.begin(&basic("anna:abcd"), 8), Begun::TooLong(_)));
        let huge = basic(&format!("anna:{}", "x".repeat(250_000)));
        assert!(matches!(users.begin(&huge, 1024), Begun::TooLong(_)));
        // Unknown users and other schemes are answered at once.
        assert!(matches!(users.begin(&basic("bob:abc"), 1024), Begun::Done(Identity::BadCredentials)));
        assert!(matches!(users.begin(b"Bearer xyz", 1024), Begun::Done(Identity::BadCredentials)));
    }
}
