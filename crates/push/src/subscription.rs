//! A browser's push subscription (`PushSubscription.toJSON()`) and the
//! checks its client-supplied endpoint must pass before anything is sent.

use std::net::IpAddr;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::Deserialize;

use crate::error::{Error, ErrorKind, Result};

/// The longest subscription text accepted: browsers' are under 600 bytes.
pub const MAX_SUBSCRIPTION_BYTES: usize = 4096;

/// A push subscription: where to send (`endpoint`) and the keys to encrypt
/// for (`p256dh`, the browser's P-256 public key, and `auth`, a 16-byte
/// secret), parsed and checked.
///
/// ```
/// let json = r#"{"endpoint":"https://fcm.googleapis.com/fcm/send/abc",
///   "keys":{"p256dh":"BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4",
///           "auth":"BTBZMqHH6r4Tts7J_aSIgg"}}"#;
/// let sub = kn_push::Subscription::parse(json).unwrap();
/// assert_eq!(sub.endpoint(), "https://fcm.googleapis.com/fcm/send/abc");
/// assert!(kn_push::Subscription::parse(r#"{"endpoint":"x"}"#).is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subscription {
    endpoint: String,
    p256dh: Vec<u8>,
    auth: Vec<u8>,
}

#[derive(Deserialize)]
struct Json {
    endpoint: String,
    keys: Keys,
}

#[derive(Deserialize)]
struct Keys {
    p256dh: String,
    auth: String,
}

impl Subscription {
    /// Parses the JSON of `PushSubscription.toJSON()` (other fields, such
    /// as `expirationTime`, are ignored). Fails with
    /// [`ErrorKind::BadInput`] on text over [`MAX_SUBSCRIPTION_BYTES`], a
    /// missing field, keys that are not base64url, a `p256dh` that is not
    /// an uncompressed P-256 point or an `auth` that is not 16 bytes.
    pub fn parse(text: &str) -> Result<Subscription> {
        if text.len() > MAX_SUBSCRIPTION_BYTES {
            return Err(bad(format!("a push subscription of {} bytes is over the {MAX_SUBSCRIPTION_BYTES} allowed", text.len())));
        }
        let json: Json = serde_json::from_str(text).map_err(|e| bad(format!("not a push subscription ({e})")))?;
        if json.endpoint.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(bad("a push subscription's endpoint has whitespace or a control character"));
        }
        let p256dh = decode("p256dh", &json.keys.p256dh)?;
        if p256dh.len() != 65 || p256::PublicKey::from_sec1_bytes(&p256dh).is_err() {
            return Err(bad("a push subscription's p256dh is not an uncompressed P-256 public key"));
        }
        let auth = decode("auth", &json.keys.auth)?;
        if auth.len() != 16 {
            return Err(bad(format!("a push subscription's auth is {} bytes, not 16", auth.len())));
        }
        // The endpoint as WHATWG URL reads it (what the policy checks):
        // an HTTP client given the text as written would read a host with
        // a fullwidth dot or a percent-escape otherwise.
        let endpoint = url::Url::parse(&json.endpoint).map_or(json.endpoint, String::from);
        Ok(Subscription { endpoint, p256dh, auth })
    }

    /// The push service's URL for this subscription, as WHATWG URL
    /// serialises it (the form [`PushPolicy::check`] reads and the sender
    /// posts to).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The browser's public key, 65 bytes (SEC 1 uncompressed).
    pub fn p256dh_bytes(&self) -> Vec<u8> {
        self.p256dh.clone()
    }

    /// The browser's 16-byte authentication secret.
    pub fn auth_bytes(&self) -> &[u8] {
        &self.auth
    }

    /// The subscription as JSON again (what a route stores).
    pub fn to_json(&self) -> String {
        serde_json::json!({
            "endpoint": self.endpoint,
            "keys": {"p256dh": URL_SAFE_NO_PAD.encode(&self.p256dh), "auth": URL_SAFE_NO_PAD.encode(&self.auth)},
        })
        .to_string()
    }
}

fn decode(name: &str, text: &str) -> Result<Vec<u8>> {
    // Browsers send unpadded base64url; accept padding too.
    URL_SAFE_NO_PAD
        .decode(text.trim_end_matches('='))
        .map_err(|_| bad(format!("a push subscription's {name} is not base64url")))
}

