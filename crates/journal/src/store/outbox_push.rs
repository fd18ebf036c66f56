//! Push routes in the outbox (issue 42): checking a push destination when
//! its route is made, and delivering an event to it through the store's
//! [`Push`](crate::push::Push). Kept apart from `outbox_delivery.rs`,
//! which calls [`Store::deliver_push`] like `deliver_remote`.

use crate::error::{Error, ErrorKind, Result};
use crate::event::Event;
use crate::push::PushAnswer;
use crate::stats::Counter;

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
}
