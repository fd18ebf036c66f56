//! The record framing: `length | CRC-32C | MessagePack body`.
//!
//! See FORMAT.md for the byte layout and why a reader can never mistake a
//! torn tail for an event.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

use crate::event::Event;

/// Bytes of the frame header: body length (u32 LE) and CRC-32C (u32 LE).
pub const FRAME_HEADER: usize = 8;

/// No frame body is ever larger than this, whatever the configuration: a
/// length above it can only be garbage.
pub const MAX_FRAME_BODY: usize = 256 << 20;

/// One stored event with the store's metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// The sequence number within its topic; the checkpoint clients see.
    pub seq: u64,
    /// When the store wrote it, in whole seconds since the epoch (enough
    /// for `do_max_age`; order comes from `seq`).
    pub stored_secs: u64,
    /// The event as stored (without `kn_route_checkpoint`, which is `seq`).
    /// When `blob` is set, the frame holds the event without its
    /// `kn_payload`, which is the blob's content (readers put it back).
    pub event: Event,
    /// The blob holding this record's `kn_payload`, if it is not inline
    /// (FORMAT.md, "Blobs").
    pub blob: Option<BlobRef>,
}

/// A reference to a payload stored once, in a blob file: the payload's
/// `xxh3_128` and its length. Stored in a record as the 24-byte `b` field
/// (hash u128 LE, then length u64 LE).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlobRef {
    /// `xxh3_128` of the payload.
    pub hash: u128,
    /// The payload's length in bytes.
    pub len: u64,
}

impl BlobRef {
    /// The reference of `payload`.
    pub fn of(payload: &[u8]) -> BlobRef {
        BlobRef { hash: xxhash_rust::xxh3::xxh3_128(payload), len: payload.len() as u64 }
    }

    /// The hash as 32 lowercase hex digits: the blob's file name.
    pub fn hex(&self) -> String {
        format!("{:032x}", self.hash)
    }

