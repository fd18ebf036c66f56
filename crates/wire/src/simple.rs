//! The `simple` format: `<count>\n<encoded event>\n` frames, and a
//! tolerant decoder of them.
//!
//! An encoded event is one `name: value\n` line per element except
//! `kn_payload`, a blank line, then the raw payload. In names and values
//! the bytes 0x00-0x1F, 0x7F-0x9F, `:` and `=`, and a space at the very
//! start or end, are written `=XX` (uppercase hex); everything else,
//! including bytes 0xA0-0xFF, is raw.
//!
//! ```
//! use kn_wire::simple;
//! use kn_wire::Event;
//!
//! let event = Event::from_pairs([("kn_payload", "hi\n"), ("a:b", " x=1 ")]);
//! let frame = simple::frame(&event);
//! assert_eq!(frame, b"23\na=3Ab: =20x=3D1=20\n\nhi\n\n");
//! assert_eq!(simple::decode_frames(&frame).unwrap(), [event]);
//! ```

use std::io::{BufRead, Read};

use kn_journal::{Event, KN_PAYLOAD};

use crate::{Error, ErrorKind};

/// The frame of `event`: elements in name order, `kn_payload` last as
/// the body.
pub fn frame(event: &Event) -> Vec<u8> {
    let mut out = Vec::new();
    write_frame(&mut out, event);
    out
}

/// Appends the frame of `event` to `out`.
pub fn write_frame(out: &mut Vec<u8>, event: &Event) {
    let elements = event.elements().filter(|(name, _)| *name != KN_PAYLOAD);
    write_frame_from(out, elements, event.payload());
}

/// Appends the frame of an event given as `elements` (written in the
/// order given; any `kn_payload` among them is skipped) and `payload`.
pub fn write_frame_from<'a>(out: &mut Vec<u8>, elements: impl IntoIterator<Item = (&'a [u8], &'a [u8])>, payload: &[u8]) {
    let encoded = encode_from(elements, payload);
    out.extend_from_slice(encoded.len().to_string().as_bytes());
    out.push(b'\n');
    out.extend_from_slice(&encoded);
    out.push(b'\n');
}

/// The encoded event without count (also the legacy event file
/// format): `elements` in the order given, then the blank line and the
/// raw `payload`.
pub fn encode_from<'a>(elements: impl IntoIterator<Item = (&'a [u8], &'a [u8])>, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 64);
    for (name, value) in elements.into_iter().filter(|(name, _)| *name != KN_PAYLOAD) {
        escape(name, &mut out);
        out.extend_from_slice(b": ");
        escape(value, &mut out);
        out.push(b'\n');
    }
    out.push(b'\n');
    out.extend_from_slice(payload);
    out
}

/// Appends `bytes` escaped for a name or value.
pub fn escape(bytes: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let last = bytes.len().saturating_sub(1);
    for (i, &b) in bytes.iter().enumerate() {
        let edge_space = b == b' ' && (i == 0 || i == last);
        if edge_space || matches!(b, 0x00..=0x1f | 0x7f..=0x9f | b':' | b'=') {
            out.extend_from_slice(&[b'=', HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]]);
        } else {
            out.push(b);
        }
    }
}

/// Decodes `=XX` (either case) anywhere; a `=` not followed by two hex
/// digits stays as it is.
pub fn unescape(bytes: &[u8]) -> Vec<u8> {
    kn_journal::internal::decode_escapes(bytes, b'=')
}

/// Decodes one encoded event (no count): header lines up to the first
/// blank line, split at their first `:`, one space stripped after the
/// colon, `=XX` decoded; the rest is the payload, always present as
/// `kn_payload`. CR LF line ends are accepted in the header.
pub fn decode_event(encoded: &[u8]) -> Result<Event, Error> {
    let mut event = Event::new();
    let mut rest = encoded;
    loop {
        let Some(end) = rest.iter().position(|&b| b == b'\n') else {
            // No blank line: all header, empty payload.
            if !rest.is_empty() {
                decode_line(rest, &mut event)?;
            }
            rest = b"";
            break;
        };
        let line = &rest[..end];
        rest = &rest[end + 1..];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            break;
        }
        decode_line(line, &mut event)?;
    }
    event.set(KN_PAYLOAD, rest);
    Ok(event)
}

