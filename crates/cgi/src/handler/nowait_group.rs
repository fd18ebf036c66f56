//! Notifies to one topic that a server's event loop has in hand together,
//! answered as one group when the store can make them at once
//! ([`Handler::handle_nowait_group`], group commit: crates/journal/FORMAT.md,
//! "Group commit"); each answered byte for byte as
//! [`Handler::handle_nowait`] answers it alone.

use kn_journal::access::Operation;
use kn_journal::Topic;
use kn_wire::{Format, Page};

use super::{cross_origin, notified, outcome_event, Handler, Reply};
use crate::request::Request;

/// A notify of the group, ready for the store.
struct Ready<'r> {
    at: usize,
    request: &'r Request,
    format: Format,
    topic: Topic,
}

impl Handler {
    /// The topic a request that [`Handler::handle_nowait`] may answer names
    /// (its `kn_to`, else its path info), as given, for a server that
    /// gathers the notifies to one topic it has in hand
    /// ([`Handler::handle_nowait_group`]); `None` for any other request.
    pub fn nowait_topic(&self, request: &Request) -> Option<Vec<u8>> {
        let params = self.nowait_notify_params(request)?;
        Some(params.get("kn_to").unwrap_or(request.path_info()).to_vec())
    }

    /// [`Handler::handle_nowait`] for `requests` in hand together, each
    /// one [`Handler::nowait_topic`] accepted: those to one topic made as
    /// one group when the store can make them at once
    /// ([`kn_journal::Store::notify_nowait_group`]), each answered as alone.
    /// `None` in a request's place, having done nothing with it: call
    /// [`Handler::handle_deferring`] for it, where waiting is allowed.
    pub fn handle_nowait_group(&self, requests: &[&Request]) -> Vec<Option<Reply>> {
        if requests.len() < 2 {
            return requests.iter().map(|r| self.handle_nowait(r)).collect();
        }
        let mut replies: Vec<Option<Reply>> = requests.iter().map(|_| None).collect();
        let mut ready: Vec<Ready<'_>> = Vec::with_capacity(requests.len());
        for (at, request) in requests.iter().enumerate() {
            let params = request.params();
            let Ok(format) = Format::from_param(params.get("kn_response_format")) else { continue };
            let Some(who) = crate::session::principal_nowait(&self.store, request) else { continue };
            let topic = match self.topic_param(params, "kn_to", request.path_info(), "bad posting destination topic name") {
                Ok(topic) => topic,
                Err(failure) => {
                    replies[at] = Some(self.answer_alone(request, format, Err(failure)));
                    continue;
                }
            };
            if let Err(err) = self.store.as_user(&who).check(Operation::Post, &topic) {
                replies[at] = Some(self.answer_alone(request, format, notified(Err(err))));
                continue;
            }
            // Another topic by another name: left to the usual way.
            if ready.first().is_some_and(|first| first.topic != topic) {
                continue;
            }
            ready.push(Ready { at, request, format, topic });
        }
        let Some(topic) = ready.first().map(|r| r.topic.clone()) else { return replies };
        let events = ready.iter().map(|r| r.request.params().elements()).collect();
        let Some(answers) = self.store.notify_nowait_group(&topic, events) else { return replies };
        for (r, answer) in ready.iter().zip(answers) {
            replies[r.at] = Some(self.answer_alone(r.request, r.format, notified(answer)));
        }
        replies
    }

    /// The answer of one notify of a group, as [`Handler::handle_nowait`]
    /// makes it.
    fn answer_alone(&self, request: &Request, format: Format, outcome: super::Outcome) -> Reply {
        let page = Page::new(request.server_url());
        let status_from = request.params().get("kn_status_from");
        cross_origin(request, self.done(format, &page, vec![outcome_event(outcome, status_from)]))
    }
}
