//! The sender the programs wire into a store (`PushRemote`): kn-journal's
//! [`Push`] seam implemented with this crate's encryption and VAPID and an
//! https client of its own (ureq over rustls).

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use kn_journal::internal::{Push, PushAnswer, PUSH_PREFIX};
use kn_journal::{Config, Event, Remote, RemoteReply};

use crate::{prepare, Outcome, PushOptions, PushPolicy, Subscription, VapidKey};

/// The file of a store's VAPID key, in the store's root.
pub const VAPID_KEY_FILE: &str = ".vapid";

/// How a server sends Web Push: the operator's settings.
#[derive(Clone, Debug)]
pub struct PushSettings {
    /// `KN_PUSH_CONTACT`: the VAPID `sub` (`mailto:` or `https:`). Unset,
    /// the server sends no Web Push.
    pub contact: String,
    /// `KN_PUSH_SERVICES`: the push service allowlist.
    pub policy: PushPolicy,
    /// `KN_PUSH_TEST_LOOPBACK=1`, for tests only: endpoints on loopback
    /// address literals allowed, over plain http too, and push service
    /// names that resolve to loopback (a stand-in push service).
    pub test_loopback: bool,
}

impl PushSettings {
    /// Reads `KN_PUSH_CONTACT`, `KN_PUSH_SERVICES` and `KN_PUSH_TEST_LOOPBACK`:
    /// `Ok(None)` when `KN_PUSH_CONTACT` is unset or empty (no Web Push).
    pub fn from_env() -> crate::Result<Option<PushSettings>> {
        let contact = std::env::var("KN_PUSH_CONTACT").unwrap_or_default();
        let contact = contact.trim();
        if contact.is_empty() {
            return Ok(None);
        }
        if !(contact.starts_with("mailto:") || contact.starts_with("https:")) || contact.chars().any(char::is_control) {
            return Err(crate::Error::new(
                crate::ErrorKind::BadInput,
                format!("bad value for environment variable KN_PUSH_CONTACT: '{}': a mailto: or https: URL", contact.escape_debug()),
            ));
        }
        let mut policy: PushPolicy = match std::env::var("KN_PUSH_SERVICES") {
            Ok(v) => v.parse()?,
            Err(_) => PushPolicy::default(),
        };
        let test_loopback = std::env::var("KN_PUSH_TEST_LOOPBACK").is_ok_and(|v| v == "1");
        if test_loopback {
            policy = policy.allowing_loopback_for_tests();
        }
        Ok(Some(PushSettings { contact: contact.to_string(), policy, test_loopback }))
    }
}

/// Sends push messages for a store.
pub struct Sender {
    settings: PushSettings,
    key: VapidKey,
    agent: ureq::Agent,
    config: Config,
}

impl Sender {
    /// A sender for the store at `root` (its key made there once, in
    /// [`VAPID_KEY_FILE`]), with the outbound timeouts of `config`.
    pub fn open(root: &Path, config: &Config, settings: PushSettings) -> crate::Result<Sender> {
        let key = VapidKey::load_or_create(&root.join(VAPID_KEY_FILE))?;
        let agent = crate::client::agent(config, &settings.policy, None);
        Ok(Sender { settings, key, agent, config: config.clone() })
    }

    /// The same sender trusting only the certificates of the PEM file
    /// `ca_file` (`KN_PUSH_CA_FILE`: a private push service's CA, or a
    /// test's) instead of the built-in Mozilla roots.
    pub fn trusting(mut self, ca_file: &Path) -> crate::Result<Sender> {
        let roots = crate::client::roots_of_file(ca_file)?;
        self.agent = crate::client::agent(&self.config, &self.settings.policy, Some(roots));
        Ok(self)
    }

    /// The VAPID public key (`do_method=vapid`, a page's
    /// `applicationServerKey`).
    pub fn public_key(&self) -> String {
        self.key.public_base64url()
    }

    fn subscription(&self, destination: &str) -> Result<Subscription, String> {
        let encoded = destination.get(PUSH_PREFIX.len()..).unwrap_or("");
        let json = URL_SAFE_NO_PAD
            .decode(encoded.trim_end_matches('='))
            .map_err(|_| "bad push destination: not webpush: and base64url".to_string())?;
        let json = String::from_utf8(json).map_err(|_| "bad push destination: not UTF-8 JSON".to_string())?;
        let sub = Subscription::parse(&json).map_err(|e| e.to_string())?;
        self.settings.policy.check(sub.endpoint()).map_err(|e| e.to_string())?;
        Ok(sub)
    }
}

/// The parameter that sets a push message's option, from the event or
/// else the route.
/// The push option `name` for `event` along `route`: the event's own
/// value when it is a valid one, else the route's. An event's value that
/// does not parse is ignored rather than refused, since a refusal poisons
/// the route: anyone who may post to a topic would end every push
/// subscription to it with one event (crates/push/tests/attack_push_sender.rs).
fn option(route: &Event, event: &Event, name: &str) -> Option<String> {
    let valid = |value: &str| {
        let one = Some(value);
        match name {
            "kn_push_ttl" => PushOptions::parse(one, None, None).is_ok(),
            "kn_push_urgency" => PushOptions::parse(None, one, None).is_ok(),
            "kn_push_topic" => PushOptions::parse(None, None, one).is_ok(),
            _ => false,
        }
    };
    event.get_str(name).filter(|v| valid(v)).or_else(|| route.get_str(name))
}

