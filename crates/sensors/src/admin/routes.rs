//! `kn routes`: which routes of a topic to list, and what to say about a
//! poisoned one (PROTOCOL.md 4.1 step 5: a delivery failed, and the route
//! was replaced under its id by an inactive one carrying the reason as
//! `kn_poisoned`): why, when, and the request that makes it again, built
//! from the version the poisoning replaced while the log still holds it.
//!
//! ```
//! use kn_journal::{Event, Store, Topic};
//! use kn_sensors::admin::routes;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let store = Store::open(dir.path()).unwrap();
//! let chat = Topic::parse("/what/chat").unwrap();
//! // A URL of this server naming no valid topic: accepted, and poisoned
//! // by its first delivery.
//! store.route(&chat, b"http://localhost/kn/a/../b", Event::from_pairs([("kn_id", "r1")])).unwrap();
//! store.notify(&chat, Event::from_pairs([("kn_payload", "hi")])).unwrap();
//!
//! let listed = routes::list(&store, &chat, false).unwrap();
//! assert_eq!(listed.len(), 1, "a poisoned route is listed by default");
//! let poisoned = routes::poisoned(&store, &listed[0]).unwrap();
//! assert!(!poisoned.reason.is_empty());
//! let again = poisoned.recreate(&store);
//! assert!(again.contains("-d kn_to=http://localhost/kn/a/../b -d kn_id=r1"), "{again}");
//! ```

use kn_journal::{Event, Route, Store, Topic, KN_PAYLOAD};
use kn_journal::internal::{now, KN_POISONED};

use crate::SensorError;

/// The routes `kn routes` lists: every route with `all`, else the active
/// ones and the poisoned ones (until they are re-created, deleted or
/// compacted away), in the order of their last change.
pub fn list(store: &Store, topic: &Topic, all: bool) -> Result<Vec<Route>, SensorError> {
    let routes = store.all_routes(topic).map_err(|e| SensorError::from_journal(e, &format!("cannot read the routes of '{topic}'")))?;
    let t = now();
    Ok(routes.into_iter().filter(|r| all || r.is_active(t) || is_poisoned(r)).collect())
}

/// True for a route that a failed delivery made inactive: no destination,
/// and the reason as `kn_poisoned`.
pub fn is_poisoned(route: &Route) -> bool {
    route.destination().is_empty() && route.event.get(KN_POISONED).is_some()
}

/// A poisoned route, explained.
#[derive(Clone, Debug)]
pub struct Poisoned {
    /// The route as it is now (inactive).
    pub route: Route,
    /// Why its delivery failed.
    pub reason: String,
    /// Seconds since it was poisoned.
    pub age: f64,
    /// The route the poisoning replaced (its destination and elements),
    /// if the topic's log still holds it (compaction reclaims it).
    pub before: Option<Event>,
}

/// `route` explained, if it is poisoned ([`is_poisoned`]).
pub fn poisoned(store: &Store, route: &Route) -> Option<Poisoned> {
    if !is_poisoned(route) {
        return None;
    }
    let reason = String::from_utf8_lossy(route.event.get(KN_POISONED).unwrap_or_default()).into_owned();
    let at = route.event.get("kn_time_t").and_then(|t| std::str::from_utf8(t).ok()?.parse::<f64>().ok());
    let age = at.map_or(0.0, |at| (now() - at).max(0.0));
    // The last version of this id with a destination, stored before the
    // poisoning (a record of the route list, superseded since).
    let records = store.stored_records(&route.source.routes()).unwrap_or_default();
    let poisoning = route.event.checkpoint();
    let upto = records.iter().position(|e| e.checkpoint() == poisoning).unwrap_or(records.len());
    let before = records[..upto].iter().rev().find(|e| e.id() == Some(route.id()) && !e.payload().is_empty()).cloned();
    Some(Poisoned { route: route.clone(), reason, age, before })
}

/// The elements of a route event that are not the request's: set by the
/// store when it stored or poisoned it.
const STORED_ONLY: [&[u8]; 5] = [KN_PAYLOAD, b"kn_time_t", b"kn_route_checkpoint", b"kn_expires", KN_POISONED];

impl Poisoned {
    /// A `curl` command that makes the route again, under the same id, on
    /// the server `store` knows itself by (its configured URL or first
    /// name, `kn names`; else `http://SERVER/kn` to fill in): with the
    /// destination and elements of the route it replaced, or with
    /// `DESTINATION` to fill in when the log no longer holds that.
    pub fn recreate(&self, store: &Store) -> String {
        let mut command = format!("curl -d do_method=route {}", data("kn_from", self.route.source.as_str().as_bytes()));
        match &self.before {
            Some(before) => {
                command.push_str(&format!(" {}", data("kn_to", before.payload())));
                for (name, value) in before.elements().filter(|(name, _)| !STORED_ONLY.contains(name)) {
                    command.push_str(&format!(" {}", data(&String::from_utf8_lossy(name), value)));
                }
            }
            None => command.push_str(&format!(" -d kn_to=DESTINATION {}", data("kn_id", self.route.id()))),
        }
        command.push_str(&format!(" -d kn_response_format=simple {}", shell_word(&server_url(store))));
        command
    }

    /// The note `kn routes` writes about it (two lines, no final newline).
    pub fn note(&self, store: &Store) -> String {
        let id = String::from_utf8_lossy(self.route.id());
        let was = match &self.before {
            Some(before) => format!(" (it went to {})", String::from_utf8_lossy(before.payload())),
            None => String::new(),
        };
        format!(
            "route {id} of {} is POISONED{was}, {:.0} s ago: {}\n  re-create it, once the cause is fixed: {}",
            self.route.source,
            self.age,
            self.reason,
            self.recreate(store)
        )
    }
}

/// The URL the store knows its server by, if any: its configured URL or
/// first name, else `http://SERVER/kn` (a placeholder).
fn server_url(store: &Store) -> String {
    let named = store.config().server_url.is_some() || store.server_names().len() > 1 || store.server_url() != "http://localhost/kn";
    if named {
        store.server_url()
    } else {
        "http://SERVER/kn".to_string()
    }
}

/// `-d name=value` for curl, or `--data-urlencode name=value` when the
/// value holds a byte that form encoding changes; quoted for the shell.
fn data(name: &str, value: &[u8]) -> String {
    let plain = value.iter().all(|&b| b.is_ascii_alphanumeric() || b"/:._-~@,".contains(&b));
    let pair = format!("{name}={}", String::from_utf8_lossy(value));
    if plain {
        format!("-d {}", shell_word(&pair))
    } else {
        format!("--data-urlencode {}", shell_word(&pair))
    }
}

/// `word` as one shell word: as it is when it holds nothing the shell
/// reads specially, else in single quotes.
fn shell_word(word: &str) -> String {
    if !word.is_empty() && word.bytes().all(|b| b.is_ascii_alphanumeric() || b"/:._-~@,=+%".contains(&b)) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_words_are_quoted_only_when_needed() {
        assert_eq!(shell_word("kn_to=/what/chat"), "kn_to=/what/chat");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
        assert_eq!(data("kn_content_filter", br"(?i)\bhi\b"), r"--data-urlencode 'kn_content_filter=(?i)\bhi\b'");
        assert_eq!(data("kn_to", b"http://h:8080/kn/a"), "-d kn_to=http://h:8080/kn/a");
    }
}
