//! Stream offsets: the checkpoint of the last record holding data, as 16
//! lowercase hex digits, then `_` and the **epoch** of that record's
//! place in 16 more (FORMAT.md, "Streams"; docs/DURABLE-STREAMS.md).
//!
//! The epoch tells one incarnation of a stream path from another: every
//! `PUT` that creates a stream draws a random, nonzero one, so a stream
//! deleted (or expired) and created again never mints an offset that an
//! earlier incarnation minted, and an offset of the earlier one is refused
//! (`410 Gone`, `Epochs::accept`) instead of silently resuming in the
//! middle of the new stream (issue 37, item 5). A fork's records up to
//! its fork point keep their source's offsets, epoch and all (the protocol
//! wants offsets shared there); its own records have its own epoch.
//! Streams created before epochs existed have epoch 0 everywhere: their
//! offsets are what they always were (`…_0000000000000000`).
//!
//! Within one stream the epoch changes only where the checkpoint grows (a
//! fork point), so comparing two of its offsets as strings compares the
//! checkpoints. `0000000000000000_0000000000000000` is the beginning of
//! every stream, as in the reference implementation: reading from it
//! skips nothing whatever the incarnation.

use super::{StreamError, StreamErrorKind};

/// A position in a stream: after the record of checkpoint [`Offset::seq`]
/// of the incarnation [`Offset::epoch`]. Made by the stream
/// ([`crate::Info::offset_at`]) or parsed ([`parse_offset`]); its token
/// is its `Display`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Offset {
    // Field order matters: the derived order is the checkpoint's first.
    seq: u64,
    epoch: u64,
}

impl Offset {
    /// The beginning of every stream: `0000000000000000_0000000000000000`.
    pub const BEGINNING: Offset = Offset { seq: 0, epoch: 0 };

    /// The offset after checkpoint `seq` in `epoch`; the beginning is one
    /// and the same for every epoch.
    pub(crate) fn new(seq: u64, epoch: u64) -> Offset {
        if seq == 0 {
            return Offset::BEGINNING;
        }
        Offset { seq, epoch }
    }

    /// The checkpoint: the last record holding data before this position.
    pub fn seq(self) -> u64 {
        self.seq
    }

    /// The incarnation the offset was minted by (0: a stream created
    /// before epochs, or the beginning).
    pub fn epoch(self) -> u64 {
        self.epoch
    }
}

impl std::fmt::Display for Offset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}_{:016x}", self.seq, self.epoch)
    }
}

/// Where a read starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// `-1` (or no offset): the beginning of the stream.
    Beginning,
    /// `now`: the current tail, skipping what is there.
    Now,
    /// After the data up to this offset (one of the stream's, else the
    /// read is refused).
    At(Offset),
}

/// The token of `at` (its `Display`): never `-1` or `now`.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let streams = kn_streams::Streams::new(std::sync::Arc::new(kn_journal::Store::open(dir.path()).unwrap()));
/// let info = streams.create("s", &kn_streams::Create::new("text/plain")).unwrap().info;
/// assert_eq!(kn_streams::offset(kn_streams::Offset::BEGINNING), "0000000000000000_0000000000000000");
/// assert!(kn_streams::offset(info.offset_at(9)) < kn_streams::offset(info.offset_at(10)));
/// assert!(kn_streams::offset(info.offset_at(42)).starts_with("000000000000002a_"));
/// ```
pub fn offset(at: Offset) -> String {
    at.to_string()
}

/// Parses an offset token as the protocol allows it in a query or a
/// header: `-1`, `now`, or one of ours. Anything else is a `400`.
pub fn parse_start(token: &str) -> Result<Start, StreamError> {
    match token {
        "-1" => Ok(Start::Beginning),
        "now" => Ok(Start::Now),
        t => parse_offset(t).map(Start::At),
    }
}

/// Parses one of our offset tokens (whether it is of a given stream is
/// [`crate::Info::accept`]'s question).
pub fn parse_offset(token: &str) -> Result<Offset, StreamError> {
    let bad = || StreamError::new(StreamErrorKind::BadRequest, format!("malformed offset '{}'", token.escape_debug()));
    let hex = |t: &str| t.len() == 16 && t.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    let (seq, epoch) = token.split_once('_').ok_or_else(bad)?;
    if !hex(seq) || !hex(epoch) {
        return Err(bad());
    }
    let seq = u64::from_str_radix(seq, 16).map_err(|_| bad())?;
    let epoch = u64::from_str_radix(epoch, 16).map_err(|_| bad())?;
    Ok(Offset { seq, epoch })
}