/// The event as the page gets it: its elements as a JSON object of
/// strings; `short`, its id and where it came from, when that is too big.
fn message(event: &Event) -> (Vec<u8>, Vec<u8>) {
    let mut full = serde_json::Map::new();
    for (name, value) in event.elements() {
        full.insert(String::from_utf8_lossy(name).into_owned(), String::from_utf8_lossy(value).into_owned().into());
    }
    let mut short = serde_json::Map::new();
    for name in ["kn_id", "kn_routed_from", "kn_route_checkpoint"] {
        if let Some(v) = event.get_str(name) {
            short.insert(name.to_string(), v.into());
        }
    }
    short.insert("kn_push_truncated".into(), "1".into());
    (serde_json::Value::Object(full).to_string().into_bytes(), serde_json::Value::Object(short).to_string().into_bytes())
}

impl Push for Sender {
    fn check(&self, destination: &str) -> Result<String, String> {
        self.subscription(destination).map(|s| s.endpoint().to_string())
    }

    fn public_key(&self) -> String {
        self.key.public_base64url()
    }

    fn send(&self, destination: &str, route: &Event, event: &Event) -> PushAnswer {
        let sub = match self.subscription(destination) {
            Ok(sub) => sub,
            Err(why) => return PushAnswer::Refused(why),
        };
        let options = PushOptions::parse(
            option(route, event, "kn_push_ttl").as_deref(),
            option(route, event, "kn_push_urgency").as_deref(),
            option(route, event, "kn_push_topic").as_deref(),
        );
        let options = match options {
            Ok(o) => o,
            Err(e) => return PushAnswer::Refused(e.to_string()),
        };
        let (full, short) = message(event);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let req = match prepare(&sub, &self.key, &self.settings.contact, &options, &full, &short, now) {
            Ok(r) => r,
            Err(e) => return PushAnswer::Refused(e.to_string()),
        };
        let mut post = self.agent.post(&req.endpoint);
        for (name, value) in &req.headers {
            post = post.header(*name, value);
        }
        let endpoint = &req.endpoint;
        match post.send(&req.body[..]) {
            Ok(mut resp) => {
                let status = resp.status().as_u16();
                let retry_after = resp.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_string);
                let mut excerpt = String::new();
                let _ = resp.body_mut().as_reader().take(200).read_to_string(&mut excerpt);
                let excerpt: String = excerpt.chars().filter(|c| !c.is_control()).collect();
                let why = format!("push service '{endpoint}' answered {status} {excerpt}").trim_end().to_string();
                match Outcome::of(status, retry_after.as_deref()) {
                    Outcome::Sent => PushAnswer::Sent,
                    Outcome::Retry(after) => PushAnswer::Retry(after, why),
                    Outcome::Gone => PushAnswer::Gone(format!("{why}: the subscription is gone")),
                    Outcome::Refused(_) => PushAnswer::Refused(why),
                }
            }
            // Its name resolved only to addresses the policy forbids
            // (client.rs): refused, the route poisoned, not retried.
            Err(ureq::Error::Io(e)) if e.kind() == std::io::ErrorKind::PermissionDenied && e.to_string().starts_with(crate::client::REFUSED_ADDRESS) => {
                PushAnswer::Refused(format!("push endpoint '{endpoint}' refused: {e}"))
            }
            Err(e) => PushAnswer::Retry(None, format!("push service '{endpoint}' did not answer: {e}")),
        }
    }
}

/// Gives `store` a Web Push sender when the operator set
/// `KN_PUSH_CONTACT` ([`PushSettings::from_env`]); the store as it was
/// otherwise. Its other remote requests keep the client its settings make
/// (`HttpRemote::from_config`).
pub fn wire(store: kn_journal::Store) -> crate::Result<kn_journal::Store> {
    let Some(settings) = PushSettings::from_env()? else { return Ok(store) };
    let mut sender = Sender::open(store.root(), store.config(), settings)?;
    if let Some(ca_file) = std::env::var_os("KN_PUSH_CA_FILE").filter(|v| !v.is_empty()) {
        sender = sender.trusting(Path::new(&ca_file))?;
    }
    let inner = Arc::new(kn_journal::HttpRemote::from_config(store.config()));
    Ok(store.with_remote(Arc::new(PushRemote::new(inner, sender))))
}

/// A store's outbound client with Web Push: [`Remote`] requests go to
/// `inner`; push routes to the [`Sender`].
pub struct PushRemote {
    inner: Arc<dyn Remote>,
    sender: Sender,
}

impl PushRemote {
    /// Wraps `inner` with `sender`.
    pub fn new(inner: Arc<dyn Remote>, sender: Sender) -> PushRemote {
        PushRemote { inner, sender }
    }

    /// The sender (for its public key).
    pub fn sender(&self) -> &Sender {
        &self.sender
    }
}

impl Remote for PushRemote {
    fn post_form(&self, url: &str, pairs: &[(&[u8], &[u8])]) -> Result<RemoteReply, kn_journal::Error> {
        self.inner.post_form(url, pairs)
    }

    fn push(&self) -> Option<&dyn Push> {
        Some(&self.sender)
    }
}
