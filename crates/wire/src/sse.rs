//! **Extension** `sse`: `text/event-stream` for `EventSource`.
//!
//! Each event is an `id:` line with its `kn_route_checkpoint` (only when it
//! has one, and only if that holds no CR, LF or NUL), a `data:` line with
//! the event as one JSON object of its elements (names in byte order), and
//! a blank line.
//!
//! **JSON encoding of byte strings.** A name or value that is valid UTF-8
//! becomes that JSON string exactly. One that is not is decoded lossily:
//! each invalid sequence becomes U+FFFD (as `String::from_utf8_lossy`), so
//! such bytes do not survive this format; clients that need them use
//! `simple`. Control characters, `"` and `\` are escaped as JSON requires
//! (`\n`, `\u0000`, ...), and so are DEL, U+2028 and U+2029; other
//! characters are written as raw UTF-8.
//!
//! ```
//! use kn_wire::{sse, Event};
//!
//! let event = Event::from_pairs([("kn_payload", "a\nb"), ("kn_route_checkpoint", "c7")]);
//! assert_eq!(sse::event(&event), b"id: c7\ndata: {\"kn_payload\":\"a\\nb\",\"kn_route_checkpoint\":\"c7\"}\n\n");
//! ```

use kn_journal::Event;

/// The keep-alive comment line.
pub const KEEP_ALIVE: &[u8] = b": keep-alive\n";

/// Appends the `retry:` field (HTML Living Standard, "Server-sent
/// events"), which asks `EventSource` to wait `millis` milliseconds before
/// reconnecting when the stream ends, instead of its own default (3 s in
/// browsers). A field line: written just before an event's `data:`, it
/// travels in that event's block.
///
/// ```
/// let mut out = Vec::new();
/// kn_wire::sse::write_retry(&mut out, 1000);
/// assert_eq!(out, b"retry: 1000\n");
/// ```
pub fn write_retry(out: &mut Vec<u8>, millis: u64) {
    out.extend_from_slice(format!("retry: {millis}\n").as_bytes());
}

/// One event, encoded.
pub fn event(event: &Event) -> Vec<u8> {
    let mut out = Vec::new();
    write_event(&mut out, event);
    out
}

/// Appends one event to `out`.
pub fn write_event(out: &mut Vec<u8>, event: &Event) {
    if let Some(id) = event.checkpoint().filter(|id| !id.iter().any(|b| matches!(b, b'\r' | b'\n' | 0))) {
        out.extend_from_slice(b"id: ");
        out.extend_from_slice(id);
        out.push(b'\n');
    }
    out.extend_from_slice(b"data: ");
    write_json_object(out, event);
    out.extend_from_slice(b"\n\n");
}

/// The event's elements as one JSON object, on one line.
pub fn json_object(event: &Event) -> String {
    let mut out = Vec::new();
    write_json_object(&mut out, event);
    // Made of `str` pieces only: always UTF-8.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

fn write_json_object(out: &mut Vec<u8>, event: &Event) {
    out.push(b'{');
    for (i, (name, value)) in event.elements().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_json_string(out, name);
        out.push(b':');
        write_json_string(out, value);
    }
    out.push(b'}');
}

/// `bytes` (as UTF-8, invalid sequences replaced) as a JSON string.
fn write_json_string(out: &mut Vec<u8>, bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    let b = text.as_bytes();
    out.reserve(b.len() + 2);
    out.push(b'"');
    // Runs of characters that need no escape are copied whole.
    let mut run = 0;
    let mut i = 0;
    while i < b.len() {
        let (escape, len): (std::borrow::Cow<'static, str>, usize) = match b[i] {
            b'"' => ("\\\"".into(), 1),
            b'\\' => ("\\\\".into(), 1),
            b'\n' => ("\\n".into(), 1),
            b'\r' => ("\\r".into(), 1),
            b'\t' => ("\\t".into(), 1),
            c @ (0..=0x1f | 0x7f) => (format!("\\u{:04x}", c).into(), 1),
            // U+2028 and U+2029 (line and paragraph separators).
            0xe2 if b.get(i + 1) == Some(&0x80) && matches!(b.get(i + 2), Some(0xa8 | 0xa9)) => {
                (if b[i + 2] == 0xa8 { "\\u2028" } else { "\\u2029" }.into(), 3)
            }
            _ => {
                i += 1;
                continue;
            }
        };
        out.extend_from_slice(&b[run..i]);
        out.extend_from_slice(escape.as_bytes());
        i += len;
        run = i;
    }
    out.extend_from_slice(&b[run..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The escaping as first written, a character at a time: the oracle.
    fn one_char_at_a_time(bytes: &[u8]) -> String {
        let mut out = String::from("\"");
        for c in String::from_utf8_lossy(bytes).chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                c if c.is_control() && (c as u32) < 0x80 || c == '\u{2028}' || c == '\u{2029}' => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push(c),
            }
        }
        out.push('"');
        out
    }

    #[test]
    fn strings_are_escaped_as_a_character_at_a_time() {
        let mut cases: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b, b'a', b]).collect();
        cases.extend(
            [
                "plain text",
                "",
                "quote \" back \\ nl \n cr \r tab \t bell \u{7} del \u{7f} nel \u{85}",
                "sep \u{2028} para \u{2029} near \u{2027}\u{202a} κόσμε 😀",
                "\u{2028}",
                "end\u{2029}",
            ]
            .iter()
            .map(|s| s.as_bytes().to_vec()),
        );
        cases.push(b"bad \xe2\x80 utf8 \xff\xfe and \xe2\x80\xa8 ok".to_vec());
        cases.push(b"\xe2\x80".to_vec());
        for case in cases {
            let mut out = Vec::new();
            write_json_string(&mut out, &case);
            assert_eq!(String::from_utf8(out).unwrap(), one_char_at_a_time(&case), "{case:?}");
        }
    }
}
