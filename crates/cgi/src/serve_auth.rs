//! Who a `serve` request is, without stalling the event loop: the
//! [`Gate`] in front of [`Authentication`] (docs/ACCESS.md, "Password
//! checks").
//!
//! A password's hash is slow on purpose (bcrypt, 1,000 rounds of MD5 whose
//! cost grows with the password's length), so `serve` never computes one on
//! an async worker. What needs no hash is decided there at once (a trusted
//! proxy's header, no credentials, credentials over
//! `Config::auth_max_credentials_bytes` (`400`), an unknown user, a check
//! remembered); the rest is queued for a small pool of its own threads
//! (`Config::auth_threads`), at most `Config::auth_queue` waiting (past
//! it: `503` with `Retry-After`). A client address whose checks fail
//! `Config::auth_backoff_after` times in a row backs off: 1 s, doubling
//! with each next failure up to `Config::auth_backoff_max`, during which its
//! checks are answered `429` with `Retry-After` and cost nothing (a check
//! remembered still passes, so a logged-in user behind the same address is
//! not locked out). At most `Config::auth_backoff_clients` addresses are
//! remembered; the oldest is forgotten first.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kn_journal::Config;

use crate::auth::{Authentication, Begun, Identity};
use crate::handler::AUTH_REALM;
use crate::pool::Pool;
use crate::Error;

/// Why a request is refused before anything else is done for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Credentials longer than the limit (`400`).
    TooLong(String),
    /// Credentials that do not check out (`401`, with a challenge).
    BadCredentials,
    /// The client is backing off after failed checks (`429`), for this
    /// many more seconds (`Retry-After`).
    BackingOff(u64),
    /// Too many checks waiting (`503`, `Retry-After`).
    Busy(String),
}

impl Refusal {
    /// The status code, reason phrase and message.
    pub(crate) fn status(&self) -> (u16, &'static str, String) {
        match self {
            Refusal::TooLong(message) => (400, "Bad Request", message.clone()),
            Refusal::BadCredentials => (401, "Unauthorized", "the user name or password is not valid".to_string()),
            Refusal::BackingOff(secs) => {
                (429, "Too Many Requests", format!("too many wrong passwords from this address: try again in {secs} s"))
            }
            Refusal::Busy(message) => (503, "Service Unavailable", message.clone()),
        }
    }

    /// Adds the refusal's headers to `reply`: a Basic challenge for
    /// `401`, `Retry-After` for `429` and for `503` (`busy_retry_after`
    /// seconds, the server's).
    pub(crate) fn add_headers<B>(&self, reply: &mut hyper::Response<B>, busy_retry_after: u32) {
        let headers = reply.headers_mut();
        match self {
            Refusal::BadCredentials => {
                if let Ok(challenge) = hyper::header::HeaderValue::from_str(&format!("Basic realm=\"{AUTH_REALM}\"")) {
                    headers.insert(hyper::header::WWW_AUTHENTICATE, challenge);
                }
            }
            Refusal::BackingOff(secs) => {
                headers.insert(hyper::header::RETRY_AFTER, hyper::header::HeaderValue::from(*secs));
            }
            Refusal::Busy(_) => {
                headers.insert(hyper::header::RETRY_AFTER, hyper::header::HeaderValue::from(busy_retry_after));
            }
            Refusal::TooLong(_) => {}
        }
    }

    /// The refusal as a plain-text reply (`/v1/stream/`, `/metrics`),
    /// with [`Refusal::add_headers`]'s headers.
    pub(crate) fn plain_reply(&self, busy_retry_after: u32) -> hyper::Response<crate::body::Body> {
        let (code, _, message) = self.status();
        let mut reply = crate::body::plain_owned(hyper::StatusCode::from_u16(code).unwrap_or(hyper::StatusCode::UNAUTHORIZED), format!("{message}\n"));
        self.add_headers(&mut reply, busy_retry_after);
        reply
    }
}

/// The authentication of one `serve`: checks off the event loop, bounded,
/// with a per-address back-off (see the module documentation).
///
/// The one way in: the gate owns the server's [`Authentication`] and
/// gives it to no one, so every entry point of `serve` that needs to know
/// who a request is (`/kn`, `/v1/stream/`, `/metrics`) asks
/// [`Gate::identify`], and every password checked anywhere in `serve` is
/// counted by the same back-off, queue and thread cap (issue 37, item 2:
/// `/metrics` had been handed the authentication itself and checked
/// passwords on the request pool, outside all three).
pub(crate) struct Gate {
    auth: Arc<Authentication>,
    max_credentials: usize,
    /// The threads that compute hashes (`None`: no htpasswd file).
    pool: Option<Pool>,
    /// Checks running or waiting, at most `capacity`.
    admitted: AtomicUsize,
    capacity: usize,
    backoff: Mutex<Backoff>,
}

