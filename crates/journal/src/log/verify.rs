//! Checking every record of a topic directory.

use std::path::{Path, PathBuf};

use crate::error::Result;

use super::segment::{Stop, list_segments, scan_segment, segment_name};

/// Checks every record of a topic directory: the number of valid records
/// and, for each segment with a bad frame, where and why.
pub(crate) fn verify_dir(dir: &Path) -> Result<(usize, Vec<(PathBuf, u64, Stop)>)> {
    let mut good = 0;
    let mut bad = Vec::new();
    for first in list_segments(dir)? {
        let path = dir.join(segment_name(first));
        let Some(scan) = scan_segment(&path, 0)? else { continue };
        good += scan.records.len();
        if let Some(stop) = scan.stop {
            bad.push((path, scan.end, stop));
        }
    }
    Ok((good, bad))
}
