//! Events: sets of byte-string elements (PROTOCOL.md section 1).

use std::collections::BTreeMap;
use std::fmt;

use crate::error::{Error, ErrorKind};

/// `kn_payload`: the body.
pub const KN_PAYLOAD: &[u8] = b"kn_payload";
/// `kn_id`: the event id.
pub const KN_ID: &[u8] = b"kn_id";
/// `kn_time_t`: seconds since the epoch.
pub const KN_TIME_T: &[u8] = b"kn_time_t";
/// `kn_expires`: `infinity`, an absolute time or `+N`.
pub const KN_EXPIRES: &[u8] = b"kn_expires";
/// `kn_route_checkpoint`: assigned each time an event is stored.
pub const KN_ROUTE_CHECKPOINT: &[u8] = b"kn_route_checkpoint";
/// `kn_route_location`: URI of the route an event last travelled.
pub const KN_ROUTE_LOCATION: &[u8] = b"kn_route_location";
/// `kn_route_id`: id of the route an event last travelled.
pub const KN_ROUTE_ID: &[u8] = b"kn_route_id";
/// `kn_routed_from`: absolute URI of the topic an event was forwarded from.
pub const KN_ROUTED_FROM: &[u8] = b"kn_routed_from";
/// `status`: only on status events.
pub const STATUS: &[u8] = b"status";

// The elements of a `kn_presence` event (docs/PRESENCE.md).
/// The element saying what a presence event is: `join` or `leave`.
pub const KN_PRESENCE: &[u8] = b"kn_presence";
/// The journal a presence event is about (also its `kn_payload`).
pub const KN_PRESENCE_JOURNAL: &[u8] = b"kn_presence_journal";
/// Since when the journal has been connected (seconds since the epoch).
pub const KN_PRESENCE_SINCE: &[u8] = b"kn_presence_since";
/// On a `leave`: when the journal was first found without a tunnel.
pub const KN_PRESENCE_LEFT: &[u8] = b"kn_presence_left";
/// The id of the route that makes the journal a subscriber of the topic.
pub const KN_PRESENCE_ROUTE: &[u8] = b"kn_presence_route";