    fn to_bytes(self) -> [u8; 24] {
        let mut b = [0u8; 24];
        b[..16].copy_from_slice(&self.hash.to_le_bytes());
        b[16..].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    fn from_bytes(b: &[u8]) -> Option<BlobRef> {
        let b: &[u8; 24] = b.try_into().ok()?;
        let hash = u128::from_le_bytes(b[..16].try_into().ok()?);
        let len = u64::from_le_bytes(b[16..].try_into().ok()?);
        Some(BlobRef { hash, len })
    }
}

/// The MessagePack body. Field names are short but named, so that a newer
/// writer may add fields and an older reader ignores them.
#[derive(Serialize, Deserialize)]
struct Body {
    #[serde(rename = "s")]
    seq: u64,
    #[serde(rename = "t")]
    stored_secs: u64,
    #[serde(rename = "e")]
    elements: BTreeMap<ByteBuf, ByteBuf>,
    #[serde(rename = "b", default, skip_serializing_if = "Option::is_none")]
    blob: Option<ByteBuf>,
}

/// What a decoder found at a position of a segment.
#[derive(Debug, PartialEq)]
pub enum Decoded {
    /// A whole, valid record that occupies `len` bytes.
    Record(Record, usize),
    /// Fewer bytes than a whole frame: not written yet (or torn).
    Incomplete,
    /// A frame whose checksum or body is wrong.
    Corrupt(String),
}

/// Encodes a record as one frame, ready for a single `write`.
pub fn encode(record: &Record) -> Vec<u8> {
    encode_event(record.seq, record.stored_secs, &record.event, record.blob.as_ref())
}

/// Encodes the frame of `event` stored as `seq` at `stored_secs`, writing
/// the MessagePack body directly with `rmp` (the bytes `rmp_serde` writes
/// for `Body`: keys `s`, `t`, `e`, shortest integers, `bin` names and
/// values) without copying the event first. With `blob`, the frame holds
/// the reference (key `b`, after `e`) instead of `kn_payload`.
pub fn encode_event(seq: u64, stored_secs: u64, event: &Event, blob: Option<&BlobRef>) -> Vec<u8> {
    use rmp::encode::{write_bin, write_map_len, write_str, write_uint};
    let inline = |name: &[u8]| blob.is_none() || name != crate::event::KN_PAYLOAD;
    let size = if blob.is_some() { event.byte_size() - event.get(crate::event::KN_PAYLOAD).map_or(0, <[u8]>::len) } else { event.byte_size() };
    let mut frame = Vec::with_capacity(FRAME_HEADER + 64 + size + 10 * event.len());
    frame.extend_from_slice(&[0u8; FRAME_HEADER]);
    // Writing into a Vec cannot fail.
    let _ = write_map_len(&mut frame, if blob.is_some() { 4 } else { 3 });
    let _ = write_str(&mut frame, "s");
    let _ = write_uint(&mut frame, seq);
    let _ = write_str(&mut frame, "t");
    let _ = write_uint(&mut frame, stored_secs);
    let _ = write_str(&mut frame, "e");
    let _ = write_map_len(&mut frame, event.elements().filter(|(n, _)| inline(n)).count() as u32);
    for (name, value) in event.elements().filter(|(n, _)| inline(n)) {
        let _ = write_bin(&mut frame, name);
        let _ = write_bin(&mut frame, value);
    }
    if let Some(blob) = blob {
        let _ = write_str(&mut frame, "b");
        let _ = write_bin(&mut frame, &blob.to_bytes());
    }
    let len = ((frame.len() - FRAME_HEADER) as u32).to_le_bytes();
    let crc = checksum(&len, &frame[FRAME_HEADER..]);
    frame[..4].copy_from_slice(&len);
    frame[4..FRAME_HEADER].copy_from_slice(&crc.to_le_bytes());
    frame
}

fn checksum(len: &[u8; 4], body: &[u8]) -> u32 {
    crc32c(&[len, body])
}

/// Inputs below this many bytes are checksummed by table, at or above it
/// with the CPU's CRC instruction.
pub(crate) const CRC_TABLE_BELOW: usize = 4096;

/// CRC-32C (Castagnoli) of `parts` one after the other, as one input.
///
/// Small inputs (the frames of a notify, a topic's head) go through a
/// slice-by-16 table: a few hundred nanoseconds, and no CPU-feature probe.
/// Large ones go through the `crc32c` crate, which uses SSE 4.2 once it has
/// asked the CPU whether it may: a dozen `CPUID` instructions, once per
/// process, that trap to the hypervisor on a virtual machine (about 40 µs
/// there, a twentieth of a CGI request). Both give the same value.
pub fn crc32c(parts: &[&[u8]]) -> u32 {
    static TABLE: crc::Crc<u32, crc::Table<16>> = crc::Crc::<u32, crc::Table<16>>::new(&crc::CRC_32_ISCSI);
    if parts.iter().map(|p| p.len()).sum::<usize>() < CRC_TABLE_BELOW {
        let mut digest = TABLE.digest();
        for part in parts {
            digest.update(part);
        }
        digest.finalize()
    } else {
        parts.iter().fold(0, |crc, part| crc32c::crc32c_append(crc, part))
    }
}

/// The seq and length of the frame at the start of `bytes`, read without
/// decoding its event: for a reader that skips the records up to a seq.
/// `None` when the frame is not whole with a valid CRC, or its body does
/// not start as every writer of this format writes it (a map whose first
/// key is `s`); [`decode`] then says what it is. Never panics.
pub(crate) fn peek_seq(bytes: &[u8]) -> Option<(u64, usize)> {
    let body = checked_body(bytes).ok()?;
    let fields = match *body.first()? {
        0x80..=0x8f => &body[1..],
        0xde => body.get(3..)?,
        0xdf => body.get(5..)?,
        _ => return None,
    };
    let value = fields.strip_prefix(&[0xa1, b's'])?;
    let seq = match *value.first()? {
        n @ 0x00..=0x7f => u64::from(n),
        0xcc => u64::from(*value.get(1)?),
        0xcd => u64::from(u16::from_be_bytes(value.get(1..3)?.try_into().ok()?)),
        0xce => u64::from(u32::from_be_bytes(value.get(1..5)?.try_into().ok()?)),
        0xcf => u64::from_be_bytes(value.get(1..9)?.try_into().ok()?),
        _ => return None,
    };
    Some((seq, FRAME_HEADER + body.len()))
}

/// The body of the frame at the start of `bytes`, once its length is in
/// bounds and its CRC matches; else what [`decode`] says of it.
fn checked_body(bytes: &[u8]) -> Result<&[u8], Decoded> {
    if bytes.len() < FRAME_HEADER {
        return Err(Decoded::Incomplete);
    }
    let len_bytes: [u8; 4] = [bytes[0], bytes[1], bytes[2], bytes[3]];
    let len = u32::from_le_bytes(len_bytes) as usize;
    let crc = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    if len > MAX_FRAME_BODY {
        return Err(Decoded::Corrupt(format!("frame length {len} exceeds the maximum")));
    }
    let Some(body) = bytes.get(FRAME_HEADER..FRAME_HEADER + len) else {
        return Err(Decoded::Incomplete);
    };
    if checksum(&len_bytes, body) != crc {
        return Err(Decoded::Corrupt("CRC-32C mismatch".to_string()));
    }
    Ok(body)
}

/// Decodes the frame at the start of `bytes`. Never panics, whatever the
/// input.
pub fn decode(bytes: &[u8]) -> Decoded {
    let body = match checked_body(bytes) {
        Ok(body) => body,
        Err(bad) => return bad,
    };
    let len = body.len();
    match rmp_serde::from_slice::<Body>(body) {
        Ok(b) => {
            let blob = match b.blob.as_ref().map(|v| BlobRef::from_bytes(v)) {
                None => None,
                Some(Some(blob)) => Some(blob),
                Some(None) => return Decoded::Corrupt("blob reference is not 24 bytes".to_string()),
            };
            let elements = b.elements.into_iter().map(|(n, v)| (n.into_vec(), v.into_vec())).collect();
            Decoded::Record(
                Record { seq: b.seq, stored_secs: b.stored_secs, event: Event::from_map(elements), blob },
                FRAME_HEADER + len,
            )
        }
        Err(e) => Decoded::Corrupt(format!("undecodable body: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Record {
        let mut e = Event::new();
        e.set("kn_id", "e1").set("kn_payload", b"\0\xff\xfe raw".to_vec()).set(b"\x01n\xc3".to_vec(), "v");
        Record { seq: 42, stored_secs: 1_796_018_670, event: e, blob: None }
    }

    #[test]
    fn a_peeked_seq_is_the_decoded_one_and_a_bad_frame_has_none() {
        let seqs = [0, 1, 127, 128, 255, 256, 65_535, 65_536, u64::from(u32::MAX), u64::from(u32::MAX) + 1, u64::MAX];
        let blob = BlobRef { hash: 0x0707_0707_0707_0707_0707_0707_0707_0707, len: 9 };
        for seq in seqs {
            for blob in [None, Some(&blob)] {
                let frame = encode_event(seq, 1_796_018_670, &sample().event, blob);
                let Decoded::Record(r, len) = decode(&frame) else { panic!("{seq}") };
                assert_eq!(peek_seq(&frame), Some((r.seq, len)), "{seq}");
                // As `rmp_serde` writes the body (older writers).
                let body = rmp_serde::to_vec_named(&Body { seq, stored_secs: 1, elements: BTreeMap::new(), blob: None }).unwrap();
                let mut old = (body.len() as u32).to_le_bytes().to_vec();
                old.extend_from_slice(&checksum(&(body.len() as u32).to_le_bytes(), &body).to_le_bytes());
                old.extend_from_slice(&body);
                assert_eq!(peek_seq(&old), Some((seq, old.len())), "{seq}, rmp_serde");
                for cut in 0..frame.len() {
                    assert_eq!(peek_seq(&frame[..cut]), None, "{seq} cut at {cut}");
                }
                for i in 0..frame.len() {
                    let mut bad = frame.clone();
                    bad[i] ^= 0x10;
                    assert_eq!(peek_seq(&bad), None, "{seq}: byte {i} flipped");
                }
            }
        }
    }

    #[test]
    fn crc32c_is_castagnoli_on_both_sides_of_the_table_limit() {
        // The check value of CRC-32C (RFC 3720 B.4).
        assert_eq!(crc32c(&[b"123456789"]), 0xe306_9283);
        assert_eq!(crc32c(&[b"1234", b"", b"56789"]), 0xe306_9283);
        let data: Vec<u8> = (0..3 * CRC_TABLE_BELOW as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for len in [0, 1, 7, 8, 100, CRC_TABLE_BELOW - 1, CRC_TABLE_BELOW, CRC_TABLE_BELOW + 1, data.len()] {
            let whole = &data[..len];
            let reference = crc32c::crc32c(whole);
            assert_eq!(crc32c(&[whole]), reference, "{len} bytes");
            let (a, b) = whole.split_at(len / 3);
            assert_eq!(crc32c(&[a, b]), reference, "{len} bytes in two parts");
        }
    }

    /// The frame as `rmp_serde` writes it: the reference for `encode`.
    fn encode_with_serde(record: &Record) -> Vec<u8> {
        let body = Body {
            seq: record.seq,
            stored_secs: record.stored_secs,
            elements: record
                .event
                .elements()
                .filter(|(n, _)| record.blob.is_none() || *n != crate::event::KN_PAYLOAD)
                .map(|(n, v)| (ByteBuf::from(n.to_vec()), ByteBuf::from(v.to_vec())))
                .collect(),
            blob: record.blob.map(|b| ByteBuf::from(b.to_bytes().to_vec())),
        };
        let body = rmp_serde::to_vec_named(&body).unwrap();
        let len = (body.len() as u32).to_le_bytes();
        let mut frame = len.to_vec();
        frame.extend_from_slice(&checksum(&len, &body).to_le_bytes());
        frame.extend_from_slice(&body);
        frame
    }

    #[test]
    fn encode_writes_the_bytes_rmp_serde_writes() {
        let sizes = [0usize, 1, 15, 16, 255, 256, 65_535, 65_536, 70_000];
        let ints = [0u64, 1, 127, 128, 255, 256, 65_535, 65_536, 1_796_018_670, u32::MAX as u64, u32::MAX as u64 + 1, u64::MAX];
        for (i, &n) in sizes.iter().enumerate() {
            let mut e = Event::new();
            e.set("kn_payload", vec![b'x'; n]).set(vec![b'n'; n.max(1)], "v");
            let r = Record { seq: ints[i % ints.len()], stored_secs: ints[(i + 5) % ints.len()], event: e, blob: None };
            assert_eq!(encode(&r), encode_with_serde(&r), "value of {n} bytes");
        }
        for count in [0usize, 1, 15, 16, 17, 300] {
            let mut e = Event::new();
            for k in 0..count {
                e.set(format!("name{k}"), format!("value{k}"));
            }
            for &seq in &ints {
                let r = Record { seq, stored_secs: seq / 3, event: e.clone(), blob: None };
                assert_eq!(encode(&r), encode_with_serde(&r), "{count} elements, seq {seq}");
            }
        }
        assert_eq!(encode(&sample()), encode_with_serde(&sample()));
        let mut with_blob = sample();
        with_blob.blob = Some(BlobRef::of(with_blob.event.payload()));
        assert_eq!(encode(&with_blob), encode_with_serde(&with_blob));
    }

    #[test]
    fn blob_reference_round_trip() {
        let mut r = sample();
        r.blob = Some(BlobRef::of(r.event.payload()));
        let frame = encode(&r);
        let Decoded::Record(back, len) = decode(&frame) else { panic!("undecodable") };
        assert_eq!(len, frame.len());
        assert_eq!(back.blob, r.blob);
        // The payload is not in the frame: readers put it back from the blob.
        assert!(!back.event.contains(crate::event::KN_PAYLOAD));
        r.event.remove(crate::event::KN_PAYLOAD);
        assert_eq!(back.event, r.event);
        for i in 0..frame.len() {
            let mut bad = frame.clone();
            bad[i] ^= 0x10;
            assert!(!matches!(decode(&bad), Decoded::Record(..)), "flip at byte {i}");
        }
    }

    #[test]
    fn round_trip() {
        let r = sample();
        let frame = encode(&r);
        assert_eq!(decode(&frame), Decoded::Record(r, frame.len()));
    }

    #[test]
    fn every_truncation_is_incomplete() {
        let frame = encode(&sample());
        for cut in 0..frame.len() {
            assert_eq!(decode(&frame[..cut]), Decoded::Incomplete, "cut at {cut}");
        }
    }

    #[test]
    fn every_flipped_bit_is_detected() {
        let frame = encode(&sample());
        for i in 0..frame.len() {
            for bit in 0..8 {
                let mut bad = frame.clone();
                bad[i] ^= 1 << bit;
                match decode(&bad) {
                    Decoded::Record(..) => panic!("flip at byte {i} bit {bit} went unnoticed"),
                    Decoded::Incomplete | Decoded::Corrupt(_) => {}
                }
            }
        }
    }

    #[test]
    fn unknown_fields_are_ignored() {
        #[derive(Serialize)]
        struct Newer {
            s: u64,
            t: u64,
            e: BTreeMap<ByteBuf, ByteBuf>,
            future: String,
        }
        let body = rmp_serde::to_vec_named(&Newer { s: 1, t: 2, e: BTreeMap::new(), future: "x".into() }).unwrap();
        let len = (body.len() as u32).to_le_bytes();
        let mut frame = len.to_vec();
        frame.extend_from_slice(&checksum(&len, &body).to_le_bytes());
        frame.extend_from_slice(&body);
        match decode(&frame) {
            Decoded::Record(r, _) => assert_eq!((r.seq, r.stored_secs), (1, 2)),
            other => panic!("{other:?}"),
        }
    }
}
