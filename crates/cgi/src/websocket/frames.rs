//! What travels in a WebSocket's text frames (docs/PROTOCOL.md,
//! "WebSocket (extension)"), both ways.
//!
//! Server to client, one JSON object per frame: an event of the journal
//! or a status event, exactly the `data:` of the `sse` format
//! (`kn_wire::sse`, which decides those bytes). A socket's tunnel is an
//! `sse` tunnel of the handler, so its resume, gap signal, receipts and
//! end are the `sse` tunnel's; this module takes the objects out of its
//! pieces.
//!
//! Client to server, one request per frame: a form body
//! (`do_method=notify&kn_to=...`) or a JSON object of the same
//! parameters; answered with the status events the form protocol answers
//! with, each with `kn_in_reply_to`, the request's `kn_id`.

use kn_journal::Event;
use kn_wire::{form, simple, sse};

/// A request's parameters, names and values as sent.
type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// The element a request's answer carries its `kn_id` in.
pub(crate) const IN_REPLY_TO: &str = "kn_in_reply_to";

/// The JSON objects in `piece`, a piece of an `sse` tunnel: its `data:`
/// lines, in order (`id:`, `retry:` and comment lines are left out).
pub(crate) fn objects(piece: &[u8]) -> impl Iterator<Item = &str> {
    piece.split(|&b| b == b'\n').filter_map(|line| line.strip_prefix(b"data: ")).filter_map(|data| std::str::from_utf8(data).ok())
}

/// The status code of a status event written as a JSON object (its
/// `status` element, `"403 Forbidden"`), if it is one.
pub(crate) fn status_code(object: &str) -> Option<u16> {
    let value: serde_json::Value = serde_json::from_str(object).ok()?;
    let status = value.get("status")?.as_str()?;
    status.get(..3)?.parse().ok()
}

/// A client's request, ready for the handler.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Message {
    /// The form body the handler reads, answering in the `simple`
    /// format.
    pub(crate) body: Vec<u8>,
    /// The request's `kn_id`, echoed in its answers.
    pub(crate) kn_id: Option<Vec<u8>>,
}

/// Why a frame from the client is no request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct NotARequest(pub(crate) String);

/// Reads one text frame of the client: a form body, or a JSON object
/// whose values are strings (or arrays of strings, for a parameter given
/// several times, as `kn_batch`). Only `notify`, `route` into a topic
/// and `batch` travel on a socket: a tunnel is the socket itself.
pub(crate) fn message(text: &str) -> Result<Message, NotARequest> {
    let pairs = if text.trim_start().starts_with('{') { json_pairs(text)? } else { form_pairs(text)? };
    let get = |name: &str| pairs.iter().find(|(n, _)| n == name.as_bytes()).map(|(_, v)| v.as_slice());
    let method = get("do_method").unwrap_or(b"notify");
    match method {
        b"notify" | b"batch" => {}
        b"route" if !opens_a_tunnel(get("kn_to")) => {}
        b"route" => return Err(NotARequest("a WebSocket follows the journal of its URL: open another socket to follow another topic".into())),
        other => {
            return Err(NotARequest(format!(
                "do_method '{}' does not travel on a WebSocket: only notify, route and batch do",
                String::from_utf8_lossy(other)
            )))
        }
    }
    let kn_id = get("kn_id").map(<[u8]>::to_vec);
    // The first value of a name is the one read: the answer's format is
    // the socket's, whatever the frame says.
    let mut body = b"kn_response_format=simple&".to_vec();
    body.extend_from_slice(form::encode(pairs.iter().map(|(n, v)| (n.as_slice(), v.as_slice()))).as_bytes());
    Ok(Message { body, kn_id })
}

/// A route into `javascript:...` (or into nothing) is a tunnel, as
/// PROTOCOL.md 3.4 says.
fn opens_a_tunnel(kn_to: Option<&[u8]>) -> bool {
    match kn_to {
        None => true,
        Some(to) => to.len() >= 11 && to[..11].eq_ignore_ascii_case(b"javascript:"),
    }
}

fn form_pairs(text: &str) -> Result<Pairs, NotARequest> {
    form::parse(text.as_bytes()).map_err(|e| NotARequest(format!("the frame is neither a form body nor a JSON object: {}", e.message())))
}

