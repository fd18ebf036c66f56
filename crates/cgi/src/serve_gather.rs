//! Group commit on `serve`'s event loop: the small notifies to one topic
//! that the server has in hand at once (eight publishers to a chat room)
//! are gathered and made together ([`Handler::handle_nowait_group`]: one
//! append of all their records, one forwarding pass), each answered as
//! alone (crates/journal/FORMAT.md, "Group commit").
//!
//! The first notify to a topic with no group under way starts the
//! topic's leader, a task of its own (so that a client going away leaves
//! no one without an answer), which yields to the event loop's other
//! tasks while each turn brings more notifies to the topic (at most
//! [`GATHER_TURNS`]; no timer: a notify alone waits for nothing but a turn
//! or two of the scheduler), then takes the list and makes it. The
//! notifies that arrive while a group is being made wait for the same
//! leader, which makes them next, gathered the same way, and ends when a
//! group leaves none waiting: this process makes one group of a topic at
//! a time, so a group never finds the topic's locks held by the group
//! before it (which would send it to the blocking path, one post at a
//! time). A notify the group could not make at once goes back to its own
//! task, for the usual way that may wait.

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
pub(crate) type Made = Result<Response, Request>;

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
    /// for, with the others to that topic in hand ([`Gathering::enqueue`];
    /// `start` is given the topic when this one is the first, to run
    /// [`Gathering::make`] on a task of its own): `Ok` with its answer,
    /// `Err(Some(request))` for the caller to make the usual way,
    /// `Err(None)` if the group ended without an answer for it (a bug).
    pub(crate) async fn notify(&self, topic: Vec<u8>, request: Request, start: impl FnOnce(Vec<u8>)) -> Result<Response, Option<Request>> {
        let (answer, leads) = self.enqueue(&topic, request);
        if leads {
            start(topic);
        }
        match answer.await {
            Ok(made) => made.map_err(Some),
            Err(_) => Err(None),
        }
    }

    /// Queues `request`, a notify [`Handler::nowait_topic`] named `topic`
    /// for, with the others to that topic in hand: where its answer will
    /// come (`Ok` with it, `Err` with the request to make the usual way),
    /// and whether it is the first, for which the caller starts
    /// [`Gathering::make`] on a task of its own (so that a client going
    /// away cannot leave the others without an answer).
    pub(crate) fn enqueue(&self, topic: &[u8], request: Request) -> (oneshot::Receiver<Made>, bool) {
        let (sender, answer) = oneshot::channel();
        let mut waiting = self.waiting();
        match waiting.get_mut(topic) {
            Some(list) => {
                list.push((request, sender));
                (answer, false)
            }
            None => {
                waiting.insert(topic.to_vec(), vec![(request, sender)]);
                (answer, true)
            }
        }
    }

    /// Makes the notifies queued for `topic`, as its leader: yields to
    /// the event loop's other tasks while each turn brings more (at most
    /// [`GATHER_TURNS`]), makes them as one group and sends each its
    /// answer; then again with those that came meanwhile, until a group
    /// leaves none waiting. Should a group panic (a bug), the topic's
    /// waiting notifies are dropped (each answered as a bug) and the next
    /// one starts a new leader.
    pub(crate) async fn make(&self, handler: &Handler, topic: &[u8]) {
        let mut leading = Leading { gathering: self, topic, done: false };
        loop {
            let mut had = self.waiting().get(topic).map_or(0, Vec::len);
            for turn in 0..GATHER_TURNS {
                tokio::task::yield_now().await;
                let now = self.waiting().get(topic).map_or(0, Vec::len);
                if now == had && turn > 0 {
                    break;
                }
                had = now;
            }
            let list = self.take(topic);
            let requests: Vec<&Request> = list.iter().map(|(request, _)| request).collect();
            let replies = handler.handle_nowait_group(&requests);
            drop(requests);
            for ((request, sender), reply) in list.into_iter().zip(replies) {
                let _ = sender.send(match reply {
                    Some(Reply::Done(response)) => Ok(response),
                    _ => Err(request),
                });
            }
            if self.finish(topic) {
                leading.done = true;
                return;
            }
        }
    }

    /// The notifies waiting for `topic`, taken to be made as a group; the
    /// topic's entry stays (its leader is at work), so that those queued
    /// meanwhile wait for this leader.
    fn take(&self, topic: &[u8]) -> Vec<(Request, oneshot::Sender<Made>)> {
        self.waiting().get_mut(topic).map(std::mem::take).unwrap_or_default()
    }

    /// After a group: true, the topic's entry removed, when none came
    /// meanwhile (under the lock that queues them, so none is left
    /// behind: the next one starts a new leader); false when they are the
    /// leader's next group.
    fn finish(&self, topic: &[u8]) -> bool {
        let mut waiting = self.waiting();
        if waiting.get(topic).is_none_or(Vec::is_empty) {
            waiting.remove(topic);
            return true;
        }
        false
    }
}