impl Gate {
    /// The gate of `auth` with `config`'s settings.
    pub(crate) fn new(auth: Arc<Authentication>, config: &Config) -> Result<Gate, Error> {
        let threads = config.auth_threads.max(1);
        let pool = match &auth.htpasswd {
            Some(file) => {
                file.set_cache_limit(config.auth_cache);
                Some(Pool::start(threads, "kn-auth")?)
            }
            None => None,
        };
        Ok(Gate {
            auth,
            max_credentials: config.auth_max_credentials_bytes,
            pool,
            admitted: AtomicUsize::new(0),
            capacity: threads.saturating_add(config.auth_queue),
            backoff: Mutex::new(Backoff::new(config)),
        })
    }

    /// True when some way of authenticating is configured (else every
    /// request is anonymous).
    pub(crate) fn is_configured(&self) -> bool {
        self.auth.is_configured()
    }

    /// The user of a request with `headers` from `peer` (`None`:
    /// anonymous), or why it is refused.
    pub(crate) async fn identify(&self, headers: &[(String, Vec<u8>)], peer: IpAddr) -> Result<Option<String>, Refusal> {
        let pending = match self.auth.begin(headers, peer, self.max_credentials) {
            Begun::Done(Identity::Anonymous) => return Ok(None),
            Begun::Done(Identity::User(user)) => return Ok(Some(user)),
            Begun::TooLong(message) => return Err(Refusal::TooLong(message)),
            Begun::Done(Identity::BadCredentials) => {
                self.backing_off(peer)?;
                self.failed(peer);
                return Err(Refusal::BadCredentials);
            }
            Begun::Verify(pending) => pending,
        };
        self.backing_off(peer)?;
        let Some(pool) = &self.pool else { return Err(Refusal::BadCredentials) };
        let Some(_admitted) = Admitted::enter(&self.admitted, self.capacity) else {
            let waiting = self.capacity;
            return Err(Refusal::Busy(format!("too many password checks: at most {waiting} may run or wait at once")));
        };
        let auth = self.auth.clone();
        let identity = pool.handle().spawn_blocking(move || auth.verify(pending)).await.unwrap_or(Identity::BadCredentials);
        match identity {
            Identity::User(user) => {
                self.succeeded(peer);
                Ok(Some(user))
            }
            _ => {
                self.failed(peer);
                Err(Refusal::BadCredentials)
            }
        }
    }

    fn backing_off(&self, peer: IpAddr) -> Result<(), Refusal> {
        let backoff = self.backoff.lock().unwrap_or_else(|e| e.into_inner());
        match backoff.wait(peer.to_canonical(), Instant::now()) {
            Some(left) => Err(Refusal::BackingOff(left.as_secs() + u64::from(left.subsec_nanos() > 0))),
            None => Ok(()),
        }
    }

    fn failed(&self, peer: IpAddr) {
        self.backoff.lock().unwrap_or_else(|e| e.into_inner()).failed(peer.to_canonical(), Instant::now());
    }

    fn succeeded(&self, peer: IpAddr) {
        self.backoff.lock().unwrap_or_else(|e| e.into_inner()).clients.remove(&peer.to_canonical());
    }
}

/// A check's place among those running or waiting; given back when
/// dropped.
struct Admitted<'a>(&'a AtomicUsize);

impl Admitted<'_> {
    fn enter(count: &AtomicUsize, capacity: usize) -> Option<Admitted<'_>> {
        count.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < capacity).then_some(n + 1)).ok()?;
        Some(Admitted(count))
    }
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The failed checks of recent client addresses.
#[derive(Debug)]
struct Backoff {
    clients: HashMap<IpAddr, Failures>,
    limit: usize,
    after: u32,
    max: Duration,
}

#[derive(Clone, Copy, Debug)]
struct Failures {
    /// Failed checks in a row.
    count: u32,
    /// When the last one failed.
    last: Instant,
}

/// The first back-off; each next failure doubles it.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);

impl Backoff {
    fn new(config: &Config) -> Backoff {
        Backoff {
            clients: HashMap::new(),
            limit: config.auth_backoff_clients,
            after: config.auth_backoff_after,
            max: config.auth_backoff_max,
        }
    }

