//! Anonymous visitors' sessions: a capability the server hands out
//! (docs/ACCESS.md, "Anonymous visitors").
//!
//! A session is an id and a token `<id>.<mac>`, the MAC an HMAC-SHA-256 of
//! the id under the store's session key (`.session-key` in the store root,
//! made on first use). The visitor keeps the token in a cookie
//! ([`SESSION_COOKIE`]); a request that brings a token whose MAC checks
//! out is made by [`Principal::anonymous_session`](super::Principal::anonymous_session), which the rules'
//! `{session}` segment matches. The journal is named by the id alone, so
//! knowing a journal's name (from a route, a listing, a log) gives nothing:
//! only the cookie does.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::{Error, ErrorKind, Result};


/// The cookie that carries an anonymous visitor's session token.
pub const SESSION_COOKIE: &str = "kn_session";

/// The file in the store root holding the session key.
const KEY_FILE: &str = ".session-key";

/// The key's length in bytes.
const KEY_BYTES: usize = 32;

/// Longest token accepted (an id of fresh_id's 16 characters, a dot and
/// 64 hex digits is 81): anything longer is not one of ours.
const MAX_TOKEN_BYTES: usize = 128;

/// The store's session key: signs and verifies session tokens.
#[derive(Clone)]
pub struct SessionKey([u8; KEY_BYTES]);

impl std::fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKey(..)")
    }
}

impl SessionKey {
    /// A key from its bytes (tests, embedders).
    pub fn from_bytes(bytes: [u8; KEY_BYTES]) -> SessionKey {
        SessionKey(bytes)
    }

    /// The key of the store at `root`: read from `root/.session-key`,
    /// made there first if there is none (atomically: processes racing to
    /// make it all end up with the one that was linked first).
    pub fn of_store(root: &Path) -> Result<SessionKey> {
        let key = key_file(root, KEY_FILE, "session key", true)?;
        key.map(SessionKey).ok_or_else(|| Error::new(ErrorKind::Io, "no session key"))
    }

    fn mac(&self) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(b"kn_session\0");
        mac
    }

    /// A fresh session: its id and the token `<id>.<mac>` that proves it.
    pub fn new_session(&self) -> (String, String) {
        let id = crate::ids::fresh_id();
        let token = self.sign(&id);
        (id, token)
    }

    /// The token of session `id`.
    pub fn sign(&self, id: &str) -> String {
        let mut mac = self.mac();
        mac.update(id.as_bytes());
        let tag = mac.finalize().into_bytes();
        let mut token = String::with_capacity(id.len() + 1 + 2 * tag.len());
        token.push_str(id);
        token.push('.');
        for b in tag {
            token.push_str(&format!("{b:02x}"));
        }
        token
    }

    /// The session id `token` proves, if its MAC checks out (compared in
    /// constant time); `None` for anything else.
    pub fn verify(&self, token: &[u8]) -> Option<String> {
        if token.len() > MAX_TOKEN_BYTES {
            return None;
        }
        let text = std::str::from_utf8(token).ok()?;
        let (id, hex) = text.rsplit_once('.')?;
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') || hex.len() != 64 {
            return None;
        }
        let tag: Vec<u8> = (0..32).map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()).collect::<Option<_>>()?;
        let mut mac = self.mac();
        mac.update(id.as_bytes());
        mac.verify_slice(&tag).ok()?;
        Some(id.to_string())
    }
}

/// The file in the store root holding the key bearer tokens of `kn token`
/// are signed with (HS256, kid `store`; docs/ACCESS.md, "Bearer tokens").
pub const TOKEN_KEY_FILE: &str = ".token-key";

/// The store's bearer-token key (`root/.token-key`, 32 random bytes,
/// mode 0660 like the session key): `None` when there is none and
/// `create` is false; made first (atomically) when `create` is true.
pub fn token_key_of_store(root: &Path, create: bool) -> Result<Option<[u8; KEY_BYTES]>> {
    key_file(root, TOKEN_KEY_FILE, "token key", create)
}