fn json_pairs(text: &str) -> Result<Pairs, NotARequest> {
    let bad = |why: &str| NotARequest(format!("the frame is not a JSON object of strings: {why}"));
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(&e.to_string()))?;
    let object = value.as_object().ok_or_else(|| bad("not an object"))?;
    let mut pairs = Vec::with_capacity(object.len());
    for (name, value) in object {
        match value {
            serde_json::Value::String(s) => pairs.push((name.clone().into_bytes(), s.clone().into_bytes())),
            serde_json::Value::Array(items) => {
                for item in items {
                    let s = item.as_str().ok_or_else(|| bad(&format!("'{name}' holds a value that is not a string")))?;
                    pairs.push((name.clone().into_bytes(), s.as_bytes().to_vec()));
                }
            }
            serde_json::Value::Number(n) => pairs.push((name.clone().into_bytes(), n.to_string().into_bytes())),
            _ => return Err(bad(&format!("'{name}' is not a string"))),
        }
    }
    Ok(pairs)
}

/// The frames answering a request: each status event of the handler's
/// `simple` answer, with the request's `kn_id` added.
pub(crate) fn answers(simple_body: &[u8], kn_id: Option<&[u8]>) -> Vec<String> {
    let events = simple::decode_frames(simple_body).unwrap_or_default();
    events.into_iter().map(|event| answer(event, kn_id)).collect()
}

/// One status event answering a request whose `kn_id` is `kn_id`.
pub(crate) fn answer(mut event: Event, kn_id: Option<&[u8]>) -> String {
    if let Some(id) = kn_id {
        event.set(IN_REPLY_TO, id);
    }
    sse::json_object(&event)
}

/// A status event answering a frame that was no request (`400`).
pub(crate) fn refusal(why: &NotARequest, kn_id: Option<&[u8]>) -> String {
    answer(kn_wire::status_event(400, "Bad request", why.0.as_bytes(), None), kn_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_objects_of_an_sse_piece_are_its_data_lines() {
        let piece = b"retry: 1000\nid: c1\ndata: {\"a\":\"1\"}\n\n: keep-alive\ndata: {\"b\":\"2\"}\n\n";
        assert_eq!(objects(piece).collect::<Vec<_>>(), ["{\"a\":\"1\"}", "{\"b\":\"2\"}"]);
        assert_eq!(status_code("{\"status\":\"403 Forbidden\"}"), Some(403));
        assert_eq!(status_code("{\"kn_payload\":\"x\"}"), None);
    }

    #[test]
    fn a_form_and_a_json_object_make_the_same_request() {
        let form = message("do_method=notify&kn_to=%2Fwhat%2Fchat&kn_payload=hi+there&kn_id=m1").unwrap();
        let json = message(r#"{"do_method":"notify","kn_to":"/what/chat","kn_payload":"hi there","kn_id":"m1"}"#).unwrap();
        assert_eq!(form.kn_id.as_deref(), Some(&b"m1"[..]));
        let params = |m: &Message| kn_wire::Params::parse(&m.body).unwrap();
        assert_eq!(params(&form).get("kn_payload"), params(&json).get("kn_payload"));
        assert_eq!(params(&json).get("kn_to"), Some(&b"/what/chat"[..]));
        let overridden = message("kn_response_format=js&kn_to=%2Fa").unwrap();
        assert_eq!(params(&overridden).get("kn_response_format"), Some(&b"simple"[..]), "the socket's format wins");
        let batch = message(r#"{"do_method":"batch","kn_batch":["kn_to=%2Fa","kn_to=%2Fb"]}"#).unwrap();
        assert_eq!(params(&batch).get_all("kn_batch").count(), 2);
    }

    #[test]
    fn tunnels_and_other_methods_do_not_travel_on_a_socket() {
        assert!(message("do_method=route&kn_from=%2Fa&kn_to=%2Fb").is_ok(), "a route into a topic");
        assert!(message("do_method=route&kn_from=%2Fa&kn_to=%2Fb&kn_expires=%2B0").is_ok(), "a route deletion");
        assert!(message("do_method=route&kn_from=%2Fa").is_err(), "a tunnel");
        assert!(message("do_method=route&kn_from=%2Fa&kn_to=javascript%3Ax").is_err(), "a tunnel");
        assert!(message("do_method=lib").is_err());
        assert!(message(r#"{"kn_payload":{"nested":1}}"#).is_err());
        assert!(message("{not json").is_err());
    }

    #[test]
    fn answers_carry_the_requests_kn_id() {
        let status = kn_wire::status_event(200, "Notified", "Wrote", None);
        let body = simple::frame(&status);
        let frames = answers(&body, Some(b"m1"));
        assert_eq!(frames.len(), 1);
        let value: serde_json::Value = serde_json::from_str(&frames[0]).unwrap();
        assert_eq!(value["status"], "200 Notified");
        assert_eq!(value[IN_REPLY_TO], "m1");
    }
}