/// A topic's leader ([`Gathering::make`]) under way: should it stop
/// without ending its loop (a panic, a dropped task), the topic's entry
/// goes, so that the next notify starts a new leader rather than waiting
/// for one that is gone.
struct Leading<'g> {
    gathering: &'g Gathering,
    topic: &'g [u8],
    done: bool,
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.gathering.waiting().remove(self.topic);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::request::{HttpRequest, Limits};

    fn notify(payload: &str) -> Request {
        let http = HttpRequest {
            method: "POST".into(),
            path_info: b"/room".to_vec(),
            query: b"kn_response_format=simple".to_vec(),
            body: format!("do_method=notify&kn_payload={payload}").into_bytes(),
            script_name: "/kn".into(),
            server_name: "127.0.0.1".into(),
            server_port: 8080,
            ..HttpRequest::default()
        };
        Request::from_http(http, &Limits::default()).unwrap()
    }

    /// A topic has one leader at a time: a notify queued while its group
    /// is made waits for that leader (no new one), which takes it next;
    /// the leader ends only when a group left none, and the next notify
    /// then starts a new one.
    #[test]
    fn notifies_queued_while_a_group_is_made_wait_for_its_leader() {
        let gathering = Gathering::default();
        let (_a, leads) = gathering.enqueue(b"/room", notify("a"));
        assert!(leads);
        let (_b, leads) = gathering.enqueue(b"/room", notify("b"));
        assert!(!leads);
        assert_eq!(gathering.take(b"/room").len(), 2);
        // Being made: the entry stays, empty; a new notify joins it.
        let (_c, leads) = gathering.enqueue(b"/room", notify("c"));
        assert!(!leads, "a second leader while the first makes its group");
        assert!(!gathering.finish(b"/room"), "the leader ended with a notify waiting");
        assert_eq!(gathering.take(b"/room").len(), 1);
        assert!(gathering.finish(b"/room"));
        assert!(gathering.waiting().is_empty());
        let (_d, leads) = gathering.enqueue(b"/room", notify("d"));
        assert!(leads, "no leader after the last group");
    }

    /// A leader that stops without ending its loop (a panic in a group,
    /// a dropped task) takes the topic's entry with it: those waiting get
    /// no answer (answered as a bug), and the next notify leads anew.
    #[test]
    fn a_leader_gone_leaves_no_notify_waiting_for_it() {
        let gathering = Gathering::default();
        let (mut answer, _) = gathering.enqueue(b"/room", notify("a"));
        drop(Leading { gathering: &gathering, topic: b"/room", done: false });
        assert!(matches!(answer.try_recv(), Err(oneshot::error::TryRecvError::Closed)));
        let (_b, leads) = gathering.enqueue(b"/room", notify("b"));
        assert!(leads);
    }

    /// Notifies to one topic sent together through the gathering, on a
    /// real store: each answered, all stored in the order queued, and no
    /// leader left behind.
    #[test]
    fn notifies_gathered_together_are_all_answered_and_stored_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = kn_journal::Config::new(dir.path().join("events"));
        config.reserve_bytes = 0;
        let store = Arc::new(kn_journal::Store::open_with(config).unwrap());
        let handler = Arc::new(Handler::new(store.clone(), crate::handler::Options::default()));
        // The topic made first, the usual way: its files then kept open,
        // as a busy topic's are.
        assert!(matches!(handler.handle(&notify("first")), Reply::Done(_)));
        let gathering = Arc::new(Gathering::default());
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let answers = runtime.block_on(async {
            let mut tasks = Vec::new();
            for i in 0..12 {
                let (gathering, handler) = (gathering.clone(), handler.clone());
                tasks.push(tokio::spawn(async move {
                    let lead = {
                        let (gathering, handler) = (gathering.clone(), handler.clone());
                        move |topic: Vec<u8>| drop(tokio::spawn(async move { gathering.make(&handler, &topic).await }))
                    };
                    gathering.notify(b"/room".to_vec(), notify(&format!("p{i}")), lead).await
                }));
                if i % 4 == 3 {
                    tokio::task::yield_now().await;
                }
            }
            let mut answers = Vec::new();
            for task in tasks {
                answers.push(task.await.unwrap());
            }
            answers
        });
        for answer in &answers {
            let response = answer.as_ref().expect("answered by the group");
            assert!(String::from_utf8_lossy(&response.body).contains("Wrote to '/room'"));
        }
        let topic = kn_journal::Topic::parse("/room").unwrap();
        let stored: Vec<String> = store.events(&topic, &kn_journal::Selection::all()).unwrap().events.iter().map(|e| String::from_utf8_lossy(e.payload()).into_owned()).collect();
        let want: Vec<String> = std::iter::once("first".to_owned()).chain((0..12).map(|i| format!("p{i}"))).collect();
        assert_eq!(stored, want);
        assert!(store.grouped_posts() >= 8, "{} posts grouped", store.grouped_posts());
        assert!(gathering.waiting().is_empty());
    }
}