/// The epochs of one incarnation of a stream: its own, and for a fork
/// those of the records it inherited (at most one entry per fork level,
/// `StreamsConfig::max_fork_depth`). Written in its `create` record
/// (`ds_offset_epoch`, `ds_fork_epochs`), kept in its state.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Epochs {
    /// The epoch of the records this incarnation wrote itself.
    own: u64,
    /// `(up to seq, epoch)`, ascending: the records at or below each
    /// bound (and above the previous one) are a source's.
    inherited: Vec<(u64, u64)>,
}

impl Epochs {
    pub(crate) fn new(own: u64, inherited: Vec<(u64, u64)>) -> Epochs {
        Epochs { own, inherited }
    }

    /// A new incarnation's epoch: random (from the 96 random bits of a
    /// fresh id), never 0, which streams made before epochs have.
    pub(crate) fn draw() -> u64 {
        xxhash_rust::xxh3::xxh3_64(kn_journal::fresh_id().as_bytes()).max(1)
    }

    /// The epoch of the offset after checkpoint `seq`.
    fn epoch_at(&self, seq: u64) -> u64 {
        if seq == 0 {
            return 0;
        }
        self.inherited.iter().find(|(upto, _)| seq <= *upto).map_or(self.own, |(_, epoch)| *epoch)
    }

    /// The offset after checkpoint `seq` in this incarnation.
    pub(crate) fn offset(&self, seq: u64) -> Offset {
        Offset::new(seq, self.epoch_at(seq))
    }

    /// `at` if this incarnation minted it (or could: the checkpoint's
    /// epoch is `at`'s); else `Gone` (`410`): an offset of an earlier
    /// stream of the same path, whose data is no longer there. Whether it
    /// is past the tail is the caller's question.
    pub(crate) fn accept(&self, at: Offset, path: &str) -> Result<Offset, StreamError> {
        if at.epoch == self.epoch_at(at.seq) {
            return Ok(at);
        }
        Err(StreamError::new(
            StreamErrorKind::Gone,
            format!("offset {at} is not of stream '{path}' as it is now: the stream it came from was deleted or expired, and this one created since (read again from -1)"),
        ))
    }

    /// The inherited epochs of a fork of this incarnation at `at`: the
    /// records up to `at` keep the offsets they have here.
    pub(crate) fn for_fork(&self, at: u64) -> Vec<(u64, u64)> {
        let mut table: Vec<(u64, u64)> = self.inherited.iter().copied().filter(|(upto, _)| *upto < at).collect();
        if at > 0 {
            table.push((at, self.epoch_at(at)));
        }
        table
    }

    /// The inherited table as `ds_fork_epochs` holds it:
    /// `upto:epoch,upto:epoch` in decimal.
    pub(crate) fn format_table(table: &[(u64, u64)]) -> String {
        table.iter().map(|(upto, epoch)| format!("{upto}:{epoch}")).collect::<Vec<_>>().join(",")
    }