fn bad(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::BadInput, message)
}

/// The push services of the major browsers, the default allowlist:
/// Chrome, Edge's Chromium and other Chromium browsers (FCM), Firefox
/// (Mozilla autopush), Safari (Apple) and legacy Edge (WNS).
pub const DEFAULT_PUSH_SERVICES: &str =
    "fcm.googleapis.com, updates.push.services.mozilla.com, *.push.apple.com, *.notify.windows.com";

/// Which push endpoints this server may send to: `https` only, a host on
/// the allowlist (an exact name, or `*.suffix` for any name under it),
/// never an address literal in a loopback, private, link-local or other
/// non-global range, never a port other than 443.
///
/// ```
/// use kn_push::PushPolicy;
///
/// let p = PushPolicy::default();
/// assert!(p.check("https://fcm.googleapis.com/fcm/send/x").is_ok());
/// assert!(p.check("https://web.push.apple.com/Q").is_ok());
/// assert!(p.check("http://fcm.googleapis.com/fcm/send/x").is_err());
/// assert!(p.check("https://fcm.googleapis.com.evil.example/x").is_err());
/// assert!(p.check("https://127.0.0.1/x").is_err());
/// let custom: PushPolicy = "push.example.org".parse().unwrap();
/// assert!(custom.check("https://push.example.org/x").is_ok());
/// assert!(custom.check("https://fcm.googleapis.com/x").is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushPolicy {
    hosts: Vec<String>,
    loopback_for_tests: bool,
}

impl Default for PushPolicy {
    fn default() -> PushPolicy {
        DEFAULT_PUSH_SERVICES.parse().unwrap_or(PushPolicy { hosts: Vec::new(), loopback_for_tests: false })
    }
}

impl std::str::FromStr for PushPolicy {
    type Err = Error;

    /// A comma-separated list of host names and `*.suffix` patterns;
    /// `default` stands for [`DEFAULT_PUSH_SERVICES`], `none` for no host.
    fn from_str(text: &str) -> Result<PushPolicy> {
        let mut hosts = Vec::new();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match item {
                "none" => {}
                "default" => hosts.extend(DEFAULT_PUSH_SERVICES.split(", ").map(String::from)),
                _ => {
                    let name = item.strip_prefix("*.").unwrap_or(item);
                    let valid = !name.is_empty()
                        && name.split('.').all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
                    if !valid {
                        return Err(bad(format!("'{item}' in the push service allowlist is not a host name or *.suffix")));
                    }
                    hosts.push(item.to_ascii_lowercase());
                }
            }
        }
        Ok(PushPolicy { hosts, loopback_for_tests: false })
    }
}

impl PushPolicy {
    /// For tests only: also allow endpoints on a loopback address literal,
    /// over `https` or plain `http` (a stand-in push service in a test). A
    /// product never sets this; the allowlist still applies to names.
    pub fn allowing_loopback_for_tests(mut self) -> PushPolicy {
        self.loopback_for_tests = true;
        self
    }

    /// Checks `endpoint`; fails with [`ErrorKind::Forbidden`] naming it and
    /// the reason.
    pub fn check(&self, endpoint: &str) -> Result<()> {
        let forbidden = |why: &str| Error::new(ErrorKind::Forbidden, format!("push endpoint '{endpoint}' refused: {why}"));
        let url = url::Url::parse(endpoint).map_err(|_| forbidden("not a URL"))?;
        let loopback_literal = match url.host() {
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            _ => false,
        };
        let test_http = self.loopback_for_tests && loopback_literal && url.scheme() == "http";
        if url.scheme() != "https" && !test_http {
            return Err(forbidden("only https push endpoints are allowed"));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(forbidden("user information in a push endpoint"));
        }
        // Push services answer on 443; another port of an allowlisted host
        // is some other service, whose answers a poisoned route's reason
        // would show.
        // (A test's stand-in listens on a port of its own.)
        if url.port().is_some() && !self.loopback_for_tests {
            return Err(forbidden("a push endpoint on a port other than https's 443"));
        }
        match url.host() {
            Some(url::Host::Domain(name)) => {
                let name = name.to_ascii_lowercase();
                if name == "localhost" || name.ends_with(".localhost") {
                    return Err(forbidden("loopback"));
                }
                let listed = self.hosts.iter().any(|h| match h.strip_prefix("*.") {
                    Some(suffix) => name.len() > suffix.len() + 1 && name.ends_with(suffix) && name.as_bytes()[name.len() - suffix.len() - 1] == b'.',
                    None => *h == name,
                });
                if listed {
                    Ok(())
                } else {
                    Err(forbidden("not on the push service allowlist (KN_PUSH_SERVICES)"))
                }
            }
            Some(url::Host::Ipv4(ip)) => self.check_address(IpAddr::V4(ip)).map_err(|e| forbidden(&e)),
            Some(url::Host::Ipv6(ip)) => self.check_address(IpAddr::V6(ip)).map_err(|e| forbidden(&e)),
            None => Err(forbidden("no host")),
        }
    }

