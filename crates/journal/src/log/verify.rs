//! Checking every record of a topic directory.

use std::path::{Path, PathBuf};

use crate::error::Result;

use super::segment::{Damage, Mode, list_segments, scan_segment, segment_name};

/// One bad frame found by [`verify_dir`]: the segment, where the frame
/// starts, and whether valid records follow it in that segment (damage in
/// the middle) or not (a tail).
pub(crate) struct BadFrame {
    pub path: PathBuf,
    pub damage: Damage,
    pub tail: bool,
}

/// Checks every record of a topic directory: the number of valid records
/// (those after a bad frame included) and every bad frame, in log order.
/// Reads each segment whole, resynchronising after bad frames, as the
/// writer does under its lock.
pub(crate) fn verify_dir(dir: &Path) -> Result<(usize, Vec<BadFrame>)> {
    let mut good = 0;
    let mut bad = Vec::new();
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
            bad.push(BadFrame { path, damage, tail: true });
        }
    }
    Ok((good, bad))
}
