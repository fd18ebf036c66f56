//! The mail sensor: one RFC 5322 message (as procmail or a `.forward` pipe
//! delivers it) becomes one event.
//!
//! The message is parsed with the `mail-parser` crate (folded header lines,
//! RFC 2047 encoded words, MIME, quoted-printable and base64, charsets
//! converted to UTF-8). The event is:
//!
//! | element | value |
//! |---|---|
//! | one per header field (`From`, `To`, `Subject`, `Date`, `Message-ID`, ...) | the field unfolded, encoded words decoded; a field that appears more than once gives one element, its values joined by newlines in message order |
//! | `kn_id` | the Message-ID without `<>`; without one, `mail-` and a digest of the other elements, so that a redelivery still maps to the same event |
//! | `kn_payload` | the text body: the `text/plain` parts (an HTML-only body converted to text), line ends as `\n` |
//! | `attachment.N` | each attachment (N from 1): `name; type/subtype; size bytes` |
//! | `alternative.N` | each other body part not used for the payload (the HTML version of a text body, inline images): `name; type/subtype; size bytes` |
//!
//! Header names are written the usual way (`Message-ID`, `Subject`,
//! `X-Mailer`) whatever case the message used. Trace fields that a
//! delivery adds and that differ from one delivery to the next
//! ([`TRACE_FIELDS`]) are left out, and an mbox `From ` line is skipped, so
//! every element is a function of the message as its author sent it: the
//! same message delivered twice is the same event, which the store
//! suppresses as a duplicate.

use std::collections::BTreeMap;

use kn_journal::Event;
use mail_parser::{HeaderForm, HeaderName, HeaderValue, Message, MessageParser, MimeHeaders, PartType};

use crate::SensorError;

/// Header fields that are not elements: trace and delivery fields added on
/// the way (they differ between two deliveries of one message), compared
/// without regard to case.
pub const TRACE_FIELDS: &[&str] = &[
    "Received",
    "Return-Path",
    "Delivered-To",
    "X-Original-To",
    "Envelope-To",
    "X-Envelope-From",
    "X-Envelope-To",
    "Received-SPF",
    "Authentication-Results",
    "ARC-Seal",
    "ARC-Message-Signature",
    "ARC-Authentication-Results",
];

/// Builds the event for one raw message (see the module documentation).
///
/// Fails with a data error (`EX_DATAERR`, 65) when the input is empty or
/// has no header field at all: that is not a mail message.
///
/// ```
/// let raw = b"From ann@example.com Sat Jan  3 01:05:34 2004\n\
///             From: Ann <ann@example.com>\n\
///             Subject: long\n  folded subject\n\
///             Message-ID: <42@example.com>\n\
///             \n\
///             Body.\n";
/// let event = kn_sensors::mail::event_from_message(raw).unwrap();
/// assert_eq!(event.get_str("Subject").unwrap(), "long folded subject");
/// assert_eq!(event.get_str("From").unwrap(), "Ann <ann@example.com>");
/// assert_eq!(event.id(), Some(&b"42@example.com"[..]));
/// assert_eq!(event.payload(), b"Body.\n");
/// assert!(kn_sensors::mail::event_from_message(b"").is_err());
/// ```
pub fn event_from_message(raw: &[u8]) -> Result<Event, SensorError> {
    let raw = skip_mbox_from_line(raw);
    if raw.iter().all(u8::is_ascii_whitespace) {
        return Err(SensorError::data("the message on standard input is empty"));
    }
    let message = MessageParser::default()
        .parse(raw)
        .filter(|m| m.parts.first().is_some_and(|root| !root.headers.is_empty()))
        .ok_or_else(|| SensorError::data("the input on standard input is not a mail message: it has no header fields"))?;

    let mut event = Event::new();
    for (name, values) in header_fields(&message) {
        event.set(name, values.join("\n"));
    }
    let (payload, used) = text_body(&message);
    describe_parts(&message, &used, &mut event);
    event.set("kn_payload", payload);

    match message.message_id().map(str::trim).filter(|id| !id.is_empty()) {
        Some(id) => event.set("kn_id", id),
        None => event.set("kn_id", format!("mail-{:032x}", digest(&event))),
    };
    Ok(event)
}

/// Drops a leading mbox `From ` envelope line, if any.
fn skip_mbox_from_line(raw: &[u8]) -> &[u8] {
    if !raw.starts_with(b"From ") {
        return raw;
    }
    match raw.iter().position(|&b| b == b'\n') {
        Some(end) => &raw[end + 1..],
        None => b"",
    }
}

/// The root header fields as element names and decoded values, repeated
/// fields gathered in message order, trace fields left out.
fn header_fields(message: &Message<'_>) -> BTreeMap<String, Vec<String>> {
    let mut fields: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let Some(root) = message.parts.first() else { return fields };
    for header in &root.headers {
        let name = element_name(&header.name);
        if fields.contains_key(&name) || TRACE_FIELDS.iter().any(|t| t.eq_ignore_ascii_case(&name)) {
            continue;
        }
        let values = message
            .header_as(header.name.clone(), HeaderForm::Text)
            .iter()
            .map(|value| match value {
                HeaderValue::Text(text) => clean_value(text),
                HeaderValue::TextList(list) => clean_value(&list.join(" ")),
                _ => String::new(),
            })
            .collect();
        fields.insert(name, values);
    }
    fields
}