/// The key in `root/file`: read, else (`create`) made there first,
/// atomically: processes racing to make it all end up with the one that
/// was linked first.
fn key_file(root: &Path, file: &str, what: &str, create: bool) -> Result<Option<[u8; KEY_BYTES]>> {
    let path = root.join(file);
    match std::fs::read(&path) {
        Ok(bytes) => return parse_key(&bytes, &path, what).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(&format!("cannot read the {what}"), &path, e)),
    }
    let key: [u8; KEY_BYTES] = crate::ids::random_bytes::<16>()
        .into_iter()
        .chain(crate::ids::random_bytes::<16>())
        .collect::<Vec<u8>>()
        .try_into()
        .map_err(|_| Error::new(ErrorKind::Io, format!("{what} of the wrong length")))?;
    let tmp = root.join(format!("{file}.{}.tmp", crate::ids::fresh_id()));
    // Group-readable and -writable, as every file of the store (the
    // server's processes share a group: docs/DEPLOY.md), but never
    // world-readable: whoever reads it can make sessions or tokens.
    let written = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o660).open(&tmp).and_then(|mut f| {
        f.set_permissions(std::fs::Permissions::from_mode(0o660))?;
        f.write_all(&key)?;
        f.sync_all()
    });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io(&format!("cannot write the {what}"), &tmp, e));
    }
    // link(2) never replaces: the first process to link wins, and
    // every process then reads that one.
    let linked = std::fs::hard_link(&tmp, &path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(Some(key)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let bytes = std::fs::read(&path).map_err(|e| Error::io(&format!("cannot read the {what}"), &path, e))?;
            parse_key(&bytes, &path, what).map(Some)
        }
        Err(e) => Err(Error::io(&format!("cannot make the {what}"), &path, e)),
    }
}

fn parse_key(bytes: &[u8], path: &Path, what: &str) -> Result<[u8; KEY_BYTES]> {
    bytes.try_into().map_err(|_| {
        Error::new(
            ErrorKind::Io,
            format!("{what} '{}' has {} bytes, not {KEY_BYTES}: remove it to make a new one", path.display(), bytes.len()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_verifies_only_under_its_key_and_unchanged() {
        let key = SessionKey::from_bytes([7; KEY_BYTES]);
        let (id, token) = key.new_session();
        assert_eq!(key.verify(token.as_bytes()).as_deref(), Some(id.as_str()));
        let other = SessionKey::from_bytes([8; KEY_BYTES]);
        assert_eq!(other.verify(token.as_bytes()), None);
        // The id alone, another id with this MAC, a changed MAC: refused.
        assert_eq!(key.verify(id.as_bytes()), None);
        let (_, mac) = token.rsplit_once('.').unwrap();
        assert_eq!(key.verify(format!("x{id}.{mac}").as_bytes()), None);
        let mut flipped = token.clone().into_bytes();
        let last = flipped.len() - 1;
        flipped[last] = if flipped[last] == b'0' { b'1' } else { b'0' };
        assert_eq!(key.verify(&flipped), None);
        assert_eq!(key.verify(&[b'a'; MAX_TOKEN_BYTES + 1]), None);
    }

    #[test]
    fn the_store_key_is_made_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let a = SessionKey::of_store(dir.path()).unwrap();
        let mode = std::fs::metadata(dir.path().join(KEY_FILE)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o660, "group read and write, nothing for others");
        let b = SessionKey::of_store(dir.path()).unwrap();
        assert_eq!(a.0, b.0);
        let (_, token) = a.new_session();
        assert!(b.verify(token.as_bytes()).is_some());
        std::fs::write(dir.path().join(KEY_FILE), b"short").unwrap();
        let err = SessionKey::of_store(dir.path()).unwrap_err();
        assert!(err.message().contains("remove it to make a new one"), "{err}");
    }
}
