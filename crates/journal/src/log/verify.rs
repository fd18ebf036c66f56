//! Checking every record of a topic directory.

use std::path::{Path, PathBuf};

use crate::error::Result;

use super::blob::verify_links;
use super::segment::{Damage, Mode, Stop, list_segments, scan_segment, segment_name};

/// One problem found by [`verify_dir`]: a bad frame (the segment, where
/// the frame starts, and whether valid records follow it in that segment,
/// damage in the middle, or not, a tail), or a blob problem (`path` is the
/// blob link, `tail` false).
pub(crate) struct BadFrame {
    pub path: PathBuf,
    pub damage: Damage,
    pub tail: bool,
}

/// Checks every record of a topic directory: the number of valid records
/// (those after a bad frame included) and every bad frame, in log order;
/// then the blobs the records refer to (missing, wrong length or hash) and
/// blob links no record refers to. Reads each segment whole,
/// resynchronising after bad frames, as the writer does under its lock.
pub(crate) fn verify_dir(dir: &Path) -> Result<(usize, Vec<BadFrame>)> {
    let mut good = 0;
    let mut bad = Vec::new();
    let mut records = Vec::new();
    for first in list_segments(dir)? {
        let path = dir.join(segment_name(first));
        let Some(scan) = scan_segment(&path, 0, first.saturating_sub(1), Mode::Whole)? else { continue };
        good += scan.records.len();
        for damage in scan.damaged {
            bad.push(BadFrame { path: path.clone(), damage, tail: false });
        }
        if let Some(stop) = scan.stop {
            let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(scan.end);
            let damage = Damage { offset: scan.end, len: size.saturating_sub(scan.end), stop };
            bad.push(BadFrame { path: path.clone(), damage, tail: true });
        }
        records.extend(scan.records.into_iter().map(|(offset, r)| (path.clone(), offset, r)));
    }
    for (path, offset, why) in verify_links(dir, &records)? {
        bad.push(BadFrame { path, damage: Damage { offset, len: 0, stop: Stop::Corrupt(why) }, tail: false });
    }
    Ok((good, bad))
}
