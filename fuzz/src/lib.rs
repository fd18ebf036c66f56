//! The bodies of knpubsub's fuzz targets, one function per target.
//!
//! Each takes arbitrary bytes and panics only when a parser breaks its
//! promise: it never panics itself on hostile input, and what it accepts
//! survives an encode → decode round trip unchanged. The same functions
//! run under libFuzzer (`cargo fuzz run <target>`, `fuzz_targets/`) and,
//! over the committed corpus `fuzz/corpus/<target>/`, in the regular test
//! suite (`tests/fuzz_replay.rs` includes this file as a module), so a
//! crash found once stays fixed without a fuzzer installed.

use std::path::{Component, Path};

use kn_journal::{decode_record, encode_record, Decoded, Event, Record, Topic, KN_PAYLOAD};
use kn_wire::form::{self, Params};
use kn_wire::simple;

/// The names of the targets, as in `fuzz/Cargo.toml` and `fuzz/corpus/`.
pub const TARGETS: [&str; 5] = ["form_parse", "simple_codec", "record_decode", "legacy_event", "topic_parse"];

/// Runs the target called `name` on `data`; false for an unknown name.
pub fn run(name: &str, data: &[u8]) -> bool {
    match name {
        "form_parse" => form_parse(data),
        "simple_codec" => simple_codec(data),
        "record_decode" => record_decode(data),
        "legacy_event" => legacy_event(data),
        "topic_parse" => topic_parse(data),
        _ => return false,
    }
    true
}

/// An arbitrary event made from `data`: chunks separated by 0xFF bytes
/// are element name, value, name, value, ...; an odd last chunk is the
/// payload.
pub fn arbitrary_event(data: &[u8]) -> Event {
    let mut event = Event::new();
    let mut chunks = data.split(|&b| b == 0xFF);
    loop {
        let Some(name) = chunks.next() else { break };
        match chunks.next() {
            Some(value) => {
                event.set(name, value);
            }
            None => {
                event.set(KN_PAYLOAD, name);
                break;
            }
        }
    }
    event
}

/// `kn_wire::form`: the urlencoded form parser and the `PATH_INFO` decoder.
pub fn form_parse(data: &[u8]) {
    if let Ok(params) = Params::parse(data) {
        let pairs = params.into_pairs();
        // Re-encoding what was parsed gives back the same pairs.
        let body = form::encode(pairs.iter().map(|(n, v)| (n, v)));
        let again = form::parse(body.as_bytes()).expect("an encoded form parses");
        assert_eq!(pairs, again, "form round trip");
    }
    if let Ok(path) = form::decode_path(data) {
        assert!(path.len() <= data.len(), "decoding never grows a path");
    }
}

/// `kn_wire::simple`: the frame decoder on arbitrary bytes, and the
/// encode → decode round trip of an arbitrary event.
pub fn simple_codec(data: &[u8]) {
    let _ = simple::decode_frames(data);
    if let Ok(event) = simple::decode_event(data) {
        assert_round_trip(&event);
    }
    assert_round_trip(&arbitrary_event(data));
}

fn assert_round_trip(event: &Event) {
    let frame = simple::frame(event);
    let decoded = simple::decode_frames(&frame).expect("a frame we wrote decodes");
    assert_eq!(decoded.len(), 1, "one frame, one event");
    let mut expected = event.clone();
    if !expected.contains(KN_PAYLOAD) {
        expected.set(KN_PAYLOAD, b"".to_vec());
    }
    assert_eq!(decoded[0], expected, "simple-format round trip");
}

/// `kn_journal::decode_record`: arbitrary bytes, then encode → decode.
pub fn record_decode(data: &[u8]) {
    match decode_record(data) {
        Decoded::Record(record, len) => {
            assert!(len <= data.len(), "a record never claims more bytes than it was given");
            let frame = encode_record(&record);
            assert_eq!(decode_record(&frame), Decoded::Record(record, frame.len()), "re-encoded record");
        }
        Decoded::Incomplete | Decoded::Corrupt(_) => {}
    }
    let mut head = [0u8; 16];
    let n = data.len().min(16);
    head[..n].copy_from_slice(&data[..n]);
    let record = Record {
        seq: u64::from_le_bytes(head[..8].try_into().unwrap_or_default()),
        stored_secs: u64::from_le_bytes(head[8..].try_into().unwrap_or_default()),
        event: arbitrary_event(&data[n..]),
        blob: None,
    };
    let frame = encode_record(&record);
    assert_eq!(decode_record(&frame), Decoded::Record(record, frame.len()), "record round trip");
}

/// `kn_sensors::legacy::parse_event`: a mod_pubsub event file; what it
/// reads, written back in the same format, reads the same.
pub fn legacy_event(data: &[u8]) {
    let Some(event) = kn_sensors::legacy::parse_event(data) else { return };
    let file = simple::encode_from(event.elements(), event.payload());
    let again = kn_sensors::legacy::parse_event(&file).expect("a file we wrote has its blank line");
    assert_eq!(again, event, "legacy event round trip");
}

/// `kn_journal::Topic::parse_bytes`: the canonical form is idempotent and
/// can never name a directory outside the store.
pub fn topic_parse(data: &[u8]) {
    let Ok(topic) = Topic::parse_bytes(data) else { return };
    let name = topic.as_str();
    assert!(name.starts_with('/'), "{name:?} starts with /");
    assert!(topic.is_root() || !name.ends_with('/'), "{name:?} has no trailing /");
    assert!(!name.contains("//"), "{name:?} has no empty segment");
    assert!(!name.bytes().any(|b| b == 0 || b == b'\\'), "{name:?} has no NUL or backslash");
    assert_eq!(Topic::parse(name).ok().as_ref(), Some(&topic), "canonical form is idempotent");
    for segment in topic.segments() {
        assert!(!segment.starts_with('.') && !segment.ends_with('.'), "segment {segment:?} of {name:?}");
        let mut parts = Path::new(segment).components();
        assert!(
            matches!((parts.next(), parts.next()), (Some(Component::Normal(_)), None)),
            "segment {segment:?} of {name:?} is one plain path component"
        );
    }
    let root = Path::new("/store");
    let dir = topic.segments().fold(root.to_path_buf(), |dir, s| dir.join(s));
    assert!(dir.starts_with(root), "{name:?} stays under the store");
    if let Some(parent) = topic.parent() {
        assert!(topic.is_within(&parent), "{name:?} lies within its parent");
    }
}