    /// Checks an address a push endpoint's name resolved to (the HTTP
    /// client calls this before connecting, so that an allowlisted name
    /// cannot be pointed at a private network). An address literal in an
    /// endpoint is never on the allowlist, except a loopback one under
    /// [`allowing_loopback_for_tests`](Self::allowing_loopback_for_tests).
    pub fn check_address(&self, ip: IpAddr) -> std::result::Result<(), String> {
        if ip.is_loopback() && self.loopback_for_tests {
            return Ok(());
        }
        if !is_global(ip) {
            return Err(format!("{ip} is a loopback, private or otherwise non-global address"));
        }
        Err(format!("{ip}: an address literal is not on the push service allowlist"))
    }

    /// Whether an address the client resolved is one it may connect to.
    pub fn may_connect(&self, ip: IpAddr) -> bool {
        is_global(ip) || (self.loopback_for_tests && ip.is_loopback())
    }
}

/// Whether `ip` is routable on the public internet (the checks of the
/// unstable `IpAddr::is_global`, spelled out).
fn is_global(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            !(v4.is_private()
                || v4.is_loopback()
                || v4.is_link_local()
                || v4.is_broadcast()
                || v4.is_documentation()
                || v4.is_unspecified()
                || o[0] == 0
                || (o[0] == 100 && (o[1] & 0xc0) == 64) // 100.64/10, shared address space
                || (o[0] == 192 && o[1] == 0 && o[2] == 0) // 192.0.0/24
                || (o[0] == 198 && (o[1] & 0xfe) == 18) // 198.18/15, benchmarking
                || o[0] >= 240)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_global(IpAddr::V4(v4));
            }
            let s = v6.segments();
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local
                || (s[0] & 0xffc0) == 0xfe80 // link local
                || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
                || (s[0] == 0x64 && s[1] == 0xff9b)) // NAT64 can reach IPv4 private ranges
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_loopback_and_mapped_addresses_are_not_global() {
        for ip in ["127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1", "0.0.0.0", "::1", "fd00::1", "fe80::1", "::ffff:10.0.0.1", "64:ff9b::a00:1"] {
            assert!(!is_global(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["8.8.8.8", "2a00:1450::1"] {
            assert!(is_global(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn a_wildcard_needs_a_label_before_its_suffix() {
        let p: PushPolicy = "*.push.apple.com".parse().unwrap();
        assert!(p.check("https://web.push.apple.com/x").is_ok());
        assert!(p.check("https://push.apple.com/x").is_err());
        assert!(p.check("https://evilpush.apple.com/x").is_err());
    }

    #[test]
    fn loopback_for_tests_allows_only_loopback_literals() {
        let p = PushPolicy::default().allowing_loopback_for_tests();
        assert!(p.check("https://127.0.0.1:8443/push").is_ok());
        assert!(p.check("http://127.0.0.1:8443/push").is_ok());
        assert!(p.check("http://fcm.googleapis.com/push").is_err());
        assert!(PushPolicy::default().check("http://127.0.0.1:8443/push").is_err());
        assert!(p.check("https://10.0.0.1/push").is_err());
        assert!(PushPolicy::default().check("https://[::1]/push").is_err());
        assert!(PushPolicy::default().check("https://localhost/push").is_err());
    }
}
