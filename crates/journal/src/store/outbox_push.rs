//! Push routes in the outbox (issue 42): checking a push destination when
//! its route is made, and delivering an event to it through the store's
//! [`Push`](crate::push::Push). Kept apart from `outbox_delivery.rs`,
//! which calls [`Store::deliver_push`] like `deliver_remote`.

use std::path::{Path, PathBuf};

use crate::error::{Error, ErrorKind, Result};
use crate::event::Event;
use crate::push::{is_push_destination, PushAnswer};
use crate::stats::Counter;
use crate::topic::Topic;

use super::outbox_delivery::Delivery;
use super::Store;

impl Store {
    /// The store's Web Push sender, if the program gave it one.
    #[doc(hidden)]
    pub fn push_sender(&self) -> Option<&dyn crate::push::Push> {
        self.remote.push()
    }

    /// Checks a push destination at route creation: this server sends Web
    /// Push, the subscription parses, its endpoint passes the push service
    /// allowlist and the outbound policy. The destination as stored.
    pub(super) fn push_destination(&self, destination: String) -> Result<Vec<u8>> {
        let Some(push) = self.remote.push() else {
            return Err(Error::new(ErrorKind::Forbidden, "bad route destination: this server sends no Web Push"));
        };
        let endpoint = push.check(&destination).map_err(|why| Error::new(ErrorKind::Forbidden, why))?;
        self.config.outbound.check(&endpoint)?;
        Ok(destination.into_bytes())
    }

    /// Delivers `copy` to the push subscription `destination`: sent,
    /// retried later (429, 5xx, no answer: not before the service's
    /// `Retry-After`), or the route poisoned (the subscription gone, the
    /// endpoint refused).
    pub(super) fn deliver_push(&self, destination: &str, route: &Event, copy: &Event) -> Delivery {
        let Some(push) = self.remote.push() else {
            return Delivery::Permanent(Counter::PoisonedRefused, Error::new(ErrorKind::Forbidden, "this server sends no Web Push"));
        };
        // The policy may have changed since the route was made.
        let checked = push.check(destination).map_err(|why| Error::new(ErrorKind::Forbidden, why));
        if let Err(err) = checked.and_then(|endpoint| self.config.outbound.check(&endpoint)) {
            return Delivery::Permanent(Counter::PoisonedRefused, err);
        }
        match push.send(destination, route, copy) {
            PushAnswer::Sent => Delivery::Done,
            PushAnswer::Retry(after, why) => Delivery::Later(Error::new(ErrorKind::Remote, why), after),
            PushAnswer::Gone(why) => Delivery::Permanent(Counter::PoisonedRefused, Error::new(ErrorKind::Remote, why)),
            PushAnswer::Refused(why) => Delivery::Permanent(Counter::PoisonedRefused, Error::new(ErrorKind::Remote, why)),
        }
    }

    /// Counts a new push route of its creator (the `kn_route_creator` or
    /// `kn_route_session` in `params`, else anonymous) against
    /// `max_push_routes` (`KN_MAX_PUSH_ROUTES`): refused (`403`) past it.
    /// Each creator's push routes are noted in `.push/<creator hash>/`,
    /// one small file per route naming its source and id; at the bound,
    /// the notes of routes no longer active push routes (deleted,
    /// poisoned, replaced, expired) are dropped before counting again, so
    /// the notes never outgrow the bound for long. The count and the new
    /// note are made under the creator's lock (`.push/<creator
    /// hash>/.lock`, an exclusive `flock`), returned to be held until the
    /// route is stored, so that requests racing at the bound, in one
    /// `serve` or in several processes, never pass it (a note whose route
    /// is not stored yet would otherwise look stale and be dropped).
    pub(super) fn count_push_route(&self, from: &Topic, params: &Event) -> Result<std::fs::File> {
        let creator = params
            .get(crate::access::KN_ROUTE_CREATOR)
            .or_else(|| params.get(crate::access::KN_ROUTE_SESSION))
            .unwrap_or(b"anonymous");
        let dir = self.root().join(PUSH_DIR).join(format!("{:016x}", xxhash_rust::xxh3::xxh3_64(creator)));
        let id = params.id().unwrap_or(b"");
        let mut key = from.as_str().as_bytes().to_vec();
        key.push(b'\n');
        key.extend_from_slice(id);
        let note = dir.join(format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&key)));
        let io = |e: std::io::Error| Error::io("cannot note a push route in", &dir, e);
        std::fs::create_dir_all(&dir).map_err(io)?;
        let lock = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(dir.join(".lock")).map_err(io)?;
        crate::shared::lock(&lock, crate::shared::LockKind::Exclusive, &self.config).map_err(io)?;
        if note.exists() {
            return Ok(lock); // the same route again (a replacement)
        }
        let max = self.config.max_push_routes;
        if notes(&dir).len() >= max {
            for stale in notes(&dir).into_iter().filter(|n| !self.is_push_route(n)) {
                let _ = std::fs::remove_file(stale);
            }
            let count = notes(&dir).len();
            if count >= max {
                let who = String::from_utf8_lossy(creator);
                return Err(Error::new(
                    ErrorKind::Forbidden,
                    format!("'{who}' has {count} active push routes, the maximum (KN_MAX_PUSH_ROUTES is {max}): delete one first"),
                ));
            }
        }
        // Written whole under a temporary name, then renamed: a reader
        // never sees half a note.
        let tmp = dir.join(format!(".tmp-{}", std::process::id()));
        std::fs::write(&tmp, &key).and_then(|()| std::fs::rename(&tmp, &note)).map_err(io)?;
        Ok(lock)
    }

    /// Whether the note at `path` names a route that is still an active
    /// push route. A note that cannot be read counts as one (kept).
    fn is_push_route(&self, path: &Path) -> bool {
        let Ok(key) = std::fs::read(path) else { return true };
        let Some(split) = key.iter().position(|&b| b == b'\n') else { return false };
        let Ok(source) = Topic::parse_bytes(&key[..split]) else { return false };
        match self.route_of(&source, &key[split + 1..]) {
            Ok(Some(route)) => route.is_active(crate::ids::now()) && is_push_destination(route.destination()) && route.event.get(super::KN_POISONED).is_none(),
            Ok(None) => false,
            Err(_) => true,
        }
    }
}

/// The directory of the push route notes, in the store's root.
pub(super) const PUSH_DIR: &str = ".push";

/// The notes of a creator's push routes (temporaries left out).
fn notes(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.file_name().is_some_and(|n| !n.to_string_lossy().starts_with('.'))).collect()
}
