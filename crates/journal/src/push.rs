//! Web Push as a route destination (issue 42, docs/PROTOCOL.md "Web Push
//! (extension)"): the seam through which the outbox hands an event to a
//! push service.
//!
//! A route whose destination starts with [`PUSH_PREFIX`] carries a
//! browser's push subscription: `webpush:` followed by the JSON of
//! `PushSubscription.toJSON()` in unpadded base64url (so that no byte of
//! it needs quoting in a route's payload). The journal knows nothing of the
//! encryption, VAPID or TLS: it asks the store's [`Remote`](crate::Remote)
//! for its [`Push`] (`Remote::push`), which the kn-push crate provides and
//! the programs wire in. Without one, a push route is refused when it is
//! made, and poisoned if one is found.

use crate::event::Event;

/// What a push destination starts with.
pub const PUSH_PREFIX: &str = "webpush:";

/// True when a route destination names a push subscription.
pub fn is_push_destination(destination: &[u8]) -> bool {
    destination.len() >= PUSH_PREFIX.len() && destination[..PUSH_PREFIX.len()].eq_ignore_ascii_case(PUSH_PREFIX.as_bytes())
}

/// What a push service made of one message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PushAnswer {
    /// Accepted (2xx): the route's receipts count it as sent, never as
    /// confirmed.
    Sent,
    /// Not now (429, 5xx, no answer): retried with back-off, not before
    /// the given seconds (the service's `Retry-After`) when some.
    Retry(Option<u64>, String),
    /// The subscription is gone (404, 410): the route is poisoned.
    Gone(String),
    /// Refused for good (any other status, a refused endpoint): the route
    /// is poisoned.
    Refused(String),
}

/// Sends events to push subscriptions (implemented by kn-push).
pub trait Push: Send + Sync {
    /// Checks a push destination when a route to it is made: the
    /// subscription parses and its endpoint is one this server may send to
    /// (`https`, on the push service allowlist, not a loopback or private
    /// address). Its endpoint URL, which the journal then checks against
    /// its outbound policy (`KN_OUTBOUND`) as for any remote destination;
    /// `Err` says why not.
    fn check(&self, destination: &str) -> Result<String, String>;

    /// Encrypts `event` for the subscription and posts it to the push
    /// service; `route` holds the route's own elements (`kn_push_ttl`,
    /// `kn_push_urgency`, `kn_push_topic`), which the event's override.
    fn send(&self, destination: &str, route: &Event, event: &Event) -> PushAnswer;

    /// The server's VAPID public key in base64url (`do_method=vapid`, a
    /// page's `applicationServerKey`).
    fn public_key(&self) -> String;
}
