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
    out.extend_from_slice(json_object(event).as_bytes());
    out.extend_from_slice(b"\n\n");
}

/// The event's elements as one JSON object, on one line.
pub fn json_object(event: &Event) -> String {
    let mut out = String::from("{");
    for (i, (name, value)) in event.elements().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_json_string(&mut out, name);
        out.push(':');
        write_json_string(&mut out, value);
    }
    out.push('}');
    out
}

fn write_json_string(out: &mut String, bytes: &[u8]) {
    out.push('"');
    for c in String::from_utf8_lossy(bytes).chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() && (c as u32) < 0x80 || c == '\u{2028}' || c == '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
}
