//! RFC 8292 VAPID: the server's P-256 key pair, made once per store and
//! rotatable, and the `Authorization: vapid t=JWT, k=KEY` header it signs.

use std::fs;
use std::io::Write;
use std::path::Path;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use p256::ecdsa::signature::Signer;
use p256::ecdsa::{Signature, SigningKey};
use rand_core::OsRng;

use crate::error::{Error, ErrorKind, Result};

/// The longest a VAPID JWT may live (RFC 8292 section 2: at most 24 hours).
pub const MAX_JWT_SECONDS: u64 = 24 * 3600;

/// A server's VAPID key pair.
///
/// ```
/// let key = kn_push::VapidKey::generate();
/// let again = kn_push::VapidKey::from_text(&key.to_text()).unwrap();
/// assert_eq!(key.public_base64url(), again.public_base64url());
/// // What a page passes to pushManager.subscribe as applicationServerKey.
/// assert_eq!(key.public_base64url().len(), 87);
/// ```
#[derive(Clone)]
pub struct VapidKey {
    signing: SigningKey,
}

impl std::fmt::Debug for VapidKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VapidKey({})", self.public_base64url())
    }
}

impl VapidKey {
    /// A new random key pair.
    pub fn generate() -> VapidKey {
        VapidKey { signing: SigningKey::random(&mut OsRng) }
    }

    /// The private key as stored: its 32-byte scalar in base64url.
    pub fn to_text(&self) -> String {
        URL_SAFE_NO_PAD.encode(self.signing.to_bytes())
    }

    /// Reads [`to_text`](Self::to_text)'s form back (surrounding
    /// whitespace ignored).
    pub fn from_text(text: &str) -> Result<VapidKey> {
        let bad = || Error::new(ErrorKind::BadInput, "a VAPID private key is 32 bytes of base64url");
        let bytes = URL_SAFE_NO_PAD.decode(text.trim()).map_err(|_| bad())?;
        let signing = SigningKey::from_slice(&bytes).map_err(|_| bad())?;
        Ok(VapidKey { signing })
    }

    /// The public key, SEC 1 uncompressed (65 bytes), in base64url: the
    /// `k=` of the header and the page's `applicationServerKey`.
    pub fn public_base64url(&self) -> String {
        let point = self.signing.verifying_key().to_encoded_point(false);
        URL_SAFE_NO_PAD.encode(point.as_bytes())
    }

    /// Reads the key at `path`, or makes one there if there is none: the
    /// file is written under a temporary name with mode 0660 (the store's
    /// group, as `.session-key`) and linked into place, so two processes starting at once agree on one key.
    pub fn load_or_create(path: &Path) -> Result<VapidKey> {
        match fs::read_to_string(path) {
            Ok(text) => VapidKey::from_text(&text).map_err(|e| io(path, &e.to_string())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = VapidKey::generate();
                match key.write(path, false) {
                    Ok(()) => Ok(key),
                    // Another process made it first: use theirs.
                    Err(_) if path.exists() => VapidKey::load_or_create(path),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(io(path, &e.to_string())),
        }
    }

    /// Replaces the key at `path` with a new one and returns it. Browsers
    /// bind a subscription to the key it was made with: after a rotation,
    /// pages must subscribe again (the push services answer 403 to the
    /// old subscriptions).
    pub fn rotate(path: &Path) -> Result<VapidKey> {
        let key = VapidKey::generate();
        key.write(path, true)?;
        Ok(key)
    }

    fn write(&self, path: &Path, replace: bool) -> Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = path.parent().unwrap_or(Path::new("."));
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("vapid");
        let tmp = dir.join(format!("{name}.{}.tmp", std::process::id()));
        let result = (|| {
            let mut file = fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o660).open(&tmp)?;
            // Whatever the umask: the store's group reads it, others never.
            file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o660))?;
            file.write_all(self.to_text().as_bytes())?;
            file.write_all(b"\n")?;
            file.sync_all()?;
            if replace {
                fs::rename(&tmp, path)
            } else {
                fs::hard_link(&tmp, path)
            }
        })();
        let _ = fs::remove_file(&tmp);
        result.map_err(|e| io(path, &e.to_string()))
    }

    /// The value of the `Authorization` header for a push to `endpoint`:
    /// `vapid t=<ES256 JWT>, k=<public key>`, the JWT's `aud` being the
    /// endpoint's origin, `exp` `now + lifetime` (at most 24 hours) and
    /// `sub` the operator's `contact` (a `mailto:` or `https:` URL).
    pub fn authorization(&self, endpoint: &str, contact: &str, now: u64, lifetime: u64) -> Result<String> {
        let url = url::Url::parse(endpoint).map_err(|_| Error::new(ErrorKind::BadInput, format!("push endpoint '{endpoint}' is not a URL")))?;
        let aud = url.origin().ascii_serialization();
        let claims = serde_json::json!({"aud": aud, "exp": now + lifetime.min(MAX_JWT_SECONDS), "sub": contact});
        let header = URL_SAFE_NO_PAD.encode(br#"{"typ":"JWT","alg":"ES256"}"#);
        let signing_input = format!("{header}.{}", URL_SAFE_NO_PAD.encode(claims.to_string()));
        let signature: Signature = self.signing.sign(signing_input.as_bytes());
        Ok(format!(
            "vapid t={signing_input}.{}, k={}",
            URL_SAFE_NO_PAD.encode(signature.to_bytes()),
            self.public_base64url()
        ))
    }
}

fn io(path: &Path, why: &str) -> Error {
    Error::new(ErrorKind::Io, format!("VAPID key file '{}': {why}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_made_once_and_read_back_then_rotated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vapid");
        let first = VapidKey::load_or_create(&path).unwrap();
        let again = VapidKey::load_or_create(&path).unwrap();
        assert_eq!(first.public_base64url(), again.public_base64url());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o660);
        let rotated = VapidKey::rotate(&path).unwrap();
        assert_ne!(first.public_base64url(), rotated.public_base64url());
        assert_eq!(VapidKey::load_or_create(&path).unwrap().public_base64url(), rotated.public_base64url());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file left");
    }

    #[test]
    fn the_jwt_audience_is_the_endpoints_origin_and_its_life_at_most_a_day() {
        let key = VapidKey::generate();
        let header = key.authorization("https://fcm.googleapis.com:443/fcm/send/x", "mailto:ops@example.org", 1000, 7 * 24 * 3600).unwrap();
        let jwt = header.strip_prefix("vapid t=").unwrap().split(", k=").next().unwrap();
        let claims = URL_SAFE_NO_PAD.decode(jwt.split('.').nth(1).unwrap()).unwrap();
        let claims: serde_json::Value = serde_json::from_slice(&claims).unwrap();
        assert_eq!(claims["aud"], "https://fcm.googleapis.com");
        assert_eq!(claims["exp"], 1000 + MAX_JWT_SECONDS);
        assert_eq!(claims["sub"], "mailto:ops@example.org");
    }
}
