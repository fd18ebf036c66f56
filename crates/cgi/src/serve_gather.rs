//! Group commit on `serve`'s event loop: the small notifies to one topic
//! that the server has in hand at once (eight publishers to a chat room)
//! are gathered and made together ([`Handler::handle_nowait_group`]: one
//! append of all their records, one forwarding pass), each answered as
//! alone (crates/journal/FORMAT.md, "Group commit").
//!
//! The first notify to a topic with none waiting leads: it yields once to
//! the other tasks of the event loop, so that the requests already read
//! reach the topic's list too (no timer: a notify alone waits for nothing
//! but one turn of the scheduler), then takes the list and makes it. A
//! notify the group could not make at once goes back to its own task, for
//! the usual way that may wait.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use tokio::sync::oneshot;

use crate::handler::{Handler, Reply};
use crate::request::Request;
use crate::response::Response;

/// The most turns of the scheduler a leading notify yields for others
/// to join it (each after one that brought some).
const GATHER_TURNS: usize = 4;

/// What a gathered notify's task gets back: its answer, or its request
/// to make the usual way.
type Made = Result<Response, Request>;

/// The notifies gathered by topic, each with where its answer goes.
type Waiting = HashMap<Vec<u8>, Vec<(Request, oneshot::Sender<Made>)>>;

/// The small notifies waiting to be made together, by the topic they
/// name (as given, before it is resolved).
#[derive(Default)]
pub(crate) struct Gathering {
    waiting: Mutex<Waiting>,
}

impl Gathering {
    fn waiting(&self) -> MutexGuard<'_, Waiting> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes `request`, a notify [`Handler::nowait_topic`] named `topic`
    /// for, with the others to that topic in hand: `Ok` with its answer,
    /// `Err(Some(request))` for the caller to make the usual way,
    /// `Err(None)` if the task leading its group ended without an answer
    /// for it (a bug).
    pub(crate) async fn notify(&self, handler: &Handler, topic: Vec<u8>, request: Request) -> Result<Response, Option<Request>> {
        let (sender, answer) = oneshot::channel();
        let leads = {
            let mut waiting = self.waiting();
            match waiting.get_mut(&topic) {
                Some(list) => {
                    list.push((request, sender));
                    false
                }
                None => {
                    waiting.insert(topic.clone(), vec![(request, sender)]);
                    true
                }
            }
        };
        if leads {
            // Yield while each turn brings more notifies to the topic.
            let mut had = 0;
            for _ in 0..GATHER_TURNS {
                tokio::task::yield_now().await;
                let now = self.waiting().get(&topic).map_or(0, Vec::len);
                if now == had {
                    break;
                }
                had = now;
            }
            let list = self.waiting().remove(&topic).unwrap_or_default();
            let requests: Vec<&Request> = list.iter().map(|(request, _)| request).collect();
            let replies = handler.handle_nowait_group(&requests);
            drop(requests);
            for ((request, sender), reply) in list.into_iter().zip(replies) {
                let _ = sender.send(match reply {
                    Some(Reply::Done(response)) => Ok(response),
                    _ => Err(request),
                });
            }
        }
        match answer.await {
            Ok(made) => made.map_err(Some),
            Err(_) => Err(None),
        }
    }
}
