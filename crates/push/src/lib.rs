//! Web Push for knpubsub: what a route needs to deliver an event to a
//! browser that may be closed (issue 42).
//!
//! * [`Subscription`]: a browser's `PushSubscription.toJSON()`, parsed and
//!   checked, the destination a push route stores.
//! * [`PushPolicy`]: which endpoints may be sent to (`https`, the major
//!   browsers' push services unless the operator says otherwise, never a
//!   loopback or private address).
//! * [`encrypt`]: RFC 8291 message encryption (`aes128gcm`).
//! * [`VapidKey`]: RFC 8292 VAPID, the server's key made once per store.
//! * [`prepare`] and [`Outcome`]: an RFC 8030 push request (body and
//!   headers, within the 4096-byte cap) and what its answer means for the
//!   route (sent, retry later, subscription gone).
//!
//! The crate sends nothing itself: the caller's HTTP client (the one
//! outbound client and policy of the server) sends the [`PushRequest`].
//! The cryptography is RustCrypto's (`p256`, `hkdf`, `sha2`, `aes-gcm`).
//!
//! ```
//! use kn_push::{prepare, Outcome, PushOptions, Subscription, VapidKey};
//!
//! let sub = Subscription::parse(r#"{"endpoint":"https://fcm.googleapis.com/fcm/send/abc",
//!   "keys":{"p256dh":"BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4",
//!           "auth":"BTBZMqHH6r4Tts7J_aSIgg"}}"#).unwrap();
//! let key = VapidKey::generate();
//! let options = PushOptions::parse(Some("60"), Some("high"), Some("chat")).unwrap();
//! let req = prepare(&sub, &key, "mailto:ops@example.org", &options, b"hello", b"{\"id\":\"e1\"}", 1_700_000_000).unwrap();
//! assert_eq!(req.endpoint, "https://fcm.googleapis.com/fcm/send/abc");
//! assert!(!req.shortened);
//! assert!(req.headers.iter().any(|(n, v)| *n == "Urgency" && v == "high"));
//! assert_eq!(Outcome::of(201, None), Outcome::Sent);
//! assert_eq!(Outcome::of(410, None), Outcome::Gone);
//! ```
#![deny(missing_docs)]

mod client;
mod ece;
mod error;
mod sender;
mod subscription;
mod vapid;

pub use ece::{encrypt, encrypt_with, OVERHEAD};
pub use error::{Error, ErrorKind, Result};
pub use sender::{wire, PushRemote, PushSettings, Sender, VAPID_KEY_FILE};
pub use subscription::{PushPolicy, Subscription, DEFAULT_PUSH_SERVICES, MAX_SUBSCRIPTION_BYTES};
pub use vapid::{VapidKey, MAX_JWT_SECONDS};

/// The largest push message body (RFC 8030 section 7.2: push services
/// must accept 4096 bytes and may refuse more).
pub const MAX_BODY_BYTES: usize = 4096;

/// The `TTL` used when neither the route nor the event gives one: four
/// weeks, what push services keep at most.
pub const DEFAULT_TTL_SECONDS: u32 = 28 * 24 * 3600;

/// RFC 8030 section 5.3: how urgent a message is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Urgency {
    /// `very-low`
    VeryLow,
    /// `low`
    Low,
    /// `normal`
    Normal,
    /// `high`
    High,
}

impl Urgency {
    /// The header value.
    pub fn as_str(self) -> &'static str {
        match self {
            Urgency::VeryLow => "very-low",
            Urgency::Low => "low",
            Urgency::Normal => "normal",
            Urgency::High => "high",
        }
    }
}

/// The `TTL`, `Urgency` and `Topic` of a push message (RFC 8030 sections
/// 5.2 to 5.4), from the route's or the event's parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushOptions {
    /// Seconds the push service keeps an undelivered message.
    pub ttl: u32,
    /// How urgent the message is; none sends no header (`normal`).
    pub urgency: Option<Urgency>,
    /// A message with the same topic replaces an undelivered one.
    pub topic: Option<String>,
}

impl Default for PushOptions {
    fn default() -> PushOptions {
        PushOptions { ttl: DEFAULT_TTL_SECONDS, urgency: None, topic: None }
    }
}

