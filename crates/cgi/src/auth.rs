//! Who makes a request to `pubsub-cgi serve` (docs/ACCESS.md): the user a
//! trusted front proxy names in a header, or the user of Basic
//! credentials checked against an htpasswd file. Under CGI the web server
//! does this and sets `REMOTE_USER`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use base64::Engine as _;

/// Most verified credentials remembered (so that a bcrypt hash is not
/// computed again for every request of a logged-in user); past it the
/// memory is emptied and filled again.
const MAX_REMEMBERED: usize = 1024;

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
    /// connection from `peer`.
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
        let peer = peer.to_canonical();
        if let Some(proxy) = &self.proxy {
            if proxy.addresses.iter().any(|a| a.to_canonical() == peer) {
                let named = header(headers, &proxy.header).and_then(|v| std::str::from_utf8(v).ok()).map(str::trim);
                return match named {
                    Some(user) if !user.is_empty() => Identity::User(user.to_string()),
                    _ => Identity::Anonymous,
                };
            }
        }
        match (&self.htpasswd, header(headers, "authorization")) {
            (Some(file), Some(credentials)) => match file.check(credentials) {
                Some(user) => Identity::User(user),
                None => Identity::BadCredentials,
            },
            _ => Identity::Anonymous,
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
#[derive(Debug)]
pub struct Htpasswd {
    path: PathBuf,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    stamp: Option<(SystemTime, u64)>,
    hashes: HashMap<String, String>,
    /// `Authorization` values already verified, and their user.
    verified: HashMap<Vec<u8>, String>,
}

impl Htpasswd {
    /// Reads the file at `path`. Errors name the file, line and user: a
    /// line without `:`, or a hash no one can check (plain text, which
    /// `htpasswd -p` writes and Apache on Linux refuses too; a malformed
    /// or unknown hash).
    pub fn load(path: &Path) -> Result<Htpasswd, String> {
        let (stamp, hashes) = read(path)?;
        Ok(Htpasswd { path: path.to_path_buf(), state: Mutex::new(State { stamp, hashes, verified: HashMap::new() }) })
    }

    /// The user whose Basic credentials `authorization` (the header's
    /// value) are; `None` when they are not valid.
    pub fn check(&self, authorization: &[u8]) -> Option<String> {
        let text = std::str::from_utf8(authorization).ok()?.trim();
        let (scheme, encoded) = text.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("basic") {
            return None;
        }
        let decoded = base64::engine::general_purpose::STANDARD.decode(encoded.trim()).ok()?;
        let decoded = String::from_utf8(decoded).ok()?;
        let (user, password) = decoded.split_once(':')?;
        let hash = {
            let mut state = self.state.lock().ok()?;
            let stamp = stamp(&self.path);
            if stamp != state.stamp {
                // A changed file: read it again; a broken one admits no one.
                let (stamp, hashes) = read(&self.path).unwrap_or((stamp, HashMap::new()));
                *state = State { stamp, hashes, verified: HashMap::new() };
            }
            if let Some(user) = state.verified.get(authorization) {
                return Some(user.clone());
            }
            state.hashes.get(user)?.clone()
        };
        // Not under the lock: a slow hash (or a flood of wrong passwords)
        // must not hold up everyone else's requests.
        if !crate::passwords::verify(password, &hash) {
            return None;
        }
        let mut state = self.state.lock().ok()?;
        if state.verified.len() >= MAX_REMEMBERED {
            state.verified.clear();
        }
        state.verified.insert(authorization.to_vec(), user.to_string());
        Some(user.to_string())
    }
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
