//! How a tunnel ends when the access rules no longer let its reader read
//! its topic (docs/ACCESS.md, "What is checked"): the refusal's status
//! event (`403`, or `401` for anonymous) and the end of the page, as a
//! route whose creator lost the right is poisoned.

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
