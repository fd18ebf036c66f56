//! How a tunnel ends when the access rules no longer let its reader read
//! its topic (docs/ACCESS.md, "What is checked"): the refusal's status
//! event (`403`, or `401` for anonymous) and the end of the page, as a
//! route whose creator lost the right is poisoned. A tunnel opened with a
//! bearer token ends the same way, with `401`, when the token expires
//! (its deadline; docs/ACCESS.md, "Bearer tokens"): the client reconnects
//! with a new token from its checkpoint.

use kn_journal::{ErrorKind, Event};
use kn_wire::{status_event, Format};

/// Sorts a tunnel read's result: the events (`Ok(Ok)`); the access rules'
/// refusal (`Ok(Err)`), which ends the tunnel (`ended` set); any other
/// error, and any read after the end (`Err`).
pub(crate) fn ended(read: kn_journal::Result<Vec<Event>>, ended: &mut bool) -> kn_journal::Result<Result<Vec<Event>, kn_journal::Error>> {
    if *ended {
        return Err(kn_journal::Error::new(ErrorKind::Forbidden, "this tunnel was ended by the access rules"));
    }
    match read {
        Ok(events) => Ok(Ok(events)),
        Err(err) if matches!(err.kind(), ErrorKind::Forbidden | ErrorKind::Unauthorized) => {
            *ended = true;
            Ok(Err(err))
        }
        Err(err) => Err(err),
    }
}

/// The last bytes of a tunnel the access rules ended: the refusal as a
/// status event in the tunnel's format, then the page's trailer.
pub(crate) fn refusal(format: Format, refused: kn_journal::Error, status_from: Option<&[u8]>) -> Vec<u8> {
    let (code, reason) = refused.kind().status();
    let status = status_event(code, reason, refused.message(), status_from);
    let mut out = Vec::new();
    format.write_event(&mut out, &status);
    out.extend_from_slice(format.padding());
    out.extend_from_slice(format.trailer());
    out
}

/// The [`std::time::Instant`] of `exp` (seconds since the epoch).
pub(crate) fn instant_of(exp: u64) -> std::time::Instant {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(exp);
    let left = at.duration_since(std::time::SystemTime::now()).unwrap_or_default();
    std::time::Instant::now() + left
}

/// The refusal ending a tunnel at its deadline when that is its token's
/// expiry (`token`) rather than its own `kn_expires` (`expires`, earlier).
pub(crate) fn token_expired(token: Option<std::time::Instant>, expires: Option<std::time::Instant>) -> Option<kn_journal::Error> {
    let token = token.filter(|t| std::time::Instant::now() >= *t)?;
    if expires.is_some_and(|e| e < token) {
        return None;
    }
    Some(kn_journal::Error::new(ErrorKind::Unauthorized, "this tunnel ended: its bearer token expired; reconnect with a new token from your checkpoint"))
}