fn decode_line(line: &[u8], event: &mut Event) -> Result<(), Error> {
    let Some(colon) = line.iter().position(|&b| b == b':') else {
        return Err(Error::new(
            ErrorKind::BadFrame,
            format!("bad simple-format line '{}': no ':' after the element name", crate::show_bytes(line, 60)),
        ));
    };
    let value = &line[colon + 1..];
    let value = value.strip_prefix(b" ").unwrap_or(value);
    event.set(unescape(&line[..colon]), unescape(value));
    Ok(())
}

/// Decodes a whole stream of frames (a simple or flash response body):
/// whitespace and NUL bytes between frames are skipped.
pub fn decode_frames(input: &[u8]) -> Result<Vec<Event>, Error> {
    let mut reader = FrameReader::new(input);
    let mut events = Vec::new();
    while let Some(event) = reader.next_event()? {
        events.push(event);
    }
    Ok(events)
}

/// Reads frames one by one from a stream, e.g. an open tunnel.
///
/// ```
/// use kn_wire::simple::FrameReader;
///
/// let mut reader = FrameReader::new(&b"  4\n\nabc\n \x00 5\n\nxyz\n"[..]);
/// assert_eq!(reader.next_event().unwrap().unwrap().payload(), b"abc");
/// assert_eq!(reader.next_event().unwrap().unwrap().payload(), b"xyz\n");
/// assert!(reader.next_event().unwrap().is_none());
/// ```
#[derive(Debug)]
pub struct FrameReader<R> {
    input: R,
}

impl<R: BufRead> FrameReader<R> {
    /// Reads frames from `input`.
    pub fn new(input: R) -> FrameReader<R> {
        FrameReader { input }
    }

    /// The next event, or `None` at the end of the stream. Errors: a
    /// count that is not a number ([`ErrorKind::BadFrame`]), a stream
    /// that ends inside a frame (`BadFrame`), or a read error (`Io`).
    pub fn next_event(&mut self) -> Result<Option<Event>, Error> {
        if !self.skip_separators()? {
            return Ok(None);
        }
        let count = self.read_count()?;
        let mut encoded = Vec::new();
        Read::by_ref(&mut self.input).take(count).read_to_end(&mut encoded).map_err(|e| Error::io("reading a frame", e))?;
        if (encoded.len() as u64) < count {
            return Err(Error::new(
                ErrorKind::BadFrame,
                format!("truncated frame: the stream ended after {} of its {count} bytes", encoded.len()),
            ));
        }
        decode_event(&encoded).map(Some)
    }

    /// Skips whitespace and NULs; false at the end of the stream.
    fn skip_separators(&mut self) -> Result<bool, Error> {
        loop {
            let buf = self.input.fill_buf().map_err(|e| Error::io("reading frames", e))?;
            if buf.is_empty() {
                return Ok(false);
            }
            let skip = buf.iter().take_while(|&&b| b.is_ascii_whitespace() || b == 0).count();
            let found = skip < buf.len();
            self.input.consume(skip);
            if found {
                return Ok(true);
            }
        }
    }

    fn read_count(&mut self) -> Result<u64, Error> {
        let mut line = Vec::new();
        Read::by_ref(&mut self.input).take(24).read_until(b'\n', &mut line).map_err(|e| Error::io("reading a frame count", e))?;
        let digits = line.strip_suffix(b"\n").unwrap_or(&line);
        let digits = digits.strip_suffix(b"\r").unwrap_or(digits);
        let count = std::str::from_utf8(digits).ok().filter(|d| d.bytes().all(|b| b.is_ascii_digit()));
        count.and_then(|d| d.parse().ok()).ok_or_else(|| {
            Error::new(ErrorKind::BadFrame, format!("bad frame count '{}': expected a decimal byte count", crate::show_bytes(&line, 24)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescape_leaves_stray_equals() {
        assert_eq!(unescape(b"a=3Db=zz=4"), b"a=b=zz=4");
    }
}
