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
pub(crate) fn objects(piece: &[u8]) -> Box<dyn Iterator<Item = &str> + Send + '_> {
    // A piece is UTF-8 (the `sse` format's JSON): checked once, its lines
    // are then found by the library's fast search, not byte by byte.
    match std::str::from_utf8(piece) {
        Ok(text) => Box::new(text.split('\n').filter_map(|line| line.strip_prefix("data: "))),
        Err(_) => Box::new(piece.split(|&b| b == b'\n').filter_map(|line| line.strip_prefix(b"data: ")).filter_map(|data| std::str::from_utf8(data).ok())),
    }
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
pub(crate) struct NotARequest {
    why: String,
    /// The frame's `kn_id`, when it was found before the frame was
    /// found wanting: its answer carries it.
    kn_id: Option<Vec<u8>>,
    /// More pairs than `KN_MAX_FORM_ELEMENTS` allows (`413`, else `400`).
    too_many: bool,
}

impl NotARequest {
    /// A frame refused for `why`, answering `kn_id`.
    pub(crate) fn new(why: impl Into<String>, kn_id: Option<&[u8]>) -> NotARequest {
        NotARequest { why: why.into(), kn_id: kn_id.map(<[u8]>::to_vec), too_many: false }
    }

    fn too_many(max_pairs: usize, kn_id: Option<Vec<u8>>) -> NotARequest {
        let why = format!("more than {} form elements in the frame and its kn_response_format together (KN_MAX_FORM_ELEMENTS)", max_pairs + 1);
        NotARequest { why, kn_id, too_many: true }
    }
}