impl PushOptions {
    /// Parses the three parameters as a client gives them (`kn_push_ttl`,
    /// `kn_push_urgency`, `kn_push_topic`). Fails with
    /// [`ErrorKind::BadInput`] on a TTL that is not a number of seconds
    /// (it is capped at [`DEFAULT_TTL_SECONDS`]), an unknown urgency, or a
    /// topic that is not 1 to 32 characters of the base64url alphabet
    /// (RFC 8030 5.4).
    pub fn parse(ttl: Option<&str>, urgency: Option<&str>, topic: Option<&str>) -> Result<PushOptions> {
        let bad = |m: String| Error::new(ErrorKind::BadInput, m);
        let ttl = match ttl {
            None => DEFAULT_TTL_SECONDS,
            Some(t) => t.parse::<u64>().map_err(|_| bad(format!("push TTL '{}' is not a number of seconds", t.escape_debug())))?.min(DEFAULT_TTL_SECONDS as u64) as u32,
        };
        let urgency = match urgency {
            None => None,
            Some("very-low") => Some(Urgency::VeryLow),
            Some("low") => Some(Urgency::Low),
            Some("normal") => Some(Urgency::Normal),
            Some("high") => Some(Urgency::High),
            Some(u) => return Err(bad(format!("push urgency '{}' is not very-low, low, normal or high", u.escape_debug()))),
        };
        let topic = match topic {
            None => None,
            Some(t) if (1..=32).contains(&t.len()) && t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') => Some(t.to_string()),
            Some(t) => return Err(bad(format!("push topic '{}' is not 1 to 32 base64url characters", t.escape_debug()))),
        };
        Ok(PushOptions { ttl, urgency, topic })
    }
}

/// A push message ready to send: POST `body` to `endpoint` with `headers`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushRequest {
    /// The push service URL (the subscription's endpoint).
    pub endpoint: String,
    /// `Content-Encoding`, `TTL`, `Authorization`, and `Urgency` and
    /// `Topic` when set. No value holds a control character.
    pub headers: Vec<(&'static str, String)>,
    /// The encrypted message, at most [`MAX_BODY_BYTES`].
    pub body: Vec<u8>,
    /// Whether `full` did not fit and `short` was sent instead.
    pub shortened: bool,
}

/// What is sent when even the short form of an event does not fit (its
/// id alone is over the cap: whoever posts chooses it): the page learns
/// that the topic has a new event and reads it there.
pub const TRUNCATED_MESSAGE: &[u8] = br#"{"kn_push_truncated":"1"}"#;

/// Builds the push request for `full` (the event as the page should get
/// it); when `full` encrypted would exceed [`MAX_BODY_BYTES`], `short` is
/// sent instead (the event's id, for the page to fetch the rest), and
/// [`TRUNCATED_MESSAGE`] when `short` does not fit either: an event never
/// makes a route's push fail for its size.
pub fn prepare(sub: &Subscription, key: &VapidKey, contact: &str, options: &PushOptions, full: &[u8], short: &[u8], now: u64) -> Result<PushRequest> {
    let fits = |m: &[u8]| m.len() + OVERHEAD <= MAX_BODY_BYTES;
    let shortened = !fits(full);
    let plaintext = match (shortened, fits(short)) {
        (false, _) => full,
        (true, true) => short,
        (true, false) => TRUNCATED_MESSAGE,
    };
    let body = encrypt(sub, plaintext)?;
    // A JWT lives 12 hours: well within RFC 8292's day, long enough for
    // clock skew.
    let authorization = key.authorization(sub.endpoint(), contact, now, 12 * 3600)?;
    if contact.chars().any(char::is_control) {
        return Err(Error::new(ErrorKind::BadInput, "the VAPID contact holds a control character"));
    }
    let mut headers = vec![
        ("Content-Encoding", "aes128gcm".to_string()),
        ("TTL", options.ttl.to_string()),
        ("Authorization", authorization),
    ];
    if let Some(u) = options.urgency {
        headers.push(("Urgency", u.as_str().to_string()));
    }
    if let Some(t) = &options.topic {
        headers.push(("Topic", t.clone()));
    }
    Ok(PushRequest { endpoint: sub.endpoint().to_string(), headers, body, shortened })
}

/// What a push service's answer means for the route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// 2xx: the push service accepted the message. A receipt counts it as
    /// sent, not confirmed: the browser may not have it yet.
    Sent,
    /// 429 or 5xx: try again later, after the `Retry-After` seconds if
    /// the service gave them.
    Retry(Option<u64>),
    /// 404 or 410: the subscription is gone; the route is poisoned.
    Gone,
    /// Any other status (400, 401, 403 after a key rotation, 413): the
    /// message will never be accepted as it is; the route is poisoned.
    Refused(u16),
}

impl Outcome {
    /// Classifies `status`, with the `Retry-After` header's value if any
    /// (delta-seconds; an HTTP date is treated as no value).
    pub fn of(status: u16, retry_after: Option<&str>) -> Outcome {
        match status {
            200..=299 => Outcome::Sent,
            404 | 410 => Outcome::Gone,
            429 | 500..=599 => Outcome::Retry(retry_after.and_then(|v| v.trim().parse::<u64>().ok())),
            other => Outcome::Refused(other),
        }
    }
}