    /// Reads [`Epochs::format_table`]'s text; `None` if malformed.
    pub(crate) fn parse_table(text: &str) -> Option<Vec<(u64, u64)>> {
        if text.is_empty() {
            return Some(Vec::new());
        }
        text.split(',')
            .map(|pair| {
                let (upto, epoch) = pair.split_once(':')?;
                Some((upto.parse().ok()?, epoch.parse().ok()?))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_sort_like_checkpoints_within_one_epoch() {
        let epochs = Epochs::new(0xfeed, Vec::new());
        let mut seqs = [0u64, 1, 9, 10, 255, 256, u64::MAX];
        let mut tokens: Vec<String> = seqs.iter().map(|&s| offset(epochs.offset(s))).collect();
        tokens.sort();
        seqs.sort();
        assert_eq!(tokens, seqs.iter().map(|&s| offset(epochs.offset(s))).collect::<Vec<_>>());
    }

    #[test]
    fn sentinels_and_malformed_offsets() {
        assert_eq!(parse_start("-1").unwrap(), Start::Beginning);
        assert_eq!(parse_start("now").unwrap(), Start::Now);
        let at = Offset::new(7, 0xabc);
        assert_eq!(parse_start(&offset(at)).unwrap(), Start::At(at));
        assert_eq!(parse_start("0000000000000000_0000000000000000").unwrap(), Start::At(Offset::BEGINNING));
        for bad in ["", "abc", "-2", "000000000000000G_0000000000000000", "000000000000002A_0000000000000000", "0000000000000001_x", "0000000000000001", "0000000000000001_000000000000000A", "0000000000000001_00000000000000001"] {
            assert_eq!(parse_start(bad).unwrap_err().kind(), StreamErrorKind::BadRequest, "{bad}");
        }
    }

    #[test]
    fn an_offset_of_another_epoch_is_gone_and_the_beginning_is_everyone_s() {
        let old = Epochs::new(0, Vec::new());
        let new = Epochs::new(5, Vec::new());
        assert_eq!(offset(old.offset(6)), "0000000000000006_0000000000000000", "streams made before epochs keep their offsets");
        assert_eq!(new.accept(old.offset(6), "s").unwrap_err().kind(), StreamErrorKind::Gone);
        assert_eq!(old.accept(new.offset(6), "s").unwrap_err().kind(), StreamErrorKind::Gone);
        assert_eq!(new.accept(new.offset(6), "s").unwrap(), new.offset(6));
        assert_eq!(new.offset(0), Offset::BEGINNING);
        assert_eq!(new.accept(Offset::BEGINNING, "s").unwrap(), Offset::BEGINNING);
        assert!(new.accept(Offset { seq: 0, epoch: 9 }, "s").is_err(), "the beginning has one token");
    }

    #[test]
    fn a_fork_keeps_its_source_s_offsets_up_to_the_fork_point() {
        let source = Epochs::new(1, Vec::new());
        let fork = Epochs::new(2, source.for_fork(5));
        for seq in 1..=5 {
            assert_eq!(fork.offset(seq), source.offset(seq));
        }
        assert_ne!(fork.offset(6), source.offset(6));
        assert!(fork.accept(source.offset(6), "f").is_err(), "past the fork point the source's data is not the fork's");
        // A fork of the fork, below and above the first fork point.
        let below = Epochs::new(3, fork.for_fork(3));
        assert_eq!(below.offset(3), source.offset(3));
        assert_eq!(below.offset(4).epoch(), 3);
        let above = Epochs::new(4, fork.for_fork(8));
        assert_eq!(above.offset(5), source.offset(5));
        assert_eq!(above.offset(8), fork.offset(8));
        assert_eq!(above.offset(9).epoch(), 4);
        assert_eq!(Epochs::parse_table(&Epochs::format_table(&above.inherited)).unwrap(), above.inherited);
        assert_eq!(Epochs::parse_table("1:x"), None);
    }

    /// A stream written before epochs (its `create` record has no
    /// `ds_offset_epoch`) keeps its offsets: `…_0000000000000000`, read
    /// as they always were.
    #[test]
    fn a_stream_written_before_epochs_keeps_its_offsets() {
        use kn_journal::{Event, Store};
        let dir = tempfile::tempdir().unwrap();
        let streams = crate::Streams::new(std::sync::Arc::new(Store::open(dir.path()).unwrap()));
        let stream = streams.stream_dir("old");
        std::fs::create_dir_all(&stream).unwrap();
        {
            let mut w = crate::Writer::open(&stream, &streams.writing, false).unwrap();
            let gauge = crate::SpaceGauge::default();
            let mut create = Event::new();
            create.set(crate::state::name::OP, crate::state::op::CREATE);
            create.set(crate::state::name::PATH, "old");
            create.set(crate::state::name::CONTENT_TYPE, "text/plain");
            create.set(crate::state::name::CREATED, "1-old");
            w.append(&create, 1, &gauge).unwrap();
            for data in ["a", "b", "c"] {
                let mut e = Event::new();
                e.set(crate::state::name::OP, crate::state::op::APPEND);
                e.set(kn_journal::KN_PAYLOAD, data);
                w.append(&e, 1, &gauge).unwrap();
            }
        }
        let info = streams.head("old").unwrap();
        assert_eq!(info.next_offset(), "0000000000000004_0000000000000000");
        let at = parse_offset("0000000000000002_0000000000000000").unwrap();
        assert_eq!(streams.read("old", Start::At(at)).unwrap().body(), b"bc");
        // Appended to now, it stays in epoch 0.
        let appended = streams.append("old", &crate::Append::data(Some("text/plain"), b"d")).unwrap();
        assert_eq!(appended.info.next_offset(), "0000000000000005_0000000000000000");
        assert_eq!(streams.read("old", Start::At(info.tail)).unwrap().body(), b"d");
    }
}
