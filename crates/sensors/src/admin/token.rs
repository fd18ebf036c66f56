//! `kn token`: a bearer token signed with the store's own HS256 key
//! (`.token-key` in the store root, made on first use, mode 0660; kid
//! `store`), for the rules of docs/ACCESS.md, "Bearer tokens".

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::{SensorError, SensorErrorKind};

/// What a token says (see docs/ACCESS.md for the claims).
#[derive(Debug, Default)]
pub struct TokenSpec {
    /// `sub` (`None`: a capability for exactly `grants`).
    pub user: Option<String>,
    /// `groups`.
    pub groups: Vec<String>,
    /// The `kn` claim: operation to patterns (empty: not narrowed).
    pub grants: BTreeMap<String, Vec<String>>,
    /// How long it is valid.
    pub ttl: Duration,
    /// `iss`, `aud`, when set.
    pub issuer: Option<String>,
    /// `aud`.
    pub audience: Option<String>,
}

/// The token of `spec`, signed with the key of the store at `root` (made
/// there if it has none).
pub fn mint(root: &Path, spec: &TokenSpec) -> Result<String, SensorError> {
    let key = kn_journal::access::token_key_of_store(root, true)
        .map_err(|e| SensorError::from_journal(e, "cannot make the store's token key"))?
        .ok_or_else(|| SensorError::new(SensorErrorKind::TempFail, "no token key"))?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut claims = serde_json::json!({ "iat": now, "exp": now.saturating_add(spec.ttl.as_secs()) });
    if let Some(user) = &spec.user {
        claims["sub"] = user.as_str().into();
    }
    if !spec.groups.is_empty() {
        claims["groups"] = spec.groups.clone().into();
    }
    if !spec.grants.is_empty() || spec.user.is_none() {
        claims["kn"] = serde_json::to_value(&spec.grants).unwrap_or_default();
    }
    if let Some(iss) = &spec.issuer {
        claims["iss"] = iss.as_str().into();
    }
    if let Some(aud) = &spec.audience {
        claims["aud"] = aud.as_str().into();
    }
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    header.kid = Some("store".to_string());
    jsonwebtoken::encode(&header, &claims, &jsonwebtoken::EncodingKey::from_secret(&key))
        .map_err(|e| SensorError::new(SensorErrorKind::TempFail, format!("cannot sign the token: {e}")))
}

/// A lifetime: `90`, `90s`, `15m`, `1h`, `7d`.
pub fn parse_ttl(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
    let n: u64 = number.parse().map_err(|_| format!("bad lifetime '{text}': expected e.g. 90s, 15m, 1h, 7d"))?;
    let scale = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("bad lifetime '{text}': the unit is s, m, h or d")),
    };
    if n == 0 {
        return Err(format!("bad lifetime '{text}': a token must live at least a second"));
    }
    Ok(Duration::from_secs(n.saturating_mul(scale)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifetimes_parse_with_their_units() {
        assert_eq!(parse_ttl("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_ttl("15m").unwrap(), Duration::from_secs(900));
        assert_eq!(parse_ttl("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_ttl("7d").unwrap(), Duration::from_secs(604_800));
        assert!(parse_ttl("1w").is_err());
        assert!(parse_ttl("0").is_err());
        assert!(parse_ttl("h").is_err());
    }
}
