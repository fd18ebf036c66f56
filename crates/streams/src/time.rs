//! RFC 3339 timestamps of `Stream-Expires-At`, in milliseconds since the
//! epoch (no calendar crate: the grammar is small).

/// Parses `YYYY-MM-DDTHH:MM:SS[.fraction](Z|+HH:MM|-HH:MM)`; `None` if the
/// text is not such a timestamp.
///
/// ```
/// use kn_streams::parse_rfc3339;
/// assert_eq!(parse_rfc3339("1970-01-01T00:00:01Z"), Some(1000));
/// assert_eq!(parse_rfc3339("1970-01-01T01:00:00.5+01:00"), Some(500));
/// assert_eq!(parse_rfc3339("tomorrow"), None);
/// ```
pub fn parse_rfc3339(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() < 20 {
        return None;
    }
    let num = |from: usize, len: usize| -> Option<i64> {
        let s = b.get(from..from + len)?;
        if !s.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(s).ok()?.parse().ok()
    };
    let (year, month, day) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    let (hour, minute, second) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
    if b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') || b[13] != b':' || b[16] != b':' {
        return None;
    }
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut i = 19;
    let mut millis = 0i64;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            if i - start < 3 {
                millis = millis * 10 + i64::from(b[i] - b'0');
            }
            i += 1;
        }
        if i == start {
            return None;
        }
        for _ in (i - start)..3 {
            millis *= 10;
        }
    }
    let zone = match b.get(i..)? {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let digits = [*h1, *h2, *m1, *m2];
            if !digits.iter().all(u8::is_ascii_digit) {
                return None;
            }
            let h = i64::from((h1 - b'0') * 10 + (h2 - b'0'));
            let m = i64::from((m1 - b'0') * 10 + (m2 - b'0'));
            if h > 23 || m > 59 {
                return None;
            }
            let offset = (h * 60 + m) * 60;
            if *sign == b'+' { offset } else { -offset }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - zone;
    Some(secs * 1000 + millis)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The end of a sliding TTL of `ttl` seconds from `from` (milliseconds
/// since the epoch), in milliseconds; `None` past what an `i64` of
/// milliseconds holds (about 292 million years): never a wrapped value.
pub(crate) fn deadline(from: i64, ttl: u64) -> Option<i64> {
    let ms = i64::try_from(ttl).ok()?.checked_mul(1000)?;
    from.checked_add(ms)
}

/// Milliseconds since the epoch, now.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants() {
        assert_eq!(parse_rfc3339("2000-03-01T00:00:00Z"), Some(951_868_800_000));
        assert_eq!(parse_rfc3339("2024-10-09T00:00:00.123Z"), Some(1_728_432_000_123));
        assert_eq!(parse_rfc3339("2024-10-09T02:00:00+02:00"), Some(1_728_432_000_000));
    }

    #[test]
    fn deadlines_never_wrap() {
        assert_eq!(deadline(1_000, 2), Some(3_000));
        assert_eq!(deadline(now_ms(), i64::MAX as u64), None);
        assert_eq!(deadline(now_ms(), u64::MAX), None);
        assert_eq!(deadline(i64::MAX - 999, 1), None);
        assert!(deadline(now_ms(), 9_000_000_000_000_000 / 1000).is_some());
    }

    #[test]
    fn malformed_timestamps() {
        for bad in ["", "2024-10-09", "2024-13-01T00:00:00Z", "2024-10-09T00:00:00", "2024-10-09T00:00:00.Z", "2024-10-09T00:00:00+2"] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }
}