/// A header value on one line, without surrounding blanks.
fn clean_value(text: &str) -> String {
    let unfolded: String = text.chars().map(|c| if c == '\r' || c == '\n' { ' ' } else { c }).collect();
    unfolded.split(' ').filter(|w| !w.is_empty()).collect::<Vec<_>>().join(" ")
}

/// The usual spelling of a header name: the known ones as the RFCs write
/// them (`Message-ID`, `MIME-Version`), others with each `-`-separated word
/// capitalised (`X-Mailer`).
fn element_name(name: &HeaderName<'_>) -> String {
    match name {
        HeaderName::Other(other) => other
            .split('-')
            .map(|word| {
                let mut chars = word.chars();
                match chars.next() {
                    Some(first) => first.to_uppercase().chain(chars.flat_map(char::to_lowercase)).collect(),
                    None => String::new(),
                }
            })
            .collect::<Vec<String>>()
            .join("-"),
        known => known.as_str().to_string(),
    }
}

/// The payload text and the indexes of the parts it was made from: the
/// text parts of the text body (HTML ones converted), joined by a newline.
fn text_body(message: &Message<'_>) -> (String, Vec<usize>) {
    let mut texts = Vec::new();
    let mut used = Vec::new();
    for &id in &message.text_body {
        let Some(part) = message.parts.get(id as usize) else { continue };
        let text = match &part.body {
            PartType::Text(text) => text.replace("\r\n", "\n"),
            PartType::Html(html) => crate::html_to_text(html),
            _ => continue,
        };
        texts.push(text);
        used.push(id as usize);
    }
    // Trailing blank lines vary with the delivery path (procmail ends
    // every message with one): the payload ends with one line end.
    let mut payload = texts.join("\n").trim_end().to_string();
    if !payload.is_empty() {
        payload.push('\n');
    }
    (payload, used)
}

/// Adds `attachment.N` and `alternative.N` elements for the leaf parts
/// that did not become the payload.
fn describe_parts(message: &Message<'_>, used: &[usize], event: &mut Event) {
    let attachments: Vec<usize> = message.attachments.iter().map(|&id| id as usize).collect();
    let (mut n_attachment, mut n_alternative) = (0, 0);
    for (index, part) in message.parts.iter().enumerate() {
        if used.contains(&index) || matches!(part.body, PartType::Multipart(_)) {
            continue;
        }
        let name = match (&part.body, part.attachment_name()) {
            (_, Some(name)) => name.to_string(),
            (PartType::Message(nested), None) => nested.subject().unwrap_or("-").to_string(),
            _ => "-".to_string(),
        };
        let content_type = match part.content_type() {
            Some(ct) => match ct.subtype() {
                Some(sub) => format!("{}/{}", ct.ctype(), sub),
                None => ct.ctype().to_string(),
            },
            None if matches!(part.body, PartType::Message(_)) => "message/rfc822".to_string(),
            None => "text/plain".to_string(),
        }
        .to_ascii_lowercase();
        let description = format!("{}; {}; {} bytes", clean_value(&name), content_type, part.len());
        if attachments.contains(&index) {
            n_attachment += 1;
            event.set(format!("attachment.{n_attachment}"), description);
        } else {
            n_alternative += 1;
            event.set(format!("alternative.{n_alternative}"), description);
        }
    }
}

/// A 128-bit digest of the elements (names and values, length-prefixed).
fn digest(event: &Event) -> u128 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for (name, value) in event.elements() {
        h.update(&(name.len() as u64).to_le_bytes());
        h.update(name);
        h.update(&(value.len() as u64).to_le_bytes());
        h.update(value);
    }
    h.digest128()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_names_are_written_the_usual_way() {
        assert_eq!(element_name(&HeaderName::Other("x-MAILER".into())), "X-Mailer");
        assert_eq!(element_name(&HeaderName::MessageId), "Message-ID");
        assert_eq!(element_name(&HeaderName::Other("kn_id".into())), "Kn_id");
    }

    #[test]
    fn trace_fields_and_the_from_line_are_not_elements() {
        let a = b"From a@b Mon Jan 1 00:00:00 2024\nReceived: from x by y; Mon, 1 Jan 2024 00:00:01 +0000\nSubject: s\n\nb\n";
        let b = b"From a@b Tue Jan 2 00:00:00 2024\nReceived: from z by y; Tue, 2 Jan 2024 00:00:01 +0000\nDelivered-To: me\nSubject: s\n\nb\n";
        let (ea, eb) = (event_from_message(a).unwrap(), event_from_message(b).unwrap());
        assert_eq!(ea, eb);
        assert!(!ea.contains("Received"));
        assert!(ea.id().unwrap().starts_with(b"mail-"));
    }

    #[test]
    fn repeated_fields_are_joined_by_newlines() {
        let e = event_from_message(b"Subject: s\nX-Tag: one\nx-tag: two\n\nb").unwrap();
        assert_eq!(e.get_str("X-Tag").unwrap(), "one\ntwo");
    }

    #[test]
    fn text_without_headers_is_not_a_message() {
        assert_eq!(event_from_message(b"just some words\n").unwrap_err().exit_code(), 65);
        assert_eq!(event_from_message(b"\n\n").unwrap_err().exit_code(), 65);
    }
}
