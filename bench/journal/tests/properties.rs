//! Properties that must hold for every input: topic names (PROTOCOL.md
//! section 2) and the record framing (FORMAT.md).

use std::path::{Component, Path};

use kn_journal::{Event, Topic};
use kn_journal::internal::{decode_record, encode_record, Decoded, Record};
use proptest::prelude::*;

/// One valid topic segment: allowed bytes, not starting or ending with `.`.
fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Za-z0-9_-]{1,12}",
        "[A-Za-z0-9_-][A-Za-z0-9._-]{0,10}[A-Za-z0-9_-]",
        "[a-zé-ω]{1,6}",
    ]
}

fn segments() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(segment(), 1..6)
}

fn allowed_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/') || b >= 0x80
}

/// Names built mostly from the interesting bytes, so that many are valid
/// and many are only just invalid.
fn topicish_bytes() -> impl Strategy<Value = Vec<u8>> {
    let byte = prop_oneof![
        4 => Just(b'/'),
        4 => Just(b'.'),
        6 => prop::sample::select(b"ab-_Z09".to_vec()),
        1 => any::<u8>(),
    ];
    prop::collection::vec(byte, 0..24)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn topic_canonical_form_is_idempotent_and_slash_insensitive(segs in segments()) {
        let plain = segs.join("/");
        let canonical = Topic::parse(&format!("/{plain}")).unwrap();
        prop_assert_eq!(canonical.as_str(), format!("/{plain}"));
        for variant in [format!("/{plain}/"), plain.clone(), format!("//{}//", segs.join("//")), format!("{plain}///")] {
            prop_assert_eq!(&Topic::parse(&variant).unwrap(), &canonical, "variant {}", variant);
        }
        let again = Topic::parse(canonical.as_str()).unwrap();
        prop_assert_eq!(&again, &canonical);
        prop_assert_eq!(Topic::parse_bytes(canonical.as_str().as_bytes()).unwrap(), canonical);
    }

    #[test]
    fn accepted_topics_obey_the_naming_rules(name in topicish_bytes()) {
        let Ok(topic) = Topic::parse_bytes(&name) else { return Ok(()) };
        let s = topic.as_str();
        prop_assert!(s.starts_with('/'));
        prop_assert!(s == "/" || !s.ends_with('/'));
        prop_assert!(!s.contains("//"));
        prop_assert!(s.bytes().all(allowed_byte), "disallowed byte in {:?}", s);
        for seg in topic.segments() {
            prop_assert!(!seg.is_empty());
            prop_assert!(!seg.starts_with('.') && !seg.ends_with('.'), "segment {:?} of {:?}", seg, s);
        }
        // Its directory stays under the root: every component is a plain name.
        let root = Path::new("/srv/kn_events");
        let mut dir = root.to_path_buf();
        for seg in topic.segments() {
            dir.push(seg);
        }
        prop_assert!(dir.starts_with(root));
        prop_assert!(dir.strip_prefix(root).unwrap().components().all(|c| matches!(c, Component::Normal(_))));
        prop_assert_eq!(Topic::parse(s).unwrap(), topic.clone());
    }

    #[test]
    fn arbitrary_bytes_never_panic_topic_parsing(name in prop::collection::vec(any::<u8>(), 0..64)) {
        if let Ok(topic) = Topic::parse_bytes(&name) {
            prop_assert!(topic.as_str().bytes().all(allowed_byte));
            prop_assert!(topic.segments().all(|s| !s.starts_with('.') && !s.ends_with('.')));
        }
    }

    #[test]
    fn record_round_trips_arbitrary_byte_elements(
        seq in any::<u64>(),
        stored_secs in any::<u64>(),
        pairs in prop::collection::vec((prop::collection::vec(any::<u8>(), 0..16), prop::collection::vec(any::<u8>(), 0..64)), 0..8),
    ) {
        let mut event = Event::from_pairs(pairs);
        event.set(b"n\0ul\xff".to_vec(), b"\0\xc3\x28\n=:".to_vec());
        let record = Record { seq, stored_secs, event, blob: None };
        let frame = encode_record(&record);
        prop_assert_eq!(decode_record(&frame), Decoded::Record(record.clone(), frame.len()));
        // Followed by more bytes, the record still decodes with its own length.
        let mut longer = frame.clone();
        longer.extend_from_slice(b"\x01\x02garbage");
        prop_assert_eq!(decode_record(&longer), Decoded::Record(record, frame.len()));
    }

    #[test]
    fn truncated_frames_never_decode_to_a_record(
        pairs in prop::collection::vec((prop::collection::vec(any::<u8>(), 0..8), prop::collection::vec(any::<u8>(), 0..40)), 0..6),
        cut in any::<prop::sample::Index>(),
    ) {
        let record = Record { seq: 7, stored_secs: 1, event: Event::from_pairs(pairs), blob: None };
        let frame = encode_record(&record);
        let cut = cut.index(frame.len());
        let decoded = decode_record(&frame[..cut]);
        prop_assert!(!matches!(decoded, Decoded::Record(..)), "cut at {} of {} decoded", cut, frame.len());
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        if let Decoded::Record(_, len) = decode_record(&bytes) {
            prop_assert!(len <= bytes.len());
        }
    }

    #[test]
    fn decoding_a_frame_with_a_plausible_header_never_panics(
        len in 0u32..300,
        crc in any::<u32>(),
        body in prop::collection::vec(any::<u8>(), 0..300),
    ) {
        let mut bytes = len.to_le_bytes().to_vec();
        bytes.extend_from_slice(&crc.to_le_bytes());
        bytes.extend_from_slice(&body);
        if let Decoded::Record(_, n) = decode_record(&bytes) {
            prop_assert!(n <= bytes.len());
        }
    }
}