    /// How long `failures` keep their address waiting after the last one.
    fn delay(&self, failures: &Failures) -> Duration {
        if self.after == 0 || failures.count < self.after {
            return Duration::ZERO;
        }
        let doublings = (failures.count - self.after).min(30);
        FIRST_BACKOFF.saturating_mul(1 << doublings).min(self.max)
    }

    /// How much longer `peer` must wait, if it is backing off.
    fn wait(&self, peer: IpAddr, now: Instant) -> Option<Duration> {
        let failures = self.clients.get(&peer)?;
        let until = failures.last + self.delay(failures);
        (now < until).then(|| until - now)
    }

    fn failed(&mut self, peer: IpAddr, now: Instant) {
        if self.after == 0 || self.limit == 0 {
            return;
        }
        if !self.clients.contains_key(&peer) && self.clients.len() >= self.limit {
            // Forget whoever failed longest ago (rarely: only when full).
            if let Some(oldest) = self.clients.iter().min_by_key(|(_, f)| f.last).map(|(ip, _)| *ip) {
                self.clients.remove(&oldest);
            }
        }
        let entry = self.clients.entry(peer).or_insert(Failures { count: 0, last: now });
        // A quiet address starts again (after twice the longest back-off).
        if now.saturating_duration_since(entry.last) > self.max.saturating_mul(2) {
            entry.count = 0;
        }
        entry.count = entry.count.saturating_add(1);
        entry.last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backoff(after: u32, max_secs: u64, clients: usize) -> Backoff {
        let mut config = Config::new("kn_events");
        config.auth_backoff_after = after;
        config.auth_backoff_max = Duration::from_secs(max_secs);
        config.auth_backoff_clients = clients;
        Backoff::new(&config)
    }

    fn ip(n: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, n])
    }

    #[test]
    fn an_address_backs_off_after_the_configured_failures_doubling_to_the_maximum() {
        let mut b = backoff(3, 4, 16);
        let t = Instant::now();
        for _ in 0..2 {
            b.failed(ip(1), t);
        }
        assert_eq!(b.wait(ip(1), t), None, "two failures of three allowed");
        b.failed(ip(1), t);
        assert_eq!(b.wait(ip(1), t), Some(Duration::from_secs(1)));
        assert_eq!(b.wait(ip(1), t + Duration::from_secs(1)), None);
        b.failed(ip(1), t);
        assert_eq!(b.wait(ip(1), t), Some(Duration::from_secs(2)));
        b.failed(ip(1), t);
        assert_eq!(b.wait(ip(1), t), Some(Duration::from_secs(4)));
        b.failed(ip(1), t);
        assert_eq!(b.wait(ip(1), t), Some(Duration::from_secs(4)), "at most the maximum");
        assert_eq!(b.wait(ip(2), t), None, "another address is not held back");
        // Quiet for longer than twice the maximum: a fresh start.
        let later = t + Duration::from_secs(9);
        b.failed(ip(1), later);
        assert_eq!(b.wait(ip(1), later), None);
    }

    #[test]
    fn the_table_of_addresses_is_bounded_forgetting_the_oldest() {
        let mut b = backoff(1, 60, 2);
        let t = Instant::now();
        b.failed(ip(1), t);
        b.failed(ip(2), t + Duration::from_millis(1));
        b.failed(ip(3), t + Duration::from_millis(2));
        assert_eq!(b.clients.len(), 2);
        assert!(!b.clients.contains_key(&ip(1)), "the oldest is forgotten");
        assert!(b.wait(ip(3), t + Duration::from_millis(2)).is_some());
    }

    #[test]
    fn no_backoff_when_turned_off() {
        let mut b = backoff(0, 60, 16);
        let t = Instant::now();
        for _ in 0..100 {
            b.failed(ip(1), t);
        }
        assert_eq!(b.wait(ip(1), t), None);
        assert!(b.clients.is_empty());
    }

    #[test]
    fn admission_stops_at_capacity_and_reopens_when_one_leaves() {
        let count = AtomicUsize::new(0);
        let first = Admitted::enter(&count, 2).unwrap();
        let _second = Admitted::enter(&count, 2).unwrap();
        assert!(Admitted::enter(&count, 2).is_none(), "the third is past the capacity");
        drop(first);
        assert!(Admitted::enter(&count, 2).is_some());
    }
}
