//! How much of its requests' bodies `serve` holds at once: a byte budget
//! (`Config::body_budget_bytes`, `KN_BODY_BUDGET_BYTES`) shared by every
//! request in flight, `/kn` and `/v1/stream/` alike.
//!
//! Each request's own limit bounds one body; without a budget across them,
//! a thousand clients each sending a body just under the limit would make
//! the process hold a thousand of them. A body announced by its
//! `Content-Length` takes its share before any of it is read (so a
//! `100 Continue` means the share is held), a chunked one as it arrives;
//! the share is given back when the request's answer is made. Past the
//! budget the request is answered `503` with `Retry-After`; a body larger
//! than the whole budget, which could never fit, `413`.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The budget of one `serve`.
pub(crate) struct BodyBudget {
    bytes: Arc<Semaphore>,
    total: u64,
}

/// The share of the budget one request holds; given back when dropped.
#[derive(Default)]
pub(crate) struct Held {
    permit: Option<OwnedSemaphorePermit>,
    bytes: u64,
}

/// Why a body could not be taken.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Larger than the request's own limit, or than the whole budget
    /// (`413`).
    TooLarge(String),
    /// The budget is taken by other requests for now (`503`, `Retry-After`).
    Busy(String),
    /// The body could not be read (`400`).
    Unreadable(String),
}

impl BodyBudget {
    /// A budget of `total` bytes.
    pub(crate) fn new(total: u64) -> BodyBudget {
        let total = total.min(Semaphore::MAX_PERMITS as u64);
        BodyBudget { bytes: Arc::new(Semaphore::new(total as usize)), total }
    }

    /// Makes `held` hold `bytes` in all (no less than it holds already).
    pub(crate) fn hold(&self, held: &mut Held, bytes: u64) -> Result<(), Refused> {
        if bytes <= held.bytes {
            return Ok(());
        }
        if bytes > self.total {
            return Err(Refused::TooLarge(format!(
                "a request body of {bytes} bytes is larger than the server's budget for all bodies at once, {} bytes (KN_BODY_BUDGET_BYTES)",
                self.total
            )));
        }
        let more = u32::try_from(bytes - held.bytes).map_err(|_| Refused::TooLarge(format!("a request body of {bytes} bytes is too large")))?;
        let permit = self.bytes.clone().try_acquire_many_owned(more).map_err(|_| {
            Refused::Busy(format!(
                "the server holds as many request bodies as it may at once ({} bytes, KN_BODY_BUDGET_BYTES): try again later",
                self.total
            ))
        })?;
        match &mut held.permit {
            Some(p) => p.merge(permit),
            None => held.permit = Some(permit),
        }
        held.bytes = bytes;
        Ok(())
    }

    /// Reads `incoming` to its end, at most `max` bytes, holding its share
    /// of the budget (taken before reading when `announced`).
    pub(crate) async fn collect(&self, mut incoming: Incoming, max: u64, announced: Option<u64>) -> Result<(Bytes, Held), Refused> {
        let mut held = Held::default();
        if let Some(length) = announced {
            self.hold(&mut held, length.min(max))?;
        }
        let mut body = BytesMut::new();
        while let Some(frame) = incoming.frame().await {
            let frame = frame.map_err(|e| Refused::Unreadable(format!("cannot read the request body: {e}")))?;
            let Ok(data) = frame.into_data() else { continue };
            let length = body.len() as u64 + data.len() as u64;
            if length > max {
                return Err(Refused::TooLarge(format!("the request body is larger than the limit of {max} bytes")));
            }
            self.hold(&mut held, length)?;
            body.extend_from_slice(&data);
        }
        Ok((body.freeze(), held))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_fit_up_to_the_budget_and_are_given_back() {
        let budget = BodyBudget::new(100);
        let mut a = Held::default();
        budget.hold(&mut a, 60).unwrap();
        let mut b = Held::default();
        assert!(matches!(budget.hold(&mut b, 41), Err(Refused::Busy(_))), "one byte past the budget");
        budget.hold(&mut b, 40).unwrap();
        assert_eq!(budget.bytes.available_permits(), 0);
        drop(a);
        budget.hold(&mut b, 100).unwrap();
        drop(b);
        assert_eq!(budget.bytes.available_permits(), 100);
    }

    #[test]
    fn a_body_larger_than_the_whole_budget_is_too_large_not_busy() {
        let budget = BodyBudget::new(100);
        assert!(matches!(budget.hold(&mut Held::default(), 101), Err(Refused::TooLarge(_))));
        assert!(budget.hold(&mut Held::default(), 100).is_ok());
    }
}
