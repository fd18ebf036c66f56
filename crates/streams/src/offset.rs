//! Stream offsets: the checkpoint of the last record holding data, as 16
//! lowercase hex digits, then `_` and 16 more for a position inside that
//! record (always 0 in the offsets we mint: reserved for sub-record
//! positions). Comparing two offsets as strings compares the checkpoints
//! (FORMAT.md, "Streams"). `0000000000000000_0000000000000000` is the
//! beginning, as in the reference implementation.

use super::{StreamError, StreamErrorKind};

/// Where a read starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// `-1` (or no offset): the beginning of the stream.
    Beginning,
    /// `now`: the current tail, skipping what is there.
    Now,
    /// After the data up to this checkpoint.
    At(u64),
}

/// The offset token of checkpoint `seq`: never `-1` or `now`, sortable
/// as a string.
///
/// ```
/// assert_eq!(kn_streams::offset(42), "000000000000002a_0000000000000000");
/// assert!(kn_streams::offset(9) < kn_streams::offset(10));
/// ```
pub fn offset(seq: u64) -> String {
    format!("{seq:016x}_0000000000000000")
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

/// Parses one of our offsets to its checkpoint.
pub fn parse_offset(token: &str) -> Result<u64, StreamError> {
    let bad = || StreamError::new(StreamErrorKind::BadRequest, format!("malformed offset '{}'", token.escape_debug()));
    let hex = |t: &str| t.len() == 16 && t.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    let (seq, within) = token.split_once('_').ok_or_else(bad)?;
    if !hex(seq) || within != "0000000000000000" {
        return Err(bad());
    }
    u64::from_str_radix(seq, 16).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_sort_like_checkpoints() {
        let mut seqs = [0u64, 1, 9, 10, 255, 256, u64::MAX];
        let mut tokens: Vec<String> = seqs.iter().map(|&s| offset(s)).collect();
        tokens.sort();
        seqs.sort();
        assert_eq!(tokens, seqs.iter().map(|&s| offset(s)).collect::<Vec<_>>());
    }

    #[test]
    fn sentinels_and_malformed_offsets() {
        assert_eq!(parse_start("-1").unwrap(), Start::Beginning);
        assert_eq!(parse_start("now").unwrap(), Start::Now);
        assert_eq!(parse_start(&offset(7)).unwrap(), Start::At(7));
        assert_eq!(parse_start("0000000000000000_0000000000000000").unwrap(), Start::At(0));
        for bad in ["", "abc", "-2", "000000000000000G_0000000000000000", "000000000000002A_0000000000000000", "0000000000000001_x", "0000000000000001", "0000000000000001_0000000000000001"] {
            assert_eq!(parse_start(bad).unwrap_err().kind(), StreamErrorKind::BadRequest, "{bad}");
        }
    }
}