/// Reads one text frame of the client: a form body, or a JSON object
/// whose values are strings (or arrays of strings, for a parameter given
/// several times, as `kn_batch`). Only `notify`, `route` into a topic
/// and `batch` travel on a socket: a tunnel is the socket itself.
///
/// At most `max_pairs` pairs are decoded (`KN_MAX_FORM_ELEMENTS` less the
/// one the request adds, its format): a frame of more is refused as soon
/// as they are counted, as a form POST is, never decoded whole (a 4 MiB
/// frame of a million tiny pairs would take some 45 times its size).
pub(crate) fn message(text: &str, max_pairs: usize) -> Result<Message, NotARequest> {
    let pairs = if text.trim_start().starts_with('{') { json_pairs(text, max_pairs)? } else { form_pairs(text, max_pairs)? };
    let get = |name: &str| pairs.iter().find(|(n, _)| n == name.as_bytes()).map(|(_, v)| v.as_slice());
    let kn_id = get("kn_id");
    let method = get("do_method").unwrap_or(b"notify");
    match method {
        b"notify" | b"batch" => {}
        b"route" if !opens_a_tunnel(get("kn_to")) => {}
        b"route" => return Err(NotARequest::new("a WebSocket follows the journal of its URL: open another socket to follow another topic", kn_id)),
        other => {
            let why = format!("do_method '{}' does not travel on a WebSocket: only notify, route and batch do", String::from_utf8_lossy(other));
            return Err(NotARequest::new(why, kn_id));
        }
    }
    let kn_id = kn_id.map(<[u8]>::to_vec);
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

fn form_pairs(text: &str, max_pairs: usize) -> Result<Pairs, NotARequest> {
    match form::Params::parse_at_most(text.as_bytes(), max_pairs) {
        Ok(params) => Ok(params.into_pairs()),
        Err(e) if e.kind() == kn_wire::ErrorKind::TooManyElements => Err(NotARequest::too_many(max_pairs, form_kn_id(text, max_pairs))),
        Err(e) => {
            let why = format!("the frame is neither a form body nor a JSON object: {}", e.message());
            Err(NotARequest { why, kn_id: form_kn_id(text, max_pairs), too_many: false })
        }
    }
}

/// The `kn_id` among the first `max_pairs` pairs of a form body that is
/// no request, each decoded alone.
fn form_kn_id(text: &str, max_pairs: usize) -> Option<Vec<u8>> {
    let pairs = text.split(['&', ';']).filter(|p| !p.is_empty()).take(max_pairs);
    pairs.filter_map(|p| form::parse(p.as_bytes()).ok()?.pop()).find(|(n, _)| n == b"kn_id").map(|(_, v)| v)
}

/// The pairs of a JSON object, read as they come (no JSON value of the
/// whole frame is built), the `max_pairs + 1`th ending the reading.
fn json_pairs(text: &str, max_pairs: usize) -> Result<Pairs, NotARequest> {
    use serde::de::DeserializeSeed;
    let mut pairs = JsonPairs { pairs: Vec::new(), max: max_pairs, too_many: false, kn_id: None };
    let mut reader = serde_json::Deserializer::from_str(text);
    let read = (&mut pairs).deserialize(&mut reader).and_then(|()| reader.end());
    match read {
        Ok(()) => Ok(pairs.pairs),
        Err(_) if pairs.too_many => Err(NotARequest::too_many(max_pairs, pairs.kn_id)),
        Err(e) => Err(NotARequest { why: format!("the frame is not a JSON object of strings: {e}"), kn_id: pairs.kn_id, too_many: false }),
    }
}

/// The pairs of a JSON request frame so far (serde's visitor).
struct JsonPairs {
    pairs: Pairs,
    max: usize,
    too_many: bool,
    kn_id: Option<Vec<u8>>,
}

impl JsonPairs {
    fn push<E: serde::de::Error>(&mut self, name: &str, value: Vec<u8>) -> Result<(), E> {
        if self.pairs.len() >= self.max {
            self.too_many = true;
            return Err(E::custom("too many form elements"));
        }
        if name == "kn_id" && self.kn_id.is_none() {
            self.kn_id = Some(value.clone());
        }
        self.pairs.push((name.as_bytes().to_vec(), value));
        Ok(())
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for &mut JsonPairs {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for &mut JsonPairs {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an object of request parameters")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(name) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            map.next_value_seed(JsonValue { pairs: &mut *self, name: &name, in_array: false })?;
        }
        Ok(())
    }
}

/// One parameter's value: a string, a number, or (at the top) an array
/// of strings, each a pair.
struct JsonValue<'p, 'n> {
    pairs: &'p mut JsonPairs,
    name: &'n str,
    in_array: bool,
}

impl<'de> serde::de::DeserializeSeed<'de> for JsonValue<'_, '_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for JsonValue<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        if self.in_array {
            write!(f, "a string in '{}'", self.name)
        } else {
            write!(f, "a string, a number or an array of strings for '{}'", self.name)
        }
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<(), E> {
        self.pairs.push(self.name, v.as_bytes().to_vec())
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<(), E> {
        self.number(serde_json::Number::from(v))
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<(), E> {
        self.number(serde_json::Number::from(v))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<(), E> {
        match serde_json::Number::from_f64(v) {
            Some(n) => self.number(n),
            None => Err(E::custom(format!("'{}' is not a finite number", self.name))),
        }
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if self.in_array {
            return Err(serde::de::Error::custom(format!("'{}' holds a value that is not a string", self.name)));
        }
        while seq.next_element_seed(JsonValue { pairs: &mut *self.pairs, name: self.name, in_array: true })?.is_some() {}
        Ok(())
    }
}

impl JsonValue<'_, '_> {
    fn number<E: serde::de::Error>(self, n: serde_json::Number) -> Result<(), E> {
        if self.in_array {
            return Err(E::custom(format!("'{}' holds a value that is not a string", self.name)));
        }
        self.pairs.push(self.name, n.to_string().into_bytes())
    }
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

/// A status event answering a frame that was no request (`400`, or
/// `413` for one of too many pairs), with its `kn_id` when it has one.
pub(crate) fn refusal(why: &NotARequest) -> String {
    let (code, text) = if why.too_many { (413, "Too many form elements") } else { (400, "Bad request") };
    answer(kn_wire::status_event(code, text, why.why.as_bytes(), None), why.kn_id.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(text: &str) -> Result<Message, NotARequest> {
        super::message(text, 100)
    }

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
    fn a_frame_of_more_pairs_than_the_limit_is_refused_with_its_kn_id() {
        let at = super::message("kn_id=a&kn_to=%2Fa&x=1", 3).unwrap();
        assert_eq!(at.kn_id.as_deref(), Some(&b"a"[..]));
        for past in ["kn_id=b&kn_to=%2Fa&x=1&y=2", r#"{"kn_id":"b","kn_to":"/a","x":["1","2"]}"#, r#"{"kn_id":"b","kn_to":"/a","x":1,"y":2.5}"#] {
            let refused = super::message(past, 3).unwrap_err();
            assert!(refused.too_many, "{past}");
            assert_eq!(refused.kn_id.as_deref(), Some(&b"b"[..]), "{past}");
            let value: serde_json::Value = serde_json::from_str(&refusal(&refused)).unwrap();
            assert_eq!(value["status"], "413 Too many form elements");
            assert_eq!(value[IN_REPLY_TO], "b");
        }
        assert!(super::message(r#"{"kn_id":"c","kn_to":"/a","x":1,"y":2.5}"#, 4).is_ok(), "numbers are pairs");
    }

    #[test]
    fn a_frame_refused_for_what_it_asks_is_answered_with_its_kn_id() {
        for frame in [r#"{"kn_id":"d","do_method":"replay"}"#, "kn_id=d&do_method=replay", r#"{"kn_id":"d","x":[["nested"]]}"#, "kn_id=d&x=%zz"] {
            let refused = message(frame).unwrap_err();
            assert!(!refused.too_many, "{frame}");
            assert_eq!(refused.kn_id.as_deref(), Some(&b"d"[..]), "{frame}");
        }
        assert!(message(r#"{"x":[1]}"#).is_err(), "an array holds strings only");
        assert!(message(r#"{"x":null}"#).is_err());
        assert!(message(r#"{"kn_to":"/a"} trailing"#).is_err());
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
