//! Stream offsets: the checkpoint of the last record holding data, as 16
//! lowercase hex digits, so that comparing two offsets as strings compares
//! the checkpoints (FORMAT.md, "Streams").

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

/// The offset token of checkpoint `seq`: 16 lowercase hex digits, never
/// `-1` or `now`, sortable as a string.
///
/// ```
/// assert_eq!(kn_journal::streams::offset(42), "000000000000002a");
/// assert!(kn_journal::streams::offset(9) < kn_journal::streams::offset(10));
/// ```
pub fn offset(seq: u64) -> String {
    format!("{seq:016x}")
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

/// Parses one of our offsets (16 hex digits).
pub fn parse_offset(token: &str) -> Result<u64, StreamError> {
    let bad = || StreamError::new(StreamErrorKind::BadRequest, format!("malformed offset '{}'", token.escape_debug()));
    if token.len() != 16 || !token.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(bad());
    }
    u64::from_str_radix(token, 16).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_sort_like_checkpoints() {
        let mut seqs = vec![0u64, 1, 9, 10, 255, 256, u64::MAX];
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
        for bad in ["", "abc", "-2", "000000000000000G", "000000000000002A", "0000000000000001_x", "00000000000000001"] {
            assert_eq!(parse_start(bad).unwrap_err().kind(), StreamErrorKind::BadRequest, "{bad}");
        }
    }
}