/// A PubSub event: unique element names mapped to values, both arbitrary
/// byte strings (NUL, newlines and invalid UTF-8 included).
///
/// ```
/// use kn_journal::Event;
///
/// let mut e = Event::new();
/// e.set("kn_id", "e1").set("kn_payload", "hello");
/// assert_eq!(e.id(), Some(&b"e1"[..]));
/// assert_eq!(e.payload(), b"hello");
/// assert_eq!(Event::new().payload(), b"", "a missing payload is empty");
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Event {
    elements: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl Event {
    /// An event with no elements.
    pub fn new() -> Event {
        Event::default()
    }

    /// Builds an event from `(name, value)` pairs; a later pair with the
    /// same name wins.
    pub fn from_pairs<N, V, I>(pairs: I) -> Event
    where
        N: Into<Vec<u8>>,
        V: Into<Vec<u8>>,
        I: IntoIterator<Item = (N, V)>,
    {
        Event { elements: pairs.into_iter().map(|(n, v)| (n.into(), v.into())).collect() }
    }

    /// Sets element `name` to `value`, replacing any earlier value.
    pub fn set(&mut self, name: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> &mut Event {
        self.elements.insert(name.into(), value.into());
        self
    }

    /// The value of element `name`.
    pub fn get(&self, name: impl AsRef<[u8]>) -> Option<&[u8]> {
        self.elements.get(name.as_ref()).map(Vec::as_slice)
    }

    /// The value of element `name` as text (lossy), if present.
    pub fn get_str(&self, name: impl AsRef<[u8]>) -> Option<String> {
        self.get(name).map(|v| String::from_utf8_lossy(v).into_owned())
    }

    /// Removes element `name`, returning its value.
    pub fn remove(&mut self, name: impl AsRef<[u8]>) -> Option<Vec<u8>> {
        self.elements.remove(name.as_ref())
    }

    /// True if element `name` is present.
    pub fn contains(&self, name: impl AsRef<[u8]>) -> bool {
        self.elements.contains_key(name.as_ref())
    }

    /// `kn_payload`, or empty when absent.
    pub fn payload(&self) -> &[u8] {
        self.get(KN_PAYLOAD).unwrap_or(b"")
    }

    /// `kn_id`, if set.
    pub fn id(&self) -> Option<&[u8]> {
        self.get(KN_ID)
    }

    /// `kn_route_checkpoint`, if set.
    pub fn checkpoint(&self) -> Option<&[u8]> {
        self.get(KN_ROUTE_CHECKPOINT)
    }

    /// The elements in name order.
    pub fn elements(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.elements.iter().map(|(n, v)| (n.as_slice(), v.as_slice()))
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.elements.len()
    }

    /// True when the event has no element at all.
    pub fn is_empty(&self) -> bool {
        self.elements.is_empty()
    }

    /// The total size of names and values in bytes.
    pub fn byte_size(&self) -> usize {
        self.elements.iter().map(|(n, v)| n.len() + v.len()).sum()
    }

    /// The absolute expiry time (seconds since the epoch), if the event has
    /// a `kn_expires` that is neither absent nor `infinity`. A relative
    /// `+N` is read against `now`.
    pub fn expires_at(&self, now: f64) -> Result<Option<f64>, Error> {
        match self.get(KN_EXPIRES) {
            None => Ok(None),
            Some(v) => parse_expires(v, now),
        }
    }

    /// True when `kn_expires` lies in the past (an unparsable value never
    /// expires).
    pub fn is_expired(&self, now: f64) -> bool {
        matches!(self.expires_at(now), Ok(Some(t)) if t <= now)
    }

    /// Drops the hop-by-hop elements (`kn_routed_from` and every `kn_route_*`).
    pub fn strip_hop_by_hop(&mut self) {
        self.elements.retain(|name, _| !is_hop_by_hop(name));
    }

    pub(crate) fn from_map(elements: BTreeMap<Vec<u8>, Vec<u8>>) -> Event {
        Event { elements }
    }

    /// A 128-bit digest of the end-to-end elements (everything but
    /// hop-by-hop elements and `kn_time_t`): equal digests mean a duplicate.
    pub(crate) fn end_to_end_digest(&self) -> u128 {
        self.end_to_end_digest_with_payload(None)
    }

    /// [`Event::end_to_end_digest`] of this event with its `kn_payload`
    /// set to `payload` (when given): the digest of an event whose payload
    /// is kept apart, in a blob, without copying it back in.
    pub(crate) fn end_to_end_digest_with_payload(&self, payload: Option<&[u8]>) -> u128 {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        let mut feed = |name: &[u8], value: &[u8]| {
            h.update(&(name.len() as u64).to_le_bytes());
            h.update(name);
            h.update(&(value.len() as u64).to_le_bytes());
            h.update(value);
        };
        let mut pending = payload;
        for (name, value) in &self.elements {
            if pending.is_some() && name.as_slice() >= KN_PAYLOAD {
                feed(KN_PAYLOAD, pending.take().unwrap_or_default());
                if name == KN_PAYLOAD {
                    continue;
                }
            }
            if is_hop_by_hop(name) || name == KN_TIME_T {
                continue;
            }
            feed(name, value);
        }
        if let Some(p) = pending {
            feed(KN_PAYLOAD, p);
        }
        h.digest128()
    }

    /// True when `other` has the same end-to-end elements.
    pub fn same_end_to_end(&self, other: &Event) -> bool {
        let e2e = |e: &Event| {
            e.elements
                .iter()
                .filter(|(n, _)| !is_hop_by_hop(n) && n.as_slice() != KN_TIME_T)
                .map(|(n, v)| (n.clone(), v.clone()))
                .collect::<Vec<_>>()
        };
        e2e(self) == e2e(other)
    }
}

/// True for `kn_routed_from` and every name starting with `kn_route_`.
pub fn is_hop_by_hop(name: &[u8]) -> bool {
    name == KN_ROUTED_FROM || name.starts_with(b"kn_route_")
}

/// Parses a `kn_expires` value: `infinity` → `None`, `+N` or `+N.F` →
/// `now + N`, otherwise an absolute epoch time.
///
/// ```
/// use kn_journal::internal::parse_expires;
/// assert_eq!(parse_expires(b"+20.5", 100.0).unwrap(), Some(120.5));
/// assert_eq!(parse_expires(b"1796018695", 0.0).unwrap(), Some(1796018695.0));
/// assert_eq!(parse_expires(b"infinity", 5.0).unwrap(), None);
/// assert!(parse_expires(b"soon", 5.0).is_err());
/// assert!(parse_expires(b"\xff", 5.0).is_err());
/// ```
pub fn parse_expires(value: &[u8], now: f64) -> Result<Option<f64>, Error> {
    let bad = || {
        Error::new(
            ErrorKind::BadRequest,
            format!("bad kn_expires '{}': expected 'infinity', '+seconds' or an epoch time", String::from_utf8_lossy(value)),
        )
    };
    // Not UTF-8 is malformed, not empty (which means `infinity`).
    let text = std::str::from_utf8(value).map_err(|_| bad())?.trim();
    if text.eq_ignore_ascii_case("infinity") || text.is_empty() {
        return Ok(None);
    }
    let (relative, number) = match text.strip_prefix('+') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(bad());
    }
    let n: f64 = number.parse().map_err(|_| bad())?;
    Ok(Some(if relative { now + n } else { n }))
}

/// Decodes `<marker>XX` escapes (two hex digits, either case), as in URLs
/// (`%`) and the simple and legacy event formats (`=`). A marker not
/// followed by two hex digits stays as it is.
///
/// ```
/// use kn_journal::internal::decode_escapes;
/// assert_eq!(decode_escapes(b"a=3Ab=zz=4", b'='), b"a:b=zz=4");
/// assert_eq!(decode_escapes(b"%2e%2E%+1", b'%'), b"..%+1");
/// ```
pub fn decode_escapes(bytes: &[u8], marker: u8) -> Vec<u8> {
    let hex = |at: usize| bytes.get(at).and_then(|&b| (b as char).to_digit(16));
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], hex(i + 1), hex(i + 2)) {
            (b, Some(hi), Some(lo)) if b == marker => {
                out.push((hi << 4 | lo) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

/// Formats seconds since the epoch the way `kn_expires` and `kn_time_t`
/// carry them: whole seconds without a fraction, else the shortest exact
/// decimal.
pub fn format_time(t: f64) -> String {
    if t.fract() == 0.0 && t.abs() < 1e15 {
        format!("{}", t as i64)
    } else {
        format!("{t}")
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.elements.iter().map(|(n, v)| (String::from_utf8_lossy(n), String::from_utf8_lossy(v))))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_names() {
        assert!(is_hop_by_hop(b"kn_routed_from"));
        assert!(is_hop_by_hop(b"kn_route_location"));
        assert!(is_hop_by_hop(b"kn_route_checkpoint"));
        assert!(!is_hop_by_hop(b"kn_routes"));
        assert!(!is_hop_by_hop(b"kn_id"));
    }

    #[test]
    fn digest_ignores_hop_by_hop_and_time() {
        let a = Event::from_pairs([("kn_id", "1"), ("kn_payload", "x"), ("kn_time_t", "5"), ("kn_route_id", "r")]);
        let b = Event::from_pairs([("kn_id", "1"), ("kn_payload", "x"), ("kn_time_t", "6"), ("kn_routed_from", "u")]);
        let c = Event::from_pairs([("kn_id", "1"), ("kn_payload", "y")]);
        assert_eq!(a.end_to_end_digest(), b.end_to_end_digest());
        assert!(a.same_end_to_end(&b));
        assert_ne!(a.end_to_end_digest(), c.end_to_end_digest());
        // A payload kept apart digests as if it were in place.
        let mut bare = c.clone();
        bare.remove(KN_PAYLOAD);
        assert_eq!(bare.end_to_end_digest_with_payload(Some(b"y")), c.end_to_end_digest());
        assert_eq!(Event::from_pairs([("kn_payload", "y"), ("z", "1")]).end_to_end_digest(), Event::from_pairs([("z", "1")]).end_to_end_digest_with_payload(Some(b"y")));
        // Name/value boundaries are part of the digest.
        let d = Event::from_pairs([("ab", "c")]);
        let e = Event::from_pairs([("a", "bc")]);
        assert_ne!(d.end_to_end_digest(), e.end_to_end_digest());
    }

    #[test]
    fn expiry_forms() {
        assert_eq!(parse_expires(b"+10", 5.0).unwrap(), Some(15.0));
        assert_eq!(parse_expires(b"+20.000000", 0.0).unwrap(), Some(20.0));
        assert!(parse_expires(b"-5", 0.0).is_err());
        assert!(parse_expires(b"+", 0.0).is_err());
        assert!(parse_expires(b"1e9", 0.0).is_err());
        let e = Event::from_pairs([("kn_expires", "10")]);
        assert!(e.is_expired(11.0));
        assert!(!e.is_expired(9.0));
        assert_eq!(format_time(1796018695.0), "1796018695");
        assert_eq!(format_time(1.5), "1.5");
    }
}
