//! `do_method=receipts` and `do_method=ack` (docs/PRESENCE.md,
//! "Receipts"): the answer's events, from what the store decides.

use kn_journal::access::AsUser;
use kn_journal::{Event, KN_PAYLOAD};
use kn_journal::internal::{Receipt, Receipts};
use kn_wire::{status_event, Format, Page};

use super::{failure_event, Failure, Handler, Reply};
use crate::request::Request;

impl Handler {
    /// `do_method=receipts`: the topic (`kn_from`, else path info) and the
    /// event's `kn_id`; a `200 Receipts` status event, then one event per
    /// journal routed from the topic.
    pub(super) fn receipts(&self, request: &Request, format: Format, page: &Page, user: &AsUser) -> Reply {
        let params = request.params();
        let status_from = params.get("kn_status_from");
        let events = match self.receipt_events(request, user) {
            Ok(events) => events,
            Err(f) => vec![failure_event(f, status_from)],
        };
        self.reply_statuses(request, format, page, events)
    }

    fn receipt_events(&self, request: &Request, user: &AsUser) -> Result<Vec<Event>, Failure> {
        let params = request.params();
        let topic = self.topic_param(params, "kn_from", request.path_info(), "bad receipts topic name")?;
        let Some(id) = params.get("kn_id").filter(|id| !id.is_empty()) else {
            return Err(Failure::new(400, "Bad request", "do_method=receipts needs the kn_id of an event of the topic"));
        };
        let receipts = user.receipts(&topic, id).map_err(|e| Failure::journal(e, "bad receipts topic name"))?;
        let Some(receipts) = receipts else {
            let id = String::from_utf8_lossy(id);
            return Err(Failure::new(404, "Not Found", format!("'{topic}' has no current event with kn_id '{id}'")));
        };
        let count = |f: fn(&Receipt) -> bool| receipts.journals.iter().filter(|r| f(r)).count();
        let mut summary = format!(
            "{} journals routed from '{topic}': {} hold the event, {} sent it to a live client, {} confirmed it\n",
            receipts.journals.len(),
            count(|r| r.holds.is_some()),
            count(|r| r.sent),
            count(|r| r.confirmed),
        );
        if receipts.not_read > 0 {
            summary.push_str(&format!(
                "{} more journals routed from '{topic}' were not read: at most {} per request (KN_RECEIPTS_MAX_JOURNALS)\n",
                receipts.not_read,
                receipts.journals.len(),
            ));
        }
        let mut events = vec![status_event(200, "Receipts", summary, params.get("kn_status_from"))];
        events.extend(receipts.journals.iter().map(|r| receipt_event(&receipts, r)));
        Ok(events)
    }

    /// `do_method=ack`: the journal (`kn_from`, else path info) and the
    /// `kn_route_checkpoint` its client has seen everything up to.
    pub(super) fn ack(&self, request: &Request, format: Format, page: &Page, user: &AsUser) -> Reply {
        let params = request.params();
        let status_from = params.get("kn_status_from");
        let status = match self.acked(request, user) {
            Ok(message) => status_event(200, "Confirmed", message, status_from),
            Err(f) => failure_event(f, status_from),
        };
        self.reply_statuses(request, format, page, vec![status])
    }

    fn acked(&self, request: &Request, user: &AsUser) -> Result<String, Failure> {
        let params = request.params();
        let journal = self.topic_param(params, "kn_from", request.path_info(), "bad journal name")?;
        let Some(checkpoint) = params.get("kn_route_checkpoint") else {
            return Err(Failure::new(400, "Bad request", "do_method=ack needs kn_route_checkpoint: the checkpoint of the last event seen"));
        };
        match user.confirm(&journal, checkpoint).map_err(|e| Failure::journal(e, "bad journal name"))? {
            Some(seq) => Ok(format!("Confirmed every event of '{journal}' up to checkpoint {seq}\n")),
            None => Err(Failure::new(404, "Not Found", format!("no journal '{journal}' on this server"))),
        }
    }
}

/// One journal's receipt: its state always; its journal, route and
/// creator only when the asker may see the route.
fn receipt_event(receipts: &Receipts, r: &Receipt) -> Event {
    let yes_no = |b: bool| if b { "true" } else { "false" };
    let mut e = Event::new();
    e.set("receipt_topic", receipts.topic.as_str())
        .set("receipt_event", receipts.id.as_slice())
        .set("receipt_holds", yes_no(r.holds.is_some()))
        .set("receipt_sent", yes_no(r.sent))
        .set("receipt_confirmed", yes_no(r.confirmed));
    if !r.visible {
        e.set(KN_PAYLOAD, "");
        return e;
    }
    e.set(KN_PAYLOAD, r.journal.as_str()).set("receipt_journal", r.journal.as_str()).set("receipt_route", r.route.id());
    if let Some(at) = r.holds {
        e.set("receipt_checkpoint", at.to_string());
    }
    if let Some(creator) = kn_journal::access::Principal::creator_of(&r.route.event).name() {
        e.set("receipt_creator", creator);
    }
    for name in [kn_journal::internal::KN_UNREAD_AFTER, kn_journal::internal::KN_UNREAD_TO] {
        if let Some(v) = r.route.event.get(name) {
            e.set(name, v);
        }
    }
    e
}
